"""Whether the engine patches fit the vLLM at hand: `evalpipe doctor` calls :func:`run_all` in a
variant's interpreter (in the one process that answers all its questions there; :func:`main`
prints the same alone), tests/engine_patches/test_engine_patches.py calls the checks directly.

Each check is (name, ok, detail). A patch that no longer applies, or whose gap upstream
has closed (then it is unnecessary), is not ok; so is an installation whose vLLM does
not load the plugin at all.
"""

from __future__ import annotations

import inspect
import json
import textwrap
from importlib.metadata import entry_points

from evalpipe.engine_patches import sp_moe
from evalpipe.engine_patches.switches import VLLM_VERSION

ENTRY_POINT = "evalpipe_engine_patches"
Result = tuple[str, bool, str]


def plugin_registered() -> Result:
    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == ENTRY_POINT]
    if not found:
        return ("plugin", False, f"no vllm.general_plugins entry point {ENTRY_POINT!r} in this interpreter: vLLM will "
                "not load the engine patches; install evalpipe into it (pip install -e <evalpipe checkout>)")
    return ("plugin", True, f"{ENTRY_POINT} -> {found[0].value}")


def vllm_version() -> Result:
    import vllm

    installed = str(vllm.__version__).split("+")[0]
    ok = installed == VLLM_VERSION
    return ("vllm version", ok, f"vLLM {installed}" + ("" if ok else f"; the patches were written for {VLLM_VERSION}: "
                                                        "re-check them (docs/sp-moe.md)"))


def cpu_collectives_gap() -> Result:
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    own = [name for name in ("all_gatherv", "reduce_scatterv") if name in vars(CpuCommunicator)]
    if own:
        return ("cpu_all_gatherv", False, f"vLLM's CpuCommunicator has its own {', '.join(own)} now: the workaround "
                "is unnecessary; drop it")
    return ("cpu_all_gatherv", True, "CpuCommunicator still lacks all_gatherv / reduce_scatterv")


def cpu_experts_gap() -> Result:
    from vllm.model_executor.layers.fused_moe.experts.cpu_moe import CPUUnquantizedExperts

    source = textwrap.dedent(inspect.getsource(CPUUnquantizedExperts.apply))
    body = source.split(") -> None:", 1)[-1]
    if "expert_map" in body:
        return ("cpu_experts_expert_map", False, "CPUUnquantizedExperts.apply reads expert_map now: the workaround "
                "may be unnecessary; re-check it")
    return ("cpu_experts_expert_map", True, "CPUUnquantizedExperts.apply still ignores expert_map")


def sp_moe_fix_applies() -> Result:
    from vllm.model_executor.models import deepseek_v2

    try:
        for qualname in sp_moe.EDITS:
            owner = getattr(deepseek_v2, qualname.split(".")[0])
            sp_moe.edited_source(qualname, textwrap.dedent(inspect.getsource(owner.forward)))
    except sp_moe.SourceChanged as err:
        return ("sp_moe_fixed", False, str(err))
    return ("sp_moe_fixed", True, "deepseek_v2.py still infers the SP layout from row counts; the fix applies")


def run_all() -> list[Result]:
    checks = [plugin_registered()]
    try:
        checks.append(vllm_version())
    except ImportError as err:
        return [*checks, ("vllm version", False, f"vLLM does not import: {err}")]
    return [*checks, cpu_collectives_gap(), cpu_experts_gap(), sp_moe_fix_applies()]


MARK = "EVALPIPE_PATCHES "


def main() -> None:
    print(MARK + json.dumps(run_all()), flush=True)
