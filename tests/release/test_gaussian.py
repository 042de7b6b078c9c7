"""The Gaussian mechanism (sqldp.mechanisms): the exact grid sampler's cells against scipy's normal CDF, the grid
property, and the analytic calibration (Balle and Wang, "Improving the Gaussian Mechanism for Differential
Privacy: Analytical Calibration and Optimal Denoising", ICML 2018) against an independent oracle: the
hockey-stick divergence at e^ε of N(0, σ²) from N(Δ, σ²) integrated numerically from the two densities.

Mutants these tests kill: the classic σ = Δ·√(2 ln(1.25/δ))/ε (Dwork & Roth Thm A.1) used for ε > 1 (its δ
exceeds the target at ε = 8, δ = 10⁻³); a σ solved for a δ that is not the least (the calibration is pinned to
within 10⁻⁴); erf bounds taken with the argument rounded the wrong way (the 2000-bit reference leaves them)."""

from __future__ import annotations

import math
from fractions import Fraction

import gmpy2
import pytest
from gmpy2 import mpfr, mpq
from scipy import integrate, stats

from sqldp import mechanisms as m

LAMBDA = 2.0**m.GRID_EXPONENT


def _reference_abs_cdf(a: mpq) -> mpfr:
    """erf(a/√2) at 2000 bits, rounded to nearest (independent of the sampler's interval code)."""
    ctx = gmpy2.context(precision=2000)
    return ctx.erf(ctx.div(ctx.add(mpfr(0, 2000), a), ctx.sqrt(2)))


@pytest.mark.parametrize("precision", [64, 120, 300, 1200])
def test_interval_bounds_enclose_a_high_precision_reference(precision: int) -> None:
    for a in (mpq(1, 3), mpq(2236, 1000) + mpq(1, 2**90), mpq(17, 1), mpq(40, 1), mpq(10**6, 7)):
        lo, hi = m.noise("gaussian").abs_cdf_bounds(a, precision)
        ref = _reference_abs_cdf(a)
        assert mpq(lo) <= mpq(ref) <= mpq(hi), (precision, a)
        assert mpq(hi) - mpq(lo) <= mpq(1, 2 ** (precision - 8))


