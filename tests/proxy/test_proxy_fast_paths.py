"""The proxy's fast paths (docs/proxy.md, "Fast paths"): public statements answered on the event loop with
PostgreSQL's own bytes, the analysis cache under private statements, and the ledger's group commit."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build, ledger, passthrough

PUBLIC = "SELECT n_name, n_nationkey, n_nationkey * 1.5 AS half, NULL::text AS nothing FROM nation ORDER BY 2"


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    make_tables(pg_dsn)
    return pg_dsn


@pytest.fixture
def proxy(upstream: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    analysts = {"alice": {"epsilon_limit": 100.0, "epsilon": 0.01}, "bob": {"epsilon_limit": 5}}
    policy = write_policy(tmp_path / "policy.toml", analysts)
    with ThreadedProxy(build(upstream, policy)) as p:
        yield p


def values(cur: psycopg.Cursor[Any]) -> list[list[bytes | None]]:
    """Every value of the cursor's result as the bytes the server sent (no decoding)."""
    res = cur.pgresult
    assert res is not None
    return [[res.get_value(r, c) for c in range(res.nfields)] for r in range(res.ntuples)]


def pool(proxy: ThreadedProxy) -> passthrough.Pool:
    return proxy.built.server.passthrough


def on_loop(proxy: ThreadedProxy, coro: Any) -> Any:
    return asyncio.run_coroutine_threadsafe(coro, proxy._loop).result(timeout=10)


def spent(dsn: str, analyst: str) -> float:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, analyst)
        assert b is not None
        return float(b.epsilon_spent)


