"""Brute-force privacy oracle for the value-level window of a SUM's private step filters
(sensitivity.columns._Window; NR §3.3.8.4 exact steps, smoothed as in NR §3.3.8.3, Theorem 3.73 for β).

Tiny databases (2–3 rows) of ``o(k, d DATE, v INT)`` with ``norm = "l1(v, d)"``: every neighbour moves one
row's date by one day or its value by one unit (distance 1 in the metric). On each side the code analyses the
query, chooses β (Theorem 3.73's search over the fixed family) and calibrates generalized Cauchy noise (γ = 4)
of scale h = c_β/b_β around f. The oracle computes the exact privacy loss between the two released
distributions, sup_z |ln p_D(z) − ln p_D′(z)|, and asserts it is ≤ ε·d. It also asserts β-smoothness of the
bound, c(D′) ≤ e^(β·d)·c(D), at every grid β.

Mutants the oracle catches (checked by hand): the bound max_r W(r) × max_r D(r) over the scanned rows
(the code before this test; the audit's case loses 2.51 > ε = 1), and the bound without the smoothing
weight W (``_Window.weigh`` returning the item unweighted: rows just outside the scan then carry their full
D, and dropping out of it drops the bound by more than e^β).
"""

from __future__ import annotations

import datetime as dt
import math
import random
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from scipy import optimize

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
Row = tuple[int, dt.date, int]


def day(text: str) -> dt.date:
    return dt.date.fromisoformat(text)


def log_density(z: np.ndarray, f: float, s: float) -> np.ndarray:
    """ln of the density of f + s·η, η ~ GenCauchy(4), up to the normalising constant (the same on both sides)."""
    return -math.log(s) - np.log1p(((z - f) / s) ** GAMMA)


def privacy_loss(f0: float, s0: float, f1: float, s1: float) -> float:
    """sup_z |ln p_0(z) − ln p_1(z)| for p_i the density of f_i + s_i·η.

    The tails: ln p_i(z) = 3·ln s_i − 4·ln|z| + o(1), so the difference tends to (γ − 1)·ln(s_0/s_1) at ±∞.
    In between: the maximum over a fine grid covering both centres and 10⁴ scales, refined by a bounded
    scalar search around the best grid point (the difference is smooth)."""
    tail = (GAMMA - 1.0) * abs(math.log(s0 / s1))
    span = abs(f0 - f1) + 1e4 * max(s0, s1)
    centre = (f0 + f1) / 2
    # dense near the centres, sparse far out (the difference is monotone beyond both centres ± a few scales)
    inner = np.linspace(centre - abs(f0 - f1) - 20 * max(s0, s1), centre + abs(f0 - f1) + 20 * max(s0, s1), 400_001)
    outer = centre + np.sign(np.linspace(-1, 1, 20_001)) * np.geomspace(1e-3, span, 20_001)
    z = np.concatenate([inner, outer])
    diff = np.abs(log_density(z, f0, s0) - log_density(z, f1, s1))
    k = int(np.argmax(diff))
    step = (inner[1] - inner[0]) * 2

    def neg(x: float) -> float:
        return -float(abs(log_density(np.array([x]), f0, s0) - log_density(np.array([x]), f1, s1))[0])

    refined = optimize.minimize_scalar(neg, bounds=(z[k] - step, z[k] + step), method="bounded")
    return max(tail, float(diff[k]), -float(refined.fun))


def test_privacy_loss_matches_the_closed_form_when_the_centres_agree() -> None:
    # same f: the difference is monotone in |z − f|, from ln(s1/s0) at the centre to 3·ln(s0/s1) at ±∞
    assert privacy_loss(0.0, 76.93, 0.0, 33.29) == pytest.approx(3 * math.log(76.93 / 33.29), rel=1e-9)
    # different f, same s: the loss is the largest |ln(1 + u^4) − ln(1 + (u − δ)^4)|, here at u ≈ δ/2·… > 0
    loss = privacy_loss(0.0, 1.0, 1.0, 1.0)
    grid = np.linspace(-50, 50, 2_000_001)
    assert loss == pytest.approx(float(np.max(np.abs(np.log1p(grid**4) - np.log1p((grid - 1) ** 4)))), rel=1e-6)


class Analyst:
    """Runs the code's analysis on a database and keeps what the release uses (f, β, h) and c at every β."""

    def __init__(self, dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.dsn = dsn
        self.session = sqldp.connect(dsn, policy=Policy.from_toml(POLICY))
        self.smooth: Callable[[float], float] | None = None
        original = mechanisms.optimise_beta

        def spy(smooth: Callable[[float], float], *args: Any, **kwargs: Any) -> mechanisms.Calibration:
            self.smooth = smooth
            return original(smooth, *args, **kwargs)

        monkeypatch.setattr(mechanisms, "optimise_beta", spy)

    def load(self, rows: list[Row]) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("TRUNCATE o")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO o VALUES (%s, %s, %s)", rows)

    def release(self, rows: list[Row]) -> tuple[float, float, float, dict[float, float]]:
        """(f, β, noise scale h, c at each grid β) of the released distribution f + h·η on ``rows``."""
        self.load(rows)
        m = self.session.analyze(QUERY, epsilon=EPSILON).measurements[0][0]
        assert self.smooth is not None
        grid = {b: self.smooth(b) for b in columns.BETA_GRID if b < EPSILON / (GAMMA + 1)}
        f = sum(min(10, max(0, v)) for _, d, v in rows if day("2000-03-01") <= d < day("2000-03-05"))
        return float(f), m.beta, m.noise_scale, grid


def neighbours(rows: list[Row]) -> Iterator[tuple[list[Row], float]]:
    """Every database that moves one row's date by a day or its value by one unit within the declared ranges,
    with the metric distance of the change (l1(v, d): 1 for either)."""
    for i, (k, d, v) in enumerate(rows):
        for moved in ((k, d - dt.timedelta(days=1), v), (k, d + dt.timedelta(days=1), v), (k, d, v - 1), (k, d, v + 1)):
            if 0 <= moved[2] <= 10 and moved[1].year == 2000:
                yield [*rows[:i], moved, *rows[i + 1 :]], 1.0


def check_pair(analyst: Analyst, rows: list[Row], other: list[Row], dist: float) -> float:
    f0, _, s0, c0 = analyst.release(rows)
    f1, _, s1, c1 = analyst.release(other)
    loss = privacy_loss(f0, s0, f1, s1)
    assert loss <= EPSILON * dist * (1 + 1e-6), (rows, other, (f0, s0), (f1, s1), loss)
    for b in c0:  # β-smoothness at every grid β, both ways
        assert c1[b] <= math.exp(b * dist) * c0[b] * (1 + 1e-9), (rows, other, b, c0[b], c1[b])
        assert c0[b] <= math.exp(b * dist) * c1[b] * (1 + 1e-9), (rows, other, b, c0[b], c1[b])
    return loss


AUDIT = [(1, day("2000-02-28"), 0), (2, day("2000-04-21"), 10)]


def test_the_audit_case_loses_at_most_epsilon(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The audit's pair: row 2 moves from 2000-04-21 to 04-22, just past the scanned margin. The bound used to
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
        answer = conn.execute(prepared.answer_sql).fetchone()
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
