"""The asyncio server: one task per client connection, analyses and queries in a bounded thread pool.

Message flow per the protocol documentation (PostgreSQL manual chapter 55): start-up and SSL negotiation
(§55.2.1, §55.2.10), SASL/SCRAM authentication (§55.3), the simple query protocol (§55.2.2), the extended
protocol (§55.2.3: Parse/Bind/Describe/Execute/Close/Flush/Sync, errors skip to the next Sync), cancel requests
(§55.2.8) and Terminate (§55.2.9). A framing error closes that connection after an ErrorResponse; the server
and the other connections go on.

The order for every private answer is fixed: analyse (refusals here cost nothing) → charge the ledger and
commit → run and add noise → send. So an answer never leaves without its charge being durable.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import os
import re
import secrets
import ssl
import struct
import threading
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import pq

from sqldp.engine.postgres.engine import Running, returning_after, watching
from sqldp.errors import DatabaseError, ForbiddenError, InputError, RefusedError, SqldpError, SqlSyntaxError
from sqldp.proxy import catalog as shadow_catalog
from sqldp.proxy import harmless, ledger, statements
from sqldp.proxy import protocol as pr
from sqldp.proxy import scram as scram_auth
from sqldp.proxy import values as v
from sqldp.proxy.config import Analyst, ProxyConfig
from sqldp.proxy.scram import AuthFailed, ScramServer

if typing.TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from sqldp.result import Result
    from sqldp.session import Session
    from sqldp.strategies import Compiled

log = logging.getLogger("sqldp.proxy")
T = typing.TypeVar("T")


class _OneLine(logging.Filter):
    """Every record of the proxy's log is one line: an exception logged with its traceback (``log.exception``)
    becomes the exception's class and first line of text. The log is read line by line (JSON), and a
    traceback's frames are not ours to print."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = " ".join(str(exc).split())[:200]
            entry = {"event": "internal_error", "where": record.getMessage(), "error": type(exc).__name__}
            record.msg, record.args = json.dumps({**entry, "text": text}), ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


log.addFilter(_OneLine())
AUTH_TIMEOUT = 30.0  # seconds a client has to finish start-up and authentication
# What one connection may keep (PostgreSQL sets no limit; a client could otherwise grow the proxy without bound:
# 200 named statements of 1 MB each grew it to 1.25 GB): named prepared statements, their text, open portals.
MAX_PREPARED = 256
MAX_PREPARED_BYTES = 16 << 20
MAX_PORTALS = 256
# Statements up to this many characters are lexed and classified on the event loop: at most about 20 ms for
# the slowest 256 characters tried (deep parentheses, long sums), well under 1 ms for a usual one; longer ones
# go to a worker thread.
INLINE_BELOW = 256
# How many checked answer texts the server remembers (ProxyServer.check); past that it starts again.
CHECKED_KEPT = 4096
# How many statement descriptions the server keeps (ProxyServer.description), least recently used dropped.
DESCRIBED_KEPT = 4096
# Messages whose oversize body can be skipped with the connection kept: the framing is intact and the
# protocol has an error path for them (§55.2.2: ErrorResponse then ReadyForQuery; §55.2.3: skip to Sync).
_SKIPPABLE = frozenset(b"QPBDECFdcf"[i : i + 1] for i in range(10))
# Extended-protocol messages whose replies wait for the next Sync or Flush, as PostgreSQL's do (§55.2.3: "messages
# returned by the backend will be combined into the minimum possible number of packets"): a private answer's
# BindComplete, RowDescription, NOTICE, DataRow, CommandComplete and ReadyForQuery leave in one send, not five.
_HELD = frozenset((b"P", b"B", b"D", b"E", b"C"))
HELD_BELOW = 1 << 16  # bytes of replies held at most; more are sent at once


@dataclass
class Outcome:
    """What a statement produced: a result set (columns and types) or only a command tag."""

    tag: str
    columns: list[str] | None = None
    types: list[int] | None = None
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    notice: bytes = b""  # a NoticeResponse sent with the answer (what a private answer cost, its error bars)
    # the statement the runner answered (None: answered otherwise): its result types are those its Describe
    # announces (ProxyServer.description), which ``types``, read off the Python values, only approximate
    query: str | None = None


def prepare_query(session: Session, sql: str, privacy: Mapping[str, Any]) -> Compiled:
    """The runner's two-step API: analyse now (no private data), run later."""
    try:
        return session.prepare(sql, **privacy)
    except RecursionError:  # sqlglot and the analyses recurse over the expression tree
        raise _TooComplex() from None


