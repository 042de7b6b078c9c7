"""No import cycles among sqldp's modules.

policy ↔ advantage ↔ priors once imported each other in a circle, held together by imports inside functions;
which module was imported first decided whether the others could be. Now parsing (sqldp.policy) comes first
and the computations on it (sqldp.advantage, sqldp.priors) after. Two checks: every module imports in a fresh
interpreter in sorted and in reverse order, and the graph of every import statement — also those inside
functions, which an import at start-up never runs — has no cycle.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

import sqldp

PACKAGE = Path(sqldp.__file__).parent


def _modules() -> dict[str, Path]:
    """Every module's dotted name and file; ``sqldp.__main__`` runs the command line when imported."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        name = ".".join(parts)
        if name != "sqldp.__main__":
            out[name] = path
    return out


@pytest.mark.parametrize("order", ["sorted", "reversed"])
def test_every_module_imports_in_a_fresh_interpreter(order: str) -> None:
    names = sorted(_modules(), reverse=order == "reversed")
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-c", code, *names], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The sqldp modules ``module`` imports anywhere in its file, except for the type checker only.
    Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first, which counts unless ``module`` is inside
    them (a package's own modules are imported while it initialises)."""
    targets: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    # imports for the type checker only (``if TYPE_CHECKING:``) never run, so they cannot close a cycle
    typing_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets.add(node.module)
            targets.update(f"{node.module}.{a.name}" for a in node.names)
    out = set()
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in known and name != module and not module.startswith(name + "."):
                out.add(name)
    return out


def test_the_import_graph_has_no_cycle() -> None:
    modules = _modules()
    graph = {m: _imported(m, p, set(modules)) for m, p in modules.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' → '.join(reversed(exc.args[1]))}")  # graphlib lists it against the arrows


def test_parsing_does_not_import_the_computations() -> None:
    """The policy package is read by everything; it must not pull in scipy or the conversions."""
    code = "import sys, sqldp.policy\nprint(sorted({'sqldp.advantage', 'sqldp.priors', 'scipy'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
