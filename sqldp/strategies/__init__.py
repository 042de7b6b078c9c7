"""Query strategies: each shape of statement sqldp answers, tried in order (as sqlglot's optimizer keeps its
rules in an ordered tuple). A strategy is a module with ``recognise(parsed, context, privacy)``: the statement
compiled (:class:`sqldp.strategies.base.Compiled`), or None for another shape; the first that answers decides.

* :mod:`~sqldp.strategies.setops` — UNION / INTERSECT / EXCEPT of branches over private tables;
* :mod:`~sqldp.strategies.selection` — public rows selected by private data (TPC-H Q20);
* :mod:`~sqldp.strategies.argmax` — the row of a grouped WITH query with the largest total (TPC-H Q15);
* :mod:`~sqldp.strategies.workflow` — uncorrelated scalar subqueries over private tables, released as steps;
* :mod:`~sqldp.strategies.aggregate` — every other statement: the analysed aggregate query, or a statement over
  public tables (last: it answers or refuses every statement). Its parts are :mod:`~sqldp.strategies.nested`
  (a histogram of per-key counts) and :mod:`~sqldp.strategies.owned` (groups owned by one private row).

A sub-query of a strategy (a set operation's branch, a workflow's step, a selection's public statements) is
analysed by :func:`sqldp.strategies.aggregate.analysed`, never through the session.
"""

from __future__ import annotations

from sqldp.frontend import ParsedQuery
from sqldp.strategies import aggregate, argmax, selection, setops, workflow
from sqldp.strategies.base import Compiled, Context, Privacy, Strategy

__all__ = ["STRATEGIES", "Compiled", "Context", "Privacy", "Strategy", "compile"]

STRATEGIES: tuple[Strategy, ...] = (setops, selection, argmax, workflow, aggregate)


def compile(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Compiled:
    """The statement compiled by the first strategy of :data:`STRATEGIES` that recognises it; reads no data."""
    for strategy in STRATEGIES:
        found = strategy.recognise(parsed, context, privacy)
        if found is not None:
            return found
    raise AssertionError("the aggregate strategy answers every statement")  # it is the last one
