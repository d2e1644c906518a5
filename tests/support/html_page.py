"""An HTML page as the report tests read it (the standard library's parser, no browser):
start tags with their attributes, end tags, and the text of each run between tags.
Shared by tests/report/test_html.py and tests/report/test_escaping.py."""

from __future__ import annotations

from html.parser import HTMLParser


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: list[tuple[str, dict[str, str | None]]] = []  # a self-closing tag (<rect/>) too
        self.ends: list[str] = []
        self.texts: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.starts.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        self.ends.append(tag)

    def handle_data(self, data):
        self.texts.append(data)


def parse_page(html: str) -> Page:
    page = Page()
    page.feed(html)
    page.close()
    return page
