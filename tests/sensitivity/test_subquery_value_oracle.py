"""Subqueries under value-level privacy (EXISTS, NOT EXISTS, IN, NOT IN, correlated scalar subqueries;
sqldp.sensitivity.columns, docs/subqueries.md "Under value-level privacy") against brute force.

On tiny random databases (real PostgreSQL; the tables r, s, p of test_subquery_oracle, whose keys b are public
and whose r.a and s.c are in the norms) every VALUE neighbour is made — each row's sensitive value changed to
every other value of the small domain, at the distance the declared norm gives (s's norm weighs c twice) —
and, for a table whose rows are private too (NR §3.3.9: r and s, or s alone, the subquery's table), every row
added and removed (distance G). For each:

* the SQL sqldp runs equals PostgreSQL's answer to the query as written, on the database and its neighbour;
* PostgreSQL's own change of the answer (ℓ1 over the groups) is within the bound scaled by the distance,
  |Δf| ≤ e^(β·d)·c(x)·d (NR Lemma 3.78: c is a β-smooth bound on the derivative of the released function's
  continuous extension, and a step of one grain moves an indicator by at most 1);
* the bound is β-smooth: c(x′) ≤ e^(β·d)·c(x) both ways.

Mutants the test kills: the subquery term without its per-key count of outer rows (one flipped outer row per
changed inner row, where a changed value of s flips every outer row with its key), and the plan without the
outer comparison's own step (Q17's shape: a changed outer value flips its own row).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterator

import psycopg
import pytest
from oracles import Neighbour, product_rows, row_neighbours, values_changed
from test_rows_oracle import _load, _random_db  # the same tiny tables r, s, p over DOMAIN
from test_subquery_oracle import DDL, DOMAIN, _l1, _values

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.sensitivity import columns
from sqldp.sensitivity.columns import ColumnPlan
from sqldp.strategies.aggregate import compile_form

NORM_WEIGHT = {"r": 1.0, "s": 2.0}  # the distance of a unit change of r.a, of s.c
ROW_WEIGHT = {"r": 1.0, "s": 2.0}  # G, when rows are private
BETAS = (0.05, 0.3, 1.5)


def _privacy(rows: str) -> dict[str, str]:
    """Whose rows are private: none, both r and s, or only s (the subquery's table: then only D's term covers
    an added row, NR §3.3.9)."""
    return {"r": "private" if rows == "private" else "public", "s": "public" if rows == "public" else "private"}


def _policy(rows: str) -> Policy:
    privacy = _privacy(rows)
    weights = {t: f"weight = {g}\n" if privacy[t] == "private" else "" for t, g in ROW_WEIGHT.items()}
    return Policy.from_toml(
        f"""
