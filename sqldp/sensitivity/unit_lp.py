"""R2T's truncated answer by linear program, for join rows that belong to several units.

When a join row may belong to more than one unit — two units in one query (a line item belongs to a customer
and to a supplier, R2T's Q5), a self-join (two orders of possibly different customers), a table reached by two
foreign-key paths — removing one unit removes join rows that other units share, and the per-unit sums of
:mod:`sqldp.sensitivity.units` no longer move by at most τ. R2T (Dong, Fang, Yi, Tao and Machanavajjhala,
"R2T: Instance-optimal Truncation for Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022,
§5) truncates by the linear program

    Q(I, τ) = max Σ_j u_j   subject to   Σ_{j ∋ k} u_j ≤ τ for every unit k,   0 ≤ u_j ≤ ψ(j),

one variable per join row j (ψ(j) ≥ 0 its value: 1 for COUNT, the clamped summand for SUM) and one
constraint per unit k over the join rows it belongs to. Its sensitivity is τ (R2T §5): if I' is I without
unit k and every row referencing it, the join rows of I' are those of I that k does not own, so an optimum
for I restricted to them is feasible for I' and loses only variables in k's constraint, at most τ; and an
optimum for I' padded with zeros is feasible for I. Hence 0 ≤ Q(I, τ) − Q(I', τ) ≤ τ. Extra constraints (a
NULL unit key treated as one more unit) do not break either step.

Join rows that own the same set of units have the same column in the constraint matrix, so the engine returns
them grouped (one variable, ψ the sum): any split of the merged variable's value among them is feasible, so
the optimum is the same.

Exactness. HiGHS (through ``scipy.optimize.linprog``) solves in floating point. The value released is a
*certified* one: HiGHS's primal point is made exactly feasible (clipped to its bounds, then each variable
scaled by the smallest τ/row-sum of its constraints, with a relative margin for rounding), which gives a lower
bound q ≤ Q*, and its duals give an upper bound by weak duality (for any y ≥ 0, Q* ≤ τ·Σ_k y_k + Σ_j ψ(j)·
max(0, 1 − Σ_{k ∋ j} y_k)). The LP is solved at τ' = τ/(1 + γ); when the certified gap plus the rounding of
the ψ to binary floating point is at most γ·τ', the released q is within γ·τ' of the optimum at τ', whose
sensitivity is τ', so q moves by at most τ'(1 + γ) = τ between neighbours and the race's noise for τ covers
it. A gap above that (not seen on any test or benchmark) raises an internal error after the charge, the
proxy's fixed failure (fail closed; the refusal itself depends on the data, but nothing else leaves).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

GAMMA = 1e-6  # the LP's relative slack: solved at τ/(1 + γ), certified to within γ·τ/(1 + γ) of its optimum
MARGIN = 1e-12  # the relative slack of the feasibility repair against floating-point rounding of row sums
UNIT_ROUNDING = 2.0**-52  # the relative error of one ψ converted to binary floating point


class LPError(RuntimeError):
    """HiGHS's answer could not be certified within the slack the noise allows (module docstring)."""


def truncations(
    owners: Sequence[Sequence[Hashable]], weights: Sequence[float], thresholds: Sequence[float]
) -> tuple[list[float], float]:
    """Q(I, τ) for every τ, and the largest total of one unit (R2T's DS_Q(I), for the audit and for skipping
    every τ ≥ DS, where the LP's optimum is Σ ψ since nothing binds). ``owners[j]`` are the units join row j
    (a group of them) belongs to, ``weights[j]`` its ψ ≥ 0."""
    import numpy as np
    from scipy.sparse import csc_matrix

    index: dict[Hashable, int] = {}
    rows: list[int] = []
    cols: list[int] = []
    psi: list[float] = []
    for owned, w in zip(owners, weights, strict=True):
        if w < 0 or not math.isfinite(w):
            raise ValueError(f"R2T needs ψ ≥ 0, got {w}")
        if w == 0:
            continue  # contributes nothing at any τ
        col = len(psi)
        psi.append(float(w))
        if not owned:
            raise ValueError("every join row must belong to a unit")
        for k in dict.fromkeys(owned):  # a row owned twice by one unit is in its constraint once
            rows.append(index.setdefault(k, len(index)))
            cols.append(col)
    if not psi:
        return [0.0] * len(thresholds), 0.0
    bound = np.asarray(psi)
    a = csc_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(index), len(psi)))
    totals = a @ bound
    largest = float(totals.max())
    total = math.fsum(psi)
    out = []
    for tau in thresholds:
        scaled = tau / (1 + GAMMA)
        out.append(total if scaled >= largest else _solve(a, bound, scaled, total))
    return out, largest


def _solve(a: Any, bound: Any, tau: float, total: float) -> float:
    """The certified optimum of the LP at ``tau`` (module docstring), trying HiGHS's dual simplex, then its
    interior point method with crossover."""
    import numpy as np
    from scipy.optimize import linprog

    n = a.shape[1]
    worst = math.inf
    for method in ("highs-ds", "highs-ipm"):
        res = linprog(
            -np.ones(n),
            A_ub=a,
            b_ub=np.full(a.shape[0], tau),
            bounds=np.column_stack([np.zeros(n), bound]),
            method=method,
        )
        if res.status != 0:
            continue
        lower = _feasible_value(a, bound, np.asarray(res.x), tau)
        y = np.maximum(-np.asarray(res.ineqlin.marginals), 0.0)
        upper = tau * math.fsum(y) + math.fsum(bound * np.maximum(0.0, 1.0 - a.T @ y))
        # the rounding of the ψ to floats and the repair's margin (a point feasible at τ(1 + 4m) is worth at
        # most (1 + 4m)·Q*(τ), Q* being concave in τ with Q*(0) = 0) count against the slack too
        gap = max(upper - lower, 0.0) + (UNIT_ROUNDING + 4 * MARGIN) * total
        if gap <= GAMMA * tau:
            return lower
        worst = min(worst, gap)
    raise LPError(f"R2T's linear program at τ = {tau:g} was not solved to within {GAMMA:g}·τ (gap {worst:g})")


def _feasible_value(a: Any, bound: Any, x: Any, tau: float) -> float:
    """Σ u over a point made exactly feasible: clipped to [0, ψ], then each variable scaled by the smallest
    τ/(row sum) of its constraints (rows within τ keep factor 1), with a relative margin for rounding."""
    import numpy as np

    x = np.clip(x, 0.0, bound)
    sums = a @ x
    factor = np.where(sums * (1 + MARGIN) > tau, tau / (sums * (1 + 4 * MARGIN) + 1e-300), 1.0)
    # csc: column j's constraints are indices[indptr[j]:indptr[j + 1]], never empty (every row has an owner)
    per_var = np.minimum(np.minimum.reduceat(factor[a.indices], a.indptr[:-1]), 1.0)
    x = x * per_var
    assert bool(np.all(a @ x <= tau * (1 + MARGIN))), "repair left a constraint above τ"
    return math.fsum(x)
