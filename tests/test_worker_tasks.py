"""Task lookup and per-task overrides (lm-eval's task index, no engine)."""

import json

import pytest

from evalpipe.worker.tasks import TaskNotFound, check_task_names, task_config


def test_synthetic_task_resolves_its_data_under_the_data_dir(tmp_path):
    cfg = task_config({"task": "gsm8k_synth_4shot", "num_fewshot": 4}, tmp_path)
    files = cfg["dataset_kwargs"]["data_files"]
    assert files == {"train": str(tmp_path / "gsm8k_synth" / "train.jsonl"), "test": str(tmp_path / "gsm8k_synth" / "test.jsonl")}
    # generated on first use
    first = json.loads((tmp_path / "gsm8k_synth" / "test.jsonl").read_text().splitlines()[0])
    assert set(first) >= {"question", "answer"}
    assert cfg["dataset_path"] == "json" and cfg["num_fewshot"] == 4
    # the prompt, filters and metric are GSM8K's
    assert cfg["doc_to_text"] == "Question: {{question}}\nAnswer:"
    assert [f["name"] for f in cfg["filter_list"]] == ["strict-match", "flexible-extract"]
    assert "tag" not in cfg


def test_gsm8k_4shot_can_point_at_local_files(tmp_path):
    (tmp_path / "gsm").mkdir()
    for split in ("train", "test"):
        (tmp_path / "gsm" / f"{split}.parquet").write_bytes(b"")
    spec = {"task": "gsm8k_4shot", "data_files": {"train": "gsm/train.parquet", "test": str(tmp_path / "gsm" / "test.parquet")}}
    cfg = task_config(spec, tmp_path)
    assert cfg["dataset_path"] == "parquet" and cfg["dataset_name"] is None
    assert cfg["dataset_kwargs"]["data_files"]["train"] == str(tmp_path / "gsm" / "train.parquet")
    assert cfg["num_fewshot"] == 4 and cfg["test_split"] == "test"


def test_missing_local_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file .*nothere.parquet does not exist"):
        task_config({"task": "gsm8k_4shot", "data_files": {"test": "nothere.parquet"}}, tmp_path)


def test_max_gen_toks_override_keeps_the_stop_strings(tmp_path):
    cfg = task_config({"task": "gsm8k_synth_4shot", "max_gen_toks": 64}, tmp_path)
    assert cfg["generation_kwargs"]["max_gen_toks"] == 64
    assert cfg["generation_kwargs"]["until"] == ["Question:", "</s>", "<|im_end|>"]


def test_lm_eval_tasks_by_name(tmp_path):
    check_task_names(["gsm8k", "hellaswag", "niah_single_1"])
    cfg = task_config({"task": "gsm8k"}, tmp_path)
    assert cfg["dataset_path"] == "openai/gsm8k"
    with pytest.raises(TaskNotFound, match="Did you mean: gsm8k"):
        check_task_names(["gsm8kk"])