class ProxyServer:
    """Serves analysts over the PostgreSQL protocol; ``session`` is a :class:`sqldp.session.Session`,
    ``ledger_pool`` holds autocommit connections to the ledger's database."""

    def __init__(
        self,
        session: Session,
        config: ProxyConfig,
        ledger_pool: ConnectionPool,
        settings: Mapping[str, str],
        shadow: shadow_catalog.Shadow | None = None,
    ) -> None:
        self.session = session
        self.shadow = shadow  # answers the catalog queries of clients and BI tools (None: no rows)
        self.config = config
        self.ledger_pool = ledger_pool
        self.settings = dict(settings)
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sqldp-proxy")
        # lexing, classifying and the answers that need no data run here, apart from the analyses and queries
        # above, so that a long analysis does not hold up other clients' connection-time chatter
        self.front = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sqldp-proxy-front")
        self.connections: dict[tuple[int, int], Connection] = {}
        self.mock_secret = secrets.token_bytes(32)
        self.tls: ssl.SSLContext | None = None
        self.cert_pem: str | None = None  # the certificate TLS presents: SCRAM-SHA-256-PLUS binds to it
        if config.tls_cert and config.tls_key:
            self.tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self.tls.load_cert_chain(str(config.tls_cert), str(config.tls_key))
            self.cert_pem = config.tls_cert.read_text(encoding="ascii")
        self.worker, self.workers = 0, 1  # this process's index among the proxy's server processes, and their number
        self.peers: tuple[str, ...] = ()  # each worker's socket for forwarded cancel requests (sqldp.proxy.workers)
        self._next_pid = 1000 + (os.getpid() % 1000) * 1000
        self._lock = threading.Lock()
        self._checked: set[str] = set()  # answer texts whose statements PostgreSQL parsed (check)
        # statement descriptions by (text, parameter types, analyst's privacy): a statement's result types
        # depend on its text and the catalog only, which do not change under a running proxy
        self._described: collections.OrderedDict[tuple[Any, ...], Description | None] = collections.OrderedDict()
        self._describer: psycopg.Connection[Any] | None = None  # upstream_describe's, opened on first use
        self._describing = threading.Lock()

    def answers_catalog(self, sql: str) -> bool:
        """Whether ``sql`` is a system-catalog query the shadow database answers (sqldp.proxy.catalog)."""
        if self.shadow is None:
            return False
        tree = shadow_catalog.parse(sql)
        tables = self.session.catalog.tables
        return (
            tree is not None
            and shadow_catalog.is_catalog_query(tree, lambda name: name in tables)
            and shadow_catalog.refusal(tree) is None
        )

    def catalog_answer(self, sql: str) -> Outcome:
        assert self.shadow is not None
        try:
            got = self.shadow.select(sql)
        except shadow_catalog.ShadowError as exc:
            raise _Shadow(exc.sqlstate, str(exc)) from None
        return Outcome(f"SELECT {len(got.rows)}", got.columns, got.types, list(got.rows))

    def budget_answer(self, analyst: str) -> Outcome:
        """``SHOW sqldp.budget`` for ``analyst``, read from the ledger (in a worker thread)."""
        with self.ledger_pool.connection() as conn:
            b = ledger.balance(conn, analyst)
        if b is None:
            raise ForbiddenError(f"analyst {analyst!r} has no budget in the ledger")
        return budget_outcome(b)

    def check(self, prepared: Compiled) -> None:
        """PostgreSQL's parse analysis of a private query's statements before the charge (reads no row): a
        type error found there is a free refusal with PostgreSQL's own SQLSTATE, not a charged failure. Once
        per answer text: the schema does not change under a running proxy."""
        statements = prepared.statements
        if statements is None or statements.answer in self._checked:
            return
        self.session.engine.check(prepared.checks())  # a workflow's steps too
        with self._lock:
            if len(self._checked) >= CHECKED_KEPT:
                self._checked.clear()
            self._checked.add(statements.answer)

    def known_description(self, query: str, types: tuple[int, ...], privacy: Mapping[str, Any]) -> Any:
        """The kept description of a statement (:meth:`description`), or :data:`UNKNOWN` (on the event loop: a
        dictionary look-up)."""
        key = (query, types, tuple(sorted(privacy.items())))
        with self._lock:
            if key not in self._described:
                return UNKNOWN
            self._described.move_to_end(key)
            return self._described[key]

    def description(self, query: str, types: tuple[int, ...], privacy: Mapping[str, Any]) -> Description | None:
        """The statement's parameter and result types (:func:`describe`), kept: every path a client may take —
        the simple protocol, an unnamed or a named statement, text or binary results — announces these, so a
        driver that caches a statement's columns (pgjdbc past its prepareThreshold) decodes every execution
        alike. In a worker thread: the analysis and the upstream's Parse/Describe take time."""
        known = self.known_description(query, types, privacy)
        if known is not UNKNOWN:
            return typing.cast(Description | None, known)
        desc = describe(self.session, query, types, privacy, self.upstream_describe)
        with self._lock:
            self._described[(query, types, tuple(sorted(privacy.items())))] = desc
            while len(self._described) > DESCRIBED_KEPT:
                self._described.popitem(last=False)
        return desc

    def upstream_describe(self, query: str, oids: list[int]) -> Shape | None:
        """Parse and Describe upstream, as the analyst role, on a connection kept for them: no reading
        connection is taken from the pool and reset afterwards (a Parse changes no session state: nothing
        runs), which took 1.6 of a describe's 6 ms on a loaded machine."""
        from sqldp.engine.postgres.engine import configure

        analyst_dsn = self.session.analyst_dsn
        assert analyst_dsn is not None  # a PostgreSQL session: the proxy serves PostgreSQL only
        with self._describing:
            for attempt in (1, 2):
                conn = self._describer
                if conn is None or conn.closed:
                    try:
                        conn = psycopg.connect(analyst_dsn, autocommit=True, connect_timeout=10)
                        configure(conn)  # as the reading connections: the same settings, read only
                    except psycopg.Error:
                        return None
                    self._describer = conn
                got = parse_describe(conn, query, oids)
                if got is not None or not conn.closed or attempt == 2:
                    return got  # refused by PostgreSQL, or answered; else the connection broke: once more
            return None

    def as_worker(self, index: int, peers: tuple[str, ...]) -> None:
        """Serve as worker ``index`` of ``len(peers)`` processes sharing one port (sqldp.proxy.workers): the
        process id in each connection's BackendKeyData is ≡ ``index`` modulo their number, so a CancelRequest,
        which arrives on a new connection that the kernel may hand to any worker, is forwarded to the owner's
        socket ``peers[owner]``."""
        with self._lock:
            self.worker, self.workers, self.peers = index, len(peers), peers
            self._next_pid = (1000 + (os.getpid() % 1000) * 1000) * self.workers + index

    def new_pid(self) -> int:
        with self._lock:
            self._next_pid += self.workers
            return self._next_pid

    def owner(self, pid: int) -> int:
        """The worker whose connection ``pid`` is (:meth:`as_worker`)."""
        return pid % self.workers

    def forward_cancel(self, pid: int, body: bytes) -> bool:
        """Send a CancelRequest for another worker's connection to that worker; whether it was another's. The
        answer is none either way (§55.2.8: the server never answers a cancel request)."""
        owner = self.owner(pid)
        if owner == self.worker:
            return False
        task = asyncio.ensure_future(_send_cancel(self.peers[owner], body))
        task.add_done_callback(_drop_result)
        return True

    async def serve(self, host: str, port: int, *, reuse_port: bool = False) -> asyncio.Server:
        return await asyncio.start_server(self._client, host, port, limit=1 << 16, reuse_port=reuse_port)

    async def serve_peers(self, path: str) -> asyncio.Server:
        """This worker's socket for cancel requests forwarded by the others (:meth:`forward_cancel`)."""
        return await asyncio.start_unix_server(self._peer, path)

    async def _peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            code, body = await asyncio.wait_for(pr.read_startup(reader), AUTH_TIMEOUT)
            # only this worker's own connections: a request is never forwarded twice
            ours = len(body) >= 8 and self.owner(struct.unpack("!i", body[:4])[0]) == self.worker
            if code == pr.CANCEL_REQUEST and ours:
                Connection(self, reader, writer)._cancel(body)
        except (pr.ProtocolError, ConnectionError, EOFError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                writer.close()
                await writer.wait_closed()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(self, reader, writer)
        try:
            await conn.run()
        except (ConnectionError, EOFError, asyncio.IncompleteReadError, TimeoutError):
            pass
        except asyncio.CancelledError:
            # the server is stopping (asyncio.run cancels what is left after shutdown()): the connection ends
            # here. Re-raised, the cancellation reached asyncio's start_server callback, which logged it with a
            # traceback (Python 3.11 streams: task.exception() of a cancelled task)
            pass
        except Exception as exc:  # a bug must cost one connection, never the server; one line, no traceback
            _internal_log("connection", exc)
            await conn._fatal("XX000", "internal error in sqldp; the connection is closed")
        finally:
            self.connections.pop(conn.key, None)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                writer.close()
                await writer.wait_closed()

    async def shutdown(self) -> None:
        """On SIGTERM or SIGINT, before the event loop stops: every connected client is told, as PostgreSQL tells
        its clients at a fast shutdown (57P01, FATAL), and its connection closed. A statement still running in a
        worker thread has its answer dropped (a charge already made stays, as for a cancel)."""
        connections = list(self.connections.values())

        async def tell(conn: Connection) -> None:
            with contextlib.suppress(TimeoutError):  # a client that reads nothing does not hold up the stop
                await asyncio.wait_for(conn._fatal("57P01", "terminating connection due to administrator command"), 1)
            with contextlib.suppress(Exception):
                conn.writer.close()

        await asyncio.gather(*(tell(c) for c in connections))

    def close(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.front.shutdown(wait=False, cancel_futures=True)
        with self._describing:
            if self._describer is not None:
                self._describer.close()
        if self.shadow is not None:
            self.shadow.close()


class _Replies:
    """The client's writer in the query loop: ``write`` keeps the messages and ``drain`` sends them in one piece
    (each ``StreamWriter.write`` is a send of its own on an idle socket: a system call, a TCP segment on
    loopback and a wake-up of the client). More than :data:`HELD_BELOW` bytes are sent at once, so a long
    result is not held in memory twice. Everything else is the wrapped writer's."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.parts: list[bytes] = []
        self.size = 0

    def write(self, data: bytes) -> None:
        self.parts.append(data)
        self.size += len(data)
        if self.size >= HELD_BELOW:
            self.flush()

    def flush(self) -> None:
        if self.parts:
            self.writer.write(b"".join(self.parts) if len(self.parts) > 1 else self.parts[0])
            self.parts.clear()
            self.size = 0

    async def drain(self) -> None:
        self.flush()
        await self.writer.drain()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.writer, name)


@dataclass
class Cursor:
    """A named cursor (DECLARE): its portal's outcome holds every row, released in full when it was declared;
    FETCH and MOVE page through them (:func:`statements.run_fetch`)."""

    hold: bool  # WITH HOLD: outlives COMMIT
    scroll: bool | None  # NO SCROLL (False) refuses backward moves, as PostgreSQL does
    position: int = 0  # 0: before the first row, k: on row k, len(rows) + 1: after the last
    in_transaction: bool = False  # declared in the open transaction block: ROLLBACK closes it, even WITH HOLD


@dataclass
class Portal:
    sql: str
    result_formats: tuple[int, ...]
    outcome: Outcome | None = None
    sent: int = 0
    empty: bool = False  # no statement in it (only comments or blanks): EmptyQueryResponse
    types: tuple[int, ...] | None = None  # result column types as Describe of its statement announced them
    spans: tuple[statements.Span, ...] = ()  # where its parameters were bound (error positions map back)
    cursor: Cursor | None = None  # a portal made by DECLARE


UNKNOWN = object()  # no description kept yet (ProxyServer.known_description)


@dataclass(frozen=True)
class Description:
    """A prepared statement as a client learns it from Describe: parameter and result column types."""

    params: tuple[int, ...]
    names: tuple[str, ...]
    columns: tuple[int, ...]


async def _send_cancel(path: str, body: bytes) -> None:
    """A CancelRequest (§55.7) for the worker listening on ``path``; a worker that is gone cancels nothing."""
    with contextlib.suppress(OSError):
        _, writer = await asyncio.open_unix_connection(path)
        writer.write(struct.pack("!ii", 16, pr.CANCEL_REQUEST) + body[:8])
        await writer.drain()
        writer.close()
        await writer.wait_closed()


def _bind_size(bind: pr.Bind) -> int:
    return sum(len(p) for p in bind.params if p is not None)


def _hand_over(loop: asyncio.AbstractEventLoop, handed: asyncio.Future[T], fn: Callable[..., T], *args: Any) -> None:
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


def _wake(waking: asyncio.Future[None]) -> None:
    if not waking.done():
        waking.set_result(None)


def _drop_result(task: asyncio.Future[Any]) -> None:
    """Retrieve a cancelled statement's late result or error so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()


def _internal_log(where: str, exc: BaseException) -> None:
    """One log line for an unexpected exception (no traceback: the log is read by people and by the wire fuzz
    test, and a traceback's locals are not ours to print); its first line of text, shortened."""
    text = " ".join(str(exc).split())[:200]
    log.error(json.dumps({"event": "internal_error", "where": where, "error": exc.__class__.__name__, "text": text}))


def _log(analyst: str, fingerprint: str, decision: str, **extra: Any) -> None:
    """One JSON line per statement: who, which query (fingerprint, never the text or any value), what happened."""
    if not log.isEnabledFor(logging.INFO):
        return
    entry = {"event": "query", "analyst": analyst, "fingerprint": fingerprint, "decision": decision}
    entry.update(extra)
    log.info(json.dumps(entry, default=str))


class Connection:
    def __init__(self, server: ProxyServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.key = (0, 0)
        self.analyst: Analyst | None = None
        self.user = ""
        self.database = ""
        self.settings: dict[str, str] = {}
        self.status = "I"  # ReadyForQuery: I idle, T in a transaction block, E failed transaction block
        self.statements: dict[str, tuple[str, tuple[int, ...]]] = {}
        self.portals: dict[str, Portal] = {}
        # the open block's savepoints, innermost last, each with the cursors declared since it (ROLLBACK TO
        # closes those, as PostgreSQL drops the portals of a rolled-back subtransaction)
        self.savepoints: list[tuple[str, set[str]]] = []
        self.waking: asyncio.Future[None] | None = None  # set when the statement running now ends or is cancelled
        self.abandoned: asyncio.Future[Any] | None = None  # a cancelled statement (or its description) still running
        self.described: dict[str, Description | None] = {}  # statement name → what the upstream said of it
        # statement name → the result types its Describe announced: a Bind of it encodes by those (pgjdbc
        # reads a named statement's executions by the columns it was told once)
        self.announced: dict[str, tuple[int, ...]] = {}
        self.cancel_requested = False
        self.running: Running | None = None  # the upstream connections of the statement running now
        self.encrypted = False  # TLS was negotiated (SSLRequest): SCRAM-SHA-256-PLUS is offered

    # -- start-up -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            ok = await asyncio.wait_for(self._startup(), AUTH_TIMEOUT)
        except pr.ProtocolError as exc:
            await self._fatal("08P01", str(exc))
            return
        if ok:
            # from now on replies are held until the client waits for them (_Replies, _HELD); the rest is forwarded
            self.writer = typing.cast(asyncio.StreamWriter, _Replies(self.writer))
            await self._loop()

    async def _startup(self) -> bool:
        for _ in range(3):  # at most SSLRequest, GSSENCRequest, then the StartupMessage
            code, body = await pr.read_startup(self.reader)
            if code == pr.SSL_REQUEST:
                if self.server.tls is not None:
                    self.writer.write(b"S")
                    await self.writer.drain()
                    await self.writer.start_tls(self.server.tls)
                    self.encrypted = True
                else:
                    self.writer.write(b"N")  # §55.2.10: continue unencrypted (the client may then give up)
                    await self.writer.drain()
                continue
            if code == pr.GSSENC_REQUEST:
                self.writer.write(b"N")
                await self.writer.drain()
                continue
            if code == pr.CANCEL_REQUEST:
                self._cancel(body)
                return False
            if code >> 16 != 3:
                await self._fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
                return False
            params = pr.parse_startup_params(body)
            if code & 0xFFFF:
                # §55.2.1: answer a newer minor version with NegotiateProtocolVersion and go on with 3.0.
                opts = [k for k in params if k.startswith("_pq_.")]
                payload = struct.pack("!ii", pr.PROTOCOL_3_0, len(opts)) + b"".join(pr.cstr(o) for o in opts)
                self.writer.write(pr.message(b"v", payload))
            return await self._authenticate(params)
        raise pr.ProtocolError("too many start-up requests")

    def _cancel(self, body: bytes) -> None:
        if len(body) < 8:
            return
        pid, key = struct.unpack("!iI", body[:8])
        if self.server.forward_cancel(pid, body):  # another worker process's connection
            return
        target = self.server.connections.get((pid, key))
        if target is not None:
            target.cancel_requested = True  # honoured before the charge
            if target.waking is not None:  # and the client is answered at once (_cancellable)
                _wake(target.waking)
            running = target.running
            if running is not None:  # and after it, PostgreSQL is asked to stop the statement's queries
                sent = asyncio.get_running_loop().run_in_executor(self.server.front, running.cancel)
                sent.add_done_callback(_drop_result)

    async def _authenticate(self, params: dict[str, str]) -> bool:
        user = params.get("user", "")
        if not user:
            await self._fatal("28000", "no user name given in the startup packet")
            return False
        self.user = user
        self.database = params.get("database", user)
        self.settings = {"application_name": params.get("application_name", "")}
        analyst = self.server.config.analysts.get(user)
        binding = scram_auth.channel_binding(self.server.cert_pem) if self.encrypted else None
        self.writer.write(pr.auth_sasl(scram_auth.mechanisms(binding is not None)))
        await self.writer.drain()
        try:
            kind, body = await pr.read_message(self.reader, 8192)
            if kind != b"p":
                raise pr.ProtocolError(f"expected a SASLInitialResponse, got message type {kind!r}")
            buf = pr.Buffer(body, "SASLInitialResponse")
            mech = buf.cstr()
            n = buf.int32()
            first = buf.bytes_(n) if n >= 0 else b""
            buf.end()
            verifier = analyst.verifier if analyst else None
            scram = ScramServer(verifier, user, self.server.mock_secret, mechanism=mech, binding=binding)
            self.writer.write(pr.auth_sasl_continue(scram.first(first)))
            await self.writer.drain()
            kind, body = await pr.read_message(self.reader, 8192)
            if kind != b"p":
                raise pr.ProtocolError(f"expected a SASLResponse, got message type {kind!r}")
            final = scram.final(body)
        except AuthFailed as exc:
            log.info(json.dumps({"event": "auth", "analyst": user, "decision": "refused", "reason": str(exc)}))
            await self._fatal("28P01", f'password authentication failed for user "{user}"')
            return False
        self.analyst = analyst
        self.key = (self.server.new_pid(), secrets.randbits(32))
        self.server.connections[self.key] = self
        out = [pr.auth_sasl_final(final), pr.auth_ok()]
        for name in harmless.REPORTED:
            value = self.settings.get(name) or self.server.settings.get(name, "")
            out.append(pr.parameter_status(name, value))
        out += [pr.parameter_status("session_authorization", user), pr.backend_key_data(*self.key)]
        out.append(pr.ready_for_query(self.status))
        self.writer.write(b"".join(out))
        await self.writer.drain()
        log.info(json.dumps({"event": "auth", "analyst": user, "decision": "accepted"}))
        return True

    async def _fatal(self, sqlstate: str, text: str) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(pr.error_response(sqlstate, text, severity="FATAL"))
            await self.writer.drain()

    # -- the query loop -----------------------------------------------------------------------

    async def _loop(self) -> None:
        skipping = False  # after an error in the extended protocol, until Sync (§55.2.3)
        limit = self.server.config.max_message_bytes
        while True:
            try:
                kind, body = await pr.read_message(self.reader, limit)
            except pr.Oversize as exc:
                if exc.kind not in _SKIPPABLE:
                    await self._fatal("08P01", str(exc))
                    return
                if not skipping:  # the error goes out before the body is skipped: the client may wait for it
                    self._error(_TooLarge(str(exc)))
                    await self.writer.drain()
                await pr.discard(self.reader, exc.size)
                if exc.kind == b"Q":
                    self.writer.write(pr.ready_for_query(self.status))
                else:
                    skipping = True
                await self.writer.drain()
                continue
            except pr.ProtocolError as exc:
                await self._fatal("08P01", str(exc))
                return
            if kind == b"X":
                return
            try:
                if kind == b"Q":
                    skipping = False
                    await self._simple(pr.parse_query(body))
                elif kind == b"S":
                    skipping = False
                    self.writer.write(pr.ready_for_query(self.status))
                elif kind == b"H":
                    pass  # Flush: everything written is flushed below
                elif kind in (b"P", b"B", b"D", b"E", b"C"):
                    if not skipping:
                        try:
                            await self._extended(kind, body)
                        except SqldpError as err:
                            self._error(err)
                            skipping = True
                elif kind in (b"d", b"c", b"f"):
                    pass  # CopyData/CopyDone/CopyFail outside COPY are ignored, as the server does
                elif kind == b"F":
                    if not skipping:
                        self._error(ForbiddenError("the function call protocol is not available through sqldp"))
                        skipping = True
                else:
                    raise pr.ProtocolError(f"invalid frontend message type {kind!r}")
            except pr.ProtocolError as exc:
                await self._fatal("08P01", str(exc))
                return
            except (ConnectionError, EOFError, asyncio.IncompleteReadError, TimeoutError):
                raise
            except Exception as exc:  # a bug: this message fails (one log line), the connection goes on
                _internal_log(f"message {kind!r}", exc)
                self._error(_Internal(exc))
                if kind == b"Q":
                    self.writer.write(pr.ready_for_query(self.status))
                elif kind != b"S":
                    skipping = True
                else:
                    self.writer.write(pr.ready_for_query(self.status))
            if kind not in _HELD:
                await self.writer.drain()

    def _error(self, err: SqldpError) -> None:
        if self.status == "T":
            self.status = "E"
        position = err.position + 1 if err.position is not None else None  # P counts from 1 (§55.8)
        self.writer.write(pr.error_response(err.sqlstate, str(err), hint=err.hint, position=position))

    async def _off(self, fn: Callable[..., Any], *args: Any) -> Any:
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
            raise _TooComplex() from None

    async def _simple(self, sql: str) -> None:
        try:
            outcome = await self._answer(sql, simple=True)
            if outcome is None:
                self.writer.write(pr.empty_query())
            else:
                if outcome.columns is not None:
                    types = await self._runner_types(outcome) if outcome.query is not None else outcome.types or []
                    self.writer.write(pr.row_description(_fields(outcome.columns, types)))
                    self.writer.write(
                        b"".join(
                            pr.data_row(v.encode_text(x, types[i]) for i, x in enumerate(row)) for row in outcome.rows
                        )
                    )
                self.writer.write(pr.command_complete(outcome.tag))
        except SqldpError as err:
            self._error(err)
        self.writer.write(pr.ready_for_query(self.status))

    async def _extended(self, kind: bytes, body: bytes) -> None:
        if kind == b"P":
            msg = pr.parse_parse(body)
            if len(await self._off(_parsed, msg.query)) > 1:
                raise RefusedError("cannot insert multiple commands into a prepared statement")
            if msg.name and msg.name in self.statements:
                raise SqlSyntaxError(f'prepared statement "{msg.name}" already exists')
            kept = [q for name, (q, _) in self.statements.items() if name != msg.name]
            if msg.name and len(kept) >= MAX_PREPARED:
                raise _TooLarge(f"too many prepared statements on this connection (limit {MAX_PREPARED}); close some")
            if sum(map(len, kept)) + len(msg.query) > MAX_PREPARED_BYTES:
                raise _TooLarge(
                    f"prepared statements on this connection would hold over {MAX_PREPARED_BYTES} bytes; close some"
                )
            self.statements[msg.name] = (msg.query, msg.param_types)
            self.described.pop(msg.name, None)
            self.announced.pop(msg.name, None)
            self.writer.write(pr.parse_complete())
        elif kind == b"B":
            bind = pr.parse_bind(body)
            if bind.statement not in self.statements:
                raise SqlSyntaxError(f'prepared statement "{bind.statement}" does not exist')
            # binary parameters need their types, binary results the columns' (§55.2.3), and every execution
            # the same columns whichever path it takes: the statement's description (kept by the server)
            desc = await self._description(bind.statement)
            query, types = self.statements[bind.statement]
            announced = self.announced.get(bind.statement)
            if bind.portal and bind.portal not in self.portals and len(self.portals) >= MAX_PORTALS:
                raise _TooLarge(f"too many open portals on this connection (limit {MAX_PORTALS}); close some")
            sql, empty, spans = await self._off(_bind, query, types, bind)
            columns = announced if announced is not None else desc.columns if desc is not None else None
            self.portals[bind.portal] = Portal(sql, bind.result_formats, empty=empty, types=columns, spans=spans)
            self.writer.write(pr.bind_complete())
        elif kind == b"D":
            target, name = pr.parse_describe_or_close(body, "Describe")
            if target == "S":
                await self._describe_statement(name)
            else:
                portal = self._portal(name)
                outcome = await self._outcome(portal)
                if outcome.columns is None:
                    self.writer.write(pr.no_data())
                else:
                    fields = _fields(outcome.columns, _result_types(portal, outcome))
                    self.writer.write(pr.row_description(fields, _formats(portal.result_formats, len(fields))))
        elif kind == b"E":
            name, max_rows = pr.parse_execute(body)
            portal = self._portal(name)
            if portal.cursor is not None:  # a declared cursor's portal: Execute fetches forward from its position
                count = max_rows if max_rows > 0 else statements.ALL
                got = self._fetch(statements.Fetch(name, "forward", count, move=False))
                oids = got.types or []
                self.writer.write(
                    b"".join(pr.data_row(v.encode_text(x, oids[i]) for i, x in enumerate(r)) for r in got.rows)
                )
                more = 0 < max_rows == len(got.rows)
                self.writer.write(pr.portal_suspended() if more else pr.command_complete(f"SELECT {len(got.rows)}"))
                return
            outcome = await self._outcome(portal)
            if portal.empty:
                self.writer.write(pr.empty_query())
                return
            if outcome.columns is not None:
                column_types = _result_types(portal, outcome)
                formats = _formats(portal.result_formats, len(column_types))
                end = len(outcome.rows) if max_rows <= 0 else min(len(outcome.rows), portal.sent + max_rows)
                chunk = []
                for row in outcome.rows[portal.sent : end]:
                    chunk.append(
                        pr.data_row(
                            v.encode_binary(x, column_types[i]) if formats[i] else v.encode_text(x, column_types[i])
                            for i, x in enumerate(row)
                        )
                    )
                self.writer.write(b"".join(chunk))
                portal.sent = end
                if end < len(outcome.rows):
                    self.writer.write(pr.portal_suspended())
                    return
            self.writer.write(pr.command_complete(outcome.tag))
        else:  # Close
            target, name = pr.parse_describe_or_close(body, "Close")
            (self.statements if target == "S" else self.portals).pop(name, None)
            if target == "S":
                self.described.pop(name, None)
                self.announced.pop(name, None)
            self.writer.write(pr.close_complete())

    def _portal(self, name: str) -> Portal:
        portal = self.portals.get(name)
        if portal is None:
            raise SqlSyntaxError(f'portal "{name}" does not exist')
        return portal

    async def _outcome(self, portal: Portal) -> Outcome:
        if portal.outcome is None:
            try:
                portal.outcome = Outcome("") if portal.empty else await self._answer(portal.sql)
            except SqldpError as err:
                if err.position is not None:  # into the statement as the client wrote it, with its $n
                    err.position = statements.unbound(portal.spans, err.position)
                raise
            if portal.types is None and portal.outcome.query is not None:
                portal.types = tuple(await self._runner_types(portal.outcome))
        return portal.outcome

    async def _runner_types(self, outcome: Outcome) -> list[int]:
        """The result types of a statement the runner answered, as a Describe of it announces them (its
        bound text: no parameters left); the types of its values where it has no description."""
        columns = outcome.columns or []
        if outcome.query is None or not columns:
            return outcome.types or []
        analyst = self.analyst
        assert analyst is not None
        desc = self.server.known_description(outcome.query, (), analyst.privacy)
        if desc is UNKNOWN:
            loop = asyncio.get_running_loop()
            run = self.server.description
            desc = await loop.run_in_executor(self.server.executor, run, outcome.query, (), analyst.privacy)
        if isinstance(desc, Description) and len(desc.columns) == len(columns):
            return list(desc.columns)
        return outcome.types or []

    async def _describe_statement(self, name: str) -> None:
        """Parameter types as declared (unspecified ones as text) and, for a SELECT, the result columns as far as
        they are known without running it: names from the select list, each typed text until executed."""
        if name not in self.statements:
            raise SqlSyntaxError(f'prepared statement "{name}" does not exist')
        n, names = await self._off(_statement_shape, self.statements[name][0])
        desc = await self._description(name) if names is not None else None
        types = self.statements[name][1]
        oids = [(types[i] if i < len(types) and types[i] else v.TEXT) for i in range(n)]
        self.writer.write(pr.parameter_description(oids))
        fetched = self._cursor_shape(self.statements[name][0]) if names is None else None
        if fetched is not None and fetched.columns is not None:
            announced = list(fetched.types or [])
            names = fetched.columns
        elif names is None:
            self.writer.write(pr.no_data())
            return
        elif desc is not None:
            names, announced = list(desc.names), list(desc.columns)
        elif names == list(BUDGET_COLUMNS):
            announced = list(BUDGET_TYPES)
        else:  # not known before it runs: text, and its executions are sent as text alike (Bind: announced)
            announced = [v.TEXT] * len(names)
        self.announced[name] = tuple(announced)
        self.writer.write(pr.row_description(_fields(names, announced)))

    async def _description(self, name: str) -> Description | None:
        """The statement's parameter and result types (:func:`describe`), once per statement; parameters the
        client left unspecified take the types described, so that binary values are read as such."""
        if name not in self.described:
            query, types = self.statements[name]
            analyst = self.analyst
            assert analyst is not None
            loop = asyncio.get_running_loop()
            shadow = self.server.shadow
            local = shadow.localize(query, self.database) if shadow is not None else query
            if shadow is not None and await self._off(self.server.answers_catalog, _with_nulls(local)):
                got = await loop.run_in_executor(self.server.front, shadow.describe, local, types)
                # its parameters keep the client's types: a text value left untyped is bound as a quoted
                # literal PostgreSQL types in place (a regclass, an oid), which sqldp's binding does not
                self.described[name] = Description(*got) if got is not None else None
                return self.described[name]
            desc = self.server.known_description(query, types, analyst.privacy)
            if desc is UNKNOWN:
                # the statement's analysis runs here, when a Bind or Describe first needs it: a CancelRequest
                # (JDBC's setQueryTimeout) ends the wait at once, as it ends a running statement's
                run = self.server.description
                self.cancel_requested = False
                desc = await self._cancellable(
                    loop.run_in_executor(self.server.executor, run, query, types, analyst.privacy)
                )
            self.described[name] = desc
            if desc is not None:
                merged = tuple(types[i] if i < len(types) and types[i] else t for i, t in enumerate(desc.params))
                self.statements[name] = (query, merged)
        return self.described[name]

    # -- answering one statement --------------------------------------------------------------

    @typing.overload
    async def _answer(self, sql: str) -> Outcome: ...
    @typing.overload
    async def _answer(self, sql: str, *, simple: bool) -> Outcome | None: ...
    async def _answer(self, sql: str, *, simple: bool = False) -> Outcome | None:
        """Connection-time chatter answered in a worker thread (:meth:`_answer_now`), the rest by the runner.
        ``simple``: a Query message's text, checked there too (None: no statement in it)."""
        notes: list[bytes] = []
        outcome = await self._off(self._answer_now, sql, notes, simple)
        self.writer.write(b"".join(notes))
        if outcome is None or isinstance(outcome, Outcome):
            return outcome
        if isinstance(outcome, _Declare):
            return await self._declare(outcome.declare)
        if isinstance(outcome, _BudgetQuery):
            assert self.analyst is not None
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.server.front, self.server.budget_answer, self.analyst.name)
        if isinstance(outcome, _CatalogQuery):
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self.server.front, self.server.catalog_answer, outcome.sql)
        try:
            answered = await self._cancellable(self._private(outcome))
        except SqldpError as err:
            _locate(err, sql, outcome)
            raise
        self.writer.write(answered.notice)  # before its rows: psql prints it above the result
        return answered

    async def _cancellable(self, work: Awaitable[T]) -> T:
        """``work``, or 57014 as soon as a CancelRequest for this connection arrives: a worker thread cannot be
        stopped, but its upstream queries are cancelled (``_cancel``: PQcancel on each connection it runs on),
        so it ends soon; a charge already made stays, none is made after the cancel (``cancel_requested``), and
        its answer is dropped. JDBC's setQueryTimeout waited for the whole run and gave up with an I/O error.
        The next statement waits for the dropped one: it still has to see the cancel flag (which the next
        statement resets) before its charge."""
        if self.abandoned is not None:
            await asyncio.wait({self.abandoned})
            self.abandoned = None
        task = asyncio.ensure_future(work)
        # one future woken by whichever comes first, the end of the work or a CancelRequest (_cancel): a task
        # waiting on an Event and asyncio.wait cost three more steps of the event loop on every statement
        waking = self.waking = asyncio.get_running_loop().create_future()
        task.add_done_callback(lambda _: _wake(waking))
        try:
            await waking
        finally:
            self.waking = None
        if task.done():
            return task.result()
        task.add_done_callback(_drop_result)
        self.abandoned = task
        raise _Cancelled()

    def _answer_now(
        self, sql: str, notes: list[bytes], simple: bool = False
    ) -> Outcome | _CatalogQuery | _BudgetQuery | _Declare | str | None:
        """In a worker thread, while this connection's task waits for it (so its state is ours to change):
        the answer to a statement that reads no data, or the statement to hand to the runner. Messages to
        send go to ``notes`` (the writer belongs to the event loop). One hand-off per statement: the simple
        protocol's checks are made here too."""
        if simple and not _simple_statements(sql):
            return None
        analyst = self.user
        stmt = statements.classify(sql)
        if self.status == "E" and stmt.kind not in ("rollback", "commit", "rollback_to"):
            raise _InFailedTransaction()
        if stmt.kind == "begin":
            if self.status == "I":
                self.status = "T"
            return Outcome("BEGIN")
        if stmt.kind in ("commit", "rollback"):
            tag = "ROLLBACK" if stmt.kind == "rollback" or self.status == "E" else "COMMIT"
            self._close_cursors(committed=tag == "COMMIT")
            self.savepoints.clear()
            self.status = "I"
            return Outcome(tag)
        if stmt.kind in ("savepoint", "release", "rollback_to"):
            if self.status == "I":
                raise _NoTransaction(stmt.words[0].upper())
            self._savepoint(stmt.kind, statements.savepoint_name(stmt.sql))
            return Outcome({"savepoint": "SAVEPOINT", "release": "RELEASE", "rollback_to": "ROLLBACK"}[stmt.kind])
        if stmt.kind == "show" and stmt.words == BUDGET_SHOW:
            return _BudgetQuery()
        if stmt.kind == "show":
            a = harmless.show(stmt.words, {**self.server.settings, **self.settings})
            return Outcome(a.tag, a.columns, a.types, a.rows)
        if stmt.kind in ("set", "reset"):
            name, value = harmless.set_(sql, stmt.words, self.settings, self.server.settings)
            if name == "all":
                self.settings = {}
            elif value is None:
                self.settings.pop(name, None)
                if name in harmless.REPORTED:  # as PostgreSQL reports a reset: the value in effect again
                    notes.append(pr.parameter_status(name, self.server.settings.get(name, "")))
            else:
                self.settings[name] = value
                if name in harmless.REPORTED:
                    notes.append(pr.parameter_status(name, value))
            return Outcome(stmt.kind.upper())
        if stmt.kind == "discard":
            self._close_cursors(everything=True)  # DISCARD ALL closes every cursor, as CLOSE ALL does
            return Outcome("DISCARD ALL")
        if stmt.kind == "declare":
            d = statements.declare(stmt.sql)
            if not d.hold and self.status != "T":
                raise _NoTransaction("DECLARE CURSOR")
            if d.name in self.portals:
                raise statements.CursorError(f'cursor "{d.name}" already exists', "42P03")
            if len(self.portals) >= MAX_PORTALS:
                raise _TooLarge(f"too many open portals on this connection (limit {MAX_PORTALS}); close some")
            return _Declare(d)
        if stmt.kind == "fetch":
            return self._fetch(statements.fetch(stmt.sql))
        if stmt.kind == "close":
            target = statements.close(stmt.sql)
            if target is None:
                self._close_cursors(everything=True)
                return Outcome("CLOSE CURSOR ALL")
            self._cursor(target)
            del self.portals[target]
            return Outcome("CLOSE CURSOR")
        if stmt.kind == "deallocate":
            target = stmt.words[-1] if len(stmt.words) > 1 else ""
            if target == "all":
                self.statements = {k: s for k, s in self.statements.items() if not k}
            else:
                self.statements.pop(target, None)
            return Outcome("DEALLOCATE" + (" ALL" if target == "all" else ""))
        context = {
            "version": self.server.settings.get("version", ""),
            "current_database": self.database,
            "current_catalog": self.database,
            "current_user": analyst,
            "session_user": analyst,
            "user": analyst,
            "current_schema": "public",
            "pg_backend_pid": self.key[0],
        }
        # cheap pre-filters on the statement's words spare the common case a second SQL parse
        if "from" not in stmt.words:
            constant = harmless.constant_select(stmt.sql, context)
            if constant is not None:
                return Outcome(constant.tag, constant.columns, constant.types, constant.rows)
        if any(w.startswith("pg_") or w == "information_schema" for w in stmt.words):
            shadow = self.server.shadow
            local = shadow.localize(stmt.sql, self.database) if shadow is not None else stmt.sql
            if self.server.answers_catalog(local):
                return _CatalogQuery(local)
            tables = self.server.session.catalog.tables
            probe = harmless.catalog_select(stmt.sql, lambda name: name in tables)
            if probe is not None:
                return Outcome(probe.tag, probe.columns, probe.types, probe.rows)
        return stmt.sql

    # -- named cursors ------------------------------------------------------------------------

    async def _declare(self, d: statements.Declare) -> Outcome:
        """DECLARE: the cursor's query answered now, like any other statement (a private one is charged here,
        once, and its noisy rows released in full with the NOTICE of its cost); FETCH then pages through the
        released rows, which is post-processing and costs nothing (Dwork & Roth, "The Algorithmic Foundations
        of Differential Privacy", Prop. 2.1)."""
        try:
            answered = await self._answer(d.query)
        except SqldpError as err:
            if err.position is not None:  # into the DECLARE statement
                err.position += d.offset
            raise
        if answered.columns is None:  # cannot happen: statements.declare admits only a SELECT
            raise ForbiddenError("a cursor can only be declared for a SELECT")
        # the column types a client decodes FETCH by, as Describe gives them for a prepared SELECT (int4 stays
        # int4; noisy values are float8); a query the runner does not answer (a catalog one) keeps its values'
        assert self.analyst is not None
        loop = asyncio.get_running_loop()
        desc = await loop.run_in_executor(
            self.server.executor, self.server.description, d.query, (), self.analyst.privacy
        )
        if desc is not None and len(desc.columns) == len(answered.columns):
            answered = dataclasses.replace(answered, types=list(desc.columns))
        cursor = Cursor(d.hold, d.scroll, in_transaction=self.status == "T")
        self.portals[d.name] = Portal(d.query, (), outcome=answered, cursor=cursor)
        if self.savepoints and self.status == "T":
            self.savepoints[-1][1].add(d.name)
        return Outcome("DECLARE CURSOR")

    def _cursor(self, name: str) -> tuple[Cursor, Outcome]:
        portal = self.portals.get(name)
        if portal is None or portal.cursor is None or portal.outcome is None:
            raise statements.CursorError(f'cursor "{name}" does not exist')
        return portal.cursor, portal.outcome

    def _fetch(self, f: statements.Fetch) -> Outcome:
        """FETCH or MOVE on a declared cursor, from its released rows (no statement runs)."""
        cursor, outcome = self._cursor(f.name)
        n = len(outcome.rows)
        if cursor.scroll is False and statements.scrolls_back(cursor.position, n, f):
            raise _ScanForward()
        rows, cursor.position = statements.run_fetch(cursor.position, n, f)
        if f.move:
            return Outcome(f"MOVE {len(rows)}")
        return Outcome(f"FETCH {len(rows)}", outcome.columns, outcome.types, [outcome.rows[i] for i in rows])

    def _savepoint(self, kind: str, name: str) -> None:
        """SAVEPOINT, RELEASE and ROLLBACK TO on the block's savepoint stack (PostgreSQL manual, SAVEPOINT: the
        latest of a repeated name is meant). RELEASE merges what was declared since into the enclosing level;
        ROLLBACK TO closes the cursors declared since the savepoint, which stays."""
        if kind == "savepoint":
            self.savepoints.append((name, set()))
            return
        at = next((i for i in range(len(self.savepoints) - 1, -1, -1) if self.savepoints[i][0] == name), None)
        if at is None:
            raise _NoSavepoint(name)
        since = set().union(*(declared for _, declared in self.savepoints[at:]))
        del self.savepoints[at + 1 :]
        if kind == "release":
            self.savepoints.pop()
            if self.savepoints:
                self.savepoints[-1][1].update(since)
            return
        self.savepoints[at][1].clear()
        for cursor in since:
            self.portals.pop(cursor, None)
        self.status = "T"

    def _close_cursors(self, *, committed: bool = False, everything: bool = False) -> None:
        """At the end of a transaction block: cursors WITHOUT HOLD close; so do those WITH HOLD declared in a
        block that rolls back (PostgreSQL manual, DECLARE). ``everything``: CLOSE ALL, DISCARD ALL."""
        for name, portal in list(self.portals.items()):
            c = portal.cursor
            if c is None:
                continue
            if everything or not c.hold or (c.in_transaction and not committed):
                del self.portals[name]
            else:
                c.in_transaction = False

    def _cursor_shape(self, query: str) -> Outcome | None:
        """For Describe of a prepared FETCH: the cursor's columns (None if it is no FETCH of a cursor)."""
        try:
            if statements.classify(query).kind != "fetch":
                return None
            f = statements.fetch(query)
            return None if f.move else self._cursor(f.name)[1]
        except SqldpError:
            return None

    async def _private(self, sql: str) -> Outcome:
        self.cancel_requested = False
        running = self.running = Running()
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        fp = statements.fingerprint(sql)
        analyst = self.analyst
        assert analyst is not None
        try:
            handed: asyncio.Future[tuple[Outcome, tuple[float, float]]] = loop.create_future()
            self.server.executor.submit(_hand_over, loop, handed, self._run_private, sql, fp, analyst, running)
            outcome, charged = await handed
        except _Withheld as err:  # charged, then failed: the log (the data owner's) says what PostgreSQL said
            ms = round((time.perf_counter() - t0) * 1000, 3)
            _log(analyst.name, fp, "error", sqlstate=err.sqlstate, upstream_sqlstate=err.upstream, ms=ms)
            raise
        except SqldpError as err:
            decision = "budget_exhausted" if err.sqlstate == "53400" else "refused"
            decision = "timeout" if isinstance(err, _TimedOut) else decision
            _log(analyst.name, fp, decision, sqlstate=err.sqlstate, ms=round((time.perf_counter() - t0) * 1000, 3))
            raise
        except Exception as exc:  # a bug or a broken upstream: fail closed, keep the connection
            log.exception("internal error answering a query")
            _log(analyst.name, fp, "error", sqlstate="XX000")
            raise _Internal(exc) from exc
        eps, delta = charged
        _log(
            analyst.name,
            fp,
            "answered" if eps else "public",
            epsilon=eps,
            delta=delta,
            rows=len(outcome.rows),
            ms=round((time.perf_counter() - t0) * 1000, 3),
        )
        return outcome

    def _run_private(
        self, sql: str, fingerprint: str, analyst: Analyst, running: Running
    ) -> tuple[Outcome, tuple[float, float]]:
        """In a worker thread: analyse, charge (committed), run, and shape the answer.

        Every refusal that does not depend on the data happens in ``prepare_query``, before the charge. The noisy
        result set leaves (``Result.table``) with a NOTICE (:func:`_notice`) of what is data-independent: the
        charge, the ledger's balance and the error bars of ``laplace-global`` values. No sensitivity, smooth
        noise scale, its error bar or a chosen β: those are functions of the private data (docs/output.md, "What each
        output field reveals")."""
        try:
            prepared = prepare_query(self.server.session, sql, analyst.privacy)
        except InputError as err:
            if err.where == "--beta":  # the analyst's β comes from this file's [analysts] table, not a flag
                raise InputError(err.message, where=f"analysts.{analyst.name}.beta") from None
            raise
        eps = delta = 0.0
        balance: ledger.Balance | None = None
        if not prepared.public:
            params = prepared.params
            if params is None:
                raise RefusedError("the query has no privacy parameters; not answered")
            self.server.check(prepared)
            if self.cancel_requested:
                raise _Cancelled()
            eps, delta = float(params.epsilon), float(params.delta or 0.0)
            with self.server.ledger_pool.connection() as conn:
                balance = ledger.charge(conn, analyst.name, eps, delta, fingerprint)
        deadline = _Deadline(running, analyst.statement_timeout)
        try:
            with watching(running), deadline:  # a CancelRequest from now on cancels the upstream queries (_cancel)
                result = prepared.run()
        except DatabaseError as err:
            if deadline.fired:
                raise _TimedOut(deadline.seconds, charged=not prepared.public) from None
            raise _from_upstream(err, public=prepared.public) from err
        columns, rows = result.table()
        types = [v.infer_type([r[i] for r in rows]) for i in range(len(columns))]
        notice = _notice(result, balance) if balance is not None else b""
        outcome = Outcome(f"SELECT {len(rows)}", list(columns), types, list(rows), notice, query=sql)
        return outcome, (eps, delta)


def _amount(x: Decimal) -> str:
    """A ledger amount as written in the policy (``2.5``, ``1E-5``), without trailing zeros."""
    text = format(x.normalize(), "f") if x == x.to_integral_value() or abs(x) >= Decimal("0.001") else str(x)
    return text if x else "0"


def _notice(result: Result, balance: ledger.Balance) -> bytes:
    """What a private answer may carry besides its values (docs/output.md, "What each output field reveals"): ε and δ
    this statement spent and what the analyst has left (the ledger: a function of the queries asked, not of
    the data), and the error bar of each value whose noise scale is data-independent (``laplace-global``:
    ``sqldp.release.error_bar``; its interval arithmetic reads only the noisy values, post-processing, Dwork &
    Roth Prop. 2.1). Values calibrated to a smooth sensitivity (NR §3.3.7–3.3.9) get no bar: it would
    reveal that sensitivity."""
    p = result.params
    spent_e, spent_d = ledger.amount(p.epsilon if p else 0.0), ledger.amount(p.delta if p else 0.0)
    left_d = max(Decimal(0), balance.delta_limit - balance.delta_spent)
    text = (
        f"sqldp: this statement spent ε = {_amount(spent_e)}, δ = {_amount(spent_d)}; {balance.analyst} has "
        f"ε = {_amount(balance.epsilon_left)} of {_amount(balance.epsilon_limit)} left, "
        f"δ = {_amount(left_d)} of {_amount(balance.delta_limit)}"
    )
    bars = [row.get("errors", {}) for row in result.rows]
    confidence = p.confidence if p else None
    if not any(bars) or confidence is None:
        detail = "no error bars: the noise of these values is scaled to the private data, so its size is not shown"
    else:
        head = f"error bars (± half-width, {confidence:.4g} confidence): "

        def one(row: dict[str, float]) -> str:
            return ", ".join(f"{name} ± {bar:.6g}" for name, bar in row.items()) or "none"

        if all(b == bars[0] for b in bars):
            detail = head + one(bars[0]) + (" in every row" if len(bars) > 1 else "")
        else:
            detail = head + "; ".join(f"row {i}: {one(b)}" for i, b in enumerate(bars, 1))
    return pr.notice_response(text, detail=detail)


class _InFailedTransaction(SqldpError):
    sqlstate = "25P02"

    def __init__(self) -> None:
        super().__init__("current transaction is aborted, commands ignored until end of transaction block")


class _NoSavepoint(SqldpError):
    sqlstate = "3B001"  # invalid_savepoint_specification

    def __init__(self, name: str) -> None:
        super().__init__(f'savepoint "{name}" does not exist')


class _NoTransaction(SqldpError):
    sqlstate = "25P01"

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} can only be used in transaction blocks")


