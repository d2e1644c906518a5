"""Run the reference layout model under many settings on one engine and record what moved.

    python -m evalpipe.lab.layout.probe [--plain] [--prompts 8] [--max-tokens 48] [--out FILE] SETTING...

SETTING is ``LAYOUT[@SCALE][:FAULT+FAULT...]`` (``sp``, ``sp:heads_permuted``,
``sp@16384:scale_after_reduce``) or ``env``: whatever ``EVALPIPE_LAYOUT`` /
``EVALPIPE_LAYOUT_FAULT`` selected when the engine started. Every setting greedily
continues the same GSM8K-style 4-shot prompts (the built-in synthetic set) and
teacher-forces one reference sequence per prompt (prompt + the first run's continuation;
with ``--plain``, the plain Llama model's; with ``--reference-from``, an earlier probe's),
so logprobs are compared position by position without any cascade after a divergence.

An engine start costs seconds, a settings switch nothing: the layout engine is started
once (prefix caching off, so no KV computed under one setting serves another) and
switched between settings with ``LayoutForCausalLM.use_settings``. Switching needs the
model in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the default here); with a
spawned engine core only ``env`` is available.

Writes one JSON document: per setting the texts, token ids and logprobs of the greedy
continuations, the teacher-forced logprob and argmax of every reference position, or the
error the setting raised.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from evalpipe.data.gsm_synth import make_splits
from evalpipe.lab.layout.faults import FAULT_ENV
from evalpipe.lab.layout.plugin import ARCHITECTURE
from evalpipe.lab.layout.settings import LAYOUT_ENV, LayoutSettings, resolve
from evalpipe.models.builtin import ensure_builtin

STOP = ["\n\n", "Question:"]


def gsm_prompts(count: int, shots: int = 4) -> list[str]:
    """lm-eval's gsm8k few-shot layout over the built-in synthetic set."""
    splits = make_splits()
    head = "".join(f"Question: {d['question']}\nAnswer: {d['answer']}\n\n" for d in splits["train"][:shots])
    return [head + f"Question: {d['question']}\nAnswer:" for d in splits["test"][:count]]


def parse_setting(spec: str, num_heads: int, tp: int) -> LayoutSettings:
    """``sp@16384:a+b`` -> LayoutSettings, validated exactly like the environment is."""
    head, _, faults = spec.partition(":")
    layout, _, scale = head.partition("@")
    config = SimpleNamespace(num_attention_heads=num_heads, layout_tp=tp, layout_out_scale=float(scale or 1.0))
    return resolve(config, {LAYOUT_ENV: layout, FAULT_ENV: faults.replace("+", ",")})


def _settings_of(model) -> str:
    return model.layout_settings().describe()


def _engine(model_path: str, layout: bool, tp: int, max_num_seqs: int):
    from vllm import LLM

    args: dict[str, Any] = dict(
        model=model_path, dtype="float32", enforce_eager=True, max_model_len=4096, seed=0,
        enable_prefix_caching=False, max_num_seqs=max_num_seqs,
    )
    if layout:
        args["hf_overrides"] = {"architectures": [ARCHITECTURE], "layout_tp": tp}
    return LLM(**args)


def _generate(llm, prompts: list[str], max_tokens: int) -> dict[str, list]:
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=1, stop=STOP)
    outs = llm.generate(prompts, params, use_tqdm=False)
    comps = [o.outputs[0] for o in outs]
    return {
        "prompt_ids": [list(o.prompt_token_ids) for o in outs],
        "texts": [c.text for c in comps],
        "token_ids": [list(c.token_ids) for c in comps],
        "logprobs": [[c.logprobs[i][t].logprob for i, t in enumerate(c.token_ids)] for c in comps],
    }


