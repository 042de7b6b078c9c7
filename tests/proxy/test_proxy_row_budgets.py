"""Per-row budgets through the proxy (docs/budgets.md, docs/proxy.md "Per-row budgets"): a private statement
over a per-row-budgeted table is answered through the per-row ledger as well as charged to the analyst's
account, its NOTICE says what each used row was charged and how many rows were used and excluded as noisy
counts only, a statement outside the proven classes is refused with the reason (or answered on the analyst
account with row_budget_fallback), and the ledger is out of the analyst's reach."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from proxy_support import PASSWORD, client_dsn
from psycopg import errors as pg_errors

from sqldp.errors import PolicyError
from sqldp.policy import Policy
from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.proxy.config import load
from sqldp.proxy.scram import make_verifier

SETUP = """
CREATE TABLE orders (o_orderkey int PRIMARY KEY, o_day int NOT NULL, o_total int NOT NULL);
CREATE TABLE lines (l_id int PRIMARY KEY, l_orderkey int NOT NULL REFERENCES orders, l_qty int NOT NULL);
INSERT INTO orders SELECT k, k % 10, k FROM generate_series(1, 40) AS k;
INSERT INTO lines SELECT k, 1 + k % 40, 1 + k % 3 FROM generate_series(1, 100) AS k;
"""

WINDOW = "SELECT COUNT(*) FROM orders WHERE o_day >= 2 AND o_day < 5"  # days 2, 3, 4: 12 rows
LATER = "SELECT COUNT(*) FROM orders WHERE o_day >= 3 AND o_day < 6"  # days 3, 4 (shared with WINDOW) and 5
# the report's OR-join counterexample (NR §3.3.12.7): not a proven class
OR_JOIN = "SELECT COUNT(*) FROM orders o JOIN lines l ON l.l_orderkey = o.o_orderkey OR l.l_orderkey = o.o_orderkey + 1"
OUTSIDE = [
    (OR_JOIN, "OR-join counterexample"),
    ("SELECT COUNT(*) FROM orders a JOIN orders b ON a.o_orderkey = b.o_orderkey", "self-join"),
    ("SELECT COUNT(*) FROM orders UNION ALL SELECT COUNT(*) FROM lines", "set operation"),
]


def policy_text(proxy: str) -> str:
    return f"""
[defaults]
epsilon = 0.5

[proxy]
{proxy}

[tables.orders]
rows = "private"
budget = "per-row"
row_epsilon = 1.0

[tables.orders.columns.o_total]
range = [0, 100]

[tables.lines]
rows = "private"
max_rows_per = {{ l_orderkey = 3 }}

[analysts.alice]
verifier = "{make_verifier(PASSWORD)}"
epsilon_limit = 100000.0
"""


def start(upstream: str, path: Path, proxy: str) -> ThreadedProxy:
    path.write_text(policy_text(proxy), encoding="utf-8")
    return ThreadedProxy(build(upstream, path))


@pytest.fixture
def upstream(pg_dsn: str) -> str:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    return pg_dsn


@pytest.fixture
def proxy(upstream: str, tmp_path: Path) -> Iterator[ThreadedProxy]:
    # counts at ε = 1000 (Laplace scale 0.001): precise enough to be checked against the ledger, and still only
    # released with noise
    with start(upstream, tmp_path / "policy.toml", "row_counts_epsilon = 1000") as p:
        yield p


def ask(port: int, sql: str) -> tuple[float, list[tuple[str, str]]]:
    """The noisy answer and the NOTICEs' (message, detail) pairs (a Diagnostic lives only inside its handler)."""
    notices: list[tuple[str, str]] = []
    with psycopg.connect(client_dsn(port), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append((d.message_primary or "", d.message_detail or "")))
        (value,) = conn.execute(sql).fetchone() or (None,)
    assert isinstance(value, float)
    return value, notices


def row_ledger(dsn: str) -> dict[int, Decimal]:
    """The per-row ledger, read as the owner."""
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute('SELECT o_orderkey, spent FROM sqldp."row_budget_orders"').fetchall())


