"""Declared contribution bounds under a privacy unit: the unit's rows bounded by the schema and the policy, and
the answer released with that bound instead of R2T's race (docs/units.md, "Declared bounds on a unit's rows").

R2T (:mod:`sqldp.sensitivity.units`) races for a truncation τ because nothing bounds how many join rows one unit
owns. Often something does: a unit's own table has one row per unit when the unit key is its enforced PRIMARY
KEY (a COUNT(*) of customers under a customer unit), a referencing table may declare ``max_rows_per = { fk = τ }``
on its foreign key to the unit (orders per customer), and the schema's keys bound the join rows each of those
rows meets (7 line items per order). When every join row belongs to one unit (the plan's ``unit_key``), the
number N of join rows one unit owns is then bounded on every database the query reads, and

* COUNT moves by at most N when a unit is added or removed; SUM(e) with e in [lo, hi] by at most N·M, M =
  max(|lo|, |hi|) (the unit's rows are removed, never exchanged: not the N·(max(hi, 0) − min(lo, 0)) of a row
  change that evicts another, docs/truncation.md);
* a GROUP BY histogram by at most N·M in ℓ1: each removed join row leaves one group;

a global sensitivity, released by Laplace at the bound over the aggregate's full ε share (Dwork, McSherry,
Nissim and Smith, TCC 2006), no races and no τ to choose.

**How N is found.** The model checker of NR §3.3.13 (:mod:`sqldp.sensitivity.model_check`) counts how many join
rows one row of a table can change. Join the query (with the joins :func:`sqldp.sensitivity.units.plan_units`
added to reach the unit key) to a table V whose one column, its key, equals the join row's unit key: the join
rows of unit u are exactly those meeting V's row u, so V's sensitivity is N, on every database that satisfies
the enforced keys and the declared bounds. A declared bound is used only on a column whose equal values belong to
one unit — the unit key of the unit's own table, or the first hop of every foreign-key path of a table to the
unit (o_custkey) — so the query reads the table truncated to τ rows per value (:func:`sqldp.rewrite.truncate`)
and removing a unit removes whole partitions: the truncated tables of the neighbour are those of the database
minus the unit's rows (docs/units.md has the proof). Without an enforced catalog the keys are claims: only the
declared bounds count.

**The choice** (policy, schema and query only, the same at every ε): R2T's error adapts to the data — to the
largest contribution DS of one unit, which a query's filters may make far smaller than the declared B = N·M —
while the declared bound's is the same on every database. The declared bound is used when its error is no larger
than R2T's on a database where one unit owns a single join row at the aggregate's largest |value| M, the smallest
DS of a unit that owns a full-valued row (:func:`prefer_declared`): one row per unit (N = 1) always; a COUNT up
to N = 143 join rows per unit (J = 8 races, β = 0.1); TPC-H's 196 line items per customer (28 orders of 7) keep
R2T's race, whose truncation follows the query's filters (Q5's one region and year).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from sqldp.catalog import Catalog, Table
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.mechanisms.race import SELECT_SHARE, race_bound
from sqldp.policy import Policy
from sqldp.policy.tables import resolve_name
from sqldp.policy.units import Unit
from sqldp.sensitivity import model_check
from sqldp.sensitivity.global_bound import (
    CUT,
    OVER,
    RANK,
    TRUNCATED_TIMEOUT,
    GlobalPlan,
    Truncation,
    _truncated_catalog,
    cached_sensitivity,
)
from sqldp.sensitivity.intervals import domain, interval
from sqldp.sensitivity.rows import equality_classes
from sqldp.sensitivity.units import UnitPlan

UNIT_TABLE = "__sqldp_unit"  # the model's table of unit keys (V above); a catalog with a table of that name gets R2T
UNIT_COLUMN = "k"
SOURCE = "declared contribution bounds under a privacy unit (docs/units.md)"


@dataclass(frozen=True)
class UnitBoundPlan(GlobalPlan):
    """A global bound under a privacy unit: at most ``join_rows`` join rows per unit, times the aggregate's
    largest |value|; released by Laplace at ``bound``/ε (the plan contract of :class:`GlobalPlan`)."""

    unit: Unit | None = None
    join_rows: float = 0.0
    # R2T's plan, used instead when another aggregate of the query races (agree)
    raced: UnitPlan | None = field(default=None, compare=False, repr=False)

    @property
    def change_distances(self) -> frozenset[float]:
        """A neighbour differs in one unit's rows, at distance 1 (units have no weights)."""
        return frozenset({1.0})

    @property
    def privacy_unit(self) -> dict[str, Any] | None:
        """What an analyst may see: the unit, the declared bound used instead of R2T's race (policy and query)."""
        assert self.unit is not None
        return {
            "unit": self.unit.name,
            "table": self.unit.table,
            "key": self.unit.key,
            "bound": "declared",
            "join_rows_per_unit": self.join_rows,
            "truncations": [str(t) for t in self.truncations],
        }

    def note(self) -> str:
        """The run's note: which bound, and why no race (data-independent)."""
        assert self.unit is not None
        rows = f"{self.join_rows:g} join row{'s' if self.join_rows != 1 else ''}"
        cuts = f"; {', '.join(map(str, self.truncations))}" if self.truncations else ""
        return (
            f"unit {self.unit.name}: at most {rows} per unit by the schema's keys and the declared bounds{cuts} → "
            "Laplace at that bound instead of R2T's race"
        )


