"""The row-level analysis against independent oracles.

* Brute force on tiny random databases (real PostgreSQL): every single-row addition and removal is made,
  the true change of the query is measured, and the analysis at D and at each neighbour D′ is compared:
  (a) the derivative bound covers the change: |f(D′) − f(D)| ≤ G·max(d(D), d(D′)) — the queries are
      polynomials in the multiplicities with non-negative coefficients, so along one multiplicity they are
      increasing and convex and the mean value theorem puts the slope between the two end derivatives;
  (b) the smoothed bound is β-smooth, c(D) ≤ e^(βG)·c(D′), and covers the local sensitivity,
      |f(D′) − f(D)| ≤ G·c(D) for tables used once (the count is linear in their multiplicities) and
      ≤ G·e^(βG)·c(D) for self-joins (the derivative may rise along the step, by at most e^(βG), NR §3.3.9's
      "supremum of the derivative sensitivities at distances in [0, 1]").
* Pattern unification against the naive enumeration of all compatible pattern subsets (hypothesis).
* The water-filling smoothing against brute-force integer distributions of k (hypothesis).
* NR §4.3.4: single-table queries have sensitivity 1.
"""

from __future__ import annotations

import itertools
import math
import random

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from oracles import product_rows, row_neighbours

from sqldp import sensitivity
from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.sensitivity import smoothing
from sqldp.sensitivity.patterns import PatternMap, unify, unify_naive
from sqldp.sensitivity.rows import RowPlan
from sqldp.sensitivity.smoothing import Growth, remembering, smooth_count

DDL = "CREATE TABLE r (a INT, b INT);\nCREATE TABLE s (b INT, c INT);\nCREATE TABLE p (b INT, d INT);\n"
DOMAIN = (0, 1, 2)
POLICY = """
[tables.r]
weight = 1.0
[tables.r.columns.a]
range = [0, 2]
[tables.s]
weight = 2.0
[tables.p]
rows = "public"
"""

QUERIES = [
    ("SELECT COUNT(*) FROM r", False),
    ("SELECT COUNT(*) FROM r, s WHERE r.b = s.b", False),
    ("SELECT COUNT(*) FROM r, s WHERE r.b = s.b AND s.c = 1", False),
    ("SELECT COUNT(*) FROM r, s WHERE r.a < s.c", False),
    ("SELECT COUNT(*) FROM r, s, p WHERE r.b = s.b AND s.c = p.b", False),
    ("SELECT SUM(r.a) FROM r, s WHERE r.b = s.b", False),
    ("SELECT SUM(CASE WHEN s.c = 1 THEN 2 WHEN r.b > 0 THEN r.a END) FROM r, s WHERE r.b = s.b", False),
    # PostgreSQL's integer division: |1 − (a + 1) / 2| reaches 1 at a = 0, where real division says 0.5
    ("SELECT SUM(1 - (r.a + 1) / 2) FROM r, s WHERE r.b = s.b", False),
    ("SELECT SUM(SQRT(POWER(r.a, 2) + 1) * EXP(r.a / 4.0)) FROM r, s WHERE r.b = s.b", False),
    # SIGN, one entry of the operator table: |SIGN(a − 1) + 2·SIGN(a)| ≤ 3 over a ∈ [0, 2]
    ("SELECT SUM(SIGN(r.a - 1) + 2 * SIGN(r.a)) FROM r, s WHERE r.b = s.b", False),
    ("SELECT SUM((r.a + 1) % 2) FROM r, s WHERE r.b = s.b", False),  # MOD: 0 ≤ (a + 1) % 2 ≤ 1
    ("SELECT COUNT(*) FROM r r1, r r2 WHERE r1.b = r2.b", True),
    ("SELECT COUNT(*) FROM r r1, r r2 WHERE r1.a = r2.b", True),
    ("SELECT COUNT(*) FROM r r1, r r2, s WHERE r1.b = s.b AND r2.a = s.c", True),
    ("SELECT COUNT(*) FROM r r1, r r2, s s1, s s2 WHERE r1.a = s1.b AND r2.b = s1.c AND s2.b = r1.b", True),
    ("SELECT COUNT(*) FROM r r1, r r2 WHERE r1.a = r2.a AND r1.b = r2.b", True),
    # Q17c's shape: s's derivative counts the pairs r1.a < r2.a per key by a running count (test_rows_pairs)
    ("SELECT COUNT(*) FROM r r1, s, r r2 WHERE r1.b = s.b AND r2.b = s.b AND r1.a < r2.a", True),
]
BETAS = (0.05, 0.3, 1.5)


