"""The request journal's lines (evalpipe/documents/journal.py): a line round-trips compact with
its version and -inf intact, a version-less line reads as version 1 and a cut one is
skipped, a line of another version or shape is refused in one sentence (before any
engine starts, in the worker)."""

from __future__ import annotations

import json

import pytest

from evalpipe.documents.journal import JOURNAL_FILE, JOURNAL_LINE_VERSION, JournalLine, read_journal_line
from evalpipe.documents.manifest import (
    read_manifest,
)
from evalpipe.documents.worker_job import WorkerJob
from evalpipe.errors import ExitCode, UserError
from evalpipe.rundir.artifacts import MANIFEST_JSON
from evalpipe.worker.journal import RequestJournal


def test_a_journal_line_round_trips_with_its_version(tmp_path):
    path = tmp_path / JOURNAL_FILE
    journal = RequestJournal(path)
    answer = {"token_ids": [1, 2], "logprobs": [-0.5, float("-inf")], "finish_reason": "stop"}
    journal.put("k1", answer)
    journal.close()
    text = path.read_text()
    assert text.count("\n") == 1 and " " not in text, "one compact line per answer"
    assert json.loads(text)["v"] == JOURNAL_LINE_VERSION
    line = read_journal_line(text, path, 1)
    assert line == JournalLine(key="k1", answer=answer)
    again = RequestJournal(path)
    assert again.get("k1") == answer and again.loaded == 1  # -inf comes back as -inf
    again.close()


def test_a_journal_line_from_before_the_version_is_read_and_a_cut_one_skipped(tmp_path):
    path = tmp_path / JOURNAL_FILE
    path.write_text('{"key": "old", "answer": {"text": "4"}}\n{"v": 1, "key": "new", "answer": {}}\n{"v": 1, "key": "cu')
    assert read_journal_line('{"key": "old", "answer": {"text": "4"}}', path, 1) == JournalLine(key="old", answer={"text": "4"})
    journal = RequestJournal(path)
    assert journal.loaded == 2 and journal.get("old") == {"text": "4"}
    journal.put("after", {"n": 1})  # not glued to the cut line
    journal.close()
    assert RequestJournal(path).loaded == 3


@pytest.mark.parametrize("line, fragment", [
    ('{"v": 2, "key": "k", "answer": {}}', "line 2 is a journal entry of version 2; this evalpipe reads version 1"),
    ('{"v": 1, "key": "k", "answer": {}, "at": 5}', "line 2: at: Extra inputs are not permitted; move the journal out of the variant directory"),
    ('{"v": 1, "answer": {}}', "line 2: key: Field required"),
    ('[1, 2]', "line 2 is not a journal entry (a JSON object)"),
])
def test_a_journal_line_this_evalpipe_cannot_read_is_one_sentence(tmp_path, line, fragment):
    path = tmp_path / JOURNAL_FILE
    path.write_text('{"v": 1, "key": "a", "answer": {}}\n' + line + "\n")
    with pytest.raises(UserError, match=JOURNAL_FILE) as err:
        RequestJournal(path)
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_the_worker_refuses_a_journal_it_cannot_read_as_a_user_error(tmp_path):
    """Before any engine starts: the variant fails with the journal's sentence (exit 2),
    and its manifest says so."""
    from evalpipe.worker import main

    vdir = tmp_path / "v"
    vdir.mkdir()
    (vdir / JOURNAL_FILE).write_text('{"v": 2, "key": "k", "answer": {}}\n')
    job = WorkerJob(variant="v", output_dir=str(vdir), engine_args={"model": str(tmp_path)}, tasks=[], topk=1,
                    data_dir=str(tmp_path / "data"), journal=JOURNAL_FILE)
    events = []

    class Events:
        def emit(self, event, **fields):
            events.append((event, fields))

    assert main.run(job, Events()) == ExitCode.USER_ERROR  # type: ignore[arg-type]
    kind, message = events[-1][1]["kind"], events[-1][1]["message"]
    assert kind == "user" and "line 1 is a journal entry of version 2" in message
    manifest = read_manifest(vdir / MANIFEST_JSON)
    assert manifest.status == "failed" and manifest.error == message
