"""The per-request journal of a variant: every finished request's answer, one JSON line
each, appended and flushed as it arrives (served variants: each completion's response;
offline ones: each GenResult / ScoreResult as vLLM finishes its request).

A run continued after a kill (evalpipe/rundir/resume.py keeps this file of an unfinished
variant) answers the requests it finds here from the journal and sends only the rest:
a kill -9 loses at most the requests that were in flight. The key is the request
itself (prompt token ids and every sampling setting), so an answer is only ever reused
for the very same request, and only from the interrupted run: within a run every request
reaches the engine, also one that another task sent before. A line cut short by the kill is ignored; each line is a
versioned document (evalpipe.documents.journal). Flushing hands each
line to the kernel, which keeps it through the death of the process; only the
machine's own crash could lose the last lines.

Standard library and evalpipe.documents only (the worker runs under any variant's interpreter).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from evalpipe.documents.journal import JournalLine, journal_line, read_journal_line
from evalpipe.documents.manifest import JournalSummary


def request_key(path: str, body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps([path, body], sort_keys=True, separators=(",", ":")).encode()).hexdigest()


class RequestJournal:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._answers: dict[str, Any] = {}
        if self.path.is_file():
            with open(self.path, encoding="utf-8") as fh:
                for number, text in enumerate(fh, 1):
                    entry = read_journal_line(text, self.path, number)
                    if entry is not None:  # None: the line the kill cut short
                        self._answers[entry.key] = entry.answer
        self.loaded = len(self._answers)
        self.reused = 0
        self._out = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - open for the engine's life
        if self.path.stat().st_size and not self.path.read_bytes().endswith(b"\n"):
            self._out.write("\n")  # end the cut line, or the next answer would be glued to it

    def get(self, key: str) -> Any | None:
        answer = self._answers.get(key)
        if answer is not None:
            self.reused += 1
        return answer

    def put(self, key: str, answer: dict[str, Any]) -> None:
        # not answered from here again in this run: a request sent twice (two tasks asking the same
        # prompt, a scenario repeating another's items) must reach the engine twice, or the path
        # its second sending drives would not run. Only an earlier, interrupted run's answers are reused.
        self._out.write(journal_line(JournalLine(key=key, answer=answer)))
        self._out.flush()

    def summary(self) -> JournalSummary:
        """For the manifest (evalpipe.worker.main records it once, as the variant ends)."""
        return JournalSummary(file=self.path.name, answers_found=self.loaded, answers_reused=self.reused)

    def close(self) -> None:
        self._out.close()
