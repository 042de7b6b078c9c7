"""Throughput and latency of the PostgreSQL proxy against PostgreSQL itself, on loopback.

    python benchmarks/proxy_bench.py [--dsn DSN] [--clients 1,10,50] [--seconds 5] [--workers 1,0] [--out FILE]
                                     [--baseline DIR]

For each workload (a public lookup answered exactly, a private COUNT answered with noise) and each number of
concurrent clients, clients run the query in a loop for a fixed time against the proxy (a `sqldp proxy`
subprocess, one per number of worker processes compared) and directly against PostgreSQL, each client on its own
connection. Reported: throughput, p50 and p99 latency, and the ratios measured in this run, and the CPU time
each query costs in the proxy, PostgreSQL and the client. To separate the proxy's own cost from the work it must do, the
same queries are also timed in-process, single client, through the runner (analysis, the answer and
sensitivity queries, noise) and the ledger charge: overhead = proxy p50 − (runner p50 + charge p50).
CPU per query is measured in interleaved rounds (each path in turn, five times) and the median reported, since
other programs on the machine inflate CPU time too; ``--baseline DIR`` (a source tree of another commit, e.g.
from ``git worktree add``) adds that tree's proxy to the rounds, for a before/after within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqldp.db import resolve_dsn  # noqa: E402
from sqldp.proxy.scram import make_verifier  # noqa: E402
from sqldp.proxy.workers import default_workers  # noqa: E402
from tests.proxy_support import start_proxy  # noqa: E402

PASSWORD = "bench-password"
WORKLOADS = {
    "public lookup": "SELECT n_name FROM nation WHERE n_nationkey = 7",
    "private COUNT": "SELECT COUNT(*) FROM visits WHERE faculty = 'math'",
}
MAX_CLIENTS = 64
MAX_SECONDS = 60.0


def make_database(server: str) -> str:
    name = f"sqldp_proxy_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    params = psycopg.conninfo.conninfo_to_dict(server)
    params["dbname"] = name
    dsn = psycopg.conninfo.make_conninfo(**params)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE nation (n_nationkey integer PRIMARY KEY, n_name text NOT NULL)")
        conn.execute("INSERT INTO nation SELECT g, 'NATION ' || g FROM generate_series(0, 24) g")
        conn.execute("CREATE TABLE visits (id integer PRIMARY KEY, faculty text NOT NULL, minutes integer NOT NULL)")
        conn.execute(
            "INSERT INTO visits SELECT g, CASE WHEN g % 3 = 0 THEN 'math' ELSE 'cs' END, g % 60 "
            "FROM generate_series(1, 10000) g"
        )
        conn.execute("ANALYZE")
    return dsn


def drop_database(server: str, dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def write_policy(directory: Path, clients: int, processes: int = 1) -> Path:
    """The benchmark's policy; threads and upstream connections per proxy process for its share of the clients,
    at most 8 upstream connections per process (with a ledger pool of half that): a process whose work holds
    the GIL gains nothing from more, and PostgreSQL's default max_connections (100) must also hold the direct
    run's clients while the proxy's pools stay open."""
    share = -(-clients // processes)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "bench-policy.toml"
    path.write_text(
        '[defaults]\nepsilon = 0.001\n[tables.nation]\nrows = "public"\n[tables.visits]\nrows = "private"\n'
        f"[proxy]\nworkers = {min(64, share + 4)}\npool_size = {min(8, share + 2)}\n"
        f'[analysts.bench]\nverifier = "{make_verifier(PASSWORD)}"\nepsilon_limit = 1e12\n',
        encoding="utf-8",
    )
    return path


def run_clients(dsn: str, query: str, clients: int, seconds: float) -> tuple[float, list[float]]:
    """(queries per second, latencies in ms) of ``clients`` connections running ``query`` for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    conns = [psycopg.connect(dsn, autocommit=True) for _ in range(clients)]
    for c in conns:  # warm up each connection (and the proxy's pools)
        c.execute(query).fetchall()
    barrier = threading.Barrier(clients + 1)
    deadline = [0.0]

    def worker(i: int) -> None:
        barrier.wait()
        mine = latencies[i]
        conn = conns[i]
        for _ in range(10_000_000):
            t0 = time.perf_counter()
            if t0 >= deadline[0]:
                return
            conn.execute(query).fetchall()
            mine.append((time.perf_counter() - t0) * 1000)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start = time.perf_counter()
    deadline[0] = start + seconds
    barrier.wait()
    for t in threads:
        t.join(timeout=seconds + 60)
    elapsed = time.perf_counter() - start
    for c in conns:
        c.close()
    flat = [x for part in latencies for x in part]
    return len(flat) / elapsed, flat


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def in_process(upstream: str, policy: Path, n: int = 300) -> dict[str, tuple[float, float]]:
    """p50 of the runner (prepare + run, pooled connections) and of the ledger charge, one client, in-process."""
    from sqldp.proxy import build, ledger

    built = build(upstream, policy)
    out: dict[str, tuple[float, float]] = {}
    try:
        session = built.server.session
        for label, query in WORKLOADS.items():
            runner, charge = [], []
            for i in range(n + 20):
                t0 = time.perf_counter()
                prepared = session.prepare(query, epsilon=0.001) if hasattr(session, "prepare") else None
                t1 = time.perf_counter()
                if prepared is not None and not prepared.public:
                    with built.server.ledger_pool.connection() as conn:
                        ledger.charge(conn, "bench", 0.001, None, "bench")
                t2 = time.perf_counter()
                (prepared.run() if prepared is not None else session.run(query, epsilon=0.001)).table()
                t3 = time.perf_counter()
                if i >= 20:
                    runner.append(((t1 - t0) + (t3 - t2)) * 1000)
                    charge.append((t2 - t1) * 1000)
            out[label] = (statistics.median(runner), statistics.median(charge))
    finally:
        built.close()
    return out


