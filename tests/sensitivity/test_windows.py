"""The window of a SUM's private step filters (sensitivity.columns._Window; NR §3.3.8.4, exact steps).

Oracles: the filter's approximation evaluated by PostgreSQL on every integer of a range (where it and its
neighbours are 0, the support must not be); finite differences of the plain query under random changes of the
sensitive values, including dates that cross the window and its scanned margin, against the bound
(|Δf| ≤ e^(β·d)·c·d along the change) and the bound's own smoothness; and the same analysis without a window.
"""

from __future__ import annotations

import math
import random

import psycopg
import pytest
import sqlglot

import sqldp
from sqldp.form import ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity import columns
from sqldp.sensitivity.expressions import RangeOps, SqlOps, bound
from sqldp.sensitivity.filters import approximate

SUPPORTS = [
    ("t.d >= 5", (4, math.inf)),
    ("t.d > 5", (5, math.inf)),
    ("t.d < 9 AND t.d >= 3", (2, 9)),
    ("t.d BETWEEN 2 AND 6", (1, 7)),
    ("t.d = 4", (3, 5)),
    ("t.d IN (2, 7)", (1, 8)),
    ("(t.d > 3 AND t.d < 6) OR t.d = 9", (3, 10)),
    ("2 * t.d + 1 > 7", (3, math.inf)),  # 2d on a grid of 2: 0 up to 2d = 6
    ("-t.d < -3", (3, math.inf)),
    ("NOT t.d > 5", None),  # 1 − s: no support is claimed
    ("t.d <> 5", None),
    ("t.d > 3 OR t.e > 1", None),  # e is not bounded in every branch
]


@pytest.mark.parametrize(("cond", "expected"), SUPPORTS)
def test_a_filter_vanishes_around_every_value_outside_its_support(
    pg_dsn: str, cond: str, expected: tuple[float, float] | None
) -> None:
    def info(ref: ColumnRef) -> tuple[str, float | None, float, bool]:
        return "integer", 1.0, 1.0, True

    f = approximate(sqlglot.parse_one(cond, read="postgres"), info)
    support = f.support.get(ColumnRef("t", "d"))
    assert support == expected
    if support is None:
        return
    lo, hi = support
    with psycopg.connect(pg_dsn) as conn:
        values = dict(
            conn.execute(
                f"SELECT t.d, CAST({f.sql.sql(dialect='postgres')} AS DOUBLE PRECISION) "
                "FROM generate_series(-20, 30) AS t(d)"
            ).fetchall()
        )
    for d, s in values.items():
        if d < lo or d > hi:
            assert s == 0.0, (d, s)
    # tight on the grid: the first value inside each finite end is not 0 (the step rises from lo to lo + 1)
    if math.isfinite(lo):
        assert values[math.floor(lo) + 1] > 0
    if math.isfinite(hi):
        assert values[math.ceil(hi) - 1] > 0


# -- a window over a join: o's date filters a SUM of l's values ---------------------------------------------

DDL = """
CREATE TABLE o (id INT PRIMARY KEY, d DATE, v INT DEFAULT 0);
CREATE TABLE l (ok INT, ln INT, x NUMERIC(6,2), PRIMARY KEY (ok, ln));
"""
POLICY = """
[tables.o]
rows = "public"
norm = "l1(d)"
[tables.o.columns.d]
range = ["2020-01-01", "2020-12-31"]
unit = "day"
[tables.l]
rows = "public"
norm = "l1(x)"
[tables.l.columns.ln]
range = [1, 3]
[tables.l.columns.x]
range = [0, 10]
"""
QUERY = "SELECT SUM(l.x) FROM o, l WHERE l.ok = o.id AND o.d >= date '2020-06-01' AND o.d < date '2020-06-08'"
BETA = 0.1
START = 152  # 2020-06-01 is day 152 of 2020 (0-based)


