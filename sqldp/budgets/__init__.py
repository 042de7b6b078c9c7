"""Per-row budgets with enforced limits and renewal (NR §3.3.12.6–7; docs/budgets.md).

:mod:`sqldp.budgets.analysis` decides whether a query is in a proven class and which rows it uses,
:mod:`sqldp.budgets.sql` generates the ledger and the statement that answers and charges in one snapshot,
:mod:`sqldp.budgets.rule` is the same rule in Python, :mod:`sqldp.budgets.renewal` the public renewal
schedule and :mod:`sqldp.budgets.continual` the report's continual mechanism over 1:n joins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqldp.budgets.analysis import Budgeted, analyse, budgeted_tables, refused
from sqldp.budgets.renewal import limit_on
from sqldp.budgets.sql import charged_statement, counts_statement, ledger_ddl, ledger_name
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.params import PrivacyParams
from sqldp.policy import Policy
from sqldp.rewrite import Statements
from sqldp.sensitivity.plan import Plan


def describe(
    form: AnalysisForm,
    plans: Sequence[Plan],
    statements: Statements,
    catalog: Catalog,
    policy: Policy,
    params: PrivacyParams | None,
) -> dict[str, Any]:
    """What ``explain`` says about a query under per-row budgets, from the query and the policy only: the
    class, the table and conditions that pick the charged rows, the ε each is charged and the limit schedule;
    or why the ledger would refuse it. How many rows that is, and how many are already excluded, depends on the
    data: :meth:`sqldp.session.Session.budget_counts` releases those with noise."""
    try:
        b = analyse(form, plans, statements, catalog, policy)
    except RefusedError as err:
        return {"refused": err.message}
    conditions = " AND ".join(e.sql(dialect="postgres") for e in b.own) or "no condition (every row)"
    r = b.budget.renewal
    limit = f"{b.budget.row_epsilon:g}" + (
        f", +{r.epsilon:g} every {r.every_days:g} days from {r.start}" + (f" up to {r.max:g}" if r.max else "")
        if r is not None
        else ""
    )
    return {
        "class": b.supported_class,
        "table": b.table,
        "charged_rows": conditions,
        "epsilon_per_row": None if params is None else params.epsilon,
        "limit": limit,
        "refused": None,
    }


def note(b: Budgeted, epsilon: float, limit: float) -> str:
    """What a budgeted run did, in data-independent terms."""
    return (
        f"per-row budgets ({b.supported_class}): each row of {b.table} the query uses was charged ε = {epsilon:g} "
        f"of its limit {limit:g}; used rows without room for it were excluded inside the statement"
    )


__all__ = [
    "Budgeted",
    "analyse",
    "budgeted_tables",
    "charged_statement",
    "counts_statement",
    "describe",
    "ledger_ddl",
    "ledger_name",
    "limit_on",
    "note",
    "refused",
]
