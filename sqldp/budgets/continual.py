"""The continual form of §3.3.12.7 (NR, "Enforcing Budget Limits"), pure: a COUNT over the rows of 1:n
joined tables released at every time point (or a SUM, with a value per joined row), each component row with
its own budget of uses.

Rows are added one per time point (row i at time i). A joined row is the chain of one row per table, each
joined to exactly one row of the table before (1:n joins); its *timestamp* is its component ids sorted in
decreasing order, and it becomes available when its last component is added. At each time point the
available joined rows are decided in increasing timestamp order: included (and each component charged one
use) when every component has a use left, else excluded. The release is the number included per time point.

Removing a joined row changes at most one other inclusion and causes no exclusion (NR Lemmas 3.103, 3.104):
the count's sensitivity is 2. With budgets that grow between time points (``grants``) the bound becomes T + 1
for T tables (Lemmas 3.105, 3.106) — provided extra budget is never spent on a joined row excluded earlier:
each joined row is decided once, at the time it becomes available. Deciding excluded rows again with new
budget moves the inclusion times of other rows and the sensitivity grows with the data (the report's
counterexample; tests/budgets/test_continual.py checks both by brute force).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def timestamp(components: Sequence[int]) -> tuple[int, ...]:
    """The report's timestamp of a joined row: its component ids in decreasing order."""
    return tuple(sorted(components, reverse=True))


def release(
    joined: Sequence[Sequence[int]],
    uses: Mapping[int, int],
    times: int,
    grants: Mapping[int, Mapping[int, int]] | None = None,
    values: Sequence[float] | None = None,
) -> tuple[float, ...]:
    """The sum of ``values`` (1 each: the COUNT) of the joined rows included at each time point 1 … ``times``.
    ``joined``: each joined row's component row ids; ``uses``: each row's initial budget in uses; ``grants``:
    time → row → extra uses added just before that time point."""
    left = dict(uses)
    counts: list[float] = []
    weight = list(values) if values is not None else [1.0] * len(joined)
    order = sorted(range(len(joined)), key=lambda i: timestamp(joined[i]))
    for t in range(1, times + 1):
        for row, extra in (grants or {}).get(t, {}).items():
            left[row] = left.get(row, 0) + extra
        n = 0.0
        for i in order:
            j = joined[i]
            if max(j) != t:  # decided once: when its last component is added
                continue
            if all(left.get(c, 0) >= 1 for c in j):
                for c in j:
                    left[c] -= 1
                n += weight[i]
        counts.append(n)
    return tuple(counts)
