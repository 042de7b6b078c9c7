"""The analytic Gaussian mechanism for a vector with a global ℓ2 bound (Balle and Wang, "Improving the Gaussian
Mechanism for Differential Privacy: Analytical Calibration and Optimal Denoising", ICML 2018, Theorem 8):
``f(x) + σ·η``, η ~ N(0, I), is (ε, δ)-DP for every f with ‖f(x) − f(x′)‖₂ ≤ Δ on neighbours iff
Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ) ≤ δ; :func:`gaussian_sigma` finds the least such σ, and
:func:`gaussian_delta_at` is its privacy map at every change distance. It is also ρ-zCDP with ρ = Δ²/(2σ²)
(Bun and Steinke, "Concentrated Differential Privacy: Simplifications, Extensions, and Lower Bounds", TCC 2016,
Prop. 1.6). The exact sampler's G for N(0, 1): G(a) = erf(a/√2) (MPFR's erf and erfc are correctly rounded).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from gmpy2 import mpfr, mpq

from sqldp.errors import InputError
from sqldp.mechanisms.calibration import Calibration, check_sensitivity
from sqldp.mechanisms.exact import Bounds, Noise, contexts, nearest, release, scale_bits, tail
from sqldp.mechanisms.registry import GAUSSIAN
from sqldp.mechanisms.source import NoiseSource


def _abs_cdf_bounds(a: mpq, precision: int) -> Bounds:
    """G(a) = erf(a/√2), increasing in a: the lower end from the least a/√2, the upper from the largest."""
    if a <= 0:
        return mpfr(0), mpfr(0)
    dn, up, _ = contexts(precision)
    al, ah = mpfr(a, precision, context=dn), mpfr(a, precision, context=up)
    lo = dn.erf(dn.div(al, up.sqrt(2)))
    hi = up.erf(up.div(ah, dn.sqrt(2)))
    return max(lo, mpfr(0)), min(hi, mpfr(1))


def _candidate(f: mpq, s: mpq, m: int, n: int) -> int:
    """G⁻¹(u) by :func:`_gaussian_quantile`, a proposal of the cell (see sqldp.mechanisms.exact.Noise)."""
    return nearest(f + s * mpq(_gaussian_quantile(tail(m, n), s, n + scale_bits(s))))


def _gaussian_quantile(tail: mpq, s: mpq, bits: int) -> mpfr:
    """The a with P(|η| > a) = erfc(a/√2) = ``tail`` for η ~ N(0, 1), to well under 1/64 of a cell (1/s): a
    double start (erfc⁻¹, or √(−2 ln tail) beyond a double's range) and Newton steps on erfc in MPFR, whose
    relative precision keeps the far tail's digits. A proposal only, like every candidate."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    q = float(tail)
    if q > 1e-300:
        a0 = math.sqrt(2.0) * float(special.erfcinv(q))
    else:
        a0 = math.sqrt(-2.0 * (math.log(tail.numerator) - math.log(tail.denominator)))
    # an error e in erfc moves a by e/g(a), g(a) = √(2/π)·e^(−a²/2): that many more bits (log2 e/2 ≈ 0.7214)
    precision = bits + int(0.7214 * a0 * a0) + 40
    _, _, near = contexts(precision)
    a = mpfr(a0, precision, context=near)
    target = near.div(mpfr(1, precision, context=near), near.mul(64, mpfr(s, precision, context=near)))
    root2, t = near.sqrt(2), mpfr(tail, precision, context=near)
    scale = near.sqrt(near.div(2, near.const_pi()))
    for _ in range(8 + precision.bit_length()):
        density = near.mul(scale, near.exp(near.minus(near.div_2exp(near.square(a), 1))))
        step = near.div(near.sub(near.erfc(near.div(a, root2)), t), density)
        a = near.add(a, step)
        if a < 0:
            a = mpfr(0)
        if abs(step) < target:
            break
    return a


def _tail_cell(x1: mpq, x2: mpq, precision: int) -> Bounds:
    """A cell in one tail: P = ½·(erfc(t/√2) − erfc(t′/√2)), t < t′ its ends' distances from 0; erfc keeps
    relative precision where 1 − erf would keep none."""
    dn, up, _ = contexts(precision)
    t, t2 = min(abs(x1), abs(x2)), max(abs(x1), abs(x2))
    r2l, r2h = dn.sqrt(2), up.sqrt(2)
    # erfc is decreasing: its lower bound from the largest argument (computed rounding up), and back
    e1l = dn.erfc(up.div(mpfr(t, precision, context=up), r2l))
    e1h = up.erfc(dn.div(mpfr(t, precision, context=dn), r2h))
    e2l = dn.erfc(up.div(mpfr(t2, precision, context=up), r2l))
    e2h = up.erfc(dn.div(mpfr(t2, precision, context=dn), r2h))
    return max(dn.div_2exp(dn.sub(e1l, e2h), 1), mpfr(0)), up.div_2exp(up.sub(e1h, e2l), 1)


def gaussian_abs_quantile(p: float) -> float:
    """The a with P(|η| ≤ a) = p for η ~ N(0, 1): a = Φ⁻¹((1 + p)/2)."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    return float(special.ndtri((1.0 + p) / 2.0))


NOISE = Noise(GAUSSIAN, _abs_cdf_bounds, _candidate, lambda p, gamma: gaussian_abs_quantile(p), _tail_cell)


def sample(value: float, scale: float, source: NoiseSource) -> float:
    """``value + scale·η``, η ~ N(0, 1), on the exact grid (sqldp.mechanisms.exact.release)."""
    return release(NOISE, value, scale, source)


def half_width(scale: float, confidence: float) -> float:
    """The a·scale with P(|scale·η| ≤ a·scale) = confidence: Φ⁻¹((1 + confidence)/2)·scale."""
    return scale * gaussian_abs_quantile(confidence)


def gaussian_delta(sigma: float, epsilon: float, l2: float = 1.0) -> float:
    """The least δ for which ``f + N(0, σ²I)`` is (ε, δ)-DP when ‖f(x) − f(x′)‖₂ ≤ l2 on neighbours (Balle and
    Wang, ICML 2018, Theorem 8): Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ), the hockey-stick divergence at
    e^ε of N(Δ, σ²) from N(0, σ²) (the ℓ2 change along one direction is the worst case)."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    a, b = l2 / (2.0 * sigma), epsilon * sigma / l2
    return float(special.ndtr(a - b) - math.exp(epsilon + special.log_ndtr(-a - b)))


