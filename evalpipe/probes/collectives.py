"""The collectives the probes record, by the name they record them under: one vocabulary
for the hooks that count them and for the config check of ``expect.per_forward``.

A collective is recorded as ``kind@group`` and, inside a forward pass, also as its bare
``kind``. Three sources, each with the kinds it can produce:

- torch.distributed's functions (group ``torch``): :data:`TORCH_COLLECTIVES`;
- vLLM's ``GroupCoordinator`` methods, under the name of their group (``tp``, ``ep`` ...,
  :data:`VLLM_GROUPS`): :data:`GROUP_COLLECTIVES`;
- the reference layout model's virtual ranks (group ``virtual``): :data:`VIRTUAL_COLLECTIVES`.

An expectation naming anything else (``all_to_all@tp``: vLLM's coordinator has no
all_to_all; a misspelt group) would count zero calls in every run: ``0`` would hold
whatever the engine did. So such a name is refused when the config is read.

Standard library only.
"""

from __future__ import annotations

import difflib

TORCH_GROUP = "torch"
VIRTUAL_GROUP = "virtual"

# function of torch.distributed -> kind
TORCH_COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
}
# method of vLLM's GroupCoordinator -> kind
GROUP_COLLECTIVES = {
    "all_reduce": "all_reduce",
    "all_gather": "all_gather",
    "all_gatherv": "all_gather",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatterv": "reduce_scatter",
    "gather": "gather",
    "dispatch": "dispatch",
    "combine": "combine",
}
# The group names GroupCoordinators are created with (the part of `unique_name` before
# ":"): vLLM's own (vllm/distributed/parallel_state.py) and vllm-ascend's
# (vllm_ascend/distributed/parallel_state.py). A group missing here is recorded under its
# name all the same, but an expectation can name it only once it is added here.
VLLM_GROUPS = (
    "world", "tp", "pp", "dp", "ep", "etp", "edp", "dcp", "pcp", "eplb", "inner_dp_world",
    "mc2", "mlp_tp", "otp", "lmheadtp", "lmhead",
)
# what the layout model's virtual ranks report (evalpipe.probes.runtime.collective)
VIRTUAL_COLLECTIVES = ("all_gather", "reduce_scatter", "all_to_all", "all_reduce")


def _recorded() -> dict[str, tuple[str, ...]]:
    """group -> the kinds recorded on it."""
    out = {TORCH_GROUP: tuple(dict.fromkeys(TORCH_COLLECTIVES.values()))}
    out.update({group: tuple(dict.fromkeys(GROUP_COLLECTIVES.values())) for group in VLLM_GROUPS})
    out[VIRTUAL_GROUP] = VIRTUAL_COLLECTIVES
    return out


RECORDED = _recorded()
# every kind any source records, in a stable order (the bare names of `per_forward`)
COLLECTIVE_KINDS = tuple(dict.fromkeys(kind for kinds in RECORDED.values() for kind in kinds))


def recorded_names() -> list[str]:
    """Every collective name a probe record can hold: each kind, and each kind@group."""
    return [*COLLECTIVE_KINDS, *(f"{kind}@{group}" for group, kinds in RECORDED.items() for kind in kinds)]


def looks_collective(name: str) -> bool:
    """Meant as a collective (a kind, or anything with `@`), not as a function's dotted name."""
    return "@" in name or "." not in name


def is_recorded(name: str) -> bool:
    kind, at, group = name.partition("@")
    return kind in RECORDED.get(group, ()) if at else kind in COLLECTIVE_KINDS


def collective_problem(name: str) -> str | None:
    """Why the probes never record ``name`` (one clause with the closest name they do), or None."""
    if is_recorded(name):
        return None
    kind, at, group = name.partition("@")
    if at and not group:
        why = "nothing follows `@` (name a group, or drop the `@` for every group)"
    elif at and kind in COLLECTIVE_KINDS and group in RECORDED:
        why = f"no {kind} is recorded on group `{group}` (its kinds: {', '.join(RECORDED[group])})"
    elif at and kind in COLLECTIVE_KINDS:
        why = f"`{group}` is not a group the probes know ({', '.join(RECORDED)})"
    else:
        why = f"`{kind}` is not a collective kind the probes record ({', '.join(COLLECTIVE_KINDS)})"
    close = difflib.get_close_matches(name.lower(), recorded_names(), n=1, cutoff=0.5)
    meant = f"; did you mean `{close[0]}`?" if close else ""
    return f"the probes never record `{name}`: {why}{meant}"


def virtual(kind: str) -> str:
    """The record's name of a virtual-rank collective; a kind outside the vocabulary is a bug of its caller."""
    if kind not in VIRTUAL_COLLECTIVES:
        raise ValueError(f"`{kind}` is not a virtual collective the probes record ({', '.join(VIRTUAL_COLLECTIVES)})")
    return f"{kind}@{VIRTUAL_GROUP}"
