"""Groups owned by one row: DP partition selection where the group key fixes a row of a private table.

TPC-H Q10 groups by ``c_custkey`` (and the customer's other columns, ``c_acctbal`` among them, a value in the
customer's norm): each group is one customer. The count-based partition selection of
:func:`sqldp.groups.partition_selection` needs a count whose change a neighbour bounds on every database, and
one customer's count (its order lines) is unbounded; its ``c_acctbal`` key would leak the balance under
value-level privacy. Neither matters once the group *owns* the customer's row:

**Owned uses.** A use u of the product is *determined* by the group key when an enforced key of u's table
(PRIMARY KEY, UNIQUE NOT NULL: :func:`sqldp.sensitivity.model_check.keys_of`) lies in the closure of the
plain-column group keys under the WHERE's column equalities and the uses already determined (Q10:
``c_custkey`` → customer → ``c_nationkey = n_nationkey`` → nation). Every product row of one group then
holds the same row of u, on every database that satisfies the keys (the neighbour relation's databases,
docs/sql.md, "Keys stop the growth").

**The argument** (docs/sql.md, "Groups owned by one row"). Let O be the determined uses and K the others.
Conditions, checked on the query's text, the catalog and the policy (a refusal names the one that fails):

1. the aggregates read no column of O;
2. a conjunct that reads a column of O reads no value-sensitive column of K, and one that reads a
   value-sensitive column of O reads columns of O only;
3. every group-key column equals (by the WHERE's equalities) a column of O;
4. a subquery's (semi-join's) correlation fixes the group key through equalities and reads O only through
   columns equal to K's (the bound form reads those); no privacy unit (R2T's neighbours differ in many rows);
5. each row of a private table t — or of a public table with values in a norm — lies in at most G_t groups:
   the closure of one of its uses' columns covers every group-key column (Q10: an order fixes its customer, a
   line its order), G_t = 1 per use, or τ per step through a declared ``max_rows_per = { k = τ }`` on a table
   of O that the answer reads truncated (Q3: a customer's at most 64 orders; docs/truncation.md); a subquery's
   table adds the groups its correlation reaches;
6. each use of O is determined by the columns of K (so a row of the product without O extends to at most
   one row with it).

Take neighbours x, x′ (one row added, removed, or its sensitive values changed) and call a group *common*
when it is present in both with the same key. For a row r of a table of O: every product row that holds r
is in a group whose O-row is r (condition 5 and ownership), so the groups that do not own r keep their rows;
a group that owns r either keeps rows whose aggregated values do not change (1), keeps or loses all of its
rows together (2: a conjunct on r's sensitive values reads owned rows alone), or gets a new key (a relabel).
So r's change leaves every common group's values as they were and adds or removes at most 2·G groups (with a
truncation, r's groups and those of the one row it evicts or brings back, an owned row of the same table).
For a row of a table of K — which must lie in one group (G = 1) — at most 2 groups appear or disappear, and the
common groups' values change, in that one group, by at most
what the *bound form* — the query without O, its conjuncts and its keys — bounds: each product row holding
the changed row is one of the bound form's rows extended in at most one way (6), its aggregated values the
same (1) and the dropped conjuncts' factor constant in {0, 1} under that change (2). The bound form reads no
column of O, so its smooth bound is unchanged by O's changes and stays β-smooth (NR Def. 3.56) on all
neighbours, and its change touches one group (5): parallel composition (NR §3.3.10.4) over the groups.

**The selection.** Every present group's indicator is 1 on both sides of a common group. Releasing a group when
1 + Lap(1) > τ = 1 + ln(k/(2δ_s)), with k = 2·max_t G_t the groups one change adds or removes, releases a
one-sided group with probability ½·e^(−(τ−1)) = δ_s/k and a common group with the same probability on both
sides: (0, δ_s) for the selection, whatever the distance of the change (a relabel by 0.01 of ``c_acctbal`` is
a change at distance 10⁻⁴), so the selector spends no ε. With the values' (ε_v, δ_v) on the common groups the
release is (ε, δ)-DP, δ per neighbouring change like the count-based selection and the smoothed Laplace of
NR Thm 3.56.

**One noise scale for every group.** Where the bound form's bound is global, every released group's noise scale
is the same on every database, and the released groups' values are independent given the selection: a change
moves one common group's value, and parallel composition is exact. Where it is read from the data (smoothed),
the one scale s(x) serves every released group, and a change of a row of K moves s for all of them: each
released group whose value did not move still costs the dilation s(x)/s(x′) (NR Thm 3.53's β part, or the
tail of Thm 3.56's δ), so m released groups cost m dilations, which parallel composition does not cover. The
release then shows at most :data:`SHARED_SCALE_GROUPS` = 1 group: of the groups selected, one drawn uniformly
(post-processing of the selection, which does not read s). Couple the two sides' selector draws on the common
groups: outside the event that a one-sided group passes (probability ≤ δ_s) both sides select the same groups
and show the same one, g; then only g's value is released, one smoothed release at (ε_v, δ_v) — its value moved
or not, its scale dilated by e^(±βd) — so the loss is that of one release. Summing over the group shown,
H_(e^(εd)) ≤ δ_s + Σ_g P[g shown]·δ_v ≤ δ. The answer was almost always empty (each group passes with
probability δ_s/k); it now lists at most one row. (tests/release/test_owned_groups.py: the exact loss summed
over every common group whose scale moved; the run path shows at most one group.)

It answers what the query asks and no more: each group is one private row, so a group is
released with probability at most δ_s/k — the answer is almost always empty, which is the honest DP answer to
"list these customers".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp import sensitivity
from sqldp.catalog import Catalog
from sqldp.engine import Dialect
from sqldp.errors import RefusedError
from sqldp.form import Aggregate, AnalysisForm, ColumnRef, Conjunct, SemiJoin, placeholder, single_aggregate
from sqldp.groups import KeyDomain
from sqldp.policy import Policy
from sqldp.rewrite import Statements, rewrite
from sqldp.sensitivity.global_bound import Truncation, declared_truncations
from sqldp.sensitivity.model_check import keys_of
from sqldp.sensitivity.owned import SHARED_SCALE_GROUPS, OwnedSelection
from sqldp.sensitivity.plan import Plan
from sqldp.sensitivity.units import is_unit, unit_tables
from sqldp.sqlgen import answer_query


@dataclass(frozen=True)
class Owned:
    """What the analysis found: the determined uses, the groups one neighbouring change can add or remove, and
    the form whose plans bound the values of the common groups."""

    owners: tuple[str, ...]  # aliases of the determined uses, dropped from the bound form
    tables: tuple[str, ...]  # the private tables among them: their rows own the groups
    groups_per_change: int  # k = 2·max_t G_t
    bound_form: AnalysisForm  # the query without the determined uses, ungrouped
    dropped: tuple[Conjunct, ...]  # the conjuncts that read determined uses: they stay in the answer's WHERE
    truncations: tuple[Truncation, ...] = ()  # declared bounds the answer enforces (on owning tables only)

    def note(self) -> str:
        cut = f"; read with the declared bounds {'; '.join(map(str, self.truncations))}" if self.truncations else ""
        return (
            f"each group is one row of {', '.join(self.tables)}: DP partition selection releases a group present "
            f"in the data with probability δ_s/{self.groups_per_change} only, δ_s the selection's share of δ "
            f"(docs/sql.md, 'Groups owned by one row'){cut}"
        )


class _Classes:
    """Union-find over the columns the WHERE's equalities ``a.x = b.y`` make equal on every product row."""

    def __init__(self, conjuncts: Iterable[Conjunct]) -> None:
        self.parent: dict[ColumnRef, ColumnRef] = {}
        for c in conjuncts:
            e = c.expr.unnest()
            if isinstance(e, exp.EQ) and isinstance(e.this, exp.Column) and isinstance(e.expression, exp.Column):
                a, b = (ColumnRef(x.table, x.name) for x in (e.this, e.expression))
                if a.alias and b.alias:
                    self.parent[self.find(a)] = self.find(b)

    def find(self, ref: ColumnRef) -> ColumnRef:
        while self.parent.get(ref, ref) != ref:
            ref = self.parent[ref]
        return ref


