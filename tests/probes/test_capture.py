"""evalpipe/probes/capture.py, with torch tensors in this process: which forward pass is a
watched sequence (from position 0, or continuing exactly where its last piece ended; a batch
of several sequences never), the rows of it kept, and what a capture writes: the kept rows
as float32 bytes with an index line that says where they are and what they are."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from evalpipe.probes.capture import TensorCapture, layers_module, runs

TOKENS = [5, 6, 7, 8, 9, 10]


def _capture(tmp_path) -> TensorCapture:
    return TensorCapture({"dir": str(tmp_path / "captures"), "sequences": [{"label": "doc 3", "token_ids": TOKENS, "rows": [1, 4]}]})


def test_a_forward_pass_is_the_watched_sequence_only_where_it_continues_it(tmp_path):
    cap = _capture(tmp_path)
    first = cap.match(torch.tensor(TOKENS[:3]), torch.arange(3))
    assert first is not None and (first.start, first.tokens, first.rows) == (0, 3, [1])
    assert cap.match(torch.tensor(TOKENS[4:5]), torch.tensor([4])) is None  # skips position 3: not the sequence
    step = cap.match(torch.tensor(TOKENS[3:5]), torch.tensor([3, 4]))
    assert step is not None and step.rows == [4]
    assert cap.match(torch.tensor([5, 6, 1, 2]), torch.tensor([0, 1, 0, 1])) is None  # two sequences in one batch
    assert cap.match(torch.tensor([9, 9]), torch.arange(2)) is None  # other tokens


def test_a_capture_writes_the_kept_rows_and_where_they_are(tmp_path):
    cap = _capture(tmp_path)
    cap.forward_started(torch.tensor(TOKENS[:3]), torch.arange(3))
    hidden = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    cap.capture("mlp", 2, [hidden], "full")
    cap.forward_finished()
    cap.capture("mlp", 3, [hidden], "full")  # outside a watched pass: nothing
    (index_file,) = (tmp_path / "captures").glob("*.jsonl")
    (entry,) = [json.loads(line) for line in index_file.read_text().splitlines()]
    assert (entry["module"], entry["layer"], entry["rows"], entry["label"]) == ("mlp", 2, [1], "doc 3")
    data = (tmp_path / "captures" / index_file.name.replace(".jsonl", ".bin")).read_bytes()
    kept = np.frombuffer(data, dtype=np.float32, offset=entry["offset"], count=4)
    assert kept.tolist() == [4.0, 5.0, 6.0, 7.0] and entry["shape"] == [1, 4]
    cap.forward_started(torch.tensor(TOKENS[:3]), torch.arange(3))
    with pytest.raises(ValueError, match="unknown capture layout"):
        cap.capture("mlp", 2, [hidden], "diagonal")


def test_indices_are_written_as_runs_and_the_decoder_layers_are_found():
    assert runs([0, 1, 2, 5, 6, 9]) == [[0, 3], [5, 7], [9, 10]] and runs([]) == []
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.layers = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    assert layers_module(model) is model.model.layers and layers_module(torch.nn.Linear(2, 2)) is None
