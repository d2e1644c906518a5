"""The suite's own rules (tests/conftest.py): a skipped test fails the run; and the
package's layering: compare/ is pure comparison, report/ renders, and only
evalpipe.pipeline.comparing (and the runner and CLI above it) joins them to run directories."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import evalpipe

PACKAGE = Path(evalpipe.__file__).parent


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


def _imports(path: Path) -> list[tuple[int, list[str]]]:
    """(line, dotted names) of every import statement in ``path``, at any depth (function-level
    imports too); ``from a import b`` names both ``a`` and ``a.b``, relative imports resolved."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.append((node.lineno, [alias.name for alias in node.names]))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[: len(parent) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            found.append((node.lineno, [base, *(f"{base}.{alias.name}" for alias in node.names)]))
    return sorted(found)


def _forbidden(sub: str, banned: tuple[str, ...]) -> list[str]:
    """"<file>:<line> imports <module>" for each import statement of package ``sub`` that reaches a banned module."""
    bad = []
    for path in sorted((PACKAGE / sub).rglob("*.py")):
        for line, names in _imports(path):
            hit = next((n for n in names if any(n == b or n.startswith(b + ".") for b in banned)), None)
            if hit is not None:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {hit}")
    return bad


def test_compare_is_pure_comparison():
    """compare/ reads and writes no run directory and knows nothing of reports or runs."""
    bad = _forbidden("compare", ("evalpipe.report", "evalpipe.pipeline.comparing", "evalpipe.pipeline.runner", "evalpipe.cli"))
    assert not bad, "compare/ must stay pure comparison (move file and report work to evalpipe/pipeline/comparing.py): " + "; ".join(bad)


def test_report_does_not_import_the_run_layer():
    """report/ renders dicts; it may use pure helpers of compare/ (e.g. verdict formatting)
    but not the run comparison module nor the modules that read and write run directories."""
    bad = _forbidden("report", ("evalpipe.pipeline.comparing", "evalpipe.pipeline.runner", "evalpipe.compare.run"))
    assert not bad, "report/ must not import the run layer (that would close an import circle): " + "; ".join(bad)


def test_probes_import_only_the_standard_library():
    """evalpipe/probes is loaded into every engine process, under another build's
    interpreter: it may import the standard library and evalpipe.probes itself, nothing
    else (not even the rest of evalpipe, which needs pydantic and friends)."""
    stdlib = set(sys.stdlib_module_names)
    files = sorted((PACKAGE / "probes").rglob("*.py"))
    assert PACKAGE / "probes" / "site" / "sitecustomize.py" in files and len(files) >= 7, files
    bad, seen = [], set()
    for path in files:
        for line, names in _imports(path):
            seen.update(names)
            for name in names:
                if name.split(".")[0] in stdlib or name == "evalpipe.probes" or name.startswith("evalpipe.probes."):
                    continue
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    assert "evalpipe.probes.runtime" in seen and "importlib.machinery" in seen, "the scan must see the probes' imports"
    assert not bad, "evalpipe/probes must stay standard library only (it runs in the engine's interpreter): " + "; ".join(bad)


def _importers_of(banned: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    """"<file>:<line> imports <module>" for every module of evalpipe outside ``allowed``
    (package prefixes or modules) that imports one of ``banned``."""
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if any(module == a or module.startswith(a + ".") for a in allowed):
            continue
        for line, names in _imports(path):
            hit = next((n for n in names if any(n == b or n.startswith(b + ".") for b in banned)), None)
            if hit is not None:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {hit}")
    return bad


def test_only_calibration_imports_the_lab():
    """The lab (the layout model, its fault zoo, the built-in models' training) is how
    evalpipe tests itself; the product reaches the layout model only through vLLM's plugin
    entry point, so nothing but calibration and the lab itself imports it."""
    bad = _importers_of(("evalpipe.lab",), ("evalpipe.lab", "evalpipe.commands.calibrate"))
    assert not bad, "only evalpipe.commands.calibrate may import evalpipe.lab: " + "; ".join(bad)


def test_task_lookup_does_not_import_the_worker():
    """evalpipe.tasks (task index, families, hub data, per-task settings) serves the parent
    and the worker alike, so it sits below worker/ (what runs inside the variant's interpreter)."""
    tasks_bad = _forbidden("tasks", ("evalpipe.worker",))
    assert not tasks_bad, "evalpipe/tasks must not import the worker: " + "; ".join(tasks_bad)
