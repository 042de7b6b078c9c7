"""Real drivers through the proxy: asyncpg and pg8000 (binary formats, typed parameters, the types Describe
announces), psycopg with binary results; noisy values arrive as float8, exact public values in their own type."""

from __future__ import annotations

import asyncio
import datetime as dt
import shutil
import subprocess
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, asyncpg_connect, client_dsn, make_tables, pgjdbc, write_policy

from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.proxy.scram import make_verifier

asyncpg = pytest.importorskip("asyncpg")
pg8000 = pytest.importorskip("pg8000.native")


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE rates (day date PRIMARY KEY, rate numeric(6, 3) NOT NULL, note varchar(10))")
        conn.execute("INSERT INTO rates VALUES ('2024-01-01', 1.250, 'new year'), ('2024-02-01', 2.500, NULL)")
    # pg8000 (scramp) refuses SCRAM iteration counts under 4096, RFC 7677's minimum
    analyst = {"epsilon_limit": 100.0, "verifier": str(make_verifier(PASSWORD, iterations=4096))}
    extra = '[tables.rates]\nrows = "public"\n[tables.visits.columns.faculty]\ndomain = ["cs", "math"]\n'
    policy = write_policy(tmp_path / "policy.toml", {"alice": analyst}, extra=extra)
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def test_asyncpg(proxy: ThreadedProxy) -> None:
    async def session() -> None:
        conn = await asyncpg_connect(proxy.port)
        try:
            rows = await conn.fetch("SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey")
            assert [tuple(r) for r in rows] == [("ALGERIA", 1), ("ARGENTINA", 2), ("BRAZIL", 3)]
            # typed parameters: int, Decimal, date (asyncpg sends them in binary, typed as Describe said)
            assert await conn.fetchval("SELECT n_name FROM nation WHERE n_nationkey = $1", 2) == "ARGENTINA"
            assert await conn.fetchval("SELECT day FROM rates WHERE rate = $1", Decimal("2.5")) == dt.date(2024, 2, 1)
            got = await conn.fetchrow("SELECT rate, note FROM rates WHERE day = $1", dt.date(2024, 1, 1))
            assert tuple(got) == (Decimal("1.250"), "new year")
            # private answers: noisy float8, charged
            count = await conn.fetchval("SELECT COUNT(*) FROM visits WHERE faculty = $1", "math")
            assert isinstance(count, float) and count.is_integer()
            groups = await conn.fetch("SELECT faculty, SUM(minutes) FROM visits GROUP BY faculty")
            assert sorted(r[0] for r in groups) == ["cs", "math"] and all(isinstance(r[1], float) for r in groups)
            # a set operation: its keys keep their type, a column noisy in any measured branch is float8 (it was
            # announced as text, which asyncpg could not decode)
            mixed = await conn.fetch(
                "SELECT faculty, COUNT(*) FROM visits GROUP BY faculty UNION ALL SELECT n_name, n_nationkey FROM nation"
            )
            assert sorted(r[0] for r in mixed)[:2] == ["ALGERIA", "ARGENTINA"] and len(mixed) == 5
            assert all(isinstance(r[0], str) and isinstance(r[1], float) for r in mixed)
        finally:
            await conn.close()

    asyncio.run(session())


def test_pg8000(proxy: ThreadedProxy) -> None:
    conn = pg8000.Connection("alice", password=PASSWORD, host="127.0.0.1", port=proxy.port, database="analytics")
    try:
        assert conn.run("SELECT n_name, n_nationkey FROM nation ORDER BY n_nationkey") == [
            ["ALGERIA", 1],
            ["ARGENTINA", 2],
            ["BRAZIL", 3],
        ]
        assert conn.run("SELECT n_name FROM nation WHERE n_nationkey = :k", k=3) == [["BRAZIL"]]
        assert conn.run("SELECT day, rate FROM rates WHERE rate > :r", r=Decimal("2")) == [
            [dt.date(2024, 2, 1), Decimal("2.500")]
        ]
        ((value,),) = conn.run("SELECT SUM(minutes) FROM visits")
        assert isinstance(value, float)
        assert [c["type_oid"] for c in conn.columns] == [701]
    finally:
        conn.close()


