"""Value bounds of aggregated expressions by interval arithmetic over the policy's column ranges.

Under row-level privacy, adding or removing one joined tuple moves SUM(e) by at most max |e|, so the
derivative of SUM is bounded by max |e| times the derivative of COUNT (NR §3.3.7.3 treats COUNT; the report
assumed a constant bound for SUM, sqldp derives it from the declared ranges, NR §3.3.11 "ranges"). The
answer itself is computed over e with every column clamped to its declared range, so the bound holds for
any data, including rows that break the declaration (fail closed). Each operator's rule is its ``interval``
entry in :mod:`sqldp.sensitivity.operators`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.pg_arithmetic import KindOf, reads_column
from sqldp.policy import Policy
from sqldp.sensitivity import operators
from sqldp.sensitivity.operators import Interval, IntervalContext

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
    return domain_of(lambda alias: form.use(alias).table, catalog, policy)


def domain_of(table_of: Callable[[str], str], catalog: Catalog, policy: Policy) -> Domain:
    """:func:`domain` with the table of each alias given by ``table_of`` (the normaliser's blocks, before a form
    exists)."""

    def kind(ref: ColumnRef) -> str:
        return catalog.table(table_of(ref.alias)).column(ref.column).kind

    def declared(ref: ColumnRef) -> Interval | None:
        r = policy.table(table_of(ref.alias)).column(ref.column).range
        if r is None or kind(ref) != "integer":
            return r
        lo, hi = math.ceil(r[0]), math.floor(r[1])
        if lo > hi:
            raise RefusedError(f"the declared range {list(r)} of integer column {ref} holds no integer")
        return float(lo), float(hi)

    def type_sql(ref: ColumnRef) -> str:
        return catalog.table(table_of(ref.alias)).column(ref.column).type_sql

    return Domain(declared, kind, type_sql)


ROW_LEVEL_SUM = "SUM under row-level privacy"


def interval(e: exp.Expr, dom: Domain, purpose: str = ROW_LEVEL_SUM) -> Interval:
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


def _interval(e: exp.Expr, dom: Domain, purpose: str) -> Interval:
    def of(x: exp.Expr) -> Interval:
        return interval(x, dom, purpose)

    def refuse(why: str) -> RefusedError:
        return RefusedError(f"cannot bound {e.sql(dialect='postgres')} for {purpose}: {why}")

    if isinstance(e, exp.Paren):
        return of(e.this)
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
    op = operators.lookup(e)
    found = None if op is None or op.interval is None else op.interval.apply(IntervalContext(of, dom.kind, refuse), e)
    if found is not None:
        return found
    raise RefusedError(
        f"cannot bound {e.sql(dialect='postgres')} for {purpose} "
        f"(supported: columns with declared ranges, numbers, {operators.supported('interval')})"
    )


_NO_COLUMNS = Domain(lambda ref: None, lambda ref: "other")


def constant(e: exp.Expr) -> float | None:
    """The value of an expression without columns as PostgreSQL computes it (−1, 1 / 2 = 0), else None (one
    that reads a column, or whose value is not pinned down: CAST(0.5 AS INTEGER) may round either way)."""
    if reads_column(e):
        return None
    try:
        lo, hi = interval(e, _NO_COLUMNS, "a constant")
    except RefusedError:
        return None
    return lo if lo == hi else None


def magnitude(e: exp.Expr, dom: Domain) -> float:
    """max |e| over the declared ranges."""
    lo, hi = interval(e, dom)
    return max(abs(lo), abs(hi))


def clamp_columns(e: exp.Expr, dom: Domain) -> exp.Expr:
    """``e`` with each column c replaced by ``CASE WHEN c < lo THEN lo WHEN c > hi THEN hi ELSE c END``: the
    bound then holds for any data. Not LEAST(GREATEST(c, lo), hi): PostgreSQL's GREATEST skips NULLs, so a NULL
    would enter SUM as lo instead of being skipped (SUM(age) with range [18, 99] counted 18 per NULL).
    :func:`sqldp.sensitivity.operators.clamped` recognises the CASE it writes."""

    def clamp(node: exp.Expr) -> exp.Expr:
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
