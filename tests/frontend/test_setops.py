"""Top-level UNION / INTERSECT / EXCEPT of queries over private tables (sqldp.strategies.setops, docs/sql.md): each
branch released at its share of ε (sequential composition), the set operation applied to the released rows.

Oracles: PostgreSQL's own set operations on the same rows (the post-processing must be PostgreSQL's, ALL and
distinct forms, with NULLs and duplicates, and its precedence of INTERSECT over UNION and EXCEPT), and the
exact joint privacy loss of the released vector against every neighbour (one row added, any key) of a tiny
database.

Mutants killed:
* each branch released with the full ε (no split) — ``test_branches_cost_at_most_epsilon_together`` (the
  overlapping branches then cost 2ε for a row in both);
* a public branch charged or noised — ``test_a_public_branch_is_exact_and_free``;
* INTERSECT ALL / EXCEPT ALL computed as their distinct forms (or the reverse), UNION ALL deduplicated, NULL
  rows not matched — ``test_combine_equals_postgresql``;
* ORDER BY / LIMIT ignored or applied per branch — ``test_order_and_limit_apply_to_the_released_rows``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlglot
from oracles import joint_loss, rows_added
from proxy_support import client_dsn, make_tables, write_policy
from sqlglot import exp

import sqldp
from sqldp.errors import BudgetExhaustedError, ForbiddenError, RefusedError, StatementError
from sqldp.policy import Policy
from sqldp.proxy import ThreadedProxy, build, ledger
from sqldp.session import Session
from sqldp.strategies import setops

EPSILON = 1.0
POLICY = '[tables.t]\nrows = "private"\n[tables.k]\nrows = "public"\n'
ROWS = [(1, "a"), (2, "a"), (3, "b"), (4, "c")]


def _load(dsn: str, rows: list[tuple[int, str | None]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY, g TEXT)")
        conn.execute("CREATE TABLE IF NOT EXISTS k (name TEXT PRIMARY KEY)")
        conn.execute("DELETE FROM t")
        conn.execute("DELETE FROM k")
        conn.execute("INSERT INTO k VALUES ('a'), ('b'), ('q')")
        for row in rows:
            conn.execute("INSERT INTO t VALUES (%s, %s)", row)


@pytest.fixture
def session(pg_dsn: str) -> Iterator[Session]:
    _load(pg_dsn, ROWS)
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=5)


def _values(rows: list[tuple[int | None, str | None]]) -> str:
    if not rows:
        return "SELECT * FROM (VALUES (0, 'x')) AS v(a, b) WHERE false"
    items = ", ".join(f"({'NULL::int' if a is None else a}, {'NULL::text' if b is None else repr(b)})" for a, b in rows)
    return f"SELECT * FROM (VALUES {items}) AS v(a, b)"


@pytest.mark.parametrize("seed", range(12))
def test_combine_equals_postgresql(pg_server_dsn: str, seed: int) -> None:
    """Random multisets of rows (with NULLs and duplicates) under every operator and precedence: the
    combination sqldp applies to released rows is PostgreSQL's, as a multiset."""
    rng = random.Random(seed)
    cells: list[tuple[int | None, str | None]] = [(1, "a"), (2, "a"), (1, None), (None, None), (3, "c")]
    ops = ["UNION", "UNION ALL", "INTERSECT", "INTERSECT ALL", "EXCEPT", "EXCEPT ALL"]
    with psycopg.connect(pg_server_dsn) as conn:
        for _ in range(6):
            branches = [[rng.choice(cells) for _ in range(rng.randrange(0, 5))] for _ in range(3)]
            texts = [_values(b) for b in branches]
            sql = f"{texts[0]} {rng.choice(ops)} {texts[1]} {rng.choice(ops)} {texts[2]}"
            statement = sqlglot.parse_one(sql, read="postgres")
            assert isinstance(statement, exp.SetOperation)
            root, parts = setops.split(statement)
            rows = [[tuple(r) for r in conn.execute(p.sql).fetchall()] for p in parts]
            expected = Counter(tuple(r) for r in conn.execute(sql).fetchall())
            assert Counter(setops.combine(root, rows)) == expected, sql


