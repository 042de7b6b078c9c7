"""Named cursors through the proxy (issue 26): psycopg's server-side cursors send DECLARE … CURSOR FOR, FETCH,
MOVE and CLOSE in a transaction block. A private query's cursor is charged once, when declared, and FETCH pages
through the released rows; a public one is exact. FETCH and MOVE follow PostgreSQL's own positioning, checked
against PostgreSQL itself on the same table."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.proxy.scram import make_verifier


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    make_tables(pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE numbers (k integer PRIMARY KEY, word text NOT NULL)")
        conn.execute("INSERT INTO numbers SELECT g, 'w' || g FROM generate_series(1, 7) g")
    return pg_dsn


@pytest.fixture
def proxy(upstream: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    extra = '[tables.numbers]\nrows = "public"\n[tables.visits.columns.faculty]\ndomain = ["cs", "math"]\n'
    # pg8000 (scramp) refuses SCRAM iteration counts under 4096, RFC 7677's minimum
    alice = {"epsilon_limit": 10.0, "verifier": str(make_verifier(PASSWORD, iterations=4096))}
    policy = write_policy(tmp_path / "policy.toml", {"alice": alice}, extra=extra)
    with ThreadedProxy(build(upstream, policy)) as p:
        yield p


def _spent(dsn: str) -> tuple[float, int]:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, "alice")
        return (0.0, 0) if b is None else (float(b.epsilon_spent), b.queries)


def test_psycopg_named_cursor_over_a_public_table(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port)) as conn:
        with conn.cursor("pub") as cur:
            cur.execute("SELECT k, word FROM numbers WHERE k > %s ORDER BY k", (2,))
            assert [d.name for d in cur.description or []] == ["k", "word"]
            assert cur.fetchone() == (3, "w3")
            assert cur.fetchmany(2) == [(4, "w4"), (5, "w5")]
            assert cur.fetchall() == [(6, "w6"), (7, "w7")]
            assert cur.fetchone() is None
        with conn.cursor("pages") as cur:  # iteration fetches itersize rows at a time
            cur.itersize = 2
            cur.execute("SELECT k FROM numbers ORDER BY k")
            assert [r[0] for r in cur] == [1, 2, 3, 4, 5, 6, 7]
        with conn.cursor("scrolling", scrollable=True) as cur:
            cur.execute("SELECT k FROM numbers ORDER BY k")
            cur.scroll(5, mode="absolute")
            assert cur.fetchone() == (6,)
            cur.scroll(-3)
            assert cur.fetchone() == (4,)
        with conn.cursor("typed", binary=True) as cur:  # FETCH in binary format: typed as PostgreSQL types them
            cur.execute("SELECT k, word FROM numbers WHERE k = %s", (7,))
            assert cur.fetchall() == [(7, "w7")]
        conn.commit()


def test_private_cursor_is_charged_once_when_declared(proxy: ThreadedProxy, upstream: str) -> None:
    notices: list[str] = []
    with psycopg.connect(client_dsn(proxy.port)) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        with conn.cursor("counts", scrollable=True) as cur:
            cur.execute("SELECT faculty, COUNT(*), SUM(minutes) FROM visits GROUP BY faculty ORDER BY faculty")
            assert _spent(upstream) == (1.0, 1) and len(notices) == 1 and "spent ε = 1" in notices[0]
            first = cur.fetchone()
            rest = cur.fetchall()
            assert first is not None and [first[0]] + [r[0] for r in rest] == ["cs", "math"]
            assert all(isinstance(x, float) for x in first[1:]) and first[1].is_integer()
            cur.scroll(0, mode="absolute")  # back to the start: the same released values, no new noise
            assert cur.fetchall() == [first, *rest]
        conn.commit()
    assert _spent(upstream) == (1.0, 1)


def test_cursor_lifetime_follows_the_transaction(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.NoActiveSqlTransaction):  # 25P01, as PostgreSQL: no block, no cursor
            conn.execute("DECLARE c CURSOR FOR SELECT k FROM numbers")
        with conn.cursor("held", withhold=True) as cur:  # WITH HOLD: outlives its (implicit) transaction
            cur.execute("SELECT k FROM numbers ORDER BY k")
            assert cur.fetchmany(3) == [(1,), (2,), (3,)]
            assert cur.fetchall() == [(4,), (5,), (6,), (7,)]
        conn.execute("BEGIN")
        conn.execute("DECLARE c CURSOR FOR SELECT COUNT(*) FROM visits")
        with pytest.raises(psycopg.errors.DuplicateCursor):
            conn.execute("DECLARE c CURSOR FOR SELECT k FROM numbers")
        conn.execute("ROLLBACK")
        conn.execute("BEGIN")
        conn.execute("DECLARE c NO SCROLL CURSOR FOR SELECT k FROM numbers ORDER BY k")
        conn.execute("DECLARE h CURSOR WITH HOLD FOR SELECT k FROM numbers ORDER BY k")
        assert conn.execute("FETCH 2 FROM c").fetchall() == [(1,), (2,)]
        assert conn.execute("MOVE FORWARD 2 IN c").statusmessage == "MOVE 2"
        assert conn.execute("FETCH NEXT c").fetchall() == [(5,)]
        conn.execute("COMMIT")  # c closes; h, declared WITH HOLD in a block that committed, stays
        with pytest.raises(psycopg.errors.InvalidCursorName):  # 34000
            conn.execute("FETCH c")
        assert conn.execute("FETCH LAST FROM h").fetchall() == [(7,)]
        assert conn.execute("CLOSE h").statusmessage == "CLOSE CURSOR"
        with pytest.raises(psycopg.errors.InvalidCursorName):
            conn.execute("CLOSE h")
        # a private cursor's error before the charge is free, with its position inside the DECLARE
        conn.execute("BEGIN")
        with pytest.raises(psycopg.errors.UndefinedColumn) as info:
            conn.execute("DECLARE bad CURSOR FOR SELECT COUNT(nope) FROM visits")
        assert info.value.diag.statement_position == str(len("DECLARE bad CURSOR FOR SELECT COUNT(") + 1)
        conn.execute("ROLLBACK")
        for sql in ("DECLARE w CURSOR WITH HOLD FOR DELETE FROM visits", "DECLARE w CURSOR FOR SELECT 1 FOR UPDATE"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(sql)
    assert _spent(upstream) == (1.0, 1)  # the rolled-back cursor's COUNT: charged when declared


def test_pg8000_describes_a_prepared_fetch(proxy: ThreadedProxy) -> None:
    pg8000 = pytest.importorskip("pg8000.native")
    conn = pg8000.Connection("alice", password=PASSWORD, host="127.0.0.1", port=proxy.port, database="analytics")
    try:
        conn.run("BEGIN")
        conn.run("DECLARE c SCROLL CURSOR FOR SELECT k, word FROM numbers WHERE k <= :n ORDER BY k", n=4)
        assert conn.run("FETCH 2 FROM c") == [[1, "w1"], [2, "w2"]]
        assert [c["type_oid"] for c in conn.columns] == [23, 25]
        assert conn.run("FETCH BACKWARD ALL FROM c") == [[1, "w1"]]
        assert conn.run("FETCH ALL FROM c") == [[1, "w1"], [2, "w2"], [3, "w3"], [4, "w4"]]
        conn.run("CLOSE ALL")
        conn.run("COMMIT")
    finally:
        conn.close()


# -- FETCH and MOVE against PostgreSQL itself --------------------------------------------------------------

DIRECTIONS = ["", "NEXT", "PRIOR", "FIRST", "LAST", "ALL", "FORWARD", "BACKWARD", "FORWARD ALL", "BACKWARD ALL"]


def _random_fetch(rng: random.Random) -> str:
    verb = rng.choice(["FETCH", "FETCH", "MOVE"])
    n = rng.choice([-9, -3, -2, -1, 0, 1, 2, 3, 6, 7, 8, 20])
    direction = rng.choice(
        [*DIRECTIONS, f"ABSOLUTE {n}", f"RELATIVE {n}", f"FORWARD {n}", f"BACKWARD {n}", str(n), str(abs(n))]
    )
    return f"{verb} {direction} {rng.choice(['FROM', 'IN', ''])} c".replace("  ", " ")


def _run(conn: psycopg.Connection, sql: str) -> tuple[str, object]:
    try:
        cur = conn.execute(sql)
        return "ok", (cur.statusmessage, cur.fetchall() if cur.description else None)
    except psycopg.Error as exc:
        return "error", exc.sqlstate


@pytest.mark.parametrize("options", ["SCROLL", "", "NO SCROLL"])
def test_fetch_and_move_position_as_postgresql_does(proxy: ThreadedProxy, upstream: str, options: str) -> None:
    """Random FETCH/MOVE sequences on a cursor over a public table, through the proxy and on PostgreSQL itself
    (the oracle): the same rows, command tags and refusals (NO SCROLL: "cursor can only scan forward")."""
    rng = random.Random(f"cursors {options}")
    queries = ["SELECT k, word FROM numbers ORDER BY k", "SELECT k FROM numbers WHERE k > 100"]
    with (
        psycopg.connect(client_dsn(proxy.port), autocommit=True) as ours,
        psycopg.connect(upstream, autocommit=True) as theirs,
    ):
        for trial in range(40):
            query = queries[trial % 2]
            for conn in (ours, theirs):
                conn.execute("BEGIN")
                conn.execute(f"DECLARE c {options} CURSOR FOR {query}")
            for _ in range(12):
                sql = _random_fetch(rng)
                got, want = _run(ours, sql), _run(theirs, sql)
                assert got == want, (options, query, sql)
                if want[0] == "error":
                    break
            for conn in (ours, theirs):
                conn.execute("ROLLBACK")


def test_execute_on_a_cursor_portal_pages_from_its_position(proxy: ThreadedProxy) -> None:
    """A declared cursor is a portal (PostgreSQL manual §55.2.3): Execute with a row limit fetches forward from
    where FETCH left it and suspends while rows remain."""
    from proxy_support import _msg, raw_login, recv_message

    def until_ready() -> list[tuple[bytes, bytes]]:
        out = []
        while True:
            kind, body = recv_message(sock)
            out.append((kind, body))
            if kind == b"Z":
                return out

    sock = raw_login(proxy.port)
    sock.sendall(_msg(b"Q", b"BEGIN; \0"))
    until_ready()
    sock.sendall(_msg(b"Q", b"DECLARE c CURSOR FOR SELECT k FROM numbers ORDER BY k\0"))
    assert [k for k, _ in until_ready()] == [b"C", b"Z"]
    sock.sendall(_msg(b"Q", b"FETCH 2 FROM c\0"))
    assert [k for k, _ in until_ready()] == [b"T", b"D", b"D", b"C", b"Z"]
    sock.sendall(_msg(b"E", b"c\0" + (3).to_bytes(4, "big")) + _msg(b"E", b"c\0\0\0\0\0") + _msg(b"S", b""))
    got = until_ready()
    rows = [body[6:].decode() for kind, body in got if kind == b"D"]
    assert rows == ["3", "4", "5", "6", "7"] and [k for k, _ in got if k != b"D"] == [b"s", b"C", b"Z"], got
    sock.close()


def _outcome(conn: psycopg.Connection, sql: str) -> tuple[str, object]:
    try:
        cur = conn.execute(sql)
    except psycopg.Error as e:
        return ("error", e.sqlstate)
    return (cur.statusmessage or "", cur.fetchall() if cur.description else None)


def test_savepoints_close_the_cursors_declared_since_as_postgresql_does(proxy: ThreadedProxy, upstream: str) -> None:
    """ROLLBACK TO closes the cursors declared after the savepoint (their subtransaction's portals), RELEASE keeps
    them, a savepoint name means its latest use, an unknown one is 3B001: 40 random sequences of SAVEPOINT,
    RELEASE, ROLLBACK TO, DECLARE, FETCH and CLOSE give the same tags, rows and SQLSTATEs through the proxy as on
    PostgreSQL itself (the public table, so every answer is exact)."""
    rng = random.Random(26)
    ops = [
        lambda: f"SAVEPOINT s{rng.randrange(3)}",
        lambda: f"RELEASE SAVEPOINT s{rng.randrange(3)}",
        lambda: f"RELEASE s{rng.randrange(3)}",
        lambda: f"ROLLBACK TO SAVEPOINT s{rng.randrange(3)}",
        lambda: f"ROLLBACK TO s{rng.randrange(3)}",
        lambda: f"DECLARE c{rng.randrange(3)} CURSOR FOR SELECT k FROM numbers ORDER BY k",
        lambda: f"DECLARE c{rng.randrange(3)} CURSOR WITH HOLD FOR SELECT k FROM numbers ORDER BY k",
        lambda: f"FETCH 2 FROM c{rng.randrange(3)}",
        lambda: f"CLOSE c{rng.randrange(3)}",
    ]
    with (
        psycopg.connect(client_dsn(proxy.port), autocommit=True) as via,
        psycopg.connect(upstream, autocommit=True) as direct,
    ):
        fixed = ["BEGIN", "SAVEPOINT a", "DECLARE c CURSOR WITH HOLD FOR SELECT k FROM numbers", "SAVEPOINT b"]
        fixed += ["RELEASE b", "ROLLBACK TO a", "FETCH c", "ROLLBACK"]
        assert [_outcome(via, sql) for sql in fixed] == [_outcome(direct, sql) for sql in fixed]
        assert _outcome(via, "FETCH c") == ("error", "34000")  # closed by ROLLBACK TO, WITH HOLD and released
        for _ in range(40):
            for conn in (via, direct):
                conn.execute("CLOSE ALL")
                conn.execute("BEGIN")
            for _ in range(14):
                sql = rng.choice(ops)()
                got, want = _outcome(via, sql), _outcome(direct, sql)
                assert got == want, sql
            end = rng.choice(["COMMIT", "ROLLBACK"])
            assert _outcome(via, end) == _outcome(direct, end)
            for i in range(3):  # WITH HOLD cursors left after the block, on both sides alike
                assert _outcome(via, f"FETCH 1 FROM c{i}") == _outcome(direct, f"FETCH 1 FROM c{i}")
