"""Permute-and-flip (McKenna and Sheldon, "Permute-and-Flip: A new mechanism for differentially private
selection", NeurIPS 2020): visit the candidates in a uniformly random order and stop at candidate r with
probability p_r = exp(rate·(s_r − max s)); the best candidate has p = 1, so the walk always stops.

At rate = ε/(2Δ) for scores that move by at most Δ on neighbours it is ε-DP (their Theorem 1), as the
exponential mechanism (sqldp.mechanisms.exponential) at the same rate, and its expected score gap
E[max s − s_r] is never larger than the exponential mechanism's, on every score vector (their Theorem 2).
Its privacy map is pure: ε·d for a change at distance d (:func:`delta_at`).

Sampled exactly from the noise source: the order by exact uniform indices (Fisher–Yates), each coin with a
uniform u whose binary digits are drawn lazily and compared with certified MPFR bounds on p_r (the exponent
rate·(s_r − max s) is an exact rational), answering only when every u of the drawn dyadic interval falls on
one side; so P(r) is exactly :func:`probabilities` (the coin's boundary has probability 0).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from gmpy2 import mpfr, mpq

from sqldp.errors import InputError
from sqldp.mechanisms.exact import contexts, uniform_index
from sqldp.mechanisms.source import NoiseSource


def _coin(exponent: mpq, source: NoiseSource) -> bool:
    """True with probability exactly e^exponent (exponent ≤ 0 rational): u < e^exponent for u uniform, its bits
    drawn lazily until certified bounds on e^exponent put the whole dyadic interval of u on one side. A p below
    MPFR's least positive number keeps a lower bound of 0; after 2¹⁶ bits such a coin answers False (its
    probability of being True is below 2⁻⁶⁰⁰⁰⁰)."""
    if exponent == 0:
        return True
    n, m, precision = 64, source.bits(64), 64
    while True:
        down, up, _ = contexts(precision)
        lo = down.exp(mpfr(exponent, precision, context=down))
        hi = up.exp(mpfr(exponent, precision, context=up))
        if mpq(m + 1, 2**n) <= lo:
            return True
        if mpq(m, 2**n) >= hi or n >= 2**16:
            return False
        m, n, precision = (m << 32) | source.bits(32), n + 32, precision + 32


def permute_and_flip_index(scores: Sequence[float], rate: float, source: NoiseSource) -> int:
    """The index permute-and-flip chooses among ``scores`` at ``rate`` (ε/(2Δ)); infinite: uniform among the
    maxima (every other coin has p = 0)."""
    if not scores:
        raise InputError("permute-and-flip needs at least one candidate")
    top = max(scores)
    order = list(range(len(scores)))
    for i in range(len(order) - 1, 0, -1):  # Fisher–Yates from the top: each order has probability 1/n!
        j = uniform_index(i + 1, source)
        order[i], order[j] = order[j], order[i]
    for r in order:
        if scores[r] == top:
            return r
        if not math.isfinite(rate):
            continue
        if _coin(mpq(rate) * (mpq(scores[r]) - mpq(top)), source):
            return r
    raise AssertionError("unreachable: a maximum's coin is 1")


def probabilities(scores: Sequence[float], rate: float) -> list[float]:
    """P(r) of :func:`permute_and_flip_index`, from the definition: the mean over the n! orders of the chance that
    every candidate before r flips tails and r heads. For tests and audits (n! terms: small n only)."""
    top = max(scores)
    p = [math.exp(rate * (s - top)) for s in scores]
    out = [0.0] * len(scores)
    orders = list(itertools.permutations(range(len(scores))))
    for order in orders:
        survive = 1.0
        for r in order:
            out[r] += survive * p[r]
            survive *= 1.0 - p[r]
    return [x / len(orders) for x in out]


def delta_at(distances: Sequence[float] = (1.0,)) -> float:
    """The δ at the loss ε·d of a change at each distance d: 0 (pure ε-DP, scores moving by ≤ Δ·d at d)."""
    return 0.0
