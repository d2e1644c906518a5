"""Which long-context task is which (evalpipe/tasks/families.py): a task or group name maps
to its family (exact names before prefixes), the generated RULER tasks are told apart from
the downloading ones, RULER's max_gen_toks table matches lm-eval's YAMLs, and missing RULER
packages are one sentence."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpipe.tasks import families as task_families
from evalpipe.tasks import ruler
from evalpipe.tasks.families import OFFLINE_RULER


def test_family_table():
    assert task_families.family_of("longbench2_detective").name == "LongBench v2"
    assert task_families.family_of("longbench_hotpotqa").name == "LongBench"
    assert task_families.family_of("niah_single_1").kind == "generated"
    assert task_families.family_of("niah_single_2").kind == "hub+nltk"
    assert task_families.family_of("gsm8k") is None


def test_max_gen_toks_table_matches_lm_evals_yamls():
    from lm_eval.tasks._yaml_loader import load_yaml

    root = Path(ruler.importlib.util.find_spec("lm_eval.tasks.ruler").submodule_search_locations[0])
    for name, yaml_name in ruler._RULER_YAML.items():
        cfg = load_yaml(root / yaml_name, resolve_func=False)
        assert cfg["generation_kwargs"]["max_gen_toks"] == task_families.RULER_MAX_GEN_TOKS[name], name
    assert set(task_families.RULER_MAX_GEN_TOKS) == set(OFFLINE_RULER) | set(task_families.RULER_ESSAY)


def test_group_names_and_exact_names_come_before_prefixes():
    assert task_families.family_of("longbench_e").name == "LongBench", "a group name"
    assert task_families.family_of("babilong_longctx").name == "babilong"
    assert task_families.family_of("ruler_qa_squad").kind == "url"
    assert task_families.family_of("ruler_vt").name == "RULER (generated)"
    assert task_families.family_of("ruler") is None, "RULER's own group is not one family: its tasks are of three"


def test_generated_ruler_tasks_are_told_apart_from_the_downloading_ones():
    assert all(task_families.is_offline_ruler(n) and task_families.is_generated_ruler(n) for n in OFFLINE_RULER)
    essay = task_families.RULER_ESSAY
    assert all(task_families.is_generated_ruler(n) and not task_families.is_offline_ruler(n) for n in essay)
    assert not any(task_families.is_generated_ruler(n) for n in (*task_families.RULER_QA, "longbench_hotpotqa", "gsm8k"))


def test_missing_ruler_packages_are_one_sentence(monkeypatch):
    task_families.require_ruler_packages()  # installed here
    real = task_families.importlib.util.find_spec
    monkeypatch.setattr(task_families.importlib.util, "find_spec", lambda name: None if name == "nltk" else real(name))
    with pytest.raises(task_families.DataUnavailable) as err:
        task_families.require_ruler_packages()
    assert str(err.value).startswith("RULER tasks need the Python package(s) nltk, which are not installed")
    assert str(err.value).count(". ") == 0 and str(err.value).endswith(").")
