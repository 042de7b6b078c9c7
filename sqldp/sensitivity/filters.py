"""Continuous approximations of private filters (NR §3.3.8.4, Table 9; §3.3.8.5 "integer" step functions).

A private conjunct (one that reads a value-sensitive column) cannot be applied in SQL as a hard filter: the
query must be a continuous function of the sensitive values. Each comparison ``lhs OP rhs`` is rewritten as
``d = lhs − rhs`` with ``d`` linear in the columns and replaced by a function with values in [0, 1]:

* exact steps when ``d`` lives on a grid of width g (integer and DATE columns: g = 1 day; DECIMAL(p, s):
  g = 10^−s; NR §3.3.8.5: "if the filtered values are integers … min(1, max(0, x − y))", and for reals with
  a bounded precision d(x, x′) ≥ 1/k, "the sensitivity … will be k times larger"). On the grid these equal
  the indicator exactly, so the released answer is the plain query's (q_m = q_i). Slope: 1/g per unit of d.
  Used when that slope is not above the sigmoid's (g ≥ 4/α for <, >; g ≥ 2/α for =): finer grids would make
  the noise larger than the sigmoid's, as §3.3.8.5 warns;
* sigmoid ``1/(1 + e^(−α·d))`` for ``d ≥ 0`` and tauoid ``2/(e^(αd) + e^(−αd))`` for ``d = 0`` otherwise
  (Table 9), slopes α/4 and α/2 (the maxima of |σ′| and |τ′|: constants, hence β-smooth for every β).

AND is ``min``, OR is ``max`` and NOT is ``1 − ·``: exact on {0, 1}, and the derivative of a min/max is the
derivative of one argument, so its bound per column is the maximum of the arguments' bounds (NR §3.3.8.3,
"Min / max"). Atoms that read no sensitive column are evaluated exactly (derivative 0). Only linear
comparisons are supported: their derivative bounds are constants, which keeps every bound smooth.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import cast

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import EPOCH
from sqldp.sensitivity import operators
from sqldp.sensitivity.representations import Linear
from sqldp.sqlgen import number

SIGMOID_ALPHA = 5.0  # NR §4.3.3.1: sigmoid precision α = 5 (Table 17)
# A ramp is at most this fraction of the compared term's declared range wide (see ramp_width)
RAMP_SHARE_OF_RANGE = 1.0 / 50.0

# For a column: (kind, grain or None, days per unit if DATE else 1.0, sensitive)
ColumnInfo = Callable[[ColumnRef], tuple[str, float | None, float, bool]]
# For a column: the width of its declared range (days for a DATE), None when it has none
ColumnSpan = Callable[[ColumnRef], float | None]


def ramp_width(lin: Linear, grid: float, cap: float, span: ColumnSpan | None) -> float:
    """The width W of the ramp that replaces a comparison of ``lin`` on a grid g (NR §3.3.8.5 generalised):
    W = max(g, min(cap, R/50)), with cap the width of NR's sigmoid (4/α for <, >; 2/α for =: the same
    slope) and R the width of the term's declared range (Σ |c_v|·range width of v; ∞ without ranges).

    Why: the noise grows with the slope 1/W (per unit of the norm: 1/(W·weight)), the bias with the rows
    whose term lies within W of the constant. NR's α = 5 counts in the column's own unit, which makes the
    sigmoid wider than the whole range of a column such as l_discount ∈ [0, 0.10] (TPC-H Q6 released every
    discount at weight ≈ 0.5: 62 % off the plain answer at every scale, bias that no ε removes). A ramp no
    wider than 2 % of the range keeps its rows near the threshold; where that is under the grid the exact
    step (W = g) is used, whose answer is the plain query's. Otherwise NR's width (W = cap, slope α/4), but
    as a ramp anchored at the constant: 0 or 1 exactly beyond W, and exact on every lattice of step ≥ W that
    holds the constant (integer quantities in a DECIMAL column: l_quantity < 24). W depends on the query,
    the catalog's type and the policy's ranges only: never on the data, so choosing it leaks nothing."""
    if span is None:
        reach = math.inf
    else:
        reach = 0.0
        for ref, c in lin.coefs.items():
            width = span(ref)
            reach += math.inf if width is None else abs(c) * width
    return max(grid, min(cap, reach * RAMP_SHARE_OF_RANGE))


@dataclass(frozen=True)
class Filter:
    """A [0, 1]-valued SQL expression approximating a condition, with per-column slope bounds."""

    sql: exp.Expr
    slopes: dict[ColumnRef, float]  # bound on |∂ filter / ∂ column| (column in its norm unit)
    exact: bool  # equals the condition's indicator on every database of the column types
    # per column x: a closed interval [lo, hi] (x in its linear unit: days for a DATE) outside which the
    # filter is 0 on a neighbourhood, so it and all its partial derivatives vanish there
    support: dict[ColumnRef, tuple[float, float]] = field(default_factory=dict)


def _interval_days(node: exp.Interval) -> float:
    text = node.this.name if isinstance(node.this, exp.Literal) else node.this.sql()
    unit = node.args.get("unit")
    parts = text.split()
    unit_name = (unit.name if unit is not None else (parts[1] if len(parts) > 1 else "")).upper()
    if unit_name not in ("DAY", "DAYS"):
        raise RefusedError(
            f"interval {node.sql(dialect='postgres')}: only day intervals are supported in private filters"
        )
    try:
        days = float(parts[0]) if parts else math.nan
    except ValueError:
        days = math.nan
    # a date moves by at most ±2^31 days in PostgreSQL; anything else is not a constant number of days
    if not (math.isfinite(days) and abs(days) <= 2**31):
        raise RefusedError(f"interval {node.sql(dialect='postgres')} is not a constant number of days")
    return days


def linear(e: exp.Expr, info: ColumnInfo) -> Linear:
    """The linear form of a comparison operand; refuse anything else (NR §3.3.8.4 needs continuity). Leaves
    here, operators by their ``linear`` rule (:mod:`sqldp.sensitivity.operators`)."""
    if isinstance(e, exp.Paren):
        return linear(e.this, info)
    if (
        isinstance(e, exp.Cast)
        and e.to.this == exp.DataType.Type.DATE
        and isinstance(e.this, exp.Literal)
        and e.this.is_string
    ):
        try:
            days = (dt.date.fromisoformat(e.this.name.strip()) - EPOCH).days
        except ValueError:  # 'infinity', 'epoch', 'today', other spellings PostgreSQL reads
            raise RefusedError(
                f"date {e.this.name!r} in a private filter: write a calendar date as 'YYYY-MM-DD'"
            ) from None
        return Linear({}, float(days))
    if isinstance(e, exp.Literal) and not e.is_string:
        value = float(e.this)
        if not math.isfinite(value):  # 1e309: a NUMERIC in PostgreSQL, infinity in the filter's arithmetic
            raise RefusedError(f"the number {e.this} in a private filter is beyond double precision (±1.8e308)")
        return Linear({}, value)
    if isinstance(e, exp.Interval):
        return Linear({}, _interval_days(e))
    if isinstance(e, exp.Column) and e.table:
        ref = ColumnRef(e.table, e.name)
        kind, grain, _, _ = info(ref)
        if kind not in ("integer", "numeric", "date"):
            raise RefusedError(f"{ref} is not a number or a date; it cannot be compared continuously")
        g = None if grain is None else Fraction(grain).limit_denominator(10**9)
        return Linear({ref: 1.0}, 0.0, g)
    op = operators.lookup(e)
    found = None if op is None or op.linear is None else op.linear.apply(lambda x: linear(x, info), e)
    if found is not None:
        return found
    raise RefusedError(
        f"private filter term {e.sql(dialect='postgres')} is not linear in the columns "
        f"(NR §3.3.8.4: supported are columns, numbers, dates, day intervals, {operators.supported('linear')})"
    )


def column_sql(ref: ColumnRef, info: ColumnInfo) -> exp.Expr:
    col = exp.column(ref.column, table=ref.alias)
    if info(ref)[0] == "date":
        # dates count in days (policy unit conversions are applied to the slopes)
        return exp.Paren(this=exp.Sub(this=col, expression=exp.cast(exp.Literal.string(EPOCH.isoformat()), "DATE")))
    return col


def _linear_sql(lin: Linear, info: ColumnInfo, const: float, *, double: bool = False) -> exp.Expr:
    """``double``: in DOUBLE PRECISION, for the sigmoids: exp() of a NUMERIC runs PostgreSQL's
    arbitrary-precision exponential, ≈ 6× slower per row on TPC-H Q6 than the float one, and NUMERIC
    arithmetic before the cast cost Q6 a quarter of its answer query at SF 1, so each column is cast first."""
    out: exp.Expr | None = None
    for ref, c in sorted(lin.coefs.items(), key=lambda kv: str(kv[0])):
        term = column_sql(ref, info)
        if double:
            term = exp.cast(term, "DOUBLE PRECISION")
        if c != 1:
            term = exp.Mul(this=number(c), expression=term)
        out = term if out is None else exp.Add(this=out, expression=term)
    if const != 0 or out is None:
        out = number(const) if out is None else exp.Add(this=out, expression=number(const))
    if double and not lin.coefs:
        return exp.cast(exp.Paren(this=out), "DOUBLE PRECISION")
    return exp.Paren(this=out)


def _clamp01(e: exp.Expr) -> exp.Expr:
    return exp.Least(this=number(1), expressions=[exp.Greatest(this=number(0), expressions=[e])])


def _slopes(lin: Linear, info: ColumnInfo, per_unit: float) -> dict[ColumnRef, float]:
    out = {}
    for ref, c in lin.coefs.items():
        _, _, days_per_unit, sensitive = info(ref)
        if sensitive:
            out[ref] = abs(c) * days_per_unit * per_unit
    return out


def _on_grid(x: float, g: Fraction) -> tuple[float, bool]:
    """x/g rounded when it is within float noise of an integer, and whether it is one."""
    k = x / float(g)
    if not math.isfinite(k):  # a constant near 1e308 over a fine grid: no grid step holds it
        raise RefusedError(f"the constant {x:g} of a private filter is too large for its column's grid")
    r = round(k)
    if abs(k - r) <= 1e-9 * max(1.0, abs(k)):
        return float(r), True
    return k, False


def compare(
    op: type[exp.Expr], lhs: exp.Expr, rhs: exp.Expr, info: ColumnInfo, span: ColumnSpan | None = None
) -> Filter:
    """``lhs OP rhs`` as a ramp on a grid — the exact step when its width is the grid's — or, without a grid,
    a sigmoid/tauoid (NR Table 9, §3.3.8.5). The ramp's width: :func:`ramp_width`."""
    d = linear(lhs, info).add(linear(rhs, info).scale(-1.0))
    if op in (exp.LT, exp.LTE):  # d < 0 ⇔ −d > 0
        d = d.scale(-1.0)
        op = exp.GT if op is exp.LT else exp.GTE
    if not d.coefs:
        raise RefusedError("a private filter compares constants only")
    if not (math.isfinite(d.const) and all(math.isfinite(c) for c in d.coefs.values())):
        # finite parts whose sum or product overflows (1e308 + 1e308): the ramp's arithmetic would be infinite
        raise RefusedError("a private filter's constants are beyond double precision (±1.8e308)")
    g = d.grid
    if g is not None and g > 0:
        cap = 4.0 / SIGMOID_ALPHA if op in (exp.GT, exp.GTE) else 2.0 / SIGMOID_ALPHA
        width = ramp_width(d, float(g), cap, span)
        # a ramp of the grid's width equals the indicator on every database of the types (the exact step of
        # NR §3.3.8.5, q_m = q_i); a wider one is 0 or 1 except within W of the constant, slope 1/W per unit
        exact = width <= float(g) * (1 + 1e-12)
        w = float(g) if exact else width
        var = Linear(d.coefs, 0.0, g)
        slopes = _slopes(var, info, 1.0 / w)
        if op in (exp.GT, exp.GTE):
            k, integral = _on_grid(-d.const, g)
            # smallest grid value L_min of the column part L with L + C OP 0
            steps = (k + 1 if integral else math.ceil(k)) if op is exp.GT else (k if integral else math.ceil(k))
            lmin = steps * float(g)
            # the ramp rises over [zero, zero + W] (0 below, 1 above): for L > c with c on the grid and W wider
            # than the grid, from c (0 at c, as the indicator); otherwise up to L_min (1 at L_min, as the
            # indicator) — for the exact step both, zero = L_min − g
            if op is exp.GT and integral and not exact:
                zero = k * float(g)
                ramp: exp.Expr = exp.Div(this=_linear_sql(var, info, -zero, double=True), expression=number(w))
            else:  # (L − L_min)/W + 1, exactly 1 at L_min (and, in NUMERIC, 0 at L_min − g for the step)
                zero = lmin - w
                ramp = exp.Add(
                    this=exp.Div(this=_linear_sql(var, info, -lmin, double=not exact), expression=number(w)),
                    expression=number(1),
                )
            sql = _clamp01(ramp)
            # 0 where L ≤ zero, on an open set where L < zero (windows use exact steps' supports only)
            return Filter(sql, slopes, exact, _support(var, zero, math.inf) if exact else {})
        _, integral = _on_grid(-d.const, g)
        if not integral:  # L + C = 0 never holds on the grid
            const = exp.Literal.number(0 if op is exp.EQ else 1)
            return Filter(const, {}, True)
        dist = exp.Least(
            this=number(1),
            expressions=[
                exp.Div(this=exp.Abs(this=_linear_sql(var, info, d.const, double=not exact)), expression=number(w))
            ],
        )
        if op is exp.EQ:  # 1 − min(1, |L + C|/W): 0 where |L + C| ≥ W
            return Filter(
                exp.Sub(this=number(1), expression=dist),
                slopes,
                exact,
                _support(var, -d.const - w, -d.const + w) if exact else {},
            )
        return Filter(dist, slopes, exact)
    # written with tanh and cosh, which PostgreSQL evaluates without overflow errors (cosh returns infinity):
    # exp() needs its argument clipped to ±700, and those LEAST/GREATEST cost ≈ 0.2 s per sigmoid
    # on the 1.1 million rows of TPC-H SF 1's Q6 window (the formulas are the same functions)
    a = SIGMOID_ALPHA
    arg = _linear_sql(d, info, d.const, double=True)
    if op in (exp.GT, exp.GTE):  # 1/(1 + e^(−α·d)) = (1 + tanh(α·d/2))/2
        half = exp.Mul(this=number(0.5), expression=exp.Tanh(this=exp.Mul(this=number(a / 2), expression=arg)))
        return Filter(exp.Paren(this=exp.Add(this=number(0.5), expression=half)), _slopes(d, info, a / 4), False)
    # 2/(e^(αd) + e^(−αd)) = 1/cosh(αd)
    tau = exp.Div(this=number(1), expression=exp.Cosh(this=exp.Mul(this=number(a), expression=arg)))
    sql = tau if op is exp.EQ else exp.Sub(this=number(1), expression=tau)
    return Filter(sql, _slopes(d, info, a / 2), False)


