"""Brute-force privacy oracle for the global (Laplace) release of combined row-and-value bounds, the ramps
that replace fine-grid private filters, and the factoring of OR branches' shared conjuncts.

* ``sqldp.sensitivity.columns._data_independent``: when c1 and c4 are global (every derivative counts public
  rows only), no subquery term and no group key on a sensitive value, c = max(c1, max_i c3_i·c4_i) is a
  global sensitivity and the release adds Laplace noise of scale c/ε. Two Laplace distributions of the same
  scale b centred at f and f′ differ by a privacy loss of exactly |f − f′|/b (sup over z of |ln p − ln p′|), so
  the oracle asserts |f(x′) − f(x)|·ε/c ≤ ε·d(x, x′) for every neighbour x′ — every row removed, rows added
  (values on and off the lattices), and every row's sensitive values moved by steps of the type's grid and
  larger, some off the lattice — with f the released function (the answer statement run in the neighbour's
  snapshot) and c recomputed there from the plan's own queries: it must be the same number on every
  database (data independence is what makes the scale releasable and the loss formula exact).
* ``sqldp.sensitivity.filters.ramp_width``: q NUMERIC(6, 2) in [0, 50] gets a ramp of width 0.8 (NR's sigmoid
  slope), x NUMERIC(6, 2) in [0, 0.1] the exact step of its grid (a sigmoid or a 0.8 ramp would be wider
  than its whole range). On databases whose q are integers the released function is the plain query's.
* ``sqldp.normalize.factor_or``: the join t.k = c.id repeated in both OR branches becomes a conjunct, so c4 = 1
  and the release is global; the released function equals the plain query's on the lattice data.

Mutants the neighbours refute (each must lose more than ε·d at some neighbour where the real bound does not):
``third`` (c/3), ``rows_only`` (c1: ignores value changes), ``values_only`` (max c3·c4: ignores additions and
removals). ``test_a_data_dependent_c4_is_not_released_globally`` kills the mutant that takes the global path
whenever the release is combined (``_data_independent`` returning True): on a join of two row-private tables
c4 reads private rows, and the scale it would give moves between neighbours.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from oracles import row_neighbours, values_changed
from pg_support import create_database, drop_database

import sqldp
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.sensitivity.columns import ColumnPlan
from sqldp.session import Session

EPSILON = 1.0
DDL = """
CREATE TABLE t (id INT PRIMARY KEY, k INT, q NUMERIC(6,2), x NUMERIC(6,2));
CREATE TABLE c (id INT PRIMARY KEY, g INT);
CREATE TABLE u (id INT PRIMARY KEY, k INT, b INT);
"""
POLICY = """
[tables.t]
rows = "private"
weight = 1.0
norm = "l1(q, 20*x)"
[tables.t.columns.q]
range = [0, 50]
[tables.t.columns.x]
range = [0, 0.1]

[tables.c]
rows = "public"

