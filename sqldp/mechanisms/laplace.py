"""The Laplace mechanism: on a global bound (ε-DP; Dwork, McSherry, Nissim and Smith, "Calibrating noise to
sensitivity in private data analysis", TCC 2006) and on a β-smooth bound (NR Theorem 3.56: ``f(x) + c(x)/b · η``
with η ~ Lap(1) and b + β ≤ ε is (ε, δ)-DP with δ = 2·e^(ε − 1 − (ε − b)/β)), with its privacy map at every
change distance (:func:`delta_at`), its exact sampler (:data:`NOISE`, G(a) = 1 − e^(−a) = −expm1(−a)) and
the selection of many equal draws above a threshold (:func:`laplace_selection`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from gmpy2 import mpfr, mpq

from sqldp.errors import InputError, RefusedError
from sqldp.mechanisms.calibration import Calibration, check_sensitivity
from sqldp.mechanisms.exact import (
    GRID_EXPONENT,
    HALF,
    Bounds,
    Noise,
    contexts,
    exact,
    geometric,
    nearest,
    one_side,
    release,
    released,
    scale_bits,
    tail,
)
from sqldp.mechanisms.registry import LAPLACE
from sqldp.mechanisms.source import NoiseSource


def laplace_abs_quantile(p: float) -> float:
    """The a with P(|η| ≤ a) = p for η ~ Lap(1): a = −ln(1 − p)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    return -math.log1p(-p)


def half_width(scale: float, confidence: float) -> float:
    """The a·scale with P(|scale·η| ≤ a·scale) = confidence: −ln(1 − confidence)·scale."""
    return scale * laplace_abs_quantile(confidence)


def _abs_cdf_bounds(a: mpq, precision: int) -> Bounds:
    """G(a) = −expm1(−a), increasing in a (see sqldp.mechanisms.exact.Noise)."""
    if a <= 0:
        return mpfr(0), mpfr(0)
    dn, up, _ = contexts(precision)
    al, ah = mpfr(a, precision, context=dn), mpfr(a, precision, context=up)
    # negation through the contexts (exact at the operand's precision): Python's unary minus on an mpfr rounds
    # to the *global* context's 53 bits, which would void the bounds
    return dn.minus(up.expm1(up.minus(al))), up.minus(dn.expm1(dn.minus(ah)))


def _candidate(f: mpq, s: mpq, m: int, n: int) -> int:
    """G⁻¹(u) = −ln(1 − u) in MPFR, a proposal of the cell (see sqldp.mechanisms.exact.Noise)."""
    _, _, near = contexts(n + scale_bits(s) + 32)
    a = near.minus(near.log(mpfr(tail(m, n), near.precision, context=near)))
    return nearest(f + s * mpq(a))


def _tail_cell(x1: mpq, x2: mpq, precision: int) -> Bounds:
    """A cell in one tail: P = ½·e^(−t)·(1 − e^(−w)) with t = min(|x1|, |x2|) and w = x2 − x1, computed with
    relative precision (Laplace cells in the far tail are e^(−10⁶) small)."""
    dn, up, _ = contexts(precision)
    t, w = min(abs(x1), abs(x2)), x2 - x1
    tl, th = mpfr(t, precision, context=dn), mpfr(t, precision, context=up)
    wl, wh = mpfr(w, precision, context=dn), mpfr(w, precision, context=up)
    lo = dn.mul(dn.exp(dn.minus(th)), dn.minus(up.expm1(up.minus(wl))))
    hi = up.mul(up.exp(up.minus(tl)), up.minus(dn.expm1(dn.minus(wh))))
    return dn.div_2exp(lo, 1), up.div_2exp(hi, 1)


NOISE = Noise(LAPLACE, _abs_cdf_bounds, _candidate, lambda p, gamma: laplace_abs_quantile(p), _tail_cell)


def sample(value: float, scale: float, source: NoiseSource) -> float:
    """``value + scale·η``, η ~ Lap(1), on the exact grid (sqldp.mechanisms.exact.release)."""
    return release(NOISE, value, scale, source)


