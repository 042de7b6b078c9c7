"""The exponential mechanism for a choice among candidates (McSherry and Talwar, FOCS 2007), as
index i with probability ∝ exp(rate·s_i) is ε-DP when each score moves by at most Δ on neighbours and
rate = ε/(2Δ), or rate = ε/Δ when every score moves the same way (sqldp.strategies.argmax: a change of one
row raises or lowers the totals, never both). Its privacy map is pure: ε·d for a change at distance d
(:func:`delta_at`). sqldp.mechanisms.permute_flip is the same choice with never more expected error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gmpy2 import mpfr, mpq

from sqldp.errors import InputError
from sqldp.mechanisms.exact import contexts, uniform_index
from sqldp.mechanisms.source import NoiseSource


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
        return tied[uniform_index(len(tied), source)]
    exponents = [mpq(rate) * (mpq(v) - mpq(top)) for v in scores]
    n, m, precision = 64, source.bits(64), 64
    while True:
        down, up, near = contexts(precision)
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


def delta_at(distances: Sequence[float] = (1.0,)) -> float:
    """The δ at the loss ε·d of a change at each distance d: 0 (a change at distance d moves each score by ≤ Δ·d,
    and the ratio of the two choices' probabilities by ≤ e^(ε·d))."""
    return 0.0
