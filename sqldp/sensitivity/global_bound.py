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
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from sqldp.catalog import Catalog, Table
from sqldp.form import Aggregate, AnalysisForm, SemiJoin
from sqldp.sensitivity import model_check
from sqldp.sensitivity.plan import Bound, ExactUnfolded
from sqldp.sensitivity.rows import RowPlan

TIMEOUT = 1.0  # seconds of solver time per (query, table); beyond it the data-dependent plan is used

_cache: dict[tuple[Any, ...], float] = {}


@dataclass(frozen=True)
class GlobalPlan(ExactUnfolded):
    """The plan contract (:mod:`sqldp.sensitivity`) for a bound that holds on every database: no queries."""

    form: AnalysisForm
    aggregate: Aggregate
    bound: float
    terms: dict[str, Any] = field(default_factory=dict)
    disjoint_groups: bool = False

    queries: tuple[exp.Select, ...] = ()
    data_independent: bool = True

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
    key = (_schema(extended, {u.table for u in spj.uses}), spj.uses, tuple(c.sql() for c in spj.conditions), name)
    if key not in _cache:
        if len(_cache) > 4096:
            _cache.clear()
        _cache[key] = model_check.sensitivity(spj, extended, name, timeout=timeout).value
    return _cache[key]


def global_plan(rows: RowPlan, catalog: Catalog, *, timeout: float = TIMEOUT) -> GlobalPlan | None:
    """The schema's global bound for a row-level plan, or None (unbounded, out of time, or constraints that
    PostgreSQL does not enforce for this catalog)."""
    if not catalog.enforced or not rows.private:
        return None
    form = rows.form
    spj = model_check.from_form(form, grouped=False)  # join rows: what a COUNT, and the histogram in ℓ1, move
    terms: dict[str, Any] = {}
    bound = 0.0
    for table in sorted(rows.private):
        key = (_schema(catalog, {u.table for u in spj.uses}), spj.uses, tuple(c.sql() for c in spj.conditions), table)
        if key not in _cache:
            if len(_cache) > 4096:
                _cache.clear()
            _cache[key] = model_check.sensitivity(spj, catalog, table, timeout=timeout).value
        n = _cache[key]
        # each derived table read from this table adds its rows' reach (NR §3.3.13.9 with c_D = 1)
        n += sum(_semi_join_rows(form, s.semi, catalog, timeout) for s in rows.semis if s.semi.use.table == table)
        if not math.isfinite(n):
            return None
        weight = rows.weights[table]
        sens = rows.multiplier * n / weight
        bound = max(bound, sens)
        terms[table] = {"global_join_rows": n, "weight": weight, "sensitivity": sens, "method": "NR §3.3.13"}
    return GlobalPlan(form, rows.aggregate, bound, terms, rows.disjoint_groups)