def laplace_b(epsilon: float, delta: float, beta: float) -> float:
    """The b of Theorem 3.56 for a target δ: δ = 2e^(ε − 1 − (ε − b)/β) ⇔ b = ε − β(ε − 1 − ln(δ/2)).
    β = 0 means a global (0-smooth) bound: b = ε, δ unused."""
    if beta == 0.0:
        return epsilon
    b = epsilon - beta * (epsilon - 1.0 - math.log(delta / 2.0))
    if b <= 0 or b + beta > epsilon:
        raise InputError(
            f"β = {beta:g} is too large for ε = {epsilon:g} and δ = {delta:g}: the Laplace mechanism needs "
            f"β < ε/(ε − 1 − ln(δ/2)) = {laplace_beta_limit(epsilon, delta):g} (NR Theorem 3.56)",
            where="--beta",
        )
    return b


def laplace_beta_limit(epsilon: float, delta: float) -> float:
    return epsilon / (epsilon - 1.0 - math.log(delta / 2.0))


def laplace_delta_at(epsilon: float, b: float, beta: float, distances: Sequence[float] = (1.0,)) -> float:
    """The δ of the smoothed Laplace f(x) + (c(x)/b)·Lap(1) (c a β-smooth bound) for one change at each distance
    d of ``distances``, at the loss ε·d: NR Theorem 3.56's δ (:func:`laplace_delta`) for d ≤ 1, and
    :func:`_laplace_delta_beyond_one` above."""
    return max(laplace_delta(epsilon, b, beta), _laplace_delta_beyond_one(epsilon, b, beta, distances))


def _laplace_delta_beyond_one(epsilon: float, b: float, beta: float, distances: Sequence[float]) -> float:
    """For each d > 1: exp(−d·(ε − b·e^(βd))/(e^(βd) − 1)) where β + b·e^(βd) ≤ ε, else 1 (no such δ); 0 when no
    d exceeds 1. At distance d the two scales differ by e^(βd) and the means by up to d·e^(βd)·c (NR Lemma
    3.78); the density ratio is then at most e^(βd + b·d·e^(βd)) from the narrower side, and from the wider
    side e^(b·d·e^(βd) + |η|(e^(βd) − 1)), which exceeds e^(εd) only when |η| > d·(ε − b·e^(βd))/(e^(βd) − 1)
    (docs/privacy.md, "The smoothed Laplace at distance d"). The theorem's own δ does not grow with d, which
    fails there: at ε = 1, δ = 10⁻⁶ and sqldp's β = 0.0345, b = ½, a change at distance 20 has hockey-stick
    divergence 0.115. ∞ (a value in a norm): 1."""
    out = 0.0
    for d in distances:
        if d <= 1.0 or beta == 0.0:
            continue
        if not math.isfinite(d):
            return 1.0
        grow = math.exp(beta * d)
        if beta + b * grow > epsilon:
            return 1.0
        out = max(out, math.exp(-d * (epsilon - b * grow) / math.expm1(beta * d)))
    return out


def laplace_beta(epsilon: float, delta: float, distances: Sequence[float] = (1.0,)) -> tuple[float, float]:
    """sqldp's (β, b) for the smoothed Laplace at (ε, δ): b = ε/2 and β = half of Theorem 3.56's limit (whose δ
    is then the target, by construction, and only smaller at a smaller β), lowered by bisection (60 halvings of
    the interval) until :func:`_laplace_delta_beyond_one` ≤ δ at every change distance above 1 too;
    data-independent. Raises where no β > 0 keeps δ (an unbounded distance)."""
    beta, b = 0.5 * laplace_beta_limit(epsilon, delta), 0.5 * epsilon  # laplace_b at half the limit is ε/2
    if _laplace_delta_beyond_one(epsilon, b, beta, distances) <= delta:
        return beta, b
    if any(not math.isfinite(d) for d in distances):
        raise RefusedError("the smoothed Laplace keeps no δ for changes of unbounded distance (a value in a norm)")
    lo, hi = 0.0, beta
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if _laplace_delta_beyond_one(epsilon, b, mid, distances) <= delta:
            lo = mid
        else:
            hi = mid
    if lo == 0.0:
        raise RefusedError(f"the smoothed Laplace keeps δ = {delta:g} at no β for change distances {distances}")
    return lo, b


def laplace_delta(epsilon: float, b: float, beta: float) -> float:
    """δ of Theorem 3.56 (with the factor 2: ε = 1, b = β = 0.1 → 2.4682e−4)."""
    if beta == 0.0:
        return 0.0
    return 2.0 * math.exp(epsilon - 1.0 - (epsilon - b) / beta)


def rho(epsilon: float) -> float:
    """The ρ-zCDP of a pure ε-DP release (Laplace on a global bound): ε²/2 (Bun and Steinke, TCC 2016, Prop. 1.4).
    The smoothed Laplace spends δ, which zCDP does not express."""
    return epsilon * epsilon / 2.0