# the neighbours: every database one private row away, each possible row added, each present row removed
ADDED = {t: product_rows(DOMAIN, DOMAIN) for t in ("r", "s")}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_toml(POLICY)


def _plan(sql: str, catalog: Catalog, policy: Policy) -> RowPlan:
    form = normalize(parse(sql, catalog), catalog, policy)
    return sensitivity.plan(form, catalog, policy)


def _evaluate(conn: psycopg.Connection, plan: RowPlan, sql: str) -> tuple[float, dict[float, dict]]:
    value = conn.execute(sql).fetchone()[0]
    results = [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]
    return float(value or 0), {beta: plan.finish(results, beta).tables for beta in BETAS}


def _random_db(rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    def rows() -> list[tuple[int, int]]:
        return [(rng.choice(DOMAIN), rng.choice(DOMAIN)) for _ in range(rng.randint(0, 4))]

    return {"r": rows(), "s": rows(), "p": rows()}


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, int]]]) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        cols = {"r": "a, b", "s": "b, c", "p": "b, d"}[table]
        for row in rows:
            conn.execute(f"INSERT INTO {table} ({cols}) VALUES (%s, %s)", row)


@pytest.mark.parametrize(("sql", "self_join"), QUERIES)
def test_brute_force_neighbours(pg_dsn: str, catalog: Catalog, policy: Policy, sql: str, self_join: bool) -> None:
    plan = _plan(sql, catalog, policy)
    weights = {"r": 1.0, "s": 2.0}
    rng = random.Random(sql)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for _ in range(4):
            db = _random_db(rng)
            _load(conn, db)
            f0, bounds0 = _evaluate(conn, plan, sql)
            for n in row_neighbours(db, ADDED, distinct=True):  # every database one private row away
                table, op, row = n.table, n.op, n.row
                cols = "a, b" if table == "r" else "b, c"
                first = cols.split(",")[0]
                second = cols.split(",")[1].strip()
                conn.execute("BEGIN")
                if op == "add":
                    conn.execute(f"INSERT INTO {table} ({cols}) VALUES (%s, %s)", row)
                else:
                    conn.execute(
                        f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} WHERE {first} = %s "
                        f"AND {second} = %s LIMIT 1)",
                        row,
                    )
                f1, bounds1 = _evaluate(conn, plan, sql)
                conn.execute("ROLLBACK")
                change = abs(f1 - f0)
                g = weights[table]
                for beta in BETAS:
                    t0, t1 = bounds0[beta].get(table), bounds1[beta].get(table)
                    if t0 is None:  # the query does not read this table
                        assert change == 0
                        continue
                    # (a) the derivative bound (multiplicity units) covers the change along the step
                    assert change <= max(t0["derivative"], t1["derivative"]) + 1e-9, (table, op, row, db)
                    # (b) smoothness w.r.t. the neighbour, both ways, at distance G
                    c0, c1 = t0["sensitivity"], t1["sensitivity"]
                    assert c0 <= math.exp(beta * g) * c1 * (1 + 1e-9) + 1e-12, (beta, table, op, row, db)
                    assert c1 <= math.exp(beta * g) * c0 * (1 + 1e-9) + 1e-12, (beta, table, op, row, db)
                    # (b) the local sensitivity, in distance units: |Δf|/G
                    factor = math.exp(beta * g) if self_join else 1.0
                    assert change / g <= factor * c0 * (1 + 1e-9) + 1e-12, (beta, table, op, row, db)


