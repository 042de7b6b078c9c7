"""How long sqldp takes to analyse and answer the 22 TPC-H queries: cold processes and a warm session.

Per query file in ``benchmarks/tpch/queries/`` under the ``tpch`` policy at ε = 1 (a refusal asking for δ > 0 is
retried with Laplace and δ = 1e-6, as ``tpch22_bench.py`` does):

* **cold explain**: ``python -m sqldp explain --schema tpch --policy tpch -f qNN.sql`` in a new process, no
  database: start-up, parsing the schema and policy, the whole analysis (a refusal is an analysis too);
* **cold run**: ``python -m sqldp run --dsn … --policy tpch --epsilon 1 -f qNN.sql`` in a new process: connect,
  read the catalog, analyse, run the statements on PostgreSQL, release;
* **warm explain**: ``sqldp.commands.explain.explain`` in this process (modules loaded, schema and policy read);
* **warm analysis**: ``Session.prepare`` in one session (``sqldp.connect``) reused for every query: the first
  analysis of the statement (the session's analysis cache and the model check's per-shape caches emptied first);
* **warm cached**: ``Session.prepare`` of the statement the session analysed before (its analysis cache);
* **warm run**: ``Session.run`` of the prepared statement: the engine's statements and fresh noise;
* **plain**: the query itself on PostgreSQL through psycopg (same database), for the ratio run/plain.

Cold figures are the child's CPU (user + system, ``RUSAGE_CHILDREN``) and wall time, the median of ``--cold``
processes; warm ones ``time.process_time`` (every thread of this process) and wall, the median of ``--warm``
calls. PostgreSQL's own CPU is in no CPU figure (the server is not a child of this process), only in wall
times. ``--profile N`` profiles one warm analysis of each of the N slowest and summarises where it went.

Usage: ``PYTHONPATH=. python benchmarks/latency_bench.py --scale 0.01 [--cold 3] [--warm 5] [--profile 4]
[--queries q01,q05] [--out FILE]``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime as dt
import io
import os
import pstats
import resource
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

import sqldp
from benchmarks.common import QUERIES, ROOT, machine, markdown_table, report, tpch_database
from sqldp.errors import RefusedError

POLICY = "tpch"
DELTA = 1e-6
GOALS = "goals: median analysis ≤ 0.1 s warm, ≤ 0.5 s cold, max ≤ 2 s"


def _child(argv: list[str]) -> tuple[float, float, int, str]:
    """CPU (user + system) and wall seconds of one ``python -m sqldp …`` process, its exit code and stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "sqldp", *argv], cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.returncode, done.stderr.strip()


def _yardstick(runs: int = 5) -> tuple[float, float]:
    """Median CPU of a bare interpreter and of one importing sqlglot (sqldp's parser, a fixed cost of every
    cold process): how loaded the machine was, to compare runs made at different times."""
    out = []
    for code in ("pass", "import sqlglot"):
        cpus = []
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], check=True)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
        out.append(statistics.median(cpus))
    return out[0], out[1]


def _cold(argv: list[str], runs: int) -> tuple[float, float, int, str]:
    """Medians of ``runs`` cold processes (CPU, wall), the last exit code and stderr."""
    cpus, walls, code, err = [], [], 0, ""
    for _ in range(runs):
        cpu, wall, code, err = _child(argv)
        cpus.append(cpu)
        walls.append(wall)
    return statistics.median(cpus), statistics.median(walls), code, err


def _warm(fn: Callable[[], Any], runs: int, before: Callable[[], None] | None = None) -> tuple[float, float]:
    """Medians of ``runs`` calls of ``fn`` in this process: (CPU, wall) seconds; ``before`` runs untimed."""
    cpus, walls = [], []
    for _ in range(runs):
        if before is not None:
            before()
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(cpus), statistics.median(walls)


def _forget(session: Any) -> None:
    """Empty what makes a repeated analysis cheaper: the session's analysis cache and the model check's results
    per query shape (sqldp.sensitivity.global_bound), so that the next prepare analyses from the text."""
    from sqldp.sensitivity import global_bound

    session._prepared.clear()
    global_bound._cache.clear()
    global_bound._workflow_cache.clear()


def _privacy(session: Any, sql: str) -> tuple[dict[str, Any], str | None]:
    """The privacy arguments the query is answered with, or the refusal's reason."""
    privacy: dict[str, Any] = {"epsilon": 1.0}
    try:
        try:
            session.prepare(sql, **privacy)
        except RefusedError as refusal:
            if "δ > 0" not in str(refusal):
                raise
            privacy = {"epsilon": 1.0, "mechanism": "laplace", "delta": DELTA}
            session.prepare(sql, **privacy)
    except RefusedError as refusal:
        return privacy, str(refusal)
    return privacy, None


