import os
import stat

import pyarrow as pa
import pytest

from evalpipe.rundir import artifacts


def test_write_json_is_stable_and_atomic(tmp_path):
    path = tmp_path / "sub" / "x.json"
    artifacts.write_json(path, {"b": 1, "a": [1.5, "é"]})
    first = path.read_bytes()
    artifacts.write_json(path, {"a": [1.5, "é"], "b": 1})
    assert path.read_bytes() == first, "same content, same bytes"
    assert artifacts.read_json(path) == {"a": [1.5, "é"], "b": 1}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"], "no temp files left behind"
    mode = stat.S_IMODE(os.stat(path).st_mode)
    assert mode & 0o044, "readable by others like any plainly written file (not mkstemp's 0600)"


def test_failed_write_keeps_the_previous_file(tmp_path):
    path = tmp_path / "x.json"
    artifacts.write_json(path, {"ok": True})

    class Unserialisable:
        def __str__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        artifacts.write_json(path, {"bad": Unserialisable()})
    assert artifacts.read_json(path) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_samples_table_collects_score_and_answer_columns(tmp_path):
    rows = [
        {"task": "t", "doc_id": 0, "repeat": 0, "prompt_hash": "h", "prompt": "p", "target": "1",
         "response": "r", "n_tokens": 3, "finish_reason": "stop",
         "score:exact_match,strict-match": 1.0, "answer:strict-match": "1"},
        {"task": "t", "doc_id": 1, "repeat": 0, "prompt_hash": "h2", "prompt": "p2", "target": "2",
         "response": "r2", "n_tokens": 0, "finish_reason": None,
         "score:exact_match,flexible-extract": 0.0},
    ]
    table = artifacts.samples_table(rows)
    assert table.schema.field("score:exact_match,strict-match").type == pa.float64()
    assert table.schema.field("answer:strict-match").type == pa.string()
    assert artifacts.score_columns(table) == ["score:exact_match,flexible-extract", "score:exact_match,strict-match"]
    assert table.column("score:exact_match,strict-match").to_pylist() == [1.0, None]
    artifacts.write_table(tmp_path / "s.parquet", table)
    assert artifacts.read_table(tmp_path / "s.parquet").equals(table)


def test_tokens_table_schema_round_trips(tmp_path):
    cols = {"task": ["t", "t"], "doc_id": [0, 0], "repeat": [0, 0], "pos": [0, 1], "token_id": [5, 6],
            "logprob": [-0.5, -1.25], "topk_ids": [[5, 7], [6, 1]], "topk_logprobs": [[-0.5, -1.0], [-1.25, -2.0]]}
    table = artifacts.tokens_table(cols)
    assert table.schema == artifacts.TOKENS_SCHEMA
    artifacts.write_table(tmp_path / "t.parquet", table)
    assert artifacts.read_table(tmp_path / "t.parquet").column("topk_ids").to_pylist() == [[5, 7], [6, 1]]


def test_redact_env_hides_credentials_only():
    env = artifacts.redact_env({"HF_TOKEN": "x", "MY_API_KEY": "y", "VLLM_CPU_KVCACHE_SPACE": "2", "PATH": "/bin"})
    assert env == {"HF_TOKEN": "***", "MY_API_KEY": "***", "PATH": "/bin", "VLLM_CPU_KVCACHE_SPACE": "2"}


def test_doc_metadata_becomes_typed_sample_columns():
    doc = {"prompt": "...", "haystack_id": "passkey-2048-1", "target_length": 2049, "length_kind": "edge",
           "length_tags": ["tp4:1", "block+1"], "depth": 0.5, "unrelated": 3}
    assert artifacts.doc_columns(doc) == {"cluster": "passkey-2048-1", "target_length": 2049, "length_kind": "edge",
                                          "length_tags": "tp4:1,block+1", "depth": 0.5}
    assert artifacts.doc_columns({"question": "q"}) == {} and artifacts.doc_columns(None) == {}
    base = {"task": "t", "doc_id": 0, "repeat": 0, "prompt_hash": "h", "prompt": "p", "target": "1", "response": "1",
            "n_tokens": 1, "finish_reason": "stop"}
    table = artifacts.samples_table([{**base, **artifacts.doc_columns(doc)}, {**base, "doc_id": 1}])
    assert table.schema.field("target_length").type == pa.int64() and table.schema.field("depth").type == pa.float64()
    assert table.column("cluster").to_pylist() == ["passkey-2048-1", None]
    assert "cluster" not in artifacts.samples_table([base]).column_names, "tasks without metadata get no columns"


def test_ruler_length_bucket_and_depth_become_typed_sample_columns():
    from evalpipe.tasks.ruler import sample_columns

    doc = {"index": 0, "input": "filler 1234567 filler", "outputs": ["1234567"], "length": 3900, "max_length": 4096,
           "gen_prefix": "The special magic number is"}
    cols = artifacts.doc_columns(sample_columns("niah_single_1", doc))
    assert cols == {"target_length": 4096, "depth": round(7 / len(doc["input"]), 4)}
    assert artifacts.doc_columns(doc) == {}, "RULER's own field names map to no column by themselves"
    base = {"task": "niah_single_1", "doc_id": 0, "repeat": 0, "prompt_hash": "h", "prompt": "p", "target": "1",
            "response": "1", "n_tokens": 1, "finish_reason": "stop"}
    table = artifacts.samples_table([{**base, **cols}])
    assert table.column("target_length").to_pylist() == [4096] and table.schema.field("depth").type == pa.float64()
