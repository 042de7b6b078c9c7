"""COUNT(DISTINCT x) under value-level privacy (TPC-H Q16 under ``tpch``) against a brute-force oracle on
PostgreSQL.

x reads no column of any norm; the private filters and the group key on a value-sensitive INTEGER column are
exact steps (sqldp.sensitivity.columns.check_distinct and _integer_key have the proof: C_g = Σ_v min(1, max
over the rows with x = v of m(r)·s(r)) is the released count on every database and its derivatives are
dominated by COUNT's, so COUNT's combined bound, NR §3.3.9.3, is used). On tiny random databases of Q16's
shape (part, partsupp, supplier, every table with private rows, part with a norm on p_size) the oracle makes
every row removal, a few row additions and changes of every p_size by one and two grid steps, and asserts for
each neighbour x′ at distance d and each β, with c the plan's bound:

  (a) per group, |C_g(x′) − C_g(x)| ≤ e^(βd)·d·min(c(x), c(x′)) (NR Lemma 3.78 integrated along the step,
      as in test_combined_oracle);
  (b) over the groups, Σ_g |ΔC_g| ≤ k·e^(βd)·d·min(c(x), c(x′)), k = 2 when a key moves rows between groups,
      else 1 (sqldp.release.histogram_factor: the dilated histogram's ℓ1 sensitivity);
  (c) c(x) ≤ e^(βd)·c(x′) both ways (β-smooth);
  (d) the un-noised answer sqldp computes is PostgreSQL's COUNT(DISTINCT) in every group.

Power: on the same neighbours, the bound with the ramps replaced by indicators (no slope for the filter and
the key: the row-level part c1 alone, histogram factor 1) is refuted by the p_size changes, and a released
Σ r in place of Σ max r (COUNT(x), not COUNT(DISTINCT x)) differs from the answer on some database. The
norm weighs p_size by 0.1, so one grid step of p_size is a distance of 0.1 and the value part dominates.

The release of these is not global (part's rows join partsupp's without a key bound), so the smooth bound's
conditions are checked. Over one table the combined bound is global and the release Laplace at c/ε, whose
exact privacy loss |f − f′|·ε/c must stay ≤ ε·d on every neighbour (p_size and ps_availqty changes too).
Refusals stay for x inside a norm and for filters that are not exact steps."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from oracles import row_neighbours, values_changed
from pg_support import create_database, drop_database

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.release import histogram_factor
from sqldp.result import GLOBAL
from sqldp.sensitivity.columns import ColumnPlan
from sqldp.session import Session

DDL = """
CREATE TABLE part (p_partkey INT PRIMARY KEY, p_brand TEXT NOT NULL, p_size INT NOT NULL,
                   p_retailprice NUMERIC(6,2) NOT NULL);
CREATE TABLE partsupp (ps_partkey INT, ps_suppkey INT, ps_availqty INT NOT NULL,
                       PRIMARY KEY (ps_partkey, ps_suppkey));
