"""Minimal reproductions of two ways vLLM's CPU build (0.32.0) changes kernels by processor.

    .venv/bin/python scripts/cpu_kernel_repro.py mla-fp32 [--backend CPU_MLA]
    .venv/bin/python scripts/cpu_kernel_repro.py attention-bf16 [--init-amx]

mla-fp32: the built-in tiny-moe (an MLA model) in float32, one prompt. On a processor with
AMX tiles, vLLM builds AMX_MLA unless CPU_MLA is asked for, and AMX_MLA refuses float32
weights at load ("expect weight to be bfloat16, ..."); elsewhere it builds CPU_MLA and runs.
`--backend CPU_MLA` runs on both kinds.

attention-bf16: the built-in tiny-gsm (a plain Llama) in bfloat16. On a processor with AMX
tiles, vLLM's CPU attention takes its "amx" ISA, whose kernel executes AMX tile instructions
without the process having asked Linux for AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM):
with the one-word default prompt the process dies with SIGILL in cpu_attention_with_kv_cache;
`--init-amx` (asking through torch first) runs, and so does a longer `--prompt` (another
kernel asks first on that path). Elsewhere the "vec" ISA runs.

Prints the processor's AMX flag, the kernels chosen and the first generated tokens; exits
with vLLM's error (or the signal) where the processor makes it fail. Runs the engine in this
process (no multiprocessing), one thread.
"""

from __future__ import annotations

import argparse
import os

os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", OMP_NUM_THREADS="1",
                  VLLM_CPU_OMP_THREADS_BIND="nobind")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("case", choices=("mla-fp32", "attention-bf16"))
    parser.add_argument("--backend", default=None, help="attention_backend engine argument (e.g. CPU_MLA)")
    parser.add_argument("--init-amx", action="store_true", help="ask Linux for AMX tile state first (torch._C._cpu._init_amx)")
    parser.add_argument("--prompt", default="hello")
    args = parser.parse_args()

    import torch

    from evalpipe.models.builtin import ensure_builtin

    if args.init_amx:
        print(f"AMX tile state granted: {torch._C._cpu._init_amx()}", flush=True)
    from vllm import LLM, SamplingParams

    from evalpipe.probes.engine_hooks import cpu_kernels

    name, dtype = ("tiny-moe", "float32") if args.case == "mla-fp32" else ("tiny-gsm", "bfloat16")
    extra = {"attention_backend": args.backend} if args.backend else {}
    llm = LLM(model=str(ensure_builtin(name).path), dtype=dtype, enforce_eager=True, max_model_len=512,
              distributed_executor_backend="uni", seed=0, **extra)
    out = llm.generate([args.prompt], SamplingParams(max_tokens=8, temperature=0))
    print(f"AMX tiles: {torch.cpu._is_amx_tile_supported()}")
    model = llm.llm_engine.model_executor.driver_worker.worker.model_runner.model
    backends = sorted({m.attn_backend.get_name() for m in model.modules() if getattr(m, "attn_backend", None) is not None})
    print(f"attention backends: {backends}; kernels: {cpu_kernels(model)}")
    print(f"generated: {out[0].outputs[0].token_ids}")


if __name__ == "__main__":
    main()
