"""Where a variant first parts from the reference: module by module, layer by layer, each
difference held to the same module's A/A difference.

Input: the pieces each configuration's engine captured (reference, variant, A/A) for the
same sequences and positions. Every module's full tensor is reassembled on each side
(:mod:`evalpipe.compare.unshard`), then compared per position: relative L2 error, cosine
similarity, largest absolute error. A module is *above its floor* when its largest
relative L2 error exceeds max(numerics floor, rel_aa x the A/A's): the A/A run is the
engine's own noise at that very module; where it is bitwise identical (a deterministic
engine), the precision's floor (docs/numerics.md) is what a correct change may still move.

The answer is the first module above its floor in forward order, the positions where it
is largest (flagged when they sit on a shard, padding, chunk or sparse-block boundary),
and how the difference grows through the later layers.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from evalpipe.compare.unshard import NotReassembled, Reassembled, reassemble
from evalpipe.documents import localization as schema
from evalpipe.documents.captures import CapturedPiece
from evalpipe.documents.localization import ModuleDoc, PositionDoc
from evalpipe.probes.capture import runs

# Forward order inside a decoder layer, with what each capture point is.
MODULES: dict[str, str] = {
    "attn.in": "attention input (the tokens each rank holds)",
    "attn.heads": "attention output before the output projection",
    "attn.partials": "output projection before the reduction (the ranks' partial sums)",
    "attn.out": "attention output after the reduction",
    "attn.residual": "residual stream after the attention add",
    "mlp.out": "MLP / MoE output",
    "layer.out": "residual stream after the layer",
}
WORST_POSITIONS = 3
NONFINITE = "NaN or inf"  # the flag of a worst position NaN or inf on one side only
_TINY = 1e-30


@dataclass(frozen=True)
class Side:
    """One configuration's captured pieces."""

    name: str
    pieces: list[CapturedPiece]


@dataclass(frozen=True)
class Boundaries:
    """What makes a position special besides the layouts the engines recorded: the
    configured tensor-parallel sizes (used when no layout was recorded) and the sparse block."""

    tp_sizes: tuple[int, ...] = ()
    sparse_block: int | None = None


@dataclass(frozen=True)
class Localization:
    variant: str
    reference: str
    aa: str | None
    numerics_floor: float
    rel_aa: float
    modules: tuple[ModuleDoc, ...]  # the document's, built here
    aa_identical: bool | None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def first(self) -> ModuleDoc | None:
        return next((m for m in self.modules if m.above), None)

    def layer_curve(self) -> list[schema.LayerPoint]:
        """Per layer, the residual stream after it (or, without that capture point, the layer's
        largest module difference)."""
        points = []
        for layer in sorted({m.layer for m in self.modules}):
            mods = [m for m in self.modules if m.layer == layer]
            out = next((m for m in mods if m.module == "layer.out"), None)
            if out is not None:
                points.append(schema.LayerPoint(layer=layer, rel_l2=out.rel_l2, aa_rel_l2=out.aa_rel_l2))
            else:
                points.append(schema.LayerPoint(layer=layer, rel_l2=_max(m.rel_l2 for m in mods),
                                                aa_rel_l2=_max(m.aa_rel_l2 for m in mods)))
        return points

    def sentence(self) -> str:
        first = self.first
        floor = "the A/A floor" if self.aa is not None else "the numerics floor"
        if first is None:
            compared = sum(1 for m in self.modules if m.rel_l2 is not None)
            return f"no module above {floor}: {compared} module outputs compared, none differs more than its floor."
        where = f"layer {first.layer}, {first.title}"
        worst = sorted({w.position for w in first.worst})
        flags = sorted({f for w in first.worst for f in w.flags if f != NONFINITE})
        text = f"first difference above {floor}: {where}"
        if worst:
            text += f", {'position' if len(worst) == 1 else 'positions'} {format_positions(worst)}"
        if flags:
            text += f" ({'; '.join(flags)})"
        if first.nonfinite:
            return text + f"; NaN or inf at {first.nonfinite} position{'s' if first.nonfinite > 1 else ''} where the reference is finite."
        return text + f"; relative L2 error {first.rel_l2 or 0:.2g} against a floor of {first.floor:.2g}."

    def not_reassembled(self) -> list[str]:
        return [f"{m.module} of layer {m.layer}: {m.not_reassembled}" for m in self.modules if m.not_reassembled]


