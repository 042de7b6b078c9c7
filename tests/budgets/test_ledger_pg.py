"""Per-row budgets on PostgreSQL: the exclusion happens inside the answer's statement, the charge is applied to
exactly the rows the answer used, in the same transaction, and the ledger is sqldp's alone."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import psycopg
import pytest

import sqldp
from sqldp.budgets import analysis, sql
from sqldp.budgets.rule import admit, charge
from sqldp.engine.base import Speed
from sqldp.engine.postgres.engine import ChargedAnswer, ensure_ledger
from sqldp.errors import DatabaseError, RefusedError
from sqldp.policy import Policy
from sqldp.rewrite import Statements
from sqldp.session import Session

SETUP = """
CREATE TABLE orders (o_orderkey int PRIMARY KEY, o_day int NOT NULL, o_total int NOT NULL);
CREATE TABLE lines (l_id int PRIMARY KEY, l_orderkey int NOT NULL REFERENCES orders, l_qty int NOT NULL);
INSERT INTO orders SELECT k, k % 10, k FROM generate_series(1, 40) AS k;
INSERT INTO lines SELECT k, 1 + k % 40, 1 + k % 3 FROM generate_series(1, 100) AS k;
"""

POLICY = """
[defaults]
epsilon = 0.5
mechanism = "laplace"
delta = 1e-7

[tables.orders]
rows = "private"
budget = "per-row"
row_epsilon = 1.0
renewal = { every_days = 30, epsilon = 0.5, start = "2026-01-01", max = 2.0 }

[tables.orders.columns.o_total]
range = [0, 100]

