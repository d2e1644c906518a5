"""The tensor captures (evalpipe/documents/captures.py): the pieces the engine's processes
wrote (<pid>.jsonl + <pid>.bin) are read back with their float32 values; a line of
another version, a piece that points past its .bin file and a line that is no JSON are
refused in one sentence; no directory means no pieces."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evalpipe.documents.captures import CAPTURE_VERSION, read_captures
from evalpipe.errors import UserError


def _entry(offset: int, rows: list[int], width: int = 3, **changes) -> dict:
    entry = {"version": CAPTURE_VERSION, "sequence": 0, "label": "t doc 0", "module": "layer.out", "layer": 1,
             "layout": "full", "rows": rows, "batch_start": 0, "batch_tokens": 8, "width": width,
             "shape": [len(rows), width], "offset": offset, "pid": 7}
    return {**entry, **changes}


def _write(directory, entries: list[dict], values: np.ndarray) -> None:
    directory.mkdir(exist_ok=True)
    (directory / "7.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries) + "\n")
    (directory / "7.bin").write_bytes(values.astype("<f4").tobytes())


def test_the_pieces_come_back_with_their_values(tmp_path):
    values = np.arange(12, dtype=np.float32)
    _write(tmp_path / "cap", [_entry(0, [2, 5]), _entry(24, [6, 7], layer=2, layout="token_shards", rank=1, world=2)],
           values)
    first, second = read_captures(tmp_path / "cap")
    assert first.entry.rows == [2, 5] and first.entry.layout == "full" and first.entry.rank is None
    np.testing.assert_array_equal(first.values, values[:6].reshape(2, 3))
    np.testing.assert_array_equal(second.values, values[6:].reshape(2, 3))
    assert (second.entry.layer, second.entry.rank, second.entry.world) == (2, 1, 2)


def test_no_capture_directory_is_no_pieces(tmp_path):
    assert read_captures(tmp_path / "none") == []


@pytest.mark.parametrize("line, fragment", [
    (_entry(0, [0], version=2), "is a capture of version 2; this evalpipe reads version 1"),
    (_entry(0, [0, 1, 2]), "points past the end of 7.bin"),
    (_entry(0, [0], shape=[2, 3]), "does not match its rows"),
    (_entry(0, [0], layout="diagonal"), "7.jsonl:1: layout: Input should be"),
])
def test_a_capture_this_evalpipe_cannot_use_is_one_sentence(tmp_path, line, fragment):
    _write(tmp_path, [line], np.zeros(6))
    with pytest.raises(UserError) as err:
        read_captures(tmp_path)
    assert fragment in str(err.value) and "run `evalpipe localize` again" in str(err.value)


def test_a_line_that_is_no_json_is_one_sentence(tmp_path):
    (tmp_path / "7.jsonl").write_text('{"version": 1, "seq\n')
    with pytest.raises(UserError, match=r"7.jsonl:1 is not a JSON line"):
        read_captures(tmp_path)