class _Internal(SqldpError):
    sqlstate = "XX000"

    def __init__(self, exc: Exception) -> None:
        super().__init__(f"internal error in sqldp ({exc.__class__.__name__}); nothing was released")


class _TooLarge(SqldpError):
    sqlstate = "54000"  # program_limit_exceeded


class _TooComplex(SqldpError):
    sqlstate = "54001"  # statement_too_complex

    def __init__(self) -> None:
        super().__init__("the statement is nested too deeply to be analysed")


class _Deadline:
    """The analyst's statement timeout over one statement's run (after its charge): when it passes, the
    statement's upstream queries are cancelled as a client's CancelRequest cancels them (PQcancel on each
    connection it holds; ``Running`` refuses any it would take next). None: no timeout."""

    def __init__(self, running: Running, seconds: float | None) -> None:
        self.running = running
        self.seconds = seconds
        self.fired = False
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        self.fired = True
        self.running.cancel()

    def __enter__(self) -> _Deadline:
        if self.seconds is not None:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


class _TimedOut(SqldpError):
    """A statement that ran past the analyst's statement timeout: one fixed message whatever the statement
    was doing (its upstream error is that of the cancel), and for a private one the charge stands: it was made
    before the run, like the charge of an answer (docs/proxy.md, "Statement timeout")."""

    sqlstate = "57014"  # query_canceled, as PostgreSQL's own statement_timeout reports it

    def __init__(self, seconds: float | None, *, charged: bool) -> None:
        cost = "; its charge stands" if charged else ""
        super().__init__(f"canceling statement due to statement timeout ({seconds:g} s, set by the data owner){cost}")
        self.hint = "SHOW sqldp.budget shows what is left" if charged else None


