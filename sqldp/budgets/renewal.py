"""Budget renewal (NR §3.3.12.6; §3.3.12.7, "Increasing budgets"), pure.

A row's limit at a date is its ``row_epsilon`` plus the grants of the policy's public schedule up to that date
(every ``every_days`` days from ``start``, ``epsilon`` each, at most ``max`` in all). Budgets may grow, never
shrink: they are private, and taking budget away would need to know whether it is still there (the report).

What extra budget may be used for: §3.3.12.7 forbids spending it on a use that was excluded earlier — deciding
an excluded use again later changes when other uses are included, and the sensitivity is no longer bounded
(its counterexample, implemented in :mod:`sqldp.budgets.continual`). In sqldp's interactive release each use
(one row in one answer) is decided once, when the answer is computed, and an answer is never recomputed, so a
grant only ever pays for uses decided after it — the rule the report allows.
"""

from __future__ import annotations

import datetime as dt
import math

from sqldp.policy.tables import RowBudget


def grants(budget: RowBudget, on: dt.date) -> int:
    """How many grants the schedule has made by ``on`` (the first one ``every_days`` after ``start``)."""
    r = budget.renewal
    if r is None or on <= r.start:
        return 0
    return math.floor((on - r.start).days / r.every_days + 1e-12)


def limit_on(budget: RowBudget, on: dt.date) -> float:
    """Each row's limit on ``on``: ``row_epsilon`` plus the grants made by then, capped at ``max``."""
    r = budget.renewal
    total = budget.row_epsilon + (0.0 if r is None else r.epsilon * grants(budget, on))
    if r is not None and r.max is not None:
        total = min(total, r.max)
    return total
