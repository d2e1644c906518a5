"""A private PostgreSQL server for the tests: a fresh cluster in a temporary directory,
listening on 127.0.0.1 only, stopped at the end. Needs Debian's postgresql package
(`bash scripts/setup.sh --tests` installs it); as root the server runs as the
`postgres` user, because PostgreSQL refuses to run as root."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or ([shutil.which(name)] if shutil.which(name) else [])
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} was not found; the history tests need a real server: "
                           "run `bash scripts/setup.sh --tests` (installs Debian's postgresql).")
    return found[-1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def postgres_server() -> Iterator[str]:
    """Yields an SQLAlchemy URL of an empty database on a new server."""
    root = Path(tempfile.mkdtemp(prefix="evalpipe-pg-"))
    data, port = root / "data", _free_port()
    as_user: list[str] = []
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    def run(*cmd: str) -> None:
        out = subprocess.run([*as_user, *cmd], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd[:2])} failed: {(out.stderr or out.stdout).strip()[-500:]}")
    try:
        run(_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "evalpipe", "--no-sync")
        run(_bin("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "start",
            "-o", f"-p {port} -c listen_addresses=127.0.0.1 -k {root} -c fsync=off")
        run(_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "evalpipe", "history")
        yield f"postgresql+psycopg://evalpipe@127.0.0.1:{port}/history"
    finally:
        subprocess.run([*as_user, _bin("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
