"""The Spark engine: the statements of an analysed query, in Spark SQL (sqldp.engine.spark.sql), on a SparkSession.

One snapshot per query. Spark has no transactions, and a table on a lake (Parquet files, a Hive table) can
change between two statements, so the answer and its sensitivity would read different data. The engine
binds each table the statements name, once per query, to a temporary view (the statements name
``__sqldp_snapshot__<table>``, which :meth:`SparkEngine.execute` replaces by the view's name, :func:`bind`),
in one of two ways:

* **pinned files** — a table that is a plain scan of unpartitioned Parquet or ORC files (what ``sqldp load
  tpch --engine spark`` registers, a Hive or data source table over such files): its version is the set of
  its files with their sizes and modification times. The engine reads that listing once, builds the view
  from exactly those files, and after the statements ran checks the listing again; when a file changed or
  went, the query runs again on the new version (up to :data:`ATTEMPTS` times) and is then refused with the
  table named. Nothing is copied: each statement scans the files, as a plain query would. The view over
  those files is kept for the next query while they (and the format, schema, options) are the same.
* **a copy** — any other table (a view with a filter or a projection, an in-memory DataFrame, a partitioned
  or bucketed table, Delta or Iceberg whose files are not the version, Spark Connect, which exposes no file
  listing): ``localCheckpoint(eager=True)`` materialises its rows in the executors' block stores, with no
  lineage back to the files, and every statement reads that copy. A lost executor then fails the query (an
  error, not another version of the data).

The copies and their views are dropped when the query ends. Queries of one engine run one at a time; the
statements of a query run side by side. A CASE branch whose value is an uncorrelated subquery runs only when
a row takes it, as on PostgreSQL (sqldp.engine.spark.sql.defer_fallbacks, :meth:`SparkEngine._statement`).

Errors: a statement that fails raises :class:`sqldp.errors.DatabaseError` with Spark's error class only (the
first line, without the SQL text or values).
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

from sqldp.engine.base import Fetched, Row, Speed
from sqldp.engine.spark.dialect import SPARK
from sqldp.engine.spark.sql import SNAPSHOT, defer_fallbacks, raised_fallback
from sqldp.errors import DatabaseError, InputError, RefusedError
from sqldp.rewrite import Statements

WORKERS = 4  # statements of one query in flight at once
ATTEMPTS = 3  # runs of a query whose pinned files changed while it ran, before it is refused
# the file formats whose files are the whole table (Delta's and Iceberg's subclasses of ParquetFileFormat
# read a transaction log too, so they are not listed: their tables are copied)
_PINNED_FORMATS = {
    "org.apache.spark.sql.execution.datasources.parquet.ParquetFileFormat": "parquet",
    "org.apache.spark.sql.execution.datasources.orc.OrcFileFormat": "orc",
}
_LISTED_INDEX = "org.apache.spark.sql.execution.datasources.InMemoryFileIndex"  # a plain listing of files

FileVersion = tuple[tuple[str, int, int], ...]  # (path, length in bytes, modification time in ms) per file


def database_error(exc: Exception) -> DatabaseError:
    """Spark's error condition (``[DIVIDE_BY_ZERO]`` …) and its first line; the SQL context Spark appends
    after it is dropped."""
    text = _message(exc).strip()
    first = text.splitlines()[0] if text else type(exc).__name__
    return DatabaseError(f"Spark failed on the query: {first}")


class SnapshotChanged(DatabaseError):
    """A pinned table's files changed while a query's statements ran: they may have read two versions."""

    def __init__(self, tables: Sequence[str]) -> None:
        super().__init__(
            f"the files of table {', '.join(repr(t) for t in tables)} changed while the query ran, so its answer "
            "and its sensitivity could have read different versions of the data"
        )
        self.tables = tuple(tables)


class SparkEngine:
    """Runs Spark SQL statements on ``spark`` (a SparkSession, local or Spark Connect). ``sources`` maps each
    catalog table to the name Spark knows it by (default: the same name), e.g. a qualified ``db.lineitem``."""

    dialect = SPARK

    def __init__(self, spark: Any, sources: Mapping[str, str] | None = None) -> None:
        self.spark = spark
        self.sources = dict(sources or {})
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._tag = uuid.uuid4().hex[:8]  # views of two engines on one SparkSession never collide
        # table → (what its pinned view reads: format, schema, options, files; the view's name) (snapshot)
        self._pinned: dict[str, tuple[tuple[Any, ...], str]] = {}

    def close(self) -> None:
        """Drops the views kept of pinned tables; the SparkSession is the caller's."""
        with self._lock:
            for name in list(self._pinned):
                self._forget(name)

    @contextmanager
    def snapshot(self, tables: tuple[str, ...]) -> Iterator[dict[str, str]]:
        """Each of ``tables`` pinned to its files or copied (module docstring) and bound to a temporary view;
        yields each table's view name. Raises :class:`SnapshotChanged` at the end of the block when a pinned
        table's files are no longer those the views read (also when the block failed: a statement may fail
        because a file went). The copies and their views go when the block ends; a pinned table's view is kept
        for the next query while its files, format, schema and options are the same (building it — a file
        index, an analysed plan — costs more than the statements of a small query), and dropped when they
        change or the engine closes."""
        prefix = f"__sqldp_{self._tag}_{next(self._ids)}_"
        copies = []
        pins: list[tuple[str, FileVersion]] = []
        views: dict[str, str] = {}
        try:
            for name in tables:
                frame = self.spark.table(self.sources.get(name, name))
                listed = _listing(frame)
                version = None if listed is None else file_version(self.spark, listed[3])
                if listed is None or version is None or any(length < 0 for _, length, _ in version):
                    frame = frame.localCheckpoint(eager=True)  # not its files alone, or a file just went: a copy
                    copies.append(frame)
                    views[name] = prefix + name
                    frame.createOrReplaceTempView(views[name])
                    continue
                fmt, schema, options, _ = listed
                key = (fmt, schema.json(), tuple(sorted(options.items())), version)
                cached = self._pinned.get(name)
                if cached is None or cached[0] != key:
                    self._forget(name)
                    view = f"__sqldp_{self._tag}_f{next(self._ids)}"  # never a per-query name (_<n>_<table>)
                    reader = self.spark.read.format(fmt).schema(schema).options(**options)
                    reader.load([path for path, _, _ in version]).createOrReplaceTempView(view)
                    self._pinned[name] = cached = (key, view)
                views[name] = cached[1]
                pins.append((name, version))
            try:
                yield views
            except Exception as exc:
                if moved := [name for name, version in pins if file_version(self.spark, version) != version]:
                    for name in moved:
                        self._forget(name)
                    raise SnapshotChanged(moved) from exc
                raise
            if moved := [name for name, version in pins if file_version(self.spark, version) != version]:
                for name in moved:
                    self._forget(name)
                raise SnapshotChanged(moved)
        finally:
            for name in tables:
                self.spark.catalog.dropTempView(prefix + name)
            for frame in copies:
                frame.unpersist()

    def _forget(self, name: str) -> None:
        """Drop the kept view of table ``name``'s pinned files (they changed, or the engine closes)."""
        cached = self._pinned.pop(name, None)
        if cached is not None:
            self.spark.catalog.dropTempView(cached[1])

    def _rows(self, sql: str, views: Mapping[str, str]) -> list[Row]:
        return [tuple(r) for r in self.spark.sql(bind(sql, views)).collect()]

    def _statement(self, sql: str, views: Mapping[str, str]) -> list[Row]:
        """One statement's rows, its deferred CASE branches (sqldp.engine.spark.sql.defer_fallbacks) computed only
        when a row takes one: as PostgreSQL, which evaluates such a subquery only then. The statement runs
        with RAISE_ERROR in each branch; when one fires, that branch's subquery runs alone, its value (one
        row, its own type) is bound to a view of this query, and the statement runs again reading it."""
        deferred = defer_fallbacks(sql)
        if deferred is None:
            return self._rows(sql, views)
        text = deferred.text
        values: list[str] = []
        try:
            for _ in range(len(deferred.calls) + 1):
                try:
                    return self._rows(text, views)
                except Exception as exc:
                    i = raised_fallback(exc)
                    if i is None or deferred.calls[i] not in text:
                        raise
                frame = self.spark.sql(bind(deferred.fallbacks[i], views))
                value = self.spark.createDataFrame(frame.collect(), frame.schema)  # one row: Spark's scalar rules
                view = f"__sqldp_{self._tag}_v{next(self._ids)}"  # never a snapshot name (those: _<n>_<table>)
                value.createOrReplaceTempView(view)
                values.append(view)
                text = text.replace(deferred.calls[i], f"(SELECT v FROM {view})")
            raise AssertionError("every deferred branch was bound")  # pragma: no cover
        finally:
            for view in values:
                self.spark.catalog.dropTempView(view)

    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        if statements.dialect != self.dialect.name:
            raise RefusedError(f"these statements are {statements.dialect} SQL; the Spark engine runs Spark SQL")
        with self._lock:
            for attempt in range(ATTEMPTS):
                try:
                    return self._execute(statements, speed)
                except SnapshotChanged:
                    # a writer replaced files while the statements ran: run them again on the new version
                    if attempt == ATTEMPTS - 1:
                        raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _execute(self, statements: Statements, speed: Speed) -> Fetched:
        try:
            with self.snapshot(statements.tables) as views, ThreadPoolExecutor(WORKERS) as pool:
                # Spark runs concurrent jobs of one session side by side: the driver plans one statement
                # while the executors run another (half the wall time of a query's statements on local[2])
                t0 = time.perf_counter()
                done: dict[str, float] = {}

                def run(sql: str, name: str = "") -> list[Row]:
                    rows = self._statement(sql, views)
                    done[name] = time.perf_counter()
                    return rows

                answer_job = pool.submit(run, statements.answer, "answer")
                jobs = [pool.submit(run, q) for q in statements.queries]
                domain_jobs = [None if q is None else pool.submit(run, q) for q in statements.domains]
                answer = answer_job.result()
                queries = [j.result() for j in jobs]
                # a joint group domain's statement has a column per key: its rows are the groups
                domains = [
                    None if j is None else tuple(r[0] if len(r) == 1 else tuple(r) for r in j.result())
                    for j in domain_jobs
                ]
                t1, t2 = done["answer"], time.perf_counter()
        except SnapshotChanged:
            raise
        except Exception as exc:
            if _spark_error(exc):
                raise database_error(exc) from exc
            raise
        speed.last = t2 - t0
        return Fetched(answer, queries, domains, t1 - t0, t2 - t0)

    def check(self, texts: Sequence[str]) -> None:
        """Nothing before the run: the statements name the per-query snapshot views, which exist only while
        :meth:`execute` runs, where Spark's analyser checks them first. The proxy serves PostgreSQL only; a
        budgeted Session on Spark (sqldp.session.Session.check) charges a statement Spark then rejects."""

    def largest_estimate(self, texts: Sequence[str]) -> None:
        """Spark's optimizer gives no row estimate before it runs: no guard of that kind here."""
        return None

    def connection(self) -> AbstractContextManager[Any]:
        """Spark has no connection a library user could run PostgreSQL statements on."""
        raise InputError("this session runs on Spark; it has no PostgreSQL connection")

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        """A statement over public tables, in Spark SQL that reads only snapshot names
        (sqldp.engine.spark.sql.public_statement, which the session applies before the run): its column names (as
        Spark names them) and rows. A table name without the snapshot prefix is refused: only the tables the
        statement was checked to read are bound."""
        import sqlglot
        from sqlglot import exp

        tree = sqlglot.parse_one(sql, read=self.dialect.name)
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        names = {t.name for t in tree.find_all(exp.Table) if t.name.lower() not in ctes}
        if any(not n.startswith(SNAPSHOT) for n in names):
            raise RefusedError(
                "the Spark engine runs public statements only as sqldp.engine.spark.sql.public_statement writes them"
            )
        tables = tuple(sorted(n[len(SNAPSHOT) :] for n in names))
        with self._lock:
            for attempt in range(ATTEMPTS):
                try:
                    with self.snapshot(tables) as views:
                        frame = self.spark.sql(bind(sql, views))
                        return list(frame.columns), [tuple(r) for r in frame.collect()]
                except SnapshotChanged:
                    if attempt == ATTEMPTS - 1:
                        raise
                except Exception as exc:
                    if _spark_error(exc):
                        raise database_error(exc) from exc
                    raise
        raise AssertionError("unreachable")  # pragma: no cover


