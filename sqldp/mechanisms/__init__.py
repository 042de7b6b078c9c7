"""Noise: generalized Cauchy (ε-DP) and Laplace ((ε, δ)-DP) calibrated to a β-smooth sensitivity bound, and the
Gaussian mechanism ((ε, δ)-DP) for a vector with a global ℓ2 bound.

Pure functions, no database. The mechanisms are those of NR §3.3.7.1:

* Theorem 3.53 / 3.62 — ``f(x) + c(x)/b · η`` with η ~ GenCauchy(γ), density ∝ 1/(1 + |x|^γ), is ε-DP when
  c is a β-smooth upper bound on the derivative sensitivity and ε = (γ + 1)(b + β), i.e.
  b = ε/(γ + 1) − β (the "ε/γ − β" printed in NR §3.3.8.5 contradicts the theorem it applies).
* Theorem 3.56 — the same with η ~ Lap(1) and b + β ≤ ε is (ε, δ)-DP with δ = 2·e^(ε − 1 − (ε − b)/β).
* Theorem 3.73 — for generalized Cauchy, the noise level may be min over a fixed family of (b_I, β_I) of
  c_I(x)/b_I: β is chosen per input to minimise the noise. The family (the β grid) is fixed in advance and
  never depends on the data.
* The analytic Gaussian mechanism (Balle and Wang, "Improving the Gaussian Mechanism for Differential
  Privacy: Analytical Calibration and Optimal Denoising", ICML 2018, Theorem 8): ``f(x) + σ·η``, η ~ N(0, I),
  is (ε, δ)-DP for every f with ‖f(x) − f(x′)‖₂ ≤ Δ on neighbours iff
  Φ(Δ/(2σ) − εσ/Δ) − e^ε·Φ(−Δ/(2σ) − εσ/Δ) ≤ δ; :func:`gaussian_sigma` finds the least such σ. It is also
  ρ-zCDP with ρ = Δ²/(2σ²) (Bun and Steinke, "Concentrated Differential Privacy: Simplifications, Extensions,
  and Lower Bounds", TCC 2016, Prop. 1.6).

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
by at most Λ/2 ≈ 4.5e−13, so error bars are those of the continuous mechanism (``Calibration.half_width``).

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
import random
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import gmpy2
from gmpy2 import mpfr, mpq

from sqldp.errors import InputError, RefusedError

GAMMA = 4.0  # NR §4.3.3: the tool fixes γ = 4 for generalized Cauchy
BETA_GRID_SIZE = 48
# Λ = 2^−40 ≈ 9.1e−13: fixed, so that the grid of possible answers reveals nothing; fine enough that the
# rounding (≤ Λ/2) is far below any noise scale a release meets, and coarse enough that a draw usually needs
# only log2(s/Λ) + 24 random bits (one 64-bit word for s up to about 2^0).
GRID_EXPONENT = -40


class NoiseSource:
    """Uniform variates on (0, 1) from the OS CSPRNG, or (test mode only) from a seeded PRNG."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self.test_mode = rng is not None

    @classmethod
    def seeded(cls, seed: int) -> NoiseSource:
        """TEST MODE: reproducible noise. Every result built with it carries ``test_mode = True``."""
        return cls(random.Random(seed))

    def bits(self, n: int) -> int:
        """n uniform random bits, as an integer in [0, 2^n)."""
        return self._rng.getrandbits(n)

    def uniform(self) -> float:
        """A uniform variate in the open interval (0, 1)."""
        while True:
            u = self._rng.random()
            if u > 0.0:
                return u

    def sign(self) -> float:
        return 1.0 if self._rng.random() < 0.5 else -1.0

    def index(self, n: int) -> int:
        """A uniform integer in [0, n), exactly (``randrange`` rejects the bits past n)."""
        return self._rng.randrange(n)


# -- distributions --------------------------------------------------------------------------------


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


