"""evalpipe/cluster/transfer.py: a variant directory written on a node comes back to the
driver through Ray as bytes. Pinned: what is unpacked is what was packed, it replaces what
an earlier attempt left, no staging directory stays behind, and a pack whose paths reach
outside its directory is refused before anything is written."""

from __future__ import annotations

import io
import tarfile

import pytest

from evalpipe.cluster import transfer


def test_a_directory_packed_and_unpacked_is_the_same_and_replaces_the_old(tmp_path):
    source = tmp_path / "node" / "v"
    (source / "records").mkdir(parents=True)
    (source / "samples.parquet").write_bytes(b"\x00parquet" * 1000)
    (source / "records" / "1.json").write_text("{}")
    target = tmp_path / "driver" / "v"
    target.mkdir(parents=True)
    (target / "stale.log").write_text("from an earlier attempt")
    transfer.unpack_into(transfer.pack(source), target)
    assert sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file()) == \
        ["records/1.json", "samples.parquet"]
    assert (target / "samples.parquet").read_bytes() == (source / "samples.parquet").read_bytes()
    assert [p.name for p in target.parent.iterdir()] == ["v"], "no staging directory is left"


def test_a_pack_that_reaches_outside_its_directory_is_refused(tmp_path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = b"x"
        info = tarfile.TarInfo("../escaped")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(tarfile.TarError):
        transfer.unpack_into(buffer.getvalue(), tmp_path / "v")
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "v").exists()
