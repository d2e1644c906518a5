"""`evalpipe compare RUN_A/VARIANT RUN_B/VARIANT`: variants of two runs, same items."""

import pytest
from fakes import make_samples, mutate, set_token, write_variant
from in_process import evalpipe

from evalpipe.errors import UserError
from evalpipe.pipeline.comparing import compare_across_runs


def cli(*args, cwd):
    return evalpipe("compare", *args, cwd=cwd)


def test_same_items_from_two_runs(tmp_path):
    s = make_samples(6)
    a = write_variant(tmp_path / "run1", "legacy", s)
    b = write_variant(tmp_path / "run2", "legacy", s, shuffle_seed=3)
    rc = compare_across_runs(a.root, b.root)
    assert rc.status.value == "IDENTICAL"
    assert rc.doc.reference == "run1/legacy" and rc.doc.variants == ["run2/legacy"]
    proc = cli(str(a.root), str(b.root), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out" / "compare.json").is_file() and (tmp_path / "out" / "report.md").is_file()


def test_a_changed_token_across_runs_is_different(tmp_path):
    s = make_samples(6)
    a = write_variant(tmp_path / "run1", "legacy", s)
    b = write_variant(tmp_path / "run2", "sp", mutate(s, 2, set_token(3, 7)))
    proc = cli(str(a.root), str(b.root), "--output", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 1
    assert "run2/sp" in proc.stdout


def test_different_items_are_a_clear_user_error(tmp_path):
    a = write_variant(tmp_path / "run1", "legacy", make_samples(6))
    b = write_variant(tmp_path / "run2", "legacy", make_samples(4))
    with pytest.raises(UserError, match="has 6 items and run2/legacy has 4"):
        compare_across_runs(a.root, b.root)
    proc = cli(str(a.root), str(b.root), cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "re-run with the same tasks and --limit" in " ".join(proc.stderr.split())
    other_task = write_variant(tmp_path / "run3", "legacy", make_samples(6, task="other_task"))
    with pytest.raises(UserError, match="ran tasks"):
        compare_across_runs(a.root, other_task.root)


def test_arguments_must_be_variant_directories(tmp_path):
    a = write_variant(tmp_path / "run1", "legacy", make_samples(2))
    proc = cli(str(a.root), str(tmp_path / "missing"), cwd=tmp_path)
    assert proc.returncode == 2 and "is not a variant directory" in proc.stderr


def test_a_variant_against_its_own_directory_compares_nothing(tmp_path):
    a = write_variant(tmp_path / "run1", "legacy", make_samples(2))
    proc = cli(str(a.root), str(tmp_path / "run1" / "." / "legacy"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "a variant against its own files compares nothing" in " ".join(proc.stderr.split())


def test_changed_prompts_are_a_clear_user_error(tmp_path):
    from fakes import set_column

    from evalpipe.rundir import artifacts

    s = make_samples(3)
    a = write_variant(tmp_path / "run1", "legacy", s)
    b = write_variant(tmp_path / "run2", "legacy", s)
    table = artifacts.read_table(b.samples)
    hashes = table.column("prompt_hash").to_pylist()
    hashes[1] = "another prompt"
    artifacts.write_table(b.samples, set_column(table, "prompt_hash", hashes))
    with pytest.raises(UserError, match=r"1 items have different prompts .*\(first: doc 1"):
        compare_across_runs(a.root, b.root)


def _probed_run(root, samples, *, ran: str = "legacy"):
    """A run of one `legacy` variant with its recorded expectations and the probes of the path it ran."""
    from fakes import write_run
    from nightly_fakes import add_probes, expectations, probes_of

    from evalpipe.rundir import artifacts

    expect = expectations("legacy")
    write_run(root, {"legacy": samples},
              run_info={"variant_settings": {"legacy": {"expect": expect.model_dump(mode="json", exclude_defaults=True)}}})
    add_probes(artifacts.VariantDir(root / "legacy"), probes_of("legacy", ran, expect))
    return root / "legacy"


def test_one_declared_path_in_two_runs_is_judged_on_its_outputs(tmp_path):
    """The same variant in two runs (another night, another build) is meant to run the same
    code: IDENTICAL outputs there are the answer, not "nothing was compared"."""
    s = make_samples(6)
    a, b = _probed_run(tmp_path / "run1", s), _probed_run(tmp_path / "run2", s)
    rc = compare_across_runs(a, b)
    (c,) = rc.comparisons
    assert rc.status.value == "IDENTICAL" and c.paths.status == "verified", c.paths


def test_a_later_run_that_left_its_path_is_inconclusive(tmp_path):
    """...but each run is still held to its own expectations: a later build whose layer fell
    back to the other path proves nothing about the declared one."""
    s = make_samples(6)
    a, b = _probed_run(tmp_path / "run1", s), _probed_run(tmp_path / "run2", s, ran="sp")
    (c,) = compare_across_runs(a, b).comparisons
    assert c.status.value == "INCONCLUSIVE" and c.verdict.outputs.value == "IDENTICAL"
    from nightly_fakes import ATTENTION

    assert f"variant `run2/legacy` never called `{ATTENTION['legacy']}`" in c.verdict.reasons[0], c.verdict.reasons


def test_a_variant_of_another_run_is_judged_against_a_reference_run_and_its_floor(tmp_path):
    """bisect's steps: the good build measured once (with its A/A run), each candidate
    compared with it; and a build's second run compared with its first under the same floor."""
    from fakes import make_samples, mutate, set_token, write_run

    from evalpipe.pipeline.comparing import compare_with_reference_run

    base = make_samples(6)
    good = write_run(tmp_path / "good", {"ref": base, "ref-aa": base}, noise_floor="ref-aa")
    same = write_run(tmp_path / "same", {"candidate": base})
    moved = write_run(tmp_path / "moved", {"candidate": mutate(base, 2, set_token(1, 999))})
    assert compare_with_reference_run(good, same / "candidate", label="same").status.passed
    judged = compare_with_reference_run(good, moved / "candidate", label="moved")
    assert judged.status.value == "DIVERGENT" and judged.doc.noise_floor is not None
    again = compare_with_reference_run(good, moved / "candidate", label="again", against=same / "candidate")
    assert again.status.value == "DIVERGENT" and again.doc.reference.endswith("same/candidate")
    assert compare_with_reference_run(good, moved / "candidate", label="x", against=moved / "candidate").status.passed
