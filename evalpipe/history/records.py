"""What a run directory contributes to the history: every variant's per-item scores, token
figures, gates, what ran and the components CI named, read through the run's documents
and verified against the manifests (read_run -> RunRecord), and a night's judgement."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from evalpipe.compare.code_paths import short
from evalpipe.documents.comparison import Comparison, PathStatus, TokenSummary, read_comparison
from evalpipe.documents.history_rows import (
    TOKEN_MEASURES,
    RecordedGate,
    RecordedRun,
    RecordedTaskVerdict,
    RecordedTokens,
    RecordedVariant,
    Role,
    TokenSource,
)
from evalpipe.documents.manifest import CollectiveCounts, ProbeSummary, VariantManifest, read_manifest
from evalpipe.documents.nightly_doc import NIGHTLY_JSON, NightlyDocument, read_nightly_document
from evalpipe.documents.run_doc import RunDocument, read_run_document
from evalpipe.errors import UserError
from evalpipe.history import HistoryError
from evalpipe.redact import redact
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import SCORE_PREFIX, RunDir, VariantDir
from evalpipe.rundir.integrity import ArtifactMismatch, verify_variant

# ---------------------------------------------------------------------------
# reading a run directory
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ItemScores:
    """One variant's per-item values of one task x metric, in the item set's order."""

    task: str
    metric: str
    keys: tuple[tuple[int, int, str], ...]  # (doc_id, repeat, prompt_hash), sorted
    values: np.ndarray  # float64, NaN where missing

    @property
    def digest(self) -> str:
        text = "\n".join(f"{d}|{r}|{h}" for d, r, h in self.keys)
        return hashlib.sha256(f"{self.task}\n{text}".encode()).hexdigest()

    @property
    def mean(self) -> float | None:
        finite = self.values[~np.isnan(self.values)]
        return float(finite.mean()) if finite.size else None

    @property
    def se(self) -> float | None:
        finite = self.values[~np.isnan(self.values)]
        return float(finite.std(ddof=1) / np.sqrt(finite.size)) if finite.size > 1 else None


def encode_items(values: np.ndarray) -> tuple[str, bytes]:
    """0/1 values as a bit string (1 319 GSM8K items: 165 bytes), anything else as float32."""
    if values.size and np.all(np.isin(values, (0.0, 1.0))):
        return "bits", np.packbits(values.astype(np.uint8)).tobytes()
    return "f32", zlib.compress(values.astype("<f4").tobytes())


def decode_items(encoding: str, data: bytes, n: int) -> np.ndarray:
    if encoding == "bits":
        return np.unpackbits(np.frombuffer(data, dtype=np.uint8), count=n).astype(np.float64)
    return np.frombuffer(zlib.decompress(data), dtype="<f4").astype(np.float64)


def item_scores_of(vdir: VariantDir) -> list[ItemScores]:
    """Every task x metric of a variant's samples.parquet, items sorted by (doc_id, repeat)."""
    if not vdir.samples.is_file():
        return []
    table = artifacts.read_table(vdir.samples)
    cols = table.to_pydict()
    metrics = [c for c in table.column_names if c.startswith(SCORE_PREFIX)]
    out = []
    for task in sorted(set(cols["task"])):
        rows = sorted(
            (int(d), int(r), str(h), i)
            for i, (t, d, r, h) in enumerate(zip(cols["task"], cols["doc_id"], cols["repeat"], cols["prompt_hash"]))
            if t == task
        )
        keys = tuple((d, r, h) for d, r, h, _ in rows)
        for col in metrics:
            raw = [cols[col][i] for *_, i in rows]
            if all(v is None for v in raw):
                continue
            values = np.array([np.nan if v is None else float(v) for v in raw], dtype=np.float64)
            out.append(ItemScores(task, col[len(SCORE_PREFIX):], keys, values))
    return out


def _commit_of(version: str | None) -> str | None:
    """The git commit in a PEP 440 local version (0.7.3.dev12+g1a2b3c4), if any."""
    if not version or "+g" not in version:
        return None
    return version.split("+g", 1)[1].split(".", 1)[0] or None


