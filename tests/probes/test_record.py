"""evalpipe/probes/record.py in this process: a process's record of collectives (a nested one counted once, per thread), forward passes and their histograms (bounded, a running or failed pass set apart), shapes, JSON-able values, and a record written only for a process worth it."""

from __future__ import annotations

import enum
import json
import os
import threading

from evalpipe.probes import record as R


def _model() -> R.ModelRecord:
    return R.ModelRecord("pkg.Model", {"pkg.Layer": 2}, [])


def test_enter_leave_count_a_nested_collective_once():
    rec = R.ProcessRecord("/nonexistent", "v")
    held = rec.enter("outer", "all_gather@tp", (), {})
    inner = rec.enter("inner", "all_gather@torch", (), {})
    plain = rec.enter("plain", None, (), {})
    assert (held, inner, plain) == (True, True, False)
    rec.leave(plain)
    rec.leave(inner)
    rec.leave(held)
    assert rec.calls == {"outer": 1, "inner": 1, "plain": 1}
    assert rec.collectives == {"all_gather@tp": 1}
    # depth restored: the next call is outermost again
    rec.leave(rec.enter("inner", "all_gather@torch", (), {}))
    assert rec.collectives == {"all_gather@tp": 1, "all_gather@torch": 1}


def test_the_collective_depth_is_per_thread():
    rec = R.ProcessRecord("/nonexistent", "v")
    held = rec.enter("outer", "all_reduce@tp", (), {})
    t = threading.Thread(target=lambda: rec.leave(rec.enter("other", "all_reduce@ep", (), {})))
    t.start()
    t.join()
    rec.leave(held)
    assert rec.collectives == {"all_reduce@tp": 1, "all_reduce@ep": 1}


def test_note_counts_a_virtual_collective():
    rec = R.ProcessRecord("/nonexistent", "v")

    class T:
        shape = (4, 8)

    rec.note("all_to_all", "virtual", (T(), T()))
    assert rec.calls == {"virtual:all_to_all": 1}
    assert rec.collectives == {"all_to_all@virtual": 1}
    assert rec.shapes == {"virtual:all_to_all": [[[4, 8], [4, 8]]]}


def test_forward_started_finished_build_per_forward_histograms():
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    rec.models.append(model)
    for n in (2, 2, 1):
        snap = rec.forward_started(model, 5)
        assert rec.forward_started(model, 9) is None, "a nested forward is part of the outer one"
        rec.forward_finished(model, None)
        for _ in range(n):
            rec.leave(rec.enter("f", "all_gather@tp", (), {}))
        rec.leave(rec.enter("g", "all_gather@ep", (), {}))
        rec.forward_finished(model, snap)
    snap = rec.forward_started(model, None)  # a forward calling nothing
    rec.forward_finished(model, snap)
    assert model.forwards == 4
    assert model.forward_tokens == [5, 5, 5]
    assert model.per_forward == {
        "f": {"2": 2, "1": 1}, "g": {"1": 3},
        "all_gather@tp": {"2": 2, "1": 1}, "all_gather@ep": {"1": 3},
        "all_gather": {"3": 2, "2": 1},  # the kind sums its groups in each forward
    }
    # calls outside a forward pass are not per-forward
    rec.leave(rec.enter("f", None, (), {}))
    assert model.per_forward["f"] == {"2": 2, "1": 1}


def test_a_pass_still_running_is_not_in_the_record():
    """The record is written while the engine runs, and an engine process its parent ends may
    never write again: a pass still running must not read as a pass that called nothing."""
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    rec.models.append(model)
    snapshot = rec.forward_started(model, 5)
    rec.note("all_gather", "virtual", ())
    running = rec.to_json()["models"][0]
    assert (running["forwards"], running["per_forward"], running["forward_tokens"]) == (0, {}, [])
    assert running["running_forwards"] == 1 and rec.to_json()["calls"] == {"virtual:all_gather": 1}, \
        "the totals hold the running pass's calls so far, and the record says a pass is running"
    rec.note("all_gather", "virtual", ())
    rec.forward_finished(model, snapshot)
    done = rec.to_json()["models"][0]
    assert (done["forwards"], done["per_forward"]["all_gather"], done["forward_tokens"]) == (1, {"2": 1}, [5])
    assert done["running_forwards"] == 0


