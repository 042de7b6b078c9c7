"""Brute-force privacy oracle for the value-level window of a SUM's private step filters
(sensitivity.columns._Window; NR §3.3.8.4 exact steps, smoothed as in NR §3.3.8.3, Theorem 3.73 for β).

Tiny databases (2–3 rows) of ``o(k, d DATE, v INT)`` with ``norm = "l1(v, d)"``: every neighbour moves one
row's date by one day or its value by one unit (distance 1 in the metric). On each side the code analyses the
query, chooses β (Theorem 3.73's search over the fixed family) and calibrates generalized Cauchy noise (γ = 4)
of scale h = c_β/b_β around f. The oracle computes the exact privacy loss between the two released
distributions, sup_z |ln p_D(z) − ln p_D′(z)|, and asserts it is ≤ ε·d. It also asserts β-smoothness of the
bound, c(D′) ≤ e^(β·d)·c(D), at every grid β.

Mutants the oracle catches (checked by hand): the bound max_r W(r) × max_r D(r) over the scanned rows
(the code before this test; the first pair below loses 2.51 > ε = 1), and the bound without the smoothing
weight W (``_Window.weigh`` returning the item unweighted: rows just outside the scan then carry their full
D, and dropping out of it drops the bound by more than e^β).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from oracles import joint_loss, values_changed

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy
from sqldp.sensitivity import columns

EPSILON = 1.0
GAMMA = mechanisms.GAMMA
DDL = "CREATE TABLE o (k INT PRIMARY KEY, d DATE, v INT)"
POLICY = """
[tables.o]
rows = "public"
norm = "l1(v, d)"
[tables.o.columns.v]
range = [0, 10]
[tables.o.columns.d]
range = ["2000-01-01", "2000-12-31"]
unit = "day"
"""
QUERY = "SELECT SUM(o.v) FROM o WHERE o.d >= date '2000-03-01' AND o.d < date '2000-03-05'"
Row = tuple[Any, ...]
Database = list[Row] | dict[str, list[Row]]  # the rows of o, or per table


def day(text: str) -> dt.date:
    return dt.date.fromisoformat(text)


class Analyst:
    """Runs the code's analysis on a database and keeps what the release uses (f, β, h) and c at every β."""

    def __init__(self, dsn: str, monkeypatch: pytest.MonkeyPatch, policy: str = POLICY, query: str = QUERY) -> None:
        self.dsn = dsn
        self.query = query
        self.session = sqldp.connect(dsn, policy=Policy.from_toml(policy))
        self.smooth: Callable[[float], float] | None = None
        original = mechanisms.optimise_beta

        def spy(smooth: Callable[[float], float], *args: Any, **kwargs: Any) -> mechanisms.Calibration:
            self.smooth = smooth
            return original(smooth, *args, **kwargs)

        monkeypatch.setattr(mechanisms, "optimise_beta", spy)

    def load(self, db: Database) -> None:
        tables = db if isinstance(db, dict) else {"o": db}
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f"TRUNCATE {', '.join(tables)}")
            with conn.cursor() as cur:
                for name, rows in tables.items():
                    cur.executemany(f"INSERT INTO {name} VALUES ({', '.join(['%s'] * len(rows[0]))})", rows)

    def release(self, rows: Database) -> tuple[float, float, float, dict[float, float]]:
        """(f, β, noise scale h, c at each grid β) of the released distribution f + h·η on ``rows``."""
        self.load(rows)
        m = self.session.analyze(self.query, epsilon=EPSILON).measurements[0][0]
        assert self.smooth is not None
        grid = {b: self.smooth(b) for b in columns.BETA_GRID if b < EPSILON / (GAMMA + 1)}
        with psycopg.connect(self.dsn) as conn:  # the released function: the plain query on clamped values
            clamped = self.query.replace("o.v", "LEAST(GREATEST(o.v, 0), 10)").replace(
                "o.u", "LEAST(GREATEST(o.u, 0), 10)"
            )
            row = conn.execute(clamped).fetchone()
        assert row is not None
        return float(row[0] or 0.0), m.beta, m.noise_scale, grid


def neighbours(rows: list[Row]) -> Iterator[tuple[list[Row], float]]:
    """Every database that moves one row's date by a day or its value by one unit within the declared ranges,
    with the metric distance of the change (l1(v, d): 1 for either)."""
    db = {"o": rows}

    def later(d: dt.date, n: int) -> dt.date:
        return d + dt.timedelta(days=n)

    days = values_changed(db, "o", {1: 1.0}, (-1, 1), add=later, within=lambda _, d: d.year == 2000)
    values = values_changed(db, "o", {2: 1.0}, (-1, 1), within=lambda _, v: 0 <= v <= 10)
    for n in itertools.chain(days, values):
        yield n.db["o"], n.distance


