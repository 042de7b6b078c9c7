"""Every path announces the same result types: the simple protocol, an unnamed or a named
statement, text or binary results; equal to PostgreSQL's for public columns and group keys, float8 for every
noisy value; binary values encoded per the announced type. pgjdbc past its prepareThreshold (5) switches from
the unnamed statement to a named one with binary results and decodes by the columns it was told once: the
proxy announced int8 (read off the Python values) on the first path and int4 (the upstream's) on the second,
and the 6th execution threw ArrayIndexOutOfBoundsException."""

from __future__ import annotations

import asyncio
import socket
import struct
import subprocess
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, asyncpg_connect, pgjdbc, raw_login, recv_message

from sqldp.proxy import ThreadedProxy, ledger

asyncpg = pytest.importorskip("asyncpg")

INT4, INT8, TEXT, BPCHAR, FLOAT8 = 23, 20, 25, 1042, 701
# (statement with one integer parameter, the parameter's value); public ones and private ones with their keys
STATEMENTS = [
    ("SELECT n_regionkey FROM nation WHERE n_nationkey = $1", 2),
    ("SELECT n_code, n_nationkey, n_name, n_regionkey FROM nation WHERE n_nationkey = $1", 3),
    ("SELECT COUNT(*), MAX(n_regionkey) FROM nation WHERE n_nationkey > $1", 0),
    ("SELECT floor, COUNT(*) FROM visits WHERE id > $1 GROUP BY floor", 0),
    ("SELECT faculty, floor, SUM(minutes) FROM visits WHERE id > $1 GROUP BY faculty, floor", 0),
]


def _upstream_types(upstream: str, sql: str, value: int) -> list[int]:
    """PostgreSQL's own RowDescription types for the statement (its Describe reads no rows)."""
    with psycopg.connect(upstream, autocommit=True) as conn:
        d = conn.pgconn.prepare(b"", sql.encode(), [INT4])
        assert d.status == psycopg.pq.ExecStatus.COMMAND_OK, d.error_message
        got = conn.pgconn.describe_prepared(b"")
        return [got.ftype(i) for i in range(got.nfields)]


# -- the wire: the same statement on each path --------------------------------------------------------------


