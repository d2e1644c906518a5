"""RULER generated offline with our tokenizer (evalpipe/tasks/ruler.py).

No engine: tasks are built through lm-eval's TaskManager (and one simple_evaluate with
a fake LM). Every test runs with the hub switched off and sockets refused, so any
download attempt (tokenizer, data set, nltk data) shows up as a failure.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from evalpipe.errors import UserError
from evalpipe.tasks import ruler
from evalpipe.tasks.families import OFFLINE_RULER
from evalpipe.tasks.ruler import RulerTooShort, generate_ruler_dataset, ruler_metadata, ruler_task_config

LENGTH = 2048  # the smallest power of two at which all six fit with the tiny model's tokenizer
N = 2

pytestmark = pytest.mark.usefixtures("offline")  # every test: the hub off, sockets refused


@pytest.fixture(scope="module")
def tokenizer_dir(builtin_model_dir) -> Path:
    return builtin_model_dir


@pytest.fixture(scope="module")
def task_manager():
    from evalpipe.tasks.index import task_manager

    return task_manager()


def _load(tm, cfg):
    return tm.load([cfg])["tasks"][cfg["task"]]


# ---------------------------------------------------------------------------
# RULER
# ---------------------------------------------------------------------------


def test_ruler_import_is_quiet(capfd, offline):
    """lm-eval's niah module calls nltk.download at import: no output, no network."""
    already = "lm_eval.tasks.ruler.prepare_niah" in sys.modules
    ruler.quiet_ruler_import()
    out, err = capfd.readouterr()
    if not already:
        assert "punkt_tab" not in out + err and "nltk_data" not in err
    assert offline == []


def test_ruler_metadata_takes_only_a_local_tokenizer_directory(tokenizer_dir, tmp_path):
    meta = ruler_metadata(tokenizer_dir, [4096, 1024, 1024], num_samples=3)
    assert meta == {
        "tokenizer": str(tokenizer_dir.resolve()),
        "pretrained": str(tokenizer_dir.resolve()),
        "max_seq_lengths": [1024, 4096],
        "num_samples": 3,
        "seed": ruler.DEFAULT_SEED,
    }
    with pytest.raises(FileNotFoundError, match="local directory"):
        ruler_metadata("meta-llama/Llama-3.1-8B", [1024])  # a hub id: never downloaded
    with pytest.raises(FileNotFoundError, match="no tokenizer files"):
        ruler_metadata(tmp_path, [1024])


@pytest.fixture(scope="module")
def built(tokenizer_dir, task_manager):
    """The six offline RULER tasks at LENGTH, N items each, built by lm-eval."""
    meta = ruler_metadata(tokenizer_dir, [LENGTH], num_samples=N)
    out = {}
    for name in OFFLINE_RULER:
        task = _load(task_manager, ruler_task_config(name, meta))
        task.build_all_requests(limit=None, rank=0, world_size=1)
        out[name] = task
    return out


@pytest.mark.parametrize("name", OFFLINE_RULER)
def test_offline_ruler_builds_within_the_length(built, name, tokenizer_dir):
    task = built[name]
    docs = list(task.eval_docs)
    assert len(docs) == N and len(task.instances) == N
    tok = ruler.load_tokenizer(str(tokenizer_dir.resolve()))
    for doc, inst in zip(docs, task.instances):
        assert {"index", "input", "outputs", "length", "max_length", "gen_prefix"} <= set(doc)
        assert doc["max_length"] == LENGTH and doc["outputs"]
        assert doc["length"] <= LENGTH + 50  # ruler_fwe sizes the text, not text + answer, to the length
        context, gen_kwargs = inst.args
        assert context.rstrip().endswith(doc["gen_prefix"])  # lm-eval appends the answer prefix
        n_tokens = len(tok(context).input_ids)
        assert LENGTH // 2 < n_tokens <= LENGTH, (name, n_tokens)
        assert gen_kwargs["max_gen_toks"] in (128, 30, 120, 50) and gen_kwargs["until"] == []
    assert task.config.metadata["max_seq_lengths"] == [LENGTH]


def test_generation_is_seeded_per_length(tokenizer_dir):
    base = dict(ruler_metadata(tokenizer_dir, [1024], num_samples=3), ruler_task="niah_single_1")
    one = generate_ruler_dataset(**base)["test"]
    again = generate_ruler_dataset(**base)["test"]
    both = generate_ruler_dataset(**{**base, "max_seq_lengths": [1024, 2048]})["test"]
    other_seed = generate_ruler_dataset(**{**base, "seed": 7})["test"]
    assert one["input"] == again["input"]
    assert both["max_length"] == [1024] * 3 + [2048] * 3
    assert both["input"][:3] == one["input"]  # adding a length leaves the others' items alone
    assert other_seed["input"] != one["input"]


def test_too_short_lengths_fail_with_a_sentence_instead_of_hanging(tokenizer_dir):
    # lm-eval's own ruler_vt loops for ever here (while True around a bare except),
    # and its ruler_cwe makes items with empty word lists and no answers.
    for name in ("ruler_vt", "ruler_cwe"):
        with pytest.raises(RulerTooShort, match=rf"{name} cannot fit .* 1024 tokens"):
            generate_ruler_dataset(**ruler_metadata(tokenizer_dir, [1024], num_samples=1), ruler_task=name)


