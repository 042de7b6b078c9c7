"""The per-row budget rule, pure (NR §3.3.12.7; Feldman & Zrnic, "Individual Privacy Accounting via a Rényi
Filter", NeurIPS 2021): the statement of :mod:`sqldp.budgets.sql` does in PostgreSQL what :func:`admit` does
here, and the tests compare the two.

A query of ε reads the rows it *uses*; a used row whose spent ε plus ε would pass its limit is excluded from
the answer, the others are included and charged ε. Both decisions read only the ledger as it was before the
query (one snapshot) and the row's own data, so removing or changing one row changes no other row's decision:
the privacy loss of a row over the whole transcript is at most the ε of the answers it was included in, which
the rule keeps at most its limit (docs/budgets.md).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

# limits and amounts are compared with this much slack: ε values are sums of floats (0.1 + 0.2 ≠ 0.3)
SLACK = 1e-9


@dataclass(frozen=True)
class Admitted:
    """What one query does to the ledger: the used rows it includes (and charges) and those it excludes."""

    included: frozenset[Hashable]
    excluded: frozenset[Hashable]


def admit(spent: Mapping[Hashable, float], used: Iterable[Hashable], epsilon: float, limit: float) -> Admitted:
    """The used rows with room for ``epsilon`` under ``limit`` are included, the others excluded. ``spent``
    is the ledger before the query (a row it lacks has spent nothing)."""
    included: set[Hashable] = set()
    excluded: set[Hashable] = set()
    for row in used:
        (included if spent.get(row, 0.0) + epsilon <= limit + SLACK else excluded).add(row)
    return Admitted(frozenset(included), frozenset(excluded))


def charge(spent: Mapping[Hashable, float], admitted: Admitted, epsilon: float) -> dict[Hashable, float]:
    """The ledger after the query: ``epsilon`` added to exactly the included rows."""
    out = dict(spent)
    for row in admitted.included:
        out[row] = out.get(row, 0.0) + epsilon
    return out
