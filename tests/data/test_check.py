"""Data files checked before an engine starts (evalpipe.data.check)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from evalpipe.data.check import DataFileError, check_data_files, columns_of, template_columns

CFG = {"doc_to_text": "Question: {{question}}\nAnswer:", "doc_to_target": "{{answer}}", "doc_to_choice": None}


def test_template_columns_reads_jinja_fields_only():
    assert template_columns(CFG) == {"doc_to_text": {"question"}, "doc_to_target": {"answer"}}
    assert template_columns({"doc_to_text": "question", "doc_to_target": lambda d: d}) == {}


def test_every_format_gives_columns_and_rows(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"question": "q", "answer": "a"}\n\n{"question": "r", "answer": "b", "x": 1}\n')
    (tmp_path / "a.json").write_text('{"data": [{"question": "q", "answer": "a"}]}')
    (tmp_path / "a.csv").write_text("question,answer\nq,a\nr,b\n")
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), tmp_path / "a.parquet")
    assert columns_of(tmp_path / "a.jsonl") == ({"question", "answer", "x"}, 2)
    assert columns_of(tmp_path / "a.json") == ({"question", "answer"}, 1)
    assert columns_of(tmp_path / "a.csv") == ({"question", "answer"}, 2)
    assert columns_of(tmp_path / "a.parquet") == ({"question", "answer"}, 1)
    check_data_files("t", {"test": [str(tmp_path / f"a.{ext}") for ext in ("jsonl", "json", "csv", "parquet")]}, CFG)


@pytest.mark.parametrize("name,content,fragment", [
    ("b.jsonl", '{"question": 1}\n{oops}\n', "b.jsonl, line 2: not valid JSON"),
    ("b.json", '[{"question": 1},', "b.json, line 1: not valid JSON"),
    ("b.json", '{"question": 1}', "is not a list of objects"),
    ("b.csv", "q,a\n1,2\n", "lacks the columns answer, question that the task's doc_to_text"),
    ("b.parquet", "not parquet", "cannot be read as Parquet"),
    ("b.jsonl", "\n\n", "has no items"),
    ("b.jsonl", b"\xff\xfe{", "is not UTF-8 text"),
])
def test_bad_files_are_one_sentence_naming_the_file(tmp_path, name, content, fragment):
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(DataFileError) as err:
        check_data_files("t", {"test": str(path)}, {"doc_to_text": "{{question}}{{answer}}", "doc_to_target": "{{answer}}{{question}}"})
    assert fragment in str(err.value) and str(path) in str(err.value)


@pytest.mark.parametrize("name", ["table.jsonl", "table.json", "table.csv"])
def test_a_parquet_file_named_as_text_is_called_parquet(tmp_path, name):
    """Read as text it would be 'not UTF-8 (byte N)'; the magic bytes say what it is and the fix."""
    path = tmp_path / name
    pq.write_table(pa.table({"question": ["q"], "answer": ["a"]}), path)
    with pytest.raises(DataFileError) as err:
        columns_of(path)
    stem = name.split(".")[0]
    assert str(err.value) == (f"data file {path} is a Parquet file, not .{name.split('.')[1]} text; rename it to "
                              f"{stem}.parquet (and the `data_files` entry with it).")
    renamed = path.rename(tmp_path / f"{stem}.parquet")
    assert columns_of(renamed) == ({"question", "answer"}, 1)


def test_data_build_checks_every_name_before_writing(tmp_path):
    from in_process import evalpipe

    data = tmp_path / "data"
    proc = evalpipe("data", "build", "gsm8k_synth", "nosuch", cwd=tmp_path, env={"EVALPIPE_DATA_DIR": str(data)})
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    flat = " ".join(proc.stderr.split())
    assert flat == ("error: unknown generated data set `nosuch` (known: gsm8k_synth); nothing was built, "
                    "name only known sets."), flat
    assert not data.exists(), "the first, known, set was not written either"
    proc = evalpipe("data", "build", "gsm8k_synth", cwd=tmp_path, env={"EVALPIPE_DATA_DIR": str(data)})
    assert proc.returncode == 0 and (data / "gsm8k_synth").is_dir(), proc.stderr
