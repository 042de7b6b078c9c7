"""zCDP accounting in the library budget (sqldp.session.Session.guarantee): a session whose runs are all ρ-zCDP
(Gaussian vectors, ρ = 1/(2σ₁²); pure ε-DP runs, ρ = ε²/2) adds their ρ and converts once, ε = ρ + 2√(ρ ln(1/δ′))
(Bun and Steinke, "Concentrated Differential Privacy", TCC 2016, Lemma 2.3 and Props. 1.3, 1.4, 1.6), and admits
a run when that account or the sequential one fits the budget. The expected numbers of runs are computed here
independently (σ₁ by scipy's root finder on Balle and Wang's Theorem 8)."""

from __future__ import annotations

import math

import psycopg
import pytest
from scipy import optimize, special

import sqldp
from sqldp.errors import BudgetExhaustedError
from sqldp.policy import Policy

POLICY = """
[defaults]
epsilon = 1.0
[tables.r.columns.a]
range = [0, 2]
[tables.s]
"""
MANY = "SELECT " + ", ".join(f"SUM(r.a + {i})" for i in range(20)) + " FROM r"  # 20 global bounds


def _sigma1(eps: float, delta: float) -> float:
    def excess(s: float) -> float:
        return float(special.ndtr(0.5 / s - eps * s) - math.exp(eps) * special.ndtr(-0.5 / s - eps * s)) - delta

    return float(optimize.brentq(excess, 0.01, 1000.0, xtol=1e-14))


def _session(dsn: str, **budget: float) -> sqldp.session.Session:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS r (a INT, b INT); CREATE TABLE IF NOT EXISTS s (b INT)")
        conn.execute("DELETE FROM r; INSERT INTO r VALUES (1, 0), (2, 1); DELETE FROM s; INSERT INTO s VALUES (1)")
    return sqldp.connect(dsn, Policy.from_toml(POLICY), **budget)


def _runs_until_refused(s: sqldp.session.Session, sql: str, limit: int = 200, **privacy: float | str) -> int:
    for n in range(limit):
        try:
            s.run(sql, **privacy)
        except BudgetExhaustedError:
            return n
    return limit


def test_gaussian_runs_add_their_rho(pg_dsn: str) -> None:
    """ε = 0.25, δ = 10⁻⁶ per run, budget (2, 10⁻⁵): sequentially 8 runs; by zCDP the largest T with
    Tρ + 2√(Tρ ln 10⁵) ≤ 2 (38 runs)."""
    s = _session(pg_dsn, budget=2.0, delta_budget=1e-5)
    privacy = {"epsilon": 0.25, "delta": 1e-6, "mechanism": "laplace"}
    assert {m.mechanism for m in s.analyze(MANY, **privacy).measurements[0]} == {"gaussian-global"}
    rho = 1 / (2 * _sigma1(0.25, 1e-6) ** 2)
    expected = max(t for t in range(1, 1000) if t * rho + 2 * math.sqrt(t * rho * math.log(1e5)) <= 2.0)
    assert expected == 38
    assert _runs_until_refused(s, MANY, **privacy) == expected
    eps, delta = s.guarantee()
    assert delta == 1e-5 and eps <= 2.0
    assert eps == pytest.approx(expected * rho + 2 * math.sqrt(expected * rho * math.log(1e5)), rel=1e-6)
    assert s.spent == pytest.approx(expected * 0.25)  # the sequential account, far over the budget
    assert s.remaining[0] == pytest.approx(2.0 - eps)


def test_pure_runs_join_the_account_and_delta_stays_what_was_charged(pg_dsn: str) -> None:
    """Without a δ budget the conversion takes δ′ = the δ the runs were charged; pure ε-DP runs (Laplace on a
    global bound) add ε²/2. With no δ at all there is nothing to convert at: the sequential account only."""
    s = _session(pg_dsn, budget=100.0)
    privacy = {"epsilon": 0.25, "delta": 1e-6, "mechanism": "laplace"}
    for _ in range(30):
        s.run(MANY, **privacy)
    s.run("SELECT COUNT(*) FROM r", epsilon=0.1)
    rho = 30 / (2 * _sigma1(0.25, 1e-6) ** 2) + 0.1**2 / 2
    eps, delta = s.guarantee()
    assert delta == pytest.approx(30e-6)
    assert eps == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1 / 30e-6)), rel=1e-6)
    assert eps < s.spent == pytest.approx(7.6)
    pure = _session(pg_dsn, budget=1.0)
    for _ in range(10):
        pure.run("SELECT COUNT(*) FROM r", epsilon=0.1)
    assert pure.guarantee() == (pytest.approx(1.0), 0.0)
    with pytest.raises(BudgetExhaustedError):
        pure.run("SELECT COUNT(*) FROM r", epsilon=0.1)


