"""Does vLLM draw a seeded request's sample independently of its batch?

The measurement behind docs/sampling.md's "per-request seeds across batch shapes": one
`vllm.LLM` (the built-in model, float32, temperature 0.6), 12 prompts with a seed each,
then the same prompts
  1. with the same seeds, sent in reverse order (other batch rows);
  2. with the same seeds, the first 3 each alone (batch of one);
  3. with other seeds (the seeds are honoured: the samples change);
  4. without seeds, twice (what common random numbers lose without a seed).
Prints how many token sequences of each came out identical to the first pass, and the
CPU kind it ran on. Nothing is timed.

    .venv/bin/python benchmarks/seed_coupling.py [--prompts 12] [--tokens 40]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEMPERATURE = 0.6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--tokens", type=int, default=40)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    from vllm import LLM, SamplingParams

    from evalpipe.config.sampling import sample_seed
    from evalpipe.machine import describe, one_line
    from evalpipe.models.builtin import ensure_builtin

    model = ensure_builtin("tiny-gsm")
    llm = LLM(model=str(model.path), dtype="float32", enforce_eager=True, seed=0, max_model_len=1024)
    prompts = [f"Question: Tom has {3 + i} apples and buys {2 * i + 1} more. How many apples does he have?\nAnswer:"
               for i in range(args.prompts)]
    seeds = [sample_seed(1234, "coupling", i, 0, 0) for i in range(args.prompts)]

    def draw(indices: list[int], seed_of) -> dict[int, tuple[int, ...]]:
        params = [SamplingParams(temperature=TEMPERATURE, max_tokens=args.tokens, seed=seed_of(i), ignore_eos=True)
                  for i in indices]
        outs = llm.generate([prompts[i] for i in indices], params, use_tqdm=False)
        return {i: tuple(o.outputs[0].token_ids) for i, o in zip(indices, outs)}

    every = list(range(args.prompts))
    first = draw(every, lambda i: seeds[i])
    reversed_order = draw(every[::-1], lambda i: seeds[i])
    alone = {}
    for i in every[:3]:
        alone.update(draw([i], lambda i: seeds[i]))
    other_seeds = draw(every, lambda i: seeds[i] ^ 0x5A5A5)
    unseeded_a = draw(every, lambda i: None)
    unseeded_b = draw(every[::-1], lambda i: None)

    def same(a: dict, b: dict) -> str:
        keys = sorted(set(a) & set(b))
        return f"{sum(a[k] == b[k] for k in keys)}/{len(keys)}"

    print(f"machine: {one_line(describe())}")
    print(f"{args.prompts} prompts, temperature {TEMPERATURE}, {args.tokens} tokens each, one vllm.LLM")
    print(f"  same seeds, reverse order:        {same(first, reversed_order)} identical token sequences")
    print(f"  same seeds, alone vs batched:     {same(first, alone)} identical")
    print(f"  other seeds:                      {same(first, other_seeds)} identical")
    print(f"  no seed, twice (other orders):    {same(unseeded_a, unseeded_b)} identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
