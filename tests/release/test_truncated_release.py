"""The release of a query that relies on a declared contribution bound (``max_rows_per``, docs/truncation.md):
Laplace at the truncated global bound over ε, checked by the exact privacy loss over every neighbour.

t (k, v) may have at most 2 rows per k, which the query enforces by truncation; s (k PRIMARY KEY, w) is
keyed by PostgreSQL; both private. For every neighbour (one row of t or s added from a small universe, or
removed), the released distributions on both sides are the exact ones the sampler draws from
(``cell_probability``), and their largest log-ratio is compared with ε (the helper of
test_global_mechanism). On the base database an added t row (k = 0, v = −3) evicts a (0, 5) of its key, so
the truncation's one-in, one-out change is among the neighbours.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from oracles import product_rows, row_neighbours
from test_global_mechanism import _loss

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy
from sqldp.result import GLOBAL

EPS = 1.0
POLICY = """
[defaults]
epsilon = 1.0
[tables.t]
max_rows_per = { k = 2 }
[tables.t.columns.v]
range = [-3, 5]
[tables.s]
"""
BASE = {"t": [(0, 5), (0, 5), (1, -3)], "s": [(0, 1), (1, 1)]}


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (k INT, v INT)")
        c.execute("CREATE TABLE s (k INT PRIMARY KEY, w INT NOT NULL)")
        yield c


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, int]]]) -> None:
    conn.execute("DELETE FROM t")
    conn.execute("DELETE FROM s")
    for table, rows in db.items():
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", row)


@pytest.mark.parametrize(
    ("sql", "bound"),
    [
        ("SELECT SUM(t.v) FROM t, s WHERE t.k = s.k", 10.0),  # s: 2 rows of ≤ 5; t: 1 · (5 − (−3)) = 8
        ("SELECT COUNT(*) FROM t, s WHERE t.k = s.k AND s.w > 0", 2.0),
    ],
)
def test_every_neighbour_is_within_epsilon(conn: psycopg.Connection, pg_dsn: str, sql: str, bound: float) -> None:
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))

    def release() -> tuple[float, float, int]:
        m = session.analyze(sql, audit=True).measurements[0][0]
        assert m.mechanism == GLOBAL and m.sensitivity == bound and m.true_value is not None
        return m.true_value, m.noise_scale, mechanisms.GRID_EXPONENT

    _load(conn, BASE)
    base = release()
    assert base[1] == bound / EPS
    worst = 0.0
    for n in row_neighbours(BASE, {"t": product_rows((0, 1, 2), (-3, 5)), "s": [(2, 1), (3, 0)]}):
        _load(conn, n.db)
        other = release()
        assert other[1] == base[1]  # the scale does not depend on the rows
        worst = max(worst, _loss(base, other))
    assert 0.5 * EPS < worst <= EPS * (1 + 1e-9)
