"""Uncorrelated scalar subqueries as workflow steps (sqldp.strategies.workflow.Workflow; docs/subqueries.md): each
released with noise from its share of ε (sequential composition), the statement then analysed and run with the released
value as a constant. Checked against PostgreSQL's own answer to the query as written (TPC-H Q22 on SF 0.01 and
random tiny databases), the statement's total charge, and that the statement's analysis reads the released
value only — never the subquery's true one."""

from __future__ import annotations

import math
import random
from pathlib import Path

import psycopg
import pytest

import sqldp
from sqldp.errors import BudgetExhaustedError, ForbiddenError, RefusedError
from sqldp.policy import Policy
from sqldp.strategies.workflow import Workflow

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "benchmarks" / "tpch" / "queries"
ROWS_POLICY = ROOT / "benchmarks" / "tpch" / "policy_rows.toml"


# Q22 unmodified groups by SUBSTRING(c_phone FROM 1 FOR 2), whose domain is its WHERE clause's IN list
# (sqldp.groups.listed_domain; the grouped answer is checked in tests/sensitivity/test_tpch_answers.py); its
# totals over the seven country codes keep the workflow alone
Q22 = (QUERIES / "q22.sql").read_text()
Q22_TOTALS = Q22.replace("    cntrycode,\n    count(*)", "    count(*)").split("group by")[0]


def _plain(v: object) -> object:
    return v.rstrip() if isinstance(v, str) else None if v is None else float(v)  # type: ignore[arg-type]


def test_q22_unnoised_workflow_is_postgres_answer(tpch_dsn: tuple[str, dict[str, int], object]) -> None:
    """Q22's totals: its AVG(c_acctbal) is a step (SUM and COUNT, two measurements), the statement's COUNT and
    SUM two more; in audit mode the statement runs with the step's true value, and its true values are
    PostgreSQL's answer to the query as written."""
    sql = Q22_TOTALS
    session = sqldp.connect(tpch_dsn[0], policy=ROWS_POLICY, seed=3)
    prepared = session.prepare(sql, epsilon=1.0)
    assert isinstance(prepared, Workflow)
    assert prepared.shares == (0.5, 0.5) and prepared.params.epsilon == 1.0
    audit = prepared.analyze()
    assert len(audit.steps) == 1 and audit.steps[0].measurements
    with psycopg.connect(tpch_dsn[0], autocommit=True) as conn:
        ((count, total),) = conn.execute(sql).fetchall()
    truths = [m.true_value for m in audit.measurements[0]]
    assert count > 0 and truths[0] == count and math.isclose(float(truths[1]), float(total), rel_tol=1e-12)
    grouped = session.prepare(Q22)  # as written: the subquery a step, the key's groups the IN list's codes
    assert isinstance(grouped, Workflow) and len(grouped.placeholder.domains[0].values or ()) == 7


def test_q22_runs_with_both_measurements_and_one_charge(tpch_dsn: tuple[str, dict[str, int], object]) -> None:
    """The statement costs its ε once, charged before anything is read: a session budget of exactly ε is spent
    in full by one run and refuses the next before it runs; the result shows the step's measurements beside
    the statement's, their ε adding up to the statement's."""
    sql = Q22_TOTALS
    session = sqldp.connect(tpch_dsn[0], policy=ROWS_POLICY, seed=5, budget=0.8)
    assert session.cost(sql, epsilon=0.8) == (0.8, 0.0)
    result = session.run(sql, epsilon=0.8)
    assert session.spent == pytest.approx(0.8, rel=1e-12)
    out = result.to_json()
    assert out["epsilon"] == 0.8 and len(out["steps"]) == 1
    step_eps = sum(m["epsilon"] for group in out["steps"][0]["measurements"] for m in group)
    outer_eps = sum(m["epsilon"] for m in out["measurements"][0])
    assert step_eps + outer_eps == pytest.approx(0.8, rel=1e-12)
    assert any("released with ε = 0.4" in n for n in out["notes"])
    assert [c for c in result.table()[0]] == ["numcust", "totacctbal"]
    with pytest.raises(BudgetExhaustedError):
        session.run(sql, epsilon=0.8)
    assert session.spent == pytest.approx(0.8, rel=1e-12)


TINY = "CREATE TABLE t (a INT NOT NULL, g INT NOT NULL);\nCREATE TABLE pub (v INT NOT NULL);\n"
TINY_POLICY = """
[defaults]
epsilon = 1.0
[tables.t]
rows = "private"
[tables.t.columns.a]
range = [0, 9]
[tables.t.columns.g]
domain = [0, 1, 2]
[tables.pub]
rows = "public"
"""
TINY_QUERIES = [
    "SELECT COUNT(*) FROM t WHERE t.g = 2 AND t.a > (SELECT AVG(t2.a) FROM t t2 WHERE t2.g = 1)",
    "SELECT SUM(t.a) FROM t WHERE t.g < 2 AND t.a <= (SELECT AVG(t2.a) + 1 FROM t t2)",
    "SELECT COUNT(*) FROM t WHERE (SELECT SUM(t2.a) FROM t t2 WHERE t2.g = 0) > t.a * 3",
    "SELECT COUNT(*), SUM(t.a) FROM t WHERE t.a > (SELECT MIN(pub.v) FROM pub)",  # public: exact, free
]


