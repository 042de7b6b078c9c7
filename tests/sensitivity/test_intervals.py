"""Interval bounds of expressions (``sqldp.sensitivity.intervals``) against PostgreSQL's own arithmetic.

The oracle is the server: random expressions over three columns are evaluated by PostgreSQL at every point of
a grid over the declared ranges (every integer of the INT column, steps of 0.25 and 0.5 of the NUMERIC ones),
and the interval must contain every value — and, when it is given at all, PostgreSQL must not fail on any
point (a bound that admits a division by zero or SQRT of a negative number would let an error reveal data).
Integer division (truncating) and rounding casts are PostgreSQL's, not the reals': read as real arithmetic,
``(t.a + 1) / 2`` would be bounded by 2.5 where PostgreSQL gives at most 2; with a ∈ [0, 2], |1 − (a + 1) / 2| by
0.5 where PostgreSQL gives 1 (``tests/sensitivity/test_rows_oracle.py`` sums that one).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from pg_support import loaded_database
from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.pg_arithmetic import rounds, truncates
from sqldp.sensitivity.intervals import Domain, interval
from sqldp.sensitivity.operators import steps

RANGES = {"a": (-3.0, 4.0), "x": (-2.5, 3.0), "p": (0.5, 4.0)}
KINDS = {"a": "integer", "x": "numeric", "p": "numeric"}
DOMAIN = Domain(range=lambda ref: RANGES[ref.column], kind=lambda ref: KINDS[ref.column])
GRID = """
CREATE TABLE t AS
SELECT a, (i * 0.25)::numeric(6, 2) AS x, (j * 0.5)::numeric(6, 2) AS p
FROM generate_series(-3, 4) a, generate_series(-10, 12) i, generate_series(1, 8) j
"""


@pytest.fixture(scope="module")
def conn(pg_server_dsn: str) -> Iterator[psycopg.Connection]:
    with loaded_database(pg_server_dsn, GRID) as c:
        yield c


def _expr(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="postgres")


def _server_range(conn: psycopg.Connection, sql: str) -> tuple[float, float]:
    lo, hi = conn.execute(f"SELECT MIN({sql}), MAX({sql}) FROM t").fetchone()
    return float(lo), float(hi)


leaves = st.sampled_from(["t.a", "t.x", "t.p", "1", "2", "3", "0.5", "1.5"])


def _grow(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    unary = st.sampled_from(
        [
            "ABS({})",
            "-({})",
            "EXP(({}) / 4.0)",
            "SQRT({})",
            "CAST({} AS INTEGER)",
            "CAST({} AS NUMERIC(12, 1))",
            "CAST({} AS DOUBLE PRECISION)",
            "POWER({}, 2)",
            "POWER({}, 3)",
            "POWER({}, -1)",
            "POWER({}, 0.5)",
        ]
    )
    binary = st.sampled_from(
        [
            "({}) + ({})",
            "({}) - ({})",
            "({}) * ({})",
            "({}) / ({})",
            "GREATEST({}, {})",
            "LEAST({}, {})",
            "CASE WHEN t.a > 0 THEN {} ELSE {} END",
        ]
    )
    return st.one_of(
        st.builds(lambda f, e: f.format(e), unary, inner),
        st.builds(lambda f, e1, e2: f.format(e1, e2), binary, inner, inner),
    )


expressions = st.recursive(leaves, _grow, max_leaves=5)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sql=expressions)
@example(sql="(t.a + 1) / 2")
@example(sql="1 - (t.a + 1) / 2")
@example(sql="CAST(t.x AS INTEGER)")
@example(sql="CAST(t.x * 3 AS NUMERIC(12, 1))")
@example(sql="POWER(t.x, 3) - POWER(t.a, 2)")
@example(sql="SQRT(POWER(t.x, 2) + POWER(t.a, 2))")
def test_interval_contains_what_postgresql_computes(conn: psycopg.Connection, sql: str) -> None:
    try:
        lo, hi = interval(_expr(sql), DOMAIN)
    except RefusedError:
        assume(False)
        return
    try:
        s_lo, s_hi = _server_range(conn, sql)
    except psycopg.errors.NumericValueOutOfRange:
        # an overflow of INTEGER, NUMERIC(12, 1) or double precision: only where the bound is that large
        assert max(abs(lo), abs(hi)) > 1e9, sql
        return
    slack = 1e-9 * max(1.0, abs(lo), abs(hi))  # NUMERIC division rounds to about 20 digits
    assert lo - slack <= s_lo and s_hi <= hi + slack, (sql, (lo, hi), (s_lo, s_hi))


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("(t.a + 1) / 2", (-1, 2)),  # truncation: real division would give 2.5
        ("1 - (t.a + 1) / 2", (-1, 2)),  # real division: [-1.5, 2]
        ("(t.x + 1) / 2", (-0.75, 2)),  # NUMERIC: real division
        ("CAST(t.x AS INTEGER)", (-3, 3)),  # -2.5 rounds to -3
        ("CAST(t.a AS BIGINT) / 3", (-1, 1)),  # an integer cast of an integer keeps truncation
        ("POWER(t.x, 2)", (0, 9)),
        ("POWER(t.a, 3)", (-27, 64)),
        ("POWER(t.p, -1)", (0.25, 2)),
        ("POWER(t.p, 0.5)", (math.sqrt(0.5), 2)),
        ("ABS(t.x)", (0, 3)),
        ("GREATEST(t.a, t.x)", (-2.5, 4)),
        ("LEAST(t.a, t.x)", (-3, 3)),
        ("EXP(t.p)", (math.exp(0.5), math.exp(4))),
    ],
)
def test_interval_is_tight_on_the_grid(conn: psycopg.Connection, sql: str, expected: tuple[float, float]) -> None:
    """Each rule alone is exact over the grid (the ends are attained), so looser rules would fail here."""
    got = interval(_expr(sql), DOMAIN)
    assert got == pytest.approx(expected)
    assert _server_range(conn, sql) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        ("SQRT(t.x)", "below 0"),
        ("POWER(t.x, 0.5)", "reaches below 0"),
        ("POWER(t.a, -1)", "contains 0"),
        ("t.p / t.x", "contains 0"),
        ("POWER(t.p, t.a)", "not a constant"),
        ("EXP(t.a * 200)", "overflows"),  # e^800 at a = 4
        ("EXP(t.a * 170) * EXP(t.a * 170)", "overflow"),  # each e^680, their product ≈ 1e590
        ("POWER(t.a * 1000, 120)", "overflow"),  # 4000^120 ≈ 1e432 in double precision (INTEGER arguments)
    ],
)
def test_interval_refuses_what_postgresql_may_reject(conn: psycopg.Connection, sql: str, why: str) -> None:
    """Each refused expression does fail in PostgreSQL somewhere on the grid (or is not bounded by a
    constant power), so a bound for it would let the server's error answer instead of the noise."""
    with pytest.raises(RefusedError, match=why):
        interval(_expr(sql), DOMAIN)
    if why != "not a constant":  # PostgreSQL fails on some point of the grid
        with pytest.raises(psycopg.DataError):
            _server_range(conn, sql)


def test_steps_are_found_by_postgresql_typing() -> None:
    kind = DOMAIN.kind
    assert truncates(_expr("t.a / 2"), kind) and not truncates(_expr("t.a / 2.0"), kind)
    assert not truncates(_expr("t.x / 2"), kind) and truncates(_expr("(t.a * 3 + 1) / (t.a - 9)"), kind)
    assert rounds(_expr("CAST(t.x AS INT)"), kind) and rounds(_expr("t.x::numeric(6, 1)"), kind)
    assert not rounds(_expr("CAST(t.a AS BIGINT)"), kind) and not rounds(_expr("t.x::float8"), kind)
    found = steps(_expr("1 + t.a / 2 + CAST(t.x AS INT) + 7 / 2"), kind)  # 7 / 2 reads no column
    assert sorted(s.sql() for s in found) == ["CAST(t.x AS INT)", "t.a / 2"]