def pin(spark: Any, frame: Any) -> tuple[Any, FileVersion] | None:
    """``frame`` read from exactly the files it reads now, and their version; None when its files are not the
    whole of it (anything but a plain scan of unpartitioned, unbucketed Parquet or ORC files listed by path)
    or the session exposes no file system (Spark Connect)."""
    listed = _listing(frame)
    if listed is None:
        return None
    fmt, schema, options, files = listed
    version = file_version(spark, files)
    if any(length < 0 for _, length, _ in version):  # a file went between the listing and now
        return None
    pinned = spark.read.format(fmt).schema(schema).options(**options).load([path for path, _, _ in version])
    return pinned, version


def _listing(frame: Any) -> tuple[str, Any, dict[str, str], FileVersion] | None:
    """What ``frame`` reads when it is a plain scan of files (:func:`pin`): the format, the schema, the
    reader's options but the paths, and the files (sizes and times not yet read: -1); None otherwise."""
    try:
        plan = frame._jdf.queryExecution().optimizedPlan()
    except AttributeError:  # a Spark Connect DataFrame: no JVM on this side
        return None
    if plan.getClass().getName() != "org.apache.spark.sql.execution.datasources.LogicalRelation":
        return None
    relation = plan.relation()
    if relation.getClass().getName() != "org.apache.spark.sql.execution.datasources.HadoopFsRelation":
        return None
    fmt = _PINNED_FORMATS.get(relation.fileFormat().getClass().getName())
    location = relation.location()
    if (
        fmt is None
        or location.getClass().getName() != _LISTED_INDEX
        or relation.partitionSchema().length() != 0
        or relation.bucketSpec().isDefined()
    ):
        return None
    options = {}
    entries = relation.options().iterator()
    while entries.hasNext():
        entry = entries.next()
        if entry._1().lower() not in ("path", "paths"):
            options[entry._1()] = entry._2()
    files = sorted(str(f) for f in location.inputFiles())
    if not files:
        return None
    return fmt, frame.schema, options, tuple((f, -1, -1) for f in files)


