"""The combined row-and-value sensitivity (NR §3.3.9.3) against a brute-force oracle on real PostgreSQL.

When a query reads value-sensitive columns (columns of a table's ``norm``) of tables whose rows are also
private, a neighbouring database either adds or removes one row of a row-private table T (distance G_T, the
table's ``weight``) or changes sensitive values (distance: the table norm of the change, ℓ1 over rows and
tables). sqldp bounds the derivative sensitivity in this combined metric by

    c = max(c1, max_i c2_i),  c2_i = max(c0_i, e^(−βG_i)·c3_i·c4_i, max_{j≠i} e^(−βG_j)·(c0_i + c3_i·c4_j))

(c1 row-level, c0 value-level, c3 the data-independent per-row derivative over the declared ranges, c4 the
smoothed count derivative; :mod:`sqldp.sensitivity.columns`). This module checks the result, not the
formula: on tiny random databases x it makes every single-row removal, a few single-row additions with
values inside the declared ranges, and a few small changes of one sensitive value of every row, measures the
true change of the plain query on PostgreSQL, and asserts for each neighbour x′ at distance d and each β

  (a) |f(x′) − f(x)| ≤ e^(βd)·c(x)·d and ≤ e^(βd)·c(x′)·d — Lemma 3.78 (the derivative at distance s from x
      is at most e^(βs)·c(x)) integrated along the step: along a value change the sensitive value moves
      continuously; along a row addition/removal the multiplicity moves from 0 to 1 (NR §3.3.9's "supremum
      of the derivative sensitivities at distances in [0, 1]"), which is why e^(βd) appears for rows too;
  (b) β-smoothness both ways: c(x) ≤ e^(βd)·c(x′) and c(x′) ≤ e^(βd)·c(x).

d is the length of the one-step path (G_T, or the norm of the value change); the metric's distance is at
most d and both inequalities only get weaker as d grows, so they are necessary conditions. Private filters
compare integer columns only: they become exact steps (:mod:`sqldp.sensitivity.filters`), so the analysed
continuous function equals the plain query on integer data, and every value stays inside its declared range,
so the clamped SUM that sqldp releases equals the plain SUM (both are asserted at every neighbour).

c(x) is taken from ``Session.analyze(…).to_json()["sensitivity"]`` at fixed β on every random database; at
the neighbours (hundreds per query) it is recomputed from the same plan and its queries inside a rolled-back
transaction, which the base databases show to agree with ``analyze``.

Power (mutation check): the same neighbours must refute weakened bounds — c/3, the value-level part alone
(max_i c0_i: ignores row changes), the row-level part alone (c1: ignores value changes) and the bound without
the cross terms (max(c1, max_i c0_i): c0 grows when rows are added, NR §3.3.9.3), so the test would fail if
the combination dropped either kind of change. A mutant counts as refuted only by a (neighbour, β) at which
the real bound passes every condition.

Found by this oracle (and fixed): the cross term e^(−βG_j)·(c0_i + c3_i·c4_j) with the data-dependent c0_i
was not β-smooth under row additions — c0_i grows additively when a row is added to T_i (the new row's
derivative) or to T_j (c3_i per new joined row), which the factor e^(βG) does not cover when β is small. sqldp
now uses c3_i·c4_i in its place in combined mode; the smallest counterexamples are kept as regression tests
(COUNTEREXAMPLES).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from oracles import row_neighbours, value_set
from pg_support import create_database, drop_database

import sqldp
from sqldp.policy import Policy
from sqldp.sensitivity.columns import ColumnPlan
from sqldp.session import Session

DDL = """
CREATE TABLE t (id INT PRIMARY KEY, k INT, a INT, x NUMERIC(6,2));
CREATE TABLE u (id INT PRIMARY KEY, k INT, b INT);
"""
POLICY = """
[tables.t]
rows = "private"
weight = 1.0
norm = "l1(0.5*a, x)"
[tables.t.columns.a]
range = [0, 4]
[tables.t.columns.x]
range = [0, 3]