def test_a_snapshot_is_its_own_copy_so_a_pass_finishing_while_it_is_written_does_not_change_it():
    """The record is serialised after its lock is released (opening the file lets the engine's
    thread run): a snapshot sharing the live histograms read 63 passes beside 64 gather pairs
    once, and the reader counted -1 passes without a gather."""
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    rec.models.append(model)
    for _ in range(2):
        snap = rec.forward_started(model, 3)
        rec.note("all_gather", "virtual", ())
        rec.forward_finished(model, snap)
    doc = rec.to_json()
    before = json.dumps(doc, sort_keys=True)
    snap = rec.forward_started(model, 70)  # a pass of a new size: every histogram and range moves
    rec.note("all_gather", "virtual", ())
    rec.note("reduce_scatter", "virtual", ())
    rec.forward_finished(model, snap)
    assert json.dumps(doc, sort_keys=True) == before
    taken = doc["models"][0]
    assert sum(taken["per_forward"]["all_gather"].values()) == taken["forwards"] == 2


def test_a_name_first_seen_in_a_later_pass_keeps_the_sizes_of_the_passes_without_it():
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    for tokens in (11, 12):
        rec.forward_finished(model, rec.forward_started(model, tokens))
    snapshot = rec.forward_started(model, 13)
    rec.note("all_gather", "virtual", ())
    rec.forward_finished(model, snapshot)
    assert model.per_forward["all_gather"] == {"1": 1}, "the zeros stay implied: forwards minus the sum"
    assert model.per_forward_tokens["all_gather"] == {"0": [11, 12], "1": [13]}
    assert model.per_forward_token_range["all_gather"] == {"0": [11, 12], "1": [13, 13]}


def test_forward_tokens_are_bounded():
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    for n in range(1, R.FORWARD_TOKENS_KEPT + 4):
        rec.forward_finished(model, rec.forward_started(model, n))
    assert model.forward_tokens == list(range(1, R.FORWARD_TOKENS_KEPT + 1))
    assert model.forwards == R.FORWARD_TOKENS_KEPT + 3


def test_a_forward_pass_over_no_token_is_set_apart():
    """A batch of padding only runs no layer work: it must not read as a forward pass that
    skipped its collectives (a partial fallback) in the per-forward histograms."""
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    rec.forward_finished(model, rec.forward_started(model, 0))
    snapshot = rec.forward_started(model, 5)
    rec.note("all_gather", "virtual", ())
    rec.forward_finished(model, snapshot)
    assert (model.forwards, model.empty_forwards) == (1, 1)
    assert model.per_forward["all_gather"] == {"1": 1}


def test_histograms_keep_a_bounded_number_of_values():
    hist: dict[str, int] = {}
    for value in range(R.HISTOGRAM_VALUES + 4):
        R._bump(hist, value)
    R._bump(hist, 0)
    R._bump(hist, R.HISTOGRAM_VALUES + 10)
    assert len(hist) == R.HISTOGRAM_VALUES + 1
    assert hist[R.OTHER] == 5
    assert hist["0"] == 2
    assert sum(hist.values()) == R.HISTOGRAM_VALUES + 6


def test_first_shapes_only():
    rec = R.ProcessRecord("/nonexistent", "v")

    class T:
        def __init__(self, *shape):
            self.shape = shape

    for n in range(R.SHAPES_KEPT + 2):
        rec.leave(rec.enter("f", None, (T(n),), {}))
    assert rec.shapes["f"] == [[[n]] for n in range(R.SHAPES_KEPT)]
    assert rec.calls["f"] == R.SHAPES_KEPT + 2


def test_shapes_of():
    class T:
        def __init__(self, *shape):
            self.shape = shape

    assert R.shapes_of((T(2, 3), 5, "x"), {"k": T(4)}) == [[2, 3], [4]]
    assert R.shapes_of(([T(1), T(2), T(3), T(4), T(5)],), {}) == [[[1], [2], [3], [4]]], "lists: the first four"
    assert R.shapes_of((T, [], (1, 2)), {}) == [], "a class with a shape attribute, an empty list, plain tuples: none"
    assert R.shapes_of(tuple(T(i) for i in range(9)), {}) == [[i] for i in range(6)], "at most six"


class Color(enum.Enum):
    RED = 1


class dtype:  # how torch's dtypes look to a standard-library probe
    name = "would-be-enum"

    def __str__(self) -> str:
        return "torch.float16"


def test_jsonable():
    assert R.jsonable(Color.RED) == "RED"
    assert R.jsonable(dtype()) == "float16", "a dtype is its text without torch., never its .name"
    assert R.jsonable({"a": (1, Color.RED), 2: {"b": None}}) == {"a": [1, "RED"], "2": {"b": None}}
    assert R.jsonable({3, 1, 2}) == [1, 2, 3]
    assert R.jsonable("x" * (R.TEXT_LIMIT + 50)) == "x" * R.TEXT_LIMIT
    assert R.jsonable(list(range(100))) == list(range(64))
    deep = R.jsonable([[[[["deep"]]]]])
    assert deep == [[["[['deep']]"]]], "below three levels a value becomes its text"
    assert R.jsonable(3.5) == 3.5 and R.jsonable(True) is True and R.jsonable(None) is None


