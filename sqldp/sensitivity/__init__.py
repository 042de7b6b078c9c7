"""Sensitivity analyses: pure functions from (analysis form, catalog, policy) to a *plan* (pipeline step 3 of
6, docs/layout.md).

The plan contract every analysis implements is :class:`sqldp.sensitivity.plan.Plan`: the queries to run in
the answer's snapshot, how their results bind to a β ↦ bound function, the aggregate it covers, whether
groups are disjoint, whether the bound is data-independent, and which conjuncts stay in the answer's WHERE.

Analyses:

* :mod:`sqldp.sensitivity.rows` — adding/removing rows of private tables (NR §3.3.7).
* :mod:`sqldp.sensitivity.global_bound` — the row-level bound from the schema's keys alone (NR §3.3.13's
  model checking), used instead of the data-dependent one when it is finite and the keys are enforced; and
  with the policy's declared contribution bounds (``max_rows_per``), which the query then enforces by
  truncation (:func:`truncated`; the session chooses per query, docs/truncation.md).
* :mod:`sqldp.sensitivity.units` — adding/removing one privacy unit with every row referencing it (R2T's
  truncated answers; the release step runs the race); :mod:`sqldp.sensitivity.unit_bounds` the global bound
  instead, where the keys and declared bounds limit a unit's join rows.
* :mod:`sqldp.sensitivity.columns` — changing values of sensitive columns (NR §3.3.8), combined with the
  row-level bound when rows are private too (NR §3.3.9); its expression and filter bounds are in
  :mod:`sqldp.sensitivity.expressions` and :mod:`sqldp.sensitivity.filters`.

Shared: :mod:`sqldp.sensitivity.intervals` (value bounds over the declared ranges) and
:mod:`sqldp.sensitivity.failures` (expressions PostgreSQL may fail on, refused before any plan); PostgreSQL's
integer division and rounding casts are described in :mod:`sqldp.pg_arithmetic`.
"""

from __future__ import annotations

from sqlglot import exp

from sqldp import subqueries
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity import failures
from sqldp.sensitivity.columns import ColumnPlan, plan_columns
from sqldp.sensitivity.global_bound import GlobalPlan, Truncation, global_plan, truncated_plan, workflow_plan
from sqldp.sensitivity.intervals import domain
from sqldp.sensitivity.plan import Bound, Plan
from sqldp.sensitivity.rows import RowPlan, plan_rows, with_key_ranges
from sqldp.sensitivity.unit_bounds import UnitBoundPlan, declared_plan
from sqldp.sensitivity.unit_distinct import distinct_plan
from sqldp.sensitivity.units import UnitPlan, plan_units, unit_tables

__all__ = [
    "Bound",
    "ColumnPlan",
    "GlobalPlan",
    "Plan",
    "RowPlan",
    "Truncation",
    "UnitBoundPlan",
    "UnitPlan",
    "plan",
    "plan_columns",
    "plan_rows",
    "plan_units",
    "truncated",
]


def plan(form: AnalysisForm, catalog: Catalog, policy: Policy, beta: float | None = None) -> Plan:
    """The plan for a form with one aggregate, from the analysis the policy calls for.

    * the query reads no value-sensitive column (a column of a table's ``norm``): the row-level plan (§3.3.7);
    * it does, and no table in it has private rows: the value-level plan (§3.3.8);
    * it does, and some table has private rows: the combined plan (§3.3.9).
    Shapes the analyses do not cover are refused by them with the reason (fail closed).
    ``beta`` is the β the user fixed (None: the release step optimises it); the value plan then evaluates only it.

    When the query reads a table that belongs to a privacy unit (``[units.NAME]``), the neighbours differ by a
    unit, not a row: R2T's plan (:mod:`sqldp.sensitivity.units`) answers it."""
    distinct = any(agg.distinct for agg in form.aggregates)
    # the semi-joins' uses and conditions count as read and evaluated (sqldp.subqueries): for the value-level
    # and unit decisions and the failure checks, the form with them in its product
    checked = subqueries.flat(form, policy.is_sensitive)
    if policy.units and unit_tables(checked, catalog, policy):
        subqueries.refuse_outside_rows(form, "R2T under a privacy unit does not model the derived table")
        if distinct:  # R2T truncates per-unit contributions that add up; distinct values do not add up
            return distinct_plan(form, catalog, policy)  # the unit's key: a bound of 1 (unit_distinct), or refused
        failures.check(form, domain(form, catalog, policy), bounded_sum=True)
        raced = plan_units(form, catalog, policy)
        # a unit whose join rows the keys and declared bounds limit: that global bound, no race (unit_bounds)
        return declared_plan(raced, catalog, policy) or raced
    # a key column θ leaves free but the policy bounds gets its range in WHERE, so that the row analysis may
    # take its table as determined with a fan-out (sqldp.sensitivity.rows, "key columns a conjunct keeps among
    # a few integers"); a conjunct on a column outside every norm, read by every plan and the answer alike
    form = with_key_ranges(form, catalog, policy)
    reads = _reads(checked)
    values = _reads_values(checked, policy, reads)
    # a data-dependent error would answer without noise: refused first (failures.py)
    failures.check(checked, domain(checked, catalog, policy), bounded_sum=not values)
    if values:
        # semi-joins and scalar subqueries: their steps are bounded per key (sqldp.sensitivity.columns)
        if distinct and any(
            ref.column in policy.table(form.use(ref.alias).table).sensitive_columns
            for agg in form.aggregates
            for ref in agg.columns
        ):
            # a distinct count of a value in a norm jumps when that value crosses another: no derivative
            # (NR §3.3.8); over other columns it is analysed as COUNT (columns.check_distinct's proof)
            raise RefusedError("COUNT(DISTINCT …) over value-sensitive columns is not a continuous function of them")
        _bounded_types(form, catalog, reads)
        return plan_columns(form, catalog, policy, beta)
    # a table with public rows and private values contributes nothing when none of its values is read
    rows = plan_rows(form, catalog, policy)
    chosen: Plan = rows
    if not rows.data_independent or rows.keyed:
        # the schema's keys may bound the join on every database (NR §3.3.13): then no smoothing is needed. Tried
        # too when the row plan is data-independent through keys: the model checker counts a self-join's row
        # once (k a ⋈ k b on the key: 1), the row plan once per use (2)
        chosen = global_plan(rows, catalog) or rows
        # with semi-joins, the workflow's composition too (NR §3.3.13.9, Prop. 3.2): both bounds hold on every
        # database, so the smaller one is used (a choice from the query and the schema only)
        composed = workflow_plan(rows, catalog)
        if composed is not None and (chosen.global_bound is None or composed.bound < chosen.global_bound):
            chosen = composed
    if distinct and not chosen.data_independent:
        # A neighbouring change adds or removes product rows, each of which changes the distinct count by at most
        # one: |ΔCOUNT(DISTINCT e)| ≤ |ΔCOUNT(*)|, so a global bound of COUNT(*) is one of COUNT(DISTINCT e)
        # (Laplace at c/ε, Dwork et al. 2006; and Σ over disjoint or ℓ1 groups likewise). NR's smoothing is
        # proved for the derivative of a function of the multiplicities (Thm 3.53), which a distinct count is
        # not, so a data-dependent bound is not used for it.
        raise RefusedError(
            "COUNT(DISTINCT …) needs a bound that holds on every database: here a private table's rows join "
            "another private table's and no schema key bounds the join"
        )
    return chosen


