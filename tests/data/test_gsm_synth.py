import itertools
import json
import re

import pytest

from evalpipe.data import gsm_synth

STRICT = re.compile(gsm_synth.STRICT_MATCH_REGEX)
ANNOTATION = re.compile(r"<<(\d+)([+\-*/])(\d+)=(\d+)>>(\d+)")


@pytest.fixture(scope="module")
def splits():
    return gsm_synth.make_splits()


def _apply(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    assert a % b == 0, f"inexact division {a}/{b}"
    return a // b


def _check_item(item: dict) -> None:
    assert set(item) == {"question", "answer", "n_steps"}
    q, ans, n_steps = item["question"], item["answer"], item["n_steps"]
    assert isinstance(q, str) and q.endswith("?")
    assert n_steps in (1, 2, 3)
    lines = ans.split("\n")
    assert len(lines) == n_steps + 1
    assert lines[-1].startswith("#### ")
    final = int(lines[-1][len("#### "):])
    assert final >= 0
    last_result = None
    for line in lines[:-1]:
        found = ANNOTATION.findall(line)
        assert len(found) == 1, line
        a, op, b, c, shown = found[0]
        a, b, c, shown = int(a), int(b), int(c), int(shown)
        assert _apply(a, op, b) == c, line
        assert shown == c, line
        assert c >= 0
        # the worked text repeats the annotated calculation: "a op b = <<a op b=c>>c"
        assert f"{a} {op} {b} = <<{a}{op}{b}={c}>>{c}" in line
        last_result = c
    assert last_result == final
    # lm-eval's strict-match filter finds the same number
    m = STRICT.search(ans)
    assert m and m.group(1) == str(final)


def test_split_sizes(splits):
    assert len(splits["test"]) == gsm_synth.SPLITS["test"][0] >= 500
    assert len(splits["train"]) == gsm_synth.SPLITS["train"][0] >= 500


def test_every_answer_is_consistent(splits):
    for item in splits["test"] + splits["train"]:
        _check_item(item)


def test_step_mix_and_variety(splits):
    test = splits["test"]
    counts = {k: sum(1 for d in test if d["n_steps"] == k) for k in (1, 2, 3)}
    assert all(c >= 0.1 * len(test) for c in counts.values()), counts
    ops = {op for d in test for op in re.findall(r"<<\d+([+\-*/])", d["answer"])}
    assert ops == {"+", "-", "*", "/"}
    assert len({d["question"].split()[0] for d in test}) > 10
    # not trivially copyable: the final answer is usually not a number from the question
    copied = sum(1 for d in test if d["answer"].rsplit("#### ", 1)[1] in re.findall(r"\d+", d["question"]))
    assert copied < 0.2 * len(test)


def test_no_duplicates_and_no_overlap(splits):
    test_q = [d["question"] for d in splits["test"]]
    train_q = [d["question"] for d in splits["train"]]
    assert len(set(test_q)) == len(test_q)
    assert len(set(train_q)) == len(train_q)
    assert not set(test_q) & set(train_q)
    corpus_q = {d["question"] for d in itertools.islice(gsm_synth.training_corpus(), 20000)}
    assert not set(test_q) & corpus_q
    assert gsm_synth.held_out_questions() == set(test_q)


def test_generate_is_deterministic_and_seeded():
    a = gsm_synth.generate(50, seed=7)
    assert a == gsm_synth.generate(50, seed=7)
    assert a != gsm_synth.generate(50, seed=8)
    excl = {d["question"] for d in a[:10]}
    b = gsm_synth.generate(50, seed=7, exclude=excl)
    assert not excl & {d["question"] for d in b}
    # the corpus stream is seeded too
    c1 = list(itertools.islice(gsm_synth.training_corpus(), 100))
    c2 = list(itertools.islice(gsm_synth.training_corpus(), 100))
    assert c1 == c2


def test_write_splits_byte_identical(tmp_path):
    p1 = gsm_synth.write_splits(tmp_path / "a")
    p2 = gsm_synth.write_splits(tmp_path / "b")
    assert set(p1) == {"train", "test"}
    for name in p1:
        assert p1[name].name == f"{name}.jsonl"
        assert p1[name].read_bytes() == p2[name].read_bytes()
    rows = [json.loads(line) for line in p1["test"].read_text(encoding="utf-8").splitlines()]
    assert rows == gsm_synth.make_splits()["test"]
    # no temp files left behind
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["test.jsonl", "train.jsonl"]


def test_ensure_splits_uses_data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("EVALPIPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("EVALPIPE_DATA_DIR", raising=False)
    paths = gsm_synth.ensure_splits()
    assert paths["test"] == tmp_path / "cache" / "data" / "gsm8k_synth" / "test.jsonl"
    assert paths["test"].exists() and paths["train"].exists()
    mtime = paths["test"].stat().st_mtime_ns
    assert gsm_synth.ensure_splits() == paths
    assert paths["test"].stat().st_mtime_ns == mtime  # not rewritten


def test_format_example_matches_lm_eval_gsm8k():
    item = {"question": "Q?", "answer": "x = <<1+1=2>>2.\n#### 2", "n_steps": 1}
    assert gsm_synth.format_example(item) == "Question: Q?\nAnswer: x = <<1+1=2>>2.\n#### 2"


def test_stale_or_edited_files_are_regenerated(tmp_path):
    paths = gsm_synth.write_splits(tmp_path)
    good = paths["test"].read_bytes()
    paths["test"].write_text('{"question": "old generator", "answer": "#### 1"}\n')
    mtime_train = paths["train"].stat().st_mtime_ns
    gsm_synth.ensure_splits(tmp_path)
    assert paths["test"].read_bytes() == good
    assert paths["train"].stat().st_mtime_ns == mtime_train, "files that already match are left alone"


def test_data_build_refuses_an_unknown_name_before_writing_any(tmp_path):
    from in_process import evalpipe

    proc = evalpipe("data", "build", "gsm8k_synth", "gsm9k", cwd=tmp_path, env={"EVALPIPE_DATA_DIR": str(tmp_path / "data")})
    assert proc.returncode == 2 and "unknown generated data set `gsm9k`" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists(), "a refused command line writes nothing"
