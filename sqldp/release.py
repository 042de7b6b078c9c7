"""The release step (pipeline step 6 of 6, docs/layout.md): from the analyses' plans and the rows the engine
read, the measurements and the noisy answer. Pure — no database, only the noise source — so every rule here
is testable on its own: composition over aggregates and groups (NR §3.3.10.4), the mechanism and β (NR
Theorems 3.53, 3.56 and 3.73, or Laplace on a global bound), the noise, and the post-processing of the noisy
values (output arithmetic, HAVING, ORDER BY and LIMIT).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlglot import exp

from sqldp import mechanisms
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, Output
from sqldp.groups import all_groups, part_groups
from sqldp.mechanisms import NoiseSource, race
from sqldp.mechanisms.registry import CAUCHY, LAPLACE, R2T_HISTOGRAM
from sqldp.mechanisms.smooth_bar import SmoothBar
from sqldp.params import PrivacyParams, check_beta
from sqldp.postprocess import Boxes, Interval, aggregate_box, evaluate, holds, interval_of
from sqldp.result import GLOBAL, PUBLIC_SCALE, R2T, UNIT_HISTOGRAM, Measurement, Result
from sqldp.sensitivity.owned import SHARED_SCALE_GROUPS
from sqldp.sensitivity.plan import Bound, Plan, Rows
from sqldp.sensitivity.smoothing import remembering
from sqldp.sensitivity.units import histogram_columns

Share = tuple[float, float | None]  # an aggregate's (ε, δ)
T = TypeVar("T")


def declared_groups(domains: Sequence[Any]) -> int | None:
    """The number of groups when every key's domain is declared in the policy; None when one is read from a
    public table at run time."""
    sizes = [len(d.values) for d in domains if d.values is not None]
    return math.prod(sizes) if len(sizes) == len(domains) else None


def shares(
    form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan], groups: int | None
) -> list[tuple[float, float | None] | None]:
    """Each aggregate's (ε, δ) share (NR §3.3.10.4): the aggregates split ε equally, and δ equally among those
    that spend it (sequential composition); the groups of a GROUP BY get the full share when a neighbouring
    change touches one group (parallel composition) or when the bound is global (below), else share/m for m
    groups (None while m is unknown).

    A global bound c (``data_independent``) covers the whole histogram in ℓ1: the plan bounds the derivative
    of the ungrouped aggregate, i.e. Σ over the rows a neighbour adds or removes of |e(row)|, and each of those
    rows lands in one group, so Σ_g |Δ_g| ≤ c. Laplace noise at c/ε on every group is then ε-DP for the vector
    (the Laplace mechanism for ℓ1 sensitivity, Dwork et al. TCC 2006), with no split over the groups."""
    # δ goes to the aggregates that spend it: a data-dependent bound's smoothed noise and the partition
    # selection count; a global bound's Laplace is pure ε-DP and would waste its share (composition adds the δs
    # actually spent, Dwork & Roth Thm 3.16)
    joint = gaussian(form, params, plans)  # one Gaussian release of every aggregate spends δ for them all
    spending = [i for i, plan in enumerate(plans) if joint or not plan.data_independent or i == form.select_by]
    # the selector of owned groups spends δ only (sqldp.strategies.owned: a common group's indicator is 1 on
    # both sides)
    free = [i for i, plan in enumerate(plans) if not plan.spends_epsilon]
    out: list[tuple[float, float | None] | None] = []
    for i, plan in enumerate(plans):
        whole = not form.group_by or plan.disjoint_groups or plan.data_independent
        divisor = 1 if whole else groups
        if divisor is None:
            out.append(None)
            continue
        eps = 0.0 if i in free else params.epsilon / (len(plans) - len(free)) / divisor
        delta = params.delta / len(spending) / divisor if params.delta and i in spending else None
        out.append((eps, delta))
    return out


def gaussian(form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan]) -> bool:
    """Whether the query's aggregates are released together by one Gaussian vector instead of Laplace at ε/k
    each: under (ε, δ) (``--mechanism laplace --delta D``), when every aggregate's bound is global (so its
    scale is known before the data: a data-dependent bound's smoothing is for Theorems 3.53/3.56) and no
    partition selection runs, and when it gives less noise (:func:`sqldp.mechanisms.gaussian_wins`, from ε,
    δ and the number of aggregates only: data-independent, like every choice of mechanism here).

    Why it is (ε, δ)-DP: each global bound c_i covers the ℓ1 norm over the groups of aggregate i's change (see
    :func:`shares`), so its ℓ2 norm too; the vector of every f_i/c_i over every group then moves by at most
    √k in ℓ2 on neighbours, and N(0, σ₁²) on each of its coordinates with σ₁ the analytic Gaussian σ for
    (ε, δ) at ℓ2 sensitivity 1, scaled by √k — i.e. N(0, (c_i·√k·σ₁)²) on f_i — is (ε, δ)-DP (Balle and Wang,
    ICML 2018, Theorem 8). Each aggregate carries (ε/k, δ/k) of it in the shares, which add up to the
    release's (ε, δ).

    At distance d (a row of a table of weight G is at G) the vector moves by √k·d, and the promise is (ε·d, δ):
    σ₁ is calibrated for every distance one change of the query's tables can have (:func:`change_distances`,
    :func:`sqldp.mechanisms.gaussian_sigma`). Where a change has no bounded distance (a value in a norm) no σ
    gives (ε·d, δ) for every d, so the Gaussian is not used there and Laplace at ε/k each is."""
    return (
        bool(params.delta)
        and form.select_by is None
        and bool(plans)
        and all(p.data_independent and p.own_mechanism is None for p in plans)
        and math.isfinite(longest_change(plans))
        and mechanisms.gaussian_wins(params.epsilon, params.delta or 0.0, len(plans), change_distances(plans))
    )


def change_distances(plans: Sequence[Plan]) -> tuple[float, ...]:
    """The distances d of the single neighbouring changes that can move the query's aggregates, sorted: one row
    of a private table t is at its weight G_t; a change of a value in a norm has no bound (∞). Each plan says its
    own (``change_distances``); a plan that does not counts as ∞ (fail closed). A function of the query and the
    policy only. The (ε, δ) mechanisms keep (ε·d, δ) at each of these (docs/privacy.md)."""
    out: set[float] = set()
    for p in plans:
        out |= set(getattr(p, "change_distances", (math.inf,)))
    return tuple(sorted(out)) or (1.0,)


def longest_change(plans: Sequence[Plan]) -> float:
    """The largest distance of one neighbouring change that moves the query's answer (:func:`change_distances`)."""
    return change_distances(plans)[-1]


