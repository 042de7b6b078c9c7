"""Per-row budgets against the analyst-level budget (docs/budgets.md): an analyst asks a stream of COUNT and
SUM queries over rolling date windows of TPC-H orders; how many are answered at the same guarantee (every
row's privacy loss at most B), how long each answer takes, and what the ledger's writes cost.

The orders of the embedded TPC-H SF 0.01 database are copied into a database of this benchmark's own (the
ledger is written beside the data; the shared database stays untouched). Guarantee B = ``--budget``; every
query costs ε = ``--epsilon``. Analyst-level: ``Session(budget=B)`` and ``run`` until the budget refuses.
Per-row: ``row_epsilon = B`` and ``run_budgeted``, with the analyst-level account as the outer limit set far
above (it never binds here). Streams: disjoint weekly windows (each order in one window) and 4-week windows
sliding by a week (each order in four: rows run out, later answers exclude them and say so in the ledger).

    python benchmarks/budgets_bench.py [--budget 1] [--epsilon 0.5] [--out benchmarks/results/budgets.md]
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
from pathlib import Path

import psycopg
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import machine

import sqldp
from sqldp.db import resolve_dsn
from sqldp.errors import BudgetExhaustedError
from sqldp.policy import Policy

NAME = "sqldp_bench_budgets"
DDL = """
CREATE TABLE orders (o_orderkey integer PRIMARY KEY, o_custkey integer NOT NULL, o_orderstatus char(1) NOT NULL,
                     o_totalprice numeric(15, 2) NOT NULL, o_orderdate date NOT NULL)
"""
COLUMNS = "o_orderkey, o_custkey, o_orderstatus, o_totalprice, o_orderdate"
FIRST, LAST = dt.date(1992, 1, 1), dt.date(1998, 8, 3)

POLICY = """
[defaults]
epsilon = {epsilon}
mechanism = "laplace"
delta = 1e-9

[tables.orders]
rows = "private"
{budget}

[tables.orders.columns.o_totalprice]
range = [810.00, 793422.00]
"""


def database(server: str) -> str:
    """This benchmark's database: the embedded TPC-H orders, copied once; the ledger dropped at every run."""
    params = psycopg.conninfo.conninfo_to_dict(server)
    with psycopg.connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (NAME,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(NAME)))
    params["dbname"] = NAME
    target = psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(target, autocommit=True) as conn:
        if conn.execute("SELECT to_regclass('public.orders')").fetchone() == (None,):
            conn.execute(DDL)
            with (
                psycopg.connect(server) as source,
                source.cursor().copy(f"COPY (SELECT {COLUMNS} FROM orders) TO STDOUT") as out,
                conn.cursor().copy(f"COPY orders ({COLUMNS}) FROM STDIN") as into,
            ):
                for block in out:
                    into.write(block)
            conn.execute("ANALYZE orders")
        conn.execute('DROP TABLE IF EXISTS sqldp."row_budget_orders"')
    return target


def windows(days: int, step: int) -> list[tuple[dt.date, dt.date]]:
    out, lo = [], FIRST
    while lo < LAST:
        out.append((lo, lo + dt.timedelta(days=days)))
        lo += dt.timedelta(days=step)
    return out


def query(i: int, lo: dt.date, hi: dt.date) -> str:
    what = "COUNT(*)" if i % 2 == 0 else "SUM(o_totalprice)"
    return f"SELECT {what} FROM orders WHERE o_orderdate >= DATE '{lo}' AND o_orderdate < DATE '{hi}'"


def ledger_stats(dsn: str) -> tuple[int, int, float]:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), pg_total_relation_size('sqldp.\"row_budget_orders\"'), coalesce(max(spent), 0) "
            'FROM sqldp."row_budget_orders"'
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), float(row[2])


