"""Per-task settings applied before lm-eval builds a task (evalpipe/tasks/configure.py):
task_config resolves relative data files under the data directory (generated on first
use), points a task at local files, overrides few-shot and max_gen_toks, generates
long-context and RULER items with the model's tokenizer, and refuses what does not apply
in one sentence."""

import json

import pytest

from evalpipe.config.run_config import TaskSpec
from evalpipe.errors import UserError
from evalpipe.tasks.configure import task_config


def test_synthetic_task_resolves_its_data_under_the_data_dir(tmp_path):
    cfg = task_config(TaskSpec.model_validate({"task": "gsm8k_synth_4shot", "num_fewshot": 4}), tmp_path)
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
    import pyarrow as pa
    import pyarrow.parquet as pq

    for split in ("train", "test"):  # the task's templates read question and answer
        pq.write_table(pa.table({"question": ["1 + 1?"], "answer": ["#### 2"]}), tmp_path / "gsm" / f"{split}.parquet")
    spec = {"task": "gsm8k_4shot", "data_files": {"train": "gsm/train.parquet", "test": str(tmp_path / "gsm" / "test.parquet")}}
    cfg = task_config(TaskSpec.model_validate(spec), tmp_path)
    assert cfg["dataset_path"] == "parquet" and cfg["dataset_name"] is None
    assert cfg["dataset_kwargs"]["data_files"]["train"] == str(tmp_path / "gsm" / "train.parquet")
    assert cfg["num_fewshot"] == 4 and cfg["test_split"] == "test"


def test_missing_local_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="data file .*nothere.parquet does not exist"):
        task_config(TaskSpec.model_validate({"task": "gsm8k_4shot", "data_files": {"test": "nothere.parquet"}}), tmp_path)


def test_max_gen_toks_override_keeps_the_stop_strings(tmp_path):
    cfg = task_config(TaskSpec.model_validate({"task": "gsm8k_synth_4shot", "max_gen_toks": 64}), tmp_path)
    assert cfg["generation_kwargs"]["max_gen_toks"] == 64
    assert cfg["generation_kwargs"]["until"] == ["Question:", "</s>", "<|im_end|>"]


def test_a_sampled_task_asks_lm_eval_for_a_repeat_per_sample_and_a_greedy_one_does_not(tmp_path):
    sampled = task_config(TaskSpec.model_validate({"task": "gsm8k_synth_4shot", "sampling": {"temperature": 0.6, "samples": 4}}), tmp_path)
    greedy = task_config(TaskSpec.model_validate({"task": "gsm8k_synth_4shot"}), tmp_path)
    assert sampled["repeats"] == 4 and greedy["repeats"] == 1  # the task's own
    assert {k: v for k, v in sampled.items() if k != "repeats"} == {k: v for k, v in greedy.items() if k != "repeats"}


def test_longctx_task_gets_its_data_generated_with_the_models_tokenizer(saved_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    from evalpipe.tasks.configure import LongCtxData

    generated = LongCtxData(str(saved_tokenizer), {"lengths": [300], "sparse_block": 256, "tp_sizes": [4], "items_per_length": 1})
    cfg = task_config(TaskSpec.model_validate({"task": "longctx_passkey"}), tmp_path / "data", generated=generated)
    (test_file,) = cfg["dataset_kwargs"]["data_files"].values()
    assert test_file.startswith(str(tmp_path / "data" / "longctx" / "passkey-")) and test_file.endswith("test.jsonl")
    items = [json.loads(line) for line in open(test_file)]
    tok = AutoTokenizer.from_pretrained(str(saved_tokenizer))
    assert sorted(it["target_length"] for it in items) == [255, 256, 257, 259, 300]
    for it in items:
        assert len(tok.encode(it["prompt"], add_special_tokens=False)) == it["target_length"] == it["length"]
    # other tasks never load the tokenizer
    plain = LongCtxData(str(tmp_path / "missing"), None)
    assert task_config(TaskSpec.model_validate({"task": "gsm8k_synth_4shot"}), tmp_path / "data", generated=plain)["dataset_path"] == "json"


def test_ruler_overrides_and_refusals(saved_tokenizer, tmp_path):
    from evalpipe.tasks.configure import LongCtxData

    generated = LongCtxData(str(saved_tokenizer), {"lengths": [512], "ruler_items_per_length": 1})
    cfg = task_config(TaskSpec(task="ruler_fwe", max_gen_toks=20), tmp_path, generated=generated)
    assert cfg["generation_kwargs"] == {"do_sample": False, "temperature": 0.0, "max_gen_toks": 20, "until": []}
    with pytest.raises(UserError, match="remove `data_files`"):
        task_config(TaskSpec(task="ruler_fwe", data_files={"test": "x.jsonl"}), tmp_path, generated=generated)
    with pytest.raises(UserError, match="resolve it with a LongCtxData"):
        task_config(TaskSpec(task="ruler_fwe"), tmp_path)
    with pytest.raises(ValueError, match="ruler_items_per_length is 0"):
        task_config(TaskSpec(task="ruler_fwe"), tmp_path, generated=LongCtxData(str(saved_tokenizer), {"ruler_items_per_length": 0}))
