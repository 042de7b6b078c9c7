"""Expressions PostgreSQL may fail on (``sqldp.sensitivity.failures``): an error in place of the noisy answer
reveals the data, so such expressions are refused before any query runs.

Oracles: (1) every expression the check accepts is evaluated by PostgreSQL without error at every point of an
adversarial grid (zeros, negatives, fractions; overflow is the documented exception and skipped), over random
expressions (hypothesis); (2) each refused shape does fail in PostgreSQL on a one-row table, and its safe
spelling is answered; (3) end to end, the refused query reads nothing: a table whose only row would make it
fail gives a refusal, not PostgreSQL's error.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import psycopg
import pytest
import sqlglot
from conftest import loaded_database
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import sqldp
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity.failures import failure

KINDS = {"a": "integer", "x": "numeric", "s": "text", "d": "date"}


def _kind(ref: ColumnRef) -> str:
    return KINDS[ref.column]


GRID = """
CREATE TABLE t AS
SELECT a, x, s, DATE '2020-01-01' + a AS d
FROM generate_series(-3, 3) a, unnest(ARRAY[-2, -0.5, 0, 0.5, 2]::numeric[]) x, unnest(ARRAY['1', 'x', '', E'\\\\']) s;
CREATE TABLE empty AS SELECT * FROM t WHERE false
"""


@pytest.fixture(scope="module")
def conn(pg_server_dsn: str) -> Iterator[psycopg.Connection]:
    with loaded_database(pg_server_dsn, GRID) as c:
        yield c


def _accepted(sql: str) -> bool:
    return all(failure(node, _kind) is None for node in sqlglot.parse_one(sql, read="postgres").walk())


numbers = st.sampled_from(["t.a", "t.x", "0", "1", "2.5", "-1"])


def _grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.sampled_from(
        [
            "ABS({})",
            "SQRT({})",
            "LN({})",
            "POWER({}, 0.5)",
            "POWER({}, 2)",
            "POWER({}, -1)",
            "NULLIF({}, 0)",
            "CAST({} AS INTEGER)",
            "CAST({} AS DOUBLE PRECISION)",
            "CAST(CAST({} AS TEXT) AS NUMERIC)",
        ]
    )
    binary = st.sampled_from(["({}) + ({})", "({}) * ({})", "({}) / ({})", "({}) % ({})", "GREATEST({}, {})"])
    return st.one_of(
        st.builds(lambda f, e: f.format(e), unary, inner),
        st.builds(lambda f, e1, e2: f.format(e1, e2), binary, inner, inner),
        st.builds(lambda e: f"({e}) / NULLIF(t.a, 0)", inner),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=st.recursive(numbers, _grow, max_leaves=4))
@example(sql="t.x / NULLIF(t.a, 0)")
@example(sql="t.x / (1 - 1)")  # a constant divisor that is 0: fails on rows, not on an empty table
@example(sql="t.x / CAST(0.4 AS INTEGER)")  # rounds to 0
@example(sql="POWER(ABS(t.x), -1)")  # 0 to a negative power
@example(sql="SQRT(t.x * t.x + POWER(t.a, 2))")
@example(sql="POWER(ABS(t.x), 1.5)")
def test_what_the_check_accepts_postgresql_evaluates_everywhere(conn: psycopg.Connection, sql: str) -> None:
    """An accepted expression may still fail on constants alone (LN(0), 1 / 0): PostgreSQL folds those when it
    plans, so the same expression fails over an empty table too — the error does not depend on the data."""
    if not _accepted(sql):
        return
    try:
        conn.execute(f"SELECT count({sql}) FROM t").fetchone()
    except psycopg.errors.UndefinedFunction:
        return  # an operator PostgreSQL does not have for these types (integer % double): not about data
    except psycopg.errors.NumericValueOutOfRange:
        pass  # overflow: documented as not covered
    except psycopg.DataError:
        with pytest.raises(psycopg.DataError):
            conn.execute(f"SELECT count({sql}) FROM empty AS t").fetchone()


@pytest.mark.parametrize(
    ("expr", "safe"),
    [
        ("1 / t.a", "1 / NULLIF(t.a, 0)"),
        ("t.x % t.a", "t.x % NULLIF(t.a, 0)"),
        ("SQRT(t.x)", "SQRT(ABS(t.x))"),
        ("LN(t.x)", None),
        ("POWER(t.x, 0.5)", "POWER(GREATEST(t.x, 0), 0.5)"),
        ("POWER(t.a, -1)", None),
        ("POWER(t.x, t.a)", None),
        ("CAST(t.s AS INTEGER)", None),
        ("CAST(t.s AS DATE)", "CAST(t.d AS DATE)"),
        ("SUBSTRING(t.s FROM 1 FOR t.a)", "SUBSTRING(t.s FROM 1 FOR 2)"),
        ("'a' LIKE t.s", "t.s LIKE 'a%'"),
        ("MAKE_DATE(t.a, 1, 1)", "EXTRACT(YEAR FROM t.d)"),  # year 0 does not exist; not in the list
        ("TO_NUMBER(t.s, '9')", "LENGTH(t.s)"),
    ],
)
def test_each_refused_shape_fails_in_postgresql_and_its_safe_spelling_does_not(
    conn: psycopg.Connection, expr: str, safe: str | None
) -> None:
    assert not _accepted(expr)
    with pytest.raises(psycopg.DataError):
        conn.execute(f"SELECT count({expr}) FROM t").fetchone()
    if safe is not None:
        assert _accepted(safe)
        conn.execute(f"SELECT count({safe}) FROM t").fetchone()


@pytest.mark.parametrize(
    "query",
    [
        "SELECT COUNT(*) FROM t WHERE 6 / t.a > 1",
        "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND 6 / u.b > 1",  # u is public; its conjunct is still refused
        "SELECT SUM(t.a) FROM t WHERE SQRT(t.a - 1) > 0",
        "SELECT COUNT(t.k / t.a) FROM t",
        "SELECT SUM(t.x) FROM t WHERE t.x / t.a > 1",  # value-level
        "SELECT SUM(POWER(t.x - 1, 1.5)) FROM t",  # value-level: a fractional power of x − 1 < 0
    ],
)
def test_a_query_that_would_fail_on_the_data_is_refused_before_reading_it(pg_dsn: str, query: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, k INT, a INT, x NUMERIC(6, 2))")
        c.execute("CREATE TABLE u (id INT PRIMARY KEY, k INT, b INT)")
        c.execute("INSERT INTO t VALUES (1, 0, 0, 0.5)")
        c.execute("INSERT INTO u VALUES (1, 0, 0)")
        with pytest.raises(psycopg.DataError):  # the plain query fails on this row
            c.execute(query)
    norm = 'norm = "l1(x)"\n' if "t.x" in query else ""
    policy = Policy.from_toml(
        f'[tables.t]\nrows = "private"\n{norm}[tables.t.columns.a]\nrange = [0, 9]\n'
        '[tables.t.columns.x]\nrange = [0, 9]\n[tables.u]\nrows = "public"\n'
    )
    session = sqldp.connect(pg_dsn, policy=policy)
    with pytest.raises(RefusedError, match="PostgreSQL would fail on such data") as err:
        session.run(query, epsilon=1.0)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("query", "plain"),
    [  # (sqldp's query, the same in BIGINT: what PostgreSQL answers without the overflow)
        ("SELECT COUNT(*) FROM t WHERE t.a * 1000000 > 5", "SELECT COUNT(*) FROM t WHERE t.a::int8 * 1000000 > 5"),
        ("SELECT SUM(t.a * t.k) FROM t", "SELECT SUM(t.a::int8 * t.k) FROM t"),  # row-level: clamped, then multiplied
        ("SELECT SUM(t.x) FROM t WHERE t.a + t.k > 2", "SELECT SUM(t.x) FROM t WHERE t.a::int8 + t.k > 2"),  # values
    ],
)
def test_integer_overflow_runs_in_bigint_instead_of_failing(pg_dsn: str, query: str, plain: str) -> None:
    """INTEGER arithmetic that overflows fails in PostgreSQL, which would reveal the large value; the SQL
    sqldp runs computes it in BIGINT (sqlgen.widen_integers), so the answer comes, with the plain value."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, k INT, a INT, x NUMERIC(6, 2))")
        c.execute("INSERT INTO t VALUES (1, 2000000000, 2000000000, 0.5), (2, 1, 3, 1.5)")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            c.execute(query)
        expected = float(c.execute(plain).fetchone()[0])
    norm = 'norm = "l1(x)"\n' if "t.x" in query else ""
    policy = Policy.from_toml(
        f'[tables.t]\nrows = "private"\n{norm}[tables.t.columns.a]\nrange = [0, 2000000000]\n'
        "[tables.t.columns.k]\nrange = [0, 2000000000]\n[tables.t.columns.x]\nrange = [0, 9]\n"
    )
    result = sqldp.connect(pg_dsn, policy=policy, seed=3).run(query, epsilon=1.0)
    assert result.measurements[0][0].true_value == pytest.approx(expected)


def test_exp_is_capped_under_value_level_privacy_instead_of_overflowing(pg_dsn: str) -> None:
    """The value-level analysis does not clamp the data; EXP(0.05·a) of a = 20,000 overflows double precision
    and fails. sqldp runs EXP(LEAST(g, 300)) (failures.cap_exponentials), which it analyses: answered, with
    the capped value and a finite bound."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, a DOUBLE PRECISION)")
        c.execute("INSERT INTO t VALUES (1, 20000), (2, 10)")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            c.execute("SELECT SUM(EXP(0.05 * t.a)) FROM t")
        expected = float(c.execute("SELECT SUM(EXP(LEAST(0.05 * t.a, 300))) FROM t").fetchone()[0])
    policy = Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(a)"\n')
    session = sqldp.connect(pg_dsn, policy=policy, seed=3)
    m = session.run("SELECT SUM(EXP(0.05 * t.a)) FROM t", epsilon=1.0, beta=0.1).measurements[0][0]
    assert m.true_value == pytest.approx(expected)
    assert math.isfinite(m.sensitivity) and m.sensitivity >= 0.05 * math.exp(0.5)  # the row a = 10: e^0.5·0.05
