"""The Spark engine: the statements of an analysed query, in Spark SQL (sqldp.spark_sql), on a SparkSession.

One snapshot per query. Spark has no transactions, and a table on a lake (Parquet files, a Hive table) can
change between two statements, so the answer and its sensitivity would read different data. The engine
therefore reads each table the statements name ONCE per query: ``localCheckpoint(eager=True)`` of the
table's DataFrame materialises its rows in the executors' block stores, with no lineage back to the files,
and every statement of the query reads that copy through a temporary view whose name is unique to the query
(the statements name ``__sqldp_snapshot__<table>``, which :meth:`SparkEngine.execute` replaces). A lost
executor then fails the query (an error, not another version of the data). The copy costs one scan of each
table per query, a scan each statement would otherwise repeat; the views and the copies are dropped when the
query ends. Queries of one engine run one at a time; the statements of a query run side by side.

Errors: a statement that fails raises :class:`sqldp.errors.DatabaseError` with Spark's error class only (the
first line, without the SQL text or values).
"""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from sqldp.engine import Fetched, Row, Speed
from sqldp.errors import DatabaseError, RefusedError
from sqldp.rewrite import Statements
from sqldp.spark_sql import SNAPSHOT

WORKERS = 4  # statements of one query in flight at once


def database_error(exc: Exception) -> DatabaseError:
    """Spark's error condition (``[DIVIDE_BY_ZERO]`` …) and its first line; the SQL context Spark appends
    after it is dropped."""
    text = str(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return DatabaseError(f"Spark failed on the query: {first}")


class SparkEngine:
    """Runs Spark SQL statements on ``spark`` (a SparkSession, local or Spark Connect). ``sources`` maps each
    catalog table to the name Spark knows it by (default: the same name), e.g. a qualified ``db.lineitem``."""

    dialect = "spark"

    def __init__(self, spark: Any, sources: Mapping[str, str] | None = None) -> None:
        self.spark = spark
        self.sources = dict(sources or {})
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tag = uuid.uuid4().hex[:8]  # views of two engines on one SparkSession never collide

    def close(self) -> None:
        """Nothing to close: the SparkSession is the caller's."""

    @contextmanager
    def snapshot(self, tables: tuple[str, ...]) -> Iterator[str]:
        """Each of ``tables`` read once into the executors and bound to a temporary view; yields the views'
        name prefix (``<prefix><table>``). The views and the copies go when the block ends."""
        prefix = f"__sqldp_{self._tag}_{next(self._ids)}_"
        copies = []
        try:
            for name in tables:
                frame = self.spark.table(self.sources.get(name, name)).localCheckpoint(eager=True)
                copies.append(frame)
                frame.createOrReplaceTempView(prefix + name)
            yield prefix
        finally:
            for name in tables:
                self.spark.catalog.dropTempView(prefix + name)
            for frame in copies:
                frame.unpersist()

    def _rows(self, sql: str, prefix: str) -> list[Row]:
        return [tuple(r) for r in self.spark.sql(sql.replace(SNAPSHOT, prefix)).collect()]

    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        if statements.dialect != self.dialect:
            raise RefusedError(f"these statements are {statements.dialect} SQL; the Spark engine runs Spark SQL")
        with self._lock:
            try:
                with self.snapshot(statements.tables) as prefix, ThreadPoolExecutor(WORKERS) as pool:
                    # Spark runs concurrent jobs of one session side by side: the driver plans one statement
                    # while the executors run another (half the wall time of a query's statements on local[2])
                    t0 = time.perf_counter()
                    done: dict[str, float] = {}

                    def run(sql: str, name: str = "") -> list[Row]:
                        rows = self._rows(sql, prefix)
                        done[name] = time.perf_counter()
                        return rows

                    answer_job = pool.submit(run, statements.answer, "answer")
                    jobs = [pool.submit(run, q) for q in statements.queries]
                    domain_jobs = [None if q is None else pool.submit(run, q) for q in statements.domains]
                    answer = answer_job.result()
                    queries = [j.result() for j in jobs]
                    domains = [None if j is None else tuple(r[0] for r in j.result()) for j in domain_jobs]
                    t1, t2 = done["answer"], time.perf_counter()
            except Exception as exc:
                if _spark_error(exc):
                    raise database_error(exc) from exc
                raise
        speed.last = t2 - t0
        return Fetched(answer, queries, domains, t1 - t0, t2 - t0)

    def check(self, texts: Sequence[str]) -> None:
        """Nothing before the run: the statements name the per-query snapshot views, which exist only while
        :meth:`execute` runs, where Spark's analyser checks them first. The proxy, the one caller that must
        refuse before charging, serves PostgreSQL only."""

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        raise RefusedError(
            "a query that reads only public tables is answered exactly on PostgreSQL; the Spark engine runs "
            "analysed queries only"
        )


def _spark_error(exc: Exception) -> bool:
    """Whether ``exc`` is an error Spark raised (analysis or execution), not a bug of sqldp's."""
    try:
        from pyspark.errors import PySparkException
    except ImportError:  # pragma: no cover - pyspark is what gave us a session
        return False
    return isinstance(exc, PySparkException)


def spark_session(master: str | None = None) -> Any:
    """A SparkSession for the CLI: ``local[*]`` by default, a cluster's master URL (``spark://…``,
    ``yarn``, …), or Spark Connect for ``sc://…`` URLs. ANSI mode is required (sqldp.spark_sql relies on
    Spark failing where PostgreSQL fails, e.g. on overflow) and set."""
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        from sqldp.errors import InputError

        raise InputError("the Spark engine needs pyspark: pip install 'sqldp[spark]'", where="--engine") from None
    url = master or "local[*]"
    builder = SparkSession.builder.appName("sqldp")
    builder = builder.remote(url) if url.startswith("sc://") else builder.master(url)
    spark = builder.config("spark.ui.showConsoleProgress", "false").config("spark.sql.ansi.enabled", "true")
    session = spark.getOrCreate()
    if not url.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    return session
