"""What an analyst sees when a statement fails (issue 26): each reproducer of a traceback or a dropped
connection is a one-line refusal before the charge; PostgreSQL's errors keep their own SQLSTATE where they
cannot depend on private rows (parse analysis, public tables) and are withheld where they could (a private
query that fails after its charge). None comes back as 08000, which drivers take for a dropped connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, _msg, client_dsn, error_fields, make_tables, raw_login, recv_message, write_policy

from sqldp.db import ANALYST_ROLE
from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.proxy.scram import make_verifier

TPCH_POLICY = Path(__file__).parents[2] / "schemas" / "tpch.toml"


def _spent(dsn: str, analyst: str = "alice") -> float:
    with psycopg.connect(dsn) as conn:
        balance = ledger.balance(conn, analyst)
        return 0.0 if balance is None else float(balance.epsilon_spent)


def _until_ready(sock: object) -> list[tuple[bytes, dict[str, str]]]:
    out = []
    while True:
        kind, body = recv_message(sock)  # type: ignore[arg-type]
        out.append((kind, error_fields(body) if kind == b"E" else {}))
        if kind == b"Z":
            return out


@pytest.fixture
def tpch_proxy(
    tpch_dsn: tuple[str, object, object], pg_dsn: str, tmp_path: Path
) -> Iterator[tuple[ThreadedProxy, str]]:
    """The proxy over TPC-H (SF 0.01) with its shipped policy; the ledger in a database of its own, since the
    TPC-H database is shared by read-only tests."""
    policy = tmp_path / "tpch.toml"
    verifier = make_verifier(PASSWORD)
    alice = f'\n[analysts.alice]\nverifier = "{verifier}"\nepsilon_limit = 50.0\n'
    policy.write_text(TPCH_POLICY.read_text(encoding="utf-8") + alice, encoding="utf-8")
    with ThreadedProxy(build(tpch_dsn[0], policy, ledger_dsn=pg_dsn)) as p:
        yield p, pg_dsn


# the reproducers: each was a traceback (CLI exit 70) or a dropped connection
REPRODUCERS = [
    "SELECT COUNT(*) FROM lineitem WHERE l_shipdate <= date '1998-12-01' - interval 'NULL' day",
    "SELECT COUNT(*) FROM orders WHERE o_orderdate > '-infinity'::date",
    "SELECT o_orderpriority, RANGE_AGG(*) FROM orders GROUP BY o_orderpriority",
    "SELECT COUNT(*) FROM lineitem WHERE l_shipdate <= date '1998-12-01' + interval '1" + "0" * 400 + "' day",
    "SELECT " + ", ".join(["COUNT(*)"] * 100_000) + " FROM orders",
]


def test_reproducers_are_one_line_refusals_before_the_charge(tpch_proxy: tuple[ThreadedProxy, str]) -> None:
    proxy, ledger_dsn = tpch_proxy
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql in REPRODUCERS:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            state = info.value.sqlstate or ""
            assert state and state[:2] not in ("08", "XX"), (sql[:80], state, str(info.value))
            # one line; libpq adds its own LINE/caret lines below it when the error has a position (P)
            assert "\n" not in (info.value.diag.message_primary or "")
            assert str(info.value).startswith(info.value.diag.message_primary or "")
            assert conn.execute("SELECT TRIM(n_name) FROM nation WHERE n_nationkey = 1").fetchone() == ("ARGENTINA",)
    assert _spent(ledger_dsn) == 0.0


def test_type_errors_are_found_by_postgres_before_the_charge(tpch_proxy: tuple[ThreadedProxy, str]) -> None:
    """A literal that is not of its column's type passes sqldp's analysis; PostgreSQL's parse analysis of the
    statements (no row read) refuses it with its own SQLSTATE, free. It was charged and failed with 08000."""
    proxy, ledger_dsn = tpch_proxy
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql in (
            "SELECT COUNT(*) FROM orders WHERE o_orderkey + 'abc' > 1",
            "SELECT COUNT(*) FROM orders WHERE o_orderkey > 'inf'",
        ):
            with pytest.raises(psycopg.errors.InvalidTextRepresentation) as info:  # 22P02
                conn.execute(sql)
            assert "invalid input syntax" in str(info.value)
        assert isinstance(conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0], float)  # type: ignore[index]
    assert _spent(ledger_dsn) == 1.0  # the last one only


def test_errors_over_public_tables_keep_their_sqlstate_and_message(tpch_proxy: tuple[ThreadedProxy, str]) -> None:
    proxy, _ = tpch_proxy
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero, match="division by zero"):
            conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1 / 0")
        with pytest.raises(psycopg.errors.InvalidTextRepresentation, match="ALGERIA"):  # public data: shown
            conn.execute("SELECT n_name::int FROM nation")
        assert conn.execute("SELECT TRIM(n_name) FROM nation WHERE n_nationkey = 2").fetchone() == ("BRAZIL",)


@pytest.fixture
def proxy(pg_dsn: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    make_tables(pg_dsn)
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 10.0}})
    with ThreadedProxy(build(pg_dsn, policy)) as p:
        yield p


def test_a_private_query_failing_after_its_charge_is_withheld_and_charged(proxy: ThreadedProxy, pg_dsn: str) -> None:
    """A real failure in PostgreSQL after the charge (the analyst role lost its right to read the table:
    checked when the executor starts, so parse analysis passes). What failed is not shown, since for a
    private query it could depend on the rows: one fixed SQLSTATE (22000) and message, and the charge stays."""
    with psycopg.connect(pg_dsn, autocommit=True) as owner:
        owner.execute(f"REVOKE SELECT ON visits FROM {ANALYST_ROLE}")
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        with pytest.raises(psycopg.errors.DataException) as info:
            conn.execute("SELECT COUNT(*) FROM visits")
        assert info.value.sqlstate == "22000"
        assert "not shown" in str(info.value) and "permission" not in str(info.value)
        assert conn.execute("SELECT n_name FROM nation WHERE n_nationkey = 1").fetchone() == ("ALGERIA",)
    assert _spent(pg_dsn) == 1.0


def test_parameter_zero_is_refused_at_parse(proxy: ThreadedProxy) -> None:
    """Parse of ``$0`` then Bind without parameters was an IndexError (XX000), with no ErrorResponse before."""
    sock = raw_login(proxy.port)
    sock.sendall(
        _msg(b"P", b"\0SELECT n_name FROM nation WHERE n_nationkey = $0\0\0\0")
        + _msg(b"B", b"\0\0\0\0\0\0\0\0")
        + _msg(b"E", b"\0\0\0\0\0")
        + _msg(b"S", b"")
    )
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[0][1]["C"] == "42P02", got
    assert got[0][1]["M"] == "there is no parameter $0"
    sock.sendall(_msg(b"Q", b"SELECT n_name FROM nation WHERE n_nationkey = $0\0"))
    got = _until_ready(sock)
    assert [k for k, _ in got] == [b"E", b"Z"] and got[0][1]["C"] == "42P02", got
    sock.sendall(_msg(b"Q", b"SELECT n_name FROM nation WHERE n_nationkey = 3\0"))
    assert [k for k, _ in _until_ready(sock)] == [b"T", b"D", b"C", b"Z"]
    sock.close()
