"""The public fast path: a statement that reads only public relations, whose analysis the session already holds
(:meth:`sqldp.session.Session.cached`), is answered on the event loop over an upstream connection the loop
holds, with no hand-off to a worker thread, and its rows are passed on as PostgreSQL sent them (text format:
the bytes of each value, never decoded into Python values and encoded again).

What is sent upstream is the statement as sqldp checked it (``PublicRelease.checked_sql``: regenerated from
the tree the allow-list and the relation check read), never the client's text, exactly as the runner's public
path sends it (sqldp.runner). It is prepared on the connection at its first execution there (a Parse, which
PostgreSQL refuses if the text holds more than one command) and executed as that prepared statement from then
on, so PostgreSQL parses and plans it once, as a direct client's driver has it do (psycopg prepares from the
fifth execution): unprepared, the lookup cost PostgreSQL twice the CPU. Protocol-level prepared statements are
not SQL ones (``pg_prepared_statements.from_sql`` is false) and hold only checked statements.

Session state, the argument of docs/proxy.md ("The public fast path"): the connections are not reset after each
use. A statement that reaches them is a single ``SELECT`` sqldp's allow-list admitted (sqldp.allowlist: no
``set_config``, advisory lock, ``LISTEN``, sequence, temporary table or other function that changes the
session), sent as one command of the extended protocol, in autocommit on a read-only session (``SETUP``); the
client's own ``SET``, ``RESET``, ``BEGIN`` and ``DECLARE`` never reach these connections (the proxy answers
them itself, sqldp.proxy.kinds). So nothing one client sends can change what the next finds there. As a check
of that argument rather than a part of it, every connection's whole session state (sqldp.proxy.upstream.STATE)
is compared with what it was after its set-up at its first use, every :data:`CHECK_EVERY`-th use and after any
error, and a connection left in a transaction or that compares unequal is closed, never used again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import struct
import time
import typing
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus, TransactionStatus

from sqldp.engine.postgres.engine import SETUP, Running, database_error
from sqldp.proxy import statements
from sqldp.proxy.errors import from_upstream, log
from sqldp.proxy.outcome import Outcome
from sqldp.proxy.upstream import STATE

if typing.TYPE_CHECKING:
    from sqldp.proxy.config import Analyst
    from sqldp.runner import Prepared

# uses between two comparisons of a connection's whole session state: each reads the catalog (pg_settings,
# information_schema) for a few ms of PostgreSQL's CPU; every 64th use cost more than the lookups themselves
CHECK_EVERY = 1024
PREPARED_KEPT = 256  # statements prepared on one connection at most; past that they are all deallocated
# the client settings under which upstream's text is what the proxy would send itself: extra_float_digits
# changes how PostgreSQL writes a float, so a client that set it is answered by the runner's path
NEUTRAL_SETTINGS = frozenset(("application_name", "client_min_messages"))


@dataclass
class Raw:
    """A result as PostgreSQL sent it: column names and type facts, and each row as a DataRow message."""

    names: list[str]
    types: list[int]
    sizes: list[int]
    mods: list[int]


class Upstream:
    """One upstream connection of the fast path, driven through libpq directly on the event loop: a reader
    kept registered on its socket for as long as it is open (one ``epoll_ctl`` per connection, not two per
    wait), its baseline session state, the statements it has prepared, and how often it was used."""

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.pgconn = conn.pgconn
        self.fd = self.pgconn.socket
        self.loop = asyncio.get_running_loop()
        self.waiting: asyncio.Future[None] | None = None
        self.baseline: tuple[Any, ...] = ()
        self.uses = 0
        self.suspect = False  # an error happened on it: compared before it is used again
        self.prepared: dict[str, bytes] = {}  # checked statement → name of its protocol-level prepared statement
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        waiting = self.waiting
        if waiting is not None:
            if not waiting.done():
                waiting.set_result(None)
            return
        try:  # idle: a notice or the server closing; read it so that the socket is not readable for ever
            self.pgconn.consume_input()
        except psycopg.Error:
            self.close()

    async def _wait(self, *, write: bool = False) -> None:
        fut = self.waiting = self.loop.create_future()
        if write:
            self.loop.add_writer(self.fd, lambda: None if fut.done() else fut.set_result(None))
        try:
            await fut
        finally:
            self.waiting = None
            if write:
                self.loop.remove_writer(self.fd)

    async def _results(self) -> list[Any]:
        """Every result of the command just sent (libpq in non-blocking mode, as psycopg sets it)."""
        pg = self.pgconn
        while pg.flush():
            await self._wait(write=True)
        results: list[Any] = []
        while True:
            pg.consume_input()
            while pg.is_busy():
                await self._wait()
                pg.consume_input()
            res = pg.get_result()
            if res is None:
                return results
            results.append(res)

    async def query(self, sql: str) -> Any:
        """``sql`` as one command (extended protocol, unnamed statement); its last result."""
        self.pgconn.send_query_params(sql.encode("utf-8"), None, result_format=0)
        results = await self._results()
        return results[-1] if results else None

    async def execute(self, sql: str) -> Any:
        """``sql`` as a statement prepared on this connection at its first execution here (PostgreSQL then
        parses and plans it once, as a direct client's driver has it do); its last result."""
        name = self.prepared.get(sql)
        if name is None:
            if len(self.prepared) >= PREPARED_KEPT:
                self.pgconn.send_query(b"DEALLOCATE ALL")
                await self._results()
                self.prepared.clear()
            name = f"sqldp_fast_{len(self.prepared)}".encode()
            self.pgconn.send_prepare(name, sql.encode("utf-8"), None)
            results = await self._results()
            res = results[-1] if results else None
            if res is None or res.status != ExecStatus.COMMAND_OK:
                return res
            self.prepared[sql] = name
        self.pgconn.send_query_prepared(name, None, None, result_format=0)
        results = await self._results()
        return results[-1] if results else None

    async def state(self) -> tuple[Any, ...]:
        """The whole session state (sqldp.proxy.upstream.STATE), each value as PostgreSQL wrote it."""
        res = await self.query(STATE)
        if res is None or res.status != ExecStatus.TUPLES_OK or res.ntuples != 1:
            raise psycopg.OperationalError("the session state could not be read")
        return tuple(res.get_value(0, c) for c in range(res.nfields))

    @property
    def closed(self) -> bool:
        return self.conn.closed

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.fd)
        self.pgconn.finish()


