"""ε from a guessing-advantage target, and back (NR §3.3.10, [LP]).

A goal (``[[goals]]``, parsed by :mod:`sqldp.policy.goals`) says what an attacker must not learn: one or more
sensitive attributes, each guessed within a precision radius (or exactly), combined as AND (guess all), OR
(guess at least one) or EACH (every attribute protected on its own), or the membership of one row of a table.
The attacker's prior is the column's ``knowledge`` in the policy (none → the worst case), whose probabilities
:mod:`sqldp.priors` computes.

The conversion uses the simplified bound: with p = Pr_pre[X′] and R the
diameter of the attribute space in the DP metric, ε = min(ε_lb(p), ε_ub(p))/R. Because the true value t is
unknown, p ranges over the values p_t that the prior allows; sqldp takes the minimum of ε over all of them,
which is exact for every prior kind (the function is piecewise monotone in p with minima at (1 ∓ δ)/2,
§1.3(f)). Opt-in per goal (``search = "a"``): the restricted attacker space of §1.4 / Theorem 1 (AND), a
grid over the radius a, keeping the largest feasible ε per true value.

Units. ε is returned in the metric sqldp's sensitivities are measured in: adding or
removing one row of table t is distance G_t (row-level privacy, NR §3.3.7); changing the values of one row is
the table's composite norm (§3.3.8); with both (§3.3.9) a change of one row is at distance
min(2·G_t, norm). R is the largest such distance between two possible values of the goal's attributes, so
noise = sensitivity/ε stays the same whatever unit the data owner wrote the radius in.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqldp.errors import InputError
from sqldp.policy.goals import Attribute, Goal
from sqldp.priors import Interval, Prior

A_GRID = 64  # radii a tried by the restricted-space search
MAX_BOXES = 4096  # combinations of per-attribute p-intervals enumerated before taking hulls


# -- closed forms, R = 1 ----------------------------------------------------------


def epsilon_lb(p: float, delta: float) -> float:
    """Upper side Pr_post ≤ p + δ ([LP] §3.2, NR §3.3.10.1); +inf when p + δ ≥ 1 (no noise needed)."""
    if p <= 0:
        return math.inf
    if p + delta >= 1:
        return math.inf
    return -math.log(p / (1 - p) * (1 / (delta + p) - 1))


def epsilon_ub(p: float, delta: float) -> float:
    """Lower side Pr_post ≥ p − δ ([LP] §3.2, NR §3.3.10.1): ε_lb with p → 1 − p."""
    return epsilon_lb(1 - p, delta)


def epsilon_simplified(p: float, delta: float) -> float:
    """min(ε_lb, ε_ub) for one prior p, R = 1 ([LP] §3.2)."""
    return min(epsilon_lb(p, delta), epsilon_ub(p, delta))


def epsilon_worst_case(delta: float) -> float:
    """The unknown-prior worst case p = (1 − δ)/2: 2·ln((1 + δ)/(1 − δ)) = 4·artanh(δ)."""
    return 4 * math.atanh(delta)


def advantage_simplified(x: float, p: float) -> float:
    """The advantage an ε with εR = x allows at prior p: max(δ_up, δ_down)."""
    if p <= 0 or p >= 1:
        return 0.0
    up = 1 / (1 + math.exp(-x) * (1 - p) / p) - p
    down = p - p * math.exp(-x) / ((1 - p) + p * math.exp(-x))
    return max(up, down)


def epsilon_over(intervals: Sequence[Interval], delta: float) -> tuple[float, float]:
    """min over p in the intervals of ε_simplified(p), R = 1, and the binding p. Between the critical points
    (1 ∓ δ)/2 and 1/2 the function is monotone, so endpoints and critical points suffice."""
    best, best_p = math.inf, math.nan
    crit = ((1 - delta) / 2, 0.5, (1 + delta) / 2)
    for lo, hi in intervals:
        for p in (lo, hi, *(c for c in crit if lo <= c <= hi)):
            e = epsilon_simplified(p, delta)
            if e < best or math.isnan(best_p):
                best, best_p = e, p
    return best, best_p


def advantage_over(intervals: Sequence[Interval], x: float) -> tuple[float, float]:
    """max over p in the intervals of the advantage at εR = x, and the binding p. δ_up is concave in p with its
    maximum at 1/(1 + e^{x/2}) (slides l.451–461) and δ_down(p) = δ_up(1 − p)."""
    best, best_p = -1.0, math.nan
    c = 1 / (1 + math.exp(x / 2))
    for lo, hi in intervals:
        for p in (lo, hi, *(q for q in (c, 1 - c) if lo <= q <= hi)):
            a = advantage_simplified(x, p)
            if a > best:
                best, best_p = a, p
    return max(best, 0.0), best_p


def epsilon_restricted(p: float, q: float, delta: float, a: float) -> float:
    """[LP] Eq. (1), NR Eq. (36): X′ of prior p against X̂′ of prior q within distance a. Returns ε ≤ 0 when
    the ln argument is ≥ 1 (that a is infeasible), +inf when p + δ ≥ 1."""
    if p + delta >= 1:
        return math.inf
    if q <= 0 or p <= 0:
        return -math.inf if q <= 0 else math.inf
    return -math.log(p / q * (1 / (delta + p) - 1)) / a


def search_a(g: Callable[[float], float], r: float, big_r: float, delta: float, *, strict: bool = True) -> Search:
    """Best a ∈ (r, R] (grid R·k/64) for one attribute with mass function g(z) = Pr_pre[d(x, t) ≤ z]
    ([LP] §3.2, NR §3.3.10.1).
    ``strict`` uses g(a − r) − g(r) for X̂′, else the paper's g(a) − g(r)."""
    p = g(r)
    best = Search(-math.inf, math.nan)
    for k in range(1, A_GRID + 1):
        a = big_r * k / A_GRID
        if a <= r:
            continue
        q = (g(a - r) if strict else g(a)) - p
        e = epsilon_restricted(p, q, delta, a)
        if e > best.epsilon:
            best = Search(e, a)
    return best


