"""One process's record: what it built, how the engine resolved its switches, what it called.

Counts are kept per name in total and, inside each forward pass of a model, as a
histogram "this many calls in that many forward passes", so an expectation such as
"one all_to_all per layer, in every forward" can be checked and a partial fallback (the
new path taken for some batches only) shows. A collective counts once, at its outermost
call: ``tensor_model_parallel_all_reduce`` -> ``GroupCoordinator.all_reduce`` -> the
device communicator is one all_reduce, while each of the three functions keeps its own
count.

Bounded: the first :data:`SHAPES_KEPT` calls of a name keep their argument shapes, a
histogram keeps :data:`HISTOGRAM_VALUES` distinct counts (the rest are summed under
"other"), and only names that were configured or are collectives are counted.

Standard library only.
"""

from __future__ import annotations

import copy
import enum
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from evalpipe.probes import NODE_ENV, SCHEMA_VERSION
from evalpipe.probes.collectives import is_recorded

SHAPES_KEPT = 3
HISTOGRAM_VALUES = 16
FORWARD_TOKENS_KEPT = 8
TEXT_LIMIT = 2000
OTHER = "other"


def token_bin(tokens: int) -> int:
    """The power-of-two bin of a pass's token count: its least member (1, 2, 4, 8 ...)."""
    return 1 << (max(tokens, 1).bit_length() - 1)


def bin_tokens(key: str) -> str:
    """A bin of :func:`token_bin` as a reader counts its tokens: "1", "2-3", "64-127" (other keys as they are)."""
    if not key.isdigit() or key == "1":
        return key
    least = int(key)
    return f"{least}-{2 * least - 1}"