class Pool:
    """The fast path's upstream connections, held by the event loop (at most ``size``; opened on demand as the
    analyst role, set up as the runner's, sqldp.engine.postgres.engine.configure)."""

    def __init__(self, dsn: str, size: int) -> None:
        self.dsn = dsn
        self.size = max(1, size)
        self.idle: list[Upstream] = []
        self.open = 0
        self.waiters: list[asyncio.Future[None]] = []
        self.answers = 0  # how many statements it answered (tests and benchmarks)
        self.checks = 0  # how many whole-state comparisons were made (tests)
        self.discarded = 0  # how many connections failed one and were closed (tests)
        self.closed = False

    async def _connect(self) -> Upstream:
        conn = await psycopg.AsyncConnection.connect(self.dsn, autocommit=True, connect_timeout=10)
        try:
            for s in SETUP:
                await conn.execute(s, prepare=False)
        except BaseException:
            await conn.close()
            raise
        up = Upstream(conn)  # from here on driven by libpq calls alone, never by psycopg's own waits
        try:
            up.baseline = await up.state()
        except BaseException:
            up.close()
            raise
        return up

    async def acquire(self) -> Upstream:
        while True:
            if self.idle:
                return self.idle.pop()
            if self.open < self.size:
                self.open += 1
                try:
                    return await self._connect()
                except BaseException:
                    self.open -= 1
                    raise
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self.waiters:
                    self.waiters.remove(fut)

    async def release(self, up: Upstream) -> None:
        """Back to the idle list, or closed: see the module's doc for when its state is compared."""
        up.uses += 1
        ok = not self.closed and not up.closed
        if ok and up.pgconn.transaction_status != TransactionStatus.IDLE:
            ok = False
        if ok and (up.suspect or (up.uses - 1) % CHECK_EVERY == 0):
            self.checks += 1
            try:
                ok = await up.state() == up.baseline
            except psycopg.Error:
                ok = False
            up.suspect = False
        if ok:
            self.idle.append(up)
        else:
            self.discarded += 1
            self.open -= 1
            up.close()
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
                break

    def close(self) -> None:
        """Once the loop serves no more: the idle connections' sockets closed."""
        self.closed = True
        idle, self.idle = self.idle, []
        for up in idle:
            with contextlib.suppress(Exception):
                up.pgconn.finish()


