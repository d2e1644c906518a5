"""evalpipe/probes/site/sitecustomize.py, in the fresh interpreters it is made for: without
EVALPIPE_PROBES it does nothing; a spec that cannot be read leaves the process running with
one line on stderr (a probe never stops the engine it watches); and the sitecustomize it
shadows on the path still runs after it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evalpipe.probes import SITE_DIR, SPEC_ENV

PROGRAM = "import sys; print('alive', 'evalpipe.probes.runtime' in sys.modules)"


def _python(tmp_path: Path, *, spec: str | None = None, shadowed: str | None = None) -> subprocess.CompletedProcess:
    path = [str(SITE_DIR)]
    if shadowed is not None:
        other = tmp_path / "other-site"
        other.mkdir()
        (other / "sitecustomize.py").write_text(shadowed)
        path.append(str(other))
    env = {k: v for k, v in os.environ.items() if k != SPEC_ENV}
    # the checkout (or the installed package) stays importable after the site directory
    env["PYTHONPATH"] = os.pathsep.join(path + [os.environ.get("PYTHONPATH", ""), str(Path(SITE_DIR).parents[2])])
    if spec is not None:
        env[SPEC_ENV] = spec
    return subprocess.run([sys.executable, "-c", PROGRAM], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_without_a_spec_nothing_is_loaded(tmp_path):
    out = _python(tmp_path)
    assert out.returncode == 0 and out.stdout.split() == ["alive", "False"], out.stderr
    assert "evalpipe probes" not in out.stderr


def test_an_unreadable_spec_leaves_the_process_running_and_says_so(tmp_path):
    out = _python(tmp_path, spec=str(tmp_path / "no-such-spec.json"))
    assert out.returncode == 0 and out.stdout.split()[0] == "alive", out.stderr
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("evalpipe probes:")]
    assert "not active in process" in line and "no-such-spec.json" in line


def test_the_sitecustomize_it_shadows_still_runs(tmp_path):
    out = _python(tmp_path, shadowed="print('the distribution s own sitecustomize ran')\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["the distribution s own sitecustomize ran", "alive False"]
