"""Shared benchmark plumbing: a TPC-H database per scale factor, timing, and a markdown report."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from sqldp.datasets import load_tpch
from sqldp.db import connect, resolve_dsn

ROOT = Path(__file__).resolve().parents[1]
QUERIES = ROOT / "benchmarks" / "tpch" / "queries"


def tpch_database(scale: float, dsn: str | None = None) -> str:
    """A database holding TPC-H at ``scale`` on the given (or embedded) server; loaded once, then reused."""
    server = resolve_dsn(dsn)
    name = "sqldp_bench_sf" + f"{scale:g}".replace(".", "_")
    params = psycopg.conninfo.conninfo_to_dict(server)
    with connect(server) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params["dbname"] = name
    target = psycopg.conninfo.make_conninfo(**params)
    with connect(target) as conn:
        loaded = conn.execute("SELECT to_regclass('public.lineitem') IS NOT NULL").fetchone()[0]
    if not loaded:
        t0 = time.perf_counter()
        load_tpch(target, scale)
        print(f"# loaded TPC-H SF {scale:g} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return target


def median_time(fn: Callable[[], Any], repeat: int = 3, min_seconds: float = 0.0) -> tuple[float, Any]:
    """Median wall time of at least ``repeat`` calls (after one warm-up), and of more until they took
    ``min_seconds`` in all (a single sub-millisecond run moves by 2× with the machine's other work), and the
    last result."""
    fn()
    times: list[float] = []
    out = None
    while len(times) < repeat or (sum(times) < min_seconds and len(times) < 10_000):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.4g}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)


def report(text: str, out: str | None) -> None:
    """Print a benchmark's results and, with ``--out``, write them to that file (benchmarks/results/*.md)."""
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