def unit_truncations(plan: UnitPlan, catalog: Catalog, policy: Policy) -> tuple[Truncation, ...]:
    """The declared ``max_rows_per`` bounds the query may read truncated under the plan's unit: on a table it
    reads, over a column whose equal values belong to one unit (the unit key of the unit's own table, or the
    first hop of every foreign-key path from the table to the unit), not already a key PostgreSQL enforces."""
    assert len(plan.units) == 1
    unit = plan.units[0]
    if any(t.startswith(OVER) for t in catalog.tables):  # the truncation's CTEs could hide it (rewrite.truncate)
        return ()
    paths = policy.members(catalog)[unit.name]
    out = []
    for name in sorted({u.table for u in plan.form.uses}):
        table = catalog.table(name)
        if {RANK, CUT} & set(table.columns):
            continue
        for declared, tau in policy.table(name).max_rows_per.items():
            column = resolve_name(declared, table.columns, f"tables.{name}.max_rows_per")
            if column is None or (catalog.enforced and (column,) in model_check.keys_of(table)):
                continue
            own = name == unit.table and column == unit.key
            hops = paths.get(name, ())
            first_hop = bool(hops) and all(p and p[0].columns == (column,) for p in hops)
            if own or first_hop:
                out.append(Truncation(name, column, tau))
    return tuple(out)


def join_rows(plan: UnitPlan, catalog: Catalog, truncations: tuple[Truncation, ...]) -> float:
    """N: how many join rows one unit can own on any database that satisfies the (enforced) keys and the
    truncations, or ∞ (module docstring): the sensitivity of the table V of unit keys, else (beyond the model
    checker's cap of 64 rows) the product bound of :func:`_through`."""
    key = plan.unit_key
    assert key is not None
    form = plan.form
    cuts = {(t.table, t.column): t.tau for t in truncations}
    uses = (*form.uses, *plan.extra_uses)
    table_of = {u.alias: u.table for u in uses}
    if len(uses) == 1:
        # one table, no join: a unit owns the rows holding its key, at most τ by a truncation or one by a key
        table = table_of[key.alias]
        if (table, key.column) in cuts:
            return float(cuts[(table, key.column)])
        if catalog.enforced and (key.column,) in model_check.keys_of(catalog.table(table)):
            return 1.0
    if UNIT_TABLE in catalog.tables:
        return math.inf
    model = _truncated_catalog(catalog, truncations)
    column = dataclasses.replace(model.table(table_of[key.alias]).column(key.column), name=UNIT_COLUMN, nullable=False)
    with_v = dataclasses.replace(
        model, tables={**model.tables, UNIT_TABLE: Table(UNIT_TABLE, {UNIT_COLUMN: column}, (UNIT_COLUMN,))}
    )
    link = exp.EQ(this=exp.column(UNIT_COLUMN, table=UNIT_TABLE), expression=exp.column(key.column, table=key.alias))
    spj = model_check.SPJ(
        (*(model_check.Use(u.alias, u.table) for u in uses), model_check.Use(UNIT_TABLE, UNIT_TABLE)),
        (*(c.expr for c in form.conjuncts), *plan.extra_conds, link),
    )
    n = cached_sensitivity(spj, with_v, UNIT_TABLE, TRUNCATED_TIMEOUT)
    return n if math.isfinite(n) else _through(plan, model, cuts)