def test_public_fast_path_sends_postgresql_bytes_and_the_checked_statement(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(upstream, autocommit=True) as direct:
        expected = values(direct.execute(PUBLIC))
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        first = values(conn.execute(PUBLIC))  # analysed, answered by the runner, the analysis kept
        before = pool(proxy).answers
        # the extended protocol, unnamed and named (psycopg prepares from the 5th) statements, and simple Query
        got = [values(conn.execute(PUBLIC)) for _ in range(6)]
        simple = values(psycopg.ClientCursor(conn).execute(PUBLIC))
        assert pool(proxy).answers - before == 7  # every one of them on the fast path
        # a parameter bound into the text is the same statement for the analysis, another for the cache
        one = conn.execute("SELECT n_name FROM nation WHERE n_nationkey = %s", (2,))
        assert one.fetchall() == [("ARGENTINA",)]
    assert first == expected and simple == expected and all(g == expected for g in got)
    assert expected[0] == [b"ALGERIA", b"1", b"1.5", None]
    # what the fast path's connection ran last is the statement sqldp checked (regenerated from its tree), never
    # the client's text
    sent = "select   n_name from nation where n_nationkey=3"
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for _ in range(3):
            assert conn.execute(sent).fetchall() == [("BRAZIL",)]
    known = proxy.built.server.session.cached(sent, **proxy.built.config.analysts["alice"].privacy)
    checked = getattr(getattr(known, "form", None), "checked_sql", "")
    assert checked and checked != sent
    pids = [up.conn.info.backend_pid for up in pool(proxy).idle]
    with psycopg.connect(upstream, autocommit=True) as owner:
        ran = owner.execute("SELECT query FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)).fetchall()
    assert (checked,) in ran and (sent,) not in ran


def test_a_setting_of_one_client_does_not_reach_another(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(upstream, autocommit=True) as direct:
        expected = values(direct.execute(PUBLIC))
    with (
        psycopg.connect(client_dsn(proxy.port), autocommit=True) as a,
        psycopg.connect(client_dsn(proxy.port, user="bob"), autocommit=True) as b,
    ):
        for conn in (a, b):
            conn.execute(PUBLIC)  # the analysis kept for both analysts
        a.execute("SET extra_float_digits = 0")
        a.execute("SET application_name = 'alice-tool'")
        with pytest.raises(psycopg.Error):  # a function that changes the session is refused by the allow-list
            a.execute("SELECT set_config('extra_float_digits', '-15', false) FROM nation")
        with pytest.raises(psycopg.Error):  # and a setting the proxy does not keep for the session
            a.execute("SET statement_timeout = 1")
        for _ in range(3):
            values(a.execute(PUBLIC))
            assert values(b.execute(PUBLIC)) == expected
        assert b.execute("SHOW application_name").fetchone() != ("alice-tool",)
        assert b.execute("SHOW extra_float_digits").fetchone() == ("1",)
    # every fast-path connection still has the session state it had after its set-up
    for up in pool(proxy).idle:
        assert on_loop(proxy, up.state()) == up.baseline
    assert pool(proxy).discarded == 0


def test_a_connection_whose_state_changed_is_closed(proxy: ThreadedProxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """The comparison behind the argument: a connection left with a setting (here set behind the proxy's back)
    is found at its next check and closed, never handed out again."""
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        conn.execute(PUBLIC)
        conn.execute(PUBLIC)
        ups = list(pool(proxy).idle)
        assert ups
        for up in ups:
            on_loop(proxy, up.query("SET work_mem = '2MB'"))
        monkeypatch.setattr(passthrough, "CHECK_EVERY", 1)
        conn.execute(PUBLIC)
    assert pool(proxy).discarded >= 1
    assert not any(up in pool(proxy).idle for up in ups[-1:])


def test_a_cached_private_statement_is_charged_and_noisy_every_time(proxy: ThreadedProxy, upstream: str) -> None:
    query = "SELECT COUNT(*) FROM visits WHERE faculty = 'math'"
    session = proxy.built.server.session
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        answers = [conn.execute(query).fetchone() for _ in range(4)]
        assert session.cached(query, **proxy.built.config.analysts["alice"].privacy) is not None
        answers += [psycopg.ClientCursor(conn).execute(query).fetchone() for _ in range(4)]
    assert pool(proxy).answers == 0  # a private statement never takes the public fast path
    assert spent(upstream, "alice") == pytest.approx(0.08)  # ε = 0.01 each, charged at every execution
    # fresh noise each time (Laplace of scale 100, rounded): a cache of the noisy answer would repeat one, and
    # fewer than 5 distinct of 8 draws has a probability under 1e-6
    assert len(set(answers)) >= 5


def test_group_commit_batches_charges_in_one_transaction(upstream: str, tmp_path: Path) -> None:
    from psycopg_pool import ConnectionPool

    with psycopg.connect(upstream, autocommit=True) as conn:
        ledger.ensure(conn)
        ledger.sync_limits(conn, [("carol", 3.5, 0.0), ("dan", 100.0, 0.0)])
    with ConnectionPool(upstream, min_size=1, max_size=4, kwargs={"autocommit": True}) as p:
        group = ledger.GroupCommit(p)
        batch = [ledger._Charge("carol", ledger.amount(1.5), ledger.amount(0), "f") for _ in range(3)]
        group._write(batch)  # one BEGIN … COMMIT: the third passes carol's limit and is refused alone
        assert [r.row is not None for r in batch] == [True, True, False]
        bad = [ledger._Charge("dan", ledger.amount(1), ledger.amount(0), "f"), ledger._Charge("dan", -5, 0, "f")]
        with pytest.raises(psycopg.Error):  # a failing charge fails its batch: none of it is committed
            group._write(bad)
        # concurrent charges through charge(): each returns once committed, the ledger adds up
        errors: list[BaseException] = []

        def charge() -> None:
            try:
                for _ in range(25):
                    group.charge("dan", 0.25, 0.0, "g")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=charge) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and group.charges == 3 + 150  # carol's batch of three and dan's 150 (written, refused or not)
        with p.connection() as conn:
            assert ledger.audit(conn) == []
            b = ledger.balance(conn, "dan")
            c = ledger.balance(conn, "carol")
    assert b is not None and float(b.epsilon_spent) == 37.5 and b.queries == 150
    assert c is not None and float(c.epsilon_spent) == 3.0
    with (
        pytest.raises(ledger.BudgetExhaustedError),
        ConnectionPool(upstream, min_size=1, max_size=2, kwargs={"autocommit": True}) as p2,
    ):
        ledger.GroupCommit(p2).charge("carol", 1.0, 0.0, "h")
