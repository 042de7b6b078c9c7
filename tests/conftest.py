"""A real PostgreSQL for every test that needs one.

Order of preference (issue 2, item 9): ``SQLDP_TEST_DSN`` if set; a testcontainers PostgreSQL when a
Docker engine answers; otherwise the embedded server in a temporary data directory. Each test that asks for
``pg_dsn`` gets a database of its own, dropped afterwards.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=2)
        client.ping()
        return True
    except Exception:  # no engine, no socket, no permission: all mean "not available"
        return False


@pytest.fixture(scope="session")
def pg_server_dsn(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A DSN for a maintenance database on a real server, for the whole session."""
    env = os.environ.get("SQLDP_TEST_DSN")
    if env:
        yield env
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:18", driver=None) as container:
            yield container.get_connection_url()
        return
    from sqldp.db import EmbeddedServer

    server = EmbeddedServer(tmp_path_factory.mktemp("sqldp-home"))
    url = server.start()
    try:
        yield url
    finally:
        server.stop()


def _with_dbname(dsn: str, dbname: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(dsn)
    params["dbname"] = dbname
    return psycopg.conninfo.make_conninfo(**params)


@pytest.fixture
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    name = f"sqldp_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_dbname(pg_server_dsn, name)
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