def zcdp(form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan]) -> float | None:
    """The ρ for which the query's release is ρ-zCDP (Bun and Steinke, "Concentrated Differential Privacy:
    Simplifications, Extensions, and Lower Bounds", TCC 2016), for a session that adds the ρ of its runs
    (their Lemma 2.3, adaptive) and converts once (sqldp.session.Session.guarantee); None where the release
    spends δ otherwise, which zCDP does not express.

    * One Gaussian vector (:func:`gaussian`): its coordinates f_i/c_i move by ≤ √k in ℓ2 under noise of
      σ = √k·σ₁, so ρ = k/(2kσ₁²) = 1/(2σ₁²) (Prop. 1.6).
    * A pure ε-DP release (no aggregate spends δ: Laplace on global bounds, generalized Cauchy, R2T) is
      ε²/2-zCDP (Prop. 1.4).
    * The smoothed Laplace of NR Theorem 3.56 and partition selection spend δ: None.

    ρ is per unit of distance: for a change at distance d the release is ρd²-zCDP (the Gaussian's shift and a
    pure release's loss both scale with d), which the session converts at the longest distance of its runs
    (:func:`longest_change`, :func:`sqldp.mechanisms.zcdp_epsilon`)."""
    if gaussian(form, params, plans):
        assert params.delta is not None
        sigma = mechanisms.gaussian_sigma(params.epsilon, params.delta, change_distances(plans))
        return mechanisms.gaussian_rho(1.0, sigma)
    if params.delta and any(not p.data_independent or i == form.select_by for i, p in enumerate(plans)):
        return None
    return params.epsilon * params.epsilon / 2.0


def dilated(form: AnalysisForm, params: PrivacyParams, plan: Plan, kind: str, groups: int | None = None) -> bool:
    """Whether the groups of a data-dependent COUNT/SUM bound share one generalized-Cauchy release of the whole
    histogram instead of splitting the share over them (for ``groups`` m, when known: where it gives less noise).

    The plan's bound c(x) is a sum over the product rows a change touches of a per-row bound (|e(r)|, or its
    derivative under value privacy), so it bounds the ℓ1 norm over the groups of the histogram's change, each
    touched row landing in one group. NR Theorem 3.53 then holds for the vector f(x) + (c(x)/b)·η with
    η ∈ ℝ^m independent GenCauchy(γ): sliding costs (γ+1)·b·‖Δf‖₁/c ≤ (γ+1)·b·d as for one value, and the
    dilation by c(x′)/c(x) ≤ e^(βd) costs (γ+1)·β·d per coordinate, m times. So ε = (γ+1)(b + m·β): b is m
    times the b of the share split m ways at the same β, and so is the noise scale smaller. When a changed
    value moves a row between two groups (``plan.key_moves``: the row's derivative counts in both groups'
    step filters) the ℓ1 change is up to 2·c(x), so the vector's scale is 2·c(x)/b: better than the split
    for m > 2 groups. Not for MIN/MAX (one row may move the extreme of every group), nor for the (ε, δ) Laplace
    of Theorem 3.56 (its δ grows with the dilation), nor where parallel composition already gives every group
    the whole share."""
    return (
        bool(form.group_by)
        and params.mechanism == CAUCHY
        and kind in ("count", "sum")
        and not plan.disjoint_groups
        and not plan.data_independent
        and plan.own_mechanism is None
        and (groups is None or groups > histogram_factor(plan))
    )


def histogram_factor(plan: Plan) -> int:
    """How many times the plan's bound covers the ℓ1 norm of its histogram's change (sqldp.release.dilated)."""
    return 2 if plan.key_moves else 1


def smoothed(
    shares: Sequence[tuple[float, float | None] | None], plans: Sequence[Plan]
) -> list[tuple[float, float | None]]:
    """The (ε, δ) shares whose noise uses β (a data-independent plan's does not, so a fixed β is no constraint)."""
    return [s for s, plan in zip(shares, plans, strict=True) if s is not None and not plan.data_independent]


