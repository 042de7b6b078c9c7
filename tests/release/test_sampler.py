"""The exact noise sampler (``mechanisms.release``): its output is the analysed continuous release rounded to a
fixed grid, drawn exactly, so the guarantee of NR Theorems 3.53 and 3.56 holds for the doubles it prints and
the floating-point attack of Mironov (CCS 2012) has nothing to read."""

from __future__ import annotations

import math
from fractions import Fraction

import gmpy2
import pytest
from gmpy2 import mpfr, mpq
from oracles import max_log_ratio
from scipy import integrate, stats

from sqldp import mechanisms as m
from sqldp.errors import RefusedError

LAMBDA = 2.0**m.GRID_EXPONENT
GC4 = 4.0


def closed_form_gc4(a: float) -> float:
    """P(|η| ≤ a) for GenCauchy(4), the antiderivative of √2/(π(1 + x⁴)) written out independently."""
    r2 = math.sqrt(2.0)
    return (1 / (2 * math.pi)) * math.log((a * a + r2 * a + 1) / (a * a - r2 * a + 1)) + (1 / math.pi) * (
        math.atan(r2 * a + 1) + math.atan(r2 * a - 1)
    )


def cdf(kind: str, x: float) -> float:
    """The analysed CDF of η, through scipy / the incomplete-beta form (independent of the sampler)."""
    if kind == "laplace":
        return float(stats.laplace.cdf(x))
    return 0.5 + math.copysign(m.gencauchy_abs_cdf(abs(x)) / 2, x)


def prob(kind: str, f: float, s: float, k: int) -> mpfr:
    lo, hi = m.cell_probability(kind, f, s, k)
    assert lo <= hi and hi - lo <= abs(hi) * mpfr(2.0**-200) + mpfr(2.0**-240)  # tight, certified bounds
    return lo


def _reference_abs_cdf(kind: str, a: mpq) -> mpfr:
    """G(a) at 2000 bits, rounded to nearest (independent of the sampler's interval code)."""
    ctx = gmpy2.context(precision=2000)
    x = ctx.add(mpfr(0, 2000), a)
    if kind == "laplace":
        return ctx.sub(1, ctx.exp(ctx.sub(0, x)))
    r2 = ctx.sqrt(2)
    num, den = ctx.add(ctx.add(ctx.square(x), ctx.mul(r2, x)), 1), ctx.add(ctx.sub(ctx.square(x), ctx.mul(r2, x)), 1)
    t = ctx.add(
        ctx.div(ctx.log(ctx.div(num, den)), 2),
        ctx.add(ctx.atan(ctx.add(ctx.mul(r2, x), 1)), ctx.atan(ctx.sub(ctx.mul(r2, x), 1))),
    )
    return ctx.div(t, ctx.const_pi())


@pytest.mark.parametrize("kind", ["cauchy", "laplace"])
@pytest.mark.parametrize("precision", [64, 120, 300])
def test_interval_bounds_enclose_a_high_precision_reference(kind: str, precision: int) -> None:
    """The certified bounds must hold at every precision, not only to a double's 1e−13: an operation done
    outside the directed-rounding contexts (Python's unary minus on an mpfr rounds to 53 bits) breaks this."""
    for a in (mpq(1, 3), mpq(2236, 1000) + mpq(1, 2**90), mpq(17, 1), mpq(10**6, 7)):
        lo, hi = m.noise(kind).abs_cdf_bounds(a, precision)
        ref = _reference_abs_cdf(kind, a)
        assert mpq(lo) <= mpq(ref) <= mpq(hi), (kind, precision, a)
        assert mpq(hi) - mpq(lo) <= mpq(1, 2 ** (precision - 8))


@pytest.mark.parametrize("a", [0.0, 1e-9, 0.3, 0.7071, 1.0, 2.5, 17.0, 1e3, 1e7])
def test_interval_bounds_enclose_the_analysed_cdf(a: float) -> None:
    """The sampler's certified G(a) = P(|η| ≤ a) against independent evaluations: the incomplete-beta form and
    the closed form near the centre, and for the tail 1 − G by quadrature of the density (where 1 − G in
    double precision has lost its digits)."""
    # ∫_a^∞ 2g(x) dx with x = a/t: smooth on (0, 1] for any a
    density0 = 2 * m.gencauchy_density(0.0)
    if a < 1:
        tail = 1 - integrate.quad(lambda x: 2 * m.gencauchy_density(x), 0, a, epsabs=0, epsrel=1e-13)[0]
    else:
        tail, _ = integrate.quad(lambda t: density0 * a * t * t / (t**4 + a**4), 0, 1, epsabs=0, epsrel=1e-12)
    for kind, exact, exact_tail in (
        ("cauchy", m.gencauchy_abs_cdf(a), tail),
        ("laplace", -math.expm1(-a), math.exp(-a)),
    ):
        lo, hi = m.noise(kind).abs_cdf_bounds(mpq(a), 120)
        assert lo <= hi and hi - lo < mpfr(2.0**-110)
        assert float(lo) == pytest.approx(exact, abs=1e-13) and float(hi) == pytest.approx(exact, abs=1e-13)
        assert float(1 - lo) == pytest.approx(exact_tail, rel=1e-9, abs=1e-30)
    if a > 0:
        assert closed_form_gc4(a) == pytest.approx(m.gencauchy_abs_cdf(a), abs=1e-13)


