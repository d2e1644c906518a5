"""The reference's sequences in a run directory: each generated sample's prompt token ids
and continuation, as the reference produced them. Teacher forcing scores them with every
variant; `evalpipe localize` sends the most divergent ones through each configuration
again. Also where a sequence's shard boundaries lie, for both."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from evalpipe.errors import UserError
from evalpipe.paths import file_problem
from evalpipe.rundir import artifacts
from evalpipe.rundir.integrity import verify_variant


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
        raise UserError(
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
    """The reference's generated sequences, from files that match its manifest (an
    ArtifactMismatch, a ValueError naming the file, for one altered since it finished).
    Only the two tables read are checked: on a cluster the reference may still be running
    beside us, its parent adding probes.json to the record as we read."""
    vdir = artifacts.VariantDir(reference_dir)
    for path in (vdir.samples, vdir.tokens):
        problem = file_problem(path)
        if problem is not None:
            raise UserError(f"teacher forcing needs the reference's {path.name}, but {path} {problem}.")
    verify_variant(vdir, files=(artifacts.SAMPLES_PARQUET, artifacts.TOKENS_PARQUET))
    return reference_sequences(artifacts.read_table(vdir.samples), artifacts.read_table(vdir.tokens))


def shard_boundaries(n_tokens: int, tp: int) -> list[int]:
    """Where the T contiguous shards of an n-token batch start (padded to a multiple of
    T, so every shard holds ceil(n/T) tokens); the first shard's start (0) excluded."""
    size = -(-n_tokens // tp)
    return [k * size for k in range(1, tp) if k * size < n_tokens]
