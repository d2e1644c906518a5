"""The data sets evalpipe generates itself (evalpipe/data/registry.py): a relative data file
under a generated set's directory is (re)generated before it is used, an edited file is
replaced by what the generator defines, other paths are only joined to the data
directory, and building sets by name refuses an unknown name before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from evalpipe.data.registry import GENERATED, build_all, ensure_dataset_file
from evalpipe.errors import UserError


def test_a_generated_set_is_written_on_first_use_and_restored_when_edited(tmp_path):
    path = ensure_dataset_file(Path("gsm8k_synth/test.jsonl"), tmp_path)
    assert path == tmp_path / "gsm8k_synth" / "test.jsonl" and path.is_file()
    original = path.read_bytes()
    assert original and (tmp_path / "gsm8k_synth" / "train.jsonl").is_file()
    path.write_text('{"question": "edited", "answer": "#### 0"}\n')
    assert ensure_dataset_file(Path("gsm8k_synth/test.jsonl"), tmp_path).read_bytes() == original


def test_other_paths_are_only_joined(tmp_path):
    assert ensure_dataset_file(Path("mine/test.jsonl"), tmp_path) == tmp_path / "mine" / "test.jsonl"
    assert list(tmp_path.iterdir()) == [], "nothing generated"


def test_build_all_builds_the_named_sets_or_every_one(tmp_path):
    assert build_all(tmp_path, ["gsm8k_synth", "gsm8k_synth"]) == [tmp_path / "gsm8k_synth"]
    assert build_all(tmp_path / "all") == [tmp_path / "all" / name for name in sorted(GENERATED)]
    assert all((tmp_path / "all" / name).is_dir() for name in GENERATED)


def test_an_unknown_set_is_refused_before_anything_is_built(tmp_path):
    with pytest.raises(UserError) as err:
        build_all(tmp_path, ["gsm8k_synth", "mmlu", "arc"])
    assert str(err.value) == ("unknown generated data sets `mmlu`, `arc` (known: gsm8k_synth); nothing was built, "
                              "name only known sets.")
    assert list(tmp_path.iterdir()) == []
