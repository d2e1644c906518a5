"""evalpipe/compare/changepoint.py, the nightly's detector on synthetic per-item series: silent on noise, a sustained one-point drop found, one odd night a transient and a new level pending first; a token measure's rise flagged in decades, a fall not, and values below the gate floor no change."""

from __future__ import annotations

import numpy as np

from evalpipe.compare.changepoint import score_changes, token_changes


def _noisy_nights(rng, base, nights, flip=0.03):
    p = np.clip(base * 0.9 + 0.05, 0, 1)
    return np.array([np.where(rng.random(base.size) < flip, (rng.random(base.size) < p).astype(float), base) for _ in range(nights)])


def test_detector_silent_on_noise_and_finds_a_sustained_one_point_drop():
    rng = np.random.default_rng(7)
    base = (rng.random(1319) < 0.6).astype(float)
    false_alarms = sum(bool([c for c in score_changes(_noisy_nights(rng, base, 30), 40.0) if c.flagged]) for _ in range(50))
    assert false_alarms == 0
    hits = 0
    for _ in range(20):
        m = _noisy_nights(rng, base, 30)
        m[20:, np.flatnonzero(base == 1)[:13]] = 0  # 13 of 1319 items stay wrong: 1 point
        hits += any(c.flagged and c.index == 20 for c in score_changes(m, 40.0))
    assert hits >= 18


def test_one_odd_night_is_a_transient_and_a_new_level_is_pending_first():
    base = np.tile((np.arange(200) % 10 < 6).astype(float), (10, 1))
    odd = base.copy()
    odd[4, :30] = 0
    assert [c for c in score_changes(odd) if c.flagged] == []
    drop = base.copy()
    drop[9, :30] = 0  # only tonight
    assert [(c.index, c.state) for c in score_changes(drop)] == [(9, "pending")]


def test_token_measure_rise_is_flagged_in_decades_and_a_fall_is_not():
    v = np.array([1e-12] * 6 + [1e-6] * 3 + [1e-12] * 3)
    changes = token_changes(v, np.full(12, 1e-12))
    assert [(c.index, c.state, c.direction) for c in changes] == [(6, "flagged", "up"), (9, "not significant", "down")]
    wobble = np.array([1e-12, 3e-12, 1e-12, 5e-12, 2e-12, 1e-12])
    assert token_changes(wobble, wobble) == []


def test_token_values_below_the_gate_floor_are_not_a_change():
    # fp32: 0, then 1e-12 (rounding) -- both below the 1e-8 floor of the KL gate
    v = np.array([0.0] * 4 + [1.8e-12] * 6)
    assert token_changes(v, np.zeros(10)) != []  # without the floor it looks like 18 decades
    assert token_changes(v, np.zeros(10), np.full(10, 1e-8)) == []
    bad = np.array([0.0] * 4 + [0.79] * 3)
    assert [c.index for c in token_changes(bad, np.zeros(7), np.full(7, 1e-8)) if c.flagged] == [4]