def components_of(manifest: VariantManifest, run_info: RunDocument, labels: dict[str, str]) -> dict[str, str]:
    """What a variant ran on: measured versions (and the commits their versions carry),
    evalpipe's code version, and the labels CI passes (``--component vllm_ascend=<sha>``),
    which win over measured values of the same name."""
    out: dict[str, str] = {}
    for name, version in manifest.versions.items():
        if version is None:
            continue
        out[name] = str(version)
        commit = _commit_of(str(version))
        if commit:
            out[f"{name}_commit"] = commit
    code = run_info.fingerprints.code
    if code:
        out["evalpipe"] = str(code)
    out.update({str(k): str(v) for k, v in labels.items()})
    return out


def _token_rows(comparison: Comparison | None) -> list[RecordedTokens]:
    if comparison is None:
        return []
    sources: tuple[tuple[TokenSource, list[TokenSummary]], ...] = (("free", comparison.tokens), ("teacher", comparison.teacher or []))
    return [RecordedTokens(task=t.task, source=source, n_samples=t.n_samples,
                           **{m: (None if getattr(t, m) is None else float(getattr(t, m))) for m in TOKEN_MEASURES})
            for source, summaries in sources for t in summaries]


def _gate_rows(comparison: Comparison | None) -> list[RecordedGate]:
    def num(x: float | None) -> float | None:
        return float(x) if x is not None and np.isfinite(x) else None

    return [RecordedGate(gate=g.gate, task=g.task, metric=g.metric, status=g.status, measured=num(g.measured),
                         threshold=num(g.threshold)) for g in (comparison.gates if comparison else [])]


def _task_verdict_rows(comparison: Comparison | None) -> list[RecordedTaskVerdict]:
    """Each task's own verdict (none for a compare.json from before task verdicts)."""
    return [RecordedTaskVerdict(task=t.task, status=t.status, outputs_status=t.outputs_status)
            for t in (comparison.tasks or [] if comparison is not None else [])]


def _probes_summary(manifest: VariantManifest) -> ProbeSummary | None:
    """What the variant ran (the manifest's "probes" summary), None for a run from before
    the probes; redacted like everything the history keeps (switch values come from the
    engine's configuration)."""
    if manifest.probes is None:
        return None
    return ProbeSummary.model_validate(redact(manifest.probes.model_dump(mode="json")))


def _path_status(comparison: Comparison | None) -> PathStatus | None:
    """The path status of a comparison in compare.json, None for one without path probes."""
    return comparison.paths.status if comparison is not None and comparison.paths is not None else None


def describe_what_ran(probes: ProbeSummary | None) -> str:
    """One line for people: model class, decoder layers and collectives per forward pass
    (the most frequent count of each kind, with how often when it varies)."""
    if probes is None:
        return "not recorded (the run predates path probes)"
    if not probes.verifiable:
        return f"not verifiable ({probes.mode} mode: the server runs outside evalpipe)"
    models = ", ".join(short(str(m)) for m in probes.models) or "no model seen"
    layers = ", ".join(f"{n} {short(str(c))}" for c, n in sorted(probes.layers.items())) or "no decoder layers"
    per_forward = "; ".join(_collective_text(kind, entry) for kind, entry in sorted(probes.collectives_per_forward.items()))
    return f"{models}; layers {layers}; per forward: {per_forward or 'no collectives'}"


def _collective_text(kind: str, entry: CollectiveCounts) -> str:
    counts = sorted(entry.counts.items(), key=lambda kv: -kv[1])
    if len(counts) == 1:
        return f"{kind} {counts[0][0]}"
    return f"{kind} " + ", ".join(f"{value} in {n} of {entry.forwards}" for value, n in counts[:3]) + (", …" if len(counts) > 3 else "")


@dataclass(frozen=True)
class VariantRecord:
    """One variant of a run directory, as it goes into the database: its row and its
    scores (with per-item values), token summaries and gate results."""

    row: RecordedVariant
    scores: list[ItemScores]
    tokens: list[RecordedTokens]
    gates: list[RecordedGate]
    task_verdicts: list[RecordedTaskVerdict] = field(default_factory=list)


