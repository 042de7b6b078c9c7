"""Untyped literals resolved to the type PostgreSQL gives them (sqldp.literals): range filters
written with a quoted literal (`o_orderdate < '1995-01-01'`, `o_totalprice > '1000'`, what pg8000 and
psycopg's `str` parameters send) were refused on value-protected columns as "not linear". The resolution is
checked three ways: its spelling, the rows PostgreSQL selects with it against the rows it selects with the
statement as written (or the same error), and the released answers against the typed query's."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from pg_support import loaded_database

import sqldp
from sqldp import literals
from sqldp.catalog import Catalog
from sqldp.frontend import parse

SHIPPED = Path(__file__).parents[2] / "schemas"
TPCH = Catalog.from_file(SHIPPED / "tpch.sql")


def resolved(condition: str, catalog: Catalog = TPCH, table: str = "orders") -> str:
    tree = parse(f"SELECT COUNT(*) FROM {table} WHERE {condition}", catalog).tree
    where = tree.args["where"]
    return str(where.this.sql(dialect="postgres"))


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("o_orderdate < '1995-01-01'", "orders.o_orderdate < CAST('1995-01-01' AS DATE)"),
        ("'1995-01-01' > o_orderdate", "CAST('1995-01-01' AS DATE) > orders.o_orderdate"),
        ("o_totalprice > '1000'", "orders.o_totalprice > 1000"),
        # NUMERIC(15, 2)'s modifier does not apply to the resolved literal: PostgreSQL compares with 1000.555
        ("o_totalprice > '1000.555'", "orders.o_totalprice > 1000.555"),
        ("o_totalprice > ' -1.5e3 '", "orders.o_totalprice > -1.5e3"),
        ("o_totalprice > 'NaN'", "orders.o_totalprice > CAST('NaN' AS DECIMAL)"),
        ("o_custkey > '1.5'", "orders.o_custkey > CAST('1.5' AS INT)"),  # PostgreSQL's error, kept
        ("o_custkey IN ('1', ' 2 ')", "orders.o_custkey IN (1, 2)"),
        ("o_totalprice BETWEEN '1' AND '2.5'", "orders.o_totalprice BETWEEN 1 AND 2.5"),
        ("o_orderdate + 1 > '1995-03-01'", "orders.o_orderdate + 1 > CAST('1995-03-01' AS DATE)"),
        ("o_custkey * 2 > '7'", "orders.o_custkey * 2 > 7"),
        ("o_orderpriority = '1-URGENT'", "orders.o_orderpriority = '1-URGENT'"),  # a text column: as written
        # explicit casts of a string as comparison operands: the number PostgreSQL reads
        ("o_totalprice > CAST('1000.5' AS NUMERIC)", "orders.o_totalprice > 1000.5"),
        ("o_totalprice > CAST('1000.555' AS NUMERIC(15, 2))", "orders.o_totalprice > 1000.56"),
        ("o_totalprice > CAST('-1000.555' AS NUMERIC(15, 2))", "orders.o_totalprice > -1000.56"),
        ("o_totalprice > CAST('1000' AS NUMERIC(3, 0))", "orders.o_totalprice > CAST('1000' AS DECIMAL(3, 0))"),
        ("o_orderdate < MAKE_DATE(1995, 1, 1)", "orders.o_orderdate < CAST('1995-01-01' AS DATE)"),
        ("o_orderdate < MAKE_DATE(1995, 2, 30)", "orders.o_orderdate < MAKE_DATE(1995, 2, 30)"),
        ("o_totalprice > NULL", "CAST(NULL AS BOOLEAN)"),
        ("CAST(NULL AS INT) <= o_totalprice", "CAST(NULL AS BOOLEAN)"),  # a typed NULL of a comparable type
        ("o_orderdate > CAST(NULL AS INT)", "orders.o_orderdate > CAST(NULL AS INT)"),  # PostgreSQL's error, kept
        # a derived table's column and a correlated one get the table column's type
        (
            "EXISTS (SELECT 1 FROM lineitem l WHERE l.l_orderkey = orders.o_orderkey AND orders.o_totalprice > '5')",
            'EXISTS(SELECT 1 AS "1" FROM lineitem AS l WHERE l.l_orderkey = orders.o_orderkey '
            "AND orders.o_totalprice > 5)",
        ),
    ],
)
def test_each_untyped_literal_is_spelled_as_postgres_types_it(condition: str, expected: str) -> None:
    assert resolved(condition) == expected


def test_a_derived_tables_column_has_its_source_columns_type() -> None:
    tree = parse(
        "SELECT COUNT(*) FROM (SELECT o_orderdate AS d, o_totalprice AS p FROM orders) t "
        "WHERE t.d < '1995-01-01' AND t.p > '10'",
        TPCH,
    ).tree
    assert tree.args["where"].this.sql(dialect="postgres") == "t.d < CAST('1995-01-01' AS DATE) AND t.p > 10"


# (condition as written) over a table of every type the resolution handles; PostgreSQL must select the same rows
# with the resolved condition, or fail on both
CONDITIONS = [
    "i4 > '5'", "i4 > ' 15 '", "i4 > '1.5'", "i4 > '0x0A'", "i4 > '1_000'", "i2 > '100000'", "i2 < '7'",
    "i8 >= '-3'", "i8 > '9223372036854775807'", "n > '1000.555'", "n = '1.005'", "n > '-1.5e3'", "n > 'NaN'",
    "n > '  2.5  '", "f > '0.1'", "r > '0.1'", "r = '0.1'", "d < '1995-01-01'", "d < '01/02/1995'",
    "ts < '1995-01-01 12:00'", "n > CAST('1000.555' AS NUMERIC(15, 2))", "n > CAST('1000.5' AS NUMERIC)",
    "i4 > CAST('7' AS INTEGER)", "i4 > CAST('99999999999' AS INTEGER)", "n < CAST('99.995' AS NUMERIC(4, 2))",
    "i4 IN ('1', ' 2 ', '0x3')", "n BETWEEN '1' AND '2.5'", "i4 + 1 > '5'", "i4 * 2 > '2.5'", "n * 2 > '2.5'",
    "d + 1 > '1995-01-02'", "d - d > '0'", "i4 > NULL", "NOT (i4 > NULL)", "NULL = n",
    "n > CAST(NULL AS INTEGER)", "NOT (d <= CAST(NULL AS TIMESTAMP))", "d > CAST(NULL AS INTEGER)",
    "c = CAST(NULL AS TEXT)", "i4 > CAST(NULL AS TEXT)",
    "d < MAKE_DATE(1995, 1, 1)", "d < MAKE_DATE(1995, 2, 30)", "c = 'ab'", "i4 < 5 AND n > '1'",
]  # fmt: skip
ROWS = """
CREATE TABLE t (id integer PRIMARY KEY, i2 smallint, i4 integer, i8 bigint, n numeric(15, 2), f double precision,
                r real, d date, ts timestamp, c char(3));