def test_psycopg_binary_cursor(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        cur = conn.cursor(binary=True)
        cur.execute("SELECT day, rate, note FROM rates ORDER BY day")
        assert cur.fetchall() == [
            (dt.date(2024, 1, 1), Decimal("1.250"), "new year"),
            (dt.date(2024, 2, 1), Decimal("2.500"), None),
        ]
        cur.execute("SELECT n_nationkey FROM nation WHERE n_name = %s AND n_nationkey > %s", ("BRAZIL", 1))
        assert cur.fetchall() == [(3,)]
        cur.execute("SELECT COUNT(*), AVG(minutes) FROM visits")
        row = cur.fetchone()
        assert row is not None and all(isinstance(x, float) for x in row)
        assert [d.type_code for d in cur.description or []] == [701, 701]


def test_transaction_characteristics_are_accepted_as_no_ops(proxy: ThreadedProxy) -> None:
    """What JDBC's setReadOnly / setTransactionIsolation and other drivers send; READ WRITE stays refused."""
    accepted = [
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE, READ ONLY",
        "SET default_transaction_read_only = on",
        "SET default_transaction_isolation = 'repeatable read'",
        "BEGIN READ ONLY",
        "SET TRANSACTION READ ONLY",
        "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ",
        "COMMIT",
        "START TRANSACTION ISOLATION LEVEL SERIALIZABLE READ ONLY DEFERRABLE",
        "COMMIT",
    ]
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql in accepted:
            conn.execute(sql)
        for sql in (
            "SET SESSION CHARACTERISTICS AS TRANSACTION READ WRITE",
            "SET TRANSACTION READ WRITE",
            "SET default_transaction_read_only = off",
            "SET TRANSACTION SNAPSHOT '00000003-0000001B-1'",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)


@pytest.mark.skipif(pgjdbc() is None, reason="java or pgjdbc (libpostgresql-jdbc-java, or ~/.m2) is not available")
def test_jdbc(proxy: ThreadedProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    session = proxy.built.server.session
    real = session.prepare

    def prepare(sql: str, **privacy: object) -> object:
        if "SUM(minutes)" in sql:  # the statement the client times out on: a 5 s analysis
            time.sleep(5)
        return real(sql, **privacy)

    monkeypatch.setattr(session, "prepare", prepare)
    source = Path(__file__).parent / "jdbc" / "ProxyClient.java"
    out = subprocess.run(
        ["java", "-cp", str(pgjdbc()), str(source), str(proxy.port), PASSWORD],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = {line.split(" ")[1]: line for line in out.stdout.splitlines() if line.startswith(("OK ", "FAIL "))}
    steps = {"readonly", "isolation", "public", "prepared", "private", "fetchsize", "cursor", "tables", "columns"}
    steps |= {"keys", "timeout"}
    assert set(lines) == steps, out.stdout + out.stderr
    assert all(line.startswith("OK ") for line in lines.values()), list(lines.values())
    assert lines["public"] == "OK public ALGERIA:1,ARGENTINA:2,BRAZIL:3,"
    assert lines["prepared"].endswith(" ARGENTINA")  # key 1 + 7 % 3 = 2, past the prepare threshold
    kind, value = lines["private"].split(" ")[2:]
    assert kind == "float8" and float(value).is_integer()
    assert lines["fetchsize"] == "OK fetchsize cs:float8,math:float8,", lines["fetchsize"]
    assert lines["cursor"] == "OK cursor ALGERIA,ARGENTINA,ALGERIA,BRAZIL,", lines["cursor"]
    # catalog discovery, from the shadow database (sqldp's catalog: names, types, NOT NULL, keys)
    assert lines["tables"] == "OK tables nation,rates,visits,", lines["tables"]
    assert lines["columns"] == "OK columns id:int4:0,faculty:text:0,minutes:int4:0,", lines["columns"]
    assert lines["keys"] == "OK keys id,", lines["keys"]
    state, ms = lines["timeout"].split(" ")[2:]
    assert state == "57014" and int(ms) < 3000, lines["timeout"]  # cancelled after 1 s, not after the 5 s run
    with psycopg.connect(pg_dsn) as conn:  # "private" and "fetchsize" charged once each; "timeout" before its charge
        balance = ledger.balance(conn, "alice")
        assert balance is not None and balance.queries == 2


# -- catalog discovery (issue 26): answered from sqldp's catalog in a shadow database, never upstream --------


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed")
def test_psql_lists_and_describes_tables(proxy: ThreadedProxy) -> None:
    out = subprocess.run(
        ["psql", client_dsn(proxy.port), "-X", "-c", "\\dt", "-c", "\\d visits"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    listed = [line.split("|")[1].strip() for line in out.stdout.splitlines() if line.startswith(" public |")]
    assert listed == ["nation", "rates", "visits"], out.stdout
    assert 'Table "public.visits"' in out.stdout
    for column in ("id", "faculty", "minutes"):
        assert any(line.split("|")[0].strip() == column and "not null" in line for line in out.stdout.splitlines())
    assert '"visits_pkey" PRIMARY KEY, btree (id)' in out.stdout


def test_sqlalchemy_reflection(proxy: ThreadedProxy) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    for driver in ("psycopg", "pg8000"):
        url = f"postgresql+{driver}://alice:{PASSWORD.replace(' ', '%20')}@127.0.0.1:{proxy.port}/analytics"
        engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        try:
            inspector = sqlalchemy.inspect(engine)
            assert sorted(inspector.get_table_names()) == ["nation", "rates", "visits"]
            columns = {c["name"]: (str(c["type"]), c["nullable"]) for c in inspector.get_columns("rates")}
            assert columns == {"day": ("DATE", False), "rate": ("NUMERIC(6, 3)", False), "note": ("VARCHAR(10)", True)}
            assert inspector.get_pk_constraint("visits")["constrained_columns"] == ["id"]
            table = sqlalchemy.Table("nation", sqlalchemy.MetaData(), autoload_with=engine)
            with engine.connect() as conn:  # the reflected table queries like any other
                assert conn.execute(sqlalchemy.select(table.c.n_name).where(table.c.n_nationkey == 2)).all() == [
                    ("ARGENTINA",)
                ]
        finally:
            engine.dispose()


def test_catalog_queries_see_no_statistics_and_nothing_cluster_wide(proxy: ThreadedProxy, pg_dsn: str) -> None:
    """The shadow's tables never held a row: reltuples says 'never analysed' (-1) where the upstream, once
    analysed, counts 200 visits; statistics, activity, sizes and the cluster's databases are not answered."""
    with psycopg.connect(pg_dsn, autocommit=True) as owner:
        owner.execute("ANALYZE visits")
        assert owner.execute("SELECT reltuples FROM pg_class WHERE relname = 'visits'").fetchone() == (200.0,)
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        assert conn.execute("SELECT reltuples, relpages FROM pg_class WHERE relname = 'visits'").fetchall() == [
            (-1.0, 0)
        ]
        for sql in (
            "SELECT attname, most_common_vals::text FROM pg_stats WHERE tablename = 'visits'",
            "SELECT datname, tup_returned FROM pg_stat_database",
            "SELECT datname FROM pg_database",
            "SELECT relname, pg_relation_size(oid) FROM pg_class WHERE relname = 'visits'",
            "SELECT relname, pg_stat_get_live_tuples(oid) FROM pg_class WHERE relname = 'visits'",
            "SELECT pid, query FROM pg_stat_activity",
        ):
            assert conn.execute(sql).fetchall() == [], sql
        assert conn.execute("SELECT current_database()").fetchone() == ("analytics",)
