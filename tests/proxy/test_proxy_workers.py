"""``sqldp proxy --workers N``: several server processes on one port (sqldp.proxy.workers) share the ledger in
PostgreSQL, route cancel requests to the process that owns the connection, and stop, restart and die together.

Each test runs the real CLI as a subprocess against a real upstream; which worker a connection landed on is
read from its BackendKeyData process id (≡ the worker's index modulo N), which the proxy also answers as
``pg_backend_pid()``."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, start_proxy, write_policy
from psycopg import errors as pg_errors

from sqldp.proxy import ledger, workers

pytestmark = pytest.mark.skipif(not workers.supported(), reason="several workers need Linux's SO_REUSEPORT")

N = 2


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    make_tables(pg_dsn)
    return pg_dsn


def children(pid: int) -> set[int]:
    """The live worker processes of ``pid`` (Linux: /proc/PID/task/PID/children), zombies and the spawn start
    method's resource tracker left out."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except FileNotFoundError:
        return set()
    out = set()
    for c in text.split():
        try:
            state = Path(f"/proc/{c}/stat").read_text().rsplit(")", 1)[1].split()[0]
            command = Path(f"/proc/{c}/cmdline").read_bytes()
        except (FileNotFoundError, IndexError):
            continue
        if state != "Z" and b"resource_tracker" not in command:
            out.add(int(c))
    return out


def workers_of(proc: subprocess.Popen[str], n: int = N, timeout: float = 60.0, gone: int = 0) -> set[int]:
    """The proxy's ``n`` worker processes, once there are that many and ``gone`` is not among them (a killed
    worker takes a moment to go, a restarted one to come)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = children(proc.pid)
        if len(got) == n and gone not in got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"expected {n} workers, got {children(proc.pid)}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def backend_pid(conn: psycopg.Connection) -> int:
    assert conn.info.backend_pid == conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
    return conn.info.backend_pid


def stop(proc: subprocess.Popen[str]) -> str:
    """SIGTERM the proxy and return what it wrote on stderr after starting."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate(timeout=10)
    return err or ""


