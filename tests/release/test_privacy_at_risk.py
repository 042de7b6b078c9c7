"""Privacy at risk ([DBB]: Dandekar, Basu and Bressan, PoPETs 2021): the worked examples of [DBB] §5.3 and
tables derived from its theorems."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sqldp import privacy_at_risk as par
from sqldp.errors import InputError


def test_p1_health_centre_budget() -> None:
    # [DBB] §5.3: N·E·e^{−1/ε₀} = $74434.40
    r = par.cost_report(5500, 100, 0.5)
    assert r.budget == pytest.approx(74434.40, abs=0.01)


def test_p2_cost_optimal_epsilon() -> None:
    # [DBB] §5.3: ε_min = 0.274, minimum budget $37805.86, saving $36628.532 (printed, off by 0.017)
    r = par.cost_report(5500, 100, 0.5)
    assert r.epsilon_min == pytest.approx(0.274, abs=5e-4)
    assert r.epsilon_min == pytest.approx(0.2741153, abs=1e-6)
    assert r.gamma_min == pytest.approx(0.6093374, abs=1e-6)
    assert r.budget_min == pytest.approx(37805.86, abs=0.01)
    assert r.saving == pytest.approx(36628.532, abs=0.02)


def test_eq10_root_is_the_numeric_minimiser() -> None:
    for e0 in (0.1, 0.5, 1.0):
        assert par.eq10_epsilon(e0) == pytest.approx(par.cost_report(1.0, 1, e0).epsilon_min, abs=1e-6)


def test_p4_pair_008_08() -> None:
    # P4: the 0.1-DP Laplace mechanism "optimally satisfies (0.08, 0.8)-privacy at risk"
    e = par.eq10_epsilon(0.1)
    assert e == pytest.approx(0.0790469, abs=1e-6)
    assert round(e, 2) == 0.08 and round(par.gamma_at(e, 0.1), 1) == 0.8
    assert par.gamma_at(0.08, 0.1) == pytest.approx(0.807919, abs=1e-6)


@pytest.mark.parametrize(
    ("k", "row", "p1"),
    [
        (1, [0.2868, 0.5215, 0.7138, 0.8711, 1], 0.632121),
        (2, [0.2218, 0.4365, 0.6394, 0.8277, 1], 0.448181),
        (3, [0.2101, 0.4174, 0.6195, 0.8143, 1], 0.356211),
        (5, [0.2045, 0.4079, 0.6090, 0.8067, 1], 0.267115),
    ],
)
def test_d2_gamma_table(k: int, row: list[float], p1: float) -> None:
    assert par.cdf_t(1.0, k) == pytest.approx(p1, abs=1e-6)
    for e, want in zip((0.2, 0.4, 0.6, 0.8, 1.0), row, strict=True):
        assert par.gamma_at(e, 1.0, k) == pytest.approx(want, abs=5e-5)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_cdf_t_against_monte_carlo(k: int) -> None:
    # independent oracle: T = |G1 − G2| with Gamma(k, 1) draws (fixed seed: a test, not noise)
    rng = np.random.default_rng(7)
    t = np.abs(rng.gamma(k, 1.0, 200_000) - rng.gamma(k, 1.0, 200_000))
    for x in (0.3, 1.0, 2.5):
        assert par.cdf_t(x, k) == pytest.approx(float(np.mean(t <= x)), abs=5e-3)


@pytest.mark.parametrize(
    ("e0", "row"), [(0.5, [0.0820, 0.2191, 0.3780]), (1, [0.1352, 0.3799, 0.7046]), (2, [0.1899, 0.5662, 1.1768])]
)
def test_d2_eq4_inverse(e0: float, row: list[float]) -> None:
    for g, want in zip((0.2, 0.5, 0.8), row, strict=True):
        assert par.epsilon_at(g, e0) == pytest.approx(want, abs=5e-5)


def test_p6_calibration_from_a_risk_target() -> None:
    # P6: target ε = 0.4 with γ1 = 0.6 → ε₀ = 0.8 (DERIVED 0.797323; k = 2: 0.6915)
    assert par.calibrate(0.4, 0.6) == pytest.approx(0.797323, abs=1e-6)
    assert par.calibrate(0.4, 0.6, k=2) == pytest.approx(0.6915, abs=1e-4)
    with pytest.raises(InputError):
        par.calibrate(2.0, 0.5)  # 1 − e^{−2} > 0.5: impossible


@pytest.mark.parametrize(
    ("e0", "emin", "g", "n", "want"),
    [
        (0.1, 0.079047, 0.79867, 10, 1.5524),
        (0.5, 0.274115, 0.60934, 100, 31.1652),
        (1.0, 0.421162, 0.54375, 1000, 428.092),
    ],
)
def test_d3_composition(e0: float, emin: float, g: float, n: int, want: float) -> None:
    assert par.composition(e0, emin, g, n, 1e-5) == pytest.approx(want, rel=2e-4)


@settings(max_examples=60, deadline=None)
@given(st.floats(0.05, 3.0), st.floats(0.05, 0.99), st.integers(1, 4))
def test_epsilon_at_inverts_gamma_at(e0: float, g: float, k: int) -> None:
    e = par.epsilon_at(g, e0, k)
    assert 0 < e <= e0
    assert par.gamma_at(e, e0, k) == pytest.approx(g, abs=1e-7)
    assert par.calibrate(e, g, k) == pytest.approx(e0, rel=1e-6)


def test_bad_inputs_are_input_errors() -> None:
    for call in (
        lambda: par.cost_report(-1, 100, 0.5),
        lambda: par.cost_report(5500, 0, 0.5),
        lambda: par.gamma_at(0.1, math.nan),
        lambda: par.cdf_t(1.0, 0),
    ):
        with pytest.raises(InputError):
            call()


def test_analyze_report_only_for_laplace() -> None:
    from sqldp.commands.analyze import privacy_at_risk_report

    out = {"public": False, "mechanism": "laplace", "epsilon": 0.1, "measurements": [[{}, {}]]}
    r = privacy_at_risk_report(out)
    assert r is not None and r["outputs"] == 2 and r["epsilon0"] == 0.1
    assert r["pairs"][1] == {"epsilon": pytest.approx(par.epsilon_at(0.8, 0.1, 2)), "gamma": 0.8}
    assert privacy_at_risk_report({**out, "mechanism": "cauchy"}) is None
