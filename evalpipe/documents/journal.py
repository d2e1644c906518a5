"""One line of a variant's request journal (evalpipe.worker.journal): a finished request's
answer under the request's key. Written and read only by RequestJournal.

Each line carries its version as ``v`` (lines are many and short: no header to lose when a
kill cuts the file). Lines written before version 1 have no ``v`` and the same two fields:
they are read as version 1, so a run interrupted under an older evalpipe continues with
its answers. A line of another version, or with a key this evalpipe does not know, is
refused in one sentence; a line cut short by a kill is no JSON at all and is skipped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Final, Literal

from evalpipe.documents.base import Document, validated
from evalpipe.errors import UserError

JOURNAL_FILE = "requests.journal.jsonl"  # in the variant directory
JOURNAL_LINE_VERSION: Final = 1
REMEDY = "move the journal out of the variant directory to ask every request again"


class JournalLine(Document):
    v: Literal[1] = JOURNAL_LINE_VERSION
    key: str  # sha256 of the request (path and body): evalpipe.worker.journal.request_key
    answer: dict[str, Any]  # the server's response, or an offline result's fields


def journal_line(line: JournalLine) -> str:
    """The line to append (compact JSON and its newline). json, not pydantic, writes the
    answer as it is (no copy of a long prompt's logprobs): they may be -inf, which must
    come back as -inf."""
    return json.dumps({"v": line.v, "key": line.key, "answer": line.answer}, separators=(",", ":")) + "\n"


def read_journal_line(text: str, path: Path, number: int) -> JournalLine | None:
    """Line ``number`` (from 1) of the journal at ``path``; None for a line a kill cut short."""
    try:
        raw = json.loads(text)
    except ValueError:
        return None
    where = f"{path} line {number}"
    if not isinstance(raw, dict):
        raise UserError(f"{where} is not a journal entry (a JSON object); {REMEDY}.")
    if "v" not in raw:
        raw = {**raw, "v": JOURNAL_LINE_VERSION}  # before version 1: the same fields
    elif raw["v"] != JOURNAL_LINE_VERSION:
        raise UserError(f"{where} is a journal entry of version {raw['v']!r}; this evalpipe reads version "
                        f"{JOURNAL_LINE_VERSION} (and the version-less ones before it): continue the run with the "
                        f"evalpipe that wrote it, or {REMEDY}.")
    return validated(JournalLine, raw, where, REMEDY)
