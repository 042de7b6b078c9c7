"""The asyncio server: one task per client connection (sqldp.proxy.connection), analyses and queries in a bounded
thread pool, cancel requests (PostgreSQL manual §55.2.8) found by key here or handed to the worker process that
owns the connection (sqldp.proxy.workers).

A connection is layered as psycopg layers its own: the loop reads a message and hands it to its handler
(sqldp.proxy.connection), a table of message handlers keyed by the message's type byte
(sqldp.proxy.messages), a table of handlers keyed by the statement's kind (sqldp.proxy.kinds), the state they
change (sqldp.proxy.backend: the transaction block in sqldp.proxy.transaction, statements, portals and cursors
in sqldp.proxy.cursors), and the one place a private answer is charged (sqldp.proxy.charging).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import secrets
import ssl
import struct
import threading
import typing
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from sqldp.errors import ForbiddenError
from sqldp.proxy import catalog as shadow_catalog
from sqldp.proxy import ledger, passthrough
from sqldp.proxy import protocol as pr
from sqldp.proxy.analysis import UNKNOWN, Description, Shape, describe, parse_describe
from sqldp.proxy.backend import drop_result
from sqldp.proxy.config import ProxyConfig
from sqldp.proxy.connection import AUTH_TIMEOUT, Connection
from sqldp.proxy.connection import Replies as _Replies  # the name tests/proxy/test_proxy_replies.py cites
from sqldp.proxy.cursors import Limits
from sqldp.proxy.errors import Shadow, internal_log
from sqldp.proxy.outcome import Outcome, budget_outcome

if typing.TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

    from sqldp.session import Session
    from sqldp.strategies import Compiled

__all__ = ["MAX_PORTALS", "MAX_PREPARED", "MAX_PREPARED_BYTES", "ProxyServer", "_Replies"]

# What one connection may keep (PostgreSQL sets no limit; a client could otherwise grow the proxy without bound:
# 200 named statements of 1 MB each grew it to 1.25 GB): named prepared statements, their text, open portals.
# Read at each use (ProxyServer.limits), so that a test may lower them.
MAX_PREPARED = 256
MAX_PREPARED_BYTES = 16 << 20
MAX_PORTALS = 256
# How many checked answer texts the server remembers (ProxyServer.check); past that it starts again.
CHECKED_KEPT = 4096
# How many statement descriptions the server keeps (ProxyServer.description), least recently used dropped.
DESCRIBED_KEPT = 4096


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
        self.charges = ledger.GroupCommit(ledger_pool)
        self.settings = dict(settings)
        self.executor = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sqldp-proxy")
        # lexing, classifying and the answers that need no data run here, apart from the analyses and queries
        # above, so that a long analysis does not hold up other clients' connection-time chatter
        self.front = ThreadPoolExecutor(max_workers=config.workers, thread_name_prefix="sqldp-proxy-front")
        self.connections: dict[tuple[int, int], Connection] = {}
        analyst_dsn = session.analyst_dsn
        assert analyst_dsn is not None  # a PostgreSQL session: the proxy serves PostgreSQL only
        self.passthrough = passthrough.Pool(analyst_dsn, config.pool_size)
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
            raise Shadow(exc.sqlstate, str(exc)) from None
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

    @property
    def limits(self) -> Limits:
        """What one connection may keep (:data:`MAX_PREPARED`, :data:`MAX_PREPARED_BYTES`, :data:`MAX_PORTALS`)."""
        return Limits(MAX_PREPARED, MAX_PREPARED_BYTES, MAX_PORTALS)

    def new_pid(self) -> int:
        with self._lock:
            self._next_pid += self.workers
            return self._next_pid

    def owner(self, pid: int) -> int:
        """The worker whose connection ``pid`` is (:meth:`as_worker`)."""
        return pid % self.workers

    def cancel(self, body: bytes) -> None:
        """A CancelRequest's process id and secret key (§55.2.8): the connection they name is cancelled, here or
        in the worker process that owns it; a key that names none cancels nothing."""
        if len(body) < 8:
            return
        pid, key = struct.unpack("!iI", body[:8])
        if self.forward_cancel(pid, body):  # another worker process's connection
            return
        target = self.connections.get((pid, key))
        if target is not None:
            target.cancel()

    def forward_cancel(self, pid: int, body: bytes) -> bool:
        """Send a CancelRequest for another worker's connection to that worker; whether it was another's. The
        answer is none either way (§55.2.8: the server never answers a cancel request)."""
        owner = self.owner(pid)
        if owner == self.worker:
            return False
        task = asyncio.ensure_future(_send_cancel(self.peers[owner], body))
        task.add_done_callback(drop_result)
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
                self.cancel(body)
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
            internal_log("connection", exc)
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
        self.passthrough.close()
        self.executor.shutdown(wait=False, cancel_futures=True)
        self.front.shutdown(wait=False, cancel_futures=True)
        with self._describing:
            if self._describer is not None:
                self._describer.close()
        if self.shadow is not None:
            self.shadow.close()


async def _send_cancel(path: str, body: bytes) -> None:
    """A CancelRequest (§55.7) for the worker listening on ``path``; a worker that is gone cancels nothing."""
    with contextlib.suppress(OSError):
        _, writer = await asyncio.open_unix_connection(path)
        writer.write(struct.pack("!ii", 16, pr.CANCEL_REQUEST) + body[:8])
        await writer.drain()
        writer.close()
        await writer.wait_closed()
