"""What the reference layout model is told to do: layout, faults, rank count, output scale.

The layout and the faults come from the engine's environment (``EVALPIPE_LAYOUT``,
``EVALPIPE_LAYOUT_FAULT``), the way a user flips a vllm-ascend switch; the rank count and
the output scale come from the model config (``layout_tp``, ``layout_out_scale``, set
through the engine's ``hf_overrides``). Every invalid combination is a ValueError with
one sentence saying what to fix, raised when the model is built.

Pure Python: importable without torch or vLLM.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from evalpipe.engine_patches.switches import LAYOUT_ENV, parse_layout
from evalpipe.lab.layout.faults import FAULT_ENV, FAULTS, parse_faults

DEFAULT_TP = 4


@dataclass(frozen=True)
class LayoutSettings:
    layout: str = "legacy"
    tp: int = DEFAULT_TP
    out_scale: float = 1.0
    faults: frozenset[str] = field(default_factory=frozenset)

    def has(self, fault: str) -> bool:
        return fault in self.faults

    def describe(self) -> str:
        faults = ",".join(sorted(self.faults)) or "none"
        return f"layout={self.layout} tp={self.tp} out_scale={self.out_scale:g} faults={faults}"


def resolve(hf_config: Any, environ: Mapping[str, str] | None = None) -> LayoutSettings:
    env = os.environ if environ is None else environ
    layout = parse_layout(env.get(LAYOUT_ENV))
    faults = parse_faults(env.get(FAULT_ENV))

    num_heads = int(hf_config.num_attention_heads)
    tp = getattr(hf_config, "layout_tp", DEFAULT_TP)
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= num_heads:
        raise ValueError(
            f"layout_tp={tp!r}: the number of virtual tensor-parallel ranks must be an integer from 1 to the "
            f"model's {num_heads} attention heads (each rank needs at least one head)."
        )
    scale = getattr(hf_config, "layout_out_scale", 1.0)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
        raise ValueError(f"layout_out_scale={scale!r} must be a positive finite number (1.0: no output scale).")
    scale = float(scale)

    for name in sorted(faults):
        fault = FAULTS[name]
        if fault.layout not in (layout, "any"):
            raise ValueError(
                f"{FAULT_ENV}: fault {name!r} acts on the {fault.layout} layout; set {LAYOUT_ENV}={fault.layout} "
                f"(it is {layout})."
            )
        if fault.needs_scale and scale == 1.0:
            raise ValueError(
                f"{FAULT_ENV}: fault {name!r} only exists with an output scale; set layout_out_scale in the "
                "engine's hf_overrides (e.g. 16384)."
            )
    return LayoutSettings(layout=layout, tp=tp, out_scale=scale, faults=faults)