class _ScanForward(SqldpError):
    sqlstate = "55000"  # object_not_in_prerequisite_state, as PostgreSQL says it
    hint = "Declare it with SCROLL option to enable backward scan."

    def __init__(self) -> None:
        super().__init__("cursor can only scan forward")


@dataclass(frozen=True)
class _Declare:
    """A DECLARE whose query the connection answers next (:meth:`Connection._declare`)."""

    declare: statements.Declare


@dataclass(frozen=True)
class _BudgetQuery:
    """``SHOW sqldp.budget``: the connected analyst's row of the ledger (answered in a worker thread: it is I/O)."""


# SHOW sqldp.budget: the statement's words, and its one row's columns (amounts are numeric, exact as in the ledger)
BUDGET_SHOW = ("show", "sqldp", "budget")
BUDGET_COLUMNS = (
    "analyst",
    "epsilon_limit",
    "epsilon_spent",
    "epsilon_left",
    "delta_limit",
    "delta_spent",
    "delta_left",
    "queries",
)
BUDGET_TYPES = (v.TEXT, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.INT8)


def budget_outcome(b: ledger.Balance) -> Outcome:
    """The analyst's balance as the one row of ``SHOW sqldp.budget``. It depends on the queries the analyst
    asked and the policy's limits, never on the data (docs/output.md, "What each output field reveals")."""
    delta_left = max(Decimal(0), b.delta_limit - b.delta_spent)
    row = (b.analyst, b.epsilon_limit, b.epsilon_spent, b.epsilon_left, b.delta_limit, b.delta_spent, delta_left)
    return Outcome("SHOW", list(BUDGET_COLUMNS), list(BUDGET_TYPES), [(*row, b.queries)])