def laplace_abs_quantile(p: float) -> float:
    """The a with P(|η| ≤ a) = p for η ~ Lap(1): a = −ln(1 − p)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    return -math.log1p(-p)


# -- the exact sampler ----------------------------------------------------------------------------

KINDS = ("cauchy", "laplace", "gaussian")  # the noise distributions ``release`` draws from

_HALF = mpq(1, 2)


@functools.lru_cache(maxsize=256)
def _contexts(precision: int) -> tuple[gmpy2.context, gmpy2.context, gmpy2.context]:
    """MPFR contexts rounding toward −∞, toward +∞ and to nearest; the exponent range is MPFR's widest, so
    nothing this module computes underflows or overflows."""
    wide = {"precision": precision, "emin": -(2**30) + 1, "emax": 2**30 - 1}
    return (
        gmpy2.context(round=gmpy2.RoundDown, **wide),
        gmpy2.context(round=gmpy2.RoundUp, **wide),
        gmpy2.context(round=gmpy2.RoundToNearest, **wide),
    )


def _abs_cdf_bounds(kind: str, a: mpq, precision: int) -> tuple[mpfr, mpfr]:
    """Certified bounds lo ≤ G(a) ≤ hi on G(a) = P(|η| ≤ a), for an exact rational a ≥ 0; each bound is within
    a few units in the last place of ``precision`` bits of G(a) (an absolute error, since G ≤ 1).

    Interval arithmetic: every operation is done twice by MPFR, rounded down for the lower end of its result
    and up for the upper end, from the ends of its operands that make the result smallest and largest."""
    if a <= 0:
        return mpfr(0), mpfr(0)
    dn, up, _ = _contexts(precision)
    al, ah = mpfr(a, precision, context=dn), mpfr(a, precision, context=up)
    if kind == "laplace":
        # G = −expm1(−a), increasing in a. Negation through the contexts (exact at the operand's precision):
        # Python's unary minus on an mpfr rounds to the *global* context's 53 bits, which would void the bounds
        return dn.minus(up.expm1(up.minus(al))), up.minus(dn.expm1(dn.minus(ah)))
    if kind == "gaussian":
        # G = erf(a/√2), increasing in a: the lower end from the least a/√2, the upper from the largest
        lo = dn.erf(dn.div(al, up.sqrt(2)))
        hi = up.erf(up.div(ah, dn.sqrt(2)))
        return max(lo, mpfr(0)), min(hi, mpfr(1))
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


def _nearest(x: mpq) -> int:
    """The k with x ∈ [k − ½, k + ½), exactly (gmpy2.floor would round a large x to a double first)."""
    y = x + _HALF
    return int(y.numerator // y.denominator)


def _exact(x: float) -> mpq:
    return mpq(*x.as_integer_ratio())


def _candidate(kind: str, f: mpq, s: mpq, m: int, n: int) -> int:
    """A guess of the cell of f + s·G⁻¹(u) for u the midpoint of [m/2^n, (m + 1)/2^n): only a proposal,
    which ``_one_side`` certifies or corrects; a wrong guess costs time, never exactness."""
    tail = mpq(2 ** (n + 1) - 2 * m - 1, 2 ** (n + 1))  # 1 − u, exactly
    scale_bits = max(0, int(s.numerator.bit_length() - s.denominator.bit_length()))
    if kind == "laplace":
        _, _, near = _contexts(n + scale_bits + 32)
        a = near.minus(near.log(mpfr(tail, near.precision, context=near)))  # G⁻¹(u) = −ln(1 − u)
    elif kind == "gaussian":
        a = _gaussian_quantile(tail, s, n + scale_bits)
    else:
        q = float(tail)
        a0 = _gencauchy_tail_quantile(q) if q > 0 else 2.0**340
        # Newton on G(a) = u: an error e in G moves a by e/g(a) ≈ e·a⁴, and s·a must be right to < 1/64 cell
        growth = 4 * max(0, math.frexp(a0)[1])
        precision = n + scale_bits + growth + 32
        _, _, near = _contexts(precision)
        u = 1 - tail
        a = mpfr(a0, precision, context=near)
        target = near.div(mpfr(1, precision, context=near), near.mul(64, mpfr(s, precision, context=near)))
        # Newton with the density in MPFR too (a double density would make it converge only linearly, by 2^-53 a
        # step, which is not enough when s is huge); quadratic convergence from a double start needs ~log2 of the
        # precision steps. Bounded: a candidate that is still off is corrected or re-guessed by the caller.
        for _ in range(4 + precision.bit_length()):
            lo, hi = _abs_cdf_bounds("cauchy", mpq(a), precision)
            density = near.div(
                near.mul(2, near.div(near.sqrt(2), near.const_pi())), near.add(1, near.square(near.square(a)))
            )
            step = near.div(near.sub(near.div_2exp(near.add(lo, hi), 1), mpfr(u, precision, context=near)), density)
            a = near.sub(a, step)
            if a < 0:
                a = mpfr(0)
            if abs(step) < target:
                break
    y = f + s * mpq(a)
    return _nearest(y)


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
    _, _, near = _contexts(precision)
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


def _uniform_index(k: int, source: NoiseSource) -> int:
    """An index uniform on range(k), exactly (rejection sampling on whole random bits)."""
    n = max(1, (k - 1).bit_length())
    while True:
        i = source.bits(n)
        if i < k:
            return i


def exponential_index(scores: Sequence[float], rate: float, source: NoiseSource) -> int:
    """The exponential mechanism's choice: index i with probability exactly w_i/Σw, w_i = exp(rate·(s_i − max s))
    (rate = ε/Δ; infinite: uniform among the maxima). As for the additive releases, a float computation would
    not be that distribution (weights underflow to 0 far from the maximum, a 53-bit uniform cannot reach cells
    narrower than 2⁻⁵³): the cell of u·Σw is found with u's binary digits drawn lazily and the cumulative weights
    bounded by MPFR in directed rounding (the exponents rate·(s_i − max s) are exact rationals); index i is
    answered only when every u of the current dyadic interval [m/2ⁿ, (m+1)/2ⁿ) lies in its cell, i.e.
    U_{i−1}/L ≤ m/2ⁿ and (m+1)/2ⁿ ≤ L_i/U (L, U lower and upper bounds of the cumulative sums and of the total),
    otherwise 32 more bits and precision are taken. So P(i) is exactly w_i/Σw (the boundaries have probability
    0). A weight below MPFR's least positive number (exponent < −2³⁰·ln 2) keeps a lower bound of 0: a u within
    that far band of a boundary would refine without end, so after 2¹⁶ bits the nearest candidate is answered
    (probability below 2⁻⁶⁰⁰⁰⁰)."""
    if not scores:
        raise InputError("the exponential mechanism needs at least one candidate")
    top = max(scores)
    if not math.isfinite(rate):
        tied = [i for i, v in enumerate(scores) if v == top]
        return tied[_uniform_index(len(tied), source)]
    exponents = [mpq(rate) * (mpq(v) - mpq(top)) for v in scores]
    n, m, precision = 64, source.bits(64), 64
    while True:
        down, up, near = _contexts(precision)
        lo = [down.exp(mpfr(x, precision, context=down)) for x in exponents]
        hi = [up.exp(mpfr(x, precision, context=up)) for x in exponents]
        lo_cum, hi_cum, near_cum = [], [], []
        a = b = c = mpfr(0, precision)
        for lw, hw in zip(lo, hi, strict=True):
            a, b = down.add(a, lw), up.add(b, hw)
            c = near.add(c, near.div(near.add(lw, hw), 2))
            lo_cum.append(a)
            hi_cum.append(b)
            near_cum.append(c)
        # the candidate: the cell holding the interval's midpoint by the nearest sums (a proposal only)
        point = near.mul(mpfr(mpq(2 * m + 1, 2 ** (n + 1)), precision, context=near), near_cum[-1])
        i = next((j for j, cum in enumerate(near_cum) if point < cum), len(scores) - 1)
        start = mpq(m, 2**n)
        end = mpq(m + 1, 2**n)
        left_ok = i == 0 or up.div(hi_cum[i - 1], lo_cum[-1]) <= start
        right_ok = i == len(scores) - 1 or end <= down.div(lo_cum[i], hi_cum[-1])
        if (left_ok and right_ok) or n >= 2**16:
            return i
        m, n, precision = (m << 32) | source.bits(32), n + 32, precision + 32


def _gencauchy_tail_quantile(q: float) -> float:
    """The a with P(|η| > a) = q for η ~ GenCauchy(4), in floating point (a starting point only)."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if q >= 0.5:
        return gencauchy_abs_quantile(1.0 - q)
    t1 = float(special.betaincinv(1.0 - 1.0 / GAMMA, 1.0 / GAMMA, q))  # 1 − t of gencauchy_abs_quantile
    return ((1.0 - t1) / t1) ** (1.0 / GAMMA) if t1 > 0 else 2.0**340


