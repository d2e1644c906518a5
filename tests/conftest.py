"""Shared fixtures and the suite's one rule about skips.

A skipped test is a feature nobody checked. Everything the tests need comes from the
project (the shipped built-in model, data generated under a temporary data directory,
engines started by the tests), so a skip means a missing install step or a stale
assumption about the machine: it is reported as a failure, with its reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers every package's tests share (tests/support/) are imported by their plain names.
sys.path.insert(0, str(Path(__file__).resolve().parent / "support"))


@pytest.fixture(scope="session")
def builtin_model_dir() -> Path:
    """The built-in model's directory, found and verified by the code runs use."""
    from evalpipe.models.builtin import ensure_builtin

    return ensure_builtin("tiny-gsm").path


@pytest.fixture(scope="session")
def cluster():
    """One real three-node Ray cluster on 127.0.0.1 (tests/support/ray_cluster.py) for every test of
    this pytest process that asks for it: started at the first, stopped after the last.
    Each test leaves it as it found it (no actor, placement group or process of its run)."""
    from ray_cluster import local_cluster

    with local_cluster() as up:
        yield up


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} skipped ({reason}); this suite allows no skips: whatever a test "
                           "needs, the project must provide (scripts/setup.sh, a fixture or .ci/run)")


def pytest_collection_modifyitems(config, items):
    """The longest test modules first (a module sets RUNS_FOR_MINUTES): the two processes of
    the end-to-end run then finish together instead of one waiting out the last long file."""
    items.sort(key=lambda item: -getattr(item.module, "RUNS_FOR_MINUTES", 0))
