"""evalpipe/compare/targets.py: localize's targets, the sequences that diverge most when teacher-forced and their rows worth capturing (the worst position, the prompt's and the continuation's ends, the shard boundaries)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from evalpipe.compare.targets import choose_targets, teacher_divergence
from evalpipe.rundir.sequences import ReferenceSequence


def _teacher(rows: list[tuple[int, int, float]]) -> pa.Table:
    return pa.table({"task": ["t"] * len(rows), "doc_id": [r[0] for r in rows], "repeat": [0] * len(rows),
                     "pos": [r[1] for r in rows], "logprob": [r[2] for r in rows]})


def test_the_most_divergent_sequences_and_their_worst_rows_are_chosen():
    seqs = [ReferenceSequence("t", d, 0, prompt_token_ids=list(range(10)), continuation_ids=[1, 2, 3, 4]) for d in range(3)]
    ref = _teacher([(d, p, -1.0) for d in range(3) for p in range(4)])
    var = _teacher([(d, p, -1.0 - (0.5 if (d, p) == (2, 1) else 0.1 if (d, p) == (0, 3) else 0.0)) for d in range(3) for p in range(4)])
    assert teacher_divergence(ref, var)[("t", 2, 0)][1] == (1, pytest.approx(0.5))
    targets = choose_targets(seqs, ref, var, samples=2, positions=1, tp_sizes=(4,))
    assert [t.label for t in targets] == ["t doc 2", "t doc 0"]
    rows = targets[0].rows
    # position 11 (continuation pos 1) is predicted from row 10
    assert rows[10] == ["teacher-forced |Δlogprob| 0.5 at position 11"]
    assert rows[9] == ["last prompt token"] and rows[13] == ["last token"]
    # 14 tokens on 4 ranks: shards of 4, boundaries at 4, 8, 12
    assert {3, 4, 7, 8, 11, 12} <= set(rows) and "first token of a shard (T = 4)" in rows[12]
    assert targets[0].token_ids == list(range(10)) + [1, 2, 3, 4]


def test_decode_mode_keeps_the_first_generated_tokens_rows():
    seqs = [ReferenceSequence("t", 0, 0, prompt_token_ids=list(range(10)), continuation_ids=[1, 2, 3, 4])]
    ref = _teacher([(0, p, -1.0) for p in range(4)])
    targets = choose_targets(seqs, ref, ref, samples=1, positions=2, decode_steps=3)
    rows = targets[0].rows
    # no teacher-forced difference at all: the decode rows are kept regardless
    assert [r for r, why in rows.items() if any("decode step" in w for w in why)] == [10, 11, 12]
    assert rows[10] == ["decode step 1 (one token per forward pass)"] and targets[0].prompt_len == 10
