"""``sqldp demo``: start the embedded database, load the cafeteria example and TPC-H (SF 0.01), and show a
few noisy answers with their error bars. ``sqldp load tpch|tpcds|cafeteria`` loads one data set."""

from __future__ import annotations

import argparse
import sys
import time

from sqldp.cli import emit
from sqldp.commands.analyze import format_text
from sqldp.db import connect, resolve_dsn
from sqldp.engine import DEFAULT_ENGINE, ENGINES, command_line
from sqldp.errors import InputError, RefusedError

DEMO_QUERIES = (
    ("cafeteria", "SELECT COUNT(*) FROM t WHERE faculty = 'math'", "math students eating (the cafeteria example)"),
    ("cafeteria", "SELECT AVG(time) FROM t WHERE faculty = 'math'", "average eating time of math students"),
    (
        "cafeteria",
        "SELECT COUNT(*) FROM t a, t b WHERE a.faculty = b.faculty AND a.name < b.name",
        "pairs of students of one faculty (self-join, NR §3.3.7.3 pattern unification)",
    ),
    ("tpch", "SELECT COUNT(*) FROM orders WHERE o_orderpriority = '1-URGENT'", "urgent orders"),
    (
        "tpch",
        "SELECT o_orderpriority, COUNT(*) AS n FROM orders GROUP BY o_orderpriority ORDER BY o_orderpriority",
        "orders per priority (declared groups, parallel composition)",
    ),
    (
        "tpch",
        "SELECT COUNT(*) FROM lineitem, orders WHERE l_orderkey = o_orderkey AND o_orderpriority = '1-URGENT'",
        "line items of urgent orders (join)",
    ),
    (
        "tpch",
        "SELECT SUM(l_quantity) FROM lineitem WHERE l_shipdate <= date '1998-09-02'",
        "quantity shipped (TPC-H Q1 shape; values protected by the lineitem norm)",
    ),
)


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, else one line per table)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = ""

    def __call__(self, table: str, done: int, total: int) -> None:
        width = 30
        frac = done / total if total else 1.0
        if self.tty:
            bar = "#" * int(frac * width)
            print(f"\r  loading {table:<10} [{bar:<{width}}] {frac:4.0%}", end="", file=sys.stderr, flush=True)
            if done >= total:
                print(file=sys.stderr)
        elif done >= total and table != self.last:
            print(f"  loaded {table} ({total / 1e6:.1f} MB)", file=sys.stderr)
            self.last = table


def _has_table(dsn: str, table: str) -> bool:
    with connect(dsn) as conn:
        row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{table}",)).fetchone()
    assert row is not None  # a SELECT without FROM returns one row
    return bool(row[0])


# the table whose presence says a data set is loaded (and whose comment records the scale factor)
_MARKER = {"tpch": "lineitem", "tpcds": "store_sales", "cafeteria": "t"}
_SCALED = {"tpch": "TPC-H", "tpcds": "TPC-DS"}


def _loaded_scale(dsn: str, dataset: str = "tpch") -> str | None:
    with connect(dsn) as conn:
        row = conn.execute(
            "SELECT obj_description(%s::regclass, 'pg_class')", (f"public.{_MARKER[dataset]}",)
        ).fetchone()
    comment = row[0] if row else None
    prefix = f"sqldp {dataset} scale "
    return comment[len(prefix) :] if comment and comment.startswith(prefix) else None


