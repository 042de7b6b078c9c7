"""Sensitivity analyses: pure functions from (analysis form, catalog, policy) to a *plan* (DESIGN.md, step 3).

The plan contract, shared by every analysis and relied on by the runner:

* ``plan.queries`` — sqlglot SELECTs the runner executes in the answer's snapshot; their result rows are
  handed back to ``finish`` in the same order.
* ``plan.aggregate`` — the aggregate actually released (e.g. SUM over clamped columns); the runner computes
  the answer from it.
* ``plan.finish(results, beta, group=()) -> Bound`` — the β-smooth sensitivity bound for that β (and group),
  with a JSON-serialisable breakdown per table. It is called for many β on the same results (β is chosen to
  minimise the noise, NR Theorem 3.73), so it must not touch the database.
* ``plan.disjoint_groups`` — True when a neighbouring change can move the answer and the bound of at most
  one group (parallel composition over the groups, NR §3.3.10.4).

Analyses:

* :mod:`sqldp.sensitivity.rows` — adding/removing rows of private tables (NR §3.3.7).
"""

from __future__ import annotations

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity.rows import Bound, RowPlan, plan_rows

__all__ = ["Bound", "RowPlan", "plan", "plan_rows"]


def plan(form: AnalysisForm, catalog: Catalog, policy: Policy) -> RowPlan:
    """The plan for a form with one aggregate, from the analysis the policy calls for.

    Fail closed: a table whose policy protects values (a ``norm``) needs the value-level analysis of
    NR §3.3.8 for every query that reads one of its sensitive columns; this build answers such queries only
    when the answer cannot depend on those values."""
    reads = {ref for agg in form.aggregates for ref in agg.columns}
    reads |= {ref for c in form.conjuncts for ref in c.columns}
    reads |= {ColumnRef(k.table, k.name) for g in form.group_by for k in g.find_all(exp.Column) if k.table}
    for ref in sorted(reads, key=str):
        table = form.use(ref.alias).table
        tp = policy.table(table)
        if ref.column in tp.sensitive_columns:
            raise RefusedError(
                f"{ref} is a value-sensitive column of {table!r} (norm {tp.norm}); answering a query that "
                "reads it needs the value-level sensitivity of NR §3.3.8, which this build does not have"
            )
    # a table with public rows and private values contributes nothing when none of its values is read
    return plan_rows(form, catalog, policy)
