"""No import cycles among sqldp's modules.

policy ↔ advantage ↔ priors once imported each other in a circle, held together by imports inside functions;
which module was imported first decided whether the others could be. Now parsing (sqldp.policy) comes first
and the computations on it (sqldp.advantage, sqldp.priors) after. Two checks: every module imports in a fresh
interpreter in sorted and in reverse order, and the graph of every import statement — also those inside
functions, which an import at start-up never runs — has no cycle. A third check adds the imports for the type
checker only (``if TYPE_CHECKING:``) and names each one that closes a cycle.
"""

from __future__ import annotations

import ast
import graphlib
import subprocess
import sys
from collections import deque
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


def _imported(module: str, path: Path, known: set[str], *, typing_only: bool = False) -> set[str]:
    """The sqldp modules ``module`` imports anywhere in its file: those run (at start-up or inside a function)
    or, with ``typing_only``, those in ``if TYPE_CHECKING:`` blocks, which only the type checker follows.
    Importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first, which counts unless ``module`` is inside
    them (a package's own modules are imported while it initialises)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    checker_only = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for stmt in node.body
        for inner in ast.walk(stmt)
    }
    targets: set[str] = set()
    for node in ast.walk(tree):
        if (id(node) in checker_only) != typing_only:
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


def _graphs() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The run-time import graph and the type checker's extra edges (``if TYPE_CHECKING:``)."""
    modules = _modules()
    known = set(modules)
    run = {m: _imported(m, p, known) for m, p in modules.items()}
    typing = {m: _imported(m, p, known, typing_only=True) - run[m] for m, p in modules.items()}
    return run, typing


def _shortest_path(graph: dict[str, set[str]], start: str, goal: str) -> list[str] | None:
    """Breadth-first: the fewest imports that lead from ``start`` to ``goal``, both ends included."""
    came: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if here == goal:
            path = [here]
            while (before := came[path[-1]]) is not None:
                path.append(before)
            return path[::-1]
        for there in sorted(graph.get(here, ())):
            if there not in came:
                came[there] = here
                queue.append(there)
    return None


def _cycles_closed_by(run: dict[str, set[str]], extra: dict[str, set[str]]) -> list[str]:
    """Each edge of ``extra`` that closes a cycle with the others, as the shortest such cycle written out
    (``a ⇢ b → … → a``: ⇢ the edge of ``extra``). Empty when the union of both graphs is acyclic."""
    union = {m: run.get(m, set()) | extra.get(m, set()) for m in run.keys() | extra.keys()}
    found = []
    for source in sorted(extra):
        for target in sorted(extra[source]):
            back = _shortest_path(union, target, source)
            if back is not None:
                found.append(f"{source} ⇢ " + " → ".join(back))
    return found


def test_the_import_graph_has_no_cycle() -> None:
    run, _ = _graphs()
    try:
        tuple(graphlib.TopologicalSorter(run).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' → '.join(reversed(exc.args[1]))}")  # graphlib lists it against the arrows


def test_the_cycle_report_names_the_edge_that_closes_it() -> None:
    """The reporter of the check below, on a graph made up for it: a type-only edge c ⇢ a closes a → b → c."""
    run = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a"}}
    assert _cycles_closed_by(run, {"c": {"a"}}) == ["c ⇢ a → b → c"]
    assert _cycles_closed_by(run, {"a": {"c"}, "d": {"c"}}) == []  # shortcuts, no way back


# The type checker follows ``if TYPE_CHECKING:`` imports too: a cycle through one of them is a real dependency
# loop between the modules (each needs the other's names), held apart only by the guard. Shared types live in a
# module both sides import (sqldp.form's PerKeyCounts, sqldp.sensitivity.representations, the protocol
# sqldp.subqueries.Normalizer).
def test_the_import_graph_with_type_only_imports_has_no_cycle() -> None:
    run, typing = _graphs()
    cycles = _cycles_closed_by(run, typing)
    assert not cycles, "type-only imports (⇢) that close a cycle:\n" + "\n".join(cycles)


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
