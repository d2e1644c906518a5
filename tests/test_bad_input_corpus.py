"""Bad input, as a corpus: every case ends with exit code 2, exactly one error sentence
naming what is wrong and where, no traceback, and no run directory left behind.
In-process (typer's runner): every case fails before anything starts."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from evalpipe.cli import app

# The interpreter the project's venv was made from: Python without vLLM (the venv has it).
BASE_PYTHON = str(Path(sys.base_prefix) / "bin" / "python3")

GOOD = {
    "model": {"path": "builtin:tiny-gsm"},
    "variants": {"a": {}, "b": {"env": {"X": "1"}}},
    "tasks": {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 4}]},
}


def with_(**changes):
    """GOOD with top-level keys replaced (a value of None removes the key)."""
    out = {k: v for k, v in GOOD.items()}
    for k, v in changes.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def data_task(name: str) -> dict:
    """A task group reading the data file DATA/<name> (written by _write_data_files)."""
    return {"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": 0, "data_files": {"test": f"DATA/{name}"}}]}


def _write_data_files(root: Path) -> None:
    root.mkdir(exist_ok=True)
    (root / "bad.jsonl").write_text('{"question": "q1", "answer": "#### 1"}\n{"question": "q2", "answer": broken}\n')
    (root / "cols.jsonl").write_text('{"q": "q1", "a": "#### 1"}\n')
    (root / "empty.jsonl").write_text("")
    (root / "data.txt").write_text("What is 1 + 1?\n")
    (root / "list.jsonl").write_text('["question", "answer"]\n')
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"question": ["q1"], "answer": ["#### 1"]}), root / "table.jsonl")  # Parquet under a text name


# (case id, config file content: dict | str | bytes | "DIR" | None (no -c), extra args, fragments of the error)
CASES = [
    ("yaml-malformed", "model: {path: [unclosed\n", [], ["invalid YAML at line"]),
    ("yaml-empty", "", [], ["the top level must be a mapping"]),
    ("yaml-binary", b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", [], ["is not UTF-8 text"]),
    ("yaml-directory", "DIR", [], ["is a directory; pass a YAML file"]),
    ("yaml-list", "- a\n- b\n", [], ["the top level must be a mapping"]),
    ("key-top", with_(engnie={}), [], ["unknown key `engnie`"]),
    ("key-model", with_(model={"path": "builtin:tiny-gsm", "dtpye": "float32"}), [], ["model.dtpye"]),
    ("key-variant", with_(variants={"a": {}, "b": {"evn": {}}}), [], ["variants.b.evn"]),
    ("key-gates", with_(gates={"tokens": {"teacher_kl": {"abs": 1}}}), [], ["gates.tokens.teacher_kl"]),
    ("key-nightly", with_(nightly={"task": "gsm8k"}), [], ["nightly.task"]),
    ("key-capture", with_(capture={"top_k": 5}), [], ["capture.top_k"]),
    ("type-variants-list", with_(variants=["a", "b"]), [], ["variants"]),
    ("type-engine-str", with_(engine={"max_model_len": "long"}), [], ["`max_model_len` is 'long'", "positive integer"]),
    ("range-max-model-len", with_(engine={"max_model_len": -5}), [], ["`max_model_len` is -5"]),
    ("range-max-num-seqs", with_(engine={"max_num_seqs": 0}), [], ["`max_num_seqs` is 0"]),
    ("type-tp-float", with_(variants={"a": {}, "b": {"engine": {"tensor_parallel_size": 1.5}}}), [], ["variant `b`", "`tensor_parallel_size` is 1.5"]),
    ("env-list", with_(env={"A": [1, 2]}), [], ["`env`", "`A` is a list"]),
    ("env-variant-dict", with_(variants={"a": {}, "b": {"env": {"B": {"x": 1}}}}), [], ["variants.b.env", "`B` is a dict"]),
    ("tasks-empty-group", with_(tasks={"gsm8k": []}), [], ["task group `gsm8k` is empty"]),
    ("tasks-none", with_(tasks={}), [], ["no task groups"]),
    ("tasks-no-name", with_(tasks={"gsm8k": [{"num_fewshot": 4}]}), [], ["tasks.gsm8k.0.task"]),
    ("tasks-fewshot-negative", with_(tasks={"gsm8k": [{"task": "gsm8k_synth_4shot", "num_fewshot": -1}]}), [], ["num_fewshot"]),
    ("tasks-limit-zero", with_(tasks={"gsm8k": [{"task": "gsm8k_synth_4shot", "limit": 0}]}), [], ["limit"]),
    ("capture-topk", with_(capture={"topk": 50}), [], ["capture.topk"]),
    ("gates-margin", with_(gates={"scores": {"margin": 0}}), [], ["gates.scores.margin"]),
    ("gates-alpha", with_(gates={"scores": {"alpha": 0.7}}), [], ["gates.scores.alpha"]),
    ("nightly-min-nights", with_(nightly={"min_nights": 0}), [], ["nightly.min_nights"]),
    ("reference-unknown", with_(reference="c"), [], ["reference"]),
    ("variants-empty", with_(variants={}), [], ["variants"]),
    ("launch-mode", with_(launch={"mode": "cloud"}), [], ["launch.mode"]),
    ("launch-port", with_(launch={"mode": "serve", "port": 70000}), [], ["launch.port"]),
    ("extends-missing", "extends: nowhere.yaml\n", [], ["nowhere.yaml", "does not exist"]),
    ("task-unknown", GOOD, ["--task-selector", "gsm9k_synth"], ["gsm9k_synth"]),
    ("task-empty", GOOD, ["--task-selector", ""], ["task"]),
    ("task-commas", GOOD, ["--task-selector", ",,"], ["task"]),
    ("limit-zero", GOOD, ["--limit", "0"], ["--limit 0 is out of range: give a positive whole number (the bounds of the config key `tasks.<group>.<n>.limit`)"]),
    ("limit-negative", GOOD, ["--limit", "-3"], ["--limit -3 is out of range"]),
    ("limit-text", GOOD, ["--limit", "ten"], ["--limit"]),
    ("timeout-zero", GOOD, ["--timeout", "0"], ["--timeout 0 is out of range: give a positive number of seconds"]),
    ("timeout-negative", GOOD, ["--timeout", "-1"], ["--timeout -1 is out of range"]),
    ("timeout-text", GOOD, ["--timeout", "soon"], ["--timeout"]),
    ("stall-timeout-zero", GOOD, ["--stall-timeout", "0"], ["--stall-timeout 0 is out of range: give a positive number (the bounds of the config key `launch.stall_timeout_s`)"]),
    ("stall-timeout-nan", GOOD, ["--stall-timeout", "nan"], ["--stall-timeout nan is out of range"]),
    ("launch-stall-timeout", with_(launch={"stall_timeout_s": -5}), [], ["launch.stall_timeout_s"]),
    ("cluster-key", with_(cluster={"adress": "auto"}), [], ["cluster.adress"]),
    ("cluster-resources", with_(cluster={"address": "auto", "resources": {"NPU": -1}}), [], ["cluster.resources", "not an amount"]),
    ("cluster-variant-resources", with_(variants={"a": {}, "b": {"resources": []}}), [], ["variants.b.resources", "mapping of Ray resource names"]),
    ("cluster-spread-and-concurrency", with_(cluster={"address": "auto", "distinct_nodes": True, "concurrency": 2}), [],
     ["remove one of the two"]),
    ("cluster-option-empty", GOOD, ["--cluster", ""], ["--cluster is empty"]),
    ("cluster-option-spaces", GOOD, ["--cluster", "a b"], ["--cluster 'a b' holds a space"]),
    ("cluster-option-local", GOOD, ["--cluster", "local"], ["--cluster 'local' would start a private one-node Ray cluster"]),
    ("cluster-option-http", GOOD, ["--cluster", "http://127.0.0.1:8265"], ["has the scheme http://, which Ray does not connect to"]),
    ("cluster-option-no-port", GOOD, ["--cluster", "ray://head"], ["names no port; give HOST:PORT, e.g. head:10001"]),
    ("cluster-option-port-range", GOOD, ["--cluster", "head:99999"], ["has the port 99999, out of range"]),
    ("cluster-address-empty", with_(cluster={"address": ""}), [], ["cluster.address", "is empty"]),
    ("cluster-address-port-text", with_(cluster={"address": "head:port"}), [], ["cluster.address", "'port', which is not a number"]),
    ("cluster-concurrency-bool", with_(cluster={"address": "auto", "concurrency": True}), [], ["cluster.concurrency", "got true where a number is wanted"]),
    ("cluster-resources-zero", with_(cluster={"address": "auto", "resources": {"CPU": 0}}), [], ["cluster.resources", "every amount is 0"]),
    ("sampling-greedy-temperature", with_(sampling={"temperature": 0}), [], ["sampling.temperature", "where vLLM decodes greedily"]),
    ("task-sampling-null", with_(tasks={"gsm8k": [{"task": "gsm8k_synth_4shot", "sampling": None}]}), [],
     ["`tasks.gsm8k.0.sampling: null` is not a setting: leave the key out"]),
    ("seed-negative", with_(seed=-1), [], ["seed", "greater than or equal to 0"]),
    ("seed-huge", with_(seed=2**40), [], ["seed", "less than 4294967296"]),
    ("concurrency-here", GOOD, ["--concurrency", "2"], ["--concurrency applies to a run on a Ray cluster"]),
    ("localize-samples-bool", with_(localize={"samples": True}), ["--dry-run"],
     ["`localize.samples`: got true where a number is wanted; give a number"]),  # pydantic would read it as 1
    ("run-id-escape", GOOD, ["--run-id", "../../escape"], ["--run-id '../../escape' is not a plain directory name"]),
    ("run-id-slash", GOOD, ["--run-id", "a/b"], ["is not a plain directory name"]),
    ("run-id-dots", GOOD, ["--run-id", ".."], ["is not a plain directory name"]),
    ("output-file", GOOD, ["--output", "FILE"], ["is a file, not a directory"]),
    ("model-missing", with_(model={"path": "/nonexistent/model"}), [], ["/nonexistent/model", "does not exist"]),
    ("model-empty-dir", with_(model={"path": "EMPTYMODEL"}), [], ["is not a complete model: config.json is missing and no weights"]),
    ("model-no-weights", with_(model={"path": "NOWEIGHTS"}), [], ["is not a complete model: no weights"]),
    ("variants-unknown", GOOD, ["--variants", "a,c"], ["variant `c` is not defined"]),
    ("markup-in-value", GOOD, ["--variants", "a,[/]"], ["--variants item '[/]' is not a name"]),  # shown as typed, not as markup
    ("control-in-value", GOOD, ["--variants", "a,b\nc\x08"], ["--variants item 'b\\nc\\x08' is not a name"]),  # one line, every character shown
    ("data-broken-line", with_(tasks=data_task("bad.jsonl")), [], ["bad.jsonl, line 2: not valid JSON"]),
    ("data-missing-column", with_(tasks=data_task("cols.jsonl")), [], ["cols.jsonl", "lacks the column question", "doc_to_text"]),
    ("data-empty", with_(tasks=data_task("empty.jsonl")), [], ["empty.jsonl", "has no items"]),
    ("data-unsupported", with_(tasks=data_task("data.txt")), [], ["data.txt has the unsupported type .txt"]),
    ("data-missing", with_(tasks=data_task("missing.jsonl")), [], ["missing.jsonl does not exist"]),
    ("data-not-objects", with_(tasks=data_task("list.jsonl")), [], ["list.jsonl, line 1: a list, not an object"]),
    # YAML that would mean something else than it says
    ("yaml-duplicate-block", yaml.safe_dump(GOOD) + "engine: {max_model_len: 64}\nengine: {max_num_seqs: 2}\n", ["--dry-run"],
     ["key `engine` appears twice", "merge them into one"]),
    ("yaml-duplicate-reference", yaml.safe_dump(GOOD) + "reference: a\nreference: b\n", ["--dry-run"], ["key `reference` appears twice"]),
    ("yaml-alias-bomb", yaml.safe_dump(GOOD) + "x: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
        f"x{i}: &a{i} [{', '.join(['*a' if i == 0 else f'*a{i - 1}'] * 10)}]\n" for i in range(5)), ["--dry-run"],
     ["expand to more than", "nodes"]),
    ("key-wrong-case", {"Model": GOOD["model"], **with_(model=None)}, ["--dry-run"], ["unknown key `Model`", "did you mean `model`"]),
    # names that become paths
    ("variant-name-path", with_(variants={"a": {}, "team/sp": {}}), ["--dry-run"], ["variant name 'team/sp' is not a plain directory name"]),
    ("variant-name-empty", with_(variants={"a": {}, "": {}}), ["--dry-run"], ["variant name '' is not a plain directory name"]),
    ("task-group-name-path", with_(tasks={"../g": GOOD["tasks"]["gsm8k"]}), ["--dry-run", "--task-selector", "all"],
     ["task group name '../g'"]),
    # values the engine or evalpipe would refuse only later
    ("dtype-unknown", with_(model={"path": "builtin:tiny-gsm", "dtype": "fp33"}), ["--dry-run"], ["`model.dtype`", "'fp33'", "bfloat16"]),
    ("dtype-unknown-engine", with_(variants={"a": {}, "b": {"engine": {"dtype": "fp16"}}}), ["--dry-run"], ["variant `b`", "`dtype` is 'fp16'"]),
    ("switch-layout-value", with_(variants={"a": {}, "b": {"env": {"EVALPIPE_LAYOUT": "SP"}}}), ["--dry-run"],
     ["variants.b.env", "EVALPIPE_LAYOUT='SP' is not a layout"]),
    ("env-key-equals", with_(env={"A=B": "1"}), ["--dry-run"], ["'A=B' is not an environment variable name"]),
    ("builtin-unknown-dry-run", with_(model={"path": "builtin:nosuch"}), ["--dry-run"], ["`model.path`", "names no built-in model"]),
    ("extends-missing", "extends: nosuch.yaml\n", ["--dry-run"], ["named by `extends:`", "fix `extends:` in"]),
    # empty or repeated options
    ("variants-empty", GOOD, ["--variants", "", "--dry-run"], ["--variants is empty"]),
    ("variants-comma", GOOD, ["--variants", ",", "--dry-run"], ["--variants ',' has an empty item"]),
    ("variants-twice", GOOD, ["--variants", "a,b,b", "--dry-run"], ["--variants names `b` twice"]),
    ("tasks-twice", GOOD, ["--task-selector", "gsm8k,gsm8k", "--dry-run"], ["the task list names `gsm8k` twice"]),
    ("output-empty", GOOD, ["--output", "", "--dry-run"], ["--output is empty"]),
    ("size-nan-with-longctx", with_(engine={"max_model_len": float("nan")}), ["--dry-run", "--task-selector", "passkey"],
     ["`max_model_len` is nan", "positive integer"]),
    ("extends-empty", "extends: ''\n", ["--dry-run"], ["`extends` must be the path of another config file; got ''"]),
    ("output-too-long", GOOD, ["--output", "x" * 5000, "--dry-run"], ["--output is longer than a path can be"]),
    ("variants-odd-name", GOOD, ["--variants", "a,../b", "--dry-run"], ["--variants item '../b' is not a name"]),
    ("config-path-newline", None, ["-c", "nosuch.yaml\n", "--dry-run"], ["nosuch.yaml\\n does not exist"]),
    ("data-parquet-as-jsonl", with_(tasks=data_task("table.jsonl")), [],
     ["table.jsonl is a Parquet file, not .jsonl text; rename it to table.parquet"]),
    ("python-missing", with_(variants={"a": {}, "b": {"python": "/nonexistent/bin/python"}}), [], ["/nonexistent/bin/python"]),
    ("python-without-vllm", with_(variants={"a": {}, "b": {"python": BASE_PYTHON}}), [],
     [f"{BASE_PYTHON} cannot import vllm", "point the variant's `python:` at one that has it"]),
]


def _invoke(tmp_path: Path, config, extra: list[str]):
    args = ["run"]
    selector = "gsm8k"
    if "--task-selector" in extra:
        i = extra.index("--task-selector")
        selector = extra[i + 1]
        extra = extra[:i] + extra[i + 2:]
    args.append(selector)
    if config is not None:
        path = tmp_path / "cfg.yaml"
        if config == "DIR":
            path = tmp_path / "cfgdir"
            path.mkdir()
        elif isinstance(config, bytes):
            path.write_bytes(config)
        elif isinstance(config, str):
            path.write_text(config)
        else:
            _write_data_files(tmp_path / "data")
            (tmp_path / "empty-model").mkdir()
            (tmp_path / "no-weights").mkdir()
            (tmp_path / "no-weights" / "config.json").write_text('{"model_type": "llama"}')
            text = yaml.safe_dump({"output": str(tmp_path / "runs"), **config})
            text = text.replace("EMPTYMODEL", str(tmp_path / "empty-model")).replace("NOWEIGHTS", str(tmp_path / "no-weights"))
            path.write_text(text.replace("DATA/", f"{tmp_path / 'data'}/"))
        args += ["-c", str(path)]
    extra = [str(tmp_path / "a-file") if a == "FILE" else a for a in extra]
    (tmp_path / "a-file").write_text("x")
    if "--output" not in extra:
        extra += ["--output", str(tmp_path / "runs")]
    return CliRunner().invoke(app, [*args, *extra])


def assert_one_sentence(res, fragments) -> str:
    """Exit 2, no traceback, exactly one error line, holding every fragment; the message, flattened."""
    out = res.stdout + (res.stderr or "")
    assert res.exit_code == 2, out
    assert "Traceback" not in out, out
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [line for line in (res.stderr or res.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:") or line.startswith("Error") or "Invalid value" in line]
    assert len(errors) == 1, out
    flat = " ".join(" ".join(lines).split())
    for fragment in fragments:
        assert fragment in flat, flat
    return flat


@pytest.mark.parametrize("case,config,extra,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, monkeypatch, case, config, extra, fragments):
    monkeypatch.chdir(tmp_path)
    flat = assert_one_sentence(_invoke(tmp_path, config, list(extra)), fragments)
    print(f"{case}: {flat}")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing is written for a run that never started"


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40


# ---------------------------------------------------------------------------
# `evalpipe compare` on bad input: stored run directories (built without an engine,
# tests/support/fakes.py) and gates files; the same rules, and nothing written anywhere.
# ---------------------------------------------------------------------------


def _compare_fixture(root: Path) -> None:
    """run/ (legacy vs sp, with the manifest's artifacts record), r1/legacy and r2/legacy
    (6 vs 4 items), r3/legacy (another task), r4/legacy (other prompts), and gates files."""
    from fakes import make_samples, record_artifacts, set_column, write_run, write_variant

    from evalpipe.rundir import artifacts

    s = make_samples(6)
    run = write_run(root / "run", {"legacy": s, "sp": s}, reference="legacy")
    for name in ("legacy", "sp"):
        record_artifacts(artifacts.VariantDir(run / name))
    write_variant(root / "r1", "legacy", s)
    write_variant(root / "r2", "legacy", make_samples(4))
    write_variant(root / "r3", "legacy", make_samples(6, task="other_task"))
    r4 = write_variant(root / "r4", "legacy", s)
    table = artifacts.read_table(r4.samples)
    artifacts.write_table(r4.samples, set_column(table, "prompt_hash", ["changed"] * table.num_rows))
    (root / "notrun").mkdir()
    (root / "brokenrun").mkdir()
    (root / "brokenrun" / "run.json").write_text("{broken")
    write_run(root / "badgates", {"legacy": s, "sp": s}, run_info={"config": {"gates": {"scores": {"margin": -1}}}})
    gates = {
        "bad.yaml": "scores: {margin: [unclosed\n",
        "unknown.yaml": yaml.safe_dump({"gates": {"scores": {"margni": 0.02}}}),
        "unknown-top.yaml": yaml.safe_dump({"tokenz": {}}),
        "type.yaml": yaml.safe_dump({"scores": {"margin": "wide"}}),
        "union.yaml": yaml.safe_dump({"tokens": {"teacher_kl_max": {"abs": "big"}}}),
        "range.yaml": yaml.safe_dump({"scores": {"alpha": 0.7}}),
        "bool.yaml": "scores: {margin: yes}\n",
        "list.yaml": "- scores\n- tokens\n",
        "empty.yaml": "",
    }
    for name, text in gates.items():
        (root / name).write_text(text)
    (root / "binary.yaml").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    (root / "gatesdir").mkdir()
    (root / "a-file").write_text("x")


def _truncate(root: Path, name: str) -> None:
    path = root / "run" / "sp" / name
    path.write_bytes(path.read_bytes()[:100])


# (case id, compare arguments (relative to the fixture root), tampering or None, fragments of the error)
COMPARE_CASES = [
    ("not-a-run", ["notrun"], None, ["notrun is not a run directory (no run.json)"]),
    ("reference-empty", ["run", "--reference", ""], None, ["--reference is empty"]),
    ("run-dir-empty", [""], None, ["RUN_DIR is empty"]),
    ("missing-run", ["nowhere"], None, ["nowhere is not a run directory"]),
    ("variant-as-run", ["r1/legacy"], None, ["r1/legacy is not a run directory"]),
    ("run-as-variant", ["run", "r1/legacy"], None, ["run is not a variant directory (no manifest.json)"]),
    ("three-targets", ["run", "run", "run"], None, ["exactly two variant directories"]),
    ("items-differ", ["r1/legacy", "r2/legacy"], None, ["r1/legacy has 6 items and r2/legacy has 4", "re-run with the same tasks and --limit"]),
    ("tasks-differ", ["r1/legacy", "r3/legacy"], None, ["ran tasks"]),
    ("prompts-differ", ["r1/legacy", "r4/legacy"], None, ["6 items have different prompts", "first: doc 0"]),
    ("across-with-reference", ["r1/legacy", "r1/legacy", "--reference", "legacy"], None, ["--reference and --variants apply to one run directory"]),
    ("reference-unknown", ["run", "--reference", "nope"], None, ["variant 'nope' has no directory in run"]),
    ("variants-unknown", ["run", "--variants", "sp,zz"], None, ["variant 'zz' has no directory in run"]),
    ("run-json-broken", ["brokenrun"], None, ["brokenrun/run.json is not valid JSON"]),
    ("run-gates-invalid", ["badgates"], None, ["badgates/run.json: config.gates.scores.margin"]),
    ("gates-bad-yaml", ["run", "--gates", "bad.yaml"], None, ["bad.yaml: invalid YAML at line 2", "fix the syntax"]),
    ("gates-unknown-key", ["run", "--gates", "unknown.yaml"], None, ["unknown key `scores.margni`", "did you mean `margin`?"]),
    ("gates-unknown-top-key", ["run", "--gates", "unknown-top.yaml"], None, ["unknown key `tokenz`"]),
    ("gates-wrong-type", ["run", "--gates", "type.yaml"], None, ["`scores.margin`", "valid number", "got 'wide'"]),
    ("gates-wrong-type-union", ["run", "--gates", "union.yaml"], None, ["`tokens.teacher_kl_max.abs`: Input should be a valid number or 'auto', got 'big'"]),
    ("gates-out-of-range", ["run", "--gates", "range.yaml"], None, ["`scores.alpha`", "got 0.7"]),
    ("gates-bool", ["run", "--gates", "bool.yaml"], None, ["`scores.margin`: got true where a number is wanted"]),
    ("gates-list", ["run", "--gates", "list.yaml"], None, ["list.yaml: expected a mapping", "found a list"]),
    ("gates-empty", ["run", "--gates", "empty.yaml"], None, ["empty.yaml: expected a mapping", "found an empty file"]),
    ("gates-binary", ["run", "--gates", "binary.yaml"], None, ["binary.yaml is not UTF-8 text"]),
    ("gates-directory", ["run", "--gates", "gatesdir"], None, ["gatesdir is a directory"]),
    ("gates-missing", ["run", "--gates", "nope.yaml"], None, ["nope.yaml does not exist"]),
    ("margin-negative", ["run", "--margin", "-0.5"], None, ["--margin must be positive and finite"]),
    ("margin-text", ["run", "--margin", "wide"], None, ["--margin"]),
    ("output-is-a-file", ["run", "--output", "a-file"], None, ["--output a-file is a file, not a directory"]),
    ("artifact-truncated", ["run"], "tokens.parquet", ["run/sp/tokens.parquet does not match its manifest", "re-run the variant or restore the file"]),
    ("artifact-deleted", ["run"], "samples.parquet:delete", ["run/sp/samples.parquet does not match its manifest (the file is missing"]),
    ("manifest-deleted", ["run"], "manifest.json:delete",
     ["run/sp/manifest.json is missing, so nothing shows that the files of variant 'sp' are what it wrote",
      "compare it unverified with `evalpipe compare --unverified` (verdict INCONCLUSIVE)"]),
]


def _snapshot(root: Path) -> dict[str, int]:
    # the run directory's lock file is not output (a compare that writes into a run takes it first)
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*") if p.is_file() and p.name != ".lock"}


@pytest.mark.parametrize("case,args,tamper,fragments", COMPARE_CASES, ids=[c[0] for c in COMPARE_CASES])
def test_bad_compare_input(tmp_path, monkeypatch, case, args, tamper, fragments):
    _compare_fixture(tmp_path)
    if tamper is not None:
        name, _, how = tamper.partition(":")
        if how == "delete":
            (tmp_path / "run" / "sp" / name).unlink()
        else:
            _truncate(tmp_path, name)
    monkeypatch.chdir(tmp_path)  # relative arguments, and the default across-run output reports/compare/ under it
    before = _snapshot(tmp_path)
    flat = assert_one_sentence(CliRunner().invoke(app, ["compare", *args]), fragments)
    print(f"compare {case}: {flat}")
    assert _snapshot(tmp_path) == before, "nothing is written when compare refuses"


def test_the_compare_corpus_covers_items_gates_and_artifacts():
    ids = {c[0] for c in COMPARE_CASES}
    assert {"not-a-run", "items-differ", "gates-bad-yaml", "gates-unknown-key", "gates-wrong-type", "artifact-truncated"} <= ids


# ---------------------------------------------------------------------------
# commands that only read (history list / show / export), and checks that come before
# the first write (history import, export's format, data build's names): one sentence,
# and nothing created, no directory, no empty database, no first data set.
# ---------------------------------------------------------------------------

MISSING_DB = "sqlite:///HERE/no/such/dir/history.sqlite"

# (case id, arguments (HERE: the test's directory), fragments of the error)
READ_CASES = [
    ("history-url-empty", ["history", "list", "--history", ""], ["--history is empty"]),
    ("history-list-missing", ["history", "list", "--history", MISSING_DB],
     ["there is no history at sqlite:///HERE/no/such/dir/history.sqlite", "`evalpipe history import RUN_DIR...` create it"]),
    ("history-show-missing", ["history", "show", "night-00", "--history", MISSING_DB], ["there is no history at"]),
    ("history-export-missing", ["history", "export", "-o", "HERE/out.csv", "--history", MISSING_DB], ["there is no history at"]),
    ("history-list-default-missing", ["history", "list", "--output", "HERE/runs"],
     ["HERE/runs/history.sqlite does not exist"]),
    ("baseline-set-missing", ["baseline", "set", "night-00", "--history", MISSING_DB], ["there is no history at"]),
    ("history-export-format", ["history", "export", "--format", "xml", "-o", "HERE/out.xml", "--history", "sqlite:///HERE/h.sqlite"],
     ["export format 'xml' is not one of csv, parquet"]),
    ("history-import-not-a-run", ["history", "import", "HERE", "--history", "sqlite:///HERE/h.sqlite"],
     ["HERE is not a run directory (it has no run.json)"]),
    ("history-import-kind", ["history", "import", "HERE", "--kind", "nighty", "--history", "sqlite:///HERE/h.sqlite"],
     ["--kind 'nighty' is not one of run, nightly"]),
    ("history-postgres-no-server", ["history", "list", "--history", "postgresql://"],
     ["history URL 'postgresql://' names no database server and no database",
      "postgresql+psycopg://USER@HOST[:PORT]/DATABASE"]),
    ("data-build-unknown", ["data", "build", "gsm8k_synth", "nosuch"],
     ["unknown generated data set `nosuch` (known: gsm8k_synth); nothing was built"]),
]


@pytest.mark.parametrize("case,args,fragments", READ_CASES, ids=[c[0] for c in READ_CASES])
def test_bad_read_input_creates_nothing(tmp_path, monkeypatch, case, args, fragments):
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    args = [a.replace("HERE", str(here)) for a in args]
    env = {"EVALPIPE_DATA_DIR": str(here / "data"), "PGHOST": None}
    flat = assert_one_sentence(CliRunner().invoke(app, args, env=env), [f.replace("HERE", str(here)) for f in fragments])
    print(f"{case}: {flat}")
    assert sorted(here.rglob("*")) == [], "nothing is created by a command that refused"


# ---------------------------------------------------------------------------
# Commands that write into an existing run directory (localize, compare, nightly
# --from-run): refused before they print a plan or start anything, nothing written.
# An option that sets the same quantity as a config key has the key's bounds.
# ---------------------------------------------------------------------------

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "default.yaml"


@pytest.fixture(scope="module")
def loc_template(tmp_path_factory):
    """runs/loc (a DIVERGENT run localize can read) in a directory every user can read:
    a read-only case runs as `nobody` when the tests run as root (see read_only)."""
    from nightly_fakes import write_localizable_run

    from evalpipe.config.loading import load_config

    root = tmp_path_factory.mktemp("loc")
    write_localizable_run(root / "runs" / "loc", load_config(CONFIG).model_dump(mode="json"))
    return root


@contextlib.contextmanager
def read_only(path: Path):
    """``path`` cannot be written meanwhile: its write bits off and, when the tests run as
    root (whom permissions do not stop), this process's effective user `nobody`, which can
    read what the test wrote (0644/0755 under a directory made traversable) but write none of it."""
    mode = path.stat().st_mode
    path.chmod(0o555)
    root = os.geteuid() == 0
    if root:
        os.seteuid(65534)
    try:
        yield
    finally:
        if root:
            os.seteuid(0)
        path.chmod(mode)


def _engines_must_not_start(*args, **kwargs):
    raise AssertionError("a refused localize reached its engines")


# (case id, arguments (relative to a copy of the template: runs/loc), tampering, fragments of the error)
WRITE_CASES = [
    ("localize-positions-huge", ["localize", "runs/loc", "--positions", "1000000"], None,
     ["--positions 1000000 is out of range: give a whole number from 1 to 256 (the bounds of the config key `localize.positions`)"]),
    ("localize-samples-huge", ["localize", "runs/loc", "--samples", "65"], None,
     ["--samples 65 is out of range: give a whole number from 1 to 64", "`localize.samples`"]),
    ("localize-decode-steps", ["localize", "runs/loc", "--decode-steps", "-1"], None,
     ["--decode-steps -1 is out of range: give a whole number from 0 to 64", "`localize.decode_steps`"]),
    ("localize-no-manifest", ["localize", "runs/loc", "--variant", "sp"], "sp/manifest.json",
     ["runs/loc/sp/manifest.json is missing, so nothing shows that the files of variant 'sp' are what it wrote",
      "restore it or re-run the variant"]),
    ("localize-reference-no-manifest", ["localize", "runs/loc", "--variant", "sp"], "legacy/manifest.json",
     ["runs/loc/legacy/manifest.json is missing"]),
    ("localize-read-only", ["localize", "runs/loc", "--variant", "sp"], "read-only",
     ["run directory runs/loc cannot be written (Permission denied); make it writable."]),
    ("compare-read-only", ["compare", "runs/loc"], "read-only",
     ["run directory runs/loc cannot be written (Permission denied); make it writable, or write the reports elsewhere with --output."]),
    ("nightly-from-run-read-only", ["nightly", "-c", str(CONFIG), "--from-run", "runs/loc", "--history", "sqlite:///h.sqlite"],
     "read-only", ["run directory runs/loc cannot be written (Permission denied); make it writable."]),
    ("nightly-from-run-not-a-run", ["nightly", "-c", str(CONFIG), "--from-run", "runs", "--history", "sqlite:///h.sqlite"], None,
     ["--from-run runs is not a run directory (no run.json)"]),
    ("run-json-broken", ["localize", "runs/loc"], "run.json:garbage",
     ["runs/loc/run.json is not valid JSON", "restore it from a copy, or run the tasks again with `evalpipe run`"]),
]


@pytest.mark.parametrize("case,args,tamper,fragments", WRITE_CASES, ids=[c[0] for c in WRITE_CASES])
def test_bad_input_to_a_command_that_writes_into_a_run(loc_template, monkeypatch, case, args, tamper, fragments):
    here = Path(tempfile.mkdtemp(prefix="evalpipe-corpus-"))  # not under pytest's own (0700) directories: `nobody` may enter it
    try:
        here.chmod(0o755)
        shutil.copytree(loc_template / "runs", here / "runs")
        run = here / "runs" / "loc"
        name, _, how = (tamper or "").partition(":")
        if how == "garbage":
            (run / name).write_text("{not json")
        elif name and name != "read-only":
            (run / name).unlink()
        monkeypatch.setattr("evalpipe.pipeline.localizing.ensure_model", _engines_must_not_start)
        before = _snapshot(here)
        with read_only(run) if name == "read-only" else contextlib.nullcontext():
            res = _invoke_in(here, args)
        flat = assert_one_sentence(res, fragments)
        print(f"{case}: {flat}")
        assert _snapshot(here) == before, "nothing is written by a command that refused"
    finally:
        shutil.rmtree(here, ignore_errors=True)


def _invoke_in(here: Path, args: list[str]):
    before = os.getcwd()
    os.chdir(here)
    try:
        return CliRunner().invoke(app, args, env={"HOME": str(here), "EVALPIPE_DATA_DIR": str(here / "data")})
    finally:
        os.chdir(before)


# (command line up to the option, the option, the config model and field of its twin key, the key);
# --margin and `gates.scores.margin` share a rule of their own (gate_settings.margin_problem)
TWINS = [
    (["localize", "runs/loc"], "--samples", "Localize", "samples", "localize.samples"),
    (["localize", "runs/loc"], "--positions", "Localize", "positions", "localize.positions"),
    (["localize", "runs/loc"], "--decode-steps", "Localize", "decode_steps", "localize.decode_steps"),
    (["run", "gsm8k", "--dry-run", "-c", str(CONFIG)], "--limit", "TaskSpec", "limit", "tasks.<group>.<n>.limit"),
    (["nightly", "-c", str(CONFIG)], "--limit", "TaskSpec", "limit", "tasks.<group>.<n>.limit"),
    (["calibrate", "-c", str(CONFIG)], "--limit", "TaskSpec", "limit", "tasks.<group>.<n>.limit"),
    (["run", "gsm8k", "--dry-run", "-c", str(CONFIG)], "--stall-timeout", "LaunchFields", "stall_timeout_s", "launch.stall_timeout_s"),
    (["nightly", "-c", str(CONFIG)], "--stall-timeout", "LaunchFields", "stall_timeout_s", "launch.stall_timeout_s"),
]


@pytest.mark.parametrize("prefix,option,model,field,key", TWINS, ids=[f"{t[0][0]} {t[1]}" for t in TWINS])
def test_an_option_and_its_config_key_refuse_the_same_values(loc_template, tmp_path, monkeypatch, prefix, option, model, field, key):
    """Just outside each bound of the key: the config refuses it, and so does the option, naming the key."""
    import pydantic

    from evalpipe.config import gate_settings, run_config

    cls = getattr(run_config, model, None) or getattr(gate_settings, model)
    lower = upper = None
    for m in cls.model_fields[field].metadata:
        lower = getattr(m, "ge", None) if hasattr(m, "ge") else (getattr(m, "gt", None) if hasattr(m, "gt") else lower)
        upper = getattr(m, "le", None) if hasattr(m, "le") else (getattr(m, "lt", None) if hasattr(m, "lt") else upper)
    assert lower is not None, f"{model}.{field} has no lower bound"
    whole = cls.model_fields[field].annotation in (int, int | None)
    outside = [lower - 1] + ([upper + 1] if upper is not None else [])
    shutil.copytree(loc_template / "runs", tmp_path / "runs")
    monkeypatch.setattr("evalpipe.pipeline.localizing.ensure_model", _engines_must_not_start)
    for value in outside:
        value = int(value) if whole else value
        with pytest.raises(pydantic.ValidationError):
            cls.model_validate({"task": "t", field: value} if model == "TaskSpec" else {field: value})
        res = _invoke_in(tmp_path, [*prefix, option, str(value)])
        assert_one_sentence(res, [f"{option} {value:g} is out of range", f"`{key}`"])
