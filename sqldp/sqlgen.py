"""Generated SQL, built as sqlglot expressions (never by string concatenation).

The answer query of an analysis form is plain PostgreSQL (DESIGN.md: it must also run unchanged on Citus):
``SELECT keys…, aggregates… FROM uses… WHERE conjuncts… GROUP BY keys…``. ORDER BY and LIMIT are absent on
purpose: they are applied to the noisy answers.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlglot import exp

from sqldp.form import Aggregate, AnalysisForm, Conjunct, TableUse


def from_uses(select: exp.Select, uses: Iterable[TableUse]) -> exp.Select:
    for i, u in enumerate(uses):
        table = exp.alias_(exp.to_table(u.table), u.alias, table=True)
        select = select.from_(table, copy=False) if i == 0 else select.join(table, join_type="cross", copy=False)
    return select


def where(select: exp.Select, conjuncts: Iterable[Conjunct | exp.Expression]) -> exp.Select:
    parts = [c.expr if isinstance(c, Conjunct) else c for c in conjuncts]
    if parts:
        select = select.where(exp.and_(*(p.copy() for p in parts)), copy=False)
    return select


def aggregate_expr(agg: Aggregate) -> exp.Expression:
    if agg.kind == "count":
        return exp.Count(this=exp.Star() if agg.arg is None else agg.arg.copy())
    cls = {"sum": exp.Sum, "min": exp.Min, "max": exp.Max}[agg.kind]
    return cls(this=agg.arg.copy() if agg.arg is not None else exp.Star())


def answer_query(form: AnalysisForm) -> exp.Select:
    """Group keys as ``__key<i>``, aggregates as ``__agg<i>`` (COUNT/SUM/MIN/MAX, AVG already split)."""
    items: list[exp.Expression] = [exp.alias_(g.copy(), f"__key{i}") for i, g in enumerate(form.group_by)]
    items += [exp.alias_(aggregate_expr(a), f"__agg{i}") for i, a in enumerate(form.aggregates)]
    select = from_uses(exp.select(*items), form.uses)
    select = where(select, form.conjuncts)
    if form.group_by:
        select = select.group_by(*(g.copy() for g in form.group_by), copy=False)
    return select