def _teacher(llm, sequences: list[list[int]]) -> dict[str, list]:
    """Logprob and argmax of every position of each sequence after the first."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
    outs = llm.generate([{"prompt_token_ids": s} for s in sequences], params, use_tqdm=False)
    logprobs, argmax = [], []
    for seq, out in zip(sequences, outs):
        positions = out.prompt_logprobs[1:]
        logprobs.append([pos[tok].logprob for tok, pos in zip(seq[1:], positions)])
        argmax.append([next(t for t, lp in pos.items() if lp.rank == 1) for pos in positions])
    return {"tf_logprobs": logprobs, "tf_argmax": argmax}


def _run(llm, prompts: list[str], max_tokens: int, reference: list[list[int]] | None) -> tuple[dict, list[list[int]]]:
    gen = _generate(llm, prompts, max_tokens)
    if reference is None:
        reference = [p + t for p, t in zip(gen["prompt_ids"], gen["token_ids"])]
    gen.pop("prompt_ids")
    return {**gen, **_teacher(llm, reference)}, reference


def probe(
    settings: list[str], *, plain: bool, prompts: int, max_tokens: int, tp: int, max_num_seqs: int,
    reference: list[list[int]] | None = None,
) -> dict:
    model_path = str(ensure_builtin("tiny-gsm").path)
    texts = gsm_prompts(prompts)
    result: dict[str, Any] = {"model": model_path, "prompts": len(texts), "results": {}}
    if plain:
        t0 = time.monotonic()
        llm = _engine(model_path, layout=False, tp=tp, max_num_seqs=max_num_seqs)
        result["results"]["plain"], reference = _run(llm, texts, max_tokens, reference)
        result["results"]["plain"]["seconds"] = time.monotonic() - t0
        _close(llm)
        del llm

    t0 = time.monotonic()
    llm = _engine(model_path, layout=True, tp=tp, max_num_seqs=max_num_seqs)
    result["engine_start_s"] = time.monotonic() - t0
    # A spawned engine core would need pickled callables to reach the model; there the
    # engine log's settings line is the record.
    local = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
    result["env_settings"] = llm.apply_model(_settings_of)[0] if local else None
    hf = llm.llm_engine.model_config.hf_config
    for spec in settings:
        t0 = time.monotonic()
        entry: dict[str, Any]
        try:
            if spec != "env":
                if not local:
                    raise RuntimeError("switching settings needs VLLM_ENABLE_V1_MULTIPROCESSING=0")
                chosen = parse_setting(spec, hf.num_attention_heads, tp)
                llm.apply_model(lambda m, s=chosen: m.use_settings(s))
            entry, reference = _run(llm, texts, max_tokens, reference)
            entry["settings"] = llm.apply_model(_settings_of)[0] if local else None
        except Exception as exc:  # recorded: a setting may be meant to fail
            entry = {"error": f"{type(exc).__name__}: {exc}"}
        entry["seconds"] = time.monotonic() - t0
        result["results"][spec] = entry
    _close(llm)
    result["reference"] = reference
    return result


def _close(llm) -> None:
    """Stop the engine core now: left to interpreter teardown, a spawned one aborts the exit."""
    llm.llm_engine.engine_core.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("settings", nargs="+")
    parser.add_argument("--plain", action="store_true", help="also run the plain Llama model first; its sequences are the reference")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--tp", type=int, default=4, help="virtual tensor-parallel ranks (layout_tp)")
    parser.add_argument("--max-num-seqs", type=int, default=8)
    parser.add_argument("--reference-from", help="teacher-force the reference sequences of an earlier probe's JSON")
    parser.add_argument("--out", help="write the JSON here instead of stdout")
    args = parser.parse_args(argv)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    doc = probe(
        args.settings, plain=args.plain, prompts=args.prompts, max_tokens=args.max_tokens, tp=args.tp,
        max_num_seqs=args.max_num_seqs,
        reference=json.loads(Path(args.reference_from).read_text())["reference"] if args.reference_from else None,
    )
    text = json.dumps(doc)
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
