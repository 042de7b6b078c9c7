"""Databases of their own on the test server (tests/conftest.py's ``pg_server_dsn``), for tests that need more
than ``pg_dsn``: created, loaded and dropped here. A module of its own, not conftest.py, so that a test file
imports it by one name whatever other conftest.py files pytest has loaded (tests/clients has one)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql


def _with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


def create_database(server_dsn: str, prefix: str = "sqldp_test") -> str:
    """A new, empty database on the server behind ``server_dsn``; returns its DSN."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return _with_dbname(server_dsn, name)


def drop_database(server_dsn: str, dsn: str) -> None:
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@contextmanager
def loaded_database(server_dsn: str, setup: str) -> Iterator[psycopg.Connection]:
    """A new database with ``setup`` run in it, as an autocommit connection; dropped afterwards."""
    dsn = create_database(server_dsn)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(setup)
            yield conn
    finally:
        drop_database(server_dsn, dsn)
