"""The PostgreSQL engine: connections, the snapshot an analysed query's statements share, and pipelining.

Session connections are autocommit and read-only by default: a single statement is its own transaction (one
round trip; explicit BEGIN/COMMIT cost ≈ 0.5 ms, as much as a small query), several share one snapshot
between BEGIN and COMMIT. COMMIT, not ROLLBACK, ends them: the same for a read-only transaction, but psycopg
forgets the connection's prepared statements on ROLLBACK, and re-planning the analysis queries costs more
than running them when the plain query takes a millisecond.
"""

from __future__ import annotations

import contextvars
import functools
import re
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
import psycopg.sql
import sqlglot
from sqlglot import exp

from sqldp.db import connect
from sqldp.engine.base import Fetched, Row, Speed
from sqldp.engine.postgres.dialect import POSTGRES
from sqldp.errors import DatabaseError, StatementError
from sqldp.rewrite import Statements, one_row

# below this (seconds), a query's answer and sensitivity queries are pipelined on one connection
SERIAL_BELOW = 0.02
IDLE_CONNECTIONS = 2  # kept open per session: the answer's and the sensitivity queries'
READ_ONLY = "SET default_transaction_read_only = on"
NO_TIMEOUT = "SET statement_timeout = 0"
SETUP = (READ_ONLY, NO_TIMEOUT)  # what configure() sets, also sent by the proxy's reset (sqldp.proxy.upstream)
BEGIN = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"


# a SELECT whose first item is a scalar subquery, or a column of the row statement's first shared scan
# (``SELECT g0.total AS v0, (SELECT …) AS v1 … FROM (…) AS g0``, sqldp.sensitivity.rows): only these may split
_PIECEWISE = re.compile(r"SELECT (\(|g\d+\.)")


def parts(text: str) -> tuple[str, ...]:
    """The statements that compute ``text``'s one row in pieces (:func:`layout`), in the order they are run."""
    return layout(text)[0]


@functools.lru_cache(maxsize=256)
def layout(text: str) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """:func:`pieces` of ``text`` and where each column of its row is in the pieces' rows side by side (None: in
    order). Besides a SELECT of scalar subqueries alone, one whose FROM is one-row aggregates only (the row
    statement's shared scans, sqldp.sensitivity.rows._shared_scan: ``SELECT (<subquery>) AS v0, g0.total AS v1
    … FROM (SELECT COUNT(*) … ) AS g0 CROSS JOIN …``) is one piece per scalar subquery and one per source of
    the FROM, the source's own SELECT: a one-row FROM gives the SELECT one row, each scalar
    subquery is evaluated once for it and reads nothing of it (an uncorrelated subquery; a correlated one keeps
    the statement whole), and a CROSS JOIN of one-row sources is their one rows side by side, so the pieces'
    values are the whole statement's. Several sources without a scalar subquery are split too (Q10's lineitem
    and orders scans run one per connection)."""
    if not _PIECEWISE.match(text):  # cheap: most statements read a FROM
        return (text,), None
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return (text,), None
    if not isinstance(tree, exp.Select) or tree.sql(dialect="postgres") != text:
        return (text,), None
    if tree.args.get("from_") is None:
        return pieces(text), None
    sources = [tree.args["from_"].this, *(j.this for j in tree.args.get("joins") or ())]
    joins = tree.args.get("joins") or ()
    if any(k not in ("expressions", "from_", "joins") and v for k, v in tree.args.items()):
        return (text,), None
    if any(j.args.get("on") or j.args.get("using") or (j.kind or "").upper() not in ("CROSS", "") for j in joins):
        return (text,), None
    names = set()
    for source in sources:
        if not isinstance(source, exp.Subquery) or not one_row(source.this) or not source.alias:
            return (text,), None
        names.add(source.alias)
    # each source's output names: an item reads one of them, found by name
    outputs = {source.alias: [e.alias_or_name for e in source.this.expressions] for source in sources}
    subqueries: list[exp.Expr] = []
    where: list[tuple[str, int]] = []  # per item: ("", k) the k-th subquery, (source, k) its k-th output
    for item in tree.expressions:
        inner = item.unalias()
        if isinstance(inner, exp.Subquery):
            if any(c.table in names for c in inner.find_all(exp.Column)):
                return (text,), None  # reads the FROM's columns: not a piece of its own
            where.append(("", len(subqueries)))
            subqueries.append(item)
        elif isinstance(inner, exp.Column) and inner.table in names:
            if outputs[inner.table].count(inner.name) != 1:
                return (text,), None
            where.append((inner.table, outputs[inner.table].index(inner.name)))
        else:
            return (text,), None
    if not subqueries and len(sources) < 2:
        return (text,), None
    texts = [exp.Select(expressions=[e.copy()]).sql(dialect="postgres") for e in subqueries]
    # one piece per source, the source's own one-row SELECT: a CROSS JOIN of one-row sources is their rows side by
    # side, so an item's value is its column of its source's row. The same source in two statements (Q21's two
    # row statements read one scan of lineitem) is one text, run once (a unit of _answer_and_queries)
    first: dict[str, int] = {}  # where a source's row starts in the pieces' rows side by side
    at = len(subqueries)
    for source in sources:
        first[source.alias] = at
        at += len(outputs[source.alias])
        texts.append(source.this.sql(dialect="postgres"))
    order = tuple(k if not alias else first[alias] + k for alias, k in where)
    return tuple(texts), order