def _through(plan: UnitPlan, model: Catalog, cuts: dict[tuple[str, str], int]) -> float:
    """N ≤ n_T·N_T for a use T of the query whose column c θ makes equal to the unit key: every join row of unit
    u holds a row of T with c = u, of which there are at most n_T (τ for a truncation on c, 1 for an enforced
    key (c)), and each such row lies in at most N_T join rows (the model checker's bound for T, NR §3.3.13).
    The smallest over such uses; ∞ if none. TPC-H's orders ⋈ lineitem under a customer unit: 28·7 = 196, past
    the 64 rows up to which the solver proves V's sensitivity itself."""
    key = plan.unit_key
    assert key is not None
    form = plan.form
    classes = equality_classes(form.conjuncts)

    def equal(a: ColumnRef, b: ColumnRef) -> bool:
        return a == b or (a in classes and b in classes and classes.connected(a, b))

    spj = model_check.SPJ(
        tuple(model_check.Use(u.alias, u.table) for u in form.uses), tuple(c.expr for c in form.conjuncts)
    )
    best = math.inf
    for use in form.uses:
        table = model.table(use.table)
        for column in table.columns:
            if not equal(ColumnRef(use.alias, column), key):
                continue
            if (use.table, column) in cuts:
                rows = float(cuts[(use.table, column)])
            elif (column,) in model_check.keys_of(table):
                rows = 1.0
            else:
                continue
            best = min(best, rows * cached_sensitivity(spj, model, use.table, TRUNCATED_TIMEOUT))
    return best


def declared_plan(plan: UnitPlan, catalog: Catalog, policy: Policy) -> UnitBoundPlan | None:
    """The global plan of an R2T plan whose unit's join rows the keys and declared bounds limit (module
    docstring), or None: R2T's race (several units per join row, semi-joins, an unbounded N)."""
    if plan.unit_key is None or len(plan.units) != 1 or plan.form.semijoins:
        return None
    truncations = unit_truncations(plan, catalog, policy)
    n = join_rows(plan, catalog, truncations)
    if not math.isfinite(n):
        return None
    agg = plan.aggregate
    if agg.kind == "count":
        largest = 1.0
    else:
        assert agg.kind == "sum" and agg.arg is not None
        lo, hi = interval(agg.arg, domain(plan.form, catalog, policy))
        largest = max(abs(lo), abs(hi))
    bound = n * largest
    if not prefer_declared(plan, bound, largest):
        return None
    unit = plan.units[0]
    terms = {
        unit.name: {
            "unit_join_rows": n,
            "largest": largest,
            "weight": 1.0,
            "sensitivity": bound,
            "method": "NR §3.3.13 under the unit's keys and declared bounds",
        }
    }
    return UnitBoundPlan(
        plan.form, agg, bound, terms, False, truncations, source=SOURCE, unit=unit, join_rows=n, raced=plan
    )


def prefer_declared(plan: UnitPlan, bound: float, largest: float) -> bool:
    """Whether the declared bound's error is at most R2T's on a database where one unit owns a single join row
    at the aggregate's largest |value| M (module docstring, "The choice"): from the policy, the schema and the
    query only, and the same at every ε (both errors are a constant over ε).

    * one total: Laplace at B/ε is within ln(1/β)·B/ε with probability 1 − β, R2T within 2·τ*·J·L/ε
      (sqldp.mechanisms.race.race_bound, R2T's Theorem 4.2 with τ* the first race ≥ M);
    * a GROUP BY: Laplace at B/ε on every group against the truncated histogram's τ*/ε₂, ε₂ = (1 −
      SELECT_SHARE)·ε (the race picks a τ no smaller than it needs, sqldp.mechanisms.race.histogram_release).
    """
    if plan.histogram:
        star = next((t for t in plan.thresholds if t >= largest), math.inf)
        return bound <= star / (1 - SELECT_SHARE)
    return (
        math.log(1 / plan.beta) * bound <= race_bound(plan.thresholds, 1.0, plan.beta, largest) * len(plan.signs) ** 2
    )


def agree(plans: tuple[Any, ...]) -> tuple[Any, ...]:
    """The plans of one query's aggregates, all declared bounds or all R2T: they share one answer query (a GROUP
    BY's truncated histograms, sqldp.sensitivity.units.grouped_answer, cover every aggregate at once), so where
    one aggregate's rule keeps the race (its M makes R2T's bound the smaller, :func:`prefer_declared`), every
    aggregate races."""
    if all(isinstance(p, UnitBoundPlan) for p in plans) or not any(isinstance(p, UnitBoundPlan) for p in plans):
        return plans
    if any(isinstance(p, UnitBoundPlan) and p.raced is None for p in plans):
        raise RefusedError(
            "COUNT(DISTINCT unit key) takes a bound of 1 (sqldp.sensitivity.unit_distinct) while another aggregate "
            "of the query races under R2T, and one query's aggregates share one answer: ask them separately"
        )
    return tuple(p.raced if isinstance(p, UnitBoundPlan) else p for p in plans)


def notes(plans: tuple[Any, ...]) -> tuple[str, ...]:
    """The notes of a query whose plans use a declared bound under a unit (one per distinct text)."""
    return tuple(dict.fromkeys(p.note() for p in plans if isinstance(p, UnitBoundPlan)))
