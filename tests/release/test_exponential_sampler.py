"""The exponential mechanism's sampler (sqldp.mechanisms.exponential_index) is a function of the uniform u's
binary digits: index i exactly when u·Σw falls in [C_{i−1}, C_i). Fixed digit strings check where the cells'
boundaries are, beyond a double's reach; seeded draws check the probabilities."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from sqldp.errors import InputError
from sqldp.mechanisms import NoiseSource, exponential_index


class _Digits(random.Random):
    """A source of u's digits fixed in advance: every bit 1 (u → 1 from below) or every bit 0 (u → 0)."""

    def __init__(self, bit: int) -> None:
        super().__init__(0)
        self.bit = bit

    def getrandbits(self, k: int) -> int:
        return (1 << k) - 1 if self.bit else 0


def test_a_weight_below_a_doubles_range_keeps_its_cell() -> None:
    # w = (1, e^−1000): the last cell is [1 − 5e−435, 1), far below 2⁻⁵³ and e^−1000 underflows a double; u with
    # every digit 1 lies in it (the float sampler answered 0 for every u < 1, i.e. always)
    assert exponential_index([0.0, -1000.0], 1.0, NoiseSource(_Digits(1))) == 1
    assert exponential_index([0.0, -1000.0], 1.0, NoiseSource(_Digits(0))) == 0
    # and the first cell of a tiny first weight: u with every digit 0 lies in [0, e^−1000/Σw)
    assert exponential_index([-1000.0, 0.0], 1.0, NoiseSource(_Digits(0))) == 0
    assert exponential_index([-1000.0, 0.0], 1.0, NoiseSource(_Digits(1))) == 1


def test_draws_follow_the_exponential_mechanism() -> None:
    scores, rate, n = [0.0, -1.0, -2.5, 3.0, 3.0], 0.7, 20_000
    source = NoiseSource.seeded(11)
    counts = Counter(exponential_index(scores, rate, source) for _ in range(n))
    weights = [math.exp(rate * (s - max(scores))) for s in scores]
    for i, w in enumerate(weights):
        p = w / sum(weights)
        assert abs(counts[i] / n - p) < 5 * math.sqrt(p * (1 - p) / n), (i, counts[i] / n, p)


def test_an_infinite_rate_is_uniform_on_the_maxima_and_no_candidate_is_refused() -> None:
    source = NoiseSource.seeded(3)
    counts = Counter(exponential_index([1.0, 4.0, 4.0, 2.0], math.inf, source) for _ in range(4000))
    assert set(counts) == {1, 2} and abs(counts[1] - 2000) < 200
    with pytest.raises(InputError, match="at least one candidate"):
        exponential_index([], 1.0, source)
