"""One client's state once it is logged in, as PostgreSQL calls the process that serves it: what the message
handlers (sqldp.proxy.messages) and the statement kinds (sqldp.proxy.kinds) read and change — the transaction
block, the named statements and portals, the session's settings, the statement running now and its
cancellation — and :class:`Server`, what they ask of the server that accepted the client.

The event loop owns a connection's task; statements that read no data are classified and answered in a worker
thread while that task waits for them (so a Backend is only ever used by one of them at a time)."""

from __future__ import annotations

import asyncio
import contextlib
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from sqldp.engine.postgres.engine import Running, returning_after
from sqldp.errors import SqldpError
from sqldp.proxy import protocol as pr
from sqldp.proxy.analysis import Description
from sqldp.proxy.config import Analyst
from sqldp.proxy.cursors import Limits, Portals, PreparedStatements
from sqldp.proxy.errors import Cancelled, TooComplex
from sqldp.proxy.outcome import Outcome
from sqldp.proxy.transaction import Transaction

if typing.TYPE_CHECKING:
    import ssl
    from concurrent.futures import ThreadPoolExecutor

    from psycopg_pool import ConnectionPool

    from sqldp.proxy.catalog import Shadow
    from sqldp.proxy.config import ProxyConfig
    from sqldp.proxy.ledger import GroupCommit
    from sqldp.proxy.passthrough import Pool
    from sqldp.session import Session
    from sqldp.strategies import Compiled

T = typing.TypeVar("T")
# Statements up to this many characters are lexed and classified on the event loop: at most about 20 ms for
# the slowest 256 characters tried (deep parentheses, long sums), well under 1 ms for a usual one; longer ones
# go to a worker thread.
INLINE_BELOW = 256


class Server(Protocol):
    """What a connection asks of the server that accepted it (sqldp.proxy.server.ProxyServer)."""

    session: Session
    config: ProxyConfig
    settings: dict[str, str]  # the upstream's reported settings (server_version, TimeZone, …)
    shadow: Shadow | None
    ledger_pool: ConnectionPool
    charges: GroupCommit  # the ledger's charges, concurrent ones in one commit
    executor: ThreadPoolExecutor  # analyses and queries
    front: ThreadPoolExecutor  # lexing, classifying and the answers that need no data
    tls: ssl.SSLContext | None
    cert_pem: str | None
    mock_secret: bytes
    connections: dict[tuple[int, int], Any]  # by (process id, secret key): where a CancelRequest finds one
    passthrough: Pool  # the public fast path's upstream connections, held by the event loop

    @property
    def limits(self) -> Limits: ...
    def new_pid(self) -> int: ...
    def cancel(self, body: bytes) -> None: ...
    def answers_catalog(self, sql: str) -> bool: ...
    def catalog_answer(self, sql: str) -> Outcome: ...
    def budget_answer(self, analyst: str) -> Outcome: ...
    def check(self, prepared: Compiled) -> None: ...
    def known_description(self, query: str, types: tuple[int, ...], privacy: Mapping[str, Any]) -> Any: ...
    def description(self, query: str, types: tuple[int, ...], privacy: Mapping[str, Any]) -> Description | None: ...