[tables.u]
rows = "private"
weight = 2.0
norm = "l1(b)"
[tables.u.columns.b]
range = [0, 3]
"""
G = {"t": 1.0, "u": 2.0}  # the policy's weights: distance of one row
NORM_WEIGHT = {("t", "a"): 0.5, ("t", "x"): 1.0, ("u", "b"): 1.0}  # l1 norms: distance = weight·|Δ|
RANGE = {("t", "a"): (0, 4), ("t", "x"): (0, 3), ("u", "b"): (0, 3)}
KEYS = (0, 1, 2)
BETAS = (0.01, 0.1, 1.0)  # points of columns.BETA_GRID, so the plan's grid and a fixed-β analyze agree
EPSILON = 10.0  # generalized Cauchy needs β < ε/5; the sensitivity does not depend on ε
DATABASES = 4
ADDITIONS = 4  # per table and database
CHANGES = 2  # per row and database

MUTANTS = ("third", "values_only", "rows_only", "no_cross_terms")

# (query, the mutants its neighbours must refute)
QUERIES: list[tuple[str, frozenset[str]]] = [
    # a global bound max(c1, c3·c4) (columns._data_independent): c0 is not computed for it, so the mutant
    # max(c0, c1) is c1, the rows-only mutant, which one table's neighbours do not refute
    ("SELECT COUNT(*) FROM t WHERE t.a >= 2", frozenset({"third", "values_only"})),
    ("SELECT SUM(t.x) FROM t WHERE t.k <> 0", frozenset({"third", "values_only"})),
    ("SELECT SUM(t.a) FROM t WHERE t.a <= 3 AND t.k < 2", frozenset({"third", "rows_only"})),
    ("SELECT COUNT(*) FROM u WHERE u.b >= 2", frozenset({"third", "rows_only"})),
    # c3·c4 in place of c0 (see the docstring) leaves this one's bound ≥ 3× every observed change
    ("SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.a > u.b", frozenset({"values_only", "no_cross_terms"})),
    ("SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.a >= 2", frozenset({"values_only", "no_cross_terms"})),
    ("SELECT SUM(t.x) FROM t, u WHERE t.k = u.k AND u.b >= 1", frozenset({"third", "values_only"})),
    ("SELECT SUM(u.b) FROM t, u WHERE t.k = u.k AND t.a < 3", frozenset({"values_only", "no_cross_terms"})),
    ("SELECT SUM(t.x * u.b) FROM t, u WHERE t.k = u.k AND t.k > 0", frozenset({"third", "values_only"})),
    # self-joins: one row fills several uses (c3 sums them, c4 counts the product rows in any position)
    ("SELECT COUNT(*) FROM t t1, t t2 WHERE t1.k = t2.k AND t1.a > t2.a", frozenset({"values_only", "no_cross_terms"})),
    ("SELECT SUM(t1.x) FROM t t1, t t2 WHERE t1.k = t2.k AND t2.a >= 2", frozenset({"values_only"})),
    (
        "SELECT SUM(t1.x * t2.x) FROM t t1, t t2, u WHERE t1.k = t2.k AND t2.k = u.k AND u.b >= 1",
        frozenset({"values_only"}),
    ),
    # EXP, SQRT and powers: the row-level part bounds them by intervals, the value part by NR Table 10
    ("SELECT SUM(SQRT(POWER(t.x, 2) + POWER(t.a, 2))) FROM t WHERE t.k <> 0", frozenset({"third", "values_only"})),
    ("SELECT SUM(EXP(t.x / 200.0) * u.b) FROM t, u WHERE t.k = u.k", frozenset({"third", "values_only"})),
]

Db = dict[str, list[tuple[Any, ...]]]  # t: (id, k, a, x), u: (id, k, b)

# (query, x, the statement making x′, d(x, x′)): at β = 0.1 the former bound had c(x′) > e^(βd)·c(x)
COUNTEREXAMPLES = [
    # x: t = ∅, u = {(0, k=0, b=0)}; x′ adds t(1, k=0, a=2, x=0): c(x) = 6.0239, c(x′) = 8.2949 > e^0.1·c(x) = 6.657
    (
        "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.a >= 2",
        {"t": [], "u": [(0, 0, 0)]},
        "INSERT INTO t VALUES (1, 0, 2, 0)",
        G["t"],
    ),
    # x: t = {(0, k=0, a=2, x=0)}, u = ∅; x′ adds u(0, k=0, b=0): c(x) = 6.6574, c(x′) = 8.2949 > e^0.2·c(x) = 8.131
    (
        "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.a >= 2",
        {"t": [(0, 0, 2, Decimal(0))], "u": []},
        "INSERT INTO u VALUES (0, 0, 0)",
        G["u"],
    ),
]


@dataclass(frozen=True)
class Neighbour:
    """One step away from x: a statement that makes x′ (rolled back afterwards) and its length d."""

    what: str
    statement: str
    params: tuple[Any, ...]
    dist: float
    kind: str  # "row" or "value"


@dataclass(frozen=True)
class State:
    """f and the bound's parts at one database, per β."""

    f: float
    bounds: dict[float, dict[str, float]]  # β → {"c", "c0", "c1", "no_cross"}


