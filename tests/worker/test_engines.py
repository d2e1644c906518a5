"""evalpipe/worker/engines.py, the parts every engine shares (the vLLM engine itself is
tested end to end in tests/e2e/): the top-k as vLLM ranks it, the A/A run's reversed order
that the caller never sees, scoring cut into calls by a token budget (in
tests/worker/test_teacher.py), each token's own text decoded once per distinct id, and the
journal of answers that a killed variant continues from without sending them again."""

from __future__ import annotations

from types import SimpleNamespace

from evalpipe.worker.engines import GenResult, JournaledCalls, decode_each, in_order, ranked_topk
from evalpipe.worker.journal import RequestJournal


def test_the_top_k_follows_vllm_s_ranks_and_leaves_out_what_it_did_not_rank_within_k():
    entries = [(7, 2, -1.5), (3, 1, -0.2), (9, None, -0.1), (4, 4, -3.0), (5, 2, -1.5)]
    assert ranked_topk(entries, 3) == ([3, 5, 7], [-0.2, -1.5, -1.5])  # a tie in rank: by id
    assert ranked_topk(entries, 1) == ([3], [-0.2])
    assert ranked_topk([], 5) == ([], [])


def test_the_reversed_order_is_the_engine_s_only():
    seen: list[list[int]] = []

    def call(requests: list[int]) -> list[int]:
        seen.append(list(requests))
        return [r * 10 for r in requests]

    assert in_order(call, [1, 2, 3], reverse=True) == [10, 20, 30]
    assert in_order(call, [1, 2, 3], reverse=False) == [10, 20, 30]
    assert seen == [[3, 2, 1], [1, 2, 3]]


def test_each_distinct_token_is_decoded_once():
    asked: list[list[list[int]]] = []

    def decode_many(sequences):
        asked.append([list(s) for s in sequences])
        return [f"<{s[0]}>" for s in sequences]

    texts = decode_each(SimpleNamespace(decode_many=decode_many), [5, 3, 5, 5, 9])
    assert texts == ["<5>", "<3>", "<5>", "<5>", "<9>"]
    assert asked == [[[3], [5], [9]]]


def _result(text: str) -> GenResult:
    return GenResult(text=text, token_ids=[1], logprobs=[-0.5], topk_ids=[[1]], topk_logprobs=[[-0.5]], finish_reason="stop")


def test_a_journaled_answer_is_not_asked_again_and_progress_counts_it(tmp_path):
    path = tmp_path / "journal.jsonl"
    first = JournaledCalls(["k1", "k2"], RequestJournal(path), GenResult, progress=None)
    assert first.todo() == [0, 1]
    first.finished(0, _result("one"))  # the variant is killed before k2 is answered
    progress: list[tuple[int, int]] = []
    again = JournaledCalls(["k1", "k2"], RequestJournal(path), GenResult, progress=lambda d, n: progress.append((d, n)))
    assert again.todo() == [1] and progress == [(1, 2)]
    again.finished(1, _result("two"))
    assert [r.text for r in again.results()] == ["one", "two"] and progress[-1] == (2, 2)
