"""The results file for other bisect tools: the top-level `pass_fail` vllm-ascend's tools/bisect
reads, and one entry per variant and task."""

import json

from fakes import make_samples, mutate, set_token, write_run
from in_process import evalpipe

from evalpipe.documents.comparison import Status
from evalpipe.documents.pass_fail import pass_fail_of


def test_each_status_has_its_word_and_only_divergent_is_fail():
    assert [pass_fail_of(s) for s in Status] == ["pass", "pass", "inconclusive", "fail"]


def test_compare_writes_the_results_file_a_divergent_variant_fails(tmp_path):
    base = make_samples(6)
    run = write_run(tmp_path / "run", {"a": base, "b": mutate(base, 2, set_token(1, 999))})
    out = evalpipe("compare", str(run), "--results-json", str(tmp_path / "res" / "r.json"), cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads((tmp_path / "res" / "r.json").read_text())
    assert data["pass_fail"] == "fail" and data["status"] == "DIVERGENT" and data["exit_code"] == 1
    assert [t["name"] for t in data["tasks"]] and all(t["name"].startswith("b/") for t in data["tasks"])
    assert any(t["pass_fail"] == "fail" for t in data["tasks"])
    same = write_run(tmp_path / "same", {"a": base, "b": base})
    assert evalpipe("compare", str(same), "--results-json", str(tmp_path / "s.json"), cwd=tmp_path).returncode in (0, 4)
    assert json.loads((tmp_path / "s.json").read_text())["pass_fail"] in ("pass", "inconclusive")
