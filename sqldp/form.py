"""The analysis form: what ``normalize`` hands to the sensitivity analyses (pipeline step 2 of 6, docs/layout.md).

A query in analysis form is ``aggregate(expr) over σθ(U1 × … × Un)`` (NR §3.3.7.2–3.3.7.3, §3.3.8.2):

* ``uses`` — the table *uses* in the product. A table that occurs twice (a self-join, ``FROM nation n1,
  nation n2``) is two uses with distinct aliases; the row analysis unifies their patterns (§3.3.7.3).
* ``conjuncts`` — θ split at its top-level ANDs. Column references are qualified by the use alias
  (``n1.n_name``); each conjunct is *private* when it reads a value-sensitive column (a column in its
  table's norm, §4.3.3.3) and *public* otherwise.
* ``aggregates`` — the distinct primitive aggregates of the SELECT list and HAVING; each SQL aggregate is
  already written over them by its entry in :mod:`sqldp.aggregates` (AVG as SUM/COUNT).
* ``outputs`` — the SELECT list: a group key, or an arithmetic expression over aggregate placeholders
  (``exp.Column`` named ``__agg<i>``) such as ``__agg0 / __agg1`` for an AVG.
* ``group_by`` — the grouping keys (expressions over uses); one noisy answer per group.
* ``order_by`` / ``limit`` — applied to the noisy answers, never to true values.
* ``semijoins`` — ``[NOT] EXISTS`` and ``[NOT] IN (SELECT …)`` conjuncts of θ, each a semi-join (or anti-join)
  to a deduplicated derived table of its correlation keys (:mod:`sqldp.subqueries`; NR §4.3.6.1 (iii)–(v)).

All expressions are sqlglot trees; they are shared, never mutated (copy before transforming).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from sqlglot import exp

AggKind = Literal["count", "sum", "min", "max"]
AGG_PREFIX = "__agg"
KEY_PREFIX = "__key"  # group key j in AnalysisForm.key_exprs, as in the answer query (sqldp.sqlgen.answer_query)


def placeholder(index: int) -> exp.Column:
    """The column that stands for aggregate ``index`` of a form in its outputs and HAVING (``__agg<i>``)."""
    return exp.column(f"{AGG_PREFIX}{index}")


@dataclass(frozen=True)
class ColumnRef:
    """A column of one table use."""

    alias: str
    column: str

    def __str__(self) -> str:
        return f"{self.alias}.{self.column}"


@dataclass(frozen=True)
class TableUse:
    """One occurrence of a catalog table in the FROM product."""

    alias: str
    table: str


@dataclass(frozen=True)
class Conjunct:
    """One top-level AND-part of the filter θ."""

    expr: exp.Expr
    columns: frozenset[ColumnRef]
    private: bool

    @cached_property  # generated once: sqlglot's generator costs ≈ 0.5 ms, on every run of a cached query
    def sql(self) -> str:
        return self.expr.sql(dialect="postgres")


@dataclass(frozen=True)
class Aggregate:
    """COUNT(*) (``arg`` is None), COUNT(e), COUNT(DISTINCT e), SUM(e), MIN(e) or MAX(e) over the filtered
    product."""

    kind: AggKind
    arg: exp.Expr | None
    columns: frozenset[ColumnRef] = frozenset()
    distinct: bool = False  # COUNT(DISTINCT e): answered only with a data-independent bound (sensitivity.plan)

    @cached_property
    def sql(self) -> str:
        inner = "*" if self.arg is None else self.arg.sql(dialect="postgres")
        return f"{self.kind.upper()}({'DISTINCT ' if self.distinct else ''}{inner})"


@dataclass(frozen=True)
class Output:
    """One column of the result: a group key or a combination of aggregates."""

    name: str
    expr: exp.Expr
    aggregates: tuple[int, ...]  # indices into AnalysisForm.aggregates used by expr
    group_key: int | None = None  # index into AnalysisForm.group_by when the output is a key
    # an expression of group keys (``age + 1``, ``SUBSTRING(name, 1, 3)``): its index into
    # AnalysisForm.key_exprs, whose value per group is computed by PostgreSQL over the group domain's values
    # (sqldp.groups); ``group_key`` is then the first key it reads
    derived: int | None = None

    @property
    def is_key(self) -> bool:
        return self.group_key is not None


@dataclass(frozen=True)
class OrderKey:
    output: int  # index into AnalysisForm.outputs; -1 for an expression that is no output (``expr``, ``derived``)
    descending: bool = False
    # ORDER BY an expression of released aggregates (``__agg<i>`` placeholders, computed on the noisy values), or
    # of the group keys alone (its index into AnalysisForm.key_exprs, computed over the domain); ``sql`` as written
    expr: exp.Expr | None = None
    derived: int | None = None
    sql: str = ""


SCALAR_VALUE = "__value"  # the column of a decorrelated scalar subquery's derived table holding its value


@dataclass(frozen=True)
class SemiJoin:
    """A ``[NOT] EXISTS`` or ``[NOT] IN (SELECT …)`` conjunct of θ as a semi-join (anti-join) to the derived table

        D = SELECT DISTINCT use.c1, …, use.ck FROM table AS use WHERE inner

    seen under the use's alias: an outer row passes when some (``anti``: no) row of D satisfies
    ``correlation``, which reads D's columns and the outer uses' (:mod:`sqldp.subqueries` has the
    transformation and its sensitivity argument)."""

    use: TableUse  # the subquery's one table use; D takes its alias
    columns: tuple[str, ...]  # D's columns: those of the use that ``correlation`` reads
    inner: tuple[exp.Expr, ...]  # the subquery's own conditions (over the use only)
    correlation: tuple[exp.Expr, ...]  # conditions over D's columns and the outer uses
    anti: bool
    source: str  # what the analyst wrote: "EXISTS", "NOT EXISTS", "IN", "NOT IN", "scalar subquery"
    where: str = "query"  # its position in the statement (query:LINE:COL), for refusals after normalising
    # a correlated scalar subquery decorrelated (sqldp.subqueries.scalar_join): D is then grouped by its
    # columns with ``value`` (the subquery's aggregate expression over the use) as its column VALUE, and the
    # outer row passes ``compare`` (the conjunct with the subquery replaced by the column VALUE of D)
    value: exp.Expr | None = None
    compare: exp.Expr | None = None

    @property
    def scalar(self) -> bool:
        return self.value is not None

    @cached_property
    def sql(self) -> str:
        return self.predicate().sql(dialect="postgres")

    def derived(self, distinct: bool = True) -> exp.Subquery:
        """D as a FROM item under the use's alias."""
        items = [exp.alias_(exp.column(c, table=self.use.alias), c) for c in self.columns]
        if self.value is not None:
            items.append(exp.alias_(self.value.copy(), SCALAR_VALUE))
        inner = exp.select(*items).from_(exp.alias_(exp.to_table(self.use.table), self.use.alias, table=True))
        if self.inner:
            inner = inner.where(exp.and_(*(e.copy() for e in self.inner)), copy=False)
        if self.value is not None:  # one row per key: the subquery's value for the outer rows with that key
            inner = inner.group_by(*(exp.column(c, table=self.use.alias) for c in self.columns), copy=False)
        elif distinct:
            inner = inner.distinct(copy=False)
        return exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(self.use.alias)))

    @property
    def joinable(self) -> bool:
        """Every column of D is equal to an expression of the outer uses alone in ``correlation``: then an outer
        row matches at most one row of D (D is a set), and the semi-join is an inner join with D."""
        if self.anti or not self.columns:
            return False
        bound = set()
        for e in self.correlation:
            e = e.unnest()
            if not isinstance(e, exp.EQ):
                continue
            for side, other in ((e.this, e.expression), (e.expression, e.this)):
                outer = {c.table for c in other.find_all(exp.Column)}
                if isinstance(side, exp.Column) and side.table == self.use.alias and self.use.alias not in outer:
                    bound.add(side.name)
        return bound == set(self.columns)

    def exists(self) -> exp.Expr:
        """The conjunct the answer's WHERE runs: ``[NOT] EXISTS (SELECT 1 FROM table AS use WHERE inner AND
        correlation)``, the subquery over the table itself. It is :meth:`predicate`'s value on every database:
        ``correlation`` reads only D's columns, so some row of D = π(σ_inner(table)) passes it exactly when some
        row of σ_inner(table) does — EXISTS asks whether a row exists, and duplicates do not change that (it is
        the EXISTS the analyst wrote). PostgreSQL then plans a semi-join (anti-join) with an index probe or a
        hash per outer key instead of deduplicating the whole table first (TPC-H Q21 at SF 0.1: 0.84 s → 0.085 s
        for the answer query). A decorrelated scalar subquery keeps D, whose value is grouped by its keys."""
        if self.value is not None or not self.columns:
            return self.predicate()
        body = exp.select(exp.Literal.number(1)).from_(
            exp.alias_(exp.to_table(self.use.table), self.use.alias, table=True)
        )
        body = body.where(exp.and_(*(e.copy() for e in (*self.inner, *self.correlation))), copy=False)
        found: exp.Expr = exp.Exists(this=body)
        return exp.Not(this=found) if self.anti else found

    def predicate(self) -> exp.Expr:
        """``[NOT] EXISTS (SELECT 1 FROM D WHERE correlation)``: the conjunct as the analysis reads it (the answer
        runs :meth:`exists`, its equal)."""
        if self.columns:
            body = exp.select(exp.Literal.number(1)).from_(self.derived())
        else:  # uncorrelated: D has no column; EXISTS asks whether the subquery has a row
            body = exp.select(exp.Literal.number(1)).from_(
                exp.alias_(exp.to_table(self.use.table), self.use.alias, table=True)
            )
            if self.inner:
                body = body.where(exp.and_(*(e.copy() for e in self.inner)), copy=False)
        conditions = [*self.correlation, *((self.compare,) if self.compare is not None else ())]
        if conditions:
            body = body.where(exp.and_(*(e.copy() for e in conditions)), copy=False)
        found: exp.Expr = exp.Exists(this=body)
        return exp.Not(this=found) if self.anti else found