def format_positions(positions: list[int]) -> str:
    """[5, 6, 7, 12] -> "5–7, 12"."""
    return ", ".join(f"{a}" if b == a + 1 else f"{a}–{b - 1}" for a, b in runs(sorted(set(positions))))


def _max(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


def _grouped(pieces: list[CapturedPiece]) -> dict[tuple[int, str, int], list[CapturedPiece]]:
    """(layer, module, sequence) -> pieces."""
    out: dict[tuple[int, str, int], list[CapturedPiece]] = defaultdict(list)
    for p in pieces:
        out[(p.entry.layer, p.entry.module, p.entry.sequence)].append(p)
    return out


@dataclass
class _Rows:
    """Per-position metrics of one module over all sequences."""

    labels: list[str] = field(default_factory=list)
    sequences: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    rel_l2: list[float] = field(default_factory=list)
    cosine: list[float] = field(default_factory=list)
    max_abs: list[float] = field(default_factory=list)
    # a row where one side holds NaN or inf that the other does not: its rel_l2 is inf, its
    # cosine NaN (left out of the minimum)
    nonfinite: list[bool] = field(default_factory=list)

    def add(self, label: str, sequence: int, a: Reassembled, b: Reassembled) -> None:
        common, ia, ib = np.intersect1d(a.rows, b.rows, return_indices=True)
        if not len(common):
            return
        x, y = a.values[ia], b.values[ib]
        finite = np.isfinite(x).all(axis=1) & np.isfinite(y).all(axis=1)
        broken = ~finite
        for i in np.flatnonzero(broken):  # the same NaN / inf on both sides is no difference
            broken[i] = not np.array_equal(x[i], y[i], equal_nan=True)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite[:, None], y - x, 0.0)
            norm_x, norm_y = np.linalg.norm(np.where(finite[:, None], x, 0.0), axis=1), np.linalg.norm(np.where(finite[:, None], y, 0.0), axis=1)
            rel = np.linalg.norm(diff, axis=1) / np.maximum(norm_x, _TINY)
            cos = np.sum(np.where(finite[:, None], x * y, 0.0), axis=1) / np.maximum(norm_x * norm_y, _TINY)
        self.rel_l2 += list(np.where(broken, np.inf, rel))
        self.cosine += list(np.where(broken, np.nan, np.where(finite, cos, 1.0)))
        self.max_abs += list(np.where(broken, np.inf, np.abs(diff).max(axis=1)))
        self.nonfinite += list(broken)
        self.labels += [label] * len(common)
        self.sequences += [sequence] * len(common)
        self.positions += [int(p) for p in common]

    def summary(self) -> tuple[float | None, float | None, float | None]:
        """Largest relative L2 and absolute error, smallest cosine, over the rows both sides
        hold finite (or identical); the others are counted in ``nonfinite``."""
        kept = [i for i, bad in enumerate(self.nonfinite) if not bad]
        if not kept:
            return None, None, None
        return (float(max(self.rel_l2[i] for i in kept)), float(min(self.cosine[i] for i in kept)),
                float(max(self.max_abs[i] for i in kept)))


