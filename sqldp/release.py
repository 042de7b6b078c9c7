"""The release step (pipeline step 6 of 6, README "Layout"): from the analyses' plans and the rows the engine
read, the measurements and the noisy answer. Pure — no database, only the noise source — so every rule here
is testable on its own: composition over aggregates and groups (NR §3.3.10.4), the mechanism and β (NR
Theorems 3.53, 3.56 and 3.73, or Laplace on a global bound), the noise, and the post-processing of the noisy
values (output arithmetic, HAVING, ORDER BY and LIMIT).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from sqlglot import exp

from sqldp import mechanisms
from sqldp.errors import RefusedError
from sqldp.form import AGG_PREFIX, AnalysisForm, Output
from sqldp.groups import all_groups
from sqldp.mechanisms import NoiseSource
from sqldp.params import PrivacyParams, check_beta
from sqldp.result import GLOBAL, R2T, Measurement, Result
from sqldp.sensitivity.plan import Bound, Plan, Rows
from sqldp.sensitivity.units import UnitPlan

Share = tuple[float, float | None]  # an aggregate's (ε, δ)


def declared_groups(domains: Sequence[Any]) -> int | None:
    """The number of groups when every key's domain is declared in the policy; None when one is read from a
    public table at run time."""
    sizes = [len(d.values) for d in domains if d.values is not None]
    return math.prod(sizes) if len(sizes) == len(domains) else None


def shares(
    form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan], groups: int | None
) -> list[tuple[float, float | None] | None]:
    """Each aggregate's (ε, δ) share (NR §3.3.10.4): the aggregates split ε and δ equally (sequential
    composition); the groups of a GROUP BY get the full share when a neighbouring change touches one group
    (parallel composition) or when the bound is global (below), else share/m for m groups (None while m is
    unknown).

    A global bound c (``data_independent``) covers the whole histogram in ℓ1: the plan bounds the derivative
    of the ungrouped aggregate, i.e. Σ over the rows a neighbour adds or removes of |e(row)|, and each of those
    rows lands in one group, so Σ_g |Δ_g| ≤ c. Laplace noise at c/ε on every group is then ε-DP for the vector
    (the Laplace mechanism for ℓ1 sensitivity, Dwork et al. TCC 2006), with no split over the groups."""
    out: list[tuple[float, float | None] | None] = []
    for plan in plans:
        whole = not form.group_by or plan.disjoint_groups or plan.data_independent
        divisor = 1 if whole else groups
        if divisor is None:
            out.append(None)
            continue
        eps = params.epsilon / len(plans) / divisor
        out.append((eps, params.delta / len(plans) / divisor if params.delta else None))
    return out


def smoothed(
    shares: Sequence[tuple[float, float | None] | None], plans: Sequence[Plan]
) -> list[tuple[float, float | None]]:
    """The (ε, δ) shares whose noise uses β (a data-independent plan's does not, so a fixed β is no constraint)."""
    return [s for s, plan in zip(shares, plans, strict=True) if s is not None and not plan.data_independent]


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

    if params.beta is None:
        extra = plan.grid  # a value plan's bound is tightest on its own grid points
        cal = mechanisms.optimise_beta(smooth, eps, params.mechanism, delta=delta, extra=extra)
    elif params.mechanism == "laplace":
        cal = mechanisms.calibrate_laplace(smooth(params.beta), eps, delta, params.beta)
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
    split = shares(form, params, plans, groups)
    check_beta(params, smoothed(split, plans))  # the group count is known now
    out = []
    for agg, plan, rows, share in zip(form.aggregates, plans, results, split, strict=True):
        assert share is not None
        eps, delta = share
        if isinstance(plan, UnitPlan):
            out.append(race_template(agg.sql, plan, rows, eps))
            continue
        cal, bound = calibrate(plan, rows, eps, delta, params)
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
                mechanism=GLOBAL if plan.data_independent else cal.mechanism,
            )
        )
    return out


def race_scales(thresholds: Sequence[float], eps: float, beta: float) -> list[tuple[float, float]]:
    """Per race j, R2T's Laplace scale τ_j·J/ε (ε split evenly over the J races, sequential composition) and the
    correction log(J/β)·τ_j·J/ε subtracted from it (R2T §4: with probability ≥ 1 − β no race's noise exceeds
    its correction, so the released top does not overshoot Q(I)). Both depend on the policy and ε only."""
    j = len(thresholds)
    return [(t * j / eps, t * j / eps * math.log(j / beta)) for t in thresholds]


