"""The suite's own rules (tests/conftest.py): a skipped test fails the run; and the
package's layering: compare/ is pure comparison, report/ renders, and only
evalpipe.pipeline.comparing (and the runner and CLI above it) joins them to run directories."""

from __future__ import annotations

import ast
import graphlib
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



# Top to bottom; a module may import its own package and the layers below its own.
LAYERS = (
    ("cli", "__main__"),  # the verbs
    ("commands",),  # use cases bigger than a call into the pipeline (doctor, calibrate)
    ("pipeline", "nightly", "bisection"),  # a run from config to report; a night from run to judgement; a bisect's search
    ("report", "history", "execution", "probing", "cluster"),  # renderers, the history, processes, probe records, Ray
    ("compare",),  # pure comparison
    ("rundir",),  # the run directory: its layout, tables, integrity, resuming
    ("documents",),  # the typed documents in it, each with its file name
    ("config", "models", "tasks", "data"),  # what a run is made of
    ("gates",),  # what each gate is: the registry config, compare, nightly and the reports iterate
    ("engine_patches",),  # evalpipe's changes inside vLLM's processes (switches checked by config)
    ("errors", "paths", "install", "redact", "machine", "atomic_files", "validation", "reporting", "number_format",
     "process_table"),  # small utilities
)
# Beside the layers: worker/ runs in the variant's interpreter and may use the layers from
# the run directory down; the lab sits just below the commands (only calibrate imports it,
# see above); probes/ is standard library only (see above).
SIDE = {"worker": LAYERS.index(("rundir",)) - 0.5, "lab": 1.5}


def _layer(top: str) -> float | None:
    return next((float(i) for i, names in enumerate(LAYERS) if top in names), SIDE.get(top))


