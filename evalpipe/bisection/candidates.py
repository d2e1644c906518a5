"""The candidate builds of a bisect: commits of a git repository, first-parent by default,
between a good and a bad ref; and each commit's tree, checked out once into a cache keyed by
the commit (a variant puts it on its PYTHONPATH, or a build command installs it there).

Every refusal is one sentence before anything starts (exit 2): a ref that does not exist,
good equal to bad, good not an ancestor of bad, a range without commits, a repository with
uncommitted changes.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from evalpipe.documents.bisect import Candidate
from evalpipe.errors import RunFailed, UserError


def git(repo: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise UserError("git is not installed; bisect reads its candidates from a git repository, install git.") from None
    if out.returncode != 0:
        raise subprocess.CalledProcessError(out.returncode, ["git", *args], out.stdout, out.stderr)
    return out.stdout


def _resolve(repo: Path, ref: str, option: str) -> str:
    try:
        return git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except subprocess.CalledProcessError:
        raise UserError(f"{option} {ref}: no such commit in {repo}; pass a commit, branch or tag of that repository.") from None


def check_repository(repo: Path) -> None:
    if not repo.is_dir():
        raise UserError(f"bisect.repo {repo} is not a directory; set it to the git repository the variant takes its code from.")
    try:
        inside = git(repo, "rev-parse", "--is-inside-work-tree").strip()
    except subprocess.CalledProcessError:
        inside = "false"
    if inside != "true":
        raise UserError(f"bisect.repo {repo} is not a git work tree; set it to the repository the variant takes its code from.")
    dirty = git(repo, "status", "--porcelain", "--untracked-files=no").strip()
    if dirty:
        first = dirty.splitlines()[0].strip()
        raise UserError(f"{repo} has uncommitted changes ({first}); commit or stash them: a bisect tests commits, "
                        "and a change outside them would make every verdict about something else.")


def candidates(repo: Path, good: str, bad: str, *, first_parent: bool = True) -> tuple[str, list[Candidate]]:
    """The good commit and the candidates after it, oldest first, the bad commit last."""
    check_repository(repo)
    good_sha, bad_sha = _resolve(repo, good, "--good"), _resolve(repo, bad, "--bad")
    if good_sha == bad_sha:
        raise UserError(f"--good {good} and --bad {bad} are the same commit {good_sha[:12]}; pass a good commit older than the bad one.")
    try:
        git(repo, "merge-base", "--is-ancestor", good_sha, bad_sha)
    except subprocess.CalledProcessError:
        raise UserError(f"--good {good} is not an ancestor of --bad {bad} in {repo}; pass an older good commit "
                        "(swapped ends, or two branches that parted).") from None
    listing = git(repo, "rev-list", "--reverse", *(["--first-parent"] if first_parent else []), f"{good_sha}..{bad_sha}")
    shas = listing.split()
    # never empty: bad descends from good and is not good, so bad itself is listed (a range
    # with no commits is good equal to bad, refused above)
    assert shas, (good_sha, bad_sha)
    return good_sha, [describe(repo, sha) for sha in shas]


def describe(repo: Path, sha: str) -> Candidate:
    subject = git(repo, "log", "-1", "--format=%s", sha).strip()
    parents = git(repo, "rev-list", "--parents", "-n", "1", sha).split()[1:]
    # against the first parent: what the change brought to the line the bisect walks
    files = (git(repo, "diff", "--name-only", parents[0], sha) if parents else git(repo, "ls-tree", "-r", "--name-only", sha)).split()
    return Candidate(commit=sha, subject=subject, files=sorted(set(files)))


def checkout(repo: Path, sha: str, cache: Path) -> Path:
    """The commit's tree under ``cache/<sha>``, extracted once (``git archive``: the
    repository's own work tree and index are never touched)."""
    tree = cache / sha
    if tree.is_dir():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{sha[:12]}-", dir=cache))
    try:
        archive = staging / "tree.tar"
        with archive.open("wb") as out:
            subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", sha], stdout=out, check=True, timeout=300)
        with tarfile.open(archive) as tar:
            tar.extractall(staging / "tree", filter="data")
        (staging / "tree").rename(tree)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tree


BUILT = ".evalpipe-built"
BUILD_LOG = ".evalpipe-build.log"


class BuildFailed(RunFailed):
    """The build command failed in a candidate's tree: the candidate is skipped with this reason."""


def build(tree: Path, command: list[str], timeout_s: float = 3600) -> None:
    """Run the config's build command in ``tree`` once (the tree is the cache, keyed by the
    commit: a built tree is not built again); its output goes to the tree's build log."""
    if not command or (tree / BUILT).is_file():
        return
    log = tree / BUILD_LOG
    try:
        with log.open("w") as out:
            done = subprocess.run(command, cwd=tree, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    except FileNotFoundError:
        raise BuildFailed(f"the build command {command[0]!r} was not found") from None
    except subprocess.TimeoutExpired:
        raise BuildFailed(f"the build command ran past {timeout_s:g} s (log: {log})") from None
    if done.returncode != 0:
        last = next((line for line in reversed(log.read_text(errors="replace").splitlines()) if line.strip()), "")
        raise BuildFailed(f"the build command exited {done.returncode}: {last.strip()[:200]} (log: {log})")
    (tree / BUILT).write_text("")
