"""Helpers for the proxy tests: a database with a public and a private table, a policy with analysts, and a
raw protocol client (SCRAM client side, RFC 5802) for sending malformed messages."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg

from sqldp.proxy.scram import make_verifier

PASSWORD = "correct horse"


def make_tables(dsn: str, rows: int = 200) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE nation (n_nationkey integer PRIMARY KEY, n_name text NOT NULL)")
        conn.execute("INSERT INTO nation VALUES (1, 'ALGERIA'), (2, 'ARGENTINA'), (3, 'BRAZIL')")
        conn.execute("CREATE TABLE visits (id integer PRIMARY KEY, faculty text NOT NULL, minutes integer NOT NULL)")
        conn.execute(
            "INSERT INTO visits SELECT g, CASE WHEN g %% 2 = 0 THEN 'math' ELSE 'cs' END, g %% 60 "
            "FROM generate_series(1, %s) g",
            (rows,),
        )


def write_policy(path: Path, analysts: dict[str, dict[str, object]], *, epsilon: float = 1.0, extra: str = "") -> Path:
    lines = [
        "[defaults]",
        f"epsilon = {epsilon}",
        "[tables.nation]",
        'rows = "public"',
        "[tables.visits]",
        'rows = "private"',
        "[tables.visits.columns.minutes]",
        "range = [0, 60]",
    ]
    for name, spec in analysts.items():
        lines.append(f"[analysts.{name}]")
        spec = {"verifier": str(make_verifier(PASSWORD)), **spec}
        for k, val in spec.items():
            lines.append(f"{k} = {val!r}" if not isinstance(val, str) else f'{k} = "{val}"')
    path.write_text("\n".join(lines) + "\n" + extra, encoding="utf-8")
    return path


def client_dsn(port: int, user: str = "alice", password: str = PASSWORD, **extra: str) -> str:
    params = {"host": "127.0.0.1", "port": str(port), "user": user, "password": password, "dbname": "analytics"}
    params.update(extra)
    return psycopg.conninfo.make_conninfo(**params)


# -- a raw protocol client ------------------------------------------------------------------------


def _msg(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack("!i", len(payload) + 4) + payload


def recv_message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = _recv_exact(sock, 5)
    (length,) = struct.unpack("!i", head[1:])
    return head[:1], _recv_exact(sock, length - 4)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError("closed")
        out += chunk
    return out


def error_fields(body: bytes) -> dict[str, str]:
    out = {}
    for part in body.split(b"\0"):
        if part:
            out[part[:1].decode()] = part[1:].decode()
    return out


def raw_login(port: int, user: str = "alice", password: str = PASSWORD) -> socket.socket:
    """Connect and authenticate with SCRAM-SHA-256; return the socket after ReadyForQuery."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = struct.pack("!i", 196608) + b"user\0" + user.encode() + b"\0database\0x\0\0"
    sock.sendall(struct.pack("!i", len(body) + 4) + body)
    kind, payload = recv_message(sock)
    assert kind == b"R" and struct.unpack("!i", payload[:4])[0] == 10
    cnonce = base64.b64encode(secrets.token_bytes(12)).decode()
    first_bare = f"n=,r={cnonce}"
    first = ("n,," + first_bare).encode()
    sock.sendall(_msg(b"p", b"SCRAM-SHA-256\0" + struct.pack("!i", len(first)) + first))
    kind, payload = recv_message(sock)
    server_first = payload[4:].decode()
    attrs = dict(p.split("=", 1) for p in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={attrs['r']}"
    auth = f"{first_bare},{server_first},{without_proof}".encode()
    sig = hmac.new(stored, auth, hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, sig, strict=True))).decode()
    sock.sendall(_msg(b"p", f"{without_proof},p={proof}".encode()))
    while True:
        kind, payload = recv_message(sock)
        if kind == b"E":
            raise PermissionError(error_fields(payload).get("M"))
        if kind == b"Z":
            return sock


def start_proxy(
    upstream: str, policy: Path, *, workers: int | None = None, log_level: str = "warning", tree: Path | None = None
) -> tuple[subprocess.Popen[str], int]:
    """``sqldp proxy`` as a subprocess on a free loopback port, returned once it says it is listening; with
    ``workers`` worker processes (default: the proxy's, one per CPU); from the source tree ``tree`` if given."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = ["proxy", "--upstream", upstream, "--policy", str(policy), "--listen", f"127.0.0.1:{port}"]
    if workers is not None:
        argv += ["--workers", str(workers)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sqldp.cli", *argv, "--log-level", log_level],
        cwd=tree,  # another source tree's sqldp (benchmarks/proxy_bench.py --baseline), else this one's
        env=None if tree is None else {**os.environ, "PYTHONPATH": str(tree)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    if "listening" not in line:
        proc.kill()
        raise RuntimeError(f"proxy did not start: {line}{proc.stderr.read()}")
    return proc, port


def pgjdbc() -> Path | None:
    """The PostgreSQL JDBC driver (pgjdbc): Debian's libpostgresql-jdbc-java (.ci/run installs it), or one in the
    local Maven repository; None without it or without java (the JDBC tests are skipped then)."""
    if shutil.which("java") is None:
        return None
    debian = Path("/usr/share/java/postgresql.jar")
    jars = sorted((Path.home() / ".m2/repository/org/postgresql/postgresql").glob("*/postgresql-*.jar"))
    return jars[-1] if jars else debian if debian.exists() else None


async def asyncpg_connect(port: int) -> Any:
    """An asyncpg connection to the proxy on ``port`` as alice (PASSWORD), plain TCP: the login every asyncpg
    test makes."""
    import asyncpg

    return await asyncpg.connect(
        host="127.0.0.1", port=port, user="alice", password=PASSWORD, database="analytics", ssl=False
    )
