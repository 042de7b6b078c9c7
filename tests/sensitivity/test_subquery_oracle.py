"""Semi-joins and anti-joins (EXISTS, NOT EXISTS, IN, NOT IN; sqldp.subqueries) against brute force.

On tiny random databases (real PostgreSQL) every single-row addition and removal of a private table is made,
and for each:

* the SQL sqldp runs (the answer query, with the derived table D = SELECT DISTINCT keys) equals PostgreSQL's
  answer to the query as written, on the database and on every neighbour;
* the released function's change is covered by the bound as in test_rows_oracle: (a) the derivative at the
  smaller of the two databases, (b) β-smoothness both ways at distance G, and the local sensitivity
  |Δf|/G ≤ c(D);
* mutants fail: D without DISTINCT (the join then counts an outer row once per matching inner row) and the
  plan without the anti-join's term (a removed inner row can add outer rows).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random

import psycopg
import pytest
from oracles import product_rows, row_neighbours
from sqlglot import exp
from test_rows_oracle import _load, _random_db  # the same tiny tables r, s, p over DOMAIN

from sqldp import sensitivity, subqueries
from sqldp.catalog import Catalog
from sqldp.form import AnalysisForm, Conjunct, single_aggregate
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.sensitivity.rows import semi_form
from sqldp.strategies import aggregate
from sqldp.strategies.aggregate import compile_form

DDL = (
    "CREATE TABLE IF NOT EXISTS r (a INT NOT NULL, b INT NOT NULL);\n"
    "CREATE TABLE IF NOT EXISTS s (b INT NOT NULL, c INT NOT NULL);\n"
    "CREATE TABLE IF NOT EXISTS p (b INT NOT NULL, d INT NOT NULL);\n"
)
COLS = {"r": ("a", "b"), "s": ("b", "c"), "p": ("b", "d")}
DOMAIN = (0, 1, 2)
POLICY = """
[tables.r]
weight = 1.0
[tables.r.columns.a]
range = [0, 2]
domain = [0, 1, 2]
[tables.s]
weight = 2.0
[tables.p]
rows = "public"
"""
WEIGHTS = {"r": 1.0, "s": 2.0}
BETAS = (0.05, 0.3, 1.5)

QUERIES = [
    # EXISTS (Q4): a join with SELECT DISTINCT s.b
    "SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b)",
    "SELECT COUNT(*) FROM r, p WHERE r.a = p.b AND EXISTS (SELECT 1 FROM s WHERE s.b = r.b AND s.c > 0)",
    # a correlation that is not an equality (Q21's l2.l_suppkey <> l1.l_suppkey): EXISTS over D
    "SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c <> r.a)",
    # the subquery's table is also the outer's (Q21's lineitem l1, l2, l3): the two terms add
    "SELECT COUNT(*) FROM r r1 WHERE EXISTS (SELECT * FROM r r2 WHERE r2.b = r1.b AND r2.a <> r1.a)",
    "SELECT COUNT(*) FROM r r1, s WHERE r1.b = s.b AND EXISTS (SELECT * FROM r r2 WHERE r2.b = r1.b AND r2.a <> r1.a)"
    " AND NOT EXISTS (SELECT * FROM r r3 WHERE r3.b = r1.b AND r3.a <> r1.a AND r3.a > 0)",
    "SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.c = 2)",  # uncorrelated
    # NOT EXISTS: an anti-join
    "SELECT COUNT(*) FROM r WHERE NOT EXISTS (SELECT * FROM s WHERE s.b = r.b)",
    "SELECT COUNT(*) FROM r, s WHERE r.b = s.b AND NOT EXISTS (SELECT * FROM s s2 WHERE s2.c = r.a AND s2.b <> s.c)",
    # IN (Q16, Q18, Q20): EXISTS with k = x
    "SELECT COUNT(*) FROM r WHERE r.a IN (SELECT s.c FROM s WHERE s.b > 0)",
    "SELECT COUNT(*) FROM r, s WHERE r.b = s.b AND r.a IN (SELECT s2.c FROM s s2)",
    "SELECT COUNT(*) FROM r WHERE r.b IN (SELECT p.b FROM p WHERE p.d > 0)",  # public subquery
    # NOT IN over NOT NULL columns: NOT EXISTS with k = x
    "SELECT COUNT(*) FROM r WHERE r.a NOT IN (SELECT s.c FROM s)",
    "SELECT SUM(r.a) FROM r WHERE r.b NOT IN (SELECT s.b FROM s WHERE s.c = 1)",
    "SELECT SUM(r.a + 1) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c = r.a)",
    # GROUP BY: one ℓ1 bound over the groups (a row of D flips outer rows of any group)
    "SELECT r.a, COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b) GROUP BY r.a",
    "SELECT r.a, COUNT(*) FROM r WHERE r.b NOT IN (SELECT s.c FROM s) GROUP BY r.a",
]


# the neighbours: every database one private row away, each possible row added, each present row removed
ADDED = {t: product_rows(DOMAIN, DOMAIN) for t in ("r", "s")}


# correlated scalar subqueries (TPC-H Q17, Q20's inner SUM): a join with D grouped by the correlation keys, whose
# per-key value can flip the comparison of every outer row with that key (sqldp.subqueries.scalar_join)
SCALAR_QUERIES = [
    "SELECT COUNT(*) FROM r WHERE r.a < (SELECT AVG(s.c) FROM s WHERE s.b = r.b)",
    "SELECT SUM(r.a) FROM r WHERE (SELECT 0.5 * MAX(s.c) FROM s WHERE s.b = r.b AND s.c > 0) >= r.a",
    "SELECT COUNT(*) FROM r, p WHERE r.b = p.b AND p.d > (SELECT SUM(s.c) - 1 FROM s WHERE s.b = p.d)",
    # Q17: the subquery's table is also the outer's; the two terms add
    "SELECT SUM(r1.a) FROM r r1 WHERE r1.a < (SELECT 0.8 * AVG(r2.a) FROM r r2 WHERE r2.b = r1.b)",
    "SELECT COUNT(*) FROM r r1 WHERE r1.a < (SELECT AVG(r2.a) FROM r r2 WHERE r2.b = r1.b)",
    "SELECT COUNT(*) FROM r r1 WHERE r1.a <> (SELECT MIN(r2.a) FROM r r2 WHERE r2.b = r1.a)",
    "SELECT r.a, COUNT(*) FROM r WHERE r.a = (SELECT MAX(s.c) FROM s WHERE s.b = r.b) GROUP BY r.a",
]


# IN over a grouped subquery with HAVING (TPC-H Q18): a join with D grouped by the key, compared on the group's
# aggregate (sqldp.subqueries.grouped_in); a changed row moves its key's aggregate only
GROUPED_QUERIES = [
    "SELECT COUNT(*) FROM r WHERE r.b IN (SELECT s.b FROM s GROUP BY s.b HAVING SUM(s.c) > 1)",
    "SELECT SUM(r.a) FROM r WHERE r.a IN (SELECT s.c FROM s WHERE s.b > 0 GROUP BY s.c HAVING MAX(s.b) >= 2)",
    # Q18: the subquery's table is also the outer's; the two terms add
    "SELECT r.a, COUNT(*) FROM r WHERE r.b IN (SELECT r2.b FROM r r2 GROUP BY r2.b HAVING SUM(r2.a) > 2) GROUP BY r.a",
    "SELECT COUNT(*) FROM r WHERE r.b IN (SELECT s.b FROM s GROUP BY s.b)",  # no HAVING: the plain IN
]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_toml(POLICY)


def _values(conn: psycopg.Connection, sql: str) -> dict[object, float]:
    """Group → value (one group, None, without GROUP BY); a group with no rows is 0."""
    out: dict[object, float] = {}
    for row in conn.execute(sql).fetchall():
        key = row[0] if len(row) > 1 else None
        out[key] = float(row[-1] or 0)
    return out


def _l1(x: dict[object, float], y: dict[object, float]) -> float:
    return sum(abs(x.get(k, 0.0) - y.get(k, 0.0)) for k in set(x) | set(y))


def _violations(
    sql: str,
    catalog: Catalog,
    policy: Policy,
    dsn: str,
    rounds: int = 4,
    given: tuple[dict[str, list[tuple[int, int]]], ...] = (),
) -> list[str]:
    """Everything the oracle finds wrong with sqldp's semi-join for ``sql`` (empty: nothing), on ``rounds``
    random databases after the ``given`` ones."""
    form = normalize(parse(sql, catalog), catalog, policy)
    assert not isinstance(form, type(None)) and form.semijoins, "the subquery became a semi-join"
    _, plans, statements = compile_form(form, catalog, policy, None)
    (plan,) = plans
    answer = statements.source.sql(dialect="postgres")
    found: list[str] = []
    rng = random.Random(sql)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)

        def evaluate() -> tuple[dict[object, float], dict[float, dict]]:
            truth, ours = _values(conn, sql), _values(conn, answer)
            if _l1(truth, ours) > 1e-9:
                found.append(f"sqldp's SQL {ours} differs from PostgreSQL's {truth}")
            results = [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]
            # the released function is the SQL sqldp runs: its changes are what the bound must cover
            return ours, {beta: plan.finish(results, beta).tables for beta in BETAS}

        for db in (*given, *(_random_db(rng) for _ in range(rounds))):
            _load(conn, db)
            f0, bounds0 = evaluate()
            for n in row_neighbours(db, ADDED, distinct=True):  # every database one private row away
                table, op, row = n.table, n.op, n.row
                first, second = COLS[table]
                conn.execute("BEGIN")
                if op == "add":
                    conn.execute(f"INSERT INTO {table} ({first}, {second}) VALUES (%s, %s)", row)
                else:
                    conn.execute(
                        f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} WHERE {first} = %s "
                        f"AND {second} = %s LIMIT 1)",
                        row,
                    )
                f1, bounds1 = evaluate()
                conn.execute("ROLLBACK")
                change = _l1(f0, f1)
                g = WEIGHTS[table]
                where = (table, op, row, db)
                for beta in BETAS:
                    t0, t1 = bounds0[beta].get(table), bounds1[beta].get(table)
                    if t0 is None or t1 is None:
                        if change:
                            found.append(f"{where}: changed by {change}, the plan does not read {table}")
                        continue
                    if change > max(t0["derivative"], t1["derivative"]) + 1e-9:
                        found.append(f"{where}: change {change} > derivative {t0['derivative']}, {t1['derivative']}")
                    c0, c1 = t0["sensitivity"], t1["sensitivity"]
                    if (
                        c0 > math.exp(beta * g) * c1 * (1 + 1e-9) + 1e-12
                        or c1 > math.exp(beta * g) * c0 * (1 + 1e-9) + 1e-12
                    ):
                        found.append(f"{where}: β = {beta} not smooth: {c0} vs {c1}")
                    if change / g > c0 * (1 + 1e-9) + 1e-12:
                        found.append(f"{where}: β = {beta}: local sensitivity {change / g} > bound {c0}")
    return found


@pytest.mark.parametrize("sql", QUERIES)
def test_brute_force_neighbours(pg_dsn: str, catalog: Catalog, policy: Policy, sql: str) -> None:
    assert _violations(sql, catalog, policy, pg_dsn) == []


@pytest.mark.parametrize("sql", SCALAR_QUERIES)
def test_brute_force_neighbours_scalar(pg_dsn: str, catalog: Catalog, policy: Policy, sql: str) -> None:
    assert _violations(sql, catalog, policy, pg_dsn) == []


@pytest.mark.parametrize("sql", GROUPED_QUERIES)
def test_brute_force_neighbours_grouped(pg_dsn: str, catalog: Catalog, policy: Policy, sql: str) -> None:
    assert _violations(sql, catalog, policy, pg_dsn) == []


def test_mutant_without_grouped_term_fails(
    pg_dsn: str, catalog: Catalog, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: the plan without the grouped derived table's term (as if s were read by nothing): a row of s
    moves its key's SUM across the HAVING threshold and flips every outer row of that key."""
    plan_rows = sensitivity.plan_rows

    def without_term(form: AnalysisForm, catalog: Catalog, policy: Policy) -> sensitivity.RowPlan:
        kept = tuple(s for s in form.semijoins if not s.scalar)
        return plan_rows(dataclasses.replace(form, semijoins=kept), catalog, policy)

    monkeypatch.setattr(sensitivity, "plan_rows", without_term)
    found = _violations(GROUPED_QUERIES[0], catalog, policy, pg_dsn, rounds=2)
    assert any("the plan does not read s" in f for f in found), found


