"""The 99 TPC-DS queries under the shipped ``tpcds`` policy: what sqldp answers, refuses or fails on.

TPC-DS is the yardstick for SQL sqldp was never tuned on (the 22 TPC-H queries are tpch22_bench.py's). For
each query file in ``benchmarks/tpcds/queries/`` (benchmarks/tpcds/README.md: DuckDB's texts, transpiled to
PostgreSQL), at ε = 1:

* the outcome: answered with DP, answered exactly (every table read is public), refused (with the refusal's
  class: the message with its names and numbers taken out), error (anything but a refusal: an internal
  error, a crash) or timeout. A refusal that asks for δ > 0 (a private group key without a declared domain)
  is retried with Laplace and δ = 1e-6, DP partition selection, and marked so;
* plain time (PostgreSQL's answer to the raw query) and noisy time (one ``Session.run``);
* where answered with DP: the median relative error of the released values over ``--runs`` runs against the
  raw answer (rows matched by their keys; values whose true answer is 0 are left out), and the true groups
  released: how many of the raw answer's rows have a released row with the same key.

Each query runs in its own process, killed after ``--timeout`` seconds (the session's statement_timeout is
the same), so one slow query or analysis cannot stall the run.

Usage: ``PYTHONPATH=. python benchmarks/tpcds_bench.py --scale 0.1 [--runs 3] [--out FILE]``. The database
``tpcds_sf<scale>`` on the embedded server (or ``--server DSN``) is loaded with ``sqldp.datasets.load_tpcds``
if it has no TPC-DS yet.
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
import traceback
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql as pgsql

from benchmarks.common import ROOT, machine, markdown_table, report
from sqldp.datasets import load_tpcds
from sqldp.db import connect, resolve_dsn

QUERIES = ROOT / "benchmarks" / "tpcds" / "queries"
POLICY = "tpcds"
DELTA = 1e-6


def tpcds_database(scale: float, server: str | None = None) -> str:
    """A database ``tpcds_sf<scale>`` holding TPC-DS at ``scale`` (dots as underscores); loaded once, then
    reused."""
    base = resolve_dsn(server)
    name = "tpcds_sf" + f"{scale:g}".replace(".", "_")
    params = psycopg.conninfo.conninfo_to_dict(base)
    with connect(base) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
    params["dbname"] = name
    target = psycopg.conninfo.make_conninfo(**params)
    with connect(target) as conn:
        row = conn.execute("SELECT to_regclass('public.store_sales') IS NOT NULL").fetchone()
    if not (row and row[0]):
        t0 = time.perf_counter()
        load_tpcds(target, scale)
        print(f"# loaded TPC-DS SF {scale:g} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target


# -- refusal classes ----------------------------------------------------------------------------------------

_NAMES = re.compile(r"(?<!\w)'[^']*'|\"[^\"]*\"|\b[a-z_][a-z0-9_]*\.[a-z_][a-z0-9_]*\b|\b\d+(\.\d+)?(e[-+]?\d+)?\b")


def refusal_class(message: str) -> str:
    """The class of a refusal: its first clause (up to ``:`` or ``;``, parentheses left out) with quoted names,
    qualified column names and numbers replaced by ``…``, so refusals that differ only in what they name or
    where group together."""
    text = message.strip().splitlines()[0] if message.strip() else "?"
    text = re.sub(r"^[\w.]+(:\d+){0,2}: ", "", text)  # a leading position (query:12:5:) is not part of the class
    while re.search(r"\([^()]*\)", text):
        text = re.sub(r"\s*\([^()]*\)", "", text)
    head = re.split(r": |; ", text, maxsplit=1)[0]
    return _NAMES.sub("…", head).strip()[:110]


# -- one query, in its own process --------------------------------------------------------------------------


def _plain_value(v: Any) -> Any:
    if isinstance(v, str):
        return v.rstrip()
    if isinstance(v, Decimal):
        return float(v)
    return v


def _key(v: Any) -> Any:
    if isinstance(v, str):
        return v.rstrip()
    if isinstance(v, (int, float, Decimal)) and not isinstance(v, bool):
        return round(float(v), 6)
    return v


def _compare(result: Any, plain_rows: list[tuple[Any, ...]]) -> tuple[list[float], set[tuple[Any, ...]]]:
    """Relative errors of the released values whose row's key matches a raw row, and the matched keys."""
    columns = list(getattr(result, "columns", []))
    rows = list(getattr(result, "rows", []))
    n_keys = len(rows[0].get("key", {})) if rows else 0
    truth = {tuple(_key(v) for v in row[:n_keys]): row for row in plain_rows}
    errors: list[float] = []
    matched: set[tuple[Any, ...]] = set()
    for r in rows:
        key = tuple(_key(v) for v in r.get("key", {}).values())
        true_row = truth.get(key)
        if true_row is None:
            continue
        matched.add(key)
        for j, name in enumerate(columns[n_keys:], start=n_keys):
            v, t = r.get("values", {}).get(name), true_row[j] if j < len(true_row) else None
            if isinstance(t, (int, float)) and not isinstance(t, bool) and t != 0 and isinstance(v, (int, float)):
                errors.append(abs(float(v) - float(t)) / abs(float(t)))
    return errors, matched