@dataclass(frozen=True)
class BoundChoice:
    """Whether a query relies on its declared contribution bounds (truncation) or not, and why: the expected
    |noise| each way, summed over the query's aggregates, at the query's ε (docs/truncation.md)."""

    truncated: bool
    truncated_noise: float  # Σ median |noise| with the truncated global bounds (Laplace at c/ε)
    untruncated_noise: float  # Σ the same, or a floor of it where the bound is data-dependent (below)
    floor: bool = False  # untruncated_noise is a floor (some untruncated bound is data-dependent)

    def to_json(self) -> dict[str, Any]:
        return {
            "chosen": "truncated global bound" if self.truncated else "untruncated bound",
            "truncated_median_noise": self.truncated_noise,
            "untruncated_median_noise": self.untruncated_noise,
            "untruncated_is_floor": self.floor,
        }

    def note(self, truncations: Sequence[Any]) -> str:
        """What a run shows when the query relies on declared bounds: data-independent (τ, not the rows cut)."""
        read = "; ".join(str(t) for t in truncations)
        return (
            f"declared contribution bound (max_rows_per) enforced by truncation — {read}; rows beyond it are not "
            f"counted. Median |noise| {self.truncated_noise:.3g} with it, {'≥ ' if self.floor else ''}"
            f"{self.untruncated_noise:.3g} without"
        )


def smooth_noise_floor(mechanism: str, beta: float | None) -> float:
    """A floor of the median |noise| per unit of smooth sensitivity and of 1/ε for the data-dependent
    mechanisms: generalized Cauchy scales by c/b with b = ε/(γ + 1) − β < ε/(γ + 1) (NR Theorem 3.53); the
    smoothed Laplace by c/b with b = ε/2 when sqldp chooses β (:func:`sqldp.mechanisms.optimise_beta`), and
    b < ε for a fixed β (NR Theorem 3.56)."""
    if mechanism == CAUCHY:
        return mechanisms.gencauchy_abs_quantile(0.5) * (mechanisms.GAMMA + 1.0)
    return math.log(2.0) * (2.0 if beta is None else 1.0)


def choose_truncation(
    form: AnalysisForm,
    plans: Sequence[Plan],
    truncated: Sequence[Plan],
    params: PrivacyParams,
    groups: int | None,
) -> BoundChoice:
    """Truncate when that gives less expected noise, decided from data-independent facts only (the choice, like
    the mechanism, is released): the truncated plans' global bounds c give Laplace noise at c/ε_i, median
    ln 2·c/ε_i (or the Gaussian vector's Φ⁻¹(¾)·√k·σ₁·c where :func:`gaussian` takes it). The untruncated
    plan's noise is known the same way when its bound is global too; when it is
    data-dependent (smoothed), its floor on a database where the declaration is reached is used: there one row
    changes N_t join rows (the model checker's bound is exact, and attained), so the smooth bound is at least
    the local sensitivity M·N_t/G_t — the truncated bound before its factor for the evicted row — and the
    mechanism's noise at least :func:`smooth_noise_floor` times it. A data-independent bound that reads public
    rows (sqldp.sensitivity.rows) is unknown until they are read and counts 0 (never truncated for). Ties keep
    the untruncated query, which answers for all rows."""
    k = len(plans)

    def share(split: Sequence[Share | None], i: int) -> float:
        s = split[i]
        return s[0] if s is not None else params.epsilon / k  # the groups' count unknown: the largest share

    cut_split = shares(form, params, truncated, groups)
    plain_split = shares(form, params, plans, groups)
    ln2 = math.log(2.0)

    def unit(ps: Sequence[Plan], split: Sequence[Share | None], i: int) -> float:
        """Median |noise| per unit of a global bound: Laplace at the share's ε, or the Gaussian vector's."""
        if gaussian(form, params, ps):
            sigma = mechanisms.gaussian_sigma(params.epsilon, params.delta or 0.0, change_distances(ps))
            return mechanisms.gaussian_abs_quantile(0.5) * math.sqrt(k) * sigma
        return ln2 / share(split, i)

    t_noise = sum(unit(truncated, cut_split, i) * (p.global_bound or 0.0) for i, p in enumerate(truncated))
    u_noise = 0.0
    for i, (plan, alt) in enumerate(zip(plans, truncated, strict=True)):
        if plan.global_bound is not None:
            u_noise += unit(plans, plain_split, i) * plan.global_bound
        elif not plan.data_independent:
            terms = alt.bind(())(0.0).tables  # a global plan's terms: its bound reads nothing
            reach = max((t["sensitivity"] / t.get("swap", 1.0) for t in terms.values()), default=0.0)
            eps = share(plain_split, i)
            if groups is not None and dilated(form, params, plan, form.aggregates[i].kind, groups):
                eps *= groups  # one release of the whole histogram: b < (ε/k)/(γ + 1), not split over the groups
            u_noise += smooth_noise_floor(params.mechanism, params.beta) * reach / eps
    floor = any(p.global_bound is None for p in plans)
    return BoundChoice(t_noise < u_noise, t_noise, u_noise, floor)