def _changes(policy: Policy, table: str) -> bool:
    """Whether the table's rows differ between neighbours: private rows, or public rows with values in a norm."""
    tp = policy.table(table)
    return not tp.public or bool(tp.sensitive_columns)


def _columns(e: exp.Expr) -> set[ColumnRef]:
    return {ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table}


def _closure(
    form: AnalysisForm,
    catalog: Catalog,
    start: set[ColumnRef],
    classes: _Classes,
    cuts: Mapping[str, Truncation] | None = None,
) -> tuple[set[str], set[ColumnRef], int, set[Truncation]]:
    """The uses whose row the columns ``start`` fix — a use with an enforced key inside the closure of ``start``
    under the equalities, adding the columns of each use found until nothing changes — and that closure (as
    the classes' representatives).

    With ``cuts`` (a table's declared ``max_rows_per = { k = τ }``, enforced by truncation), a use whose k is in
    the closure has at most τ rows there: it joins with a factor τ when no key step is left. The third value
    is the product of those factors — how many rows of the uses found one value of ``start`` meets at most —
    and the fourth the truncations used."""
    known = {classes.find(r) for r in start}
    fixed: set[str] = set()
    factor, used = 1, set()
    while True:
        step = None
        for u in form.uses:
            if u.alias in fixed:
                continue
            keys = keys_of(catalog.table(u.table))
            if any(all(classes.find(ColumnRef(u.alias, c)) in known for c in key) for key in keys):
                step = u
                break
        if step is None and cuts:
            for u in form.uses:
                cut = cuts.get(u.table)
                if u.alias not in fixed and cut is not None and classes.find(ColumnRef(u.alias, cut.column)) in known:
                    step, factor = u, factor * cut.tau
                    used.add(cut)
                    break
        if step is None:
            return fixed, known, factor, used
        fixed.add(step.alias)
        known |= {classes.find(ColumnRef(step.alias, c)) for c in catalog.table(step.table).columns}