def run_query(dsn: str, text: str, runs: int, timeout: float) -> dict[str, Any]:
    """Everything measured for one query (called in a child process)."""
    import sqldp
    from sqldp.errors import RefusedError

    out: dict[str, Any] = {}
    with psycopg.connect(dsn) as conn:
        conn.execute(f"SET statement_timeout = {int(timeout * 1000)}")
        t0 = time.perf_counter()
        plain_rows = [tuple(_plain_value(v) for v in r) for r in conn.execute(text).fetchall()]
        out["plain_s"] = time.perf_counter() - t0
    out["true_rows"] = len(plain_rows)
    session = sqldp.connect(dsn, policy=POLICY, statement_timeout=timeout)
    privacy: dict[str, Any] = {"epsilon": 1.0}
    try:
        try:
            prepared = session.prepare(text, **privacy)
        except RefusedError as refusal:
            if "δ > 0" not in str(refusal):
                raise
            privacy = {"epsilon": 1.0, "mechanism": "laplace", "delta": DELTA}
            prepared = session.prepare(text, **privacy)
    except RefusedError as refusal:
        out.update(outcome="refused", message=str(refusal).strip().splitlines()[0])
        return out
    public = bool(getattr(prepared, "public", False))
    errors: list[float] = []
    matched: list[int] = []
    times: list[float] = []
    for _ in range(1 if public else max(runs, 1)):
        t0 = time.perf_counter()
        try:
            result = session.run(text, **privacy)
        except RefusedError as refusal:  # refused at run time (e.g. the planner's estimate is too large)
            out.update(outcome="refused", message=str(refusal).strip().splitlines()[0])
            return out
        times.append(time.perf_counter() - t0)
        e, m = _compare(result, plain_rows)
        errors += e
        matched.append(len(m))
    out["noisy_s"] = statistics.median(times)
    if public:
        out.update(outcome="exact")
    else:
        out.update(
            outcome="DP" if "delta" not in privacy else f"DP, partition selection (δ = {DELTA:g})",
            error=statistics.median(errors) if errors else None,
            groups=statistics.median(matched),
        )
    return out


def _child(conn: Any, dsn: str, text: str, runs: int, timeout: float) -> None:
    try:
        conn.send(run_query(dsn, text, runs, timeout))
    except BaseException as exc:  # the parent classifies: an error is a finding, not a crash of the run
        last = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        where = f" at {Path(last.filename).name}:{last.lineno}" if last else ""
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        conn.send({"outcome": "error", "message": f"{type(exc).__name__}: {first}{where}"})
    finally:
        conn.close()