def check_pair(analyst: Analyst, rows: Database, other: Database, dist: float) -> float:
    f0, _, s0, c0 = analyst.release(rows)
    f1, _, s1, c1 = analyst.release(other)
    loss = joint_loss([(f0, s0)], [(f1, s1)])  # sup_z |ln p_0(z) − ln p_1(z)|, generalized Cauchy
    assert loss <= EPSILON * dist * (1 + 1e-6), (rows, other, (f0, s0), (f1, s1), loss)
    for b in c0:  # β-smoothness at every grid β, both ways
        assert c1[b] <= math.exp(b * dist) * c0[b] * (1 + 1e-9), (rows, other, b, c0[b], c1[b])
        assert c0[b] <= math.exp(b * dist) * c1[b] * (1 + 1e-9), (rows, other, b, c0[b], c1[b])
    return loss


AUDIT = [(1, day("2000-02-28"), 0), (2, day("2000-04-21"), 10)]


def test_a_row_leaving_the_scan_loses_at_most_epsilon(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair found by review: row 2 moves from 2000-04-21 to 04-22, just past the scanned margin. The bound used to
    be max W (row 1, one day from the window) × max D (row 2's v = 10), and row 2 leaving the scan dropped it
    from 76.93 (β 0.05) to 33.29 (β 0.1): a loss of 3·ln(76.93/33.29) = 2.51 > ε."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    analyst = Analyst(pg_dsn, monkeypatch)
    moved = [AUDIT[0], (2, day("2000-04-22"), 10)]
    assert check_pair(analyst, AUDIT, moved, 1.0) <= EPSILON


def test_every_neighbour_of_tiny_databases_loses_at_most_epsilon(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dates around both window edges and both scanned margins (K = ln 100/β_ref = 46 days at β_ref = 0.1),
    values at the ends and the middle of [0, 10]; every neighbour of each database."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    analyst = Analyst(pg_dsn, monkeypatch)
    days = [
        day("2000-01-13"), day("2000-01-14"), day("2000-02-28"), day("2000-02-29"), day("2000-03-01"),
        day("2000-03-04"), day("2000-03-05"), day("2000-04-20"), day("2000-04-21"), day("2000-04-22"),
        day("2000-09-01"),
    ]  # fmt: skip
    rng = random.Random(16)
    databases = [AUDIT, [(1, day("2000-03-02"), 0), (2, day("2000-01-14"), 10)]]
    for _ in range(6):
        n = rng.choice([2, 3])
        databases.append([(k, rng.choice(days), rng.choice([0, 1, 5, 9, 10])) for k in range(1, n + 1)])
    worst = 0.0
    for rows in databases:
        for other, dist in neighbours(rows):
            worst = max(worst, check_pair(analyst, rows, other, dist))
    assert worst > 0.05  # the releases did differ between neighbours


def test_values_outside_the_declared_range_are_clamped(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cap covers a far row by max D over the declared ranges, so the data must stay in them: a value of
    1000 (declared [0, 10]) is summed as 10 (and −50 as 0), as SUM's arguments are under row privacy. The
    next test moves such a row across the scanned margin: without the clamp its D is 100 times the cap's."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    analyst = Analyst(pg_dsn, monkeypatch)
    inside = [(1, day("2000-03-02"), 1000), (2, day("2000-03-03"), -50)]
    prepared = analyst.session.prepare(QUERY, epsilon=EPSILON)
    analyst.load(inside)
    with psycopg.connect(pg_dsn) as conn:
        answer = conn.execute(prepared.statements.answer).fetchone()
    assert answer is not None and float(answer[0]) == 10.0  # 1000 → 10, −50 → 0


def test_a_value_outside_the_declared_range_crossing_the_margin_stays_smooth(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    analyst = Analyst(pg_dsn, monkeypatch)
    far = [(1, day("2000-04-21"), 1000), (2, day("2000-09-01"), 3)]
    out = [(1, day("2000-04-22"), 1000), (2, day("2000-09-01"), 3)]
    *_, c_in = analyst.release(far)
    *_, c_out = analyst.release(out)
    for b, c in c_in.items():
        assert c <= math.exp(b) * c_out[b] * (1 + 1e-9), (b, c, c_out[b])


# two summed columns: the skyline groups by |u| and the window's column d and takes max |v| per group
POLICY2 = POLICY.replace('norm = "l1(v, d)"', 'norm = "l1(v, u, d)"') + "[tables.o.columns.u]\nrange = [0, 10]\n"
QUERY2 = "SELECT SUM(o.v * o.u + o.v) FROM o WHERE o.d BETWEEN date '2000-03-01' AND date '2000-03-03'"
# the scanned margins (K = 46 days beyond the support [02-29, 03-04]: 01-13 and 04-20 are the last days
# read) and the days around the window
DAYS = [day(t) for t in ("2000-01-12", "2000-01-13", "2000-04-20", "2000-04-21")] + [
    day("2000-02-27") + dt.timedelta(days=k) for k in range(0, 8)
]


@pytest.fixture
def analyst2(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Analyst:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE o (k INT PRIMARY KEY, d DATE, v INT, u INT)")
    return Analyst(pg_dsn, monkeypatch, POLICY2, QUERY2)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    rows=st.lists(st.tuples(st.sampled_from(DAYS), st.integers(0, 10), st.integers(0, 10)), min_size=2, max_size=3),
    which=st.integers(0, 2),
    move=st.sampled_from([(-1, 0, 0), (1, 0, 0), (0, -1, 0), (0, 1, 0), (0, 0, -1), (0, 0, 1)]),
)
def test_two_summed_columns_random_neighbours_lose_at_most_epsilon(
    analyst2: Analyst, rows: list[tuple[dt.date, int, int]], which: int, move: tuple[int, int, int]
) -> None:
    """Random tiny databases and one random neighbour each (a day, or one unit of v or u): β-smooth at every
    grid β, and the exact privacy loss of the two releases ≤ ε·d."""
    db = [(k + 1, d, v, u) for k, (d, v, u) in enumerate(rows)]
    i = which % len(db)
    k, d, v, u = db[i]
    moved = (k, d + dt.timedelta(days=move[0]), v + move[1], u + move[2])
    if not (0 <= moved[2] <= 10 and 0 <= moved[3] <= 10):
        return
    check_pair(analyst2, db, [*db[:i], moved, *db[i + 1 :]], 1.0)


# a join: o's date is the window, l's values are summed, weighed by a public column c of l, so that l's own
# D = |c| reads a leaf: l's bound is a skyline grouped by |c| and o's date, o's a GROUP BY per order
JOIN_DDL = """
CREATE TABLE o (k INT PRIMARY KEY, d DATE);
CREATE TABLE l (ok INT, ln INT, x INT, c INT, PRIMARY KEY (ok, ln));
"""
JOIN_POLICY = """
[tables.o]
rows = "public"
norm = "l1(d)"
[tables.o.columns.d]
range = ["2000-01-01", "2000-12-31"]
unit = "day"
[tables.l]
rows = "public"
norm = "l1(x)"
[tables.l.columns.ln]
range = [1, 2]
[tables.l.columns.x]
range = [0, 10]
[tables.l.columns.c]
range = [0, 10]
"""
JOIN_QUERY = "SELECT SUM(l.x * l.c) FROM o, l WHERE l.ok = o.k AND o.d >= date '2000-03-01' AND o.d < date '2000-03-05'"


def test_a_join_every_neighbour_loses_at_most_epsilon(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(JOIN_DDL)
    analyst = Analyst(pg_dsn, monkeypatch, JOIN_POLICY, JOIN_QUERY)

    # the scan reads 01-13 to 04-21; an order one day from the window with a small c, another at the margin
    # with large ones (the first pair's shape, through the join)
    databases: list[tuple[list[Row], list[Row]]] = [
        ([(1, day("2000-02-28")), (2, day("2000-04-21"))], [(1, 1, 5, 1), (2, 1, 5, 10), (2, 2, 5, 10)]),
        ([(1, day("2000-03-04")), (2, day("2000-01-13"))], [(1, 1, 1, 2), (2, 1, 10, 10), (2, 2, 9, 10)]),
        ([(1, day("2000-03-05")), (2, day("2000-04-20"))], [(1, 1, 10, 3), (1, 2, 0, 10), (2, 1, 10, 1)]),
    ]
    worst = 0.0
    for orders, lines in databases:
        for i, (k, d) in enumerate(orders):
            for step in (-1, 1):
                moved = [*orders[:i], (k, d + dt.timedelta(days=step)), *orders[i + 1 :]]
                worst = max(worst, check_pair(analyst, {"o": orders, "l": lines}, {"o": moved, "l": lines}, 1.0))
        for i, (k, n, x, c) in enumerate(lines):
            for step in (-1, 1):
                if 0 <= x + step <= 10:
                    moved_lines = [*lines[:i], (k, n, x + step, c), *lines[i + 1 :]]
                    worst = max(
                        worst, check_pair(analyst, {"o": orders, "l": lines}, {"o": orders, "l": moved_lines}, 1.0)
                    )
    assert worst > 0.05
