"""What a proxy user sees besides the values: the cost and the error bars of each private answer (NOTICE),
``SHOW sqldp.budget``, error positions (issue #23, "Proxy users"). Real clients: psycopg 3 and psql."""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from proxy_support import client_dsn, make_tables, write_policy

from sqldp.proxy import ThreadedProxy, build, ledger


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    make_tables(pg_dsn)
    return pg_dsn


@pytest.fixture
def proxy(upstream: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 3.5}})
    with ThreadedProxy(build(upstream, policy)) as p:
        yield p


@dataclass(frozen=True)
class Notice:
    severity: str | None
    message: str
    detail: str


def _notices(conn: psycopg.Connection) -> list[Notice]:
    """The notices the connection receives (a Diagnostic is valid only inside the handler: copied there)."""
    got: list[Notice] = []

    def keep(d: psycopg.errors.Diagnostic) -> None:
        got.append(Notice(d.severity_nonlocalized, d.message_primary or "", d.message_detail or ""))

    conn.add_notice_handler(keep)
    return got


def test_private_answer_comes_with_its_cost_and_error_bar(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        notes = _notices(conn)
        conn.execute("SELECT COUNT(*) FROM visits WHERE faculty = %s", ("math",)).fetchone()
        conn.execute("SELECT COUNT(*) AS n FROM visits").fetchone()  # simple-protocol-free path, no parameters
        conn.execute("SELECT n_name FROM nation").fetchall()  # public: costs nothing, no notice
    assert [n.severity for n in notes] == ["NOTICE", "NOTICE"]
    assert notes[0].message == "sqldp: this statement spent ε = 1, δ = 0; alice has ε = 2.5 of 3.5 left, δ = 0 of 0"
    assert "alice has ε = 1.5 of 3.5 left" in notes[1].message
    # the oracle: a count's global sensitivity is 1, so Laplace noise of scale 1/ε = 1; P(|X| > w) = e^(-w),
    # so at confidence c the half-width is w = -ln(1 - c)
    detail = notes[1].detail
    m = re.fullmatch(r"error bars \(± half-width, ([0-9.]+) confidence\): n ± ([0-9.]+)", detail)
    assert m is not None, detail
    # (here 1.51), plus 0.5 for the release's rounding of the count to an integer (sqldp.aggregates.counted)
    assert float(m.group(2)) == pytest.approx(-math.log(1 - float(m.group(1))) + 0.5, rel=1e-2)


def test_no_error_bar_for_a_data_dependent_noise_scale(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        notes = _notices(conn)
        conn.execute("SELECT COUNT(*) FROM visits a, visits b WHERE a.faculty = b.faculty").fetchone()
    assert len(notes) == 1
    assert notes[0].detail.startswith("no error bars")
    assert "±" not in notes[0].detail


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed")
def test_psql_prints_the_notice(proxy: ThreadedProxy) -> None:
    out = subprocess.run(
        ["psql", client_dsn(proxy.port), "-X", "-A", "-t", "-c", "SELECT COUNT(*) FROM visits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "NOTICE:  sqldp: this statement spent ε = 1, δ = 0; alice has ε = 2.5 of 3.5 left" in out.stderr
    assert "DETAIL:  error bars" in out.stderr


def test_show_sqldp_budget(proxy: ThreadedProxy, upstream: str) -> None:
    names = ["analyst", "epsilon_limit", "epsilon_spent", "epsilon_left", "delta_limit", "delta_spent", "delta_left"]
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        cur = conn.execute("SHOW sqldp.budget")
        assert [d.name for d in cur.description or []] == [*names, "queries"]
        assert cur.fetchall() == [("alice", 3.5, 0, 3.5, 0, 0, 0, 0)]
        conn.execute("SELECT COUNT(*) FROM visits").fetchone()
        # the extended protocol, prepared (Describe of the statement announces the same columns and types)
        cur = conn.execute("show SQLDP.BUDGET", prepare=True)
        assert [d.type_code for d in cur.description or []] == [25, 1700, 1700, 1700, 1700, 1700, 1700, 20]
        assert cur.fetchall() == [("alice", Decimal("3.5"), 1, Decimal("2.5"), 0, 0, 0, 1)]
    # the oracle: the ledger itself, read by the data owner
    with psycopg.connect(upstream) as conn:
        b = ledger.balance(conn, "alice")
        assert b is not None and (b.epsilon_spent, b.queries) == (1, 1)


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed")
def test_psql_show_sqldp_budget(proxy: ThreadedProxy) -> None:
    out = subprocess.run(
        ["psql", client_dsn(proxy.port), "-X", "-A", "-c", "SHOW sqldp.budget"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == [
        "analyst|epsilon_limit|epsilon_spent|epsilon_left|delta_limit|delta_spent|delta_left|queries",
        "alice|3.5|0|3.5|0|0|0|0",
    ]


# -- error positions: PostgreSQL itself is the oracle ----------------------------------------------

POSITIONED = [
    ("SELECT COUNT(* FROM visits WHERE minutes > 3", ()),  # a syntax error
    ("SELECT COUNT(*) FROM visits WHERE nosuch = 1", ()),
    ("SELECT COUNT(*)\n  FROM visits\n WHERE faculty = %s AND nosuch > 2", ("a rather long parameter value",)),
    ("SELECT SUM(minutes) FROM visits WHERE minutes > %s AND faculty = %s OR nosuch", (3, "math")),
]


def _position(dsn: str, sql: str, params: tuple[object, ...]) -> tuple[str | None, int | None]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as info:
            conn.execute(sql, params or None)
        diag = info.value.diag
        return diag.sqlstate, int(diag.statement_position) if diag.statement_position else None


@pytest.mark.parametrize(("sql", "params"), POSITIONED)
def test_error_position_is_postgresql_s(
    proxy: ThreadedProxy, upstream: str, sql: str, params: tuple[object, ...]
) -> None:
    expected = _position(upstream, sql, params)
    assert expected[1] is not None
    assert _position(client_dsn(proxy.port), sql, params) == expected


@pytest.mark.skipif(shutil.which("psql") is None, reason="psql (Debian's postgresql-client) is not installed")
def test_psql_draws_the_caret(proxy: ThreadedProxy, upstream: str) -> None:
    script = "SELECT COUNT(*)\n  FROM visits\n WHERE faculty = 'x' AND nosuch > 2;\n"

    def caret(dsn: str) -> list[str]:
        out = subprocess.run(["psql", dsn, "-X"], input=script, capture_output=True, text=True, timeout=30)
        return [line for line in out.stderr.splitlines() if line.startswith("LINE ") or line.strip() == "^"]

    expected = caret(upstream)
    assert len(expected) == 2
    assert caret(client_dsn(proxy.port)) == expected


# -- cancel (issue #26) ----------------------------------------------------------------------------

SLOW = "SELECT COUNT(*) FROM visits a, visits b, visits c WHERE a.faculty = b.faculty AND b.faculty = c.faculty"


def _upstream_running(dsn: str, text: str) -> int:
    """How many of PostgreSQL's backends are running a statement containing ``text`` (the oracle)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT COUNT(*) FROM pg_stat_activity "
            "WHERE state = 'active' AND query LIKE %s AND pid <> pg_backend_pid()",
            (f"%{text}%",),
        ).fetchone()
        return int(row[0]) if row else 0


def test_cancel_stops_the_upstream_query_and_the_charge_stays(pg_dsn: str, tmp_path: Path) -> None:
    make_tables(pg_dsn, rows=3000)  # the triple join counts 2 × 1500³ rows: minutes, unless cancelled
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 3.5}})
    with (
        ThreadedProxy(build(pg_dsn, policy)) as proxy,
        psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn,
    ):
        worker = threading.Thread(target=lambda: _run_and_expect_cancel(conn), daemon=True)
        worker.start()
        deadline = time.monotonic() + 60
        while _upstream_running(pg_dsn, "visits") == 0:  # charged, and running upstream
            assert time.monotonic() < deadline and worker.is_alive()
            time.sleep(0.1)
        conn.cancel_safe(timeout=5)  # psycopg's CancelRequest to the proxy
        worker.join(timeout=30)
        assert not worker.is_alive()
        deadline = time.monotonic() + 20
        while _upstream_running(pg_dsn, "visits") > 0:  # PostgreSQL stopped it
            assert time.monotonic() < deadline, "the upstream query still runs"
            time.sleep(0.1)
        t0 = time.monotonic()  # the connection's next private statement no longer waits for the cancelled one
        conn.execute("SELECT COUNT(*) FROM visits").fetchone()
        assert time.monotonic() - t0 < 10
    with psycopg.connect(pg_dsn) as conn:  # charged before it ran, the cancelled one's charge stays (docs/proxy.md)
        b = ledger.balance(conn, "alice")
        assert b is not None and (b.epsilon_spent, b.queries) == (2, 2)


def _run_and_expect_cancel(conn: psycopg.Connection) -> None:
    with pytest.raises(psycopg.errors.QueryCanceled):
        conn.execute(SLOW)


def test_budget_exhausted_error_has_a_hint(proxy: ThreadedProxy) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for _ in range(3):
            conn.execute("SELECT COUNT(*) FROM visits").fetchone()
        with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as info:
            conn.execute("SELECT COUNT(*) FROM visits")  # 0.5 left of 3.5, the query costs 1
        assert "SHOW sqldp.budget" in (info.value.diag.message_hint or "")
        assert conn.execute("SHOW sqldp.budget").fetchone()[3] == Decimal("0.5")  # type: ignore[index]


def test_statement_timeout_cancels_a_private_cross_join_and_the_charge_stays(pg_dsn: str, tmp_path: Path) -> None:
    """The data owner's statement timeout (opt-in): alice's 1 s (her own) cancels the triple join upstream
    after its charge, with one fixed message, and the charge stays; bob gets [proxy]'s 60 s."""
    make_tables(pg_dsn, rows=3000)
    analysts = {"alice": {"epsilon_limit": 3.5, "statement_timeout": 1.0}, "bob": {"epsilon_limit": 3.5}}
    policy = write_policy(tmp_path / "policy.toml", analysts, extra="[proxy]\nstatement_timeout = 60\n")
    with ThreadedProxy(build(pg_dsn, policy)) as proxy:
        with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
            t0 = time.monotonic()
            with pytest.raises(psycopg.errors.QueryCanceled) as info:
                conn.execute(SLOW)
            took = time.monotonic() - t0
            assert str(info.value).startswith(
                "canceling statement due to statement timeout (1 s, set by the data owner); its charge stands"
            )
            assert info.value.diag.message_hint == "SHOW sqldp.budget shows what is left"
            assert 1.0 <= took < 20, took
            deadline = time.monotonic() + 20
            while _upstream_running(pg_dsn, "visits") > 0:  # PostgreSQL stopped it (the oracle)
                assert time.monotonic() - deadline < 0, "the upstream query still runs"
                time.sleep(0.1)
            assert isinstance(conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0], float)  # type: ignore[index]
        with psycopg.connect(client_dsn(proxy.port, user="bob"), autocommit=True) as conn:
            assert isinstance(conn.execute("SELECT COUNT(*) FROM visits").fetchone()[0], float)  # type: ignore[index]
    with psycopg.connect(pg_dsn) as conn:  # charged before it ran: the timed-out statement's charge stays
        b = ledger.balance(conn, "alice")
        assert b is not None and (b.epsilon_spent, b.queries) == (2, 2)
