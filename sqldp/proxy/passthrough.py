"""The public fast path: a statement that reads only public relations, whose analysis the session already holds
(:meth:`sqldp.session.Session.cached`), is answered on the event loop over an upstream connection the loop
holds, with no hand-off to a worker thread, and its rows are passed on as PostgreSQL sent them (text format:
the bytes of each value, never decoded into Python values and encoded again).

What is sent upstream is the statement as sqldp checked it (``PublicRelease.checked_sql``: regenerated from
the tree the allow-list and the relation check read), never the client's text, exactly as the runner's public
path sends it (sqldp.runner). It goes as one Parse/Bind/Execute/Sync of the unnamed statement (libpq's
``PQsendQueryParams``), which PostgreSQL refuses if it holds more than one command.

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
from psycopg import generators, waiting
from psycopg.pq import ExecStatus, TransactionStatus

from sqldp.engine.postgres.engine import SETUP, Running, database_error
from sqldp.proxy import statements
from sqldp.proxy.errors import from_upstream, log
from sqldp.proxy.outcome import Outcome
from sqldp.proxy.upstream import STATE

if typing.TYPE_CHECKING:
    from sqldp.proxy.backend import Backend
    from sqldp.runner import Prepared

CHECK_EVERY = 64  # uses between two comparisons of a connection's whole session state
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
    """One upstream connection of the fast path, its baseline session state and how often it was used."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], baseline: tuple[Any, ...]) -> None:
        self.conn = conn
        self.baseline = baseline
        self.uses = 0
        self.suspect = False  # an error happened on it: compared before it is used again


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
            cur = await conn.execute(STATE, prepare=False)
            row = await cur.fetchone()
        except BaseException:
            await conn.close()
            raise
        assert row is not None
        return Upstream(conn, tuple(row))

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
        ok = not self.closed and not up.conn.closed
        if ok and up.conn.info.transaction_status != TransactionStatus.IDLE:
            ok = False
        if ok and (up.suspect or (up.uses - 1) % CHECK_EVERY == 0):
            self.checks += 1
            try:
                cur = await up.conn.execute(STATE, prepare=False)
                row = await cur.fetchone()
                ok = row is not None and tuple(row) == up.baseline
            except psycopg.Error:
                ok = False
            up.suspect = False
        if ok:
            self.idle.append(up)
        else:
            self.discarded += 1
            self.open -= 1
            await up.conn.close()
        for fut in self.waiters:
            if not fut.done():
                fut.set_result(None)
                break

    def close(self) -> None:
        """From any thread, once the loop serves no more: the idle connections' sockets closed."""
        self.closed = True
        idle, self.idle = self.idle, []
        for up in idle:
            up.conn.pgconn.finish()


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
    pgconn = up.conn.pgconn
    b.running = _Cancelling(pgconn)  # a CancelRequest from now on cancels the upstream statement
    try:
        pgconn.send_query_params(sql.encode("utf-8"), None, result_format=0)
        results = await waiting.wait_async(generators.execute(pgconn), pgconn.socket)
    except BaseException:
        up.suspect = True
        if isinstance(up.conn, psycopg.AsyncConnection) and not up.conn.closed:
            await up.conn.close()  # cancelled or broken mid-statement: its protocol state is unknown
        await pool.release(up)
        raise
    res = results[-1] if results else None
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
