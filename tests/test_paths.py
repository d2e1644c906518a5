"""Where evalpipe keeps what outlives a run (evalpipe/paths.py): the cache and data
directories follow their environment variables (expanded and absolute) or default under
the home directory, and the plain-name rule keeps a run, variant or task name from naming
another directory."""

from __future__ import annotations

import pytest

from evalpipe.paths import CACHE_ENV, DATA_ENV, cache_dir, data_dir, is_plain_name, models_dir


def test_the_directories_default_under_the_home_cache(monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_ENV, raising=False)
    monkeypatch.delenv(DATA_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "evalpipe"
    assert models_dir() == cache_dir() / "models" and data_dir() == cache_dir() / "data"


def test_the_environment_moves_them(monkeypatch, tmp_path):
    monkeypatch.delenv(DATA_ENV, raising=False)  # CI sets both: here each is set in turn
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_ENV, "~/c/../cache")
    assert cache_dir() == tmp_path / "cache" and data_dir() == tmp_path / "cache" / "data"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(DATA_ENV, "data")
    assert data_dir() == tmp_path / "data" and data_dir().is_absolute()
    assert models_dir() == tmp_path / "cache" / "models", "the data directory does not move the models"


@pytest.mark.parametrize("name", ["legacy", "sp-tp2", "run_2026.12.04", "v1+cpu", "A" * 200])
def test_plain_names(name):
    assert is_plain_name(name)


@pytest.mark.parametrize("name", ["", "..", "a..b", "a/b", ".hidden", "-x", "a b", "A" * 201, "é"])
def test_names_that_would_name_another_directory(name):
    assert not is_plain_name(name)