def _released(dsn: str, sql: str, rows: list[tuple[int, str | None]]) -> list[tuple[float, float, str]]:
    _load(dsn, rows)
    result = sqldp.connect(dsn, Policy.from_toml(POLICY), seed=1).run(sql, epsilon=EPSILON)
    assert result.released
    return [(m.true_value or 0.0, m.noise_scale, m.mechanism) for group in result.measurements for m in group]


def test_branches_cost_at_most_epsilon_together(pg_dsn: str) -> None:
    """Two overlapping branches (a row with g = 'a' is in both) and a grouped one: the released vector of a
    database and of each neighbour with one more row, whatever its g, has exact joint loss ≤ ε."""
    sql = (
        "SELECT COUNT(*) FROM t WHERE t.g IN ('a', 'b') "
        "UNION ALL SELECT COUNT(*) FROM t WHERE t.g = 'a' "
        "UNION ALL SELECT COUNT(*) FROM t WHERE t.g IS NULL"
    )
    worst = 0.0
    for base in ([], ROWS):
        x = _released(pg_dsn, sql, list(base))
        assert [s for _, s, _ in x] == pytest.approx([3 / EPSILON] * 3)  # ε/3 each: sequential composition
        for n in rows_added({"t": list(base)}, "t", [(99, g) for g in ("a", "b", "z", None)]):
            y = _released(pg_dsn, sql, n.db["t"])
            loss = joint_loss(x, y)
            assert loss <= EPSILON + 1e-9, (base, n.change, loss)
            worst = max(worst, loss)
    assert worst == pytest.approx(2 * EPSILON / 3)  # the row in both overlapping branches


def test_a_public_branch_is_exact_and_free(session: Session) -> None:
    sql = "SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM k"
    result = session.run(sql, epsilon=EPSILON)
    (private,) = [m for group in result.measurements for m in group]
    assert private.noise_scale == pytest.approx(1 / EPSILON)  # the whole ε for the only measured branch
    assert private.true_value == 4.0
    assert result.table()[1][1] == (3,)  # the public branch's exact answer
    assert session.cost(sql, epsilon=EPSILON) == (EPSILON, 0.0)


def test_order_and_limit_apply_to_the_released_rows(session: Session) -> None:
    sql = (
        "SELECT t.g, COUNT(*) AS n FROM t WHERE t.g IN ('a', 'b', 'c') GROUP BY 1 "
        "UNION ALL SELECT k.name, 10 FROM k ORDER BY n DESC, 1 LIMIT 4"
    )
    result = session.run(sql, epsilon=EPSILON)
    columns, rows = result.table()
    assert columns == ["g", "n"]
    assert len(rows) == 4
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert [r for r in rows if r[1] == 10] == [("a", 10), ("b", 10), ("q", 10)]  # public rows, ties by name
    assert [(m.true_value, m.noise_scale) for g in result.measurements for m in g] == [
        (2.0, 1.0),
        (1.0, 1.0),
        (1.0, 1.0),
    ]  # one measured branch: full ε, parallel over its groups
    distinct = session.run(
        "SELECT COUNT(*) FROM k UNION SELECT COUNT(*) FROM k UNION SELECT COUNT(*) FROM t", epsilon=EPSILON
    )
    assert len(distinct.table()[1]) == 2  # UNION removed the repeated public row


