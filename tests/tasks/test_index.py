"""Task lookup (evalpipe/tasks/index.py: lm-eval's task index, no engine), and lm-eval's long-context
tasks through the worker path."""

import re

import pytest

from evalpipe.config.run_config import TaskSpec
from evalpipe.documents.worker_job import WorkerJob
from evalpipe.tasks.configure import task_config
from evalpipe.tasks.index import TaskNotFound, check_task_names


def test_lm_eval_tasks_by_name(tmp_path):
    check_task_names(["gsm8k", "hellaswag", "niah_single_1"])
    cfg = task_config(TaskSpec.model_validate({"task": "gsm8k"}), tmp_path)
    assert cfg["dataset_path"] == "openai/gsm8k"
    with pytest.raises(TaskNotFound, match="Did you mean: gsm8k"):
        check_task_names(["gsm8kk"])


def test_the_project_s_own_tasks_are_found_without_indexing_lm_eval_s():
    """Indexing lm-eval's ~15,000 task files costs ~10 s in every worker: only a task that is
    not one of the project's own needs it, and each index is built once per process."""
    from evalpipe.install import shipped_dir
    from evalpipe.tasks.index import task_manager

    tasks_dir = str(shipped_dir("tasks"))

    own = task_manager(names=["gsm8k_synth_4shot", "longctx_passkey"])
    assert "gsm8k_synth_4shot" in own.all_tasks and "hellaswag" not in own.all_tasks
    full = task_manager(names=["gsm8k_synth_4shot", "hellaswag"])
    assert "hellaswag" in full.all_tasks and "gsm8k_synth_4shot" in full.all_tasks
    assert task_manager() is full is task_manager(tasks_dir) is task_manager(tasks_dir, ["gsm8k"])
    assert task_manager(tasks_dir, ["longctx_vartrack"]) is own


# ---------------------------------------------------------------------------
# lm-eval's long-context tasks through the worker path (evalpipe.tasks.ruler, evalpipe.tasks.hub_data)
# ---------------------------------------------------------------------------

RULER_LENGTH = 1024  # fits niah_* with both tokenizers below; too short for ruler_vt with either


def _spec(task, **kw) -> TaskSpec:
    """A job's task entry, as the runner writes it."""
    return TaskSpec(task=task, **kw)


@pytest.fixture(scope="module")
def ruler_imported():
    """lm-eval's RULER needle module, imported once for the module (8-30 s, ~1 GB)."""
    from evalpipe.tasks import ruler

    return ruler.quiet_ruler_import()


@pytest.fixture(scope="module")
def builtin_tokenizer(builtin_model_dir):
    return builtin_model_dir


def _ruler_docs(tokenizer_dir, task, tmp_path, **longctx):
    from evalpipe.tasks.configure import LongCtxData
    from evalpipe.tasks.index import task_manager

    generated = LongCtxData(str(tokenizer_dir), {"lengths": [RULER_LENGTH], "ruler_items_per_length": 2, **longctx}, seed=7)
    cfg = task_config(_spec(task), tmp_path, generated=generated)
    task_obj = task_manager().load([cfg])["tasks"][task]
    return cfg, list(task_obj.eval_docs)


@pytest.mark.parametrize("which", ["builtin", "saved"])
def test_ruler_task_is_generated_with_the_models_tokenizer(which, request, ruler_imported, tmp_path):
    tokenizer_dir = request.getfixturevalue(f"{which}_tokenizer")
    cfg, docs = _ruler_docs(tokenizer_dir, "niah_single_1", tmp_path)
    assert len(docs) == 2 and {d["max_length"] for d in docs} == {RULER_LENGTH}
    assert cfg["metadata"]["tokenizer"] == str(tokenizer_dir.resolve()) and cfg["metadata"]["seed"] == 7
    assert cfg["metadata"]["num_samples"] == 2 and cfg["metadata"]["max_seq_lengths"] == [RULER_LENGTH]
    assert [m["metric"] for m in cfg["metric_list"]] == ["score", str(RULER_LENGTH)]
    assert cfg["generation_kwargs"]["max_gen_toks"] == 128 and cfg["generation_kwargs"]["until"] == []
    assert len(cfg["custom_dataset"].sha256) == 64


def test_ruler_items_interleave_lengths_so_limit_keeps_every_length(saved_tokenizer, ruler_imported, tmp_path):
    from evalpipe.worker.main import data_file_hashes

    cfg, docs = _ruler_docs(saved_tokenizer, "niah_multikey_2", tmp_path, lengths=[512, RULER_LENGTH])
    assert [d["max_length"] for d in docs] == [512, RULER_LENGTH, 512, RULER_LENGTH]
    again, _ = _ruler_docs(saved_tokenizer, "niah_multikey_2", tmp_path, lengths=[512, RULER_LENGTH])
    assert again["custom_dataset"].sha256 == cfg["custom_dataset"].sha256  # every variant sees the same items
    assert data_file_hashes([cfg]) == {"niah_multikey_2": {"test": {"path": "generated:ruler", "sha256": cfg["custom_dataset"].sha256}}}