def _load(dsn: str, orders: list[tuple[int, int]], lines: list[tuple[int, int, float]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE o, l")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO o (id, d) VALUES (%s, date '2020-01-01' + %s)", orders)
            cur.executemany("INSERT INTO l VALUES (%s, %s, %s)", lines)


def _value(dsn: str) -> float:
    with psycopg.connect(dsn) as conn:
        return float(conn.execute(QUERY).fetchone()[0] or 0.0)  # type: ignore[index]


def test_the_window_is_used_and_scans_only_rows_near_it(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    # order 1 in the window with a small line; order 2 far away (day 10) with three large ones
    _load(pg_dsn, [(1, START + 2), (2, 10)], [(1, 1, 1.0), (2, 1, 9.0), (2, 2, 9.0), (2, 3, 9.0)])
    policy = Policy.from_toml(POLICY)
    session = sqldp.connect(pg_dsn, policy=policy)
    prepared = session.prepare(QUERY, epsilon=1.0, beta=BETA)
    assert "o.d BETWEEN CAST('2020-04-14' AS DATE) AND CAST('2020-07-25' AS DATE)" in prepared.statements.answer
    m = prepared.analyze().measurements[0][0]
    window = m.tables["o"]["window"]
    assert window["column"] == "o.d" and window["support"] == [18413.0, 18421.0]  # days since 1970-01-01
    # o's bound: order 1's line, slope 1 times ub(x) = e^(β·x − 1)/β below x = 1/β (Lemma 3.67): 10·e^(−0.9);
    # order 2 is left out (its share is under the far cap e^(−β·K)·3·10 = 0.3, K = ln(100)/β)
    assert m.tables["o"]["value_sensitivity"] == pytest.approx(10 * math.exp(-0.9))
    assert window["far_rows_bound"]["o"] == pytest.approx(0.3)
    # without the window: order 2's three lines count in full
    monkeypatch.setattr(columns, "_window", lambda *a, **k: None)
    plain = sqldp.connect(pg_dsn, policy=policy).analyze(QUERY, epsilon=1.0, beta=BETA).measurements[0][0]
    assert "window" not in plain.tables["o"] and plain.tables["o"]["value_sensitivity"] == pytest.approx(
        30 * math.exp(-0.1)
    )


def test_no_window_where_the_metric_does_not_separate_it_from_the_summed_columns(pg_dsn: str) -> None:
    """W(d)·D(v) is β-smooth when d and v are separated (l1: the distances add up), not under linf."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    query = QUERY.replace("SUM(l.x)", "SUM(l.x + o.v)")
    for norm, windowed in (("l1(d, v)", True), ("linf(d, v)", False)):
        text = POLICY.replace('norm = "l1(d)"', f'norm = "{norm}"') + "[tables.o.columns.v]\nrange = [0, 5]\n"
        session = sqldp.connect(pg_dsn, policy=Policy.from_toml(text))
        assert ("BETWEEN CAST(" in session.prepare(query, epsilon=1.0, beta=BETA).statements.answer) == windowed
    # nor without declared ranges for the cap
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY.replace("range = [0, 10]", "")))
    assert "BETWEEN CAST(" not in session.prepare(QUERY, epsilon=1.0, beta=BETA).statements.answer


def test_finite_differences_across_the_window_never_exceed_the_bound(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    rng = random.Random(5)
    # dates near both edges of the window [152, 158], near the scanned margin (K ≈ 46 days) and far away
    near = [START - 1, START, START + 6, START + 7, START - 46, START - 47, START + 53, START + 54, 5, 300]
    checked = 0
    for _ in range(6):
        orders = [(i, rng.choice(near) + rng.randint(-1, 1)) for i in range(6)]
        lines = [(i, n, round(rng.uniform(0, 10), 2)) for i in range(6) for n in range(1, rng.randint(1, 3) + 1)]
        _load(pg_dsn, orders, lines)
        c0, f0 = session.analyze(QUERY, epsilon=1.0, beta=BETA).to_json()["sensitivity"], _value(pg_dsn)
        for _ in range(5):
            o1, l1 = [list(r) for r in orders], [list(r) for r in lines]
            for _ in range(rng.randint(1, 2)):
                if rng.random() < 0.6:
                    rng.choice(o1)[1] += rng.choice([-2, -1, 1, 2])
                else:
                    r = rng.choice(l1)
                    r[2] = round(min(10.0, max(0.0, r[2] + rng.choice([-0.5, 0.01, 1.0]))), 2)
            o1t, l1t = [tuple(r) for r in o1], [tuple(r) for r in l1]
            dist = sum(abs(a[1] - b[1]) for a, b in zip(orders, o1t, strict=True)) + sum(
                abs(a[2] - b[2]) for a, b in zip(lines, l1t, strict=True)
            )
            _load(pg_dsn, o1t, l1t)
            c1, f1 = session.analyze(QUERY, epsilon=1.0, beta=BETA).to_json()["sensitivity"], _value(pg_dsn)
            slack = 1e-9 * max(1.0, abs(f0))
            assert abs(f1 - f0) <= math.exp(BETA * dist) * min(c0, c1) * dist + slack, (orders, o1t, lines, l1t)
            assert c0 <= math.exp(BETA * dist) * c1 * (1 + 1e-9) and c1 <= math.exp(BETA * dist) * c0 * (1 + 1e-9)
            checked += abs(f1 - f0) > 0
            _load(pg_dsn, orders, lines)
    assert checked >= 5  # the changes did move the answer


def test_rows_left_out_of_the_scan_are_covered_by_the_cap(pg_dsn: str) -> None:
    """One order just beyond the scanned margin: the scan sees no row, and the bound is the cap, which must
    stay within e^β of the bound after the order moves one day into the scan (smoothness across the margin)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    lines = [(1, n, 10.0) for n in (1, 2, 3)]
    bounds = []
    for day in (START + 55, START + 54):  # the scan ends at 2020-07-25, day START + 54
        _load(pg_dsn, [(1, day)], lines)
        bounds.append(session.analyze(QUERY, epsilon=1.0, beta=BETA).to_json()["sensitivity"])
    assert 0 < bounds[1] <= math.exp(BETA) * bounds[0]
    assert bounds[0] == pytest.approx(0.3)  # e^(−β·K)·3 lines·max D (10 per line), K = ln(100)/β


@pytest.mark.parametrize("beta", columns.BETA_GRID)
def test_the_cap_bounds_the_smoothed_bound_of_every_value_in_the_range(pg_dsn: str, beta: float) -> None:
    """The cap multiplies max D over the declared ranges; D is built from the smoothed ub(x) (Lemma 3.67),
    which is above |x| where |x| < 1/(β·w): its maximum over x ∈ [0, 10] is what RangeOps(smoothed) gives."""
    e = sqlglot.parse_one("t.x * (1 - t.y)", read="postgres")
    weights = {"x": 1.0, "y": 0.5}
    ranges = {"x": (0.0, 10.0), "y": (0.0, 0.5)}
    ub, d = bound(e, lambda r: weights.get(r.column), SqlOps(), beta, lambda a, b: True)
    top, dtop = bound(e, lambda r: weights.get(r.column), RangeOps(lambda r: ranges[r.column], True), beta)
    with psycopg.connect(pg_dsn) as conn:
        sql = ", ".join(f"MAX({x.sql(dialect='postgres')})" for x in [ub, *d.values()])
        got = conn.execute(
            f"SELECT {sql} FROM generate_series(0, 100) AS gx(i), generate_series(0, 50) AS gy(j), "
            "LATERAL (SELECT gx.i / 10.0 AS x, gy.j / 100.0 AS y) AS t"
        ).fetchone()
    assert got is not None
    for value, limit in zip(got, [top, *dtop.values()], strict=True):
        assert float(value) <= limit * (1 + 1e-9)