def boundary_flags(position: int, batches: set[tuple[int, int, int, int]], tokens: int, where: Boundaries) -> tuple[str, ...]:
    """Why ``position`` of a ``tokens``-long sequence is special. ``batches``: the forward
    passes' (start, tokens, world, shard rows) the engines recorded for it."""
    flags: set[str] = set()
    # the layouts the engines recorded; the configured sizes only where none was (an engine
    # whose shards no capture point sees): with both, a position near a 16-way boundary of
    # a layout that never ran would be flagged for nothing
    recorded = {b for b in batches if b[2] > 1}
    layouts = set(batches) | (set() if recorded else {(0, tokens, t, -(-tokens // t)) for t in where.tp_sizes if t > 1})
    for start, n, world, size in layouts:
        if not start <= position < start + n or world < 2:
            continue
        edges = [start + k * size for k in range(1, world) if k * size < n]
        if any(position in (e - 1, e) for e in edges):
            flags.add(f"a shard boundary of T = {world}")
        if n % world and position == start + n - 1:
            flags.add(f"the last token before the padding of T = {world}")
    if any(start == position and n == 1 for start, n, _w, _s in batches):
        flags.add("a one-token forward pass (a decode step)")
    elif any(start > 0 and position == start for start, _n, _w, _s in batches):
        flags.add("the first token of a prefill chunk")
    block = where.sparse_block
    if block and position > 0 and (position % block == 0 or (position + 1) % block == 0):
        flags.add(f"a sparse-block boundary ({block})")
    return tuple(sorted(flags))


def localize(reference: Side, variant: Side, aa: Side | None, *, labels: dict[int, str], tokens: dict[int, int],
             numerics_floor: float, rel_aa: float = 3.0, where: Boundaries = Boundaries()) -> Localization:
    """Compare ``variant`` with ``reference`` module by module, each against ``aa``'s difference."""
    ref, var = _grouped(reference.pieces), _grouped(variant.pieces)
    aas = _grouped(aa.pieces) if aa is not None else {}
    batches: dict[int, set[tuple[int, int, int, int]]] = defaultdict(set)
    for side in (reference, variant):
        for p in side.pieces:
            e = p.entry
            if e.layout == "token_shards" and e.shard_rows:
                batches[e.sequence].add((e.batch_start, e.batch_tokens, e.world, e.shard_rows))
            elif e.batch_start > 0:
                batches[e.sequence].add((e.batch_start, e.batch_tokens, 1, e.batch_tokens))

    keys = sorted(set(ref) | set(var), key=lambda k: (k[0], _order(k[1]), k[2]))
    modules: list[ModuleDoc] = []
    aa_values: list[float] = []
    for layer, module in dict.fromkeys((k[0], k[1]) for k in keys):
        ab, baseline = _Rows(), _Rows()
        problems: list[str] = []
        for seq in sorted({k[2] for k in keys if k[:2] == (layer, module)}):
            label = labels.get(seq, str(seq))
            a = reassemble(ref.get((layer, module, seq), []))
            b = reassemble(var.get((layer, module, seq), []))
            for who, got in ((reference.name, a), (variant.name, b)):
                if isinstance(got, NotReassembled):
                    problems.append(f"{who}: {got.why}")
            if isinstance(a, Reassembled) and isinstance(b, Reassembled):
                ab.add(label, seq, a, b)
            if aa is not None and isinstance(a, Reassembled):
                c = reassemble(aas.get((layer, module, seq), []))
                if isinstance(c, Reassembled):
                    baseline.add(label, seq, a, c)
                else:
                    problems.append(f"{aa.name}: {c.why}")
        rel, cos, mx = ab.summary()
        aa_rel, aa_cos, aa_mx = baseline.summary()
        if aa_rel is not None:
            aa_values.append(aa_rel)
        floor = max(numerics_floor, rel_aa * aa_rel) if aa_rel is not None else numerics_floor
        worst: list[PositionDoc] = []
        if ab.rel_l2:
            order = np.argsort(-np.asarray(ab.rel_l2), kind="stable")[:WORST_POSITIONS]
            worst = [
                _position(ab.labels[i], ab.positions[i], float(ab.rel_l2[i]),
                          boundary_flags(ab.positions[i], batches[ab.sequences[i]], tokens.get(ab.sequences[i], 0), where))
                for i in order if ab.rel_l2[i] > 0
            ]
        nonfinite = int(sum(ab.nonfinite))
        modules.append(ModuleDoc(
            layer=layer, module=module, title=MODULES.get(module, module), rows=len(ab.rel_l2), rel_l2=rel, cosine=cos,
            max_abs=mx, aa_rel_l2=aa_rel, aa_cosine=aa_cos, aa_max_abs=aa_mx, floor=floor,
            above=nonfinite > 0 or (rel is not None and rel > floor), worst=worst,
            not_reassembled="; ".join(dict.fromkeys(problems)) or None, nonfinite=nonfinite,
        ))
    aa_identical = None if aa is None or not aa_values else all(v == 0 for v in aa_values)
    return Localization(variant=variant.name, reference=reference.name, aa=aa.name if aa is not None else None,
                        numerics_floor=numerics_floor, rel_aa=rel_aa, modules=tuple(modules), aa_identical=aa_identical)


def _position(label: str, position: int, rel_l2: float, flags: tuple[str, ...]) -> PositionDoc:
    """One of a module's worst positions; a row NaN or inf on one side only (its rel_l2 inf) says so
    among its flags, its rel_l2 None."""
    finite = bool(np.isfinite(rel_l2))
    return PositionDoc(label=label, position=position, rel_l2=rel_l2 if finite else None,
                       flags=list(flags) + ([] if finite else [NONFINITE]))


def _order(module: str) -> int:
    names = list(MODULES)
    return names.index(module) if module in names else len(names)