def keys(dsn: str, where: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(f"SELECT o_orderkey FROM orders WHERE {where}").fetchall()}


def analyst_spent(dsn: str) -> Decimal:
    with psycopg.connect(dsn) as conn:
        b = ledger.balance(conn, "alice")
        assert b is not None
        return b.epsilon_spent


def per_row_line(notices: list[tuple[str, str]]) -> tuple[str, str]:
    found = [n for n in notices if "per-row budgets" in n[0]]
    assert len(found) == 1, notices
    return found[0]


def counts(message: str) -> tuple[float, float]:
    used = message.split("rows used ≈ ")[1].split(",")[0]
    excluded = message.split("excluded (no room left) ≈ ")[1].split(" ")[0]
    return float(used), float(excluded)


def test_the_notice_says_the_per_row_charge_and_noisy_counts(proxy: ThreadedProxy, upstream: str) -> None:
    _, notices = ask(proxy.port, WINDOW)
    message, detail = per_row_line(notices)
    assert message.startswith(
        "sqldp: per-row budgets (single table; rows): each row of orders the answer used was charged ε = 0.5 of "
        "its limit 1; rows used ≈ "
    ), message
    assert "Laplace scale 0.001, ε = 1000 of this statement's charge" in message
    used, excluded = counts(message)
    assert abs(used - 12) < 0.5 and abs(excluded) < 0.5
    assert "orders.o_day >= 2 AND orders.o_day < 5" in detail
    # the analyst's account: the answer's ε and the counts' ε, and the spent ε the first NOTICE says
    assert analyst_spent(upstream) == Decimal("1000.5")
    assert any("this statement spent ε = 1000.5," in n[0] for n in notices)
    # the per-row ledger: exactly the used rows, charged the answer's ε
    assert row_ledger(upstream) == {k: Decimal("0.5") for k in keys(upstream, "o_day >= 2 AND o_day < 5")}


def test_repeated_queries_exhaust_rows_and_later_answers_exclude_them(proxy: ThreadedProxy, upstream: str) -> None:
    window = keys(upstream, "o_day >= 2 AND o_day < 5")
    ask(proxy.port, WINDOW)
    ask(proxy.port, WINDOW)
    assert row_ledger(upstream) == {k: Decimal("1.0") for k in window}  # each used row is at its limit of 1
    _, notices = ask(proxy.port, WINDOW)
    used, excluded = counts(per_row_line(notices)[0])
    assert abs(used) < 0.5 and abs(excluded - 12) < 0.5  # all 12 used rows are left out
    assert row_ledger(upstream) == {k: Decimal("1.0") for k in window}  # and not charged past their limit
    # an overlapping window: its rows of days 3 and 4 are spent and left out, those of day 5 are charged
    _, notices = ask(proxy.port, LATER)
    used, excluded = counts(per_row_line(notices)[0])
    assert abs(used - 4) < 0.5 and abs(excluded - 8) < 0.5
    fifth = keys(upstream, "o_day = 5")
    assert row_ledger(upstream) == {**{k: Decimal("1.0") for k in window}, **{k: Decimal("0.5") for k in fifth}}
    assert analyst_spent(upstream) == 4 * Decimal("1000.5")  # the analyst-level account is charged every time


def test_outside_the_classes_is_refused_with_the_reason(proxy: ThreadedProxy, upstream: str) -> None:
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql, why in OUTSIDE:
            with pytest.raises(psycopg.Error) as info:
                conn.execute(sql)
            message = info.value.diag.message_primary or ""
            assert message.startswith("budget: per-row budgets (docs/budgets.md): ") and why in message, message
            assert "\n" not in message
        # the connection stays usable and a budgeted query is answered
        assert isinstance((conn.execute(WINDOW).fetchone() or (None,))[0], float)
    assert analyst_spent(upstream) == Decimal("1000.5")  # the refusal cost nothing


