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

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow as pa

from evalpipe import artifacts
from evalpipe.worker.engines import Engine, ScoreRequest, in_order


@dataclass(frozen=True)
class ReferenceSequence:
    task: str
    doc_id: int
    repeat: int
    prompt_token_ids: list[int]
    continuation_ids: list[int]


def reference_sequences(samples: pa.Table, tokens: pa.Table) -> list[ReferenceSequence]:
    """The reference's (prompt, continuation) token ids per generated sample, in key order."""
    if artifacts.PROMPT_IDS_COLUMN not in samples.column_names:
        raise ValueError(
            "the reference's samples.parquet has no prompt_token_ids column (written by an older evalpipe); "
            "re-run the reference variant to enable teacher forcing."
        )
    continuation: dict[tuple[str, int, int], list[int]] = {}
    order = np.lexsort(
        [tokens.column(c).to_numpy(zero_copy_only=False) for c in ("pos", "repeat", "doc_id", "task")]
    )
    cols = tokens.take(pa.array(order)).select(["task", "doc_id", "repeat", "token_id"]).to_pydict()
    for task, doc, rep, tid in zip(cols["task"], cols["doc_id"], cols["repeat"], cols["token_id"]):
        continuation.setdefault((task, int(doc), int(rep)), []).append(int(tid))
    rows = samples.select(["task", "doc_id", "repeat", artifacts.PROMPT_IDS_COLUMN]).to_pylist()
    out = []
    for row in sorted(rows, key=lambda r: (r["task"], r["doc_id"], r["repeat"])):
        key = (row["task"], int(row["doc_id"]), int(row["repeat"]))
        prompt = row[artifacts.PROMPT_IDS_COLUMN]
        if prompt is None or not continuation.get(key):
            continue
        out.append(ReferenceSequence(*key, prompt_token_ids=list(prompt), continuation_ids=continuation[key]))
    return out


def read_reference_sequences(reference_dir: Path) -> list[ReferenceSequence]:
    vdir = artifacts.VariantDir(reference_dir)
    for path in (vdir.samples, vdir.tokens):
        if not path.is_file():
            raise ValueError(f"teacher forcing needs the reference's {path.name}, but {path} does not exist.")
    return reference_sequences(artifacts.read_table(vdir.samples), artifacts.read_table(vdir.tokens))


def teacher_force(
    engine: Engine,
    sequences: list[ReferenceSequence],
    topk: int,
    *,
    reverse_order: bool = False,
    token_text: Callable[[list[int]], list[str]] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> pa.Table:
    """Score every sequence's continuation; one row per continuation position (teacher.parquet)."""
    requests = [
        ScoreRequest(token_ids=s.prompt_token_ids + s.continuation_ids, start=len(s.prompt_token_ids))
        for s in sequences
    ]
    # A continuation can only start at position >= 1 (position 0 has no logprob);
    # the reference generated after a non-empty prompt, so this always holds.
    results = (
        in_order(lambda reqs: engine.score(reqs, progress=progress, topk=topk), requests, reverse_order)
        if requests  # likelihood-only tasks generate nothing to force
        else []
    )
    cols: dict[str, list] = {name: [] for name in artifacts.TOKENS_REQUIRED}
    for seq, res in zip(sequences, results):
        n = len(seq.continuation_ids)
        cols["task"] += [seq.task] * n
        cols["doc_id"] += [seq.doc_id] * n
        cols["repeat"] += [seq.repeat] * n
        cols["pos"] += list(range(n))
        cols["token_id"] += seq.continuation_ids
        cols["logprob"] += res.logprobs
        cols["topk_ids"] += res.topk_ids or [[] for _ in range(n)]
        cols["topk_logprobs"] += res.topk_logprobs or [[] for _ in range(n)]
    if token_text is not None:
        cols["token_text"] = token_text(cols["token_id"])
    return artifacts.tokens_table(cols)