def calibrate(
    plan: Plan, results: Sequence[Rows], eps: float, delta: float | None, params: PrivacyParams
) -> tuple[mechanisms.Calibration, Bound]:
    """The noise for one aggregate: β from the user, or chosen to minimise the noise (NR Theorem 3.73)."""

    bound_at = plan.bind(results)  # the β-independent work once; then one cheap evaluation per β
    if plan.data_independent:
        # The bound does not depend on the private data (nor on β): it is the global sensitivity over every
        # database that differs in private rows, so value + Lap(c/ε) is ε-DP (Dwork, McSherry, Nissim, Smith,
        # "Calibrating noise to sensitivity in private data analysis", TCC 2006) with δ = 0 — a scale c/ε
        # where generalized Cauchy needs c/(ε/(γ + 1) − β) ≥ 5c/ε. Chosen from the plan's shape only.
        return mechanisms.calibrate_global(float(bound_at(0.0).sensitivity), eps), bound_at(0.0)

    def smooth(beta: float) -> float:
        return float(bound_at(beta).sensitivity)

    distances = change_distances([plan])
    mechanism = plan.mechanism(params.mechanism, False)  # the measurement's mechanism says which
    if params.beta is None:
        extra = plan.grid  # a value plan's bound is tightest on its own grid points
        cal = mechanisms.optimise_beta(smooth, eps, mechanism, delta=delta, extra=extra, distances=distances)
    elif mechanism == LAPLACE:
        cal = mechanisms.calibrate_laplace(smooth(params.beta), eps, delta, params.beta, distances)
    else:
        cal = mechanisms.calibrate_cauchy(smooth(params.beta), eps, params.beta)
    return cal, bound_at(cal.beta)


def templates(
    form: AnalysisForm,
    params: PrivacyParams,
    plans: Sequence[Plan],
    results: Sequence[Sequence[Rows]],
    groups: int,
) -> list[Measurement]:
    """Per aggregate, its calibrated measurement (no value yet): its share of ε and δ over ``groups`` groups
    (NR §3.3.10.4), the bound its plan computes from ``results`` and the noise that bound calls for. A plan's
    bound covers every group of the query, so the template serves each group."""
    # the aggregates' β searches smooth the same counts at the same βs (sqldp.sensitivity.smoothing.remembering)
    with remembering():
        return _templates(form, params, plans, results, groups)


def _templates(
    form: AnalysisForm,
    params: PrivacyParams,
    plans: Sequence[Plan],
    results: Sequence[Sequence[Rows]],
    groups: int,
) -> list[Measurement]:
    split = shares(form, params, plans, groups)
    check_beta(params, smoothed(split, plans))  # the group count is known now
    joint = gaussian(form, params, plans)
    distances = change_distances(plans)  # the Gaussian vector's (joint), calibrated for every one of them
    out = []
    for i, (agg, plan, rows, share) in enumerate(zip(form.aggregates, plans, results, split, strict=True)):
        assert share is not None
        eps, delta = share
        own = plan.template(agg.sql, rows, eps)
        if own is not None:  # a mechanism of the plan's own (R2T's race, sqldp.mechanisms.race)
            out.append(own)
            continue
        if not plan.spends_epsilon:
            # owned groups' selector: its indicator with Laplace noise of scale 1, thresholded by δ alone
            # (selection_threshold); no ε is spent, so none is shown
            cal, bound = mechanisms.calibrate_global(1.0, 1.0), plan.bind(rows)(0.0)
            cal = dataclasses.replace(cal, epsilon=0.0)
        else:
            cal, bound = calibrate(plan, rows, bar_value_epsilon(plan, params, eps, joint), delta, params)
        share_eps = eps
        if joint:  # the whole query's (ε, δ) on one Gaussian vector: this aggregate's coordinates of it
            assert params.delta is not None
            cal = mechanisms.calibrate_gaussian(cal.sensitivity, params.epsilon, params.delta, len(plans), distances)
        if dilated(form, params, plan, agg.kind, groups):
            # calibrated at the split share ε/m and β: the vector's b = ε/(γ+1) − m·β is m times that b, and
            # its sensitivity the bound times the histogram factor
            factor = histogram_factor(plan)
            eps *= groups
            cal = dataclasses.replace(
                cal,
                epsilon=eps,
                b=cal.b * groups,
                sensitivity=cal.sensitivity * factor,
                scale=cal.scale * factor / groups,
            )
        # after any dilation: L is the log of the scale released (a constant times the smooth bound), at the
        # bar's share of the ε this measurement spends (the whole histogram's when dilated)
        bar = smooth_bar(plan, params, share_eps, eps, joint, cal)
        out.append(
            Measurement(
                aggregate=agg.sql,
                epsilon=eps,
                delta=delta,
                beta=cal.beta,
                sensitivity=cal.sensitivity,
                noise_scale=cal.scale,
                half_width=cal.half_width(params.confidence),
                terms=bound.tables,
                mechanism=plan.mechanism(params.mechanism, joint),
                calibration=cal,
                bound=plan.bound_source,
                owned_groups=plan.owned_groups,
                one_sided=one_sided_count(plan, bound) if i == form.select_by else None,
                bar=bar,
            )
        )
    return out


def _bar_applies(plan: Plan, params: PrivacyParams, joint: bool) -> bool:
    """Whether the measurement's noise is scaled to a β-smooth bound computed from the data (generalized Cauchy
    or the smoothed Laplace) and a share of its ε buys a bar (sqldp.mechanisms.smooth_bar): decided from the
    plan's shape and the parameters only."""
    if params.bar_share <= 0 or joint or plan.data_independent or not plan.spends_epsilon:
        return False
    return plan.mechanism(params.mechanism, False) in (CAUCHY, LAPLACE)


