"""Generated SQL, built as sqlglot expressions (never by string concatenation).

The answer query of an analysis form is plain PostgreSQL (it must also run unchanged on Citus):
``SELECT keys…, aggregates… FROM uses… WHERE conjuncts… GROUP BY keys…``. ORDER BY and LIMIT are absent on
purpose: they are applied to the noisy answers.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

from sqlglot import exp

from sqldp.form import Aggregate, AnalysisForm, Conjunct, SemiJoin, TableUse
from sqldp.pg_arithmetic import KindOf, integer_valued


def number(v: float) -> exp.Expr:
    """A number as SQL: an integer literal where exact (below 1e15), else the shortest repr of the double;
    negative values as a negation (a literal has no sign in sqlglot); ±∞ as DOUBLE PRECISION 'Infinity'."""
    if math.isinf(v):
        inf = exp.cast(exp.Literal.string("Infinity"), "DOUBLE PRECISION")
        return inf if v > 0 else exp.Neg(this=inf)
    magnitude = abs(v)
    exact = float(v).is_integer() and magnitude < 1e15
    lit = exp.Literal.number(str(int(magnitude)) if exact else repr(float(magnitude)))
    return exp.Neg(this=lit) if v < 0 else lit


@functools.lru_cache(maxsize=1024)
def _table(name: str) -> exp.Table:
    """``exp.to_table(name)``, parsed once per name (callers copy it): the analyses build thousands of FROM
    lists (TPC-H Q8: 548 tables in one analysis), and sqlglot's parser costs ~0.3 ms a call."""
    return exp.to_table(name)


def from_uses(select: exp.Select, uses: Iterable[TableUse]) -> exp.Select:
    for i, u in enumerate(uses):
        table = exp.alias_(_table(u.table).copy(), u.alias, table=True, copy=False)
        # the Join node built here: ``join(table, join_type="cross")`` parses the text "cross" at every call (the
        # same tree, ~12x slower)
        select = (
            select.from_(table, copy=False) if i == 0 else select.join(exp.Join(this=table, kind="CROSS"), copy=False)
        )
    return select


def where(select: exp.Select, conjuncts: Iterable[Conjunct | exp.Expr]) -> exp.Select:
    parts = [c.expr if isinstance(c, Conjunct) else c for c in conjuncts]
    if parts:
        select = select.where(exp.and_(*(p.copy() for p in parts)), copy=False)
    return select


def aggregate_expr(agg: Aggregate) -> exp.Expr:
    if agg.kind == "count":
        if agg.distinct and agg.arg is not None:
            return exp.Count(this=exp.Distinct(expressions=[agg.arg.copy()]))
        return exp.Count(this=exp.Star() if agg.arg is None else agg.arg.copy())
    if agg.kind == "sum" and agg.arg is not None:
        # summed in NUMERIC: a double precision SUM fails once the total passes 1.8e308 (two rows of 1e308), an
        # error the data decides; NUMERIC holds the total of 2^63 values up to 10^130900 (failures.check)
        return exp.Sum(this=exp.cast(agg.arg.copy(), "NUMERIC"))
    cls = {"sum": exp.Sum, "min": exp.Min, "max": exp.Max}[agg.kind]
    return cls(this=agg.arg.copy() if agg.arg is not None else exp.Star())


def answer_query(form: AnalysisForm) -> exp.Select:
    """Group keys as ``__key<i>``, aggregates as ``__agg<i>`` (COUNT/SUM/MIN/MAX, AVG already split)."""
    items: list[exp.Expr] = [exp.alias_(g.copy(), f"__key{i}") for i, g in enumerate(form.group_by)]
    items += [exp.alias_(aggregate_expr(a), f"__agg{i}") for i, a in enumerate(form.aggregates)]
    select = from_uses(exp.select(*items), form.uses)
    conditions: list[Conjunct | exp.Expr] = list(form.conjuncts)
    for semi in form.semijoins:
        # a decorrelated scalar subquery whose derived table's columns are all tied to outer columns is an inner
        # join with D (grouped by those columns: one row per outer row at most), compared on D's value; the
        # others run as [NOT] EXISTS over the subquery's table, which has the same value as over D
        # (SemiJoin.exists; sqldp.subqueries). That includes an EXISTS or IN whose D is joinable (Q4): the
        # join with the set D multiplies each outer row by 0 or 1, the indicator EXISTS gives, and PostgreSQL
        # then probes the subquery's table per outer key instead of deduplicating all of it first
        if semi.joinable and semi.compare is not None:
            select = select.join(matched_keys(semi.derived(), semi, form), join_type="cross", copy=False)
            conditions += semi.correlation
            conditions.append(semi.compare)
        else:
            conditions.append(semi.exists())
    select = where(select, conditions)
    if form.group_by:
        select = select.group_by(*(g.copy() for g in form.group_by), copy=False)
    return select


