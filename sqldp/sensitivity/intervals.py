"""Value bounds of aggregated expressions by interval arithmetic over the policy's column ranges.

Under row-level privacy, adding or removing one joined tuple moves SUM(e) by at most max |e|, so the
derivative of SUM is bounded by max |e| times the derivative of COUNT (NR §3.3.7.3 treats COUNT; the report
assumed a constant bound for SUM, sqldp derives it from the declared ranges, NR §3.3.11 "ranges"). The
answer itself is computed over e with every column clamped to its declared range, so the bound holds for
any data, including rows that break the declaration (fail closed).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.pg_arithmetic import KindOf, case_values, reads_column, rounds, truncates
from sqldp.policy import Policy

Interval = tuple[float, float]
RangeOf = Callable[[ColumnRef], Interval | None]


@dataclass(frozen=True)
class Domain:
    """What the analyses know of a column's values without reading them: the declared range (an integer
    column's rounded inwards to integers, so that clamping keeps its type) and the catalog's kind."""

    range: RangeOf
    kind: KindOf
    # the catalog's SQL type ("INTEGER", "NUMERIC(15,2)", …): which values the data can hold whatever the
    # policy declares (failures.py); None: read from the kind, as widely as it allows
    type: Callable[[ColumnRef], str] | None = None


def domain(form: AnalysisForm, catalog: Catalog, policy: Policy) -> Domain:
    """The policy's ranges and the catalog's kinds of the columns, found through the alias the query reads
    them by."""

    def kind(ref: ColumnRef) -> str:
        return catalog.table(form.use(ref.alias).table).column(ref.column).kind

    def declared(ref: ColumnRef) -> Interval | None:
        r = policy.table(form.use(ref.alias).table).column(ref.column).range
        if r is None or kind(ref) != "integer":
            return r
        lo, hi = math.ceil(r[0]), math.floor(r[1])
        if lo > hi:
            raise RefusedError(f"the declared range {list(r)} of integer column {ref} holds no integer")
        return float(lo), float(hi)

    def type_sql(ref: ColumnRef) -> str:
        return catalog.table(form.use(ref.alias).table).column(ref.column).type_sql

    return Domain(declared, kind, type_sql)


def _mul(a: Interval, b: Interval) -> Interval:
    products = [x * y for x in a for y in b if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)]
    return min(products, default=0.0), max(products, default=0.0)


def _real(f: Callable[[float], float], x: float) -> float:
    try:
        return f(x)
    except OverflowError:
        return math.inf


def _ipow(x: float, n: int) -> float:
    try:
        return x**n
    except OverflowError:
        return math.copysign(math.inf, x) if n % 2 else math.inf


def _abs(a: Interval) -> Interval:
    top = max(abs(a[0]), abs(a[1]))
    return (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))), top


def _power(a: Interval, r: float, e: exp.Expression, purpose: str) -> Interval:
    """a^r as PostgreSQL's POWER computes it (in double precision; an error for a negative base with a
    fractional exponent, or 0 with a negative one)."""
    lo, hi = a
    if r.is_integer():
        n = int(r)
        if n < 0:
            if lo <= 0 <= hi:
                raise RefusedError(
                    f"cannot bound {e.sql(dialect='postgres')} for {purpose}: the base's range {list(a)} contains 0"
                )
            return _power((1.0 / hi, 1.0 / lo), float(-n), e, purpose)
        if n % 2 == 0:  # x^n is decreasing below 0 and increasing above
            small, big = _abs(a)
            return _ipow(small, n), _ipow(big, n)
        return _ipow(lo, n), _ipow(hi, n)
    if lo < 0 or (r < 0 and lo == 0):
        raise RefusedError(
            f"cannot bound {e.sql(dialect='postgres')} for {purpose}: a fractional power of a base whose range "
            f"{list(a)} reaches {'below 0' if lo < 0 else '0'} fails in PostgreSQL"
        )
    ends = (_real(lambda x: x**r, lo), _real(lambda x: x**r, hi))
    return min(ends), max(ends)


MAX_EXP = 709.0  # e^709.78 is the largest double; PostgreSQL's exp() fails above it

ROW_LEVEL_SUM = "SUM under row-level privacy"


def interval(e: exp.Expression, dom: Domain, purpose: str = ROW_LEVEL_SUM) -> Interval:
    """[lo, hi] ⊇ the values of ``e`` when every column lies in its declared range, by PostgreSQL's arithmetic
    (integer division truncates, casts to integers round: :mod:`sqldp.pg_arithmetic`); refuse
    otherwise, naming the ``purpose`` the range is needed for — and where a value could overflow double
    precision, since PostgreSQL then fails on such data, an error that would answer for it."""
    lo, hi = _interval(e, dom, purpose)
    if math.isinf(lo) or math.isinf(hi):
        raise RefusedError(
            f"cannot bound {e.sql(dialect='postgres')} for {purpose}: its values over the declared ranges "
            "overflow double precision"
        )
    return lo, hi


def _interval(e: exp.Expression, dom: Domain, purpose: str) -> Interval:
    def of(x: exp.Expression) -> Interval:
        return interval(x, dom, purpose)

    def refuse(why: str) -> RefusedError:
        return RefusedError(f"cannot bound {e.sql(dialect='postgres')} for {purpose}: {why}")

    if isinstance(e, exp.Paren):
        return of(e.this)
    if isinstance(e, exp.Cast):
        lo, hi = of(e.this)
        # a rounding cast moves a value by at most 1/2 (to NUMERIC(p, s): 10^(−s)/2), monotonically
        return (math.floor(lo), math.ceil(hi)) if rounds(e, dom.kind) else (lo, hi)
    if isinstance(e, exp.Column):
        r = dom.range(ColumnRef(e.table, e.name))
        if r is None:
            raise RefusedError(
                f"{purpose} needs a value range for {e.sql(dialect='postgres')}: declare "
                f"range = [low, high] for column {e.name!r} in the policy"
            )
        return r
    if isinstance(e, exp.Literal) and not e.is_string:
        v = float(e.this)
        return v, v
    if isinstance(e, exp.Neg):
        lo, hi = of(e.this)
        return -hi, -lo
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a, b = of(e.this), of(e.expression)
        if isinstance(e, exp.Add):
            return a[0] + b[0], a[1] + b[1]
        if isinstance(e, exp.Sub):
            return a[0] - b[1], a[1] - b[0]
        if isinstance(e, exp.Mul):
            return _mul(a, b)
        if b[0] <= 0 <= b[1]:
            raise refuse(f"the divisor's range {list(b)} contains 0")
        lo, hi = _mul(a, (1.0 / b[1], 1.0 / b[0]))
        # integer division truncates towards zero, a non-decreasing function of the real quotient
        return (math.trunc(lo), math.trunc(hi)) if truncates(e, dom.kind) else (lo, hi)
    if isinstance(e, exp.Abs):
        return _abs(of(e.this))
    if isinstance(e, exp.Exp):
        lo, hi = of(e.this)
        if hi > MAX_EXP:  # PostgreSQL fails on the data beyond it, an error that would answer for it
            raise refuse(f"EXP of values up to {hi:g} overflows double precision (e^{MAX_EXP:g} is the largest)")
        return _real(math.exp, lo), _real(math.exp, hi)
    if isinstance(e, exp.Sqrt):
        lo, hi = of(e.this)
        if lo < 0:
            raise refuse(f"its argument's range {[lo, hi]} reaches below 0, where SQRT fails in PostgreSQL")
        return math.sqrt(lo), math.sqrt(hi)
    if isinstance(e, exp.Pow):
        r_lo, r_hi = of(e.expression)
        if r_lo != r_hi:
            raise refuse("the exponent is not a constant")
        return _power(of(e.this), r_lo, e, purpose)
    if isinstance(e, (exp.Greatest, exp.Least)):
        parts = [of(x) for x in [e.this, *e.expressions]]
        pick = max if isinstance(e, exp.Greatest) else min  # both ends are monotone in every argument
        return pick(p[0] for p in parts), pick(p[1] for p in parts)
    if isinstance(e, exp.Case) and e.this is None:
        # CASE WHEN … THEN v1 … ELSE v0 END takes one of its branch values (a missing ELSE is NULL, which SUM
        # skips): the hull of the branches bounds it, whatever the conditions read
        branches = [of(v) for v in case_values(e)]
        if e.args.get("default") is None:
            branches.append((0.0, 0.0))
        return min(b[0] for b in branches), max(b[1] for b in branches)
    raise RefusedError(
        f"cannot bound {e.sql(dialect='postgres')} for {purpose} "
        "(supported: columns with declared ranges, numbers, + − × /, ABS, EXP, SQRT, POWER by a constant, "
        "GREATEST, LEAST, casts, CASE over such branches)"
    )


_NO_COLUMNS = Domain(lambda ref: None, lambda ref: "other")


def constant(e: exp.Expression) -> float | None:
    """The value of an expression without columns as PostgreSQL computes it (−1, 1 / 2 = 0), else None (one
    that reads a column, or whose value is not pinned down: CAST(0.5 AS INTEGER) may round either way)."""
    if reads_column(e):
        return None
    try:
        lo, hi = interval(e, _NO_COLUMNS, "a constant")
    except RefusedError:
        return None
    return lo if lo == hi else None


def magnitude(e: exp.Expression, dom: Domain) -> float:
    """max |e| over the declared ranges."""
    lo, hi = interval(e, dom)
    return max(abs(lo), abs(hi))


def clamp_columns(e: exp.Expression, dom: Domain) -> exp.Expression:
    """``e`` with each column c replaced by ``CASE WHEN c < lo THEN lo WHEN c > hi THEN hi ELSE c END``: the
    bound then holds for any data. Not LEAST(GREATEST(c, lo), hi): PostgreSQL's GREATEST skips NULLs, so a NULL
    would enter SUM as lo instead of being skipped (SUM(age) with range [18, 99] counted 18 per NULL)."""

    def clamp(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table:
            r = dom.range(ColumnRef(node.table, node.name))
            if r is not None:
                lo, hi = (exp.Literal.number(int(v) if float(v).is_integer() else v) for v in r)
                return exp.Case(
                    ifs=[
                        exp.If(this=exp.LT(this=node.copy(), expression=lo), true=lo.copy()),
                        exp.If(this=exp.GT(this=node.copy(), expression=hi), true=hi.copy()),
                    ],
                    default=node.copy(),
                )
        return node

    return e.copy().transform(clamp)


def clamped(e: exp.Expression) -> tuple[exp.Expression, float, float] | None:
    """(x, lo, hi) when ``e`` is a clamp written by :func:`clamp_columns`, else None."""
    if not isinstance(e, exp.Case) or e.this is not None or len(e.args.get("ifs", [])) != 2:
        return None
    below, above = e.args["ifs"]
    x = e.args.get("default")
    if not (isinstance(below.this, exp.LT) and isinstance(above.this, exp.GT)) or x is None:
        return None
    lo, hi = below.args["true"], above.args["true"]
    if not all(isinstance(v, exp.Literal) and not v.is_string for v in (lo, hi)):
        return None
    if below.this.this != x or above.this.this != x or below.this.expression != lo or above.this.expression != hi:
        return None
    return x, float(lo.this), float(hi.this)
