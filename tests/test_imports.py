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


# -- start-up: the heavy modules load only on the paths that use them ------------------------------------------

# z3 (the model check of joins), scipy and numpy (calibration, error bars of the smoothed mechanisms, R2T's LP),
# pyspark (--engine spark), matplotlib (epsilon --plot), and psycopg and asyncio where no database is read
HEAVY = ("scipy", "numpy", "z3", "pyspark", "matplotlib", "psycopg", "asyncio")
TPCH_Q06 = Path(__file__).resolve().parents[1] / "benchmarks" / "tpch" / "queries" / "q06.sql"
SINGLE_TABLE = [
    TPCH_Q06.read_text(encoding="utf-8"),  # SUM over a filtered lineitem
    "SELECT o_orderpriority, COUNT(*), AVG(o_totalprice) FROM orders GROUP BY o_orderpriority",
]
JOIN = "SELECT COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey AND l_quantity > 10"


def _loaded_after(statements: str, *, env: dict[str, str] | None = None) -> tuple[list[str], str]:
    """Which of HEAVY a fresh interpreter has imported after ``statements`` (and their stdout)."""
    code = (
        "import contextlib, io, json, sys\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        + "".join(f"    {line}\n" for line in statements.splitlines())
        + f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
        "print(json.dumps({'loaded': loaded, 'out': out.getvalue()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    import json

    found = json.loads(done.stdout)
    return found["loaded"], found["out"]


def test_the_command_line_starts_without_the_heavy_modules() -> None:
    """`sqldp --help` builds every command's parser: none of them may import what only its work needs."""
    loaded, _ = _loaded_after("import sqldp.cli\nsqldp.cli.build_parser().format_help()")
    assert loaded == []


@pytest.mark.parametrize("query", SINGLE_TABLE)
def test_explaining_a_single_table_query_needs_no_solver_scipy_or_database(query: str) -> None:
    """`sqldp explain --schema`: the whole analysis of a query over one table, with its global sensitivity
    (no join: one row moves one join row and one group, no solver needed)."""
    argv = ["explain", "--schema", "tpch", "--policy", "tpch", "--format", "json", query]
    loaded, out = _loaded_after(f"from sqldp.cli import main\nassert main({argv!r}) == 0")
    assert loaded == []
    import json

    explained = json.loads(out)
    assert explained["refused"] is None and explained["sql"]
    for entry in explained["global_sensitivity"].values():
        assert entry["join_rows"]["sensitivity"] == 1 and not entry["join_rows"]["timed_out"]
        assert entry.get("groups", {"sensitivity": 1})["sensitivity"] == 1


def test_a_join_still_loads_the_solver() -> None:
    """The other side of the check above (so that it could fail): the global sensitivity of a join is the
    model check's, with z3, and it is the exact one (NR Table 21's Q12 shape: orders' join rows unbounded)."""
    argv = ["explain", "--schema", "tpch", "--policy", "tpch", "--format", "json", JOIN]
    loaded, out = _loaded_after(f"from sqldp.cli import main\nassert main({argv!r}) == 0")
    assert "z3" in loaded and "scipy" not in loaded
    import json

    g = json.loads(out)["global_sensitivity"]
    assert g["orders"]["join_rows"]["sensitivity"] == "inf" and g["lineitem"]["join_rows"]["sensitivity"] == 1


def test_running_a_single_table_query_needs_no_solver_or_scipy(
    tpch_dsn: tuple[str, dict[str, int], dict[str, list[tuple[int, int]]]],
) -> None:
    """`sqldp run` of a COUNT over one table on PostgreSQL: psycopg, but not z3 (the global bound of a query
    without a join, sqldp.sensitivity.global_bound.one_use) nor scipy (Laplace's error bar is closed-form)."""
    query = "SELECT COUNT(*) FROM orders WHERE o_orderpriority = '1-URGENT'"
    argv = ["run", "--dsn", tpch_dsn[0], "--policy", "tpch", "--epsilon", "1", "--format", "json", query]
    loaded, out = _loaded_after(f"from sqldp.cli import main\nassert main({argv!r}) == 0")
    assert "z3" not in loaded and "scipy" not in loaded and "numpy" not in loaded and "psycopg" in loaded
    import json

    result = json.loads(out)
    assert result["mechanism"] == "laplace-global" and isinstance(result["answer"], float)


def test_a_lazy_module_replaces_itself_at_its_first_use() -> None:
    """sqldp.lazy: nothing is imported until an attribute is read; then the importer's global is the module."""
    code = (
        "import sys\nfrom sqldp.lazy import lazy\nns = {}\nns['colorsys'] = lazy('colorsys', ns)\n"
        "assert 'colorsys' not in sys.modules\nassert ns['colorsys'].rgb_to_hsv(1, 0, 0) == (0.0, 1.0, 1)\n"
        "assert ns['colorsys'] is sys.modules['colorsys']\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