class _NeedleReader:
    """A fake LM that answers NIAH questions by reading the needle out of the prompt."""

    def __new__(cls):
        from lm_eval.api.model import LM

        class Reader(LM):
            def generate_until(self, requests, disable_tqdm=False):
                out = []
                for inst in requests:
                    ctx = inst.args[0]
                    key = re.search(r"special magic number for (\S+) mentioned in the provided text\?", ctx).group(1)
                    out.append(" " + re.search(rf"for {re.escape(key)} is: (\d+)", ctx).group(1) + ".")
                return out

            def loglikelihood(self, requests, disable_tqdm=False):
                raise NotImplementedError

            def loglikelihood_rolling(self, requests, disable_tqdm=False):
                raise NotImplementedError

        return Reader()


def test_simple_evaluate_reports_score_and_per_length_metrics(tokenizer_dir, task_manager):
    from lm_eval import simple_evaluate

    cfg = ruler_task_config("niah_multikey_2", ruler_metadata(tokenizer_dir, [1024, 2048], num_samples=2))
    out = simple_evaluate(model=_NeedleReader(), tasks=[cfg], task_manager=task_manager, log_samples=True, bootstrap_iters=0)
    res = out["results"]["niah_multikey_2"]
    assert res["score,none"] == 1.0 and res["1024,none"] == 1.0 and res["2048,none"] == 1.0
    logged = out["samples"]["niah_multikey_2"]
    assert sorted(e["doc"]["max_length"] for e in logged) == [1024, 1024, 2048, 2048]
    for e in logged:  # each item carries its own length's metric only
        assert set(e["metrics"]) == {"score", str(e["doc"]["max_length"])}


def test_simple_evaluate_metadata_is_ignored_with_an_explicit_task_manager(tokenizer_dir, task_manager):
    """Why the metadata goes into the task config (or TaskManager(metadata=...))."""
    from lm_eval import simple_evaluate

    meta = {"tokenizer": str(tokenizer_dir), "max_seq_lengths": [1024]}
    with pytest.raises(AssertionError, match="No tokenizer or pretrained provided"):
        simple_evaluate(model=_NeedleReader(), tasks=["niah_multikey_2"], task_manager=task_manager, metadata=meta)


def test_stock_builder_reads_config_metadata_and_makes_500_items(tokenizer_dir, task_manager):
    """lm-eval's own builder takes the same metadata from a config dict (TaskManager(metadata=...)
    merges into the same place), but has no knob for the item count."""
    from lm_eval.tasks._yaml_loader import load_yaml

    ruler.quiet_ruler_import()
    cfg = load_yaml(task_manager.task_index["niah_multikey_2"].yaml_path, resolve_func=True)
    cfg.pop("tag", None)
    cfg["metadata"] = {"tokenizer": str(tokenizer_dir), "max_seq_lengths": [1024], "num_samples": 3}
    docs = list(_load(task_manager, cfg).eval_docs)
    assert len(docs) == 500 and {d["max_length"] for d in docs} == {1024}


def test_ruler_task_config_keeps_evalpipe_overrides(tokenizer_dir):
    meta = ruler_metadata(tokenizer_dir, [4096], num_samples=1)
    cfg = ruler_task_config({"task": "ruler_vt", "generation_kwargs": {"max_gen_toks": 7, "until": []}}, meta)
    assert cfg["generation_kwargs"]["max_gen_toks"] == 7
    assert cfg["metadata"]["ruler_task"] == "ruler_vt" and cfg["metadata"]["num_samples"] == 1
    assert [m["metric"] for m in cfg["metric_list"]] == ["score", "4096"]
    assert "tag" not in cfg and callable(cfg["custom_dataset"])
    with pytest.raises(UserError, match="not a RULER task"):
        ruler_task_config("ruler_qa_squad", meta)


def test_item_fields_give_length_and_needle_depth(built):
    doc = next(iter(built["niah_single_1"].eval_docs))
    fields = ruler.item_fields(doc)
    assert fields["max_length"] == LENGTH and fields["length"] == doc["length"]
    assert 0.0 <= fields["depth"] <= 1.0


def test_prebuilt_items_interleave_lengths_and_are_what_lm_eval_gets(tokenizer_dir, task_manager):
    cfg = ruler_task_config("niah_multikey_2", ruler_metadata(tokenizer_dir, [1024, LENGTH], num_samples=2))
    pre = ruler.prebuild_ruler(cfg)
    assert cfg["custom_dataset"] is generate_ruler_dataset  # the input config is left alone
    docs = list(_load(task_manager, pre).eval_docs)
    assert [d["max_length"] for d in docs] == [1024, LENGTH, 1024, LENGTH]
    plain = generate_ruler_dataset(**cfg["metadata"])["test"]
    assert sorted(d["input"] for d in docs) == sorted(plain["input"])  # same items, other order
    assert "sha256 " + pre["custom_dataset"].sha256[:12] in repr(pre["custom_dataset"])


def test_ruler_task_config_merges_a_max_gen_toks_override(tokenizer_dir):
    cfg = ruler_task_config({"task": "niah_single_1", "generation_kwargs": {"max_gen_toks": 9}}, ruler_metadata(tokenizer_dir, [1024]))
    assert cfg["generation_kwargs"] == {"do_sample": False, "temperature": 0.0, "max_gen_toks": 9, "until": []}


def test_sample_columns_only_for_ruler_and_depth_only_for_needles(built):
    doc = next(iter(built["niah_single_1"].eval_docs))
    cols = ruler.sample_columns("niah_single_1", doc)
    assert cols == {"target_length": LENGTH, "depth": ruler.item_fields(doc)["depth"]}
    vt_doc = next(iter(built["ruler_vt"].eval_docs))
    assert ruler.sample_columns("ruler_vt", vt_doc) == {"target_length": LENGTH}
    assert ruler.item_fields(vt_doc, "ruler_vt")["depth"] is None
    assert ruler.sample_columns("gsm8k", doc) == {} and ruler.sample_columns("niah_single_1", None) == {}
