"""How evalpipe writes a number (evalpipe/number_format.py): gate values as counts or three
significant digits, scores with three decimals, signed differences with a true minus sign and
two significant digits when small, small magnitudes with two, percentages, p-values, logprobs,
intervals; a missing value as the caller's mark, NaN and infinities as "n/a"."""

from __future__ import annotations

import math

import pytest

from evalpipe import number_format as numbers
from evalpipe.number_format import DASH, MINUS


@pytest.mark.parametrize(
    ("value", "shown"),
    [(None, DASH), (3, "3"), (3.0, "3"), (0.0012345, "0.00123"), (0.3, "0.3"), (1e16, "1e+16"),
     (math.inf, "inf"), (-math.inf, f"{MINUS}inf"), (math.nan, "n/a"), (True, "True"), ("12 of 40", "12 of 40")],
)
def test_fmt_num_counts_as_integers_measurements_with_three_digits(value, shown):
    assert numbers.fmt_num(value) == shown


def test_a_missing_value_is_the_callers_mark():
    assert numbers.fmt_num(None, "n/a") == "n/a" and numbers.fmt_small(None) == "n/a" and numbers.fmt_small(None, DASH) == DASH
    assert numbers.fmt_sig(None) == DASH and numbers.fmt_sig(math.nan, missing="none") == "none"


def test_scores_differences_and_small_magnitudes():
    assert numbers.fmt_score(0.48215) == "0.482" and numbers.fmt_score(None) == "n/a" and numbers.fmt_score(math.nan) == "n/a"
    assert numbers.fmt_delta(-0.0412) == f"{MINUS}0.041" and numbers.fmt_delta(0.25) == "+0.250" and numbers.fmt_delta(0) == "0"
    assert numbers.fmt_delta(-3.1e-5) == f"{MINUS}3.1e-05" and numbers.fmt_delta(math.inf) == "n/a"
    assert numbers.fmt_small(3.14159e-6) == "3.1e-06" and numbers.fmt_small(0.0) == "0" and numbers.fmt_small(math.nan) == "n/a"
    assert numbers.fmt_sig(0.4821537) == "0.4822" and numbers.fmt_sig(0.4821537, 2) == "0.48"


def test_percentages_p_values_logprobs_and_intervals():
    assert numbers.fmt_pct(5, 6) == "5/6 (83.3%)" and numbers.fmt_pct(0, 0) == "0/0" and numbers.fmt_pct(None, 6) == DASH
    assert [numbers.fmt_p(p) for p in (None, 1.0, 1.2, 0.0412, 0.001, 0.0009)] == [DASH, "1", "1", "0.041", "0.001", "<0.001"]
    assert numbers.fmt_lp(-0.40531) == f"{MINUS}0.4053" and numbers.fmt_lp(0.5) == "0.5" and numbers.fmt_lp(None) == "n/a"
    assert numbers.fmt_ci(-0.25, 0.5) == f"[{MINUS}0.250, +0.500]" and numbers.fmt_ci(None, 0.5) == "n/a"
    assert numbers.fmt_mean_se(0.5, 0.2236) == "0.500 \u00b1 0.224" and numbers.fmt_mean_se(0.5, None) == "0.500"