class _Events:
    def __init__(self):
        self.events = []

    def emit(self, event, **fields):
        self.events.append({"event": event, **fields})

    def progress(self, *args):
        pass


def _run_step1(tmp_path, monkeypatch, tokenizer_dir, task, lengths):
    """main.run() with an engine start that fails the test: what step 1 makes of `task`."""
    from evalpipe.rundir import artifacts
    from evalpipe.worker import engine_choice, main

    def no_engine(*args, **kwargs):
        raise AssertionError("the engine must not start")

    monkeypatch.setattr(engine_choice, "build_engine", no_engine)
    job = WorkerJob(
        variant="v", output_dir=str(tmp_path / "v"), engine_args={"model": str(tokenizer_dir)},
        tasks=[_spec(task)], seed=1, data_dir=str(tmp_path / "data"), topk=1,
        longctx={"lengths": lengths, "ruler_items_per_length": 2},
    )
    events = _Events()
    code = main.run(job, events)
    (error,) = [e for e in events.events if e["event"] == "error"]
    manifest = artifacts.read_json(tmp_path / "v" / "manifest.json")
    return code, error, manifest


def _one_sentence(msg):
    return msg.endswith(".") and msg.count(". ") == 0 and "\n" not in msg


def test_ruler_length_too_short_is_a_user_error_before_the_engine_starts(saved_tokenizer, tmp_path, monkeypatch):
    from evalpipe.errors import ExitCode

    code, error, manifest = _run_step1(tmp_path, monkeypatch, saved_tokenizer, "ruler_vt", [RULER_LENGTH])
    assert code == ExitCode.USER_ERROR and error["kind"] == "user"
    assert re.match(rf"ruler_vt cannot fit an item into {RULER_LENGTH} tokens with this tokenizer: .*use a larger length "
                    rf"\(the lengths are `longctx.lengths` of the run config: {RULER_LENGTH}\)\.$", error["message"])
    assert _one_sentence(error["message"])
    assert manifest["status"] == "failed" and manifest["error"] == error["message"]


def test_hub_only_task_without_local_data_is_a_user_error_before_the_engine_starts(saved_tokenizer, tmp_path, monkeypatch):
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst

    from evalpipe.errors import ExitCode

    monkeypatch.setattr(dconfig, "HF_HUB_OFFLINE", True)  # as evalpipe's workers run (plan.DEFAULT_ENV)
    monkeypatch.setattr(dconfig, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(hconst, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    code, error, _ = _run_step1(tmp_path, monkeypatch, saved_tokenizer, "longbench_hotpotqa", [RULER_LENGTH])
    assert code == ExitCode.USER_ERROR and error["kind"] == "user"
    assert error["message"].startswith("task `longbench_hotpotqa` needs the hub dataset `Xnhyacinth/LongBench` (config `hotpotqa`)")
    assert str(tmp_path / "hf" / "datasets") in error["message"] and _one_sentence(error["message"])
    code, error, _ = _run_step1(tmp_path / "b", monkeypatch, saved_tokenizer, "ruler_qa_squad", [RULER_LENGTH])
    assert code == ExitCode.USER_ERROR and "cannot run offline" in error["message"]


def test_ruler_sample_rows_carry_the_length_bucket_and_needle_depth(builtin_tokenizer, ruler_imported, tmp_path):
    from evalpipe.rundir import artifacts
    from evalpipe.worker.main import sample_rows

    _, docs = _ruler_docs(builtin_tokenizer, "niah_single_1", tmp_path)

    def logged(doc_id, doc):
        return {"doc_id": doc_id, "doc": doc, "filter": "none", "filtered_resps": [" 1"], "metrics": ["score", str(doc["max_length"])],
                "score": 1.0, str(doc["max_length"]): 1.0, "arguments": [[doc["input"], {}]], "resps": [[" 1"]],
                "prompt_hash": "h", "target": str(doc["outputs"])}

    rows, _ = sample_rows("niah_single_1", [logged(i, d) for i, d in enumerate(docs)], {})
    for row, doc in zip(rows, docs):
        assert row["target_length"] == RULER_LENGTH and row["score:1024,none"] == 1.0
        assert row["depth"] == pytest.approx(doc["input"].find(doc["outputs"][0]) / len(doc["input"]), abs=1e-4)
    vt_doc = {**docs[0], "outputs": ["ABCDE"], "input": "VAR ABCDE = 1"}
    (vt_row,), _ = sample_rows("ruler_vt", [logged(0, vt_doc)], {})
    assert vt_row["target_length"] == RULER_LENGTH and "depth" not in vt_row  # no needle: no depth
    (other,), _ = sample_rows("gsm8k", [logged(0, docs[0])], {})
    assert "target_length" not in other and "depth" not in other  # `max_length` means nothing elsewhere
    table = artifacts.samples_table(rows)
    assert table.schema.field("target_length").type == artifacts.DOC_COLUMNS["target_length"]
