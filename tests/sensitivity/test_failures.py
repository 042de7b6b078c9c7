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
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pg_support import loaded_database

import sqldp
from sqldp.catalog import kind_of
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity.failures import failure, value_failure
from sqldp.sensitivity.intervals import Domain
from sqldp.sqlgen import widen_integers

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
    """The value-level analysis does not clamp the data; EXP(0.05·a) of a = 200,000 overflows NUMERIC
    and fails. sqldp runs EXP(LEAST(g, 300)) (failures.cap_exponentials), which it analyses: answered, with
    the capped value and a finite bound. (Over a DOUBLE PRECISION column 0.05·a itself fails for a = 5e−324,
    an underflow: refused, test_values_that_leave_their_type_are_refused_or_never_fail.)"""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, a NUMERIC(12, 2))")
        c.execute("INSERT INTO t VALUES (1, 200000), (2, 10)")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            c.execute("SELECT SUM(EXP(0.05 * t.a)) FROM t")
        expected = float(c.execute("SELECT SUM(EXP(LEAST(0.05 * t.a, 300))) FROM t").fetchone()[0])
    policy = Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(a)"\n')
    session = sqldp.connect(pg_dsn, policy=policy, seed=3)
    m = session.run("SELECT SUM(EXP(0.05 * t.a)) FROM t", epsilon=1.0, beta=0.1).measurements[0][0]
    assert m.true_value == pytest.approx(expected)
    assert math.isfinite(m.sensitivity) and m.sensitivity >= 0.05 * math.exp(0.5)  # the row a = 10: e^0.5·0.05


# -- values that leave their type: D is answered, D plus one row fails in PostgreSQL --------------------------

TYPED = """
CREATE TABLE t (id INT PRIMARY KEY, x INT, y INT, z INT, b BIGINT, f DOUBLE PRECISION, s TEXT, d DATE);
INSERT INTO t VALUES (1, 1, 1, 1, 1, 1.5, 'a', DATE '2020-01-01'), (2, 2, 2, 2, 2, 2.5, 'b', DATE '2020-02-01')
"""
TYPED_POLICY = """
[tables.t]
rows = "private"
[tables.t.columns.x]
range = [0, 1000]
[tables.t.columns.f]
range = [0, 1e18]
"""


def _outcome(session: sqldp.session.Session, query: str) -> str:
    try:
        session.run(query, epsilon=1.0)
    except RefusedError as err:
        assert "\n" not in str(err)
        return "refused"
    except sqldp.errors.DatabaseError as err:
        return f"failed in PostgreSQL: {err}"
    return "answered"


