"""R2T's linear program for join rows that belong to several units (Dong, Fang, Yi, Tao and Machanavajjhala,
"R2T: Instance-optimal Truncation for Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022,
§5): two units in one schema (u with its orders and line items, s with the line items that reference it) and
a self-join.

Oracles independent of the code under test:

* the join rows and the units each belongs to are enumerated in Python from the database's structure, and
  each truncated answer Q(I, τ) is the LP's exact rational optimum found by z3 (``z3.Optimize`` over the
  reals), not by HiGHS;
* every neighbour that removes one unit with every row referencing it (a u with its orders and their line
  items, or an s with its line items) is run on real PostgreSQL, and the exact privacy loss of the released
  races at the release grid's points (``test_units._loss``) stays within ε.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from fractions import Fraction

import psycopg
import pytest
import z3
from test_units import _loss

import sqldp
from sqldp.mechanisms import race as r2t
from sqldp.policy import Policy
from sqldp.result import R2T, Measurement
from sqldp.sensitivity.unit_lp import GAMMA, truncations
from sqldp.sensitivity.units import races

DDL = """
CREATE TABLE u (id INT PRIMARY KEY);
CREATE TABLE s (id INT PRIMARY KEY);
CREATE TABLE o (oid INT PRIMARY KEY, uid INT NOT NULL REFERENCES u (id));
CREATE TABLE l (lid INT PRIMARY KEY, oid INT NOT NULL REFERENCES o (oid), sid INT NOT NULL REFERENCES s (id),
                q INT NOT NULL);
"""
EPS = 1.0
GS = 40  # races τ = 5.5, 30.25
POLICY = f"""
[defaults]
epsilon = {EPS}
[units.u]
key = "id"
max_contribution = {GS}
[units.s]
key = "id"
max_contribution = {GS}
[tables.l.columns.q]
range = [0, 3]
"""
# a database: per u, its orders; per order, its line items as (supplier, q); suppliers 1, 2, 3 exist
Db = dict[int, list[list[tuple[int, int]]]]
SUPPLIERS = (1, 2, 3)
DATABASES: list[tuple[Db, tuple[int, ...]]] = [
    ({1: [[(1, 1), (2, 2)], [(1, 3)]], 2: [[(1, 0), (3, 2)]]}, SUPPLIERS),
    # u 1 and s 1 own more than τ = 5.5 line items, and share most of them
    ({1: [[(1, 2)] * 6, [(2, 1)] * 2], 2: [[(1, 3), (3, 1)]], 3: []}, SUPPLIERS),
    ({1: [[(1, 3)] * 12, [(2, 3)] * 20], 2: [[(3, 1)] * 3]}, SUPPLIERS),  # s 2 above τ = 5.5, u 1 above 30.25
    ({1: [], 2: [[]]}, (1,)),
]

Line = tuple[int, int, int]  # (u, s, q)
Rows = list[tuple[frozenset[tuple[str, int]], int]]  # join rows: (the units they belong to, ψ)


def _lines(db: Db) -> list[Line]:
    return [(u, sid, q) for u, orders in db.items() for lines in orders for sid, q in lines]


# (query, its join rows from the database's structure: the independent oracle)
QUERIES: list[tuple[str, Callable[[Db], Rows]]] = [
    ("SELECT COUNT(*) FROM l", lambda db: [(frozenset({("u", u), ("s", s)}), 1) for u, s, _ in _lines(db)]),
    (
        "SELECT SUM(l.q) FROM o, l, s WHERE o.oid = l.oid AND l.sid = s.id",
        lambda db: [(frozenset({("u", u), ("s", s)}), q) for u, s, q in _lines(db)],
    ),
    # a self-join: two line items of one supplier, each of its own u (possibly the same)
    (
        "SELECT COUNT(*) FROM l l1, l l2 WHERE l1.sid = l2.sid AND l1.q > l2.q",
        lambda db: [
            (frozenset({("u", a[0]), ("u", b[0]), ("s", a[1])}), 1)
            for a, b in itertools.product(_lines(db), repeat=2)
            if a[1] == b[1] and a[2] > b[2]
        ],
    ),
]


def _optimum(rows: Rows, tau: float) -> Fraction:
    """The LP's exact optimum: max Σ u_j, Σ_{j ∋ k} u_j ≤ τ per unit k, 0 ≤ u_j ≤ ψ_j, by z3 over the reals."""
    opt = z3.Optimize()
    us = [z3.Real(f"u{j}") for j in range(len(rows))]
    for u, (_, psi) in zip(us, rows, strict=True):
        opt.add(u >= 0, u <= psi)
    t = Fraction(tau)
    for k in {k for owners, _ in rows for k in owners}:
        members = [u for u, (owners, _) in zip(us, rows, strict=True) if k in owners]
        opt.add(z3.Sum(members) <= z3.Q(t.numerator, t.denominator))
    goal = opt.maximize(z3.Sum(us) if us else z3.RealVal(0) + 0)
    assert opt.check() == z3.sat
    v = opt.upper(goal)
    return Fraction(v.as_long()) if z3.is_int_value(v) else Fraction(v.numerator_as_long(), v.denominator_as_long())