# -- random databases and their neighbours ------------------------------------------------------------


def _cents(rng: random.Random) -> Decimal:
    lo, hi = RANGE[("t", "x")]
    return Decimal(rng.choice([lo * 100, hi * 100, rng.randint(lo * 100, hi * 100)])) / 100


def _t_row(rng: random.Random, rid: int) -> tuple[Any, ...]:
    return (rid, rng.choice(KEYS), rng.randint(*RANGE[("t", "a")]), _cents(rng))


def _u_row(rng: random.Random, rid: int) -> tuple[Any, ...]:
    return (rid, rng.choice(KEYS), rng.randint(*RANGE[("u", "b")]))


def _random_db(rng: random.Random) -> Db:
    return {
        "t": [_t_row(rng, i) for i in range(rng.randint(1, 6))],
        "u": [_u_row(rng, i) for i in range(rng.randint(1, 6))],
    }


def _load(conn: psycopg.Connection, db: Db) -> None:
    conn.execute("TRUNCATE t, u")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s)", db["t"])
        cur.executemany("INSERT INTO u VALUES (%s, %s, %s)", db["u"])


def _changed(rng: random.Random, table: str, column: str, old: Any) -> Any:
    """A small change of one sensitive value that stays inside the declared range (never 0)."""
    lo, hi = RANGE[(table, column)]
    steps = [Decimal("0.01"), Decimal("0.25"), Decimal(1)] if column == "x" else [1, 2]
    for _ in range(20):
        new = old + rng.choice([-1, 1]) * rng.choice(steps)
        if lo <= new <= hi:
            return new
    return lo if old != lo else hi


def _neighbours(db: Db, rng: random.Random) -> Iterator[Neighbour]:
    """Per table: each row removed, ADDITIONS random rows added, and CHANGES random changes of a sensitive value
    of each row (drawn in that order: the same neighbours for a seed)."""
    for table, cols in (("t", "id, k, a, x"), ("u", "id, k, b")):
        make = _t_row if table == "t" else _u_row
        added = [make(rng, 100 + j) for j in range(ADDITIONS)]
        for n in row_neighbours(db, {table: added}, G):
            if n.op == "remove":
                yield Neighbour(n.change, f"DELETE FROM {table} WHERE id = %s", (n.row[0],), n.distance, "row")
            else:
                marks = ", ".join(["%s"] * len(n.row))
                statement = f"INSERT INTO {table} ({cols}) VALUES ({marks})"
                yield Neighbour(n.change, statement, n.row, n.distance, "row")
        sensitive = ("a", "x") if table == "t" else ("b",)
        position = {"a": 2, "x": 3, "b": 2}
        for i, row in enumerate(db[table]):
            for _ in range(CHANGES):
                column = rng.choice(sensitive)
                new = _changed(rng, table, column, row[position[column]])
                n = value_set(db, table, i, position[column], new, NORM_WEIGHT[(table, column)])
                statement = f"UPDATE {table} SET {column} = %s WHERE id = %s"
                yield Neighbour(f"{table}.{column}: {n.change}", statement, (new, row[0]), n.distance, "value")


# -- the analysis at one database -----------------------------------------------------------------------


def _scalar(conn: psycopg.Connection, sql: str) -> float:
    row = conn.execute(sql).fetchone()
    return float(row[0]) if row is not None and row[0] is not None else 0.0  # SUM of nothing is 0