@pytest.fixture
def many(upstream: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    policy = write_policy(tmp_path / "p.toml", {"carol": {"epsilon_limit": 10.0, "epsilon": 0.25}})
    proc, port = start_proxy(upstream, policy, workers=N)
    try:
        yield proc, port
    finally:
        stop(proc)


def test_concurrent_charges_over_several_workers_never_overspend(
    upstream: str, many: tuple[subprocess.Popen[str], int]
) -> None:
    """16 clients spread over the workers ask 8 private counts each at once: exactly 10 / 0.25 = 40 are paid
    for and answered, whichever process charged them."""
    _, port = many
    answered: list[int] = []
    owners: list[int] = []
    errors: list[str] = []
    start = threading.Barrier(16)

    def client() -> None:
        n = 0
        with psycopg.connect(client_dsn(port, user="carol"), autocommit=True) as conn:
            owners.append(backend_pid(conn) % N)
            start.wait()
            for _ in range(8):
                try:
                    conn.execute("SELECT COUNT(*) FROM visits").fetchone()
                    n += 1
                except pg_errors.ConfigurationLimitExceeded:
                    pass
                except psycopg.Error as exc:
                    errors.append(str(exc))
        answered.append(n)

    threads = [threading.Thread(target=client) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert set(owners) == set(range(N)), owners  # the kernel spread the connections (P(not) = 2⁻¹⁵)
    assert sum(answered) == 40
    with psycopg.connect(upstream) as conn:
        b = ledger.balance(conn, "carol")
        assert b is not None and b.epsilon_spent == b.epsilon_limit == 10
        assert b.queries == 40
        assert ledger.audit(conn) == []


def test_a_cancel_request_reaches_the_worker_that_owns_the_connection(
    many: tuple[subprocess.Popen[str], int],
) -> None:
    """A CancelRequest comes on a new connection, which the kernel hands to any worker; the proxy forwards it
    to the owner. A long public query (a cross join of 3¹⁸ rows, minutes of work) is cancelled within
    moments on connections of each worker, ten rounds in all: were forwarding broken, each round would fail
    with probability 1/2."""
    _, port = many
    slow = "SELECT COUNT(*) FROM " + ", ".join(f"nation n{i}" for i in range(18))
    conns: list[psycopg.Connection] = []
    try:
        while {backend_pid(c) % N for c in conns} != set(range(N)):
            conns.append(psycopg.connect(client_dsn(port, user="carol"), autocommit=True))
            assert len(conns) < 40
        by_worker = {backend_pid(c) % N: c for c in conns}
        for round_ in range(10):
            conn = by_worker[round_ % N]
            timer = threading.Timer(0.3, conn.cancel_safe)
            timer.start()
            t0 = time.perf_counter()
            with pytest.raises(pg_errors.QueryCanceled):
                conn.execute(slow)
            timer.join()
            assert time.perf_counter() - t0 < 5.0
            assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
    finally:
        for c in conns:
            c.close()


def test_kill_9_of_a_worker_mid_query_leaves_the_ledger_consistent_and_the_worker_is_restarted(
    upstream: str, tmp_path: Path
) -> None:
    policy = write_policy(tmp_path / "p.toml", {"dave": {"epsilon_limit": 1000.0, "epsilon": 0.25}})
    proc, port = start_proxy(upstream, policy, workers=N)
    try:
        first = workers_of(proc)
        received = [0]
        lock = threading.Lock()
        stop_clients = threading.Event()
        failed: list[int] = []  # owners of the connections that broke

        def client() -> None:
            with psycopg.connect(client_dsn(port, user="dave"), autocommit=True) as conn:
                owner = backend_pid(conn) % N
                try:
                    for _ in range(2000):
                        if stop_clients.is_set():
                            return
                        conn.execute("SELECT COUNT(*) FROM visits").fetchone()
                        with lock:
                            received[0] += 1
                except psycopg.OperationalError:
                    failed.append(owner)  # its worker was killed under it: expected

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while received[0] < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        # the others go on while the parent starts a new worker
        restarted = workers_of(proc, gone=victim)
        assert victim not in restarted and len(restarted & first) == N - 1
        before = received[0]
        time.sleep(0.5)
        assert received[0] > before or not [t for t in threads if t.is_alive()]
        stop_clients.set()
        for t in threads:
            t.join(timeout=60)
        assert failed and len(set(failed)) == 1  # every broken client was on the killed worker
        # the new worker serves, once it has built its server: new connections reach every worker again
        seen = set()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with psycopg.connect(client_dsn(port, user="dave"), autocommit=True) as conn:
                seen.add(backend_pid(conn) % N)
                assert isinstance(conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0], float)  # type: ignore[index]
            if seen == set(range(N)):
                break
        assert seen == set(range(N))
    finally:
        err = stop(proc)
    assert proc.returncode == 0, err
    assert '"event": "worker_exit"' in err and '"exitcode": -9' in err and '"restarted": true' in err
    assert not any(alive(p) for p in first | restarted)
    with psycopg.connect(upstream) as conn:
        assert ledger.audit(conn) == []  # SUM(charges) = spent
        b = ledger.balance(conn, "dave")
        charges = conn.execute("SELECT COUNT(*) FROM sqldp.budget_charges WHERE analyst = 'dave'").fetchone()
        n_charges = charges[0] if charges else 0
        assert b is not None and b.epsilon_spent == ledger.amount(0.25) * n_charges
        # the shadow database went with the proxy (the last one on this upstream to stop)
        shadows = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE 'sqldp\\_catalog\\_%%' AND "
            "shobj_description(oid, 'pg_database') = 'sqldp catalog of database ' || current_database() || ': ' "
            "|| right(datname, 12)"
        ).fetchone()
        assert shadows == (0,)
    assert received[0] <= n_charges  # every answer a client got was paid for first


