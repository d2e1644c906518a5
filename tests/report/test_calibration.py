"""docs/calibration.md as render_calibration writes it (evalpipe/report/calibration.py): the
command, the machine and the headline counts; one escaped row per entry; the sensitivity
and false-alarm sections and the localization summary only when there is data for them;
and the sensitivity plot's PNG, the same bytes for the same points. Rows and points are
built by hand (the calibration run itself is an end-to-end matter).
"""

from pathlib import Path

from evalpipe.documents.calibration import CalibrationRow, SampledVerdict, SensitivityPoint
from evalpipe.documents.run_doc import RunDocument
from evalpipe.report.calibration import render_calibration, sensitivity_plot


def _positional(model, args, kwargs):
    """The model from its fields in declaration order (the rows below read as table rows)."""
    return model(**dict(zip(model.model_fields, args)), **kwargs)


def _row(*args, **kwargs) -> CalibrationRow:
    return _positional(CalibrationRow, args, kwargs)


def _sensitivity(*args, **kwargs) -> SensitivityPoint:
    return _positional(SensitivityPoint, args, kwargs)


def _sampled(*args, **kwargs) -> SampledVerdict:
    return _positional(SampledVerdict, args, kwargs)

def test_table_states_command_machine_and_outcomes():
    rows = [
        _row("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "exact_match,strict-match", 0.0, 0.0, 0.0, 1.0, 100, None, "pass-through"),
        _row("fault-x", "harmful", "DIVERGENT", "caught", ("teacher-forced",), ("teacher_kl_max",), "t",
                       "exact_match,strict-match", -0.02, -0.05, 0.01, 0.3, 100, 3, "a <bad> | bug"),
    ]
    info = RunDocument(run_id="cal", hardware={"cpus": 2, "machine": "x86_64", "system": "Linux"}, versions={"vllm": "0.32.0"})
    text = render_calibration(rows, info, command="evalpipe calibrate --limit 100", seconds=600, run_dir=Path("x"))
    assert "`evalpipe calibrate --limit 100` (10 min" in text and "2 CPUs, x86_64" in text and "vllm 0.32.0" in text
    assert "**Harmful caught: 1/1. Benign kept clean: 1/1.**" in text
    assert "| fault-x | harmful | DIVERGENT | caught | \u22120.020 [\u22120.050, +0.010] | 0.3 | teacher-forced (teacher\\_kl\\_max) | 3 |" in text
    assert "a &lt;bad&gt; \\| bug" in text, "docs are escaped"


def _point(m, n, families, status="DIVERGENT", ratio=2.0, significant=True):
    return _sensitivity(f"fault-attn_out_error_{m:g}", m, n, status, families, (),
                            {"teacher_kl_max": ratio, "teacher_kl_shift": ratio / 2}, {"teacher_kl_shift": significant})


def test_sensitivity_and_false_alarm_sections_and_the_plot():
    rows = [_row("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 100, None, "")]
    points = [
        _point(1e-2, 100, ("teacher-forced", "distributional")), _point(1e-2, 600, ("teacher-forced", "distributional")),
        _point(1e-3, 100, (), "EQUIVALENT", 0.5, False), _point(1e-3, 600, ("teacher-forced",)),
        _point(1e-4, 100, (), "EQUIVALENT", 0.01, False), _point(1e-4, 600, (), "EQUIVALENT", 0.05, False),
    ]
    firing = {"aa_pairs": {"teacher_kl_max": (0, 2)}, "benign": {"teacher_kl_max": (1, 5), "free_kl_max": (0, 0)}}
    text = render_calibration(rows, RunDocument(run_id="c"), command="evalpipe calibrate", seconds=60, run_dir=Path("x"),
                              sensitivity=points, firing=firing, plot="calibration-sensitivity.png")
    assert "| 1e-3 | EQUIVALENT | — | DIVERGENT | teacher-forced |" in text
    assert "| teacher-forced | 1e-2 | 1e-3 |" in text and "| distributional | 1e-2 | 1e-2 |" in text
    assert "| scores | — | — |" in text
    assert "| teacher\\_kl\\_max | 0/2 | 1/5 |" in text and "| free\\_kl\\_max | — | — |" in text
    assert "![measured / threshold per gate against \u03b5](calibration-sensitivity.png)" in text
    png = sensitivity_plot(points)
    assert png.startswith(b"\x89PNG") and png == sensitivity_plot(points), "same points, same bytes"


def _render(rows, run=None, **kw) -> str:
    return render_calibration(rows, run or RunDocument(run_id="c"), command="evalpipe calibrate", seconds=60,
                              run_dir=Path("runs/cal-7"), **kw)


def test_fallback_count_and_localization_column():
    rows = [
        _row("fault-fallback", "fallback", "INCONCLUSIVE", "caught", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 50, None,
                       "leaves its path", localized="none", expected_place="none"),
        _row("fault-err_1e-2", "graded", "DIVERGENT", "caught", ("teacher-forced",), ("teacher_kl_max",), "t", "m",
                       0.0, 0.0, 0.0, 1.0, 50, 7, "", localized="layer 1 attn.out", expected_place="layer 1 attn.out"),
        _row("fault-err_1e-5", "graded", "EQUIVALENT", "missed", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 50, None, "",
                       localized="none", expected_place="layer 1 attn.out"),
    ]
    text = _render(rows)
    assert "Fallbacks flagged INCONCLUSIVE: 1/1. " in text
    assert "named the known place for 2/3 entries; of the graded errors it placed fault-err_1e-2 and missed fault-err_1e-5" in text
    assert "\n- **fault-fallback** (fallback): leaves its path\n" in text  # the entries, each with its doc
    row = next(line for line in text.splitlines() if line.startswith("| fault-err\\_1e-2 |"))
    assert row.endswith("| 7 | layer 1 attn.out (layer 1 attn.out) \u2713 |")
    missed = next(line for line in text.splitlines() if line.startswith("| fault-err\\_1e-5 |"))
    assert missed.endswith("| \u2014 | none (layer 1 attn.out) \u2717 |")


def test_without_points_firing_or_localization_those_sections_are_left_out():
    rows = [_row("sp", "benign", "DIVERGENT", "false alarm", ("scores",), ("score_mcnemar",), "t", "m",
                           0.1, 0.05, 0.15, 0.01, 10, 4, "")]
    text = _render(rows, RunDocument())
    assert "Run: `cal-7`; items per variant: 10." in text  # no run id in run.json: the run directory's name
    assert "Benign kept clean: 0/1.**" in text and "Fallbacks flagged" not in text
    assert "## Sensitivity" not in text and "## False alarms" not in text and "`evalpipe localize`" not in text
    assert "Numerics:" not in text
    assert "| sp | benign | DIVERGENT | false alarm | +0.100 [+0.050, +0.150] | 0.01 | scores (score\\_mcnemar) | 4 | \u2014 |" in text


def test_the_sampled_run_adds_its_column_and_its_own_summary_line():

    rows = [
        _row("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 100, None, "",
                       sampled=_sampled(0.6, 2, "EQUIVALENT", "clean", (), ())),
        _row("fault-x", "harmful", "DIVERGENT", "caught", ("teacher-forced",), ("teacher_kl_max",), "t", "m",
                       -0.02, -0.05, 0.01, 0.3, 100, 3, "",
                       sampled=_sampled(0.6, 2, "EQUIVALENT", "missed", (), ())),
        _row("fault-y", "harmful", "FAILED", "caught", ("engine failure",), (), None, None, None, None, None, None, 0,
                       None, "", sampled=None),
    ]
    text = render_calibration(rows, RunDocument(run_id="cal"), command="c", seconds=60, run_dir=Path("x"))
    assert "**Sampled at temperature 0.6 (2 per item, common random numbers, docs/sampling.md): harmful caught: 0/2. " \
           "Benign kept clean: 1/1.**" in text
    assert "| sampled at temperature 0.6, 2/item: verdict, outcome (detectors) |" in text
    assert "| EQUIVALENT, missed (—) |" in text and "| EQUIVALENT, clean (—) |" in text
    assert text.count("|---|---|---|---|---:|---:|---|---:|---|---|") == 1
    greedy_only = render_calibration([rows[0].model_copy(update={"sampled": None})], RunDocument(run_id="cal"), command="c",
                                     seconds=60, run_dir=Path("x"))
    assert "Sampled at" not in greedy_only and "sampled at temperature" not in greedy_only


def test_a_zoo_over_several_tasks_says_which_task_caught_which_entry():
    rows = [
        _row("sp", "benign", "EQUIVALENT", "clean", (), (), "t", "m", 0.0, 0.0, 0.0, 1.0, 20, None, "",
             by_task={"gsm8k_synth_4shot": "EQUIVALENT", "scenario_near_limit": "IDENTICAL"}),
        _row("fault-far_position_error", "harmful", "DIVERGENT", "caught", ("teacher-forced",), ("teacher_kl_max",), "t", "m",
             0.0, 0.0, 0.0, 1.0, 20, 2, "", by_task={"gsm8k_synth_4shot": "EQUIVALENT", "scenario_near_limit": "DIVERGENT"}),
    ]
    text = _render(rows)
    assert "## Which task catches which entry" in text
    assert "| variant | expected | gsm8k\\_synth\\_4shot | scenario\\_near\\_limit |" in text
    assert "| fault-far\\_position\\_error | harmful | EQUIVALENT | **DIVERGENT** |" in text
    # one task: the section says nothing the main table does not
    single = [r.model_copy(update={"by_task": {"gsm8k_synth_4shot": r.status}}) for r in rows]
    assert "Which task catches" not in _render(single)
