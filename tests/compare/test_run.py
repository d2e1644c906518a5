"""evalpipe/compare/run.py: two variants' tables in, one comparison out. Pinned here: the
comparison's document is built with it (what the file holds is what the object answers),
a run's status is its worst variant's and leaves the A/A comparison out, the sides read
without a manifest make it INCONCLUSIVE, a margin that leaves the equivalence gate unable to
fail is refused, and two runs are compared only on the same items with the same prompts."""

from __future__ import annotations

import json

import pytest
from fakes import make_samples, mutate, set_token, tables

from evalpipe.compare.run import RunComparison, VariantArtifacts, check_same_items, compare_artifacts, compare_tables, with_margin
from evalpipe.config.gate_settings import Gates
from evalpipe.documents.comparison import Status, read_comparison
from evalpipe.errors import UserError


def _compare(a, b, **kw):
    (sa, ta), (sb, tb) = tables(a), tables(b)
    return compare_tables(sa, ta, sb, tb, label_a="legacy", label_b="sp", **kw)


def test_the_comparison_answers_from_the_document_it_built():
    same = make_samples(6)
    vc = _compare(same, same)
    assert vc.status is Status.IDENTICAL and vc.doc.status is Status.IDENTICAL
    assert (vc.reference, vc.variant) == ("legacy", "sp") == (vc.doc.reference, vc.doc.variant)
    assert vc.paths is None and vc.unverified == () and vc.by_length is None  # bare tables: no paths, no lengths


def test_a_run_is_as_bad_as_its_worst_variant_and_the_aa_run_is_not_counted(tmp_path):
    same = make_samples(6)
    moved = mutate(same, 2, set_token(0, 7))
    identical, divergent = _compare(same, same), _compare(same, moved)
    rc = RunComparison.of("run-1", "legacy", (identical, divergent), noise_floor=divergent)
    assert divergent.status is Status.DIVERGENT and rc.status is Status.DIVERGENT
    quiet = RunComparison.of("run-1", "legacy", (identical,), noise_floor=divergent)
    assert quiet.status is Status.IDENTICAL and quiet.doc.noise_floor == divergent.doc
    path = tmp_path / "compare.json"
    path.write_text(rc.to_json())
    assert read_comparison(path) == rc.doc and json.loads(rc.to_json())["status"] == "DIVERGENT"


def test_a_side_read_without_its_manifest_makes_it_inconclusive():
    sa, ta = tables(make_samples(4))
    a = VariantArtifacts("legacy", sa, ta, None)
    b = VariantArtifacts("sp", sa, ta, None, verified=False)
    vc = compare_artifacts(a, b, worst_k=0, gates=Gates())
    assert vc.unverified == ("sp",) and vc.status is Status.INCONCLUSIVE
    rc = RunComparison.of("r", "legacy", (vc,))
    assert rc.doc.unverified == ["sp"]


def test_a_margin_override_is_checked_as_the_config_checks_it():
    assert with_margin(None, None) == Gates()
    assert with_margin(Gates(), 0.05).scores.margin == 0.05
    with pytest.raises(UserError, match="margin"):
        with_margin(Gates(), 1.0)  # no 0/1 score difference exceeds 1: a gate that cannot fail


def test_runs_are_compared_only_on_the_same_items_with_the_same_prompts():
    a, _ = tables(make_samples(4))
    check_same_items(a, a, "run1/legacy", "run2/legacy")
    fewer, _ = tables(make_samples(3))
    with pytest.raises(UserError, match="has 4 items and run2/legacy has 3"):
        check_same_items(a, fewer, "run1/legacy", "run2/legacy")
    other_task, _ = tables(make_samples(4, task="other"))
    with pytest.raises(UserError, match="compare runs of the same tasks"):
        check_same_items(a, other_task, "run1/legacy", "run2/legacy")
    changed = a.set_column(a.schema.get_field_index("prompt_hash"), "prompt_hash",
                           [[f"x{i}" for i in range(a.num_rows)]])
    with pytest.raises(UserError, match="4 items have different prompts"):
        check_same_items(a, changed, "run1/legacy", "run2/legacy")