@dataclass(frozen=True)
class Compiled:
    """sqldp's plan for one query and its SQL, generated once (sqlglot generation dominates otherwise)."""

    sql: str
    plan: ColumnPlan
    answer: str  # the released aggregate's query
    queries: tuple[str, ...]  # the plan's sensitivity queries

    @classmethod
    def of(cls, session: Session, sql: str) -> Compiled:
        prepared = session.prepare(sql, epsilon=EPSILON)  # β free: the plan evaluates columns.BETA_GRID
        plan = prepared.plans[0]
        assert isinstance(plan, ColumnPlan) and plan.row_plan is not None  # the combined path (§3.3.9.3)
        assert prepared.statements is not None
        queries = tuple(q.sql(dialect="postgres") for q in plan.queries)
        return cls(sql, plan, prepared.statements.source.sql(dialect="postgres"), queries)


def _state(conn: psycopg.Connection, q: Compiled) -> State:
    """f(x) by the plain query, and c(x) with its parts from sqldp's plan, on the connection's snapshot."""
    f = _scalar(conn, q.sql)
    released = _scalar(conn, q.answer)
    assert abs(released - f) <= 1e-9 * max(1.0, abs(f)), (q.sql, released, f)  # q_m = the plain query here
    at = q.plan.bind([conn.execute(s).fetchall() for s in q.queries])
    bounds: dict[float, dict[str, float]] = {}
    for beta in BETAS:
        b = at(beta)
        c0 = max((v["value_sensitivity"] for v in b.tables.values() if "value_sensitivity" in v), default=0.0)
        c1 = max((v["rows"]["sensitivity"] for v in b.tables.values() if "rows" in v), default=0.0)
        bounds[beta] = {"c": b.sensitivity, "c0": c0, "c1": c1, "no_cross": max(c0, c1)}
    return State(f, bounds)


MUTANT_BOUND: dict[str, Callable[[dict[str, float]], float]] = {
    "third": lambda b: b["c"] / 3,
    "values_only": lambda b: b["c0"],
    "rows_only": lambda b: b["c1"],
    "no_cross_terms": lambda b: b["no_cross"],
}


def _violations(c_x: float, c_y: float, change: float, d: float, beta: float, f_scale: float) -> dict[str, str]:
    """The oracle's conditions that a pair of bounds c(x), c(x′) breaks for a step of length d: "change" for
    (a), "smooth" for (b)."""
    grow = math.exp(beta * d)
    slack = 1e-9 * max(1.0, f_scale)
    out: dict[str, str] = {}
    if change > grow * min(c_x, c_y) * d + slack:
        out["change"] = f"|Δf| = {change:g} > e^(βd)·d·min(c(x), c(x′)) = {grow * min(c_x, c_y) * d:g}"
    if max(c_x, c_y) > grow * min(c_x, c_y) * (1 + 1e-9) + 1e-12:
        out["smooth"] = f"c(x) = {c_x:g}, c(x′) = {c_y:g}: ratio > e^(βd) = {grow:g}"
    return out


@dataclass
class Report:
    """What the oracle found for one query."""

    checked: dict[str, int] = field(default_factory=lambda: {"row": 0, "value": 0})
    failures: dict[str, list[str]] = field(default_factory=dict)  # "change" / "smooth_row" / "smooth_value"
    killed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MUTANTS, 0))


