"""SQL fuzz through the library against a real PostgreSQL: generated statements (fixed seed) mixing a public
and a private table, subqueries in every clause, functions on and off the allow-list, other statement
kinds, deep nesting and garbage tokens. Whatever sqldp does with them:

* no traceback: every failure is a SqldpError (one line, with where);
* nothing changes in the database: table contents, the catalog, large objects, sequences and the session's
  settings are the same before and after;
* no exact answer reads a private table: a result is ``public`` only if the statement's text names no
  private table and no system catalog (an independent, purely lexical check, stricter than sqldp's), and
  every other released result carries noise.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable, Iterator

import psycopg
import pytest

import sqldp
from sqldp.errors import SqldpError

SEED = 20261123
STATEMENTS = 1500

DDL = """
CREATE TABLE pub (k INT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE priv (id INT PRIMARY KEY, x INT NOT NULL, label TEXT NOT NULL);
CREATE SEQUENCE fuzz_seq;
INSERT INTO pub VALUES (1, 'a'), (2, 'b'), (3, 'c');
INSERT INTO priv SELECT g, g % 50, CASE WHEN g % 2 = 0 THEN 'even' ELSE 'odd' END FROM generate_series(1, 40) g;
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.pub]
rows = "public"
[tables.priv.columns.x]
range = [0, 50]
[tables.priv.columns.label]
domain = ["even", "odd"]
"""

# what must never run: each reads server state, a file, statistics, or changes something
DANGEROUS = [
    "pg_read_file('/etc/hostname')", "pg_ls_dir('.')", "pg_stat_get_live_tuples('priv'::regclass)",
    "pg_relation_size('priv')", "current_setting('data_directory')", "set_config('sqldp.fuzz', 'x', false)",
    "lo_create(0)", "lo_import('/etc/hostname')", "pg_sleep(0.05)", "random()", "nextval('fuzz_seq')",
    "setval('fuzz_seq', 99)", "version()", "txid_current()", "pg_advisory_lock(1)", "'priv'::regclass",
    "query_to_xml('SELECT * FROM priv', true, true, '')", "pg_catalog.pg_read_file('/etc/hostname')",
    "clock_timestamp()", "current_user", "inet_server_addr()", "pg_backend_pid()", "CAST(1 AS oid)",
    "dblink('dbname=x', 'SELECT 1')", "pg_notify('c', 'p')", "pg_terminate_backend(1)",
]  # fmt: skip
HARMLESS = ["lower(name)", "abs(k)", "coalesce(k, 0)", "k + 1", "length(name)", "upper(name)", "k * 2", "1"]
PRIVATE_HARMLESS = ["x", "abs(x)", "x + 1", "least(x, 10)", "greatest(x, 0)", "coalesce(x, 0)", "x * 2"]
OTHER_KINDS = [
    "INSERT INTO pub VALUES (9, 'z')", "UPDATE priv SET x = 0", "DELETE FROM priv", "DROP TABLE priv",
    "CREATE TABLE t2 (a int)", "TRUNCATE priv", "COPY priv TO STDOUT", "SET work_mem = '1GB'",
    "SELECT 1; DELETE FROM priv", "ALTER TABLE priv ADD COLUMN y int", "GRANT ALL ON priv TO PUBLIC",
    "DO $$ BEGIN DELETE FROM priv; END $$", "CALL p()", "SELECT x INTO t3 FROM priv", "LOCK TABLE priv",
    "SELECT x FROM priv FOR UPDATE", "VACUUM priv", "EXPLAIN ANALYZE SELECT * FROM priv", "SHOW data_directory",
    "WITH d AS (DELETE FROM priv RETURNING *) SELECT COUNT(*) FROM d", "PREPARE p AS SELECT 1", "LISTEN c",
]  # fmt: skip
GARBAGE = ["(", ")", "'", '"', ";", "--", "/*", "*/", "$$", "\\", "SELECT", "FROM", ",", "::", "[", "]", "\x00", "é"]


class Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def pick(self, xs: list[str]) -> str:
        return self.r.choice(xs)

    def subquery(self) -> str:
        table, col = self.pick(["pub k", "priv x", "priv id"]).split()
        agg = self.pick(["MAX", "MIN", "COUNT", "SUM"])
        return self.pick(
            [
                f"(SELECT {agg}({col}) FROM {table})",
                f"(SELECT {col} FROM {table} LIMIT 1)",
                f"(SELECT {col} FROM {table} WHERE {col} > {self.r.randint(0, 60)} ORDER BY {col} LIMIT 1)",
            ]
        )

    def scalar(self, private: bool, depth: int = 0) -> str:
        choices: list[Callable[[], str]] = [
            lambda: self.pick(PRIVATE_HARMLESS if private else HARMLESS),
            lambda: str(self.r.randint(-5, 100)),
            lambda: self.pick(DANGEROUS),
            self.subquery,
        ]
        if depth < 3:
            choices.append(lambda: f"({self.scalar(private, depth + 1)} + {self.scalar(private, depth + 1)})")
            choices.append(
                lambda: f"CASE WHEN {self.condition(private, depth + 1)} THEN {self.scalar(private, depth + 1)} END"
            )
        return self.r.choice(choices)()

    def condition(self, private: bool, depth: int = 0) -> str:
        col = self.pick(["x", "id"]) if private else "k"
        choices: list[Callable[[], str]] = [
            lambda: f"{col} > {self.r.randint(0, 60)}",
            lambda: (
                f"{col} IN (SELECT {self.pick(['k', 'id', 'x'])} FROM {self.pick(['pub', 'priv'])})"
                if self.r.random() < 0.5
                else f"{col} IN (SELECT k FROM pub)"
            ),
            lambda: f"EXISTS (SELECT 1 FROM {self.pick(['pub', 'priv'])} WHERE {self.r.randint(0, 2)} = 1)",
            lambda: f"{self.scalar(private, depth + 1)} IS NOT NULL",
            lambda: f"{col} = {self.subquery()}",
        ]
        if depth < 3:
            choices.append(lambda: f"({self.condition(private, depth + 1)} OR {self.condition(private, depth + 1)})")
        return self.r.choice(choices)()

    def select(self) -> str:
        private = self.r.random() < 0.5
        table = "priv" if private else "pub"
        if private:
            arg = self.scalar(True)
            items = self.pick(["COUNT(*)", f"SUM({arg})", f"AVG({arg})", f"MAX({arg})", "COUNT(*), label", arg])
        else:
            items = ", ".join(self.scalar(False) for _ in range(self.r.randint(1, 3)))
        sql = f"SELECT {items} FROM {table}"
        if self.r.random() < 0.7:
            sql += f" WHERE {self.condition(private)}"
        if private and "label" in items:
            sql += " GROUP BY label"
        if self.r.random() < 0.2:
            sql += f" ORDER BY {self.pick(['1', self.subquery()])}"
        if self.r.random() < 0.2:
            sql += f" LIMIT {self.r.randint(0, 5)}"
        return sql

    def statement(self) -> str:
        kind = self.r.random()
        if kind < 0.08:
            return self.pick(OTHER_KINDS)
        sql = self.select()
        shape = self.r.random()
        if shape < 0.1:
            sql = f"WITH c AS (SELECT {self.pick(['x', 'id'])} AS v FROM priv) {sql}"
        elif shape < 0.15:
            sql = f"WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 3) {sql}"
        elif shape < 0.25:
            sql = f"{sql} UNION SELECT {self.pick(['k FROM pub', 'x FROM priv', 'id FROM priv'])}"
        elif shape < 0.3:
            sql = sql.replace(" FROM ", f" FROM (SELECT * FROM {self.pick(['pub', 'priv'])}) s, ", 1)
        if self.r.random() < 0.08:  # deep nesting
            n = self.r.choice([10, 31, 33, 200, 5000])
            sql = sql.replace("SELECT ", "SELECT " + "(" * n + "1" + ")" * n + " + ", 1)
        if self.r.random() < 0.03:
            sql += " AND " + " AND ".join(["k > 0"] * self.r.choice([50, 120, 3000]))
        if self.r.random() < 0.1:  # garbage tokens at random places
            for _ in range(self.r.randint(1, 3)):
                at = self.r.randint(0, len(sql))
                sql = sql[:at] + " " + self.pick(GARBAGE) + " " + sql[at:]
        return sql


def _words(sql: str) -> set[str]:
    return {w.lower() for w in re.findall(r"[A-Za-z_][A-Za-z_0-9$]*", sql)}


def _state(dsn: str) -> tuple[object, ...]:
    """Everything a statement could have changed: table contents, the catalog, large objects, sequences."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        return tuple(
            conn.execute(q).fetchone()
            for q in (
                "SELECT md5(string_agg(k || ':' || name, ',' ORDER BY k)) FROM pub",
                "SELECT md5(string_agg(id || ':' || x || ':' || label, ',' ORDER BY id)) FROM priv",
                "SELECT md5(string_agg(oid::text || relname || relkind::text, ',' ORDER BY oid)) FROM pg_class",
                "SELECT md5(string_agg(oid::text || proname, ',' ORDER BY oid)) FROM pg_proc",
                "SELECT count(*) FROM pg_largeobject_metadata",
                "SELECT last_value, is_called FROM fuzz_seq",
                "SELECT md5(string_agg(grantee || privilege_type || table_name, ',' ORDER BY grantee, "
                "privilege_type, table_name)) FROM information_schema.role_table_grants",
            )
        )


