"""Is a hub-only long-context task's data already on this machine?

LongBench, LongBench v2, InfiniteBench, babilong, SCROLLS and the RULER variants that
need an essay corpus or QA data read hub data sets. :func:`check_available` tells,
offline and in milliseconds, whether their data is already in the Hugging Face datasets
cache (or given as local files) and otherwise raises :class:`DataUnavailable` with one
sentence saying what is missing, where it looked and how to fix it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evalpipe.paths import file_problem
from evalpipe.tasks.families import (
    ESSAY_DATASET,
    OFFLINE_RULER,
    RULER_ESSAY,
    RULER_GROUPS,
    RULER_QA,
    DataUnavailable,
    family_of,
    require_ruler_packages,
)
from evalpipe.tasks.index import task_manager


def check_available(
    task_name: str,
    data_files: Any = None,
    *,
    metadata: dict[str, Any] | None = None,
    allow_download: bool = False,
) -> None:
    """Raise :class:`DataUnavailable` (one sentence) when a hub-only long-context task,
    or any task of such a group, has no data on this machine; return None when it has,
    when ``allow_download`` is set (the machine may reach the hub), and for every task
    this module does not know (gsm8k, evalpipe's own tasks...). Never touches the network.

    ``data_files``: evalpipe's `data_files:` override of the task (passes if the files
    exist and the task reads them). ``metadata``: the task metadata babilong takes its
    config from (``max_seq_lengths``: "0k", "1k", ... "128k"; default "0k").
    """
    if task_name in RULER_GROUPS:
        missing: list[tuple[str, DataUnavailable]] = []
        for leaf in (*OFFLINE_RULER, *RULER_ESSAY, *RULER_QA):
            try:
                check_available(leaf, metadata=metadata, allow_download=allow_download)
            except DataUnavailable as err:
                missing.append((leaf, err))
        if missing:
            raise DataUnavailable(
                f"{len(missing)} of the 13 tasks of group `ruler` cannot run here ({', '.join(m for m, _ in missing)}), "
                f"so run only the generated ones ({', '.join(OFFLINE_RULER)}) offline; the first: {str(missing[0][1]).rstrip('.')}."
            )
        return
    fam = family_of(task_name)
    if fam is None:
        return
    if fam.kind == "generated":
        require_ruler_packages()
        return
    if data_files:
        if not fam.local_files:
            raise DataUnavailable(
                f"task `{task_name}` ({fam.name}) does not read `data_files:` (lm-eval builds it in Python), so local files "
                "cannot stand in for its hub data; pre-fill the Hugging Face datasets cache instead."
            )
        unreadable = [(p, problem) for p in _flatten(data_files) if (problem := file_problem(Path(str(p)).expanduser()))]
        if unreadable:
            path, problem = unreadable[0]
            raise DataUnavailable(f"task `{task_name}`: data file {path} {problem}; point `data_files:` to a file.")
        return
    if allow_download:
        return
    if fam.kind == "url":
        raise DataUnavailable(
            f"task `{task_name}` ({fam.name}) downloads {RULER_QA[task_name]} with `requests` while it builds its items and "
            "lm-eval keeps no cache of it, so it cannot run offline; run it on a machine that reaches that address, "
            f"or use the generated RULER tasks ({', '.join(OFFLINE_RULER)})."
        )
    if fam.kind == "hub-python":
        _check_scrolls(task_name)
        return
    if fam.kind == "hub+nltk":
        _check_dataset(task_name, *ESSAY_DATASET, kwargs={})
        _check_punkt(task_name)
        return
    leaves = _leaf_tasks(task_name)
    if not leaves:
        return  # unknown to this lm-eval: evalpipe's own name check reports it
    missing = []
    for leaf, (path, name, split, kwargs) in leaves.items():
        if fam.name == "babilong":
            name = str((metadata or {}).get("max_seq_lengths") or "0k")
        try:
            _check_dataset(leaf, path, name, split, kwargs=kwargs)
        except DataUnavailable as err:
            missing.append((leaf, err))
    if missing and len(leaves) == 1:
        raise missing[0][1]
    if missing:
        raise DataUnavailable(
            f"{len(missing)} of the {len(leaves)} tasks of `{task_name}` have no data here; the first: {str(missing[0][1]).rstrip('.')}."
        )


def _flatten(files: Any) -> list:
    if isinstance(files, dict):
        return [p for v in files.values() for p in _flatten(v)]
    if isinstance(files, (list, tuple)):
        return [p for v in files for p in _flatten(v)]
    return [files]


def _leaf_tasks(name: str) -> dict[str, tuple[str, str | None, str | None, dict]]:
    """{leaf task: (dataset_path, dataset_name, test split, dataset_kwargs)} from lm-eval's
    YAMLs (includes resolved, functions not imported), groups and tags expanded."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml

    index = _task_index()
    out: dict[str, tuple[str, str | None, str | None, dict]] = {}

    def visit(n: str, depth: int = 0) -> None:
        entry = index.get(n)
        if entry is None or depth > 8:
            return
        if entry.kind is Kind.TAG:
            for t in sorted(entry.tags):
                visit(t, depth + 1)
            return
        if entry.yaml_path is None:
            return
        cfg = load_yaml(entry.yaml_path, resolve_func=False)
        if entry.kind is Kind.GROUP:
            for child in cfg.get("task") or []:
                visit(child if isinstance(child, str) else (child.get("task") or child.get("group")), depth + 1)
            return
        if entry.kind is Kind.TASK and cfg.get("dataset_path"):
            kwargs = dict(cfg.get("dataset_kwargs") or {})
            # babilong's own key: its loader reads that split of the config named by metadata
            split = kwargs.pop("qa_split", None) or cfg.get("test_split") or cfg.get("validation_split")
            out[n] = (cfg["dataset_path"], cfg.get("dataset_name"), split, kwargs)

    visit(name)
    return out