BUCKET = "__n"  # a histogram of per-key counts: the inner query's count, the histogram's key
KEY = "__k"  # its inner query's group key


@dataclass(frozen=True)
class PerKeyCounts:
    """The inner aggregation of a histogram of per-key counts (sqldp.strategies.nested): ``COUNT(count_arg)`` per
    value of ``key`` (a column of ``preserved``) over ``preserved`` joined (``outer``: LEFT OUTER) to ``counted``
    on ``key = foreign`` and ``on`` (conditions on ``counted``), under ``where`` (conditions on ``preserved``)."""

    preserved: TableUse
    counted: TableUse
    key: str
    foreign: str
    on: tuple[exp.Expr, ...]
    where: tuple[exp.Expr, ...]
    count_arg: exp.Expr | None  # None: COUNT(*)
    outer: bool
    alias: str  # the derived table's name in the query
    joined: bool = True  # False: one table counts its own rows per key (counted is preserved, foreign is key)

    @property
    def uses(self) -> tuple[TableUse, ...]:
        return (self.preserved, self.counted) if self.joined else (self.preserved,)

    def inner(self) -> exp.Select:
        """The inner query as it runs: the analyst's, with its outputs renamed."""
        a, b = self.preserved, self.counted
        count = exp.Count(this=exp.Star() if self.count_arg is None else self.count_arg.copy())
        key = exp.column(self.key, table=a.alias)
        q = exp.select(exp.alias_(key.copy(), KEY), exp.alias_(count, BUCKET)).from_(
            exp.alias_(exp.to_table(a.table), a.alias, table=True)
        )
        if self.joined:
            on = exp.and_(exp.EQ(this=key.copy(), expression=exp.column(self.foreign, table=b.alias)), *self.on)
            q = q.join(
                exp.alias_(exp.to_table(b.table), b.alias, table=True),
                on=on,
                join_type="left outer" if self.outer else "inner",
                copy=False,
            )
        if self.where:
            q = q.where(exp.and_(*(e.copy() for e in self.where)), copy=False)
        return q.group_by(key, copy=False)