CREATE TABLE supplier (s_suppkey INT PRIMARY KEY, s_comment TEXT NOT NULL);
"""
P_SIZE_WEIGHT = 0.1
POLICY = f"""
[tables.part]
rows = "private"
norm = "l1({P_SIZE_WEIGHT}*p_size, 0.01*p_retailprice)"
[tables.part.columns.p_size]
range = [1, 4]
domain = [1, 2, 3, 4]
[tables.part.columns.p_retailprice]
range = [0, 10]
[tables.part.columns.p_brand]
domain = ["a", "b"]
[tables.partsupp]
rows = "private"
norm = "l1(ps_availqty)"
[tables.partsupp.columns.ps_availqty]
range = [0, 3]
[tables.supplier]
rows = "private"
"""
BRANDS = ("a", "b")
SIZES = (1, 2, 3, 4)
SUPPLIERS = (1, 2, 3)
BETAS = (0.01, 0.1, 1.0)  # points of columns.BETA_GRID
EPSILON = 10.0
DATABASES = 4
ADDITIONS = 3  # per table and database

Q16 = (
    "SELECT p_brand, p_size, COUNT(DISTINCT ps_suppkey) FROM partsupp, part WHERE p_partkey = ps_partkey "
    "AND p_size IN (2, 3, 4) AND ps_suppkey NOT IN (SELECT s_suppkey FROM supplier WHERE s_comment LIKE '%C%') "
    "GROUP BY p_brand, p_size"
)
QUERIES = [
    Q16,
    "SELECT COUNT(DISTINCT ps_suppkey) FROM partsupp, part WHERE p_partkey = ps_partkey AND p_size >= 3",
    "SELECT p_size, COUNT(DISTINCT ps_suppkey) FROM partsupp, part WHERE p_partkey = ps_partkey GROUP BY p_size",
    # the key on an INTEGER column of the norm (columns._integer_key) serves COUNT and SUM as well
    "SELECT p_size, COUNT(*) FROM partsupp, part WHERE p_partkey = ps_partkey GROUP BY p_size",
    "SELECT p_brand, p_size, SUM(ps_availqty) FROM partsupp, part WHERE p_partkey = ps_partkey "
    "GROUP BY p_brand, p_size",
]
DISTINCT = "COUNT(DISTINCT "

Db = dict[str, list[tuple[Any, ...]]]
Answer = dict[tuple[Any, ...], float]


@dataclass(frozen=True)
class Compiled:
    """sqldp's plan for one query, its released answer's SQL and the plan's queries, generated once."""

    sql: str
    plan: ColumnPlan
    answer: str
    queries: tuple[str, ...]
    keys: int  # group key columns in the answer's rows

    @classmethod
    def of(cls, session: Session, sql: str) -> Compiled:
        prepared = session.prepare(sql, epsilon=EPSILON)
        plan = prepared.plans[0]
        assert isinstance(plan, ColumnPlan) and plan.row_plan is not None  # combined (NR §3.3.9.3)
        assert plan.aggregate.distinct == (DISTINCT in sql)  # the released aggregate is the distinct count
        assert prepared.statements is not None
        queries = tuple(q.sql(dialect="postgres") for q in plan.queries)
        keys = len(prepared.form.group_by)  # type: ignore[union-attr]
        return cls(sql, plan, prepared.statements.source.sql(dialect="postgres"), queries, keys)


@dataclass(frozen=True)
class State:
    distinct: Answer  # PostgreSQL's answer per group (missing: 0): the distinct count, or COUNT/SUM
    summed: Answer  # Σ r: the same rows counted without DISTINCT (the mutant's released function)
    bounds: dict[float, tuple[float, float]]  # β → (c, c1)


def _answer(conn: psycopg.Connection, sql: str, keys: int) -> Answer:
    return {tuple(row[:keys]): float(row[keys] or 0) for row in conn.execute(sql).fetchall()}


def _state(conn: psycopg.Connection, q: Compiled) -> State:
    plain = _answer(conn, q.sql, q.keys)
    released = {k: v for k, v in _answer(conn, q.answer, q.keys).items() if v}
    assert released == {k: v for k, v in plain.items() if v}, (q.sql, released, plain)  # (d)
    summed = _answer(conn, q.sql.replace(DISTINCT, "COUNT("), q.keys)
    at = q.plan.bind([conn.execute(s).fetchall() for s in q.queries])
    bounds = {}
    for beta in BETAS:
        b = at(beta)
        c1 = max((v["rows"]["sensitivity"] for v in b.tables.values() if "rows" in v), default=0.0)
        bounds[beta] = (b.sensitivity, c1)
    return State(plain, summed, bounds)


def _random_db(rng: random.Random) -> Db:
    parts = [(i, rng.choice(BRANDS), rng.choice(SIZES), rng.randint(0, 1000) / 100) for i in range(rng.randint(1, 4))]
    ps = {(p[0], s) for p in parts for s in SUPPLIERS if rng.random() < 0.6}
    return {
        "part": parts,
        "partsupp": [(p, s, rng.randint(0, 3)) for p, s in sorted(ps)],
        "supplier": [(s, rng.choice(["ok", "Complaint"])) for s in SUPPLIERS if rng.random() < 0.5],
    }