@pytest.fixture
def tiny(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _load(conn: psycopg.Connection, db: Db, suppliers: tuple[int, ...]) -> None:
    conn.execute("DELETE FROM l; DELETE FROM o; DELETE FROM u; DELETE FROM s")
    for sid in suppliers:
        conn.execute("INSERT INTO s VALUES (%s)", (sid,))
    oid = lid = 0
    for unit, orders in db.items():
        conn.execute("INSERT INTO u VALUES (%s)", (unit,))
        for lines in orders:
            oid += 1
            conn.execute("INSERT INTO o VALUES (%s, %s)", (oid, unit))
            for sid, q in lines:
                lid += 1
                conn.execute("INSERT INTO l VALUES (%s, %s, %s, %s)", (lid, oid, sid, q))


def _measure(s: sqldp.session.Session, sql: str) -> Measurement:
    m = s.analyze(sql, audit=True).measurements[0][0]
    assert m.mechanism == R2T and m.unit is not None and m.unit["truncation"] == "linear program"
    return m


def _neighbours(db: Db, suppliers: tuple[int, ...]) -> Iterator[tuple[Db, tuple[int, ...]]]:
    """Every database with one unit fewer: a u with its orders and their line items, or an s with its line
    items (every row referencing it)."""
    for unit in db:
        yield {u: orders for u, orders in db.items() if u != unit}, suppliers
    for sid in suppliers:
        without = {u: [[x for x in lines if x[0] != sid] for lines in orders] for u, orders in db.items()}
        yield without, tuple(x for x in suppliers if x != sid)


@pytest.mark.parametrize(("sql", "join_rows"), QUERIES)
def test_every_unit_neighbour_is_within_epsilon(
    tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str, join_rows: Callable[[Db], Rows]
) -> None:
    s, conn = tiny
    worst = 0.0
    thresholds = races(GS)
    for db, suppliers in DATABASES:
        _load(conn, db, suppliers)
        m = _measure(s, sql)
        exact = [_optimum(join_rows(db), t) for t in thresholds]
        # the certified value: within γ·τ below the optimum at τ/(1 + γ), itself within γ·τ below that at τ
        for got, want, t in zip(m.truncated, exact, thresholds, strict=True):
            assert float(want) - 2 * GAMMA * t <= got <= float(want) + 1e-9
        scales = [sc for sc, _ in r2t.race_scales(m.thresholds, m.epsilon, 0.1)]
        for other, others in _neighbours(db, suppliers):
            _load(conn, other, others)
            m2 = _measure(s, sql)
            assert (m2.thresholds, m2.epsilon) == (m.thresholds, m.epsilon)  # the scales are the policy's
            for a, b, t in zip(m.truncated, m2.truncated, thresholds, strict=True):
                assert -1e-9 <= a - b <= t  # R2T §5: removing a unit lowers Q(I, τ) by at most τ
            loss = sum(_loss(a, b, sc) for a, b, sc in zip(m.truncated, m2.truncated, scales, strict=True))
            assert loss <= EPS * (1 + 1e-9)
            worst = max(worst, loss)
    assert worst > 0.5 * EPS  # the neighbours do use the budget


def test_shared_rows_are_truncated_once_per_unit() -> None:
    """Q5's shape by hand: customer a owns 4 line items of supplier x and 2 of y, customer b 3 of y. At τ = 3
    the LP keeps 3 of a's (from x or y) and 3 of y's (b's or a's): 6 in all, where truncating customers alone
    would give 6 and suppliers alone 6, and both one after the other could give less."""
    owners = [(("c", "a"), ("s", "x"))] * 4 + [(("c", "a"), ("s", "y"))] * 2 + [(("c", "b"), ("s", "y"))] * 3
    values, largest = truncations(owners, [1.0] * len(owners), [3.0, 10.0])
    rows: Rows = [(frozenset(o), 1) for o in owners]
    assert values[0] == pytest.approx(float(_optimum(rows, 3.0)), abs=1e-5) and values[1] == 9.0 and largest == 6.0
