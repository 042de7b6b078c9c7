"""Fixtures for the real-client suite: an upstream database with a public and a private table, its
policy, and a proxy in a thread, shared by the tests of one module (a proxy's set-up and its database's drop
take seconds). The clients themselves (psql, pgcli, pgjdbc, psycopg, asyncpg, pg8000) run as they would for
an analyst, over TCP to the proxy's port; the programs among them as subprocesses."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, make_tables, write_policy
from psycopg import sql

from sqldp.proxy import ThreadedProxy, build
from sqldp.proxy.scram import make_verifier


def fill(dsn: str) -> None:
    """The proxy tests' tables (proxy_support.make_tables), two more columns of nation (an integer one that is
    no key: the JDBC reproducer of a 6th execution; a char(3) one: bpchar on the wire) and an integer column
    of visits to group by."""
    make_tables(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE nation ADD COLUMN n_regionkey integer NOT NULL DEFAULT 0")
        conn.execute("UPDATE nation SET n_regionkey = n_nationkey % 2")
        conn.execute("ALTER TABLE nation ADD COLUMN n_code char(3)")
        conn.execute("UPDATE nation SET n_code = upper(left(n_name, 3))")
        # an integer group key of a private table (its domain declared in the policy)
        conn.execute("ALTER TABLE visits ADD COLUMN floor integer NOT NULL DEFAULT 1")
        conn.execute("UPDATE visits SET floor = 1 + id % 3")


def write(path: Path) -> Path:
    # pg8000 (scramp) refuses SCRAM iteration counts under 4096, RFC 7677's minimum
    analyst = {"epsilon_limit": 100.0, "verifier": str(make_verifier(PASSWORD, iterations=4096))}
    extra = (
        '[tables.visits.columns.faculty]\ndomain = ["cs", "math"]\n[tables.visits.columns.floor]\ndomain = [1, 2, 3]\n'
    )
    return write_policy(path, {"alice": analyst}, extra=extra)


@pytest.fixture(scope="module")
def upstream(pg_server_dsn: str) -> Iterator[str]:
    """A database of its own for the module's tests."""
    name = f"sqldp_clients_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsn = psycopg.conninfo.make_conninfo(pg_server_dsn, dbname=name)
    try:
        fill(dsn)
        yield dsn
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write(tmp_path_factory.mktemp("policy") / "policy.toml")


@pytest.fixture(scope="module")
def proxy(upstream: str, policy: Path) -> Iterator[ThreadedProxy]:
    with ThreadedProxy(build(upstream, policy)) as p:
        yield p
