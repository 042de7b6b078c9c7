"""Nested aggregation as the normaliser recognises it (sqldp.normalize): the histogram of per-key counts
(TPC-H Q13), whose analysis and SQL are :mod:`sqldp.strategies.nested`'s (the lemma and its proof are there), and
aggregates of per-key aggregates written as the flat query they equal (:func:`flatten`).

Pure: no database. :func:`histogram` recognises the shape on the front end's algebra and builds the analysis form
(:class:`sqldp.form.PerKeyCounts` its inner aggregation); the normaliser is passed as :class:`Normalising`, the
few things of it these functions read.
"""

from __future__ import annotations

from typing import Protocol

from sqlglot import exp

from sqldp import algebra as ra
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import BUCKET, Aggregate, AnalysisForm, Conjunct, OrderKey, Output, PerKeyCounts, TableUse, placeholder
from sqldp.frontend import conjuncts
from sqldp.policy import Policy
from sqldp.sensitivity import failures
from sqldp.sensitivity.intervals import domain
from sqldp.sensitivity.units import unit_tables


class Normalising(Protocol):
    """What :func:`histogram` and :func:`flatten` read of the normaliser (sqldp.normalize.Normalizer)."""

    catalog: Catalog
    policy: Policy
    notes: list[str]

    def _order(
        self, sort: ra.Sort, outputs: tuple[Output, ...], body: ra.Aggregate
    ) -> tuple[tuple[OrderKey, ...], int | None]: ...


def refuse(why: str) -> RefusedError:
    return RefusedError(f"nested aggregation (a histogram of per-key counts, TPC-H Q13's shape): {why}")


def _columns(e: exp.Expr) -> set[tuple[str, str]]:
    return {(c.table, c.name) for c in e.find_all(exp.Column)}


def histogram(normalizer: Normalising, body: ra.Aggregate, sort: ra.Sort | None) -> AnalysisForm | None:
    """The analysis form of a histogram of per-key counts, or None when ``body`` does not aggregate a derived
    table that aggregates (the normaliser's own refusal then stands). A query of that outer shape that is not
    the one analysed here is refused with what differs."""
    child = body.child
    if not (isinstance(child, ra.Rename) and isinstance(child.child, ra.Aggregate)):
        return None
    inner, alias = child.child, child.alias
    counts = [(name, e) for name, e in inner.items if isinstance(e, exp.Count)]
    if len(counts) != 1 or inner.having is not None or len(inner.groups) != 1:
        raise refuse("the derived table must be GROUP BY one column with one COUNT and no HAVING")
    bucket = counts[0][0]
    (key,) = inner.groups
    if not isinstance(key, exp.Column) or not key.table:
        raise refuse("the derived table's GROUP BY must be one column of a table")
    for name, e in inner.items:
        if not isinstance(e, exp.Count) and e != key:
            raise refuse(f"the derived table's output {name!r} is neither its GROUP BY key nor its COUNT")
    count = counts[0][1]
    arg = count.this
    if isinstance(arg, exp.Distinct):
        raise refuse("COUNT(DISTINCT …) inside is not analysed")
    shape = _join(inner.child, key, None if isinstance(arg, exp.Star) else arg, alias)
    # the outer query: GROUP BY the count, and COUNT(*) (the number of key groups per count)
    if len(body.groups) != 1 or body.having is not None:
        raise refuse("the outer query must be GROUP BY the derived table's count, without HAVING")
    (outer_key,) = body.groups
    if not (isinstance(outer_key, exp.Column) and outer_key.table == alias and outer_key.name == bucket):
        raise refuse(f"the outer query must be GROUP BY {alias}.{bucket}, the derived table's count")
    outputs = []
    for name, e in body.items:
        if e == outer_key:
            outputs.append(Output(name, exp.column(BUCKET), (), group_key=0))
        elif isinstance(e, exp.Count) and isinstance(e.this, exp.Star):
            outputs.append(Output(name, placeholder(0), (0,)))
        else:
            raise refuse(f"output {name!r}: the outer query may select its key and COUNT(*) only")
    _check(normalizer, shape)
    order_by: tuple[OrderKey, ...] = ()
    limit = None
    if sort is not None:
        order_by, limit = normalizer._order(sort, tuple(outputs), body)
    normalizer.notes.append(
        f"derived table {alias} aggregates per {key.name}: its histogram of counts is analysed as one function "
        "(sqldp.strategies.nested: one row moves one key group between two counts, ℓ1 ≤ 2)"
    )
    return AnalysisForm(
        uses=shape.uses,
        conjuncts=(),
        aggregates=(Aggregate("count", None, frozenset()),),
        outputs=tuple(outputs),
        group_by=(exp.column(bucket, table=alias),),
        order_by=order_by,
        limit=limit,
        notes=tuple(normalizer.notes),
        nested=shape,
    )


