"""The embedded server commands and the catalog read from a live database."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from sqldp import db
from sqldp.catalog import Catalog
from sqldp.db import RESTART_SETTINGS, EmbeddedServer, resolve_dsn


def sqldp(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sqldp.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.pg  # starts an embedded server of its own
def test_db_start_status_url_stop(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert sqldp("db", "status", "--data-dir", home).returncode == 3
    started = sqldp("db", "start", "--data-dir", home)
    assert started.returncode == 0, started.stderr
    try:
        status = sqldp("db", "status", "--data-dir", home)
        assert status.returncode == 0 and "running" in status.stdout
        url = sqldp("db", "url", "--data-dir", home).stdout.strip()
        with psycopg.connect(url) as conn:  # the server survives the command that started it
            assert conn.execute("SELECT 1").fetchone() == (1,)
            # the analyst role exists from the start, and the default database is hardened for it
            assert conn.execute("SELECT count(*) FROM pg_roles WHERE rolname = %s", (db.ANALYST_ROLE,)).fetchone() == (
                1,
            )
            assert conn.execute("SELECT has_function_privilege('public', 'lo_create(oid)', 'EXECUTE')").fetchone() == (
                False,
            )
        granted = sqldp("db", "grant", "--data-dir", home)
        assert granted.returncode == 0 and "already granted" in granted.stdout, granted.stderr
        printed = sqldp("db", "grant", "--print-sql")
        assert printed.returncode == 0 and "CREATE ROLE" in printed.stdout and "REVOKE EXECUTE" in printed.stdout
        assert sqldp("db", "start", "--data-dir", home).stdout.strip().endswith(url)  # idempotent
    finally:
        assert sqldp("db", "stop", "--data-dir", home).stdout.strip() == "stopped"
    assert sqldp("db", "status", "--data-dir", home).returncode == 3


def test_explicit_dsn_wins(monkeypatch) -> None:
    monkeypatch.setenv("SQLDP_DSN", "postgresql://from-env/db")
    assert resolve_dsn("postgresql://explicit/db") == "postgresql://explicit/db"
    assert resolve_dsn(None) == "postgresql://from-env/db"


def test_unreachable_database_is_one_line_exit_1(tmp_path: Path) -> None:
    r = sqldp("explain", "--dsn", f"postgresql://nobody@/none?host={tmp_path}&port=1", "SELECT 1")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "cannot connect" in r.stderr


def test_catalog_from_database_matches_ddl(pg_dsn: str) -> None:
    ddl = (
        "CREATE TABLE region (r_regionkey INT PRIMARY KEY, r_name CHAR(25) NOT NULL);"
        "CREATE TABLE nation (n_nationkey INT PRIMARY KEY, n_name TEXT, n_regionkey INT REFERENCES region,"
        " n_date DATE, n_amount DECIMAL(15,2));"
    )
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(ddl)
        live = Catalog.from_database(conn)
    parsed = Catalog.from_ddl(ddl)
    for name in ("region", "nation"):
        assert {c: col.kind for c, col in live.table(name).columns.items()} == {
            c: col.kind for c, col in parsed.table(name).columns.items()
        }
        assert live.table(name).primary_key == parsed.table(name).primary_key
    fk = live.table("nation").foreign_keys[0]
    assert (fk.columns, fk.ref_table, fk.ref_columns) == (("n_regionkey",), "region", ("r_regionkey",))
    assert live.table("nation").columns["n_date"].kind == "date"
    assert live.table("nation").columns["n_amount"].kind == "numeric"


def test_fresh_server_gets_its_restart_settings(tmp_path: Path) -> None:
    """A new data directory: the server is restarted once with RESTART_SETTINGS (shared_buffers here)."""
    if not RESTART_SETTINGS:
        pytest.skip("the machine's memory is unknown or small: no restart settings")
    server = EmbeddedServer(tmp_path / "home")
    url = server.start()
    try:
        with psycopg.connect(url) as conn:
            for name, value in RESTART_SETTINGS.items():
                shown = conn.execute("SELECT setting::bigint * 8 / 1024 FROM pg_settings WHERE name = %s", (name,))
                assert f"{shown.fetchone()[0]}MB" == value  # shared_buffers is counted in 8 kB pages
    finally:
        server.stop()


def test_settings_that_stop_the_server_are_dropped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A shared_buffers the machine cannot give: the restart fails, the setting is removed and the server
    starts without it (a database that will not start is worse than a slower one)."""
    monkeypatch.setattr(db, "RESTART_SETTINGS", {"shared_buffers": "4000GB"})
    server = EmbeddedServer(tmp_path / "home")
    url = server.start()
    try:
        with psycopg.connect(url) as conn:
            assert conn.execute("SHOW shared_buffers").fetchone()[0] == "128MB"
        assert "shared_buffers" not in (server.pgdata / "postgresql.auto.conf").read_text()
        assert "random_page_cost = '1.1'" in (server.pgdata / "postgresql.auto.conf").read_text()
    finally:
        server.stop()
