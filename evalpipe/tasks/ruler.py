"""lm-eval's RULER tasks generated offline with the model's own tokenizer.

Six RULER tasks build their items at task-build time from the model's tokenizer and a
list of target lengths; nothing is downloaded. lm-eval's own builders always make 500
items per length, hang for ever (``while True`` around a bare ``except:``) or emit items
with empty answers when a tokenizer is less efficient than they expect, and print to
stdout. :func:`ruler_task_config` returns a task config dict whose ``custom_dataset`` is
:func:`generate_ruler_dataset`: the same prompts from lm-eval's own templates and random
draws, ``num_samples`` items per length, each length seeded on its own (same items
whatever other lengths are asked for), bounded loops that fail with a sentence instead
of hanging, and a per-item ``score`` plus one metric per length (``"4096"``...) that only
that length's items carry.

How to hand RULER its settings: with an explicit ``task_manager``, ``simple_evaluate``
ignores its own ``metadata=`` argument (it only uses it to build a TaskManager when none
is given). The settings must be in the task config's ``metadata`` (what
:func:`ruler_task_config` does) or in ``TaskManager(metadata=...)``, which would hand them
to every task, babilong included, which reads ``max_seq_lengths`` as a config name.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import io
import json
import logging
import os
import random
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from evalpipe.errors import UserError
from evalpipe.tasks.families import (
    NIAH_PARAMS,
    OFFLINE_RULER,
    RULER_ESSAY,
    is_generated_ruler,
    require_ruler_packages,
)

log = logging.getLogger(__name__)

DEFAULT_NUM_SAMPLES = 20  # per length; lm-eval's builders make 500
DEFAULT_SEED = 42
_MAX_ATTEMPTS = 10_000  # per item, in the loops that lm-eval leaves unbounded


class RulerTooShort(UserError):
    """A RULER task cannot fit an item into the requested length with this tokenizer."""


def ruler_metadata(
    tokenizer_path: str | os.PathLike,
    lengths: list[int],
    num_samples: int = DEFAULT_NUM_SAMPLES,
    seed: int = DEFAULT_SEED,
) -> dict[str, Any]:
    """What RULER needs in a task's metadata: a *local* tokenizer directory (never a hub
    id, so nothing can try to download one), the target lengths, items per length, seed.

    Works as the ``metadata`` of :func:`ruler_task_config` and, for lm-eval's stock
    builders (500 items per length, no seed of their own), as ``TaskManager(metadata=...)``.
    """
    path = Path(tokenizer_path).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(
            f"RULER needs the model's tokenizer as a local directory, and {path} is not one; "
            "pass the model's local path (a hub id would make transformers try to download it)."
        )
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")):
        raise FileNotFoundError(f"no tokenizer files (tokenizer.json, tokenizer_config.json, ...) in {path}.")
    clean = sorted({int(n) for n in lengths})
    if not clean or clean[0] <= 0:
        raise UserError(f"RULER lengths must be positive token counts, got {lengths!r}.")
    if int(num_samples) < 1:
        raise UserError(f"num_samples must be at least 1, got {num_samples!r}.")
    return {
        "tokenizer": str(path),
        "pretrained": str(path),
        "max_seq_lengths": clean,
        "num_samples": int(num_samples),
        "seed": int(seed),
    }


def ruler_task_config(task: str | dict[str, Any], metadata: dict[str, Any]) -> dict[str, Any]:
    """lm-eval task config dict for one RULER task, to pass as ``simple_evaluate(tasks=[cfg])``.

    ``task`` is a task name or a config dict for it (e.g. from evalpipe's
    ``tasks.task_config``, whose ``generation_kwargs`` and ``num_fewshot`` are kept).
    """
    from lm_eval.tasks._yaml_loader import load_yaml

    if isinstance(task, dict):
        name = str(task["task"])
        base = dict(task)
    else:
        name = task
        base = {}
    if name not in OFFLINE_RULER and name not in RULER_ESSAY:
        raise UserError(
            f"`{name}` is not a RULER task evalpipe can generate; generated offline: {', '.join(OFFLINE_RULER)}; "
            f"with a pre-filled essay cache: {', '.join(RULER_ESSAY)}."
        )
    spec = importlib.util.find_spec("lm_eval.tasks.ruler")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the installed lm-eval has no RULER tasks (lm_eval.tasks.ruler); install the lm-eval version evalpipe depends on.")
    yaml_path = Path(spec.submodule_search_locations[0]) / _RULER_YAML[name]
    # Functions unresolved: importing lm-eval's niah module costs ~8 s and ~1 GB (a list
    # of 6 million word pairs) and calls nltk.download; every function field is replaced below.
    cfg = load_yaml(yaml_path, resolve_func=False)
    if isinstance(base.get("generation_kwargs"), dict):  # merged: a max_gen_toks override keeps `until` etc.
        base["generation_kwargs"] = {**(cfg.get("generation_kwargs") or {}), **base["generation_kwargs"]}
    cfg.update(base)
    for key in ("tag", "group", "include"):
        cfg.pop(key, None)
    lengths = list(metadata["max_seq_lengths"])
    cfg["task"] = name
    cfg["custom_dataset"] = generate_ruler_dataset
    cfg["process_results"] = process_results
    cfg["metric_list"] = [{"metric": "score", "aggregation": "mean", "higher_is_better": True}] + [
        {"metric": str(n), "aggregation": "mean", "higher_is_better": True} for n in lengths
    ]
    meta = cfg.get("metadata") if isinstance(cfg.get("metadata"), dict) else {}
    cfg["metadata"] = {**meta, **metadata, "ruler_task": name}
    return cfg


_RULER_YAML = {
    **{n: f"{n}.yaml" for n in NIAH_PARAMS},
    "ruler_vt": "vt.yaml",
    "ruler_cwe": "cwe.yaml",
    "ruler_fwe": "fwe.yaml",
}


def process_results(doc: dict, results: list[str]) -> dict[str, float]:
    """lm-eval's string_match_all, as ``score`` for every item and under the item's own
    length (``"4096"``) so that per-length means come out of lm-eval's aggregation."""
    from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all

    score = string_match_all(postprocess_pred(results), [doc["outputs"]])
    return {"score": score, str(doc["max_length"]): score}


