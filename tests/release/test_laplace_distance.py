"""The smoothed Laplace (NR Theorem 3.56) for one change at distance d > 1 (sqldp.mechanisms.laplace_delta_at,
laplace_beta): the theorem's δ does not grow with d, which fails at large d; sqldp lowers β until its own bound
holds at every distance a change of the query's tables can have, and gives a bound whose distances are
unbounded (a value in a norm) generalized Cauchy instead.

Oracle, independent of the bound in the code: the hockey-stick divergence at e^(εd), integrated numerically,
between f₁ + (c₁/b)·Lap(1) and f₂ + (c₂/b)·Lap(1) over the configurations a β-smooth c allows at distance d (a
shortest path whose largest bound c_μ lies at either end or in the middle: |f₁ − f₂| ≤ d·c_μ, NR Lemma 3.78),
in both directions. sqldp's β for d must keep it ≤ δ; the β chosen for distance 1 fails at d = 20 (0.115).
"""

from __future__ import annotations

import math

import psycopg
import pytest
from oracles import hockey_stick_continuous

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy


def _worst(eps: float, b: float, beta: float, d: float) -> float:
    """The largest divergence over the configurations at distance d (c₁ = 1)."""
    grow = math.exp(beta * d)
    # (c₂, c_μ): c rising along the path, flat with its peak in the middle, falling
    configs = [(grow, grow), (1.0, math.exp(beta * d / 2)), (1.0 / grow, 1.0)]
    worst = 0.0
    for c2, peak in configs:
        for shift in (0.0, d * peak):
            s1, s2 = 1.0 / b, c2 / b
            there = hockey_stick_continuous("laplace", 0.0, s1, shift, s2, eps * d)
            back = hockey_stick_continuous("laplace", shift, s2, 0.0, s1, eps * d)
            worst = max(worst, there, back)
    return worst


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-6), (0.5, 1e-3)])
@pytest.mark.parametrize("d", [0.5, 1.0, 2.0, 5.0, 20.0])
def test_the_chosen_beta_keeps_delta_at_distance_d(eps: float, delta: float, d: float) -> None:
    beta, b = mechanisms.laplace_beta(eps, delta, (d,))
    assert mechanisms.laplace_delta_at(eps, b, beta, (d,)) <= delta * (1 + 1e-12)  # Thm 3.56 to rounding
    assert _worst(eps, b, beta, d) <= delta * (1 + 1e-6)


def test_the_unit_distance_beta_fails_at_distance_twenty() -> None:
    """The mutant: β and b chosen for distance 1 (the theorem's δ, the same at every d) at a weight of 20."""
    beta, b = mechanisms.laplace_beta(1.0, 1e-6, (1.0,))
    assert _worst(1.0, b, beta, 20.0) > 0.1
    assert mechanisms.laplace_delta_at(1.0, b, beta, (20.0,)) == 1.0  # β + b·e^(βd) > ε: no δ at all
    assert mechanisms.laplace_beta(1.0, 1e-6, (20.0,))[0] < beta


def test_unbounded_distances_have_no_laplace() -> None:
    with pytest.raises(sqldp.errors.RefusedError, match="unbounded distance"):
        mechanisms.laplace_beta(1.0, 1e-6, (1.0, math.inf))


POLICY = '[tables.r]\nrows = "private"\nweight = {w}\n[tables.r.columns.b]\nrange = [0, 4]\n'
SELF_JOIN = "SELECT COUNT(*) FROM r AS r1, r AS r2 WHERE r1.a = r2.a"


def test_a_session_calibrates_at_its_tables_weights(pg_dsn: str) -> None:
    """A self-join without keys has a smoothed bound (the rows analysis): under --mechanism laplace its β is
    the unit-distance one at weight 1 and lower at weight 20; with b in a norm, SUM(b) over the self-join moves
    with a value change of any size, and gets generalized Cauchy."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE r (a INT, b INT)")
        conn.execute("INSERT INTO r VALUES (1, 1), (1, 2), (2, 3)")
    privacy = {"epsilon": 1.0, "delta": 1e-6, "mechanism": "laplace"}
    betas = {}
    for w in (1.0, 20.0):
        s = sqldp.connect(pg_dsn, Policy.from_toml(POLICY.format(w=w)))
        (m,) = s.analyze(SELF_JOIN, audit=True, **privacy).measurements[0]
        assert m.mechanism == "laplace"
        betas[w] = m.beta
    assert betas[1.0] == pytest.approx(mechanisms.laplace_beta(1.0, 1e-6)[0])
    assert betas[20.0] == pytest.approx(mechanisms.laplace_beta(1.0, 1e-6, (20.0,))[0]) and betas[20.0] < betas[1.0]
    normed = POLICY.format(w=1.0).replace("weight = 1.0\n", 'weight = 1.0\nnorm = "l1(b)"\n')
    s = sqldp.connect(pg_dsn, Policy.from_toml(normed))
    (m,) = s.analyze("SELECT SUM(r1.b) FROM r AS r1, r AS r2 WHERE r1.a = r2.a", audit=True, **privacy).measurements[0]
    assert m.mechanism == "cauchy"
