"""AVG as the peers compute it: a sum centred on the midpoint of the declared range (half the sensitivity of
the plain sum) over a count, the ratio clamped to the range (post-processing of the two noisy values)."""

from __future__ import annotations

import statistics
from collections.abc import Iterator

import psycopg
import pytest

import sqldp
from sqldp.policy import Policy

POLICY = "[defaults]\nepsilon = 1.0\n[tables.t.columns.x]\nrange = [0, 60]\n[tables.t.columns.y]\nrange = [-5, 15]\n"


@pytest.fixture
def session(pg_dsn: str) -> Iterator[sqldp.session.Session]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INT PRIMARY KEY, x INT, y NUMERIC(6, 2), z INT)")
        conn.execute("INSERT INTO t SELECT g, g % 61, (g % 21) - 5, g FROM generate_series(1, 40) g")
        conn.execute("INSERT INTO t VALUES (41, NULL, NULL, NULL)")  # AVG ignores NULLs, so does the count
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=5)


def test_the_centred_sum_has_half_the_sensitivity(session: sqldp.session.Session) -> None:
    out = session.analyze("SELECT AVG(x) FROM t", audit=True)
    by_aggregate = {m.aggregate: m for m in out.measurements[0]}
    assert by_aggregate["SUM(t.x - 30)"].sensitivity == 30.0  # (60 − 0)/2, where SUM(x) has 60
    assert by_aggregate["COUNT(t.x)"].sensitivity == 1.0
    assert any("AVG → 30 + SUM(x − 30)/COUNT(x)" in n for n in out.notes)
    asymmetric = session.analyze("SELECT AVG(y) FROM t", audit=True).measurements[0]
    assert {m.aggregate: m.sensitivity for m in asymmetric}["SUM(t.y - 5)"] == 10.0  # [−5, 15]: 10, not 15


def test_released_averages_stay_in_the_declared_range_and_centre_on_the_truth(session: sqldp.session.Session) -> None:
    with psycopg.connect(session.dsn) as conn:
        true = float(conn.execute("SELECT AVG(x) FROM t").fetchone()[0])  # type: ignore[index]
    answers = [session.run("SELECT AVG(x) AS a FROM t", epsilon=0.2).answer for _ in range(200)]
    assert all(0.0 <= a <= 60.0 for a in answers)
    assert min(answers) == 0.0 or max(answers) == 60.0  # at ε = 0.2 the noise does reach the clamp
    assert abs(statistics.median(answers) - true) < 5.0


def test_an_average_without_a_declared_range_is_not_centred(session: sqldp.session.Session) -> None:
    out = session.analyze("SELECT AVG(x + 1) FROM t", audit=True)  # an expression: the plain SUM/COUNT
    assert "AVG → SUM/COUNT" in out.notes
    assert {m.aggregate for m in out.measurements[0]} == {"SUM(t.x + 1)", "COUNT(t.x + 1)"}