def bar_value_epsilon(plan: Plan, params: PrivacyParams, eps: float, joint: bool) -> float:
    """The ε the value is calibrated at: ε·(1 − bar_share) where a bar is bought, else ε."""
    return params.value_epsilon(eps) if _bar_applies(plan, params, joint) else eps


def smooth_bar(
    plan: Plan, params: PrivacyParams, share_eps: float, eps: float, joint: bool, cal: mechanisms.Calibration
) -> SmoothBar | None:
    """The bar's release for a smoothed measurement (sqldp.mechanisms.smooth_bar), at ε_b = bar_share·ε of the
    ε the measurement spends (``eps``; ``share_eps`` is the share it was calibrated at, before any dilation);
    None where no bar is bought. The smoothness of ln(scale) per unit of distance is data-independent: the
    smoothed Laplace's β (fixed, or sqldp.mechanisms.laplace.laplace_beta of (ε, δ) and the change
    distances); generalized Cauchy's fixed β, or, where β is chosen per input from the grid (NR Theorem 3.73,
    a data-dependent choice), the grid's limit ε_v/(γ + 1) at the calibrated share, above every β of the
    family. ``cal`` is the calibration after any dilation (which multiplies the scale by a constant)."""
    if not _bar_applies(plan, params, joint):
        return None
    if cal.mechanism == LAPLACE or params.beta is not None:
        beta = cal.beta if cal.mechanism == LAPLACE else float(params.beta or 0.0)
    else:
        beta = params.value_epsilon(share_eps) / (mechanisms.GAMMA + 1.0)
    log_scale = math.log(cal.scale) if cal.scale > 0 else -math.inf
    return SmoothBar(
        beta=beta,
        epsilon=eps * params.bar_share,
        share=params.bar_share,
        confidence=params.confidence,
        log_scale=log_scale,
    )


def measure(
    form: AnalysisForm,
    made: Sequence[Measurement],
    answer_rows: Sequence[tuple[Any, ...]],
    domain_values: Sequence[Sequence[Any]],
    parts: Sequence[tuple[int, ...]] | None = None,
) -> tuple[list[tuple[Any, ...]], list[list[Measurement]]]:
    """The groups (every combination of the parts' groups; ``[()]`` without GROUP BY) and, per group, the
    templates with the group's true value from the answer rows. ``domain_values`` lists each key's values, or,
    with ``parts`` (sqldp.groups.factors: the GROUP BY positions of each independent part of the domain), each
    part's groups as tuples of its keys' values (sqldp.groups.read_factors). A group with no rows has COUNT and
    SUM 0 (SUM of nothing is NULL in SQL, 0 as a function) and no MIN, MAX or AVG."""
    if form.select_by is not None:  # partition selection: the groups present in the data, in key order
        k = len(form.group_by)
        by_key = {tuple(r[:k]): tuple(r) for r in answer_rows}
        groups = sorted(by_key, key=lambda g: tuple(_sort_key(v) for v in g))
        indices = groups
    elif form.group_by:
        if parts is None:
            parts = [(j,) for j in range(len(domain_values))]
            domain_values = [tuple((v,) for v in vals) for vals in domain_values]
        groups = part_groups(parts, domain_values)
        by_key = by_group(answer_rows, [len(vals) for vals in domain_values])
        indices = all_groups([tuple(range(len(vals))) for vals in domain_values])
    else:
        groups, by_key, indices = [()], {}, [()]
    out = []
    for g in indices:
        row = by_key.get(g) if form.group_by else (answer_rows[0] if answer_rows else None)
        measured: list[Measurement] = []
        for i, template in enumerate(made):
            # a field-for-field copy of the template (dataclasses.replace runs __init__ over every field: most of
            # a run's Python time when partition selection measures thousands of groups)
            m = object.__new__(Measurement)
            m.__dict__.update(template.__dict__)
            if row is not None and row[len(form.group_by) + i] is not None:
                m.true_value = float(row[len(form.group_by) + i])
                # an owned group's indicator: 1 for a group present (sqldp.strategies.owned)
                if m.owned_groups is not None:
                    m.true_value = min(1.0, m.true_value)
            else:
                m.true_value = 0.0 if form.aggregates[i].kind in ("count", "sum") else None
            if m.mechanism == UNIT_HISTOGRAM:
                races = len(m.thresholds)
                own, masses, largest = histogram_columns(len(form.group_by), len(made), races, i)
                m.truncated = tuple(float(v or 0) for v in row[own]) if row is not None else (0.0,) * races
                m.mass = tuple(float(v or 0) for v in row[masses]) if row is not None else (0.0,) * races
                assert m.unit is not None
                top = float(row[largest] or 0) if row is not None else 0.0
                m.terms = {
                    m.unit["unit"]: {
                        "thresholds": list(m.thresholds),
                        "truncated": list(m.truncated),
                        "largest_contribution": top,
                    }
                }
            measured.append(m)
        out.append(measured)
    return groups, out


