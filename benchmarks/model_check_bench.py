"""The model-checking global sensitivity (NR §3.3.13) on the TPC-H queries and on NR §4.3.6.1's modified Q10.

For every unmodified TPC-H query that is one join–filter–group block, join–filter derived tables in FROM
inlined (Q7–Q9; subqueries in WHERE, aggregated derived tables and views need the workflow transformations of
NR §4.3.6.1), the global sensitivity w.r.t. each table it reads: of the result
(Ψ over the group keys for GROUP BY; an ungrouped aggregate returns one row, NR §3.3.13.8 "Aggregation
queries") and of the join rows (Φ: what a COUNT over the join moves). Then modified Q10 (o_orderdate added
to SELECT and GROUP BY, the interval N days) for N = 1 … 50, w.r.t. customer, beside NR Table 21 and
§4.3.6.3 (the i5-2520M of NR; NAPLES stopped at about N = 9).

Run: ``python benchmarks/model_check_bench.py [--out benchmarks/results/model_check.md]``. No database.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine
from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.sensitivity import model_check as mc

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "benchmarks" / "tpch" / "queries"
CATALOG = Catalog.from_file(ROOT / "sqldp" / "data" / "schemas" / "tpch.sql")
# NR Table 21: total analyser time per query's workflow, seconds (i5-2520M)
NR_TABLE_21 = {"Q1": 0.134, "Q3": 0.256, "Q5": 0.558, "Q6": 0.080, "Q10": 0.357, "Q12": 0.324, "Q19": 0.153}
Q10_BY_DAY = """
SELECT c_custkey, c_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, c_address,
       c_phone, c_comment, o_orderdate
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01'
  AND o_orderdate < DATE '1993-10-01' + INTERVAL '{n}' DAY AND l_returnflag = 'R' AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment, o_orderdate
"""


def fmt(v: float) -> str:
    return "∞" if math.isinf(v) else f"{v:g}"


def tpch(lines: list[str]) -> float:
    lines += [
        "## The 22 TPC-H queries",
        "",
        "| query | table | result rows | join rows | method | exact | time (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    total = nr_total = 0.0
    for path in sorted(QUERIES.glob("q*.sql")):
        name = f"Q{int(path.stem[1:])}"
        try:
            parsed = parse(path.read_text(), CATALOG)
            spj = mc.from_select(parsed.tree)  # type: ignore[arg-type]
        except ValueError:  # subqueries, views: the workflow transformations are a later step
            lines.append(f"| {name} | — | subqueries: needs the workflow transformations (NR §4.3.6.1) | | | | |")
            continue
        grouped = parsed.tree.args.get("group") is not None
        aggregated = parsed.tree.find(exp.AggFunc) is not None
        bag = mc.SPJ(spj.uses, spj.conditions)
        for table in dict.fromkeys(u.table for u in spj.uses):
            t0 = time.perf_counter()
            rows = mc.sensitivity(bag, CATALOG, table)
            if grouped or not aggregated:
                result = mc.sensitivity(spj, CATALOG, table) if grouped else rows
                value = result.value
            else:  # one output row, which changes iff some join row does
                result, value = rows, min(rows.value, 1.0)
            seconds = time.perf_counter() - t0
            total += seconds
            nr_total += seconds if name in NR_TABLE_21 else 0.0
            limit = " (time limit)" if result.timed_out or rows.timed_out else ""
            lines.append(
                f"| {name} | {table} | {fmt(value)} | {fmt(rows.value)} | {result.method}{limit} | "
                f"{'yes' if result.exact else 'bound'} | {seconds:.3f} |"
            )
    lines += [
        "",
        f"Total: {total:.2f} s for every query analysed; {nr_total:.2f} s for "
        f"{', '.join(NR_TABLE_21)} (NR Table 21, the same queries: {sum(NR_TABLE_21.values()):.2f} s on an "
        "i5-2520M).",
        "",
    ]
    return total


def q10(lines: list[str], ns: list[int]) -> None:
    lines += [
        "## Modified Q10 (NR §4.3.6.1): N-day window, per-day groups, w.r.t. customer",
        "",
        "| N | sensitivity | exact | time (s) |",
        "|---|---|---|---|",
    ]
    for n in ns:
        spj = mc.from_select(parse(Q10_BY_DAY.format(n=n), CATALOG).tree)  # type: ignore[arg-type]
        t0 = time.perf_counter()
        r = mc.sensitivity(spj, CATALOG, "customer", timeout=5)
        lines.append(f"| {n} | {fmt(r.value)} | {'yes' if r.exact else 'bound'} | {time.perf_counter() - t0:.2f} |")
    lines += ["", "NR §4.3.6.3: under 5 s for N ≤ 7; no answer within 5 minutes for most N = 9.", ""]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--max-n", type=int, default=50)
    args = ap.parse_args()
    lines = [
        "# Model-checking global sensitivity (NR §3.3.13)",
        "",
        f"Machine: {machine()}, load average {os.getloadavg()[0]:.1f} at the start (shared with other work).",
        "Command: `python benchmarks/model_check_bench.py --out benchmarks/results/model_check.md`. Per (query,",
        "table) time limit 5 s; a limit reached gives the bound proven by then (∞ if none) and says so.",
        "",
    ]
    tpch(lines)
    ns = [n for n in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 15, 20, 25, 30, 40, 50) if n <= args.max_n]
    q10(lines, ns)
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