def test_single_table_sensitivity_is_one(pg_dsn: str, catalog: Catalog, policy: Policy) -> None:
    """NR §4.3.4: a COUNT over one table has sensitivity 1 whatever the data, for every β."""
    plan = _plan("SELECT COUNT(*) FROM r WHERE a > 0 AND b < 2", catalog, policy)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute("INSERT INTO r SELECT g % 3, g % 2 FROM generate_series(1, 500) g")
        results = [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]
    for beta in (0.001, 0.1, 1.0):
        assert plan.finish(results, beta).sensitivity == 1.0


def test_weight_divides_sensitivity(catalog: Catalog) -> None:
    """G is the distance of one row: a table weighted 2 has half the per-distance sensitivity."""
    plan = _plan("SELECT COUNT(*) FROM s", catalog, Policy.from_toml(POLICY))
    assert plan.finish([], 0.1).sensitivity == 0.5


# -- pattern unification ---------------------------------------------------------------------------

COLUMNS = ("x", "y", "z")


@st.composite
def pattern_maps(draw: st.DrawFn) -> list[PatternMap]:
    maps = []
    for _ in range(draw(st.integers(1, 3))):
        cols = tuple(c for c in COLUMNS if draw(st.booleans()))
        keys = draw(st.sets(st.tuples(*(st.integers(0, 2) for _ in cols)), max_size=5))
        maps.append(PatternMap(cols, {k: float(draw(st.integers(1, 9))) for k in keys}))
    return maps


@settings(max_examples=300, deadline=None)
@given(pattern_maps())
def test_unification_matches_naive_enumeration(maps: list[PatternMap]) -> None:
    assert sorted(unify(maps)) == sorted(unify_naive(maps))


def test_unification_example_from_the_report() -> None:
    """NR §3.3.7.3: (*, 100, *) with count 5 and (1000, *, *) with count 10 unify to (1000, 100, *): 5 + 10."""
    use1 = PatternMap(("b",), {(100,): 5.0})
    use2 = PatternMap(("a",), {(1000,): 10.0})
    assert max(sum(v) for v in unify([use1, use2])) == 15.0
    # bindings that disagree never add up
    use3 = PatternMap(("a",), {(7,): 3.0, (8,): 4.0})
    use4 = PatternMap(("a",), {(7,): 6.0})
    assert sorted(unify([use3, use4])) == [(3.0, 6.0), (4.0, 0.0)]


# -- smoothing ------------------------------------------------------------------------------------


@st.composite
def growths(draw: st.DrawFn) -> Growth:
    tables = tuple(
        (float(draw(st.integers(0, 6))), draw(st.integers(1, 2)), float(draw(st.sampled_from([0.5, 1.0, 2.0]))))
        for _ in range(draw(st.integers(0, 3)))
    )
    return Growth(tables, float(draw(st.integers(1, 3))))


@settings(max_examples=200, deadline=None)
@given(growths(), st.integers(0, 20), st.sampled_from([0.2, 0.5, 1.0]))
def test_smoothing_dominates_every_integer_distribution(growth: Growth, count: int, beta: float) -> None:
    """max_k e^(−βk)·A(k) computed by water-filling is ≥ e^(−βk)·A for every integer way of adding rows."""
    count = min(float(count), growth.base())  # a count never exceeds the product of the local counts
    value, _ = smooth_count(count, growth, beta)
    assert value >= count
    budget = 8
    ranges = [range(0, int(budget / g) + 1) for _, _, g in growth.tables]
    for ks in itertools.product(*ranges):
        k = sum(g * kt for (_, _, g), kt in zip(growth.tables, ks, strict=True))
        if k > budget:
            continue
        grown = growth.public * math.prod((n + kt) ** m for (n, m, _), kt in zip(growth.tables, ks, strict=True))
        a = count + grown - growth.base()
        assert value >= math.exp(-beta * k) * a * (1 - 1e-9)


@settings(max_examples=200, deadline=None)
@given(growths(), st.integers(0, 20), st.sampled_from([0.1, 0.5]), st.integers(1, 5))
def test_smoothing_is_monotone_in_the_count(growth: Growth, count: int, beta: float, extra: int) -> None:
    low = min(float(count), growth.base())
    high = min(low + extra, growth.base())
    assert smooth_count(high, growth, beta)[0] >= smooth_count(low, growth, beta)[0] * (1 - 1e-12)


