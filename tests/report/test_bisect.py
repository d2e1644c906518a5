"""The bisect report: every candidate in order, its verdict and evidence, and the answer."""

from rich.console import Console

from evalpipe.documents.bisect import Answer, Attempt, BisectJournal, Candidate, Evidence, Step, StepVerdict
from evalpipe.documents.comparison import Status
from evalpipe.report.bisect import bisect_html, bisect_markdown, bisect_table, rows, write_bisect_reports


def journal() -> BisectJournal:
    cands = [Candidate(commit=f"{i:040x}", subject=f"change <{i}> | x", files=[f"f{i}.py"]) for i in range(1, 5)]
    diff = Attempt(run_dir="/r", limit=8, status=Status.DIVERGENT, verdict=StepVerdict.DIFFERENT, reason="teacher_kl_p99 above",
                   evidence=Evidence(first_divergence=17, kl_p99=2.5e-6, flipped=0, failed_gates=["teacher_kl_p99"]))
    skip = Attempt(run_dir="/s", limit=8, status=None, verdict=StepVerdict.SKIP, reason="the build did not run: ImportError")
    steps = [Step(commit=cands[3].commit, attempts=[diff, diff], verdict=StepVerdict.DIFFERENT, reason="confirmed", endpoint=True),
             Step(commit=cands[1].commit, attempts=[skip], verdict=StepVerdict.SKIP, reason="the build did not run: ImportError"),
             Step(commit=cands[2].commit, attempts=[diff, diff], verdict=StepVerdict.DIFFERENT, reason="confirmed"),
             Step(commit=cands[0].commit, attempts=[], verdict=StepVerdict.SAME, reason="EQUIVALENT")]
    answer = Answer(kind="ambiguous", first_different=cands[2].commit, could_be=[cands[1].commit, cands[2].commit],
                    sentence="the first DIFFERENT build is 3 or one of the skipped builds before it")
    return BisectJournal(config="c.yaml", repo="/r", variant="sp", good="0" * 40, bad=cands[-1].commit, candidates=cands,
                         steps=steps, answer=answer, seconds=90)


def test_rows_hold_each_candidates_verdict_runs_and_evidence_in_order():
    r = rows(journal())
    assert [x.verdict for x in r] == ["SAME", "SKIP", "DIFFERENT", "DIFFERENT"]
    assert (r[2].first_divergence, r[2].kl_p99, r[2].flipped, r[2].gates, r[2].runs) == ("17", "2.5e-06", "0", "teacher_kl_p99", "2")
    assert r[1].why == "the build did not run: ImportError" and r[1].first_divergence == "—"


def test_markdown_html_and_terminal_say_the_answer_and_escape_the_subjects(tmp_path):
    j = journal()
    md = bisect_markdown(j)
    assert "**the first DIFFERENT build is 3" in md and "`f3.py`" in md
    assert "change <3> \\| x" in md or "change &lt;3&gt; \\| x" in md, "a pipe in a subject cannot break the table"
    html = bisect_html(j)
    assert "change &lt;3&gt; | x" in html and "<script" not in html
    table, records = bisect_table(j)
    console = Console(record=True, width=200)
    console.print(table)
    assert "DIFFERENT" in console.export_text() and [r["verdict"] for r in records] == ["SAME", "SKIP", "DIFFERENT", "DIFFERENT"]
    written = write_bisect_reports(tmp_path, j)
    assert [p.name for p in written] == ["bisect.md", "bisect.html"] and all(p.is_file() for p in written)