def test_fallback_answers_on_the_analyst_account(upstream: str, tmp_path: Path) -> None:
    notices: list[tuple[str, str]] = []
    with (
        start(upstream, tmp_path / "policy.toml", "row_budget_fallback = true") as p,
        psycopg.connect(client_dsn(p.port), autocommit=True) as conn,
    ):
        conn.add_notice_handler(lambda d: notices.append((d.message_primary or "", d.message_detail or "")))
        (value,) = conn.execute(OR_JOIN).fetchone() or (None,)
        assert isinstance(value, float)
        line = per_row_line(notices)[0]
        assert line.startswith("sqldp: per-row budgets not used (docs/budgets.md): private table use(s) l (lines)")
        assert "answered on alice's analyst-level account only" in line
        notices.clear()
        conn.execute(WINDOW)  # a proven class still goes through the ledger; no counts without their ε
        line = per_row_line(notices)[0]
        assert "charged ε = 0.5 of its limit 1; how many rows it used and excluded is not released" in line
        assert "≈" not in line
    assert analyst_spent(upstream) == Decimal("1.0")  # 0.5 each, no counts
    assert row_ledger(upstream) == {k: Decimal("0.5") for k in keys(upstream, "o_day >= 2 AND o_day < 5")}


def test_the_analyst_cannot_read_or_write_the_ledger(proxy: ThreadedProxy, upstream: str) -> None:
    ask(proxy.port, WINDOW)
    before = row_ledger(upstream)
    with psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn:
        for sql in (
            'SELECT * FROM sqldp."row_budget_orders"',
            'SELECT COUNT(*) FROM sqldp."row_budget_orders"',
            'UPDATE sqldp."row_budget_orders" SET spent = 0',
            'DELETE FROM sqldp."row_budget_orders"',
            'TRUNCATE sqldp."row_budget_orders"',
        ):
            with pytest.raises(psycopg.Error):
                conn.execute(sql)
        with pytest.raises(pg_errors.InsufficientPrivilege):
            conn.execute('UPDATE sqldp."row_budget_orders" SET spent = 0')
    assert row_ledger(upstream) == before


def test_the_proxy_options_are_checked() -> None:
    for bad, key in (("row_budget_fallback = 1", "row_budget_fallback"), ("row_counts_epsilon = -1", "row_counts_")):
        with pytest.raises(PolicyError) as info:
            load(Policy.from_toml(policy_text(bad)))
        assert info.value.where is not None and info.value.where.rpartition("proxy.")[2].startswith(key)
    cfg = load(Policy.from_toml(policy_text("row_budget_fallback = true\nrow_counts_epsilon = 0.25")))
    assert cfg.row_budget_fallback is True and cfg.row_counts_epsilon == 0.25


def test_the_statement_timeout_cancels_a_budgeted_answer_and_its_charge(upstream: str, tmp_path: Path) -> None:
    """The budgeted answer's transaction runs on a connection of sqldp's own role; the proxy's statement timeout
    reaches it too: here it waits for the ledger's advisory lock, held by the owner, and is cancelled after 1 s
    with the analyst's charge standing and no row charged (the transaction rolled back)."""
    with start(upstream, tmp_path / "policy.toml", "statement_timeout = 1") as p:
        ask(p.port, WINDOW)  # creates the ledger (its creation takes the same lock)
        before = row_ledger(upstream)
        # the owner holds the ledger's lock (as a budgeted answer's transaction takes it) for 10 s: without the
        # cancel, the answer would wait and then succeed
        owner = psycopg.connect(upstream, autocommit=True)
        owner.execute("SELECT pg_advisory_lock(hashtext(%s))", ("sqldp." + "row_budget_orders",))  # ChargedAnswer's key
        release = threading.Timer(10, owner.close)
        release.start()
        try:
            with (
                psycopg.connect(client_dsn(p.port), autocommit=True) as conn,
                pytest.raises(pg_errors.QueryCanceled) as info,
            ):
                conn.execute(WINDOW)
            assert "statement timeout (1 s" in (info.value.diag.message_primary or "")
        finally:
            release.cancel()
            owner.close()
    assert row_ledger(upstream) == before
    assert analyst_spent(upstream) == Decimal("1.0")
