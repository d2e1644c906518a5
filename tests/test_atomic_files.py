"""Files written whole or not at all (evalpipe/atomic_files.py): a write replaces the file in
one rename and leaves no temp file, a failed write leaves the old file as it was, a file
gets the permissions open() would have given it (owner-only when private), and JSON is
written stably so that equal content gives equal bytes."""

from __future__ import annotations

import os
import stat

import pytest

from evalpipe.atomic_files import read_json, write_bytes, write_json, write_text


def test_a_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "sub" / "f.txt"
    write_text(path, "first")
    write_text(path, "second ü")
    assert path.read_text(encoding="utf-8") == "second ü" and os.listdir(path.parent) == ["f.txt"]
    write_bytes(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01" and os.listdir(path.parent) == ["f.txt"]


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "f.json"
    write_json(path, {"a": 1})

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)  # the new bytes are written, not yet renamed over the file
    with pytest.raises(OSError, match="No space left"):
        write_json(path, {"a": 2})
    assert read_json(path) == {"a": 1} and os.listdir(tmp_path) == ["f.json"]


def test_permissions_follow_the_umask_or_are_owner_only(tmp_path):
    old = os.umask(0o027)
    try:
        write_text(tmp_path / "plain", "x")
        write_json(tmp_path / "secret", {"url": "http://u:pw@h"}, private=True)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "secret").stat().st_mode) == 0o600


def test_json_is_written_stably(tmp_path):
    write_json(tmp_path / "a.json", {"b": 1, "a": [1, 2], "p": tmp_path / "x"})
    write_json(tmp_path / "b.json", {"p": tmp_path / "x", "a": [1, 2], "b": 1})
    text = (tmp_path / "a.json").read_text()
    assert text == (tmp_path / "b.json").read_text() and text.endswith("}\n")
    assert text.index('"a"') < text.index('"b"') < text.index('"p"'), "sorted keys"
    assert read_json(tmp_path / "a.json")["p"] == str(tmp_path / "x"), "what JSON cannot hold is written as text"
