"""Candidates from a real git repository; every bad range refused in one sentence."""

import pytest
from git_repos import git, linear_repo

from evalpipe.bisection.candidates import candidates, checkout
from evalpipe.errors import UserError


@pytest.fixture
def repo(tmp_path):
    repo = linear_repo(tmp_path / "repo", 4, file="code.py")
    # a side branch merged in: one first-parent candidate, two commits on the side
    git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    for i in range(2):
        (repo / f"side{i}.py").write_text("x = 1\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"side {i}")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    return repo


def test_first_parent_candidates_oldest_first_the_bad_one_last_with_subject_and_files(repo):
    good, found = candidates(repo, "HEAD~3", "HEAD")
    assert good == git(repo, "rev-parse", "HEAD~3")
    assert [c.subject for c in found] == ["revision 2", "revision 3", "merge side"]
    assert found[0].files == ["code.py"]
    assert found[-1].files == ["side0.py", "side1.py"], "a merge's files against its first parent"
    _, every = candidates(repo, "HEAD~3", "HEAD", first_parent=False)
    assert len(every) == 5


@pytest.mark.parametrize(("good", "bad", "words"), [
    ("nope", "HEAD", "--good nope: no such commit"),
    ("HEAD~3", "v9", "--bad v9: no such commit"),
    ("HEAD", "HEAD", "are the same commit"),
    ("HEAD", "HEAD~2", "is not an ancestor of --bad"),
])
def test_a_bad_range_is_one_sentence(repo, good, bad, words):
    with pytest.raises(UserError, match=words):
        candidates(repo, good, bad)


def test_uncommitted_changes_and_a_directory_that_is_no_repository_are_refused(repo, tmp_path):
    (repo / "code.py").write_text("REVISION = 'edited'\n")
    with pytest.raises(UserError, match="has uncommitted changes .*code.py.*commit or stash them"):
        candidates(repo, "HEAD~3", "HEAD")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UserError, match="is not a git work tree"):
        candidates(plain, "a", "b")
    with pytest.raises(UserError, match="is not a directory"):
        candidates(tmp_path / "absent", "a", "b")


def test_a_checkout_is_the_commits_tree_extracted_once(repo, tmp_path):
    sha = git(repo, "rev-parse", "HEAD~3")
    tree = checkout(repo, sha, tmp_path / "cache")
    assert (tree / "code.py").read_text() == "REVISION = 1\n"  # HEAD~3 along the first parents
    (tree / "marker").write_text("kept")
    assert checkout(repo, sha, tmp_path / "cache") == tree and (tree / "marker").is_file()
    assert git(repo, "status", "--porcelain") == "", "the repository's own tree is untouched"


def test_a_build_runs_once_per_tree_and_a_failed_one_says_why(tmp_path):
    from evalpipe.bisection.candidates import BUILT, BuildFailed, build

    tree = tmp_path / "tree"
    tree.mkdir()
    build(tree, ["sh", "-c", "echo built >> out.txt"])
    build(tree, ["sh", "-c", "echo built >> out.txt"])
    assert (tree / "out.txt").read_text() == "built\n" and (tree / BUILT).is_file()
    broken = tmp_path / "broken"
    broken.mkdir()
    with pytest.raises(BuildFailed, match="exited 3: no compiler here"):
        build(broken, ["sh", "-c", "echo starting; echo no compiler here; exit 3"])
    assert not (broken / BUILT).exists(), "a failed build is tried again next time"
    with pytest.raises(BuildFailed, match="was not found"):
        build(broken, ["no-such-build-tool"])
