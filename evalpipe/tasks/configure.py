"""Apply the run config's per-task settings to an lm-eval task before lm-eval builds it.

Relative `data_files` paths resolve against evalpipe's data directory, where the
synthetic sets are generated on first use; this is what lets one task YAML serve a
laptop, CI and an air-gapped cluster without edits.

Long-context tasks of lm-eval (evalpipe.tasks.ruler, evalpipe.tasks.hub_data): RULER's generated tasks get
their items made here with the model's tokenizer at the run config's `longctx.lengths`
(`longctx.ruler_items_per_length` per length), and hub-only ones (LongBench,
InfiniteBench, babilong, ...) are checked for local data, so either fails with one
sentence before any engine starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from evalpipe.config.run_config import TaskSpec
from evalpipe.data import longctx, scenarios
from evalpipe.data.check import check_data_files
from evalpipe.data.registry import ensure_dataset_file
from evalpipe.errors import UserError
from evalpipe.paths import file_problem
from evalpipe.tasks import families, hub_data, ruler
from evalpipe.tasks.index import check_task_names, task_manager

_BUILDER_BY_SUFFIX = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}


# A relative data file a generator may own: returns the generated file, or None when the
# path is not one of its placeholders (see LongCtxData).
GeneratedData = Callable[[Path, Path], "Path | None"]


class LongCtxData:
    """Resolves tasks/longctx's `longctx/<probe>-{fingerprint}/test.jsonl` placeholders (and
    tasks/scenarios' `scenarios/<name>-{fingerprint}/test.jsonl`, from ``scenario_spec``):
    the probe's items are generated with the model's own tokenizer (exact lengths) and
    cached under the data directory by fingerprint. The tokenizer loads on first use.

    Also builds lm-eval's RULER tasks (:meth:`ruler_config`) from the same spec's
    lengths with the same tokenizer; ``seed`` is the run's seed."""

    def __init__(self, tokenizer_path: str, spec: dict[str, Any] | None, seed: int | None = None,
                 scenario_spec: scenarios.ScenarioSpec | None = None):
        self.tokenizer_path = tokenizer_path
        self.spec = spec
        self.seed = seed
        self.scenario_spec = scenario_spec or scenarios.ScenarioSpec()
        self._tokenizer: Any = None  # a transformers tokenizer, loaded on first use

    def __call__(self, relative: Path, data_dir: Path) -> Path | None:
        if scenarios.is_placeholder(relative):
            return scenarios.resolve_data_file(relative, self.tokenizer(), self.scenario_spec, data_dir)
        if not longctx.is_placeholder(relative):
            return None
        spec = longctx.LongCtxSpec(**(self.spec or {}))
        return longctx.resolve_data_file(relative, self.tokenizer(), spec, data_dir)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return self._tokenizer

    def local_tokenizer_dir(self) -> str:
        """The tokenizer as a local directory (RULER never loads one from the hub): the
        path itself, or the snapshot of a hub id that is already in the local hub cache."""
        path = Path(self.tokenizer_path).expanduser()
        if path.is_dir():
            return str(path)
        try:
            from huggingface_hub import snapshot_download

            return snapshot_download(self.tokenizer_path, local_files_only=True)
        except Exception:  # noqa: BLE001 - not a cached hub id: ruler_metadata says what is wrong
            return str(path)

    def ruler_config(self, spec: TaskSpec) -> dict[str, Any]:
        """lm-eval config of one RULER task with its items already generated: the run
        config's longctx.lengths, ruler_items_per_length items per length, the run's seed.
        Raises RulerTooShort (a ValueError) when a length cannot hold an item."""
        name = spec.task
        if spec.data_files:
            raise UserError(f"task `{name}` generates its items from the model's tokenizer; remove `data_files` from its entry.")
        lc = longctx.LongCtxSpec(**(self.spec or {}))
        seed = ruler.DEFAULT_SEED if self.seed is None else int(self.seed)
        meta = ruler.ruler_metadata(self.local_tokenizer_dir(), list(lc.lengths), lc.ruler_items_per_length, seed)
        overrides: dict[str, Any] = {"task": name}
        if spec.num_fewshot is not None:
            overrides["num_fewshot"] = spec.num_fewshot
        if spec.max_gen_toks is not None:
            overrides["generation_kwargs"] = {"max_gen_toks": spec.max_gen_toks}
        try:
            return with_samples(ruler.prebuild_ruler(ruler.ruler_task_config(overrides, meta)), spec)
        except ruler.RulerTooShort as err:  # say where the length comes from
            raise ruler.RulerTooShort(
                f"{str(err).rstrip('.')} (the lengths are `longctx.lengths` of the run config: {', '.join(map(str, lc.lengths))})."
            ) from None