[tables.lines]
rows = "private"
max_rows_per = { l_orderkey = 3 }
"""

WINDOW = "SELECT COUNT(*) FROM orders WHERE o_day >= 2 AND o_day < 5"
JOIN = "SELECT COUNT(*) FROM orders o JOIN lines l ON l.l_orderkey = o.o_orderkey WHERE o.o_day < 3"
JAN = dt.date(2026, 1, 15)  # before the first grant: limit 1.0


@pytest.fixture
def session(pg_dsn: str) -> Session:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    return sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=3)


def ledger(dsn: str) -> dict[int, Decimal]:
    with psycopg.connect(dsn) as conn:
        return dict(conn.execute('SELECT o_orderkey, spent FROM sqldp."row_budget_orders"').fetchall())


def used_keys(dsn: str, where: str) -> set[int]:
    with psycopg.connect(dsn) as conn:
        return {r[0] for r in conn.execute(f"SELECT o_orderkey FROM orders WHERE {where}").fetchall()}


def raw(session: Session, text: str, limit: float = 1.0) -> tuple[int, str]:
    """The exact answer of the charged statement (run as the session does, without the noise) and its text."""
    prepared = session.prepare(text)
    assert prepared.statements is not None
    found = analysis.analyse(prepared.form, prepared.plans, prepared.statements, session.catalog, session.policy)  # type: ignore[arg-type]
    assert session.dsn is not None
    with psycopg.connect(session.dsn, autocommit=True) as owner:
        ensure_ledger(owner, sql.ledger_name(found.table), sql.ledger_ddl(found.table, found.key))
    statement = sql.charged_statement(prepared.statements.answer, found, 0.5, limit)
    fetched = ChargedAnswer(session.dsn, sql.ledger_name(found.table)).execute(
        Statements(statement, (), (), {}, prepared.statements.source), Speed()
    )
    return int(fetched.answer[0][0]), statement


def test_exclusion_is_inside_the_statement_and_the_charge_is_the_used_rows(session: Session) -> None:
    assert session.dsn is not None
    used = used_keys(session.dsn, "o_day >= 2 AND o_day < 5")
    count, statement = raw(session, WINDOW)
    assert "NOT EXISTS" in statement and "row_budget_orders" in statement and "INSERT INTO" in statement
    assert count == len(used) == 12
    assert ledger(session.dsn) == {k: Decimal("0.5") for k in used}
    # one row nearly spent: the next answer leaves it out, and it alone is not charged
    nearly = min(used)
    with psycopg.connect(session.dsn, autocommit=True) as conn:
        conn.execute('UPDATE sqldp."row_budget_orders" SET spent = 0.8 WHERE o_orderkey = %s', (nearly,))
    count, _ = raw(session, WINDOW)
    assert count == len(used) - 1
    after = ledger(session.dsn)
    assert after[nearly] == Decimal("0.8")
    assert {k: v for k, v in after.items() if k != nearly} == {k: Decimal("1.0") for k in used - {nearly}}
    # every used row is now out of budget: the answer is over no row, and nothing is charged
    count, _ = raw(session, WINDOW)
    assert count == 0 and ledger(session.dsn) == after


def test_a_failing_answer_charges_nothing(session: Session) -> None:
    """The charge commits with the answer or not at all: a statement that fails leaves the ledger as it was."""
    assert session.dsn is not None
    raw(session, WINDOW)
    before = ledger(session.dsn)
    prepared = session.prepare(WINDOW)
    assert prepared.statements is not None
    found = analysis.analyse(prepared.form, prepared.plans, prepared.statements, session.catalog, session.policy)  # type: ignore[arg-type]
    failing = prepared.statements.answer.replace("COUNT(*)", "COUNT(*) / (COUNT(*) - COUNT(*))")
    statement = sql.charged_statement(failing, found, 0.5, 1.0)
    with pytest.raises(DatabaseError, match="division by zero"):
        ChargedAnswer(session.dsn, "row_budget_orders").execute(
            Statements(statement, (), (), {}, prepared.statements.source), Speed()
        )
    assert ledger(session.dsn) == before


def test_one_to_n_join_charges_the_parents_and_excludes_their_children(session: Session) -> None:
    assert session.dsn is not None
    parents = used_keys(session.dsn, "o_day < 3")
    with psycopg.connect(session.dsn) as conn:
        lines = conn.execute(
            "SELECT l_orderkey, count(*) FROM lines JOIN orders ON l_orderkey = o_orderkey WHERE o_day < 3 "
            "GROUP BY l_orderkey"
        ).fetchall()
    per = dict(lines)
    count, _ = raw(session, JOIN)
    assert count == sum(min(n, 3) for n in per.values())  # the declared bound truncates lines to 3 per order
    assert ledger(session.dsn) == {k: Decimal("0.5") for k in parents}  # parents without lines are charged too
    gone = next(iter(per))
    with psycopg.connect(session.dsn, autocommit=True) as conn:
        conn.execute('UPDATE sqldp."row_budget_orders" SET spent = 1.0 WHERE o_orderkey = %s', (gone,))
    count, _ = raw(session, JOIN)
    assert count == sum(min(n, 3) for k, n in per.items() if k != gone)


def test_session_runs_match_the_rule_and_renewal_adds_budget(session: Session) -> None:
    assert session.dsn is not None
    spent: dict[object, float] = {}
    windows = [(0, 4), (2, 6), (3, 7), (1, 3)]
    for lo, hi in windows:
        text = f"SELECT COUNT(*) FROM orders WHERE o_day >= {lo} AND o_day < {hi}"
        result = session.run_budgeted(text, on=JAN)
        assert result.released and "per-row budgets (single table; rows)" in result.notes[-1]
        spent = charge(spent, admit(spent, used_keys(session.dsn, f"o_day >= {lo} AND o_day < {hi}"), 0.5, 1.0), 0.5)
    assert {k: float(v) for k, v in ledger(session.dsn).items()} == spent
    assert session.spent == pytest.approx(0.5 * len(windows))  # the analyst-level account is charged too
    # 3 (o_day) was in three windows: exhausted in January, room again after the first grant (limit 1.5)
    exhausted = used_keys(session.dsn, "o_day = 3")
    session.run_budgeted("SELECT COUNT(*) FROM orders WHERE o_day = 3", on=JAN)
    assert all(float(ledger(session.dsn)[k]) == 1.0 for k in exhausted)
    session.run_budgeted("SELECT COUNT(*) FROM orders WHERE o_day = 3", on=dt.date(2026, 2, 1))
    assert all(float(ledger(session.dsn)[k]) == 1.5 for k in exhausted)


def test_the_analyst_role_cannot_touch_the_ledger(session: Session) -> None:
    session.run_budgeted(WINDOW, on=JAN)
    assert session.analyst_dsn is not None and session.analyst_dsn != session.dsn
    with psycopg.connect(session.analyst_dsn) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute('UPDATE sqldp."row_budget_orders" SET spent = 0')


def test_refusals_name_the_reason_and_fallback_uses_the_analyst_account(session: Session) -> None:
    assert session.dsn is not None
    with pytest.raises(RefusedError, match="OR-join counterexample"):
        session.run_budgeted(
            "SELECT COUNT(*) FROM orders o JOIN lines l ON l.l_orderkey = o.o_orderkey OR l.l_id = o.o_orderkey"
        )
    with pytest.raises(RefusedError, match="budgeted tables 2 times"):
        session.run_budgeted("SELECT COUNT(*) FROM orders a JOIN orders b ON a.o_orderkey = b.o_orderkey")
    with pytest.raises(RefusedError, match="no table with budget"):
        session.run_budgeted("SELECT COUNT(*) FROM lines")
    result = session.run_budgeted("SELECT COUNT(*) FROM lines", fallback=True)
    assert result.released and session.spent == pytest.approx(0.5)
    with psycopg.connect(session.dsn) as conn:
        assert conn.execute("SELECT to_regclass('sqldp.\"row_budget_orders\"')").fetchone() == (None,)


def test_value_level_conditions_on_sensitive_columns_are_refused(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(SETUP)
    policy = POLICY.replace('rows = "private"\nbudget', 'rows = "private"\nnorm = "l1(o_total)"\nbudget', 1)
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy), seed=3)
    with pytest.raises(RefusedError, match="value-sensitive column"):
        session.run_budgeted("SELECT COUNT(*) FROM orders WHERE o_total > 10")
    result = session.run_budgeted("SELECT SUM(o_total) FROM orders WHERE o_day < 3", on=JAN)
    assert "rows and values" in result.notes[-1]


def test_explain_and_noisy_counts_say_what_a_query_would_charge(session: Session) -> None:
    from sqldp.commands.explain import _text, explain

    out = explain(WINDOW, session.catalog, session.policy)
    assert out["budget"]["class"] == "single table; rows" and out["budget"]["epsilon_per_row"] == 0.5
    assert "orders.o_day >= 2" in out["budget"]["charged_rows"] and "every 30 days" in out["budget"]["limit"]
    assert "Per-row budgets (single table; rows): charges ε = 0.5 to each row of orders" in _text(out)
    refused = explain(
        "SELECT COUNT(*) FROM orders a JOIN orders b ON a.o_orderkey = b.o_orderkey", session.catalog, session.policy
    )
    assert "budgeted tables 2 times" in refused["budget"]["refused"]
    # 12 used rows, none excluded yet; then all excluded. ε = 50: noise scale 0.02, the counts within ±1
    first = session.budget_counts(WINDOW, epsilon=50.0, on=JAN)
    assert abs(first["charged"] - 12) < 1 and abs(first["excluded"]) < 1 and first["noise_scale"] == 0.02
    assert session.spent == pytest.approx(50.0)  # the analyst-level account pays; the ledger does not
    assert session.dsn is not None and ledger(session.dsn) == {}
    session.run_budgeted(WINDOW, on=JAN)
    session.run_budgeted(WINDOW, on=JAN)
    after = session.budget_counts(WINDOW, epsilon=50.0, on=JAN)
    assert abs(after["charged"]) < 1 and abs(after["excluded"] - 12) < 1


def test_concurrent_budgeted_runs_never_overspend(session: Session) -> None:
    """Two sessions charging the same rows at once: the advisory lock orders them, so every row ends at its
    limit exactly (two charges of 0.5) and never above it, however the six runs interleave."""
    import threading

    assert session.dsn is not None
    other = sqldp.connect(session.dsn, Policy.from_toml(POLICY), seed=4)
    errors: list[BaseException] = []

    def runs(s: Session) -> None:
        try:
            for _ in range(3):
                s.run_budgeted(WINDOW, on=JAN)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=runs, args=(s,)) for s in (session, other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert set(ledger(session.dsn).values()) == {Decimal("1.0")}
    assert len(ledger(session.dsn)) == 12