def bind(sql: str, views: Mapping[str, str]) -> str:
    """``sql`` with each snapshot name (``__sqldp_snapshot__<table>``, sqldp.engine.spark.sql) replaced by the view
    the snapshot bound the table to; the longest name first, and only whole names, so ``order`` never
    rewrites part of ``orders``."""
    if not views:
        return sql
    names = "|".join(re.escape(n) for n in sorted(views, key=len, reverse=True))
    return re.sub(re.escape(SNAPSHOT) + f"({names})(?![\\w$])", lambda m: views[m.group(1)], sql)


def file_version(spark: Any, files: FileVersion) -> FileVersion:
    """Each of ``files``' paths with its length and modification time now, from the table's file system
    (-1, -1 for a file that is gone)."""
    from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]

    jvm = spark._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    out = []
    for path, _, _ in files:
        hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
        try:
            status = hadoop_path.getFileSystem(conf).getFileStatus(hadoop_path)
        except Py4JJavaError:  # FileNotFoundException, or the file system cannot say: not the version pinned
            out.append((path, -1, -1))
            continue
        out.append((path, int(status.getLen()), int(status.getModificationTime())))
    return tuple(out)


def _spark_error(exc: Exception) -> bool:
    """Whether ``exc`` is an error Spark raised (analysis or execution), not a bug of sqldp's. An error inside
    a scalar subquery reaches Python as py4j's Py4JJavaError, not as a PySparkException: both are Spark's."""
    try:
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException
    except ImportError:  # pragma: no cover - pyspark is what gave us a session
        return False
    return isinstance(exc, (PySparkException, Py4JJavaError))


