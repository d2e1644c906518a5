"""The search over candidates' verdicts: it finds what a scan of every build finds, in about
log2 looks, and goes around skipped builds."""

from hypothesis import given
from hypothesis import strategies as st

from evalpipe.bisection.search import bounds, expected_steps, next_candidate, suspects
from evalpipe.documents.bisect import StepVerdict

S, D, K = StepVerdict.SAME, StepVerdict.DIFFERENT, StepVerdict.SKIP


def search(truth: list[StepVerdict]) -> tuple[list[int], list[int]]:
    """Run the search against known verdicts; the looks it made and its suspects."""
    verdicts = {len(truth) - 1: truth[-1]}
    looks = []
    while (i := next_candidate(verdicts, len(truth))) is not None:
        assert i not in verdicts, "a build is never looked at twice"
        looks.append(i)
        verdicts[i] = truth[i]
    return looks, suspects(verdicts, len(truth))


@given(st.integers(1, 64), st.data())
def test_a_monotone_history_is_found_exactly_in_log2_looks(count, data):
    first = data.draw(st.integers(0, count - 1))
    truth = [S] * first + [D] * (count - first)
    looks, found = search(truth)
    assert found == [first]
    assert len(looks) + 2 <= expected_steps(count), (count, first, looks)


@given(st.integers(2, 40), st.data())
def test_skipped_builds_cost_one_look_each_and_widen_the_answer_only_when_next_to_it(count, data):
    first = data.draw(st.integers(0, count - 1))
    skipped = set(data.draw(st.lists(st.integers(0, count - 2), max_size=count // 2)))
    truth = [K if i in skipped else (S if i < first else D) for i in range(count)]
    looks, found = search(truth)
    assert found[-1] >= first and all(truth[i] is K for i in found[:-1])
    # the true first DIFFERENT build is among the suspects unless skipped itself
    if first not in skipped:
        assert found[-1] == first
    else:
        assert first in found
    assert len(looks) <= count - 1


def test_the_next_look_is_the_middle_and_a_skip_moves_it_to_a_neighbour():
    assert next_candidate({9: D}, 10) == 4
    assert next_candidate({9: D, 4: K}, 10) == 3
    assert next_candidate({9: D, 4: K, 3: S}, 10) == 6
    assert bounds({9: D, 3: S, 6: D}, 10).first_different == 6
    assert suspects({9: D, 3: S, 4: K, 5: K, 6: D}, 10) == [4, 5, 6]


def test_a_same_build_after_a_different_one_does_not_move_the_low_end_past_it():
    # the change came and went: the first DIFFERENT build stays the answer
    b = bounds({9: D, 2: D, 5: S}, 10)
    assert (b.last_same, b.first_different) == (-1, 2)


def test_expected_steps_are_the_two_ends_and_log2_looks():
    assert [expected_steps(n) for n in (1, 2, 15, 16, 17)] == [2, 3, 6, 6, 7]