def _task_index() -> dict:
    return task_manager().task_index  # cached: the index is built once per process


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Force `datasets` and `huggingface_hub` offline for one look-up, whatever the env says."""
    import datasets.config as dconfig
    import huggingface_hub.constants as hconst

    saved = (dconfig.HF_HUB_OFFLINE, hconst.HF_HUB_OFFLINE)
    dconfig.HF_HUB_OFFLINE = True
    hconst.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        dconfig.HF_HUB_OFFLINE, hconst.HF_HUB_OFFLINE = saved


def _check_dataset(task: str, path: str, name: str | None, split: str | None, *, kwargs: dict) -> None:
    """Cheap, offline: the same cache look-up `datasets.load_dataset` does offline (it only
    reads the prepared Arrow cache, never the raw hub download cache), then the split's files."""
    import datasets
    import datasets.config as dconfig

    # the task's dataset_kwargs as lm-eval passes them (InfiniteBench: `features`)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("trust_remote_code",)}
    where = os.path.expanduser(str(dconfig.HF_DATASETS_CACHE))
    what = f"`{path}`" + (f" (config `{name}`)" if name else "")
    fix = (
        f"pre-fill the cache on a machine with network (`python -c \"import datasets; datasets.load_dataset('{path}'"
        + (f", '{name}'" if name else "")
        + ")\"`) and copy its ~/.cache/huggingface (or $HF_HOME) here"
    )
    fam = family_of(task)
    if fam is not None and fam.local_files:
        fix += ", or point the task at local files with `data_files:` in the run config"
    try:
        with _offline(), _silence_datasets():
            builder = datasets.load_dataset_builder(path, name, **kwargs)
    except Exception as err:  # noqa: BLE001 - any failure here means "not usable offline"
        # "not cached" surfaces as ConnectionError (offline hub), FileNotFoundError or
        # ValueError("Couldn't find cache..."); anything else is worth naming
        odd = "" if isinstance(err, (ConnectionError, FileNotFoundError, ValueError)) else f" ({type(err).__name__}: {err})"
        raise DataUnavailable(
            f"task `{task}` needs the hub dataset {what}, which is not in the Hugging Face datasets cache at {where}{odd}; {fix}."
        ) from None
    splits = builder.info.splits or {}
    if split and splits and split not in splits:
        raise DataUnavailable(
            f"task `{task}` needs split `{split}` of {what}, but the cache at {builder.cache_dir} has only "
            f"{', '.join(sorted(splits))}; {fix}."
        )
    if not any(Path(builder.cache_dir).glob("*.arrow")):
        raise DataUnavailable(f"task `{task}`: the cache entry of {what} at {builder.cache_dir} has no data files; {fix}.")


@contextlib.contextmanager
def _silence_datasets() -> Iterator[None]:
    """The cache look-up logs 'Using the latest cached version...' warnings."""
    import datasets

    level = datasets.logging.get_verbosity()
    datasets.logging.set_verbosity_error()
    try:
        yield
    finally:
        datasets.logging.set_verbosity(level)


def _check_punkt(task: str) -> None:
    import nltk

    try:
        nltk.data.find("tokenizers/punkt_tab/english/")
    except LookupError:
        raise DataUnavailable(
            f"task `{task}` splits its essay haystack into sentences with nltk's `punkt_tab`, which is not in any of "
            f"nltk's data directories ({', '.join(map(str, nltk.data.path[:3]))}, ...); run "
            "`python -m nltk.downloader punkt_tab` on a machine with network and copy ~/nltk_data here (or set NLTK_DATA)."
        ) from None


def _check_scrolls(task: str) -> None:
    from huggingface_hub import constants as hconst
    from huggingface_hub import try_to_load_from_cache

    sub = {
        "scrolls_contractnli": "contract_nli",
        "scrolls_govreport": "gov_report",
        "scrolls_narrativeqa": "narrative_qa",
        "scrolls_qasper": "qasper",
        "scrolls_quality": "quality",
        "scrolls_summscreenfd": "summ_screen_fd",
        "scrolls_qmsum": "qmsum",
    }
    names = list(sub.values()) if task == "scrolls" else [sub.get(task, task.removeprefix("scrolls_"))]
    metric = try_to_load_from_cache("tau/scrolls", "metrics/scrolls.py", revision="refs/pr/5", repo_type="dataset")
    if not isinstance(metric, str):
        raise DataUnavailable(
            f"task `{task}` (SCROLLS) downloads its metric script and data zip from the hub dataset `tau/scrolls` while it is "
            f"built, and they are not in the hub cache at {hconst.HF_HUB_CACHE}; SCROLLS is a Python task that cannot read "
            "local files, so run it once on a machine with network and copy ~/.cache/huggingface (or $HF_HOME) here."
        )
    for n in names:
        if not isinstance(try_to_load_from_cache("tau/scrolls", f"{n}.zip", repo_type="dataset"), str):
            raise DataUnavailable(
                f"task `{task}` (SCROLLS) needs `{n}.zip` of the hub dataset `tau/scrolls`, which is not in the hub cache at "
                f"{hconst.HF_HUB_CACHE}; run it once on a machine with network and copy ~/.cache/huggingface (or $HF_HOME) here."
            )