[tables.u]
rows = "private"
weight = 1.0
norm = "l1(b)"
[tables.u.columns.b]
range = [0, 3]
"""
WEIGHT = {"q": 1.0, "x": 20.0}
RANGE = {"q": (Decimal(0), Decimal(50)), "x": (Decimal(0), Decimal("0.1"))}
STEPS = {"q": ("0.01", "0.37", "1", "2.5"), "x": ("0.01", "0.02", "0.05")}
PUBLIC_C = [(0, 1), (1, 2), (2, 1)]
MUTANTS = ("third", "rows_only", "values_only")

QUERIES = [
    "SELECT SUM(t.x) FROM t WHERE t.q < 3",
    "SELECT SUM(t.x) FROM t WHERE t.k = 1",  # c1 = 0.1 above c3·c4 = 1/20: a removal refutes values_only
    "SELECT COUNT(*) FROM t WHERE t.x BETWEEN 0.03 AND 0.05 AND t.q >= 2",
    "SELECT SUM(t.q * t.x) FROM t WHERE t.q <= 4 AND t.x > 0.02",
    "SELECT SUM(t.q) FROM t, c WHERE t.k = c.id AND c.g = 1 AND t.q > 1",
    "SELECT SUM(t.x) FROM t, c WHERE (t.k = c.id AND c.g = 1 AND t.q < 2) OR (t.k = c.id AND c.g = 2 AND t.q > 4)",
]
# the two lattices the filters are exact on: q integers (the ramp's), x on its 0.01 grid (the step's)
FIXED = [
    [(0, 0, Decimal(2), Decimal("0.1")), (1, 1, Decimal(3), Decimal("0.04")), (2, 2, Decimal(5), Decimal("0.03"))],
    [(0, 1, Decimal(1), Decimal("0.05")), (1, 0, Decimal(4), Decimal("0.1"))],
]


def _row(rng: random.Random, rid: int, lattice: bool) -> tuple[Any, ...]:
    q = Decimal(rng.randint(0, 6)) if lattice else Decimal(rng.randint(0, 600)) / 100
    return (rid, rng.randint(0, 2), q, Decimal(rng.randint(0, 10)) / 100)


@dataclass(frozen=True)
class Neighbour:
    what: str
    statement: str
    params: tuple[Any, ...]
    dist: float
    kind: str  # "row" or "value"


def _neighbours(rows: list[tuple[Any, ...]], rng: random.Random) -> Iterator[Neighbour]:
    """The statements that make each neighbour of t's ``rows``: a row removed or added (4 random rows, on and off
    the lattice), and q or x moved by each step either way within its range."""
    db = {"t": rows}
    added = [_row(rng, 100 + j, lattice=j % 2 == 0) for j in range(4)]
    for n in row_neighbours(db, {"t": added}):
        if n.op == "remove":
            yield Neighbour(n.change, "DELETE FROM t WHERE id = %s", (n.row[0],), n.distance, "row")
        else:
            yield Neighbour(n.change, "INSERT INTO t VALUES (%s, %s, %s, %s)", n.row, n.distance, "row")
    names = {2: "q", 3: "x"}

    def in_range(index: object, v: Decimal) -> bool:
        lo, hi = RANGE[names[index]]  # type: ignore[index]
        return lo <= v <= hi

    for index, column in names.items():
        shifts = [sign * Decimal(step) for step in STEPS[column] for sign in (-1, 1)]
        for n in values_changed(db, "t", {index: WEIGHT[column]}, shifts, within=in_range):
            (old,), (new,) = n.removed["t"], n.added["t"]
            statement = f"UPDATE t SET {column} = %s WHERE id = %s"
            yield Neighbour(n.change, statement, (new[index], old[0]), n.distance, "value")


def _scalar(conn: psycopg.Connection, sql: str) -> float:
    row = conn.execute(sql).fetchone()
    return float(row[0]) if row is not None and row[0] is not None else 0.0


@dataclass(frozen=True)
class Compiled:
    sql: str
    plan: ColumnPlan
    answer: str
    queries: tuple[str, ...]

    @classmethod
    def of(cls, session: Session, sql: str) -> Compiled:
        prepared = session.prepare(sql, epsilon=EPSILON)
        plan = prepared.plans[0]
        assert isinstance(plan, ColumnPlan) and plan.row_plan is not None  # the combined path (§3.3.9.3)
        assert prepared.statements is not None
        queries = tuple(q.sql(dialect="postgres") for q in plan.queries)
        return cls(sql, plan, prepared.statements.answer, queries)

    def state(self, conn: psycopg.Connection) -> tuple[float, dict[str, float]]:
        """f (the released function, as the answer statement computes it) and the bound with its parts."""
        f = _scalar(conn, self.answer)
        b = self.plan.bind([conn.execute(s).fetchall() for s in self.queries])(0.0)
        c1 = max((v["rows"]["sensitivity"] for v in b.tables.values() if "rows" in v), default=0.0)
        c34 = max((v["combined_sensitivity"] for v in b.tables.values() if "combined_sensitivity" in v), default=0.0)
        return f, {"c": b.sensitivity, "third": b.sensitivity / 3, "rows_only": c1, "values_only": c34}


@dataclass
class Report:
    checked: dict[str, int] = field(default_factory=lambda: {"row": 0, "value": 0})
    worst: float = 0.0  # the largest loss / (ε·d) over the neighbours
    killed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(MUTANTS, 0))


def _load(conn: psycopg.Connection, rows: list[tuple[Any, ...]]) -> None:
    conn.execute("TRUNCATE t")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s)", rows)


def _oracle(conn: psycopg.Connection, session: Session, sql: str) -> Report:
    compiled = Compiled.of(session, sql)
    assert compiled.plan.data_independent, sql
    rng = random.Random(sql)
    report = Report()
    databases = [*FIXED, *([_row(rng, i, lattice=i % 2 == 0) for i in range(rng.randint(1, 4))] for _ in range(3))]
    bound = None
    for rows in databases:
        _load(conn, rows)
        f0, c0 = compiled.state(conn)
        m = session.analyze(sql, epsilon=EPSILON).measurements[0][0]
        # end to end: Laplace at c/ε, around the released function, the same c as the plan's on every database
        assert m.mechanism == GLOBAL and m.noise_scale == pytest.approx(c0["c"] / EPSILON, rel=1e-12), (sql, m)
        assert m.true_value == pytest.approx(f0, rel=1e-9, abs=1e-12)
        bound = c0["c"] if bound is None else bound
        assert c0["c"] == bound, (sql, rows)
        if all(r[2] == int(r[2]) for r in rows):  # the ramps and steps are exact on these lattices: no bias
            assert f0 == pytest.approx(_scalar(conn, sql), rel=1e-12, abs=1e-12), (sql, rows)
        for nb in _neighbours(rows, rng):
            conn.execute("BEGIN")
            conn.execute(nb.statement, nb.params)
            f1, c1 = compiled.state(conn)
            conn.execute("ROLLBACK")
            assert c1["c"] == bound, (sql, rows, nb.what)  # data-independent: the same scale on both sides
            report.checked[nb.kind] += 1
            loss = abs(f1 - f0) * EPSILON / bound  # Laplace, equal scales: the exact privacy loss
            assert loss <= EPSILON * nb.dist * (1 + 1e-9) + 1e-12, (sql, rows, nb.what, f0, f1, bound)
            report.worst = max(report.worst, loss / (EPSILON * nb.dist))
            for mutant in MUTANTS:
                scale = min(c0[mutant], c1[mutant]) / EPSILON
                if scale <= 0 or abs(f1 - f0) / scale > EPSILON * nb.dist * (1 + 1e-9) + 1e-12:
                    report.killed[mutant] += 1
    return report


@pytest.fixture(scope="module")
def oracle_db(pg_server_dsn: str) -> Iterator[tuple[psycopg.Connection, Session]]:
    dsn = create_database(pg_server_dsn, "sqldp_value_global")
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
            conn.cursor().executemany("INSERT INTO c VALUES (%s, %s)", PUBLIC_C)
            yield conn, sqldp.connect(dsn, policy=Policy.from_toml(POLICY), seed=1)
    finally:
        drop_database(pg_server_dsn, dsn)


@pytest.fixture(scope="module")
def reports(oracle_db: tuple[psycopg.Connection, Session]) -> dict[str, Report]:
    return {sql: _oracle(*oracle_db, sql) for sql in QUERIES}


@pytest.mark.parametrize("sql", QUERIES)
def test_global_release_loses_at_most_epsilon_on_every_neighbour(reports: dict[str, Report], sql: str) -> None:
    report = reports[sql]
    assert report.checked["row"] > 10 and report.checked["value"] > 50, report.checked
    assert report.worst > 0, report.worst  # the neighbours move the answer (the mutants below measure power)


def test_the_mutants_lose_more_than_epsilon_somewhere(reports: dict[str, Report]) -> None:
    for mutant in MUTANTS:
        assert sum(r.killed[mutant] for r in reports.values()) > 0, mutant


def test_ramp_widths(oracle_db: tuple[psycopg.Connection, Session]) -> None:
    """q (range 50) gets NR's slope 1.25 as a ramp; x (range 0.1) the exact step of its 0.01 grid, slope 100."""
    _, session = oracle_db
    plan = Compiled.of(session, QUERIES[2]).plan
    slopes = plan.tables_info["t"]["columns"]
    assert slopes["q"]["filter_slope"] == pytest.approx(1.25) and slopes["x"]["filter_slope"] == pytest.approx(100.0)


