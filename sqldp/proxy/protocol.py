"""PostgreSQL frontend/backend protocol v3: framing, parsing and building of messages.

Everything here follows the protocol documentation, "Frontend/Backend Protocol" (chapter 55 of the
PostgreSQL 18 manual): §55.2 message flow, §55.7 message formats, §55.8 error and notice fields. Every length
read off the wire is checked before anything is allocated for it, so a client cannot make the proxy read or
buffer more than :data:`MAX_MESSAGE` bytes per message (the server's own limit for startup packets is 10000
bytes, ``MAX_STARTUP_PACKET_LENGTH`` in ``pqcomm.h``; we use the same).
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PROTOCOL_3_0 = 196608  # 3 << 16
SSL_REQUEST = 80877103  # §55.2.10: 1234 << 16 | 5679
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
MAX_STARTUP = 10_000
MAX_MESSAGE = 1 << 20  # 1 MiB: a SELECT longer than this is not a query an analyst types
MAX_PARAMS = 1000


class ProtocolError(Exception):
    """A malformed or unacceptable message. The connection is answered with an ErrorResponse (08P01) and closed,
    as the server does (§55.2.9: the state of the stream is unknown after a framing error)."""

    sqlstate = "08P01"  # protocol_violation


# -- reading --------------------------------------------------------------------------------------


async def read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    try:
        return await reader.readexactly(n)
    except asyncio.IncompleteReadError as exc:
        raise EOFError("connection closed mid-message") from exc


async def read_startup(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """A startup-phase packet (no type byte, §55.7 StartupMessage/SSLRequest/CancelRequest): (code, rest)."""
    head = await read_exactly(reader, 4)
    (length,) = struct.unpack("!i", head)
    if length < 8 or length > MAX_STARTUP:
        raise ProtocolError(f"invalid startup packet length {length}")
    body = await read_exactly(reader, length - 4)
    (code,) = struct.unpack("!i", body[:4])
    return code, body[4:]


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_MESSAGE) -> tuple[bytes, bytes]:
    """One typed message: (type byte, body). The length word counts itself but not the type byte."""
    head = await read_exactly(reader, 5)
    kind = head[:1]
    (length,) = struct.unpack("!i", head[1:])
    if length < 4:
        raise ProtocolError(f"invalid message length {length} for message type {kind!r}")
    if length - 4 > limit:
        raise Oversize(kind, length - 4, limit)
    return kind, await read_exactly(reader, length - 4)


class Oversize(ProtocolError):
    """A message longer than the limit, noticed from its length word before any of its body is read. The body
    can be skipped (:func:`discard`) and the connection kept, since the framing is intact."""

    sqlstate = "54000"  # program_limit_exceeded

    def __init__(self, kind: bytes, size: int, limit: int) -> None:
        super().__init__(f"message of type {kind!r} is {size} bytes, over the limit of {limit}")
        self.kind = kind
        self.size = size


async def discard(reader: asyncio.StreamReader, n: int) -> None:
    """Read and drop ``n`` bytes, never holding more than 64 KiB of them."""
    while n > 0:
        chunk = await reader.read(min(n, 1 << 16))
        if not chunk:
            raise EOFError("connection closed mid-message")
        n -= len(chunk)


class Buffer:
    """Bounds-checked reads from one message body; any overrun is a :class:`ProtocolError`."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.pos = 0
        self.what = what

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError(f"truncated {self.what} message")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> bytes:
        return self._take(1)

    def int16(self) -> int:
        return int(struct.unpack("!h", self._take(2))[0])

    def int32(self) -> int:
        return int(struct.unpack("!i", self._take(4))[0])

    def uint32(self) -> int:
        return int(struct.unpack("!I", self._take(4))[0])

    def bytes_(self, n: int) -> bytes:
        return self._take(n)

    def cstr(self) -> str:
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise ProtocolError(f"unterminated string in {self.what} message")
        raw = self.data[self.pos : end]
        self.pos = end + 1
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError(f"invalid UTF-8 in {self.what} message") from None

    def count(self, what: str) -> int:
        n = self.int16()
        if n < 0 or n > MAX_PARAMS:
            raise ProtocolError(f"invalid {what} count {n} in {self.what} message")
        return n

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.pos} trailing bytes in {self.what} message")


def parse_startup_params(body: bytes) -> dict[str, str]:
    """The name/value pairs of a StartupMessage (after the protocol version)."""
    buf = Buffer(body, "startup")
    out: dict[str, str] = {}
    while True:
        name = buf.cstr()
        if not name:
            break
        out[name] = buf.cstr()
    buf.end()
    return out


@dataclass(frozen=True)
class Parse:
    name: str
    query: str
    param_types: tuple[int, ...]


@dataclass(frozen=True)
class Bind:
    portal: str
    statement: str
    param_formats: tuple[int, ...]
    params: tuple[bytes | None, ...]
    result_formats: tuple[int, ...]


def parse_parse(body: bytes) -> Parse:
    buf = Buffer(body, "Parse")
    name, query = buf.cstr(), buf.cstr()
    types = tuple(buf.uint32() for _ in range(buf.count("parameter type")))
    buf.end()
    return Parse(name, query, types)