def load(dsn: str, dataset: str, scale: float, *, force: bool = False, strict_scale: bool = False) -> None:
    """Load a data set unless it is there. ``strict_scale`` (``sqldp load``): TPC-H or TPC-DS of another scale
    factor is an error naming ``--reload``; the demo uses whatever TPC-H is loaded."""
    from sqldp import datasets

    marker = _MARKER[dataset]
    if _has_table(dsn, marker) and not force:
        name = _SCALED.get(dataset)
        loaded = _loaded_scale(dsn, dataset) if name else None
        if name and loaded != f"{scale:g}" and strict_scale:
            what = f"scale factor {loaded}" if loaded else f"{name} of an unknown scale factor"
            raise InputError(f"{what} is loaded, not {scale:g}; pass --reload to replace it", where="--scale")
        print(f"{dataset}: already loaded (use --reload to load again)", file=sys.stderr)
        return
    t0 = time.perf_counter()

    def phase(text: str) -> None:
        # the clock runs from the start of the load: each phase line says how long the load has taken so far
        print(f"  {text} … ({time.perf_counter() - t0:.1f} s since the start)", file=sys.stderr, flush=True)

    if dataset in _SCALED:
        if dataset == "tpch":
            print(f"loading TPC-H at scale factor {scale:g} (tpchgen-cli, COPY)", file=sys.stderr)
            counts = datasets.load_tpch(dsn, scale, progress=Progress(), replace=force, phase=phase)
        else:
            print(f"loading TPC-DS at scale factor {scale:g} (DuckDB's dsdgen, COPY)", file=sys.stderr)
            counts = datasets.load_tpcds(dsn, scale, progress=Progress(), replace=force, phase=phase)
        with connect(dsn) as conn:  # which scale is loaded, for the next `load` (a table comment)
            conn.execute(f"COMMENT ON TABLE public.{marker} IS 'sqldp {dataset} scale {scale:g}'")
    else:
        counts = datasets.load_cafeteria(dsn, replace=force)
    total = sum(counts.values())
    print(f"{dataset}: {total} rows, {time.perf_counter() - t0:.1f} s in total", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("demo", help="load example data into the embedded database and answer a few queries")
    p.add_argument("--dsn", help="use this database instead of the embedded one")
    p.add_argument("--data-dir", help="embedded server home")
    p.add_argument("--scale", type=float, default=0.01, help="TPC-H scale factor (default 0.01)")
    p.add_argument("--epsilon", type=float, default=1.0, help="ε per query (default 1)")
    p.add_argument("--reload", action="store_true", help="drop and load the data again")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=run_demo)

    lp = sub.add_parser("load", help="load an example data set (tpch, tpcds or cafeteria)")
    lp.add_argument("dataset", choices=("tpch", "tpcds", "cafeteria"))
    lp.add_argument("--dsn")
    lp.add_argument("--data-dir")
    lp.add_argument("--scale", type=float, default=0.01, help="TPC-H or TPC-DS scale factor (default 0.01)")
    lp.add_argument("--reload", action="store_true", help="drop and load again")
    lp.add_argument(
        "--engine",
        choices=tuple(ENGINES),
        default=DEFAULT_ENGINE,
        help="spark: write TPC-H as Parquet (tpchgen-cli) for sqldp run --engine spark",
    )
    lp.add_argument("--spark-data", metavar="DIR", help="spark: the directory to write (default: $SQLDP_HOME/spark)")
    lp.add_argument("--spark-master", metavar="URL", help="spark: the master that checks the files (default local[*])")
    lp.set_defaults(func=run_load)


# after the demo, where to go: the data stays loaded, so the README's first query answers at once
NEXT = """
== what next
   sqldp run --policy tpch "SELECT o_orderpriority, COUNT(*) FROM orders GROUP BY 1"   # your own query
   sqldp analyze --policy tpch -f q.sql       # how it would be answered, before anything is read or spent
   How to read ± and the confidence: the README, "One query, and how to read its answer"; the Python
   library and notebooks: docs/output.md; a budget for these runs: sqldp run --budget FILE (docs/output.md)."""


def _check_scale(scale: float) -> None:
    if not 0 < scale <= 100:
        raise InputError(f"scale factor must be in (0, 100], got {scale}", where="--scale")


def run_load(args: argparse.Namespace) -> int:
    _check_scale(args.scale)
    package = command_line(args.engine)
    if hasattr(package, "load"):  # an engine that loads a data set its own way (Spark: Parquet and its DDL)
        return int(package.load(args))
    load(resolve_dsn(args.dsn, args.data_dir), args.dataset, args.scale, force=args.reload, strict_scale=True)
    return 0


def run_demo(args: argparse.Namespace) -> int:
    import sqldp
    from sqldp.datasets import dataset_path

    _check_scale(args.scale)
    dsn = resolve_dsn(args.dsn, args.data_dir)
    load(dsn, "cafeteria", args.scale, force=args.reload)
    load(dsn, "tpch", args.scale, force=args.reload)
    sessions = {name: sqldp.connect(dsn, dataset_path(f"{name}.toml")) for name in ("cafeteria", "tpch")}
    outputs = []
    for dataset, sql, title in DEMO_QUERIES:
        try:
            result = sessions[dataset].run(sql, epsilon=args.epsilon).to_json()
        except RefusedError as err:  # the demo shows refusals as a user would see them
            result = {"query": sql, "refused": str(err)}
        outputs.append({"title": title, **result})
        if args.format == "text":
            print(f"\n== {title}\n   {sql}")
            text = f"refused: {result['refused']}" if "refused" in result else format_text(result)
            print("   " + text.replace("\n", "\n   "))
    if args.format == "text":
        print(NEXT)
    if args.format == "json":
        emit(args, {"demo": outputs}, lambda p: "")
    return 0