def test_a_data_dependent_c4_is_not_released_globally(oracle_db: tuple[psycopg.Connection, Session]) -> None:
    """t ⋈ u on a non-key column: a t row is in as many product rows as u has rows with its k, so c4 reads
    private rows and the combined bound moves when a u row is added. Released as Laplace at the bound of each
    database (the mutant that takes the global path whenever the release is combined), two neighbours would
    get different scales b0 ≠ b1, whose privacy loss sup_z |ln p0(z) − ln p1(z)| ≥ |z|·|1/b0 − 1/b1| − … is
    unbounded: the plan must not be global, and the release is not Laplace."""
    conn, session = oracle_db
    sql = "SELECT SUM(t.x) FROM t, u WHERE t.k = u.k AND t.q < 3"
    compiled = Compiled.of(session, sql)
    assert not compiled.plan.data_independent
    assert session.analyze(sql, epsilon=EPSILON).measurements[0][0].mechanism != GLOBAL
    _load(conn, [(0, 0, Decimal(1), Decimal("0.05"))])
    conn.execute("TRUNCATE u")
    conn.execute("INSERT INTO u VALUES (0, 0, 1)")
    mutant = dataclasses.replace(compiled.plan, data_independent=True)  # what the mutant would release
    before = mutant.bind([conn.execute(s).fetchall() for s in compiled.queries])(0.0).sensitivity
    conn.execute("INSERT INTO u VALUES (1, 0, 1)")  # a neighbour: one u row added
    after = mutant.bind([conn.execute(s).fetchall() for s in compiled.queries])(0.0).sensitivity
    conn.execute("TRUNCATE u")
    assert after != before, (before, after)
