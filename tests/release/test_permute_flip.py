"""Permute-and-flip (sqldp.mechanisms.permute_flip; McKenna and Sheldon, NeurIPS 2020): its exact output law,
written here from the algorithm's definition, is ε-DP at rate ε/(2Δ) over every pair of score vectors that
differ by at most Δ in each score (brute force on small vectors), never has a larger expected score gap than
the exponential mechanism at the same rate, and the sampler draws from that law."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import gmpy2
import pytest
from gmpy2 import mpfr
from oracles import max_log_ratio

from sqldp.errors import InputError
from sqldp.mechanisms import NoiseSource
from sqldp.mechanisms.permute_flip import permute_and_flip_index, probabilities

gmpy2.get_context().precision = 200


def law(scores: tuple[float, ...], rate: float) -> dict[int, mpfr]:
    """P(r) from the definition, in 200-bit arithmetic: over the n! orders, equally likely, the walk stops at r when
    every candidate before r flips tails (probability 1 − p) and r heads, p_i = e^(rate·(s_i − max s))."""
    top = max(scores)
    p = [gmpy2.exp(mpfr(rate) * (mpfr(s) - mpfr(top))) for s in scores]
    out = {r: mpfr(0) for r in range(len(scores))}
    orders = list(itertools.permutations(range(len(scores))))
    for order in orders:
        survive = mpfr(1)
        for r in order:
            out[r] += survive * p[r]
            survive *= 1 - p[r]
    return {r: v / len(orders) for r, v in out.items()}


def exponential_law(scores: tuple[float, ...], rate: float) -> list[float]:
    w = [math.exp(rate * (s - max(scores))) for s in scores]
    return [x / math.fsum(w) for x in w]


VECTORS = [v for n in (2, 3, 4) for v in itertools.product((0.0, 1.0, 2.0), repeat=n)]
SHIFTS = (-1.0, -0.5, 0.0, 0.5, 1.0)  # each score moves by at most Δ = 1


def neighbours(scores: tuple[float, ...]) -> list[tuple[float, ...]]:
    return [
        tuple(s + d for s, d in zip(scores, shift, strict=True))
        for shift in itertools.product(SHIFTS, repeat=len(scores))
    ]


def worst_loss(rate: float, vectors: list[tuple[float, ...]]) -> float:
    return max(max_log_ratio(law(a, rate), law(b, rate)) for a in vectors for b in neighbours(a))


def test_the_output_law_is_epsilon_dp_over_every_neighbour() -> None:
    """Theorem 1: at rate ε/(2Δ) no output's probability moves by more than e^ε, every vector, every shift."""
    eps = 1.0
    small = [v for v in VECTORS if len(v) <= 3]
    assert worst_loss(eps / 2.0, small) <= eps + 1e-12
    # the check has teeth: at twice the rate (ε/Δ, what non-monotone scores may not use) some pair exceeds ε
    assert worst_loss(eps, small) > eps + 1e-3


def test_the_module_probabilities_are_the_definitions() -> None:
    for v in VECTORS:
        exact = law(v, 0.5)
        assert probabilities(v, 0.5) == pytest.approx([float(exact[r]) for r in range(len(v))], abs=1e-14)


def test_never_a_larger_expected_gap_than_the_exponential_mechanism() -> None:
    """Theorem 2: E[max s − s_r] under permute-and-flip ≤ the exponential mechanism's, at the same rate."""
    for v in VECTORS:
        for rate in (0.1, 0.5, 2.0):
            top = max(v)
            pf = math.fsum(float(p) * (top - v[r]) for r, p in law(v, rate).items())
            em = math.fsum(p * (top - s) for p, s in zip(exponential_law(v, rate), v, strict=True))
            assert pf <= em + 1e-12, (v, rate)
    # and strictly better where the candidates are not all tied
    v = (0.0, 1.0, 2.0)
    assert math.fsum(float(p) * (2 - v[r]) for r, p in law(v, 0.5).items()) < math.fsum(
        p * (2 - s) for p, s in zip(exponential_law(v, 0.5), v, strict=True)
    )


def test_draws_follow_the_law() -> None:
    scores, rate, n = (0.0, -1.0, -2.5, 3.0, 3.0), 0.7, 20_000
    source = NoiseSource.seeded(5)
    counts = Counter(permute_and_flip_index(scores, rate, source) for _ in range(n))
    exact = law(scores, rate)
    for r in range(len(scores)):
        p = float(exact[r])
        sd = math.sqrt(n * p * (1 - p))
        assert abs(counts[r] - n * p) <= 5 * sd + 1, (r, counts[r], n * p)
    # chi-square over the five outcomes (4 degrees of freedom: 18.5 is its 0.999 quantile)
    chi2 = sum((counts[r] - n * float(exact[r])) ** 2 / (n * float(exact[r])) for r in range(len(scores)))
    assert chi2 < 18.5


def test_the_seeded_draws_are_reproducible_and_the_edges_hold() -> None:
    a = [permute_and_flip_index((1.0, 2.0, 0.5), 1.0, NoiseSource.seeded(3)) for _ in range(5)]
    assert a == [permute_and_flip_index((1.0, 2.0, 0.5), 1.0, NoiseSource.seeded(3)) for _ in range(5)]
    # a weight far below a double's range: the best candidate unless the coin of e^−1000 comes up (never here)
    assert {permute_and_flip_index((0.0, -1000.0), 1.0, NoiseSource.seeded(s)) for s in range(20)} == {0}
    # infinite rate: uniform among the maxima, never another
    drawn = Counter(permute_and_flip_index((1.0, 3.0, 3.0), math.inf, NoiseSource.seeded(s)) for s in range(400))
    assert set(drawn) == {1, 2} and min(drawn.values()) > 150
    with pytest.raises(InputError):
        permute_and_flip_index((), 1.0, NoiseSource.seeded(0))
