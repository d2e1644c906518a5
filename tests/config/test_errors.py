"""The config package's error (evalpipe/config/errors.py): a ConfigError is a user error, so
every command exits 2 with its one sentence, and code that catches user errors catches it."""

from __future__ import annotations

import pytest

from evalpipe.config.errors import ConfigError
from evalpipe.errors import ExitCode, UserError


def test_a_config_error_is_a_user_error_with_exit_code_2():
    err = ConfigError("my.yaml: unknown key `modle`; remove it or fix its spelling.")
    assert isinstance(err, UserError) and err.exit_code == ExitCode.USER_ERROR == 2
    with pytest.raises(UserError, match="unknown key `modle`"):
        raise err


def test_a_config_error_is_raised_by_the_config_s_readers(tmp_path):
    from evalpipe.config.loading import load_config

    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "missing.yaml")
    assert err.value.exit_code == ExitCode.USER_ERROR and "missing.yaml" in str(err.value)
