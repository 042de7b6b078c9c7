"""COUNT(DISTINCT e): answered with a global bound only — a neighbouring change adds or removes product rows,
each of which moves the distinct count by at most one, so COUNT(*)'s data-independent bound c covers it.

Oracle: on small random databases in PostgreSQL, every neighbour (each row of the private table removed, each
row over the small domain added) moves the distinct count by at most c, and c is the same on every database;
refusals where no global bound exists."""

from __future__ import annotations

import random
from collections.abc import Iterator

import psycopg
import pytest
from oracles import product_rows, row_neighbours

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.result import GLOBAL

POLICY = """
[tables.r]
rows = "private"
[tables.r.columns.b]
domain = [0, 1, 2]
[tables.s]
rows = "private"
[tables.p]
rows = "public"
"""
QUERIES = [
    "SELECT COUNT(DISTINCT r.a) FROM r",
    "SELECT COUNT(DISTINCT p.d) FROM r, p WHERE r.b = p.b",
    "SELECT COUNT(DISTINCT r.a + p.d) FROM r, p WHERE r.b = p.b AND p.d > 0",
    "SELECT r.b, COUNT(DISTINCT r.a) FROM r GROUP BY r.b",
]


@pytest.fixture
def session(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, str]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (id INT PRIMARY KEY, a INT, b INT)")
        conn.execute("CREATE TABLE s (id INT PRIMARY KEY, b INT)")
        conn.execute("CREATE TABLE p (b INT, d INT)")
        conn.execute("INSERT INTO p VALUES (0, 0), (0, 1), (1, 1), (2, 2), (2, 2), (2, 0)")
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=2), pg_dsn


def _values(conn: psycopg.Connection, sql: str) -> dict[tuple[object, ...], float]:
    """The answer by group (the key columns; () without GROUP BY)."""
    return {tuple(row[:-1]): float(row[-1]) for row in conn.execute(sql).fetchall()}


@pytest.mark.parametrize("sql", QUERIES)
def test_every_neighbour_moves_the_distinct_count_by_at_most_the_global_bound(
    session: tuple[sqldp.session.Session, str], sql: str
) -> None:
    s, dsn = session
    rng = random.Random(sql)
    bounds = set()
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(4):  # four random databases
            conn.execute("DELETE FROM r")
            rows = [(i, rng.randrange(3), rng.randrange(3)) for i in range(rng.randrange(1, 6))]
            for row in rows:
                conn.execute("INSERT INTO r VALUES (%s, %s, %s)", row)
            [measurement] = {
                m.aggregate: m for group in s.analyze(sql, epsilon=1.0).measurements for m in group
            }.values()
            assert measurement.mechanism == GLOBAL
            bounds.add(measurement.sensitivity)
            before = _values(conn, sql)
            added = [(99, a, b) for a, b in product_rows(range(3), range(3))]
            neighbours = [
                ("DELETE FROM r WHERE id = %s", (n.row[0],))
                if n.op == "remove"
                else ("INSERT INTO r VALUES (%s, %s, %s)", n.row)
                for n in row_neighbours({"r": rows}, {"r": added})
            ]
            for statement, args in neighbours:
                conn.execute("BEGIN")
                conn.execute(statement, args)
                after = _values(conn, sql)
                conn.execute("ROLLBACK")
                # GROUP BY: the ℓ1 change over the groups (a missing group counts 0) is what c bounds
                change = sum(abs(before.get(k, 0.0) - after.get(k, 0.0)) for k in before.keys() | after.keys())
                assert change <= measurement.sensitivity
    assert len(bounds) == 1  # the same on every database: data-independent


def test_count_distinct_is_refused_without_a_global_bound(session: tuple[sqldp.session.Session, str]) -> None:
    s, _ = session
    with pytest.raises(RefusedError, match="needs a bound that holds on every database"):
        s.prepare("SELECT COUNT(DISTINCT r.a) FROM r, s WHERE r.b = s.b", epsilon=1.0)
    with pytest.raises(RefusedError, match=r"SUM\(DISTINCT …\) is not supported \(COUNT\(DISTINCT e\) is\)"):
        s.prepare("SELECT SUM(DISTINCT r.a) FROM r", epsilon=1.0)


def test_the_noisy_distinct_count_is_centred_on_the_true_one(session: tuple[sqldp.session.Session, str]) -> None:
    s, dsn = session
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO r SELECT g, g % 7, g % 3 FROM generate_series(1, 50) g")
    answers = [s.run("SELECT COUNT(DISTINCT r.a) AS n FROM r", epsilon=1.0).answer for _ in range(200)]
    assert abs(sum(answers) / len(answers) - 7) < 0.5  # Laplace(1) noise, mean 0
