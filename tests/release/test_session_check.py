"""A library Session checks a private query's statements before it charges:
PostgreSQL's parse analysis (a statement it rejects on its text and the schema costs nothing, as in the proxy),
then the planner's row estimate against the session's ``max_estimated_rows``; and its connections carry the
session's statement timeout."""

from __future__ import annotations

import psycopg
import pytest

import sqldp
from sqldp.errors import DatabaseError, InputError, StatementError, TooLargeError
from sqldp.policy import Policy

POLICY = Policy.from_toml('[tables.t]\nrows = "private"\n[tables.t.columns.age]\nrange = [0, 100]\n')


@pytest.fixture
def dsn(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, k INT NOT NULL, age INT NOT NULL, name TEXT NOT NULL)")
        c.execute("INSERT INTO t SELECT i, i, i % 90, 'n' || i FROM generate_series(1, 3000) i")
        c.execute("ANALYZE t")
    return pg_dsn


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT COUNT(SUM(age)) FROM t", "aggregate function calls cannot be nested"),
        ("SELECT COUNT(*) FROM t WHERE name > 5", "operator does not exist: text > integer"),
        ("SELECT COUNT(*) FROM t WHERE age = 'abc'", 'invalid input syntax for type integer: "abc"'),
        # in a scalar subquery: a workflow step, released before the statement
        ("SELECT COUNT(*) FROM t WHERE age > (SELECT AVG(age) FROM t WHERE name > 5)", "operator does not exist"),
    ],
)
def test_a_statement_postgres_rejects_is_not_charged(dsn: str, sql: str, message: str) -> None:
    """These were charged and then failed with a DatabaseError (CLI exit 1, "unreachable database")."""
    session = sqldp.connect(dsn, POLICY, budget=2.0)
    try:
        with pytest.raises(StatementError, match="PostgreSQL refused the query: " + message) as info:
            session.run(sql, epsilon=1.0)
        assert info.value.exit_code == 2 and info.value.sqlstate[:2] in ("42", "22")
        assert session.spent == 0.0 and session.remaining == (2.0, None)
        session.run("SELECT COUNT(*) FROM t", epsilon=1.0)  # the budget still covers what it did
        assert session.spent == 1.0
    finally:
        session.close()


def test_a_query_the_planner_expects_to_be_enormous_is_refused_uncharged(dsn: str) -> None:
    cross = "SELECT COUNT(*) FROM t AS a, t AS b"  # 3000 × 3000 rows expected
    session = sqldp.connect(dsn, POLICY, budget=2.0, max_estimated_rows=1e6, seed=1)
    try:
        with pytest.raises(TooLargeError, match=r"expects a step of 9e\+06 rows .* limit of 1e\+06") as info:
            session.run(cross, epsilon=1.0)
        assert info.value.sqlstate == "54000" and "\n" not in str(info.value)
        with pytest.raises(TooLargeError):
            session.analyze(cross, epsilon=1.0)  # the data owner's analysis runs the same statements
        assert session.spent == 0.0
        assert session.run("SELECT COUNT(*) FROM t AS a, t AS b WHERE a.k = b.k", epsilon=1.0).answer is not None
    finally:
        session.close()
    unlimited = sqldp.connect(dsn, POLICY, max_estimated_rows=0, seed=1)
    try:
        assert unlimited.run(cross, epsilon=1.0).measurements[0][0].true_value == 9_000_000
    finally:
        unlimited.close()


def test_the_statement_timeout_is_the_sessions_and_a_timed_out_release_stays_charged(dsn: str) -> None:
    default = sqldp.connect(dsn, POLICY)
    try:
        with default.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("5min",)
    finally:
        default.close()
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute("UPDATE t SET k = 0")  # one key: 9,000,000 joined pairs, about a second to count
        c.execute("ANALYZE t")
    session = sqldp.connect(dsn, POLICY, budget=2.0, statement_timeout=0.2)
    try:
        with session.connection() as conn:
            assert conn.execute("SHOW statement_timeout").fetchone() == ("200ms",)
        with pytest.raises(DatabaseError, match=r"statement timeout .*statement_timeout") as info:
            session.run("SELECT COUNT(*) FROM t AS a, t AS b WHERE a.k = b.k", epsilon=1.0)
        # the charge stays: "over 200 ms" is a function of the latency the caller sees anyway
        assert info.value.sqlstate == "57014" and info.value.exit_code == 2 and session.spent == 1.0
    finally:
        session.close()


@pytest.mark.parametrize("option", ["statement_timeout", "max_estimated_rows"])
@pytest.mark.parametrize("value", [-1.0, float("nan"), float("inf"), "10"])
def test_a_bad_limit_is_a_one_line_error(dsn: str, option: str, value: object) -> None:
    with pytest.raises(InputError, match=f"{option} must be a finite number ≥ 0"):
        sqldp.connect(dsn, POLICY, **{option: value})