# two parts of one group (brand a, size 3) share supplier 1: Σ r counts it twice, the distinct count once; a
# move of one part's p_size to 2 or 4 leaves supplier 1 in group 3 and adds it to the other group
SHARED: Db = {
    "part": [(0, "a", 3, 5.0), (1, "a", 3, 7.5), (2, "b", 2, 1.0)],
    "partsupp": [(0, 1, 1), (0, 2, 0), (1, 1, 3), (2, 3, 2)],
    "supplier": [(2, "ok"), (3, "Complaint")],
}


def _load(conn: psycopg.Connection, db: Db) -> None:
    conn.execute("TRUNCATE part, partsupp, supplier")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO part VALUES (%s, %s, %s, %s)", db["part"])
        cur.executemany("INSERT INTO partsupp VALUES (%s, %s, %s)", db["partsupp"])
        cur.executemany("INSERT INTO supplier VALUES (%s, %s)", db["supplier"])


@dataclass(frozen=True)
class Neighbour:
    what: str
    statement: str
    params: tuple[Any, ...]
    dist: float
    kind: str  # "row" or "value"


def _neighbours(db: Db, rng: random.Random) -> Iterator[Neighbour]:
    """The statements that make each neighbour: a row of each table removed, random parts and partsupp rows
    and every absent supplier added, and p_size or ps_availqty moved by one or two grid steps in its range."""
    keys = [p[0] for p in db["part"]]
    taken = {r[:2] for r in db["partsupp"]}
    free = [(k, s) for k in keys for s in SUPPLIERS if (k, s) not in taken]
    added: dict[str, list[tuple[Any, ...]]] = {"part": [], "partsupp": []}
    for j in range(ADDITIONS):
        added["part"].append((100 + j, rng.choice(BRANDS), rng.choice(SIZES), 1.0))
        if free:
            added["partsupp"].append((*rng.choice(free), 0))
    added["supplier"] = [(s, "Complaint") for s in SUPPLIERS if s not in {x[0] for x in db["supplier"]}]
    inserts = {
        "part": "INSERT INTO part VALUES (%s, %s, %s, %s)",
        "partsupp": "INSERT INTO partsupp VALUES (%s, %s, %s)",
        "supplier": "INSERT INTO supplier VALUES (%s, %s)",
    }
    deletes = {
        "part": ("DELETE FROM part WHERE p_partkey = %s", 1),
        "partsupp": ("DELETE FROM partsupp WHERE ps_partkey = %s AND ps_suppkey = %s", 2),
        "supplier": ("DELETE FROM supplier WHERE s_suppkey = %s", 1),
    }
    for n in row_neighbours(db, added):
        if n.op == "remove":
            statement, width = deletes[n.table]
            yield Neighbour(n.change, statement, tuple(n.row[:width]), n.distance, "row")
        else:
            yield Neighbour(n.change, inserts[n.table], tuple(n.row), n.distance, "row")
    # one and two grid steps of p_size (weight P_SIZE_WEIGHT) and of ps_availqty (weight 1), inside their ranges
    for n in values_changed(db, "part", {2: P_SIZE_WEIGHT}, (-2, -1, 1, 2), within=lambda _, v: v in SIZES):
        (old,), (new,) = n.removed["part"], n.added["part"]
        statement = "UPDATE part SET p_size = %s WHERE p_partkey = %s"
        yield Neighbour(n.change, statement, (new[2], old[0]), n.distance, "value")
    for n in values_changed(db, "partsupp", {2: 1.0}, (-2, -1, 1, 2), within=lambda _, v: 0 <= v <= 3):
        (old,), (new,) = n.removed["partsupp"], n.added["partsupp"]
        statement = "UPDATE partsupp SET ps_availqty = %s WHERE ps_partkey = %s AND ps_suppkey = %s"
        yield Neighbour(n.change, statement, (new[2], *old[:2]), n.distance, "value")


