"""Where the error of the value-level (per-column) TPC-H answers comes from: bias of the released function
against noise.

Under value-level privacy a private filter on a column whose grid is finer than the sigmoid's slope allows
(l_discount's 0.01, l_quantity's DECIMAL) is released as a sigmoid (NR §3.3.8.4–§3.3.8.5): the function the
noise is added to is not the raw query. For each query and policy, at ε = 1:

* plain: PostgreSQL's answer to the raw query file;
* bias: median over the released values of |f − plain| / |plain|, f the un-noised released function (each
  output expression evaluated on the measurements' true values, as ``tests/sensitivity/test_tpch_answers.py``);
* noise: median over ``--runs`` runs and the values of |noisy − f| / |plain|;
* error: median of |noisy − plain| / |plain| (what ``benchmarks/tpch22_bench.py`` reports);
* the mechanism, β and the sensitivity and noise scale of the first measurement (audit figures: this is a
  benchmark on public TPC-H data).

Values whose plain answer is 0 (or that the raw query does not return) are left out.

Usage: ``PYTHONPATH=. python benchmarks/value_bench.py --scale 0.01 [--runs 10] [--queries q06,q14]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import QUERIES, machine, markdown_table, report, tpch_database

import sqldp
from sqldp.form import AnalysisForm
from sqldp.groups import all_groups
from sqldp.postprocess import evaluate

POLICIES = ("tpch", "tpch_catalog")
DEFAULT = ("q06", "q14", "q12", "q04", "q19", "q22", "q17")


def _plain(v: Any) -> Any:
    if isinstance(v, str):
        return v.rstrip()
    if isinstance(v, Decimal):
        return float(v)
    return v


def _key(v: Any) -> Any:
    return v.rstrip() if isinstance(v, str) else float(v) if isinstance(v, (int, float, Decimal)) else v


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def measure(dsn: str, policy: str, name: str, runs: int) -> list[Any]:
    sql = (QUERIES / f"{name}.sql").read_text(encoding="utf-8")
    session = sqldp.connect(dsn, policy=policy)
    prepared: Any = session.prepare(sql, epsilon=1.0)
    # a workflow (Q22: its AVG subquery is a released step) is measured on its last step, whose groups are
    # declared; in audit mode the step's true value is used (tests/sensitivity/test_tpch_answers.py)
    last = getattr(prepared, "placeholder", prepared)
    form = last.form
    assert isinstance(form, AnalysisForm)
    with psycopg.connect(dsn) as conn:
        plain_rows = [tuple(_plain(v) for v in r) for r in conn.execute(sql).fetchall()]
        domains = []
        for d in last.domains:
            assert d.values is not None, "groups read from a public table: not measured here"
            domains.append(tuple(_plain(v) for v in d.values))
    outputs = form.outputs
    key_of = [i for i, o in enumerate(outputs) if o.is_key]
    result = prepared.analyze()
    groups = all_groups(domains) if form.group_by else [()]
    released: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    for g, measured in zip(groups, result.measurements, strict=True):
        values = [m.true_value for m in measured]
        row = tuple(g[o.group_key] if o.is_key else evaluate(o.expr, values) for o in outputs)
        released[tuple(_key(row[i]) for i in key_of)] = row
    truth = {tuple(_key(r[i]) for i in key_of): r for r in plain_rows}
    first = result.measurements[0][0]
    bias: list[float] = []
    for key, t_row in truth.items():
        f_row = released.get(key)
        for j in range(len(outputs)):
            t = t_row[j]
            if j in key_of or not isinstance(t, (int, float)) or t == 0 or f_row is None or f_row[j] is None:
                continue
            bias.append(abs(float(f_row[j]) - float(t)) / abs(float(t)))
    noise: list[float] = []
    error: list[float] = []
    for _ in range(runs):
        out = session.run(sql, epsilon=1.0)
        for r in out.rows:
            key = tuple(_key(v) for v in r.get("key", {}).values())
            t_row, f_row = truth.get(key), released.get(key)
            if t_row is None or f_row is None:
                continue
            for j, col in enumerate(out.columns):
                t, v = t_row[j], r["values"].get(col)
                if j in key_of or not isinstance(t, (int, float)) or t == 0 or v is None or f_row[j] is None:
                    continue
                noise.append(abs(float(v) - float(f_row[j])) / abs(float(t)))
                error.append(abs(float(v) - float(t)) / abs(float(t)))
    print(f"# {policy} {name}: bias {_median(bias)} noise {_median(noise)} error {_median(error)}", file=sys.stderr)
    return [
        name,
        policy,
        first.mechanism,
        first.beta,
        first.sensitivity,
        first.noise_scale,
        _median(bias),
        _median(noise),
        _median(error),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--queries", default=",".join(DEFAULT), help="comma-separated query files (default: %(default)s)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dsn = tpch_database(args.scale)
    rows = [measure(dsn, p, q, args.runs) for q in args.queries.split(",") for p in POLICIES]
    header = ["query", "policy", "mechanism", "β", "sensitivity", "noise scale", "bias", "noise", "error"]
    text = "\n".join(
        [
            f"SF {args.scale:g}, ε = 1, {args.runs} runs. {machine()} (shared). {dt.date.today()}. Command: "
            f"`PYTHONPATH=. python benchmarks/value_bench.py --scale {args.scale:g} --runs {args.runs}`",
            "",
            markdown_table(header, rows),
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