def _tiny(dsn: str, rng: random.Random) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS t (a INT NOT NULL, g INT NOT NULL)")
        conn.execute("CREATE TABLE IF NOT EXISTS pub (v INT NOT NULL)")
        conn.execute("DELETE FROM t")
        conn.execute("DELETE FROM pub")
        for _ in range(rng.randint(1, 12)):
            conn.execute("INSERT INTO t VALUES (%s, %s)", (rng.randint(0, 9), rng.randint(0, 2)))
        for _ in range(rng.randint(1, 3)):
            conn.execute("INSERT INTO pub VALUES (%s)", (rng.randint(0, 9),))


@pytest.mark.parametrize("sql", TINY_QUERIES)
def test_unnoised_workflow_is_postgres_answer_on_random_databases(pg_dsn: str, sql: str) -> None:
    rng = random.Random(sql)
    for _ in range(6):
        _tiny(pg_dsn, rng)
        session = sqldp.connect(pg_dsn, policy=Policy.from_toml(TINY_POLICY), seed=1)
        try:
            prepared = session.prepare(sql)
            assert isinstance(prepared, Workflow)
            audit = prepared.analyze()
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                (raw,) = conn.execute(sql).fetchall()
            # an empty SUM is NULL in SQL and 0 in the measurement (both released as noise around 0)
            got = tuple(float(m.true_value or 0) for m in audit.measurements[0])
            assert got == tuple(float(v or 0) for v in raw), (sql, raw)
        finally:
            session.close()


def test_public_subquery_is_exact_free_and_allow_listed(pg_dsn: str) -> None:
    _tiny(pg_dsn, random.Random(2))
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(TINY_POLICY), seed=1)
    prepared = session.prepare(TINY_QUERIES[3], epsilon=0.6)
    assert isinstance(prepared, Workflow)
    assert prepared.shares == (0.0, 0.6) and prepared.steps[0][1].public
    result = prepared.run()
    assert result.steps[0].public and result.steps[0].released
    assert "evaluated exactly" in result.notes[0]
    # the allow-list applies to the subquery as to any public statement: nothing off it runs
    with pytest.raises(ForbiddenError):
        session.prepare("SELECT COUNT(*) FROM t WHERE t.a > (SELECT MIN(pub.v) + pg_backend_pid() FROM pub)")
    session.close()


def test_statement_analysis_reads_the_released_value_only(pg_dsn: str) -> None:
    """Two databases whose subquery values differ (rows of g = 1 only, which the statement does not count):
    with the same released value the statement's SQL and its analysis are the same — sensitivity, noise
    scale, true answer — so nothing of the subquery's true value reaches the statement but through its
    noisy release."""
    sql = TINY_QUERIES[0]
    policy = Policy.from_toml(TINY_POLICY)
    figures = []
    for ones in ((1, 1), (9, 9, 9)):
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS t (a INT NOT NULL, g INT NOT NULL)")
            conn.execute("CREATE TABLE IF NOT EXISTS pub (v INT NOT NULL)")
            conn.execute("DELETE FROM t")
            for a in (2, 5, 7, 8):
                conn.execute("INSERT INTO t VALUES (%s, 2)", (a,))
            for a in ones:
                conn.execute("INSERT INTO t VALUES (%s, 1)", (a,))
        session = sqldp.connect(pg_dsn, policy=policy, seed=1)
        prepared = session.prepare(sql)
        assert isinstance(prepared, Workflow)
        (step, _), released = prepared.steps[0], 4.5
        outer = prepared.outer(step.splice(sql, released))
        assert outer.statements is not None and "SELECT" not in outer.statements.answer.split("FROM", 1)[1]
        audit = outer.analyze()
        m = audit.measurements[0][0]
        figures.append((outer.statements.answer, m.sensitivity, m.noise_scale, m.true_value))
        session.close()
    assert figures[0] == figures[1] and figures[0][3] == 3  # a > 4.5 among 2, 5, 7, 8


def test_refusals_before_the_charge(pg_dsn: str) -> None:
    _tiny(pg_dsn, random.Random(3))
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(TINY_POLICY), seed=1, budget=1.0)
    for sql, fragment in (
        ("SELECT COUNT(*) FROM t WHERE t.a > (SELECT t2.g, AVG(t2.a) FROM t t2 GROUP BY t2.g)", "one value"),
        ("SELECT COUNT(*) FROM t WHERE t.a > (SELECT t2.a FROM t t2)", "releases rows of private table"),
    ):
        with pytest.raises((RefusedError, ForbiddenError)) as info:
            session.run(sql)
        assert fragment in info.value.message
    assert session.spent == 0
    session.close()