def release(form: AnalysisForm, result: Result, groups: Sequence[tuple[Any, ...]], noise: NoiseSource) -> None:
    """Sample each measurement's noise and compute the released rows from the noisy values only (post-processing
    keeps the guarantee, Dwork & Roth Prop. 2.1): the output expressions, HAVING, ORDER BY and LIMIT."""
    race.histogram_release(result, noise)
    # per released row: its keys, values, error bars, and the values of ORDER BY's expressions that are no output
    rows: list[tuple[dict[str, Any], dict[str, Any], dict[str, float], dict[int, Any]]] = []
    kept: list[list[Measurement]] = []

    def draw(m: Measurement) -> None:
        if m.mechanism == UNIT_HISTOGRAM:
            assert m.noisy_value is not None  # drawn by histogram_release, one τ for every group
        elif m.mechanism == R2T:
            m.noisy_value = race.race(m, noise)
        else:
            assert m.true_value is not None
            m.noisy_value = mechanisms.release(m.mechanism, m.true_value, m.noise_scale, noise)
            if m.bar is not None:
                m.bar.draw(noise)  # once for every group's copy: they share the bound

    chosen = _selection(form, result.measurements, noise) if form.select_by is not None else None
    for index, (g, measured) in enumerate(zip(groups, result.measurements, strict=True)):
        if any(g[len(form.group_by) + i] is not True for i in form.key_having):
            continue  # HAVING over the keys alone: a filter on the (public or declared) domain; NULL drops, as SQL
        for m in measured:
            if m.true_value is None:
                # only MIN/MAX (AggKind) of a group with no rows; a refusal is an answer, and this one depends on public
                # facts only: MIN/MAX run over public rows (NR §3.3.9), keys over value-sensitive columns are
                # refused, private filters keep every row in q_m (§3.3.8.4), and a value change keeps NULL-ness
                # (tests/sensitivity/test_minmax.py checks every value neighbour)
                raise RefusedError(f"{m.aggregate} has no value for a group with no rows; not released")
        if chosen is not None and form.select_by is not None:
            # the selectors are drawn first (_selection): a group not selected leaves nothing, not even that it was
            # measured, so its other values need no noise (each measurement's noise is drawn independently)
            if index not in chosen:
                continue
            measured[form.select_by].noisy_value = chosen[index]
        for i, m in enumerate(measured):
            if i != form.select_by:
                draw(m)
        noisy = [m.noisy_value for m in measured]
        kept.append(list(measured))
        if form.having is not None and holds(form.having, noisy) is not True:
            continue  # HAVING on the noisy aggregates: NULL, like SQL, drops the group
        values: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        errors: dict[str, float] = {}
        for o in form.outputs:
            if o.is_key:
                # a key expression's value follows the keys in the group's tuple (sqldp.groups.factors)
                keys[o.name] = g[o.group_key if o.derived is None else len(form.group_by) + o.derived]  # type: ignore[index]
                continue
            values[o.name] = evaluate(o.expr, noisy)
            bar = error_bar(o, measured, values[o.name], result.params.confidence if result.params else None)
            if bar is not None:
                errors[o.name] = bar
        # ORDER BY an expression: of the noisy aggregates (post-processing), or of the keys (over the domain)
        order = {
            i: evaluate(k.expr, noisy) if k.expr is not None else g[len(form.group_by) + k.derived]  # type: ignore[operator]
            for i, k in enumerate(form.order_by)
            if k.output < 0
        }
        rows.append((keys, values, errors, order))
    for i, key in reversed(list(enumerate(form.order_by))):
        if key.output < 0:

            def by_expression(row: tuple[Any, ...], i: int = i) -> tuple[int, Any]:
                return _sort_key(row[3][i])

            rows.sort(key=by_expression, reverse=key.descending)
            continue
        out: Output = form.outputs[key.output]

        def sort_key(row: tuple[Any, ...], o: Output = out) -> tuple[int, Any]:
            return _sort_key(row[0].get(o.name) if o.is_key else row[1].get(o.name))

        rows.sort(key=sort_key, reverse=key.descending)
    if form.limit is not None:
        rows = rows[: form.limit]
    if form.select_by is not None:
        result.measurements = kept  # how many groups the data has is private; the selected ones are released
    result.columns = [o.name for o in form.outputs]
    result.rows = []
    for k, v, bars, _ in rows:
        row: dict[str, Any] = {"key": k, "values": v} if form.group_by else {"values": v}
        if bars:
            row["errors"] = bars
        result.rows.append(row)
    result.released = True


def _selection(
    form: AnalysisForm, measurements: Sequence[Sequence[Measurement]], noise: NoiseSource
) -> dict[int, float]:
    """The groups partition selection keeps (their index) and their selectors' noisy values: each selector's
    Laplace release compared with τ (:func:`selection_threshold`). Groups whose selectors share the true value,
    scale and τ (every group of owned-row selection: its indicator is 1) are drawn together by
    :func:`sqldp.mechanisms.laplace_selection`, the same joint distribution as one release per group, in time
    independent of how many groups the data has."""
    assert form.select_by is not None
    classes: dict[tuple[float, float, float], list[int]] = {}
    for i, measured in enumerate(measurements):
        selector = measured[form.select_by]
        threshold = selection_threshold(selector)  # refuses without δ or a data-independent count bound
        assert selector.true_value is not None  # a count: 0 for a group without rows, never NULL (measure)
        key = (selector.true_value, selector.noise_scale, threshold)
        classes.setdefault(key, []).append(i)
    chosen: dict[int, float] = {}
    for (value, scale, threshold), members in classes.items():
        drawn = mechanisms.laplace_selection(len(members), value, scale, threshold, noise)
        chosen.update({members[j]: v for j, v in drawn.items()})
    if shared_scale(form, measurements) and len(chosen) > SHARED_SCALE_GROUPS:
        # owned groups whose values share a noise scale read from the data: show one selected group, drawn
        # uniformly (post-processing of the selection; sqldp.strategies.owned, "One noise scale for every group")
        assert SHARED_SCALE_GROUPS == 1
        pick = sorted(chosen)[noise.index(len(chosen))]
        chosen = {pick: chosen[pick]}
    return chosen