@dataclass(frozen=True)
class Search:
    epsilon: float  # ≤ 0: no radius a on the grid is feasible
    a: float


def theorem1(
    gs: Sequence[Callable[[float], float]], radii: Sequence[float], reach: Sequence[float], a: float, delta: float
) -> float:
    """Theorem 1 ([LP] §4.2, NR Thm 3.88 with the denominator "a"): AND of independent
    attributes under the ℓ∞ metric; ``reach`` are the a_i = min(a, R_i). ≤ 0 means infeasible."""
    p = math.prod(g(r) for g, r in zip(gs, radii, strict=True))
    big = math.prod(g(x) for g, x in zip(gs, reach, strict=True))
    return epsilon_restricted(p, big - p, delta, a)


def epsilon_lambert_uniform(p: float, delta: float, r: float) -> float:
    """[LP] App. A: the optimum over a for a uniform prior, ε = W((p+δ)/(e(1−p−δ)))/r; valid only while
    a* = r + 1/ε stays inside the space (the caller checks)."""
    from scipy.special import lambertw

    return float(lambertw((p + delta) / (math.e * (1 - p - delta)), 0).real) / r


# -- combining attributes ---------------------------------------------------------


def combine_intervals(per_attribute: Sequence[Sequence[Interval]], combine: str) -> list[Interval]:
    """The possible priors of the whole goal: AND multiplies the independent marginals (Thm 1), OR takes
    1 − Π(1 − p_i) (NR §3.3.10.3 with a_i = R_i). Both are increasing in every p_i, so a box of intervals maps
    to the interval between its corners."""
    lists = [list(x) for x in per_attribute]
    while math.prod(len(x) for x in lists) > MAX_BOXES:  # too many combinations: hull the longest list
        i = max(range(len(lists)), key=lambda j: len(lists[j]))
        lists[i] = [(min(lo for lo, _ in lists[i]), max(hi for _, hi in lists[i]))]

    def f(ps: Sequence[float]) -> float:
        return math.prod(ps) if combine == "and" else 1 - math.prod(1 - p for p in ps)

    out = {(f([b[0] for b in box]), f([b[1] for b in box])) for box in itertools.product(*lists)}
    return sorted(out)