@settings(max_examples=300, deadline=None)
@given(
    st.floats(0, 1e7),
    st.integers(1, 3),
    st.sampled_from([0.5, 1.0, 2.0, 3.0]),
    st.floats(0.5, 20),
    st.one_of(st.floats(0, 1e9), st.sampled_from([0.0, 1.0, 2.0**40, math.inf])),
)
def test_one_table_level_is_the_loop_bit_for_bit(n: float, m: int, g: float, public: float, k: float) -> None:
    """The one-table water-filling level (Growth._level_one, what nearly every bisection step calls) is the
    general loop's (λ, prod, extra), float for float: the smoothed bounds are the same numbers."""
    growth = Growth(((n, m, g),), public)
    # past a double's range (n = 5e-155 makes (size/n)^m overflow) both raise, alike
    failures = []
    for level in (growth._level_one, growth._level_loop):
        try:
            level(k)
        except OverflowError:
            failures.append(level)
    assert len(failures) in (0, 2), failures
    if failures:
        return
    fast, loop = growth._level_one(k), growth._level_loop(k)
    assert [math.copysign(1.0, x) for x in fast] == [math.copysign(1.0, x) for x in loop]
    assert all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in zip(fast, loop, strict=True)), (fast, loop)
    assert growth.level(k) == fast or any(math.isnan(x) for x in fast)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(growths(), st.integers(0, 20), st.sampled_from([0.01, 0.2, 0.5, 1.0])), max_size=6))
def test_remembered_smoothing_is_the_computed_one(calls: list[tuple[Growth, int, float]]) -> None:
    """Within one release (``remembering``) each (count, growth, β) is smoothed once; every answer, the first and
    the remembered ones, with an equal growth built anew, is the very float smooth_count computes outside."""
    fresh = [smooth_count(min(float(c), g.base()), g, b) for g, c, b in calls]
    with remembering():
        for _ in range(2):
            got = [smooth_count(min(float(c), g.base()), Growth(g.tables, g.public), b) for g, c, b in calls]
            assert got == fresh


def test_smoothing_is_remembered_for_one_release_only(monkeypatch: pytest.MonkeyPatch) -> None:
    computed: list[float] = []
    real = smoothing._smooth_count

    def counting(count: float, growth: Growth, beta: float) -> tuple[float, float]:
        computed.append(count)
        return real(count, growth, beta)

    monkeypatch.setattr(smoothing, "_smooth_count", counting)
    growth = Growth(((5.0, 1, 1.0),), 1.0)
    with remembering():
        first = smooth_count(3.0, growth, 0.5)
        assert smooth_count(3.0, Growth(((5.0, 1, 1.0),), 1.0), 0.5) == first
        assert len(computed) == 1
        smooth_count(3.0, growth, 0.2)  # another β is another answer
        assert len(computed) == 2
        # 0.0 == −0.0 as dict keys, but a static count is returned as given: the sign is part of the key
        assert math.copysign(1.0, smooth_count(0.0, Growth(), 1.0)[0]) == 1.0
        assert math.copysign(1.0, smooth_count(-0.0, Growth(), 1.0)[0]) == -1.0
    computed.clear()
    smooth_count(3.0, growth, 0.5)  # the next release computes again: nothing is kept from one run's data
    assert computed == [3.0]


def test_two_uses_with_the_same_own_conjuncts_share_one_count(catalog: Catalog, policy: Policy) -> None:
    """n_j is the count of use j's rows passing its own conjuncts: two uses of one table with the same ones
    (up to the alias) read one scalar, and different ones two (the brute force above covers the numbers)."""
    same = _plan("SELECT COUNT(*) FROM r r1, s, r r2 WHERE r1.b = s.b AND r2.b = s.b AND r1.a < r2.a", catalog, policy)
    assert same.local["r1"] == same.local["r2"]
    other = _plan("SELECT COUNT(*) FROM r r1, s, r r2 WHERE r1.b = s.b AND r2.b = s.b AND r1.a > 0", catalog, policy)
    assert other.local["r1"] != other.local["r2"]