def test_a_run_that_spends_delta_otherwise_ends_the_zcdp_account(pg_dsn: str) -> None:
    """The smoothed Laplace of NR Theorem 3.56 (a private ⋈ private join's data-dependent bound) is not ρ-zCDP:
    with it the session is accounted sequentially only, so it is refused where only the zCDP account fits,
    and after it the Gaussian runs add up sequentially."""
    s = _session(pg_dsn, budget=2.0, delta_budget=1e-4)
    privacy = {"epsilon": 0.25, "delta": 1e-6, "mechanism": "laplace"}
    join = "SELECT COUNT(*) FROM r, s WHERE r.b = s.b"
    for _ in range(10):
        s.run(MANY, **privacy)
    assert s.rho_spent is not None and s.guarantee()[0] < 2.0 < s.spent
    with pytest.raises(BudgetExhaustedError):
        s.run(join, **privacy)  # sequentially 2.75 > 2
    fresh = _session(pg_dsn, budget=2.0, delta_budget=1e-4)
    for _ in range(6):
        fresh.run(MANY, **privacy)
    fresh.run(join, **privacy)
    assert fresh.rho_spent is None
    assert fresh.guarantee() == (pytest.approx(1.75), pytest.approx(7e-6))
    fresh.run(MANY, **privacy)
    assert fresh.remaining[0] == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(BudgetExhaustedError):
        fresh.run(MANY, **privacy)


def _sigma_at(eps: float, delta: float, d: float) -> float:
    """σ for ℓ2 sensitivity d at the loss ε·d (the hockey-stick divergence of N(d, σ²) from N(0, σ²) at e^(εd))."""

    def excess(s: float) -> float:
        a, b = d / (2 * s), eps * s
        return float(special.ndtr(a - b) - math.exp(eps * d) * special.ndtr(-a - b)) - delta

    return float(optimize.brentq(excess, 0.01, 1000.0, xtol=1e-14))


def test_a_weight_above_one_converts_at_its_distance(pg_dsn: str) -> None:
    """r at weight 2: one row is a change at distance 2, promised (ε·2, δ). The Gaussian is calibrated at distance
    2, and the zCDP account (ρ per unit distance, ρ·d² at d) converts at d = 2: ε = 2ρ + 2√(ρ ln(1/δ′)) — the
    conversion at distance 1 would overspend at d = 2 (ρ·4 + 2·2√(ρL) > 2·(ρ + 2√(ρL))). Both expected counts
    are computed here, independently of sqldp."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS r (a INT, b INT); CREATE TABLE IF NOT EXISTS s (b INT)")
        conn.execute("DELETE FROM r; INSERT INTO r VALUES (1, 0), (2, 1)")
    s = sqldp.connect(pg_dsn, Policy.from_toml("[tables.r]\nweight = 2.0\n" + POLICY), budget=2.0, delta_budget=1e-5)
    privacy = {"epsilon": 0.25, "delta": 1e-6, "mechanism": "laplace"}
    measured = s.analyze(MANY, audit=True, **privacy).measurements[0]
    assert {m.mechanism for m in measured} == {"gaussian-global"}
    sigma = _sigma_at(0.25, 1e-6, 2.0)
    # SUM(a + 0), a ∈ [0, 2]: bound 2/G = 1 per unit of distance
    assert measured[0].noise_scale == pytest.approx(1.0 * math.sqrt(20) * sigma, rel=1e-6)
    rho = 1 / (2 * sigma**2)
    expected = max(t for t in range(1, 1000) if 2 * t * rho + 2 * math.sqrt(t * rho * math.log(1e5)) <= 2.0)
    assert _runs_until_refused(s, MANY, **privacy) == expected
    assert s.longest == 2.0
