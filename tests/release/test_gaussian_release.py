"""One Gaussian vector for a query's global bounds (sqldp.release.gaussian), checked by brute force on tiny
databases in real PostgreSQL.

For every neighbour (one row of r added, any values of its declared ranges and domain, or one removed) the
answers of every aggregate in every group are read from PostgreSQL itself (plain SQL, not sqldp), and sqldp's
noise scales σ_i from its audit. The released vector is f + N(0, diag σ²), so the privacy loss between two
neighbours is that of two Gaussians with the same covariance: its hockey-stick divergence at e^ε is exactly
Φ(D/2 − ε/D) − e^ε·Φ(−D/2 − ε/D) with D = ‖(f − f′)/σ‖₂ (Balle and Wang, ICML 2018, Theorem 8; the grid
rounding of the sampler is post-processing). It must be ≤ δ over every neighbour, and the neighbours reach δ.

Mutants this kills (each run by hand against this test): σ without the √k of the k values released
together (``calibrate_gaussian`` with ``values`` 1: one aggregate's σ, as if each had the whole (ε, δ));
the classic σ = √(2 ln(1.25/δ))/ε in place of the analytic one (at ε = 10, δ = 0.1 its divergence is 4δ).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import psycopg
import pytest
from oracles import gaussian_delta, product_rows, row_neighbours

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy
from sqldp.result import GAUSSIAN, GLOBAL

DDL = "CREATE TABLE r (a INT, b INT, g INT)"
POLICY = """
[defaults]
epsilon = 1.0
[tables.r.columns.a]
range = [0, 2]
[tables.r.columns.b]
range = [-1, 3]
[tables.r.columns.g]
domain = [0, 1]
"""
# 8 aggregates after AVG's rewrite (a centred SUM and a COUNT); one added row (a = 2, b = 3) reaches every
# bound at once, so D = √8 normalised scales: the release spends its whole δ there
AGGREGATES = ["COUNT(*)", "SUM(r.a)", "SUM(r.b)", "SUM(r.a + r.b)", "SUM(r.a * r.b)", "SUM(3 * r.a)", "AVG(r.b)"]
QUERY = f"SELECT r.g, {', '.join(AGGREGATES)} FROM r GROUP BY r.g"
# the same values, as PostgreSQL computes them for the released vector: AVG(b) is released as SUM(b − 1) and
# COUNT(b) (its post-processing divides them), so those two are the coordinates
TRUTH = (
    "SELECT g.g, COUNT(r.g), COALESCE(SUM(r.a), 0), COALESCE(SUM(r.b), 0), COALESCE(SUM(r.a + r.b), 0), "
    "COALESCE(SUM(r.a * r.b), 0), COALESCE(SUM(3 * r.a), 0), COALESCE(SUM(r.b - 1), 0), COUNT(r.b) "
    "FROM (VALUES (0), (1)) AS g(g) LEFT JOIN r ON r.g = g.g GROUP BY g.g ORDER BY g.g"
)
BASE = [(1, 0, 0), (2, 3, 1), (0, -1, 1)]


@pytest.fixture
def session(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _load(conn: psycopg.Connection, rows: list[tuple[int, int, int]]) -> None:
    conn.execute("DELETE FROM r")
    for row in rows:
        conn.execute("INSERT INTO r VALUES (%s, %s, %s)", row)


def _truth(conn: psycopg.Connection) -> list[float]:
    return [float(v) for row in conn.execute(TRUTH).fetchall() for v in row[1:]]


def _scales(s: sqldp.session.Session, eps: float, delta: float) -> tuple[list[float], set[str]]:
    out = s.analyze(QUERY, audit=True, epsilon=eps, delta=delta, mechanism="laplace")
    ms = [m for group in out.measurements for m in group]
    return [m.noise_scale for m in ms], {m.mechanism for m in ms}


# the neighbours: one row of r added, any values of its declared ranges and domain, or one removed
ADDED = product_rows(range(3), range(-1, 4), range(2))


# (10, 0.1): a setting where the classic σ, valid for ε < 1 only, gives 4× the δ; 8 values choose the Gaussian.
# At a table weight G one row is a change at distance G, promised (ε·G, δ): the divergence is taken at e^(εG)
# (a σ calibrated for distance 1 gives 1.5·10⁻² at G = 5 for δ = 10⁻³, 15× δ)
@pytest.mark.parametrize("weight", [0.5, 1.0, 2.0, 20.0])
@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-3), (10.0, 0.1)])
def test_every_neighbour_is_within_delta_at_epsilon(pg_dsn: str, eps: float, delta: float, weight: float) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        s = sqldp.connect(pg_dsn, Policy.from_toml(f"[tables.r]\nweight = {weight}\n" + POLICY))
        _check_every_neighbour(s, conn, eps, delta, weight)


def _check_every_neighbour(
    s: sqldp.session.Session, conn: psycopg.Connection, eps: float, delta: float, weight: float
) -> None:
    _load(conn, BASE)
    f = _truth(conn)
    scales, used = _scales(s, eps, delta)
    if not mechanisms.gaussian_wins(eps, delta, 8, (weight,)):
        # calibrated for distance G the Gaussian loses to Laplace at ε/k (pure ε·d at every d): not chosen
        assert used == {GLOBAL}
        return
    assert used == {GAUSSIAN} and len(scales) == len(f) == 16
    worst = 0.0
    for n in row_neighbours({"r": BASE}, {"r": ADDED}):
        _load(conn, n.db["r"])
        f2 = _truth(conn)
        scales2, _ = _scales(s, eps, delta)
        assert scales2 == scales  # data-independent
        d = math.sqrt(sum(((x - y) / sd) ** 2 for x, y, sd in zip(f, f2, scales, strict=True)))
        worst = max(worst, gaussian_delta(d, 1.0, eps * weight))  # d: the shift in units of σ
    assert worst <= delta
    assert worst > delta * (1 - 1e-6)  # attained: one added row reaches every bound


def test_values_in_a_norm_never_get_the_gaussian(pg_dsn: str) -> None:
    """A change of a value in a norm has no bounded distance, and no σ gives (ε·d, δ) for every d: the same
    8 global bounds get Laplace at ε/k each instead, and the session's zCDP account is not used."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        _load(conn, BASE)
    normed = POLICY.replace("[tables.r.columns.a]", '[tables.r]\nnorm = "l1(a)"\n[tables.r.columns.a]')
    s = sqldp.connect(pg_dsn, Policy.from_toml(normed))
    out = s.analyze("SELECT SUM(r.b), COUNT(*), SUM(r.a) FROM r", audit=True, epsilon=1.0, delta=1e-3)
    assert out.measurements[0][0].mechanism != GAUSSIAN
    many = ", ".join(f"SUM(r.b + {i})" for i in range(20))
    out = s.analyze(f"SELECT SUM(r.a), {many} FROM r", audit=True, epsilon=1.0, delta=1e-6, mechanism="laplace")
    assert GAUSSIAN not in {m.mechanism for m in out.measurements[0]}
    plain = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    out = plain.analyze(f"SELECT {many} FROM r", audit=True, epsilon=1.0, delta=1e-6, mechanism="laplace")
    assert {m.mechanism for m in out.measurements[0]} == {GAUSSIAN}  # the same without the norm