@dataclass(frozen=True)
class AnalysisForm:
    uses: tuple[TableUse, ...]
    conjuncts: tuple[Conjunct, ...]
    aggregates: tuple[Aggregate, ...]
    outputs: tuple[Output, ...]
    group_by: tuple[exp.Expr, ...] = ()
    order_by: tuple[OrderKey, ...] = ()
    limit: int | None = None
    notes: tuple[str, ...] = field(default=())  # rewrites applied (e.g. "AVG → SUM/COUNT")
    # HAVING over the aggregates (``__agg<i>`` placeholders), evaluated on the noisy values after the noise
    having: exp.Expr | None = None
    # DP partition selection (sqldp.groups.partition_selection): the index of the hidden COUNT(*) whose noisy
    # value decides which of the groups present in the data are released; None: the groups are declared
    select_by: int | None = None
    # SELECT DISTINCT: the released rows are the groups present in the data, all chosen by partition selection
    distinct_rows: bool = False
    semijoins: tuple[SemiJoin, ...] = ()
    # a histogram of per-key counts (sqldp.strategies.nested): the uses are its inner query's two tables, analysed there
    nested: PerKeyCounts | None = None
    # expressions of the group keys alone, each key j written as the column ``__key<j>`` (KEY_PREFIX): the
    # outputs that compute them (Output.derived) and the HAVING conjuncts that read keys only (``key_having``,
    # indices into it: a filter on the public or declared group domain, post-processing)
    key_exprs: tuple[exp.Expr, ...] = ()
    key_having: tuple[int, ...] = ()

    def use(self, alias: str) -> TableUse:
        """The table use an alias names: one of the product's, or a semi-join's (its columns are read by the
        semi-join's conditions, which the checks of the columns' kinds and ranges cover too)."""
        for u in (*self.uses, *(s.use for s in self.semijoins)):
            if u.alias == alias:
                return u
        raise KeyError(alias)

    def uses_of(self, table: str) -> tuple[TableUse, ...]:
        return tuple(u for u in self.uses if u.table == table)

    @property
    def tables(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(u.table for u in self.uses))