def _hub_offline() -> bool:
    """Whether this process may not download data sets (evalpipe's workers get
    HF_HUB_OFFLINE=1 and HF_DATASETS_OFFLINE=1 unless the config turns them off)."""
    import datasets.config

    return bool(datasets.config.HF_HUB_OFFLINE)


def _resolve_data_files(data_files: Any, data_dir: Path, generated: GeneratedData | None = None) -> Any:
    if isinstance(data_files, dict):
        return {k: _resolve_data_files(v, data_dir, generated) for k, v in data_files.items()}
    if isinstance(data_files, list):
        return [_resolve_data_files(v, data_dir, generated) for v in data_files]
    path = Path(str(data_files)).expanduser()
    if not path.is_absolute():
        path = (generated(path, data_dir) if generated else None) or ensure_dataset_file(path, data_dir)
    problem = file_problem(path)
    if problem is not None:
        raise FileNotFoundError(f"data file {path} {problem}; point `data_files` to a file.")
    return str(path)


def _builder_for(data_files: Any) -> str:
    first = data_files
    while isinstance(first, (dict, list)):
        first = next(iter(first.values())) if isinstance(first, dict) else first[0]
    suffix = Path(str(first)).suffix.lower()
    if suffix not in _BUILDER_BY_SUFFIX:
        raise UserError(f"cannot tell the format of data file {first}; use .parquet, .jsonl, .json or .csv.")
    return _BUILDER_BY_SUFFIX[suffix]


def task_config(
    spec: TaskSpec, data_dir: Path, tasks_dir: str | None = None, generated: GeneratedData | None = None
) -> str | dict[str, Any]:
    """What to hand lm-eval for one TaskSpec: the task's full config dict with our
    overrides applied, or just its name when it is a group or a Python-defined task.

    RULER's generated tasks need ``generated`` to be a :class:`LongCtxData` (the model's
    tokenizer and the longctx spec) and come back with their items built; hub-only
    long-context tasks raise DataUnavailable (a ValueError) when their data is not here."""
    from lm_eval.tasks._index import Kind
    from lm_eval.tasks._yaml_loader import load_yaml


    name = spec.task
    check_task_names([name], tasks_dir)
    if families.is_generated_ruler(name):
        # not through load_yaml(resolve_func=True): that imports lm-eval's niah module
        # with its nltk download, and its builders make 500 items per length
        hub_data.check_available(name, metadata=None, allow_download=not _hub_offline())  # essay cache, packages
        if not isinstance(generated, LongCtxData):
            raise UserError(f"task `{name}` (RULER) is generated with the model's tokenizer; resolve it with a LongCtxData.")
        return generated.ruler_config(spec)
    hub_data.check_available(name, spec.data_files, allow_download=not _hub_offline())
    if name in families.RULER_QA or name == "ruler":
        raise UserError(
            f"`{name}` is not a RULER task evalpipe can hand the model's tokenizer and lengths; "
            f"run the generated ones instead ({', '.join(families.OFFLINE_RULER)})."
        )
    entry = task_manager(tasks_dir, [name]).task_index[name]
    if entry.kind is not Kind.TASK or entry.yaml_path is None:
        if spec.data_files:
            raise UserError(f"task `{name}` is a group or Python task; `data_files` only applies to single YAML tasks.")
        if spec.sampling is not None:
            raise UserError(f"task `{name}` is a group or Python task; `sampling:` applies to single YAML tasks "
                            "(list the group's tasks one by one).")
        return name
    cfg = load_yaml(entry.yaml_path, resolve_func=True)
    cfg.pop("tag", None)
    cfg.pop("group", None)
    data_files = spec.data_files or (cfg.get("dataset_kwargs") or {}).get("data_files")
    if data_files:
        resolved = _resolve_data_files(data_files, data_dir, generated)
        check_data_files(name, resolved, cfg)
        cfg["dataset_kwargs"] = {**(cfg.get("dataset_kwargs") or {}), "data_files": resolved}
        if spec.data_files:
            cfg["dataset_path"] = _builder_for(resolved)
            cfg["dataset_name"] = None
    if spec.num_fewshot is not None:
        cfg["num_fewshot"] = spec.num_fewshot
    if spec.max_gen_toks is not None:
        cfg["generation_kwargs"] = {**(cfg.get("generation_kwargs") or {}), "max_gen_toks": spec.max_gen_toks}
    return with_samples(cfg, spec)


def with_samples(cfg: dict[str, Any], spec: TaskSpec) -> dict[str, Any]:
    """A sampled task's config asks lm-eval for `samples` answers per request (its repeats,
    which the capturing LM seeds one by one); a greedy task's is left as it is."""
    if spec.sampling is None:
        return cfg
    if cfg.get("output_type", "generate_until") != "generate_until":
        raise UserError(f"task `{spec.task}` scores likelihoods, which nothing samples; remove `sampling:` from its entry.")
    return {**cfg, "repeats": spec.sampling.samples}