@pytest.mark.parametrize(
    ("query", "row"),
    [
        ("SELECT COUNT(*) FROM t WHERE EXP(t.x) > 1", "x = 710"),
        ("SELECT COUNT(EXP(t.f)) FROM t", "f = 800"),
        ("SELECT COUNT(*) FROM t WHERE EXP(t.f) > 1", "f = -800"),  # underflow
        ("SELECT COUNT(*) FROM t WHERE POWER(t.x, 300) > 0", "x = 20"),
        ("SELECT SUM(CAST(t.x AS NUMERIC(2, 0))) FROM t", "x = 100"),  # row-level: clamped to [0, 1000]
        ("SELECT COUNT(*) FROM t WHERE CAST(t.x AS SMALLINT) > 0", "x = 40000"),
        ("SELECT COUNT(*) FROM t WHERE CAST(t.f AS NUMERIC(3, 1)) > 0", "f = 100"),
        ("SELECT COUNT(*) FROM t WHERE CAST(t.f AS INTEGER) > 0", "f = 'NaN'"),
        ("SELECT COUNT(*) FROM t WHERE t.x = 7 AND SUBSTRING(t.s, 1, -1) = ''", "x = 7"),
        ("SELECT COUNT(*) FROM t WHERE t.x * t.y * t.z > 0", "x = 2000000000, y = 2000000000, z = 2000000000"),
        ("SELECT COUNT(*) FROM t WHERE t.b + 1 > 0", "b = 9223372036854775807"),
        ("SELECT COUNT(*) FROM t WHERE ABS(t.b) > 0", "b = -9223372036854775808"),
        ("SELECT COUNT(*) FROM t WHERE t.f * t.f > 0", "f = 1e200"),
        ("SELECT COUNT(*) FROM t WHERE t.f * t.f > 0", "f = 1e-200"),  # underflow
        ("SELECT COUNT(*) FROM t WHERE t.f * 0.5 > 0", "f = '5e-324'"),
        ("SELECT COUNT(*) FROM t WHERE t.d + 1 > DATE '2020-01-01'", "d = '5874897-12-31'"),
        ("SELECT COUNT(*) FROM t WHERE t.d - DATE '2020-01-01' > 0", "d = 'infinity'"),
        ("SELECT COUNT(*) FROM t WHERE LENGTH(t.s) * 1000000 > 0", "s = repeat('x', 3000)"),
    ],
)
def test_an_error_on_one_more_row_never_answers(pg_dsn: str, query: str, row: str) -> None:
    """Each query is answered on D, and its plain form fails in PostgreSQL on D plus one row: sqldp must give the
    same kind of outcome on both (refused on both, or answered on both), never an error on one only."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(TYPED)
        c.execute(query.replace("SELECT", "SELECT 1,", 1))  # the plain query runs on D
        c.execute(f"INSERT INTO t SELECT 4, x, y, z, b, f, s, d FROM t WHERE id = 1; UPDATE t SET {row} WHERE id = 4")
        with pytest.raises(psycopg.DataError):  # … and fails on D plus the row
            c.execute(query.replace("SELECT", "SELECT 1,", 1))
        c.execute("DELETE FROM t WHERE id = 4")
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(TYPED_POLICY), seed=1)
    before = _outcome(session, query)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(f"INSERT INTO t SELECT 4, x, y, z, b, f, s, d FROM t WHERE id = 1; UPDATE t SET {row} WHERE id = 4")
    after = _outcome(session, query)
    assert before == after, (before, after)
    assert not before.startswith("failed"), before


def test_a_statement_timeout_does_not_answer_for_the_data(pg_dsn: str) -> None:
    """A timeout the data trips is an answer (how many rows share a key decides how long the join takes): sqldp's
    connections set the session's own statement timeout (docs/limits.md), whatever the database configures, so
    the slow D is answered like the fast one (with the database's, PostgreSQL cancels the slow one: "canceling
    statement due to statement timeout")."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, k INT)")
        c.execute("INSERT INTO t SELECT i, i FROM generate_series(1, 3000) i")
        dbname = c.info.dbname
        c.execute(f'ALTER DATABASE "{dbname}" SET statement_timeout = 100')
    policy = Policy.from_toml('[tables.t]\nrows = "private"\n')
    query = "SELECT COUNT(*) FROM t AS t1, t AS t2 WHERE t1.k = t2.k"
    assert sqldp.connect(pg_dsn, policy=policy, seed=1).run(query, epsilon=1.0).measurements[0][0].true_value == 3000
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("UPDATE t SET k = 0")  # one key: 9,000,000 joined pairs
        with pytest.raises(psycopg.errors.QueryCanceled):
            c.execute(query).fetchone()
    result = sqldp.connect(pg_dsn, policy=policy, seed=1).run(query, epsilon=1.0)
    assert result.measurements[0][0].true_value == 3000 * 3000


# each column type's extreme values: every combination of an integer row, a double precision row and a NUMERIC row
EXTREMES = r"""
CREATE TABLE g AS
SELECT i.s, i.a, i.b, fl.f, fl.r, nu.x, nu.n, 'x'::text AS t
FROM (VALUES ('-32768'::int2, '-2147483648'::int4, '-9223372036854775808'::int8), ('-1'::int2, -1, '-1'::int8),
             (0::int2, 0, 0::int8), (1::int2, 1, 1::int8), (32767::int2, 2147483647::int4, 9223372036854775807::int8)
     ) AS i(s, a, b),
     (VALUES (-1.7976931348623157e308::float8, -3.4e38::real), (-1e200::float8, -1e20::real), (-1::float8, -1::real),
             (-5e-324::float8, -1.4e-45::real), (0::float8, 0::real), (5e-324::float8, 1.4e-45::real),
             (1e-200::float8, 1e-30::real), (1::float8, 1::real), (710::float8, 710::real),
             (1.7976931348623157e308::float8, 3.4e38::real), ('NaN'::float8, 'NaN'::real),
             ('Infinity'::float8, 'Infinity'::real), ('-Infinity'::float8, '-Infinity'::real)) AS fl(f, r),
     (VALUES (-9999.99::numeric(6, 2), -9.999999999e131071::numeric), (-0.01, -1::numeric), (0, 0),
             (0.01, power(10::numeric, -16383)), (9999.99, 9.999999999e131071::numeric), ('NaN', 'NaN'),
             (1, 'Infinity'), (-1, '-Infinity')) AS nu(x, n);
CREATE TABLE empty AS SELECT * FROM g WHERE false
"""
EXTREME_TYPES = {
    "s": "SMALLINT",
    "a": "INTEGER",
    "b": "BIGINT",
    "f": "DOUBLE PRECISION",
    "r": "REAL",
    "x": "NUMERIC(6,2)",
    "n": "NUMERIC",
    "t": "TEXT",
}
EXTREME_DOMAIN = Domain(
    range=lambda ref: None,
    kind=lambda ref: kind_of(EXTREME_TYPES[ref.column]),
    type=lambda ref: EXTREME_TYPES[ref.column],
)


