"""Small git repositories for the bisect's tests: real git, a commit per revision."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@localhost", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def linear_repo(repo: Path, commits: int, file: str = "plugin.py") -> Path:
    """``commits`` commits on main, each setting REVISION in ``file`` to its number."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    for i in range(commits):
        (repo / file).write_text(f"REVISION = {i}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"revision {i}")
    return repo
