"""A bisect's report: the candidates in order with each one's verdict and evidence, and the
answer (Markdown, HTML and the terminal), from the journal alone."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from evalpipe.atomic_files import write_text
from evalpipe.documents.bisect import BisectJournal, Step, short
from evalpipe.number_format import DASH, fmt_small
from evalpipe.report.markdown import md_escape, template_environment

BISECT_MD = "bisect.md"
BISECT_HTML = "bisect.html"
COLUMNS = ("#", "commit", "subject", "verdict", "runs", "first divergent token", "KL p99", "flipped items", "failed gates", "why")


@dataclass(frozen=True)
class Row:
    index: int
    commit: str
    subject: str
    verdict: str
    runs: str
    first_divergence: str
    kl_p99: str
    flipped: str
    gates: str
    why: str


def rows(journal: BisectJournal) -> list[Row]:
    """Every candidate, oldest first; the untested ones too (verdict —)."""
    out = []
    for i, cand in enumerate(journal.candidates):
        step: Step | None = journal.step(cand.commit)
        last = next((a for a in reversed(step.attempts) if a.evidence is not None), None) if step else None
        ev = last.evidence if last is not None else None
        out.append(Row(
            index=i + 1, commit=short(cand.commit), subject=cand.subject,
            verdict=str(step.verdict) if step else DASH, runs=str(len(step.attempts)) if step else "0",
            first_divergence=DASH if ev is None or ev.first_divergence is None else str(ev.first_divergence),
            kl_p99=DASH if ev is None else fmt_small(ev.kl_p99, DASH),
            flipped=DASH if ev is None else str(ev.flipped),
            gates=DASH if ev is None or not ev.failed_gates else ", ".join(ev.failed_gates),
            why=step.reason if step else "not tested",
        ))
    return out


def _view(journal: BisectJournal) -> dict:
    first = next((c for c in journal.candidates if journal.answer and c.commit == journal.answer.first_different), None)
    return {"journal": journal, "source": source(journal), "good": short(journal.good), "bad": short(journal.bad), "rows": rows(journal), "columns": COLUMNS, "first": first,
            "runs": journal.runs(), "minutes": journal.seconds / 60}


def source(journal: BisectJournal) -> str:
    return journal.repo if journal.repo is not None else f"the builds listed in {journal.config}"


def bisect_markdown(journal: BisectJournal) -> str:
    view = _view(journal)
    lines = [f"# Bisect of {md_escape(source(journal))}", "",
             f"Good {short(journal.good)}, bad {short(journal.bad)}, {len(journal.candidates)} candidate builds of variant "
             f"`{md_escape(journal.variant)}` (config {md_escape(journal.config)}); {view['runs']} runs of a build, "
             f"{view['minutes']:.1f} min.", ""]
    if journal.answer is not None:
        lines += [f"**{md_escape(journal.answer.sentence)}**", ""]
    first = view["first"]
    if first is not None:
        lines += ["Files it changed: " + (", ".join(f"`{md_escape(f)}`" for f in first.files) or "none"), ""]
        if journal.answer and journal.answer.localize_dir:
            lines += [f"Localized against its parent ({md_escape(journal.answer.localize_dir)}): "
                      f"{md_escape(journal.answer.localized or '')}", ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in view["rows"]:
        lines.append("| " + " | ".join([str(r.index), r.commit, md_escape(r.subject, 80), r.verdict, r.runs, r.first_divergence,
                                         r.kl_p99, r.flipped, md_escape(r.gates), md_escape(r.why, 200)]) + " |")
    return "\n".join(lines) + "\n"


def bisect_html(journal: BisectJournal) -> str:
    return template_environment(autoescape=True).get_template("bisect.html.j2").render(**_view(journal))


def write_bisect_reports(root: Path, journal: BisectJournal) -> list[Path]:
    md, html = root / BISECT_MD, root / BISECT_HTML
    write_text(md, bisect_markdown(journal))
    write_text(html, bisect_html(journal))
    return [md, html]


def bisect_table(journal: BisectJournal) -> tuple[Table, list[dict[str, str]]]:
    """The terminal's table and its rows as records (--progress jsonl)."""
    table = Table(title=f"bisect {short(journal.good)}..{short(journal.bad)}")
    for c in COLUMNS:
        table.add_column(c, overflow="fold")
    records = []
    for r in rows(journal):
        table.add_row(str(r.index), r.commit, escape(r.subject), r.verdict, r.runs, r.first_divergence, r.kl_p99, r.flipped,
                      escape(r.gates), escape(r.why))
        records.append({"commit": r.commit, "subject": r.subject, "verdict": r.verdict, "runs": r.runs, "why": r.why})
    return table, records