def _one_side(kind: str, f: mpq, s: mpq, source: NoiseSource) -> int:
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
            k = _candidate(kind, f, s, m, n)
        lo_u, hi_u = mpq(m, 2**n), mpq(m + 1, 2**n)
        for _ in range(8):
            a_hi = (k + _HALF - f) / s
            if a_hi <= 0:  # the whole cell lies below f, where this side puts no mass
                k += 1
                continue
            g_lo = _abs_cdf_bounds(kind, max((k - _HALF - f) / s, mpq(0)), precision)
            g_hi = _abs_cdf_bounds(kind, a_hi, precision)
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


def release(kind: str, value: float, scale: float, source: NoiseSource, *, grid_exponent: int = GRID_EXPONENT) -> float:
    """The noisy answer ``K·Λ`` (Λ = 2^grid_exponent) with K distributed exactly as the grid cell of
    ``value + scale·η``, η ~ GenCauchy(4) (``"cauchy"``), Lap(1) (``"laplace"``) or N(0, 1) (``"gaussian"``);
    see the module docstring.

    ``scale == 0`` (nothing private can move the value) releases the cell of ``value`` itself."""
    if kind not in KINDS:
        raise ValueError(f"unknown mechanism {kind!r}")
    if not (math.isfinite(value) and math.isfinite(scale) and scale >= 0):
        raise RefusedError("the true value or the noise scale is not finite; nothing is released")
    unit = mpq(2) ** -grid_exponent  # 1/Λ
    f, s = _exact(value) * unit, _exact(scale) * unit
    if s == 0:
        k = _nearest(f)
    elif source.bits(1):
        k = _one_side(kind, f, s, source)
    else:  # η = −A: the cell of f − s·A is minus the cell of −f + s·A (up to the ends, of probability 0)
        k = -_one_side(kind, -f, s, source)
    return _released(k, grid_exponent)


