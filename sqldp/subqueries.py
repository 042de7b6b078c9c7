"""Subqueries inside WHERE: ``[NOT] EXISTS (SELECT …)`` and ``x [NOT] IN (SELECT k …)`` as semi-joins and
anti-joins to a deduplicated derived table (NR §4.3.6.1, transformations (iii), (iv) and (v)).

The transformation (a workflow step, NR §3.2.1.1: the subquery's result is an intermediate table the main
query reads). For a conjunct of θ

    EXISTS (SELECT … FROM T AS u WHERE φ(u) AND ψ(u, outer))          (ψ: the conditions reading outer uses)
    x IN (SELECT u.k FROM T AS u WHERE φ(u) AND ψ(u, outer))           ≡ EXISTS (… AND u.k = x)

let D = SELECT DISTINCT u.c1, …, u.ck FROM T AS u WHERE φ(u), where c1 … ck are the columns of u that ψ reads.
Then an outer row passes the conjunct iff some row d of D satisfies ψ(d, outer): EXISTS only asks whether a
row exists, and the columns ψ does not read do not change the answer, so D's set semantics keep it. (IN is
EXISTS with ψ ∧ u.k = x in WHERE: IN yields NULL rather than false when no k equals x and a NULL is present,
and WHERE treats both alike.) NOT EXISTS passes iff no row of D does (an anti-join). ``x NOT IN (SELECT k …)``
is NOT EXISTS (… AND k = x) only when neither x nor k can be NULL (a NULL k makes NOT IN false for every row, a
NULL x false whenever the subquery has a row): answered when the catalog declares both NOT NULL, refused
otherwise (NR's (v) asks for a foreign key; NOT NULL is what the equivalence needs).

The SQL that runs computes exactly this: ``EXISTS (SELECT 1 FROM T AS u WHERE φ AND ψ)``, equal to EXISTS over
D on every database since ψ reads only D's columns (:meth:`sqldp.form.SemiJoin.exists`; the analysis reads
:meth:`~sqldp.form.SemiJoin.predicate`, over D) — also when ψ ties every column of D to the outer uses by
equalities (Q4, IN), where an inner join with the set D would give the same value (each outer row meets at
most one of its rows). Only a decorrelated scalar subquery joins D, grouped by its keys, and compares with
its value (sqldp.sqlgen.answer_query).

The sensitivity argument (row-level privacy, NR §3.3.7; the workflow rule c′ + Σ cᵢ·c′ᵢ of NR §3.3.13.9).
Write the query's value as f = Σ_{outer rows o} w(o)·[∃ d ∈ D: ψ(d, o)] (for NOT EXISTS, [∄ …]) with w(o) the
aggregate's term (1 for COUNT, |e| ≤ M for SUM).

1. Rows of an outer table t. The indicator lies in [0, 1] whatever D holds, so adding or removing one row of t
   moves f by at most what it moves the same query without the conjunct: the outer derivative (NR §3.3.7.3)
   computed with the conjunct dropped bounds it, for EXISTS and NOT EXISTS alike. (Keeping D's rows as a
   factor would be no better: the indicator is at most 1 already.)
2. Rows of T, the subquery's table (c_D = 1: one row of T adds or removes at most one row of D, since D is
   π_{c1…ck}(σ_φ(T)) made a set). Changing one row of D to or from d flips the indicator only of the outer rows
   o with ψ(d, o), whether it is a semi-join or an anti-join: the change is at most M·#{o : ψ(d, o)} — the
   derivative of the same outer query joined with D w.r.t. a row of D, which the row analysis counts by D's
   *pattern* (the columns of d that ψ's equalities tie to outer columns; the others are existential). For an
   anti-join, *removing* a row of T can *add* outer rows; the bound counts both directions.
3. A table read both outside and inside (Q21's lineitem l1 and l2): the two terms add (NR §3.3.13.9's
   c′ + c_D·c′_D with c_D = 1). Each term is smoothed as the row analysis smooths it (the outer private uses
   grow with the distance; D's term does not depend on D itself), and a sum of smooth bounds is smooth.
4. Along one step the terms are evaluated at the smaller database: the new outer rows pass at most once
   (term 1) and the old ones flip at most once (term 2), so |Δf| ≤ max(d(D), d(D′)) as for joins.

Groups are not disjoint once a subquery reads a private table (a row of D flips outer rows of any group), so
the bound is one ℓ1 bound over the groups. The schema's global bound (NR §3.3.13) for term 2 is the model
check of the outer query joined with D as a table whose row is unique (D is a set; its key is all of its
columns) (:mod:`sqldp.sensitivity.global_bound`).

Shapes outside this are refused with the reason and position: a subquery over several tables (one changed row
could change many keys of D), with GROUP BY, HAVING, aggregates, LIMIT or set operations, nested subqueries,
subqueries under OR or NOT other than the one directly before EXISTS or IN, and any subquery under privacy units
(R2T does not model D). Under value-level privacy (NR §3.3.8) the subquery's answer is a step of the sensitive
values it reads, bounded per key (:func:`value_steps`, :mod:`sqldp.sensitivity.columns`; docs/subqueries.md,
"Under value-level privacy"); refused where a correlation reads a value-sensitive column.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sqldp import algebra as ra
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import SCALAR_VALUE, AnalysisForm, ColumnRef, Conjunct, SemiJoin, TableUse
from sqldp.frontend import ParsedQuery, position
from sqldp.policy import Policy

Exports = dict[str, dict[str, exp.Expr]]  # alias seen by the enclosing scope → column → expression


class Normalizer(Protocol):
    """What the rewriting of a subquery reads and writes of the normaliser it runs inside
    (sqldp.normalize.Normalizer, which imports this module: a protocol keeps the import graph acyclic)."""

    sql: str
    catalog: Catalog
    notes: list[str]
    tables: dict[str, str]  # fresh alias → catalog table
    ctes: set[str]

    def refuse(self, reason: str, node: exp.Expr | None = None) -> RefusedError: ...

    def _fresh(self, alias: str) -> str: ...

    def _substitute(self, e: exp.Expr, exports: Exports) -> exp.Expr: ...


def recognise(cond: exp.Expr) -> tuple[exp.Expr, exp.Expr | None, bool, str] | None:
    """``(subquery, x, anti, source)`` for a conjunct ``[NOT] EXISTS (q)`` or ``x [NOT] IN (q)``, else None."""
    e = cond.unnest()
    anti = isinstance(e, exp.Not)
    if anti:
        e = e.this.unnest()
    if isinstance(e, exp.Exists):
        return e.this, None, anti, "NOT EXISTS" if anti else "EXISTS"
    if isinstance(e, exp.In) and e.args.get("query") is not None:
        return e.args["query"], e.this, anti, "NOT IN" if anti else "IN"
    return None


def semijoin(n: Normalizer, cond: exp.Expr, exports: Exports) -> SemiJoin | None:
    """The semi-join for one conjunct of a WHERE (columns as written, resolved through ``exports``), None
    when the conjunct is not a subquery predicate; a refusal with the position for one sqldp cannot analyse."""
    found = recognise(cond)
    if found is None:
        return None
    query, x, anti, source = found
    while isinstance(query, exp.Subquery):
        query = query.this
    what = f"{source} (SELECT …)"
    if not isinstance(query, exp.Select):
        shape = query.key.upper()
        raise n.refuse(f"{what}: only a plain SELECT … FROM one table WHERE … is analysed, not {shape}", query)
    if query.args.get("group") is not None and x is not None and not anti:
        return grouped_in(n, cond, query, x, exports)
    for arg, name in (("group", "GROUP BY"), ("having", "HAVING"), ("limit", "LIMIT"), ("offset", "OFFSET")):
        if query.args.get(arg) is not None:
            raise n.refuse(f"{what} with {name} is not analysed (NR §4.3.6.1 (iii)–(v) cover SELECT … WHERE)", query)
    if query.args.get("with_") or query.args.get("with") or query.args.get("joins"):
        raise n.refuse(
            f"{what} over several tables is not analysed: one changed row could change many of its keys", query
        )
    if any(node.find(exp.AggFunc) for node in query.expressions):
        raise n.refuse(f"{what} with an aggregate in its SELECT list is not analysed", query)
    alias, name, use, scope = _one_table(n, query, exports, what, "analysed")
    where = query.args.get("where")
    parts = [n._substitute(p, scope) for p in _split(where.this)] if where is not None else []
    if x is not None:
        if len(query.expressions) != 1:
            raise n.refuse(f"{what}: the subquery must return one column", query)
        item = query.expressions[0]
        k = n._substitute(item.unalias() if isinstance(item, exp.Alias) else item, scope)
        if not (isinstance(k, exp.Column) and k.table == alias):
            raise n.refuse(f"{what}: the subquery must return a column of its table", item)
        left = n._substitute(x, exports)
        if anti:
            _not_null(n, left, k, cond)
        parts.append(exp.EQ(this=k, expression=left))
    inner: list[exp.Expr] = []
    correlation: list[exp.Expr] = []
    for p in parts:
        tables = {c.table for c in p.find_all(exp.Column)}
        (inner if tables <= {alias} else correlation).append(p)
    columns = sorted({c.name for p in correlation for c in p.find_all(exp.Column) if c.table == alias})
    n.notes.append(f"{source} (SELECT … FROM {name}) → {'anti' if anti else 'semi'}-join with SELECT DISTINCT keys")
    where_ = position(n.sql, cond)
    return SemiJoin(use, tuple(columns), tuple(inner), tuple(correlation), anti, source, where_)


_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
# what a decorrelated subquery's value may be built of around its one aggregate: arithmetic with numbers
_VALUE_NODES = (exp.Mul, exp.Add, exp.Sub, exp.Neg, exp.Paren, exp.Literal)


def grouped_in(n: Normalizer, cond: exp.Expr, query: exp.Select, x: exp.Expr, exports: Exports) -> SemiJoin:
    """``x IN (SELECT u.k FROM T u WHERE φ(u) GROUP BY u.k HAVING agg(u) <op> c)`` (TPC-H Q18) as the decorrelated
    scalar subquery is (:func:`scalar_join`): D = SELECT u.k, agg AS VALUE FROM T u WHERE φ GROUP BY u.k, and the
    outer row passes when D has a row with u.k = x and VALUE <op> c. The same set of keys: a key is in the IN's
    list iff its group exists and passes HAVING, and D has one row per existing group. The sensitivity argument
    is the scalar join's (docs/subqueries.md): one row of T changes one key's aggregate, so at most the outer
    rows of that key flip (c_D = 1). HAVING must be one comparison of that aggregate with a constant; a HAVING-
    less GROUP BY u.k is the plain IN (D is the set of keys either way)."""
    what = "IN (SELECT … GROUP BY …)"
    for arg, name in (("limit", "LIMIT"), ("offset", "OFFSET"), ("distinct", "DISTINCT")):
        if query.args.get(arg) is not None:
            raise n.refuse(f"{what} with {name} is not analysed", query)
    if query.args.get("with_") or query.args.get("with") or query.args.get("joins"):
        raise n.refuse(
            f"{what} over several tables is not analysed: one changed row could change many of its keys", query
        )
    alias, name, use, scope = _one_table(n, query, exports, what, "analysed")
    if len(query.expressions) != 1:
        raise n.refuse(f"{what}: the subquery must return one column", query)
    item = query.expressions[0]
    k = n._substitute(item.unalias() if isinstance(item, exp.Alias) else item, scope)
    keys = [n._substitute(g, scope) for g in query.args["group"].expressions]
    if not (isinstance(k, exp.Column) and k.table == alias and keys == [k]):
        raise n.refuse(f"{what}: the subquery must return the one column it groups by, a column of its table", query)
    where = query.args.get("where")
    inner = [n._substitute(p, scope) for p in _split(where.this)] if where is not None else []
    if any({c.table for c in p.find_all(exp.Column)} - {alias} for p in inner):
        raise n.refuse(f"{what}: a grouped subquery correlated with the outer query is not analysed", query)
    left = n._substitute(x, exports)
    correlation = (exp.EQ(this=k, expression=left),)
    having = query.args.get("having")
    if having is None:
        n.notes.append(f"IN (SELECT … FROM {name} GROUP BY key) → semi-join with SELECT DISTINCT keys")
        return SemiJoin(use, (k.name,), tuple(inner), correlation, False, "IN", position(n.sql, cond))
    h = having.this.unnest()
    if not isinstance(h, _COMPARISONS):
        raise n.refuse(f"{what}: HAVING must be one comparison of an aggregate with a number", having)
    sides = (h.this, h.expression)
    aggregated = [bool(side.find(exp.AggFunc)) for side in sides]
    if aggregated.count(True) != 1 or any(
        c for side in sides for c in side.find_all(exp.Column) if not side.find(exp.AggFunc)
    ):
        raise n.refuse(f"{what}: HAVING must be one comparison of an aggregate with a number", having)
    agg_side = sides[aggregated.index(True)]
    value = _value(n, agg_side, scope, alias, having)
    column = exp.column(SCALAR_VALUE, table=alias)
    compare = type(h)(
        this=column if aggregated[0] else h.this.copy(), expression=h.expression.copy() if aggregated[0] else column
    )
    n.notes.append(f"IN (SELECT … FROM {name} GROUP BY key HAVING …) → join with a table grouped by its key")
    return SemiJoin(
        use, (k.name,), tuple(inner), correlation, False, "IN", position(n.sql, cond), value=value, compare=compare
    )


def scalar_subquery(cond: exp.Expr) -> tuple[exp.Subquery, exp.Expr] | None:
    """``(subquery, other side)`` for a conjunct ``e <op> (SELECT …)`` or ``(SELECT …) <op> e``, else None."""
    e = cond.unnest()
    if not isinstance(e, _COMPARISONS):
        return None
    for side, other in ((e.expression, e.this), (e.this, e.expression)):
        while isinstance(side, exp.Paren):
            side = side.this
        if isinstance(side, exp.Subquery) and isinstance(side.unnest(), exp.Select):
            return side, other
    return None


def scalar_join(n: Normalizer, cond: exp.Expr, exports: Exports) -> SemiJoin | None:
    """A correlated scalar subquery compared with an outer expression, ``e < (SELECT 0.2 * AVG(u.x) FROM T u
    WHERE φ(u) AND u.k = x(outer))`` (TPC-H Q17), decorrelated into an inner join with the grouped derived table
    D = SELECT u.k, 0.2 * AVG(u.x) AS VALUE FROM T u WHERE φ GROUP BY u.k, and the conjunct e < D.VALUE (NR
    §4.3.6.1 (ii); the argument is in docs/subqueries.md). None when ``cond`` is no such comparison; a refusal
    with the position for one that cannot be decorrelated."""
    found = scalar_subquery(cond)
    if found is None:
        return None
    sub, other = found
    query = sub.unnest()
    assert isinstance(query, exp.Select)
    what = "scalar subquery"
    for arg, name in (("group", "GROUP BY"), ("having", "HAVING"), ("limit", "LIMIT"), ("offset", "OFFSET")):
        if query.args.get(arg) is not None:
            raise n.refuse(f"{what} with {name} is not decorrelated (NR §4.3.6.1 (ii): SELECT agg … WHERE)", query)
    if query.args.get("with_") or query.args.get("with") or query.args.get("joins") or query.args.get("distinct"):
        raise n.refuse(
            f"{what} over several tables is not decorrelated: one changed row could change the value of many keys",
            query,
        )
    alias, name, use, scope = _one_table(n, query, exports, what, "decorrelated")
    if len(query.expressions) != 1:
        raise n.refuse(f"{what}: the subquery must return one column", query)
    item = query.expressions[0]
    value = _value(n, item.unalias() if isinstance(item, exp.Alias) else item, scope, alias, item)
    where = query.args.get("where")
    written_parts = _split(where.this) if where is not None else []
    inner: list[exp.Expr] = []
    correlation: list[exp.Expr] = []
    columns: list[str] = []
    for part in written_parts:
        p = n._substitute(part, scope)
        tables = {c.table for c in p.find_all(exp.Column)}
        if tables <= {alias}:
            inner.append(p)
            continue
        key = _key_equality(p, alias)
        if key is None:
            raise n.refuse(
                f"{what}: only equalities between a column of the subquery's table and outer expressions are "
                f"decorrelated, not {p.sql(dialect='postgres')}",
                part,
            )
        correlation.append(p)
        columns.append(key)
    if not correlation:
        raise n.refuse(
            f"{what}: uncorrelated, so it is a workflow step released on its own before the statement (a "
            "session's run, `sqldp run`, the proxy); this analysis takes one query at a time",
            sub,
        )
    e = cond.unnest()
    column = exp.column(SCALAR_VALUE, table=alias)
    outer = n._substitute(other, exports)
    sub_first = other is e.expression  # (SELECT …) < e keeps its order: < is not symmetric
    compare = type(e)(this=column if sub_first else outer, expression=outer if sub_first else column)
    n.notes.append(f"scalar subquery (SELECT … FROM {name} WHERE … = outer) → join with a table grouped by its keys")
    return SemiJoin(
        use,
        tuple(dict.fromkeys(columns)),
        tuple(inner),
        tuple(correlation),
        False,
        what,
        position(n.sql, cond),
        value=value,
        compare=compare,
    )


def _one_table(
    n: Normalizer, query: exp.Select, exports: Exports, what: str, done: str
) -> tuple[str, str, TableUse, Exports]:
    """The subquery's one catalog table as a fresh use: its alias, table name, use, and the scope its WHERE and
    SELECT list read (the subquery's alias hides an outer one of the same name); refused otherwise."""
    from_ = query.args.get("from_") or query.args.get("from")
    table = from_.this if from_ is not None else None
    if not isinstance(table, exp.Table) or table.args.get("db") or table.name.lower() not in n.catalog.tables:
        raise n.refuse(f"{what}: only a subquery reading one table of the catalog is {done}", query)
    if table.name.lower() in n.ctes:
        raise n.refuse(f"{what}: {table.name!r} names both a WITH query and a table; rename the WITH query", table)
    name = table.name.lower()
    written = table.alias_or_name.lower()
    alias = n._fresh(written)
    n.tables[alias] = name
    mine: dict[str, exp.Expr] = {c: exp.column(c, table=alias) for c in n.catalog.table(name).columns}
    return alias, name, TableUse(alias, name), {**exports, written: mine}


def _key_equality(p: exp.Expr, alias: str) -> str | None:
    """The subquery's column in ``u.k = x(outer)`` (either order), x reading outer columns only; else None."""
    e = p.unnest()
    if not isinstance(e, exp.EQ):
        return None
    for side, other in ((e.this, e.expression), (e.expression, e.this)):
        outer = {c.table for c in other.find_all(exp.Column)}
        if isinstance(side, exp.Column) and side.table == alias and outer and alias not in outer:
            return side.name
    return None


def _value(n: Normalizer, e: exp.Expr, scope: Exports, alias: str, at: exp.Expr) -> exp.Expr:
    """The subquery's value: one AVG, SUM, MIN or MAX of a column of its table, in arithmetic with numbers
    (Q17's 0.2 * AVG(l_quantity)). COUNT is refused: over no rows it is 0, not NULL, and the inner join would
    drop the outer rows whose key has no row instead of comparing them with 0. SUM and AVG of floating point
    columns are refused: PostgreSQL raises an overflow error the data decide (an answer without noise)."""
    aggs = list(e.find_all(exp.AggFunc))
    what = "scalar subquery"
    if len(aggs) != 1 or not isinstance(aggs[0], (exp.Avg, exp.Sum, exp.Min, exp.Max)):
        raise n.refuse(f"{what}: its value must be one AVG, SUM, MIN or MAX (COUNT is 0 over no rows)", at)
    agg = aggs[0]
    for node in e.walk():
        if node is agg or node.find_ancestor(exp.AggFunc) is agg:
            continue
        if not isinstance(node, _VALUE_NODES) or (isinstance(node, exp.Literal) and node.is_string):
            raise n.refuse(f"{what}: its value may combine the aggregate with numbers by + − ×, not {node.key}", at)
    arg = n._substitute(agg.this, scope)
    if not (isinstance(arg, exp.Column) and arg.table == alias):
        raise n.refuse(f"{what}: its aggregate must read one column of its table", at)
    column = n.catalog.table(n.tables[alias]).column(arg.name)
    exact = column.kind == "integer" or column.type_sql.upper().startswith(("NUMERIC", "DECIMAL"))
    if isinstance(agg, (exp.Avg, exp.Sum)) and not exact:
        raise n.refuse(f"{what}: {agg.key.upper()} of {column.type_sql} may overflow (an error the data decide)", at)
    out = e.copy()
    next(out.find_all(exp.AggFunc)).set("this", arg)
    return out


def _not_null(n: Normalizer, left: exp.Expr, k: exp.Column, at: exp.Expr) -> None:
    """x NOT IN (SELECT k …) is NOT EXISTS (… AND k = x) only when neither side can be NULL (module docstring)."""
    for side in (left, k):
        column = None
        if isinstance(side, exp.Column) and side.table:
            table = n.tables.get(side.table)
            column = n.catalog.table(table).columns.get(side.name) if table is not None else None
        if column is None or column.nullable:
            shown = side.sql(dialect="postgres")
            raise n.refuse(
                f"NOT IN (SELECT …): {shown} may be NULL, and then NOT IN is not NOT EXISTS (a NULL in the "
                "subquery makes NOT IN false for every row); write NOT EXISTS (…) or declare the column NOT NULL",
                at,
            )


def _split(e: exp.Expr) -> list[exp.Expr]:
    e = e.unnest()
    return [*_split(e.this), *_split(e.expression)] if isinstance(e, exp.And) else [e]


def flat(form: AnalysisForm, sensitive: Callable[[str, str], bool]) -> AnalysisForm:
    """The form with each semi-join's use and conditions put into the product: what the checks that look at
    every column and expression the statement evaluates (value-sensitive reads, PostgreSQL failures) need.
    Not a query with the same value — only for those checks."""
    if not form.semijoins:
        return form
    extra = []
    for s in form.semijoins:
        for e in (*s.inner, *s.correlation, *_evaluated(s)):
            cols = frozenset(ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table)
            private = any(sensitive(form.use(r.alias).table, r.column) for r in cols)
            extra.append(Conjunct(e, cols, private))
    return dataclasses.replace(
        form,
        uses=(*form.uses, *(s.use for s in form.semijoins)),
        conjuncts=(*form.conjuncts, *extra),
        semijoins=(),
    )


def _evaluated(s: SemiJoin) -> tuple[exp.Expr, ...]:
    """A decorrelated scalar subquery's comparison as the checks see it: D's VALUE replaced by the value's
    expression over one row (the aggregate by its argument), so the columns it reads and the arithmetic it
    does are checked like any conjunct's (value-sensitive reads, PostgreSQL failures)."""
    if s.value is None or s.compare is None:
        return ()
    per_row = s.value.copy().transform(lambda node: node.this.copy() if isinstance(node, exp.AggFunc) else node)

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == s.use.alias and node.name == SCALAR_VALUE:
            return exp.Paren(this=per_row.copy())
        return node

    return (s.compare.copy().transform(swap),)


@dataclass(frozen=True)
class ValueSteps:
    """What a semi-join reads of the value-sensitive columns (value-level privacy, NR §3.3.8; the argument is in
    docs/subqueries.md, "Under value-level privacy"): ``inner``, the columns of the subquery's table its own
    conditions or its value read — a changed value there moves the subquery's answer for its key only, a step
    for the outer rows with that key; ``outer``, the outer columns a decorrelated scalar subquery's comparison
    reads — a step of the outer row's own indicator."""

    semi: SemiJoin
    inner: frozenset[ColumnRef]
    outer: frozenset[ColumnRef]


def value_steps(form: AnalysisForm, sensitive: Callable[[ColumnRef], bool]) -> tuple[ValueSteps, ...]:
    """The value-sensitive columns each semi-join compares by a step, refused with the reason and position when
    a correlation (the keys tying D to the outer rows, or a condition between them) reads one: a changed value
    there moves a row of T to another key, or an outer row to another row of D, which the per-key count of the
    argument does not bound."""
    out = []
    for s in form.semijoins:
        for e in s.correlation:
            read = sorted({str(r) for r in _refs(e) if sensitive(r)})
            if read:
                raise RefusedError(
                    f"{s.source} (SELECT … FROM {s.use.table}): its correlation {e.sql(dialect='postgres')} reads "
                    f"value-sensitive {', '.join(read)}; a changed value would move a row to another key, which the "
                    "value-level analysis of subqueries (per-key counts, NR §3.3.8.5 steps) does not bound",
                    where=s.where,
                )
        own = [*s.inner, *((s.value,) if s.value is not None else ())]
        inner = frozenset(r for e in own for r in _refs(e) if sensitive(r))
        outer = frozenset(
            r for r in (_refs(s.compare) if s.compare is not None else ()) if r.alias != s.use.alias and sensitive(r)
        )
        out.append(ValueSteps(s, inner, outer))
    return tuple(out)


def _refs(e: exp.Expr) -> set[ColumnRef]:
    return {ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table}


def refuse_outside_rows(form: AnalysisForm, why: str) -> None:
    """Only the row-level and value-level analyses model the semi-joins: refuse the others (privacy units)."""
    if form.semijoins:
        s = form.semijoins[0]
        raise RefusedError(
            f"{s.source} (SELECT … FROM {s.use.table}) is analysed under row- and value-level privacy only "
            f"(NR §3.3.7, §3.3.8): {why}",
            where=s.where,
        )


def private_tables(form: AnalysisForm, policy: Policy) -> frozenset[str]:
    """The tables with private rows the semi-joins read."""
    return frozenset(s.use.table for s in form.semijoins if policy.table(s.use.table).rows_private)


def ctes_of(tree: exp.Expr) -> dict[str, exp.Expr]:
    """Every CTE body in the statement by name (all scopes together: a superset of what a reference means)."""
    out: dict[str, exp.Expr] = {}
    for cte in tree.find_all(exp.CTE):
        name = cte.alias_or_name.lower()
        out[name] = exp.Tuple(expressions=[out[name].copy(), cte.this.copy()]) if name in out else cte.this
    return out


def expression_subqueries(tree: exp.Expr) -> list[exp.Expr]:
    """The outermost subqueries in expression positions (SELECT list, WHERE, HAVING, GROUP BY, ORDER BY, IN,
    EXISTS, ANY, function arguments), as opposed to FROM/JOIN items, CTE bodies and set-operation operands."""
    found: list[exp.Expr] = []
    for node in tree.walk(bfs=True):
        if not isinstance(node, exp.Query) or node is tree or _inside(node, found):
            continue
        child: exp.Expr = node
        parent = node.parent
        while isinstance(parent, (exp.Subquery, exp.Paren)):
            child, parent = parent, parent.parent
        if parent is None or isinstance(parent, (exp.From, exp.Join, exp.CTE, exp.SetOperation)):
            continue
        found.append(child)
    return found


def _inside(node: exp.Expr, outer: list[exp.Expr]) -> bool:
    parent = node.parent
    while parent is not None:
        if any(parent is o for o in outer):
            return True
        parent = parent.parent
    return False


# -- uncorrelated scalar subqueries: released constants (a workflow of steps, NR §3.2.1.1) ---------------------


@dataclass(frozen=True)
class ScalarStep:
    """An uncorrelated scalar subquery of a statement, answered on its own before the statement: ``sql`` is its
    text with everything before it blanked (newlines kept), so a refusal's ``query:LINE:COL`` is the position in
    the statement; ``start``/``end`` delimit its parentheses there."""

    start: int
    end: int  # one past the closing parenthesis
    sql: str
    where: str

    def splice(self, statement: str, value: float | None) -> str:
        """``statement`` with this subquery replaced by ``value`` — a number, or NULL — padded with the newlines
        and blanks the subquery held, so every later position in the statement stays where it was."""
        text = "(NULL)" if value is None else f"({_number(value)})"
        held = statement[self.start : self.end]
        lines = held.count("\n")
        tail = len(held) - (held.rfind("\n") + 1) if lines else len(held)
        pad = "\n" * lines + " " * max(0, tail - (len(text) if not lines else 0))
        if not lines and len(text) > len(held):
            pad = ""
        return statement[: self.start] + text + pad + statement[self.end :]


def _number(value: float) -> str:
    if not math.isfinite(value):
        raise RefusedError(f"a released value {value!r} is not a number SQL can hold")
    return repr(float(value))


def scalar_steps(parsed: ParsedQuery, catalog: Catalog) -> tuple[ScalarStep, ...]:
    """The uncorrelated scalar subqueries in the statement's expressions (outermost ones; not EXISTS, IN or ANY
    operands, not those reading a WITH query of the statement), each with its text. One whose text cannot be
    located exactly (re-parsed and compared with the tree) is left out: the analysis then refuses it."""
    statement = parsed.statement
    if statement is None:
        return ()
    qualified = expression_subqueries(parsed.tree)
    written = expression_subqueries(statement)
    if len(qualified) != len(written):
        return ()
    ctes = set(ctes_of(statement))
    spans = _select_parentheses(parsed.sql)
    out = []
    for q, w in zip(qualified, written, strict=True):
        if not (isinstance(w, exp.Subquery) and isinstance(w.unnest(), exp.Select)):
            continue
        if isinstance(w.parent, (exp.Exists, exp.In, exp.Any, exp.All)) or _correlated(q):
            continue
        if any(t.name.lower() in ctes for t in w.find_all(exp.Table)):
            continue
        span = _span(parsed.sql, w, spans)
        if span is None:
            continue
        start, end = span
        blank = "".join(c if c == "\n" else " " for c in parsed.sql[: start + 1])
        out.append(ScalarStep(start, end, blank + parsed.sql[start + 1 : end - 1], position(parsed.sql, w)))
    return tuple(out)


def _correlated(sub: exp.Expr) -> bool:
    """Whether a qualified subquery reads a column of a table use it does not define itself."""
    own = {t.alias_or_name for t in sub.find_all(exp.Table)}
    own |= {s.alias for s in sub.find_all(exp.Subquery) if s.alias}
    own |= {c.alias_or_name for c in sub.find_all(exp.CTE)}
    return any(c.table and c.table not in own for c in sub.find_all(exp.Column))


def _select_parentheses(sql: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every parenthesis that opens a SELECT or WITH, by the tokenizer (no recursion)."""
    tokens = sqlglot.Dialect.get_or_raise("postgres").tokenize(sql)
    opened: list[int] = []
    out = []
    for i, tok in enumerate(tokens):
        if tok.token_type == TokenType.L_PAREN:
            opened.append(i)
        elif tok.token_type == TokenType.R_PAREN and opened:
            j = opened.pop()
            if j + 1 < len(tokens) and tokens[j + 1].token_type in (TokenType.SELECT, TokenType.WITH):
                out.append((tokens[j].start, tok.end + 1))
    return out


def _span(sql: str, sub: exp.Expr, spans: list[tuple[int, int]]) -> tuple[int, int] | None:
    """The innermost SELECT parenthesis holding every positioned token of ``sub``, if its text parses to
    ``sub``'s query again; else None."""
    starts = [n.meta["start"] for n in sub.walk() if n.meta.get("start") is not None]
    ends = [n.meta["end"] for n in sub.walk() if n.meta.get("end") is not None]
    if not starts or not ends:
        return None
    lo, hi = min(starts), max(ends)
    holding = [(a, b) for a, b in spans if a < lo and hi < b]
    if not holding:
        return None
    start, end = max(holding, key=lambda s: s[0])
    try:
        again = sqlglot.parse_one(sql[start + 1 : end - 1], read="postgres")
    except (ParseError, TokenError):
        return None
    return (start, end) if again == sub.unnest() else None


# -- LEFT OUTER JOIN (NR §4.3.6.1 (ix)) --------------------------------------------------------------------------
#
# (ix) writes ``L LEFT JOIN R ON c`` as the inner join σ_c(L × R) plus the unmatched rows of L (L AND NOT EXISTS
# (SELECT … FROM R WHERE c)) extended with NULLs for R's columns. Two cases make one of the two parts vanish on
# every database, so the query is one of the flat forms the analyses already cover (docs/subqueries.md, "LEFT
# OUTER JOIN"):
#
# * the enclosing WHERE rejects the NULL-extended rows: a conjunct that is NULL or false whenever R's columns are
#   all NULL (strict in a column of R, as PostgreSQL's planner reduces outer joins, reduce_outer_joins). Every
#   unmatched row fails it, so the union is the inner join alone: σ_c(L × R) under that WHERE.
# * c contains equalities l = r.k over a key of R (PRIMARY KEY or UNIQUE, enforced by PostgreSQL) and nothing
#   outside c reads R: every row of L meets at most one row of R, so the union holds each row of L exactly once
#   (matched or NULL-extended), and what the query reads of it is L's own columns: the query over L alone.
# * the query has no GROUP BY and every aggregate's argument is NULL on the NULL-extended rows (SUM(r.x),
#   COUNT(r.x), AVG(r.x + l.y), …; not COUNT(*), nor an aggregate of L's columns): SQL's aggregates skip NULLs,
#   so the unmatched part adds nothing to any of them, and the answer is the inner join's (checked on the form
#   by :func:`skips_unmatched`).
#
# Any other LEFT JOIN (both parts non-empty and read) is refused: the sum of the two parts' analyses is not built.


class ReadsEliminated(RefusedError):
    """A LEFT JOIN's right table left out (the second case above) is read after all: the normaliser analyses the
    statement again with that join kept (the third case), which refuses if it does not apply either."""

    def __init__(self, message: str, where: str, join: int) -> None:
        super().__init__(message, where=where)
        self.join = join


GENERAL = (
    "{kind} JOIN: analysed when WHERE rejects its NULL-extended rows (a condition on the right table that NULL "
    "fails: it is then the inner join), when ON equates a key of the right table and nothing else reads that "
    "table (the left side alone), or, without GROUP BY, when every aggregate reads a column of the right table "
    "that makes it skip the NULL-extended rows (not COUNT(*)); the sum of the inner join and the unmatched rows "
    "(NR §4.3.6.1 (ix)) is not analysed"
)


@dataclass(frozen=True)
class NullExtended:
    """A LEFT JOIN analysed as its inner join on the condition that the unmatched part adds nothing (the third
    case above): ``alias`` is the right table's use in the form."""

    alias: str
    kind: str
    where: str


def skips_unmatched(form: AnalysisForm, joins: list[NullExtended]) -> None:
    """Refuse unless every aggregate of ``form`` skips the NULL-extended rows of each join in ``joins`` and there
    is no GROUP BY (a group of unmatched rows only would exist over the LEFT JOIN and not over the inner join)."""
    for j in joins:
        skipped = all(a.arg is not None and null_when(a.arg, frozenset({j.alias})) for a in form.aggregates)
        if form.group_by or form.distinct_rows or not skipped:
            raise RefusedError(GENERAL.format(kind=j.kind), where=j.where)


# operators that yield NULL when this operand is NULL (PostgreSQL's strict operators over their operands)
_STRICT_BINARY = (
    exp.EQ,
    exp.NEQ,
    exp.LT,
    exp.LTE,
    exp.GT,
    exp.GTE,
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.Mod,
    exp.Like,
    exp.ILike,
    exp.DPipe,
)


def null_when(e: exp.Expr, aliases: frozenset[str]) -> bool:
    """Whether ``e`` is NULL whenever every column of the uses ``aliases`` is NULL (conservative: False for
    anything not listed, e.g. IS NULL, COALESCE, CASE, functions, OR)."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Column):
        return e.table in aliases
    if isinstance(e, _STRICT_BINARY):
        return null_when(e.this, aliases) or null_when(e.expression, aliases)
    if isinstance(e, (exp.Neg, exp.Not, exp.Cast, exp.Between)):
        # BETWEEN is NULL when its operand is; a NULL bound may give false instead (then NOT would pass the row)
        return null_when(e.this, aliases)
    if isinstance(e, exp.In) and e.args.get("query") is None and not e.args.get("unnest"):
        return null_when(e.this, aliases)
    return False


def rejects_null(e: exp.Expr, aliases: frozenset[str]) -> bool:
    """Whether the WHERE conjunct ``e`` is never true when every column of ``aliases`` is NULL."""
    e = e.unnest()
    if isinstance(e, exp.And):
        return rejects_null(e.this, aliases) or rejects_null(e.expression, aliases)
    if isinstance(e, exp.Or):
        return rejects_null(e.this, aliases) and rejects_null(e.expression, aliases)
    return null_when(e, aliases)


def _exported(node: ra.Node) -> frozenset[str]:
    """The aliases a FROM item shows the enclosing query (the columns a LEFT JOIN NULL-extends)."""
    if isinstance(node, (ra.Relation, ra.Rename)):
        return frozenset({node.alias})
    if isinstance(node, ra.OuterJoin):
        return _exported(node.left) | _exported(node.right)
    return frozenset(a for child in ra.children(node) for a in _exported(child))


def left_join(
    n: Normalizer, node: ra.OuterJoin, above: tuple[exp.Expr, ...], keep: bool
) -> tuple[ra.Node, ra.Relation | None, bool]:
    """``(what to analyse, eliminated, conditional)`` for a LEFT OUTER JOIN under the WHERE conjuncts ``above`` (as
    written): the inner join when one of them rejects the NULL-extended rows; the left side alone when the join
    meets at most one row of R per row of L and ``keep`` is False (``eliminated`` is R: nothing may read it); else,
    when R is a table, the inner join with ``conditional`` True (the form must pass :func:`skips_unmatched`).
    Refused for RIGHT, FULL and other joins. The argument is the comment above."""
    where = position(n.sql, node.condition) if node.condition is not None else "query"
    if node.kind.upper() not in ("LEFT", "LEFT OUTER"):
        raise RefusedError(
            f"{node.kind} JOIN is not supported: inner joins and LEFT [OUTER] JOIN have a sensitivity analysis "
            "(NR §3.3.7.2, §4.3.6.1 (ix))",
            where=where,
        )
    if node.condition is None:
        raise RefusedError("LEFT JOIN without ON is not supported", where=where)
    on = _split(node.condition)
    right = _exported(node.right)
    rejecting = next((c for c in above if rejects_null(c, right)), None)
    if rejecting is not None:
        n.notes.append(
            f"LEFT JOIN → inner join: WHERE {rejecting.sql(dialect='postgres')} rejects its NULL-extended rows"
        )
        return _inner(node), None, False
    r = node.right
    if not isinstance(r, ra.Relation):
        raise RefusedError(GENERAL.format(kind=node.kind), where=where)
    if not keep and n.catalog.enforced and _at_most_one(n, node.left, r, on):
        n.notes.append(
            f"LEFT JOIN {r.table} on a key of {r.table}: every row of the left side is kept once and nothing else "
            f"reads {r.table} → the left side alone"
        )
        return node.left, r, False
    n.notes.append(f"LEFT JOIN {r.table} → inner join: the aggregates skip its NULL-extended rows (no GROUP BY)")
    return _inner(node), None, True


def _inner(node: ra.OuterJoin) -> ra.Node:
    assert node.condition is not None
    left = node.left.children if isinstance(node.left, ra.Product) else (node.left,)
    return ra.Select(node.condition, ra.Product((*left, node.right)))


def _at_most_one(n: Normalizer, left: ra.Node, r: ra.Relation, on: list[exp.Expr]) -> bool:
    """Whether the conjuncts ``on`` equate every column of a key of R (its PRIMARY KEY or a UNIQUE constraint)
    with a column of the left side of the same type: then a row of the left side matches at most one row of R.
    Same type, no COLLATE: an equality that casts R's key (bigint to double precision) or compares it under
    another collation could match two distinct keys."""
    table = n.catalog.table(r.table)
    by_alias = {x.alias: x.table for x in ra.relations(left) if x.alias in _exported(left)}
    keyed: set[str] = set()
    for c in on:
        e = c.unnest()
        if not isinstance(e, exp.EQ):
            continue
        for mine, other in ((e.this, e.expression), (e.expression, e.this)):
            if not (isinstance(mine, exp.Column) and mine.table == r.alias and isinstance(other, exp.Column)):
                continue
            source = by_alias.get(other.table)
            if source is None or other.name not in n.catalog.table(source).columns:
                continue
            theirs = n.catalog.table(source).column(other.name)
            if mine.name in table.columns and theirs.type_sql.upper() == table.column(mine.name).type_sql.upper():
                keyed.add(mine.name)
    keys = [k for k in (table.primary_key, *table.unique) if k]
    return any(set(k) <= keyed for k in keys)
