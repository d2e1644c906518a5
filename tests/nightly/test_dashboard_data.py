"""evalpipe/nightly/dashboard_data.py: the nightly dashboard's data from the history -- every
night with its status and a link to its report relative to the dashboard, each score series
with its A/A band and the flagged change's index, each token series beside the A/A run's
value (a KL measure on a log scale), only the nights of the config asked for -- and
build_dashboard writing the rendered page."""

from __future__ import annotations

import pytest

from evalpipe.nightly import dashboard_data as dashboard


def test_dashboard_data_has_series_bands_and_the_change(tmp_path, judged_nights):
    db, results = judged_nights([False] * 3 + [True] * 2)
    data = dashboard.dashboard_data(db, "cfg1", "t", tmp_path / "dash" / "index.html")
    assert [n.status for n in data.nights] == ["PASS"] * 3 + ["REGRESSION"] * 2
    assert data.nights[0].report == "../runs/night-00/report.html"
    sp = next(s for s in data.series if s.variant == "sp")
    assert len(sp.points) == 5 and sp.changes == [3]
    assert sp.aa_band is not None and (sp.aa_band.low, sp.aa_band.high) == (pytest.approx(0.6), pytest.approx(0.6))  # A/A identical: zero width
    change = next(c for c in data.changes if c.run_id == "night-03")
    assert change.report == "../runs/night-03/report.html"


def test_token_series_stand_beside_the_aa_runs_values(tmp_path, judged_nights):
    db, _ = judged_nights([False, False, True])
    data = dashboard.dashboard_data(db, "cfg1", "t", tmp_path / "dash" / "index.html")
    token = {t.measure: t for t in data.token_series if t.variant == "sp"}
    hard = token["free_n_hard_divergences"]
    assert [(p.run_id, p.value, p.aa_value) for p in hard.points] == [
        ("night-00", 0.0, 0.0), ("night-01", 0.0, 0.0), ("night-02", 12.0, 0.0)]
    assert hard.log is False and token["free_kl_max"].log is True
    assert all(t.variant != "legacy-aa" for t in data.token_series), "the A/A run is no series of its own"


def test_only_the_nights_of_the_config_asked_for(tmp_path, judged_nights):
    db, _ = judged_nights([False])
    data = dashboard.dashboard_data(db, "another-config", "nightly", tmp_path / "index.html")
    assert (data.title, data.nights, data.series, data.token_series, data.changes) == ("nightly", [], [], [], [])
    assert data.database == db.where


def test_a_night_whose_report_is_gone_has_no_link(tmp_path, judged_nights):
    db, _ = judged_nights([False, False])
    (tmp_path / "runs" / "night-01" / "report.html").unlink()
    nights = dashboard.dashboard_data(db, "cfg1", "t", tmp_path / "dash" / "index.html").nights
    assert [n.report for n in nights] == ["../runs/night-00/report.html", None]


def test_build_dashboard_writes_the_page_of_every_night(tmp_path, judged_nights):
    db, _ = judged_nights([False, True])
    path = tmp_path / "site" / "dashboard.html"
    assert dashboard.build_dashboard(db, "cfg1", "my nightly", path) == path
    page = path.read_text()
    assert "my nightly" in page and "night-00" in page and "night-01" in page
