"""DP estimators of the declarations a policy needs and the catalog does not prove (``sqldp policy init
--estimate-epsilon E --estimate-delta D``): value ranges, text domains and contribution bounds.

Each estimator is a DP release of the private data (a neighbouring change adds or removes one row of the
table), with its privacy map beside it; the release is then declared in the policy, where every query enforces
it (a range is a clamp, a domain the only groups released, ``max_rows_per`` a truncation: docs/truncation.md),
so a declaration the data breaks biases an answer, never its privacy. Using a DP release afterwards is
post-processing; the estimates compose with each other (their ε and δ add up) and nothing else.

* :func:`quantile_index` — the exponential mechanism (McSherry and Talwar, FOCS 2007) over a grid of candidate
  bounds fixed before the data is read (:func:`numeric_grid`, :func:`date_grid`, :func:`tau_grid`): candidate
  g_j scores −|#{x < g_j} − q·n|. One row moves every score by at most Δ = max(q, 1 − q) (the count by 0 or 1,
  q·n by q), so rate ε/(2Δ) is ε-DP. Its input is a histogram of the values over the grid's cells, which
  :mod:`sqldp.engine.postgres.summaries` computes.
* :func:`rows_quantile_index` — the same over τ = 1 … 64 for the count of rows per value of a column, scoring
  −|#{values with ≤ τ rows} − q·#values|. One row either moves one value's count by one, which moves one score
  (τ = the old count) by at most 1, or adds a value with one row, which moves every count by 1 and q·#values by
  q, so every score by at most 1 − q, up or down. One score moving by 1 changes any candidate's probability by at
  most e^(rate); all moving by 1 − q ≤ ½ (q ≥ ½) by at most e^(2·rate·(1−q)) ≤ e^(rate): rate ε is ε-DP.
* :func:`select_values` — DP partition selection with Laplace noise (Korolova et al., WWW 2009): a value is
  kept when its count is at least ``floor`` and its count plus Laplace(1/ε) noise exceeds
  ``floor + ln(1/(2δ))/ε``. Adding a row moves one value's count by one: a value already counted changes its
  chance by at most e^ε, a value that crosses ``floor`` appears with probability at most δ: (ε, δ)-DP.

Noise comes from :class:`sqldp.mechanisms.source.NoiseSource` (the OS CSPRNG): the exponential mechanism's exact
sampler (:func:`sqldp.mechanisms.exponential.exponential_index`) and the exact Laplace sampler.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from decimal import Decimal

from sqldp.mechanisms import laplace
from sqldp.mechanisms.exponential import exponential_index
from sqldp.mechanisms.source import NoiseSource

LOW_QUANTILE = 0.001  # a range's lower end: values below it are clamped up to it
HIGH_QUANTILE = 0.999  # and its upper end
ROWS_QUANTILE = 0.999  # max_rows_per: the share of values whose rows are all kept
MAX_TAU = 64  # the model checker proves bounds up to 64 join rows (sqldp.policy.init.MAX_TAU)
# mantissas of the numeric grid: about 25 % apart, so a bound is at most that much looser than the quantile
MANTISSAS = (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8)
FIRST_DATE = dt.date(1900, 1, 1)  # the date grid: the first of every month from here ...
LAST_DATE = dt.date(2100, 1, 1)  # ... to here


# -- grids: fixed before any data is read -----------------------------------------------------------


def numeric_grid(low: Decimal | int | None, high: Decimal | int | None, scale: int, integer: bool) -> list[Decimal]:
    """Candidate bounds for a number column: 0 and ±m·10^k (m in :data:`MANTISSAS`) from the column's least step
    (10^−scale; 1 for an integer column) up to 10^18, kept within the type's [low, high] when it has one, and the
    type's ends themselves. A function of the catalog alone."""
    step = 0 if integer else max(scale, 0)
    out: set[Decimal] = {Decimal(0)}
    for k in range(-step, 19):
        for m in MANTISSAS:
            v = (Decimal(str(m)) * Decimal(10) ** k).quantize(Decimal(1).scaleb(-step))
            if v == 0:
                continue
            out.update((v, -v))
    if low is not None:
        out = {v for v in out if v >= Decimal(low)} | {Decimal(low)}
    if high is not None:
        out = {v for v in out if v <= Decimal(high)} | {Decimal(high)}
    return sorted(out)


def numeric_anchor(grid: Sequence[Decimal]) -> int:
    """The grid point nearest 0 (0 itself unless the type's range excludes it)."""
    return min(range(len(grid)), key=lambda j: abs(grid[j]))


DATE_ANCHOR = dt.date(2000, 1, 1)


def date_anchor(grid: Sequence[dt.date]) -> int:
    return min(range(len(grid)), key=lambda j: abs((grid[j] - DATE_ANCHOR).days))


def date_grid() -> list[dt.date]:
    """Candidate bounds for a DATE column: the first of every month from 1900 to 2100."""
    out, y, m = [], FIRST_DATE.year, FIRST_DATE.month
    while dt.date(y, m, 1) <= LAST_DATE:
        out.append(dt.date(y, m, 1))
        y, m = (y + 1, 1) if m == 12 else (y, m + 1)
    return out


def tau_grid() -> list[int]:
    """Candidate contribution bounds τ = 1 … MAX_TAU, and MAX_TAU + 1 standing for "more" (no bound written)."""
    return list(range(1, MAX_TAU + 2))


# -- the exponential mechanism over a grid -----------------------------------------------------------


