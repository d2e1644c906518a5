"""The package's shape in numbers: modules, import levels, import circles, imports hidden
in functions, private names imported across modules, the largest files.

    .venv/bin/python scripts/code_map.py [PACKAGE_DIR]   # default: evalpipe/ next to this script

Import levels: the longest chain of internal imports (a module that imports nothing of
the package is level 1; the circles, collapsed to one node, count once). Imports are read
with the standard library's ast, all of them (function-level and TYPE_CHECKING ones too),
so the numbers describe what a reader has to follow, not only what runs at import time.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

import networkx as nx


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(root: Path, path: Path, modules: set[str]) -> tuple[set[str], int, list[str]]:
    """(internal modules imported, imports inside functions, private names imported from another module)."""
    name = module_name(root, path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    private: list[str] = []
    in_function = 0
    function_lines = {
        n.lineno
        for f in ast.walk(tree)
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
        for n in ast.walk(f)
        if isinstance(n, (ast.Import, ast.ImportFrom))
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, *([base] if base else [])])
            targets = []
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.append(full if full in modules else base)
                if alias.name.startswith("_") and not alias.name.startswith("__") and base in modules and base != name:
                    private.append(f"{name} <- {base}.{alias.name}")
        else:
            continue
        internal = {t for t in targets if t in modules and t != name}
        if internal and node.lineno in function_lines:
            in_function += 1
        found |= internal
    return found, in_function, private


def main(argv: list[str]) -> int:
    root = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / "evalpipe"
    files = {module_name(root, p): p for p in sorted(root.rglob("*.py"))}
    modules = set(files)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    hidden = 0
    private: list[str] = []
    for name, path in files.items():
        found, in_function, priv = imports_of(root, path, modules)
        hidden += in_function
        private += priv
        graph.add_edges_from((name, t) for t in found if not name.startswith(t + "."))  # a package's own __init__
    circles = [sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1]
    dag = nx.condensation(graph)
    level: dict[int, int] = {}
    for node in reversed(list(nx.topological_sort(dag))):
        level[node] = 1 + max((level[s] for s in dag.successors(node)), default=0)
    top = sorted(n for n in modules if n.count(".") == 1 and not files[n].name == "__init__.py")
    sizes = sorted(((sum(1 for _ in p.open(encoding="utf-8")), n) for n, p in files.items()), reverse=True)
    by_package: dict[str, int] = defaultdict(int)
    for n in modules:
        by_package[n.split(".")[1] if n.count(".") >= 2 or files[n].name == "__init__.py" and n.count(".") == 1 else "(top)"] += 1

    print(f"package            {root}")
    print(f"modules            {len(modules)} ({sum(s for s, _ in sizes)} lines)")
    print(f"modules at the top {len(top)}: {', '.join(t.split('.', 1)[1] for t in top)}")
    print(f"import levels      {max(level.values(), default=0)}")
    print(f"import circles     {len(circles)}" + "".join(f"\n                   {' <-> '.join(c)}" for c in circles))
    print(f"imports in functions {hidden}")
    print(f"private names imported across modules {len(private)}" + "".join(f"\n                   {p}" for p in private[:12]))
    print("largest files      " + ", ".join(f"{n.split('.', 1)[1]} {s}" for s, n in sizes[:8]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
