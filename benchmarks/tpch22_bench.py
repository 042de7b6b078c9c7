"""The 22 unmodified TPC-H queries under both shipped TPC-H policies: what sqldp answers and how well.

For each query file in ``benchmarks/tpch/queries/`` and each policy (``tpch``: every table private but nation
and region; ``tpch_catalog``: customer, orders and lineitem private, the catalogue public), at ε = 1:

* answered (DP, or exactly where every table read is public) or the refusal's reason. A refusal that asks for
  δ > 0 (a private group key without a declared domain) is retried with Laplace and δ = 1e-6, DP partition
  selection, and marked so;
* the workflow steps (one statement until workflows land: each query here is one analysed step);
* the budget split: the aggregates' ε shares and how the groups share them (NR §3.3.10.4);
* the median relative error of the released values over ``--runs`` runs, against PostgreSQL's answer to the
  raw query (released rows matched to its rows by their keys; values whose true answer is 0 are left out);
* noisy/plain time: the median time of a noisy run over that of the raw query on PostgreSQL.

Usage: ``PYTHONPATH=. python benchmarks/tpch22_bench.py --scale 0.01 [--runs 10] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from decimal import Decimal
from typing import Any

import psycopg

import sqldp
from benchmarks.common import QUERIES, machine, markdown_table, median_time, report, tpch_database
from sqldp.errors import RefusedError

POLICIES = ("tpch", "tpch_catalog")
DELTA = 1e-6


def _plain_value(v: Any) -> Any:
    if isinstance(v, str):
        return v.rstrip()
    if isinstance(v, Decimal):
        return float(v)
    return v


def _released_key(v: Any) -> Any:
    return v.rstrip() if isinstance(v, str) else float(v) if isinstance(v, (int, float, Decimal)) else v


def _split(plan: list[dict[str, Any]] | None) -> str:
    if not plan:
        return ""
    eps = sorted({round(p["epsilon"], 6) for p in plan if p.get("epsilon") is not None})
    modes = sorted({p["groups"] for p in plan})
    shares = "/".join(f"{e:g}" for e in eps) if eps else "per group at run time"
    return f"{len(plan)} agg, ε {shares} each; {'; '.join(modes)}"


def _errors(result: Any, plain_rows: list[tuple], columns: list[str]) -> list[float]:
    """|released − true| / |true| per released value whose row matches a row of the raw answer."""
    n_keys = len(result.rows[0].get("key", {})) if result.rows else 0
    truth = {tuple(_released_key(v) for v in row[:n_keys]): row for row in plain_rows}
    out = []
    for r in result.rows:
        key = tuple(_released_key(v) for v in r.get("key", {}).values())
        true_row = truth.get(key)
        if true_row is None:
            continue
        for j, name in enumerate(columns[n_keys:], start=n_keys):
            v, t = r["values"].get(name), true_row[j]
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t != 0 and v is not None:
                out.append(abs(float(v) - float(t)) / abs(float(t)))
    return out


def bench(scale: float, runs: int, only: set[str] | None = None) -> list[list[Any]]:
    dsn = tpch_database(scale)
    rows: list[list[Any]] = []
    for policy in POLICIES:
        session = sqldp.connect(dsn, policy=policy)
        for path in sorted(QUERIES.glob("q*.sql")):
            if only is not None and path.stem not in only:
                continue
            sql = path.read_text(encoding="utf-8")
            privacy: dict[str, Any] = {"epsilon": 1.0}
            try:
                try:
                    prepared = session.prepare(sql, **privacy)
                except RefusedError as refusal:
                    if "δ > 0" not in str(refusal):
                        raise
                    privacy = {"epsilon": 1.0, "mechanism": "laplace", "delta": DELTA}
                    prepared = session.prepare(sql, **privacy)
            except RefusedError as refusal:
                rows.append([path.stem, policy, "refused: " + str(refusal)[:160], "", "", "", ""])
                continue
            with psycopg.connect(dsn) as conn:
                plain_rows = [tuple(_plain_value(v) for v in r) for r in conn.execute(sql).fetchall()]

            def plain(text: str = sql) -> None:
                with psycopg.connect(dsn) as conn:
                    conn.execute(text).fetchall()

            t_plain, _ = median_time(plain, repeat=5)
            t_noisy, _ = median_time(lambda s=sql, p=privacy, db=session: db.run(s, **p), repeat=5)
            if prepared.public:
                rows.append([path.stem, policy, "exact (public tables only)", 1, "", 0.0, t_noisy / t_plain])
                continue
            errors: list[float] = []
            for _ in range(runs):
                out = session.run(sql, **privacy)
                errors += _errors(out, plain_rows, out.columns)
            how = "DP" if "delta" not in privacy else f"DP, partition selection (δ = {DELTA:g})"
            split = _split(prepared.describe().plan)
            median = statistics.median(errors) if errors else None
            rows.append([path.stem, policy, how, 1, split, median, t_noisy / t_plain])
            print(f"# {policy} {path.stem}: {how}, error {median}", file=sys.stderr)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--out", default=None)
    ap.add_argument("--queries", default=None, help="comma-separated query files to run (default: all 22)")
    args = ap.parse_args()
    only = set(args.queries.split(",")) if args.queries else None
    rows = bench(args.scale, args.runs, only)
    header = ["query", "policy", "answered", "steps", "budget split", "median rel. error", "noisy/plain"]
    answered = {p: sum(1 for r in rows if r[1] == p and not str(r[2]).startswith("refused")) for p in POLICIES}
    ratios = [r[6] for r in rows if isinstance(r[6], float)]
    text = "\n".join(
        [
            f"# The 22 TPC-H queries, unmodified, SF {args.scale:g}",
            "",
            f"Machine: {machine()} (shared with other jobs: times are noisy). Date: {dt.date.today()}.",
            "",
            f"Command: `PYTHONPATH=. python benchmarks/tpch22_bench.py --scale {args.scale:g} --runs {args.runs}"
            f"{' --queries ' + args.queries if args.queries else ''}` "
            "(ε = 1; a refusal asking for δ > 0 is retried with Laplace, δ = 1e-6).",
            "",
            markdown_table(header, rows),
            "",
            "Answered: " + ", ".join(f"{p} {n} of {len({r[0] for r in rows})}" for p, n in answered.items()) + ". "
            f"noisy/plain median {statistics.median(ratios):.3g} over {len(ratios)} answered.",
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