def _msg(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def _row_description(body: bytes) -> list[int]:
    (n,) = struct.unpack("!h", body[:2])
    at, types = 2, []
    for _ in range(n):
        at = body.index(b"\0", at) + 1
        _, _, oid, _, _, _ = struct.unpack("!ihihih", body[at : at + 18])
        types.append(oid)
        at += 18
    return types


def _data_row(body: bytes) -> list[bytes | None]:
    (n,) = struct.unpack("!h", body[:2])
    at, out = 2, []
    for _ in range(n):
        (size,) = struct.unpack("!i", body[at : at + 4])
        at += 4
        out.append(None if size < 0 else body[at : at + size])
        at += max(size, 0)
    return out


def _exchange(sock: socket.socket, data: bytes) -> tuple[list[list[int]], list[list[bytes | None]]]:
    """Send ``data`` (ending in Sync or a Query); the RowDescriptions and DataRows until ReadyForQuery."""
    sock.sendall(data)
    descriptions, rows = [], []
    while True:
        kind, body = recv_message(sock)
        if kind == b"E":
            raise AssertionError(body.decode("utf-8", "replace"))
        if kind == b"T":
            descriptions.append(_row_description(body))
        elif kind == b"D":
            rows.append(_data_row(body))
        elif kind == b"Z":
            return descriptions, rows


def _bind(portal: bytes, name: bytes, value: int, binary: bool) -> bytes:
    param = str(value).encode()
    results = struct.pack("!hh", 1, 1) if binary else struct.pack("!h", 0)
    return _msg(b"B", portal + b"\0" + name + b"\0" + struct.pack("!hhi", 0, 1, len(param)) + param + results)


def _paths(sock: socket.socket, sql: str, value: int) -> dict[str, tuple[list[int], list[list[bytes | None]]]]:
    """The statement's announced types and rows on each path a driver takes."""
    out = {}
    text = sql.replace("$1", str(value))
    d, rows = _exchange(sock, _msg(b"Q", text.encode() + b"\0"))
    out["simple"] = (d[0], rows)
    parse = _msg(b"P", b"\0" + sql.encode() + b"\0" + struct.pack("!h", 0))
    for binary in (False, True):
        got, rows = _exchange(
            sock,
            parse + _bind(b"", b"", value, binary) + _msg(b"D", b"P\0") + _msg(b"E", b"\0\0\0\0\0") + _msg(b"S", b""),
        )
        out["unnamed binary" if binary else "unnamed text"] = (got[0], rows)
    name = f"s{abs(hash(sql)) % 10**6}".encode()
    got, _ = _exchange(
        sock, _msg(b"P", name + b"\0" + sql.encode() + b"\0\0\0") + _msg(b"D", b"S" + name + b"\0") + _msg(b"S", b"")
    )
    out["named describe"] = (got[0], [])
    for i in range(3):  # executions of the named statement without a Describe (pgjdbc's 6th on), binary
        got, rows = _exchange(sock, _bind(b"", name, value, True) + _msg(b"E", b"\0\0\0\0\0") + _msg(b"S", b""))
        assert got == []
        out[f"named binary {i}"] = (out["named describe"][0], rows)
    return out


def test_every_path_announces_postgresql_s_types(proxy: ThreadedProxy, upstream: str) -> None:
    sock = raw_login(proxy.port)
    try:
        for sql, value in STATEMENTS:
            expected = _upstream_types(upstream, sql, value)
            private = "visits" in sql
            if private:  # the group keys keep their type; every noisy value is float8
                keys = sql.split("GROUP BY ")[1].split(", ")
                names = sql.split("SELECT ")[1].split(" FROM")[0].split(", ")
                expected = [t if n in keys else FLOAT8 for n, t in zip(names, expected, strict=True)]
            paths = _paths(sock, sql, value)
            for path, (types, rows) in paths.items():
                assert types == expected, (sql, path, types, expected)
                for row in rows:  # binary values in the announced type's size (int4: 4 bytes, float8: 8)
                    for oid, raw in zip(types, row, strict=True):
                        if "binary" in path and raw is not None and oid in (INT4, INT8, FLOAT8):
                            assert len(raw) == {INT4: 4, INT8: 8, FLOAT8: 8}[oid], (sql, path, oid, raw)
            if not private:  # exact answers: the same rows on every path that sends text
                texts = {p: r for p, (_, r) in paths.items() if p in ("simple", "unnamed text")}
                assert texts["simple"] == texts["unnamed text"]
    finally:
        sock.close()


def test_asyncpg_prepared_statements_in_binary(proxy: ThreadedProxy) -> None:
    async def session() -> None:
        conn = await asyncpg_connect(proxy.port)
        try:
            stmt = await conn.prepare("SELECT n_code, n_nationkey, n_regionkey FROM nation WHERE n_nationkey = $1")
            assert [a.type.name for a in stmt.get_attributes()] == ["bpchar", "int4", "int4"]
            for _ in range(7):
                assert tuple(await stmt.fetchrow(2)) == ("ARG", 2, 0)
            grouped = await conn.prepare("SELECT floor, COUNT(*) FROM visits WHERE id > $1 GROUP BY floor")
            assert [a.type.name for a in grouped.get_attributes()] == ["int4", "float8"]
            rows = await grouped.fetch(0)
            assert sorted(r[0] for r in rows) == [1, 2, 3] and all(isinstance(r[1], float) for r in rows)
        finally:
            await conn.close()

    asyncio.run(session())


@pytest.mark.skipif(pgjdbc() is None, reason="java or pgjdbc (libpostgresql-jdbc-java, or ~/.m2) is not available")
def test_jdbc_past_the_prepare_threshold(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(upstream) as conn:
        before = ledger.balance(conn, "alice")
    source = Path(__file__).parent / "jdbc" / "TypesClient.java"
    out = subprocess.run(
        ["java", "-cp", str(pgjdbc()), str(source), str(proxy.port), PASSWORD],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line.split(" ") for line in out.stdout.splitlines() if line.startswith(("OK ", "FAIL "))]
    assert lines and all(line[0] == "OK" for line in lines), out.stdout + out.stderr
    seen: dict[str, set[tuple[str, str]]] = {}
    for _, step, _, types, values in lines:
        seen.setdefault(step, set()).add((types, values))
    assert {t for t, _ in seen["int4"]} == {"int4"}  # the upstream's type on all 8 executions
    assert {v for _, v in seen["int4"]} == {"Integer:1;", "Integer:0;"}
    assert {t for t, _ in seen["mixed"]} == {"bpchar,int4,text,int4"}
    assert ("bpchar,int4,text,int4", "String:ARG,Integer:2,String:ARGENTINA,Integer:0;") in seen["mixed"]
    assert {t for t, _ in seen["private"]} == {"int4,float8,float8"}
    assert all(v.count("Integer:") == 3 and v.count("Double:noisy") == 6 for _, v in seen["private"])
    with psycopg.connect(upstream) as conn:
        after = ledger.balance(conn, "alice")
    assert before is not None and after is not None
    assert after.queries - before.queries == 7  # each private execution charged once, and each answered