def _outside(
    sj: SemiJoin,
    owners: set[str],
    classes: _Classes,
    form: AnalysisForm,
    catalog: Catalog,
    where: Callable[[str], RefusedError],
) -> SemiJoin:
    """The semi-join as the bound form reads it: each column of an owning use in its correlation replaced by an
    equal column of another use (Q18's ``o_orderkey`` by ``l_orderkey``), the same value on every product row."""
    kept = [u for u in form.uses if u.alias not in owners]

    def swap(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Column) or node.table not in owners:
            return node
        root = classes.find(ColumnRef(node.table, node.name))
        for u in kept:
            for c in catalog.table(u.table).columns:
                if classes.find(ColumnRef(u.alias, c)) == root:
                    return exp.column(c, table=u.alias)
        raise where(f"the {sj.source} subquery reads {node.sql()}, which no other table's column equals")

    return dataclasses.replace(sj, correlation=tuple(e.copy().transform(swap) for e in sj.correlation))


def analyse(form: AnalysisForm, catalog: Catalog, policy: Policy) -> Owned | None:
    """The owned-groups analysis of the module docstring for a form under partition selection: None when no
    private use is determined by the group key (the count-based selection decides), a refusal naming the
    condition that fails when one is."""
    if form.select_by is None or form.nested is not None or not form.group_by or not catalog.enforced:
        return None
    if policy.units and unit_tables(form, catalog, policy):  # a unit's neighbours differ in many rows
        return None
    classes = _Classes(form.conjuncts)
    plain = {ColumnRef(k.table, k.name) for k in form.group_by if isinstance(k, exp.Column) and k.table}
    owners, owned, _, _ = _closure(form, catalog, plain, classes)
    private = {u.alias for u in form.uses if _changes(policy, u.table)}
    if not owners & private:
        return None

    def where(what: str) -> RefusedError:
        tables = ", ".join(sorted({form.use(a).table for a in owners & private}))
        return RefusedError(f"groups owned by one row of {tables}: {what}")

    def sensitive(ref: ColumnRef) -> bool:
        return policy.is_sensitive(form.use(ref.alias).table, ref.column)

    selector = form.aggregates[form.select_by]
    for agg in form.aggregates:
        if agg is not selector and any(r.alias in owners for r in agg.columns):
            raise where(f"{agg.sql} reads a column of a table the group key fixes; its values would change with it")
    dropped = []
    for c in form.conjuncts:
        read = set(c.columns)
        if not any(r.alias in owners for r in read):
            continue
        if any(sensitive(r) and r.alias not in owners for r in read):
            raise where(f"the condition {c.sql} reads a value-sensitive column of a table the key does not fix")
        if any(sensitive(r) for r in read if r.alias in owners) and any(r.alias not in owners for r in read):
            raise where(f"the condition {c.sql} mixes a value-sensitive column of an owning row with other rows")
        dropped.append(c)
    key_columns: set[ColumnRef] = set().union(*(_columns(k) for k in form.group_by))
    for key in form.group_by:
        # a key column equal to an owning row's column (Q3's l_orderkey = o_orderkey) is fixed by that row
        if not all(classes.find(r) in owned for r in _columns(key)):
            raise where(f"the key {key.sql(dialect='postgres')} is not a column of a row the key fixes")
    # declared contribution bounds on the owning tables (docs/truncation.md): read truncated by the answer, they
    # bound how many groups one row of another table reaches (Q3: a customer's orders). Only on owning rows —
    # their changes, evictions included, touch whole groups — and in an order that reads no sensitive value
    cuts = {}
    inside = {sj.use.table for sj in form.semijoins}  # the truncation would rewrite a subquery's reads too
    for cut in declared_truncations(dataclasses.replace(form, semijoins=()), catalog, policy):
        if cut.table in inside:
            continue
        ordered = keys_of(catalog.table(cut.table))
        stable = [cut.column, *(ordered[0] if ordered else ())]
        owning = all(u.alias in owners for u in form.uses_of(cut.table))
        if ordered and owning and not any(policy.is_sensitive(cut.table, c) for c in stable):
            cuts[cut.table] = cut
    reach: dict[str, int] = {}
    truncations: set[Truncation] = set()
    for u in form.uses:
        if u.alias not in private:
            continue
        table = catalog.table(u.table)
        _, known, fan, used = _closure(form, catalog, {ColumnRef(u.alias, c) for c in table.columns}, classes, cuts)
        if not all(classes.find(r) in known for r in key_columns):
            raise where(
                f"a row of {u.table} can be in many groups here (its rows do not fix the group key), so the "
                "groups one change adds or removes are unbounded"
            )
        if fan > 1 and u.alias not in owners:  # its change would move the values of several common groups
            raise where(f"a row of {u.table} can be in several groups here, so its change moves several values")
        truncations |= used
        # G_t: a row of t meets at most ``fan`` rows of the uses its columns reach, so it is in at most that many
        # groups. A change of it adds or removes at most 2·G_t groups: its own before and after (a relabel), or
        # its own and those of the row a truncation evicts or brings back (docs/truncation.md: one row in, one
        # out of the same key), which are owned rows of the same table
        reach[u.table] = reach.get(u.table, 0) + fan
    semijoins = []
    for sj in form.semijoins:
        # a row of the subquery's table changes one row of D, which flips the outer rows its correlation's
        # equalities select: those of the groups the outer columns equal to D's columns fix
        outer = set()
        for e in sj.correlation:
            e = e.unnest()
            sides = (e.this, e.expression) if isinstance(e, exp.EQ) else ()
            for a, b in (sides, sides[::-1]) if sides else ():
                if isinstance(a, exp.Column) and a.table == sj.use.alias and isinstance(b, exp.Column) and b.table:
                    outer.add(ColumnRef(b.table, b.name))
        _, known, fan, used = _closure(form, catalog, outer, classes, cuts)
        if not outer or not all(classes.find(r) in known for r in key_columns):
            raise where(
                f"the {sj.source} subquery's rows do not fix the group key through equalities, so one change of "
                f"{sj.use.table} can flip rows of unboundedly many groups"
            )
        if fan > 1:  # a changed row of D moves the values of each group it reaches
            raise where(f"the {sj.source} subquery's rows can reach several groups, so a change moves several values")
        truncations |= used
        reach[sj.use.table] = reach.get(sj.use.table, 0) + fan
        semijoins.append(_outside(sj, owners, classes, form, catalog, where))
    kept = [u for u in form.uses if u.alias not in owners]
    if not any(u.alias in private for u in kept):
        raise where("no private table is left to measure the values over")
    every = {ColumnRef(u.alias, c) for u in kept for c in catalog.table(u.table).columns}
    if not owners <= _closure(form, catalog, every, classes)[0]:
        raise where("a table the key fixes is not joined to the others by its key")
    left = [c for c in form.conjuncts if c not in dropped]
    values = tuple(o for o in form.outputs if not o.is_key)
    bound_form = dataclasses.replace(
        form,
        uses=tuple(kept),
        conjuncts=tuple(left),
        group_by=(),
        outputs=values,
        order_by=(),
        limit=None,
        having=None,
        select_by=None,
        distinct_rows=False,
        semijoins=tuple(semijoins),
    )
    tables = tuple(sorted({form.use(a).table for a in owners & private}))
    cuts_used = tuple(sorted(truncations, key=str))
    return Owned(tuple(sorted(owners)), tables, 2 * max(reach.values()), bound_form, tuple(dropped), cuts_used)


