"""FunctionCall (PostgreSQL manual §55.2.6) is refused and answered as PostgreSQL answers a failed one: an
ErrorResponse, then ReadyForQuery (libpq's PQfn waits for it); after an error in the extended protocol it is
discarded until Sync like any other message (§55.2.3)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_support import _msg, error_fields, make_tables, raw_login, recv_message, write_policy

from sqldp.proxy import ThreadedProxy, build

LIMIT = 4096  # max_message_bytes of the proxy below
# FunctionCall of function oid 1234 with no arguments and a text result (§55.7)
CALL = _msg(b"F", struct.pack("!I", 1234) + struct.pack("!hh", 0, 0) + struct.pack("!h", 0))


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    policy = write_policy(
        tmp_path / "policy.toml", {"alice": {"epsilon_limit": 10.0}}, extra=f"[proxy]\nmax_message_bytes = {LIMIT}\n"
    )
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def _until_ready(sock: socket.socket) -> list[tuple[bytes, bytes]]:
    out = []
    while True:
        kind, body = recv_message(sock)
        out.append((kind, body))
        if kind == b"Z":
            return out


def test_a_function_call_is_refused_and_answered_with_ready_for_query(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(CALL)
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[-1][1] == b"I"
    fields = error_fields(got[0][1])
    assert fields["C"] == "42501" and "function call protocol" in fields["M"]
    # the connection goes on: a query is answered, and no Sync was needed
    sock.sendall(_msg(b"Q", b"SELECT 1\0"))
    assert [k for k, _ in _until_ready(sock)] == [b"T", b"D", b"C", b"Z"]
    # in a transaction block the refusal fails the block, as any error does
    sock.sendall(_msg(b"Q", b"BEGIN\0"))
    assert _until_ready(sock)[-1] == (b"Z", b"T")
    sock.sendall(CALL)
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[-1][1] == b"E"
    sock.sendall(_msg(b"Q", b"ROLLBACK\0"))
    assert _until_ready(sock)[-1] == (b"Z", b"I")
    sock.close()


def test_a_function_call_after_an_extended_protocol_error_waits_for_sync(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"B", b"\0nowhere\0\0\0\0\0\0\0") + CALL + _msg(b"S", b""))
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"]  # the Bind's error only: the call was discarded
    assert "nowhere" in error_fields(got[0][1])["M"]
    sock.close()


def test_an_oversize_function_call_is_skipped_and_answered(proxy: ThreadedProxy) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"F", b"\0" * (LIMIT + 100)))
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and error_fields(got[0][1])["C"] == "54000"
    sock.sendall(_msg(b"Q", b"SELECT 1\0"))
    assert [k for k, _ in _until_ready(sock)] == [b"T", b"D", b"C", b"Z"]
    sock.close()
