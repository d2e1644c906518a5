"""Hand-built variant directories for the compare/report unit tests.

A :class:`FakeSample` is one (task, doc_id, repeat) with its generated token ids,
logprobs and scores; :func:`write_variant` turns a list of them into samples.parquet
and tokens.parquet through the real artifact writers (and teacher.parquet, in the same
token layout, from a second list), :func:`write_run` adds run.json.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

from evalpipe.documents.manifest import VariantManifest, read_manifest, write_manifest
from evalpipe.documents.run_doc import RunDocument
from evalpipe.rundir import artifacts, integrity
from evalpipe.rundir.artifacts import RunDir, VariantDir

TASK = "gsm8k_synth_4shot"
METRIC = "exact_match,strict-match"
SCORE_COL = artifacts.SCORE_PREFIX + METRIC
TOPK = 3


@dataclass
class FakeSample:
    task: str
    doc_id: int
    token_ids: list[int]
    logprobs: list[float]
    scores: dict[str, float] = field(default_factory=dict)
    response: str = ""
    repeat: int = 0
    target: str = "42"
    topk_ids: list[list[int]] | None = None
    topk_logprobs: list[list[float]] | None = None

    def copy(self, **changes: Any) -> "FakeSample":
        new = dataclasses.replace(self, **changes)
        new.token_ids = list(new.token_ids)
        new.logprobs = list(new.logprobs)
        new.scores = dict(new.scores)
        return new

    def topk(self) -> tuple[list[list[int]], list[list[float]]]:
        """Top-k lists: the chosen token first, then two runners-up (unless given explicitly)."""
        ids = self.topk_ids or [[t, t + 1, t + 2] for t in self.token_ids]
        lps = self.topk_logprobs or [[lp, lp - 1.0, lp - 2.0] for lp in self.logprobs]
        return ids, lps


def make_samples(
    n: int = 10,
    task: str = TASK,
    length: int = 8,
    seed: int = 0,
    scores: Iterable[float] | None = None,
) -> list[FakeSample]:
    """``n`` deterministic samples of ``length`` tokens; scores default to doc_id % 2."""
    rng = np.random.default_rng(seed)
    score_list = list(scores) if scores is not None else [float(i % 2) for i in range(n)]
    out = []
    for i in range(n):
        ids = rng.integers(100, 30000, size=length).tolist()
        lps = (-rng.random(length) * 3).astype(np.float32).tolist()
        out.append(
            FakeSample(
                task=task,
                doc_id=i,
                token_ids=ids,
                logprobs=lps,
                scores={METRIC: score_list[i]},
                response=f"The answer is {i}.",
            )
        )
    return out


def _sample_row(s: FakeSample) -> dict[str, Any]:
    row: dict[str, Any] = {
        "task": s.task,
        "doc_id": s.doc_id,
        "repeat": s.repeat,
        "prompt_hash": f"h{s.task}{s.doc_id}",
        "prompt": f"Question {s.doc_id}?",
        "target": s.target,
        "response": s.response,
        "n_tokens": len(s.token_ids),
        "finish_reason": "stop",
        "answer:strict-match": s.response.split()[-1] if s.response else "",
    }
    for metric, value in s.scores.items():
        row[artifacts.SCORE_PREFIX + metric] = value
    return row


def tables(samples: list[FakeSample]):
    """(samples table, tokens table) built with the artifact helpers."""
    return artifacts.samples_table(_sample_row(s) for s in samples), token_table(samples)


def token_table(samples: list[FakeSample]):
    """The tokens.parquet / teacher.parquet layout of ``samples``, one row per position."""
    cols: dict[str, list] = {name: [] for name in artifacts.TOKENS_REQUIRED}
    for s in samples:
        ids, lps = s.topk()
        for pos, (tok, lp) in enumerate(zip(s.token_ids, s.logprobs)):
            cols["task"].append(s.task)
            cols["doc_id"].append(s.doc_id)
            cols["repeat"].append(s.repeat)
            cols["pos"].append(pos)
            cols["token_id"].append(tok)
            cols["logprob"].append(lp)
            cols["topk_ids"].append(ids[pos])
            cols["topk_logprobs"].append(lps[pos])
    return artifacts.tokens_table(cols)


def write_variant(
    run_root: Path,
    name: str,
    samples: list[FakeSample],
    *,
    shuffle_seed: int | None = None,
    teacher: list[FakeSample] | None = None,
) -> VariantDir:
    """Write <run_root>/<name>/{manifest.json, samples.parquet, tokens.parquet[, teacher.parquet]}.

    ``teacher``: the reference's continuations as this variant scored them (token ids
    of the reference, this variant's logprobs and top-k lists). ``shuffle_seed``
    permutes the rows of every table (the comparison must not care).
    """
    vdir = RunDir(run_root).variant(name)
    samples_t, tokens_t = tables(samples)
    teacher_t = None if teacher is None else token_table(teacher)
    if shuffle_seed is not None:
        rng = np.random.default_rng(shuffle_seed)
        samples_t, tokens_t, teacher_t = (
            None if t is None else t.take(rng.permutation(t.num_rows)) for t in (samples_t, tokens_t, teacher_t)
        )
    write_manifest(vdir.manifest, VariantManifest(variant=name, status="ok"))
    artifacts.write_table(vdir.samples, samples_t)
    artifacts.write_table(vdir.tokens, tokens_t)
    if teacher_t is not None:
        artifacts.write_table(vdir.teacher, teacher_t)
    return vdir


def write_run(
    run_root: Path,
    variants: dict[str, list[FakeSample]],
    reference: str | None = None,
    run_info: dict[str, Any] | RunDocument | None = None,
    *,
    teachers: dict[str, list[FakeSample]] | None = None,
    noise_floor: str | None = None,
) -> Path:
    """A whole run directory: run.json plus one variant directory per entry.

    ``teachers`` gives teacher.parquet contents per variant name; ``noise_floor`` names
    the A/A variant (one of ``variants``) in run.json, as a run with a noise floor does.
    """
    run_root = Path(run_root)
    teachers = teachers or {}
    for name, samples in variants.items():
        write_variant(run_root, name, samples, teacher=teachers.get(name))
    ref = reference or next(iter(variants))
    info: dict[str, Any] = {"run_id": run_root.name, "reference": ref, "variants": list(variants)}
    if noise_floor is not None:
        info["noise_floor"] = {"variant": noise_floor, "of": ref, "reverse_order": True}
    info.update(run_info.as_mapping() if isinstance(run_info, RunDocument) else run_info or {})
    artifacts.write_json(RunDir(run_root).run_json, info)
    return run_root


def mutate(samples: list[FakeSample], doc_id: int, fn: Callable[[FakeSample], FakeSample], task: str = TASK) -> list[FakeSample]:
    """Copy of ``samples`` with the sample (task, doc_id) replaced by ``fn(copy)``."""
    return [fn(s.copy()) if (s.task, s.doc_id) == (task, doc_id) else s.copy() for s in samples]


def set_token(pos: int, new_id: int) -> Callable[[FakeSample], FakeSample]:
    """A mutation for `mutate`: the sample generates `new_id` at `pos` instead."""

    def fn(s: FakeSample) -> FakeSample:
        ids = list(s.token_ids)
        ids[pos] = new_id
        return s.copy(token_ids=ids)

    return fn


def set_column(table: Any, name: str, values: list) -> Any:
    """Copy of a samples table with column ``name`` replaced or appended (e.g. "cluster", "prompt")."""
    import pyarrow as pa

    arr = pa.array(values)
    if name in table.column_names:
        return table.set_column(table.column_names.index(name), name, arr)
    return table.append_column(name, arr)


def set_step(pos: int, token_id: int, logprob: float, topk_ids: list[int], topk_logprobs: list[float]) -> Callable[[FakeSample], FakeSample]:
    """A mutation for `mutate`: at `pos` the sample generates `token_id` with this logprob and top-k lists.

    The other positions keep their top-k lists (the default ones unless set explicitly).
    """

    def fn(s: FakeSample) -> FakeSample:
        ids, lps = s.topk()
        ids, lps = [list(x) for x in ids], [list(x) for x in lps]
        ids[pos], lps[pos] = list(topk_ids), list(topk_logprobs)
        tok, lp = list(s.token_ids), list(s.logprobs)
        tok[pos], lp[pos] = token_id, logprob
        return s.copy(token_ids=tok, logprobs=lp, topk_ids=ids, topk_logprobs=lps)

    return fn


def perturb_topk(eps: float, positions: Iterable[int] | None = None) -> Callable[[FakeSample], FakeSample]:
    """A mutation for `mutate`: the runner-up's top-k logprob moves by ``eps`` at ``positions`` (default all).

    Shifting every top-k logprob by the same amount leaves the renormalised top-k
    distribution unchanged; moving one entry changes it, so the top-k KL grows with |eps|.
    """

    def fn(s: FakeSample) -> FakeSample:
        ids, lps = s.topk()
        ids, lps = [list(x) for x in ids], [list(x) for x in lps]
        for pos in range(len(lps)) if positions is None else positions:
            lps[pos][1] = float(np.float32(lps[pos][1] + eps))
        return s.copy(topk_ids=ids, topk_logprobs=lps)

    return fn


def swap_top1(positions: Iterable[int]) -> Callable[[FakeSample], FakeSample]:
    """A mutation for `mutate` on teacher-forced data: at ``positions`` the first two top-k ids swap.

    The forced token and the logprobs stay; the top-1 token becomes the runner-up, with
    the default top-k a gap of 1 nat on both sides (a hard flip, whichever side is the reference).
    """

    def fn(s: FakeSample) -> FakeSample:
        ids, lps = s.topk()
        ids, lps = [list(x) for x in ids], [list(x) for x in lps]
        for pos in positions:
            ids[pos][0], ids[pos][1] = ids[pos][1], ids[pos][0]
        return s.copy(topk_ids=ids, topk_logprobs=lps)

    return fn


def update_manifest(vdir: VariantDir, **update: Any) -> None:
    """The variant's manifest with ``update`` (fields as the worker writes them, checked)."""
    manifest = read_manifest(vdir.manifest)
    write_manifest(vdir.manifest, VariantManifest.model_validate({**manifest.model_dump(), **update}))


def record_artifacts(vdir: VariantDir, **update: Any) -> None:
    """The artifacts record the worker's finish step writes into the manifest (and ``update``)."""
    update_manifest(vdir, **update, artifacts=integrity.describe_artifacts(vdir))