def _flags(privacy: dict[str, Any]) -> list[str]:
    out = ["--epsilon", f"{privacy['epsilon']:g}"]
    if "delta" in privacy:
        out += ["--mechanism", privacy["mechanism"], "--delta", f"{privacy['delta']:g}"]
    return out


def _measure(path: Path, session: Any, schema: Any, policy: Any, dsn: str, cold: int, warm: int) -> dict[str, Any]:
    """Every figure of one query file (the module docstring says what each is)."""
    from sqldp.commands.explain import explain

    sql = path.read_text(encoding="utf-8")
    privacy, refused = _privacy(session, sql)
    row: dict[str, Any] = {"query": path.stem, "refused": refused, "privacy": privacy}
    explain_argv = ["explain", "--schema", "tpch", "--policy", POLICY, *_flags(privacy), "-f", str(path)]
    row["cold_explain_cpu"], row["cold_explain_wall"], code, err = _cold(explain_argv, cold)
    assert code in (0, 2), err  # 2: refused, with its one line
    run_argv = ["run", "--dsn", dsn, "--policy", POLICY, *_flags(privacy), "--format", "json", "-f", str(path)]
    row["cold_run_cpu"], row["cold_run_wall"], code, err = _cold(run_argv, cold)
    assert code == (2 if refused else 0), err

    def forget() -> None:
        _forget(session)

    def analyse() -> None:
        with contextlib.suppress(RefusedError):
            session.prepare(sql, **privacy)

    row["warm_explain_cpu"], row["warm_explain_wall"] = _warm(lambda: explain(sql, schema, policy), warm, forget)
    row["warm_analysis_cpu"], row["warm_analysis_wall"] = _warm(analyse, warm, forget)
    analyse()  # now in the session's cache
    row["warm_cached_cpu"], row["warm_cached_wall"] = _warm(analyse, warm)
    if refused is None:
        row["warm_run_cpu"], row["warm_run_wall"] = _warm(lambda: session.run(sql, **privacy), warm)
        with psycopg.connect(dsn) as conn:
            conn.execute(sql).fetchall()  # PostgreSQL's caches as warm as for the runs above
            _, row["plain_wall"] = _warm(lambda: conn.execute(sql).fetchall(), warm)
    return row


def bench(scale: float, cold: int, warm: int, only: set[str] | None) -> tuple[list[dict[str, Any]], Any]:
    from sqldp.context import load_catalog, load_policy

    dsn = tpch_database(scale)
    session = sqldp.connect(dsn, policy=POLICY)
    schema, policy = load_catalog("tpch", None), load_policy(POLICY)
    rows: list[dict[str, Any]] = []
    for path in sorted(QUERIES.glob("q*.sql")):
        if only is not None and path.stem not in only:
            continue
        row = _measure(path, session, schema, policy, dsn, cold, warm)
        print(
            f"# {path.stem}: cold explain {row['cold_explain_cpu']:.3f} s CPU, cold run {row['cold_run_cpu']:.3f}, "
            f"warm analysis {row['warm_analysis_cpu']:.3f}{' (refused)' if row['refused'] else ''}",
            file=sys.stderr,
        )
        rows.append(row)
    return rows, session