@pytest.fixture
def session(pg_dsn: str, tmp_path) -> Iterator[tuple[sqldp.session.Session, str]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    s = sqldp.connect(pg_dsn, policy, seed=7)
    try:
        yield s, pg_dsn
    finally:
        s.close()


def test_generated_statements_never_crash_change_the_database_or_release_private_data_exactly(session) -> None:
    s, dsn = session
    before = _state(dsn)
    rng = random.Random(SEED)
    gen = Gen(rng)
    counts = {"public": 0, "noisy": 0, "refused": 0}
    crashes: list[str] = []  # tracebacks: any exception but a one-line SqldpError
    connection_errors: list[str] = []  # SQLSTATE class 08, which drivers take for a dropped connection (issue 26)
    t0 = time.perf_counter()
    for _ in range(STATEMENTS):
        sql = gen.statement()
        try:
            result = s.run(sql)
        except SqldpError as err:
            assert "\n" not in str(err), (sql, str(err))
            if err.sqlstate.startswith("08"):
                connection_errors.append(f"{err.sqlstate}: {err} <- {sql[:200]}")
            counts["refused"] += 1
            continue
        except Exception as exc:  # any other exception is the failure this test looks for
            crashes.append(f"{type(exc).__name__}: {exc} <- {sql[:200]}")
            continue
        if result.public:
            counts["public"] += 1
            words = _words(sql)
            assert "priv" not in words and not any(w.startswith("pg_") for w in words), sql
        else:
            counts["noisy"] += 1
            assert result.params is not None and result.measurements, sql
            assert all(m.noise_scale > 0 for group in result.measurements for m in group), sql
    elapsed = time.perf_counter() - t0
    assert (len(crashes), len(connection_errors)) == (0, 0), (crashes[:5], connection_errors[:5])
    assert _state(dsn) == before
    with s.connection() as conn:  # the pooled connection the statements ran on kept its settings
        assert conn.execute("SELECT current_setting('sqldp.fuzz', true)").fetchone() in (None, (None,), ("",))
    # the generator reaches every outcome (a change that made everything refused would pass the rest)
    assert counts["public"] > 50 and counts["noisy"] > 50 and counts["refused"] > STATEMENTS // 2, counts
    assert elapsed < 120, (elapsed, counts)