def gaussian_delta_at(sigma: float, epsilon: float, distances: Sequence[float] = (1.0,)) -> float:
    """The largest δ over the changes at the given ``distances`` d of ``f + N(0, σ²I)`` for ℓ2 sensitivity 1
    per unit of distance, each at the loss ε·d it is promised: max_d of the hockey-stick divergence at e^(ε·d)
    of N(d, σ²) from N(0, σ²) (:func:`gaussian_delta` with Δ = d). For d > 1 the divergence at e^(εd) is larger
    than at distance 1 (ε = 1, δ = 10⁻³ at d = 1 gives 1.8·10⁻³ at d = 2), so a σ calibrated for distance 1 does
    not give (εd, δ) there (docs/privacy.md, "The Gaussian at distance d")."""
    return max(gaussian_delta(sigma, epsilon * d, d) for d in distances)


@functools.lru_cache(maxsize=256)
def gaussian_sigma(epsilon: float, delta: float, distances: tuple[float, ...] = (1.0,)) -> float:
    """The σ of the analytic Gaussian mechanism for ℓ2 sensitivity 1 per unit of distance (scale it by Δ₂): the
    least σ with :func:`gaussian_delta_at` ≤ δ for every change distance in ``distances`` (each divergence
    decreases in σ, so their maximum does), found by Brent's method, then raised by a relative 1e−9 — far more
    than the doubles' error in Φ moves δ — and checked, so that the σ returned is on the safe side. Unlike the
    classic σ = Δ√(2 ln(1.25/δ))/ε (Dwork & Roth Thm A.1), valid for ε < 1 only, it holds for every ε > 0 and
    is never larger. ``distances`` must be finite: no σ gives (εd, δ) for every d > 0 (the divergence at
    e^(εd) tends to 1 as d grows), which is why value-level changes never get the Gaussian
    (sqldp.release.gaussian)."""
    from scipy import optimize  # here, not at the top: scipy costs ~0.4 s to import

    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InputError(f"ε must be positive and finite, got {epsilon}", where="--epsilon")
    if not 0.0 < delta < 1.0:
        raise InputError(f"the Gaussian mechanism needs 0 < δ < 1, got {delta}", where="--delta")
    if not distances or not all(d > 0 and math.isfinite(d) for d in distances):
        raise ValueError(f"the Gaussian needs finite positive change distances, got {distances}")

    def excess(x: float) -> float:
        return gaussian_delta_at(x, epsilon, distances) - delta

    lo, hi = 1e-3, 1.0
    while excess(lo) <= 0:  # δ(σ) → 1 − 0 as σ → 0: a σ with too large a δ
        lo /= 2.0
    while excess(hi) > 0:
        hi *= 2.0
    root = float(optimize.brentq(excess, lo, hi, xtol=1e-15, rtol=1e-13))
    sigma = root * (1.0 + 1e-9)
    while excess(sigma) > 0:
        sigma *= 1.0 + 1e-9
    return sigma


