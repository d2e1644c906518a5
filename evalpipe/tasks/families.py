"""Which long-context lm-eval task is which: generated offline from the model's tokenizer
(six RULER tasks), or hub-only (LongBench, LongBench v2, InfiniteBench, babilong, SCROLLS,
RULER's essay-haystack and QA variants), and what each needs. Pure data: importable
without lm-eval (the run plan reads it before any worker starts).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Any

from evalpipe.errors import UserError


class DataUnavailable(UserError):
    """A task's data is neither in the local caches nor given as local files."""

# RULER tasks built from lm-eval's templates without any download, with the
# generator parameters of lm_eval/tasks/ruler/niah_utils.py (0.4.13).
NIAH_PARAMS: dict[str, dict[str, Any]] = {
    "niah_single_1": {"type_haystack": "repeat", "type_needle_k": "words", "type_needle_v": "numbers"},
    "niah_multikey_2": {"type_haystack": "needle", "type_needle_k": "words", "type_needle_v": "numbers"},
    "niah_multikey_3": {"type_haystack": "needle", "type_needle_k": "uuids", "type_needle_v": "uuids"},
    # essay haystack: the Paul Graham essays (hub dataset) and nltk's punkt_tab
    "niah_single_2": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers"},
    "niah_single_3": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "uuids"},
    "niah_multikey_1": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_k": 4},
    "niah_multivalue": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_v": 4},
    "niah_multiquery": {"type_haystack": "essay", "type_needle_k": "words", "type_needle_v": "numbers", "num_needle_q": 4},
}
OFFLINE_RULER: tuple[str, ...] = ("niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_cwe", "ruler_fwe")
RULER_ESSAY: tuple[str, ...] = ("niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multivalue", "niah_multiquery")
RULER_QA: dict[str, str] = {
    "ruler_qa_squad": "https://rajpurkar.github.io/SQuAD-explorer/dataset/dev-v2.0.json",
    "ruler_qa_hotpot": "https://huggingface.co/datasets/namlh2004/hotpotqa (hotpot_dev_distractor_v1.json)",
}
ESSAY_DATASET = ("baber/paul_graham_essays", None, "train")


@dataclass(frozen=True)
class Family:
    """A set of lm-eval tasks, by group name or name prefix, and where its data comes from."""

    name: str
    groups: tuple[str, ...]  # lm-eval group / tag names that stand for the whole family
    prefixes: tuple[str, ...]  # task-name prefixes (or exact names) of its leaf tasks
    kind: str  # "generated" | "hub" | "hub+nltk" | "url" | "hub-python"
    local_files: bool  # whether evalpipe's `data_files:` override can replace the hub data


FAMILIES: tuple[Family, ...] = (
    Family("RULER (generated)", (), OFFLINE_RULER, "generated", False),
    Family("RULER essay haystack", (), RULER_ESSAY, "hub+nltk", False),
    Family("RULER QA", (), tuple(RULER_QA), "url", False),
    Family("LongBench v2", ("longbench2",), ("longbench2_",), "hub", True),
    Family("LongBench", ("longbench", "longbench_e"), ("longbench_",), "hub", True),
    Family("InfiniteBench", ("infinitebench",), ("infinitebench_",), "hub", True),
    Family("babilong", ("babilong", "babilong_longctx"), ("babilong_",), "hub", False),
    Family("SCROLLS", ("scrolls",), ("scrolls_",), "hub-python", False),
)
RULER_GROUPS = ("ruler",)


def family_of(task_name: str) -> Family | None:
    """The family a task or group name belongs to, or None for tasks this module leaves alone."""
    for fam in FAMILIES:
        if task_name in fam.groups or task_name in fam.prefixes:
            return fam
    for fam in FAMILIES:  # prefixes after exact names: "longbench2_x" is not LongBench
        if any(task_name.startswith(p) for p in fam.prefixes if p.endswith("_")):
            return fam
    return None


def is_offline_ruler(task_name: str) -> bool:
    return task_name in OFFLINE_RULER


def is_generated_ruler(task_name: str) -> bool:
    """A RULER task :func:`ruler_task_config` builds (offline, or from a pre-filled essay cache)."""
    return task_name in OFFLINE_RULER or task_name in RULER_ESSAY


# generation_kwargs.max_gen_toks of lm-eval 0.4.13's RULER YAMLs (tests check them against
# the YAMLs): what a prompt needs on top of its length in the model's context window,
# known without importing lm-eval (the run plan checks it before any worker starts).
RULER_MAX_GEN_TOKS: dict[str, int] = {
    **{n: 128 for n in NIAH_PARAMS},
    "ruler_vt": 30,
    "ruler_cwe": 120,
    "ruler_fwe": 50,
}


def require_ruler_packages() -> None:
    missing = [m for m in ("wonderwords", "nltk") if importlib.util.find_spec(m) is None]
    if missing:
        raise DataUnavailable(
            f"RULER tasks need the Python package(s) {', '.join(missing)}, which are not installed in "
            f"this environment; install them with `pip install wonderwords nltk` (or `pip install -e .` of evalpipe)."
        )