@pytest.mark.parametrize("kind", ["cauchy", "laplace"])
def test_cell_probabilities_are_the_cdf_differences_and_sum_to_one(kind: str) -> None:
    f, s = 0.3 + LAMBDA / 3, 2.0**-35  # f off the grid; cells of width Λ = s/32
    centre = round(f / LAMBDA)
    ks = range(centre - 2000, centre + 2001)
    total = sum((prob(kind, f, s, k) for k in ks), mpfr(0))
    outside = cdf(kind, ((ks[0] - 0.5) * LAMBDA - f) / s) + 1 - cdf(kind, ((ks[-1] + 0.5) * LAMBDA - f) / s)
    assert float(total) + outside == pytest.approx(1.0, abs=1e-12)
    for k in (centre - 40, centre - 1, centre, centre + 1, centre + 7, centre + 300):
        expected = cdf(kind, ((k + 0.5) * LAMBDA - f) / s) - cdf(kind, ((k - 0.5) * LAMBDA - f) / s)
        assert float(prob(kind, f, s, k)) == pytest.approx(expected, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize("kind", ["cauchy", "laplace"])
def test_draws_follow_the_exact_cell_probabilities(kind: str) -> None:
    """χ² of 6000 seeded draws against the exact cell probabilities, with a scale of a few cells so that the
    grid shows; and the same draws fail against the cells of a value shifted by one cell (the test has
    power)."""
    f, s = 5.0 + 0.37 * LAMBDA, 3.0 * LAMBDA
    source = m.NoiseSource.seeded(20261123)
    draws = [m.release(kind, f, s, source) for _ in range(6000)]
    ks = [round(x / LAMBDA) for x in draws]
    assert all(k * LAMBDA == x for k, x in zip(ks, draws, strict=True))
    centre = round(f / LAMBDA)
    bins = list(range(centre - 8, centre + 9))

    def pvalue(shift: int) -> float:
        probs = [float(prob(kind, f, s, k - shift)) for k in bins]
        observed = [ks.count(k) for k in bins]
        expected = [p * len(ks) for p in probs]
        observed.append(len(ks) - sum(observed))
        expected.append(len(ks) - sum(expected))
        return float(stats.chisquare(observed, expected).pvalue)

    assert pvalue(0) > 1e-3
    assert pvalue(1) < 1e-6


@pytest.mark.parametrize("kind", ["cauchy", "laplace"])
def test_draws_at_ordinary_scales_fit_the_continuous_mechanism(kind: str) -> None:
    """Kolmogorov–Smirnov of 3000 draws (CSPRNG) of the standardised noise against the analysed CDF; a
    wrong distribution is rejected by the same test."""
    source = m.NoiseSource()
    f, s = 123.456, 7.5
    z = [(m.release(kind, f, s, source) - f) / s for _ in range(3000)]
    assert stats.kstest([cdf(kind, v) for v in z], "uniform").pvalue > 1e-3
    assert stats.kstest(z, stats.norm.cdf).pvalue < 1e-3


@pytest.mark.parametrize("kind", ["cauchy", "laplace"])
def test_output_support_is_the_grid_whatever_the_true_value(kind: str) -> None:
    """Mironov's attack reads which doubles are reachable: here every output of two true values that differ by
    no multiple of Λ lies on the same grid kΛ (the old ``f + s·F⁻¹(u)`` fails this)."""
    source = m.NoiseSource.seeded(1)
    for f in (0.1, 0.1 + LAMBDA / 3, 1234.5678, -3.3e-7):
        for s in (1e-3, 5.0, 3.3e6):
            for _ in range(30):
                x = m.release(kind, f, s, source)
                k = Fraction(x) / Fraction(LAMBDA)
                assert k.denominator == 1, (f, s, x)


def test_zero_scale_releases_the_cell_of_the_value() -> None:
    source = m.NoiseSource.seeded(1)
    assert m.release("cauchy", 300.0, 0.0, source) == 300.0
    assert m.release("laplace", 0.1, 0.0, source) == round(0.1 / LAMBDA) * LAMBDA


def test_huge_values_and_scales_stay_exact_and_finite() -> None:
    source = m.NoiseSource.seeded(2)
    for f, s in ((1.2345e15, 3.7e9), (-1e300, 1e290), (0.0, 1e-300)):
        for kind in ("cauchy", "laplace"):
            x = m.release(kind, f, s, source)
            assert math.isfinite(x) and Fraction(x) % Fraction(LAMBDA) == 0
            assert abs(x - f) < 1e9 * s + LAMBDA


def test_non_finite_inputs_are_refused_and_unknown_kinds_rejected() -> None:
    source = m.NoiseSource.seeded(3)
    with pytest.raises(RefusedError, match="not finite"):
        m.release("cauchy", math.inf, 1.0, source)
    with pytest.raises(RefusedError, match="not finite"):
        m.release("cauchy", 1.0, math.nan, source)
    with pytest.raises(ValueError, match="unknown mechanism"):
        m.release("gauss", 1.0, 1.0, source)


def test_seeded_release_is_reproducible() -> None:
    a, b = m.NoiseSource.seeded(9), m.NoiseSource.seeded(9)
    assert [m.release("cauchy", 1.5, 2.0, a) for _ in range(5)] == [m.release("cauchy", 1.5, 2.0, b) for _ in range(5)]
    assert a.test_mode and not m.NoiseSource().test_mode


def _worst_log_ratio(kind: str, x: tuple[float, float], y: tuple[float, float], ks: list[int]) -> float:
    """The largest |ln P_x(k) − ln P_y(k)| over the cells ``ks``, the exact probabilities of each printed value."""
    p, q = ({k: prob(kind, *z, k) for k in ks} for z in (x, y))
    assert all(v > 0 for v in (*p.values(), *q.values()))  # full support: no cell reveals which database it was
    return max_log_ratio(p, q)


def _cells(f: float, s: float) -> list[int]:
    """Cells from the centre out to 10⁶ noise scales on both sides (tails included)."""
    centre = round(f / LAMBDA)
    offsets = sorted({0, 1, 2, 5, *(round(s / LAMBDA * 10 ** (e / 4)) for e in range(-8, 25))})
    return sorted({centre + sign * o for o in offsets for sign in (1, -1)})


def test_exact_output_probabilities_are_cauchy_epsilon_dp() -> None:
    """NR Theorem 3.53: with s = c/b, b = ε/(γ + 1) − β, neighbours move f by at most c and c by a factor
    e^(±β); the exact probabilities of every printed value then differ by at most e^ε, tails included."""
    eps, beta = 1.0, 0.05
    b = eps / (GC4 + 1) - beta
    c = 3.0 * LAMBDA * 1.37  # a few cells, so that the rounding matters
    f = 10.0 + LAMBDA / 7
    worst = 0.0
    for f2 in (f - c, f + c):
        for factor in (math.exp(-beta), 1.0, math.exp(beta)):
            x, y = (f, c / b), (f2, c * factor / b)
            worst = max(worst, _worst_log_ratio("cauchy", x, y, _cells(f, c / b)))
    assert worst <= eps
    assert worst > 0.3 * eps  # the pairs do use a good part of the budget
    # a neighbour moved by 30c is not covered by the theorem, and the check sees it
    assert _worst_log_ratio("cauchy", (f, c / b), (f + 30 * c, c / b), _cells(f, c / b)) > eps


def test_exact_output_probabilities_are_laplace_epsilon_dp_for_a_global_bound() -> None:
    """NR Theorem 3.56 with β = 0 (a global bound, δ = 0): s = c/ε and |f − f′| ≤ c give ratios ≤ e^ε."""
    eps = 0.5
    c = 5.0 * LAMBDA + LAMBDA / 3
    f = -2.0 + LAMBDA / 5
    worst = max(_worst_log_ratio("laplace", (f, c / eps), (f2, c / eps), _cells(f, c / eps)) for f2 in (f - c, f + c))
    assert eps * 0.9 < worst <= eps * (1 + 1e-12)
    assert _worst_log_ratio("laplace", (f, c / eps), (f + 3 * c, c / eps), _cells(f, c / eps)) > eps


def test_error_bar_quantiles_are_unchanged() -> None:
    """The symmetric error bars are those of the continuous mechanism (NR §3.3.8.5): 78 % of the noise of
    GenCauchy(4) lies within 0.998780 scales, of Laplace within 1.514128; the sampler's draws agree."""
    cal = m.calibrate_cauchy(1.0, 1.0, 0.1)
    assert cal.half_width(0.78) == pytest.approx(10.0 * 0.998780, rel=1e-6)
    lap = m.calibrate_laplace(2.0, 1.0, m.laplace_delta(1.0, 0.1, 0.1), 0.1)
    assert lap.half_width(0.78) == pytest.approx(20.0 * 1.514128, rel=1e-6)
    source = m.NoiseSource.seeded(11)
    for kind, c in (("cauchy", cal), ("laplace", lap)):
        inside = sum(abs(m.release(kind, 50.0, c.scale, source) - 50.0) <= c.half_width(0.78) for _ in range(3000))
        assert inside / 3000 == pytest.approx(0.78, abs=0.03)
