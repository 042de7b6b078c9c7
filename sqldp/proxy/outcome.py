"""What a statement produced, before it is encoded for the wire (sqldp.proxy.messages): a result set or a
command tag; and the one row of ``SHOW sqldp.budget``."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from sqldp.proxy import ledger
from sqldp.proxy import values as v


@dataclass
class Outcome:
    """What a statement produced: a result set (columns and types) or only a command tag."""

    tag: str
    columns: list[str] | None = None
    types: list[int] | None = None
    rows: list[Any] = field(default_factory=list)  # tuples of values; DataRow messages where ``raw`` is set
    notice: bytes = b""  # a NoticeResponse sent with the answer (what a private answer cost, its error bars)
    # the statement the runner answered (None: answered otherwise): its result types are those its Describe
    # announces (ProxyServer.description), which ``types``, read off the Python values, only approximate
    query: str | None = None
    # the public fast path's result (sqldp.proxy.passthrough.Raw): ``rows`` are then DataRow messages as
    # PostgreSQL sent them, in text format, and the column facts are upstream's
    raw: Any = None


# SHOW sqldp.budget: the statement's words, and its one row's columns (amounts are numeric, exact as in the ledger)
BUDGET_SHOW = ("show", "sqldp", "budget")
BUDGET_COLUMNS = (
    "analyst",
    "epsilon_limit",
    "epsilon_spent",
    "epsilon_left",
    "delta_limit",
    "delta_spent",
    "delta_left",
    "queries",
)
BUDGET_TYPES = (v.TEXT, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.NUMERIC, v.INT8)


def budget_outcome(b: ledger.Balance) -> Outcome:
    """The analyst's balance as the one row of ``SHOW sqldp.budget``. It depends on the queries the analyst
    asked and the policy's limits, never on the data (docs/output.md, "What each output field reveals")."""
    delta_left = max(Decimal(0), b.delta_limit - b.delta_spent)
    row = (b.analyst, b.epsilon_limit, b.epsilon_spent, b.epsilon_left, b.delta_limit, b.delta_spent, delta_left)
    return Outcome("SHOW", list(BUDGET_COLUMNS), list(BUDGET_TYPES), [(*row, b.queries)])