def _support(var: Linear, lo: float, hi: float) -> dict[ColumnRef, tuple[float, float]]:
    """The interval of x where c·x ∈ [lo, hi], for a term c·x of one column (none for several columns)."""
    if len(var.coefs) != 1:
        return {}
    ((ref, c),) = var.coefs.items()
    a, b = lo / c, hi / c
    return {ref: (min(a, b), max(a, b))}


def _combine(kind: str, parts: list[Filter]) -> Filter:
    slopes: dict[ColumnRef, float] = {}
    for p in parts:
        for k, v in p.slopes.items():
            slopes[k] = max(slopes.get(k, 0.0), v)
    cls = exp.Least if kind == "and" else exp.Greatest
    sql = parts[0].sql if len(parts) == 1 else cls(this=parts[0].sql, expressions=[p.sql for p in parts[1:]])
    return Filter(sql, slopes, all(p.exact for p in parts), combine_supports(kind, [p.support for p in parts]))


def combine_supports(
    kind: str, supports: list[dict[ColumnRef, tuple[float, float]]]
) -> dict[ColumnRef, tuple[float, float]]:
    """min (AND, and a product of [0, 1] filters) vanishes on a neighbourhood wherever one argument does: the
    intersection of the supports; max (OR) only where all do: the hull, for columns every argument bounds."""
    out: dict[ColumnRef, tuple[float, float]] = {}
    if kind == "and":
        for sup in supports:
            for ref, (lo, hi) in sup.items():
                plo, phi = out.get(ref, (-math.inf, math.inf))
                out[ref] = (max(lo, plo), min(hi, phi))
        return out
    for ref in set.intersection(*(set(s) for s in supports)) if supports else ():
        out[ref] = (min(s[ref][0] for s in supports), max(s[ref][1] for s in supports))
    return out