def shared_scale(form: AnalysisForm, measurements: Sequence[Sequence[Measurement]]) -> bool:
    """Whether the groups are owned (sqldp.strategies.owned) and a value's noise scale is read from the data:
    decided by the mechanisms, which the query, the schema and the policy decide."""
    if form.select_by is None or not measurements:
        return False
    first = measurements[0]
    return first[form.select_by].owned_groups is not None and any(
        m.mechanism not in PUBLIC_SCALE for i, m in enumerate(first) if i != form.select_by
    )


def one_sided_count(plan: Plan, bound: Bound) -> float:
    """The largest count one neighbouring change can give a group that exists on one side only: the plan's own
    figure where it has one (a bucket of the nested histogram holds one inner group: 1), else the count's join
    rows for one row of the table that moves most, c_t·G_t per private table t — the bound c_t is per unit of
    distance and one row of t is at distance G_t (NR §3.3.7). ∞ where a term does not say its weight (fail
    closed: :func:`selection_threshold` then refuses)."""
    own = getattr(plan, "one_sided", None)
    if own is not None:
        return float(own)
    counts = [
        float(t["sensitivity"]) * float(t["weight"]) if "sensitivity" in t and "weight" in t else math.inf
        for t in bound.tables.values()
    ]
    return max(counts, default=math.inf)


def selection_threshold(selector: Measurement) -> float:
    """τ = M + b·ln(1/(2δ)) for the selection count's noise scale b = c/ε, its δ share and M
    (:func:`one_sided_count`) the largest count a group that exists on one side of one neighbouring change can
    have: a group is released when its noisy count exceeds τ (sqldp.groups.partition_selection), which a
    one-sided group does with probability ½·e^(−(τ − M)/b) = δ at most, at any distance of the change; a common
    group's count moves by at most c·d at distance d, costing ε·d. (c·(1 + ln(1/(2δ))/ε), which this replaced,
    took M = c: at a table weight G > 1 a row at distance G gives a one-sided group of count c·G, released with
    probability δ·e^(ε(G − 1)).) For owned groups (sqldp.strategies.owned) the selected value is the group's indicator,
    equal on both sides of a common group, under Laplace noise of scale b = 1, and k one-sided groups share δ:
    τ = 1 + b·ln(k/(2δ)), so that each is released with probability ½·e^(−(τ−1)/b) = δ/k, whatever the
    distance of the change."""
    if selector.delta is None or selector.mechanism != GLOBAL:
        raise RefusedError("partition selection needs δ > 0 and a data-independent count bound")
    if selector.owned_groups is not None:
        return 1.0 + selector.noise_scale * math.log(selector.owned_groups / (2.0 * selector.delta))
    m = selector.one_sided
    if m is None or not math.isfinite(m):
        raise RefusedError(
            "DP partition selection needs a bound on the count of a group that one change creates; this query's "
            "count bound does not say it"
        )
    return m + selector.noise_scale * math.log(1.0 / (2.0 * selector.delta))


def error_bar(
    output: Output, measured: Sequence[Measurement], value: float | None, confidence: float | None
) -> float | None:
    """The half-width of an interval around the released ``value`` that holds the true value with probability at
    least ``confidence``, when every measurement the output reads has a data-independent noise scale (a
    ``laplace-global`` or ``gaussian-global`` one: its bar may be shown to analysts); else None. Each
    measurement's bar is taken at confidence 1 − (1 − c)/k for the k measurements read (a union bound: all k
    hold at once with probability ≥ c), and the output's interval follows by interval arithmetic
    (:data:`INTERVALS`), which is sound for every operator there: the true output is the expression at the
    true values, which lie in their intervals."""
    used = [measured[i] for i in output.aggregates]
    if value is None or confidence is None or not used:
        return None
    if any(m.mechanism not in PUBLIC_SCALE and (m.bar is None or m.bar.noisy_log is None) for m in used):
        return None
    if any(m.calibration is None or m.noisy_value is None for m in used):
        return None
    each = 1.0 - (1.0 - confidence) / len(used)
    boxes: dict[int, Interval] = {}
    for i in output.aggregates:
        m, noisy = measured[i], measured[i].noisy_value
        assert noisy is not None
        boxes[i] = (noisy - (width := measurement_bar(m, each)), noisy + width)
    projected = _projected(output.expr, boxes)
    if projected is not None:
        return projected
    span = interval_of(output.expr, boxes)
    if span is None or not all(math.isfinite(x) for x in span):
        return None
    return max(value - span[0], span[1] - value, 0.0)


