"""What every document shares (evalpipe/documents/base.py): a document refuses a key it does
not know and cannot be changed in place; a failed validation is one sentence naming the
file, the key path and the remedy; a file that is no JSON object is one sentence too."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from evalpipe.documents.base import Document, read_json_object, validated
from evalpipe.errors import UserError


class Inner(Document):
    n: int


class Outer(Document):
    name: str
    inner: Inner


def test_a_document_is_strict_and_frozen():
    doc = Outer(name="a", inner=Inner(n=1))
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        Outer(name="a", inner={"n": 1}, other=2)
    with pytest.raises(ValidationError, match="frozen"):
        doc.name = "b"  # type: ignore[misc]


def test_validated_names_where_the_key_and_the_remedy_in_one_sentence():
    assert validated(Outer, {"name": "a", "inner": {"n": 3}}, "x.json", "fix it") == Outer(name="a", inner=Inner(n=3))
    with pytest.raises(UserError) as err:
        validated(Outer, {"name": "a", "inner": {"n": "many"}}, "x.json", "fix it", at="top")
    assert str(err.value) == "x.json: top.inner.n: Input should be a valid integer, unable to parse string as an integer; fix it."


@pytest.mark.parametrize("text, fragment", [
    ("{cut", "is not valid JSON ("),
    ("[1, 2]", "should hold a JSON object"),
])
def test_read_json_object_refuses_what_is_no_json_object(tmp_path, text, fragment):
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(UserError) as err:
        read_json_object(path, "restore it")
    assert str(err.value).startswith(str(path)) and fragment in str(err.value) and str(err.value).endswith("; restore it.")
    path.write_text('{"a": [1]}')
    assert read_json_object(path, "restore it") == {"a": [1]}


def test_read_json_object_of_a_missing_file_is_one_sentence(tmp_path):
    with pytest.raises(UserError, match="missing.json is not valid JSON .*; restore it.$"):
        read_json_object(tmp_path / "missing.json", "restore it")
