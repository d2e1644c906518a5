"""The rows of a step that recompute a preempted request, as the model runner's batch orders them."""

import torch

from evalpipe.lab.layout import resumed


def test_the_resumed_requests_rows_follow_the_batch_order_and_each_requests_scheduled_count():
    order = ["a", "b", "c", "d"]
    scheduled = {"a": 1, "b": 37, "c": 1, "d": 5}
    assert resumed.resumed_ranges(order, scheduled, {"b", "d"}) == (44, ((1, 38), (39, 44)))
    assert resumed.resumed_ranges(order, scheduled, set()) == (44, ())


def test_the_mask_covers_the_noted_rows_and_a_pass_of_another_size_is_left_alone():
    resumed.note_step(6, ((1, 3), (5, 6)))
    try:
        mask = resumed.resumed_rows(6, torch.device("cpu"))
        assert mask is not None and mask.tolist() == [False, True, True, False, False, True]
        assert resumed.resumed_rows(8, torch.device("cpu")) is None, "a warm-up or padded pass is not the step"
        resumed.note_step(6, ())
        assert resumed.resumed_rows(6, torch.device("cpu")) is None
    finally:
        resumed.note_step(0, ())


def test_the_wrapper_notes_the_step_the_runner_prepared():
    class Batch:
        req_ids = ["x", "y"]

    class Runner:
        input_batch = Batch()

    class Cached:
        resumed_req_ids = {"y"}

    class Output:
        num_scheduled_tokens = {"x": 1, "y": 9}
        scheduled_cached_reqs = Cached()

    calls = []
    wrapped = resumed._wrap(lambda runner, out: calls.append(out) or "state")
    try:
        assert wrapped(Runner(), Output()) == "state" and len(calls) == 1
        mask = resumed.resumed_rows(10, torch.device("cpu"))
        assert mask is not None and torch.nonzero(mask).flatten().tolist() == list(range(1, 10))
    finally:
        resumed.note_step(0, ())