@dataclass(frozen=True)
class _CatalogQuery:
    """A system-catalog query for the shadow database (answered in a worker thread: it is I/O)."""

    sql: str


class _Shadow(SqldpError):
    """PostgreSQL's error on a catalog query in the shadow database: about definitions only, shown as is."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class _Withheld(SqldpError):
    sqlstate = "22000"  # data_exception: the private data made it fail, as far as the analyst may know

    def __init__(self, upstream: str) -> None:
        super().__init__(
            "PostgreSQL failed while answering this private query, after its charge; what failed is not shown, "
            "since it could depend on the private data"
        )
        self.upstream = upstream  # PostgreSQL's SQLSTATE, for the data owner's log only


def _from_upstream(err: DatabaseError, *, public: bool) -> SqldpError:
    """What the analyst sees of PostgreSQL's failure on a query that passed the analysis. Over public tables:
    PostgreSQL's own SQLSTATE and message (they can only depend on public data), except that a lost upstream
    connection (class 08, or no SQLSTATE) is not the client's connection and is reported as 58000
    (system_error): drivers take 08 for a dropped connection of their own. Over private tables, after the
    charge: one fixed SQLSTATE and message whatever failed, since which error it was (and its message, which
    may quote a value) could depend on the private rows (docs/sql.md, "Errors are answers too")."""
    if not public:
        return _Withheld(err.sqlstate)
    code = err.sqlstate if not err.sqlstate.startswith("08") else "58000"
    return DatabaseError(err.message, sqlstate=code)


class _Cancelled(SqldpError):
    sqlstate = "57014"

    def __init__(self) -> None:
        super().__init__("canceling statement due to user request")


_WHERE = re.compile(r"query:(\d+):(\d+)")


def _locate(err: SqldpError, text: str, statement: str) -> None:
    """Set ``err.position`` to the character index in ``text`` (what the client sent) of the ``query:LINE:COL``
    the analysis gave for ``statement`` (the statement in ``text`` that the runner read), if it gave one."""
    m = _WHERE.fullmatch(err.where or "")
    if m is None or err.position is not None:
        return
    line, col = int(m.group(1)), int(m.group(2))
    start = 0
    for _ in range(line - 1):
        start = statement.find("\n", start) + 1
        if start == 0:
            return
    err.position = max(text.find(statement), 0) + start + col - 1


def _bind(query: str, types: tuple[int, ...], bind: pr.Bind) -> tuple[str, bool, tuple[statements.Span, ...]]:
    """The statement with the Bind message's parameters as validated literals, whether it is empty, and where
    the literals stand (:func:`statements.unbound`)."""
    n = len(bind.params)
    wanted = statements.param_count(query)
    if n != wanted:
        raise SqlSyntaxError(f"bind message supplies {n} parameters, but prepared statement requires {wanted}")
    if len(bind.param_formats) not in (0, 1, n):
        raise pr.ProtocolError("invalid number of parameter format codes in Bind message")

    def fmt(i: int) -> int:
        return bind.param_formats[0 if len(bind.param_formats) == 1 else i] if bind.param_formats else 0

    spans: list[statements.Span] = []
    sql = statements.bind(
        query,
        lambda k: v.literal(bind.params[k - 1], fmt(k - 1), types[k - 1] if k - 1 < len(types) else 0, k),
        spans,
    )
    return sql, not statements.split(sql), tuple(spans)


Shape = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]]  # parameter types, column names, column types


def parse_describe(conn: Any, query: str, oids: list[int]) -> Shape | None:
    """PostgreSQL's Parse and Describe of ``query`` as the unnamed statement on ``conn`` (a psycopg
    connection): nothing runs, no row is read. None when PostgreSQL refuses it."""
    pg = conn.pgconn
    ok = pq.ExecStatus.COMMAND_OK
    if pg.prepare(b"", query.encode("utf-8"), oids).status != ok:
        return None
    d = pg.describe_prepared(b"")
    if d.status != ok:
        return None
    params = tuple(d.param_type(i) for i in range(d.nparams))
    names = tuple((d.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(d.nfields))
    return params, names, tuple(d.ftype(i) for i in range(d.nfields))


def describe(
    session: Session,
    query: str,
    types: tuple[int, ...],
    privacy: Mapping[str, Any],
    upstream_describe: Callable[[str, list[int]], Shape | None] | None = None,
) -> Description | None:
    """Parameter and result column types of a SELECT, as a client learns them from Describe before it runs:
    asyncpg and pg8000 decode results by these (a noisy value announced as text failed to decode), asyncpg
    encodes parameters by them. None when unknown (the statement is not one the runner accepts).

    The runner's analysis (no data read) says which columns are released exactly; the upstream describes the
    statement (Parse and Describe read no rows) only after the analysis accepted it. Public columns and
    group keys keep the upstream's types; every noisy value is float8. ``upstream_describe`` does the Parse
    and Describe (:meth:`ProxyServer.upstream_describe`); without it a connection of the session's does."""
    try:
        kind = statements.classify(query).kind
        if kind == "declare":  # its parameters are its query's; DECLARE itself returns no rows
            inner = describe(session, statements.declare(query).query, types, privacy, upstream_describe)
            return None if inner is None else Description(inner.params, (), ())
        if kind != "select":
            return None
        n = statements.param_count(query)
        bound = statements.bind(query, lambda k: v.null_literal(types[k - 1] if k - 1 < len(types) else 0))
        prepared = prepare_query(session, bound, privacy)
    except (SqldpError, RecursionError):
        return None
    oids = [types[i] if i < len(types) else 0 for i in range(n)]
    if upstream_describe is None:
        with session.connection() as conn:
            got = parse_describe(conn, query, oids)
    else:
        got = upstream_describe(query, oids)
    if got is None:
        return None
    params, names, upstream = got
    if prepared.public:
        return Description(params, names, upstream)
    # the measured statements: the query's own, or each measured branch of a set operation
    # (sqldp.strategies.setops); a column is noisy if any of them releases it with noise
    branches = getattr(prepared, "branches", None)
    measured = [prepared] if branches is None else [b for b in branches if not b.public]
    noisy = [False] * len(upstream)
    for m in measured:
        outputs = getattr(getattr(m, "form", None), "outputs", None)
        if outputs is None or len(outputs) != len(upstream):
            return None
        noisy = [n or not o.is_key for n, o in zip(noisy, outputs, strict=True)]
    return Description(params, names, tuple(v.FLOAT8 if n else u for u, n in zip(upstream, noisy, strict=True)))


