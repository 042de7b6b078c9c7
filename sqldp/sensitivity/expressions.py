"""β-smooth upper bounds of expressions and of their derivative sensitivities (NR §3.3.8.3, Table 10, Fig. 41).

For an aggregated expression e over one row of the product, :func:`bound` returns ``(ub, d)``: ``ub`` a
β-smooth upper bound of |e| and, per sensitive column v, ``d[v]`` a β-smooth upper bound of |∂e/∂v| (v in
its own units). "β-smooth" is w.r.t. the database metric, in which a change δ of column v costs at least
w_v·δ (w_v = the norm of the unit vector of v, :func:`column_weight`). The rules:

* constant c: (|c|, 0); a column that is not value-sensitive: (|x|, 0) — it does not move (NR: "use the exact
  values of subexpressions" of non-sensitive data);
* sensitive column x: |x| is β-smooth where |x| ≥ 1/(β·w); max(|x|, 1/(β·w)) is a β-smooth upper bound
  (Lemma 3.67, Table 10 "x^r", r = 1, with the exponential part bounded by its end value); ∂x/∂x = 1;
* e1 ± e2: (ub1 + ub2, d1 + d2) (Fig. 41 (+_S), (+_D); Lemma 3.70.1);
* e1 · e2: (ub1·ub2, ub1·d2 + ub2·d1) (Lemma 3.70.2, Fig. 41 (*_S), product rule). A product of β1- and
  β2-smooth bounds is (β1 + β2)-smooth, so in general β is split between the factors by their number of
  sensitive occurrences. When the factors read *separated* column sets S1, S2 — the metric satisfies
  d(x, x′) ≥ d_S1(x, x′) + d_S2(x, x′), as for columns of different tables (tables and rows combine with ℓ1)
  or different columns under an ℓ1 node of the table norm (:func:`separated`) — each factor is β-smooth
  w.r.t. its own part of the distance and the product is β-smooth with no split: e^(β·d_S1)·e^(β·d_S2)
  ≤ e^(β·d). Every bound here is smooth w.r.t. the distance restricted to the columns it reads, which is
  what makes this compose;
* e / c for a non-zero constant, −e, ABS, CAST: as e; e^k (integer k ≤ 8) as a product;
* e^r, POWER(e, r) for a constant r ≥ 1 (other than the integers above): with (u, d) the (β/r)-smooth bounds
  of e, (u^r, r·u^(r−1)·d) (Table 10 "x^r, r ≥ 1", composition with h(y) = y^r): u^r is β-smooth, u^(r−1)
  is (r−1)β/r-smooth and d is β/r-smooth, so their product is β-smooth. 0 < r < 1 is refused (the derivative
  is unbounded near 0), except as an ℓp norm;
* ℓp norms of sub-expressions, SQRT(a1^2 + … + ak^2) (p = 2; a square written a^2, POWER(a, 2) or a·a) and
  POWER(|a1|^p + … + |ak|^p, 1/p) for a constant p ≥ 1 (|a|^p: POWER(ABS(a), p), or POWER(a, p) for an even
  integer p); a constant term c ≥ 0 is the constant c^(1/p). With (u_i, d_i) the β-smooth bounds of the a_i:
  (‖(u_1, …, u_k)‖_p, per v ‖(d_1[v], …, d_k[v])‖_p) (Table 10 "‖x‖_p", Fig. 41 "Min / max", ℓp′-norm). The
  norm is non-decreasing in each |a_i| and positively homogeneous, so the first is an upper bound and
  β-smooth; |∂f/∂v| ≤ ‖∇_a f‖_q·‖(∂a_i/∂v)_i‖_p (Hölder, q the dual exponent) with ‖∇_a f‖_q = 1;
* EXP(g) (Table 10 "e^(rx), |r| ≤ β"; composition h(g) with h = exp, 1-smooth in its argument): only where
  the derivative bounds d_g[v] of g are data-independent constants c_v (g affine in the sensitive columns,
  say; non-sensitive columns may appear anywhere). Then L = Σ_v c_v/w_v is a global Lipschitz constant of g
  in the metric (a change costs at least w_v·|δ_v| for each v, so |Δg| ≤ Σ_v c_v·|δ_v| ≤ L·dist), and e^g
  is L-smooth: if L ≤ β, (e^g, e^g·c_v) exactly; if L > β no β-smooth bound exists in general and both are
  ∞ (that β is unusable; the callers skip it). A g without sensitive columns does not move: (e^g, none).
  Over the ranges (:class:`RangeOps`) e^(max |g|) for any L: a global maximum needs no smoothing;
* GREATEST/LEAST(e1, …): (max ub, max d) (NR §3.3.8.3 "Min / max").

An infinite bound (β too small for an EXP, or β ≤ 0) is the constant ∞; in SQL ``CAST('Infinity' AS DOUBLE
PRECISION)``, which absorbs every operation (∞·0 would be NaN in PostgreSQL; ∞ bounds it anyway).

Each operator's rule is its ``derivative`` entry in :mod:`sqldp.sensitivity.operators` (:func:`bound` reads
columns and numbers itself and refuses what the table does not cover); the product and EXP rules, which split
or check β, are here. The same rules evaluate either to SQL (per row, for Postgres) or to numbers over the
declared column ranges (the data-independent maximum c3 of NR §3.3.9.3), through :class:`SqlOps` and
:class:`RangeOps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Norm
from sqldp.sensitivity import operators
from sqldp.sensitivity.intervals import constant
from sqldp.sensitivity.representations import Ops
from sqldp.sqlgen import number

Sensitive = Callable[[ColumnRef], float | None]  # the column's weight w_v if value-sensitive, else None
# whether two disjoint sets of sensitive columns are separated by the metric (see the module docstring)
Separated = Callable[[frozenset[ColumnRef], frozenset[ColumnRef]], bool]


class SqlOps:
    """Per-row bounds as SQL (double precision, so the sums over joins cannot overflow numeric scales)."""

    def const(self, v: float) -> exp.Expr:
        return number(abs(v))

    def column(self, ref: ColumnRef, node: exp.Column) -> exp.Expr:
        return exp.Abs(this=exp.cast(node.copy(), "DOUBLE PRECISION"))

    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> exp.Expr:
        # Lemma 3.67 / Table 10 (x^r, r = 1): |x| where |x| ≥ 1/b, else e^(b|x| − 1)/b, with b = 1/floor;
        # written GREATEST(|x|, e^(min(b|x| − 1, 0))/b) since e^(y − 1) ≥ y
        b = 1.0 / floor
        arg = exp.Least(
            this=exp.Sub(this=exp.Mul(this=number(b), expression=self.column(ref, node)), expression=number(1)),
            expressions=[number(0)],
        )
        smooth = exp.Div(this=exp.Exp(this=arg), expression=number(b))
        return exp.Greatest(this=self.column(ref, node), expressions=[smooth])

    def add(self, a: exp.Expr, b: exp.Expr) -> exp.Expr:
        if _is_inf(a) or _is_inf(b):
            return _inf()
        if _is_zero(a):
            return b
        if _is_zero(b):
            return a
        return exp.Add(this=a, expression=b)

    def mul(self, a: exp.Expr, b: exp.Expr) -> exp.Expr:
        if _is_zero(a) or _is_zero(b):
            return number(0)
        if _is_inf(a) or _is_inf(b):  # also for a data-dependent 0, where PostgreSQL would say NaN
            return _inf()
        if _is_one(a):
            return b
        if _is_one(b):
            return a
        return exp.Mul(this=_paren(a), expression=_paren(b))

    def greatest(self, parts: list[exp.Expr]) -> exp.Expr:
        if any(_is_inf(p) for p in parts):
            return _inf()
        parts = [p for p in parts if not _is_zero(p)] or [number(0)]
        return parts[0] if len(parts) == 1 else exp.Greatest(this=parts[0], expressions=parts[1:])

    def least(self, parts: list[exp.Expr]) -> exp.Expr:
        parts = [p for p in parts if not _is_inf(p)] or [_inf()]
        return parts[0] if len(parts) == 1 else exp.Least(this=parts[0], expressions=parts[1:])

    def power(self, a: exp.Expr, r: float) -> exp.Expr:
        if _is_inf(a):
            return _inf()
        if r == 1 or _is_zero(a) or _is_one(a):
            return a
        if isinstance(a, exp.Literal):
            return number(float(a.this) ** r)
        return exp.Pow(this=a, expression=number(r))

    def norm(self, parts: list[exp.Expr], p: float) -> exp.Expr:
        if any(_is_inf(x) for x in parts):
            return _inf()
        parts = [x for x in parts if not _is_zero(x)]
        if len(parts) <= 1:  # ‖(a, 0, …)‖_p = a
            return parts[0] if parts else number(0)
        total = self.power(parts[0], p)
        for x in parts[1:]:
            total = exp.Add(this=total, expression=self.power(x, p))
        return exp.Sqrt(this=total) if p == 2 else exp.Pow(this=exp.Paren(this=total), expression=number(1 / p))

    def exponential(self, g: exp.Expr, ub: exp.Expr, smooth: bool) -> exp.Expr:
        if not smooth:
            return _inf()
        c = constant(g)
        if c is not None:
            return number(math.exp(c))
        # the exact value; g keeps its bare columns, so columns._monotone does not take e^g for a function
        # non-decreasing in |x| (it is not); where the query wrote ABS(x) it is, and is recognised as such
        return exp.Exp(this=exp.cast(g.copy(), "DOUBLE PRECISION"))


def _paren(e: exp.Expr) -> exp.Expr:
    return exp.Paren(this=e) if isinstance(e, (exp.Add, exp.Sub)) else e


def _inf() -> exp.Expr:
    return exp.cast(exp.Literal.string("Infinity"), "DOUBLE PRECISION")


def _is_inf(e: exp.Expr) -> bool:
    return (
        isinstance(e, exp.Cast)
        and isinstance(e.this, exp.Literal)
        and e.this.is_string
        and e.this.this.lower() in ("infinity", "inf")
    )


def _is_zero(e: exp.Expr) -> bool:
    return isinstance(e, exp.Literal) and not e.is_string and float(e.this) == 0


def _is_one(e: exp.Expr) -> bool:
    return isinstance(e, exp.Literal) and not e.is_string and float(e.this) == 1


class RangeOps:
    """The same bounds maximised over the policy's declared ranges (data-independent). ``smoothed``: the
    maximum of the β-smooth bounds SqlOps writes (for a sensitive |x| ≤ M, max(M, e^(min(M/floor − 1, 0))·floor),
    which exceeds M below the floor), not of the functions themselves."""

    def __init__(self, range_of: Callable[[ColumnRef], tuple[float, float] | None], smoothed: bool = False) -> None:
        self.range_of = range_of
        self.smoothed = smoothed

    def const(self, v: float) -> float:
        return abs(v)

    def column(self, ref: ColumnRef, node: exp.Column) -> float:
        r = self.range_of(ref)
        if r is None:
            raise RefusedError(
                f"combined row and value privacy (NR §3.3.9) needs a declared range for {ref} "
                "(the global bound c3 of the expression)"
            )
        return max(abs(r[0]), abs(r[1]))

    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> float:
        m = self.column(ref, node)  # a global maximum of the function needs no smoothing
        if not self.smoothed:
            return m
        # SqlOps.sensitive is non-decreasing in |x|: its maximum is at |x| = M
        return max(m, math.exp(min(m / floor - 1.0, 0.0)) * floor)

    def add(self, a: float, b: float) -> float:
        return a + b

    def mul(self, a: float, b: float) -> float:
        return 0.0 if a == 0 or b == 0 else a * b

    def greatest(self, parts: list[float]) -> float:
        return max(parts, default=0.0)

    def least(self, parts: list[float]) -> float:
        return min(parts)

    def power(self, a: float, r: float) -> float:
        return _float_power(a, r)

    def norm(self, parts: list[float], p: float) -> float:
        return _float_norm(parts, p)

    def exponential(self, g: exp.Expr, ub: float, smooth: bool) -> float:
        # e^g ≤ e^|g| ≤ e^ub over the ranges; a global maximum needs no smoothing, whatever L is
        return _float_exp(ub)


class _ConstOps:
    """A data-independent constant bounding what :class:`SqlOps` computes from above, or None where it reads
    the data: tells EXP whether the derivative bounds of its argument are constants."""

    def const(self, v: float) -> float:
        return abs(v)

    def column(self, ref: ColumnRef, node: exp.Column) -> float | None:
        return None

    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> float | None:
        return None

    def add(self, a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else a + b

    def mul(self, a: float | None, b: float | None) -> float | None:
        if a == 0 or b == 0:  # as SqlOps: a literal 0 factor makes the product 0
            return 0.0
        return None if a is None or b is None else a * b

    def greatest(self, parts: list[float | None]) -> float | None:
        return None if any(p is None for p in parts) else max([p for p in parts if p is not None], default=0.0)

    def least(self, parts: list[float | None]) -> float | None:
        known = [p for p in parts if p is not None]  # a minimum is below each of its constant parts
        return min(known) if known else None

    def power(self, a: float | None, r: float) -> float | None:
        return None if a is None else _float_power(a, r)

    def norm(self, parts: list[float | None], p: float) -> float | None:
        if any(x is None for x in parts):
            return None
        return _float_norm([x for x in parts if x is not None], p)

    def exponential(self, g: exp.Expr, ub: float | None, smooth: bool) -> float | None:
        if not smooth:
            return math.inf
        return None if ub is None else _float_exp(ub)


def _float_power(a: float, r: float) -> float:
    try:
        return a**r
    except OverflowError:
        return math.inf


def _float_norm(parts: list[float], p: float) -> float:
    if any(math.isinf(x) for x in parts):
        return math.inf
    top = max(parts, default=0.0)
    if top == 0:
        return 0.0
    return top * sum((x / top) ** p for x in parts) ** (1 / p)  # scaled: no overflow of x^p


def _float_exp(v: float) -> float:
    try:
        return math.exp(v)
    except OverflowError:
        return math.inf


def _sensitive_refs(e: exp.Expr, sensitive: Sensitive) -> list[ColumnRef]:
    refs = (ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table)
    return [r for r in refs if sensitive(r) is not None]


def bound(
    e: exp.Expr, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated | None = None
) -> tuple[Any, dict[ColumnRef, Any]]:
    """(ub, d): β-smooth upper bounds of |e| and of |∂e/∂v| per sensitive column v (module docstring).
    ``separated`` tells which products may keep the whole β in each factor; None: always split β."""
    if separated is not None:
        return _bound(e, sensitive, ops, beta, separated)
    return _bound(e, sensitive, ops, beta, lambda a, b: False)


def _bound(
    e: exp.Expr, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated
) -> tuple[Any, dict[ColumnRef, Any]]:
    if isinstance(e, exp.Paren):
        return _bound(e.this, sensitive, ops, beta, separated)
    if isinstance(e, exp.Literal) and not e.is_string:
        return ops.const(float(e.this)), {}
    if isinstance(e, exp.Column) and e.table:
        ref = ColumnRef(e.table, e.name)
        w = sensitive(ref)
        if w is None:
            return ops.column(ref, e), {}
        if beta <= 0:
            return ops.const(math.inf), {ref: ops.const(1.0)}
        return ops.sensitive(ref, e, 1.0 / (beta * w)), {ref: ops.const(1.0)}
    op = operators.lookup(e)
    if op is not None and op.derivative is not None:
        found = op.derivative.apply(_Derivation(sensitive, ops, beta, separated), e)
        if found is not None:
            return found
    raise RefusedError(
        f"cannot bound {e.sql(dialect='postgres')} under value-level privacy "
        f"(NR Table 10/Fig. 41 as implemented: columns, numbers, {operators.supported('derivative')})"
    )


@dataclass(frozen=True)
class _Derivation:
    """The context of a derivative rule (:class:`sqldp.sensitivity.operators.DerivativeContext`)."""

    sensitive: Sensitive
    ops: Ops
    beta: float
    separated: Separated

    def of(self, e: exp.Expr, beta: float | None = None) -> tuple[Any, dict[ColumnRef, Any]]:
        return _bound(e, self.sensitive, self.ops, self.beta if beta is None else beta, self.separated)

    def product(self, a: exp.Expr, b: exp.Expr) -> tuple[Any, dict[ColumnRef, Any]]:
        return _product(a, b, self.sensitive, self.ops, self.beta, self.separated)

    def exponential(self, g: exp.Expr) -> tuple[Any, dict[ColumnRef, Any]]:
        return _exponential(g, self.sensitive, self.ops, self.beta, self.separated)

    def constant(self, e: exp.Expr) -> float | None:
        return constant(e)

    def reads_sensitive(self, e: exp.Expr) -> bool:
        return bool(_sensitive_refs(e, self.sensitive))

    def refuse(self, e: exp.Expr, why: str) -> RefusedError:
        return RefusedError(f"cannot bound {e.sql(dialect='postgres')} under value-level privacy: {why}")


def _exponential(
    g: exp.Expr, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated
) -> tuple[Any, dict[ColumnRef, Any]]:
    """EXP(g), NR §3.3.8.3, Table 10 "e^(rx), |r| ≤ β" and "composition with a real function": e^g is
    L-smooth when g is L-Lipschitz in the metric, and L = Σ_v c_v/w_v for constant bounds c_v of |∂g/∂v|."""
    u, d = _bound(g, sensitive, ops, beta, separated)
    _, consts = _bound(g, sensitive, _ConstOps(), beta, separated)
    lipschitz = 0.0
    for ref, c in consts.items():
        if c is None:
            raise RefusedError(
                f"cannot bound EXP({g.sql(dialect='postgres')}) under value-level privacy: the derivative of its "
                f"argument w.r.t. {ref} is not a constant (NR Table 10 has e^(rx) for constant r only)"
            )
        w = sensitive(ref) or 0.0
        if c > 0:
            lipschitz += c / w if w > 0 else math.inf  # a change of weight 0 would cost nothing
    # a β-smooth bound exists for L ≤ β only (β ≤ 0: never, unless e^g does not move); d has the keys of consts
    ub = ops.exponential(g, u, lipschitz <= beta and (beta > 0 or lipschitz == 0))
    return ub, {ref: ops.mul(ub, ops.const(c)) for ref, c in consts.items() if ref in d}


def _product(
    a: exp.Expr, b: exp.Expr, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated
) -> tuple[Any, dict[ColumnRef, Any]]:
    # Lemma 3.70.2: a product of β1- and β2-smooth bounds is (β1 + β2)-smooth; split β by occurrences,
    # unless the factors' columns are separated by the metric (module docstring)
    ra, rb = _sensitive_refs(a, sensitive), _sensitive_refs(b, sensitive)
    na, nb = len(ra), len(rb)
    if na + nb == 0 or (na and nb and separated(frozenset(ra), frozenset(rb))):
        ba, bb = beta, beta
    else:
        ba, bb = beta * na / (na + nb), beta * nb / (na + nb)
    u1, d1 = _bound(a, sensitive, ops, ba, separated)
    u2, d2 = _bound(b, sensitive, ops, bb, separated)
    d: dict[ColumnRef, Any] = {}
    for k in sorted(set(d1) | set(d2), key=str):
        terms = []
        if k in d2:
            terms.append(ops.mul(u1, d2[k]))
        if k in d1:
            terms.append(ops.mul(u2, d1[k]))
        d[k] = terms[0] if len(terms) == 1 else ops.add(terms[0], terms[1])
    return ops.mul(u1, u2), d


# -- norms -------------------------------------------------------------------------------------------


def column_weights(norm: Norm) -> dict[str, float]:
    """w_v = ‖e_v‖ for each column's first occurrence (later repeats are dropped: the norm without them is
    smaller, and a sensitivity w.r.t. a smaller norm bounds the one w.r.t. the larger, NR §3.3.8.3)."""
    out: dict[str, float] = {}

    def walk(n: Norm, w: float) -> None:
        for t in n.terms:
            if t.column is not None:
                out.setdefault(t.column, w * abs(t.weight))
            elif t.norm is not None:
                walk(t.norm, w * abs(t.weight))

    walk(norm, 1.0)
    return out


def norm_separates(norm: Norm, first: set[str], second: set[str]) -> bool:
    """‖Δ‖ ≥ ‖Δ restricted to ``first``‖ + ‖Δ restricted to ``second``‖ for every change Δ of one row (two
    disjoint column sets; columns outside the norm are not sensitive and do not matter).

    True at an ℓ1 node when every term reads one side only or separates them itself (the node's sum splits),
    and at any node where one term holds every column of both sides and separates them (the other terms
    only add to ‖Δ‖); a column the norm repeats is counted wherever it appears."""
    if first & second:
        return False

    touching = []
    for t in norm.terms:
        if t.column is not None:
            cols: frozenset[str] = frozenset({t.column})
        else:
            assert t.norm is not None  # a term is a column or a norm
            cols = t.norm.columns
        a, b = bool(cols & first), bool(cols & second)
        if a or b:
            touching.append((t, a and b))
    if len(touching) == 1:
        t, mixed = touching[0]
        return not mixed or (t.norm is not None and norm_separates(t.norm, first, second))
    if norm.p != 1:
        return False
    return all(not mixed or (t.norm is not None and norm_separates(t.norm, first, second)) for t, mixed in touching)


def dual(norm: Norm, parts: dict[str, Any], ops_kind: str = "sql") -> Any:
    """‖∇‖ in the dual of the row norm from per-column bounds (Lemmas 3.64–3.66): a term w·N contributes its
    dual value divided by w, and ℓp combines with ℓq, q = p/(p − 1). Columns already used drop out."""
    seen: set[str] = set()

    def rec(n: Norm) -> Any:
        vals = []
        for t in n.terms:
            if t.column is not None:
                if t.column in seen or t.column not in parts:
                    seen.add(t.column)
                    continue
                seen.add(t.column)
                v = parts[t.column]
            elif t.norm is not None:
                v = rec(t.norm)
                if v is None:
                    continue
            else:  # pragma: no cover - a term is a column or a norm
                continue
            vals.append(_scale(v, 1.0 / abs(t.weight), ops_kind))
        if not vals:
            return None
        return _combine(vals, n.p, ops_kind)

    return rec(norm)


def _scale(v: Any, c: float, kind: str) -> Any:
    if kind == "float":
        return v * c
    return v if c == 1 else exp.Mul(this=_paren(v), expression=number(c))


def _combine(vals: list[Any], p: float, kind: str) -> Any:
    q = 1.0 if math.isinf(p) else (math.inf if p == 1 else p / (p - 1))
    if kind == "float":
        if math.isinf(q):
            return max(vals)
        return sum(v**q for v in vals) ** (1 / q)
    if len(vals) == 1:
        return vals[0]
    if math.isinf(q):
        return exp.Greatest(this=vals[0], expressions=vals[1:])
    if q == 1:
        out = vals[0]
        for v in vals[1:]:
            out = exp.Add(this=out, expression=v)
        return exp.Paren(this=out)
    total: exp.Expr | None = None
    for v in vals:
        term = exp.Pow(this=_paren(v), expression=number(q))
        total = term if total is None else exp.Add(this=total, expression=term)
    return exp.Pow(this=exp.Paren(this=total), expression=number(1 / q))