def describe(form: AnalysisForm) -> dict[str, Any]:
    """A JSON-serialisable summary of the analysis form (``sqldp explain``)."""

    def sql(e: exp.Expr) -> str:
        return e.sql(dialect="postgres")

    return {
        "tables": list(form.tables),
        "uses": [{"alias": u.alias, "table": u.table} for u in form.uses],
        "conjuncts": [
            {"sql": c.sql, "private": c.private, "columns": sorted(str(r) for r in c.columns)} for c in form.conjuncts
        ],
        "aggregates": [a.sql for a in form.aggregates],
        "outputs": [{"name": o.name, "expr": sql(o.expr), "group_key": o.is_key} for o in form.outputs],
        "group_by": [sql(g) for g in form.group_by],
        "order_by": [
            {"output": form.outputs[k.output].name if k.output >= 0 else k.sql, "desc": k.descending}
            for k in form.order_by
        ],
        "limit": form.limit,
        "rewrites": list(dict.fromkeys(form.notes)),
        **(
            {
                "semijoins": [
                    {"source": s.source, "table": s.use.table, "alias": s.use.alias, "anti": s.anti, "sql": s.sql}
                    for s in form.semijoins
                ]
            }
            if form.semijoins
            else {}
        ),
    }


def single_aggregate(form: AnalysisForm, index: int) -> AnalysisForm:
    """The form restricted to one aggregate (each aggregate is its own measurement)."""
    agg = form.aggregates[index]
    out = Output(f"{AGG_PREFIX}0", exp.column(f"{AGG_PREFIX}0"), (0,))
    keys = tuple(o for o in form.outputs if o.is_key)
    return dataclasses.replace(form, aggregates=(agg,), outputs=(*keys, out), order_by=(), limit=None)