def _with_nulls(query: str) -> str:
    return statements.bind(query, lambda k: "NULL")


def _result_types(portal: Portal, outcome: Outcome) -> list[int]:
    """The result's column types: as announced by Describe of the statement if it was described (a client
    decodes by those), else as the outcome's values say."""
    if portal.types is not None and outcome.columns is not None and len(portal.types) == len(outcome.columns):
        return list(portal.types)
    return outcome.types or []


def _param_formats(bind: pr.Bind) -> list[int]:
    n, f = len(bind.params), bind.param_formats
    return list(f) if len(f) == n else [f[0]] * n if len(f) == 1 else [0] * n


def _parsed(query: str) -> list[str]:
    """A Parse message's statements, its ``$n`` checked as PostgreSQL checks them at Parse ($0 is refused)."""
    statements.param_count(query)
    return statements.split(query)


def _simple_statements(sql: str) -> list[str]:
    """The statements of a simple Query; a ``$n`` there has no value (the upstream failed on it with a
    connection error, 08000, as if the database had failed)."""
    n = statements.param_count(sql)
    if n:
        raise statements.NoParameter(n, " (parameters need the extended query protocol)")
    return statements.split(sql)


def _statement_shape(query: str) -> tuple[int, list[str] | None]:
    """A prepared statement's parameter count and, for a SELECT or SHOW, its result column names as far as
    they are known without running it (None: no result set)."""
    n = statements.param_count(query)
    stmt = statements.classify(query)
    if stmt.words == BUDGET_SHOW:
        return n, list(BUDGET_COLUMNS)
    if stmt.kind == "show":
        return n, [" ".join(stmt.words[1:])]
    if stmt.kind != "select":
        return n, None
    return n, _select_names(statements.bind(query, lambda k: "NULL"))


def _fields(columns: list[str], types: list[int]) -> list[pr.Field]:
    return [pr.Field(c, t, v.TYPE_SIZE.get(t, -1)) for c, t in zip(columns, types, strict=True)]


def _formats(codes: tuple[int, ...], n: int) -> list[int]:
    if not codes:
        return [0] * n
    if len(codes) == 1:
        return [codes[0]] * n
    if len(codes) != n:
        raise pr.ProtocolError(f"Bind message has {len(codes)} result formats but the query has {n} columns")
    return list(codes)


def _select_names(sql: str) -> list[str]:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except Exception:
        return []
    if not isinstance(tree, exp.Select):
        return []
    out = []
    for item in tree.expressions:
        name = item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else ""
        out.append(name or (item.sql_name().lower() if isinstance(item, exp.Func) else "?column?"))
    return out