# -- the metric ------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    """How value changes of the goal's attributes translate into the DP distance.

    ``diameter`` is R (the largest distance between two possible values); ``reach(a)`` gives per attribute
    the value radius ρ_i such that the box Π[t_i ± ρ_i] lies within distance a of t (a subset of the a-ball
    is enough for [LP] Eq. (1)); ``unit`` says what one unit of distance is."""

    diameter: float
    reach: Callable[[float], tuple[float, ...]]
    unit: str


def _value_radius(attr: Attribute, policy: Any) -> float:
    """A radius in the prior's value units: dates count in days internally, the radius in the column's unit."""
    if attr.radius is None:
        return 0.0
    col = policy.table(attr.table).column(attr.column) if policy is not None else None
    return attr.radius * (col.days_per_unit if col is not None else 1.0)  # unit "day" (the default) is 1


def policy_metric(goal: Goal, policy: Any) -> Metric:
    """The DP metric of sqldp (NR §3.3.7–3.3.9) restricted to the goal's attributes."""
    by_table: dict[str, list[int]] = {}
    for i, a in enumerate(goal.attributes):
        by_table.setdefault(a.table, []).append(i)
    diameter = 0.0
    parts: list[tuple[float, float, list[tuple[int, float]]]] = []  # (2G or inf, unused, [(attr, weight)])
    for tname, idx in by_table.items():
        t = policy.table(tname)
        row_cost = 2 * t.weight if t.rows_private else math.inf  # remove + add (§3.3.7)
        weights: list[tuple[int, float]] = []
        widths: dict[str, float] = {}
        in_norm = t.norm is not None and all(goal.attributes[i].column in t.norm.columns for i in idx)
        for i in idx:
            a = goal.attributes[i]
            col = t.column(a.column)
            scale = col.days_per_unit  # 1 unless a DATE counts in weeks, months or years
            w = t.norm.evaluate({a.column: 1.0}) / scale if t.norm is not None and in_norm else math.inf
            weights.append((i, w))
            width = a.prior.diameter()
            if width is None and col.range is not None:
                width = col.range[1] - col.range[0]
            widths[a.column] = math.inf if width is None else width / scale
        norm_cost = t.norm.evaluate(widths) if t.norm is not None and in_norm else math.inf
        cost = min(row_cost, norm_cost)
        if math.isinf(cost):
            names = ", ".join(goal.attributes[i].name for i in idx)
            why = (
                "give the column a range or a knowledge with bounds"
                if in_norm
                else "the table's rows are public and the column is not in its norm"
            )
            raise InputError(f"the policy does not protect {names} within a bounded distance: {why}")
        diameter += cost
        parts.append((row_cost, cost, weights))
    n_tables = len(parts)

    def reach(a: float) -> tuple[float, ...]:
        rho = [0.0] * len(goal.attributes)
        share = a / n_tables  # distances of changes in several tables add up (group privacy)
        for row_cost, _, weights in parts:
            for i, w in weights:
                if share >= row_cost:
                    rho[i] = math.inf
                elif math.isfinite(w) and w > 0:
                    rho[i] = share / (len(weights) * w)  # triangle inequality over the norm's terms
        return tuple(rho)

    return Metric(diameter, reach, "DP distance of the policy (row weight G, norm units)")


def scaled_metric(goal: Goal) -> Metric:
    """The metric of an inline goal (``sqldp epsilon`` without a policy): distances in precision units,
    d = max_i |x_i − x′_i|/r_i (slides l.372, Thm 1's ℓ∞), and the discrete metric for exact guesses."""
    sizes = []
    for a in goal.attributes:
        if a.radius is None:
            sizes.append(1.0)
            continue
        width = a.prior.diameter()
        if width is None:
            raise InputError(f"the prior of {a.name} has no bounds: give a range", where="--prior")
        sizes.append(width / a.radius)
    rad = [a.radius for a in goal.attributes]

    def reach(x: float) -> tuple[float, ...]:
        return tuple(math.inf if r is None and x >= 1 else 0.0 if r is None else x * r for r in rad)

    return Metric(max(sizes, default=1.0), reach, "precision units (distance r = 1; exact guesses: discrete)")


# -- the conversion -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Conversion:
    """ε for one goal (one protected set) with what determined it."""

    goal: str
    advantage: float
    epsilon: float  # in the metric's units; inf: no noise needed for this goal
    epsilon_normalised: float  # R = 1
    diameter: float  # R
    p: float  # the binding prior Pr_pre[X′]
    p_range: list[Interval]
    bound: str  # "ε_lb" | "ε_ub" | "restricted (a = …)" | "none needed"
    a: float | None = None
    unit: str = ""
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "goal": self.goal,
            "advantage": self.advantage,
            "epsilon": None if math.isinf(self.epsilon) else self.epsilon,
            "epsilon_normalised": None if math.isinf(self.epsilon_normalised) else self.epsilon_normalised,
            "diameter": self.diameter,
            "prior": self.p,
            "prior_range": [list(x) for x in self.p_range],
            "bound": self.bound,
            "a": self.a,
            "unit": self.unit,
            "notes": self.notes,
        }


