"""Generalized Cauchy noise calibrated to a β-smooth sensitivity bound (NR §3.3.7.1):

* Theorem 3.53 / 3.62 — ``f(x) + c(x)/b · η`` with η ~ GenCauchy(γ), density ∝ 1/(1 + |x|^γ), is ε-DP when
  c is a β-smooth upper bound on the derivative sensitivity and ε = (γ + 1)(b + β), i.e.
  b = ε/(γ + 1) − β (the "ε/γ − β" printed in NR §3.3.8.5 contradicts the theorem it applies).
* Theorem 3.73 — the noise level may be min over a fixed family of (b_I, β_I) of c_I(x)/b_I: β is chosen per
  input to minimise the noise. The family (the β grid) is fixed in advance and never depends on the data.

Its privacy map is pure: ε·d for a change at distance d, δ = 0 at every d (:func:`delta_at`). The exact
sampler's G for GenCauchy(4), density √2/(π(1 + x⁴)): G(a) = 2∫₀^a = (1/(2π))·ln((a² + √2a + 1)/(a² − √2a + 1))
+ (1/π)·(atan(√2a + 1) + atan(√2a − 1)).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence

from gmpy2 import mpfr, mpq

from sqldp.errors import InputError, RefusedError
from sqldp.mechanisms.calibration import GAMMA, Calibration, check_sensitivity
from sqldp.mechanisms.exact import Bounds, Noise, contexts, nearest, release, scale_bits
from sqldp.mechanisms.exact import tail as tail_of
from sqldp.mechanisms.registry import CAUCHY
from sqldp.mechanisms.source import NoiseSource

BETA_GRID_SIZE = 48


def gencauchy_abs_cdf(a: float, gamma: float = GAMMA) -> float:
    """P(|η| ≤ a) for η ~ GenCauchy(γ).

    With t = a^γ/(1 + a^γ), ∫₀^a dx/(1 + x^γ) = (1/γ)·B(t; 1/γ, 1 − 1/γ), so P(|η| ≤ a) is the regularised
    incomplete beta function I_t(1/γ, 1 − 1/γ). For γ = 4 it equals the closed form the sampler uses.
    """
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if a <= 0:
        return 0.0
    if math.isinf(a):
        return 1.0
    t = 1.0 / (1.0 + a ** (-gamma))
    return float(special.betainc(1.0 / gamma, 1.0 - 1.0 / gamma, t))


def gencauchy_abs_quantile(p: float, gamma: float = GAMMA) -> float:
    """The a with P(|η| ≤ a) = p (η ~ GenCauchy(γ)): t = I⁻¹(p; 1/γ, 1 − 1/γ), a = (t/(1 − t))^(1/γ); for
    p ≥ 1/2 through 1 − t = I⁻¹(1 − p; 1 − 1/γ, 1/γ), so that the tail (p → 1) keeps its precision."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    if p == 0.0:
        return 0.0
    if p < 0.5:
        t = float(special.betaincinv(1.0 / gamma, 1.0 - 1.0 / gamma, p))
        return (t / (1.0 - t)) ** (1.0 / gamma)
    s = float(special.betaincinv(1.0 - 1.0 / gamma, 1.0 / gamma, 1.0 - p))  # s = 1 − t
    return ((1.0 - s) / s) ** (1.0 / gamma)


def gencauchy_density(x: float, gamma: float = GAMMA) -> float:
    """The normalised density: γ·sin(π/γ)/(2π) · 1/(1 + |x|^γ)."""
    return gamma * math.sin(math.pi / gamma) / (2.0 * math.pi) / (1.0 + abs(x) ** gamma)


