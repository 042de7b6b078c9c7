"""COUNT(DISTINCT unit key) under a privacy unit (sqldp.sensitivity.unit_distinct, docs/units.md).

What must hold: over tiny databases on real PostgreSQL, for every neighbour that removes one unit with every
row referencing it, the exact privacy loss of the released vector (Laplace on every group at the plan's
scale; the true counts sqldp reads equal those computed here in Python from the database's structure) is at
most ε — ungrouped, and grouped by a column of the unit's own table (one group per unit). Refused: a distinct
count of another column (an order key moves by a unit's many orders), grouping by a column a unit's rows may
spread over. Mutant caught: sensitivity 0.5 (half the scale) exceeds ε on these databases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import pytest
from oracles import joint_loss

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy

EPS = 1.0
DDL = """
DROP TABLE IF EXISTS l, o, u;
CREATE TABLE u (id INT PRIMARY KEY, g INT NOT NULL);
CREATE TABLE o (oid INT PRIMARY KEY, uid INT NOT NULL REFERENCES u (id), d INT NOT NULL);
CREATE TABLE l (lid INT PRIMARY KEY, oid INT NOT NULL REFERENCES o (oid), q INT NOT NULL);
"""
POLICY = f"""
[defaults]
epsilon = {EPS}
[units.u]
key = "id"
max_contribution = 40
[tables.u.columns.g]
domain = [0, 1]
[tables.o.columns.d]
domain = [0, 1]
[tables.l.columns.q]
range = [0, 3]
"""
# a database: per unit, (its g, its orders: per order (d, its line items' q))
Db = dict[int, tuple[int, list[tuple[int, list[int]]]]]
DATABASES: list[Db] = [
    {1: (0, [(0, [1, 2]), (1, [3])]), 2: (1, [(1, [0])]), 3: (1, [])},
    {1: (1, [(1, [1] * 5), (1, [2] * 4)]), 2: (1, [(1, [3])]), 3: (0, [(0, [])])},
    {1: (0, [(0, [3])] * 6), 2: (0, [(1, [1, 2]), (1, [])]), 3: (1, [(1, [2] * 3)]), 4: (1, [])},
]
# (query, per unit (g, orders): the groups it is counted in — the independent oracle)
Counted = Callable[[int, list[tuple[int, list[int]]]], set[int]]
QUERIES: list[tuple[str, Counted]] = [
    (
        "SELECT COUNT(DISTINCT o.uid) FROM o, l WHERE o.oid = l.oid",
        lambda g, os: {0} if any(ls for _, ls in os) else set(),
    ),
    ("SELECT COUNT(DISTINCT u.id) FROM u, o WHERE u.id = o.uid", lambda g, os: {0} if os else set()),
    ("SELECT COUNT(DISTINCT o.uid) FROM o WHERE o.d = 1", lambda g, os: {0} if any(d == 1 for d, _ in os) else set()),
    (
        "SELECT u.g, COUNT(DISTINCT o.uid) FROM u, o, l WHERE u.id = o.uid AND o.oid = l.oid GROUP BY u.g",
        lambda g, os: {g} if any(ls for _, ls in os) else set(),
    ),
]


@pytest.fixture
def tiny(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _load(conn: psycopg.Connection, db: Db) -> None:
    conn.execute("DELETE FROM l; DELETE FROM o; DELETE FROM u")
    oid = lid = 0
    for unit, (g, orders) in db.items():
        conn.execute("INSERT INTO u VALUES (%s, %s)", (unit, g))
        for d, lines in orders:
            oid += 1
            conn.execute("INSERT INTO o VALUES (%s, %s, %s)", (oid, unit, d))
            for q in lines:
                lid += 1
                conn.execute("INSERT INTO l VALUES (%s, %s, %s)", (lid, oid, q))


def _released(s: sqldp.session.Session, sql: str) -> list[tuple[float, float, str]]:
    """(true value, noise scale, mechanism) per released coordinate, as sqldp would draw them (audit)."""
    result = s.analyze(sql, audit=True)
    out = []
    for group in result.measurements:
        for m in group:
            assert m.true_value is not None and m.noise_scale is not None
            out.append((float(m.true_value), float(m.noise_scale), str(m.mechanism)))
    return out


def _expected(db: Db, counted: Counted, groups: int) -> list[float]:
    out = [0.0] * groups
    for g, orders in db.values():
        for k in counted(g, orders):
            out[k] += 1
    return out


@pytest.mark.parametrize(("sql", "counted"), QUERIES)
def test_every_unit_neighbour_is_within_epsilon(
    tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str, counted: Counted
) -> None:
    s, conn = tiny
    groups = 2 if "GROUP BY" in sql else 1
    worst = mutant = 0.0
    for db in DATABASES:
        _load(conn, db)
        ours = _released(s, sql)
        assert [v for v, _, _ in ours] == _expected(db, counted, groups)
        assert all(mech == "laplace-global" and scale == pytest.approx(1.0 / EPS) for _, scale, mech in ours)
        for unit in db:
            rest = {u: v for u, v in db.items() if u != unit}
            _load(conn, rest)
            theirs = _released(s, sql)
            assert [v for v, _, _ in theirs] == _expected(rest, counted, groups)
            loss = joint_loss(ours, theirs)
            assert loss <= EPS * (1 + 1e-9), (db, unit, loss)
            worst = max(worst, loss)
            halved = [(v, scale / 2, mech) for v, scale, mech in ours]
            mutant = max(mutant, joint_loss(halved, [(v, scale / 2, mech) for v, scale, mech in theirs]))
    assert worst == pytest.approx(EPS)  # some unit moves the count by exactly 1: the bound is tight
    assert mutant > EPS * 1.5  # sensitivity 0.5 (half the scale) is caught


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(DISTINCT o.oid) FROM o",  # a unit may own many orders
        "SELECT o.d, COUNT(DISTINCT o.uid) FROM o GROUP BY o.d",  # a unit's orders spread over both groups
        "SELECT COUNT(DISTINCT o.uid), COUNT(*) FROM o",  # the other aggregate races under R2T
    ],
)
def test_refused(tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str) -> None:
    s, conn = tiny
    _load(conn, DATABASES[0])
    with pytest.raises(RefusedError):
        s.run(sql, epsilon=EPS)