def profile(session: Any, queries: list[str], top: int = 12) -> str:
    """One warm analysis of each query under cProfile: the share of its time per module (self time) and the
    sqldp functions with the largest cumulative time below the session's own entry points."""
    lines = []
    for name in queries:
        sql = (QUERIES / f"{name}.sql").read_text(encoding="utf-8")
        privacy, _ = _privacy(session, sql)
        _forget(session)
        prof = cProfile.Profile()
        prof.enable()
        with contextlib.suppress(RefusedError):
            session.prepare(sql, **privacy)
        prof.disable()
        stats = pstats.Stats(prof, stream=io.StringIO())
        total = max(sum(v[2] for v in stats.stats.values()), 1e-9)  # type: ignore[attr-defined]
        by_module: dict[str, float] = defaultdict(float)
        cumulative, own = [], []
        for (file, line, func), (_, calls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
            by_module[_module(file)] += tottime
            own.append((tottime, f"{_module(file)}.{func}:{line} ({calls} calls)"))
            if "/sqldp/" in file and "/session.py" not in file:
                cumulative.append((cumtime, f"{_module(file)}.{func}:{line}"))
        shares = sorted(by_module.items(), key=lambda kv: -kv[1])[:8]
        lines.append(f"**{name}** ({total:.2f} s under the profiler; self time by module): ")
        lines.append(", ".join(f"{m} {t / total:.0%}" for m, t in shares))
        lines.append("")
        lines.append(
            "largest self time: " + ", ".join(f"{w} {t / total:.0%}" for t, w in sorted(own, reverse=True)[:5])
        )
        lines.append("")
        lines.append("largest cumulative sqldp functions: ")
        for cum, where in sorted(cumulative, reverse=True)[:top]:
            lines.append(f"  {where} {cum / total:.0%}")
        lines.append("")
    return "\n".join(lines)


def _module(file: str) -> str:
    """A profiled function's module, as a dotted name for sqldp and sqlglot, the top package otherwise."""
    path = Path(file)
    parts = path.with_suffix("").parts
    for root in ("sqldp", "sqlglot"):
        if root in parts:
            i = len(parts) - 1 - parts[::-1].index(root)
            return ".".join(parts[i:])
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return "python" if file.startswith(("<", "~")) or "python3" in file else path.stem


def _summary(rows: list[dict[str, Any]], keys: list[str]) -> list[list[Any]]:
    out = []
    for key in keys:
        values = [r[key] for r in rows if r.get(key) is not None]
        if values:
            worst = max(rows, key=lambda r: r.get(key) or -1.0)["query"]
            out.append([key.replace("_", " "), statistics.median(values), max(values), worst, len(values)])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.01)
    ap.add_argument("--cold", type=int, default=3, help="cold processes per query and command")
    ap.add_argument("--warm", type=int, default=5, help="warm calls per query and measurement")
    ap.add_argument("--profile", type=int, default=4, help="profile the warm analysis of the N slowest")
    ap.add_argument("--queries", default=None, help="comma-separated query files (default: all 22)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    only = set(args.queries.split(",")) if args.queries else None
    t0 = time.perf_counter()
    load = os.getloadavg()
    bare, sqlglot_import = _yardstick()
    rows, session = bench(args.scale, args.cold, args.warm, only)
    slowest = [r["query"] for r in sorted(rows, key=lambda r: -r["warm_analysis_cpu"])[: args.profile]]
    profiled = profile(session, slowest) if slowest else ""
    session.close()
    header = [
        "query",
        "answered",
        "cold explain CPU",
        "cold explain wall",
        "cold run CPU",
        "cold run wall",
        "warm explain CPU",
        "warm analysis CPU",
        "warm analysis wall",
        "warm cached CPU",
        "warm run CPU",
        "warm run wall",
        "plain wall",
        "warm run / plain",
    ]
    table = []
    for r in rows:
        answered = "refused" if r["refused"] else "DP" + (f" (δ = {DELTA:g})" if "delta" in r["privacy"] else "")
        ratio = r["warm_run_wall"] / r["plain_wall"] if r.get("plain_wall") else None
        table.append(
            [
                r["query"],
                answered,
                r["cold_explain_cpu"],
                r["cold_explain_wall"],
                r["cold_run_cpu"],
                r["cold_run_wall"],
                r["warm_explain_cpu"],
                r["warm_analysis_cpu"],
                r["warm_analysis_wall"],
                r["warm_cached_cpu"],
                r.get("warm_run_cpu"),
                r.get("warm_run_wall"),
                r.get("plain_wall"),
                ratio,
            ]
        )
        r["run_over_plain"] = ratio
    for r in rows:
        r["cold_over_warm_analysis"] = r["cold_explain_cpu"] / max(r["warm_analysis_cpu"], 1e-9)
    keys = [
        "cold_explain_cpu",
        "cold_explain_wall",
        "cold_run_cpu",
        "cold_run_wall",
        "warm_explain_cpu",
        "warm_analysis_cpu",
        "warm_analysis_wall",
        "warm_cached_cpu",
        "warm_run_cpu",
        "warm_run_wall",
        "plain_wall",
        "run_over_plain",
        "cold_over_warm_analysis",
    ]
    command = f"PYTHONPATH=. python benchmarks/latency_bench.py --scale {args.scale:g} --cold {args.cold} " + (
        f"--warm {args.warm} --profile {args.profile}" + (f" --queries {args.queries}" if args.queries else "")
    )
    text = "\n".join(
        [
            f"# Latency: the 22 TPC-H queries, SF {args.scale:g}, cold process and warm session",
            "",
            f"Machine: {machine()}, shared with other jobs (load average {load[0]:.2f} at the start; CPU times "
            f"matter more than wall times). Date: {dt.date.today()}. Took {time.perf_counter() - t0:.0f} s. "
            f"Yardstick at the start: a bare `python -c pass` took {bare:.3f} s of CPU, `import sqlglot` "
            f"{sqlglot_import:.3f} s (the load inflates CPU times too).",
            "",
            f"Command: `{command}` (policy `{POLICY}`, ε = 1; a refusal asking for δ > 0 retried with Laplace, "
            f"δ = {DELTA:g}; embedded PostgreSQL). Seconds; what each column measures: the docstring of "
            "`benchmarks/latency_bench.py`.",
            "",
            markdown_table(header, table),
            "",
            f"Over the queries (goals, {GOALS}):",
            "",
            markdown_table(["figure", "median", "max", "max at", "queries"], _summary(rows, keys)),
            "",
            "## Where the warm analysis goes (the slowest, one profiled analysis each)",
            "",
            profiled,
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