def goal_p_range(goal: Goal, radii: Sequence[float]) -> list[Interval]:
    if goal.membership is not None:
        p = goal.membership_prior
        return [(0.0, 1.0)] if p is None else [(p, p)]
    ranges = [Prior.of(a.prior).p_range(r) for a, r in zip(goal.attributes, radii, strict=True)]
    return combine_intervals(ranges, goal.combine)


def convert(goal: Goal, delta: float, metric: Metric, radii: Sequence[float]) -> Conversion:
    """ε for one AND/OR/membership goal at advantage δ."""
    if not 0 < delta < 1:
        raise InputError(f"the advantage target must be in (0, 1), got {delta}", where="--advantage")
    intervals = goal_p_range(goal, radii)
    e_norm, p = epsilon_over(intervals, delta)
    big_r = metric.diameter
    bound = "none needed" if math.isinf(e_norm) else ("ε_lb" if p <= 0.5 else "ε_ub")
    if big_r <= 0:  # every possible value is within the radius: nothing to guess
        e_norm, bound = math.inf, "none needed"
    e = math.inf if math.isinf(e_norm) else e_norm / big_r
    conv = Conversion(goal.describe(), delta, e, e_norm, big_r, p, intervals, bound, unit=metric.unit)
    if goal.search == "a" and goal.membership is None and not math.isinf(e_norm):
        conv = _with_search(goal, delta, metric, radii, conv)
    return conv


