"""evalpipe/lab/build.py, `python -m evalpipe.lab.build`: a recipe's overrides read as JSON
where they parse and as text otherwise, and the refusals that come before any training
(--ship with overrides, a model name it does not know)."""

from __future__ import annotations

import pytest

from evalpipe.errors import ExitCode
from evalpipe.lab.build import _parse_set, main


def test_overrides_are_json_where_they_parse():
    assert _parse_set(["steps=20", "lr=1e-3", "name=tiny", "split_digits=true"]) == \
        {"steps": 20, "lr": 1e-3, "name": "tiny", "split_digits": True}
    with pytest.raises(SystemExit, match="--set expects KEY=VALUE"):
        _parse_set(["steps"])


def test_what_is_refused_before_any_training(capsys, tmp_path):
    assert main(["tiny-gsm", "--ship", "--set", "steps=1"]) == ExitCode.USER_ERROR
    assert "--ship builds the default recipe" in capsys.readouterr().err
    assert main(["no-such-model", "--out-dir", str(tmp_path)]) == ExitCode.USER_ERROR
    assert "no-such-model" in capsys.readouterr().err and not any(tmp_path.iterdir())