def test_cell_probabilities_are_scipys_normal_cdf_differences_and_sum_to_one() -> None:
    f, s = 0.3 + LAMBDA / 3, 2.0**-35  # f off the grid; cells of width Λ = s/32
    centre = round(f / LAMBDA)
    ks = range(centre - 400, centre + 401)  # ±12.5 scales: the rest is below 1e−35
    total = sum((m.cell_probability("gaussian", f, s, k)[0] for k in ks), mpfr(0))
    assert float(total) == pytest.approx(1.0, abs=1e-12)
    for k in (centre - 40, centre - 1, centre, centre + 1, centre + 7, centre + 100):
        lo, hi = m.cell_probability("gaussian", f, s, k)
        assert lo <= hi and hi - lo <= hi * mpfr(2.0**-200)
        expected = stats.norm.cdf(((k + 0.5) * LAMBDA - f) / s) - stats.norm.cdf(((k - 0.5) * LAMBDA - f) / s)
        assert float(lo) == pytest.approx(expected, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize("distance", [30.0, 300.0, -3000.0])
def test_tail_cells_keep_their_relative_precision(distance: float) -> None:
    """Far in the tail 1 − erf has no digits left in any fixed precision; the tail cells go through erfc and
    match scipy's log survival function (e^(−4.5·10⁶) at 3000 scales)."""
    s = 1.0
    k = round(distance / LAMBDA)
    lo, hi = m.cell_probability("gaussian", 0.0, s, k)
    assert 0 < lo <= hi and (hi - lo) / hi < mpfr(2.0**-200)
    # the cell is Λ wide: its mass is φ(kΛ)·Λ·(1 + O((kΛ·Λ)²)), the correction below 10⁻¹⁷ here
    expected_log = stats.norm.logpdf(k * LAMBDA) + math.log(LAMBDA)
    assert float(gmpy2.log(lo)) == pytest.approx(expected_log, rel=1e-12)


def test_draws_follow_the_exact_cell_probabilities() -> None:
    """χ² of 6000 seeded draws against the exact cell probabilities at a scale of a few cells; the same draws
    fail against the cells of a value shifted by one cell (the test has power)."""
    f, s = 5.0 + 0.37 * LAMBDA, 3.0 * LAMBDA
    source = m.NoiseSource.seeded(20261125)
    draws = [m.release("gaussian", f, s, source) for _ in range(6000)]
    ks = [round(x / LAMBDA) for x in draws]
    assert all(k * LAMBDA == x for k, x in zip(ks, draws, strict=True))
    centre = round(f / LAMBDA)
    bins = list(range(centre - 8, centre + 9))

    def pvalue(shift: int) -> float:
        probs = [float(m.cell_probability("gaussian", f, s, k - shift)[0]) for k in bins]
        observed = [ks.count(k) for k in bins]
        expected = [p * len(ks) for p in probs]
        observed.append(len(ks) - sum(observed))
        expected.append(len(ks) - sum(expected))
        return float(stats.chisquare(observed, expected).pvalue)

    assert pvalue(0) > 1e-3
    assert pvalue(1) < 1e-6


def test_draws_at_ordinary_scales_fit_the_normal_distribution() -> None:
    """Kolmogorov–Smirnov of 3000 CSPRNG draws of the standardised noise against Φ; Laplace noise of the same
    variance is rejected by the same test."""
    source = m.NoiseSource()
    f, s = 123.456, 7.5
    z = [(m.release("gaussian", f, s, source) - f) / s for _ in range(3000)]
    assert stats.kstest(z, stats.norm.cdf).pvalue > 1e-3
    assert stats.kstest(z, stats.laplace(scale=1 / math.sqrt(2)).cdf).pvalue < 1e-3


def test_output_support_is_the_grid_whatever_the_true_value() -> None:
    """Mironov's floating-point attack reads which doubles are reachable: every output lies on the grid kΛ."""
    source = m.NoiseSource.seeded(1)
    for f in (0.1, 0.1 + LAMBDA / 3, 1234.5678, -3.3e-7):
        for s in (1e-3, 5.0, 3.3e6):
            for _ in range(30):
                x = m.release("gaussian", f, s, source)
                assert (Fraction(x) / Fraction(LAMBDA)).denominator == 1, (f, s, x)


def test_huge_and_tiny_scales_stay_exact_and_finite() -> None:
    source = m.NoiseSource.seeded(2)
    for f, s in ((1.2345e15, 3.7e9), (-1e300, 1e290), (0.0, 1e-300)):
        x = m.release("gaussian", f, s, source)
        assert math.isfinite(x) and Fraction(x) % Fraction(LAMBDA) == 0
        assert abs(x - f) < 40 * s + LAMBDA


def _divergence(sigma: float, eps: float) -> float:
    """∫ max(0, p(x) − e^ε·q(x)) dx for p = N(0, σ²), q = N(1, σ²), by quadrature of the densities: the
    region where p > e^ε·q is x < ½ − εσ² (the log ratio (1 − 2x)/(2σ²) is decreasing), split at 0 and at
    σ-steps so that quad sees the mass."""
    edge = 0.5 - eps * sigma * sigma
    total = 0.0
    left = edge - 40 * sigma
    for i in range(20):
        lo, hi = left + i * 2 * sigma, left + (i + 1) * 2 * sigma
        part, _ = integrate.quad(
            lambda x: stats.norm.pdf(x, 0, sigma) - math.exp(eps) * stats.norm.pdf(x, 1, sigma),
            lo,
            hi,
            epsabs=0,
            epsrel=1e-12,
        )
        total += part
    return total


@pytest.mark.parametrize(("eps", "delta"), [(1.0, 1e-6), (0.1, 1e-5), (1.0, 1e-3), (8.0, 1e-3), (4.0, 1e-9)])
def test_sigma_is_the_least_that_gives_delta(eps: float, delta: float) -> None:
    """Balle and Wang's Theorem 8 against the quadrature oracle: δ(σ) ≤ δ, and 10⁻⁴ less σ exceeds δ."""
    sigma = m.gaussian_sigma(eps, delta)
    assert _divergence(sigma, eps) <= delta * (1 + 1e-6)
    assert _divergence(sigma * (1 - 1e-4), eps) > delta
    assert m.gaussian_delta(sigma, eps) <= delta
    # never above the classic σ where that one is valid (ε < 1)
    if eps < 1:
        assert sigma <= math.sqrt(2 * math.log(1.25 / delta)) / eps


def test_the_classic_sigma_fails_for_large_epsilon() -> None:
    """The mutant of the classic calibration at ε = 8, δ = 10⁻³: its divergence exceeds δ (so the analytic σ,
    here larger, is needed), which the oracle above detects."""
    eps, delta = 8.0, 1e-3
    classic = math.sqrt(2 * math.log(1.25 / delta)) / eps
    assert _divergence(classic, eps) > 1.2 * delta
    assert m.gaussian_sigma(eps, delta) > classic


def test_the_published_example_and_rho() -> None:
    """σ₁(1, 10⁻⁵) ≈ 3.73 (Balle and Wang report the analytic σ ≈ 25 % below the classic 4.84 at ε = 1); the
    zCDP of N(0, σ²) at ℓ2 sensitivity Δ is Δ²/(2σ²) (Bun and Steinke, TCC 2016, Prop. 1.6)."""
    assert m.gaussian_sigma(1.0, 1e-5) == pytest.approx(3.7306, abs=1e-4)
    assert m.gaussian_rho(2.0, 4.0) == 0.125


def test_the_choice_compares_median_noise() -> None:
    """ln 2·k/ε (Laplace at ε/k each) against Φ⁻¹(¾)·√k·σ₁ (one Gaussian vector), by scipy: at ε = 1,
    δ = 10⁻⁶ the Gaussian first wins at k = 17 values."""
    sigma = m.gaussian_sigma(1.0, 1e-6)
    first = next(k for k in range(1, 100) if stats.norm.ppf(0.75) * math.sqrt(k) * sigma < math.log(2) * k)
    assert first == 17
    assert [m.gaussian_wins(1.0, 1e-6, k) for k in (1, 16, 17, 40)] == [False, False, True, True]


def test_calibration_and_error_bar() -> None:
    """σ = c·√k·σ₁ for one coordinate of k values; its 78 % bar is Φ⁻¹(0.89)·σ and the sampler's draws agree."""
    cal = m.calibrate_gaussian(3.0, 1.0, 1e-6, 20)
    assert cal.mechanism == "gaussian" and cal.scale == pytest.approx(3.0 * math.sqrt(20) * m.gaussian_sigma(1.0, 1e-6))
    assert cal.half_width(0.78) == pytest.approx(cal.scale * stats.norm.ppf(0.89), rel=1e-12)
    source = m.NoiseSource.seeded(11)
    draws = [m.release("gaussian", 50.0, cal.scale, source) for _ in range(3000)]
    assert sum(abs(x - 50.0) <= cal.half_width(0.78) for x in draws) / 3000 == pytest.approx(0.78, abs=0.03)