def parse_bind(body: bytes) -> Bind:
    buf = Buffer(body, "Bind")
    portal, statement = buf.cstr(), buf.cstr()
    formats = tuple(buf.int16() for _ in range(buf.count("parameter format")))
    params: list[bytes | None] = []
    for _ in range(buf.count("parameter")):
        n = buf.int32()
        params.append(None if n == -1 else buf.bytes_(n))
    results = tuple(buf.int16() for _ in range(buf.count("result format")))
    buf.end()
    if any(f not in (0, 1) for f in (*formats, *results)):
        raise ProtocolError("format codes must be 0 (text) or 1 (binary) in Bind message")
    return Bind(portal, statement, formats, tuple(params), results)


def parse_describe_or_close(body: bytes, what: str) -> tuple[str, str]:
    buf = Buffer(body, what)
    kind = buf.byte().decode("latin-1")
    name = buf.cstr()
    buf.end()
    if kind not in ("S", "P"):
        raise ProtocolError(f"{what} target must be 'S' or 'P', got {kind!r}")
    return kind, name


def parse_execute(body: bytes) -> tuple[str, int]:
    buf = Buffer(body, "Execute")
    portal, max_rows = buf.cstr(), buf.int32()
    buf.end()
    return portal, max_rows


def parse_query(body: bytes) -> str:
    buf = Buffer(body, "Query")
    text = buf.cstr()
    buf.end()
    return text


# -- building -------------------------------------------------------------------------------------


def message(kind: bytes, payload: bytes = b"") -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def cstr(text: str) -> bytes:
    return text.encode("utf-8").replace(b"\0", b"") + b"\0"


def auth_ok() -> bytes:
    return message(b"R", struct.pack("!i", 0))


def auth_sasl(mechanisms: Sequence[str]) -> bytes:
    return message(b"R", struct.pack("!i", 10) + b"".join(cstr(m) for m in mechanisms) + b"\0")


def auth_sasl_continue(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 11) + data)


def auth_sasl_final(data: bytes) -> bytes:
    return message(b"R", struct.pack("!i", 12) + data)


def parameter_status(name: str, value: str) -> bytes:
    return message(b"S", cstr(name) + cstr(value))


def backend_key_data(pid: int, key: int) -> bytes:
    return message(b"K", struct.pack("!iI", pid, key))


def ready_for_query(status: str) -> bytes:
    return message(b"Z", status.encode("ascii"))


@dataclass(frozen=True)
class Field:
    name: str
    type_oid: int
    type_size: int = -1
    type_mod: int = -1


def row_description(fields: Sequence[Field], formats: Sequence[int] = ()) -> bytes:
    parts = [struct.pack("!h", len(fields))]
    for i, f in enumerate(fields):
        fmt = formats[i] if i < len(formats) else 0
        parts.append(cstr(f.name) + struct.pack("!IhIhih", 0, 0, f.type_oid, f.type_size, f.type_mod, fmt))
    return message(b"T", b"".join(parts))


def data_row(values: Iterable[bytes | None]) -> bytes:
    vals = list(values)
    parts = [struct.pack("!h", len(vals))]
    for v in vals:
        parts.append(struct.pack("!i", -1) if v is None else struct.pack("!i", len(v)) + v)
    return message(b"D", b"".join(parts))


def command_complete(tag: str) -> bytes:
    return message(b"C", cstr(tag))


def empty_query() -> bytes:
    return message(b"I")


def parse_complete() -> bytes:
    return message(b"1")


def bind_complete() -> bytes:
    return message(b"2")


def close_complete() -> bytes:
    return message(b"3")


def no_data() -> bytes:
    return message(b"n")


def portal_suspended() -> bytes:
    return message(b"s")


def parameter_description(oids: Sequence[int]) -> bytes:
    return message(b"t", struct.pack("!h", len(oids)) + b"".join(struct.pack("!I", o) for o in oids))


def error_response(
    sqlstate: str, text: str, *, severity: str = "ERROR", hint: str | None = None, position: int | None = None
) -> bytes:
    """§55.8: S/V severity, C code, M message (one line), optional H hint and P position (the 1-based index, in
    characters, into the query string the client sent: psql draws its caret there)."""
    fields = [b"S" + cstr(severity), b"V" + cstr(severity), b"C" + cstr(sqlstate), b"M" + cstr(" ".join(text.split()))]
    if hint:
        fields.append(b"H" + cstr(hint))
    if position is not None:
        fields.append(b"P" + cstr(str(position)))
    return message(b"E", b"".join(fields) + b"\0")


def notice_response(text: str, *, detail: str | None = None) -> bytes:
    """§55.7 NoticeResponse, severity NOTICE (SQLSTATE 00000, successful completion): M message, optional D
    detail. Clients show it beside the result (psql prints ``NOTICE:  …``; psycopg's notice handlers)."""
    fields = [b"S" + cstr("NOTICE"), b"V" + cstr("NOTICE"), b"C" + cstr("00000"), b"M" + cstr(" ".join(text.split()))]
    if detail:
        fields.append(b"D" + cstr(detail))
    return message(b"N", b"".join(fields) + b"\0")
