"""A real PostgreSQL for every test that needs one.

Order of preference: ``SQLDP_TEST_DSN`` if set; a testcontainers PostgreSQL when a
Docker engine answers; otherwise the embedded server in a temporary data directory. Each test that asks for
``pg_dsn`` gets a database of its own, dropped afterwards.

Every test that needs PostgreSQL carries the ``pg`` marker — those using the server fixture get it here, the
few that start a server of their own declare it — so ``pytest -m "not pg"`` runs the rest without one. The
tests mirror the package: frontend, sensitivity, release, policy, engine, proxy, cli.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from pg_support import create_database, drop_database


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "pg: needs a PostgreSQL server (run the rest with -m 'not pg')")
    config.addinivalue_line("markers", "spark: needs Apache Spark (pyspark and a Java runtime)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "pg_server_dsn" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.pg)
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """One local SparkSession (2 cores, as the Spark tests are sized for) for the whole test run: starting
    one costs seconds. Skipped when no Java runtime is installed (pyspark needs one; .ci/run installs it)."""
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime (java on PATH or JAVA_HOME): Spark cannot start")
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sqldp-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")  # SF 0.01: the default 200 partitions are 200 tiny tasks
        # the default 1 GiB driver (local mode: the executor too) ran out of execution memory once in a full run
        # (Q8's hash aggregate, after some 200 Spark tests in one session); the machines have 24 GiB
        .config("spark.driver.memory", "3g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_tpch(spark: object, tmp_path_factory: pytest.TempPathFactory) -> tuple[object, dict[str, int]]:
    """TPC-H at SF 0.01 as Parquet (tpchgen-cli, the same generator and scale as ``tpch_dsn``), registered
    with the session's Spark; and the row counts."""
    from sqldp import datasets

    return spark, datasets.load_tpch_spark(spark, 0.01, tmp_path_factory.mktemp("tpch-parquet"))


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


@pytest.fixture
def pg_dsn(pg_server_dsn: str) -> Iterator[str]:
    """A fresh, empty database for one test."""
    dsn = create_database(pg_server_dsn)
    try:
        yield dsn
    finally:
        drop_database(pg_server_dsn, dsn)


@pytest.fixture(scope="session")
def tpch_dsn(pg_server_dsn: str) -> Iterator[tuple[str, dict[str, int], dict[str, list[tuple[int, int]]]]]:
    """TPC-H at SF 0.01 (tpchgen-cli, about two seconds), loaded once per test session into a database of its
    own and shared by read-only tests; also the loader's returned counts and the progress reports it made."""
    from sqldp import datasets

    dsn = create_database(pg_server_dsn, "sqldp_tpch")
    reports: dict[str, list[tuple[int, int]]] = {}
    try:
        counts = datasets.load_tpch(
            dsn, 0.01, progress=lambda t, done, total: reports.setdefault(t, []).append((done, total))
        )
        yield dsn, counts, reports
    finally:
        drop_database(pg_server_dsn, dsn)
