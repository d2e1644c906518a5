"""The README and the docs pages link to each other, to headings inside them and to
repository files. A heading renamed or a section moved to another page breaks such a
link without anything failing, and a reader following it lands nowhere; so every
relative link must name an existing file and every anchor a heading of its target.
The README is the entry point, kept short (the reference lives in docs/), so it has a
length bound and must link every docs page; and its first config is meant to be copied,
so it must stay a valid config as the config's keys change.

Reads files only (no engine); paths are taken from this file's place in the tree, not
from the installed package, so a worktree checks its own files.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 300

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# [text](target) and ![alt](target); the text holds no brackets, the target no spaces
LINK = re.compile(r"!?\[([^\[\]]*)\]\(([^()\s]+)\)")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of the lines outside fenced and indented code blocks."""
    out, fenced, previous_blank = [], False, True
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            previous_blank = False
            continue
        indented_code = previous_blank and line.startswith("    ") and line.strip()
        if not fenced and not indented_code:
            out.append((number, line))
        previous_blank = not line.strip() or bool(indented_code)
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text lower-cased, everything but
    letters, digits, spaces, '-' and '_' dropped, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows its text
    text = text.replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path):
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings
    return out


def links(path: Path) -> list[tuple[int, str]]:
    return [(number, m.group(2)) for number, line in prose_lines(path) for m in LINK.finditer(line)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for number, target in links(page):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: ({target})"
        if not dest.exists():
            broken.append(f"{where} names no file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{where}: {dest.name} has no heading with the anchor #{anchor}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_readme_is_short() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= README_MAX_LINES, f"README.md has {n} lines (at most {README_MAX_LINES}): move reference text to docs/"


def test_readme_links_every_docs_page() -> None:
    linked = {(README.parent / target.partition("#")[0]).resolve() for _, target in links(README)}
    missing = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"README.md links no docs page named {', '.join(missing)}; add it to its Documentation list"


def test_readme_first_config_is_a_valid_config() -> None:
    from evalpipe.config.loading import parse_config

    text = README.read_text(encoding="utf-8")
    section = text.split("## A first config for a new switch", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```yaml\n(.*?)```", section, re.S)
    assert block, "README.md: the first-config section has no ```yaml block"
    config = parse_config(yaml.safe_load(block.group(1)), "README.md, A first config for a new switch")
    assert len(config.variants) == 2 and config.reference in config.variants
    for name in config.variants:
        assert config.variant_expect(name).declares(), f"variant `{name}` of the README's config declares no expectation"


def test_slug_follows_github() -> None:
    assert slug("Quick start (a fresh Linux machine, CPU only, no model hub needed)") == (
        "quick-start-a-fresh-linux-machine-cpu-only-no-model-hub-needed")
    assert slug("Before a run: `evalpipe doctor`") == "before-a-run-evalpipe-doctor"
    assert slug("The built-in model's files") == "the-built-in-models-files"
    assert slug("Writing expectations for a new switch") == "writing-expectations-for-a-new-switch"


def test_the_readme_holds_no_timing_of_one_machine() -> None:
    # A time depends on the machine it was taken on; docs/measured.md says which for each.
    timings = re.findall(r"\b\d+(?:\.\d+)? ?(?:min|ms|s|seconds|minutes|hours?)\b", README.read_text(encoding="utf-8"))
    assert not timings, f"README.md states timings {timings[:5]}; put them in docs/measured.md with their machine"
