"""Constant date arithmetic (sqldp/dates.py) against PostgreSQL itself: whatever sqldp folds, PostgreSQL must
compute to the same midnight."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from sqldp import dates


@pytest.fixture(scope="module")
def conn(pg_server_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_server_dsn, autocommit=True) as c:
        yield c


def _folded(sql_expr: str) -> exp.Expression:
    tree = sqlglot.parse_one(f"SELECT 1 FROM t WHERE x < {sql_expr}", read="postgres")
    return dates.fold_date_arithmetic(tree).args["where"].this.expression


UNITS = ["year", "years", "month", "mons", "week", "day", "days"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    day=st.dates(min_value=dt.date(1900, 1, 1), max_value=dt.date(2100, 12, 31)),
    terms=st.lists(
        st.tuples(st.sampled_from(["+", "-"]), st.integers(-40, 40), st.sampled_from(UNITS)), min_size=1, max_size=3
    ),
    qualified=st.booleans(),
)
def test_folds_equal_postgresql(
    conn: psycopg.Connection, day: dt.date, terms: list[tuple[str, int, str]], qualified: bool
) -> None:
    """Month clamping (Jan 31 + 1 month), leap years, negative amounts, chains of intervals: the folded date is
    PostgreSQL's timestamp at midnight."""
    text = f"date '{day.isoformat()}'"
    for op, amount, unit in terms:
        text += (
            f" {op} interval '{amount}' {unit}"
            if qualified and unit in ("year", "month", "day")
            else (f" {op} interval '{amount} {unit}'")
        )
    folded = _folded(text)
    assert isinstance(folded, exp.Cast), text
    expected = conn.execute(f"SELECT ({text})::timestamp").fetchone()[0]  # type: ignore[index]
    assert expected == dt.datetime.combine(dt.date.fromisoformat(folded.this.name), dt.time()), text


def test_month_end_clamping_and_the_tpch_forms() -> None:
    assert _folded("date '1994-01-31' + interval '1 month'").sql("postgres") == "CAST('1994-02-28' AS DATE)"
    assert _folded("date '1996-02-29' + interval '1' year").sql("postgres") == "CAST('1997-02-28' AS DATE)"
    assert _folded("date '1998-12-01' - interval '90' day (3)").sql("postgres") == "CAST('1998-09-02' AS DATE)"
    assert _folded("date '1993-07-01' + interval '3' month").sql("postgres") == "CAST('1993-10-01' AS DATE)"


@pytest.mark.parametrize(
    "text",
    [
        "date '1994-01-01' + interval '1 hour'",  # a time part: not midnight
        "date '1994-01-01' + interval '1.5' day",  # fractional
        "date '1994-01-01' + interval 'NULL' day",
        "date '1994-01-01' + interval '1' second",
        "d + interval '1' day",  # not constant
    ],
)
def test_what_is_not_a_constant_midnight_is_left_as_written(text: str) -> None:
    assert isinstance(_folded(text), exp.Add)


def test_only_comparison_operands_are_folded() -> None:
    """In a SELECT list the value is a timestamp in PostgreSQL: folding it to a date would change the type."""
    tree = sqlglot.parse_one("SELECT date '1994-01-01' + interval '1' year FROM t", read="postgres")
    assert dates.fold_date_arithmetic(tree).sql("postgres") == tree.sql("postgres")
    between = sqlglot.parse_one(
        "SELECT 1 FROM t WHERE d BETWEEN date '1994-01-01' AND date '1994-01-01' + interval '1' month", read="postgres"
    )
    assert "CAST('1994-02-01' AS DATE)" in dates.fold_date_arithmetic(between).sql("postgres")


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        ("t.d <= date '1998-12-01' - interval 'NULL' day", "not a constant number of days"),
        ("t.d > '-infinity'::date", "write a calendar date"),
        ("t.d <= date '1998-12-01' + interval '1" + "0" * 400 + "' day", "not a constant number of days"),
    ],
)
def test_odd_constants_are_refused_in_one_line(pg_server_dsn: str, condition: str, message: str) -> None:
    """Reproducers that ended in tracebacks (ValueError, OverflowError): a one-line refusal at prepare."""
    import sqldp
    from sqldp.catalog import Catalog
    from sqldp.errors import RefusedError
    from sqldp.policy import Policy

    catalog = Catalog.from_ddl("CREATE TABLE t (id INT PRIMARY KEY, d DATE NOT NULL, v INT NOT NULL);")
    policy = Policy.from_toml(
        '[defaults]\nepsilon = 1.0\n[tables.t]\nrows = "public"\nnorm = "l1(d)"\n'
        '[tables.t.columns.d]\nrange = ["1990-01-01", "2000-12-31"]\n'
    )
    session = sqldp.connect(pg_server_dsn, policy, schema=catalog, allow_privileged=True)
    with pytest.raises(RefusedError, match=message):
        session.prepare(f"SELECT COUNT(*) FROM t WHERE {condition}")
