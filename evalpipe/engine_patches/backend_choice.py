"""Ask a variant's own vLLM which attention backend its CPU platform will build, on this processor.

    python -m evalpipe.engine_patches.backend_choice < request.json

``request.json``: ``{"model": path, "dtype": ..., "attention_backend": name or null,
"hf_overrides": {...}, "trust_remote_code": bool}``. Prints one line, ``EVALPIPE_BACKEND_CHOICE {...}``:
``{"use_mla", "dtype", "backend", "supported_dtypes", "amx_tile", "avx512_bf16"}``, ``{"platform": name}``
when vLLM is not on its CPU platform here, or ``{"error": ...}``.

Why ask rather than know: vLLM's CPU platform picks the backend from the processor
(``CpuPlatform.get_attn_backend_cls`` prefers AMX_MLA for MLA models whenever the CPU has
AMX tiles, unless CPU_MLA is asked for), and AMX_MLA takes bfloat16 weights only, so a
float32 config that runs on an AMD EPYC fails at engine start on an Intel Xeon. The rule
lives in vLLM and changes with it; the variant's interpreter is the one that will apply it.
Only the CPU platform is asked: an accelerator build picks per device, at start.

Runs in the variant's interpreter (as engine_patches.checks does): standard library and that interpreter's vLLM.
`evalpipe doctor` calls :func:`choose` there, in the one process that answers all its questions.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace
from typing import Any

MARK = "EVALPIPE_BACKEND_CHOICE "


def choose(request: dict[str, Any]) -> dict[str, Any]:
    """What vLLM's CPU platform will build for ``request`` on this processor."""
    import torch
    from vllm.config import ModelConfig
    from vllm.platforms import current_platform
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if not current_platform.is_cpu():
        return {"platform": str(current_platform.device_name)}
    # architectures that plugins register (evalpipe's layout model among them) exist only after this
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    model = ModelConfig(model=request["model"], dtype=request.get("dtype") or "auto",
                        hf_overrides=request.get("hf_overrides") or {},
                        trust_remote_code=bool(request.get("trust_remote_code")))
    name = request.get("attention_backend")
    selected = AttentionBackendEnum[name] if name else None
    # get_attn_backend_cls reads these two fields of the selector config on the CPU platform
    selector: Any = SimpleNamespace(use_sparse=False, use_mla=bool(model.use_mla))
    path = CpuPlatform.get_attn_backend_cls(selected, selector)  # type: ignore[arg-type]  # None: nothing asked for, as vLLM passes it
    backend = resolve_obj_by_qualname(path)
    return {
        "use_mla": bool(model.use_mla),
        "dtype": str(model.dtype).removeprefix("torch."),
        "backend": backend.get_name(),
        "supported_dtypes": [str(d).removeprefix("torch.") for d in backend.supported_dtypes],
        "amx_tile": bool(torch.cpu._is_amx_tile_supported()),
        "avx512_bf16": bool(torch.cpu._is_avx512_bf16_supported()),
    }


def main() -> None:
    try:
        answer = choose(json.load(sys.stdin))
    except Exception as err:  # noqa: BLE001 - whatever stops vLLM from answering is the answer
        answer = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}
    print(MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