def envelope(cond: exp.Expr, info: ColumnInfo) -> exp.Expr | None:
    """A public condition that every row with a non-zero approximation satisfies, whatever the sensitive
    values (None: no such condition is known). The approximation of a public atom is its exact indicator, AND
    is min and OR is max, so where the envelope is false the approximation is 0 identically and the row
    contributes neither to the answer nor to any derivative (NR §3.3.8.4): filtering it out in SQL changes
    neither, and a scan then reads what the plain query reads (TPC-H Q19: the brands and containers of each
    branch, beside the private quantity ranges)."""
    if not any(c.table and info(ColumnRef(c.table, c.name))[3] for c in cond.find_all(exp.Column)):
        return cond
    if isinstance(cond, exp.Paren):
        return envelope(cond.this, info)
    if isinstance(cond, (exp.And, exp.Or)):
        parts = [envelope(cond.this, info), envelope(cond.expression, info)]
        if isinstance(cond, exp.And):
            known = [p for p in parts if p is not None]
            return cast(exp.Expr, exp.and_(*(p.copy() for p in known))) if known else None
        if any(p is None for p in parts):
            return None
        return cast(exp.Expr, exp.or_(*(p.copy() for p in parts if p is not None)))  # an Or node
    return None  # a private atom, or NOT (1 − s is 1 where s is 0): true for every row