def _message(exc: Exception) -> str:
    """Spark's own message: a Py4JJavaError's text starts with py4j's "An error occurred while calling
    o123.collectToPython" and goes on with the Java stack; the Java exception's message is what failed."""
    java = getattr(exc, "java_exception", None)
    if java is None:
        return str(exc)
    try:
        # the root cause is Spark's error ("[DIVIDE_BY_ZERO] …"); the wrappers above it say "awaitResult"
        for _ in range(32):
            cause = java.getCause()
            if cause is None:
                break
            java = cause
        return str(java.getMessage() or java.toString())
    except Exception:  # the gateway is gone: say what kind of error it was, never the stack
        return type(exc).__name__


def local_settings(master: str) -> dict[str, str]:
    """The settings sqldp gives a SparkSession it starts itself on a local master (``local``, ``local[N]``,
    ``local[*]``, ``local[N,F]``); none for a cluster's master or Spark Connect, whose operators size them.

    Spark's defaults are sized for a cluster: 200 shuffle partitions are 200 tasks per shuffle, run a few at a
    time on a machine's cores, and adaptive query execution (AQE) plans each stage again after the one before
    it, which for sqldp's statements (the folded bounds are long expressions) is planning time that local data
    sizes never win back. Measured on the NAPLES queries at SF 0.1 on ``local[2]`` (docs/spark.md, "Session
    settings"): 2 × cores shuffle partitions and AQE off lower the noisy times and do not raise the plain
    ones."""
    match = re.fullmatch(r"local(?:\[\s*(\d+|\*)\s*(?:,\s*\d+\s*)?\])?", master.strip())
    if match is None:
        return {}
    threads = match.group(1)
    cores = 1 if threads is None else (os.cpu_count() or 1) if threads == "*" else max(int(threads), 1)
    return {"spark.sql.shuffle.partitions": str(2 * cores), "spark.sql.adaptive.enabled": "false"}