def _oracle(conn: psycopg.Connection, session: Session, sql: str) -> Report:
    """Every neighbour of DATABASES random databases, every β: the bound's violations and the mutants'."""
    compiled = Compiled.of(session, sql)
    rng = random.Random(sql)
    report = Report()
    for _ in range(DATABASES):
        db = _random_db(rng)
        _load(conn, db)
        base = _state(conn, compiled)
        for beta in BETAS:  # c(x) end to end agrees with the plan evaluated on the connection
            c = session.analyze(sql, epsilon=EPSILON, beta=beta).to_json()["sensitivity"]
            assert c == pytest.approx(base.bounds[beta]["c"], rel=1e-9, abs=1e-12), (sql, beta, db)
        for nb in _neighbours(db, rng):
            conn.execute("BEGIN")
            conn.execute(nb.statement, nb.params)
            other = _state(conn, compiled)
            conn.execute("ROLLBACK")
            report.checked[nb.kind] += 1
            change = abs(other.f - base.f)
            scale = max(abs(base.f), abs(other.f))
            for beta in BETAS:
                bx, by = base.bounds[beta], other.bounds[beta]
                found = _violations(bx["c"], by["c"], change, nb.dist, beta, scale)
                for cond, text in found.items():
                    key = cond if cond == "change" else f"smooth_{nb.kind}"
                    report.failures.setdefault(key, []).append(f"β={beta}, d={nb.dist:g}, x′ = x {nb.what}: {text}")
                    report.failures[key][-1] += f"; x = {db}"
                if found:
                    continue  # a mutant counts as refuted only where the real bound passes
                for m in MUTANTS:
                    if _violations(MUTANT_BOUND[m](bx), MUTANT_BOUND[m](by), change, nb.dist, beta, scale):
                        report.killed[m] += 1
    return report


@pytest.fixture(scope="module")
def oracle_db(pg_server_dsn: str) -> Iterator[tuple[psycopg.Connection, Session]]:
    """One database for the module: the schema, a connection for the neighbours and an sqldp session on it."""
    dsn = create_database(pg_server_dsn, "sqldp_combined")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
            yield conn, sqldp.connect(dsn, policy=Policy.from_toml(POLICY), seed=1)
    finally:
        drop_database(pg_server_dsn, dsn)


@pytest.fixture(scope="module")
def oracle(oracle_db: tuple[psycopg.Connection, Session]) -> Callable[[str], Report]:
    """The oracle's report per query, computed once and shared by the tests that read it."""
    reports: dict[str, Report] = {}

    def report(sql: str) -> Report:
        if sql not in reports:
            reports[sql] = _oracle(*oracle_db, sql)
        return reports[sql]

    return report


@pytest.mark.parametrize(("sql", "must_kill"), QUERIES)
def test_combined_bound_covers_every_neighbour(
    oracle: Callable[[str], Report], sql: str, must_kill: frozenset[str]
) -> None:
    """(a) for every neighbour, rows and values, and (b) for value changes; the mutants are refuted."""
    report = oracle(sql)
    assert report.checked["row"] >= DATABASES * 2 * ADDITIONS and report.checked["value"] >= DATABASES * CHANGES
    for cond in ("change", "smooth_value"):
        found = report.failures.get(cond, [])
        assert not found, f"{sql}: {len(found)} violations of {cond}, first: {found[0]}"
    missed = sorted(m for m in must_kill if report.killed[m] == 0)
    assert not missed, f"{sql}: no neighbour refutes {missed} ({report.killed})"


def test_every_mutant_is_refuted_somewhere() -> None:
    assert set().union(*(kill for _, kill in QUERIES)) == set(MUTANTS)


@pytest.mark.parametrize("sql", [q for q, _ in QUERIES])
def test_combined_bound_is_smooth_under_row_changes(oracle: Callable[[str], Report], sql: str) -> None:
    """(b) for row additions and removals: c(x) ≤ e^(βG)·c(x′) both ways."""
    found = oracle(sql).failures.get("smooth_row", [])
    assert not found, f"{sql}: {len(found)} violations, first: {found[0]}"


@pytest.mark.parametrize(("sql", "db", "statement", "d"), COUNTEREXAMPLES)
def test_cross_term_counterexamples(
    oracle_db: tuple[psycopg.Connection, Session], sql: str, db: Db, statement: str, d: float
) -> None:
    """The smallest databases where the former combined bound was not β-smooth (β = 0.1)."""
    conn, session = oracle_db
    compiled = Compiled.of(session, sql)
    _load(conn, db)
    c_x = _state(conn, compiled).bounds[0.1]["c"]
    conn.execute("BEGIN")
    conn.execute(statement)
    c_y = _state(conn, compiled).bounds[0.1]["c"]
    conn.execute("ROLLBACK")
    assert c_y <= math.exp(0.1 * d) * c_x * (1 + 1e-9), (c_x, c_y)
