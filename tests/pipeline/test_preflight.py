"""evalpipe/pipeline/preflight.py: what a plan is checked for before any engine starts -- an
unknown task name (first), a data file a task entry names that is missing or lacks a column, an
engine argument the variant's vLLM does not know -- each refused as one sentence
(ConfigError), and a plan that passes answered with the probed names of every variant."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from plans import fake_plan
from rich.console import Console

from evalpipe.config.errors import ConfigError
from evalpipe.pipeline import preflight as preflight_module
from evalpipe.pipeline.preflight import check_user_data, preflight
from evalpipe.tasks.index import TaskNotFound


def _plan_of_task(tmp_path, entry: dict, variants: dict | None = None):
    return fake_plan(tmp_path, variants or {"a": {}, "b": {}}, "pre", tasks={"gsm8k": [entry]})


def test_a_plan_that_passes_gets_each_variant_s_probed_names(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {"engine": {"max_num_seqs": 1}}}, "pre")
    names = preflight(plan, Console(quiet=True))
    assert sorted(names) == ["a", "b"]
    assert not plan.run_dir.exists(), "nothing is written before the run starts"


def test_an_unknown_task_is_one_sentence_and_checked_first(tmp_path, monkeypatch):
    # the task index's own sentence (all of lm-eval's tasks indexed, ~5 s) is pinned in
    # tests/tasks/test_index.py; here: it reaches the user as a ConfigError, before the
    # data files and the engine arguments are looked at
    def unknown(names):
        raise TaskNotFound(f"unknown task `{names[0]}`: it is neither in tasks nor among lm-eval's tasks.")

    monkeypatch.setattr(preflight_module, "check_task_names", unknown)
    plan = _plan_of_task(tmp_path, {"task": "gsm8k_4shot", "data_files": {"test": str(tmp_path / "nothere.parquet")}},
                         {"a": {}, "b": {"engine": {"max_num_seq": 1}}})
    with pytest.raises(ConfigError, match="^unknown task `gsm8k_4shot`: it is neither"):
        preflight(plan, Console(quiet=True))


def test_a_data_file_that_is_missing_or_lacks_a_column_is_refused(tmp_path):
    missing = _plan_of_task(tmp_path, {"task": "gsm8k_4shot", "data_files": {"test": str(tmp_path / "nothere.parquet")}})
    with pytest.raises(ConfigError, match="nothere.parquet does not exist"):
        check_user_data(missing)
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"prompt": ["1 + 1?"]}), bad)  # gsm8k's templates read question and answer
    with pytest.raises(ConfigError, match="lacks the column question"):
        check_user_data(_plan_of_task(tmp_path, {"task": "gsm8k_4shot", "data_files": {"train": str(bad), "test": str(bad)}}))
    check_user_data(fake_plan(tmp_path, {"a": {}}, "no-data-files"))  # nothing to read: nothing refused


def test_an_engine_argument_the_variant_s_vllm_does_not_know_is_refused(tmp_path):
    plan = fake_plan(tmp_path, {"a": {}, "b": {"engine": {"max_num_seq": 1}}}, "pre")
    with pytest.raises(ConfigError, match="variant `b`: `max_num_seq` is not an engine argument"):
        preflight(plan, Console(quiet=True))
