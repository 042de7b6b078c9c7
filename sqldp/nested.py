"""Nested aggregation: the histogram of per-key counts (TPC-H Q13), with the LEFT OUTER JOIN it needs.

The shape, as analysts write it::

    SELECT c_count, COUNT(*) FROM (
        SELECT a.k, COUNT(b.x) FROM A a LEFT OUTER JOIN B b ON a.k = b.f AND <conditions on b>
        [WHERE <conditions on a>] GROUP BY a.k
    ) AS d (k, c_count)
    GROUP BY c_count

(or the same with an inner join). The inner query gives every key group of A one count; the outer query
counts the groups per count ("how many customers have n orders"). NR §4.3.6.1 rewrites Q13 by hand ((ix): the
outer join as the inner join plus the unmatched rows); here the two levels are analysed together, as one
function of the database, and its ℓ1 sensitivity is data-independent:

**Lemma.** Adding or removing one row of A or B changes the histogram by at most 2 in ℓ1 (1 per unit of
the row's distance: 2/G for a table of weight G, NR §3.3.7).

*Proof.* Every inner group is the set of A rows with one value of a.k together with the B rows they match;
a row of B matches only the group whose key equals its b.f (the join is ``a.k = b.f``, and its other
conditions read b alone), and a row of A belongs to its own key's group. So a neighbouring change alters one
inner group at most: the group's count moves from one bucket to another (−1 in one, +1 in the other: ℓ1 2),
or the group appears or disappears (±1 in one bucket). Removing an A row whose key has no other A row drops
its group, and with it the B rows it matched (they meet no other group: they leave the answer, they do not
move). Value changes: every column the query reads must be outside the policy's norms (checked), so a value
neighbour does not change the answer at all. □

In the unmatched part of the outer join (NR §4.3.6.1 (ix)) a group with no matching B row counts 0 (COUNT of
the NULL-extended row's b.x) or 1 (COUNT(*)); it is one inner group like the others, which is why the LEFT
JOIN needs no term of its own here.

The histogram's keys (the counts) are private values without a declared domain. They are released

* with **DP partition selection** when δ > 0 is allowed (the COUNT(*) of each bucket present in the data, with
  Laplace noise at c/ε, c = 2/G, released only above :func:`sqldp.release.selection_threshold` τ = 1 +
  (c/ε)·ln(1/(2δ)); a neighbouring change makes at most one bucket appear or vanish on each side, with count 1
  there at any weight G, so it passes with probability ½·e^{−(τ−1)ε/c} = δ — Korolova, Kenthapadi, Mishra,
  Ntoulas, "Releasing search queries and clicks privately", WWW 2009; Wilson et al., "Differentially private SQL
  with bounded user contribution", PoPETs 2020), or
* over the **domain 0 … τ** when the policy declares ``max_rows_per = { f = τ }`` on B (docs/truncation.md):
  B is read truncated to τ rows per f, so a group of one A row counts at most τ; a neighbouring change of B
  is then one row in and one out of the same f, i.e. of the same inner group: still ℓ1 ≤ 2. Every bucket
  0 … τ is released with Laplace noise (a count above τ — several A rows sharing a key — is outside the
  domain and never released), pure ε;
* else refused, naming both ways out.

**One table** (``SELECT n, COUNT(*) FROM (SELECT a.k, COUNT(*) AS n FROM A a [WHERE ψ(a)] GROUP BY a.k) d GROUP BY
n``): the lemma with B = A. A row of A belongs to its own key's group only and moves its count by one, so ℓ1 ≤ 2
again; under ``max_rows_per = { k = τ }`` on A every group counts 1 … τ (it has a row), the domain released.

**Aggregates of per-key aggregates** (:func:`flatten`: an outer query without GROUP BY over ``d = SELECT k,
COUNT(x) AS n, SUM(y) AS s FROM … GROUP BY k``). On every database SUM(n) = COUNT(x) and SUM(s) = SUM(y) over d's
FROM/WHERE (the groups partition the rows; both NULL over no row), COUNT(*) = COUNT(n) = COUNT(DISTINCT k) when
k is a column declared NOT NULL (one row of d per key value), and AVG(n) = COUNT(x)/COUNT(DISTINCT k). The query is
written as that flat query and analysed as any other; nothing here bounds it.

Pure: no database. :func:`histogram` recognises the shape (on the front end's algebra) and builds the analysis
form; :func:`compile_histogram` builds its plan, domain and SQL for :meth:`sqldp.session.Session.prepare`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from sqldp import algebra as ra
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import Aggregate, AnalysisForm, Conjunct, OrderKey, Output, TableUse, placeholder
from sqldp.frontend import conjuncts
from sqldp.groups import KeyDomain
from sqldp.params import PrivacyParams
from sqldp.policy import Policy
from sqldp.policy.tables import resolve_name
from sqldp.rewrite import Statements, rewrite
from sqldp.sensitivity import failures
from sqldp.sensitivity.global_bound import GlobalPlan, Truncation
from sqldp.sensitivity.intervals import domain
from sqldp.sensitivity.plan import Plan
from sqldp.sensitivity.units import unit_tables

if TYPE_CHECKING:
    from sqldp.engine import Dialect
    from sqldp.normalize import Normalizer

# the lemma's bound: one row changes the histogram by at most this much in ℓ1 (a key group leaves one count for
# another); tests/release/test_nested_histogram.py runs the mutant with 1 and sees the privacy loss exceed ε
L1_CHANGE = 2.0
BUCKET = "__n"  # the inner query's count: the histogram's key
KEY = "__k"  # the inner query's group key


@dataclass(frozen=True)
class PerKeyCounts:
    """The inner aggregation of a histogram of per-key counts: ``COUNT(count_arg)`` per value of ``key`` (a
    column of ``preserved``) over ``preserved`` joined (``outer``: LEFT OUTER) to ``counted`` on ``key =
    foreign`` and ``on`` (conditions on ``counted``), under ``where`` (conditions on ``preserved``)."""

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


def _refuse(why: str) -> RefusedError:
    return RefusedError(f"nested aggregation (a histogram of per-key counts, TPC-H Q13's shape): {why}")


def _columns(e: exp.Expr) -> set[tuple[str, str]]:
    return {(c.table, c.name) for c in e.find_all(exp.Column)}


def histogram(normalizer: Normalizer, body: ra.Aggregate, sort: ra.Sort | None) -> AnalysisForm | None:
    """The analysis form of a histogram of per-key counts, or None when ``body`` does not aggregate a derived
    table that aggregates (the normaliser's own refusal then stands). A query of that outer shape that is not
    the one analysed here is refused with what differs."""
    child = body.child
    if not (isinstance(child, ra.Rename) and isinstance(child.child, ra.Aggregate)):
        return None
    inner, alias = child.child, child.alias
    counts = [(name, e) for name, e in inner.items if isinstance(e, exp.Count)]
    if len(counts) != 1 or inner.having is not None or len(inner.groups) != 1:
        raise _refuse("the derived table must be GROUP BY one column with one COUNT and no HAVING")
    bucket = counts[0][0]
    (key,) = inner.groups
    if not isinstance(key, exp.Column) or not key.table:
        raise _refuse("the derived table's GROUP BY must be one column of a table")
    for name, e in inner.items:
        if not isinstance(e, exp.Count) and e != key:
            raise _refuse(f"the derived table's output {name!r} is neither its GROUP BY key nor its COUNT")
    count = counts[0][1]
    arg = count.this
    if isinstance(arg, exp.Distinct):
        raise _refuse("COUNT(DISTINCT …) inside is not analysed")
    shape = _join(inner.child, key, None if isinstance(arg, exp.Star) else arg, alias)
    # the outer query: GROUP BY the count, and COUNT(*) (the number of key groups per count)
    if len(body.groups) != 1 or body.having is not None:
        raise _refuse("the outer query must be GROUP BY the derived table's count, without HAVING")
    (outer_key,) = body.groups
    if not (isinstance(outer_key, exp.Column) and outer_key.table == alias and outer_key.name == bucket):
        raise _refuse(f"the outer query must be GROUP BY {alias}.{bucket}, the derived table's count")
    outputs = []
    for name, e in body.items:
        if e == outer_key:
            outputs.append(Output(name, exp.column(BUCKET), (), group_key=0))
        elif isinstance(e, exp.Count) and isinstance(e.this, exp.Star):
            outputs.append(Output(name, placeholder(0), (0,)))
        else:
            raise _refuse(f"output {name!r}: the outer query may select its key and COUNT(*) only")
    _check(normalizer, shape)
    order_by: tuple[OrderKey, ...] = ()
    limit = None
    if sort is not None:
        order_by, limit = normalizer._order(sort, tuple(outputs), body)
    normalizer.notes.append(
        f"derived table {alias} aggregates per {key.name}: its histogram of counts is analysed as one function "
        "(sqldp.nested: one row moves one key group between two counts, ℓ1 ≤ 2)"
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


def flatten(normalizer: Normalizer, body: ra.Aggregate) -> ra.Aggregate | None:
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
        raise _refuse(f"{what}: the derived table must be GROUP BY one column, without HAVING (and no outer HAVING)")
    (key,) = inner.groups
    per_key: dict[str, exp.Expr | None] = {}  # the derived table's outputs: None for the key, else its aggregate
    for name, e in inner.items:
        if e == key:
            per_key[name] = None
        elif isinstance(e, (exp.Count, exp.Sum)) and not isinstance(e.this, exp.Distinct):
            per_key[name] = e
        else:
            raise _refuse(f"{what}: its output {name!r} must be its key, a COUNT or a SUM")

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
            raise _refuse(
                f"{what}: counting its rows needs the GROUP BY key to be a column declared NOT NULL (a NULL key "
                "is a group COUNT(DISTINCT key) does not count)"
            )
        return exp.Count(this=exp.Distinct(expressions=[key.copy()]))

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == alias:
            raise _refuse(f"{what}: {node.sql(dialect='postgres')} is read outside an aggregate")
        if not isinstance(node, exp.AggFunc):
            return node
        arg = node.this
        shown = node.sql(dialect="postgres")
        if isinstance(node, exp.Count) and (arg is None or isinstance(arg, exp.Star)):
            return groups()
        if not (isinstance(arg, exp.Column) and arg.table == alias and arg.name in per_key):
            raise _refuse(f"{what}: {shown} must aggregate one output of the derived table")
        per = per_key[arg.name]
        if isinstance(node, exp.Count) and (per is None or isinstance(per, exp.Count)):
            return groups()  # the key and a COUNT are never NULL: COUNT(t.n) counts every row of t
        if isinstance(node, exp.Sum) and per is not None:
            return per.copy()  # the sum over the keys of the sum (count) per key: the sum (count) of all rows
        if isinstance(node, exp.Avg) and isinstance(per, exp.Count):
            return exp.Paren(this=exp.Div(this=per.copy(), expression=groups()))
        raise _refuse(
            f"{what}: {shown} is not analysed (SUM, AVG and COUNT of a per-key COUNT, SUM of a per-key SUM, and "
            "COUNT(*) are)"
        )

    items = tuple((name, e.copy().transform(swap)) for name, e in body.items)
    normalizer.notes.append(
        f"derived table {alias} grouped by {key.sql(dialect='postgres')}: its aggregates written over the rows it "
        "groups (SUM of per-key counts = COUNT, COUNT(*) = COUNT(DISTINCT key); sqldp.nested)"
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
            raise _refuse("the GROUP BY key must be a column of the table")
        if arg is not None and not (isinstance(arg, exp.Column) and arg.table == a.alias):
            raise _refuse(f"COUNT({arg.sql(dialect='postgres')}): count a column of {a.table}, or COUNT(*)")
        return PerKeyCounts(a, a, key.name, key.name, (), tuple(where), arg, False, alias, joined=False)
    if isinstance(node, ra.OuterJoin):
        if node.kind.upper() not in ("LEFT", "LEFT OUTER"):
            raise _refuse(f"{node.kind} JOIN: only LEFT OUTER JOIN (and the inner join) are analysed")
        sides, on, outer = (node.left, node.right), conjuncts(node.condition), True
    elif isinstance(node, ra.Product) and len(node.children) == 2:
        sides, on, outer = (node.children[0], node.children[1]), [], False
    else:
        raise _refuse("the derived table must read one table, or two tables joined on its GROUP BY key")
    if not all(isinstance(s, ra.Relation) for s in sides):
        raise _refuse("both sides of the join must be tables")
    a, b = (TableUse(s.alias, s.table) for s in sides)  # type: ignore[union-attr]
    if a.table == b.table:  # one row would be both a key group's own row and a counted row of another group
        raise _refuse(f"a self-join of {a.table} is not analysed (one row could change two key groups)")
    if key.table != a.alias:
        if outer:
            raise _refuse("the GROUP BY key must be a column of the LEFT JOIN's preserved (left) table")
        a, b = b, a
    if key.table != a.alias:
        raise _refuse("the GROUP BY key must be a column of one of the two tables")
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
        raise _refuse(f"the join must have the condition {key.sql(dialect='postgres')} = <a column of {b.table}>")
    for c in rest:
        if any(t != b.alias for t, _ in _columns(c)):
            raise _refuse(
                f"join condition {c.sql(dialect='postgres')}: besides the key equality, the join may filter "
                f"{b.table} only (a condition reading {a.table} would make a row meet other key groups)"
            )
    for c in where:
        if any(t != a.alias for t, _ in _columns(c)):
            raise _refuse(
                f"WHERE {c.sql(dialect='postgres')}: the derived table's WHERE may read {a.table} only (over a LEFT "
                "JOIN, a condition on the other table turns it into an inner join; write it in ON)"
            )
    if arg is not None and not (isinstance(arg, exp.Column) and arg.table == b.alias):
        raise _refuse(f"COUNT({arg.sql(dialect='postgres')}): count a column of {b.table}, or COUNT(*)")
    return PerKeyCounts(a, b, key.name, foreign, tuple(rest), tuple(where), arg, outer, alias)


def _check(normalizer: Normalizer, shape: PerKeyCounts) -> None:
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
            raise _refuse(
                f"it reads value-sensitive column {alias}.{column}: a changed value moves a row between counts "
                "by a step, which has no derivative (NR §3.3.8); only row-level changes are analysed here"
            )
    form = _flat(shape)
    if policy.units and unit_tables(form, catalog, policy):
        raise _refuse("not analysed under a privacy unit (R2T, sqldp.sensitivity.units)")
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


def compile_histogram(
    form: AnalysisForm,
    catalog: Catalog,
    policy: Policy,
    params: PrivacyParams,
    dialect: Dialect,
) -> tuple[AnalysisForm, tuple[KeyDomain, ...], tuple[Plan, ...], Statements]:
    """The plan (a global ℓ1 bound, the module's lemma), the bucket domain (partition selection, or 0 … τ
    under a declared contribution bound) and the SQL of a histogram of per-key counts; refused when neither
    release of the buckets applies. Decided from the query, the policy and the privacy parameters only."""
    shape = form.nested
    assert shape is not None
    weights = [policy.table(u.table).weight for u in form.uses if not policy.table(u.table).public]
    bound = L1_CHANGE / min(weights)
    terms = {
        u.table: {
            "sensitivity": L1_CHANGE / policy.table(u.table).weight,
            "weight": policy.table(u.table).weight,
            "method": "sqldp.nested (ℓ1 ≤ 2 per row)",
        }
        for u in form.uses
        if not policy.table(u.table).public
    }
    truncations: tuple[Truncation, ...] = ()
    if params.delta:
        form = dataclasses.replace(form, select_by=0)
        domains = (KeyDomain(None, None, private=True),)
    else:
        counted = catalog.table(shape.counted.table)
        tau = None
        for declared, t in policy.table(shape.counted.table).max_rows_per.items():
            if resolve_name(declared, counted.columns, f"tables.{counted.name}.max_rows_per") == shape.foreign:
                tau = t
        if tau is None or policy.table(shape.counted.table).public:
            raise _refuse(
                f"the counts are private values with no declared domain: allow δ > 0 (--mechanism laplace --delta "
                f"D) for DP partition selection of the counts present, or declare a contribution bound "
                f"(tables.{shape.counted.table}.max_rows_per = {{ {shape.foreign} = τ }}) for the domain 0 … τ"
            )
        truncations = (Truncation(shape.counted.table, shape.foreign, tau),)
        # a key group of one table has a row, so COUNT(*) is at least 1 there; through a join (or COUNT(x) of a
        # column that may be NULL) a group may count 0
        low = 1 if not shape.joined and shape.count_arg is None else 0
        domains = (KeyDomain(tuple(range(low, tau + 1)), None),)
        form = dataclasses.replace(
            form, notes=(*form.notes, f"counts released over {low} … {tau}: {truncations[0]} (declared max_rows_per)")
        )
    if not dialect.histogram_partition_selection and params.delta:  # after the refusals not of the engine
        # the domain 0 … τ runs on Spark (the truncation keeps PostgreSQL's rows, sqldp.rewrite.total_order);
        # partition selection of the counts present has not been compared with PostgreSQL there
        raise _refuse("DP partition selection of the counts runs on PostgreSQL only (declare max_rows_per for Spark)")
    # a bucket that exists on one side only holds one inner group (the lemma): its count is 1 at any weight
    plan = GlobalPlan(form, form.aggregates[0], bound, terms, truncations=truncations, one_sided=1.0)
    derived = exp.Subquery(this=shape.inner(), alias=exp.TableAlias(this=exp.to_identifier(shape.alias)))
    bucket = exp.column(BUCKET, table=shape.alias)
    answer = (
        exp.select(exp.alias_(bucket.copy(), "__key0"), exp.alias_(exp.Count(this=exp.Star()), "__agg0"))
        .from_(derived)
        .group_by(bucket)
    )
    statements = rewrite(form, answer, (plan,), domains, catalog, policy, dialect)
    return form, domains, (plan,), statements
