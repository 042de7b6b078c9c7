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

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.policy import Policy

Interval = tuple[float, float]
RangeOf = Callable[[ColumnRef], Interval | None]


def declared_ranges(form: AnalysisForm, policy: Policy) -> RangeOf:
    """The policy's declared range of each column, found through the alias the query reads it by."""
    return lambda ref: policy.table(form.use(ref.alias).table).column(ref.column).range


def _mul(a: Interval, b: Interval) -> Interval:
    products = [x * y for x in a for y in b if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)]
    return min(products, default=0.0), max(products, default=0.0)


ROW_LEVEL_SUM = "SUM under row-level privacy"


def interval(e: exp.Expression, range_of: RangeOf, purpose: str = ROW_LEVEL_SUM) -> Interval:
    """[lo, hi] ⊇ the values of ``e`` when every column lies in its declared range; refuse otherwise, naming
    the ``purpose`` the range is needed for."""
    if isinstance(e, (exp.Paren, exp.Cast)):
        return interval(e.this, range_of, purpose)
    if isinstance(e, exp.Column):
        r = range_of(ColumnRef(e.table, e.name))
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
        lo, hi = interval(e.this, range_of, purpose)
        return -hi, -lo
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a = interval(e.this, range_of, purpose)
        b = interval(e.expression, range_of, purpose)
        if isinstance(e, exp.Add):
            return a[0] + b[0], a[1] + b[1]
        if isinstance(e, exp.Sub):
            return a[0] - b[1], a[1] - b[0]
        if isinstance(e, exp.Mul):
            return _mul(a, b)
        if b[0] <= 0 <= b[1]:
            raise RefusedError(f"cannot bound {e.sql(dialect='postgres')}: the divisor's range {list(b)} contains 0")
        return _mul(a, (1.0 / b[1], 1.0 / b[0]))
    if isinstance(e, exp.Case) and e.this is None:
        # CASE WHEN … THEN v1 … ELSE v0 END takes one of its branch values (a missing ELSE is NULL, which SUM
        # skips): the hull of the branches bounds it, whatever the conditions read
        branches = [interval(i.args["true"], range_of, purpose) for i in e.args.get("ifs", [])]
        default = e.args.get("default")
        branches.append(interval(default, range_of, purpose) if default is not None else (0.0, 0.0))
        return min(b[0] for b in branches), max(b[1] for b in branches)
    raise RefusedError(
        f"cannot bound {e.sql(dialect='postgres')} for {purpose} "
        "(supported: columns with declared ranges, numbers, + − × /, CASE over such branches)"
    )


def magnitude(e: exp.Expression, range_of: RangeOf) -> float:
    """max |e| over the declared ranges."""
    lo, hi = interval(e, range_of)
    return max(abs(lo), abs(hi))


def clamp_columns(e: exp.Expression, range_of: RangeOf) -> exp.Expression:
    """``e`` with each column c replaced by LEAST(GREATEST(c, lo), hi): the bound then holds for any data."""

    def clamp(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.table:
            r = range_of(ColumnRef(node.table, node.name))
            if r is not None:
                lo, hi = (exp.Literal.number(int(v) if float(v).is_integer() else v) for v in r)
                return exp.Least(this=exp.Greatest(this=node.copy(), expressions=[lo]), expressions=[hi])
        return node

    return e.copy().transform(clamp)
