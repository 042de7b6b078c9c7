"""A row-level bound from the schema alone: the global sensitivity of NR §3.3.13 as a plan.

The derivative analysis of NR §3.3.7 bounds a COUNT over a join of private tables by what the data shows (the
join-key frequencies of the other private tables), smoothed over the distance to any database — so it is
data-dependent and needs generalized Cauchy noise (or Laplace with δ). When the schema's PRIMARY KEY, UNIQUE
and NOT NULL constraints bound the number of join rows one added or removed row can change on *every*
database (the model-checking analysis, :mod:`sqldp.sensitivity.model_check`: TPC-H's lineitem ⋈ orders changes
at most 1 row per lineitem row and 7 per orders row, since (l_orderkey, l_linenumber) is the key and
l_linenumber lies in [1, 7] … or whatever the solver proves), that number N_t times the aggregate's largest
|e| is a global bound for the table: Laplace at c/ε is then ε-DP with no smoothing (Dwork et al. 2006).

A semi-join or anti-join to a derived table D (``[NOT] EXISTS``, ``[NOT] IN``, :mod:`sqldp.subqueries`) adds,
for the subquery's table T, the number of outer join rows one row of D can flip: the model check of the outer
query joined with D by ψ, D being a table whose row is unique (SELECT DISTINCT: its key is all its columns)
and c_D = 1 (NR §3.3.13.9, c′ + c_D·c′_D; §3.3.13.7 for the set semantics of D).

Used only when the constraints are the database's own (a catalog read from PostgreSQL, which enforces them;
a schema file states them but nothing checks the data against it), and only when every private table's N_t
is finite within the time limit. Nothing here reads data.

Declared contribution bounds (:func:`truncated_plan`, docs/truncation.md): the policy's ``max_rows_per =
{ k = τ }`` says at most τ rows of a table share a value of k. The query then reads the table through a
truncation that keeps τ rows per value (:func:`sqldp.rewrite.truncate`), so the declaration holds on every
database the query sees, and the model checker may use it as a constraint: a key (k, rank) with a rank in
1 … τ (τ = 1: k is a key, as a PRIMARY KEY or UNIQUE NOT NULL would make it). The truncation is not a
one-row change, though: adding a row r to a table truncated by k may evict the τ-th row of r's key (and
removing one may bring the (τ+1)-th back), so one neighbouring change moves the truncated table by one row
in and one row out of the same key. Since a join–filter query is monotone in its tables, the in-row adds a
rows and the out-row removes b rows of the join, 0 ≤ a, b ≤ N_t (both intermediate databases satisfy the
declaration). Hence, with values of the aggregand in [lo, hi] (|e| ≤ M):

* COUNT: |Δ| = |a − b| ≤ N_t — as without truncation;
* SUM: |Δ| ≤ N_t·(max(hi, 0) − min(lo, 0)) — N_t·M when e has one sign, at most 2·N_t·M;
* GROUP BY (ℓ1 over the groups): a and b may land in different groups, ≤ 2·N_t·M.

A table that is not truncated changes by one row: N_t·M, as :func:`global_plan`.

Workflows (:func:`workflow_plan`, NR §3.3.13.9 Proposition 3.2): the same semi-joins and decorrelated scalar
subqueries as steps of :mod:`sqldp.sensitivity.model_check_workflow`, whose derived tables D may be grouped
(r_D = 2: a changed group is a row out and a row in) and whose own sensitivity S_D(t) comes from the model
checker too; the main step joins the EXISTS / IN steps as tables (the keys D has as a set may tie the outer
tables together where the outer product alone does not), and drops the anti-joins (their indicator is in
[0, 1]; :mod:`sqldp.subqueries`, argument 1). Per table t, c′_t + Σ_D c_D·r_D·S_D(t) with c′_t and c_D the
main step's join rows: |ΔSUM(e)| ≤ M·that, ℓ1 over the groups. The release takes the smaller of this and
:func:`global_plan`'s bound (both hold on every database); each plan names its source.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from sqldp.catalog import Catalog, Column, Table
from sqldp.form import SCALAR_VALUE, Aggregate, AnalysisForm, SemiJoin
from sqldp.policy import Policy
from sqldp.policy.tables import resolve_name
from sqldp.sensitivity import model_check
from sqldp.sensitivity.intervals import domain, interval
from sqldp.sensitivity.plan import Bound, ExactUnfolded
from sqldp.sensitivity.rows import RowPlan

TIMEOUT = 1.0  # reference seconds of solver steps per (query, table) (model_check.Budget); beyond, the smoothed plan
# the same under declared contribution bounds: a self-join on a declared key with τ = 28 (TPC-H orders per
# customer) needs 1 s per use on an idle machine to prove 2τ, and the alternative is a smoothed bound several
# times larger. The result is cached per (schema, query, table), so a session pays it once per query shape.
TRUNCATED_TIMEOUT = 5.0

# the model's column for a row's rank within its key under a declared bound, which the truncation's SQL
# computes under the same name (sqldp.rewrite.truncate), and the name of that SQL's subquery: a table with a
# column of either name is not truncated (the names would clash)
RANK, CUT = "__sqldp_rank", "__sqldp_cut"
# the other names that SQL gives (sqldp.rewrite.truncated_read): the keys over τ (a CTE), the table's alias and
# the window's input; with a catalog table named as a CTE (OVER0, OVER1, …) nothing is truncated (it would be hidden)
OVER, ALL, IN = "__sqldp_over", "__sqldp_all", "__sqldp_in"

_cache: dict[tuple[Any, ...], float] = {}


@dataclass(frozen=True)
class Truncation:
    """A declared contribution bound the query enforces: ``table`` is read with at most ``tau`` rows per value
    of ``column`` (sqldp.rewrite.truncate)."""

    table: str
    column: str
    tau: int

    def __str__(self) -> str:
        return f"{self.table}: at most {self.tau} row{'s' if self.tau > 1 else ''} per {self.column}"


@dataclass(frozen=True)
class GlobalPlan(ExactUnfolded):
    """The plan contract (:mod:`sqldp.sensitivity`) for a bound that holds on every database: no queries."""

    form: AnalysisForm
    aggregate: Aggregate
    bound: float
    terms: dict[str, Any] = field(default_factory=dict)
    disjoint_groups: bool = False
    truncations: tuple[Truncation, ...] = ()  # the declared bounds the bound relies on (the rewrite enforces them)
    # which global bound this is (released: it depends on the query, the schema and the policy only)
    source: str = "schema keys (NR §3.3.13)"

    # the largest count one neighbouring change can give a group that exists on one side only (DP partition
    # selection's threshold, sqldp.release.selection_threshold); None: the count's bound at the change's distance
    # (the terms' sensitivity times weight: one row of t moves at most c_t·G_t join rows)
    one_sided: float | None = None

    queries: tuple[exp.Select, ...] = ()
    data_independent: bool = True

    @property
    def change_distances(self) -> frozenset[float]:
        """The distances of the neighbouring changes that move this aggregate: G_t for a row of each private table
        in the terms; ∞ (no bound) where a term does not say its weight."""
        return frozenset(float(t["weight"]) if "weight" in t else math.inf for t in self.terms.values()) or frozenset(
            {math.inf}
        )

    @property
    def global_bound(self) -> float | None:
        return float(self.bound)

    @property
    def bound_source(self) -> str | None:
        return self.source

    @property
    def declared_truncations(self) -> tuple[Truncation, ...]:
        return self.truncations

    def expected_bound(self) -> float | None:
        """The bound itself: a number that needs no query, so its noise and bar follow before a run."""
        return float(self.bound)

    def bind(self, results: Sequence[Any]) -> Callable[[float], Bound]:
        return lambda beta: Bound(self.bound, self.terms)

    def finish(self, results: Sequence[Any], beta: float) -> Bound:
        return self.bind(results)(beta)


def _schema(catalog: Catalog, tables: set[str]) -> tuple[Any, ...]:
    """What the solver reads of the catalog: columns, types, nullability and keys of the tables used."""
    out = []
    for name in sorted(tables):
        t = catalog.table(name)
        out.append((t.name, t.primary_key, t.unique, tuple(sorted(t.columns.values(), key=lambda c: c.name))))
    return tuple(out)


def one_use(spj: model_check.SPJ, table: str) -> model_check.GlobalSensitivity | None:
    """Without a join, no solver: a query over one use of ``table`` has each of its rows in at most one result
    row (the derivative of NR §3.3.13.4 is the row itself or nothing), so it moves at most one join row and
    one group. Exact without a filter (a database of that row alone reaches 1); with one, an upper bound (the
    solver could prove 0 for a filter no row passes, which changes nothing but a constant query's noise).
    None when the query joins: then :func:`model_check.sensitivity` decides. Building the formula and a solver
    is ~0.1 s of CPU with z3's import, most of what a single-table analysis would otherwise take."""
    if len(spj.uses) != 1 or spj.uses[0].table != table.lower():
        return None
    return model_check.GlobalSensitivity(
        table.lower(), 1.0, not spj.conditions, "keys (one use, no join: at most the row itself)", 0.0
    )


def for_form(form: AnalysisForm, catalog: Catalog, tables: Sequence[str]) -> dict[str, Any]:
    """:func:`model_check.for_form` (what `sqldp explain` shows), by :func:`one_use` for a query without a
    join."""
    if len(form.uses) != 1:
        return model_check.for_form(form, catalog, tables)
    out: dict[str, Any] = {}
    for table in tables:
        bag = one_use(model_check.from_form(form, grouped=False), table)
        if bag is None:  # not the table read (the caller names the ones the form reads)
            return model_check.for_form(form, catalog, tables)
        entry = {"join_rows": bag.to_json()}
        if form.group_by:
            groups = one_use(model_check.from_form(form, grouped=True), table)
            assert groups is not None  # the same one use
            entry["groups"] = groups.to_json()
        out[table] = entry
    return out


def _semi_join_rows(form: AnalysisForm, semi: SemiJoin, catalog: Catalog, timeout: float) -> float:
    """How many outer join rows one row of the derived table D can flip: D as a table of its own whose key is
    all its columns (a set), joined to the outer product by ψ (sqldp.subqueries, argument 2)."""
    if not semi.columns:  # uncorrelated: one row of D flips every outer row, however many there are
        return math.inf
    original = catalog.table(semi.use.table)
    name = f"{semi.use.table}__distinct"
    derived = Table(name, {c: original.column(c) for c in semi.columns}, tuple(semi.columns))
    extended = dataclasses.replace(catalog, tables={**catalog.tables, name: derived})
    outer = model_check.from_form(form, grouped=False)
    spj = model_check.SPJ((*outer.uses, model_check.Use(semi.use.alias, name)), (*outer.conditions, *semi.correlation))
    return cached_sensitivity(spj, extended, name, timeout, exact_one_use=False)


def cached_sensitivity(
    spj: model_check.SPJ, catalog: Catalog, table: str, timeout: float, *, exact_one_use: bool = True
) -> float:
    """The model checker's join rows per row of ``table`` (NR §3.3.13), first by :func:`one_use` where
    ``exact_one_use``; cached by schema, query, table and step budget (the search's budget counts solver steps,
    not seconds: the same answer every time)."""
    conditions = tuple(c.sql() for c in spj.conditions)
    key = (_schema(catalog, {u.table for u in spj.uses}), spj.uses, conditions, table, timeout, exact_one_use)
    n = _cache.get(key)
    if n is None:
        found = (exact_one_use and one_use(spj, table)) or model_check.sensitivity(spj, catalog, table, timeout=timeout)
        n = found.value
        if len(_cache) > 4096:
            _cache.clear()
        _cache[key] = n
    return n


def global_plan(rows: RowPlan, catalog: Catalog, *, timeout: float = TIMEOUT) -> GlobalPlan | None:
    """The schema's global bound for a row-level plan, or None (unbounded, out of time, or constraints that
    PostgreSQL does not enforce for this catalog)."""
    if not catalog.enforced or not rows.private:
        return None
    joined = _join_rows(rows, catalog, timeout)
    if joined is None:
        return None
    terms: dict[str, Any] = {}
    bound = 0.0
    for table, n in joined.items():
        weight = rows.weights[table]
        sens = rows.multiplier * n / weight
        bound = max(bound, sens)
        terms[table] = {"global_join_rows": n, "weight": weight, "sensitivity": sens, "method": "NR §3.3.13"}
    return GlobalPlan(rows.form, rows.aggregate, bound, terms, rows.disjoint_groups)


def _join_rows(rows: RowPlan, catalog: Catalog, timeout: float) -> dict[str, float] | None:
    """Per private table, N_t: how many join rows one of its rows can change on any database that satisfies
    the catalog's keys (NR §3.3.13); None when one is unbounded or out of time."""
    spj = model_check.from_form(rows.form, grouped=False)  # join rows: what a COUNT, and the histogram in ℓ1, move
    out: dict[str, float] = {}
    for table in sorted(rows.private):
        n = cached_sensitivity(spj, catalog, table, timeout)
        # each derived table read from this table adds its rows' reach (NR §3.3.13.9 with c_D = 1)
        n += sum(_semi_join_rows(rows.form, s.semi, catalog, timeout) for s in rows.semis if s.semi.use.table == table)
        if not math.isfinite(n):
            return None
        out[table] = n
    return out


# -- declared contribution bounds ------------------------------------------------------------------------


def declared_truncations(form: AnalysisForm, catalog: Catalog, policy: Policy) -> tuple[Truncation, ...]:
    """The policy's ``max_rows_per`` bounds a query could rely on: on a table it reads, over a column one of
    its conditions reads (a join or filter key: where a multiplicity bound limits how many rows one row
    meets), and not already a key PostgreSQL enforces (then the data holds τ = 1 without a truncation)."""
    if form.semijoins:  # the rewrite truncates the product's tables, not a subquery's: not modelled together
        return ()
    if any(t.startswith(OVER) for t in catalog.tables):  # the truncation's CTEs could hide it (rewrite.truncate)
        return ()
    read = {(form.use(r.alias).table, r.column) for c in form.conjuncts for r in c.columns}
    out = []
    for name in sorted({u.table for u in form.uses}):
        table = catalog.table(name)
        for declared, tau in policy.table(name).max_rows_per.items():
            column = resolve_name(declared, table.columns, f"tables.{name}.max_rows_per")
            if column is None or (name, column) not in read or {RANK, CUT} & set(table.columns):
                continue
            if catalog.enforced and (column,) in model_check.keys_of(table):
                continue
            out.append(Truncation(name, column, tau))
    return tuple(out)


def _truncated_catalog(catalog: Catalog, truncations: tuple[Truncation, ...]) -> Catalog:
    """The catalog the model checker reads under the truncations: each truncated table gets the key
    (column, rank) with a rank in 1 … τ, first among its keys (the solver then orders rows by rank, so τ + 1
    rows of one key contradict at once); (column) alone for τ = 1. Keys of a catalog PostgreSQL does not
    enforce are claims and left out: only the truncations hold then.

    The truncated column is NOT NULL in the model. Sound as the model's NULL handling is
    (:mod:`sqldp.sensitivity.model_check`): the truncation keeps at most τ rows with a NULL key too, and
    replacing each NULL by a fresh value keeps every key's rows at most τ and adds join rows only."""
    tables: dict[str, Table] = {}
    for name, t in catalog.tables.items():
        keys = model_check.keys_of(t) if catalog.enforced else []
        tables[name] = Table(t.name, t.columns, keys[0] if keys else (), t.foreign_keys, tuple(keys[1:]))
    for cut in truncations:
        t = tables[cut.table]
        columns = dict(t.columns)
        columns[cut.column] = dataclasses.replace(columns[cut.column], nullable=False)
        key: tuple[str, ...] = (cut.column,)
        if cut.tau > 1:
            columns[RANK] = Column(RANK, "INTEGER", "integer", nullable=False, bounds=(1, cut.tau))
            key = (cut.column, RANK)
        others = tuple(k for k in ((t.primary_key,) if t.primary_key else ()) + t.unique if k != key)
        tables[cut.table] = Table(t.name, columns, key, t.foreign_keys, others)
    return Catalog(tables, catalog.source, enforced=True)


def truncated_plan(
    rows: RowPlan,
    catalog: Catalog,
    policy: Policy,
    truncations: tuple[Truncation, ...],
    *,
    timeout: float = TRUNCATED_TIMEOUT,
) -> GlobalPlan | None:
    """The global bound of a row-level plan when the query reads the ``truncations``' tables truncated
    (module docstring: N_t from the model checker under the declared bounds, times 2 for a truncated table
    where the evicted row's join rows can add to the new row's), or None when a table's N_t stays unbounded."""
    if not truncations or not rows.private:
        return None
    joined = _join_rows(rows, _truncated_catalog(catalog, truncations), timeout)
    if joined is None:
        return None
    cut = {t.table: t for t in truncations}
    m = rows.multiplier
    if rows.form.group_by:
        swap = 2.0  # the in-row's and the out-row's join rows may fall in two groups: ℓ1 adds them
    elif rows.aggregate.kind == "count" or m == 0:
        swap = 1.0
    else:
        assert rows.form.aggregates[0].arg is not None
        lo, hi = interval(rows.form.aggregates[0].arg, domain(rows.form, catalog, policy))
        swap = (max(hi, 0.0) - min(lo, 0.0)) / m  # in (1, 2] when e takes both signs, else 1
    terms: dict[str, Any] = {}
    bound = 0.0
    for table, n in joined.items():
        weight = rows.weights[table]
        factor = swap if table in cut else 1.0
        sens = m * n * factor / weight
        bound = max(bound, sens)
        terms[table] = {"global_join_rows": n, "weight": weight, "sensitivity": sens, "method": "NR §3.3.13"}
        if table in cut:
            terms[table].update(truncated=str(cut[table]), swap=factor)
    # a truncated private table moves two rows, which may sit in two groups: no parallel composition
    disjoint = rows.disjoint_groups and not (cut.keys() & rows.private)
    return GlobalPlan(
        rows.form,
        rows.aggregate,
        bound,
        terms,
        disjoint,
        truncations,
        source="declared contribution bounds (NR §3.3.13)",
    )


# -- workflows (NR §3.3.13.9, Proposition 3.2) -------------------------------------------------------------

WORKFLOW_SOURCE = "schema keys, workflow composition (NR §3.3.13.9, Prop. 3.2)"
_workflow_cache: dict[tuple[Any, ...], Any] = {}


def form_select(form: AnalysisForm) -> exp.Select:
    """The join–filter query the release answers, as one qualified SELECT: the product's uses, θ's conjuncts and
    each semi-join as the predicate the answer's WHERE holds (:meth:`sqldp.form.SemiJoin.predicate`: EXISTS over
    D = SELECT DISTINCT …), a decorrelated scalar subquery as the comparison it came from (the workflow makes it
    a step grouped by the correlation keys, which keeps those keys a key of D)."""
    first, *rest = form.uses
    select = exp.select(exp.Literal.number(1)).from_(exp.alias_(exp.to_table(first.table), first.alias, table=True))
    for u in rest:
        select = select.join(exp.alias_(exp.to_table(u.table), u.alias, table=True), copy=False)
    parts = [c.expr.copy() for c in form.conjuncts]
    parts += [_scalar(s) if s.scalar and not s.anti else s.predicate() for s in form.semijoins]
    if parts:
        select = select.where(exp.and_(*parts), copy=False)
    return select


def _scalar(semi: SemiJoin) -> exp.Expr:
    """``compare`` with D's value column replaced by the scalar subquery over the use (φ ∧ ψ in its WHERE): the
    comparison the analyst wrote (an empty subquery is NULL and fails it, as the join with D has no row)."""
    assert semi.value is not None and semi.compare is not None
    body = exp.select(semi.value.copy()).from_(exp.alias_(exp.to_table(semi.use.table), semi.use.alias, table=True))
    conditions = [*semi.inner, *semi.correlation]
    if conditions:
        body = body.where(exp.and_(*(e.copy() for e in conditions)), copy=False)

    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == semi.use.alias and node.name == SCALAR_VALUE:
            return exp.Subquery(this=body.copy())
        return node

    return semi.compare.copy().transform(swap)


def workflow_plan(rows: RowPlan, catalog: Catalog, *, timeout: float = TIMEOUT) -> GlobalPlan | None:
    """The global bound of a row-level plan with semi-joins from the workflow's composition (module docstring),
    or None: constraints PostgreSQL does not enforce, a shape the workflow does not decompose (an uncorrelated
    EXISTS: one row flips every outer row), a private table whose composed term is ∞, or a step out of time."""
    from sqldp.sensitivity import model_check_workflow as mw  # z3-heavy: only for forms with semi-joins

    if not catalog.enforced or not rows.private or not rows.form.semijoins or rows.form.nested is not None:
        return None
    tree = form_select(rows.form)
    tables = {u.table for u in (*rows.form.uses, *(s.use for s in rows.form.semijoins))}
    key = (_schema(catalog, tables), tree.sql(dialect="postgres"))
    found = _workflow_cache.get(key)
    if found is None:
        try:
            found = mw.workflow(tree, catalog, timeout=timeout, measure="join")
        except ValueError:
            return None
        if any(s.kind == "released" for s in found.steps):
            return None  # no released step in a form's WHERE (sqldp.session answers those first); fail closed
        if len(_workflow_cache) > 1024:
            _workflow_cache.clear()
        _workflow_cache[key] = found  # a budget of solver steps (model_check.Budget): the same answer every time
    terms: dict[str, Any] = {}
    bound = 0.0
    for table in sorted(rows.private):
        n = found.total.get(table)
        if n is None or not math.isfinite(n):
            return None
        weight = rows.weights[table]
        sens = rows.multiplier * n / weight
        bound = max(bound, sens)
        terms[table] = {"global_join_rows": n, "weight": weight, "sensitivity": sens, "method": "NR §3.3.13.9"}
    return GlobalPlan(rows.form, rows.aggregate, bound, terms, rows.disjoint_groups, source=WORKFLOW_SOURCE)