def _changes(x: Answer, y: Answer) -> list[float]:
    return [abs(x.get(k, 0.0) - y.get(k, 0.0)) for k in x.keys() | y.keys()]


@dataclass
class Report:
    checked: dict[str, int]
    failures: list[str]
    indicator_refuted: int = 0  # neighbours refuting c1 with factor 1 (ramps as indicators)
    sum_differs: int = 0  # databases where Σ r ≠ the distinct count in some group


def _oracle(conn: psycopg.Connection, session: Session, sql: str) -> Report:
    q = Compiled.of(session, sql)
    factor = histogram_factor(q.plan)
    rng = random.Random(sql)
    report = Report({"row": 0, "value": 0}, [])
    for i in range(DATABASES):
        db = SHARED if i == 0 else _random_db(rng)
        _load(conn, db)
        base = _state(conn, q)
        report.sum_differs += base.summed != base.distinct
        # the plan agrees with analyze, which shows a grouped answer's histogram sensitivity (release.dilated)
        c = session.analyze(sql, epsilon=EPSILON, beta=0.1).to_json()["sensitivity"]
        assert c == pytest.approx((factor if q.keys else 1) * base.bounds[0.1][0], rel=1e-9), (sql, db)
        for nb in _neighbours(db, rng):
            conn.execute("BEGIN")
            conn.execute(nb.statement, nb.params)
            other = _state(conn, q)
            conn.execute("ROLLBACK")
            report.checked[nb.kind] += 1
            changes = _changes(base.distinct, other.distinct)
            worst, l1 = max(changes, default=0.0), sum(changes)
            for beta in BETAS:
                (cx, c1x), (cy, c1y) = base.bounds[beta], other.bounds[beta]
                grow = math.exp(beta * nb.dist)
                limit = grow * nb.dist * min(cx, cy)
                where = f"{sql}, β={beta}, x′ = x {nb.what}, x = {db}"
                if worst > limit + 1e-9:
                    report.failures.append(f"(a) max |ΔC_g| = {worst} > {limit}: {where}")
                if l1 > factor * limit + 1e-9:
                    report.failures.append(f"(b) Σ|ΔC_g| = {l1} > {factor}·{limit}: {where}")
                if max(cx, cy) > grow * min(cx, cy) * (1 + 1e-9):
                    report.failures.append(f"(c) c(x) = {cx}, c(x′) = {cy}: {where}")
                if l1 > grow * nb.dist * min(c1x, c1y) + 1e-9:
                    report.indicator_refuted += 1
    return report


@pytest.fixture(scope="module")
def oracle_db(pg_server_dsn: str) -> Iterator[tuple[psycopg.Connection, Session]]:
    dsn = create_database(pg_server_dsn, "sqldp_distinct_value")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
            yield conn, sqldp.connect(dsn, policy=Policy.from_toml(POLICY), seed=1)
    finally:
        drop_database(pg_server_dsn, dsn)


@pytest.mark.parametrize("sql", QUERIES)
def test_distinct_count_bound_covers_every_neighbour(oracle_db: tuple[psycopg.Connection, Session], sql: str) -> None:
    report = _oracle(*oracle_db, sql)
    assert report.checked["row"] >= DATABASES * 3 and report.checked["value"] >= DATABASES, report.checked
    assert not report.failures, f"{len(report.failures)} violations, first: {report.failures[0]}"
    # power: the ramps as indicators (the row part alone) miss the p_size changes
    assert report.indicator_refuted > 0
    if sql == Q16:  # and the released function must be the distinct count, not Σ r, which differs here
        assert report.sum_differs > 0


