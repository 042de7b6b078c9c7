"""Range filters on value-protected columns with parameters the clients send untyped, through the proxy:
psycopg binds a ``str`` as unknown, pg8000 inlines its parameters, asyncpg describes the statement (the
parameter bound as NULL) and encodes its ``Decimal`` / ``date`` by the types Describe gives. Each was refused as
"not linear" (asyncpg: Describe said text, and asyncpg would not send a Decimal)."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, asyncpg_connect, client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build
from sqldp.proxy.scram import make_verifier

asyncpg = pytest.importorskip("asyncpg")
pg8000 = pytest.importorskip("pg8000.native")

POLICY = """
[tables.sales]
rows = "private"
norm = "l1(day, 0.01*amount)"
[tables.sales.columns.day]
range = ["2024-01-01", "2024-12-31"]
unit = "day"
[tables.sales.columns.amount]
range = [0, 1000]
"""


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE sales (id integer PRIMARY KEY, day date NOT NULL, amount numeric(8, 2) NOT NULL)")
        conn.execute("INSERT INTO sales SELECT g, date '2024-01-01' + g, (g * 7) % 1000 FROM generate_series(1, 300) g")
    analyst = {"epsilon_limit": 100.0, "verifier": str(make_verifier(PASSWORD, iterations=4096))}
    with ThreadedProxy(build(pg_dsn, write_policy(tmp_path / "policy.toml", {"alice": analyst}, extra=POLICY))) as p:
        yield p


def test_psycopg_str_parameters_on_value_protected_columns(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql, params in [
            ("SELECT COUNT(*) FROM sales WHERE day < %s", ("2024-06-01",)),
            ("SELECT SUM(amount) FROM sales WHERE amount > %s", ("500",)),
            ("SELECT COUNT(*) FROM sales WHERE day BETWEEN %s AND %s AND amount > %s", ("2024-02-01", "2024-03-01", "2.5")),  # noqa: E501
            # the literal forms themselves, in a simple query
            ("SELECT COUNT(*) FROM sales WHERE amount > CAST('100.5' AS numeric) AND day < MAKE_DATE(2024, 6, 1)", ()),
        ]:  # fmt: skip
            row = conn.execute(sql, params).fetchone()  # type: ignore[arg-type]
            assert row is not None and isinstance(row[0], float), (sql, row)


def test_pg8000_parameters_on_value_protected_columns(proxy: ThreadedProxy) -> None:
    conn = pg8000.Connection("alice", password=PASSWORD, host="127.0.0.1", port=proxy.port, database="analytics")
    try:
        ((count,),) = conn.run("SELECT COUNT(*) FROM sales WHERE day < :d", d="2024-06-01")
        ((total,),) = conn.run("SELECT SUM(amount) FROM sales WHERE amount > :a AND day >= :d", a="500", d="2024-02-01")
        assert isinstance(count, float) and isinstance(total, float)
    finally:
        conn.close()


def test_asyncpg_prepared_range_filters_describe_the_columns_types(proxy: ThreadedProxy) -> None:
    async def session() -> None:
        conn = await asyncpg_connect(proxy.port)
        try:
            stmt = await conn.prepare("SELECT COUNT(*) FROM sales WHERE amount > $1 AND day < $2")
            # the types PostgreSQL resolves the parameters to, and the noisy count as float8
            assert [t.name for t in stmt.get_parameters()] == ["numeric", "date"]
            assert [a.type.name for a in stmt.get_attributes()] == ["float8"]
            value = await stmt.fetchval(Decimal("500"), dt.date(2024, 6, 1))
            assert isinstance(value, float)
        finally:
            await conn.close()

    asyncio.run(session())
