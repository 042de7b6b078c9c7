"""The exact sampler every additive release draws with, and the frame of a noise distribution it draws from
(:class:`Noise`; sqldp.mechanisms.laplace, sqldp.mechanisms.cauchy and sqldp.mechanisms.gaussian give theirs:
the closed form of G below, certified by MPFR, and a proposal of the cell).

**The sampler** (``release``). The theorems are about the real-valued ``Y = f + s·η``. Computing it as
``f + s·F⁻¹(u)`` in floating point is not that distribution: the set of doubles such a computation can
reach, and their probabilities, depend on f and s, so a single output can identify the true value (Mironov,
"On significance of the least significant bits for differential privacy", CCS 2012, §3). sqldp instead
releases ``K·Λ``, where Λ = 2^GRID_EXPONENT is a fixed grid that depends on nothing (not on the data, the
query, s or f) and the integer K is drawn with exactly the probabilities

    P(K = k) = P(Y ∈ [(k − ½)Λ, (k + ½)Λ)) = F(((k + ½)Λ − f)/s) − F(((k − ½)Λ − f)/s),

F the CDF of η, computed for the exact binary values of f and s. K is a function of Y (rounding to the
grid), so releasing K·Λ is post-processing of the analysed release and has the same (ε, δ) (post-processing
lemma, Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Prop. 2.1); its support is the
grid, whatever f is, and converting K·Λ to a double is a fixed function of K. The rounding moves the answer
by at most Λ/2 ≈ 4.5e−13, so error bars are those of the continuous mechanism
(sqldp.mechanisms.calibration.Calibration.half_width).

K is drawn exactly by inversion. With probability ½ each, η is +A or −A, A = |η| with CDF G; A = G⁻¹(u) for
a uniform u whose binary digits are drawn lazily from the source (the OS CSPRNG, or the seeded PRNG in test
mode): after n bits u is known to lie in the dyadic interval [m/2^n, (m + 1)/2^n). The cell k holds the
A ∈ [a_lo, a_hi) with a_lo, a_hi exact rationals, i.e. the u ∈ [G(a_lo), G(a_hi)); the sampler answers k
only when certified bounds prove G(a_lo) ≤ m/2^n and (m + 1)/2^n ≤ G(a_hi), so that every u of the interval
lies in cell k, and otherwise draws 32 more bits (and raises the precision). The answer is therefore a
function of the infinite bit string u alone, equal to the cell of f + s·G⁻¹(u) except on the boundary
points (probability 0): P(K = k) is exactly the cell probability above. The bounds come from MPFR (through
gmpy2), whose elementary functions are correctly rounded in the directed rounding modes, combined by
interval arithmetic (each operation rounded outward) over closed forms of G:

* Laplace(1): G(a) = 1 − e^(−a) = −expm1(−a);
* N(0, 1): G(a) = erf(a/√2) (MPFR's erf and erfc are correctly rounded too);
* GenCauchy(4), density √2/(π(1 + x⁴)): G(a) = 2∫₀^a = (1/(2π))·ln((a² + √2a + 1)/(a² − √2a + 1))
  + (1/π)·(atan(√2a + 1) + atan(√2a − 1)).

A float (or a few Newton steps in MPFR) only proposes the candidate k; it never decides.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import gmpy2
from gmpy2 import mpfr, mpq

from sqldp.errors import RefusedError
from sqldp.mechanisms.registry import Name
from sqldp.mechanisms.source import NoiseSource

# Λ = 2^−40 ≈ 9.1e−13: fixed, so that the grid of possible answers reveals nothing; fine enough that the
# rounding (≤ Λ/2) is far below any noise scale a release meets, and coarse enough that a draw usually needs
# only log2(s/Λ) + 24 random bits (one 64-bit word for s up to about 2^0).
GRID_EXPONENT = -40

HALF = mpq(1, 2)

Bounds = tuple[mpfr, mpfr]


@dataclass(frozen=True)
class Noise:
    """A symmetric noise distribution η, as the exact sampler needs it: G(a) = P(|η| ≤ a) certified, a proposal
    of the cell, and the quantile of |η| for error bars."""

    name: Name
    # certified bounds lo ≤ G(a) ≤ hi for an exact rational a ≥ 0, within a few units in the last place of
    # ``precision`` bits (interval arithmetic in MPFR: every operation rounded outward)
    abs_cdf_bounds: Callable[[mpq, int], Bounds]
    # (f, s, m, n) → a guess of the cell of f + s·G⁻¹(u) for u the midpoint of [m/2^n, (m + 1)/2^n); only a
    # proposal, which the sampler certifies or corrects: a wrong guess costs time, never exactness
    candidate: Callable[[mpq, mpq, int, int], int]
    # (confidence, γ) → the a with P(|η| ≤ a) = confidence
    abs_quantile: Callable[[float, float], float]
    # certified bounds on P(x1 ≤ η < x2) for a cell in one tail (x1 ≥ 0 or x2 ≤ 0) with relative precision;
    # None: the difference of two CDF values is precise enough
    tail_cell: Callable[[mpq, mpq, int], Bounds] | None = None


@functools.lru_cache(maxsize=256)
def contexts(precision: int) -> tuple[gmpy2.context, gmpy2.context, gmpy2.context]:
    """MPFR contexts rounding toward −∞, toward +∞ and to nearest; the exponent range is MPFR's widest, so
    nothing this module computes underflows or overflows."""
    wide = {"precision": precision, "emin": -(2**30) + 1, "emax": 2**30 - 1}
    return (
        gmpy2.context(round=gmpy2.RoundDown, **wide),
        gmpy2.context(round=gmpy2.RoundUp, **wide),
        gmpy2.context(round=gmpy2.RoundToNearest, **wide),
    )


def tail(m: int, n: int) -> mpq:
    """1 − u, exactly, for u the midpoint of the dyadic interval [m/2^n, (m + 1)/2^n) a candidate starts from."""
    return mpq(2 ** (n + 1) - 2 * m - 1, 2 ** (n + 1))


def scale_bits(s: mpq) -> int:
    """About log2 of the scale in grid units: how many more bits a candidate's precision needs."""
    return max(0, int(s.numerator.bit_length() - s.denominator.bit_length()))


