"""The two-connection path of the PostgreSQL engine (sqldp.engine.postgres): the answer and the sensitivity
statements taken from one queue by two connections in one exported snapshot, a statement of independent scalar
subqueries run as one statement per subquery (``parts``). The figures are those of the one-connection path,
the spare connection reads the exported snapshot, and a failing statement fails the release as before without
leaving a connection behind.

Mutants these tests kill: the parts joined in another order or one dropped (figures differ from the pipelined
path); the spare connection without ``SET TRANSACTION SNAPSHOT`` (it sees the late row); a failure swallowed,
or the failed transaction's connection kept idle in the engine (error expected, connection states checked);
``parts`` splitting a SELECT with a FROM or with a non-subquery item (a row per part would change); ``layout``
putting a one-row source's columns back at another source's place."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlglot import exp

import sqldp
from sqldp.engine.base import Speed
from sqldp.engine.postgres import engine as postgres
from sqldp.errors import DatabaseError, RefusedError
from sqldp.rewrite import Statements
from sqldp.runner import Prepared

QUERIES = Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries"
SLOW = 10.0  # a last run this slow (seconds) takes the two-connection path next time


def test_parts_split_a_select_of_scalar_subqueries_only(pg_dsn: str) -> None:
    whole = "SELECT (SELECT COUNT(*) FROM t) AS v0, (SELECT MAX(x) FROM t WHERE x > 1) AS v1, (SELECT 2) AS v2"
    assert postgres.parts(whole) == (
        "SELECT (SELECT COUNT(*) FROM t) AS v0",
        "SELECT (SELECT MAX(x) FROM t WHERE x > 1) AS v1",
        "SELECT (SELECT 2) AS v2",
    )
    for kept in (
        "SELECT (SELECT COUNT(*) FROM t) AS v0",  # one item: nothing to share
        "SELECT (SELECT COUNT(*) FROM t) AS v0, (SELECT 1) AS v1 FROM t",  # a FROM: a row per row of t
        "SELECT (SELECT COUNT(*) FROM t) AS v0, generate_series(1, 2) AS v1",  # a set-returning item
        "SELECT (SELECT COUNT(*) FROM t) AS v0, (SELECT 1) AS v1 LIMIT 0",  # no row at all
        "SELECT (SELECT COUNT(*) FROM t) AS v0, (SELECT 1) AS v1 WHERE FALSE",
        "SELECT (SELECT COUNT(*) FROM t)  AS v0, (SELECT 1) AS v1",  # not written back as read: kept whole
        "SELECT COUNT(*) FROM t",
    ):
        assert postgres.parts(kept) == (kept,), kept
    # on PostgreSQL the parts' one-row answers side by side are the whole statement's row
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); INSERT INTO t SELECT g FROM generate_series(1, 50) g")
        row = conn.execute(whole).fetchall()
        pieces = [conn.execute(p).fetchall() for p in postgres.parts(whole)]
    assert all(len(p) == 1 for p in pieces) and [tuple(v for p in pieces for v in p[0])] == row == [(50, 50, 2)]


def test_layout_splits_one_row_sources_one_piece_each(pg_dsn: str) -> None:
    """A SELECT of the columns of several one-row sources (the row statement's shared scans, Q10's g0 and g1) is
    one piece per source, the source's own SELECT, with or without scalar subqueries beside them; the pieces'
    rows side by side, put back in the items' order, are the whole statement's row, whatever order the items
    read the sources in. A source two statements read under other aliases and columns is one text (run once)."""
    s0 = "SELECT COUNT(*) AS total, MAX(x) AS best FROM t"
    s1 = "SELECT SUM(x) AS total, MIN(x) AS best FROM t WHERE x > 10"
    cases = {
        f"SELECT g1.total AS v0, g0.total AS v1, g0.best AS v2, g1.best AS v3 FROM ({s0}) AS g0 CROSS JOIN ({s1}) "
        "AS g1": ((s0, s1), (2, 0, 1, 3)),
        f"SELECT g1.best AS v0, (SELECT MAX(x) FROM t WHERE x < 5) AS v1, g0.total AS v2 FROM ({s0}) AS g0 CROSS "
        f"JOIN ({s1}) AS g1": (("SELECT (SELECT MAX(x) FROM t WHERE x < 5) AS v1", s0, s1), (4, 0, 1)),
        f"SELECT g5.best AS v7, (SELECT 1) AS v8 FROM ({s1}) AS g5": (("SELECT (SELECT 1) AS v8", s1), (2, 0)),
    }
    # one source and no scalar subquery: nothing to share
    alone = f"SELECT g0.best AS v0, g0.total AS v1 FROM ({s0}) AS g0"
    assert postgres.layout(alone) == ((alone,), None)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); INSERT INTO t SELECT g FROM generate_series(1, 50) g")
        for whole, expected in cases.items():
            texts, order = postgres.layout(whole)
            assert (texts, order) == expected
            (row,) = conn.execute(whole).fetchall()
            side = tuple(v for text in texts for v in conn.execute(text).fetchall()[0])
            assert order is not None and tuple(side[k] for k in order) == row, whole


def _figures(prepared: Prepared, last: float) -> dict[str, Any]:
    """The audit figures of one run taking the path ``last`` selects (without the timings)."""
    prepared.speed.last = last
    out = prepared.analyze().to_json(audit=True)
    out.pop("timings_ms", None)
    return out


@pytest.mark.parametrize("policy", ["tpch", "tpch_catalog"])
def test_tpch_figures_are_the_pipelined_ones(tpch_dsn: tuple[str, Any, Any], policy: str) -> None:
    """Every audited figure (true values, sensitivities, smooth bounds, the chosen β …) of every answered
    TPC-H query at SF 0.01 is the same, at full precision, on one connection (pipelined) and on two sharing a
    queue — the first two-connection run in the given order, the second longest first."""
    session = sqldp.connect(tpch_dsn[0], policy=policy)
    answered, split = 0, 0
    for path in sorted(QUERIES.glob("q*.sql")):
        sql = path.read_text(encoding="utf-8")
        try:
            try:
                prepared = session.prepare(sql, epsilon=1.0)
            except RefusedError as refusal:
                if "δ > 0" not in str(refusal):
                    raise
                prepared = session.prepare(sql, epsilon=1.0, mechanism="laplace", delta=1e-6)
        except RefusedError:
            continue
        if not isinstance(prepared, Prepared) or prepared.public or prepared.statements is None:
            continue  # workflows and selections run Prepared ones; public queries read no sensitivity
        answered += 1
        split += sum(len(postgres.parts(q)) > 1 for q in prepared.statements.queries)
        pipelined = _figures(prepared, 0.0)
        prepared.speed.each.clear()
        assert _figures(prepared, SLOW) == pipelined, path.stem
        if prepared.statements.queries:
            assert prepared.speed.each, path.stem  # the two-connection path ran and timed each unit
        assert _figures(prepared, SLOW) == pipelined, path.stem  # longest first
    assert answered >= 10 and split >= 3  # the split row statements (Q4, Q5, Q7 …) were among them
    session.close()


@pytest.fixture
def table(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (name TEXT PRIMARY KEY, time INT)")
        conn.execute("INSERT INTO t SELECT 's' || g, g % 61 FROM generate_series(1, 300) g")
    yield pg_dsn


def _statements(answer: str, queries: tuple[str, ...]) -> Statements:
    return Statements(answer, queries, (), {}, exp.select("1"))


def test_the_spare_connection_reads_the_exported_snapshot(table: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row committed after the snapshot was exported (here, just before the spare connection starts) is not
    seen by the parts the spare connection runs (their backend is not the answer's)."""
    dsn = table
    engine = postgres.PostgresEngine(dsn)
    spare = engine._spare_connection

    @contextmanager
    def late() -> Iterator[psycopg.Connection]:
        with psycopg.connect(dsn, autocommit=True) as writer:
            writer.execute("INSERT INTO t VALUES ('late', 5)")
        with spare() as conn:  # type: ignore[union-attr]
            yield conn

    monkeypatch.setattr(engine, "_spare_connection", late)
    # the answer keeps its connection busy for a while: the spare one takes the parts meanwhile
    answer = "SELECT COUNT(*), pg_backend_pid() FROM t, pg_sleep(1)"
    queries = ("SELECT (SELECT COUNT(*) FROM t) AS a, (SELECT pg_backend_pid()) AS b, (SELECT COUNT(*) FROM t) AS c",)
    with engine.connection() as conn:
        before = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]  # type: ignore[index]
        rows, _, _ = engine._answer_and_queries(conn, _statements(answer, queries), Speed(last=SLOW))
        postgres.end(conn)
        after = conn.execute("SELECT COUNT(*) FROM t").fetchone()[0]  # type: ignore[index]
    (count, pid), ((a, other, c),) = rows[0][0], rows[1]
    assert other != pid  # the parts ran on the spare connection
    assert count == a == c == before and after == before + 1
    engine.close()