def measure(dsn: str, text: str, runs: int, timeout: float) -> dict[str, Any]:
    """:func:`run_query` in a child process, killed after ``timeout`` seconds (and a little for the plain
    query and the runs, each bounded by the statement_timeout themselves)."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, dsn, text, runs, timeout), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    child.close()
    got: dict[str, Any] | None = None
    if parent.poll(timeout):
        try:
            got = parent.recv()
        except EOFError:
            got = None
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join()
    if got is None:
        if time.perf_counter() - t0 >= timeout:
            return {"outcome": "timeout", "message": f"no answer in {timeout:g} s"}
        return {"outcome": "error", "message": f"the process died (exit {proc.exitcode})"}
    return got


# -- the report -----------------------------------------------------------------------------------------


def _machine_line() -> str:
    mem = ""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    at = f", load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f} at the start" if load else ""
    return f"{machine()}{mem}{at}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--server", default=None, help="PostgreSQL server DSN (default: the embedded server)")
    ap.add_argument("--runs", type=int, default=3, help="noisy runs per query answered with DP (default 3)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per query (default 300)")
    ap.add_argument("--out", default=None)
    ap.add_argument("--queries", default=None, help="comma-separated query files to run (default: all 99)")
    args = ap.parse_args()
    only = set(args.queries.split(",")) if args.queries else None
    started = _machine_line()
    dsn = tpcds_database(args.scale, args.server)
    t_start = time.perf_counter()
    results: list[tuple[str, dict[str, Any]]] = []
    for path in sorted(QUERIES.glob("q*.sql")):
        if only is not None and path.stem not in only:
            continue
        got = measure(dsn, path.read_text(encoding="utf-8"), args.runs, args.timeout)
        results.append((path.stem, got))
        print(f"# {path.stem}: {got['outcome']} {got.get('message', '')[:100]}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - t_start

    rows = []
    for name, r in results:
        outcome = r["outcome"]
        what = outcome
        if outcome == "refused":
            what = f"refused ({refusal_class(r['message'])})"
        elif outcome in ("error", "timeout"):
            what = f"{outcome}: {r['message']}"
        groups = f"{r['groups']:g} of {r['true_rows']}" if r.get("groups") is not None else ""
        rows.append([name, what, r.get("noisy_s"), r.get("plain_s"), r.get("error"), groups, r.get("true_rows")])
    header = ["query", "outcome", "noisy s", "plain s", "median rel. error", "true groups released", "true rows"]
    kinds = Counter("DP" if r["outcome"].startswith("DP") else r["outcome"] for _, r in results)
    classes = Counter(refusal_class(r["message"]) for _, r in results if r["outcome"] == "refused")
    by_class: dict[str, list[str]] = {}
    for name, r in results:
        if r["outcome"] == "refused":
            by_class.setdefault(refusal_class(r["message"]), []).append(name)
    summary = [
        f"| answered with DP | {kinds['DP']} |",
        f"| answered exactly (public tables only) | {kinds['exact']} |",
        f"| refused | {kinds['refused']} |",
        f"| error | {kinds['error']} |",
        f"| timeout ({args.timeout:g} s) | {kinds['timeout']} |",
    ]
    class_rows = [[c, n, ", ".join(by_class[c])] for c, n in classes.most_common()]
    command = f"PYTHONPATH=. python benchmarks/tpcds_bench.py --scale {args.scale:g} --runs {args.runs}"
    if args.timeout != 300:
        command += f" --timeout {args.timeout:g}"
    if args.queries:
        command += f" --queries {args.queries}"
    text = "\n".join(
        [
            f"# The 99 TPC-DS queries under the tpcds policy, SF {args.scale:g}",
            "",
            f"Machine: {started} (shared with other jobs: times are noisy). Date: {dt.date.today()}. "
            f"Wall time of the run: {wall / 60:.1f} min.",
            "",
            f"Command: `{command}` (ε = 1 per query; a refusal asking for δ > 0 is retried with Laplace, "
            f"δ = {DELTA:g}; each query in its own process, killed after {args.timeout:g} s).",
            "",
            "| outcome | queries |",
            "|---|---|",
            *summary,
            "",
            "Refusals by class (the message's first clause, names and numbers as …):",
            "",
            markdown_table(["class", "queries", "which"], class_rows),
            "",
            markdown_table(header, rows),
            "",
            "Refusal and error messages in full:",
            "",
            *[f"- {name}: {r['message']}" for name, r in results if r.get("message")],
        ]
    )
    report(text, args.out)


if __name__ == "__main__":
    main()
