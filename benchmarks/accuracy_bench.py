"""Accuracy against the peers: median |error| of sqldp's answers on TPC-H under row-level privacy.

For each query: the true answer (plain PostgreSQL), ``--runs`` noisy answers at ε = 1 (median |noisy − true|
over the released values), the expected |error| from the noise scale (Laplace: scale; generalized Cauchy(4):
its mean |η|·scale = scale), and the mechanism sqldp chose. A second table runs the queries that release
many values under (ε = 1, δ = 10⁻⁶), where sqldp may choose one Gaussian vector (sqldp.release.gaussian), with
the expected median |noise| of the mechanism it did not choose beside it; a third reads what the orders
self-join's declared contribution bound τ costs in noise and in bias. The peer column is the figure the
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
from scipy import optimize, stats

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy
from sqldp.result import GAUSSIAN

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


MODES = ["AIR", "FOB", "MAIL", "RAIL", "REG AIR", "SHIP", "TRUCK"]
# a pivot table: per return flag, four measures per ship mode (28 values per group)
PIVOT = (
    "SELECT l_returnflag, "
    + ", ".join(
        f"SUM(CASE WHEN l_shipmode = '{m}' THEN {e} ELSE 0 END) AS {n}_{m.replace(' ', '_').lower()}"
        for m in MODES
        for n, e in (("n", "1"), ("qty", "l_quantity"), ("price", "l_extendedprice"), ("disc", "l_discount"))
    )
    + " FROM lineitem GROUP BY l_returnflag"
)
DELTA = 1e-6
APPROXIMATE = {"epsilon": 1.0, "delta": DELTA, "mechanism": "laplace"}
# (name, SQL): the many-value queries, under (ε = 1, δ = 10⁻⁶)
DELTA_CASES: list[tuple[str, str]] = [
    ("TPC-H Q1 (unmodified), all values", (QUERIES / "q01.sql").read_text()),
    ("GROUP BY o_orderpriority COUNT", "SELECT o_orderpriority, COUNT(*) FROM orders GROUP BY o_orderpriority"),
    ("GROUP BY l_returnflag COUNT", "SELECT l_returnflag, COUNT(*) FROM lineitem GROUP BY l_returnflag"),
    ("pivot: 4 measures × 7 ship modes by l_returnflag", PIVOT),
]
SELF_JOIN_TRUNCATED = """
WITH o AS (
  SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY o_custkey ORDER BY o_orderkey) AS rn FROM orders) t
  WHERE rn <= %(tau)s
)
SELECT COUNT(*) FROM o o1, o o2 WHERE o1.o_custkey = o2.o_custkey AND o1.o_orderkey < 100
"""
SELF_JOIN = "SELECT COUNT(*) FROM orders o1, orders o2 WHERE o1.o_custkey = o2.o_custkey AND o1.o_orderkey < 100"


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
    name: str,
    sql: str,
    peer: float | None,
    column: str | None,
    conn: psycopg.Connection,
    session: Any,
    runs: int,
    privacy: dict[str, Any] | None = None,
) -> list[Any]:
    privacy = privacy or {}
    try:
        first = session.run(sql, audit=True, **privacy)
    except sqldp.errors.SqldpError as err:
        return [name, "refused: " + str(err).splitlines()[0][:80], None, None, None, peer, None]
    names, plain = _plain(conn, sql)
    errors: list[float] = []
    relative: list[float] = []
    for _ in range(runs):
        for got, true in _pairs(session.run(sql, **privacy), names, plain, column):
            errors.append(abs(got - true))
            if true:
                relative.append(abs(got - true) / abs(true))
    used = sorted({m.mechanism for g in first.measurements for m in g})
    noisiest = max((m for g in first.measurements for m in g), key=lambda m: m.noise_scale)
    expected = _median_noise(noisiest.mechanism) * noisiest.noise_scale
    median = statistics.median(errors)
    rel = statistics.median(relative) if relative else None
    return [name, ", ".join(used), median, expected, rel, peer, median / peer if peer else None]


def _median_noise(mechanism: str) -> float:
    """The median of |noise| per unit of scale: ln 2 for Laplace, G⁻¹(½) for GenCauchy(4), Φ⁻¹(¾) for N(0, 1)."""
    if mechanism == "cauchy":
        return mechanisms.gencauchy_abs_quantile(0.5)
    if mechanism == GAUSSIAN:
        return mechanisms.gaussian_abs_quantile(0.5)
    return math.log(2)


def bench_delta(name: str, sql: str, conn: psycopg.Connection, session: Any, runs: int) -> list[Any]:
    """One many-value query under (ε = 1, δ = 10⁻⁶): the row of :func:`bench`, and the expected median |noise|
    of the noisiest measurement under the mechanism sqldp did not choose (Laplace at ε/k each, or the Gaussian
    vector at σ = c·√k·σ₁; sqldp.mechanisms.gaussian_wins), from the same bound c."""
    row = bench(name, sql, None, None, conn, session, runs, APPROXIMATE)
    first = session.analyze(sql, **APPROXIMATE)
    k = len(first.measurements[0])
    noisiest = max((m for g in first.measurements for m in g), key=lambda m: m.noise_scale)
    c, eps = noisiest.sensitivity, APPROXIMATE["epsilon"]
    if noisiest.mechanism == GAUSSIAN:
        other = _median_noise("laplace") * c * k / eps
    else:
        other = _median_noise(GAUSSIAN) * c * math.sqrt(k) * mechanisms.gaussian_sigma(eps, DELTA)
    return [row[0], row[1], k, row[2], row[3], other, row[3] / other if other else None]


def _median_abs(bias: float, scale: float) -> float:
    """The median of |bias + Lap(scale)|: the m with P(−m − bias ≤ X ≤ m − bias) = ½."""
    dist = stats.laplace(scale=scale)
    return float(optimize.brentq(lambda m: dist.cdf(m - bias) - dist.cdf(-m - bias) - 0.5, 0.0, abs(bias) + 50 * scale))


def self_join_taus(conn: psycopg.Connection, taus: list[int]) -> list[list[Any]]:
    """The orders self-join under a declared bound τ of orders per o_custkey: its Laplace sensitivity 2τ − 1 (one
    added row in and one evicted, docs/truncation.md), the pairs the truncation cuts (a data-dependent figure
    for this report only: sqldp never reads it) and the median |error| of bias + noise at ε = 1."""
    full = conn.execute(SELF_JOIN).fetchone()[0]
    out = []
    for tau in taus:
        kept = conn.execute(SELF_JOIN_TRUNCATED, {"tau": tau}).fetchone()[0]
        sens = 2 * tau - 1
        out.append([tau, sens, math.log(2) * sens, full - kept, _median_abs(full - kept, sens)])
    return out


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
    delta_rows = []
    with psycopg.connect(dsn) as conn:
        for name, sql, peer, column in CASES:
            rows.append(bench(name, sql, peer, column, conn, session, args.runs))
            print(rows[-1], file=sys.stderr)
        for name, sql in DELTA_CASES:
            delta_rows.append(bench_delta(name, sql, conn, session, args.runs))
            print(delta_rows[-1], file=sys.stderr)
        taus = self_join_taus(conn, [14, 18, 20, 21, 22, 24, 26, 28, 32])
    header = [
        "query", "mechanism", "median abs error", "expected median abs noise (noisiest measurement)",
        "median relative error", "peer", "ratio",
    ]  # fmt: skip
    delta_header = [
        "query", "mechanism", "k", "median abs error", "expected median abs noise (noisiest)",
        "other mechanism's expected", "ratio",
    ]  # fmt: skip
    best = min(taus, key=lambda t: t[4])
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
            "## Many values under (ε = 1, δ = 10⁻⁶): Laplace at ε/k each or one Gaussian vector",
            "",
            "`--mechanism laplace --delta 1e-6`. Where every bound is global, sqldp compares, from ε, δ and the",
            "number k of values released together only, the median |noise| of Laplace at ε/k each (ln 2·k·c/ε)",
            "with that of one analytic Gaussian vector (Balle & Wang, ICML 2018) over every c_i-scaled value",
            "(Φ⁻¹(¾)·√k·σ₁·c, σ₁ = 4.2247 at ε = 1, δ = 10⁻⁶): the Gaussian wins from k = 17 on. Q1 releases",
            "k = 11 values per group (its AVGs are centred SUMs over COUNTs) and keeps Laplace (the Gaussian",
            "would be 1.24× noisier); a one-aggregate histogram is k = 1 (its groups already share ε through",
            "the ℓ1 bound) and keeps Laplace (the Gaussian would be 4.1× noisier); the pivot (k = 28) takes the",
            "Gaussian. `other` is the expected median |noise| of the noisiest measurement under the mechanism",
            "not chosen, from the same bound.",
            "",
            markdown_table(delta_header, delta_rows),
            "",
            "## The orders self-join: the declared τ in noise and bias",
            "",
            "The peer's 28.5 is the median |noise| of Laplace at sensitivity 28.5/ln 2 ≈ 41, i.e. 2τ − 1 with",
            "τ ≈ 21 orders per customer (or a bound of ≈ 41 pairs per added order, however obtained); sqldp's",
            "policy declares τ = 28 (sensitivity 55). A smaller τ has less noise and cuts more pairs: the",
            "table reads both off the data for this report (the pairs cut are data-dependent: sqldp never",
            "reads them, nor picks τ from them). At ε = 1 one value gets no help from the Gaussian (k = 1),",
            "and the self-join's 2τ − 1 is attained (one added order joins itself and τ − 1 others both ways),",
            "so no sound choice of ours at τ = 28 reaches 28.5. Nor does a smaller declared τ once its bias is",
            f"counted: the least median |error| below is {best[4]:.4g}, at τ = {best[0]} (a choice made here by",
            "looking at the data, which a policy may not do); the peer's 28.5 matches the noise alone at",
            "τ ≈ 21, which would cut the pairs shown.",
            "",
            markdown_table(
                ["τ", "sensitivity 2τ − 1", "median abs noise", "pairs cut (bias)", "median abs error"], taus
            ),
            "",
        ]
    )
    print(report)
    if args.out:
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
