"""The dashboard's data (evalpipe/documents/dashboard_doc.py): the samples the dashboard tests
render are valid documents, and what is not one (a night status the dashboard has no state
for, a change state the detector never gives, a field of another shape) is refused."""

from __future__ import annotations

import pytest
from dashboard_samples import sample_history, synthetic_history
from pydantic import ValidationError

from evalpipe.documents.dashboard_doc import DashboardData


def test_the_samples_are_dashboard_documents():
    data = DashboardData.model_validate(sample_history())
    assert [n.status for n in data.nights][-1] == "REGRESSION" and data.changes[0].flipped[3].doc_id == 3
    assert data.series[0].aa_band is not None and data.series[0].aa_band.low == 0.47
    assert len(DashboardData.model_validate(synthetic_history(n_nights=20, n_tasks=2)).series) == 2 * 3 * 2


@pytest.mark.parametrize("edit, where", [
    (lambda d: d["nights"][0].update(status="GREEN"), "nights.0.status"),
    (lambda d: d["changes"][0].update(state="accepted"), "changes.0.state"),
    (lambda d: d["series"][0].update(changes=["five"]), "series.0.changes.0"),
    (lambda d: d["token_series"][0]["points"][0].update(value="tiny"), "token_series.0.points.0.value"),
    (lambda d: d.update(colour="red"), "colour"),
])
def test_what_is_no_dashboard_document_is_refused(edit, where):
    data = sample_history()
    edit(data)
    with pytest.raises(ValidationError) as err:
        DashboardData.model_validate(data)
    assert where in str(err.value)
