"""Teacher forcing: score the reference variant's exact sequences with this variant's engine.

Free-running traces stop being comparable at the first differing token: after it
the two contexts differ. Teacher forcing removes that cascade. Every variant (the
reference included) prefills the reference's prompt + generated continuation and
reports, at each continuation position, its logprob of the reference's token and
its own top-k. The result has the tokens.parquet layout and is stored as
teacher.parquet, so the same comparison code reads both.

The sequences come from the reference's samples/tokens tables: the reference
worker passes the tables it has just built, later workers read the reference's
files. Only generated samples take part (likelihood tasks generate nothing).
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import pyarrow as pa

from evalpipe.rundir import artifacts
from evalpipe.rundir.sequences import ReferenceSequence, shard_boundaries
from evalpipe.worker.engines import Engine, ScoreRequest, in_order


def prompt_positions(prompt_len: int, total_len: int, spec: Mapping[str, Any] | None) -> list[int]:
    """The prompt positions (absolute, 1..prompt_len-1) teacher forcing keeps.

    Empty for prompts shorter than ``min_prompt_tokens``; otherwise the last N, every
    Nth, and the positions around each shard boundary (for the prompt's own prefill
    and for the teacher-forced prefill of prompt + continuation) and block boundary."""
    if not spec or prompt_len < int(spec["min_prompt_tokens"]):
        return []
    keep: set[int] = set(range(max(1, prompt_len - int(spec["last"])), prompt_len))
    if int(spec["every"]) > 0:
        keep.update(range(int(spec["every"]), prompt_len, int(spec["every"])))
    edges: set[int] = set()
    for tp in spec["tp_sizes"]:
        edges.update(shard_boundaries(prompt_len, int(tp)))
        edges.update(shard_boundaries(total_len, int(tp)))
    for block in spec["block_sizes"]:
        edges.update(range(int(block), prompt_len, int(block)))
    around = int(spec["around"])
    for edge in edges:
        # the last token of one shard and the first of the next, `around` each side
        keep.update(range(edge - 1 - around, edge + around + 1))
    return sorted(p for p in keep if 1 <= p < prompt_len)


def teacher_force(
    engine: Engine,
    sequences: list[ReferenceSequence],
    topk: int,
    *,
    reverse_order: bool = False,
    token_text: Callable[[list[int]], list[str]] | None = None,
    progress: Callable[[int, int], None] | None = None,
    prompt_spec: Mapping[str, Any] | None = None,
) -> pa.Table:
    """Score every sequence's continuation and the chosen prompt positions
    (``prompt_positions``); one row per position (teacher.parquet). ``pos`` counts from
    the continuation's first token: prompt positions are negative (-1 = the prompt's
    last token), so one axis serves both and the keys stay unique."""
    requests = []
    for s in sequences:
        n = len(s.prompt_token_ids)
        kept = prompt_positions(n, n + len(s.continuation_ids), prompt_spec)
        requests.append(
            ScoreRequest(
                token_ids=s.prompt_token_ids + s.continuation_ids,
                start=n,
                positions=kept + list(range(n, n + len(s.continuation_ids))) if kept else None,
                label=f"teacher forcing {s.task} doc {s.doc_id}",
            )
        )
    # A continuation can only start at position >= 1 (position 0 has no logprob);
    # the reference generated after a non-empty prompt, so this always holds.
    results = (
        in_order(lambda reqs: engine.score(reqs, progress=progress, topk=topk), requests, reverse_order)
        if requests  # likelihood-only tasks generate nothing to force
        else []
    )
    cols: dict[str, list] = {name: [] for name in artifacts.TOKENS_REQUIRED}
    for seq, req, res in zip(sequences, requests, results):
        start = req.start
        positions = req.positions if req.positions is not None else range(start, len(req.token_ids))
        n = len(positions)
        cols["task"] += [seq.task] * n
        cols["doc_id"] += [seq.doc_id] * n
        cols["repeat"] += [seq.repeat] * n
        cols["pos"] += [p - start for p in positions]
        cols["token_id"] += [req.token_ids[p] for p in positions]
        cols["logprob"] += res.logprobs
        cols["topk_ids"] += res.topk_ids or [[] for _ in range(n)]
        cols["topk_logprobs"] += res.topk_logprobs or [[] for _ in range(n)]
    if token_text is not None:
        cols["token_text"] = token_text(cols["token_id"])
    return artifacts.tokens_table(cols)