def quantile_sensitivity(q: float) -> float:
    """How far one row moves a score −|#{x < g} − q·n|: the count by 0 or 1 while q·n moves by q."""
    return max(q, 1.0 - q)


def quantile_scores(cells: Sequence[int], q: float) -> list[float]:
    """The score of each grid point g_j (j = 0 … m−1) given ``cells``, the m + 1 counts of the values below
    g_0, in [g_{j−1}, g_j) and at or above g_{m−1} (PostgreSQL's ``width_bucket`` numbering)."""
    n = sum(cells)
    below, out = 0, []
    for j in range(len(cells) - 1):
        below += cells[j]
        out.append(-abs(below - q * n))
    return out


def quantile_rate(epsilon: float, q: float) -> float:
    """The exponential mechanism's rate for ε-DP: ε/(2Δ) (scores move either way by at most Δ)."""
    return epsilon / (2.0 * quantile_sensitivity(q))


PRIOR_STEP = math.log(2.0)  # the base measure halves with each grid step away from the anchor


def prior(n: int, anchor: int) -> list[float]:
    """The log base measure of the grid's n points: −|j − anchor|·ln 2. Fixed before the data is read, it breaks
    the ties among the candidates beyond the data (every bound below the least value scores alike) towards the
    anchor (0, 2000-01-01, τ = 1), i.e. towards the data, and leaves the privacy loss as it is: the ratio of two
    neighbours' weights for one candidate is the same with it or without it."""
    return [-abs(j - anchor) * PRIOR_STEP for j in range(n)]


def weighted_index(scores: Sequence[float], rate: float, anchor: int, source: NoiseSource) -> int:
    """Index j with probability ∝ μ_j·exp(rate·s_j), μ the base measure of :func:`prior`."""
    base = prior(len(scores), anchor)
    return exponential_index([s + b / rate for s, b in zip(scores, base, strict=True)], rate, source)


def weights(scores: Sequence[float], rate: float, anchor: int) -> list[float]:
    """The exact output distribution of :func:`weighted_index` (in floating point), for the privacy tests."""
    base = prior(len(scores), anchor)
    top = max(rate * s + b for s, b in zip(scores, base, strict=True))
    w = [math.exp(rate * s + b - top) for s, b in zip(scores, base, strict=True)]
    total = sum(w)
    return [x / total for x in w]


def quantile_index(cells: Sequence[int], q: float, epsilon: float, anchor: int, source: NoiseSource) -> int:
    """The index of the grid point released as the q-quantile of the values (ε-DP, pure)."""
    return weighted_index(quantile_scores(cells, q), quantile_rate(epsilon, q), anchor, source)


def rows_scores(per_count: Mapping[int, int], q: float) -> list[float]:
    """Scores of τ = 1 … MAX_TAU + 1 given ``per_count`` (k → how many values have k rows; k > MAX_TAU counted
    at MAX_TAU + 1): −|#{values with ≤ τ rows} − q·#values|."""
    n = sum(per_count.values())
    out, at_most = [], 0
    for tau in tau_grid():
        at_most += per_count.get(tau, 0)
        out.append(-abs(at_most - q * n))
    return out


ROWS_SENSITIVITY = 1.0  # one row: one score by ≤ 1, or (a new value) every score by ≤ 1 − q ≤ ½


def rows_rate(epsilon: float) -> float:
    """ε/Δ, not ε/(2Δ): a change moves a single score, or all by at most half of Δ (module docstring)."""
    return epsilon / ROWS_SENSITIVITY


def rows_quantile_index(per_count: Mapping[int, int], q: float, epsilon: float, source: NoiseSource) -> int:
    """The index into :func:`tau_grid` of the τ released as the q-quantile of rows per value (ε-DP for q ≥ ½,
    pure; the base measure favours small τ)."""
    if q < 0.5:
        raise ValueError("the rate ε holds for q ≥ ½ only")
    return weighted_index(rows_scores(per_count, q), rows_rate(epsilon), 0, source)


# -- DP partition selection -----------------------------------------------------------------------------


def selection_floor(epsilon: float, delta: float) -> int:
    """The least count a value needs to be a candidate at all (the SQL leaves out the others): a sixteenth of the
    threshold's margin, so rare values are not read. Any floor ≥ 1 keeps the mechanism (ε, δ)-DP."""
    return max(1, math.floor(math.log(1.0 / (2.0 * delta)) / epsilon / 16.0))


def selection_threshold(epsilon: float, delta: float, floor: int) -> float:
    """``floor + ln(1/(2δ))/ε``: a value whose count just reached ``floor`` passes with probability
    ½·e^(−ε·ln(1/(2δ))/ε) = δ."""
    return floor + math.log(1.0 / (2.0 * delta)) / epsilon


def select_values(
    counts: Mapping[object, int], epsilon: float, delta: float, floor: int, source: NoiseSource
) -> list[object]:
    """The values (among those with count ≥ ``floor``) whose count plus Laplace(1/ε) exceeds the threshold."""
    threshold = selection_threshold(epsilon, delta, floor)
    return [v for v, c in counts.items() if c >= floor and laplace.sample(float(c), 1.0 / epsilon, source) > threshold]


def release_probability(count: int, epsilon: float, delta: float, floor: int) -> float:
    """P(a value with ``count`` rows is selected): exact, for the privacy tests."""
    if count < floor:
        return 0.0
    gap = selection_threshold(epsilon, delta, floor) - count  # P(Laplace(1/ε) > gap)
    return 0.5 * math.exp(-epsilon * gap) if gap >= 0 else 1.0 - 0.5 * math.exp(epsilon * gap)