def calibrate_laplace(
    sensitivity: float, epsilon: float, delta: float | None, beta: float, distances: Sequence[float] = (1.0,)
) -> Calibration:
    if not delta:
        raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Theorem 3.56)", where="--delta")
    b = laplace_b(epsilon, delta, beta)  # Theorem 3.56's δ at distance 1, by construction
    if _laplace_delta_beyond_one(epsilon, b, beta, distances) > delta:
        raise InputError(
            f"β = {beta:g} keeps δ = {delta:g} only for changes at distance ≤ 1; this query's changes reach "
            f"{max(distances):g} (a table weight): choose a smaller β or let sqldp choose it",
            where="--beta",
        )
    c = check_sensitivity(sensitivity)
    return Calibration(NOISE, epsilon, delta, beta, b, c, c / b)


def calibrate_global(sensitivity: float, epsilon: float) -> Calibration:
    """Laplace noise at c/ε for a bound c that holds on every database (a global sensitivity): ε-DP with
    δ = 0 and no smoothing (β = 0, b = ε; Dwork, McSherry, Nissim and Smith, TCC 2006)."""
    c = check_sensitivity(sensitivity)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InputError(f"ε must be positive and finite, got {epsilon}", where="--epsilon")
    return Calibration(NOISE, epsilon, 0.0, 0.0, epsilon, c, c / epsilon)


def optimise(
    smooth: Callable[[float], float], epsilon: float, delta: float | None, distances: Sequence[float]
) -> Calibration:
    """The smoothed Laplace at sqldp's data-independent β (:func:`laplace_beta`): NR Theorem 3.73, which lets
    β follow the data, is proved for generalized Cauchy only."""
    if not delta:
        raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Theorem 3.56)", where="--delta")
    beta, b = laplace_beta(epsilon, delta, distances)
    c = check_sensitivity(smooth(beta))
    return Calibration(NOISE, epsilon, delta, beta, b, c, c / b)


def laplace_selection(
    count: int, value: float, scale: float, threshold: float, source: NoiseSource, *, grid_exponent: int = GRID_EXPONENT
) -> dict[int, float]:
    """Which of ``count`` independent draws ``release(NOISE, value, scale)`` come out above ``threshold``, and
    their released values: exactly the joint distribution of ``count`` calls of sqldp.mechanisms.exact.release
    each followed by ``> threshold``, in time that grows with the number selected rather than with ``count``
    when few are (DP partition selection: every present group of one class has the same true value, scale and
    τ).

    A draw is selected when its cell K has K·Λ > τ, i.e. K ≥ k₀ = ⌊τ/Λ⌋ + 1, i.e. f + s·η ≥ k₀ − ½ (the cell's
    lower end; f, s in grid units), i.e. η ≥ c = (k₀ − ½ − f)/s. For c > 0 that has probability p = ½·e^(−c),
    independently per draw, so the indices selected are found by geometric gaps
    (sqldp.mechanisms.exact.geometric). Given η ≥ c > 0, η lies on the positive side and η − c ~ Exp(1)
    (memorylessness), so the selected draw's cell is that of (k₀ − ½) + s·A with A ~ Exp(1):
    sqldp.mechanisms.exact.one_side from k₀ − ½, the very sampler the release uses on its positive side. For
    c ≤ 0 (p ≥ ½) each draw is made by the release itself."""
    unit = mpq(2) ** -grid_exponent
    f, s = exact(value) * unit, exact(scale) * unit
    t = exact(threshold) * unit
    k0 = int(t.numerator // t.denominator) + 1
    c = (k0 - HALF - f) / s if s > 0 else mpq(-1)
    if c <= 0:
        out = {}
        for i in range(count):
            v = release(NOISE, value, scale, source, grid_exponent=grid_exponent)
            if v > threshold:
                out[i] = v
        return out

    def p_bounds(precision: int) -> tuple[mpfr, mpfr]:
        dn, up, _ = contexts(precision)
        c_lo, c_hi = mpfr(c, precision, context=dn), mpfr(c, precision, context=up)
        return dn.div_2exp(dn.exp(dn.minus(c_hi)), 1), up.div_2exp(up.exp(up.minus(c_lo)), 1)

    out = {}
    i = -1
    while True:
        i += geometric(p_bounds, source) + 1
        if i >= count:
            return out
        out[i] = released(one_side(NOISE, k0 - HALF, s, source), grid_exponent)
