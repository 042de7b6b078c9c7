"""Replies to the extended protocol are held until Sync or Flush and then sent in one piece, as PostgreSQL
sends them (manual §55.2.3: without Flush, the backend's messages "will be combined into the minimum possible
number of packets"); sqldp.proxy.server._Replies."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from proxy_support import _msg, make_tables, raw_login, recv_message, write_policy

from sqldp.proxy import ThreadedProxy, build


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 10.0}})
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def _nothing_within(sock: socket.socket, seconds: float) -> bool:
    sock.settimeout(seconds)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""  # b"": closed, which is not "nothing"
    except TimeoutError:
        return True
    finally:
        sock.settimeout(10)


def _until_ready(sock: socket.socket) -> list[bytes]:
    kinds = []
    while True:
        kind, _ = recv_message(sock)
        kinds.append(kind)
        if kind == b"Z":
            return kinds


@pytest.mark.parametrize(
    "query",
    [b"SELECT n_name FROM nation WHERE n_nationkey = 1", b"SELECT COUNT(*) FROM visits"],
    ids=["public", "private"],
)
def test_replies_wait_for_flush_or_sync_and_come_in_order(proxy: ThreadedProxy, query: bytes) -> None:
    sock = raw_login(proxy.port)
    sock.sendall(
        _msg(b"P", b"\0" + query + b"\0\0\0")
        + _msg(b"B", b"\0\0\0\0\0\0\0\0")
        + _msg(b"D", b"P\0")
        + _msg(b"E", b"\0\0\0\0\0")
    )
    assert _nothing_within(sock, 1.0)  # the statement ran (Describe needs its columns), its replies are held
    sock.sendall(_msg(b"H", b""))  # Flush: everything so far, no ReadyForQuery
    kinds = [recv_message(sock)[0] for _ in range(3)]
    assert kinds == [b"1", b"2", b"N" if b"visits" in query else b"T"]
    rest = [recv_message(sock)[0] for _ in range(3 if b"visits" in query else 2)]
    assert rest == ([b"T", b"D", b"C"] if b"visits" in query else [b"D", b"C"])
    assert _nothing_within(sock, 0.3)
    sock.sendall(_msg(b"S", b""))
    assert _until_ready(sock) == [b"Z"]
    # the simple protocol answers at once
    sock.sendall(_msg(b"Q", query + b"\0"))
    assert _until_ready(sock)[-2:] == [b"C", b"Z"]
    sock.close()