class Backend:
    def __init__(
        self,
        server: Server,
        writer: asyncio.StreamWriter,
        key: tuple[int, int],
        analyst: Analyst,
        user: str,
        database: str,
        settings: dict[str, str],
    ) -> None:
        self.server = server
        self.writer = writer
        self.key = key  # BackendKeyData: pg_backend_pid() answers its process id
        self.analyst = analyst
        self.user = user
        self.database = database
        self.settings = settings  # what the client set (SET) over the server's
        self.transaction = Transaction()
        self.prepared = PreparedStatements()
        self.portals = Portals()
        self.waking: asyncio.Future[None] | None = None  # set when the statement running now ends or is cancelled
        self.abandoned: asyncio.Future[Any] | None = None  # a cancelled statement (or its description) still running
        self.cancel_requested = False
        self.running: Running | None = None  # the upstream connections of the statement running now

    def error(self, err: SqldpError) -> None:
        """An ErrorResponse; an open transaction block fails."""
        self.transaction.fail()
        position = err.position + 1 if err.position is not None else None  # P counts from 1 (§55.8)
        self.writer.write(pr.error_response(err.sqlstate, str(err), hint=err.hint, position=position))

    async def off(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` in a worker thread: lexing, parsing and classifying take time in proportion to the text
        (up to the message limit) and on the event loop would stall every other client meanwhile. Short texts
        are done on the loop: a hand-off costs more than they take (0.2-0.4 ms each, three per statement in
        the extended protocol, on a loaded machine)."""
        size = sum(len(a) if isinstance(a, str) else _bind_size(a) if isinstance(a, pr.Bind) else 0 for a in args)
        try:
            if size <= INLINE_BELOW:
                return fn(*args)
            return await asyncio.get_running_loop().run_in_executor(self.server.front, fn, *args)
        except RecursionError:  # sqlglot recurses over nested parentheses
            raise TooComplex() from None

    def in_front(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in the threads of the answers that need no data (they do I/O: the ledger, the shadow)."""
        return asyncio.get_running_loop().run_in_executor(self.server.front, fn, *args)

    def in_executor(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` in the threads of the analyses and queries."""
        return asyncio.get_running_loop().run_in_executor(self.server.executor, fn, *args)

    # -- the statement running now and its cancellation -----------------------------------------

    def cancel(self) -> None:
        """A CancelRequest for this connection (§55.2.8)."""
        self.cancel_requested = True  # honoured before the charge
        if self.waking is not None:  # and the client is answered at once (cancellable)
            wake(self.waking)
        running = self.running
        if running is not None:  # and after it, PostgreSQL is asked to stop the statement's queries
            sent = asyncio.get_running_loop().run_in_executor(self.server.front, running.cancel)
            sent.add_done_callback(drop_result)

    async def cancellable(self, work: Awaitable[T]) -> T:
        """``work``, or 57014 as soon as a CancelRequest for this connection arrives: a worker thread cannot be
        stopped, but its upstream queries are cancelled (:meth:`cancel`: PQcancel on each connection it runs
        on), so it ends soon; a charge already made stays, none is made after the cancel
        (``cancel_requested``), and its answer is dropped. JDBC's setQueryTimeout waited for the whole run and
        gave up with an I/O error. The next statement waits for the dropped one: it still has to see the
        cancel flag (which the next statement resets) before its charge."""
        if self.abandoned is not None:
            await asyncio.wait({self.abandoned})
            self.abandoned = None
        task = asyncio.ensure_future(work)
        # one future woken by whichever comes first, the end of the work or a CancelRequest (cancel): a task
        # waiting on an Event and asyncio.wait cost three more steps of the event loop on every statement
        waking = self.waking = asyncio.get_running_loop().create_future()
        task.add_done_callback(lambda _: wake(waking))
        try:
            await waking
        finally:
            self.waking = None
        if task.done():
            return task.result()
        task.add_done_callback(drop_result)
        self.abandoned = task
        raise Cancelled()


def _bind_size(bind: pr.Bind) -> int:
    return sum(len(p) for p in bind.params if p is not None)


def hand_over(loop: asyncio.AbstractEventLoop, handed: asyncio.Future[T], fn: Callable[..., T], *args: Any) -> None:
    """In a worker thread: ``fn(*args)``'s value or exception to ``handed`` as soon as it is known, then the
    upstream connections it used back to their pool, whose reset (sqldp.proxy.upstream) runs meanwhile instead
    of before the answer. (``run_in_executor`` also settles its future only once the function returns, and
    chains a second future to it.)"""
    with returning_after():
        try:
            value = fn(*args)
        except BaseException as exc:
            _soon(loop, _fail, handed, exc)
        else:
            _soon(loop, _succeed, handed, value)


def _soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the event loop is closed: the server is stopping
        loop.call_soon_threadsafe(fn, *args)


def _succeed(handed: asyncio.Future[T], value: T) -> None:
    if not handed.done():  # done: the statement's task was cancelled meanwhile (the server is stopping)
        handed.set_result(value)


def _fail(handed: asyncio.Future[Any], exc: BaseException) -> None:
    if not handed.done():
        handed.set_exception(exc)


def wake(waking: asyncio.Future[None]) -> None:
    if not waking.done():
        waking.set_result(None)


def drop_result(task: asyncio.Future[Any]) -> None:
    """Retrieve a cancelled statement's late result or error so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()
