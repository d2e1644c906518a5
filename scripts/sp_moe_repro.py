"""Minimal reproduction of vLLM's single-token SP-MoE bug against a running vLLM server
(docs/sp-moe.md, Finding 1): the same greedy prompts sent all in one request and one per
request. A correct engine gives the same tokens both ways; vLLM 0.32.0 with sequence-
parallel MoE (DP > 1, TP > 1, expert parallel) does not, because a DP rank that decodes a
single sequence computes it wrongly.

    python scripts/sp_moe_repro.py http://127.0.0.1:8000 [--prompts 8] [--tokens 16]

Prints one line per prompt (same tokens or the first differing one, the largest
|Δlogprob| up to it) and a summary; exit code 1 when any prompt differs.
"""

from __future__ import annotations

import argparse
import sys

import httpx

PROMPT = "Question: Tom has {a} apples and buys {b} more. How many apples does he have now?\nAnswer:"


def complete(client: httpx.Client, url: str, model: str, prompts: list[str], tokens: int) -> list[dict]:
    reply = client.post(f"{url}/v1/completions", json={"model": model, "prompt": prompts, "max_tokens": tokens,
                                                        "temperature": 0, "logprobs": 1}, timeout=600)
    reply.raise_for_status()
    return sorted(reply.json()["choices"], key=lambda c: c["index"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("url")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    url = args.url.rstrip("/")
    prompts = [PROMPT.format(a=i + 3, b=2 * i + 1) for i in range(args.prompts)]
    with httpx.Client() as client:
        model = client.get(f"{url}/v1/models", timeout=60).json()["data"][0]["id"]
        batched = complete(client, url, model, prompts, args.tokens)
        alone = [complete(client, url, model, [p], args.tokens)[0] for p in prompts]
    differ = 0
    for i, (a, b) in enumerate(zip(batched, alone)):
        ta, tb = a["logprobs"]["tokens"], b["logprobs"]["tokens"]
        first = next((k for k, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        upto = len(ta) if first is None else first + 1
        dlp = max(abs(x - y) for x, y in zip(a["logprobs"]["token_logprobs"][:upto], b["logprobs"]["token_logprobs"][:upto]))
        differ += ta != tb
        print(f"prompt {i}: " + ("same tokens" if ta == tb else f"first differing token {first}") + f", max |Δlogprob| {dlp:.2g}")
    print(f"{differ} of {len(prompts)} prompts differ between one request per prompt and one request for all")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