@dataclass(frozen=True)
class RunRecord:
    """Everything of one run directory that goes into the database; its run row carries the
    night's judgement when its directory keeps one (nightly.json), read with the rest so a
    broken one is refused before anything is written."""

    run: RecordedRun
    variants: list[VariantRecord]


def read_run(run_dir: Path, *, kind: str | None = None, labels: dict[str, str] | None = None) -> RunRecord:
    rd = RunDir(Path(run_dir))
    if not rd.run_json.is_file():
        raise HistoryError(f"{rd.root} is not a run directory (it has no run.json); pass the directory `evalpipe run` wrote.")
    try:
        info = read_run_document(rd.root) or RunDocument()
    except UserError as err:
        raise HistoryError(str(err)) from None
    try:
        compare = read_comparison(rd.compare_json) if rd.compare_json.is_file() else None
    except UserError as err:  # one of another schema: a history error, so recording a run only warns
        raise HistoryError(str(err)) from None
    labels = {**info.components, **(labels or {})}
    kind = kind or info.kind or "run"
    names = info.variants or rd.variant_names()
    reference = info.reference or (names[0] if names else "")
    aa = info.aa_variant
    by_variant = {c.variant: c for c in compare.comparisons} if compare else {}
    out_variants = []
    for name in names:
        vdir = rd.variant(name)
        if not vdir.manifest.is_file() and not vdir.samples.is_file():
            continue  # a variant that never got going: nothing of it to record
        try:
            # a run whose files changed after it finished, or lost a manifest, is not recorded as if it had produced them
            verify_variant(vdir)
        except ArtifactMismatch as err:
            raise HistoryError(str(err)) from None
        manifest = read_manifest(vdir.manifest)
        role: Role = "reference" if name == reference else "aa" if name == aa else "variant"
        comparison = (compare.noise_floor if compare else None) if role == "aa" else by_variant.get(name)
        # run.json is redacted when written; a run directory from before that is not
        entry = info.variant_settings.get(name)
        # a path, differs between machines without meaning anything; the versions are components
        setting = redact(entry.model_dump(mode="json", exclude_unset=True, exclude={"versions", "python"}) if entry else {})
        row = RecordedVariant(
            name=name, role=role,
            status=None if role == "reference" or comparison is None else comparison.status,
            exit_code=info.variant_status[name].exit_code if name in info.variant_status else None,
            components=redact(components_of(manifest, info, labels)),
            settings=setting,
            probes=_probes_summary(manifest),
            path_status=None if role == "reference" else _path_status(comparison),
        )
        out_variants.append(VariantRecord(row, item_scores_of(vdir), _token_rows(comparison),
                                          _gate_rows(comparison) if role == "variant" else [],
                                          _task_verdict_rows(comparison)))
    night = judgement_of(rd.root)
    run = RecordedRun(
        run_id=info.run_id or rd.root.name,
        kind=kind,
        started_at=float(info.started_at or rd.run_json.stat().st_mtime),
        config_path=info.config_path,
        config_hash=info.fingerprints.config_sha256,
        code_version=info.fingerprints.code,
        model=info.model.name or info.model.path,
        model_fingerprint=info.model.fingerprint,
        task_selector=info.task_selector,
        status=info.status,
        verdict=info.verdict,
        reference=reference,
        aa_variant=aa,
        hardware=info.hardware,
        run_dir=str(rd.root.resolve()),
        nightly_status=None if night is None else night.status,
        baseline_run_id=None if night is None else night.baseline,
        judgement=night,
    )
    return RunRecord(run, out_variants)


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------


def judgement_of(run_dir: Path) -> NightlyDocument | None:
    """A night's judgement as its run directory keeps it (nightly.json), so an import
    rebuilds the night's status too."""
    try:
        return read_nightly_document(run_dir / NIGHTLY_JSON)
    except UserError as err:
        raise HistoryError(str(err)) from None
