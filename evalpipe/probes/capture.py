"""Tensor capture for `evalpipe localize`: chosen rows of chosen modules' outputs, per
process and rank, so that the parent can find the first module where two variants part.

Active when the probe spec has a ``capture`` section: the sequences to watch (their token
ids) and, for each, the rows (absolute positions) to keep. A forward pass is captured when
its tokens are one contiguous piece of one watched sequence -- localize sends one sequence
per request with prefix caching off, so ``positions`` runs a, a+1, ... and ``input_ids``
equal the sequence's tokens there (a chunked prefill is several such pieces). Only then
do the capture points write, and only the kept rows: at most sequences x rows x modules x
hidden floats per process.

Two kinds of capture points:

- explicit: model code calls :func:`evalpipe.probes.runtime.capture` with the pieces its
  ranks hold and the layout they hold them in (the reference layout model does, for its
  virtual ranks); such a model sets ``evalpipe_captures = True`` on its class;
- generic, for any other model: forward hooks on each decoder layer (vLLM's
  ``model.layers``) and its ``self_attn``, ``self_attn.o_proj`` (its input: the rank's
  heads before the output projection) and ``mlp``, with the tensor-parallel rank the
  process holds; in a layer that sets vLLM's ``use_sequence_parallel_moe`` the attention
  output is a partial sum and the MLP and layer outputs are token shards.

What a rank holds is recorded as it is, with its layout; the parent reassembles the full
tensor (:mod:`evalpipe.compare.unshard`). Layouts:

``full``          every row of the batch, the whole width (one process, no ranks);
``replicated``    the same, held by every tensor-parallel rank;
``token_shards``  rank r holds batch rows [r*s, (r+1)*s) (``shard_rows`` s; the batch
                  padded to world*s);
``head_columns``  rank r holds every batch row, but only its columns (``columns``, runs of
                  [start, stop) in the full width);
``partial_sum``   rank r holds a partial sum of the full tensor (row-parallel products
                  before their reduction): the full tensor is the sum over ranks.

A piece may also be held at a scale (``scale``: a model's output scale, neutral by
construction): the full tensor is the piece divided by it.

Files: ``<dir>/<pid>.jsonl`` (one line per stored piece) and ``<pid>.bin`` (its floats,
float32 little-endian, back to back). Standard library only: tensors are reached through
their own methods and torch through ``sys.modules``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from typing import Any, Sequence

CAPTURE_VERSION = 1
LAYOUTS = ("full", "replicated", "token_shards", "head_columns", "partial_sum")
# Forward order of the generic capture points within a decoder layer.
GENERIC_MODULES = ("attn.heads", "attn.out", "mlp.out", "layer.out")


class Watched:
    """A watched sequence: its token ids and the rows to keep."""

    def __init__(self, index: int, label: str, token_ids: list[int], rows: list[int]):
        self.index = index
        self.label = label
        self.token_ids = token_ids
        self.rows = sorted(set(rows))


class Forward:
    """The watched piece a forward pass computes: sequence, first position, token count."""

    def __init__(self, sequence: Watched, start: int, tokens: int):
        self.sequence = sequence
        self.start = start
        self.tokens = tokens
        self.rows = [r for r in sequence.rows if start <= r < start + tokens]


class TensorCapture:
    def __init__(self, spec: dict[str, Any]):
        self.out_dir = str(spec["dir"])
        self.sequences = [
            Watched(i, str(s.get("label", i)), [int(t) for t in s["token_ids"]], [int(r) for r in s["rows"]])
            for i, s in enumerate(spec["sequences"])
        ]
        self.local = threading.local()
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.written = 0
        # per watched sequence, the end of the last piece this process captured: a later piece
        # counts only if it continues there, since its attention reads the earlier positions'
        # keys and values (a decode step after the engine generated another token than the
        # sequence's is not the sequence any more, even where its own token matches again)
        self.reached: dict[int, int] = {}

    def forked(self) -> None:
        """A forked child writes files of its own."""
        self.pid = os.getpid()
        self.local = threading.local()
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ forward passes

    def current(self) -> Forward | None:
        return getattr(self.local, "forward", None)

    def forward_started(self, input_ids: Any, positions: Any) -> None:
        self.local.forward = self.match(input_ids, positions)

    def forward_finished(self) -> None:
        self.local.forward = None

    def match(self, input_ids: Any, positions: Any) -> Forward | None:
        """The watched piece these tokens are (from position 0, or continuing the last piece of
        the same sequence), or None."""
        if input_ids is None or positions is None or getattr(positions, "ndim", 0) != 1:
            return None
        n = int(input_ids.shape[-1])
        if n == 0 or int(positions.shape[0]) != n:
            return None
        pos = positions.tolist()
        start = int(pos[0])
        if pos != list(range(start, start + n)):
            return None  # more than one sequence in this batch
        ids: list[int] | None = None
        for seq in self.sequences:
            if start + n > len(seq.token_ids):
                continue
            if ids is None:
                ids = [int(t) for t in input_ids.reshape(-1).tolist()]
            if seq.token_ids[start : start + n] == ids and (start == 0 or self.reached.get(seq.index) == start):
                self.reached[seq.index] = start + n
                return Forward(seq, start, n)
        return None

    # ------------------------------------------------------------------ capture points

    def capture(self, module: str, layer: int, pieces: Sequence[Any], layout: str, *, world: int = 1,
                rank: int | None = None, shard_rows: int | None = None,
                columns: Sequence[Sequence[int]] | None = None, width: int | None = None, scale: float = 1.0) -> None:
        """Store the kept rows of ``pieces`` (one tensor per rank, in rank order; or one piece
        of rank ``rank`` of ``world``). ``columns``: per piece, the column indices it holds;
        ``scale``: the factor the model holds this tensor at (an output scale that is neutral
        by construction), which the comparison divides out."""
        fwd = self.current()
        if fwd is None or not fwd.rows:
            return
        if layout not in LAYOUTS:
            raise ValueError(f"unknown capture layout {layout!r}")
        ranks: list[int | None] = [None] if layout == "full" else [rank] if rank is not None else list(range(len(pieces)))
        for i, (r, piece) in enumerate(zip(ranks, pieces)):
            if layout == "token_shards" and r is not None:
                size = int(shard_rows or piece.shape[0])
                rows = [p for p in fwd.rows if r * size <= p - fwd.start < (r + 1) * size]
                local = [p - fwd.start - r * size for p in rows]
            else:
                rows = [p for p in fwd.rows if p - fwd.start < piece.shape[0]]
                local = [p - fwd.start for p in rows]
            if not rows:
                continue
            cols = None if columns is None else runs(columns[i])
            self._write(piece, local, {
                "version": CAPTURE_VERSION, "sequence": fwd.sequence.index, "label": fwd.sequence.label,
                "module": module, "layer": int(layer), "layout": layout, "rank": r, "world": int(world),
                "rows": rows, "batch_start": fwd.start, "batch_tokens": fwd.tokens,
                "shard_rows": shard_rows, "columns": cols,
                "width": int(width if width is not None else piece.shape[-1]), "scale": float(scale),
            })

    def _write(self, piece: Any, local_rows: list[int], entry: dict[str, Any]) -> None:
        torch = sys.modules["torch"]
        index = torch.tensor(local_rows, dtype=torch.long, device=piece.device)
        data = piece.detach().index_select(0, index).to(torch.float32).cpu().contiguous()
        raw = data.numpy().tobytes()
        with self.lock:
            os.makedirs(self.out_dir, exist_ok=True)
            stem = os.path.join(self.out_dir, str(self.pid))
            with open(stem + ".bin", "ab") as fh:
                offset = fh.tell()
                fh.write(raw)
            entry.update(shape=[int(n) for n in data.shape], offset=offset, dtype="float32", pid=self.pid)
            with open(stem + ".jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(entry) + "\n")
            self.written += 1

    # ------------------------------------------------------------------ generic hooks

    def hook_model(self, model: Any, tp_rank: int, tp_size: int) -> list[str]:
        """Forward hooks on every decoder layer of a model that does not capture for itself;
        returns what could not be hooked."""
        layers = layers_module(model)
        if layers is None:
            return ["no ModuleList named `layers`: no generic capture points"]
        missing: list[str] = []
        for index, layer in enumerate(layers):
            if type(layer).__name__ == "PPMissingLayer":
                continue
            # vLLM's own flag of a sequence-parallel MoE layer (DeepseekV2DecoderLayer and kin):
            # its attention's output is each rank's partial sum (reduce-scattered after the
            # hook), its MLP and layer outputs are token shards of ceil(N / TP) rows. Read from
            # the layer, never guessed from a row count: a one-token batch's shard has as many
            # rows as the batch.
            sharded = tp_size > 1 and bool(getattr(layer, "use_sequence_parallel_moe", False))
            layer.register_forward_hook(self._layer_hook(index, tp_rank, tp_size, sharded))
            attn = getattr(layer, "self_attn", None)
            mlp = getattr(layer, "mlp", None)
            o_proj = getattr(attn, "o_proj", None)
            if attn is None or mlp is None or o_proj is None:
                missing.append(f"layer {index}: no self_attn / self_attn.o_proj / mlp")
                continue
            attn.register_forward_hook(self._output_hook("attn.out", index, tp_rank, tp_size,
                                                         "partial_sum" if sharded else "replicated"))
            mlp.register_forward_hook(self._output_hook("mlp.out", index, tp_rank, tp_size,
                                                        "token_shards" if sharded else "replicated"))
            o_proj.register_forward_pre_hook(self._heads_hook(index, tp_rank, tp_size))
        return missing

    def _rank_piece(self, module: str, layer: int, tensor: Any, tp_rank: int, tp_size: int, layout: str) -> None:
        """One rank's tensor in ``layout`` (replicated, partial_sum or token_shards); without
        tensor parallelism the whole tensor."""
        if tp_size == 1:
            self.capture(module, layer, [tensor], "full")
        elif layout == "token_shards":
            self.capture(module, layer, [tensor], layout, rank=tp_rank, world=tp_size, shard_rows=int(tensor.shape[0]))
        else:
            self.capture(module, layer, [tensor], layout, rank=tp_rank, world=tp_size)

    def _layer_hook(self, index: int, tp_rank: int, tp_size: int, sharded: bool):
        def hook(_module: Any, _args: Any, output: Any) -> None:
            if self.current() is None:
                return
            hidden, residual = (output[0], output[1]) if isinstance(output, tuple) else (output, None)
            stream = hidden if residual is None else hidden + residual
            self._rank_piece("layer.out", index, stream, tp_rank, tp_size, "token_shards" if sharded else "replicated")
        return hook

    def _output_hook(self, module: str, index: int, tp_rank: int, tp_size: int, layout: str):
        def hook(_module: Any, _args: Any, output: Any) -> None:
            if self.current() is None:
                return
            tensor = output[0] if isinstance(output, tuple) else output
            self._rank_piece(module, index, tensor, tp_rank, tp_size, layout)
        return hook

    def _heads_hook(self, index: int, tp_rank: int, tp_size: int):
        def hook(_module: Any, args: Any) -> None:
            if self.current() is None or not args:
                return
            local = args[0]
            width = int(local.shape[-1])
            cols = list(range(tp_rank * width, (tp_rank + 1) * width))
            self.capture("attn.heads", index, [local], "head_columns", rank=tp_rank, world=tp_size,
                         columns=[cols], width=width * tp_size)
        return hook


def runs(indices: Any) -> list[list[int]]:
    """Ascending indices as runs [start, stop): 64 heads of 128 columns are 64 pairs, not 8192
    ints (also how localize writes positions: 2047–2049)."""
    values = [int(i) for i in (indices.tolist() if hasattr(indices, "tolist") else indices)]
    runs: list[list[int]] = []
    for v in values:
        if runs and runs[-1][1] == v:
            runs[-1][1] = v + 1
        else:
            runs.append([v, v + 1])
    return runs


def layers_module(model: Any) -> Any:
    """The decoder layers: the first ModuleList named ``layers`` (vLLM's convention), or None."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "layers" and type(module).__name__ == "ModuleList":
            return module
    return None