@pytest.mark.parametrize("index", [0, 4])
def test_mutant_without_scalar_term_fails(
    pg_dsn: str, catalog: Catalog, policy: Policy, monkeypatch: pytest.MonkeyPatch, index: int
) -> None:
    """A changed row of the subquery's table moves its key's value, which flips the comparison of every outer
    row with that key. A plan without the derived table's per-key term is caught: where s is read inside only,
    the plan no longer reads s; in Q17's shape (r inside and outside) its bound covers only the outer row a
    change adds, and a row moving its key's average past several others exceeds it."""
    plan_rows = sensitivity.plan_rows

    def without_term(form: AnalysisForm, catalog: Catalog, policy: Policy) -> sensitivity.RowPlan:
        kept = tuple(s for s in form.semijoins if not s.scalar)
        return plan_rows(dataclasses.replace(form, semijoins=kept), catalog, policy)

    monkeypatch.setattr(sensitivity, "plan_rows", without_term)
    # r1.a < AVG(r2.a) per b: adding (2, 0) to two rows (1, 0) lifts their key's average from 1 to 4/3, so both
    # pass at once — a change of 2 where the outer row's own term allows 1
    given = ({"r": [(1, 0), (1, 0), (2, 1)], "s": [(0, 0)], "p": []},)
    found = _violations(SCALAR_QUERIES[index], catalog, policy, pg_dsn, rounds=2, given=given)
    assert any("the plan does not read s" in f or "local sensitivity" in f or "derivative" in f for f in found), found


