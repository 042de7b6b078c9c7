"""Per-row budgets with enforced limits and renewal (NR §3.3.12.6–7; docs/budgets.md).

:mod:`sqldp.budgets.analysis` decides whether a query is in a proven class and which rows it uses,
:mod:`sqldp.budgets.sql` generates the ledger and the statement that answers and charges in one snapshot,
:mod:`sqldp.budgets.rule` is the same rule in Python, :mod:`sqldp.budgets.renewal` the public renewal
schedule and :mod:`sqldp.budgets.continual` the report's continual mechanism over 1:n joins.
"""

from __future__ import annotations

from sqldp.budgets.analysis import Budgeted, analyse, budgeted_tables, refused
from sqldp.budgets.renewal import limit_on
from sqldp.budgets.sql import charged_statement, counts_statement, ledger_ddl, ledger_name


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
    "ledger_ddl",
    "ledger_name",
    "limit_on",
    "note",
    "refused",
]
