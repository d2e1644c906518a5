"""evalpipe/lab/training.py, its cheap parts (a whole build is tests/models/test_builtin.py):
the learning-rate schedule (linear warm-up to the peak, cosine down to its floor, flat after
the last step), the long-context stage's steps (probes cycling through the lengths, a GSM
step every so often), and the tokenizer: a number is one token in every context the recipe
puts it in, and the special tokens keep their ids."""

from __future__ import annotations

import pytest

from evalpipe.lab.training import _longctx_schedule, _lr_at, train_tokenizer
from evalpipe.models.builtin import SPECIAL_TOKENS

SPEC = {"lr": 1e-3, "warmup_steps": 10, "steps": 110, "min_lr_ratio": 0.1}


def test_the_learning_rate_warms_up_then_falls_on_a_cosine_to_its_floor():
    assert _lr_at(0, SPEC) == pytest.approx(1e-4) and _lr_at(9, SPEC) == pytest.approx(1e-3)
    assert _lr_at(60, SPEC) == pytest.approx(1e-4 + 0.9e-3 * 0.5)  # half way: the mean of peak and floor
    assert _lr_at(110, SPEC) == pytest.approx(1e-4) == _lr_at(500, SPEC)
    rates = [_lr_at(s, SPEC) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


def test_the_long_context_stage_cycles_its_lengths_with_a_gsm_step_every_so_often():
    steps = _longctx_schedule({"longctx_gsm_every": 3}, {"steps": 7, "lengths": [512, 1024]})
    assert steps == [("probe", 512), ("probe", 1024), ("gsm", 0), ("probe", 512), ("probe", 1024), ("gsm", 0), ("probe", 512)]
    assert all(kind == "probe" for kind, _ in _longctx_schedule({"longctx_gsm_every": 0}, {"steps": 4, "lengths": [8]}))


def test_numbers_are_single_tokens_and_the_special_tokens_keep_their_ids():
    texts = ["Natalia sold 48 clips in April and half as many in May."] * 20
    tok = train_tokenizer({"split_digits": False, "vocab_size": 400, "number_tokens": 60}, texts)
    for text in (" 17", "<<17", "=17", ">>17"):
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text and tok.decode(ids[-1:]).strip() == "17", (text, ids)  # the number: one token
    assert [tok.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    split = train_tokenizer({"split_digits": True, "vocab_size": 300}, texts)
    assert len(split.encode(" 1234").ids) >= 4  # every digit its own token
