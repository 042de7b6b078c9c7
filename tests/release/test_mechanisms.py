"""Noise mechanisms: printed values, goodness of fit, calibration and its refusals."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate

from sqldp import mechanisms as m
from sqldp.errors import InputError, RefusedError


def closed_form_gc4(a: float) -> float:
    """P(|η| ≤ a) for GenCauchy(4), an independent closed form."""
    r2 = math.sqrt(2.0)
    return (1 / (2 * math.pi)) * math.log((a * a + r2 * a + 1) / (a * a - r2 * a + 1)) + (1 / math.pi) * (
        math.atan(r2 * a + 1) + math.atan(r2 * a - 1)
    )


@pytest.mark.parametrize(
    ("p", "a"), [(0.5, 0.566396), (0.78, 0.998780), (0.9, 1.393951), (0.95, 1.793362), (0.99, 3.102832)]
)
def test_gencauchy4_half_widths_table_d7(p: float, a: float) -> None:
    assert m.gencauchy_abs_quantile(p) == pytest.approx(a, abs=2e-6)


def test_gencauchy4_78_percent_within_one() -> None:
    """NR §3.3.8.5: ∫_{−1}^{1} of GenCauchy(4) ≈ 0.78 — "noise < λ with ≈ 78 %"."""
    assert m.gencauchy_abs_cdf(1.0) == pytest.approx(0.7805499, abs=1e-7)


@settings(max_examples=100, deadline=None)
@given(st.floats(0.01, 50.0))
def test_gencauchy_cdf_matches_closed_form_and_quadrature(a: float) -> None:
    assert m.gencauchy_abs_cdf(a) == pytest.approx(closed_form_gc4(a), abs=1e-10)
    quad, _ = integrate.quad(lambda x: m.gencauchy_density(x), -a, a, limit=200)
    assert m.gencauchy_abs_cdf(a) == pytest.approx(quad, abs=1e-8)


@settings(max_examples=100, deadline=None)
@given(st.floats(1e-6, 1 - 1e-9), st.sampled_from([2.0, 3.0, 4.0, 6.0]))
def test_quantile_inverts_cdf(p: float, gamma: float) -> None:
    assert m.gencauchy_abs_cdf(m.gencauchy_abs_quantile(p, gamma), gamma) == pytest.approx(p, rel=1e-7, abs=1e-12)


def test_density_integrates_to_one() -> None:
    for gamma in (2.0, 4.0, 5.5):
        total, _ = integrate.quad(lambda x, g=gamma: m.gencauchy_density(x, g), -math.inf, math.inf)
        assert total == pytest.approx(1.0, abs=1e-8)


def test_laplace_78_percent_bound() -> None:
    """The Laplace (λ = 1) 78 % bound is −ln(0.22) = 1.514128."""
    assert m.laplace_abs_quantile(0.78) == pytest.approx(1.514128, abs=1e-6)


def test_noise_source_is_secure_unless_seeded() -> None:
    assert m.NoiseSource().test_mode is False
    a, b = m.NoiseSource.seeded(7), m.NoiseSource.seeded(7)
    assert a.test_mode and [a.uniform() for _ in range(3)] == [b.uniform() for _ in range(3)]


def test_cauchy_calibration_theorem_353() -> None:
    """NR §4.3.3.1: ε = 1, β = 0.1 → b = 0.1, noise scale 10·c(x)."""
    cal = m.calibrate_cauchy(3.0, 1.0, 0.1)
    assert cal.b == pytest.approx(0.1) and cal.scale == pytest.approx(30.0)
    assert cal.half_width(0.78) == pytest.approx(30.0 * 0.998780, rel=1e-6)
    with pytest.raises(InputError, match="too large"):
        m.calibrate_cauchy(1.0, 1.0, 0.2)  # b = 0.2 − 0.2 = 0


def test_laplace_delta_theorem_356_d8() -> None:
    """NR Theorem 3.56: ε = 1, b = 0.1, β = 0.1 → δ = 2e^(1−1−9) = 2.46820e−4, and back."""
    delta = m.laplace_delta(1.0, 0.1, 0.1)
    assert delta == pytest.approx(2.46820e-4, rel=1e-5)
    cal = m.calibrate_laplace(2.0, 1.0, delta, 0.1)
    assert cal.b == pytest.approx(0.1) and cal.scale == pytest.approx(20.0)
    assert cal.half_width(0.78) == pytest.approx(20.0 * 1.514128, rel=1e-6)
    with pytest.raises(InputError, match="delta"):
        m.calibrate_laplace(1.0, 1.0, None, 0.1)


def test_unbounded_sensitivity_is_refused() -> None:
    with pytest.raises(RefusedError, match="unbounded"):
        m.calibrate_cauchy(math.inf, 1.0, 0.1)


def test_beta_optimisation_picks_the_least_noise_on_a_fixed_grid() -> None:
    """Theorem 3.73: h(x) = min_I c_I(x)/b_I over a data-independent family."""
    grid = m.beta_grid(1.0)
    assert grid == m.beta_grid(1.0) and max(grid) < 1.0 / 5

    def smooth(beta: float) -> float:  # a bound that grows as β shrinks, like A(k) smoothing
        return 1.0 + 0.05 / beta

    cal = m.optimise_beta(smooth, 1.0, "cauchy")
    assert cal.scale == pytest.approx(min(smooth(b) / (0.2 - b) for b in grid))
    assert cal.sensitivity == pytest.approx(smooth(cal.beta))


def test_optimise_beta_tries_the_analysis_grid_points_too() -> None:
    # a value plan's bound is tightest on its own grid points (it rounds β down to one of them)
    def smooth(beta: float) -> float:
        return 1.0 if beta == 0.1 else 100.0

    assert m.optimise_beta(smooth, 1.0, "cauchy").beta != 0.1
    assert m.optimise_beta(smooth, 1.0, "cauchy", extra=(0.1, 0.3)).beta == 0.1  # 0.3 ≥ ε/(γ+1)
