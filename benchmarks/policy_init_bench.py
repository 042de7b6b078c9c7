"""How many shipped benchmark queries answer under a policy `sqldp policy init` writes, against the hand-written one.

For TPC-H (the 22 queries of ``benchmarks/tpch/queries/``) and TPC-DS (the 99 of ``benchmarks/tpcds/queries/``)
three policies, each at ε = 1 per query (a refusal asking for δ > 0 retried with Laplace, δ = 1e-6, as the
other benchmarks do):

(a) the hand-written policy shipped with sqldp (``tpch``, ``tpcds``);
(b) ``sqldp policy init --private T…`` alone, the private tables being those (a) makes private: the catalog's
    facts only;
(c) the same with ``--estimate-epsilon 1 --estimate-delta 1e-6``: DP-estimated value ranges and contribution
    bounds added (recorded in the file's ``[estimates]`` section).

A query counts as answered when it prepares and one run returns (DP, or exact where every table read is
public). The CLI is called through its real entry point, so (b) and (c) are what a user gets.

Usage: ``PYTHONPATH=. python benchmarks/policy_init_bench.py --scale 0.01 [--out FILE]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import sqldp
from benchmarks.common import ROOT, machine, markdown_table, report, tpch_database
from sqldp.errors import RefusedError, SqldpError
from sqldp.policy.document import Policy

DELTA = 1e-6
SUITES = {  # suite → the hand-written policies, the query files
    "TPC-H": (("tpch", "tpch_catalog"), ROOT / "benchmarks" / "tpch" / "queries"),
    "TPC-DS": (("tpcds",), ROOT / "benchmarks" / "tpcds" / "queries"),
}


def _dsn(suite: str, scale: float) -> str:
    if suite == "TPC-H":
        return tpch_database(scale)
    from benchmarks.tpcds_bench import tpcds_database

    return tpcds_database(scale)


def private_tables(policy: str) -> list[str]:
    """The tables the shipped policy makes private (rows or values)."""
    from sqldp.datasets import shipped

    loaded = Policy.from_file(shipped(policy, ".toml"))
    return sorted(name for name, t in loaded.tables.items() if not t.public)


def init_policy(dsn: str, private: list[str], target: Path, estimate: bool) -> float:
    """Write a policy with the real CLI; its wall time."""
    cmd = [sys.executable, "-m", "sqldp", "policy", "init", "--dsn", dsn, "--private", ",".join(private)]
    cmd += ["-o", str(target), "--force"]
    if estimate:
        cmd += ["--estimate-epsilon", "1", "--estimate-delta", str(DELTA)]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t0


def answered(dsn: str, policy: str | Path, queries: Path) -> dict[str, str]:
    """Per query file: "DP", "exact" or the refusal's first line."""
    session = sqldp.connect(dsn, policy=str(policy), statement_timeout=120)
    out: dict[str, str] = {}
    for path in sorted(queries.glob("q*.sql")):
        text = path.read_text(encoding="utf-8")
        privacy: dict[str, Any] = {"epsilon": 1.0}
        try:
            try:
                prepared = session.prepare(text, **privacy)
            except RefusedError as refusal:
                if "δ > 0" not in str(refusal):
                    raise
                privacy = {"epsilon": 1.0, "mechanism": "laplace", "delta": DELTA}
                prepared = session.prepare(text, **privacy)
            session.run(text, **privacy)
            out[path.stem] = "exact" if prepared.public else "DP"
        except SqldpError as refusal:
            out[path.stem] = "refused: " + str(refusal).strip().splitlines()[0][:140]
        print(f"# {policy} {path.stem}: {out[path.stem][:100]}", file=sys.stderr)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--suites", default="TPC-H,TPC-DS")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    summary: list[list[Any]] = []
    details: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        for suite, shipped, queries in [(s, p, SUITES[s][1]) for s in args.suites.split(",") for p in SUITES[s][0]]:
            dsn = _dsn(suite, args.scale)
            private = private_tables(shipped)
            plain, estimated = Path(tmp) / f"{shipped}_init.toml", Path(tmp) / f"{shipped}_estimated.toml"
            t_plain = init_policy(dsn, private, plain, estimate=False)
            t_est = init_policy(dsn, private, estimated, estimate=True)
            got = {
                "hand-written": answered(dsn, shipped, queries),
                "init": answered(dsn, plain, queries),
                "init + estimates": answered(dsn, estimated, queries),
            }
            counts = {k: sum(not v.startswith("refused") for v in o.values()) for k, o in got.items()}
            n = len(got["hand-written"])
            summary.append([suite, shipped, ",".join(private), n, *counts.values(), f"{t_plain:.1f} / {t_est:.1f}"])
            rows = [[q, *(got[k][q] for k in got)] for q in sorted(got["hand-written"])]
            differ = [r for r in rows if len({str(c).startswith("refused") for c in r[1:]}) > 1]
            details += [
                f"### {suite} ({shipped}): queries where the policies differ",
                "",
                markdown_table(["query", *got], differ) if differ else "(none)",
                "",
            ]
    header = [
        "suite",
        "(a) policy",
        "--private",
        "queries",
        "(a) hand-written",
        "(b) init",
        "(c) init + estimates",
        "init s (b / c)",
    ]
    command = f"PYTHONPATH=. python benchmarks/policy_init_bench.py --scale {args.scale:g}"
    text = "\n".join(
        [
            f"# Queries answered under `sqldp policy init` policies, SF {args.scale:g}",
            "",
            f"Machine: {machine()} (shared with other jobs). Date: {dt.date.today()}.",
            "",
            f"Command: `{command}` (ε = 1 per query; a refusal asking for δ > 0 is retried with Laplace, δ = 1e-6; "
            "(c) spends --estimate-epsilon 1 --estimate-delta 1e-6 once, on the estimates).",
            "",
            markdown_table(header, summary),
            "",
            *details,
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
