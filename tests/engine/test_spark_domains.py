"""Joint group domains and key expressions on Spark (sqldp.groups; docs/sql.md "Group domains from public
tables", "Expressions of group keys"): the same tables in PostgreSQL and as Spark views give the same released
groups, key values and true values, so the domain statements (a joint domain's tuples, read whole by the
engine; a declared domain listed as constants with its key expressions) keep their meaning in Spark SQL."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest

import sqldp
from sqldp.policy import Policy
from sqldp.session import Session

DDL = """
CREATE TABLE item (ik INT PRIMARY KEY, item_id TEXT NOT NULL, descr TEXT NOT NULL);
CREATE TABLE sales (id INT PRIMARY KEY, ik INT NOT NULL REFERENCES item (ik), age INT NOT NULL);
"""
ROWS = """
INSERT INTO item VALUES (1, 'A', 'red'), (2, 'A', 'blue'), (3, 'B', 'red'), (4, 'C', 'green');
INSERT INTO sales VALUES (1, 1, 18), (2, 1, 19), (3, 3, 19), (4, 4, 25), (5, 2, 20);
"""
SPARK = {"item": "ik INT, item_id STRING, descr STRING", "sales": "id INT, ik INT, age INT"}
POLICY = (
    '[defaults]\nepsilon = 1.0\n[tables.item]\nrows = "public"\n[tables.sales.columns.age]\ndomain = [18, 19, 20]\n'
)
QUERIES = [
    "SELECT i.item_id, i.descr, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik GROUP BY i.item_id, i.descr",
    # PostgreSQL's integer division over the declared values (Spark's / would give 9.5)
    "SELECT s.age + 1 AS a, s.age / 2 AS half, COUNT(*) AS n FROM sales s GROUP BY s.age HAVING s.age > 18",
    "SELECT LENGTH(i.descr) / 2 AS l, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik GROUP BY i.descr",
    "SELECT i.descr, s.age, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik GROUP BY i.descr, s.age "
    "HAVING i.descr <> 'blue' ORDER BY s.age % 2, i.descr",
]


@pytest.fixture(scope="module")
def engines(spark: Any, pg_server_dsn: str) -> Iterator[tuple[Session, Session]]:
    from test_spark import engine_pair

    with engine_pair(spark, pg_server_dsn, DDL, ROWS, SPARK, Policy.from_toml(POLICY), "domains", seed=4) as pair:
        yield pair


def _released(session: Session, sql: str) -> list[tuple[tuple[Any, ...], list[float | None]]]:
    result = session.run(sql)
    assert result.released
    drawn = [ms for ms in result.measurements if ms[0].noisy_value is not None]
    return [
        (tuple(r["key"].values()), [m.true_value for m in ms])
        for r, ms in zip(result.rows, sorted(drawn, key=lambda ms: _position(result, ms)), strict=True)
    ]


def _position(result: sqldp.result.Result, measured: list[Any]) -> int:
    """Where a released group's row is: the rows carry the noisy values of their measurements."""
    return next(i for i, r in enumerate(result.rows) if r["values"]["n"] == shown(measured[0].noisy_value))


@pytest.mark.parametrize("sql", QUERIES)
def test_the_same_groups_and_values_on_spark(engines: tuple[Session, Session], sql: str) -> None:
    pg, on_spark = engines
    ours = _released(pg, sql)
    assert ours and ours == _released(on_spark, sql)


def shown(noisy: float) -> float:
    """A released count as the rows show it: the noisy value rounded half away from zero, at least 0."""
    return max(0.0, float(math.floor(abs(noisy) + 0.5)) * (1 if noisy >= 0 else -1))
