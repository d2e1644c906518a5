"""localize.json (evalpipe/documents/localization.py): localizations round-trip, localizing a
variant again replaces its entry and keeps the others', a file this evalpipe cannot read is
put aside (never lost, never in the way) when a new localization is written, and reading
one of another version is refused in one sentence."""

from __future__ import annotations

import json

import pytest

from evalpipe.documents.localization import (
    LOCALIZE_JSON,
    LOCALIZE_VERSION,
    LocalizeDocument,
    ModuleDoc,
    PositionDoc,
    read_localizations,
    write_localizations,
)
from evalpipe.errors import UserError


def _doc(variant: str, sentence: str = "parts at layer 1") -> LocalizeDocument:
    first = ModuleDoc(layer=1, module="attn.out", title="attention output", rows=2, rel_l2=0.5, floor=0.01, above=True,
                      worst=[PositionDoc(label="t doc 0", position=4, rel_l2=None, flags=["a shard boundary of T = 2"])])
    return LocalizeDocument(run_id="r", variant=variant, reference="legacy", modes={"legacy": "offline", variant: "serve"},
                            precision="bf16", numerics_floor=0.01, rel_aa=3.0, sequences=[], modules=[first], first=first,
                            sentence=sentence)


def test_localizations_round_trip(tmp_path):
    assert read_localizations(tmp_path) == [], "none localized: none"
    path, aside = write_localizations(tmp_path, [_doc("sp"), _doc("tp")])
    assert path == tmp_path / LOCALIZE_JSON and aside is None
    assert json.loads(path.read_text())["version"] == LOCALIZE_VERSION
    assert read_localizations(tmp_path) == [_doc("sp"), _doc("tp")]


def test_localizing_a_variant_again_replaces_only_its_entry(tmp_path):
    write_localizations(tmp_path, [_doc("sp"), _doc("tp")])
    write_localizations(tmp_path, [_doc("sp", "parts at layer 0")])
    assert [(d.variant, d.sentence) for d in read_localizations(tmp_path)] == [("tp", "parts at layer 1"),
                                                                              ("sp", "parts at layer 0")]


@pytest.mark.parametrize("text, fragment", [
    ('{"version": 2, "localizations": []}', "is a localization of version 2; this evalpipe reads version 1"),
    ('{"version": 1, "localizations": [{"variant": "sp"}]}', "localizations.0.run_id: Field required"),
    ("{cut", "is not valid JSON"),
])
def test_an_unreadable_localization_is_one_sentence_and_put_aside_when_rewritten(tmp_path, text, fragment):
    (tmp_path / LOCALIZE_JSON).write_text(text)
    with pytest.raises(UserError) as err:
        read_localizations(tmp_path)
    assert fragment in str(err.value) and "run `evalpipe localize` again" in str(err.value)
    path, aside = write_localizations(tmp_path, [_doc("sp")])
    assert aside == tmp_path / (LOCALIZE_JSON + ".unreadable") and aside.read_text() == text
    assert read_localizations(tmp_path) == [_doc("sp")]
