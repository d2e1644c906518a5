"""Bad input, as a corpus: every case ends with exit code 2, exactly one error sentence
naming what is wrong and where, no traceback, and no run directory left behind.
In-process (typer's runner): every case fails before anything starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from evalpipe.cli import app

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
    ("limit-zero", GOOD, ["--limit", "0"], ["--limit must be a positive number"]),
    ("limit-negative", GOOD, ["--limit", "-3"], ["--limit must be a positive number"]),
    ("limit-text", GOOD, ["--limit", "ten"], ["--limit"]),
    ("timeout-zero", GOOD, ["--timeout", "0"], ["--timeout 0 must be a positive number"]),
    ("timeout-negative", GOOD, ["--timeout", "-1"], ["--timeout -1 must be a positive number"]),
    ("timeout-text", GOOD, ["--timeout", "soon"], ["--timeout"]),
    ("run-id-escape", GOOD, ["--run-id", "../../escape"], ["--run-id '../../escape' is not a plain directory name"]),
    ("run-id-slash", GOOD, ["--run-id", "a/b"], ["is not a plain directory name"]),
    ("run-id-dots", GOOD, ["--run-id", ".."], ["is not a plain directory name"]),
    ("output-file", GOOD, ["--output", "FILE"], ["is a file, not a directory"]),
    ("model-missing", with_(model={"path": "/nonexistent/model"}), [], ["/nonexistent/model", "does not exist"]),
    ("model-empty-dir", with_(model={"path": "EMPTYMODEL"}), [], ["is not a complete model: config.json is missing and no weights"]),
    ("model-no-weights", with_(model={"path": "NOWEIGHTS"}), [], ["is not a complete model: no weights"]),
    ("variants-unknown", GOOD, ["--variants", "a,c"], ["variant `c` is not defined"]),
    ("data-broken-line", with_(tasks=data_task("bad.jsonl")), [], ["bad.jsonl, line 2: not valid JSON"]),
    ("data-missing-column", with_(tasks=data_task("cols.jsonl")), [], ["cols.jsonl", "lacks the column question", "doc_to_text"]),
    ("data-empty", with_(tasks=data_task("empty.jsonl")), [], ["empty.jsonl", "has no items"]),
    ("data-unsupported", with_(tasks=data_task("data.txt")), [], ["data.txt has the unsupported type .txt"]),
    ("data-missing", with_(tasks=data_task("missing.jsonl")), [], ["missing.jsonl does not exist"]),
    ("data-not-objects", with_(tasks=data_task("list.jsonl")), [], ["list.jsonl, line 1: a list, not an object"]),
    ("python-missing", with_(variants={"a": {}, "b": {"python": "/nonexistent/bin/python"}}), [], ["/nonexistent/bin/python"]),
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


@pytest.mark.parametrize("case,config,extra,fragments", CASES, ids=[c[0] for c in CASES])
def test_bad_input(tmp_path, monkeypatch, case, config, extra, fragments):
    monkeypatch.chdir(tmp_path)
    res = _invoke(tmp_path, config, list(extra))
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
    print(f"{case}: {flat}")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir()), "nothing is written for a run that never started"


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 40