def generate_ruler_dataset(**kwargs: Any) -> dict[str, Any]:
    """``custom_dataset`` of :func:`ruler_task_config`: lm-eval calls it with the task's
    metadata as keyword arguments and takes ``{"test": Dataset}``."""
    import datasets

    name = kwargs.get("ruler_task")
    if name not in _GENERATORS and name not in NIAH_PARAMS:
        raise UserError(f"generate_ruler_dataset needs `ruler_task` in the metadata, got {name!r}.")
    tok_name = kwargs.get("tokenizer") or kwargs.get("pretrained")
    if not tok_name:
        raise UserError(f"{name}: no `tokenizer` in the task metadata; build the config with ruler_metadata().")
    tokenizer = load_tokenizer(str(tok_name))
    lengths = sorted({int(n) for n in kwargs.get("max_seq_lengths") or [4096]})
    n = int(kwargs.get("num_samples") or DEFAULT_NUM_SAMPLES)
    seed = int(kwargs.get("seed", DEFAULT_SEED))
    rows: list[dict] = []
    for length in lengths:
        with _seeded(seed, name, length), _quiet():
            if name in NIAH_PARAMS:
                made = _niah(name, tokenizer, length, n)
            else:
                made = _GENERATORS[name](tokenizer, length, n)
        _check_items(name, length, made)
        rows += made
    return {"test": datasets.Dataset.from_list(rows, split=datasets.Split.TEST)}


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str):
    """The tokenizer from a local directory only (``local_files_only``: no hub request)."""
    from transformers import AutoTokenizer

    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer directory {path} does not exist; RULER needs the model's local tokenizer.")
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=True)
    # RULER measures whole haystacks; the "longer than model_max_length" warning is noise.
    tok.model_max_length = 1 << 30
    if not tok("The quick brown fox jumps over the lazy dog.").input_ids:
        raise UserError(f"tokenizer {path} encodes text to 0 tokens; RULER cannot size its items with it.")
    return tok


_SEED_LOCK = threading.Lock()