def nearest(x: mpq) -> int:
    """The k with x ∈ [k − ½, k + ½), exactly (gmpy2.floor would round a large x to a double first)."""
    y = x + HALF
    return int(y.numerator // y.denominator)


def exact(x: float) -> mpq:
    return mpq(*x.as_integer_ratio())


def uniform_index(k: int, source: NoiseSource) -> int:
    """An index uniform on range(k), exactly (rejection sampling on whole random bits)."""
    n = max(1, (k - 1).bit_length())
    while True:
        i = source.bits(n)
        if i < k:
            return i


def one_side(noise: Noise, f: mpq, s: mpq, source: NoiseSource) -> int:
    """The k with f + s·A ∈ [k − ½, k + ½) for A = G⁻¹(u), u uniform and drawn bit by bit (s > 0, f and s in
    units of the grid). Answers only once every u of the drawn dyadic interval gives the same k."""
    scale_bits = max(0, int(s.numerator.bit_length() - s.denominator.bit_length()))
    # the cells near the mode are ≈ g(0)/s wide in u: 24 bits more make a draw that straddles two rare
    n = max(64, scale_bits + 24)
    m = source.bits(n)
    k: int | None = None
    while True:
        precision = n + 24
        if k is None:
            k = noise.candidate(f, s, m, n)
        lo_u, hi_u = mpq(m, 2**n), mpq(m + 1, 2**n)
        for _ in range(8):
            a_hi = (k + HALF - f) / s
            if a_hi <= 0:  # the whole cell lies below f, where this side puts no mass
                k += 1
                continue
            g_lo = noise.abs_cdf_bounds(max((k - HALF - f) / s, mpq(0)), precision)
            g_hi = noise.abs_cdf_bounds(a_hi, precision)
            if g_lo[1] <= lo_u and hi_u <= g_hi[0]:
                return k
            if g_hi[1] <= lo_u:  # every u of the interval is beyond this cell's upper end
                k += 1
            elif g_lo[0] >= hi_u:  # … or below its lower end
                k -= 1
            else:  # the interval straddles an end, or the bounds are too wide to tell: more bits, more precision
                break
        else:
            k = None  # the guess was far off: guess again with the longer u
        m = (m << 32) | source.bits(32)
        n += 32


def release(
    noise: Noise, value: float, scale: float, source: NoiseSource, *, grid_exponent: int = GRID_EXPONENT
) -> float:
    """The noisy answer ``K·Λ`` (Λ = 2^grid_exponent) with K distributed exactly as the grid cell of
    ``value + scale·η``, η drawn from ``noise`` (GenCauchy(4), Lap(1) or N(0, 1)); see the module
    docstring.

    ``scale == 0`` (nothing private can move the value) releases the cell of ``value`` itself."""
    if not (math.isfinite(value) and math.isfinite(scale) and scale >= 0):
        raise RefusedError("the true value or the noise scale is not finite; nothing is released")
    unit = mpq(2) ** -grid_exponent  # 1/Λ
    f, s = exact(value) * unit, exact(scale) * unit
    if s == 0:
        k = nearest(f)
    elif source.bits(1):
        k = one_side(noise, f, s, source)
    else:  # η = −A: the cell of f − s·A is minus the cell of −f + s·A (up to the ends, of probability 0)
        k = -one_side(noise, -f, s, source)
    return released(k, grid_exponent)


def released(k: int, grid_exponent: int) -> float:
    """The released double of grid cell k (K·Λ): what :func:`release` and
    sqldp.mechanisms.laplace.laplace_selection answer."""
    unit = mpq(2) ** -grid_exponent
    try:
        return k * 2.0**grid_exponent if abs(k) < 2**53 else float(mpq(k) / unit)
    except OverflowError:  # a fixed function of k: beyond the largest double
        return math.copysign(math.inf, k)


def geometric(p_lo_hi: Callable[[int], tuple[mpfr, mpfr]], source: NoiseSource) -> int:
    """G with P(G ≥ j) = (1 − p)^j (failures before the first success of Bernoulli(p) trials), exactly:
    G = ⌊ln U / ln(1 − p)⌋ for U uniform on (0, 1), whose binary digits are drawn lazily; the quotient is bounded
    by MPFR in directed rounding from certified bounds on p (``p_lo_hi(precision)``), and G is answered once
    every U of the drawn dyadic interval [m/2ⁿ, (m + 1)/2ⁿ) has the same floor. 0 < p < 1."""
    n, m = 64, source.bits(64)
    while True:
        precision = n + 64
        dn, up, _ = contexts(precision)
        p_lo, p_hi = p_lo_hi(precision)
        # |ln(1 − p)| = −log1p(−p), increasing in p; negation is exact, log1p rounded up gives the lower end
        l_lo = up.minus(up.log1p(up.minus(p_lo)))
        l_hi = up.minus(dn.log1p(dn.minus(p_hi)))
        u_lo, u_hi = mpq(m, 2**n), mpq(m + 1, 2**n)
        if m > 0 and l_lo > 0:
            # −ln U ∈ [−ln u_hi, −ln u_lo]; the quotient (−ln U)/|ln(1 − p)| falls as U grows
            q_lo = dn.div(dn.minus(up.log(mpfr(u_hi, precision, context=up))), l_hi)
            q_hi = up.div(up.minus(dn.log(mpfr(u_lo, precision, context=dn))), l_lo)
            g_lo, g_hi = int(gmpy2.floor(q_lo)), int(gmpy2.floor(q_hi))
            if g_lo == g_hi:
                return max(g_lo, 0)
        m, n = (m << 32) | source.bits(32), n + 32


def cell_probability(
    noise: Noise, value: float, scale: float, k: int, *, grid_exponent: int = GRID_EXPONENT, precision: int = 256
) -> tuple[mpfr, mpfr]:
    """Certified bounds on P(K = k) = F(((k + ½)Λ − f)/s) − F(((k − ½)Λ − f)/s) of ``release`` (s > 0), F the
    CDF of η: the distribution the sampler draws from, for tests and audits."""
    unit = mpq(2) ** -grid_exponent
    f, s = exact(value) * unit, exact(scale) * unit
    dn, up, _ = contexts(precision)

    def cdf(x: mpq) -> tuple[mpfr, mpfr]:  # F(x) = ½ + ½·sign(x)·G(|x|)
        lo, hi = noise.abs_cdf_bounds(abs(x), precision)
        if x >= 0:
            return dn.div_2exp(dn.add(1, lo), 1), up.div_2exp(up.add(1, hi), 1)
        return dn.div_2exp(dn.sub(1, hi), 1), up.div_2exp(up.sub(1, lo), 1)

    x1, x2 = (k - HALF - f) / s, (k + HALF - f) / s
    if noise.tail_cell is not None and (x1 >= 0 or x2 <= 0):
        # a cell in one tail, by the distribution's own formula with relative precision (the difference of two
        # CDF values near 0 or 1 would lose every digit in the far tail)
        return noise.tail_cell(x1, x2, precision)
    upper, lower = cdf(x2), cdf(x1)
    return max(dn.sub(upper[0], lower[1]), mpfr(0)), up.sub(upper[1], lower[0])