def test_released_rows_keep_their_branch_error_bars(session: Session) -> None:
    """Each released value carries the error bar its branch gave it, under the set operation's column names;
    an exact public row has none (docs/output.md: every released value carries its own error bar)."""
    sql = (
        "SELECT t.g, COUNT(*) AS n FROM t WHERE t.g IN ('a', 'b') GROUP BY 1 "
        "UNION ALL SELECT t.g AS h, COUNT(*) AS c FROM t WHERE t.g = 'c' GROUP BY 1 "
        "UNION ALL SELECT k.name, 10 FROM k"
    )
    result = session.run(sql, epsilon=EPSILON)
    alone = session.run("SELECT t.g, COUNT(*) AS n FROM t WHERE t.g IN ('a', 'b') GROUP BY 1", epsilon=EPSILON / 2)
    (bar,) = {e["n"] for e in (r["errors"] for r in alone.rows)}
    noisy = [r for r in result.rows if r["values"]["n"] != 10]
    assert len(noisy) == 3 and all(r["errors"] == {"n": bar} for r in noisy)  # ε/2 each, the branch's own bar
    assert all("errors" not in r for r in result.rows if r["values"]["n"] == 10)
    records = result.records()
    assert {rec.get("n_error") for rec in records} == {bar, None}


def test_the_budget_is_charged_once_for_all_branches(pg_dsn: str) -> None:
    _load(pg_dsn, ROWS)
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY), budget=1.5)
    sql = "SELECT COUNT(*) FROM t UNION ALL SELECT COUNT(*) FROM t WHERE t.g = 'a'"
    session.run(sql, epsilon=1.0)
    assert session.spent == pytest.approx(1.0)
    with pytest.raises(BudgetExhaustedError):
        session.run(sql, epsilon=1.0)


@pytest.mark.parametrize(
    ("sql", "error", "why"),
    [
        ("SELECT COUNT(*) FROM t UNION SELECT COUNT(*), 1 FROM t", RefusedError, "same number of columns"),
        (
            "WITH a AS (SELECT * FROM t) SELECT COUNT(*) FROM a UNION SELECT COUNT(*) FROM t",
            RefusedError,
            "WITH around a set operation",
        ),
        ("SELECT COUNT(*) AS n FROM t UNION SELECT 1 FROM k ORDER BY n + 1", RefusedError, "must name an output"),
        ("SELECT t.g FROM t UNION SELECT k.name FROM k", ForbiddenError, "releases rows of private table"),
        # PostgreSQL's own type check of the whole statement, before any charge
        ("SELECT COUNT(*) FROM t UNION SELECT k.name FROM k", StatementError, "cannot be matched"),
    ],
)
def test_refusals(session: Session, sql: str, error: type[Exception], why: str) -> None:
    with pytest.raises(error) as refusal:
        session.prepare(sql, epsilon=EPSILON)
    assert why in str(refusal.value)


def test_explain_lists_each_branch(session: Session) -> None:
    """``sqldp explain`` of a set operation: each branch as the query it runs as, reading no data."""
    from sqldp.commands.explain import _text, explain

    out = explain(
        "SELECT COUNT(*) FROM t WHERE t.g = 'a' UNION ALL SELECT COUNT(*) FROM k", session.catalog, session.policy
    )
    first, second = out["set_operation"]["branches"]
    assert first["branch"] == "SELECT COUNT(*) FROM t WHERE t.g = 'a'" and first["analysis"]["aggregates"] == [
        "COUNT(*)"
    ]
    assert second["public"] and out["refused"] is None
    assert "Branch 2: SELECT COUNT(*) FROM k" in _text(out)


def test_the_proxy_answers_a_set_operation_charged_once(pg_dsn: str, tmp_path: Path) -> None:
    """Through the Postgres-wire proxy: the analyst's ledger is charged the statement's ε once, the rows are the
    released branches' (a noisy count, then the public table's exact count)."""
    make_tables(pg_dsn)
    policy = write_policy(tmp_path / "policy.toml", {"alice": {"epsilon_limit": 3.0}})
    with (
        ThreadedProxy(build(pg_dsn, policy)) as proxy,
        psycopg.connect(client_dsn(proxy.port), autocommit=True) as conn,
    ):
        rows = conn.execute("SELECT COUNT(*) FROM visits UNION ALL SELECT COUNT(*) FROM nation").fetchall()
    assert len(rows) == 2 and float(rows[1][0]) == 3.0 and float(rows[0][0]).is_integer()
    with psycopg.connect(pg_dsn) as conn:
        balance = ledger.balance(conn, "alice")
    assert balance is not None and float(balance.epsilon_spent) == 1.0