@contextlib.contextmanager
def _seeded(seed: int, name: str, length: int) -> Iterator[None]:
    """Seed Python's and numpy's global generators (which lm-eval's RULER code draws
    from) per (seed, task, length), and give the caller's random state back afterwards."""
    s = zlib.crc32(f"{seed}:{name}:{length}".encode())
    with _SEED_LOCK:
        py_state, np_state = random.getstate(), np.random.get_state()
        random.seed(s)
        np.random.seed(s)
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """lm-eval's RULER code prints progress to stdout (up to one line per try)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        yield
    if buf.getvalue():
        log.debug("RULER generation printed: %s", buf.getvalue()[-2000:])


@contextlib.contextmanager
def _no_nltk_download() -> Iterator[None]:
    """lm-eval's prepare_niah calls ``nltk.download("punkt_tab")`` at import when nltk's
    punkt_tab is missing. Offline that prints an error block (or, where the network drops
    packets instead of refusing, waits up to nltk's 120 s network timeout per try) and
    then prints "Downloaded punkt_tab" anyway. punkt_tab is only used for the essay
    haystack, which needs data from the hub in any case; check_available checks it there."""
    import nltk

    original = nltk.download
    nltk.download = lambda *a, **k: False
    try:
        yield
    finally:
        nltk.download = original


def quiet_ruler_import():
    """Import lm-eval's RULER needle module without the nltk download and its prints
    (~8 s and ~1 GB on first import: lm-eval builds a 6-million-entry key word list)."""
    mod = sys.modules.get("lm_eval.tasks.ruler.prepare_niah")
    if mod is not None:
        return mod
    require_ruler_packages()
    with _no_nltk_download(), _quiet():
        import lm_eval.tasks.ruler.prepare_niah as mod
    return mod


# -- the generators -----------------------------------------------------------------


def _niah(name: str, tokenizer, length: int, n: int) -> list[dict]:
    prepare_niah = quiet_ruler_import()
    from lm_eval.tasks.ruler.niah_utils import TEMPLATE

    params = dict(NIAH_PARAMS[name])
    try:
        return prepare_niah.generate_samples(
            prepare_niah.get_haystack(type_haystack=params["type_haystack"]),
            max_seq_length=length,
            template=TEMPLATE,
            num_samples=n,
            TOKENIZER=tokenizer,
            **params,
        )
    except ValueError as err:
        if "Could not generate any sample" in str(err) or "grew past" in str(err):
            raise RulerTooShort(f"{name} cannot fit an item into {length} tokens with this tokenizer: {err}") from err
        raise


VT_ICL_BUDGET = 500  # lm-eval's token budget for ruler_vt's one few-shot example


def _vt(tokenizer, length: int, n: int) -> list[dict]:
    """lm-eval's ruler_vt (vt_utils.get_dataset): one few-shot example made at 500 tokens,
    then n items at ``length`` that start with it; same draws, bounded loops. Where this
    tokenizer cannot fit the example into 500 tokens (lm-eval hangs there), the example
    gets the budget it needs (its 5-line minimum plus 64 tokens of slack) instead."""
    require_ruler_packages()
    try:
        icl = _vartrack(tokenizer, 1, VT_ICL_BUDGET, incremental=5, icl_example=None, task="ruler_vt few-shot example")[0]
    except RulerTooShort:
        need = _vt_min_tokens(tokenizer, noises=5, is_icl=True) + 64
        log.warning("ruler_vt: the few-shot example needs about %d tokens with this tokenizer, not 500", need)
        icl = _vartrack(tokenizer, 1, max(VT_ICL_BUDGET, need), incremental=5, icl_example=None, task="ruler_vt few-shot example")[0]
    return _vartrack(tokenizer, n, length, incremental=10, icl_example=icl, task="ruler_vt")


def _vt_min_tokens(tokenizer, noises: int, is_icl: bool) -> int:
    from lm_eval.tasks.ruler import vt_utils as vt

    text, answer = vt.generate_input_output(noises, 1, 4, is_icl=is_icl)
    return len(tokenizer(text + f" {answer}").input_ids) + 30


def _vartrack(tokenizer, num_samples: int, max_seq_length: int, *, incremental: int, icl_example: dict | None, task: str) -> list[dict]:
    # Mirrors lm_eval/tasks/ruler/vt_utils.py sys_vartrack_w_noise_random (0.4.13):
    # num_chains=1, num_hops=4, add_fewshot=True, tokens_to_generate=30.
    from lm_eval.tasks.ruler import vt_utils as vt

    tokens_to_generate, num_chains, num_hops = 30, 1, 4
    is_icl = icl_example is None
    example_tokens = 0
    icl_text = None
    if icl_example is not None:
        icl_text = icl_example["input"] + " " + " ".join(icl_example["outputs"]) + "\n\n"
        example_tokens = len(tokenizer(icl_text).input_ids)

    num_noises, total_tokens = incremental, 0
    while total_tokens + tokens_to_generate + example_tokens < max_seq_length:
        input_text, answer = vt.generate_input_output(num_noises, num_chains, num_hops, is_icl=is_icl)
        total_tokens = len(tokenizer(input_text + f" {answer}").input_ids)
        if total_tokens + tokens_to_generate + example_tokens > max_seq_length:
            num_noises -= incremental
            break
        num_noises += incremental
    if num_noises < incremental:
        raise RulerTooShort(
            f"{task} cannot fit an item into {max_seq_length} tokens with this tokenizer: "
            f"{incremental} noise lines already take {total_tokens + tokens_to_generate + example_tokens} tokens "
            f"({example_tokens} of them the few-shot example); use a larger length."
        )

    out: list[dict] = []
    for index in range(num_samples):
        used, attempts = num_noises, 0
        while True:
            attempts += 1
            try:
                input_text, answer = vt.generate_input_output(used, num_chains, num_hops, is_icl=is_icl)
                n_tokens = len(tokenizer(input_text).input_ids) + tokens_to_generate + example_tokens
                if n_tokens <= max_seq_length:
                    break
                reason = f"{n_tokens} tokens"
            except Exception as err:  # noqa: BLE001 - lm-eval retries on any failure too
                reason = f"{type(err).__name__}: {err}"
            if used <= incremental or attempts >= _MAX_ATTEMPTS:
                raise RulerTooShort(f"{task} cannot fit item {index} into {max_seq_length} tokens with this tokenizer ({reason}).")
            used -= incremental
        if icl_text is not None:
            cutoff = input_text.index(vt.CONFIG["variable_tracking"]["template"][:20])
            input_text = input_text[:cutoff] + vt.randomize_icl(icl_text) + "\n\n" + input_text[cutoff:]
        gen_prefix_index = input_text.rfind(" Answer: According to the chain(s) of variable assignment")
        gen_prefix = input_text[gen_prefix_index:].strip()
        if icl_example is not None:
            input_text = input_text[:gen_prefix_index]
        out.append(
            {"index": index, "input": input_text, "outputs": answer, "length": n_tokens, "max_length": max_seq_length, "gen_prefix": gen_prefix}
        )
    return out


def _cwe(tokenizer, length: int, n: int) -> list[dict]:
    # Mirrors lm_eval/tasks/ruler/cwe_utils.py sys_word_pair_random (0.4.13), bounded.
    # lm-eval leaves `input_example` out of the prompt (doc_to_text is "{{input}}"), so
    # its ruler_cwe is zero-shot although the example's room is still reserved.
    require_ruler_packages()
    from lm_eval.tasks.ruler import cwe_utils as cwe

    cwe.RNG.seed(random.getrandbits(32))  # lm-eval's module-level Random(42) would differ per call
    tokens_to_generate, incremental, num_cw = 120, 10, 10

    def answer_list(answer: list[str]) -> str:
        return " ".join(f"{i + 1}. {w}" for i, w in enumerate(answer))

    num_words, total_tokens = incremental, 0
    while total_tokens + tokens_to_generate < length:
        example, input_text, answer = cwe.generate_input_output(num_words, length)
        total_tokens = len(tokenizer(example + "\n" + input_text + " " + answer_list(answer)).input_ids)
        if total_tokens + tokens_to_generate > length:
            num_words -= incremental
            break
        num_words += incremental
        if num_words > len(cwe.WORDS):
            num_words = len(cwe.WORDS)
            break
    if num_words < num_cw:  # lm-eval goes on with 0 words: empty lists, empty answers
        raise RulerTooShort(
            f"ruler_cwe cannot fit a list of {num_cw} common words into {length} tokens with this tokenizer "
            f"({total_tokens + tokens_to_generate} tokens with {incremental} words, counting the example lm-eval sizes "
            "but leaves out of the prompt); use a larger length (lm-eval repeats each common word 30 times from 4096 "
            "tokens on and 6 times below, so a length under 4096 may fit where 4096 does not)."
        )
    out: list[dict] = []
    for index in range(n):
        used, attempts = num_words, 0
        while True:
            attempts += 1
            try:
                example, input_text, answer = cwe.generate_input_output(used, length)
                n_tokens = len(tokenizer(input_text).input_ids) + tokens_to_generate
                if n_tokens <= length:
                    break
                reason = f"{n_tokens} tokens"
            except Exception as err:  # noqa: BLE001
                reason = f"{type(err).__name__}: {err}"
            if used <= incremental or attempts >= _MAX_ATTEMPTS:
                raise RulerTooShort(f"ruler_cwe cannot fit item {index} into {length} tokens with this tokenizer ({reason}).")
            used -= incremental
        input_text = input_text[: input_text.rfind(cwe.CONFIG["answer_prefix"])]
        out.append(
            {
                "index": index,
                "input": input_text.strip(),
                "input_example": example,
                "outputs": answer,
                "length": n_tokens,
                "max_length": length,
                "gen_prefix": cwe.CONFIG["answer_prefix"].strip(),
            }
        )
    return out


def _fwe(tokenizer, length: int, n: int) -> list[dict]:
    require_ruler_packages()
    from lm_eval.tasks.ruler import fwe_utils as fwe

    bare = len(tokenizer(fwe.TEMPLATE.format(context="", query="")).input_ids)
    if bare + 16 * 3 > length:  # lm-eval's shrinking loop never ends when the template alone is too long
        raise RulerTooShort(f"ruler_fwe cannot fit into {length} tokens with this tokenizer: its template alone takes {bare} tokens.")
    return fwe.sys_kwext(tokenizer=tokenizer, max_seq_length=length, num_samples=n)


_GENERATORS: dict[str, Callable[[Any, int, int], list[dict]]] = {"ruler_vt": _vt, "ruler_cwe": _cwe, "ruler_fwe": _fwe}


def _check_items(name: str, length: int, items: list[dict]) -> None:
    """Every item must carry its answers in its text; lm-eval's builders do not all check."""
    if not items:
        raise RulerTooShort(f"{name} made no item at length {length}.")
    for item in items:
        outputs = item.get("outputs") or []
        if not outputs:
            raise RulerTooShort(f"{name} made an item with no answer at length {length}; use a larger length.")
        text = item["input"] + " " + item.get("gen_prefix", "")
        if name == "ruler_fwe":
            continue  # coded words: the answers are the most frequent ones, present by construction if any
        if any(str(o) not in text for o in outputs):
            raise RulerTooShort(f"{name} made an item whose answer is not in its text at length {length}; use a larger length.")


def item_fields(doc: dict, task: str | None = None) -> dict[str, Any]:
    """Per-item facts of a RULER doc (lm-eval logs it as ``doc`` in each sample) for
    per-length reports: the configured length, the item's measured budget, and, for the
    needle tasks, where the (first) answer sits in the haystack as a fraction of its
    characters (lm-eval draws the position at random and does not record it).

    With ``task`` given, ``depth`` is only reported for the needle tasks (``niah_*``): in
    ruler_vt/cwe/fwe the first answer's first occurrence says nothing about a position."""
    text, outputs = str(doc.get("input", "")), doc.get("outputs") or []
    depth = None
    if outputs and text and (task is None or task in NIAH_PARAMS):
        pos = text.find(str(outputs[0]))
        depth = round(pos / len(text), 4) if pos >= 0 else None
    return {"max_length": doc.get("max_length"), "length": doc.get("length"), "depth": depth}


def sample_columns(task: str, doc: Any) -> dict[str, Any]:
    """evalpipe's per-sample length columns for a RULER doc (none for other tasks):
    ``target_length`` = the configured length bucket (the doc's ``max_length``; the
    prompt itself is at most that long, not exactly), ``depth`` for the needle tasks."""
    if not is_generated_ruler(task) or not isinstance(doc, dict) or doc.get("max_length") is None:
        return {}
    fields = item_fields(doc, task)
    out: dict[str, Any] = {"target_length": int(fields["max_length"])}
    if fields["depth"] is not None:
        out["depth"] = float(fields["depth"])
    return out


class PrebuiltItems:
    """``custom_dataset`` of a config made by :func:`prebuild_ruler`: hands lm-eval the items
    generated beforehand (lm-eval calls it with the task metadata, which it ignores)."""

    def __init__(self, dataset: Any, sha256: str):
        self.dataset = dataset
        self.sha256 = sha256

    def __call__(self, **_: Any) -> dict[str, Any]:
        return {"test": self.dataset}

    def __repr__(self) -> str:  # what lm-eval's config dump and results.json show
        return f"<RULER items generated by evalpipe: {len(self.dataset)} items, sha256 {self.sha256[:12]}>"


def prebuild_ruler(cfg: dict[str, Any]) -> dict[str, Any]:
    """Generate a :func:`ruler_task_config` config's items now, so that RulerTooShort and
    missing packages surface before any engine starts, and return a copy of ``cfg`` whose
    ``custom_dataset`` hands lm-eval exactly these items.

    Items are interleaved across lengths (item 0 of every length, then item 1, ...), so
    that lm-eval's ``limit`` (the first N docs) keeps every length rather than the
    shortest one only. ``cfg["custom_dataset"].sha256`` fingerprints the items."""
    import datasets

    meta = dict(cfg["metadata"])
    rows = generate_ruler_dataset(**meta)["test"].to_list()
    rank: dict[int, int] = {}
    keyed = []
    for row in rows:
        n = rank[row["max_length"]] = rank.get(row["max_length"], -1) + 1
        keyed.append(((n, row["max_length"]), row))
    rows = [row for _, row in sorted(keyed, key=lambda kr: kr[0])]
    digest = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()
    dataset = datasets.Dataset.from_list(rows, split=datasets.Split.TEST)
    return {**cfg, "custom_dataset": PrebuiltItems(dataset, digest)}
