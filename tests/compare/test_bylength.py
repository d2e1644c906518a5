"""Per task x prompt length / needle depth (evalpipe/compare/bylength.py), on hand-built long-context runs.

The builders here (a long-context task whose samples carry target_length, length_kind,
length_tags, depth and cluster, and teacher-forced traces with prompt positions, pos < 0)
are imported by test_report_bylength.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from fakes import (
    METRIC,
    TASK,
    make_samples,
    mutate,
    perturb_topk,
    set_column,
    set_token,
    swap_top1,
    tables,
    token_table,
)

from evalpipe.compare import stats
from evalpipe.compare.bylength import (
    breakdown_artifacts,
    depth_bin,
    has_lengths,
    length_breakdown,
)
from evalpipe.compare.run import VariantArtifacts, compare_artifacts
from evalpipe.compare.scores import compare_scores
from evalpipe.compare.tokens import compare_tokens
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.manifest import VariantManifest, write_manifest
from evalpipe.pipeline.comparing import compare_run, load_artifacts, write_outputs
from evalpipe.rundir import artifacts
from evalpipe.rundir.artifacts import RunDir

LTASK = "longctx_passkey"
LENGTHS = (1024, 2047, 2048, 2049)
KINDS = {1024: ("round", ""), 2047: ("edge", "block-1"), 2048: ("round", "tp4:0,block"), 2049: ("edge", "tp4:1,block+1")}
DEPTHS = (0.1, 0.5, 0.9)
PER_LENGTH = 4  # items per length: two haystacks (clusters: even / odd doc ids) of two questions
PROMPT = 4  # teacher-forced prompt positions per item: pos -4..-1, then the continuation 0..3
DOC_COLS = ("cluster", "target_length", "length_kind", "length_tags", "depth")


def length_of(doc: int) -> int:
    return LENGTHS[doc // PER_LENGTH]


def meta(doc: int) -> dict[str, Any]:
    n = length_of(doc)
    kind, tags = KINDS[n]
    return {
        "cluster": f"hay-{n}-{doc % 2}",
        "target_length": n,
        "length_kind": kind,
        "length_tags": tags,
        "depth": DEPTHS[doc % len(DEPTHS)] + 0.01 * (doc % 2),
    }


def docs_at(length: int) -> list[int]:
    return [d for d in range(len(LENGTHS) * PER_LENGTH) if length_of(d) == length]


def long_samples(seed: int = 0):
    return make_samples(len(LENGTHS) * PER_LENGTH, task=LTASK, seed=seed)


def flip_score(s):
    return s.copy(scores={METRIC: 1.0 - s.scores[METRIC]})


def apply(samples, docs, fn, task=LTASK):
    for d in docs:
        samples = mutate(samples, d, fn, task=task)
    return samples


def write_long_variant(root: Path, name: str, samples, teacher=None, *, prompt: int = PROMPT, doc_meta=meta) -> None:
    """samples.parquet with the long-context columns (null for other tasks), tokens, teacher with prompt positions."""
    vdir = RunDir(root).variant(name)
    st, tt = tables(samples)
    for col in DOC_COLS:
        values = [doc_meta(s.doc_id)[col] if s.task == LTASK else None for s in samples]
        st = set_column(st, col, pa.array(values, type=artifacts.DOC_COLUMNS[col]))
    write_manifest(vdir.manifest, VariantManifest(variant=name, status="ok"))
    artifacts.write_table(vdir.samples, st)
    artifacts.write_table(vdir.tokens, tt)
    if teacher is not None:
        te = token_table(teacher)
        is_long = pc.equal(te.column("task"), LTASK)
        shifted = pc.if_else(is_long, pc.subtract(te.column("pos"), pa.scalar(prompt, pa.int32())), te.column("pos"))
        te = te.set_column(te.column_names.index("pos"), "pos", shifted.cast(pa.int32()))
        artifacts.write_table(vdir.teacher, te)


def write_long_run(root: Path, variants: dict[str, tuple[list, list | None]], reference: str = "legacy",
                   noise_floor: str | None = None, **kw) -> Path:
    for name, (samples, teacher) in variants.items():
        write_long_variant(root, name, samples, teacher, **kw)
    info: dict[str, Any] = {"run_id": root.name, "reference": reference, "variants": list(variants)}
    if noise_floor:
        info["noise_floor"] = {"variant": noise_floor, "of": reference}
    artifacts.write_json(RunDir(root).run_json, info)
    return root


def broken_at_2049():
    """legacy vs sp: sp changes only the 2049 items (scores, a hard divergence, free-running and teacher KL,
    a hard top-1 flip)."""
    s, t = long_samples(), long_samples(seed=7)
    docs = docs_at(2049)
    sp = apply(apply(s, docs[0::2], flip_score), [docs[0]], set_token(2, 7))  # two items 0 -> 1
    sp = apply(sp, [docs[1]], perturb_topk(0.5, positions=[4]))  # free-running KL, no divergence
    sp_t = apply(t, [docs[1]], perturb_topk(0.5, positions=[1]))  # pos -3: a prompt position
    sp_t = apply(sp_t, [docs[2]], swap_top1([6]))  # pos 2: the continuation
    return {"legacy": (s, t), "sp": (sp, sp_t)}


@pytest.fixture
def run_2049(tmp_path) -> Path:
    return write_long_run(tmp_path / "run", broken_at_2049())


def _rows(vc, task=LTASK):
    (entry,) = [t for t in vc.by_length if t.task == task]
    return {r.target_length: r for r in entry.lengths}


# ---------------------------------------------------------------------------
# grouping
# ---------------------------------------------------------------------------


def test_only_the_changed_length_shows_the_difference(run_2049):
    (vc,) = compare_run(run_2049).comparisons
    rows = _rows(vc)
    assert list(rows) == sorted(LENGTHS)
    bad = rows[2049]
    (score,) = bad.scores
    assert score.n_paired == PER_LENGTH and score.n_changed == 2 and score.delta != 0
    assert score.delta == 0.5 and score.a_wrong_b_right == 2
    assert sorted(score.changed) == [(d, 0) for d in docs_at(2049)[0::2]]
    assert bad.free.n_divergent == 1 and bad.free.n_hard_divergences == 1
    assert bad.teacher.kl_max > 0 and bad.teacher.n_top1_hard == 1
    for n in (1024, 2047, 2048):
        f = rows[n]
        (sc,) = f.scores
        assert (sc.n_changed, sc.delta, sc.mcnemar_p) == (0, 0.0, 1.0), n
        assert f.free.n_divergent == 0 and f.free.kl_max == 0.0, n
        assert f.teacher.kl_max == 0.0 and f.teacher.n_top1_hard == 0 and f.teacher.kl_max_at is None, n
        assert f.teacher_prompt.max_abs_dlogprob == 0.0 and f.teacher_continuation.max_abs_dlogprob == 0.0


def test_length_rows_carry_kind_tags_depths_and_counts(run_2049):
    (vc,) = compare_run(run_2049).comparisons
    rows = _rows(vc)
    assert (rows[2049].length_kind, rows[2049].length_tags) == ("edge", "tp4:1,block+1")
    assert (rows[1024].length_kind, rows[1024].length_tags) == ("round", None)
    assert rows[2048].length_tags == "tp4:0,block"
    for r in rows.values():
        assert (r.n_items, r.n_clusters) == (PER_LENGTH, 2)
        assert r.free.n_samples == PER_LENGTH and r.teacher.n_samples == PER_LENGTH
        assert r.teacher.n_positions == PER_LENGTH * 8
        assert set(r.depths) <= set(DEPTHS) and r.depths == sorted(r.depths)


def test_depth_rows_bin_the_needle_depth(run_2049):
    (vc,) = compare_run(run_2049).comparisons
    depths = vc.by_length[0].depths
    assert [r.depth_bin for r in depths] == list(DEPTHS)
    n_docs = len(LENGTHS) * PER_LENGTH
    for r in depths:
        members = [d for d in range(n_docs) if DEPTHS[d % 3] == r.depth_bin]
        assert r.n_items == len(members)
        assert r.lengths == sorted({length_of(d) for d in members})
        assert r.depth_min <= r.depth_bin + 0.05 and r.depth_max >= r.depth_bin - 0.05
    assert sum(r.n_items for r in depths) == n_docs
    # the prompt-position perturbation is in doc docs_at(2049)[1]: only its depth bin shows it
    d = docs_at(2049)[1]
    for r in depths:
        shows = r.teacher_prompt.kl_max > 0
        assert shows == (r.depth_bin == DEPTHS[d % 3])


def test_depth_bin_rounds_to_tenths():
    got = depth_bin(np.array([0.0, 0.049, 0.05, 0.097, 0.5029, 0.949, 0.95, 1.0, np.nan]))
    assert got[:-1].tolist() == [0.0, 0.0, 0.1, 0.1, 0.5, 0.9, 1.0, 1.0] and np.isnan(got[-1])


def test_scores_are_clustered_by_haystack(run_2049):
    (vc,) = compare_run(run_2049).comparisons
    (score,) = _rows(vc)[2049].scores
    docs = docs_at(2049)
    a = np.array([float(d % 2) for d in docs])
    b = a.copy()
    b[0::2] = 1 - b[0::2]
    clusters = [meta(d)["cluster"] for d in docs]
    ref = stats.paired_difference(a, b, clusters=clusters)
    assert score.n_clusters == 2 and score.df == 1 and score.se_delta == pytest.approx(0.5)
    assert (score.se_delta, score.ci_low, score.ci_high) == pytest.approx((ref.se, ref.ci_low, ref.ci_high))
    unclustered = stats.paired_difference(a, b)
    assert score.se_delta != pytest.approx(unclustered.se)
    assert score.mcnemar_p == stats.mcnemar_exact(0, 2)


def test_teacher_prompt_and_continuation_are_split(run_2049):
    (vc,) = compare_run(run_2049).comparisons
    task = vc.by_length[0]
    assert task.has_prompt_positions
    f = _rows(vc)[2049]
    # the KL perturbation sits at a prompt position, the hard top-1 flip in the continuation
    assert f.teacher_prompt.kl_max > 0 and f.teacher_prompt.n_top1_hard == 0
    assert f.teacher_prompt.kl_max_at == (docs_at(2049)[1], 0, 1 - PROMPT)
    assert f.teacher_continuation.n_top1_hard == 1 and f.teacher_continuation.kl_max_at[2] >= 0
    assert f.teacher_prompt.n_positions == f.teacher_continuation.n_positions == PER_LENGTH * PROMPT
    assert f.teacher.n_positions == f.teacher_prompt.n_positions + f.teacher_continuation.n_positions
    assert f.teacher.kl_max == max(f.teacher_prompt.kl_max, f.teacher_continuation.kl_max)


def test_without_prompt_positions_there_is_no_split(tmp_path):
    run = write_long_run(tmp_path / "run", broken_at_2049(), prompt=0)
    (vc,) = compare_run(run).comparisons
    task = vc.by_length[0]
    assert not task.has_prompt_positions
    f = _rows(vc)[2049]
    assert f.teacher_prompt is None and f.teacher_continuation is None and f.teacher.kl_max > 0
    d = task.model_dump(mode="json")["lengths"][0]
    assert d["teacher_prompt"] is None and d["teacher_continuation"] is None


def test_without_teacher_the_teacher_figures_are_none(tmp_path):
    variants = {name: (s, None) for name, (s, _) in broken_at_2049().items()}
    (vc,) = compare_run(write_long_run(tmp_path / "run", variants)).comparisons
    f = _rows(vc)[2049]
    assert f.teacher is None and f.free.n_hard_divergences == 1
    assert not vc.by_length[0].has_prompt_positions


# ---------------------------------------------------------------------------
# the figures are those of the task-level functions on filtered tables
# ---------------------------------------------------------------------------


def _filter(table, task, docs):
    mask = pc.and_(pc.equal(table.column("task"), task), pc.is_in(table.column("doc_id"), value_set=pa.array(docs, pa.int64())))
    return table.filter(mask)


def test_rows_equal_the_task_functions_on_the_rows_items(run_2049):
    rd = RunDir(run_2049)
    a, b = load_artifacts(rd.variant("legacy")), load_artifacts(rd.variant("sp"))
    vc = compare_artifacts(a, b, worst_k=0, gates=Gates())
    for n, row in _rows(vc).items():
        docs = docs_at(n)
        sa, sb = _filter(a.samples, LTASK, docs), _filter(b.samples, LTASK, docs)
        (sr,) = compare_scores(sa, sb).rows
        (gs,) = row.scores
        assert (gs.mean_a, gs.mean_b, gs.delta, gs.ci_low, gs.ci_high, gs.mcnemar_p, gs.n_clusters) == (
            sr.mean_a, sr.mean_b, sr.delta, sr.ci_low, sr.ci_high, sr.mcnemar_p, sr.n_clusters
        )
        (ft,) = compare_tokens(_filter(a.tokens, LTASK, docs), _filter(b.tokens, LTASK, docs), sa, sb).summaries
        fr = row.free
        assert (fr.n_divergent, fr.n_hard_divergences, fr.max_abs_dlogprob, fr.kl_max, fr.kl_p99) == (
            ft.n_divergent, ft.n_hard_divergences, ft.max_abs_dlogprob, ft.kl_max, ft.kl_p99
        )
        ta, tb = _filter(a.teacher, LTASK, docs), _filter(b.teacher, LTASK, docs)
        for part, keep in ((row.teacher, None), (row.teacher_prompt, True), (row.teacher_continuation, False)):
            if keep is None:
                xa, xb = ta, tb
            else:
                xa, xb = (t.filter(pc.less(t.column("pos"), 0) if keep else pc.greater_equal(t.column("pos"), 0)) for t in (ta, tb))
            (tt,) = compare_tokens(xa, xb).summaries
            assert (part.kl_max, part.kl_p99, part.max_abs_dlogprob, part.n_top1_hard, part.n_top1_disagree) == (
                tt.kl_max, tt.kl_p99, tt.max_abs_dlogprob, tt.n_top1_hard, tt.n_top1_disagree
            ), (n, keep)
            assert part.kl_max_at == tt.kl_max_at
            assert part.n_positions == tt.n_positions_compared


def test_breakdown_of_artifacts_alone_equals_the_runs(run_2049):
    rd = RunDir(run_2049)
    a, b = load_artifacts(rd.variant("legacy")), load_artifacts(rd.variant("sp"))
    vc = compare_artifacts(a, b, worst_k=5, gates=Gates())
    assert breakdown_artifacts(a, b) == vc.by_length


# ---------------------------------------------------------------------------
# compare.json
# ---------------------------------------------------------------------------


def test_compare_json_by_length_key_and_noise_floor(tmp_path):
    variants = broken_at_2049()
    s, t = variants["legacy"]
    variants["legacy-aa"] = (s, apply(t, [docs_at(1024)[0]], perturb_topk(1e-3, positions=[5])))
    rc = compare_run(write_long_run(tmp_path / "run", variants, noise_floor="legacy-aa"))
    d = rc.doc.model_dump(mode="json")
    (c,) = d["comparisons"]
    (entry,) = c["by_length"]
    assert entry["task"] == LTASK and entry["metrics"] == [METRIC] and entry["has_prompt_positions"] is True
    assert [r["target_length"] for r in entry["lengths"]] == sorted(LENGTHS)
    row = entry["lengths"][-1]
    assert set(row) == {"target_length", "length_kind", "length_tags", "depths", "n_items", "n_clusters", "scores",
                        "free", "teacher", "teacher_prompt", "teacher_continuation"}
    assert {"depth_bin", "depth_min", "depth_max", "lengths"} <= set(entry["depths"][0])
    # the A/A comparison carries its own rows: the floor per length
    (aa,) = d["noise_floor"]["by_length"]
    floor = {r["target_length"]: r["teacher_continuation"]["kl_max"] for r in aa["lengths"]}
    assert floor[1024] > 0 and floor[2047] == floor[2048] == floor[2049] == 0
    json.dumps(d, allow_nan=False)  # plain JSON: no NaN


def test_compare_json_is_byte_identical_on_recomputation(tmp_path, run_2049):
    write_outputs(run_2049, compare_run(run_2049))
    first = RunDir(run_2049).compare_json.read_bytes()
    write_outputs(run_2049, compare_run(run_2049))
    assert RunDir(run_2049).compare_json.read_bytes() == first
    assert b'"by_length"' in first


def test_row_order_of_the_tables_does_not_matter(tmp_path, run_2049):
    shuffled = tmp_path / "shuffled"
    rng = np.random.default_rng(3)
    for name in ("legacy", "sp"):
        src, dst = RunDir(run_2049).variant(name), RunDir(shuffled).variant(name)
        write_manifest(dst.manifest, VariantManifest(variant=name, status="ok"))
        for kind in ("samples", "tokens", "teacher"):
            t = artifacts.read_table(getattr(src, kind))
            artifacts.write_table(getattr(dst, kind), t.take(rng.permutation(t.num_rows)))
    artifacts.write_json(RunDir(shuffled).run_json, artifacts.read_json(RunDir(run_2049).run_json))
    one, two = compare_run(run_2049).comparisons[0], compare_run(shuffled).comparisons[0]
    assert one.by_length == two.by_length


def test_gsm8k_like_runs_have_no_by_length(tmp_path):
    from fakes import write_run

    s = make_samples(8)
    run = write_run(tmp_path / "run", {"legacy": s, "sp": apply(s, [3], set_token(2, 7), task=TASK)})
    (vc,) = compare_run(run).comparisons
    assert vc.by_length is None and "by_length" not in vc.doc.model_dump(mode="json")
    st, _ = tables(s)
    assert not has_lengths(st, st)
    # a target_length column that is null everywhere adds nothing either
    empty = set_column(st, "target_length", pa.array([None] * st.num_rows, pa.int64()))
    assert length_breakdown(empty, empty, compare_scores(empty, empty)) is None


def test_mixed_run_breaks_down_only_the_long_task(tmp_path):
    gsm = make_samples(6, seed=2)
    variants = {name: (gsm + s, None if t is None else gsm + t) for name, (s, t) in broken_at_2049().items()}
    (vc,) = compare_run(write_long_run(tmp_path / "run", variants)).comparisons
    assert [t.task for t in vc.by_length] == [LTASK]
    assert {r.task for r in vc.scores.rows} == {LTASK, TASK}
    assert _rows(vc)[2049].scores[0].n_changed == 2


def test_metadata_on_one_side_is_enough(tmp_path, run_2049):
    """An older run's variant without the long-context columns still pairs with one that has them."""
    rd = RunDir(run_2049)
    a, b = load_artifacts(rd.variant("legacy")), load_artifacts(rd.variant("sp"))
    bare = VariantArtifacts("sp", b.samples.drop_columns(list(DOC_COLS)), b.tokens, b.teacher)
    full = compare_artifacts(a, b, worst_k=0, gates=Gates())
    one_sided = compare_artifacts(a, bare, worst_k=0, gates=Gates())
    swapped = compare_artifacts(bare, a, worst_k=0, gates=Gates())
    assert one_sided.by_length == full.by_length
    assert [r.target_length for r in swapped.by_length[0].lengths] == sorted(LENGTHS)
    # the cluster labels come from the side that has them, so the statistics stay clustered
    (score,) = _rows(swapped)[2049].scores
    assert score.n_clusters == 2