def _released(k: int, grid_exponent: int) -> float:
    """The released double of grid cell k (K·Λ): what :func:`release` and :func:`laplace_selection` answer."""
    unit = mpq(2) ** -grid_exponent
    try:
        return k * 2.0**grid_exponent if abs(k) < 2**53 else float(mpq(k) / unit)
    except OverflowError:  # a fixed function of k: beyond the largest double
        return math.copysign(math.inf, k)


def _geometric(p_lo_hi: Callable[[int], tuple[mpfr, mpfr]], source: NoiseSource) -> int:
    """G with P(G ≥ j) = (1 − p)^j (failures before the first success of Bernoulli(p) trials), exactly:
    G = ⌊ln U / ln(1 − p)⌋ for U uniform on (0, 1), whose binary digits are drawn lazily; the quotient is bounded
    by MPFR in directed rounding from certified bounds on p (``p_lo_hi(precision)``), and G is answered once
    every U of the drawn dyadic interval [m/2ⁿ, (m + 1)/2ⁿ) has the same floor. 0 < p < 1."""
    n, m = 64, source.bits(64)
    while True:
        precision = n + 64
        dn, up, _ = _contexts(precision)
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


def laplace_selection(
    count: int, value: float, scale: float, threshold: float, source: NoiseSource, *, grid_exponent: int = GRID_EXPONENT
) -> dict[int, float]:
    """Which of ``count`` independent draws ``release("laplace", value, scale)`` come out above ``threshold``,
    and their released values: exactly the joint distribution of ``count`` calls of :func:`release` each
    followed by ``> threshold``, in time that grows with the number selected rather than with ``count`` when
    few are (DP partition selection: every present group of one class has the same true value, scale and τ).

    A draw is selected when its cell K has K·Λ > τ, i.e. K ≥ k₀ = ⌊τ/Λ⌋ + 1, i.e. f + s·η ≥ k₀ − ½ (the cell's
    lower end; f, s in grid units), i.e. η ≥ c = (k₀ − ½ − f)/s. For c > 0 that has probability p = ½·e^(−c),
    independently per draw, so the indices selected are found by geometric gaps (:func:`_geometric`). Given
    η ≥ c > 0, η lies on the positive side and η − c ~ Exp(1) (memorylessness), so the selected draw's cell is
    that of (k₀ − ½) + s·A with A ~ Exp(1): :func:`_one_side` from k₀ − ½, the very sampler :func:`release`
    uses on its positive side. For c ≤ 0 (p ≥ ½) each draw is made by :func:`release` itself."""
    unit = mpq(2) ** -grid_exponent
    f, s = _exact(value) * unit, _exact(scale) * unit
    t = _exact(threshold) * unit
    k0 = int(t.numerator // t.denominator) + 1
    c = (k0 - _HALF - f) / s if s > 0 else mpq(-1)
    if c <= 0:
        out = {}
        for i in range(count):
            v = release("laplace", value, scale, source, grid_exponent=grid_exponent)
            if v > threshold:
                out[i] = v
        return out

    def p_bounds(precision: int) -> tuple[mpfr, mpfr]:
        dn, up, _ = _contexts(precision)
        c_lo, c_hi = mpfr(c, precision, context=dn), mpfr(c, precision, context=up)
        return dn.div_2exp(dn.exp(dn.minus(c_hi)), 1), up.div_2exp(up.exp(up.minus(c_lo)), 1)

    out = {}
    i = -1
    while True:
        i += _geometric(p_bounds, source) + 1
        if i >= count:
            return out
        out[i] = _released(_one_side("laplace", k0 - _HALF, s, source), grid_exponent)


def cell_probability(
    kind: str, value: float, scale: float, k: int, *, grid_exponent: int = GRID_EXPONENT, precision: int = 256
) -> tuple[mpfr, mpfr]:
    """Certified bounds on P(K = k) = F(((k + ½)Λ − f)/s) − F(((k − ½)Λ − f)/s) of ``release`` (s > 0), F the
    CDF of η: the distribution the sampler draws from, for tests and audits."""
    unit = mpq(2) ** -grid_exponent
    f, s = _exact(value) * unit, _exact(scale) * unit
    dn, up, _ = _contexts(precision)

    def cdf(x: mpq) -> tuple[mpfr, mpfr]:  # F(x) = ½ + ½·sign(x)·G(|x|)
        lo, hi = _abs_cdf_bounds(kind, abs(x), precision)
        if x >= 0:
            return dn.div_2exp(dn.add(1, lo), 1), up.div_2exp(up.add(1, hi), 1)
        return dn.div_2exp(dn.sub(1, hi), 1), up.div_2exp(up.sub(1, lo), 1)

    x1, x2 = (k - _HALF - f) / s, (k + _HALF - f) / s
    if kind == "laplace" and (x1 >= 0 or x2 <= 0):
        # A cell in one tail: P = ½·e^(−t)·(1 − e^(−w)) with t = min(|x1|, |x2|) and w = x2 − x1, computed with
        # relative precision (the difference of two CDF values near 0 or 1 would lose every digit in the far
        # tail, where Laplace cells are e^(−10⁶) small)
        t, w = min(abs(x1), abs(x2)), x2 - x1
        tl, th = mpfr(t, precision, context=dn), mpfr(t, precision, context=up)
        wl, wh = mpfr(w, precision, context=dn), mpfr(w, precision, context=up)
        lo = dn.mul(dn.exp(dn.minus(th)), dn.minus(up.expm1(up.minus(wl))))
        hi = up.mul(up.exp(up.minus(tl)), up.minus(dn.expm1(dn.minus(wh))))
        return dn.div_2exp(lo, 1), up.div_2exp(hi, 1)
    if kind == "gaussian" and (x1 >= 0 or x2 <= 0):
        # a cell in one tail: P = ½·(erfc(t/√2) − erfc(t′/√2)), t < t′ its ends' distances from 0; erfc keeps
        # relative precision where 1 − erf would keep none
        t, t2 = min(abs(x1), abs(x2)), max(abs(x1), abs(x2))
        r2l, r2h = dn.sqrt(2), up.sqrt(2)
        # erfc is decreasing: its lower bound from the largest argument (computed rounding up), and back
        e1l = dn.erfc(up.div(mpfr(t, precision, context=up), r2l))
        e1h = up.erfc(dn.div(mpfr(t, precision, context=dn), r2h))
        e2l = dn.erfc(up.div(mpfr(t2, precision, context=up), r2l))
        e2h = up.erfc(dn.div(mpfr(t2, precision, context=dn), r2h))
        return max(dn.div_2exp(dn.sub(e1l, e2h), 1), mpfr(0)), up.div_2exp(up.sub(e1h, e2l), 1)
    upper, lower = cdf(x2), cdf(x1)
    return max(dn.sub(upper[0], lower[1]), mpfr(0)), up.sub(upper[1], lower[0])


# -- calibration ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The noise of one released value: ``value + scale · η``."""

    mechanism: str
    epsilon: float
    delta: float | None
    beta: float
    b: float
    sensitivity: float  # c_β(x), the β-smooth sensitivity bound used
    scale: float  # c_β(x)/b
    gamma: float = GAMMA

    def half_width(self, confidence: float) -> float:
        """The a·scale with P(|noise| ≤ a·scale) = confidence (NR §3.3.8.5). The grid of ``release`` moves the
        answer by at most Λ/2 more, which these half-widths do not add (Λ is below any scale they print)."""
        if self.scale == 0.0:
            return 0.0
        if self.mechanism == "cauchy":
            return self.scale * _confidence_quantile(confidence, self.gamma)
        if self.mechanism == "gaussian":
            return self.scale * gaussian_abs_quantile(confidence)
        return self.scale * laplace_abs_quantile(confidence)


@functools.lru_cache(maxsize=64)
def _confidence_quantile(confidence: float, gamma: float) -> float:
    # every release asks for the same few confidences; scipy's inverse beta costs ≈ 15 µs a call
    return gencauchy_abs_quantile(confidence, gamma)


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


def _check_sensitivity(c: float) -> float:
    if math.isnan(c) or c < 0:
        raise RefusedError(f"the sensitivity analysis returned {c}; nothing is released")
    if math.isinf(c):
        raise RefusedError("the sensitivity is unbounded for this query; nothing is released")
    return float(c)


def calibrate_cauchy(sensitivity: float, epsilon: float, beta: float, gamma: float = GAMMA) -> Calibration:
    b = cauchy_b(epsilon, beta, gamma)
    c = _check_sensitivity(sensitivity)
    return Calibration("cauchy", epsilon, None, beta, b, c, c / b, gamma)


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
    c = _check_sensitivity(sensitivity)
    return Calibration("laplace", epsilon, delta, beta, b, c, c / b)


def calibrate_global(sensitivity: float, epsilon: float) -> Calibration:
    """Laplace noise at c/ε for a bound c that holds on every database (a global sensitivity): ε-DP with
    δ = 0 and no smoothing (β = 0, b = ε; Dwork, McSherry, Nissim and Smith, TCC 2006)."""
    c = _check_sensitivity(sensitivity)
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InputError(f"ε must be positive and finite, got {epsilon}", where="--epsilon")
    return Calibration("laplace", epsilon, 0.0, 0.0, epsilon, c, c / epsilon)


# -- the Gaussian mechanism for a vector with a global ℓ2 bound --------------------------------------


def gaussian_abs_quantile(p: float) -> float:
    """The a with P(|η| ≤ a) = p for η ~ N(0, 1): a = Φ⁻¹((1 + p)/2)."""
    from scipy import special  # here, not at the top: scipy costs ~0.4 s to import

    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    return float(special.ndtri((1.0 + p) / 2.0))


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
    c = _check_sensitivity(sensitivity)
    sigma = c * math.sqrt(values) * gaussian_sigma(epsilon, delta, distances)
    return Calibration("gaussian", epsilon, delta, 0.0, epsilon, c, sigma)


def beta_grid(epsilon: float, gamma: float = GAMMA) -> list[float]:
    """The fixed, data-independent family of β values of Theorem 3.73 for generalized Cauchy: geometric steps
    inside the feasible interval (0, ε/(γ + 1)), where β = ε/(γ + 1) would make b = 0."""
    limit = epsilon / (gamma + 1.0)
    # from β_max/10⁴ up to 0.98·β_max: small β suits data far from its worst case, large β the rest
    lo, hi = limit * 1e-4, limit * 0.98
    n = BETA_GRID_SIZE
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def optimise_beta(
    smooth: Callable[[float], float],
    epsilon: float,
    mechanism: str,
    *,
    delta: float | None = None,
    gamma: float = GAMMA,
    extra: Sequence[float] = (),
    distances: Sequence[float] = (1.0,),
) -> Calibration:
    """Choose β to minimise the noise scale c_β(x)/b_β over the fixed grid (NR Theorem 3.73).

    ``extra``: more data-independent β values to try (an analysis that evaluates its bound on its own grid
    passes those points, where its bound is tightest); the feasible ones join the family.

    Theorem 3.73 is proved for generalized Cauchy. For Laplace it is not, so the Laplace mechanism uses one
    data-independent β: the one that spends half of ε on b (b = ε/2), lowered where the query's changes reach
    beyond distance 1 (:func:`laplace_beta`; ``distances``, from the query and the policy)."""
    if mechanism == "laplace":
        if not delta:
            raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Theorem 3.56)", where="--delta")
        beta, b = laplace_beta(epsilon, delta, distances)
        c = _check_sensitivity(smooth(beta))
        return Calibration("laplace", epsilon, delta, beta, b, c, c / b)
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
