"""R2T's release under a privacy unit (Dong, Fang, Yi, Tao and Machanavajjhala, "R2T: Instance-optimal
Truncation for Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022, §4): the race of
several truncated answers, each with Laplace noise (sqldp.mechanisms.laplace), and its GROUP BY form that
chooses τ by the race and releases the truncated histogram (docs/units.md). The analysis that computes the
truncated answers is sqldp.sensitivity.units; this module reads only what :class:`Raced` names of its plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sqldp.mechanisms import laplace
from sqldp.mechanisms.registry import R2T, R2T_HISTOGRAM
from sqldp.mechanisms.source import NoiseSource
from sqldp.result import Measurement, Result

Rows = Sequence[tuple[Any, ...]]

# The histogram's noise is calibrated to τ·(1 + SLACK): PostgreSQL rounds a NUMERIC quotient to at least 16
# significant digits, so a unit's scaled contributions add up to at most τ·(1 + 10⁻¹⁵) (grouped_answer).
SLACK = 1e-12
# Under GROUP BY, the share of the query's ε spent on choosing τ by R2T's race on the units' total ℓ1 mass,
# and the β of that race's corrections; the rest of ε releases the histogram (docs/units.md). The choice only
# has to tell apart thresholds a factor 5.5 apart; the histogram's noise, τ/ε₂ on every group, is what the
# analyst reads. A race that fails its event picks a worse τ (accuracy), never a less private one, so its β
# is 1/2 (R2T's event at median confidence: correction factor 1.92 for 8 races, where β = 0.1 takes 3.76 and
# drives τ down at small scales). Both chosen by replaying the release of TPC-H Q5/Q7/Q8/Q9's truncated
# histograms at SF 0.1 and 1 (docs/units.md); neither bears on privacy.
SELECT_SHARE = 0.2
SELECT_BETA = 0.5


class Raced(Protocol):
    """What the race reads of an R2T plan (sqldp.sensitivity.units.UnitPlan): the thresholds τ_j, the raced
    parts' signs, GS_Q, R2T's β, whether it is a GROUP BY histogram, what an analyst may see of it, and from the
    rows the engine read, the truncated answers and the per-table terms."""

    @property
    def thresholds(self) -> tuple[float, ...]: ...
    @property
    def signs(self) -> tuple[int, ...]: ...
    @property
    def gs(self) -> float: ...
    @property
    def beta(self) -> float: ...
    @property
    def histogram(self) -> bool: ...
    def describe(self) -> dict[str, Any]: ...
    def truncated(self, results: Sequence[Rows]) -> tuple[tuple[float, ...], float]: ...
    def bind(self, results: Sequence[Rows]) -> Callable[[float], Any]: ...


def shift(races: int, beta: float) -> float:
    """The correction's factor L: race j subtracts L·s_j from its noisy value, s_j = τ_j·J/ε its Laplace scale.

    Theorem 4.2's event is that no race's noise exceeds its correction (so Q̃ ≤ Q(I)) and that the race j*
    with τ_{j*} ≥ DS, whose truncated answer is Q(I), is not pushed down by more than its correction (so Q̃ ≥
    Q(I) − 2·C_{j*}). The paper takes L = ln(J/β) from a union bound over the two tails of the J races
    (P[|Lap(s)| > L·s] = e^{−L}). The noises are independent and only one race's lower tail matters, so the
    event's probability is exactly (1 − e^{−L}/2)^{J−1}·(1 − e^{−L}) (P[Lap(s) > L·s] = e^{−L}/2); L here
    solves that = 1 − β, the same guarantee with a smaller correction (J = 8, β = 0.1: 3.76 where ln(J/β)
    is 4.38). The left side increases with L, so bisection finds it; it depends on J and β only."""
    lo, hi = 0.0, math.log(2 * races / beta) + 1.0

    def event(x: float) -> float:
        return (1 - math.exp(-x) / 2) ** (races - 1) * (1 - math.exp(-x))

    assert event(hi) >= 1 - beta
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if event(mid) < 1 - beta else (lo, mid)
    return hi


def race_scales(thresholds: Sequence[float], eps: float, beta: float) -> list[tuple[float, float]]:
    """Per race j, R2T's Laplace scale s_j = τ_j·J/ε (ε split evenly over the J races, sequential composition)
    and the correction L·s_j subtracted from it (R2T §4; L from :func:`shift`: with
    probability ≥ 1 − β no race's noise exceeds its correction, so the released top does not overshoot Q(I),
    and the race at τ ≥ DS is not pushed below Q(I) by more than it). Both depend on the policy and ε only."""
    j = len(thresholds)
    factor = shift(j, beta)
    return [(t * j / eps, t * j / eps * factor) for t in thresholds]


def race_bound(thresholds: Sequence[float], eps: float, beta: float, largest: float) -> float:
    """R2T's error bound at probability 1 − β (Theorem 4.2 of the paper, for base b races): Q(I) − 2·C_{j*} ≤
    Q̃ ≤ Q(I), where j* is the first race with τ_{j*} ≥ DS (the largest contribution of one unit) and C_{j*}
    its correction; τ_{j*} ≤ max(τ_1, b·DS), so the bound is 2·max(τ_1, b·DS)·J·L/ε (b = 2, L = ln(J/β): the
    paper's 4·J·ln(J/β)·DS/ε). Infinite when DS exceeds the top race (the truncation there is not bounded)."""
    j = len(thresholds)
    if largest > thresholds[-1]:
        return math.inf
    star = next(t for t in thresholds if t >= largest)
    return 2 * star * j * shift(j, beta) / eps


def race_template(aggregate: str, plan: Raced, rows: Sequence[Rows], eps: float) -> Measurement:
    """The measurement of an R2T plan: the truncated answers it read and the race's data-independent parts.
    ``half_width`` is R2T's error bound at probability 1 − β (:func:`race_bound`, summed over the raced parts;
    DS, the largest contribution of one unit, is read from the data: audit only)."""
    if plan.histogram:  # per group, its truncated values are read from the answer's rows (measure)
        return Measurement(
            aggregate=aggregate,
            epsilon=eps,
            delta=None,
            beta=0.0,
            sensitivity=plan.gs,
            noise_scale=plan.thresholds[-1] * (1 + SLACK) / (eps * (1 - SELECT_SHARE)),
            half_width=math.inf,
            terms={},
            mechanism=R2T_HISTOGRAM,
            unit=plan.describe(),
            thresholds=plan.thresholds,
        )
    values, largest = plan.truncated(rows)
    j = len(plan.thresholds)
    parts = len(plan.signs)
    bound = plan.bind(rows)(0.0)
    return Measurement(
        aggregate=aggregate,
        epsilon=eps,
        delta=None,
        beta=0.0,
        sensitivity=plan.gs,
        noise_scale=plan.thresholds[-1] * j * parts / eps,
        half_width=parts * race_bound(plan.thresholds, eps / parts, plan.beta, largest),
        terms=bound.tables,
        mechanism=R2T,
        unit=plan.describe(),
        thresholds=plan.thresholds,
        truncated=values,
    )


def race(m: Measurement, noise: NoiseSource) -> float:
    """R2T's release (Dong, Fang, Yi, Tao and Machanavajjhala, SIGMOD 2022, §4): each truncated answer
    Q(I, τ_j) with Laplace noise at τ_j·J/ε — τ_j bounds how much one unit moves it, so each race is
    (ε/J)-DP and the J races together ε-DP — minus its correction, and the largest of them and Q(I, 0) = 0
    released. The corrections and the maximum are post-processing of the noisy values (Dwork & Roth,
    Prop. 2.1), so neither the base of the races nor the correction's factor bears on privacy, only on the
    error (:func:`race_bound`). Each noisy value is sampled exactly (sqldp.mechanisms.exact.release). A SUM raced in a
    positive and a negative part gives each part half of ε and releases their difference (sequential
    composition)."""
    assert m.unit is not None
    signs = m.unit.get("signs", [1])
    j = len(m.thresholds)
    out = 0.0
    for i, sign in enumerate(signs):
        best = 0.0  # Q(I, 0): truncated at 0, no unit contributes
        scales = race_scales(m.thresholds, m.epsilon / len(signs), m.unit["beta"])
        for q, (scale, correction) in zip(m.truncated[i * j : (i + 1) * j], scales, strict=True):
            best = max(best, laplace.sample(q, scale, noise) - correction)
        out += sign * best
    return out


def choose_threshold(
    thresholds: Sequence[float], masses: Sequence[float], eps: float, beta: float, noise: NoiseSource
) -> int:
    """The index of the τ a GROUP BY under a privacy unit truncates at: R2T's race (:func:`race`) on the total
    ℓ1 mass T(τ_j) = Σ_u min(c_u, τ_j), whose sensitivity is τ_j, each race with Laplace at τ_j·J/ε minus its
    correction; the race whose corrected noisy value is largest wins (the top of R2T's race; the truncation at
    τ = 0 is no candidate: it would release nothing). ε-DP by sequential composition over the J races; the
    choice is post-processing of their noisy values, so τ may be shown."""
    best, chosen = -math.inf, 0
    for j, (q, (scale, correction)) in enumerate(zip(masses, race_scales(thresholds, eps, beta), strict=True)):
        value = laplace.sample(q, scale, noise) - correction
        if value > best:
            best, chosen = value, j
    return chosen


def histogram_release(result: Result, noise: NoiseSource) -> None:
    """The noisy values of every GROUP BY aggregate answered under a privacy unit (mechanism
    ``r2t-histogram``; docs/units.md): of the query's ε (the sum of their shares), :data:`SELECT_SHARE`
    chooses τ (:func:`choose_threshold` on the mass summed over the released groups, its corrections at
    :data:`SELECT_BETA`), and the rest releases
    the vector of every such aggregate in every group, truncated across groups and aggregates at τ, with
    Laplace noise at τ·(1 + SLACK)/ε₂ on each coordinate: its ℓ1 sensitivity is τ
    (:func:`sqldp.sensitivity.units.grouped_answer`), so one Laplace vector is ε₂-DP (Dwork, McSherry, Nissim,
    Smith, TCC 2006), not ε₂/m per group. Sequential composition: ε in all."""
    if not result.measurements:
        return
    index = [i for i, m in enumerate(result.measurements[0]) if m.mechanism == R2T_HISTOGRAM]
    if not index:
        return
    first = result.measurements[0][index[0]]
    assert first.unit is not None
    eps = math.fsum(result.measurements[0][i].epsilon for i in index)
    races = len(first.thresholds)
    masses = [math.fsum(group[index[0]].mass[j] for group in result.measurements) for j in range(races)]
    j = choose_threshold(first.thresholds, masses, eps * SELECT_SHARE, SELECT_BETA, noise)
    tau = first.thresholds[j]
    scale = tau * (1 + SLACK) / (eps * (1 - SELECT_SHARE))
    confidence = result.params.confidence if result.params is not None else None
    unit = {**first.unit, "tau": tau}
    for group in result.measurements:
        for i in index:
            m = group[i]
            assert m.true_value is not None
            m.noisy_value = laplace.sample(m.truncated[j], scale, noise)
            m.noise_scale = scale
            m.half_width = scale * math.log(1 / (1 - confidence)) if confidence else math.inf
            m.unit = unit
