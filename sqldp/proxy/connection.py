"""One client connection: start-up and SSL negotiation (PostgreSQL manual §55.2.1, §55.2.10), SASL/SCRAM
authentication (§55.3), then the loop — read a message, hand it to its handler (sqldp.proxy.messages), send
what it wrote. The loop knows the framing and the extended protocol's error recovery (§55.2.3: after an
error, messages are discarded until Sync), nothing of statements. A framing error closes the connection after
an ErrorResponse; the server and the other connections go on."""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import struct
import typing
from typing import Any

from sqldp.errors import SqldpError
from sqldp.proxy import harmless
from sqldp.proxy import protocol as pr
from sqldp.proxy import scram as scram_auth
from sqldp.proxy.backend import Backend, Server
from sqldp.proxy.errors import Internal, TooLarge, internal_log, log
from sqldp.proxy.messages import MESSAGES, Terminated
from sqldp.proxy.scram import AuthFailed, ScramServer

AUTH_TIMEOUT = 30.0  # seconds a client has to finish start-up and authentication
HELD_BELOW = 1 << 16  # bytes of replies held at most; more are sent at once


class Replies:
    """The client's writer in the query loop: ``write`` keeps the messages and ``drain`` sends them in one piece
    (each ``StreamWriter.write`` is a send of its own on an idle socket: a system call, a TCP segment on
    loopback and a wake-up of the client). The loop drains after every message but those whose replies wait
    for the next Sync or Flush, as PostgreSQL's do (§55.2.3: "messages returned by the backend will be
    combined into the minimum possible number of packets"): a private answer's BindComplete, RowDescription,
    NOTICE, DataRow, CommandComplete and ReadyForQuery leave in one send, not five. More than
    :data:`HELD_BELOW` bytes are sent at once, so a long result is not held in memory twice. Everything else
    is the wrapped writer's."""

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


class Connection:
    def __init__(self, server: Server, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.server = server
        self.reader = reader
        self.writer = writer
        self.key = (0, 0)
        self.backend: Backend | None = None  # once logged in
        self.encrypted = False  # TLS was negotiated (SSLRequest): SCRAM-SHA-256-PLUS is offered

    def cancel(self) -> None:
        """A CancelRequest for this connection (sqldp.proxy.server.ProxyServer.cancel)."""
        if self.backend is not None:
            self.backend.cancel()

    # -- start-up -----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            backend = await asyncio.wait_for(self._startup(), AUTH_TIMEOUT)
        except pr.ProtocolError as exc:
            await self._fatal("08P01", str(exc))
            return
        if backend is not None:
            # from now on replies are held until the client waits for them (Replies); the rest is forwarded
            self.writer = backend.writer = typing.cast(asyncio.StreamWriter, Replies(self.writer))
            self.backend = backend
            await self._loop(backend)

    async def _startup(self) -> Backend | None:
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
                self.server.cancel(body)
                return None
            if code >> 16 != 3:
                await self._fatal("0A000", f"unsupported frontend protocol {code >> 16}.{code & 0xFFFF}")
                return None
            params = pr.parse_startup_params(body)
            if code & 0xFFFF:
                # §55.2.1: answer a newer minor version with NegotiateProtocolVersion and go on with 3.0.
                opts = [k for k in params if k.startswith("_pq_.")]
                payload = struct.pack("!ii", pr.PROTOCOL_3_0, len(opts)) + b"".join(pr.cstr(o) for o in opts)
                self.writer.write(pr.message(b"v", payload))
            return await self._authenticate(params)
        raise pr.ProtocolError("too many start-up requests")

    async def _authenticate(self, params: dict[str, str]) -> Backend | None:
        user = params.get("user", "")
        if not user:
            await self._fatal("28000", "no user name given in the startup packet")
            return None
        database = params.get("database", user)
        settings = {"application_name": params.get("application_name", "")}
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
            return None
        assert analyst is not None  # an unknown user has no verifier: SCRAM runs on a mock one and fails
        self.key = (self.server.new_pid(), secrets.randbits(32))
        backend = Backend(self.server, self.writer, self.key, analyst, user, database, settings)
        self.server.connections[self.key] = self
        out = [pr.auth_sasl_final(final), pr.auth_ok()]
        for name in harmless.REPORTED:
            value = settings.get(name) or self.server.settings.get(name, "")
            out.append(pr.parameter_status(name, value))
        out += [pr.parameter_status("session_authorization", user), pr.backend_key_data(*self.key)]
        out.append(pr.ready_for_query(backend.transaction.status))
        self.writer.write(b"".join(out))
        await self.writer.drain()
        log.info(json.dumps({"event": "auth", "analyst": user, "decision": "accepted"}))
        return backend

    async def _fatal(self, sqlstate: str, text: str) -> None:
        with contextlib.suppress(Exception):
            self.writer.write(pr.error_response(sqlstate, text, severity="FATAL"))
            await self.writer.drain()

    # -- the message loop ---------------------------------------------------------------------

    async def _loop(self, b: Backend) -> None:
        skipping = False  # after an error in the extended protocol, until Sync (§55.2.3)
        limit = self.server.config.max_message_bytes
        while True:
            try:
                kind, body = await pr.read_message(self.reader, limit)
            except pr.Oversize as exc:
                # a body can be skipped with the connection kept: the framing is intact and the message has
                # an error path (§55.2.2: ErrorResponse then ReadyForQuery; §55.2.3: skip to Sync)
                entry = MESSAGES.get(exc.kind)
                if entry is None or entry.bodiless:
                    await self._fatal("08P01", str(exc))
                    return
                discarded = skipping and entry.flow.skipped
                if not skipping:  # the error goes out before the body is skipped: the client may wait for it
                    b.error(TooLarge(str(exc)))
                    await self.writer.drain()
                await pr.discard(self.reader, exc.size)
                if not entry.flow.ready:
                    skipping = True
                elif not discarded:
                    self.writer.write(pr.ready_for_query(b.transaction.status))
                await self.writer.drain()
                continue
            except pr.ProtocolError as exc:
                await self._fatal("08P01", str(exc))
                return
            entry = MESSAGES.get(kind)
            if entry is None:
                await self._fatal("08P01", f"invalid frontend message type {kind!r}")
                return
            if entry.flow.syncs:
                skipping = False
            if not (skipping and entry.flow.skipped):
                try:
                    await entry.handle(b, body)
                    failed = False
                except Terminated:
                    return
                except pr.ProtocolError as exc:
                    await self._fatal("08P01", str(exc))
                    return
                except SqldpError as err:
                    b.error(err)
                    failed = True
                except (ConnectionError, EOFError, asyncio.IncompleteReadError, TimeoutError):
                    raise
                except Exception as exc:  # a bug: this message fails (one log line), the connection goes on
                    internal_log(f"message {kind!r}", exc)
                    b.error(Internal(exc))
                    failed = True
                if failed and entry.flow.ready:
                    self.writer.write(pr.ready_for_query(b.transaction.status))
                elif failed:
                    skipping = True
            if not entry.flow.held:
                await self.writer.drain()