def _projected(e: exp.Expr, boxes: Boxes) -> float | None:
    """The bar of a released COUNT or SUM of non-negative terms (sqldp.aggregates.counted, sqldp.aggregates.clamp
    at 0) of one measurement, else None: the measurement's own half-width, plus 0.5 for the rounding. Raising a
    value to 0 projects it onto [0, ∞), a convex set holding the true value, which moves it no farther from
    the truth; rounding moves it by at most 0.5. (The interval arithmetic would give 0 when the whole interval
    is below 0, a bar that reads as exact.)"""
    if isinstance(e, exp.Cast) and e.to.is_type(*exp.DataType.INTEGER_TYPES):
        e = e.this  # a count's BIGINT (sqldp.aggregates.counted): already an integer
    zero = isinstance(e, exp.Greatest) and isinstance(e.this, exp.Literal) and not e.this.is_string
    if not zero or len(e.expressions) != 1 or float(e.this.this) != 0.0:
        return None
    inner, rounding = e.expressions[0], 0.0
    if isinstance(inner, exp.Round) and inner.args.get("decimals") is None:
        inner, rounding = inner.this, 0.5
    box = aggregate_box(inner, boxes) if isinstance(inner, exp.Column) else None
    return None if box is None else (box[1] - box[0]) / 2 + rounding


def measurement_bar(m: Measurement, confidence: float) -> float:
    """One measurement's half-width at ``confidence``: from its public scale, or, for a smoothed bound with a
    bar (sqldp.mechanisms.smooth_bar), the noise's half-width at 1 − miss/2 computed with the noisy upper bound
    U (which holds with probability 1 − miss/2) in place of the scale: both hold with probability ≥ confidence
    (a union bound). Post-processing of the released value and L."""
    if m.bar is None or m.mechanism in PUBLIC_SCALE:
        return float(m.calibration.half_width(confidence))
    miss = (1.0 - confidence) / 2.0
    return float(dataclasses.replace(m.calibration, scale=m.bar.upper(miss)).half_width(1.0 - miss))


def describe(
    form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan], domains: Sequence[Any]
) -> list[dict[str, Any]]:
    """Per aggregate, what an analyst may see before anything is read: its ε and δ share and how the groups
    share it (None while the group count is read from a public table at run time)."""
    out = []
    groups = declared_groups(domains)
    split = shares(form, params, plans, groups)
    joint = gaussian(form, params, plans)
    for agg, plan, share in zip(form.aggregates, plans, split, strict=True):
        parallel = not form.group_by or plan.disjoint_groups
        vector = dilated(form, params, plan, agg.kind, groups)
        if joint:
            how = (
                f"one Gaussian release of all {len(plans)} aggregates' global bounds (ℓ2), less noise than "
                f"Laplace at ε/{len(plans)} each"
            )
        elif parallel:
            how = "full share"
        elif plan.own_mechanism == R2T_HISTOGRAM:
            how = "full share (ℓ1 over the groups: each unit truncated across them, one Laplace release)"
        elif plan.data_independent:
            how = "full share (ℓ1 over the groups, global bound)"
        elif vector and groups is None and histogram_factor(plan) > 1:
            # the group count is read at run time, and a key-moving histogram is one release only for m > 2
            how = (
                f"full share (ℓ1 over the groups, one generalized-Cauchy release of the histogram if it has more"
                f" than {histogram_factor(plan)} groups, else the share divided among them)"
            )
        elif vector:
            how = "full share (ℓ1 over the groups, one generalized-Cauchy release of the histogram)"
        else:
            how = "share divided among the groups"
        eps = share[0] if share else None
        if vector:  # the share before the split over the groups (shares() divides it)
            eps = params.epsilon / len(plans)
        delta = share[1] if share else None
        entry: dict[str, Any] = {
            "aggregate": agg.sql,
            "groups": how,
            "epsilon": eps,
            "delta": delta,
            "mechanism": plan.mechanism(params.mechanism, joint),
        }
        if plan.bound_source is not None:  # which global bound (the query, the schema and the policy decide it)
            entry["bound"] = plan.bound_source
        expected = None if joint or vector else plan.expected_bound()
        if expected is not None and eps is not None:
            # a global bound that needs no query: the noise _templates will calibrate to it (calibrate), and
            # its bar, follow from the query, the schema and the policy alone, so they are the error to expect
            cal = mechanisms.calibrate_global(expected, eps)
            entry["noise_scale"], entry["half_width"] = cal.scale, cal.half_width(params.confidence)
        if plan.privacy_unit is not None:
            entry["unit"] = plan.privacy_unit
        out.append(entry)
    return out


def by_group(rows: Sequence[tuple], sizes: Sequence[int]) -> dict[tuple, tuple]:
    """The answer rows of a GROUP BY by their groups' indices (``match_groups`` puts them first), without
    those indices: the keys, then the aggregates, as the answer query gives them."""
    k = len(sizes)
    out: dict[tuple, tuple] = {}
    for row in rows:
        index = tuple(row[:k])
        if any(i is None for i in index):
            continue  # outside the declared domain: never released
        if index in out:  # two PostgreSQL groups in one released group (see match_groups: cannot happen)
            raise RefusedError("the GROUP BY keys do not match the declared groups one to one; not released")
        out[index] = tuple(row[k:])
    return out


def _sort_key(v: Any) -> tuple[int, Any]:
    return (1, 0) if v is None else (0, v)
