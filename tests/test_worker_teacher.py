"""Teacher forcing's bookkeeping (which sequences, which positions) with a stand-in engine.

The real engine's side (prompt_logprobs through vLLM) is covered by the end-to-end run."""

import pytest

from evalpipe import artifacts
from evalpipe.worker.engines import ScoreResult
from evalpipe.worker.teacher import read_reference_sequences, reference_sequences, teacher_force


def _reference_tables():
    rows = [
        {"task": "t", "doc_id": 1, "repeat": 0, "prompt_hash": "h1", "prompt": "p", "target": "1", "response": "r",
         "n_tokens": 2, "finish_reason": "stop", artifacts.PROMPT_IDS_COLUMN: [5, 6, 7]},
        {"task": "t", "doc_id": 0, "repeat": 0, "prompt_hash": "h0", "prompt": "p", "target": "0", "response": "r",
         "n_tokens": 3, "finish_reason": "stop", artifacts.PROMPT_IDS_COLUMN: [8, 9]},
        # a likelihood item: no prompt ids, no generated tokens -> not teacher-forced
        {"task": "mc", "doc_id": 0, "repeat": 0, "prompt_hash": "h", "prompt": "p", "target": "0", "response": "[]",
         "n_tokens": 0, "finish_reason": None, artifacts.PROMPT_IDS_COLUMN: None},
    ]
    # token rows deliberately out of order
    tokens = {
        "task": ["t"] * 5, "doc_id": [1, 0, 0, 1, 0], "repeat": [0] * 5, "pos": [1, 2, 0, 0, 1],
        "token_id": [21, 12, 10, 20, 11], "logprob": [-0.1] * 5, "topk_ids": [[1]] * 5, "topk_logprobs": [[-0.1]] * 5,
    }
    return artifacts.samples_table(rows), artifacts.tokens_table(tokens)


class RecordingEngine:
    """Scores position i of every sequence as -(token id)/100 and ranks ids 1..k after it."""

    def __init__(self):
        self.calls = []

    def score(self, requests, progress=None, topk=1):
        self.calls.append(([r.token_ids for r in requests], topk))
        out = []
        for r in requests:
            scored = r.token_ids[r.start:]
            out.append(ScoreResult(
                logprobs=[-t / 100 for t in scored],
                is_greedy=[True] * len(scored),
                topk_ids=[[t] + list(range(1, topk)) for t in scored],
                topk_logprobs=[[-t / 100] + [-5.0] * (topk - 1) for t in scored],
            ))
        return out


def test_reference_sequences_join_prompt_ids_and_ordered_continuations():
    seqs = reference_sequences(*_reference_tables())
    assert [(s.task, s.doc_id) for s in seqs] == [("t", 0), ("t", 1)]
    assert seqs[0].prompt_token_ids == [8, 9] and seqs[0].continuation_ids == [10, 11, 12]
    assert seqs[1].prompt_token_ids == [5, 6, 7] and seqs[1].continuation_ids == [20, 21]


def test_teacher_force_scores_exactly_the_continuations_in_either_order():
    seqs = reference_sequences(*_reference_tables())
    for reverse in (False, True):
        engine = RecordingEngine()
        table = teacher_force(engine, seqs, topk=3, reverse_order=reverse, token_text=lambda ids: [f"<{i}>" for i in ids])
        sent, topk = engine.calls[0]
        assert topk == 3
        expected = [[8, 9, 10, 11, 12], [5, 6, 7, 20, 21]]
        assert sent == (expected[::-1] if reverse else expected)
        cols = table.to_pydict()
        assert cols["doc_id"] == [0, 0, 0, 1, 1] and cols["pos"] == [0, 1, 2, 0, 1]
        assert cols["token_id"] == [10, 11, 12, 20, 21]
        assert cols["logprob"] == pytest.approx([-0.10, -0.11, -0.12, -0.20, -0.21])
        assert cols["topk_ids"][3] == [20, 1, 2]
        assert cols["token_text"][0] == "<10>"
        assert table.schema == artifacts.TOKENS_SCHEMA


def test_old_reference_without_prompt_ids_gives_one_clear_sentence(tmp_path):
    samples, tokens = _reference_tables()
    samples = samples.drop_columns([artifacts.PROMPT_IDS_COLUMN])
    vdir = artifacts.VariantDir(tmp_path / "ref")
    artifacts.write_table(vdir.samples, samples)
    artifacts.write_table(vdir.tokens, tokens)
    with pytest.raises(ValueError, match="no prompt_token_ids column .* re-run the reference variant"):
        read_reference_sequences(vdir.root)
    with pytest.raises(ValueError, match="does not exist"):
        read_reference_sequences(tmp_path / "missing")


def test_nothing_generated_means_an_empty_teacher_table_and_no_engine_call():
    engine = RecordingEngine()
    table = teacher_force(engine, [], topk=5)
    assert table.num_rows == 0 and table.schema == artifacts.TOKENS_SCHEMA
    assert engine.calls == []
