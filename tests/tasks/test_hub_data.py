"""Hub-only long-context tasks (evalpipe/tasks/hub_data.py): check_available says in one
sentence which hub data set, config and split a task lacks and where it looked, passes when
the local cache has it or local files stand in where lm-eval reads them, and leaves other
tasks alone. The module runs with the hub off and sockets refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpipe.tasks.families import OFFLINE_RULER, DataUnavailable
from evalpipe.tasks.hub_data import check_available

pytestmark = pytest.mark.usefixtures("offline")


@pytest.fixture()
def empty_cache(tmp_path, monkeypatch):
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(dconfig, "HF_DATASETS_CACHE", tmp_path / "hf" / "datasets")
    monkeypatch.setattr(hconst, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path / "hf"


def _fake_cached_dataset(datasets_cache: Path, repo: str, config: str, split: str, rows: list[dict]) -> Path:
    """What `datasets.load_dataset(repo, config)` leaves in the cache after a download."""
    import datasets
    from datasets.arrow_writer import ArrowWriter
    from datasets.naming import camelcase_to_snakecase

    namespace, name = repo.split("/")
    snake = camelcase_to_snakecase(name)
    where = datasets_cache / f"{namespace}___{snake}" / config / "0.0.0" / "0123456789abcdef"
    where.mkdir(parents=True)
    ds = datasets.Dataset.from_list(rows)
    with ArrowWriter(path=str(where / f"{snake}-{split}.arrow"), features=ds.features) as writer:
        writer.write_table(ds.data.table)
        writer.finalize()
    info = datasets.DatasetInfo(features=ds.features, config_name=config, dataset_name=snake)
    info.splits = datasets.SplitDict({split: datasets.SplitInfo(name=split, num_examples=len(rows), dataset_name=snake)})
    info.write_to_directory(str(where))
    return where


def test_longbench_without_data_raises_one_clear_sentence(empty_cache):
    with pytest.raises(DataUnavailable) as err:
        check_available("longbench_hotpotqa")
    msg = str(err.value)
    assert "`Xnhyacinth/LongBench` (config `hotpotqa`)" in msg
    assert str(empty_cache / "datasets") in msg
    assert "copy its ~/.cache/huggingface" in msg and "data_files:" in msg
    assert msg.count(". ") == 0 and msg.endswith(".")  # one sentence


def test_longbench_group_names_the_missing_count(empty_cache):
    with pytest.raises(DataUnavailable, match=r"^\d+ of the \d+ tasks of `longbench_single_tasks` have no data here"):
        check_available("longbench_single_tasks")


def test_longbench_passes_when_the_cache_has_it(empty_cache):
    import datasets

    rows = [{"input": "q", "context": "c", "answers": ["a"], "length": 1, "dataset": "hotpotqa", "language": "en",
             "all_classes": None, "_id": "x"}]
    _fake_cached_dataset(empty_cache / "datasets", "Xnhyacinth/LongBench", "hotpotqa", "test", rows)
    check_available("longbench_hotpotqa")  # no exception
    # and the fake is what datasets itself reads offline
    assert datasets.load_dataset("Xnhyacinth/LongBench", "hotpotqa", split="test")[0]["input"] == "q"
    with pytest.raises(DataUnavailable, match="config `2wikimqa`"):
        check_available("longbench_2wikimqa")


def test_local_files_stand_in_only_where_lm_eval_reads_them(empty_cache, tmp_path):
    f = tmp_path / "hotpot.jsonl"
    f.write_text("{}\n")
    check_available("longbench_hotpotqa", data_files={"test": str(f)})
    with pytest.raises(DataUnavailable, match="does not exist"):
        check_available("longbench_hotpotqa", data_files={"test": str(tmp_path / "nope.jsonl")})
    with pytest.raises(DataUnavailable, match="does not read `data_files:`"):
        check_available("babilong_qa1", data_files={"test": str(f)})


def test_babilong_checks_the_config_its_metadata_names(empty_cache):
    with pytest.raises(DataUnavailable, match="RMT-team/babilong-1k-samples` \\(config `0k`\\)"):
        check_available("babilong_qa1")
    _fake_cached_dataset(empty_cache / "datasets", "RMT-team/babilong-1k-samples", "4k", "qa1",
                         [{"input": "i", "question": "q", "target": "t"}])
    check_available("babilong_qa1", metadata={"max_seq_lengths": "4k"})
    with pytest.raises(DataUnavailable, match="split `qa2`"):
        check_available("babilong_qa2", metadata={"max_seq_lengths": "4k"})


def test_ruler_variants_that_download(empty_cache):
    with pytest.raises(DataUnavailable, match="baber/paul_graham_essays"):
        check_available("niah_single_2")
    with pytest.raises(DataUnavailable, match="rajpurkar.github.io.* cannot run offline"):
        check_available("ruler_qa_squad")
    check_available("ruler_qa_squad", allow_download=True)
    with pytest.raises(DataUnavailable, match="7 of the 13 tasks of group `ruler`"):
        check_available("ruler")
    for name in OFFLINE_RULER:
        check_available(name)


def test_other_hub_families_and_unknown_tasks(empty_cache):
    with pytest.raises(DataUnavailable, match="recursal/longbench-v2"):
        check_available("longbench2_detective")
    with pytest.raises(DataUnavailable, match="xinrongzhang2022/InfiniteBench"):
        check_available("infinitebench_passkey")
    with pytest.raises(DataUnavailable, match="tau/scrolls"):
        check_available("scrolls_qasper")
    check_available("gsm8k")  # not a long-context task: nothing to say
    check_available("longbench_hotpotqa", allow_download=True)
