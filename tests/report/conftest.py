"""The fixture several report test files share: one real comparison of the long-context run."""

from __future__ import annotations

from typing import Any

import pytest
from report_samples import long_run_compare


@pytest.fixture(scope="session")
def long_compare(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """compare.json of report_samples.long_run_compare, made once (a real comparison takes a moment)."""
    return long_run_compare(tmp_path_factory.mktemp("bylength"))
