"""The batched partition-selection sampler (``mechanisms.laplace_selection``): the same joint distribution as one
``release("laplace", …)`` per group followed by ``> τ``, drawn by geometric gaps between the selected groups.

Oracles: the geometric law P(G ≥ j) = (1 − p)^j; the per-group releases themselves (frequencies); and, on a grid
of width 1 where half a cell shows, the exact cell probabilities of ``release`` (``cell_probability``)
conditioned on K ≥ k₀ for the selected values. Chi-square tests at a 10⁻⁴ level, seeded (TEST MODE noise).
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
from gmpy2 import mpfr
from scipy import stats

from sqldp import mechanisms as m
from sqldp.mechanisms import exact
from sqldp.release import selection_threshold
from sqldp.result import GLOBAL, Measurement

ALPHA = 1e-4


def _chi_square(observed: Counter[int], probabilities: dict[int, float], n: int) -> float:
    """The p-value of observed counts against expected ones (the rest of the mass pooled into one cell)."""
    cells = sorted(probabilities)
    expected = [probabilities[c] * n for c in cells]
    counts = [observed.get(c, 0) for c in cells]
    rest = n - sum(counts)
    rest_expected = n - sum(expected)
    if rest_expected > 1e-9:
        counts.append(rest)
        expected.append(rest_expected)
    return float(stats.chisquare(counts, expected).pvalue)


def test_geometric_gaps_follow_the_geometric_law() -> None:
    c = 0.9
    p = 0.5 * math.exp(-c)

    def bounds(precision: int) -> tuple[mpfr, mpfr]:
        dn, up, _ = exact.contexts(precision)
        return dn.div_2exp(dn.exp(dn.minus(mpfr(c, precision, context=up))), 1), up.div_2exp(
            up.exp(up.minus(mpfr(c, precision, context=dn))), 1
        )

    source = m.NoiseSource.seeded(3)
    n = 20_000
    draws = Counter(exact.geometric(bounds, source) for _ in range(n))
    law = {j: p * (1 - p) ** j for j in range(30)}
    assert _chi_square(draws, law, n) > ALPHA
    assert min(draws) == 0


@pytest.mark.parametrize(("value", "scale", "threshold"), [(0.0, 1.0, math.log(2)), (1.0, 1.0, 2.5), (3.0, 2.0, 0.5)])
def test_each_group_is_selected_as_by_its_own_release(value: float, scale: float, threshold: float) -> None:
    """Per position and in total, the selection frequencies of the batch equal those of ``count`` releases;
    (3.0, 2.0, 0.5) has τ below the value (p > ½): the per-release path."""
    count, trials = 6, 3000
    p = (
        0.5 * math.exp(-(threshold - value) / scale)
        if threshold > value
        else 1 - 0.5 * math.exp((threshold - value) / scale)
    )
    batch, single = m.NoiseSource.seeded(5), m.NoiseSource.seeded(6)
    per_position = Counter[int]()
    totals = Counter[int]()
    reference = Counter[int]()
    above = []
    for _ in range(trials):
        chosen = m.laplace_selection(count, value, scale, threshold, batch)
        per_position.update(chosen.keys())
        totals[len(chosen)] += 1
        above += list(chosen.values())
        reference[sum(m.release("laplace", value, scale, single) > threshold for _ in range(count))] += 1
    assert all(v > threshold for v in above)
    binomial = {k: float(stats.binom.pmf(k, count, p)) for k in range(count + 1)}
    assert _chi_square(totals, binomial, trials) > ALPHA
    assert _chi_square(reference, binomial, trials) > ALPHA  # the oracle itself is the law
    for i in range(count):
        se = math.sqrt(p * (1 - p) / trials)
        assert abs(per_position[i] / trials - p) < 4.5 * se, i
    # given η > c, η − c ~ Exp(1): the selected values average τ + scale (the grid is 2⁻⁴⁰ here)
    if threshold > value:
        mean = sum(above) / len(above)
        assert abs(mean - (threshold + scale)) < 4.5 * scale / math.sqrt(len(above))


def test_the_selected_values_are_the_release_s_cells_above_the_threshold() -> None:
    """On a grid of width 1 (cells [k − ½, k + ½)), value 0.3, scale 2, τ = 2: selected means K ≥ 3, and a selected
    K has probability P(K = k)/P(K ≥ 3) by the exact cell probabilities. Starting the tail at k₀ instead of
    k₀ − ½ (the cell's lower end) would move every selected value by half a cell and fail here."""
    value, scale, threshold, grid = 0.3, 2.0, 2.0, 0
    source = m.NoiseSource.seeded(9)
    values = Counter[int]()
    for _ in range(4000):
        for v in m.laplace_selection(3, value, scale, threshold, source, grid_exponent=grid).values():
            values[int(v)] += 1
    n = sum(values.values())
    cells = {k: m.cell_probability("laplace", value, scale, k, grid_exponent=grid) for k in range(3, 80)}
    tail = sum(float((lo + hi) / 2) for lo, hi in cells.values())
    assert tail == pytest.approx(0.5 * math.exp(-(2.5 - value) / scale), rel=1e-9)
    # how many: each of the 12,000 draws with the release's P(K ≥ 3) (k₀ in place of its cell's lower end
    # would make it ½e^(−1.35) instead of ½e^(−1.1))
    assert abs(n / 12_000 - tail) < 4.5 * math.sqrt(tail * (1 - tail) / 12_000)
    conditional = {k: float((lo + hi) / 2) / tail for k, (lo, hi) in cells.items()}
    assert min(values) == 3
    assert _chi_square(values, conditional, n) > ALPHA


def test_owned_groups_are_released_at_delta_over_k() -> None:
    """The owned selector (indicator 1, scale 1, τ = 1 + ln(k/(2δ))): each group with probability δ/k; with
    δ/k = 0.05 and 2,000 groups in one call, about 100 selected (an owned query's groups, by the thousand, draw
    in one pass)."""
    selector = Measurement("COUNT(*)", 0.0, 0.1, 0.0, 1.0, 1.0, 0.0, {}, mechanism=GLOBAL, owned_groups=2)
    tau = selection_threshold(selector)
    assert tau == pytest.approx(1 + math.log(2 / 0.2))
    counts = [len(m.laplace_selection(2000, 1.0, 1.0, tau, m.NoiseSource.seeded(s))) for s in range(20)]
    mean, se = sum(counts) / len(counts), math.sqrt(2000 * 0.05 * 0.95 / len(counts))
    assert abs(mean - 100) < 4.5 * se
