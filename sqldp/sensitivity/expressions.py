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
* GREATEST/LEAST(e1, …): (max ub, max d) (NR §3.3.8.3 "Min / max").

The same rules evaluate either to SQL (per row, for Postgres) or to numbers over the declared column
ranges (the data-independent maximum c3 of NR §3.3.9.3), through :class:`SqlOps` and :class:`RangeOps`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Norm

Sensitive = Callable[[ColumnRef], float | None]  # the column's weight w_v if value-sensitive, else None
# whether two disjoint sets of sensitive columns are separated by the metric (see the module docstring)
Separated = Callable[[frozenset[ColumnRef], frozenset[ColumnRef]], bool]


class Ops(Protocol):
    def const(self, v: float) -> Any: ...
    def column(self, ref: ColumnRef, node: exp.Column) -> Any: ...
    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def greatest(self, parts: list[Any]) -> Any: ...
    def least(self, parts: list[Any]) -> Any: ...


def _num(v: float) -> exp.Expression:
    if float(v).is_integer() and abs(v) < 1e15:
        return exp.Literal.number(str(int(v))) if v >= 0 else exp.Neg(this=exp.Literal.number(str(-int(v))))
    return exp.Literal.number(repr(float(v))) if v >= 0 else exp.Neg(this=exp.Literal.number(repr(-float(v))))


