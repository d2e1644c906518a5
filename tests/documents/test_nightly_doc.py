"""nightly.json (evalpipe/documents/nightly_doc.py): a night's judgement round-trips, the
history gets it without the file's version, a version-less one reads as version 1, and one
of another version or with an unknown key is refused in one sentence."""

from __future__ import annotations

import json

import pytest

from evalpipe.documents.nightly_doc import (
    NIGHT_STATUSES,
    NIGHTLY_JSON,
    NIGHTLY_VERSION,
    NightlyDocument,
    read_nightly_document,
    write_nightly_document,
)
from evalpipe.errors import UserError
from tests.report.test_nightly import change


def _night() -> NightlyDocument:
    return NightlyDocument(run_id="night-3", status="REGRESSION", verdict="EQUIVALENT", baseline="night-2",
                           reasons=["sp drifted from baseline night-2: DIVERGENT"],
                           vs_baseline=[{"variant": "sp", "status": "DIVERGENT", "baseline": "night-2"}],
                           changes=[change("flagged", "acc fell")], paths=None)


def test_a_nightly_document_round_trips(tmp_path):
    path = tmp_path / NIGHTLY_JSON
    write_nightly_document(path, _night())
    assert read_nightly_document(path) == _night()
    assert json.loads(path.read_text())["version"] == NIGHTLY_VERSION
    assert read_nightly_document(tmp_path / "none.json") is None
    # the history keeps the judgement without the file's version
    assert "version" not in _night().judgement() and _night().judgement()["baseline"] == "night-2"


@pytest.mark.parametrize("edit, fragment", [
    (lambda d: d.update(baselin="x"), "nightly.json: baselin: Extra inputs are not permitted"),
    (lambda d: d.update(version=7), "is a nightly.json of version 7; this evalpipe reads version 1"),
    (lambda d: d.update(status="GREEN"), "nightly.json: status: Input should be"),
])
def test_a_nightly_json_this_evalpipe_cannot_read_is_one_sentence(tmp_path, edit, fragment):
    raw = json.loads(_night().model_dump_json())
    edit(raw)
    path = tmp_path / NIGHTLY_JSON
    path.write_text(json.dumps(raw))
    with pytest.raises(UserError) as err:
        read_nightly_document(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_version_less_nightly_json_reads_as_version_1(tmp_path):
    raw = json.loads(_night().model_dump_json())
    raw.pop("version")
    path = tmp_path / NIGHTLY_JSON
    path.write_text(json.dumps(raw))
    assert read_nightly_document(path) == _night()


def test_the_night_statuses_run_from_least_to_most_severe():
    assert NIGHT_STATUSES == ("PASS", "INCONCLUSIVE", "REGRESSION", "FAILED")
    assert NightlyDocument(run_id="n").status == "PASS" and NightlyDocument(run_id="n").compared
