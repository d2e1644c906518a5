"""Teacher forcing's bookkeeping (which sequences, which positions) with a stand-in engine.

The real engine's side (prompt_logprobs through vLLM) is covered by the end-to-end run."""

import pytest
from rundir_checks import finished_reference

from evalpipe.config.run_config import PromptPositions
from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.errors import UserError
from evalpipe.rundir import artifacts
from evalpipe.rundir.sequences import ReferenceSequence, read_reference_sequences, reference_sequences, shard_boundaries
from evalpipe.worker.engines import ScoreResult, token_budget_slices
from evalpipe.worker.teacher import prompt_positions, teacher_force


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
            scored = [r.token_ids[p] for p in r.scored()]
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
    with pytest.raises(UserError, match="ref/manifest.json is missing"):  # nothing to check its files against
        read_reference_sequences(vdir.root)
    write_manifest(vdir.manifest, VariantManifest(variant="ref", status="ok"))  # from before the artifacts record
    with pytest.raises(UserError, match="no prompt_token_ids column .* re-run the reference variant"):
        read_reference_sequences(vdir.root)
    with pytest.raises(UserError, match="does not exist"):
        read_reference_sequences(tmp_path / "missing")


def test_a_reference_altered_since_it_finished_is_refused_naming_the_file(tmp_path):
    from evalpipe.rundir import integrity

    samples, tokens = _reference_tables()
    vdir = artifacts.VariantDir(tmp_path / "ref")
    finished_reference(vdir, samples, tokens)
    assert len(read_reference_sequences(vdir.root)) == 2
    artifacts.write_table(vdir.tokens, tokens.slice(0, 3))  # rewritten with fewer rows
    with pytest.raises(integrity.ArtifactMismatch, match="tokens.parquet"):
        read_reference_sequences(vdir.root)


def test_nothing_generated_means_an_empty_teacher_table_and_no_engine_call():
    engine = RecordingEngine()
    table = teacher_force(engine, [], topk=5)
    assert table.num_rows == 0 and table.schema == artifacts.TOKENS_SCHEMA
    assert engine.calls == []


SPEC = PromptPositions().model_dump()


def test_short_prompts_keep_the_continuation_only():
    assert prompt_positions(1023, 1100, SPEC) == []
    assert prompt_positions(5000, 5010, None) == []


def test_shard_boundaries_follow_padded_contiguous_shards():
    # 10 tokens over 4 ranks: padded to 12, shards of 3 -> shards start at 3, 6, 9
    assert shard_boundaries(10, 4) == [3, 6, 9]
    assert shard_boundaries(8, 4) == [2, 4, 6]
    # 5 tokens over 4 ranks: shards of 2, the last one all padding
    assert shard_boundaries(5, 4) == [2, 4]


def test_long_prompt_keeps_last_every_nth_and_every_boundary():
    n, total = 4099, 4120
    kept = prompt_positions(n, total, SPEC)
    assert kept == sorted(set(kept)) and kept[0] >= 1 and kept[-1] == n - 1
    assert set(range(n - 256, n)) <= set(kept)
    assert {512, 1024, 3584} <= set(kept)
    for tp in (4, 16):
        for edge in shard_boundaries(n, tp) + shard_boundaries(total, tp):
            assert {edge - 2, edge - 1, edge, edge + 1} <= set(kept), (tp, edge)
    assert {2046, 2047, 2048, 2049} <= set(kept), "the sparse-attention block boundary"
    # bounded: a few hundred of the 4099 positions
    assert len(kept) < 400


def test_kept_positions_grow_slowly_with_prompt_length():
    sizes = [len(prompt_positions(n, n + 32, SPEC)) for n in (16384, 131072)]
    assert sizes[0] < 600 and sizes[1] < 1200
    assert sizes[1] < 8 * sizes[0] / 4, "every-Nth grows linearly; the rest is constant per prompt"


def test_prompt_positions_come_first_with_negative_pos():
    prompt = list(range(100, 100 + 1200))
    seq = ReferenceSequence("t", 0, 0, prompt_token_ids=prompt, continuation_ids=[7, 8])
    spec = {**SPEC, "min_prompt_tokens": 1000, "last": 2, "every": 0, "tp_sizes": [], "block_sizes": [600], "around": 0}
    engine = RecordingEngine()
    table = teacher_force(engine, [seq], topk=2, prompt_spec=spec)
    cols = table.to_pydict()
    # block edge 600 -> positions 599, 600; last 2 -> 1198, 1199; then the continuation
    assert cols["pos"] == [599 - 1200, 600 - 1200, -2, -1, 0, 1]
    assert cols["token_id"] == [prompt[599], prompt[600], prompt[1198], prompt[1199], 7, 8]
    assert cols["logprob"] == pytest.approx([-t / 100 for t in cols["token_id"]])


def test_score_work_is_sliced_by_token_budget():
    assert token_budget_slices([5, 5, 5, 5], 10) == [(0, 2), (2, 4)]
    assert token_budget_slices([30, 5, 5], 10) == [(0, 1), (1, 3)], "a long request gets a slice of its own"
    assert token_budget_slices([], 10) == []
    lengths = [3, 9, 1, 1, 12, 4]
    slices = token_budget_slices(lengths, 10)
    assert [i for lo, hi in slices for i in range(lo, hi)] == list(range(len(lengths)))
    assert all(sum(lengths[lo:hi]) <= 10 or hi - lo == 1 for lo, hi in slices)
