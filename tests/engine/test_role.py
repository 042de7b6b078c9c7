"""Least privilege at the database: analyst statements run as a role that may only read the catalog's tables.

Each dangerous statement below is issued directly on the Session's reading connection, bypassing the parser
and its allow-list, and must fail there; each succeeds on the superuser connection sqldp is given (shown first),
so the failure is the role's doing and not the statement's.
"""

from __future__ import annotations

import time
import uuid

import psycopg
import pytest

import sqldp
from sqldp import db
from sqldp.errors import ForbiddenError
from sqldp.proxy import ledger

SETUP = """
CREATE TABLE people (id int PRIMARY KEY, age int NOT NULL);
INSERT INTO people SELECT g, 20 + g % 50 FROM generate_series(1, 100) g;
ANALYZE people;
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.people.columns.age]
range = [0, 120]
"""

# statement, and what it would do on the superuser connection
ATTACKS = {
    "pg_read_file": "SELECT pg_read_file('PG_VERSION')",
    "pg_ls_dir": "SELECT count(*) FROM pg_ls_dir('.')",
    "lo_create": "SELECT lo_create(0)",
    "set_config_then_insert": "SELECT set_config('default_transaction_read_only', 'off', false); "
    "SELECT set_config('transaction_read_only', 'off', false); INSERT INTO people VALUES (1000, 1)",
    "insert": "INSERT INTO people VALUES (1001, 1)",
    "create_table": "CREATE TABLE evil (x int)",
    "create_temp_table": "CREATE TEMP TABLE evil (x int)",
    "pg_sleep": "SELECT pg_sleep(0)",
    "relation_size": "SELECT pg_relation_size('people')",
    "stats_live_tuples": "SELECT n_live_tup FROM pg_stat_user_tables WHERE relname = 'people'",
    "pg_stats_values": "SELECT most_common_vals FROM pg_stats WHERE tablename = 'people'",
    "reltuples": "SELECT reltuples FROM pg_class WHERE relname = 'people'",
    "advisory_lock": "SELECT pg_advisory_lock(hashtext('sqldp.budget_ledger'))",
    "read_ledger": "SELECT * FROM sqldp.budget_ledger",
    "write_ledger": "UPDATE sqldp.budget_ledger SET epsilon_spent = 0",
    "set_role_back": "SELECT set_config('role', 'postgres', false)",
}


@pytest.fixture
def owner_dsn(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
        ledger.ensure(conn)
        ledger.sync_limits(conn, [("alice", 1.0, 0.0)])
    return pg_dsn


@pytest.fixture
def policy_file(tmp_path):
    p = tmp_path / "policy.toml"
    p.write_text(POLICY)
    return p


@pytest.mark.parametrize("name", sorted(ATTACKS))
def test_attack_succeeds_as_owner_and_fails_as_analyst(owner_dsn: str, policy_file, name: str) -> None:
    sql = ATTACKS[name]
    if name == "set_role_back":  # the owner's own role name, whatever the server calls it
        with psycopg.connect(owner_dsn) as c:
            sql = sql.replace("postgres", c.execute("SELECT current_user").fetchone()[0])
    with psycopg.connect(owner_dsn, autocommit=False) as conn:  # rolled back: the owner's success changes nothing
        for stmt in sql.split("; "):
            conn.execute(stmt)
        conn.rollback()
    session = sqldp.connect(owner_dsn, policy_file)
    try:
        with session.connection() as conn:
            with pytest.raises(psycopg.Error) as info:
                for stmt in sql.split("; "):
                    conn.execute(stmt)
            # refused for want of a privilege or by the read-only transaction, not by a typo in the attack
            assert isinstance(info.value, (psycopg.errors.InsufficientPrivilege, psycopg.errors.ReadOnlySqlTransaction))
        with session.connection() as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] == "sqldp_analyst"
    finally:
        session.close()
    with psycopg.connect(owner_dsn) as conn:
        assert conn.execute("SELECT count(*) FROM people").fetchone()[0] == 100


def test_analyst_reads_the_policy_tables_and_the_runner_uses_its_role(owner_dsn: str, policy_file) -> None:
    session = sqldp.connect(owner_dsn, policy_file, seed=1)
    try:
        assert session.analyst_dsn != session.dsn
        with session.connection() as conn:
            assert conn.execute("SELECT count(*) FROM people").fetchone()[0] == 100
            assert conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
            assert conn.execute("SHOW search_path").fetchone()[0] == "public, pg_catalog, pg_temp"
            assert conn.execute("SELECT current_user, session_user").fetchone() == (db.ANALYST_ROLE,) * 2
        assert abs(session.run("SELECT COUNT(*) FROM people").answer - 100) < 100
    finally:
        session.close()


def test_role_settings_hold_on_a_plain_login(owner_dsn: str, policy_file) -> None:
    """default_transaction_read_only and search_path are the role's, not only set by configure()."""
    sqldp.connect(owner_dsn, policy_file).close()
    with psycopg.connect(db.with_user(owner_dsn, db.ANALYST_ROLE), autocommit=True) as conn:
        assert conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
        assert conn.execute("SHOW search_path").fetchone()[0] == "public, pg_catalog, pg_temp"
        row = conn.execute(
            "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles WHERE rolname = current_user"
        ).fetchone()
        assert row == (False, False, False, False)


