"""Functions of released aggregates in the SELECT list (sqldp.postprocess): ROUND(SUM(x) / COUNT(*), 2), POWER,
COALESCE, NULLIF, ABS, SIGN, FLOOR, CEIL, TRUNC, EXP, LN, LOG, CBRT, MOD and casts, computed after the release.

What must hold: each value is PostgreSQL's own for the same expression over the released values — a released
SUM as a NUMERIC, a released COUNT as a BIGINT — so the oracle is PostgreSQL evaluating the expression with the
values as typed constants (integer division truncating towards zero, ROUND and casts of a numeric rounding
halves away from zero and of a double precision to even, NULL propagating; where PostgreSQL fails, as on a
division by zero, the release is NULL); an error bar's interval holds the function at every point of the
aggregates' intervals, with its ends in order where the function decreases; MOD, not monotone, has no bar and
says why. Mutants caught: Python's floor division for PostgreSQL's truncation, Python's round (halves to
even) for ROUND of a numeric, a decreasing function's ends left unswapped, a bar given for MOD.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator

import psycopg
import pytest
import sqlglot
from sqlglot import exp

import sqldp
from sqldp import postprocess
from sqldp.policy import Policy

# s: a released SUM (NUMERIC), n: a released COUNT (BIGINT, as sqldp.aggregates.counted types it)
EXPRESSIONS = [
    "s / n",
    "n / 2",
    "(n - 10) / 3",
    "-n / 4",
    "ROUND(s / n, 2)",
    "ROUND(s)",
    "ROUND(s, 1)",
    "ROUND(s, -1)",
    "ROUND(CAST(s AS DOUBLE PRECISION))",
    "ROUND(n / 3)",
    "POWER(s, 2)",
    "POWER(n, 2)",
    "POWER(s, 0.5)",
    "POWER(2, n)",
    "POWER(s, -1)",
    "COALESCE(s / NULLIF(n, 0), 0)",
    "NULLIF(n, 0)",
    "NULLIF(s, 2.5)",
    "ABS(s)",
    "SIGN(s)",
    "FLOOR(s)",
    "CEIL(s)",
    "TRUNC(s)",
    "TRUNC(s, 1)",
    "EXP(n)",
    "EXP(s / 1000)",
    "LN(s)",
    "LN(n)",
    "LOG(s)",
    "LOG(2, n)",
    "CBRT(s)",
    "MOD(n, 3)",
    "MOD(n - 10, 3)",
    "MOD(s, 2)",
    "CAST(s AS INT)",
    "CAST(s AS BIGINT)",
    "CAST(s AS NUMERIC(10, 1))",
    "CAST(CAST(s AS DOUBLE PRECISION) AS INT)",
    "CAST(n AS DOUBLE PRECISION) / 4",
    "CAST(s AS REAL)",
    "CASE WHEN n > 2 THEN s * 2 ELSE 0 END",
    "GREATEST(s, n) - LEAST(s, 1)",
]
SUMS = [0.0, 2.5, -2.5, 0.5, -7.25, 1.45, 1234.5678, -0.05, 15.0, 0.001]
COUNTS = [0, 1, 2, 3, 7, 12, 25]


def _ours(text: str) -> exp.Expr:
    """The expression over placeholders, n as the released COUNT's BIGINT."""
    tree = sqlglot.parse_one(text, read="postgres")

    def placed(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name == "s":
            return exp.column("__agg0")
        if isinstance(node, exp.Column) and node.name == "n":
            return exp.Cast(this=exp.column("__agg1"), to=exp.DataType.build("BIGINT"))
        return node

    return tree.transform(placed)


def _pg_text(text: str, s: float, n: int) -> str:
    tree = sqlglot.parse_one(text, read="postgres")

    def typed(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.name == "s":
            return sqlglot.parse_one(f"CAST('{s!r}' AS NUMERIC)", read="postgres")
        if isinstance(node, exp.Column) and node.name == "n":
            return sqlglot.parse_one(f"CAST({n} AS BIGINT)", read="postgres")
        return node

    return "SELECT " + tree.transform(typed).sql(dialect="postgres")


def _close(a: float | None, b: float | None, single: bool = False) -> bool:
    """Equal to 9 digits; to 7 for a REAL, which PostgreSQL prints to its shortest decimal."""
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-7 if single else 1e-9, abs_tol=1e-12)


def _mismatches(conn: psycopg.Connection, texts: list[str]) -> list[str]:
    """Where sqldp's value differs from PostgreSQL's (an error of PostgreSQL's being NULL)."""
    out = []
    for text in texts:
        ours = _ours(text)
        for s, n in itertools.product(SUMS, COUNTS):
            try:
                with conn.transaction():
                    row = conn.execute(_pg_text(text, s, n)).fetchone()
                theirs = None if row is None or row[0] is None else float(row[0])
            except psycopg.DataError:  # division by zero, logarithm of 0, overflow …
                theirs = None
            mine = postprocess.evaluate(ours, [s, float(n)])
            if not _close(mine, theirs, single="REAL" in text):
                out.append(f"{text} at s={s}, n={n}: sqldp {mine}, PostgreSQL {theirs}")
    return out


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        yield c


def test_values_are_postgresql_s_own(conn: psycopg.Connection) -> None:
    assert _mismatches(conn, EXPRESSIONS) == []


def test_mutants_are_caught(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """Python's floor division for PostgreSQL's truncation, Python's round for ROUND of a numeric."""
    floor_div = postprocess.Step("/", postprocess._arithmetic(lambda a, b: a // b if b else None), postprocess._widest)
    monkeypatch.setitem(postprocess.EVALUATE, exp.Div, floor_div)
    assert _mismatches(conn, ["(n - 10) / 3"])
    monkeypatch.undo()
    monkeypatch.setattr(postprocess, "nearest", lambda v: float(round(v)))
    assert _mismatches(conn, ["ROUND(s)", "CAST(s AS INT)"])


# -- error bars ---------------------------------------------------------------------------------------------


def test_bars_hold_the_function_over_every_point() -> None:
    """Over random boxes of the two aggregates, every point's value lies in the interval (soundness), and a
    monotone function of one aggregate reaches both ends (the ends mapped, not merely bounded)."""
    rng = random.Random(7)
    one_aggregate = {"POWER(s, -1)", "EXP(s / 1000)", "CBRT(s)", "LN(s)", "ROUND(s, 1)", "FLOOR(s)", "SIGN(s)"}
    checked = 0
    for text in EXPRESSIONS:
        ours = _ours(text)
        for _ in range(30):
            s0, n0 = rng.uniform(-20, 40), rng.randint(0, 30)
            box = {0: (s0, s0 + rng.uniform(0, 10)), 1: (float(n0), float(n0 + rng.randint(0, 5)))}
            span = postprocess.interval_of(ours, box)
            if span is None:
                continue
            assert span[0] <= span[1], text
            points = [(box[0][0] + (box[0][1] - box[0][0]) * i / 8, box[1][0] + j) for i in range(9) for j in range(6)]
            for s, n in points:
                if n > box[1][1]:
                    continue
                v = postprocess.evaluate(ours, [s, n])
                assert v is not None and span[0] - 1e-9 <= v <= span[1] + 1e-9, (text, box, s, n, v, span)
            if text in one_aggregate:
                ends = {postprocess.evaluate(ours, [x, 0.0]) for x in box[0]}
                assert ends == set(span) or len(ends) == 1, (text, box, ends, span)
            checked += 1
    assert checked > 500


def test_decreasing_function_swaps_the_ends() -> None:
    assert postprocess.interval_of(_ours("POWER(s, -1)"), {0: (2.0, 4.0)}) == (0.25, 0.5)
    assert postprocess.interval_of(_ours("-EXP(s)"), {0: (0.0, 1.0)}) == (-math.e, -1.0)
    assert postprocess.interval_of(_ours("LOG(0.5, s)"), {0: (1.0, 4.0)}) == pytest.approx((-2.0, 0.0))


def test_mod_has_no_bar_and_says_why() -> None:
    assert postprocess.interval_of(_ours("MOD(n, 3)"), {1: (4.0, 5.0)}) is None
    assert any("MOD is not monotone" in why for why in postprocess.unbarred(_ours("MOD(n, 3) + 1")))


POLICY = """
[defaults]
epsilon = 1.0
[tables.t.columns.x]
range = [0, 10]
"""


def test_release_end_to_end(pg_dsn: str) -> None:
    """A query's outputs are the functions of its released aggregates, by PostgreSQL's rules, with bars where
    the function is monotone and a note where it is MOD."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("DROP TABLE IF EXISTS t; CREATE TABLE t (id INT PRIMARY KEY, x INT NOT NULL)")
        c.execute("INSERT INTO t SELECT i, i % 11 FROM generate_series(1, 40) AS i")
    sql = (
        "SELECT ROUND(SUM(x) * 1.0 / COUNT(*), 2) AS r, COUNT(*) / 3 AS third, MOD(COUNT(*), 7) AS m, "
        "POWER(COUNT(*), 2) AS sq, COALESCE(SUM(x), 0) AS s FROM t"
    )
    result = sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=3).run(sql, epsilon=1.0)
    row = result.rows[0]
    n = next(m.noisy_value for m in result.measurements[0] if m.aggregate.startswith("COUNT"))
    s = next(m.noisy_value for m in result.measurements[0] if m.aggregate.startswith("SUM"))
    assert n is not None and s is not None
    count = max(0, postprocess.nearest(n))
    values = row["values"]
    assert values["third"] == float(int(count) // 3)
    assert values["m"] == float(int(count) % 7)
    assert values["sq"] == count**2
    assert values["r"] == pytest.approx(round(s / count + 1e-12, 2), abs=0.006)
    assert "m" not in row.get("errors", {}) and {"r", "third", "sq", "s"} <= set(row.get("errors", {}))
    assert any("MOD is not monotone" in note for note in result.notes)
