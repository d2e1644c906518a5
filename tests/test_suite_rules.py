"""The suite's own rules (tests/conftest.py): a skipped test fails the run."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_a_skip_fails_the_run_with_its_reason(tmp_path):
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text(
        "import pytest\n"
        "def test_needs_a_file():\n"
        "    pytest.skip('model not at ~/.cache/somewhere')\n"
        "@pytest.mark.skipif(True, reason='no data here')\n"
        "def test_marked():\n"
        "    pass\n"
        "@pytest.mark.xfail(reason='known', strict=False)\n"
        "def test_expected_failure():\n"
        "    assert False\n"
        "def test_fine():\n"
        "    pass\n"
    )
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert out.returncode == 1, out.stdout
    last = out.stdout.strip().splitlines()[-1]
    # a skip in the test body fails it; a skip mark (decided in setup) makes it an error
    assert "1 failed" in last and "1 error" in last and "1 passed" in last and "1 xfailed" in last, last
    assert "skipped" not in last, last
    assert "model not at ~/.cache/somewhere" in out.stdout and "no data here" in out.stdout
    assert "allows no skips" in out.stdout