def test_many_values_at_epsilon_one_delta_one_in_a_million(
    session: tuple[sqldp.session.Session, psycopg.Connection],
) -> None:
    """The realistic setting of the accuracy benchmark, ε = 1, δ = 10⁻⁶: 17 values or more get the Gaussian;
    the same query's first few aggregates keep Laplace at ε/k each."""
    s, conn = session
    _load(conn, BASE)
    many = ", ".join(f"SUM(r.a + {i})" for i in range(17))
    out = s.run(f"SELECT {many} FROM r", audit=True, epsilon=1.0, delta=1e-6, mechanism="laplace")
    ms = out.measurements[0]
    assert {m.mechanism for m in ms} == {GAUSSIAN}
    sigma1 = mechanisms.gaussian_sigma(1.0, 1e-6)
    for i, m in enumerate(ms):  # SUM(a + i), a + i ∈ [i, 2 + i]: bound 2 + i
        assert m.sensitivity == 2 + i
        assert m.noise_scale == pytest.approx((2 + i) * math.sqrt(17) * sigma1, rel=1e-12)
        assert (m.epsilon, m.delta) == pytest.approx((1 / 17, 1e-6 / 17))
    # the released JSON shows the data-independent σ and bar, and the mechanism with its reason
    j = out.to_json(audit=False)
    assert j["measurements"][0][0]["mechanism"] == GAUSSIAN and "noise_scale" in j["measurements"][0][0]
    described = s.analyze(f"SELECT {many} FROM r", audit=False, epsilon=1.0, delta=1e-6, mechanism="laplace")
    assert "one Gaussian release of all 17" in str(described.to_json())
    few = ", ".join(f"SUM(r.a + {i})" for i in range(16))
    assert {m.mechanism for m in s.analyze(f"SELECT {few} FROM r", epsilon=1.0, delta=1e-6, mechanism="laplace")
            .measurements[0]} == {GLOBAL}  # fmt: skip
    # pure ε-DP (no δ): never Gaussian
    assert {m.mechanism for m in s.analyze(f"SELECT {many} FROM r", epsilon=1.0).measurements[0]} == {GLOBAL}
    assert s.cost(f"SELECT {many} FROM r", epsilon=1.0, delta=1e-6, mechanism="laplace") == (1.0, 1e-6)
