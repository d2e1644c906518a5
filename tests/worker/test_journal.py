"""The offline engine's per-request journal, on stand-ins for `vllm.LLM` (pure code: the
real engine's kill and resume are in test_e2e_run.py).

Two stand-ins: one like vLLM 0.32 (`enqueue` returns the engine's ids, `<id>-<random>`,
outputs carry the plain id and finish out of order), one like an older vLLM with
`generate` only."""

from __future__ import annotations

import math
from types import SimpleNamespace

from evalpipe.documents.journal import JOURNAL_FILE
from evalpipe.worker.engines import GenRequest, OfflineEngine, ScoreRequest
from evalpipe.worker.journal import RequestJournal


def _generated(prompt_ids: list[int]) -> SimpleNamespace:
    """A finished RequestOutput: the prompt's tokens plus one, with logprobs that name them."""
    ids = [t + 1 for t in prompt_ids]
    logprobs = [{t: SimpleNamespace(logprob=-0.5 * (i + 1), rank=1)} for i, t in enumerate(ids)]
    return SimpleNamespace(outputs=[SimpleNamespace(token_ids=ids, logprobs=logprobs, text=f"<{ids}>",
                                                    finish_reason="stop")],
                           prompt_logprobs=[None] + [{t: SimpleNamespace(logprob=-1.0, rank=2)} for t in prompt_ids[1:]],
                           finished=True)


class _Queue:
    """vLLM ≥ 0.1x: requests queued by `enqueue`, answered by `llm_engine.step()`."""

    def __init__(self) -> None:
        self.counter, self.pending, self.sent = 0, [], []
        self.llm_engine = self

    def enqueue(self, prompts, params, use_tqdm=False):
        ids = []
        for p in prompts:
            self.pending.append((str(self.counter), p["prompt_token_ids"]))
            self.sent.append(p["prompt_token_ids"])
            ids.append(f"{self.counter}-a1b2c3d4")  # the engine's own id, as vLLM returns it
            self.counter += 1
        return ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)

    def step(self):
        done, self.pending = self.pending[::-1][:2], self.pending[:-2]  # two per step, the last queued first
        return [SimpleNamespace(request_id=rid, **vars(_generated(ids))) for rid, ids in done]


class _Batch:
    """An older vLLM: `generate` answers everything at once, in order."""

    def __init__(self) -> None:
        self.sent = []

    def generate(self, prompts, params, use_tqdm=False):
        self.sent += [p["prompt_token_ids"] for p in prompts]
        if use_tqdm:  # vLLM's bar: one update per finished request
            bar = use_tqdm(total=len(prompts))
            for _ in prompts:
                bar.update(1)
            bar.close()
        return [_generated(p["prompt_token_ids"]) for p in prompts]


def _engine(llm, journal_path) -> OfflineEngine:
    engine = OfflineEngine.__new__(OfflineEngine)  # no vLLM: the stand-in is the engine
    engine._llm, engine.journal = llm, RequestJournal(journal_path)
    return engine


def _requests(n: int) -> list[GenRequest]:
    return [GenRequest(prompt_token_ids=[10 * i, 10 * i + 1], max_tokens=4, stop=["\n"]) for i in range(n)]


def test_answers_in_request_order_each_appended_as_it_finishes_and_reused_after_a_kill(tmp_path):
    path = tmp_path / JOURNAL_FILE
    llm = _Queue()
    progress = []
    first = _engine(llm, path)
    results = first.generate(_requests(5), topk=1, progress=lambda d, t: progress.append((d, t)))
    assert [r.token_ids for r in results] == [[10 * i + 1, 10 * i + 2] for i in range(5)]
    assert progress == [(i, 5) for i in range(1, 6)]  # one step per finished request
    first.journal.close()
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 5
    # killed after three answers, the third line cut short
    path.write_text("".join(lines[:2]) + lines[2][:20])
    llm.sent.clear()
    progress.clear()
    again = _engine(llm, path)
    resumed = again.generate(_requests(5), topk=1, progress=lambda d, t: progress.append((d, t)))
    # the stand-in finished requests 4 and 3 first: only 0, 1 and 2 are asked again, in order
    assert llm.sent == [[0, 1], [10, 11], [20, 21]], "only what the journal lacks is asked"
    assert resumed == results
    assert progress[0] == (2, 5) and progress[-1] == (5, 5)
    assert again.journal.summary().model_dump() == {"file": JOURNAL_FILE, "answers_found": 2, "answers_reused": 2}


def test_another_request_is_not_answered_from_the_journal(tmp_path):
    path = tmp_path / JOURNAL_FILE
    llm = _Queue()
    _engine(llm, path).generate(_requests(2), topk=1)
    llm.sent.clear()
    other = [GenRequest(prompt_token_ids=r.prompt_token_ids, max_tokens=8, stop=r.stop) for r in _requests(2)]
    _engine(llm, path).generate(other, topk=1)  # another max_tokens: another request
    assert len(llm.sent) == 2


def test_scores_are_journaled_with_their_positions(tmp_path):
    path = tmp_path / JOURNAL_FILE
    llm = _Queue()
    reqs = [ScoreRequest(token_ids=[5, 6, 7], start=1), ScoreRequest(token_ids=[5, 6, 7], start=2)]
    scored = _engine(llm, path).score(reqs, topk=1)
    assert [len(s.logprobs) for s in scored] == [2, 1] and scored[0].is_greedy == [False, False]
    llm.sent.clear()
    assert _engine(llm, path).score(reqs, topk=1) == scored and llm.sent == []


def test_an_older_vllm_without_enqueue_journals_each_call(tmp_path):
    path = tmp_path / JOURNAL_FILE
    llm = _Batch()
    results = _engine(llm, path).generate(_requests(3), topk=1)
    assert math.isclose(results[2].logprobs[1], -1.0) and len(path.read_text().splitlines()) == 3
    llm.sent.clear()
    progress = []
    assert _engine(llm, path).generate(_requests(6), topk=1, progress=lambda d, t: progress.append(d))[:3] == results
    assert llm.sent == [[30, 31], [40, 41], [50, 51]]
    assert progress == [3, 4, 5, 6]  # the journal's answers, then each finished request once


def test_a_request_answered_in_this_run_is_sent_again_and_one_of_the_interrupted_run_is_reused(tmp_path):
    path = tmp_path / "journal.jsonl"
    first = RequestJournal(path)
    first.put("k1", {"text": "a"})
    assert first.get("k1") is None, "within a run every request reaches the engine (a scenario's second sending too)"
    first.close()
    again = RequestJournal(path)
    assert again.get("k1") == {"text": "a"} and again.reused == 1
    again.close()