INSERT INTO t VALUES
  (1, 1, 1, -3, 1000.56, 0.1, 0.1, '1994-12-31', '1995-01-01 11:59', 'ab'),
  (2, 7, 5, 0, 1.01, 0.2, 0.2, '1995-01-01', '1995-01-01 12:00', 'abc'),
  (3, -2, 16, 9, 2.50, 0.05, 0.05, '1995-01-02', '1995-01-01 12:01', 'b'),
  (4, 300, 1000, 12, -1500, -1, -1, '1990-06-15', '1990-06-15 00:00', NULL),
  (5, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL);
"""


def _ids(conn: psycopg.Connection, condition: str) -> tuple[str, ...] | str:
    try:
        return tuple(str(r[0]) for r in conn.execute(f"SELECT id FROM t AS t WHERE {condition} ORDER BY id"))  # type: ignore[arg-type]
    except psycopg.Error as exc:
        return f"error {exc.sqlstate}"


# left as written: a text column; an invalid date, casts out of their type's range and typed NULLs with no
# operator, all PostgreSQL's errors
UNCHANGED = {
    "c = 'ab'", "d < MAKE_DATE(1995, 2, 30)", "i4 > CAST('99999999999' AS INTEGER)",
    "n < CAST('99.995' AS NUMERIC(4, 2))", "d > CAST(NULL AS INTEGER)", "i4 > CAST(NULL AS TEXT)",
}  # fmt: skip


def test_postgres_selects_the_same_rows_with_the_resolved_literals(
    pg_server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with loaded_database(pg_server_dsn, ROWS) as conn:
        catalog = Catalog.from_database(conn)
        after = {c: resolved(c, catalog, "t") for c in CONDITIONS}
        monkeypatch.setattr(literals, "resolve", lambda tree, _: tree)  # the qualified statement as written
        before = {c: resolved(c, catalog, "t") for c in CONDITIONS}
        for condition in CONDITIONS:
            assert (after[condition] == before[condition]) == (condition in UNCHANGED), (condition, after[condition])
            assert _ids(conn, after[condition]) == _ids(conn, before[condition]), (condition, after[condition])


TPCH_POLICY = SHIPPED / "tpch.toml"
UNTYPED = [
    # (query, untyped condition, typed condition): value-protected columns of the shipped TPC-H policy
    ("COUNT(*) FROM orders", "o_orderdate < '1995-01-01'", "o_orderdate < date '1995-01-01'"),
    ("COUNT(*) FROM orders", "o_totalprice > '1000'", "o_totalprice > 1000"),
    ("COUNT(*) FROM orders", "o_totalprice > CAST('1000.5' AS numeric)", "o_totalprice > 1000.5"),
    ("COUNT(*) FROM orders", "o_orderdate < MAKE_DATE(1995, 1, 1)", "o_orderdate < date '1995-01-01'"),
    (
        "SUM(l_quantity) FROM lineitem",
        "l_shipdate BETWEEN '1994-01-01' AND '1994-12-31' AND l_discount > '0.05'",
        "l_shipdate BETWEEN date '1994-01-01' AND date '1994-12-31' AND l_discount > 0.05",
    ),
]


@pytest.mark.parametrize(("query", "untyped", "typed"), UNTYPED)
def test_a_session_answers_untyped_range_filters_as_the_typed_ones(
    tpch_dsn: tuple[str, object, object], query: str, untyped: str, typed: str
) -> None:
    """Refused as "not linear" before; now the same release as the typed query (same seed, same answer)."""
    answers = []
    for condition in (untyped, typed):
        sql = f"SELECT {query} WHERE {condition}"
        session = sqldp.connect(tpch_dsn[0], str(TPCH_POLICY), seed=7)
        try:
            result = session.run(sql, epsilon=1.0)
        finally:
            session.close()
        (m,) = result.measurements[0]
        answers.append((result.answer, m.mechanism, m.sensitivity, m.true_value))
    assert answers[0] == answers[1]


def test_a_comparison_with_null_is_answered_as_postgres_evaluates_it(tpch_dsn: tuple[str, object, object]) -> None:
    """What a client describing `o_totalprice > $1` sends (the parameter bound as NULL): a count over no rows."""
    session = sqldp.connect(tpch_dsn[0], str(TPCH_POLICY), seed=7)
    try:
        result = session.run("SELECT COUNT(*) FROM orders WHERE o_totalprice > NULL", epsilon=1.0)
    finally:
        session.close()
    assert result.measurements[0][0].true_value == 0