def flatten(normalizer: Normalising, body: ra.Aggregate) -> ra.Aggregate | None:
    """An aggregate without GROUP BY over a derived table grouped by one key, written as the aggregate of the
    derived table's own rows it equals on every database (the module docstring, "Aggregates of per-key aggregates"),
    or None when ``body`` is not of that outer shape. The flat query is then analysed as any other. Refused with
    the reason when an outer aggregate has no such equal."""
    child = body.child
    if body.groups or not (isinstance(child, ra.Rename) and isinstance(child.child, ra.Aggregate)):
        return None
    inner, alias = child.child, child.alias
    what = f"an aggregate over derived table {alias}, grouped by one key"
    if inner.having is not None or len(inner.groups) != 1 or body.having is not None:
        raise refuse(f"{what}: the derived table must be GROUP BY one column, without HAVING (and no outer HAVING)")
    (key,) = inner.groups
    per_key: dict[str, exp.Expr | None] = {}  # the derived table's outputs: None for the key, else its aggregate
    for name, e in inner.items:
        if e == key:
            per_key[name] = None
        elif isinstance(e, (exp.Count, exp.Sum)) and not isinstance(e.this, exp.Distinct):
            per_key[name] = e
        else:
            raise refuse(f"{what}: its output {name!r} must be its key, a COUNT or a SUM")

    def groups() -> exp.Expr:
        # COUNT(*) over the derived table is its number of rows, one per key value: COUNT(DISTINCT key) when the
        # key cannot be NULL (a NULL key is a group of its own that COUNT(DISTINCT) skips)
        table = (
            next((r.table for r in ra.relations(inner.child) if r.alias == key.table), None)
            if isinstance(key, exp.Column)
            else None
        )
        column = normalizer.catalog.table(table).columns.get(key.name) if table is not None else None
        if column is None or column.nullable:
            raise refuse(
                f"{what}: counting its rows needs the GROUP BY key to be a column declared NOT NULL (a NULL key "
                "is a group COUNT(DISTINCT key) does not count)"
            )
        return exp.Count(this=exp.Distinct(expressions=[key.copy()]))

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == alias:
            raise refuse(f"{what}: {node.sql(dialect='postgres')} is read outside an aggregate")
        if not isinstance(node, exp.AggFunc):
            return node
        arg = node.this
        shown = node.sql(dialect="postgres")
        if isinstance(node, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
            return groups()
        if not (isinstance(arg, exp.Column) and arg.table == alias and arg.name in per_key):
            raise refuse(f"{what}: {shown} must aggregate one output of the derived table")
        per = per_key[arg.name]
        if isinstance(node, exp.Count) and (per is None or isinstance(per, exp.Count)):
            return groups()  # the key and a COUNT are never NULL: COUNT(t.n) counts every row of t
        if isinstance(node, exp.Sum) and per is not None:
            return per.copy()  # the sum over the keys of the sum (count) per key: the sum (count) of all rows
        if isinstance(node, exp.Avg) and isinstance(per, exp.Count):
            return exp.Paren(this=exp.Div(this=per.copy(), expression=groups()))
        raise refuse(
            f"{what}: {shown} is not analysed (SUM, AVG and COUNT of a per-key COUNT, SUM of a per-key SUM, and "
            "COUNT(*) are)"
        )

    items = tuple((name, e.copy().transform(swap)) for name, e in body.items)
    normalizer.notes.append(
        f"derived table {alias} grouped by {key.sql(dialect='postgres')}: its aggregates written over the rows it "
        "groups (SUM of per-key counts = COUNT, COUNT(*) = COUNT(DISTINCT key); sqldp.per_key)"
    )
    return ra.Aggregate((), items, None, inner.child)


def _join(node: ra.Node, key: exp.Column, arg: exp.Expr | None, alias: str) -> PerKeyCounts:
    """The two table uses, the join condition and the filters of the derived table's FROM/WHERE."""
    where: list[exp.Expr] = []
    while isinstance(node, ra.Select):
        where += conjuncts(node.condition)
        node = node.child
    if isinstance(node, ra.Relation):  # one table: each key group counts its own rows
        a = TableUse(node.alias, node.table)
        if key.table != a.alias:
            raise refuse("the GROUP BY key must be a column of the table")
        if arg is not None and not (isinstance(arg, exp.Column) and arg.table == a.alias):
            raise refuse(f"COUNT({arg.sql(dialect='postgres')}): count a column of {a.table}, or COUNT(*)")
        return PerKeyCounts(a, a, key.name, key.name, (), tuple(where), arg, False, alias, joined=False)
    if isinstance(node, ra.OuterJoin):
        if node.kind.upper() not in ("LEFT", "LEFT OUTER"):
            raise refuse(f"{node.kind} JOIN: only LEFT OUTER JOIN (and the inner join) are analysed")
        sides, on, outer = (node.left, node.right), conjuncts(node.condition), True
    elif isinstance(node, ra.Product) and len(node.children) == 2:
        sides, on, outer = (node.children[0], node.children[1]), [], False
    else:
        raise refuse("the derived table must read one table, or two tables joined on its GROUP BY key")
    if not all(isinstance(s, ra.Relation) for s in sides):
        raise refuse("both sides of the join must be tables")
    a, b = (TableUse(s.alias, s.table) for s in sides)  # type: ignore[union-attr]
    if a.table == b.table:  # one row would be both a key group's own row and a counted row of another group
        raise refuse(f"a self-join of {a.table} is not analysed (one row could change two key groups)")
    if key.table != a.alias:
        if outer:
            raise refuse("the GROUP BY key must be a column of the LEFT JOIN's preserved (left) table")
        a, b = b, a
    if key.table != a.alias:
        raise refuse("the GROUP BY key must be a column of one of the two tables")
    if not outer:  # an inner join's conditions are its WHERE's: split by the tables they read
        on, where = (
            [c for c in where if any(t == b.alias for t, _ in _columns(c))],
            [c for c in where if all(t != b.alias for t, _ in _columns(c))],
        )
    foreign = None
    rest = []
    for c in on:
        if foreign is None and isinstance(c, exp.EQ):
            sides_ = (c.this, c.expression)
            for x, y in (sides_, sides_[::-1]):
                if x == key and isinstance(y, exp.Column) and y.table == b.alias:
                    foreign = y.name
            if foreign is not None:
                continue
        rest.append(c)
    if foreign is None:
        raise refuse(f"the join must have the condition {key.sql(dialect='postgres')} = <a column of {b.table}>")
    for c in rest:
        if any(t != b.alias for t, _ in _columns(c)):
            raise refuse(
                f"join condition {c.sql(dialect='postgres')}: besides the key equality, the join may filter "
                f"{b.table} only (a condition reading {a.table} would make a row meet other key groups)"
            )
    for c in where:
        if any(t != a.alias for t, _ in _columns(c)):
            raise refuse(
                f"WHERE {c.sql(dialect='postgres')}: the derived table's WHERE may read {a.table} only (over a LEFT "
                "JOIN, a condition on the other table turns it into an inner join; write it in ON)"
            )
    if arg is not None and not (isinstance(arg, exp.Column) and arg.table == b.alias):
        raise refuse(f"COUNT({arg.sql(dialect='postgres')}): count a column of {b.table}, or COUNT(*)")
    return PerKeyCounts(a, b, key.name, foreign, tuple(rest), tuple(where), arg, outer, alias)


def _check(normalizer: Normalising, shape: PerKeyCounts) -> None:
    """Refuse what the lemma does not cover: value-sensitive columns (a changed value would move a row across
    a filter or between key groups by a step of any size, while a value neighbour may be arbitrarily close,
    NR §3.3.8), and expressions PostgreSQL may fail on (sqldp.sensitivity.failures: an error would answer for
    the data)."""
    policy, catalog = normalizer.policy, normalizer.catalog
    by_alias = {u.alias: u.table for u in shape.uses}
    read = {(shape.preserved.alias, shape.key), (shape.counted.alias, shape.foreign)}
    for e in (*shape.on, *shape.where, *((shape.count_arg,) if shape.count_arg is not None else ())):
        read |= _columns(e)
    for alias, column in sorted(read):
        if policy.is_sensitive(by_alias[alias], column):
            raise refuse(
                f"it reads value-sensitive column {alias}.{column}: a changed value moves a row between counts "
                "by a step, which has no derivative (NR §3.3.8); only row-level changes are analysed here"
            )
    form = _flat(shape)
    if policy.units and unit_tables(form, catalog, policy):
        raise refuse("not analysed under a privacy unit (R2T, sqldp.sensitivity.units)")
    failures.check(form, domain(form, catalog, policy), bounded_sum=False)


def _flat(shape: PerKeyCounts) -> AnalysisForm:
    """The inner query's product and conditions as a form (for the failure checks and the unit test)."""
    key = exp.EQ(
        this=exp.column(shape.key, table=shape.preserved.alias),
        expression=exp.column(shape.foreign, table=shape.counted.alias),
    )
    keys = (key,) if shape.joined else ()
    conjuncts = tuple(Conjunct(c, frozenset(), False) for c in (*keys, *shape.on, *shape.where))
    return AnalysisForm(shape.uses, conjuncts, (), ())