def _gencauchy_tail_quantile(q: float) -> float:
    """The a with P(|η| > a) = q for η ~ GenCauchy(4), in floating point (a starting point only)."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if q >= 0.5:
        return gencauchy_abs_quantile(1.0 - q)
    t1 = float(special.betaincinv(1.0 - 1.0 / GAMMA, 1.0 / GAMMA, q))  # 1 − t of gencauchy_abs_quantile
    return ((1.0 - t1) / t1) ** (1.0 / GAMMA) if t1 > 0 else 2.0**340


@functools.lru_cache(maxsize=64)
def _confidence_quantile(confidence: float, gamma: float) -> float:
    # every release asks for the same few confidences; scipy's inverse beta costs ≈ 15 µs a call
    return gencauchy_abs_quantile(confidence, gamma)


def half_width(scale: float, confidence: float, gamma: float = GAMMA) -> float:
    """The a·scale with P(|scale·η| ≤ a·scale) = confidence, η ~ GenCauchy(γ)."""
    return scale * _confidence_quantile(confidence, gamma)


def _abs_cdf_bounds(a: mpq, precision: int) -> Bounds:
    """G(a) for GenCauchy(4) (see sqldp.mechanisms.exact.Noise)."""
    if a <= 0:
        return mpfr(0), mpfr(0)
    dn, up, _ = contexts(precision)
    al, ah = mpfr(a, precision, context=dn), mpfr(a, precision, context=up)
    # GenCauchy(4): G(a) = (ln(N/D)/2 + atan(p + 1) + atan(p − 1))/π with p = √2a, N = a² + p + 1,
    # D = a² − p + 1 ≥ ½; all of a, p, a², N, D are positive
    pl, ph = dn.mul(dn.sqrt(2), al), up.mul(up.sqrt(2), ah)
    ql, qh = dn.square(al), up.square(ah)
    nl, nh = dn.add(dn.add(ql, pl), 1), up.add(up.add(qh, ph), 1)
    dl, dh = dn.add(dn.sub(ql, ph), 1), up.add(up.sub(qh, pl), 1)
    tl = dn.add(dn.div_2exp(dn.log(dn.div(nl, dh)), 1), dn.add(dn.atan(dn.add(pl, 1)), dn.atan(dn.sub(pl, 1))))
    th = up.add(up.div_2exp(up.log(up.div(nh, dl)), 1), up.add(up.atan(up.add(ph, 1)), up.atan(up.sub(ph, 1))))
    pil, pih = dn.const_pi(), up.const_pi()
    lo = dn.div(tl, pih) if tl >= 0 else dn.div(tl, pil)
    hi = up.div(th, pil) if th >= 0 else up.div(th, pih)
    return max(lo, mpfr(0)), min(hi, mpfr(1))


def _candidate(f: mpq, s: mpq, m: int, n: int) -> int:
    """G⁻¹(u) by Newton's method in MPFR from a double start, a proposal of the cell (see
    sqldp.mechanisms.exact.Noise)."""
    tail = tail_of(m, n)
    q = float(tail)
    a0 = _gencauchy_tail_quantile(q) if q > 0 else 2.0**340
    # Newton on G(a) = u: an error e in G moves a by e/g(a) ≈ e·a⁴, and s·a must be right to < 1/64 cell
    growth = 4 * max(0, math.frexp(a0)[1])
    precision = n + scale_bits(s) + growth + 32
    _, _, near = contexts(precision)
    u = 1 - tail
    a = mpfr(a0, precision, context=near)
    target = near.div(mpfr(1, precision, context=near), near.mul(64, mpfr(s, precision, context=near)))
    # Newton with the density in MPFR too (a double density would make it converge only linearly, by 2^-53 a
    # step, which is not enough when s is huge); quadratic convergence from a double start needs ~log2 of the
    # precision steps. Bounded: a candidate that is still off is corrected or re-guessed by the caller.
    for _ in range(4 + precision.bit_length()):
        lo, hi = _abs_cdf_bounds(mpq(a), precision)
        density = near.div(
            near.mul(2, near.div(near.sqrt(2), near.const_pi())), near.add(1, near.square(near.square(a)))
        )
        step = near.div(near.sub(near.div_2exp(near.add(lo, hi), 1), mpfr(u, precision, context=near)), density)
        a = near.sub(a, step)
        if a < 0:
            a = mpfr(0)
        if abs(step) < target:
            break
    return nearest(f + s * mpq(a))


NOISE = Noise(CAUCHY, _abs_cdf_bounds, _candidate, _confidence_quantile)


def sample(value: float, scale: float, source: NoiseSource) -> float:
    """``value + scale·η``, η ~ GenCauchy(4), on the exact grid (sqldp.mechanisms.exact.release)."""
    return release(NOISE, value, scale, source)


def delta_at(distances: Sequence[float] = (1.0,)) -> float:
    """The δ at the loss ε·d of a change at each distance d: 0. Theorem 3.53's proof bounds the density ratio by
    e^((γ+1)(b + β)·d) for a change at distance d (the slide scales with d, the dilation by e^(βd)), so the
    release is ε·d-DP at every d, bounded or not."""
    return 0.0


def rho(epsilon: float) -> float:
    """The ρ-zCDP of an ε-DP release: ε²/2 (Bun and Steinke, TCC 2016, Prop. 1.4)."""
    return epsilon * epsilon / 2.0


def cauchy_b(epsilon: float, beta: float, gamma: float = GAMMA) -> float:
    """b = ε/(γ + 1) − β (Theorem 3.53); refuse when no noise level can give ε."""
    b = epsilon / (gamma + 1.0) - beta
    if b <= 0:
        raise InputError(
            f"β = {beta:g} is too large for ε = {epsilon:g}: generalized Cauchy needs β < ε/(γ+1) = "
            f"{epsilon / (gamma + 1.0):g} (NR Theorem 3.53)",
            where="--beta",
        )
    return b


def calibrate_cauchy(sensitivity: float, epsilon: float, beta: float, gamma: float = GAMMA) -> Calibration:
    b = cauchy_b(epsilon, beta, gamma)
    c = check_sensitivity(sensitivity)
    return Calibration(NOISE, epsilon, None, beta, b, c, c / b, gamma)


def beta_grid(epsilon: float, gamma: float = GAMMA) -> list[float]:
    """The fixed, data-independent family of β values of Theorem 3.73 for generalized Cauchy: geometric steps
    inside the feasible interval (0, ε/(γ + 1)), where β = ε/(γ + 1) would make b = 0."""
    limit = epsilon / (gamma + 1.0)
    # from β_max/10⁴ up to 0.98·β_max: small β suits data far from its worst case, large β the rest
    lo, hi = limit * 1e-4, limit * 0.98
    n = BETA_GRID_SIZE
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def optimise(
    smooth: Callable[[float], float], epsilon: float, gamma: float = GAMMA, extra: Sequence[float] = ()
) -> Calibration:
    """β minimising the noise scale c_β(x)/b_β over the fixed grid and the ``extra`` points (NR Theorem 3.73)."""
    best: Calibration | None = None
    limit = epsilon / (gamma + 1.0)
    for beta in sorted({*beta_grid(epsilon, gamma), *(b for b in extra if 0 < b < limit)}):
        c = smooth(beta)
        if not math.isfinite(c):  # some analyses have no bound for very small β: skip those family members
            continue
        cal = calibrate_cauchy(c, epsilon, beta, gamma)
        if best is None or cal.scale < best.scale:
            best = cal
    if best is None:
        raise RefusedError("the sensitivity is unbounded for this query at every β; nothing is released")
    return best