@functools.lru_cache(maxsize=256)
def pieces(text: str) -> tuple[str, ...]:
    """The statements that compute ``text``'s one row in pieces, for the two connections to share: a SELECT
    without FROM whose items are all scalar subqueries (the row-sensitivity statement of
    sqldp.sensitivity.rows asks one per table and per join pattern) is one ``SELECT (<subquery>) AS <name>``
    per item. An item of a SELECT without FROM is evaluated once, reads nothing of the others, and a scalar
    subquery gives one value (or fails, alone as within the whole): in one snapshot the parts' values side by
    side are the whole statement's row. Anything else stays whole, and so does a text sqlglot would not write
    back exactly as it reads it (each part is then the very SQL of its item). Cached: parsing a statement of
    many subqueries costs milliseconds, and a prepared query runs the same texts every time."""
    if not text.startswith("SELECT ("):  # cheap: most statements read a FROM
        return (text,)
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except sqlglot.errors.SqlglotError:
        return (text,)
    if not isinstance(tree, exp.Select) or any(v for k, v in tree.args.items() if k != "expressions"):
        return (text,)
    items = tree.expressions
    if len(items) < 2 or not all(isinstance(e.unalias(), exp.Subquery) for e in items):
        return (text,)
    if tree.sql(dialect="postgres") != text:
        return (text,)
    return tuple(exp.Select(expressions=[e.copy()]).sql(dialect="postgres") for e in items)


def _unaliased(text: str) -> str:
    """A piece ``SELECT (<subquery>) AS <name>`` without its name: the same subquery under two names is one unit."""
    head, _, name = text.rpartition(") AS ")
    if text.startswith("SELECT (") and head and name.isidentifier():
        return head + ")"
    return text


def configure(conn: psycopg.Connection, statement_timeout: float | None = None) -> None:
    """Set up a connection the session reads through (autocommit): read only, and statements prepared from
    their first run, since an analysed query runs the same SQL texts every time (the session caches them).
    The statement timeout is the session's (seconds; None: none), whatever the server or role sets. A timeout
    that cancels a private query's statements ends its release after the charge, which stays: "ran over T" is
    a function of the latency the caller sees anyway, the timing side channel (docs/sql.md, "Errors are answers
    too"; docs/limits.md)."""
    for statement in SETUP:
        conn.execute(statement)
    if statement_timeout:
        conn.execute(f"SET statement_timeout = {max(1, round(statement_timeout * 1000))}")  # milliseconds
    conn.prepare_threshold = 0


def database_error(exc: psycopg.Error) -> DatabaseError:
    """One line from PostgreSQL's message (its first line says what failed)."""
    diag = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if exc.sqlstate == "57014" and "statement timeout" in diag:  # the session's limit (configure), not a cancel
        diag += " (the session's statement_timeout, --statement-timeout SECONDS; 0: no limit)"
    return DatabaseError(f"PostgreSQL failed on the query: {diag}", sqlstate=exc.sqlstate)


def _idle(conn: psycopg.Connection) -> bool:
    return not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def end(conn: psycopg.Connection) -> None:
    """End the snapshot's transaction, if one was begun (COMMIT keeps prepared statements, see above)."""
    if conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.execute("COMMIT")