[tables.r]
rows = "{privacy["r"]}"
{weights["r"]}norm = "l1(a)"
[tables.r.columns.a]
range = [0, 2]
domain = [0, 1, 2]
[tables.r.columns.b]
domain = [0, 1, 2]
[tables.s]
rows = "{privacy["s"]}"
{weights["s"]}norm = "l1(2*c)"
[tables.s.columns.c]
range = [0, 2]
[tables.p]
rows = "public"
"""
    )


QUERIES = [
    # EXISTS (Q4): a step of s.c inside flips every r row with s's key
    "SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c > 0)",
    # NOT EXISTS (Q21's l3): an anti-join, not monotone
    "SELECT COUNT(*) FROM r WHERE NOT EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c >= 1)",
    # IN and NOT IN (Q16's shape) over a step of s.c
    "SELECT COUNT(*) FROM r WHERE r.b IN (SELECT s.b FROM s WHERE s.c = 2)",
    "SELECT COUNT(*) FROM r WHERE r.b NOT IN (SELECT s.b FROM s WHERE s.c < 2)",
    # the outer query's own values: a SUM of r.a and a private filter on r.a, beside the subquery's step
    "SELECT SUM(r.a) FROM r WHERE r.a > 0 AND EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c > 0)",
    # the subquery's table is the outer's (Q21): r read outside and inside, the terms add
    "SELECT COUNT(*) FROM r r1, p WHERE r1.b = p.b AND r1.a > 0 "
    "AND NOT EXISTS (SELECT * FROM r r2 WHERE r2.b = r1.b AND r2.a > 1)",
    # uncorrelated: a step of s.c decides every outer row
    "SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.c = 2)",
    # a subquery whose conditions read no sensitive value (Q21's l2): D does not move with the values
    "SELECT SUM(r.a) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b)",
    # GROUP BY a public key: one ℓ1 bound over the groups (a row of D flips outer rows of any group)
    "SELECT r.b, COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b AND s.c > 0) GROUP BY r.b",
]

# correlated scalar subqueries: the per-key value moves with s.c (or r.a, Q17), the comparison with the outer
# row's own r.a is a step of that row
SCALAR_QUERIES = [
    "SELECT COUNT(*) FROM r WHERE r.a < (SELECT AVG(s.c) FROM s WHERE s.b = r.b)",
    "SELECT SUM(r.a) FROM r WHERE (SELECT MAX(s.c) FROM s WHERE s.b = r.b AND s.c < 2) >= r.a",
    # Q17: the subquery's table is the outer's
    "SELECT SUM(r1.a) FROM r r1 WHERE r1.a < (SELECT 0.8 * AVG(r2.a) FROM r r2 WHERE r2.b = r1.b)",
    "SELECT r.b, COUNT(*) FROM r WHERE r.a = (SELECT MIN(s.c) FROM s WHERE s.b = r.b) GROUP BY r.b",
]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)


Db = dict[str, list[tuple[int, int]]]


def _neighbours(db: Db, private: dict[str, str]) -> Iterator[Neighbour]:
    """Every value neighbour (r.a or s.c of one row set to each other value of DOMAIN, distance weight·|Δ|), and
    for a table with private rows every row added or removed (distance G)."""
    shifts = sorted({v - w for v in DOMAIN for w in DOMAIN} - {0})
    for table, position in (("r", 0), ("s", 1)):
        yield from values_changed(db, table, {position: NORM_WEIGHT[table]}, shifts, within=lambda _, v: v in DOMAIN)
        if private[table] == "private":
            yield from row_neighbours(db, {table: product_rows(DOMAIN, DOMAIN)}, ROW_WEIGHT)


def _violations(
    sql: str, catalog: Catalog, rows: str, dsn: str, rounds: int = 2, given: tuple[Db, ...] = ()
) -> list[str]:
    """Everything the oracle finds wrong for ``sql`` (empty: nothing) on the ``given`` databases and ``rounds``
    random ones."""
    policy = _policy(rows)
    form = normalize(parse(sql, catalog), catalog, policy)
    assert form.semijoins, "the subquery became a semi-join"
    _, plans, statements = compile_form(form, catalog, policy, None)
    (plan,) = plans
    assert isinstance(plan, ColumnPlan) and not plan.key_moves  # the value-level analysis, ℓ1 over groups
    answer = statements.source.sql(dialect="postgres")
    found: list[str] = []
    rng = random.Random(f"{sql}/{rows}")
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)

        def evaluate(db: Db) -> tuple[dict[object, float], dict[float, float]]:
            _load(conn, db)
            truth, ours = _values(conn, sql), _values(conn, answer)
            if _l1(truth, ours) > 1e-9:
                found.append(f"{db}: sqldp's SQL {ours} differs from PostgreSQL's {truth}")
            results = [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]
            return truth, {beta: plan.finish(results, beta).sensitivity for beta in BETAS}

        moved = 0
        for db in (*given, *(_random_db(rng) for _ in range(rounds))):
            f0, c0 = evaluate(db)
            for n in _neighbours(db, _privacy(rows)):
                other, dist, what = n.db, n.distance, n.change
                f1, c1 = evaluate(other)
                change = _l1(f0, f1)
                moved += change > 0
                for beta in BETAS:
                    grow = math.exp(beta * dist)
                    if change > grow * c0[beta] * dist * (1 + 1e-9) + 1e-9:
                        found.append(
                            f"{db}, {what}: β = {beta}: |Δf| = {change} > e^(βd)·c·d, c = {c0[beta]}, d = {dist}"
                        )
                    if (
                        c1[beta] > grow * c0[beta] * (1 + 1e-9) + 1e-12
                        or c0[beta] > grow * c1[beta] * (1 + 1e-9) + 1e-12
                    ):
                        found.append(f"{db}, {what}: β = {beta}: not smooth: {c0[beta]} vs {c1[beta]} at d = {dist}")
        assert moved, "no neighbour moved the answer: the databases test nothing"
    return found


# keys shared by several rows of r and of s, values at both ends of the domain: the steps cross here
RICH = {"r": [(0, 0), (1, 0), (2, 1), (1, 1)], "s": [(0, 0), (1, 1), (2, 0)], "p": [(0, 0), (1, 1)]}


@pytest.mark.parametrize("rows", ["public", "private", "inner"])
@pytest.mark.parametrize("sql", QUERIES + SCALAR_QUERIES)
def test_brute_force_value_neighbours(pg_dsn: str, catalog: Catalog, sql: str, rows: str) -> None:
    assert _violations(sql, catalog, rows, pg_dsn, given=(RICH,)) == []


def test_mutant_without_the_per_key_count_fails(pg_dsn: str, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three rows of r share key 0; moving s's one row of key 0 from c = 0 to c = 1 (distance 2) makes EXISTS
    true for all three: |Δf| = 3 > e^(2β)·c·2 once c counts one outer row per key (c = 1/2) instead of three."""
    monkeypatch.setattr(columns, "_outer_rows", lambda counts, term: 1.0)
    given = ({"r": [(0, 0), (1, 0), (2, 0)], "s": [(0, 0)], "p": []},)
    found = _violations(QUERIES[0], catalog, "public", pg_dsn, rounds=0, given=given)
    assert any("|Δf|" in f for f in found), found