def race_template(aggregate: str, plan: UnitPlan, rows: Sequence[Rows], eps: float) -> Measurement:
    """The measurement of an R2T plan: the truncated answers it read and the race's data-independent parts.
    ``half_width`` is R2T's error bound 4·J·log(J/β)·DS/ε at probability 1 − β (Theorem 4.2 of the paper;
    DS, the largest contribution of one unit, is read from the data: audit only)."""
    values, largest = plan.truncated(rows)
    j = len(plan.thresholds)
    bound = plan.bind(rows)(0.0)
    return Measurement(
        aggregate=aggregate,
        epsilon=eps,
        delta=None,
        beta=0.0,
        sensitivity=plan.unit.max_contribution,
        noise_scale=plan.thresholds[-1] * j * len(plan.signs) / eps,
        half_width=4 * j * math.log(j / plan.beta) * largest * len(plan.signs) ** 2 / eps,
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
    Prop. 2.1). Each noisy value is sampled exactly (sqldp.mechanisms.release). A SUM raced in a positive and
    a negative part gives each part half of ε and releases their difference (sequential composition)."""
    assert m.unit is not None
    signs = m.unit.get("signs", [1])
    j = len(m.thresholds)
    out = 0.0
    for i, sign in enumerate(signs):
        best = 0.0  # Q(I, 0): truncated at 0, no unit contributes
        scales = race_scales(m.thresholds, m.epsilon / len(signs), m.unit["beta"])
        for q, (scale, correction) in zip(m.truncated[i * j : (i + 1) * j], scales, strict=True):
            best = max(best, mechanisms.release("laplace", q, scale, noise) - correction)
        out += sign * best
    return out


def measure(
    form: AnalysisForm,
    made: Sequence[Measurement],
    answer_rows: Sequence[tuple[Any, ...]],
    domain_values: Sequence[Sequence[Any]],
) -> tuple[list[tuple[Any, ...]], list[list[Measurement]]]:
    """The groups (every combination of the key domains; ``[()]`` without GROUP BY) and, per group, the
    templates with the group's true value from the answer rows. A group with no rows has COUNT and SUM 0 (SUM
    of nothing is NULL in SQL, 0 as a function) and no MIN, MAX or AVG."""
    groups = all_groups([tuple(vals) for vals in domain_values]) if form.group_by else [()]
    by_key = by_group(answer_rows, [len(vals) for vals in domain_values]) if form.group_by else {}
    indices = all_groups([tuple(range(len(vals))) for vals in domain_values]) if form.group_by else [()]
    out = []
    for g in indices:
        row = by_key.get(g) if form.group_by else (answer_rows[0] if answer_rows else None)
        measured: list[Measurement] = []
        for i, template in enumerate(made):
            m = dataclasses.replace(template)
            if row is not None and row[len(form.group_by) + i] is not None:
                m.true_value = float(row[len(form.group_by) + i])
            else:
                m.true_value = 0.0 if form.aggregates[i].kind in ("count", "sum") else None
            measured.append(m)
        out.append(measured)
    return groups, out


def release(form: AnalysisForm, result: Result, groups: Sequence[tuple[Any, ...]], noise: NoiseSource) -> None:
    """Sample each measurement's noise and compute the released rows from the noisy values only (post-processing
    keeps the guarantee, Dwork & Roth Prop. 2.1): the output expressions, HAVING, ORDER BY and LIMIT."""
    rows: list[tuple[dict[str, Any], dict[str, Any]]] = []
    for g, measured in zip(groups, result.measurements, strict=True):
        noisy = []
        for m in measured:
            if m.true_value is None:
                raise RefusedError(f"{m.aggregate} has no value for a group with no rows; not released")
            if m.mechanism == R2T:
                m.noisy_value = race(m, noise)
            else:
                kind = "laplace" if m.mechanism == GLOBAL else m.mechanism
                m.noisy_value = mechanisms.release(kind, m.true_value, m.noise_scale, noise)
            noisy.append(m.noisy_value)
        if form.having is not None and holds(form.having, noisy) is not True:
            continue  # HAVING on the noisy aggregates: NULL, like SQL, drops the group
        values: dict[str, Any] = {}
        keys: dict[str, Any] = {}
        for o in form.outputs:
            if o.is_key:
                keys[o.name] = g[o.group_key]  # type: ignore[index]
            else:
                values[o.name] = evaluate(o.expr, noisy)
        rows.append((keys, values))
    for key in reversed(form.order_by):
        out: Output = form.outputs[key.output]

        def sort_key(kv: tuple[dict[str, Any], dict[str, Any]], o: Output = out) -> tuple[int, Any]:
            return _sort_key(kv[0].get(o.name) if o.is_key else kv[1].get(o.name))

        rows.sort(key=sort_key, reverse=key.descending)
    if form.limit is not None:
        rows = rows[: form.limit]
    result.columns = [o.name for o in form.outputs]
    result.rows = [{"key": k, "values": v} if form.group_by else {"values": v} for k, v in rows]
    result.released = True


def describe(
    form: AnalysisForm, params: PrivacyParams, plans: Sequence[Plan], domains: Sequence[Any]
) -> list[dict[str, Any]]:
    """Per aggregate, what an analyst may see before anything is read: its ε and δ share and how the groups
    share it (None while the group count is read from a public table at run time)."""
    out = []
    split = shares(form, params, plans, declared_groups(domains))
    for agg, plan, share in zip(form.aggregates, plans, split, strict=True):
        parallel = not form.group_by or plan.disjoint_groups
        whole = "full share" if parallel else "full share (ℓ1 over the groups, global bound)"
        entry: dict[str, Any] = {
            "aggregate": agg.sql,
            "groups": whole if parallel or plan.data_independent else "share divided among the groups",
            "epsilon": share[0] if share else None,
            "delta": share[1] if share else None,
        }
        if isinstance(plan, UnitPlan):
            entry["unit"] = plan.describe()
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


def evaluate(e: exp.Expr, values: Sequence[float | None]) -> float | None:
    """Evaluate an output expression over (noisy) aggregate values: + − × /, GREATEST/LEAST and constants."""
    if isinstance(e, exp.Column) and e.name.startswith(AGG_PREFIX):
        return values[int(e.name[len(AGG_PREFIX) :])]
    if isinstance(e, exp.Literal) and not e.is_string:
        return float(e.this)
    if isinstance(e, exp.Paren):
        return evaluate(e.this, values)
    if isinstance(e, exp.Neg):
        v = evaluate(e.this, values)
        return None if v is None else -v
    if isinstance(e, exp.Cast):
        return evaluate(e.this, values)
    if isinstance(e, (exp.Greatest, exp.Least)):  # the clamp of a centred AVG (sqldp.normalize)
        args = [evaluate(a, values) for a in (e.this, *e.expressions)]
        if any(a is None for a in args):
            return None
        return max(args) if isinstance(e, exp.Greatest) else min(args)  # type: ignore[type-var]
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a, b = evaluate(e.this, values), evaluate(e.expression, values)
        if a is None or b is None:
            return None
        if isinstance(e, exp.Add):
            return a + b
        if isinstance(e, exp.Sub):
            return a - b
        if isinstance(e, exp.Mul):
            return a * b
        return a / b if b != 0 else None
    raise RefusedError(f"output expression {e.sql(dialect='postgres')} is not supported after aggregation")


_COMPARE: dict[type, Callable[[float, float], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
}


def holds(e: exp.Expr, values: Sequence[float | None]) -> bool | None:
    """A HAVING condition over (noisy) aggregate values, with SQL's three-valued AND/OR/NOT."""
    if isinstance(e, exp.Paren):
        return holds(e.this, values)
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Not):
        inner = holds(e.this, values)
        return None if inner is None else not inner
    if isinstance(e, (exp.And, exp.Or)):
        a, b = holds(e.this, values), holds(e.expression, values)
        if isinstance(e, exp.And):
            return False if a is False or b is False else None if a is None or b is None else True
        return True if a is True or b is True else None if a is None or b is None else False
    if type(e) in _COMPARE:
        x, y = evaluate(e.this, values), evaluate(e.expression, values)
        return None if x is None or y is None else _COMPARE[type(e)](x, y)
    if isinstance(e, exp.Between):
        x, lo, hi = (evaluate(e.args[k], values) for k in ("this", "low", "high"))
        return None if x is None or lo is None or hi is None else lo <= x <= hi
    raise RefusedError(f"HAVING condition {e.sql(dialect='postgres')} is not supported after aggregation")


def _sort_key(v: Any) -> tuple[int, Any]:
    return (1, 0) if v is None else (0, v)