def bin_size(key: str) -> str:
    """A bin's passes as a sentence names them: "1 token", "64-127 tokens"."""
    return "1 token" if key == "1" else f"{bin_tokens(key)} tokens"


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON value for whatever a switch holds (dtypes, enums, config objects), bounded."""
    if isinstance(value, enum.Enum):
        return value.name  # IntEnum and str enums too: a config says `compilation_mode: NONE`
    if value is None or isinstance(value, (bool, int, float, str)):
        return value[:TEXT_LIMIT] if isinstance(value, str) else value
    if depth < 3 and isinstance(value, dict):
        return {str(k): jsonable(v, depth + 1) for k, v in list(value.items())[:64]}
    if depth < 3 and isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=str) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v, depth + 1) for v in list(items)[:64]]
    name = getattr(value, "name", None)
    if type(value).__name__ != "dtype" and isinstance(name, str) and type(value).__module__ != "builtins":
        return name  # an enum member
    return str(value).removeprefix("torch.")[:TEXT_LIMIT]


def shapes_of(args: tuple, kwargs: dict) -> list[Any]:
    """Shapes of the tensor arguments (lists of tensors: the first four), in call order."""
    out: list[Any] = []
    for value in (*args, *kwargs.values()):
        shape = getattr(value, "shape", None)
        if shape is not None and not isinstance(value, type):
            out.append([int(n) for n in shape])
        elif isinstance(value, (list, tuple)) and value and getattr(value[0], "shape", None) is not None:
            out.append([[int(n) for n in getattr(v, "shape", ())] for v in value[:4]])
    return out[:6]


def class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _bump(histogram: dict[str, int], value: int) -> None:
    key = str(value)
    if key not in histogram and len(histogram) >= HISTOGRAM_VALUES:
        key = OTHER
    histogram[key] = histogram.get(key, 0) + 1


class ModelRecord:
    def __init__(self, model_class: str, layers: dict[str, int], attention_backends: list[str]):
        self.model_class = model_class
        self.layers = layers
        self.attention_backends = attention_backends
        self.forwards = 0
        self.empty_forwards = 0  # forward passes over no token (padding-only batches): not counted above
        self.failed_forwards = 0  # forward passes that raised: cut short, so not counted above either
        # passes running when the record was written (a process may end inside one, its
        # engine shut down mid-step): their calls so far are in the totals, not in `forwards`
        self.running_forwards = 0
        self.forward_tokens: list[int] = []
        self.per_forward: dict[str, dict[str, int]] = {}
        self.per_forward_tokens: dict[str, dict[str, list[int]]] = {}  # name -> {count: tokens of the first passes}
        # name -> {count: [fewest, most] tokens of every pass with that count}: whether a count
        # belongs to one batch size exactly (a collective skipped in every one-token pass)
        self.per_forward_token_range: dict[str, dict[str, list[int]]] = {}
        self.token_range: list[int] | None = None  # [fewest, most] tokens over every pass so far
        # passes by their tokens, in power-of-two bins keyed by the bin's least count ("1": one
        # token, a single request decoding alone; "2": 2-3; "4": 4-7 ...): which of the
        # scheduler's batch shapes the engine ran, the evidence that a path was exercised
        self.tokens_per_forward: dict[str, int] = {}

    def to_json(self) -> dict[str, Any]:
        return {
            "model_class": self.model_class,
            "layers": self.layers,
            "attention_backends": self.attention_backends,
            "forwards": self.forwards,
            "empty_forwards": self.empty_forwards,
            "failed_forwards": self.failed_forwards,
            "running_forwards": self.running_forwards,
            "forward_tokens": self.forward_tokens,
            "per_forward": self.per_forward,
            "per_forward_tokens": self.per_forward_tokens,
            "per_forward_token_range": self.per_forward_token_range,
            "tokens_per_forward": self.tokens_per_forward,
        }


class ProcessRecord:
    """Counters and findings of this process, written to ``<out_dir>/<pid>.json``."""

    def __init__(self, out_dir: str, variant: str):
        self.out_dir = out_dir
        self.variant = variant
        self.reset()

    def reset(self) -> None:
        """A fresh record (a forked child starts its own)."""
        self.pid = os.getpid()
        self.lock = threading.Lock()  # a fork may have copied it held by another thread
        # one writer at a time, each writing what it saw last: without it the writer thread's
        # older snapshot could replace the file after the exit's final one
        self.write_lock = threading.Lock()
        self.started_at = time.time()
        self.calls: dict[str, int] = {}
        self.collectives: dict[str, int] = {}
        self.shapes: dict[str, list[Any]] = {}
        self.models: list[ModelRecord] = []
        self.switches: dict[str, Any] = {}
        self.switch_errors: dict[str, str] = {}
        self.absent: dict[str, str] = {}
        self.errors: list[str] = []
        self.vllm_loaded = "vllm" in sys.modules
        self.dirty = True
        self.local = threading.local()

    # ------------------------------------------------------------------ calls

    def enter(self, name: str, collective: str | None, args: tuple, kwargs: dict) -> bool:
        """Count one call of ``name``; ``collective`` ("all_gather@tp") counts when no other
        collective is running in this thread. Returns whether this call holds the
        collective depth (pass it to :meth:`leave`)."""
        outermost = False
        if collective is not None:
            depth = getattr(self.local, "depth", 0)
            self.local.depth = depth + 1
            outermost = depth == 0
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1
            if outermost and collective is not None:  # outermost implies a collective; says so to the checker
                self.collectives[collective] = self.collectives.get(collective, 0) + 1
            kept = self.shapes.setdefault(name, [])
            if len(kept) < SHAPES_KEPT:
                kept.append(shapes_of(args, kwargs))
            self.dirty = True
        return collective is not None

    def leave(self, held_depth: bool) -> None:
        if held_depth:
            self.local.depth -= 1

    def note(self, kind: str, group: str, tensors: tuple) -> None:
        """A collective that has no function of its own to wrap (the layout model's virtual ones)."""
        collective = f"{kind}@{group}"
        if not is_recorded(collective):  # an expectation could not name it: a bug of the caller
            raise ValueError(f"`{collective}` is not in the probes' vocabulary (evalpipe.probes.collectives)")
        self.leave(self.enter(f"{group}:{kind}", collective, tensors, {}))

    # ------------------------------------------------------------------ forward passes

    def forward_started(self, model: ModelRecord, tokens: int | None) -> Any:
        """A snapshot of the counters, or None inside another forward (counted once, by the outer one).

        A pass counts when it finishes, not when it starts: the record is written while the
        engine runs (and a process ended by its parent may never write again), so a pass
        still running must not show as a pass that called nothing."""
        if getattr(self.local, "forward", False):
            return None
        if tokens == 0:
            # no token, no layer work (a layer skips its collectives on an empty batch): such a
            # pass says nothing about "so many calls in every forward pass"
            with self.lock:
                model.empty_forwards += 1
            return None
        self.local.forward = True
        with self.lock:
            model.running_forwards += 1
            return dict(self.calls), dict(self.collectives), tokens

    def forward_failed(self, model: ModelRecord, snapshot: Any) -> None:
        """A forward pass that raised: what it called before says nothing about a whole pass."""
        if snapshot is None:
            return
        self.local.forward = False
        with self.lock:
            model.running_forwards -= 1
            model.failed_forwards += 1
            self.dirty = True

    def forward_finished(self, model: ModelRecord, snapshot: Any) -> None:
        if snapshot is None:
            return
        self.local.forward = False
        calls, collectives, tokens = snapshot
        with self.lock:
            seen = {name: n - calls.get(name, 0) for name, n in self.calls.items() if n > calls.get(name, 0)}
            for key, n in self.collectives.items():
                delta = n - collectives.get(key, 0)
                if delta:
                    seen[key] = delta
                    kind = key.partition("@")[0]
                    seen[kind] = seen.get(kind, 0) + delta
            for name in seen:
                if name not in model.per_forward and model.forwards and model.forward_tokens:
                    # first seen in this pass: the earlier passes called it zero times (a zero
                    # stays implied in the histogram: forwards minus its sum), sized here
                    model.per_forward_tokens.setdefault(name, {})["0"] = model.forward_tokens[:SHAPES_KEPT]
                    if model.token_range is not None:
                        model.per_forward_token_range.setdefault(name, {})["0"] = list(model.token_range)
                _bump(model.per_forward.setdefault(name, {}), seen[name])
            model.running_forwards -= 1
            model.forwards += 1
            if tokens is not None and len(model.forward_tokens) < FORWARD_TOKENS_KEPT:
                model.forward_tokens.append(tokens)
            if tokens is not None:
                # which passes made which counts: an odd count (a fallback in some passes) is
                # then found by its batches' sizes (names seen before count this pass's zeros)
                for name in model.per_forward:
                    count = str(seen.get(name, 0))
                    kept = model.per_forward_tokens.setdefault(name, {}).setdefault(count, [])
                    if len(kept) < SHAPES_KEPT:
                        kept.append(tokens)
                    span = model.per_forward_token_range.setdefault(name, {}).setdefault(count, [tokens, tokens])
                    span[0], span[1] = min(span[0], tokens), max(span[1], tokens)
                span = model.token_range or [tokens, tokens]
                model.token_range = [min(span[0], tokens), max(span[1], tokens)]
                _bump(model.tokens_per_forward, token_bin(tokens))
            self.dirty = True

    # ------------------------------------------------------------------ writing

    def role(self) -> str:
        """What this process is in a vLLM deployment (from its process name and command line)."""
        import multiprocessing

        name = multiprocessing.current_process().name
        main = getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") or ""
        argv = " ".join(sys.argv)
        if name.startswith("EngineCore"):
            return "engine_core"
        if "Worker" in name:
            return "worker"
        if "Coordinator" in name:
            return "dp_coordinator"
        if main == "evalpipe.worker.main":
            return "evalpipe_worker"
        if main.startswith("vllm.entrypoints") or "vllm serve" in argv or os.path.basename(sys.argv[0] or "") == "vllm":
            return "api_server"
        return "other"

    def to_json(self) -> dict[str, Any]:
        import multiprocessing

        with self.lock:
            # a copy, taken under the lock: the file is written after it is released, while the
            # engine's thread may finish a pass (its histograms must not move past `forwards`)
            return copy.deepcopy({
                "schema_version": SCHEMA_VERSION,
                "variant": self.variant,
                "pid": self.pid,
                "ppid": os.getppid(),
                "process_name": multiprocessing.current_process().name,
                "role": self.role(),
                "argv": [a[:200] for a in sys.argv[:8]],
                "node": os.environ.get(NODE_ENV),
                "hostname": socket.gethostname(),
                "started_at": self.started_at,
                "updated_at": time.time(),
                "models": [m.to_json() for m in self.models],
                "switches": self.switches,
                "switch_errors": self.switch_errors,
                "calls": self.calls,
                "collectives": self.collectives,
                "shapes": self.shapes,
                "absent": self.absent,
                "errors": self.errors[:20],
            })

    def worth_writing(self) -> bool:
        """Processes that touched vLLM in a known role or built a model; not every helper
        interpreter that inherits the environment (compile workers, tools)."""
        return bool(self.models) or (self.vllm_loaded and self.role() != "other")

    def write(self) -> None:
        if not self.worth_writing():
            return
        with self.write_lock:
            self.dirty = False  # before the snapshot: a change during it marks the record dirty again
            doc = self.to_json()
            os.makedirs(self.out_dir, exist_ok=True)
            # two nodes of a deployment may share the directory and a pid
            node = os.environ.get(NODE_ENV)
            path = os.path.join(self.out_dir, f"node{node}-{self.pid}.json" if node else f"{self.pid}.json")
            tmp = f"{path}.{threading.get_ident()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, sort_keys=True)
            os.replace(tmp, path)
