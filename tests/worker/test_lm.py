"""evalpipe/worker/lm.py: the lm-eval model that carries lm-eval's requests through the
engine. What it must keep: one capture per (task, doc, request, repeat) with the prompt
the engine saw, prompts cut to leave room for the answer, sampling asked by a task turned
into greedy and recorded, the A/A run's reversed order invisible to lm-eval, and
likelihoods split where lm-eval's own models split them. The engine here is a small
in-test one with one character per token, so every id and logprob is known."""

from __future__ import annotations

from dataclasses import dataclass, field

from lm_eval.api.instance import Instance

from evalpipe.documents.manifest import EngineInfo
from evalpipe.worker.engines import GenRequest, GenResult, ScoreRequest, ScoreResult
from evalpipe.worker.lm import CapturingLM, waves

EOS = 0


@dataclass
class CharEngine:
    """One token per character (its code point); generates the prompt's last character
    again, and scores each token with logprob -token_id / 1000."""

    max_model_len: int = 64
    eos_token_id: int | None = EOS
    generated: list[list[GenRequest]] = field(default_factory=list)
    scored: list[list[ScoreRequest]] = field(default_factory=list)

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids) -> str:
        return "".join(chr(t) for t in token_ids)

    def encode_many(self, texts):
        return [self.encode(t) for t in texts]

    def decode_many(self, sequences):
        return [self.decode(s) for s in sequences]

    def generate(self, requests, topk, progress=None):
        self.generated.append(list(requests))
        out = []
        for r in requests:
            ids = [r.prompt_token_ids[-1]] * min(r.max_tokens, 2)
            out.append(GenResult(text=self.decode(ids), token_ids=ids, logprobs=[-0.5] * len(ids),
                                 topk_ids=[[i] for i in ids], topk_logprobs=[[-0.5] for _ in ids], finish_reason="length"))
        return out

    def score(self, requests, topk=0, progress=None):
        self.scored.append(list(requests))
        return [ScoreResult(logprobs=[-r.token_ids[p] / 1000 for p in r.scored()],
                            is_greedy=[r.token_ids[p] == ord("B") for p in r.scored()]) for r in requests]

    def info(self) -> EngineInfo:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _gen(task: str, doc_id: int, context: str, idx: int = 0, **gen_kwargs) -> Instance:
    return Instance(request_type="generate_until", doc={}, arguments=(context, {"until": ["\n"], **gen_kwargs}),
                    idx=idx, metadata=(task, doc_id, 1))


def test_every_request_is_captured_under_its_key_with_the_prompt_the_engine_saw():
    engine = CharEngine()
    lm = CapturingLM(engine, topk=1, max_gen_toks=4)
    texts = lm.generate_until([_gen("t", 3, "abc"), _gen("t", 3, "abd"), _gen("u", 1, "xy", idx=1)])
    assert texts == ["cc", "dd", "yy"]
    # the same (task, doc, request) twice: repeats 0 and 1
    assert set(lm.captures) == {("t", 3, 0, 0), ("t", 3, 0, 1), ("u", 1, 1, 0)}
    capture = lm.captures[("t", 3, 0, 1)]
    assert capture.prompt_token_ids == [97, 98, 100] and not capture.truncated_prompt
    assert capture.result.token_ids == [100, 100]
    (sent,) = engine.generated
    assert [r.stop for r in sent] == [["\n"]] * 3 and {r.max_tokens for r in sent} == {4}
    assert sent[0].label == "t doc 3"


def test_a_long_prompt_keeps_its_end_and_leaves_room_for_the_answer():
    engine = CharEngine(max_model_len=10)
    lm = CapturingLM(engine, topk=1)
    lm.generate_until([_gen("t", 0, "0123456789abcdef", max_gen_toks=4)])
    capture = lm.captures[("t", 0, 0, 0)]
    assert capture.truncated_prompt and engine.decode(capture.prompt_token_ids) == "abcdef"  # 10 - 4 tokens


def test_sampling_a_task_asks_for_is_recorded_and_not_done():
    engine = CharEngine()
    lm = CapturingLM(engine, topk=1)
    lm.generate_until([_gen("sampled", 0, "ab", do_sample=True, temperature=0.7), _gen("greedy", 0, "ab", temperature=0.0)])
    assert lm.sampling_overridden == {"sampled"}
    assert all(r.draw is None for r in engine.generated[0])  # greedy: no sampler, no seed of its own


def test_a_sampled_task_seeds_each_sample_by_its_identity_not_its_place_in_the_batch():
    from evalpipe.config.sampling import Sampling, sample_seed

    forward, backward = CharEngine(), CharEngine()
    for engine, reverse in ((forward, False), (backward, True)):
        lm = CapturingLM(engine, topk=1, reverse_order=reverse)
        lm.sampling = Sampling(temperature=0.6, top_p=0.9, top_k=40, samples=2, seed=7)
        # lm-eval sends a request once per repeat: the repeats are the samples
        lm.generate_until([_gen("t", 3, "ab", do_sample=True), _gen("t", 3, "ab"), _gen("t", 4, "cd")])
        assert lm.sampling_overridden == set()  # the run config asked for it: done, not overridden
        drawn = {key: c.draw for key, c in lm.captures.items()}
        assert drawn[("t", 3, 0, 1)].seed == sample_seed(7, "t", 3, 0, 1)
        assert {d.seed for d in drawn.values()} == {sample_seed(7, "t", 3, 0, 0), sample_seed(7, "t", 3, 0, 1),
                                                    sample_seed(7, "t", 4, 0, 0)}
        assert {(d.temperature, d.top_p, d.top_k, d.min_p) for d in drawn.values()} == {(0.6, 0.9, 40, 0.0)}
    sent_forward = {tuple(r.prompt_token_ids) + (r.draw.seed,) for r in forward.generated[0]}
    sent_backward = {tuple(r.prompt_token_ids) + (r.draw.seed,) for r in backward.generated[0]}
    assert sent_forward == sent_backward and [r.draw for r in forward.generated[0]] != [r.draw for r in backward.generated[0]]