def gaussian_rho(l2: float, sigma: float) -> float:
    """ρ of the ρ-zCDP that ``f + N(0, σ²I)`` gives for ℓ2 sensitivity ``l2`` (Bun and Steinke, TCC 2016,
    Prop. 1.6): Δ²/(2σ²)."""
    return l2 * l2 / (2.0 * sigma * sigma)


def zcdp_epsilon(rho: float, delta: float, longest: float = 1.0) -> float:
    """The ε for which ρ-zCDP per unit of distance gives (ε·d, δ)-DP for every change at distance d ≤
    ``longest``. ρ-zCDP at distance 1 is ρd²-zCDP at distance d (a pure ε-DP release is (εd)²/2-, a Gaussian of
    ℓ2 sensitivity d per change d²/(2σ²)-zCDP), which gives (ρd² + 2d√(ρ ln(1/δ)), δ)-DP (Bun and Steinke,
    TCC 2016, Prop. 1.3) = (d·(ρd + 2√(ρ ln(1/δ))), δ): so ε = ρ·max(1, D) + 2√(ρ ln(1/δ)) for D = ``longest``.
    No finite ε holds for unbounded distances (value-level changes): ``longest`` must be finite."""
    if not math.isfinite(longest):
        raise ValueError("zCDP gives no (εd, δ) for every d: the change distances must be bounded")
    return rho * max(1.0, longest) + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def gaussian_wins(epsilon: float, delta: float, values: int, distances: tuple[float, ...] = (1.0,)) -> bool:
    """Whether ``values`` global bounds released together get less noise from one Gaussian release than from
    Laplace at an equal ε split (sqldp.release.shares), from (ε, δ) and the count alone — data-independent.

    Laplace gives aggregate i the scale k·c_i/ε (ε/k each, c_i its ℓ1 bound over the groups); the Gaussian,
    releasing f_i/c_i whose vector moves by ≤ √k in ℓ2 (each part's ℓ2 ≤ its ℓ1 ≤ 1), gives it σ = c_i·√k·σ₁,
    σ₁ = :func:`gaussian_sigma` (ε, δ). Both are proportional to c_i, so one comparison decides for every
    aggregate: median |noise| ln 2·k/ε against Φ⁻¹(¾)·√k·σ₁ (the measure the truncation choice uses). At
    ε = 1, δ = 10⁻⁶ (σ₁ ≈ 4.22) the Gaussian wins from k = 17 values on. σ₁ is calibrated for every change
    distance in ``distances`` (table weights); Laplace's ε·d at distance d needs no change."""
    laplace = math.log(2.0) * values / epsilon
    gaussian = gaussian_abs_quantile(0.5) * math.sqrt(values) * gaussian_sigma(epsilon, delta, distances)
    return gaussian < laplace


def calibrate_gaussian(
    sensitivity: float, epsilon: float, delta: float, values: int, distances: tuple[float, ...] = (1.0,)
) -> Calibration:
    """One coordinate of a Gaussian release of ``values`` global bounds together at (ε·d, δ) for a change at
    each distance d in ``distances``: σ = c·√k·σ₁ (see :func:`gaussian_wins`). ``epsilon`` and ``delta`` are
    the whole release's."""
    c = check_sensitivity(sensitivity)
    sigma = c * math.sqrt(values) * gaussian_sigma(epsilon, delta, distances)
    return Calibration(NOISE, epsilon, delta, 0.0, epsilon, c, sigma)