def exact(dsn: str, lo: dt.date, hi: dt.date, b: float, eps: float) -> tuple[int, int]:
    """The data owner's count of a window's used rows and of those excluded (not released: the benchmark's)."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE l.spent + %s > %s) FROM orders o "
            'LEFT JOIN sqldp."row_budget_orders" l USING (o_orderkey) WHERE o_orderdate >= %s AND o_orderdate < %s',
            (eps, b, lo, hi),
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def per_row(dsn: str, stream: list[tuple[dt.date, dt.date]], b: float, eps: float) -> dict[str, float]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('DROP TABLE IF EXISTS sqldp."row_budget_orders"')
    policy = POLICY.format(epsilon=eps, budget=f'budget = "per-row"\nrow_epsilon = {b}')
    session = sqldp.connect(dsn, Policy.from_toml(policy), budget=1e6, seed=1)
    session.run_budgeted(query(0, *stream[0]))  # warm-up: the ledger's creation, the analysis cache
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('DROP TABLE IF EXISTS sqldp."row_budget_orders"')
    session._ledgers.clear()
    session.run_budgeted(query(0, *stream[0]))  # the ledger created again, outside the timed stream
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute('TRUNCATE sqldp."row_budget_orders"')
    times, ledger_times, answer_times, whole, partial, rows_written = [], [], [], 0, 0, 0
    for i, (lo, hi) in enumerate(stream):
        used, excluded = exact(dsn, lo, hi, b, eps)
        before = ledger_stats(dsn)
        t0 = time.perf_counter()
        result = session.run_budgeted(query(i, lo, hi))
        times.append(time.perf_counter() - t0)
        ledger_times.append(result.timings["ledger_transaction"])
        answer_times.append(result.timings["answer_query"])
        after = ledger_stats(dsn)
        rows_written += used - excluded
        assert after[2] <= b + 1e-9  # no row ever over its budget
        assert after[0] - before[0] <= used - excluded
        whole += excluded == 0
        partial += excluded > 0
    count, size, _ = ledger_stats(dsn)
    return {
        "answered": len(stream),
        "answered_all_rows": whole,
        "answered_some_excluded": partial,
        "median_ms": 1000 * statistics.median(times),
        "median_transaction_ms": 1000 * statistics.median(ledger_times),
        "median_statement_ms": 1000 * statistics.median(answer_times),
        "rows_charged_per_answer": rows_written / len(stream),
        "ledger_rows": count,
        "ledger_bytes": size,
    }


def analyst_level(dsn: str, stream: list[tuple[dt.date, dt.date]], b: float, eps: float) -> dict[str, float]:
    session = sqldp.connect(dsn, Policy.from_toml(POLICY.format(epsilon=eps, budget="")), budget=b, seed=1)
    warm = sqldp.connect(dsn, Policy.from_toml(POLICY.format(epsilon=eps, budget="")), seed=1)
    times = []
    for i, w in enumerate(stream[:50]):  # the time of a plain answer, without any budget
        t0 = time.perf_counter()
        warm.run(query(i, *w))
        times.append(time.perf_counter() - t0)
    answered = 0
    for i, w in enumerate(stream):
        try:
            session.run(query(i, *w))
        except BudgetExhaustedError:
            break
        answered += 1
    return {"answered": answered, "median_ms": 1000 * statistics.median(times[1:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=1.0, help="B: every row's loss at most B (default 1)")
    ap.add_argument("--epsilon", type=float, default=0.5, help="ε of each query (default 0.5)")
    ap.add_argument("--out", type=Path, default=None, help="write the markdown report here")
    args = ap.parse_args()
    dsn = database(resolve_dsn(None))
    streams = {"weekly, disjoint": windows(7, 7), "4 weeks sliding by 1 week": windows(28, 7)}
    lines = [
        "# Per-row budgets against the analyst-level budget",
        "",
        f"Machine: {machine()}. Command: `python benchmarks/budgets_bench.py --budget {args.budget:g} "
        f"--epsilon {args.epsilon:g}`. TPC-H SF 0.01 orders (15,000 rows) of the embedded database, copied into a "
        f"database of the benchmark's own. Guarantee: every row's loss ≤ B = {args.budget:g}; each query (COUNT and "
        f"SUM(o_totalprice) in turn, over o_orderdate windows from {FIRST} to {LAST}) costs ε = {args.epsilon:g}.",
        "",
        "| stream | queries | analyst-level answered | per-row answered | of which no row excluded | gain | "
        "ms/answer plain | ms/answer per-row | of which transaction | rows charged/answer | ledger rows | "
        "ledger size |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, stream in streams.items():
        plain = analyst_level(dsn, stream, args.budget, args.epsilon)
        rows = per_row(dsn, stream, args.budget, args.epsilon)
        gain = rows["answered_all_rows"] / max(1, plain["answered"])
        lines.append(
            f"| {name} | {len(stream)} | {plain['answered']:.0f} | {rows['answered']:.0f} | "
            f"{rows['answered_all_rows']:.0f} | {gain:.0f}× | {plain['median_ms']:.1f} | {rows['median_ms']:.1f} | "
            f"{rows['median_transaction_ms']:.1f} | {rows['rows_charged_per_answer']:.0f} | "
            f"{rows['ledger_rows']:.0f} | "
            f"{rows['ledger_bytes'] / 1024:.0f} KiB |"
        )
        print(lines[-1], flush=True)
    lines += [
        "",
        "Gain: answers with no row excluded, per-row, over answers the analyst-level budget gives (⌊B/ε⌋). "
        "ms/answer: median wall time of `Session.run` (no budget) and of `Session.run_budgeted`; the transaction "
        "is the one that answers and charges (advisory lock, the statement with its ledger INSERT … ON CONFLICT, "
        "COMMIT). Rows charged/answer: the ledger rows written by one answer (the used rows with room). On the "
        "sliding stream each order is in four windows and has room for two (B/ε): from the third window on, "
        "answers leave out the orders already spent (the ledger decides, inside the statement), so most answers "
        "are over part of their window — still every row's loss ≤ B.",
    ]
    text = "\n".join(lines) + "\n"
    if args.out:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