def test_q16_group_key_moves_rows(oracle_db: tuple[psycopg.Connection, Session]) -> None:
    """GROUP BY p_size (in the norm) moves a row between groups: not disjoint, histogram factor 2."""
    plan = Compiled.of(oracle_db[1], Q16).plan
    assert plan.key_moves and not plan.disjoint_groups and histogram_factor(plan) == 2
    assert not plan.data_independent


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        # x in a norm: a distinct count of a sensitive value jumps when it crosses another
        (
            "SELECT COUNT(DISTINCT p_size) FROM part WHERE p_brand = 'a'",
            "COUNT(DISTINCT …) over value-sensitive columns is not a continuous function of them",
        ),
        (
            "SELECT COUNT(DISTINCT p_size + ps_suppkey) FROM part, partsupp WHERE p_partkey = ps_partkey",
            "COUNT(DISTINCT …) over value-sensitive columns is not a continuous function of them",
        ),
        # p_retailprice's ramp (NUMERIC(6, 2) over a range of 10) is wider than its 0.01 grid: not exact
        (
            "SELECT COUNT(DISTINCT ps_suppkey) FROM part, partsupp WHERE p_partkey = ps_partkey AND p_retailprice > 5",
            "needs every private filter to be an exact step",
        ),
    ],
)
def test_refusals(oracle_db: tuple[psycopg.Connection, Session], sql: str, reason: str) -> None:
    with pytest.raises(RefusedError, match=reason.replace("(", r"\(").replace(")", r"\)")):
        oracle_db[1].prepare(sql, epsilon=EPSILON)


# single tables: c1, c4 and c3 are data-independent, so the release is Laplace at c/ε (columns._data_independent)
# (query, whether the ramps-as-indicators bound c1 is below c): c = max(c1, c3·c4)
GLOBAL_QUERIES = [
    ("SELECT COUNT(DISTINCT ps_suppkey) FROM partsupp WHERE ps_availqty >= 2", False),  # c = max(1, 1·1)
    ("SELECT COUNT(DISTINCT p_brand) FROM part WHERE p_size IN (2, 3)", True),  # c = max(1, 1/0.1): one step is 0.1
]


@pytest.mark.parametrize(("sql", "value_part_dominates"), GLOBAL_QUERIES)
def test_global_distinct_release_loses_at_most_epsilon_d(
    oracle_db: tuple[psycopg.Connection, Session], sql: str, value_part_dominates: bool
) -> None:
    """Laplace at c/ε around f and f′ loses exactly |f − f′|·ε/c (the scale is the same on every database):
    at most ε·d on every neighbour. The ramps as indicators (c1 alone) lose more somewhere, and so would a
    released Σ r (COUNT without DISTINCT) where two rows share a value."""
    conn, session = oracle_db
    q = Compiled.of(session, sql)
    assert q.plan.data_independent
    rng = random.Random(sql)
    bound = None
    refuted = sum_differs = checked = 0
    for i in range(DATABASES):
        db = SHARED if i == 0 else _random_db(rng)
        _load(conn, db)
        base = _state(conn, q)
        sum_differs += base.summed != base.distinct
        m = session.analyze(sql, epsilon=1.0).measurements[0][0]
        c, c1 = base.bounds[BETAS[0]]
        assert m.mechanism == GLOBAL and m.noise_scale == pytest.approx(c, rel=1e-12), (sql, m)
        bound = c if bound is None else bound
        assert c == bound, (sql, db)
        for nb in _neighbours(db, rng):
            conn.execute("BEGIN")
            conn.execute(nb.statement, nb.params)
            other = _state(conn, q)
            conn.execute("ROLLBACK")
            assert other.bounds[BETAS[0]][0] == bound, (sql, db, nb.what)
            change = max(_changes(base.distinct, other.distinct), default=0.0)
            assert change / bound <= nb.dist * (1 + 1e-9), (sql, db, nb.what, change, bound)  # loss / ε
            checked += 1
            refuted += change / c1 > nb.dist * (1 + 1e-9)
    assert checked > 20 and sum_differs > 0, (checked, sum_differs)
    assert (refuted > 0) == value_part_dominates, refuted