def spark_session(master: str | None = None) -> Any:
    """A SparkSession for the CLI: ``local[*]`` by default, a cluster's master URL (``spark://…``,
    ``yarn``, …), or Spark Connect for ``sc://…`` URLs. ANSI mode is required (sqldp.engine.spark.sql relies on
    Spark failing where PostgreSQL fails, e.g. on overflow) and set. A local session sqldp starts gets
    :func:`local_settings`; when this process already runs a SparkContext, ``getOrCreate`` returns the
    session of whoever started it, and its settings are left as they are."""
    try:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession
    except ImportError:
        from sqldp.errors import InputError

        raise InputError("the Spark engine needs pyspark: pip install 'sqldp[spark]'", where="--engine") from None
    url = master or "local[*]"
    builder = SparkSession.builder.appName("sqldp")
    builder = builder.remote(url) if url.startswith("sc://") else builder.master(url)
    spark = builder.config("spark.ui.showConsoleProgress", "false").config("spark.sql.ansi.enabled", "true")
    if SparkContext._active_spark_context is None:  # sqldp starts the session: not someone else's to tune
        for key, value in local_settings(url).items():
            spark = spark.config(key, value)
    session = spark.getOrCreate()
    if not url.startswith("sc://"):
        session.sparkContext.setLogLevel("ERROR")
    return session
