"""Accuracy against the peers: median |error| of sqldp's answers on TPC-H under row-level privacy.

For each query: the true answer (plain PostgreSQL), ``--runs`` noisy answers at ε = 1 (median |noisy − true|
over the released values), the expected |error| from the noise scale (Laplace: scale; generalized Cauchy(4):
its mean |η|·scale = scale), and the mechanism sqldp chose. The peer column is the figure the
"as little noise as the guarantee allows" issue measured for the best of Tumult Analytics and SmartNoise SQL
on the same queries (TPC-H SF 0.01, ε = 1, same clamping ranges, row-level privacy); it is quoted, not
re-run here (neither peer is installed by this project).

    python benchmarks/accuracy_bench.py --scale 0.01 --runs 20 --out benchmarks/results/accuracy.md
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QUERIES, ROOT, machine, markdown_table, tpch_database

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy

POLICY = ROOT / "benchmarks" / "tpch" / "policy_rows.toml"
OUT = ROOT / "benchmarks" / "results" / "accuracy.md"

# (name, SQL, the peer's median |error| from the issue, or None, and the one output column measured, or None
# for all). The issue measured sqldp before the mechanism choice at 3.11, 137, 46, 89, 0.0106 and 30,700 on the
# first six, and Q12's high_line_count at 3,390 (5,400 %) against the peer's 21.5 (35 %).
CASES: list[tuple[str, str, float | None, str | None]] = [
    ("COUNT orders with a filter", "SELECT COUNT(*) FROM orders WHERE o_orderstatus = 'F'", 1.0, None),
    ("SUM(l_quantity), range [1, 50]", "SELECT SUM(l_quantity) FROM lineitem", 26.0, None),
    ("lineitem ⋈ orders COUNT", "SELECT COUNT(*) FROM lineitem, orders WHERE l_orderkey = o_orderkey", 17.0, None),
    (
        "orders self-join COUNT",
        "SELECT COUNT(*) FROM orders o1, orders o2 WHERE o1.o_custkey = o2.o_custkey AND o1.o_orderkey < 100",
        28.5,
        None,
    ),
    ("AVG(l_quantity)", "SELECT AVG(l_quantity) FROM lineitem", 0.0014, None),
    ("TPC-H Q6 revenue (unmodified)", (QUERIES / "q06.sql").read_text(), 11_000.0, None),
    ("TPC-H Q12 (unmodified), all values", (QUERIES / "q12.sql").read_text(), None, None),
    ("TPC-H Q12 high_line_count", (QUERIES / "q12.sql").read_text(), 21.5, "high_line_count"),
    (
        "GROUP BY o_orderpriority COUNT",
        "SELECT o_orderpriority, COUNT(*) FROM orders GROUP BY o_orderpriority",
        None,
        None,
    ),
    ("GROUP BY l_returnflag COUNT", "SELECT l_returnflag, COUNT(*) FROM lineitem GROUP BY l_returnflag", None, None),
    ("TPC-H Q1 (unmodified), all values", (QUERIES / "q01.sql").read_text(), None, None),
]


def _plain(conn: psycopg.Connection, sql: str) -> tuple[list[str], list[tuple[Any, ...]]]:
    cur = conn.execute(sql.rstrip().rstrip(";"))
    return [d.name for d in cur.description or ()], cur.fetchall()


def _pairs(
    result: Any, names: list[str], plain: list[tuple[Any, ...]], column: str | None = None
) -> list[tuple[float, float]]:
    """(released, true) for every released value (of ``column`` only, if given), matched by group key (a
    declared group with no rows in the data has true COUNT/SUM 0; the released order is the domain's, not
    PostgreSQL's)."""
    truth: dict[tuple[str, ...], dict[str, Any]] = {}
    for row in plain:
        named = dict(zip(names, row, strict=True))
        keys = tuple(str(named[k]).strip() for k in (result.rows[0].get("key", {}) if result.rows else {}))
        truth[keys] = named
    out = []
    for row in result.rows:
        keys = tuple(str(v).strip() for v in row.get("key", {}).values())
        for name, value in row["values"].items():
            if column is not None and name != column:
                continue
            true = truth.get(keys, {}).get(name)
            if value is not None:
                out.append((float(value), float(true) if true is not None else 0.0))
    return out


def bench(
    name: str, sql: str, peer: float | None, column: str | None, conn: psycopg.Connection, session: Any, runs: int
) -> list[Any]:
    try:
        first = session.run(sql, audit=True)
    except sqldp.errors.SqldpError as err:
        return [name, "refused: " + str(err).splitlines()[0][:80], None, None, None, peer, None]
    names, plain = _plain(conn, sql)
    errors: list[float] = []
    relative: list[float] = []
    for _ in range(runs):
        for got, true in _pairs(session.run(sql), names, plain, column):
            errors.append(abs(got - true))
            if true:
                relative.append(abs(got - true) / abs(true))
    used = sorted({m.mechanism for g in first.measurements for m in g})
    noisiest = max((m for g in first.measurements for m in g), key=lambda m: m.noise_scale)
    # the median of |noise| at the largest scale: ln 2 · scale for Laplace, G⁻¹(½) · scale for GenCauchy(4)
    unit = math.log(2) if noisiest.mechanism != "cauchy" else mechanisms.gencauchy_abs_quantile(0.5)
    expected = unit * noisiest.noise_scale
    median = statistics.median(errors)
    rel = statistics.median(relative) if relative else None
    return [name, ", ".join(used), median, expected, rel, peer, median / peer if peer else None]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--dsn", default=None, help="PostgreSQL server (default: the embedded one)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dsn = tpch_database(args.scale, args.dsn)
    session = sqldp.connect(dsn, Policy.from_file(POLICY))
    rows = []
    t0 = time.perf_counter()
    with psycopg.connect(dsn) as conn:
        for name, sql, peer, column in CASES:
            rows.append(bench(name, sql, peer, column, conn, session, args.runs))
            print(rows[-1], file=sys.stderr)
    header = [
        "query", "mechanism", "median abs error", "expected median abs noise (noisiest measurement)",
        "median relative error", "peer", "ratio",
    ]  # fmt: skip
    report = "\n".join(
        [
            f"# Accuracy at ε = 1, TPC-H SF {args.scale:g}, row-level privacy (`benchmarks/tpch/policy_rows.toml`)",
            "",
            f"{dt.date.today().isoformat()} · {machine()} · {args.runs} runs per query · "
            f"{time.perf_counter() - t0:.0f} s",
            f"`python benchmarks/accuracy_bench.py --scale {args.scale:g} --runs {args.runs}`",
            "",
            "median |error| over every released value of every run; `peer` is the best of Tumult Analytics",
            "and SmartNoise SQL as measured for the issue (not re-run here); ratio = sqldp / peer. Before",
            "this benchmark's changes the issue measured sqldp at 3.11, 137, 46, 89, 0.0106 and 30,700 on the",
            "first six rows (generalized Cauchy throughout) and 3,390 on Q12's high_line_count. The expected",
            "column is the median |noise| of the noisiest measurement (for AVG and Q1 a SUM, before the",
            "division by the noisy count). Timings are of a machine shared with other work.",
            "",
            "The joins use the policy's declared contribution bounds (`max_rows_per`, docs/truncation.md):",
            "lineitem ≤ 7 rows per l_orderkey (true by the TPC-H spec: nothing is cut) and orders ≤ 28 rows",
            "per o_custkey (a choice: the spec does not bound it; the data have up to 32 at SF 0.01, so the",
            "self-join's answer is computed on truncated orders, 467 of its 469 pairs, and the error column",
            "counts that bias). SUM(l_quantity) is Laplace at sensitivity 50, as the peer's: its expected",
            "median |noise| is 50·ln 2 = 34.66; the peer's 26 is the median of 20 runs, whose standard error",
            "is ≈ b/√20 ≈ 11, so the two agree.",
            "",
            markdown_table(header, rows),
            "",
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