def _connections(dsn: str) -> list[tuple[str, str]]:
    """The other backends on this database: (state, query)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(
            "SELECT state, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        ).fetchall()


def _settled(dsn: str, opened: int) -> list[tuple[str, str]]:
    """The backends once those of closed connections are gone: a backend leaves pg_stat_activity a moment
    after its client closed the connection (a connection the engine keeps stays, whatever its state)."""
    deadline = time.monotonic() + 5.0
    states = _connections(dsn)
    while time.monotonic() < deadline and (len(states) > opened or any(s != "idle" for s, _ in states)):
        time.sleep(0.05)
        states = _connections(dsn)
    return states


@pytest.mark.parametrize("pooled", [False, True])
def test_a_failing_statement_fails_the_release_cleanly(table: str, pooled: bool) -> None:
    """A statement that fails on either connection fails the run with the error the one-connection path gives
    (a DatabaseError with PostgreSQL's SQLSTATE), no connection is left in a transaction or open beyond those
    the engine keeps, and the engine answers the next run."""
    dsn = table
    pool = None
    if pooled:
        from psycopg_pool import ConnectionPool

        pool = ConnectionPool(
            dsn, min_size=2, max_size=2, kwargs={"autocommit": True}, configure=postgres.configure, open=True
        )
        pool.wait()
    engine = postgres.PostgresEngine(dsn, pool=pool)
    ok = _statements("SELECT COUNT(*) FROM t", ("SELECT (SELECT COUNT(*) FROM t) AS a, (SELECT 1) AS b",))
    assert engine.execute(ok, Speed(last=SLOW)).queries == [[(300, 1)]]  # both connections opened once
    opened = len(_connections(dsn))
    failing = "SELECT (SELECT COUNT(*) FROM t) AS a, (SELECT 1 / (MIN(time) - MIN(time)) FROM t) AS b"
    for answer, queries in (
        ("SELECT COUNT(*) FROM t, pg_sleep(0.3)", (failing, "SELECT COUNT(*) FROM t")),  # fails on the spare
        ("SELECT COUNT(*) / (MIN(time) - MIN(time)) FROM t", ("SELECT COUNT(*) FROM t, pg_sleep(0.3)",)),  # here
    ):
        errors = []
        for last in (0.0, SLOW):  # the one-connection path, then the two-connection one
            with pytest.raises(DatabaseError) as caught:
                engine.execute(_statements(answer, queries), Speed(last=last))
            errors.append((type(caught.value), caught.value.sqlstate))
        assert errors[0] == errors[1] == (DatabaseError, "22012")
        states = _settled(dsn, opened)
        assert all(state == "idle" for state, _ in states), states
        assert len(states) <= opened, states  # none left open beyond those the engine (or the pool) keeps
    # the engine still answers, on two connections
    assert engine.execute(ok, Speed(last=SLOW)).queries == [[(300, 1)]]
    engine.close()
    if pool is not None:
        pool.close()
