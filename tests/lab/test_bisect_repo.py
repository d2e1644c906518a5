"""The bisect test's plugin repository: sixteen commits, each kind of change where the table
says, and every checkout a plugin vLLM finds through its entry point."""

import json
import subprocess
import sys

import pytest

from evalpipe.bisection.candidates import checkout
from evalpipe.lab import bisect_repo as R

PROBE = """
import importlib.metadata, json, os
from demo_layout_plugin import patches
eps = [e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "demo_layout_plugin"]
patches._flaky_attention = lambda: os.environ.__setitem__("FLAKY", "1")  # the model is not imported here
patches.apply()
print(json.dumps({"eps": eps, "faults": os.environ.get("EVALPIPE_LAYOUT_FAULT", ""), "flaky": os.environ.get("FLAKY", "")}))
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("bisect") / "repo"
    return path, R.build_repository(path)


def plugin(repo, sha, tmp_path) -> dict:
    tree = checkout(repo, sha, tmp_path / "trees")
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_sixteen_commits_with_each_change_where_the_table_says(repo, tmp_path):
    path, shas = repo
    assert len(shas) == R.COMMITS == 16
    seen = {i: plugin(path, shas[i], tmp_path) for i in (0, R.BENIGN, R.FIX, R.FLAKY, R.REVERT, R.HARMFUL, 15)}
    assert all(s["eps"] == ["demo_layout_plugin:register"] for s in seen.values()), "found through its entry point"
    assert seen[0]["faults"] == "" and not seen[0]["flaky"]
    assert seen[R.BENIGN]["faults"] == seen[R.FIX]["faults"] == seen[R.REVERT]["faults"] == "tree_reduce"
    assert seen[R.FLAKY]["flaky"] and not seen[R.REVERT]["flaky"] and not seen[15]["flaky"]
    assert seen[R.HARMFUL]["faults"] == seen[15]["faults"] == "tree_reduce,attn_out_error_1e-3"


def test_the_broken_commit_fails_in_register_where_vllm_does_not_catch_it(repo, tmp_path):
    path, shas = repo
    tree = checkout(path, shas[R.BROKEN], tmp_path / "trees")
    out = subprocess.run([sys.executable, "-c", "import demo_layout_plugin; demo_layout_plugin.register()"],
                         capture_output=True, text=True, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode != 0 and "No module named 'demo_layout_plugin_fused_ext'" in out.stderr
    ok = subprocess.run([sys.executable, "-c", "import demo_layout_plugin"], capture_output=True, text=True,
                        env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert ok.returncode == 0, "importing the plugin works (vLLM would only log a failed import and go on)"