def approximate(cond: exp.Expr, info: ColumnInfo, span: ColumnSpan | None = None) -> Filter:
    """The continuous approximation of a boolean condition (NR §3.3.8.4); ``span``: the declared range widths
    that bound the ramps' widths (:func:`ramp_width`; None: no column has a declared range)."""
    reads_sensitive = any(c.table and info(ColumnRef(c.table, c.name))[3] for c in cond.find_all(exp.Column))
    if not reads_sensitive:
        case = exp.Case(ifs=[exp.If(this=cond.copy(), true=exp.Literal.number(1))], default=exp.Literal.number(0))
        return Filter(case, {}, True)
    if isinstance(cond, exp.Paren):
        return approximate(cond.this, info, span)
    if isinstance(cond, exp.And):
        return _combine("and", [approximate(cond.this, info, span), approximate(cond.expression, info, span)])
    if isinstance(cond, exp.Or):
        return _combine("or", [approximate(cond.this, info, span), approximate(cond.expression, info, span)])
    if isinstance(cond, exp.Not):
        inner = approximate(cond.this, info, span)
        return Filter(exp.Sub(this=number(1), expression=exp.Paren(this=inner.sql)), inner.slopes, inner.exact)
    if isinstance(cond, (exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ)):
        return compare(type(cond), cond.this, cond.expression, info, span)
    if isinstance(cond, exp.Between):
        lo = compare(exp.GTE, cond.this, cond.args["low"], info, span)
        hi = compare(exp.LTE, cond.this, cond.args["high"], info, span)
        return _combine("and", [lo, hi])
    if isinstance(cond, exp.In) and cond.expressions and not cond.args.get("query"):
        return _combine("or", [compare(exp.EQ, cond.this, v, info, span) for v in cond.expressions])
    raise RefusedError(
        f"private filter {cond.sql(dialect='postgres')} has no continuous approximation "
        "(NR §3.3.8.4: comparisons <, ≤, >, ≥, =, <>, BETWEEN and IN of linear terms, combined by AND/OR/NOT)"
    )