class Running:
    """The upstream connections one statement is running on, so that another thread can cancel it (the
    proxy forwards a client's CancelRequest, PostgreSQL manual §55.2.8, to each of them with PQcancel). Set
    for the statements a thread runs with :func:`watching`. A connection taken after :meth:`cancel` is
    refused (57014) instead of starting a query nobody waits for."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._connections: list[psycopg.Connection] = []
        self.cancelled = False

    def add(self, conn: psycopg.Connection) -> None:
        with self._lock:
            if self.cancelled:
                raise DatabaseError("canceling statement due to user request", sqlstate="57014")
            self._connections.append(conn)

    def remove(self, conn: psycopg.Connection) -> None:
        with self._lock:
            if conn in self._connections:
                self._connections.remove(conn)

    def cancel(self, timeout: float = 5.0) -> None:
        """Ask PostgreSQL to cancel what each connection runs now (blocking: a round trip per connection)."""
        with self._lock:
            self.cancelled = True
            connections = list(self._connections)
        for conn in connections:
            try:
                conn.cancel_safe(timeout=timeout)
            except psycopg.Error:  # the connection may be gone meanwhile: a cancel is best effort
                continue


_running: contextvars.ContextVar[Running | None] = contextvars.ContextVar("sqldp_running", default=None)
_held: contextvars.ContextVar[list[_Held] | None] = contextvars.ContextVar("sqldp_held", default=None)


class _Held:
    """A pooled connection a thread is done with, given back to ``pool`` when its :func:`returning_after` ends."""

    def __init__(self, pool: Any, conn: psycopg.Connection, reusable: bool) -> None:
        self.pool, self.conn, self.reusable = pool, conn, reusable


@contextmanager
def returning_after() -> Iterator[None]:
    """Pooled connections this thread is done with meanwhile go back to their pool when the block ends, rather
    than each as soon as it is done with: the proxy hands a statement's answer to its event loop inside the
    block, and the connections' reset (sqldp.proxy.upstream) runs after, off the answer's path. Meanwhile the
    thread's next use takes one of them again (the same statement's: its parse check, then its run) rather
    than a second one from the pool, which could be empty."""
    held: list[_Held] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        failed: BaseException | None = None
        for h in held:
            try:
                h.pool.putconn(h.conn)
            except BaseException as exc:  # the others are given back all the same
                failed = failed or exc
        if failed is not None:
            raise failed


@contextmanager
def watching(running: Running) -> Iterator[Running]:
    """Statements this thread runs meanwhile register their connections with ``running``."""
    token = _running.set(running)
    try:
        yield running
    finally:
        _running.reset(token)


@contextmanager
def _watched(
    inner: AbstractContextManager[psycopg.Connection], running: Running | None
) -> Iterator[psycopg.Connection]:
    with inner as conn:
        if running is None:
            yield conn
            return
        running.add(conn)
        try:
            yield conn
        finally:
            running.remove(conn)


class PostgresEngine:
    """Runs statements as the analyst role on ``dsn``: on connections of ``pool`` (a psycopg_pool
    ConnectionPool of connections set up by :func:`configure`) when given, else on a few it keeps open
    (opening one costs ≈ 6 ms, more than many plain queries). ``first`` is an open connection to reuse."""

    dialect = POSTGRES

    def __init__(
        self,
        dsn: str,
        *,
        pool: Any = None,
        first: psycopg.Connection | None = None,
        statement_timeout: float | None = None,
    ) -> None:
        self.dsn = dsn
        self.pool = pool
        # seconds each statement may run on the connections this engine opens (None: no limit); a pool's
        # connections are set up by whoever made the pool (the proxy has its own timeout, docs/proxy.md)
        self.statement_timeout = statement_timeout
        if first is not None:
            configure(first, statement_timeout)
        self._idle: list[psycopg.Connection] = [first] if first is not None else []
        self._lock = threading.Lock()

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        """An autocommit, read-only connection: from the pool if there is one, else one this engine keeps;
        registered with the thread's :class:`Running` while in use, if there is one."""
        return _watched(self._connection(), _running.get())

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection]:
        if self.pool is not None:
            held = _held.get()
            if held is None:
                with self.pool.connection() as conn:
                    yield conn
                return
            again = next((h for h in held if h.pool is self.pool and h.reusable and _idle(h.conn)), None)
            if again is not None:
                held.remove(again)
            conn = again.conn if again is not None else self.pool.getconn()
            reusable = False
            try:
                yield conn
                reusable = True
            finally:
                held.append(_Held(self.pool, conn, reusable))
            return
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None or conn.closed:
            conn = connect(self.dsn)
            configure(conn, self.statement_timeout)
        try:
            yield conn
        except BaseException:
            conn.close()
            raise
        if conn.closed or conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.close()
            return
        with self._lock:
            if len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def _spare_connection(self) -> AbstractContextManager[psycopg.Connection] | None:
        """A second connection for the sensitivity queries, or None when the pool has none free right now (the
        caller then runs them on its own connection; waiting could deadlock a full pool)."""
        running = _running.get()  # entered in another thread, where the context variable is not set
        if self.pool is None:
            return _watched(self._connection(), running)
        from psycopg_pool import PoolTimeout

        try:
            conn = self.pool.getconn(timeout=0.001)
        except PoolTimeout:
            return None
        pool = self.pool

        @contextmanager
        def borrowed() -> Iterator[psycopg.Connection]:
            try:
                yield conn
            finally:
                pool.putconn(conn)

        return _watched(borrowed(), running)

    def close(self) -> None:
        """Close the connections this engine keeps (a pool given by the caller stays the caller's)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def check(self, texts: Sequence[str]) -> None:
        """PostgreSQL's parse analysis of each statement, without running it: the extended protocol's Parse
        (PostgreSQL manual §55.2.3) on the unnamed statement, which looks up names and types and converts the
        literals but neither plans nor reads a row. What fails here (``'abc'`` as an integer, an operator
        that does not exist, over 1664 result columns) fails on the text and the schema alone, so its error
        is a :class:`StatementError` with PostgreSQL's own SQLSTATE, raised before anything is charged."""
        with self.connection() as conn:
            for text in dict.fromkeys(texts):
                res = conn.pgconn.prepare(b"", text.encode("utf-8"))
                if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
                    sqlstate = res.error_field(psycopg.pq.DiagnosticField.SQLSTATE)
                    primary = res.error_field(psycopg.pq.DiagnosticField.MESSAGE_PRIMARY) or b"failed"
                    raise StatementError(
                        f"PostgreSQL refused the query: {primary.decode('utf-8', 'replace')}",
                        sqlstate=(sqlstate or b"42000").decode("ascii"),
                    )

    def largest_estimate(self, texts: Sequence[str]) -> tuple[float, int]:
        """The largest number of rows PostgreSQL's planner expects any step of any of ``texts`` to produce
        (EXPLAIN without ANALYZE: it plans from the tables' statistics and runs nothing), and the index of the
        statement it is in. The estimate reads pg_class and pg_statistic, which describe the private tables
        too: a figure for the data owner's guard (sqldp.session.Session.check), never for an analyst."""
        largest, where = 0.0, 0
        with self.connection() as conn:
            for i, text in enumerate(texts):
                try:
                    row = conn.execute(f"EXPLAIN (FORMAT JSON) {text}").fetchone()
                except psycopg.Error as exc:
                    raise database_error(exc) from exc
                plans = [row[0][0]["Plan"]] if row is not None else []
                while plans:
                    node = plans.pop()
                    if float(node.get("Plan Rows", 0)) > largest:
                        largest, where = float(node["Plan Rows"]), i
                    plans.extend(node.get("Plans", ()))
        return largest, where

    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        with self.connection() as conn:
            try:
                out, t_answer, t_queries = self._answer_and_queries(conn, statements, speed)
                domains = [
                    # a joint group domain's statement has a column per key: its rows are the groups
                    None
                    if text is None
                    else tuple(r[0] if len(r) == 1 else tuple(r) for r in conn.execute(text).fetchall())
                    for text in statements.domains
                ]
                end(conn)
            except psycopg.Error as exc:
                raise database_error(exc) from exc
        return Fetched(out[0], out[1:], domains, t_answer, t_queries)

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        with self.connection() as conn:
            try:
                cur = conn.execute(sql)  # one statement, read only (READ_ONLY)
                return [d.name for d in cur.description or []], cur.fetchall()
            except psycopg.Error as exc:
                raise database_error(exc) from exc

    def _answer_and_queries(
        self, conn: psycopg.Connection, statements: Statements, speed: Speed
    ) -> tuple[list[list[Row]], float, float]:
        """The answer query's rows followed by each sensitivity query's, and how long the answer query and the
        sensitivity queries took, all in one snapshot (NR §4.3.4 ran them separately).

        A lone answer query (everything folded into it, no group domain to read) runs as one statement. Else a
        transaction (BEGIN; :meth:`execute` ends it after the domain queries) and two ways, chosen by how long
        the last run of this query took: small queries are pipelined on one connection (one round trip for all
        of them; the fixed cost of a second connection, a thread and a snapshot export would dominate); larger
        ones are shared between this connection and a spare one that imports the snapshot
        (pg_export_snapshot / SET TRANSACTION SNAPSHOT, PostgreSQL manual §9.28.5), so the wall time is about
        the longer half: both take the next statement from one queue, the longest last time first, and a
        statement of several independent scalar subqueries is run as one statement per subquery (``parts``).
        If one fails, neither connection starts another and the release fails with the first error."""
        queries, answer = list(statements.queries), statements.answer
        serial = not queries or speed.last < SERIAL_BELOW
        spare = None if serial else self._spare_connection()
        domains = any(statements.domains)
        t0 = time.perf_counter()
        if not queries and not domains:  # one statement: its own snapshot (and no mode to choose next time)
            out = [conn.execute(answer).fetchall()]
            elapsed = time.perf_counter() - t0
            return out, elapsed, elapsed
        if spare is None:
            with conn.pipeline():
                conn.execute(BEGIN)
                cursors = [conn.execute(q) for q in (answer, *queries)]
                if not domains:
                    conn.execute("COMMIT")  # nothing else to read: end the transaction in the same round trip
            out = [c.fetchall() for c in cursors]
            elapsed = time.perf_counter() - t0
            speed.last = elapsed
            return out, elapsed, elapsed  # pipelined: they ran together
        conn.execute(BEGIN)
        snapshot = conn.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        # the units of work: the answer, then each query's parts (the query itself unless ``parts`` splits it)
        split = [layout(q) for q in queries]
        # a piece several statements ask (the same scalar subquery, another alias) is run once: it is
        # deterministic in one snapshot (Q21's two row statements share most of their counts)
        every = [answer, *(text for texts, _ in split for text in texts)]
        keys = [_unaliased(t) for t in every]
        units = list(dict.fromkeys(keys))
        unit_of = [units.index(k) for k in keys]
        texts_of = {k: t for k, t in zip(keys, every, strict=True)}
        units = [texts_of[k] for k in units]
        # a queue both connections take from, the longest last time first (LPT: the wall time is then at most
        # 4/3 of the best split); a unit never timed yet keeps its place after the timed ones
        order = sorted(range(len(units)), key=lambda u: -speed.each.get(units[u], 0.0))
        rows: list[list[Row] | None] = [None] * len(units)
        took: dict[int, float] = {}
        lock = threading.Lock()
        stop = threading.Event()  # a unit failed: neither connection starts another
        done: dict[str, float] = {}

        def work(on: psycopg.Connection) -> None:
            while not stop.is_set():
                with lock:
                    if not order:
                        return
                    u = order.pop(0)
                started = time.perf_counter()
                try:
                    rows[u] = on.execute(units[u]).fetchall()
                except BaseException:
                    stop.set()
                    raise
                took[u] = time.perf_counter() - started
                if u == 0:
                    done["answer"] = time.perf_counter()

        def side() -> None:
            try:
                with spare as other:
                    other.execute(BEGIN)
                    other.execute(psycopg.sql.SQL("SET TRANSACTION SNAPSHOT {}").format(psycopg.sql.Literal(snapshot)))
                    work(other)
                    other.execute("COMMIT")
            except BaseException:
                stop.set()
                raise

        with ThreadPoolExecutor(max_workers=1) as pool:
            future = pool.submit(side)
            try:
                work(conn)
            except BaseException:
                stop.set()
                futures.wait([future])  # the snapshot must outlive the side transaction's import; its error, if
                raise  # any, is the second one: this connection's is raised, as before
            future.result()
        t_end = time.perf_counter()
        for u, seconds in took.items():
            speed.each[units[u]] = seconds
        # what the units would take one after the other
        speed.last = sum(took.values())
        if any(r is None for r in rows):  # every unit ran when neither connection failed
            raise RuntimeError("a statement of the snapshot was not run")
        got_all = [rows[u] or [] for u in unit_of]
        fetched: list[list[Row]] = [got_all[0]]
        at = 1
        for texts, columns in split:
            got = got_all[at : at + len(texts)]
            at += len(texts)
            if len(texts) == 1:
                fetched.append(got[0])
                continue
            # a split query: its one row is its parts' one-row answers side by side (in ``columns``' order)
            row = tuple(v for r in got for v in r[0])
            fetched.append([row if columns is None else tuple(row[k] for k in columns)])
        return fetched, done["answer"] - t0, t_end - t0


