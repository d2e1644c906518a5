"""What the compared engines compute in, and the absolute floors of the gates that follow from it.

A token gate's bound is max(floor, rel_aa x the A/A value). The A/A run measures the
engine's own run-to-run noise; the floor is what a *correct* change of the code may
still move on an engine of this precision, where the A/A run cannot say (a
deterministic engine's A/A is bitwise identical, so 3 x A/A = 0). A floor sized for
bf16 noise on an fp32 engine hides every systematic error smaller than bf16 rounding;
a floor sized for fp32 on a bf16 engine calls every reordered reduction a regression.
So the floors are a table by precision, and a gate whose ``abs`` is ``auto`` (the
default) reads its floor there. A number in the config overrides the table.

The precision is the reference's: the claim under test is "the variant reproduces the
reference's numerics", so an fp32 reference against a bf16 variant is judged with fp32
floors (and fails, configs/dtype_control.yaml). It comes from the reference's resolved
engine arguments (``dtype``), ``auto`` resolved through the model's config.json; when
it cannot be found the half-precision floors apply (the lenient side) and the report
says so.

Every floor (each gate's, in evalpipe/gates/registry.py) is justified by a measurement in
docs/numerics.md (which configs, which figures); the tests check that the document lists every floor.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from evalpipe.documents.comparison import NumericsDoc
from evalpipe.gates.registry import FP32, GATES, HALF, PRECISIONS

# dtype names as vLLM / transformers spell them -> precision class
_CLASSES = {
    "float32": FP32, "fp32": FP32, "float": FP32, "float64": FP32, "double": FP32,
    "bfloat16": HALF, "bf16": HALF, "float16": HALF, "fp16": HALF, "half": HALF,
}

# gate -> floor, per precision class, for a deterministic engine (A/A bitwise identical at
# the teacher-forced positions) or no A/A run; and where the A/A run is noisy. Each gate
# carries its own (evalpipe/gates/registry.py). Rationale and measurements: docs/numerics.md.
FLOORS: dict[str, dict[str, float]] = {p: {g.name: g.floors[p] for g in GATES if g.floors} for p in PRECISIONS}
NOISY_AA_FLOORS: dict[str, dict[str, float]] = {
    p: {g.name: g.noisy_aa_floors[p] for g in GATES if p in g.noisy_aa_floors} for p in PRECISIONS
}


# `evalpipe localize`: the relative L2 error of one module's output (reference vs variant,
# largest over the captured positions) that a correct change of summation order may still
# make, per precision, where the A/A run is bitwise identical. Measured in docs/numerics.md.
LOCALIZE_FLOORS: dict[str, float] = {FP32: 1e-5, HALF: 5e-2}


@dataclass(frozen=True, init=False)
class Numerics:
    """The reference's precision and what the A/A run showed, and the gate floors that follow:
    ``doc``, the document compare.json holds, built here with them (the rules below read it).

    ``aa_identical`` None: no A/A run (the relative bounds and the distributional gates
    have nothing to work with)."""

    doc: NumericsDoc

    def __init__(self, dtype: str | None = None, source: str = "unknown", aa_identical: bool | None = None) -> None:
        precision = _CLASSES.get((dtype or "").lower(), HALF)
        noisy = NOISY_AA_FLOORS[precision] if aa_identical is False else {}
        object.__setattr__(self, "doc", NumericsDoc(dtype=dtype, source=source, precision=precision, aa_identical=aa_identical,
                                                    floors={**FLOORS[precision], **noisy}))

    @property
    def dtype(self) -> str | None:
        return self.doc.dtype

    @property
    def precision(self) -> str:
        return self.doc.precision

    @property
    def known(self) -> bool:
        return (self.dtype or "").lower() in _CLASSES

    def floors(self) -> dict[str, float]:
        return dict(self.doc.floors)

    def floor(self, gate: str) -> float:
        return float(self.doc.floors[gate])

    @property
    def localize_floor(self) -> float:
        return LOCALIZE_FLOORS[self.precision]

    def describe(self) -> str:
        d = self.doc
        what = f"{d.dtype} ({d.source})" if self.known else f"precision unknown ({d.source}): half-precision floors"
        aa = {
            None: "no A/A run",
            True: "A/A bitwise identical at the teacher-forced positions",
            False: "A/A noisy at the teacher-forced positions",
        }[d.aa_identical]
        return f"{what}; {aa}"

    def with_aa(self, aa_identical: bool | None) -> "Numerics":
        return Numerics(self.doc.dtype, self.doc.source, aa_identical)


def _model_config_dtype(model: str) -> str | None:
    path = Path(model) / "config.json"
    if not path.is_file():
        return None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = cfg.get("torch_dtype") or cfg.get("dtype")
    return str(value) if value else None


def numerics_from_engine_args(engine_args: Mapping[str, Any] | None, where: str) -> Numerics:
    """The precision a variant ran in, from its resolved engine arguments (its manifest)."""
    args = engine_args or {}
    dtype = args.get("dtype")
    if dtype and str(dtype).lower() != "auto":
        return Numerics(str(dtype), f"dtype in {where}")
    model = args.get("model")
    found = _model_config_dtype(str(model)) if model else None
    if found:
        return Numerics(found, "the model's config.json (dtype auto)")
    return Numerics(None, f"no dtype in {where}")
