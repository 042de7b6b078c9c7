"""Dataframe clients through the proxy: ibis' postgres backend and pandas ``read_sql``
over a psycopg connection and over an SQLAlchemy engine (psycopg driver). Public tables give PostgreSQL's
exact answer, private aggregates a noisy number charged to the analyst's ledger. ibis connects (item 4: it
sends ``SET TIMEZONE`` on connecting), lists the public tables (item 5: it filters information_schema by
``current_database()``, which named the shadow catalog, and got ``[]``), and its way of writing a grouped
aggregate, a SELECT over the grouped derived table, is refused with its real cause (item 6: it was refused as
"releases rows", which it does not)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import ibis
import pandas as pd
import psycopg
import pytest
import sqlalchemy
from proxy_support import PASSWORD, client_dsn

from sqldp.proxy import ThreadedProxy, ledger

pytestmark = [
    # ibis 12 reads a pandas option pandas 3 deprecates; pandas warns for any DBAPI connection but sqlite3
    pytest.mark.filterwarnings("ignore:The 'future.infer_string' option is deprecated"),
    pytest.mark.filterwarnings("ignore:pandas only supports SQLAlchemy connectable"),
]

ROWS = 200  # visits' rows (proxy_support.make_tables)
GROUPED = "SELECT faculty, COUNT(*) AS n FROM visits GROUP BY faculty ORDER BY faculty"
# an outer query over a grouped derived table (ibis' SQL for a grouped aggregate) over the fixture's private table
OUTER = "SELECT t1.faculty, t1.n FROM (SELECT faculty, COUNT(*) AS n FROM visits GROUP BY 1) AS t1 ORDER BY t1.faculty"
OUTER_CAUSE = "an outer query reads the aggregated results of a derived table over private table 'visits'"


def spent(upstream: str) -> tuple[Decimal, int]:
    """alice's ε spent and queries charged, read from the ledger in the upstream database."""
    with psycopg.connect(upstream) as conn:
        balance = ledger.balance(conn, "alice")
    assert balance is not None
    return balance.epsilon_spent, balance.queries


def public_rows(upstream: str, query: str) -> list[tuple[object, ...]]:
    """The answer PostgreSQL gives without the proxy."""
    with psycopg.connect(upstream) as conn:
        return conn.execute(query).fetchall()


def noisy_count(value: object, true: int) -> float:
    """A noisy count: a finite number near the ``true`` one (ε = 1, sensitivity 1: Laplace noise of scale 1,
    beyond 50 with probability e^-50)."""
    assert isinstance(value, numbers.Real) and not isinstance(value, bool), repr(value)
    number = float(value)
    assert math.isfinite(number) and abs(number - true) < 50, number
    return number


@pytest.fixture(scope="module")
def con(proxy: ThreadedProxy) -> Iterator[Any]:
    backend = ibis.postgres.connect(
        host="127.0.0.1", port=proxy.port, user="alice", password=PASSWORD, database="analytics"
    )
    try:
        yield backend
    finally:
        backend.disconnect()


def test_ibis_lists_and_reads_public_tables(con: Any, upstream: str) -> None:
    assert sorted(con.list_tables()) == ["nation", "visits"]
    nation = con.table("nation")
    assert nation.count().execute() == len(public_rows(upstream, "SELECT * FROM nation")) == 3
    frame = nation.select("n_nationkey", "n_name").order_by("n_nationkey").execute()
    expected = public_rows(upstream, "SELECT n_nationkey, n_name FROM nation ORDER BY n_nationkey")
    assert list(frame.itertuples(index=False, name=None)) == expected


def test_ibis_private_count_is_noisy_and_charged(con: Any, upstream: str) -> None:
    visits = con.table("visits")
    before = spent(upstream)
    noisy_count(visits.count().execute(), ROWS)
    after = spent(upstream)
    assert after[0] - before[0] == 1 and after[1] - before[1] == 1  # the policy's ε, one query


def test_ibis_grouped_aggregate_is_refused_for_its_real_cause(con: Any, upstream: str) -> None:
    visits = con.table("visits")
    grouped = visits.group_by("faculty").aggregate(n=visits.count()).order_by("faculty")
    before = spent(upstream)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=OUTER_CAUSE) as refused:
        grouped.execute()
    assert "releases rows" not in str(refused.value)
    assert spent(upstream) == before  # refused before anything was charged


def test_outer_query_over_aggregates_refused_through_psycopg(proxy: ThreadedProxy, upstream: str) -> None:
    before = spent(upstream)
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match=OUTER_CAUSE) as refused:
            conn.execute(OUTER)
        assert refused.value.sqlstate == "42501"
        assert "releases rows" not in str(refused.value)
        assert "post-processing aggregates in an outer query is not supported yet" in str(refused.value)
        assert conn.execute("SELECT 1").fetchone() == (1,)  # the connection stays usable
    assert spent(upstream) == before


def check_grouped(frame: Any, upstream: str, before: tuple[Decimal, int]) -> None:
    """The private GROUPED answer: the declared faculties, a noisy count each, one query charged."""
    assert list(frame.columns) == ["faculty", "n"]
    assert list(frame["faculty"]) == ["cs", "math"]
    assert frame["n"].dtype == "float64"  # noisy values are float8 on the wire (COUNT's own type is int8)
    for n in frame["n"]:
        noisy_count(n, ROWS // 2)  # visits alternate between the two faculties
    after = spent(upstream)
    assert after[0] - before[0] == 1 and after[1] - before[1] == 1


def test_pandas_read_sql_over_psycopg(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port)) as conn:  # not autocommit: inside a transaction block
        frame = pd.read_sql(
            "SELECT n_nationkey, n_name FROM nation WHERE n_nationkey > %s ORDER BY 1", conn, params=(1,)
        )
        expected = public_rows(upstream, "SELECT n_nationkey, n_name FROM nation WHERE n_nationkey > 1 ORDER BY 1")
        assert list(frame.itertuples(index=False, name=None)) == expected
        before = spent(upstream)
        check_grouped(pd.read_sql(GROUPED, conn), upstream, before)


def test_pandas_read_sql_over_sqlalchemy(proxy: ThreadedProxy, upstream: str) -> None:
    url = sqlalchemy.URL.create(
        "postgresql+psycopg",
        username="alice",
        password=PASSWORD,
        host="127.0.0.1",
        port=proxy.port,
        database="analytics",
    )
    engine = sqlalchemy.create_engine(url)
    try:
        query = sqlalchemy.text("SELECT n_nationkey, n_name FROM nation WHERE n_nationkey > :k ORDER BY 1")
        frame = pd.read_sql(query, engine, params={"k": 1})
        expected = public_rows(upstream, "SELECT n_nationkey, n_name FROM nation WHERE n_nationkey > 1 ORDER BY 1")
        assert list(frame.itertuples(index=False, name=None)) == expected
        before = spent(upstream)
        check_grouped(pd.read_sql(sqlalchemy.text(GROUPED), engine), upstream, before)
    finally:
        engine.dispose()