def test_mutant_without_the_outer_step_fails(pg_dsn: str, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """r.a < AVG(s.c) per key: moving one outer r.a across its key's average flips that row alone, which only the
    outer comparison's own step bounds (s does not move). A plan without it is caught."""
    original = columns._subquery_steps

    def without_outer(scope: object, agg: object) -> tuple:
        return tuple(dataclasses.replace(st, outer=frozenset()) for st in original(scope, agg))  # type: ignore[arg-type]

    monkeypatch.setattr(columns, "_subquery_steps", without_outer)
    given = ({"r": [(0, 0), (2, 1)], "s": [(0, 1), (2, 0)], "p": []},)
    found = _violations(SCALAR_QUERIES[0], catalog, "public", pg_dsn, rounds=0, given=given)
    assert any("|Δf|" in f for f in found), found


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        # a key compared with a sensitive value: a changed value moves a row of s to another key
        ("SELECT COUNT(*) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.c = r.b)", "reads value-sensitive"),
        ("SELECT COUNT(*) FROM r WHERE r.a IN (SELECT s.b FROM s)", "reads value-sensitive"),
        ("SELECT COUNT(*) FROM r WHERE r.b = (SELECT MAX(s.b) FROM s WHERE s.c = r.b)", "reads value-sensitive"),
        ("SELECT MIN(r.a) FROM r WHERE EXISTS (SELECT * FROM s WHERE s.b = r.b)", "COUNT and SUM"),
    ],
)
def test_refused_with_the_reason(catalog: Catalog, sql: str, why: str) -> None:
    policy = _policy("public")
    form = normalize(parse(sql, catalog), catalog, policy)
    with pytest.raises(RefusedError, match=why):
        compile_form(form, catalog, policy, None)