def test_the_reversed_order_reaches_the_engine_and_not_lm_eval():
    engine = CharEngine()
    lm = CapturingLM(engine, topk=1, max_gen_toks=4, reverse_order=True)
    texts = lm.generate_until([_gen("t", 0, "ab"), _gen("t", 1, "cd")])
    assert [r.prompt_token_ids for r in engine.generated[0]] == [[99, 100], [97, 98]]
    assert texts == ["bb", "dd"] and lm.captures[("t", 0, 0, 0)].result.token_ids == [98, 98]


def test_a_continuation_takes_the_context_s_trailing_spaces_as_lm_eval_s_models_do():
    engine = CharEngine()
    lm = CapturingLM(engine, topk=1)
    (ll, greedy), (ll_empty, _) = lm.loglikelihood([
        Instance(request_type="loglikelihood", doc={}, arguments=("Q: ", "B"), idx=0, metadata=("t", 0, 1)),
        Instance(request_type="loglikelihood", doc={}, arguments=("", "B"), idx=0, metadata=("t", 1, 1)),
    ])
    first, empty = engine.scored[0]
    assert first.token_ids == [81, 58, 32, 66] and first.start == 2  # " B" is the continuation
    assert ll == -(32 + 66) / 1000 and greedy is False  # the space is not the argmax
    # no context: the continuation is scored after the end-of-text token
    assert empty.token_ids == [EOS, 66] and empty.start == 1 and ll_empty == -66 / 1000


def test_a_rolling_likelihood_sums_its_windows():
    engine = CharEngine(max_model_len=4)
    lm = CapturingLM(engine, topk=1)
    (total,) = lm.loglikelihood_rolling([Instance(request_type="loglikelihood_rolling", doc={}, arguments=("abcdefg",),
                                                  idx=0, metadata=("t", 0, 1))])
    windows = engine.scored[0]
    assert len(windows) > 1  # the text is longer than one window
    assert abs(total - -sum(range(97, 104)) / 1000) < 1e-12  # every character scored exactly once


def test_each_engine_call_opens_its_progress_as_its_requests_are_handed_over():
    """``0/n`` reaches the progress callback before the engine computes anything: the
    no-progress watchdog times the engine from there, not lm-eval's request building."""
    seen: list[tuple] = []

    class Recording(CharEngine):
        def generate(self, requests, topk, progress=None):
            seen.append(("engine generate", len(requests)))
            return super().generate(requests, topk, progress)

        def score(self, requests, topk=0, progress=None):
            seen.append(("engine score", len(requests)))
            return super().score(requests, topk, progress)

    lm = CapturingLM(Recording(), topk=1, progress=lambda phase, done, total: seen.append((phase, done, total)))
    lm.generate_until([_gen("t", 0, "ab"), _gen("t", 1, "cd")])
    ll = Instance(request_type="loglikelihood", doc={}, arguments=("A", "B"), idx=0, metadata=("t", 0, 1))
    lm.loglikelihood([ll])
    assert seen == [("generate", 0, 2), ("engine generate", 2), ("loglikelihood", 0, 1), ("engine score", 1)]


def test_a_task_s_schedule_decides_the_engine_calls_its_requests_make():
    """`together`: one call; `one_at_a_time`: a call per request (each decodes alone);
    `prime_first`: the first alone, then the rest (hits on what it cached). Answers keep
    lm-eval's order, and the progress counts run over the whole lm-eval call."""
    requests = [_gen("t", i, c) for i, c in enumerate("abcd")]
    for schedule, calls in [("together", [4]), ("one_at_a_time", [1, 1, 1, 1]), ("prime_first", [1, 3])]:
        engine, seen = CharEngine(), []
        lm = CapturingLM(engine, topk=1, progress=lambda phase, done, total, seen=seen: seen.append((done, total)))
        lm.schedule = schedule
        assert lm.generate_until(requests) == ["aa", "bb", "cc", "dd"], schedule
        assert [len(call) for call in engine.generated] == calls, schedule
        assert seen[0] == (0, 4) and all(total == 4 for _, total in seen), (schedule, seen)
    # the A/A run's reversed order is the order the waves are cut from
    engine = CharEngine()
    lm = CapturingLM(engine, topk=1, reverse_order=True)
    lm.schedule = "prime_first"
    assert lm.generate_until(requests) == ["aa", "bb", "cc", "dd"]
    assert [[r.prompt_token_ids[-1] for r in call] for call in engine.generated] == [[ord("d")], [ord(c) for c in "cba"]]
    # likelihoods go in the same waves
    lm.schedule, lm.reverse_order = "one_at_a_time", False
    pairs = [Instance(request_type="loglikelihood", doc={}, arguments=("A", c), idx=0, metadata=("t", i, 1)) for i, c in enumerate("BC")]
    lm.loglikelihood(pairs)
    assert [len(call) for call in engine.scored] == [1, 1]


def test_waves_cover_every_request_once_in_order():
    assert waves(0, "one_at_a_time") == [] and waves(1, "prime_first") == [(0, 1)]
    for n in range(1, 6):
        for schedule in ("together", "one_at_a_time", "prime_first"):
            cut = waves(n, schedule)
            assert [i for lo, hi in cut for i in range(lo, hi)] == list(range(n)), (n, schedule)