def test_a_record_is_written_only_for_a_process_worth_it(tmp_path):
    rec = R.ProcessRecord(str(tmp_path / "out"), "v")
    rec.vllm_loaded = False
    rec.write()
    assert not (tmp_path / "out").exists(), "a helper interpreter that built nothing writes nothing"
    rec.models.append(_model())
    rec.calls["f"] = 1
    rec.write()
    written = json.loads((tmp_path / "out" / f"{os.getpid()}.json").read_text())
    assert written["calls"] == {"f": 1} and written["models"][0]["model_class"] == "pkg.Model"
    assert written["schema_version"] == 1 and written["variant"] == "v"
    assert not rec.dirty
    assert [p.name for p in (tmp_path / "out").iterdir()] == [f"{os.getpid()}.json"], "no temporary file left"


def test_reset_starts_a_fresh_record():
    rec = R.ProcessRecord("/nonexistent", "v")
    rec.leave(rec.enter("f", "all_reduce@tp", (), {}))
    rec.models.append(_model())
    rec.reset()
    assert rec.calls == {} and rec.collectives == {} and rec.models == [] and rec.shapes == {}


def test_a_forward_pass_that_raised_is_set_apart():
    """A pass cut short by an exception says nothing about "so many calls in every forward
    pass": it is counted on its own, not as a pass that skipped its collectives."""
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    snapshot = rec.forward_started(model, 5)
    rec.forward_failed(model, snapshot)
    snapshot = rec.forward_started(model, 5)
    rec.note("all_gather", "virtual", ())
    rec.forward_finished(model, snapshot)
    assert (model.forwards, model.failed_forwards) == (1, 1)
    assert model.per_forward["all_gather"] == {"1": 1}
    assert rec.forward_started(model, 5) is not None, "the failed pass left no forward open"


def test_the_tokens_of_a_pass_are_the_fewest_its_inputs_hold():
    from evalpipe.probes.engine_hooks import _tokens

    class T:
        def __init__(self, *shape):
            self.shape = shape

    assert _tokens((T(8), T(8)), {}) == 8
    assert _tokens((), {"input_ids": T(0), "positions": T(8)}) == 0, "empty inputs: an empty pass"
    assert _tokens((None, T(3, 8)), {}) == 8, "mrope positions: tokens on the last axis"
    assert _tokens((), {"positions": T(6), "inputs_embeds": T(6, 128)}) == 6
    assert _tokens((), {}) is None


def test_the_passes_behind_each_count_keep_their_sizes():
    """A partial fallback (the new path skipped for some batches) shows as an odd count in
    some passes; the record keeps the token counts of the first such passes, zeros included."""
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    for tokens, gathers in ((512, 3), (1, 3), (7, 0), (1, 3), (9, 0)):
        snapshot = rec.forward_started(model, tokens)
        for _ in range(gathers):
            rec.note("all_gather", "virtual", ())
        rec.forward_finished(model, snapshot)
    assert model.per_forward["all_gather"] == {"3": 3}
    assert model.per_forward_tokens["all_gather"] == {"3": [512, 1, 1], "0": [7, 9]}
    # every pass counts in the ranges, not only the first few
    for tokens in (1, 2, 300):
        rec.forward_finished(model, rec.forward_started(model, tokens))
    assert model.per_forward_token_range["all_gather"] == {"3": [1, 512], "0": [1, 300]}


def test_passes_are_counted_by_their_tokens_in_power_of_two_bins():
    """One token (a single request decoding alone) has a bin of its own; the others are binned
    by their least power of two, so a prefill chunk of the budget and a decode batch part."""
    assert [R.token_bin(n) for n in (1, 2, 3, 4, 7, 8, 8191, 8192)] == [1, 2, 2, 4, 4, 8, 4096, 8192]
    assert [R.bin_tokens(k) for k in ("1", "2", "64", "other")] == ["1", "2-3", "64-127", "other"]
    rec = R.ProcessRecord("/nonexistent", "v")
    model = _model()
    rec.models.append(model)
    for tokens in (1, 1, 1, 3, 2, 8192, None):
        rec.forward_finished(model, rec.forward_started(model, tokens))
    assert rec.to_json()["models"][0]["tokens_per_forward"] == {"1": 3, "2": 2, "8192": 1}
    assert model.forwards == 7, "a pass whose tokens were not read counts, in no bin"
