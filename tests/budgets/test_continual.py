"""NR §3.3.12.7 by brute force on the continual mechanism (sqldp.budgets.continual): 1:n joins of two tables,
rows added one per time point, each row with a budget of uses, a SUM over the joined rows released at every
time point (values 0/1, so L = 1).

Checked for every database of up to 5 rows (each row a parent, or a child of an earlier parent), every budget
of 1 or 2 uses per row and, with renewal, every schedule of one-use grants to the parents: removing a child
(one joined row) moves the released series by at most 2 in L1 without renewal (Lemmas 3.103, 3.104) and at
most T + 1 = 3 with it (Lemmas 3.105, 3.106). The mutant that spends a grant on joined rows excluded earlier
(deciding them again at later time points) is caught on the report's counterexample: one parent, children
arriving one per time point, a grant before each.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from sqldp.budgets.continual import release, timestamp


def structures(n: int) -> list[tuple[int | None, ...]]:
    """Row i (1-based) is a parent (None) or a child of an earlier parent; row 1 is a parent."""
    out: list[tuple[int | None, ...]] = [()]
    for _i in range(1, n + 1):
        grown = []
        for s in out:
            parents = [j + 1 for j, p in enumerate(s) if p is None]
            for choice in (None, *parents):
                grown.append((*s, choice))
        out = grown
    return out


def joined_rows(shape: Sequence[int | None]) -> list[tuple[int, int]]:
    return [(p, i + 1) for i, p in enumerate(shape) if p is not None]


def l1(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def without(
    shape: Sequence[int | None], values: Mapping[int, int], row: int
) -> tuple[list[tuple[int, int]], list[int]]:
    """The joined rows and their values once ``row`` (a child) is removed."""
    kept = [j for j in joined_rows(shape) if j[1] != row]
    return kept, [values[j[1]] for j in kept]


def reincluding(
    joined: Sequence[Sequence[int]],
    uses: Mapping[int, int],
    times: int,
    grants: Mapping[int, Mapping[int, int]],
    values: Sequence[float],
) -> tuple[float, ...]:
    """The mutant: at every time point the joined rows excluded earlier are decided again, first (in
    timestamp order), so that new budget can include them."""
    left = dict(uses)
    pending: list[int] = []
    out = []
    order = sorted(range(len(joined)), key=lambda i: timestamp(joined[i]))
    for t in range(1, times + 1):
        for row, extra in grants.get(t, {}).items():
            left[row] = left.get(row, 0) + extra
        total = 0.0
        candidates = sorted(pending + [i for i in order if max(joined[i]) == t], key=lambda i: timestamp(joined[i]))
        pending = []
        for i in candidates:
            if all(left.get(c, 0) >= 1 for c in joined[i]):
                for c in joined[i]:
                    left[c] -= 1
                total += values[i]
            else:
                pending.append(i)
        out.append(total)
    return tuple(out)


def worst_child_removal(n: int, budgets: Sequence[int], with_grants: bool, mechanism=release) -> float:  # type: ignore[no-untyped-def]
    worst = 0.0
    for shape in structures(n):
        children = [i + 1 for i, p in enumerate(shape) if p is not None]
        if not children:
            continue
        parents = [i + 1 for i, p in enumerate(shape) if p is None]
        grant_sets: list[dict[int, dict[int, int]]] = [{}]
        if with_grants:
            slots = [(t, p) for t in range(2, n + 1) for p in parents if p < t]
            grant_sets = []
            for chosen in itertools.product((0, 1), repeat=len(slots)):
                g: dict[int, dict[int, int]] = {}
                for (t, p), c in zip(slots, chosen, strict=True):
                    if c:
                        g.setdefault(t, {})[p] = 1
                grant_sets.append(g)
        for uses in itertools.product(budgets, repeat=n):
            budget = {i + 1: u for i, u in enumerate(uses)}
            for vals in itertools.product((0, 1), repeat=len(children)):
                values = dict(zip(children, vals, strict=True))
                full = joined_rows(shape)
                full_values = [values[c] for _, c in full]
                for g in grant_sets:
                    base = mechanism(full, budget, n, g, full_values)
                    for c in children:
                        kept, kept_values = without(shape, values, c)
                        worst = max(worst, l1(base, mechanism(kept, budget, n, g, kept_values)))
    return worst


def test_structures_enumerate_every_one_to_n_database() -> None:
    # row 2: parent or child of 1; row 3: parent, or a child of any parent before it
    assert sorted(structures(3), key=str) == sorted(
        [(None, None, None), (None, None, 1), (None, None, 2), (None, 1, None), (None, 1, 1)], key=str
    )
    assert all(s[0] is None for s in structures(4))


def test_sensitivity_two_without_renewal() -> None:
    """Lemmas 3.103 and 3.104: removing a joined row includes at most one other and excludes none."""
    worst = max(worst_child_removal(n, (1, 2), with_grants=False) for n in (2, 3, 4, 5))
    assert worst <= 2
    assert worst == 2  # attained: the bound is tight


def test_sensitivity_t_plus_one_with_renewal() -> None:
    """Lemmas 3.105 and 3.106: with budgets that grow, at most T = 2 others included, none excluded."""
    worst = max(worst_child_removal(n, (1,), with_grants=True) for n in (2, 3, 4, 5))
    assert worst <= 3


def test_mutant_reincluding_excluded_uses_is_caught() -> None:
    """The report's counterexample: one parent (budget one use), children 2 … n, a grant before each child
    from the third on. The mutant moves every later inclusion by one time point when child 2 is removed, and
    with alternating values the series moves by more than T + 1."""
    n = 7
    shape: tuple[int | None, ...] = (None,) + (1,) * (n - 1)
    values = {c: (c % 2) for c in range(2, n + 1)}
    full = joined_rows(shape)
    grants = {t: {1: 1} for t in range(4, n + 1)}
    budget = {i: 1 for i in range(1, n + 1)}
    kept, kept_values = without(shape, values, 2)
    full_values = [values[c] for _, c in full]
    mutant = l1(reincluding(full, budget, n, grants, full_values), reincluding(kept, budget, n, grants, kept_values))
    honest = l1(release(full, budget, n, grants, full_values), release(kept, budget, n, grants, kept_values))
    assert honest <= 3 < mutant
    # and the brute force over every database of up to 5 rows finds it too
    assert max(worst_child_removal(n, (1,), with_grants=True, mechanism=reincluding) for n in (4, 5)) > 3