class SqlOps:
    """Per-row bounds as SQL (double precision, so the sums over joins cannot overflow numeric scales)."""

    def const(self, v: float) -> exp.Expression:
        return _num(abs(v))

    def column(self, ref: ColumnRef, node: exp.Column) -> exp.Expression:
        return exp.Abs(this=exp.cast(node.copy(), "DOUBLE PRECISION"))

    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> exp.Expression:
        # Lemma 3.67 / Table 10 (x^r, r = 1): |x| where |x| ≥ 1/b, else e^(b|x| − 1)/b, with b = 1/floor;
        # written GREATEST(|x|, e^(min(b|x| − 1, 0))/b) since e^(y − 1) ≥ y
        b = 1.0 / floor
        arg = exp.Least(
            this=exp.Sub(this=exp.Mul(this=_num(b), expression=self.column(ref, node)), expression=_num(1)),
            expressions=[_num(0)],
        )
        smooth = exp.Div(this=exp.Exp(this=arg), expression=_num(b))
        return exp.Greatest(this=self.column(ref, node), expressions=[smooth])

    def add(self, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        if _is_zero(a):
            return b
        if _is_zero(b):
            return a
        return exp.Add(this=a, expression=b)

    def mul(self, a: exp.Expression, b: exp.Expression) -> exp.Expression:
        if _is_zero(a) or _is_zero(b):
            return _num(0)
        if _is_one(a):
            return b
        if _is_one(b):
            return a
        return exp.Mul(this=_paren(a), expression=_paren(b))

    def greatest(self, parts: list[exp.Expression]) -> exp.Expression:
        parts = [p for p in parts if not _is_zero(p)] or [_num(0)]
        return parts[0] if len(parts) == 1 else exp.Greatest(this=parts[0], expressions=parts[1:])

    def least(self, parts: list[exp.Expression]) -> exp.Expression:
        return parts[0] if len(parts) == 1 else exp.Least(this=parts[0], expressions=parts[1:])


def _paren(e: exp.Expression) -> exp.Expression:
    return exp.Paren(this=e) if isinstance(e, (exp.Add, exp.Sub)) else e


def _is_zero(e: exp.Expression) -> bool:
    return isinstance(e, exp.Literal) and not e.is_string and float(e.this) == 0


def _is_one(e: exp.Expression) -> bool:
    return isinstance(e, exp.Literal) and not e.is_string and float(e.this) == 1


class RangeOps:
    """The same bounds maximised over the policy's declared ranges (data-independent)."""

    def __init__(self, range_of: Callable[[ColumnRef], tuple[float, float] | None]) -> None:
        self.range_of = range_of

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
        return self.column(ref, node)  # a global maximum needs no smoothing

    def add(self, a: float, b: float) -> float:
        return a + b

    def mul(self, a: float, b: float) -> float:
        return 0.0 if a == 0 or b == 0 else a * b

    def greatest(self, parts: list[float]) -> float:
        return max(parts, default=0.0)

    def least(self, parts: list[float]) -> float:
        return min(parts)


def _sensitive_refs(e: exp.Expression, sensitive: Sensitive) -> list[ColumnRef]:
    refs = (ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table)
    return [r for r in refs if sensitive(r) is not None]


def bound(
    e: exp.Expression, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated | None = None
) -> tuple[Any, dict[ColumnRef, Any]]:
    """(ub, d): β-smooth upper bounds of |e| and of |∂e/∂v| per sensitive column v (module docstring).
    ``separated`` tells which products may keep the whole β in each factor; None: always split β."""
    if separated is not None:
        return _bound(e, sensitive, ops, beta, separated)
    return _bound(e, sensitive, ops, beta, lambda a, b: False)


def _bound(
    e: exp.Expression, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated
) -> tuple[Any, dict[ColumnRef, Any]]:
    if isinstance(e, (exp.Paren, exp.Cast, exp.Abs, exp.Neg)):
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
    if isinstance(e, (exp.Add, exp.Sub)):
        u1, d1 = _bound(e.this, sensitive, ops, beta, separated)
        u2, d2 = _bound(e.expression, sensitive, ops, beta, separated)
        d = dict(d1)
        for k, v in d2.items():
            d[k] = ops.add(d[k], v) if k in d else v
        return ops.add(u1, u2), d
    if isinstance(e, exp.Mul):
        return _product(e.this, e.expression, sensitive, ops, beta, separated)
    if isinstance(e, exp.Div):
        den = e.expression
        while isinstance(den, (exp.Paren, exp.Cast)):
            den = den.this
        if isinstance(den, exp.Literal) and not den.is_string and float(den.this) != 0:
            inv = ops.const(1.0 / abs(float(den.this)))
            u, d = _bound(e.this, sensitive, ops, beta, separated)
            return ops.mul(u, inv), {k: ops.mul(v, inv) for k, v in d.items()}
    if isinstance(e, exp.Pow):
        k = e.expression
        if isinstance(k, exp.Literal) and not k.is_string and float(k.this).is_integer() and 1 <= float(k.this) <= 8:
            n = int(float(k.this))
            if n == 1:
                return _bound(e.this, sensitive, ops, beta, separated)
            rest = exp.Pow(this=e.this.copy(), expression=exp.Literal.number(n - 1))
            return _product(e.this, rest, sensitive, ops, beta, separated)
    clamp = _clamp(e)
    if clamp is not None:
        # |clamp(x, lo, hi)| ≤ min(max(|x|, |lo|), max(|lo|, |hi|)); a min of β-smooth bounds is β-smooth
        x, lo, hi = clamp
        u, d = _bound(x, sensitive, ops, beta, separated)
        return ops.least([ops.greatest([u, ops.const(lo)]), ops.const(max(abs(lo), abs(hi)))]), d
    if isinstance(e, (exp.Greatest, exp.Least)):
        parts = [_bound(x, sensitive, ops, beta, separated) for x in [e.this, *e.expressions]]
        keys = {k for _, d in parts for k in d}
        return ops.greatest([u for u, _ in parts]), {
            k: ops.greatest([d[k] for _, d in parts if k in d]) for k in sorted(keys, key=str)
        }
    raise RefusedError(
        f"cannot bound {e.sql(dialect='postgres')} under value-level privacy "
        "(NR Table 10/Fig. 41 as implemented: columns, numbers, + − ×, / by a constant, integer powers, "
        "ABS, GREATEST, LEAST)"
    )


def _literal(e: exp.Expression) -> float | None:
    if isinstance(e, exp.Literal) and not e.is_string:
        return float(e.this)
    if isinstance(e, exp.Neg):
        v = _literal(e.this)
        return None if v is None else -v
    return None


def _clamp(e: exp.Expression) -> tuple[exp.Expression, float, float] | None:
    """LEAST(GREATEST(x, lo), hi) as written by :func:`sqldp.sensitivity.intervals.clamp_columns`."""
    if isinstance(e, exp.Least) and len(e.expressions) == 1 and isinstance(e.this, exp.Greatest):
        inner = e.this
        hi = _literal(e.expressions[0])
        lo = _literal(inner.expressions[0]) if len(inner.expressions) == 1 else None
        if hi is not None and lo is not None:
            return inner.this, lo, hi
    return None


def _product(
    a: exp.Expression, b: exp.Expression, sensitive: Sensitive, ops: Ops, beta: float, separated: Separated
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
        cols = {t.column} if t.column is not None else t.norm.columns
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
    return v if c == 1 else exp.Mul(this=_paren(v), expression=_num(c))


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
    total = None
    for v in vals:
        term = exp.Pow(this=_paren(v), expression=_num(q))
        total = term if total is None else exp.Add(this=total, expression=term)
    return exp.Pow(this=exp.Paren(this=total), expression=_num(1 / q))