def truncated(
    form: AnalysisForm, catalog: Catalog, policy: Policy, truncations: tuple[Truncation, ...]
) -> GlobalPlan | None:
    """The row-level plan's global bound when the query reads the ``truncations``' tables truncated to their
    declared τ rows per key (:func:`sqldp.sensitivity.global_bound.truncated_plan`), or None where that does
    not apply: value-sensitive columns, privacy units, COUNT(DISTINCT …), or a bound that stays unbounded.
    The caller (:func:`sqldp.strategies.aggregate.compile_form`) has already built the untruncated plan, which refused
    what the analyses do not cover."""
    if not truncations or (policy.units and unit_tables(form, catalog, policy)):
        return None
    if any(agg.distinct for agg in form.aggregates) or _reads_values(form, policy, _reads(form)):
        return None
    return truncated_plan(plan_rows(form, catalog, policy), catalog, policy, truncations)


def _reads(form: AnalysisForm) -> set[ColumnRef]:
    reads = {ref for agg in form.aggregates for ref in agg.columns}
    reads |= {ref for c in form.conjuncts for ref in c.columns}
    reads |= {ColumnRef(k.table, k.name) for g in form.group_by for k in g.find_all(exp.Column) if k.table}
    return reads


def _reads_values(form: AnalysisForm, policy: Policy, reads: set[ColumnRef]) -> bool:
    """Whether the query reads a value-sensitive column (a column of its table's ``norm``)."""
    return any(ref.column in policy.table(form.use(ref.alias).table).sensitive_columns for ref in reads)


def _bounded_types(form: AnalysisForm, catalog: Catalog, reads: set[ColumnRef]) -> None:
    """The value-level analysis computes its smooth filters, window weights and per-row bounds in double
    precision over the columns it reads (NR §3.3.8.4's sigmoids). PostgreSQL fails such arithmetic on values
    near the limits of DOUBLE PRECISION (overflow at 1e308, underflow below 1e-308) and carries NaN through
    it, so on a DOUBLE PRECISION, REAL or unconstrained NUMERIC column the statement would fail, or the bound
    would be NaN, for some data: an error or refusal that answers for that data. Integer, DATE and NUMERIC(p, s)
    values with p − s ≤ 300 and s ≤ 300 lie well inside double precision's range and are never subnormal, so
    only those are read by the value-level analysis. (NUMERIC(p, s) still admits NaN: an open case, see
    docs/sql.md, "Errors are answers too".)"""
    for ref in sorted(reads, key=str):
        column = catalog.table(form.use(ref.alias).table).column(ref.column)
        if column.kind == "numeric" and not _inside_double(column.type_sql):
            raise RefusedError(
                f"column {ref} has type {column.type_sql}, whose values (NaN, ±Infinity, magnitudes near 1e308) "
                "make the value-level analysis's double-precision SQL fail or its bound NaN for some data; "
                "declare it NUMERIC(p, s) or an integer type (NR §3.3.8)"
            )


def _inside_double(type_sql: str) -> bool:
    """NUMERIC(p, s) / DECIMAL(p, s) whose values stay between 1e-300 and 1e300 in magnitude (or are 0)."""
    head, _, args = type_sql.upper().replace(" ", "").partition("(")
    if head not in ("NUMERIC", "DECIMAL") or not args:
        return False
    p, _, s = args.rstrip(")").partition(",")
    scale = int(s or 0)
    return int(p) - scale <= 300 and scale <= 300
