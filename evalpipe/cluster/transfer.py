"""A variant's directory as one value that Ray can carry between a node and the driver.

When the nodes do not share the driver's filesystem, a node packs what its variant wrote
(artifacts, manifest, probe records, logs) into an uncompressed tar (the Parquet files
are compressed already) and the driver unpacks it beside the run directory, then moves
it into place: a half-transferred variant never stands where a finished one is read.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path


def pack(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.is_symlink():
                tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buffer.getvalue()


def unpack_into(data: bytes, target: Path) -> None:
    """Replace ``target`` by the packed directory (staged beside it, then renamed)."""
    staging = target.with_name(f".incoming-{target.name}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r") as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, no links out of it
        if target.exists():
            old = target.with_name(f".replaced-{target.name}")
            shutil.rmtree(old, ignore_errors=True)
            target.rename(old)
            staging.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
