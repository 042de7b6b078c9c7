"""The 21 NAPLES TPC-H queries on the Spark engine (local[2]) beside the PostgreSQL engine, value-level policy
as in ``naples_bench.py`` (tpch.toml with all rows public), and the rows queries under the row-level policy
as in ``rows_bench.py`` (``benchmarks/tpch/policy_rows.toml``), ε = 1, β = 0.1.

For each query and engine: the plain query's time (Spark: the PostgreSQL text transpiled by sqlglot and
collected; PostgreSQL: a prepared statement), the noisy answer's time (``Session.run``, the analysis cached
after the first run), their ratio, and whether q_s is the same on both engines. Medians of ``--repeat`` runs
after a warm-up. The Parquet files are written once per scale under ``<SQLDP_HOME>/spark-bench-sf<scale>``.

    python benchmarks/spark_bench.py --scale 0.1 > benchmarks/results/spark.md

The medians of the noisy/plain ratios are over the NAPLES 21 and over the rows queries, per engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, like the other benchmarks

import sqlglot
from common import QUERIES, machine, markdown_table, median_time, tpch_database
from naples_bench import TABLE16, value_policy
from rows_bench import POLICY as ROWS_POLICY

import sqldp
from sqldp import datasets
from sqldp.db import connect, default_home
from sqldp.engine.spark.engine import local_settings, spark_session
from sqldp.errors import SqldpError
from sqldp.policy import Policy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--queries", nargs="+", metavar="NAME", help="only these queries (a partial run)")
    ap.add_argument("--suites", nargs="+", choices=("naples", "rows"), default=["naples", "rows"])
    ap.add_argument("--budget", type=float, help="seconds: start no query after this (the rest are marked)")
    ap.add_argument(
        "--spark-defaults",
        action="store_true",
        help="Spark's own settings instead of the ones sqldp gives a local session "
        "(sqldp.engine.spark.engine.local_settings)",
    )
    args = ap.parse_args()
    started = time.perf_counter()
    policy = value_policy()
    rows_policy = Policy.from_file(ROWS_POLICY)
    dsn = tpch_database(args.scale, None)
    conn = connect(dsn)
    directory = default_home() / f"spark-bench-sf{args.scale:g}".replace(".", "_")
    spark = spark_session("local[2]")
    if args.spark_defaults:  # the comparison in docs/spark.md, "Session settings"
        for key in local_settings("local[2]"):
            spark.conf.unset(key)
    settings = {k: spark.conf.get(k) for k in local_settings("local[2]")}
    print(f"# Spark settings: {settings}", file=sys.stderr, flush=True)
    if not (directory / datasets.SPARK_SCHEMA).is_file():
        datasets.load_tpch_spark(spark, args.scale, directory)
    views = datasets.register_parquet(spark, directory)
    schema = directory / datasets.SPARK_SCHEMA
    sessions = {
        "naples": (
            sqldp.connect(dsn, policy=policy, seed=7),
            sqldp.connect(policy=policy, schema=schema, seed=7, spark=spark, spark_tables=views),
        ),
        "rows": (
            sqldp.connect(dsn, policy=rows_policy, seed=7),
            sqldp.connect(policy=rows_policy, schema=schema, seed=7, spark=spark, spark_tables=views),
        ),
    }
    listed = [(suite, p) for suite in args.suites for p in sorted((QUERIES / suite).glob("q*.sql"))]
    if args.queries:
        listed = [(s, p) for s, p in listed if p.stem in args.queries or f"{s}/{p.stem}" in args.queries]
    rows: list[list[Any]] = []
    ratios: dict[str, tuple[list[float], list[float]]] = {"naples": ([], []), "rows": ([], [])}
    for suite, path in listed:
        name = f"{suite}/{path.stem}"
        pg, sk = sessions[suite]
        if args.budget is not None and time.perf_counter() - started > args.budget:
            rows.append([name, None, None, None, None, None, None, None, "not run: --budget spent"])
            continue
        text = path.read_text(encoding="utf-8").rstrip().rstrip(";")
        spark_text = sqlglot.transpile(text, read="postgres", write="spark")[0]
        try:
            t_pg, _ = median_time(lambda q=text: conn.execute(q, prepare=True).fetchall(), args.repeat)
            n_pg, res_pg = median_time(lambda q=text, s=pg: s.run(q, epsilon=1.0, beta=0.1), args.repeat)
            t_sk, _ = median_time(lambda q=spark_text: spark.sql(q).collect(), args.repeat)
            n_sk, res_sk = median_time(lambda q=text, s=sk: s.run(q, epsilon=1.0, beta=0.1), args.repeat)
        except SqldpError as exc:
            rows.append([name, None, None, None, None, None, None, None, str(exc)[:80]])
            continue
        qs_pg = res_pg.to_json(audit=True).get("sensitivity")
        qs_sk = res_sk.to_json(audit=True).get("sensitivity")
        same = qs_pg == qs_sk or (
            qs_pg is not None
            and qs_sk is not None
            and abs(float(qs_pg) - float(qs_sk)) <= 1e-9 * max(1.0, abs(float(qs_pg)))
        )
        if suite == "rows" or path.stem in TABLE16:
            ratios[suite][0].append(n_sk / t_sk)
            ratios[suite][1].append(n_pg / t_pg)
        rows.append([name, t_sk * 1e3, n_sk * 1e3, n_sk / t_sk, t_pg * 1e3, n_pg * 1e3, n_pg / t_pg, same, ""])
        print(f"# {rows[-1]} at {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    header = ["query", "Spark plain ms", "Spark noisy ms", "Spark ratio", "PG plain ms", "PG noisy ms", "PG ratio"]
    print(f"# NAPLES and rows queries on Spark local[2] and PostgreSQL, SF {args.scale:g}\n")
    print(f"Spark settings: {', '.join(f'`{k}` = {v}' for k, v in settings.items())}.\n")
    command = f"python benchmarks/spark_bench.py --scale {args.scale:g} --repeat {args.repeat}"
    command += f" --budget {args.budget:g}" if args.budget is not None else ""
    command += "" if args.suites == ["naples", "rows"] else " --suites " + " ".join(args.suites)
    command += " --spark-defaults" if args.spark_defaults else ""
    print(f"Machine: {machine()}. Command: `{command}`.\n")
    print(markdown_table([*header, "q_s equal", "note"], rows))
    for suite, (spark_ratios, pg_ratios) in ratios.items():
        if spark_ratios:
            print(
                f"\n{suite}: noisy/plain median Spark {statistics.median(spark_ratios):.2f}, "
                f"PostgreSQL {statistics.median(pg_ratios):.2f} over {len(spark_ratios)} queries."
            )
    print(f"\n{time.perf_counter() - started:.0f} s in all.")


if __name__ == "__main__":
    main()
