"""Before any engine starts: will this processor give a variant the attention backend it needs?

vLLM's CPU build chooses kernels by processor: for an MLA model (DeepSeek family, GLM-5)
it builds AMX_MLA on a CPU with AMX tiles and CPU_MLA elsewhere, and AMX_MLA takes
bfloat16 weights only. A config that runs on one x86 kind then fails at engine start on
another, or (with bfloat16) silently runs another kernel. :func:`ask` has the variant's
own vLLM say what it will build (:mod:`evalpipe.engine_patches.backend_choice`, run by
`evalpipe doctor` in the variant's interpreter; :func:`answered` reads its answer); :func:`judge`
holds that against the model's dtype and the variant's ``expect.switches.attention_backends``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

EXPECTED_KEY = "attention_backends"  # the switch the probes record from the built model


class BackendChoice(BaseModel):
    """What vLLM's CPU platform answered for one variant (see backend_choice.choose)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    use_mla: bool
    dtype: str
    backend: str
    supported_dtypes: list[str]
    amx_tile: bool
    avx512_bf16: bool

    def processor(self) -> str:
        features = [f for f, has in (("AMX tiles", self.amx_tile), ("AVX-512 bf16", self.avx512_bf16)) if has]
        return "this processor has " + " and ".join(features) if features else "this processor has neither AMX tiles nor AVX-512 bf16"


def request(model_path: Path, engine_args: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": str(model_path),
        "dtype": engine_args.get("dtype"),
        "attention_backend": engine_args.get("attention_backend"),
        "hf_overrides": engine_args.get("hf_overrides") or {},
        "trust_remote_code": bool(engine_args.get("trust_remote_code")),
    }


def answered(answer: dict[str, Any]) -> BackendChoice | str | None:
    """What the variant's vLLM said (backend_choice's JSON): its choice, why it could not
    say, or None when it is not on the CPU platform (an accelerator build chooses per
    device, at start)."""
    if "error" in answer:
        return f"vLLM could not say which attention backend it will build: {answer['error']}"
    if "platform" in answer:
        return None
    return BackendChoice(**answer)


def expected_backends(switches: dict[str, Any]) -> list[str] | None:
    """The backends a variant's expectations name, or None when they name none."""
    value = switches.get(EXPECTED_KEY)
    if value is None:
        return None
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def judge(choice: BackendChoice, expected: list[str] | None) -> tuple[bool, str]:
    """(passes, one sentence) for the doctor's line."""
    kind = "MLA model" if choice.use_mla else "model"
    built = f"vLLM's CPU platform builds {choice.backend} for this {kind} ({choice.processor()})"
    if choice.dtype not in choice.supported_dtypes:
        fix = ("set engine `attention_backend: CPU_MLA` (the reference MLA backend, any dtype) or run "
               f"`model.dtype: {choice.supported_dtypes[0]}`") if choice.backend == "AMX_MLA" else \
              f"run `model.dtype` as one of {', '.join(choice.supported_dtypes)} or choose another `attention_backend`"
        return False, f"{built}, which takes {', '.join(choice.supported_dtypes)} weights, not {choice.dtype}: the engine would fail at start; {fix}."
    if expected is not None and sorted(expected) != [choice.backend]:
        return False, (f"{built}, but the variant's `expect.switches.attention_backends` says {expected}: the run would be INCONCLUSIVE; "
                       f"pin the backend with engine `attention_backend: {expected[0]}` or correct the expectation.")
    return True, f"{built}, {choice.dtype}" + (", as expected" if expected is not None else "")