def _with_search(goal: Goal, delta: float, metric: Metric, radii: Sequence[float], base: Conversion) -> Conversion:
    """Restricted attacker space ([LP] Theorem 1 for AND): per true value t the best of the
    simplified bound and Eq. (1) over a grid of a; then the worst t. True values are the kinks of g_t."""
    priors = [Prior.of(at.prior) for at in goal.attributes]
    best_a: dict[tuple[Any, ...], tuple[float, float | None]] = {}
    grid = [metric.diameter * k / A_GRID for k in range(1, A_GRID + 1)]
    reaches = [metric.reach(a) for a in grid]
    cands = []
    for i, prior in enumerate(priors):
        extra = {radii[i], *(min(rh[i], 1e300) for rh in reaches), *(max(rh[i] - radii[i], 0) for rh in reaches)}
        vals = prior.true_values(tuple(x for x in extra if math.isfinite(x) and x < 1e300))
        cands.append(vals[:: max(1, len(vals) // 64)] + vals[-1:])
    combos = list(itertools.product(*cands))
    if len(combos) > MAX_BOXES:
        return Conversion(**{**base.__dict__, "notes": [*base.notes, "restricted search skipped: too many attributes"]})
    worst: tuple[float, float, float | None] = (math.inf, math.nan, None)
    for t in combos:
        p = math.prod(pr.mass(ti, r) for pr, ti, r in zip(priors, t, radii, strict=True))
        up, a_used = epsilon_lb(p, delta) / metric.diameter, None
        for a, rho in zip(grid, reaches, strict=True):
            inner = [(x - r if goal.strict else x) for x, r in zip(rho, radii, strict=True)]
            big = math.prod(
                1.0 if math.isinf(z) else (pr.mass(ti, z) if z >= r else 0.0)
                for pr, ti, z, r in zip(priors, t, inner, radii, strict=True)
            )
            e = epsilon_restricted(p, big - p, delta, a)
            if e > up:
                up, a_used = e, a
        e_t = min(up, epsilon_ub(p, delta) / metric.diameter)
        best_a[t] = (e_t, a_used)
        if e_t < worst[0]:
            worst = (e_t, p, a_used)
    e, p, a_used = worst
    e = min(e, base.epsilon) if a_used is None else e  # never below the exact simplified bound's guarantee
    if e <= base.epsilon or a_used is None:
        return Conversion(**{**base.__dict__, "notes": [*base.notes, "restricted search did not improve ε"]})
    return Conversion(
        base.goal, delta, e, e * metric.diameter, metric.diameter, p, base.p_range,
        f"restricted (a = {a_used:g})", a_used, base.unit, [*base.notes, "restricted space: numeric over true values"],
    )  # fmt: skip


def resolve(goal: Goal, policy: Any | None) -> tuple[Metric, list[float]]:
    """The metric and value-unit radii of a goal (policy metric, or the scaled metric inline)."""
    if goal.membership is not None:
        if policy is None:
            return Metric(1.0, lambda a: (), "rows (distance 1 = one row added or removed)"), []
        t = policy.table(goal.membership)
        if not t.rows_private:
            raise InputError(f"goal on membership of {goal.membership}: the policy makes its rows public")
        return Metric(t.weight, lambda a: (), f"rows of {goal.membership} (weight G = {t.weight:g})"), []
    if policy is None:
        return scaled_metric(goal), [a.radius or 0.0 for a in goal.attributes]
    return policy_metric(goal, policy), [_value_radius(a, policy) for a in goal.attributes]


def goal_conversion(goal: Goal, delta: float, policy: Any | None = None) -> Conversion:
    if goal.combine == "each" and len(goal.attributes) > 1:
        convs = []
        for a in goal.attributes:
            single = Goal((a,), "and", goal.advantage, search=goal.search, strict=goal.strict)
            metric, radii = resolve(single, policy)
            convs.append(convert(single, delta, metric, radii))
        return min(convs, key=lambda c: c.epsilon)
    metric, radii = resolve(goal, policy)
    return convert(goal, delta, metric, radii)


def default_goals(policy: Any) -> list[Goal]:
    """No [[goals]]: protect the membership of one row of every table with private rows, worst-case prior —
    the standard reading of DP. Tables the policy does not name are private with G = 1."""
    goals = [Goal(membership=t.name) for t in policy.tables.values() if t.rows_private]
    return [*goals, Goal(membership="\x00unnamed", name="membership of a row of a table the policy does not name")]


def conversions(policy: Any, advantage: float | None) -> list[Conversion]:
    goals = list(policy.goals) or default_goals(policy)
    out = []
    for g in goals:
        target = advantage if advantage is not None else g.advantage
        if target is None:
            target = policy.defaults.advantage
        if target is None:
            raise InputError(f"goal {g.describe()!r} has no advantage target: set advantage or pass --advantage")
        out.append(goal_conversion(g, target, policy))
    return out


def epsilon_from_policy(policy: Any, advantage: float | None, *, outputs: int = 1) -> float:
    """The total ε of one query in the units of sqldp's sensitivities, meeting every goal (EACH across
    goals: the smallest ε). ``advantage`` overrides the goals' own targets.

    ``outputs`` (the number of aggregates) does not change the result: the runner splits the returned ε
    across the aggregates itself (sequential composition, NR Thm 3.90), and GROUP BY groups are disjoint sets
    of rows, which under the ℓ1 metric across records (independent records, NR §3.3.10) each get the full ε
    (Thm 3.91). It is only checked."""
    if isinstance(outputs, bool) or not isinstance(outputs, int) or outputs < 1:
        raise InputError(f"outputs must be a positive integer, got {outputs!r}")
    if advantage is not None and not 0 < advantage < 1:
        raise InputError(f"the advantage target must be in (0, 1), got {advantage}", where="--advantage")
    convs = conversions(policy, advantage)
    best = min(convs, key=lambda c: c.epsilon)
    if math.isinf(best.epsilon):
        raise InputError(
            f"the advantage target {best.advantage:g} is met without any noise for every goal (e.g. "
            f"{best.goal}: prior {best.p:.4g}); sqldp does not release exact answers for it — give --epsilon"
        )
    if not best.epsilon > 0:
        raise InputError(f"the advantage target {best.advantage:g} cannot be met for {best.goal} (ln argument ≥ 1)")
    return best.epsilon


def advantage_from_epsilon(goal: Goal, epsilon: float, policy: Any | None = None) -> Conversion:
    """The inverse: the largest advantage an ε (in the metric's units) allows an attacker with this goal,
    maximised over the possible priors; ``a``/``bound`` are not used."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"epsilon must be a positive number, got {epsilon}", where="--epsilon")
    goals = [Goal((a,), "and") for a in goal.attributes] if goal.combine == "each" else [goal]
    best: Conversion | None = None
    for g in goals:
        metric, radii = resolve(g, policy)
        intervals = goal_p_range(g, radii)
        adv, p = advantage_over(intervals, epsilon * metric.diameter)
        conv = Conversion(
            g.describe(), adv, epsilon, epsilon * metric.diameter, metric.diameter, p, intervals,
            "ε_lb" if p <= 0.5 else "ε_ub", unit=metric.unit,
        )  # fmt: skip
        if best is None or conv.advantage > best.advantage:
            best = conv
    assert best is not None
    return best