def test_provision_is_idempotent_and_cheap(owner_dsn: str) -> None:
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        db.provision(conn, ["people"], harden=True)
        assert db.provision(conn, ["people"], harden=True) is False  # nothing left to do: no writes
        # a table loaded later is granted at the next session start, not before
        conn.execute("CREATE TABLE later (x int)")
        assert db.provision(conn, ["people", "later"], harden=True) is True
    with psycopg.connect(db.with_user(owner_dsn, db.ANALYST_ROLE), autocommit=True) as conn:
        conn.execute("SELECT count(*) FROM later")


def test_tables_outside_the_catalog_are_not_granted(owner_dsn: str, policy_file, tmp_path) -> None:
    schema = tmp_path / "schema.sql"
    schema.write_text("CREATE TABLE people (id int PRIMARY KEY, age int NOT NULL);")
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE secrets (x int); INSERT INTO secrets VALUES (42)")
    session = sqldp.connect(owner_dsn, policy_file, schema=schema)
    try:
        with session.connection() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT x FROM secrets")
    finally:
        session.close()


def test_startup_check_refuses_a_superuser_analyst_dsn(owner_dsn: str, policy_file) -> None:
    with pytest.raises(ForbiddenError) as info:
        sqldp.connect(owner_dsn, policy_file, analyst_dsn=owner_dsn)
    text = str(info.value)
    assert "\n" not in text and "is a superuser" in text and "sqldp db grant --print-sql" in text
    assert info.value.where == "analyst_dsn"
    sqldp.connect(owner_dsn, policy_file, analyst_dsn=owner_dsn, allow_privileged=True).close()


def test_startup_check_refuses_a_role_that_may_write(owner_dsn: str, policy_file) -> None:
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        db.provision(conn, ["people"], harden=True)
        conn.execute(f"GRANT INSERT ON people TO {db.ANALYST_ROLE}")
    try:
        with pytest.raises(ForbiddenError, match="may write table people"):
            sqldp.connect(owner_dsn, policy_file, analyst_dsn=db.with_user(owner_dsn, db.ANALYST_ROLE))
    finally:
        with psycopg.connect(owner_dsn, autocommit=True) as conn:
            conn.execute(f"REVOKE INSERT ON people FROM {db.ANALYST_ROLE}")


def test_a_fresh_role_on_a_server_sqldp_does_not_own(pg_dsn: str) -> None:
    """Without the database-wide revokes (a user's server), what PUBLIC grants by default is reported as a warning:
    PostgreSQL lets every role create temporary tables, create large objects and call set_config."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
        db.provision(conn, ["people"], harden=False)
    with psycopg.connect(db.with_user(pg_dsn, db.ANALYST_ROLE), autocommit=True) as conn:
        report = db.check_privileges(conn, ["people"])
        assert report.refused == []
        assert set(report.warnings) >= {"may execute lo_create", "may execute set_config"}
        if "may create temporary tables" in report.warnings:  # as PUBLIC may by default on every version
            conn.execute("BEGIN READ WRITE")
            conn.execute("CREATE TEMP TABLE t (x int)")
            conn.execute("ROLLBACK")


def test_startup_cost_is_small(owner_dsn: str, policy_file) -> None:
    sqldp.connect(owner_dsn, policy_file).close()  # provisioned once
    t0 = time.perf_counter()
    for _ in range(5):
        sqldp.connect(owner_dsn, policy_file).close()
    per_session = (time.perf_counter() - t0) / 5
    assert per_session < 0.5, per_session


def test_printed_sql_closes_what_public_may_do(pg_dsn: str) -> None:
    """``sqldp db grant --print-sql`` for a user's own server: run by its owner, the analyst role it creates passes
    the start-up check without a warning."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
        conn.execute(db.print_sql(conn.info.dbname))  # the whole script, as psql -f would run it
    with psycopg.connect(db.with_user(pg_dsn, db.ANALYST_ROLE), autocommit=True) as conn:
        report = db.check_privileges(conn, ["people"])
        assert (report.refused, report.warnings) == ([], [])
        assert conn.execute("SELECT count(*) FROM people").fetchone()[0] == 100
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT lo_create(0)")


def test_provision_creates_a_role_that_does_not_exist_yet(owner_dsn: str) -> None:
    """The "is anything missing" query must not ask has_table_privilege about a role before it exists."""
    role = f"sqldp_test_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(owner_dsn, autocommit=True) as conn:
        try:
            assert db.provision(conn, ["people"], harden=False, role=role) is True
            assert db.provision(conn, ["people"], harden=False, role=role) is False
            assert conn.execute("SELECT has_table_privilege(%s, 'people', 'SELECT')", (role,)).fetchone() == (True,)
        finally:
            conn.execute(f'REVOKE ALL ON people FROM "{role}"; REVOKE ALL ON SCHEMA public FROM "{role}"')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')


def test_proxy_reads_as_the_analyst_and_keeps_the_ledger_as_the_owner(pg_dsn: str, tmp_path) -> None:
    from proxy_support import make_tables, write_policy

    from sqldp.proxy import build

    make_tables(pg_dsn)
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 3.5}})
    built = build(pg_dsn, policy)
    try:
        session = built.server.session
        with session.connection() as conn:  # the proxy's pool
            assert conn.execute("SELECT current_user").fetchone()[0] == db.ANALYST_ROLE
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("SELECT epsilon_spent FROM sqldp.budget_ledger")
        with built.server.ledger_pool.connection() as conn:
            assert conn.execute("SELECT current_user").fetchone()[0] != db.ANALYST_ROLE
            assert ledger.balance(conn, "alice") is not None
    finally:
        built.close()
