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


def _save_tokenizer(path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from evalpipe.data import longctx

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(longctx.FILLER) * 5 + list(longctx.HEADER.values()), trainer=trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(str(path))


def test_longctx_task_gets_its_data_generated_with_the_models_tokenizer(tmp_path):
    from transformers import AutoTokenizer

    from evalpipe.worker.tasks import LongCtxData

    _save_tokenizer(tmp_path / "tok")
    generated = LongCtxData(str(tmp_path / "tok"), {"lengths": [300], "sparse_block": 256, "tp_sizes": [4], "items_per_length": 1})
    cfg = task_config({"task": "longctx_passkey"}, tmp_path / "data", generated=generated)
    (test_file,) = cfg["dataset_kwargs"]["data_files"].values()
    assert test_file.startswith(str(tmp_path / "data" / "longctx" / "passkey-")) and test_file.endswith("test.jsonl")
    items = [json.loads(line) for line in open(test_file)]
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert sorted(it["target_length"] for it in items) == [255, 256, 257, 259, 300]
    for it in items:
        assert len(tok.encode(it["prompt"], add_special_tokens=False)) == it["target_length"] == it["length"]
    # other tasks never load the tokenizer
    plain = LongCtxData(str(tmp_path / "missing"), None)
    assert task_config({"task": "gsm8k_synth_4shot"}, tmp_path / "data", generated=plain)["dataset_path"] == "json"