@pytest.fixture(scope="module")
def extremes(pg_server_dsn: str) -> Iterator[psycopg.Connection]:
    with loaded_database(pg_server_dsn, EXTREMES) as c:
        yield c


def _accepted_everywhere(sql: str) -> bool:
    e = sqlglot.parse_one(sql, read="postgres")
    if any(failure(node, EXTREME_DOMAIN.kind) is not None for node in e.walk()):
        return False
    return value_failure(e, EXTREME_DOMAIN) is None


leaves = st.sampled_from(["g.s", "g.a", "g.b", "g.f", "g.r", "g.x", "g.n", "0", "1", "2.5", "-1", "700", "1e300"])


def _grow_typed(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.sampled_from(
        [
            "ABS({})",
            "-({})",
            "EXP({})",
            "POWER({}, 2)",
            "POWER({}, 3)",
            "POWER({}, 300)",
            "POWER(ABS({}), 0.5)",
            "SQRT(ABS({}))",
            "ROUND({})",
            "NULLIF({}, 0)",
            "LEAST(GREATEST({}, -100), 100)",
            "LEAST(GREATEST({}, -700), 700)",
            "CAST({} AS SMALLINT)",
            "CAST({} AS INTEGER)",
            "CAST({} AS BIGINT)",
            "CAST({} AS NUMERIC(3, 1))",
            "CAST({} AS NUMERIC)",
            "CAST({} AS REAL)",
            "CAST({} AS DOUBLE PRECISION)",
            "LENGTH(g.t) * ({})",
        ]
    )
    binary = st.sampled_from(
        [
            "({}) + ({})",
            "({}) - ({})",
            "({}) * ({})",
            "({}) / NULLIF({}, 0)",
            "({}) % NULLIF({}, 0)",
            "GREATEST({}, {})",
        ]
    )
    return st.one_of(
        st.builds(lambda f, e: f.format(e), unary, inner),
        st.builds(lambda f, e1, e2: f.format(e1, e2), binary, inner, inner),
    )


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=st.recursive(leaves, _grow_typed, max_leaves=4))
@example(sql="EXP(LEAST(GREATEST(g.f, -700), 700))")
@example(sql="CAST(LEAST(GREATEST(g.f, -100), 100) AS NUMERIC(3, 1))")
@example(sql="CAST(g.f AS NUMERIC) * 0.5")
@example(sql="g.a * g.a")
@example(sql="(g.n) * (0.5)")
@example(sql="POWER(g.x, 3)")
@example(sql="(g.b) + (LEAST(GREATEST((g.s) / NULLIF(0, 0), -100), 100))")  # GREATEST(NULL, −100) is −100
@example(sql="ABS(NULLIF(g.s, 0))")  # SMALLINT: ABS(−32768) fails unless widened
@example(sql="(CAST(g.f AS NUMERIC)) + (SQRT(ABS(g.s)))")  # NUMERIC of 1.79769313486232e308 back to a double
@example(sql="(CAST(g.x AS NUMERIC)) - ((NULLIF(g.r, 0)) + (g.r))")  # REAL + REAL is REAL
def test_what_the_check_accepts_never_fails_on_extreme_values(extremes: psycopg.Connection, sql: str) -> None:
    """Accepted expressions, run as sqldp runs them (INTEGER arithmetic in BIGINT), are evaluated by PostgreSQL
    without error on every combination of each column type's extremes (±2^15, ±2^31, ±2^63, ±1.8e308,
    ±5e−324, NaN, ±Infinity, NUMERIC's ±10^131072 and 10^−16383); an error on constants alone fails over no
    rows too (PostgreSQL folds them when it plans), and does not depend on the data."""
    if not _accepted_everywhere(sql):
        return
    run = widen_integers(sqlglot.parse_one(sql, read="postgres"), EXTREME_DOMAIN.kind).sql(dialect="postgres")
    try:
        extremes.execute(f"SELECT count({run}) FROM g").fetchone()
    except (psycopg.errors.UndefinedFunction, psycopg.errors.DatatypeMismatch):
        return  # an operator PostgreSQL does not have for these types: fails on any data
    except (psycopg.DataError, psycopg.errors.FeatureNotSupported):  # "cannot convert NaN to integer" is the latter
        with pytest.raises((psycopg.DataError, psycopg.errors.FeatureNotSupported)):
            extremes.execute(f"SELECT count({run}) FROM empty AS g").fetchone()