def compile_owned(
    form: AnalysisForm,
    owned: Owned,
    domains: tuple[KeyDomain, ...],
    catalog: Catalog,
    policy: Policy,
    beta: float | None,
    dialect: Dialect,
) -> tuple[tuple[Plan, ...], Statements]:
    """The plans and SQL of an owned-groups query: each value's plan from the bound form (run as statements of
    their own, never inside the answer's scan, whose product has the owning rows the bound must not read), the
    selector, and the answer with the bound form's WHERE plus the conjuncts on the owning rows."""
    assert form.select_by is not None
    made: dict[int, Plan] = {}
    for i in range(len(form.aggregates)):
        if i == form.select_by:
            continue
        p = sensitivity.plan(single_aggregate(owned.bound_form, i), catalog, policy, beta)
        assert not is_unit(p)  # analyse leaves privacy units to their own analysis
        fields = {f.name for f in dataclasses.fields(p)}  # type: ignore[arg-type]
        changes: dict[str, Any] = {"disjoint_groups": True}  # condition 5: a change touches one group
        for name in ("inline", "grouped_scan"):
            if name in fields:
                changes[name] = (False,) * len(p.queries)
        made[i] = dataclasses.replace(p, **changes)  # type: ignore[type-var]
    wheres = {tuple(c.sql for c in p.conjuncts) for p in made.values()}
    if len(wheres) > 1:
        raise RefusedError("the aggregates of this query need different continuous filters; ask them one by one")
    kept = next(iter(made.values())).conjuncts if made else owned.bound_form.conjuncts
    selector = form.aggregates[form.select_by]
    made[form.select_by] = OwnedSelection(
        dataclasses.replace(owned.bound_form, aggregates=(selector,), conjuncts=kept),
        selector,
        1.0,
        {"owned groups": {"owning tables": list(owned.tables), "groups_per_change": owned.groups_per_change}},
        disjoint_groups=True,
        truncations=owned.truncations,
        source="groups owned by one row (docs/sql.md)",
        groups_per_change=owned.groups_per_change,
    )
    plans = tuple(made[i] for i in range(len(form.aggregates)))
    notes: tuple[str, ...] = (owned.note(),)
    if not all(p.data_independent for p in plans):
        notes += (
            f"the values' noise scale is read from the data and shared by the groups: at most {SHARED_SCALE_GROUPS} "
            "group selected is shown (drawn uniformly; docs/sql.md, 'Groups owned by one row')",
        )
    # the answer's WHERE: the values' (a value plan may move a private conjunct into its aggregate, NR §3.3.8.4)
    # and the conjuncts on the owning rows, in the query's order
    keep = {c.sql for c in (*kept, *owned.dropped)}
    # (and a key column's declared range the plan added, sensitivity.with_key_ranges: not in the query's own)
    where = tuple(c for c in form.conjuncts if c.sql in keep) + tuple(c for c in kept if c not in form.conjuncts)
    answer = answer_query(dataclasses.replace(form, aggregates=tuple(p.aggregate for p in plans), conjuncts=where))
    statements = rewrite(form, answer, plans, domains, catalog, policy, dialect)
    return plans, dataclasses.replace(statements, notes=notes)


def own_selector(form: AnalysisForm, catalog: Catalog, policy: Policy) -> AnalysisForm:
    """The form with a hidden COUNT(*) as the selector when its groups are owned and partition selection chose
    the query's own COUNT(*) (sqldp.groups.partition_selection): the owned selector is a group's indicator,
    not its count, so the query's COUNT(*) stays a value measured like the others."""
    if form.select_by is None:
        return form
    try:
        if analyse(form, catalog, policy) is None:
            return form
    except RefusedError:
        return form  # compile_form refuses it again, or the count-based selection answers
    i = form.select_by
    mark = placeholder(i).name
    having = form.having is not None and any(c.name == mark for c in form.having.find_all(exp.Column))
    if not having and not any(i in o.aggregates for o in form.outputs):
        return form
    count = Aggregate("count", None, frozenset())
    return dataclasses.replace(form, aggregates=(*form.aggregates, count), select_by=len(form.aggregates))
