"""Group keys that are expressions of columns with declared domains or of public tables' columns
(sqldp.groups: ``_declared_image``, ``_distinct_tuples``): the key's domain is the expression's image.

What must hold: the released groups are exactly PostgreSQL's image of the declared domains under the key
expression — the groups PostgreSQL's own GROUP BY gives over a table holding every combination of declared
values (integer division truncating, ROUND of a numeric half away from zero, text functions, EXTRACT, CASE,
several columns) or, over a public table, its distinct values; and by brute force over every combination of
declared values, a database whose one row holds it counts that row in the group PostgreSQL computes for it and
in no other (every value of the domain maps into the image). Mutants caught: the image computed with Python's
floor division (−3 / 10 = −1, a group PostgreSQL never forms), the image of one column only (a group missing),
a domain that ignores the public table's rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import psycopg
import pytest

import sqldp
from sqldp.policy import Policy

AGES = [19, 25, 41, -3]
NAMES = ["ann", "Ann"]
DAYS = ["2020-01-05", "2021-12-31"]
XS = ["1.25", "-2.5", "0.5"]
DDL = """
DROP TABLE IF EXISTS p, f, w;
CREATE TABLE p (id INT PRIMARY KEY, age INT NOT NULL, name TEXT NOT NULL, d DATE NOT NULL, x NUMERIC(6, 2) NOT NULL);
CREATE TABLE w (wk INT PRIMARY KEY, w_name TEXT NOT NULL);
CREATE TABLE f (id INT PRIMARY KEY, wk INT NOT NULL REFERENCES w (wk));
INSERT INTO w VALUES (1, 'north depot'), (2, 'north yard'), (3, 'south depot'), (4, 'x');
"""
POLICY = f"""
[defaults]
epsilon = 1.0
[tables.p.columns.age]
domain = {AGES}
[tables.p.columns.name]
domain = {NAMES!r}
[tables.p.columns.d]
domain = {DAYS!r}
[tables.p.columns.x]
domain = [{", ".join(XS)}]
[tables.w]
rows = "public"
""".replace("'", '"')
# key expressions over p, and the columns each reads (in the order of a row's values below)
KEYS = [
    ("p.age / 10", ("age",)),
    ("p.age % 3", ("age",)),
    ("UPPER(p.name)", ("name",)),
    ("EXTRACT(YEAR FROM p.d)", ("d",)),
    ("ROUND(p.x)", ("x",)),
    ("p.age + LENGTH(p.name)", ("age", "name")),
    ("CASE WHEN p.x > 1 THEN p.name ELSE 'z' END", ("x", "name")),
]
DECLARED = {"age": AGES, "name": NAMES, "d": DAYS, "x": XS}


@pytest.fixture
def dsn(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    yield pg_dsn


def _load(dsn: str, rows: list[dict[str, object]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM p")
        for i, r in enumerate(rows):
            values = {"age": AGES[0], "name": NAMES[0], "d": DAYS[0], "x": XS[0], **r}
            conn.execute(
                "INSERT INTO p VALUES (%s, %s, %s, %s, %s)",
                (i, values["age"], values["name"], values["d"], values["x"]),
            )


def _released(dsn: str, key: str, table: str = "p", where: str = "") -> list[tuple[object, float]]:
    """(key, true COUNT(*)) per released group, in group order (the measurements' order)."""
    sql = f"SELECT {key} AS k, COUNT(*) AS n FROM {table} {where} GROUP BY {key}"
    result = sqldp.connect(dsn, Policy.from_toml(POLICY), seed=1).run(sql, epsilon=1.0)
    assert result.released
    return [(row["key"]["k"], g[0].true_value) for row, g in zip(result.rows, result.measurements, strict=True)]


def _pg(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


@pytest.mark.parametrize(("key", "columns"), KEYS)
def test_image_is_postgresql_s_and_every_value_lands_in_it(dsn: str, key: str, columns: tuple[str, ...]) -> None:
    combos = [dict(zip(columns, c, strict=True)) for c in itertools.product(*(DECLARED[c] for c in columns))]
    _load(dsn, combos)  # every combination of declared values: PostgreSQL's GROUP BY gives the whole image
    image = {r[0] for r in _pg(dsn, f"SELECT DISTINCT {key} FROM p WHERE {key} IS NOT NULL")}
    released = _released(dsn, key)
    assert {k for k, _ in released} == image
    assert len({k for k, _ in released}) == len(released)
    for combo in combos:  # brute force: each declared value's row is counted in its own group only
        _load(dsn, [combo])
        (own,) = _pg(dsn, f"SELECT {key} FROM p")
        counts = dict(_released(dsn, key))
        assert own[0] in counts, (key, combo)
        assert counts == {k: (1.0 if k == own[0] else 0.0) for k in counts}, (key, combo)


def test_floor_division_image_would_differ(dsn: str) -> None:
    """The mutant image with Python's floor division has a group PostgreSQL never forms (−3 // 10 = −1)."""
    _load(dsn, [{"age": a} for a in AGES])
    floor = {a // 10 for a in AGES}
    released = {k for k, _ in _released(dsn, "p.age / 10")}
    assert released != floor and -1 in floor and -1 not in released


def test_public_expression_takes_the_public_table_s_values(dsn: str) -> None:
    """SUBSTRING of a public table's column: its distinct values over the public rows, each private row counted
    in its own warehouse's group."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM f; INSERT INTO f VALUES (1, 1), (2, 3), (3, 2), (4, 4), (5, 1)")
    key = "SUBSTRING(w.w_name, 1, 5)"
    released = _released(dsn, key, "f, w", "WHERE f.wk = w.wk")
    image = {r[0] for r in _pg(dsn, f"SELECT DISTINCT {key} FROM w")}
    assert {k for k, _ in released} == image == {"north", "south", "x"}
    truth = dict(_pg(dsn, f"SELECT {key}, COUNT(*) FROM f, w WHERE f.wk = w.wk GROUP BY 1"))
    assert {k: n for k, n in released} == {k: float(truth.get(k, 0)) for k in image}