class Backend(typing.Protocol):
    """What the fast path reads of a client's :class:`sqldp.proxy.backend.Backend` (a protocol, so that the
    backend, which holds the fast path's :class:`Pool`, and this module do not import each other)."""

    analyst: Analyst
    settings: dict[str, str]
    running: Running | None


def usable(b: Backend, prepared: Any) -> bool:
    """Whether the fast path may answer: a public analysis, no statement timeout to keep (the runner's path
    keeps it), and client settings that do not change how values are written."""
    return (
        getattr(prepared, "public", False)
        and getattr(getattr(prepared, "form", None), "checked_sql", "")
        and b.analyst.statement_timeout is None
        and all(name in NEUTRAL_SETTINGS for name in b.settings)
    )


async def answer(b: Backend, pool: Pool, prepared: Prepared) -> Outcome:
    """The public statement's rows as PostgreSQL sent them (:class:`Raw`), its checked text sent upstream."""
    sql: str = getattr(prepared.form, "checked_sql", "")  # a PublicRelease's: usable() checked it is there
    t0 = time.perf_counter()
    up = await pool.acquire()
    pgconn = up.pgconn
    b.running = _Cancelling(pgconn)  # a CancelRequest from now on cancels the upstream statement
    try:
        res = await up.execute(sql)
    except BaseException:
        up.suspect = True
        up.close()  # cancelled or broken mid-statement: its protocol state is unknown
        await pool.release(up)
        raise
    if res is None or res.status != ExecStatus.TUPLES_OK:
        up.suspect = True
        await pool.release(up)
        if res is not None and res.status == ExecStatus.FATAL_ERROR:
            exc = pg_errors.error_from_result(res, encoding="utf-8")
            raise from_upstream(database_error(exc), public=True) from None
        raise from_upstream(database_error(psycopg.OperationalError("no result from the upstream")), public=True)
    nf, nt = res.nfields, res.ntuples
    raw = Raw(
        [(res.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(nf)],
        [res.ftype(i) for i in range(nf)],
        [res.fsize(i) for i in range(nf)],
        [res.fmod(i) for i in range(nf)],
    )
    rows = [_data_row(res, r, nf) for r in range(nt)]
    pool.answers += 1
    await pool.release(up)
    if log.isEnabledFor(logging.INFO):
        ms = round((time.perf_counter() - t0) * 1000, 3)
        entry = {
            "event": "query",
            "analyst": b.analyst.name,
            "fingerprint": statements.fingerprint(prepared.sql),
            "decision": "public",
            "epsilon": 0.0,
            "delta": 0.0,
            "rows": nt,
            "ms": ms,
            "path": "fast",
        }
        log.info(json.dumps(entry))
    return Outcome(f"SELECT {nt}", raw.names, raw.types, rows, raw=raw)


class _Cancelling(Running):
    """What :meth:`Backend.cancel` calls (in a worker thread) to cancel the fast path's upstream statement."""

    def __init__(self, pgconn: Any) -> None:
        super().__init__()
        self.pgconn = pgconn

    def cancel(self, timeout: float = 5.0) -> None:
        self.cancelled = True
        with contextlib.suppress(psycopg.Error):  # the connection may be gone meanwhile: a cancel is best effort
            self.pgconn.get_cancel().cancel()


_NULL = struct.pack("!i", -1)


def _data_row(res: Any, r: int, nf: int) -> bytes:
    """Row ``r`` of ``res`` as a DataRow message (§55.7), each value's bytes as PostgreSQL sent them."""
    parts = [struct.pack("!h", nf)]
    for c in range(nf):
        value = res.get_value(r, c)
        parts.append(_NULL if value is None else struct.pack("!i", len(value)) + value)
    body = b"".join(parts)
    return b"D" + struct.pack("!i", len(body) + 4) + body