# -- per-row budgets (sqldp.budgets) -------------------------------------------------------------------------


def ensure_ledger(conn: psycopg.Connection, name: str, ddl: Sequence[str]) -> None:
    """Create a per-row ledger (``name``, schema ``sqldp``) with ``ddl`` unless it exists, as sqldp's own role
    (``conn`` is the owner's); serialised by an advisory lock, as sqldp.proxy.ledger.ensure is."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sqldp.{name}",))
        found = conn.execute("SELECT to_regclass(%s)", (f'sqldp."{name}"',)).fetchone()
        if found is None or found[0] is None:
            for statement in ddl:
                conn.execute(statement)  # generated by sqldp.budgets.sql


class ChargedAnswer:
    """Runs a budgeted query's one statement (sqldp.budgets.sql.charged_statement: the answer and the charge of
    the rows it used) in one transaction on a connection of sqldp's own role, after a transaction-level
    advisory lock on the ledger, so that concurrent budgeted queries on one table charge one after another
    (each statement's snapshot is taken after the lock, PostgreSQL manual §13.2.1). The answer commits with
    its charge or not at all. An :class:`sqldp.engine.base.Engine` for one run."""

    dialect = POSTGRES

    def __init__(self, owner_dsn: str, ledger: str, statement_timeout: float | None = None) -> None:
        self.owner_dsn, self.ledger, self.statement_timeout = owner_dsn, ledger, statement_timeout
        self.charge_seconds = 0.0  # how long the transaction took, lock and COMMIT (the ledger's write) included

    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        t0 = time.perf_counter()
        try:
            # watched (:func:`watching`): a CancelRequest or the proxy's statement timeout cancels
            # the lock wait or the statement, and the transaction, charge included, rolls back
            with _watched(connect(self.owner_dsn, autocommit=False), _running.get()) as conn:
                if self.statement_timeout:
                    conn.execute(f"SET statement_timeout = {max(1, round(self.statement_timeout * 1000))}")
                conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"sqldp.{self.ledger}",))
                t_answer = time.perf_counter()
                rows = conn.execute(statements.answer).fetchall()
                elapsed = time.perf_counter() - t_answer
                domains = [
                    None
                    if text is None
                    else tuple(r[0] if len(r) == 1 else tuple(r) for r in conn.execute(text).fetchall())
                    for text in statements.domains
                ]
                conn.commit()
        except psycopg.Error as exc:
            raise database_error(exc) from exc
        self.charge_seconds = time.perf_counter() - t0
        return Fetched(rows, [], domains, elapsed, 0.0)

    def check(self, texts: Sequence[str]) -> None:  # the session checked the statements it derives from
        return None

    def largest_estimate(self, texts: Sequence[str]) -> None:  # the session's check ran on its own engine
        return None

    def connection(self) -> AbstractContextManager[psycopg.Connection]:
        raise StatementError("a budgeted run executes one private query", sqlstate="0A000")

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        raise StatementError("a budgeted run executes one private query", sqlstate="0A000")

    def close(self) -> None:
        return None


def read_counts(owner_dsn: str, ledger: str, statement: str) -> tuple[int, int]:
    """The exact (charged, excluded) counts of sqldp.budgets.sql.counts_statement, read in one snapshot as
    sqldp's role; they are data-dependent and leave sqldp only with noise."""
    try:
        with _watched(connect(owner_dsn), _running.get()) as conn:
            row = conn.execute(statement).fetchone()
    except psycopg.Error as exc:
        raise database_error(exc) from exc
    assert row is not None
    return int(row[0]), int(row[1])