def _cpu_ticks(pid: int) -> int:
    """User and system CPU ticks of ``pid`` and its live descendants (Linux /proc; 0 elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total = int(fields[11]) + int(fields[12])
        for task in Path(f"/proc/{pid}/task").iterdir():
            total += sum(_cpu_ticks(int(c)) for c in (task / "children").read_text().split())
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return 0
    return total


def _backends(server: str, database: str) -> list[int]:
    with psycopg.connect(server, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", (database,)).fetchall()
    return [r[0] for r in rows]


def cpu_per_query(
    server: str, upstream: str, paths: dict[str, tuple[str, int | None]], query: str, n: int = 1000, rounds: int = 5
) -> dict[str, tuple[float, float, float]]:
    """CPU milliseconds per query, one client, for each path (label → (DSN, proxy process id or None)): (proxy
    processes, PostgreSQL backends of the benchmark's database, the client). CPU time grows less than latency
    when other programs load the machine, but it does grow (shared caches and cores): the paths take turns,
    ``rounds`` times, and the median of each is reported. Only for a server on this machine (its backends'
    /proc entries); the backends counted are those alive after the warm-up."""
    database = psycopg.conninfo.conninfo_to_dict(upstream)["dbname"]
    hz = os.sysconf("SC_CLK_TCK")
    conns = {label: psycopg.connect(dsn, autocommit=True) for label, (dsn, _) in paths.items()}
    got: dict[str, list[tuple[float, float, float]]] = {label: [] for label in paths}
    try:
        for conn in conns.values():
            for _ in range(50):  # warm up the pools
                conn.execute(query).fetchall()
        backends = _backends(server, database)
        for _ in range(rounds):
            for label, conn in conns.items():
                proxy = paths[label][1]
                p0, g0, c0 = _cpu_ticks(proxy) if proxy else 0, sum(map(_cpu_ticks, backends)), time.process_time()
                for _ in range(n):
                    conn.execute(query).fetchall()
                p1, g1, c1 = _cpu_ticks(proxy) if proxy else 0, sum(map(_cpu_ticks, backends)), time.process_time()
                got[label].append(((p1 - p0) / hz / n * 1000, (g1 - g0) / hz / n * 1000, (c1 - c0) / n * 1000))
    finally:
        for conn in conns.values():
            conn.close()
    med = statistics.median
    return {
        label: (med(v[0] for v in vals), med(v[1] for v in vals), med(v[2] for v in vals))
        for label, vals in got.items()
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", help="PostgreSQL server (default: the embedded one)")
    ap.add_argument("--clients", default="1,10,50")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--out", type=Path, help="write the markdown report here")
    ap.add_argument(
        "--workers", default="1,0", help="proxy worker processes to compare, in one run (0: the proxy's default)"
    )
    ap.add_argument("--baseline", type=Path, help="a source tree whose proxy joins the CPU rounds (before/after)")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    counts = [int(w) or default_workers() for w in args.workers.split(",")]
    if any(not 1 <= c <= MAX_CLIENTS for c in clients) or not 0 < args.seconds <= MAX_SECONDS:
        raise SystemExit(f"clients must be in [1, {MAX_CLIENTS}] and seconds in (0, {MAX_SECONDS}]")
    server = resolve_dsn(args.dsn)
    upstream = make_database(server)
    tmp = Path(tempfile.mkdtemp(prefix="sqldp-proxy-bench-"))
    lines: list[str] = []
    procs: dict[int, subprocess.Popen[str]] = {}
    try:
        local = in_process(upstream, write_policy(tmp, 1))
        dsns = {}
        for w in counts:
            proc, port = start_proxy(upstream, write_policy(tmp / str(w), max(clients), w), workers=w)
            procs[w] = proc
            dsns[w] = psycopg.conninfo.make_conninfo(
                host="127.0.0.1", port=str(port), user="bench", password=PASSWORD, dbname="bench"
            )
        rows = []
        for label, query in WORKLOADS.items():
            for n in clients:
                qps_d, lat_d = run_clients(upstream, query, n, args.seconds)
                for w in counts:
                    qps_p, lat_p = run_clients(dsns[w], query, n, args.seconds)
                    rows.append((label, n, w, qps_d, lat_d, qps_p, lat_p))
                    print(
                        f"{label:14} clients={n:3} direct {qps_d:8.0f} q/s  workers={w} {qps_p:8.0f} q/s",
                        file=sys.stderr,
                    )
        paths: dict[str, tuple[str, int | None]] = {"direct": (upstream, None)}
        for w in counts:
            paths[f"proxy, {w} worker{'s' if w > 1 else ''}"] = (dsns[w], procs[w].pid)
        if args.baseline is not None:
            w = counts[0]
            policy = write_policy(tmp / "baseline", max(clients), w)
            base, port = start_proxy(upstream, policy, workers=w, tree=args.baseline)
            procs[-1] = base
            paths[f"baseline proxy, {w} worker{'s' if w > 1 else ''}"] = (
                psycopg.conninfo.make_conninfo(
                    host="127.0.0.1", port=str(port), user="bench", password=PASSWORD, dbname="bench"
                ),
                base.pid,
            )
        cpu = {
            (label, path): got
            for label, query in WORKLOADS.items()
            for path, got in cpu_per_query(server, upstream, paths, query).items()
        }
        lines += [
            "# Proxy benchmark",
            "",
            f"Command: `python benchmarks/proxy_bench.py --clients {args.clients} --seconds {args.seconds:g}"
            f" --workers {args.workers}{' --dsn …' if args.dsn else ''}{' --baseline …' if args.baseline else ''}`"
            " (embedded PostgreSQL unless `--dsn`).",
            "",
            f"Machine: {os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
            f"{platform.system()} {platform.release()}, Python {platform.python_version()}, "
            f"psycopg {psycopg.__version__}.",
            "Clients are threads in the benchmark process, each with its own connection; each proxy is a `sqldp proxy`",
            "subprocess with the number of worker processes in the `workers` column, all started before the first",
            "measurement; everything on 127.0.0.1 (PostgreSQL over its Unix socket for the direct runs and the",
            "proxy's upstream). Tables: `nation` (25 rows, public), `visits` (10 000 rows, private); ε = 0.001 per",
            "query.",
            "Each proxy row is measured right after the direct row above it: ratios are within one run.",
            "",
            "| workload | clients | workers | direct q/s | proxy q/s | throughput ratio | direct p50 ms |"
            " proxy p50 ms | direct p99 ms | proxy p99 ms | p99 ratio |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, n, w, qps_d, lat_d, qps_p, lat_p in rows:
            p50d, p50p, p99d, p99p = pct(lat_d, 0.5), pct(lat_p, 0.5), pct(lat_d, 0.99), pct(lat_p, 0.99)
            lines.append(
                f"| {label} | {n} | {w} | {qps_d:.0f} | {qps_p:.0f} | {qps_p / qps_d:.3f} | {p50d:.3f} | {p50p:.3f} | "
                f"{p99d:.3f} | {p99p:.3f} | {p99p / p99d:.1f} |"
            )
        lines += [
            "",
            "## Where a single client's time goes (p50, ms)",
            "",
            "The runner's work (parse, analyses, the answer and sensitivity queries on a pooled connection, noise) and",
            "the ledger charge are what the proxy must do for each answer; the rest is the proxy's own overhead",
            "(protocol, statement classification, thread hand-off, logging). A cached public lookup takes the fast",
            'path (docs/proxy.md, "Fast paths"), which does not go through the runner: what it must do is the',
            "direct query, so its overhead is also given as proxy p50 − direct p50.",
            "",
            "| workload | workers | proxy p50 | runner p50 | ledger charge p50 | proxy's own overhead |"
            " direct p50 | proxy − direct |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for label, n, w, _qd, lat_d, _qp, lat_p in rows:
            if n != 1:
                continue
            runner, charge = local[label]
            charge = charge if label.startswith("private") else 0.0
            p50p, p50d = pct(lat_p, 0.5), pct(lat_d, 0.5)
            lines.append(
                f"| {label} | {w} | {p50p:.3f} | {runner:.3f} | {charge:.3f} | {p50p - runner - charge:.3f} | "
                f"{p50d:.3f} | {p50p - p50d:.3f} |"
            )
        lines += [
            "",
            "## CPU per query, one client (ms of CPU time)",
            "",
            "What each query costs in CPU wherever it runs: the proxy's processes, the PostgreSQL backends of the",
            "benchmark's database (the answer, the ledger charge and the pooled connections' resets), the client.",
            "With every core busy, throughput is at most cores / total. Median of five interleaved rounds of 1,000",
            "queries per path"
            + (" (the baseline: the proxy of the tree given to `--baseline`, same policy)." if args.baseline else "."),
            "",
            "| workload | path | proxy | PostgreSQL | client | total |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for (label, path), (p, g, c) in cpu.items():
            lines.append(f"| {label} | {path} | {p:.3f} | {g:.3f} | {c:.3f} | {p + g + c:.3f} |")
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait(timeout=10)
        drop_database(server, upstream)
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