def _package_imports() -> list[tuple[str, int, str, str]]:
    """(file, line, importing top-level name, imported module) for every import of another
    of evalpipe's top-level packages or modules (function-level imports too)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",) or parts[0] == "probes":
            continue
        for line, names in _imports(path):
            for name in names:
                if name.startswith("evalpipe.") and name.split(".")[1] != parts[0]:
                    found.append((str(path.relative_to(PACKAGE.parent)), line, parts[0], name))
    return found


def test_every_package_has_a_layer():
    tops = {p.relative_to(PACKAGE).parts[0].removesuffix(".py") for p in PACKAGE.iterdir()
            if p.suffix == ".py" or (p / "__init__.py").exists()} - {"__init__", "probes"}
    assert {"cli", "pipeline", "compare", "rundir", "worker"} <= tops, tops
    unplaced = sorted(t for t in tops if _layer(t) is None)
    assert not unplaced, f"place {unplaced} in LAYERS (tests/test_suite_rules.py) and docs/development.md"


def test_imports_point_down_the_layers():
    """A layer never imports one above it (nor worker/ anything of the parent above the run
    directory), so each package can be read, tested and replaced from the bottom up."""
    up = [f"{where}:{line} ({top}) imports {name}" for where, line, top, name in _package_imports()
          if (mine := _layer(top)) is not None and (theirs := _layer(name.split(".")[1])) is not None and theirs < mine]
    assert not up, "imports must point down the layers: " + "; ".join(up)


def test_no_module_of_the_parent_imports_the_worker():
    """worker/ is what runs in the variant's interpreter (another build's, maybe); the parent
    talks to it through the job file and its events, and shares only evalpipe.documents."""
    bad = [f"{where}:{line} imports {name}" for where, line, top, name in _package_imports()
           if top != "worker" and name.split(".")[1] == "worker"]
    assert not bad, "only evalpipe/worker may import evalpipe.worker: " + "; ".join(bad)


def test_no_import_circle():
    """Between modules, function-level imports included (a circle hidden in a function is
    still a circle)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        deps = graph.setdefault(module, set())
        for _, names in _imports(path):
            deps.update(n for n in names if n.startswith("evalpipe.") and n != module)
    modules = set(graph)
    graph = {m: {d for d in deps if d in modules and not m.startswith(d + ".")} for m, deps in graph.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


def _messages(tree: ast.AST) -> list[ast.Constant]:
    """The string literals of a module but its docstrings (what a user can be told)."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def test_no_message_offers_deleting_as_the_way_forward():
    """A run's files are its evidence: a message says how to restore, redo or move aside
    what is in the way, never to delete it (`restore or delete run.json` once did)."""
    import re

    advice = re.compile(r"(?i)\b(delete|erase)\b|\brm -|\bremove (the|its|this) (file|journal|directory|run|manifest)")
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _messages(ast.parse(path.read_text(encoding="utf-8"))):
            if advice.search(node.value):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:100]!r}")
    assert found == [], found


TESTS = Path(__file__).resolve().parent
# Beside the mirror: the runs that start the real engine, and the helpers every package's tests share.
OUTSIDE_THE_MIRROR = ("e2e", "support")


def _modules() -> list[Path]:
    """Every module of the package, relative to it; `python -m evalpipe` is the CLI's."""
    return [path.relative_to(PACKAGE) for path in sorted(PACKAGE.rglob("*.py")) if path.name not in ("__init__.py", "__main__.py")]


def test_every_test_directory_mirrors_a_package():
    strays = [str(d.relative_to(TESTS)) for d in sorted(TESTS.rglob("*"))
              if d.is_dir() and d.name != "__pycache__" and "__pycache__" not in d.parts
              and d.relative_to(TESTS).parts[0] not in OUTSIDE_THE_MIRROR and not (PACKAGE / d.relative_to(TESTS)).is_dir()]
    assert not strays, f"tests/{strays[0]} matches no package of evalpipe/: put its tests beside the package they test"


def test_every_module_has_a_test_file_of_its_own():
    missing = [f"tests/{rel.parent / ('test_' + rel.name)}" for rel in _modules() if not (TESTS / rel.parent / f"test_{rel.name}").is_file()]
    assert not missing, f"{len(missing)} modules have no test file of their own, first {missing[:5]}"


def test_no_module_of_evalpipe_shares_a_name_with_the_standard_library():
    """Some processes have evalpipe's own directory on their path (the guard's parent in
    tests/execution/test_guard.py): a top-level evalpipe/numbers.py once shadowed the standard
    library's numbers there, and pydantic failed to import."""
    names = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    assert "cli" in names and "number_format" in names, "the scan must see evalpipe's top-level modules"
    assert not names & set(sys.stdlib_module_names), sorted(names & set(sys.stdlib_module_names))


def _run_ids_named(path: Path) -> set[str]:
    """The run ids a test module gives as literals: after "--run-id", to the process lookups
    of tests/support/processes.py (wait_gone, processes_of), and assigned to `run_id`."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.List, ast.Tuple, ast.Call)):
            items = node.args if isinstance(node, ast.Call) else node.elts
            for before, item in zip(items, items[1:]):
                if isinstance(before, ast.Constant) and before.value == "--run-id" and isinstance(item, ast.Constant):
                    found.add(str(item.value))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("wait_gone", "processes_of") \
                and node.args and isinstance(node.args[0], ast.Constant):
            found.add(str(node.args[0].value))
        if isinstance(node, ast.Assign):  # run_id = "x", and `base, run_id = ..., "x"`
            for target in node.targets:
                pairs = zip(target.elts, node.value.elts) if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple) \
                    else [(target, node.value)]
                for name, value in pairs:
                    if isinstance(name, ast.Name) and name.id == "run_id" and isinstance(value, ast.Constant):
                        found.add(str(value.value))
    return found


def test_every_run_id_a_test_names_belongs_to_one_module():
    """The tests find a run's processes by the run id in their environment (so does a resume
    that reaps what an earlier attempt left), and two test files run at once: a run id named
    in two modules would count or reap the other's processes as this run's."""
    tests = Path(__file__).parent
    owners: dict[str, set[str]] = {}
    for path in tests.rglob("test_*.py"):
        for run_id in _run_ids_named(path):
            owners.setdefault(run_id, set()).add(str(path.relative_to(tests)))
    shared = {run_id: sorted(files) for run_id, files in owners.items() if len(files) > 1}
    assert shared == {}, f"run ids named in more than one test module: {shared}; give each module its own"
