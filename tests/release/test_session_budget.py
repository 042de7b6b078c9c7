"""A privacy budget in the library (sequential composition): ``sqldp.connect(..., budget=ε)`` charges each
run before it reads anything and refuses what the budget does not cover; ``cost`` previews a query's price."""

from __future__ import annotations

import psycopg
import pytest

import sqldp
from sqldp.errors import BudgetExhaustedError, InputError
from sqldp.policy import Policy

POLICY = '[defaults]\nepsilon = 0.4\n[tables.t.columns.x]\nrange = [0, 10]\n[tables.pub]\nrows = "public"\n'


def test_runs_are_charged_and_refused_past_the_budget(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); INSERT INTO t SELECT g % 11 FROM generate_series(1, 50) g")
        conn.execute("CREATE TABLE pub (y INT); INSERT INTO pub VALUES (1), (2)")
    s = sqldp.connect(pg_dsn, Policy.from_toml(POLICY), budget=1.0)
    assert s.cost("SELECT COUNT(*) FROM t") == (0.4, 0.0) and s.cost("SELECT SUM(y) FROM pub") == (0.0, 0.0)
    assert s.remaining == (1.0, None)  # previews spend nothing
    s.run("SELECT COUNT(*) FROM t")
    s.run("SELECT SUM(x) FROM t", epsilon=0.5)
    assert s.spent == pytest.approx(0.9)
    with pytest.raises(BudgetExhaustedError, match=r"costs ε = 0\.4"):
        s.run("SELECT COUNT(*) FROM t")
    assert s.spent == pytest.approx(0.9)  # a refused query is not charged
    s.run("SELECT COUNT(*) FROM t", epsilon=0.1)  # what is left still buys a cheaper query
    assert s.remaining[0] == pytest.approx(0.0, abs=1e-12)
    assert s.run("SELECT SUM(y) FROM pub").public  # public data costs nothing, even with nothing left
    unlimited = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    for _ in range(5):
        unlimited.run("SELECT COUNT(*) FROM t")
    assert unlimited.remaining == (None, None) and unlimited.spent == pytest.approx(2.0)


def test_a_bad_budget_is_a_one_line_error(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); CREATE TABLE pub (y INT)")
    with pytest.raises(InputError, match="budget must be a finite number") as err:
        sqldp.connect(pg_dsn, Policy.from_toml(POLICY), budget=float("nan"))
    assert err.value.where == "budget"