def test_a_sum_of_doubles_is_refused_under_value_level_privacy(pg_dsn: str) -> None:
    """Under value-level privacy SUM's argument is not clamped: a double precision SUM fails once its total
    passes 1.8e308 (D has one row of 1.7e308, D plus one row two). The value-level analysis refuses DOUBLE
    PRECISION columns before any query (its own double-precision SQL could fail too), on both databases."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, f DOUBLE PRECISION)")
        c.execute("INSERT INTO t VALUES (1, 1.5), (2, 1.7e308)")
        c.execute("SELECT SUM(t.f) FROM t").fetchone()
        c.execute("INSERT INTO t VALUES (3, 1.7e308)")
        with pytest.raises(psycopg.errors.NumericValueOutOfRange):
            c.execute("SELECT SUM(t.f) FROM t").fetchone()
        c.execute("DELETE FROM t WHERE id = 3")
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(f)"\n'), seed=1)
    refusals = []
    for extra in ("", "INSERT INTO t VALUES (3, 1.7e308)"):
        if extra:
            with psycopg.connect(pg_dsn, autocommit=True) as c:
                c.execute(extra)
        with pytest.raises(RefusedError, match="DOUBLE PRECISION") as err:
            session.run("SELECT SUM(t.f) FROM t", epsilon=1.0)
        refusals.append(str(err.value))
    assert refusals[0] == refusals[1]


def test_sums_run_in_numeric(pg_dsn: str) -> None:
    """sqlgen.aggregate_expr sums in NUMERIC: a NUMERIC(310, 0) total passing 1.8e308 is exact, where a
    double precision sum would fail (the column's type is outside what the value-level analysis reads, so this
    is checked on the SQL sqldp generates)."""
    from sqldp.form import Aggregate
    from sqldp.sqlgen import aggregate_expr

    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, f DOUBLE PRECISION)")
        c.execute("INSERT INTO t VALUES (1, 1.7e308), (2, 1.7e308)")
        arg = sqlglot.parse_one("t.f", read="postgres")
        agg = aggregate_expr(Aggregate("sum", arg, frozenset())).sql(dialect="postgres")
        (total,) = c.execute(f"SELECT {agg} FROM t").fetchone()  # type: ignore[misc]
    assert float(total) == math.inf or float(total) == pytest.approx(3.4e308)


def test_value_level_analysis_refuses_double_precision_columns(pg_server_dsn: str) -> None:
    """A private filter's sigmoid over a DOUBLE PRECISION column failed in PostgreSQL once a row held 1e308
    (value out of range: overflow), while the same query was answered without that row: the error answered
    for the row. Such columns are refused before any query, on D and on D plus the row alike."""
    setup = "CREATE TABLE t (k INT PRIMARY KEY, f DOUBLE PRECISION);INSERT INTO t VALUES (1, 3.0), (2, 7.0);"
    policy = Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(f)"\n[tables.t.columns.f]\nrange = [0, 10]\n')
    outcomes = []
    for extra in ("", "INSERT INTO t VALUES (3, 1e308);"):
        with loaded_database(pg_server_dsn, setup + extra) as conn:
            session = sqldp.connect(conn.info.dsn, policy=policy)
            try:
                with pytest.raises(RefusedError, match="DOUBLE PRECISION") as err:
                    session.run("SELECT COUNT(*) FROM t WHERE t.f > 5", epsilon=1.0)
                outcomes.append(str(err.value))
            finally:
                session.close()
    assert outcomes[0] == outcomes[1]