def matched_keys(derived: exp.Subquery, semi: SemiJoin, form: AnalysisForm) -> exp.Subquery:
    """The grouped D of a decorrelated scalar subquery (``derived``) restricted to the keys an outer row can
    match: when D's columns equal expressions of one outer use u (TPC-H Q17: ``l_partkey = part.p_partkey``)
    and conjuncts of the query read u alone (``p_brand = …``), D's rows are kept where ``(keys) IN (SELECT
    those expressions FROM u WHERE those conjuncts)``.

    Same answer: D is grouped by its keys, so a group's value is a function of the table's rows with that key
    alone, and keeping whole groups leaves each kept group's value as it was. An outer row that passes the
    query's conjuncts passes u's, so the key it joins on is in the IN set and its D row is kept; the rows D
    loses joined no outer row that passes the WHERE. Only the answer query is restricted (the analyses read
    SemiJoin.derived as it is). PostgreSQL then computes the per-part average of Q17 for the 18 parts the
    query asks about, by index, instead of grouping all of lineitem (SF 0.1: 250 ms → 5 ms). ``derived``
    unchanged when a key equals no column of the outer uses, the keys read several outer uses, or no conjunct
    reads u alone."""
    outer: dict[str, exp.Expr] = {}
    for e in semi.correlation:
        e = e.unnest()
        if not isinstance(e, exp.EQ):
            continue
        for side, other in ((e.this, e.expression), (e.expression, e.this)):
            reads = {c.table for c in other.find_all(exp.Column)}
            # the outer side a column: the IN subquery then reads values and evaluates only conjuncts the WHERE
            # evaluates on u's rows anyway, so it raises no error the answer would not (docs/sql.md, "Errors are
            # answers too")
            mine = isinstance(side, exp.Column) and side.table == semi.use.alias and semi.use.alias not in reads
            if mine and isinstance(other, exp.Column):
                outer.setdefault(side.name, other)
    uses = {c.table for e in outer.values() for c in e.find_all(exp.Column)}
    if set(outer) != set(semi.columns) or len(uses) != 1:
        return derived
    (alias,) = uses
    use = next((u for u in form.uses if u.alias == alias), None)
    # conjuncts whose every column (their expressions', not only the uses' they list) is one of u's
    own = [c for c in form.conjuncts if c.columns and all(x.table == alias for x in c.expr.find_all(exp.Column))]
    if use is None or not own:
        return derived
    keys = [exp.column(c, table=semi.use.alias) for c in semi.columns]
    probe = where(from_uses(exp.select(*(outer[c].copy() for c in semi.columns)), [use]), own)
    test = exp.In(this=keys[0] if len(keys) == 1 else exp.Tuple(expressions=keys), query=exp.Subquery(this=probe))
    out = derived.copy()
    out.this.where(test, copy=False)
    return out


_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Neg, exp.Abs)


def widen_integers(e: exp.Expr, kind_of: KindOf) -> exp.Expr:
    """``e`` with each INTEGER-typed operand of + − × / % and ABS cast to BIGINT (a copy).

    PostgreSQL raises an error when INTEGER arithmetic overflows (``t.a * 1000000`` for a ≥ 2148), and an error
    in place of a noisy answer tells the analyst about the data. BIGINT arithmetic gives the same values
    wherever INTEGER does not overflow (integer division still truncates), and a product of two INTEGER
    values cannot overflow it. Literals, and arithmetic whose own operands are widened, are left as they are.
    The analyses never see this: it is how the SQL they describe is run (a rule of ``sqldp.rewrite``)."""

    def operand(x: exp.Expr) -> exp.Expr:
        inner = x
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, (exp.Literal, *_ARITHMETIC)) or (
            isinstance(inner, exp.Cast) and inner.to.is_type(exp.DataType.Type.BIGINT)
        ):
            return x
        return exp.cast(x, "BIGINT") if integer_valued(inner, kind_of) else x

    def widen(node: exp.Expr) -> exp.Expr:
        if isinstance(node, _ARITHMETIC):
            for key in ("this", "expression"):
                child = node.args.get(key)
                if isinstance(child, exp.Expr):
                    node.set(key, operand(child))
        return node

    return e.copy().transform(widen, copy=False)
