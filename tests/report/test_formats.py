"""The formats every renderer shares (evalpipe/report/formats.py): positions
as "doc D [repeat R] pos P" with how many were left out, the excerpt windows around the first
differing character, control characters shown as \\uXXXX, token texts as JSON literals.
"""

from __future__ import annotations

from evalpipe.report import formats


def test_positions_name_doc_repeat_and_pos_and_say_how_many_more():
    assert formats.fmt_positions([[3, 0, 5], [7, 1, 0]], 31) == "doc 3 pos 5, doc 7 repeat 1 pos 0 (first 2 of 31)"
    assert formats.fmt_positions([[3, 0, 5]], 1) == "doc 3 pos 5"
    assert formats.fmt_positions([[3, 0], [4, 0, 2]], None) == "doc 4 pos 2"  # a malformed entry is left out
    assert formats.fmt_positions([], 5) == "" and formats.fmt_positions(None, None) == ""
    assert formats.fmt_triple((2, 0, 4)) == "doc 2 pos 4" and formats.fmt_triple(None) == formats.DASH and formats.fmt_triple([1, 2]) == formats.DASH


def test_excerpts_are_windows_around_the_first_difference():
    same = "x" * 300
    a, b = formats.excerpts(same, same)
    assert a == b == same[:formats.EXCERPT_CHARS] + formats.ELLIPSIS  # identical: from the start
    k = 100  # first differing character
    a, b = formats.excerpts(same[:k] + "A" + same, same[:k] + "B" + same)
    assert a.startswith(formats.ELLIPSIS) and a[1:].startswith("x" * formats.EXCERPT_CONTEXT + "A") and b[1 + formats.EXCERPT_CONTEXT] == "B"
    assert len(a) == len(b) == 1 + formats.EXCERPT_CHARS + 1  # an ellipsis either side
    # one a prefix of the other: the window is around where the shorter ends; None reads as ""
    assert formats.excerpts("abc", "abcdef") == ("abc", "abcdef")
    assert formats.excerpts(None, "def") == ("", "def")


def test_control_characters_are_shown_not_sent():
    assert formats.show_controls("a\x00b\x1bc\x7f\u2028\ud800") == "a\\u0000b\\u001bc\\u007f\\u2028\\ud800"
    assert formats.show_controls("one\ntwo\tthree", keep="\n") == "one\ntwo\\u0009three"
    assert formats.show_controls("plain ünïcode ✓") == "plain ünïcode ✓"


def test_token_texts_are_json_literals():
    assert formats.quoted(" the") == '" the"' and formats.quoted("\n") == '"\\n"' and formats.quoted("ü") == '"ü"' and formats.quoted(13) == '"13"'
