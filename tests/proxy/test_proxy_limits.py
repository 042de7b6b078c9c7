"""Bounded work per client: oversized messages are skipped with the connection kept, what a connection may keep
is capped, deep nesting is a one-line refusal, and a long parse runs off the event loop."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import _msg, client_dsn, error_fields, make_tables, raw_login, recv_message, write_policy

from sqldp.proxy import ThreadedProxy, build, harmless, ledger
from sqldp.proxy import server as proxy_server

LIMIT = 4096  # max_message_bytes of the proxy below


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    policy = write_policy(
        tmp_path / "policy.toml", {"alice": {"epsilon_limit": 100.0}}, extra=f"[proxy]\nmax_message_bytes = {LIMIT}\n"
    )
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def _until_ready(sock: socket.socket) -> list[tuple[bytes, dict[str, str]]]:
    """The messages up to ReadyForQuery, errors with their fields."""
    out = []
    while True:
        kind, body = recv_message(sock)
        out.append((kind, error_fields(body) if kind == b"E" else {}))
        if kind == b"Z":
            return out


def _lookup(sock: socket.socket) -> None:
    sock.sendall(_msg(b"Q", b"SELECT n_nationkey FROM nation WHERE n_name = 'BRAZIL'\0"))
    assert [k for k, _ in _until_ready(sock)] == [b"T", b"D", b"C", b"Z"]


def test_oversized_messages_are_skipped_and_the_connection_kept(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    # simple protocol: ErrorResponse, ReadyForQuery, then the next query is served
    sock.sendall(_msg(b"Q", b"SELECT 1 /*" + b"x" * (2 * LIMIT) + b"*/\0"))
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"]
    assert got[0][1]["C"] == "54000" and str(LIMIT) in got[0][1]["M"]
    _lookup(sock)
    # extended protocol: the error, then everything up to Sync skipped (§55.2.3)
    sock.sendall(
        _msg(b"P", b"\0SELECT 1 /*" + b"x" * (2 * LIMIT) + b"*/\0\0\0")
        + _msg(b"B", b"\0\0\0\0\0\0\0\0")
        + _msg(b"E", b"\0\0\0\0\0")
        + _msg(b"S", b"")
    )
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[0][1]["C"] == "54000"
    _lookup(sock)
    sock.close()


def test_prepared_statements_and_portals_per_connection_are_capped(
    proxy: ThreadedProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = b"-- " + b"x" * (LIMIT - 100) + b"\nSELECT 1"
    monkeypatch.setattr(proxy_server, "MAX_PREPARED_BYTES", 10 * len(big) + 3000)  # room for 10 big, 375 small
    sock = raw_login(proxy.port)

    def parse(name: bytes, text: bytes = b"SELECT 1") -> list[tuple[bytes, dict[str, str]]]:
        sock.sendall(_msg(b"P", name + b"\0" + text + b"\0\0\0") + _msg(b"S", b""))
        return _until_ready(sock)

    # bytes: ten statements of almost LIMIT bytes fit, the eleventh does not
    for i in range(10):
        assert parse(b"big%d" % i, big)[0][0] == b"1"
    got = parse(b"big10", big)
    assert got[0][0] == b"E" and got[0][1]["C"] == "54000" and "close some" in got[0][1]["M"]
    sock.sendall(_msg(b"C", b"Sbig0\0") + _msg(b"S", b""))  # closing one makes room
    assert [k for k, _ in _until_ready(sock)] == [b"3", b"Z"]
    assert parse(b"big10", big)[0][0] == b"1"
    # count: MAX_PREPARED named statements in all
    for i in range(proxy_server.MAX_PREPARED - 10):
        assert parse(b"s%d" % i)[0][0] == b"1", i
    got = parse(b"one-too-many")
    assert got[0][0] == b"E" and got[0][1]["C"] == "54000"
    assert parse(b"")[0][0] == b"1"  # the unnamed statement is replaced, not kept: always allowed
    # portals
    sock.sendall(b"".join(_msg(b"B", b"p%d\0\0\0\0\0\0\0\0" % i) for i in range(proxy_server.MAX_PORTALS + 1)))
    sock.sendall(_msg(b"S", b""))
    got = _until_ready(sock)
    assert [k for k, _ in got].count(b"2") == proxy_server.MAX_PORTALS and got[-2][1]["C"] == "54000"
    _lookup(sock)
    sock.close()


def test_deep_nesting_is_a_one_line_refusal_without_traceback(
    proxy: ThreadedProxy, caplog: pytest.LogCaptureFixture
) -> None:
    depth = 1800  # over what sqlglot's recursive parser and the analyses manage, under the message limit
    caplog.set_level(logging.INFO, logger="sqldp.proxy")
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql in (
            "SELECT " + "(" * depth + "1" + ")" * depth,  # no FROM: the proxy's own constant answers
            "SELECT COUNT(*) FROM visits WHERE " + "(" * depth + "minutes > 1" + ")" * depth,
        ):
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            assert info.value.sqlstate != "XX000" and "\n" not in (info.value.diag.message_primary or "")
            assert str(info.value).startswith(info.value.diag.message_primary or "")  # then libpq's caret, if P
            assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
    assert not [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]


@pytest.fixture
def roomy_proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 100.0}})
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def test_a_long_parse_does_not_stall_other_clients(roomy_proxy: ThreadedProxy) -> None:
    """A constant SELECT of many terms takes sqlglot seconds to parse; meanwhile another client's SELECT 1 is
    answered promptly (the parse ran on the event loop, and every client waited for it)."""
    proxy = roomy_proxy
    slow = "SELECT " + "+".join(["1"] * 60_000)  # ≈ 120 kB
    big = psycopg.conninfo.make_conninfo(client_dsn(proxy.port))
    done = threading.Event()
    took: list[float] = []

    def long_one() -> None:
        t0 = time.perf_counter()
        with psycopg.connect(big, autocommit=True) as conn, pytest.raises(psycopg.Error):
            conn.execute(slow)  # refused in the end (a constant SELECT the proxy does not answer)
        took.append(time.perf_counter() - t0)
        done.set()

    waits = []
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        conn.execute("SELECT 1")
        worker = threading.Thread(target=long_one)
        worker.start()
        time.sleep(0.1)
        while not done.is_set():
            t0 = time.perf_counter()
            assert conn.execute("SELECT 1").fetchone() == (1,)
            waits.append(time.perf_counter() - t0)
            time.sleep(0.01)
        worker.join()
    # the part of the work that ran on the event loop before: the proxy's own parse for constant SELECTs
    t0 = time.perf_counter()
    assert harmless.constant_select(slow, {}) is None
    on_loop = time.perf_counter() - t0
    print(f"long query {took[0]:.2f} s (its parse {on_loop:.2f} s), other client max {max(waits) * 1000:.0f} ms")
    assert on_loop > 0.3, on_loop  # long enough for the comparison to mean something
    assert len(waits) >= 5 and max(waits) < on_loop / 2, (max(waits), on_loop)


def test_a_parameter_in_a_simple_query_is_refused_by_the_proxy(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"Q", b"SELECT n_name FROM nation WHERE n_nationkey = $1\0"))
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[0][1]["C"] == "42P02", got  # it was 08000 from upstream
    _lookup(sock)
    sock.close()


def test_a_cancel_request_is_answered_at_once_and_nothing_is_charged(
    roomy_proxy: ThreadedProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = roomy_proxy.built.server.session
    real = session.prepare

    def slow_analysis(sql: str, **privacy: object) -> object:  # an analysis that takes 5 s
        time.sleep(5)
        return real(sql, **privacy)

    monkeypatch.setattr(session, "prepare", slow_analysis)
    with psycopg.connect(client_dsn(roomy_proxy.port), autocommit=True) as conn:
        timer = threading.Timer(0.5, conn.cancel_safe)
        timer.start()
        t0 = time.perf_counter()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT COUNT(*) FROM visits")
        took = time.perf_counter() - t0
        timer.join()
        assert took < 2.5, took  # it was the whole analysis (5 s) before
        monkeypatch.setattr(session, "prepare", real)
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
    time.sleep(5)  # the abandoned analysis finishes, finds the cancel and does not charge
    with psycopg.connect(pg_dsn) as admin:
        balance = ledger.balance(admin, "alice")
        assert balance is None or float(balance.epsilon_spent) == 0.0


def test_an_internal_error_is_one_log_line_and_the_connection_stays(
    roomy_proxy: ThreadedProxy, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    session = roomy_proxy.built.server.session
    real = session.prepare

    def broken(sql: str, **privacy: object) -> object:
        if "visits" in sql:
            raise ValueError("a bug in the analysis\nsecond line")
        return real(sql, **privacy)

    monkeypatch.setattr(session, "prepare", broken)
    caplog.set_level(logging.INFO, logger="sqldp.proxy")
    with psycopg.connect(client_dsn(roomy_proxy.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InternalError_) as info:
            conn.execute("SELECT COUNT(*) FROM visits")
        assert "nothing was released" in str(info.value)
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
    records = [r for r in caplog.records if r.name == "sqldp.proxy"]
    assert not [r for r in records if r.exc_info or r.exc_text or "\n" in r.getMessage()]
    assert [r.getMessage() for r in records if "internal_error" in r.getMessage() and "ValueError" in r.getMessage()]