def test_workers_die_with_a_killed_parent(upstream: str, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "p.toml", {"erin": {"epsilon_limit": 10.0}})
    proc, port = start_proxy(upstream, policy, workers=N)
    try:
        pids = workers_of(proc)
        with psycopg.connect(client_dsn(port, user="erin"), autocommit=True) as conn:
            conn.execute("SELECT COUNT(*) FROM visits").fetchone()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            deadline = time.monotonic() + 10
            while any(alive(p) for p in pids) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not any(alive(p) for p in pids)  # no orphan goes on answering and charging
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT COUNT(*) FROM visits").fetchone()
    finally:
        stop(proc)


def test_a_worker_that_keeps_dying_stops_the_proxy_loudly(upstream: str, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "p.toml", {"erin": {"epsilon_limit": 10.0}})
    proc, _ = start_proxy(upstream, policy, workers=N)
    try:
        killed: set[int] = set()
        for _ in range(workers.RESTARTS + 1):
            pids = workers_of(proc, gone=max(killed, default=0))
            victim = min(pids)
            os.kill(victim, signal.SIGKILL)
            killed.add(victim)
            if proc.poll() is not None:
                break
        proc.wait(timeout=60)
    finally:
        err = stop(proc)
    assert proc.returncode == 1
    assert "worker processes died within" in err
    assert not any(alive(p) for p in killed)


def test_a_worker_killed_while_it_starts_is_started_again(upstream: str, tmp_path: Path) -> None:
    """A replacement killed before it reports ready counts as one more death (the proxy used to give up at
    once with "could not be restarted"); below the limit the proxy starts it again and keeps serving."""
    policy = write_policy(tmp_path / "p.toml", {"erin": {"epsilon_limit": 10.0}})
    proc, port = start_proxy(upstream, policy, workers=N)
    try:
        first = workers_of(proc)
        victim = min(first)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 30
        starting: set[int] = set()
        while not starting and time.monotonic() < deadline:
            starting = children(proc.pid) - first
            time.sleep(0.005)
        assert starting, "no replacement worker appeared"
        os.kill(starting.pop(), signal.SIGKILL)  # spawn imports sqldp for ~1 s: it has not listened yet
        again = workers_of(proc, gone=victim)
        assert proc.poll() is None and len(again) == N
        with psycopg.connect(client_dsn(port, user="erin"), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        err = stop(proc)
    assert err.count('"restarted": true') == 2 and "while starting" in err and "stopping" not in err


def test_workers_option_is_checked(upstream: str, tmp_path: Path) -> None:
    policy = write_policy(tmp_path / "p.toml", {"erin": {"epsilon_limit": 10.0}})
    from sqldp.cli import main

    for bad in ("0", str(workers.MAX_WORKERS + 1)):
        assert main(["proxy", "--upstream", upstream, "--policy", str(policy), "--workers", bad]) == 2


def test_a_statement_is_analysed_once_per_policy_across_connections(
    upstream: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The connections of one worker share its session's prepared cache: the same statement from three
    connections (and a prepared Describe) is parsed and analysed once; after a policy reload (a new Policy
    object), once more."""
    from sqldp.policy import Policy
    from sqldp.proxy import ThreadedProxy, build

    policy = write_policy(tmp_path / "p.toml", {"erin": {"epsilon_limit": 100.0}})
    with ThreadedProxy(build(upstream, policy)) as proxy:
        session = proxy.built.server.session
        compiled: list[str] = []
        real = session._compile

        def counting(sql: str, **privacy: object) -> object:
            compiled.append(sql)
            return real(sql, **privacy)

        monkeypatch.setattr(session, "_compile", counting)
        query = "SELECT COUNT(*) FROM visits WHERE faculty = 'math'"
        for _ in range(3):
            with psycopg.connect(client_dsn(proxy.port, user="erin"), autocommit=True) as conn:
                assert isinstance(conn.execute(query).fetchone()[0], float)  # type: ignore[index]
                assert isinstance(conn.execute(query, prepare=True).fetchone()[0], float)  # type: ignore[index]
        assert compiled == [query]
        session.policy = Policy.from_file(policy)  # what a reload does: a new policy object
        with psycopg.connect(client_dsn(proxy.port, user="erin"), autocommit=True) as conn:
            conn.execute(query).fetchone()
            conn.execute(query).fetchone()
        assert compiled == [query, query]