def test_mutant_without_distinct_fails(
    pg_dsn: str, catalog: Catalog, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The semi-join counts an outer row once (EXISTS, or a join with the set D): joined with the subquery's
    table itself, without DISTINCT, an outer row is counted once per matching inner row — a different answer,
    and a change by an outer row larger than its bound."""
    original = aggregate.answer_query

    def bag_join(form: AnalysisForm) -> exp.Select:
        for s in form.semijoins:
            inner = tuple(Conjunct(e, frozenset(), False) for e in s.inner)
            joined = semi_form(form, s)
            form = dataclasses.replace(joined, conjuncts=(*joined.conjuncts, *inner))
        return original(form)

    monkeypatch.setattr(aggregate, "answer_query", bag_join)
    found = _violations(QUERIES[0], catalog, policy, pg_dsn)
    assert any("differs from PostgreSQL" in f for f in found)
    assert any("local sensitivity" in f or "derivative" in f for f in found)


def test_mutant_without_antijoin_term_fails(
    pg_dsn: str, catalog: Catalog, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NOT EXISTS is not monotone: removing a row of s adds rows of r. A plan that drops the anti-join's term
    (as if s were read by nothing) is caught."""
    monkeypatch.setattr(
        subqueries,
        "private_tables",
        lambda form, policy: frozenset(s.use.table for s in form.semijoins if not s.anti),
    )
    for sql in (QUERIES[6], QUERIES[11]):
        found = _violations(sql, catalog, policy, pg_dsn, rounds=2)
        assert any("the plan does not read s" in f for f in found), sql


def test_plans_of_semijoins_are_row_level(catalog: Catalog, policy: Policy) -> None:
    """The terms: D's derivative counts r's rows per pattern (data-dependent), s alone is bounded by 1."""
    form = normalize(parse(QUERIES[0], catalog), catalog, policy)
    plan = sensitivity.plan(single_aggregate(form, 0), catalog, policy)
    assert not plan.data_independent and not plan.disjoint_groups
    outer_only = dataclasses.replace(form, semijoins=())
    assert sensitivity.plan(outer_only, catalog, policy).data_independent


# -- the schema's global bound (NR §3.3.13) ---------------------------------------------------------------

KEYED = (
    "CREATE TABLE IF NOT EXISTS o (k INT PRIMARY KEY, g INT NOT NULL);\n"
    "CREATE TABLE IF NOT EXISTS l (k INT NOT NULL, n INT NOT NULL, PRIMARY KEY (k, n));\n"
)
KEYED_POLICY = "[tables.o]\nweight = 1.0\n[tables.l]\nweight = 1.0\n"
KEYED_QUERIES = [
    "SELECT COUNT(*) FROM o WHERE EXISTS (SELECT * FROM l WHERE l.k = o.k AND l.n > 0)",
    "SELECT COUNT(*) FROM o WHERE NOT EXISTS (SELECT * FROM l WHERE l.k = o.k)",
    "SELECT COUNT(*) FROM o WHERE o.k IN (SELECT l.k FROM l WHERE l.n <> 1)",
    "SELECT COUNT(*) FROM o WHERE o.g NOT IN (SELECT l.n FROM l WHERE l.k = o.k)",
    # o read inside and outside: 1 for its own row + 1 for the row of D it changes (NR §3.3.13.9)
    "SELECT COUNT(*) FROM o WHERE NOT EXISTS (SELECT * FROM o o2 WHERE o2.g = o.k AND o2.k <> o.k)",
]


@pytest.mark.parametrize("sql", KEYED_QUERIES)
def test_global_bound_brute_force(pg_dsn: str, sql: str) -> None:
    """With keys PostgreSQL enforces, the bound holds on every database: |Δf| ≤ bound over every key-respecting
    neighbour of random tiny databases, with one bound for all of them."""
    from sqldp.sensitivity.global_bound import GlobalPlan

    catalog = dataclasses.replace(Catalog.from_ddl(KEYED), enforced=True)
    policy = Policy.from_toml(KEYED_POLICY)
    form = normalize(parse(sql, catalog), catalog, policy)
    plan = sensitivity.plan(form, catalog, policy)
    assert isinstance(plan, GlobalPlan), sql
    # o's key bounds every term by 1; the last query reads o inside and outside: 1 + 1
    assert plan.bound == (2 if "o o2" in sql else 1), plan.terms
    cols = {"o": ("k", "g"), "l": ("k", "n")}
    rng = random.Random(sql)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(KEYED)
        for _ in range(6):
            db = {
                "o": {(k, rng.choice(DOMAIN)) for k in DOMAIN if rng.random() < 0.6},
                "l": {(k, n) for k in DOMAIN for n in DOMAIN if rng.random() < 0.4},
            }
            for table, rows in db.items():
                conn.execute(f"DELETE FROM {table}")
                for row in rows:
                    conn.execute(f"INSERT INTO {table} ({', '.join(cols[table])}) VALUES (%s, %s)", row)
            f0 = _values(conn, sql)
            for table, rows in db.items():
                keys = {r[0] for r in rows} if table == "o" else set(rows)
                adds = [r for r in itertools.product(DOMAIN, DOMAIN) if (r[0] if table == "o" else r) not in keys]
                for op, row in [*(("add", r) for r in adds), *(("remove", r) for r in sorted(rows))]:
                    conn.execute("BEGIN")
                    a, b = cols[table]
                    if op == "add":
                        conn.execute(f"INSERT INTO {table} ({a}, {b}) VALUES (%s, %s)", row)
                    else:
                        conn.execute(f"DELETE FROM {table} WHERE {a} = %s AND {b} = %s", row)
                    change = _l1(f0, _values(conn, sql))
                    conn.execute("ROLLBACK")
                    assert change <= plan.bound + 1e-9, (sql, table, op, row, db, plan.terms)
