"""The fake engine (evalpipe/worker/fakes/engine.py) itself: deterministic, self-consistent
(scoring a sequence gives the logprobs its generation saw), its scripted behaviours, and
chosen only through its environment variable."""

from __future__ import annotations

import pytest

from evalpipe.worker.engines import GenRequest, ScoreRequest
from evalpipe.worker.fakes import engine as fake_engine
from evalpipe.worker.fakes.engine import EOS, Behaviour, FakeEngine, build_fake_engine
from evalpipe.worker.journal import RequestJournal

PROMPT = "Question: 3 apples and 4 pears?\nAnswer:"


def engine(**behaviour) -> FakeEngine:
    return FakeEngine({}, Behaviour(**behaviour))


def generate(eng: FakeEngine, prompt: str = PROMPT, topk: int = 5, max_tokens: int = 64):
    (out,) = eng.generate([GenRequest(eng.encode(prompt), max_tokens=max_tokens)], topk=topk)
    return out


def test_generation_is_deterministic_greedy_and_plausible():
    a, b = generate(engine()), generate(engine())
    assert a == b
    assert a.token_ids and len(a.token_ids) == len(a.logprobs) == len(a.topk_ids) == len(a.topk_logprobs)
    assert all(len(t) == 5 for t in a.topk_ids) and all(lp <= 0 for lp in a.logprobs)
    for tid, lp, ids, lps in zip(a.token_ids, a.logprobs, a.topk_ids, a.topk_logprobs):
        assert tid == ids[0] and lp == lps[0] and lps == sorted(lps, reverse=True) and len(set(ids)) == len(ids)
    assert a.finish_reason in ("stop", "length") and (a.token_ids[-1] == EOS) == (a.finish_reason == "stop")
    assert a.text == generate(engine()).text and a.text.isprintable()
    assert generate(engine(), prompt=PROMPT + " ").token_ids != a.token_ids, "another prompt, another answer"


def test_scoring_a_generated_sequence_reproduces_its_logprobs():
    eng = engine()
    prompt = eng.encode(PROMPT)
    gen = generate(eng)
    (scored,) = eng.score([ScoreRequest(prompt + gen.token_ids, start=len(prompt))], topk=5)
    assert scored.logprobs == gen.logprobs and all(scored.is_greedy)
    assert scored.topk_ids == gen.topk_ids and scored.topk_logprobs == gen.topk_logprobs
    other = [t + 1 if t < 255 else 97 for t in gen.token_ids]
    (forced,) = eng.score([ScoreRequest(prompt + other, start=len(prompt), positions=[len(prompt) + 1])], topk=2)
    assert len(forced.logprobs) == 1 and forced.is_greedy == [False] and forced.logprobs[0] < forced.topk_logprobs[0][-1]


def test_a_diverging_variant_differs_from_its_position_on():
    ref, var = generate(engine()), generate(engine(diverge_at=3))
    assert var.token_ids[:3] == ref.token_ids[:3] and var.logprobs[:3] == ref.logprobs[:3]
    assert var.token_ids[3] != ref.token_ids[3]


def test_a_seeded_sample_depends_on_its_seed_only_and_follows_its_settings():
    from evalpipe.worker.engines import Draw

    eng = engine()
    prompt = eng.encode(PROMPT)

    def sample(seed: int, **settings) -> list[int]:
        draw = Draw(**{"temperature": 0.8, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "seed": seed, **settings})
        requests = [GenRequest(prompt, max_tokens=24, draw=draw), GenRequest(eng.encode(PROMPT + "x"), max_tokens=24, draw=draw)]
        return eng.generate(requests, topk=5)[0].token_ids

    greedy = generate(eng, max_tokens=24).token_ids
    assert sample(1) == sample(1) and sample(1) != sample(2)  # the seed is honoured, whatever else is in the batch
    assert len({tuple(sample(s)) for s in range(8)}) > 4 and all(tuple(sample(s)) != tuple(greedy) for s in range(3))
    assert sample(5, top_k=1) == greedy and sample(6, min_p=0.999) == greedy  # truncation to the best is greedy
    # a diverging variant with the same seed draws the same tokens until its distribution changes
    (other,) = engine(diverge_at=3).generate([GenRequest(prompt, max_tokens=24, draw=Draw(0.8, 1.0, 0, 0.0, 1))], topk=5)
    assert other.token_ids[:3] == sample(1)[:3] and other.token_ids != sample(1)


def test_behaviours_are_parsed_and_a_typo_is_refused():
    b = Behaviour.parse("1, diverge=4,delay=0.5,hang_after=2,exit_after=3,signal=KILL")
    assert (b.diverge_at, b.delay_s, b.hang_after, b.exit_after, b.exit_signal) == (4, 0.5, 2, 3, "KILL")
    assert Behaviour.parse("1") == Behaviour() and Behaviour.parse("fail_start").fail_start
    with pytest.raises(RuntimeError, match="unknown behaviour 'diverg=4'"):
        Behaviour.parse("diverg=4")
    with pytest.raises(RuntimeError, match="fail_start"):
        build_fake_engine({}, env={fake_engine.FAKE_ENGINE_ENV: "fail_start"})


def test_only_its_variable_selects_it():
    assert not fake_engine.requested({}) and not fake_engine.requested({fake_engine.FAKE_ENGINE_ENV: "0"})
    assert fake_engine.requested({fake_engine.FAKE_ENGINE_ENV: "1"})
    assert fake_engine.setting({fake_engine.FAKE_ENGINE_ENV: "delay=1"}) == "delay=1"
    assert fake_engine.setting({fake_engine.FAKE_ENGINE_ENV: " 0 "}) is None and fake_engine.setting({}) is None
    assert engine().info().kind == "fake"


def test_the_journal_answers_what_an_earlier_attempt_asked(tmp_path):
    first = FakeEngine({}, Behaviour(), journal=RequestJournal(tmp_path / "j.jsonl"))
    want = generate(first)
    first.close()
    again = FakeEngine({}, Behaviour(exit_after=0), journal=RequestJournal(tmp_path / "j.jsonl"))
    assert generate(again) == want, "answered from the journal: the engine (told to exit) was not asked"
    assert again.journal is not None and again.journal.summary().answers_reused == 1


def test_hold_answers_one_request_then_waits_for_its_file(tmp_path):
    """hold=PATH: a point the test controls (an event, not a duration)."""
    import threading

    release = tmp_path / "release"
    eng = engine(hold=str(release))
    assert Behaviour.parse(f"hold={release}").hold == str(release)
    generate(eng)  # the first request is answered at once
    answered = threading.Event()
    second = threading.Thread(target=lambda: (generate(eng), answered.set()), daemon=True)
    second.start()
    assert not answered.wait(0.5), "the second request waits while the file is missing"
    release.write_text("")
    assert answered.wait(120), "the file released it"
