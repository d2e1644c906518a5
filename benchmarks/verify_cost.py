"""What do verified artifacts cost on a real run directory?

Copies RUN_DIR to a temporary directory (the original is never written), records every
variant's artifacts as the worker's finish step does (size, sha256, Parquet rows), then
times :func:`evalpipe.rundir.integrity.verify_variant` over all variants twice: from the page
cache, and after evicting the copy's files from it (posix_fadvise DONTNEED).

    .venv/bin/python benchmarks/verify_cost.py reports/runs/<run_id>
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from evalpipe.documents.manifest import VariantManifest, read_manifest, write_manifest
from evalpipe.rundir import artifacts, integrity


def _evict(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def main(run_dir: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(shutil.copytree(run_dir, Path(tmp) / run_dir.name))
        vdirs = [artifacts.VariantDir(p) for p in sorted(run.iterdir()) if (p / artifacts.MANIFEST_JSON).is_file()]
        t = time.perf_counter()
        records = {v.name: integrity.describe_artifacts(v) for v in vdirs}
        record_s = time.perf_counter() - t
        for v in vdirs:
            manifest = read_manifest(v.manifest)
            write_manifest(v.manifest, VariantManifest.model_validate({**manifest.model_dump(), "artifacts": records[v.name]}))
        size = sum(e["bytes"] for r in records.values() for e in r.values())
        timings = {}
        for label in ("warm", "cold"):
            if label == "cold":
                os.sync()
                _evict(run)
            t = time.perf_counter()
            for v in vdirs:
                integrity.verify_variant(v)
            timings[label] = time.perf_counter() - t
    print(f"{run_dir}: {len(vdirs)} variants, {size / 1e6:.1f} MB of artifacts; record {record_s:.3f} s, "
          f"verify {timings['warm']:.3f} s from the page cache, {timings['cold']:.3f} s from disk "
          f"({timings['warm'] / max(len(vdirs), 1) * 1000:.1f} ms per variant)")


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/verify_cost.py RUN_DIR")
    main(Path(sys.argv[1]))
