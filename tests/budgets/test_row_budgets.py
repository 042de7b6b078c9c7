"""Brute force over tiny databases: per-row budgets keep every row's privacy loss within its budget.

For every database of 2–3 rows (a single table) or of 1–2 parents with up to 2 children each (a 1:n join
below the budgeted table), every neighbour (a value change inside a row; adding or removing a row), and every
path of a small adaptive strategy of 4 queries (each query's window and ε chosen from whether the earlier noisy
answers passed a threshold), the exact privacy loss of the whole transcript is computed analytically from the
Laplace densities and compared with the budget of the row that changed. The mechanism is the rule of
sqldp.budgets.rule over the used rows of sqldp.budgets.analysis (the budgeted rows passing the conditions on
their own table). Three mutants of the mechanism, written here as alternate functions, must each be caught.

Exact loss: along one path the queries are fixed, the answer at step t is y_t ~ Lap(a_t, b) on one database
and Lap(a'_t, b) on the other, and the path is taken for y_t in a half-line (or everywhere, at the last step).
The log density ratio is a sum of ℓ_t(y_t) = (|y_t − a'_t| − |y_t − a_t|)/b, one variable per step, so its
supremum over the path's transcripts is the sum of each ℓ_t's supremum over its half-line: a piecewise linear
function whose supremum is at a breakpoint (a_t, a'_t), the threshold or far out, all evaluated.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from sqldp.budgets.rule import Admitted, admit, charge

BIG = 1e6


@dataclass(frozen=True)
class Query:
    kind: str  # "count" or "sum"
    lo: int  # window on the budgeted row's t: lo <= t < hi
    hi: int
    epsilon: float


# an adaptive strategy: the query at each step from the bits "earlier answer ≥ threshold"
Strategy = Callable[[tuple[bool, ...]], Query]
THRESHOLD = 0.5


def strategy_windows(bits: tuple[bool, ...]) -> Query:
    """Rolling windows: the next window moves right after a large answer, widens after a small one."""
    if not bits:
        return Query("count", 0, 2, 0.5)
    lo = sum(bits)
    hi = 3 if not bits[-1] else lo + 2
    return Query("sum" if len(bits) % 2 else "count", min(lo, 2), max(hi, min(lo, 2) + 1), 0.5)


def strategy_mixed(bits: tuple[bool, ...]) -> Query:
    """Repeats the whole range with varying ε, narrowing on small answers."""
    if not bits:
        return Query("sum", 0, 3, 0.25)
    if bits[-1]:
        return Query("count", 0, 3, 0.5)
    return Query("sum", 1, 3, 0.75 if len(bits) == 1 else 0.25)


STRATEGIES = (strategy_windows, strategy_mixed)
STEPS = 4


# -- databases ------------------------------------------------------------------------------------------------
# single table: a row is (key, t, v), t in {0, 1, 2} (the public window column), v in {0, 1} (the value);
# 1:n join: parents (key, t), children (key, parent, v), at most TAU children per parent (a declared bound)

T_VALUES, V_VALUES, TAU = (0, 1, 2), (0, 1), 2


@dataclass(frozen=True)
class Db:
    parents: tuple[tuple[str, int], ...]  # (key, t)
    children: tuple[tuple[str, str, int], ...] = ()  # (key, parent key, v); empty: single table of (key, t, v)
    values: tuple[int, ...] = ()  # single table: each parent row's v
    joined: bool = False  # a 1:n join (parents and children), else a single table


def single_tables(n: int) -> list[Db]:
    kinds = list(itertools.product(T_VALUES, V_VALUES))
    out = []
    for rows in itertools.product(kinds, repeat=n):
        out.append(Db(tuple((f"r{i}", t) for i, (t, _) in enumerate(rows)), (), tuple(v for _, v in rows)))
    return out


def join_dbs() -> list[Db]:
    out = []
    for n_parents in (1, 2):
        # the parents' order does not matter to the mechanism: each set of windows once
        for ts in itertools.combinations_with_replacement(T_VALUES, n_parents):
            parents = tuple((f"p{i}", t) for i, t in enumerate(ts))
            slots = [(p, j) for p, _ in parents for j in range(TAU)]
            # each child slot empty or a child with v
            for fill in itertools.product((None, *V_VALUES), repeat=len(slots)):
                kids = tuple((f"c{p}{j}", p, v) for (p, j), v in zip(slots, fill, strict=True) if v is not None)
                out.append(Db(parents, kids, joined=True))
    return out


# -- the mechanism and its mutants ----------------------------------------------------------------------------


def used(db: Db, q: Query) -> list[Hashable]:
    """sqldp.budgets.analysis: the budgeted rows passing the conditions on their own table."""
    return [k for k, t in db.parents if q.lo <= t < q.hi]


def contributions(db: Db, q: Query, included: frozenset[Hashable]) -> float:
    """The exact answer over the included rows (and, for a join, their children)."""
    if not db.joined:
        return sum(
            (1 if q.kind == "count" else v) for (k, _), v in zip(db.parents, db.values, strict=True) if k in included
        )
    return sum((1 if q.kind == "count" else v) for _, p, v in db.children if p in included)


def sensitivity(db: Db) -> float:
    """sqldp's global bound for these queries: one row (a single table's row, v in [0, 1]); a parent with up
    to TAU children, or one child (1:n join under the declared bound)."""
    return float(TAU) if db.joined else 1.0


Mechanism = Callable[[Db, Query, dict[Hashable, float], float], tuple[float, dict[Hashable, float]]]


def correct(db: Db, q: Query, spent: dict[Hashable, float], limit: float) -> tuple[float, dict[Hashable, float]]:
    a = admit(spent, used(db, q), q.epsilon, limit)
    return contributions(db, q, a.included), charge(spent, a, q.epsilon)


def mutant_charges_unused(
    db: Db, q: Query, spent: dict[Hashable, float], limit: float
) -> tuple[float, dict[Hashable, float]]:
    """Charges the budgeted rows the answer did not use instead of those it used."""
    a = admit(spent, used(db, q), q.epsilon, limit)
    others = frozenset(k for k, _ in db.parents if k not in set(used(db, q)))
    return contributions(db, q, a.included), charge(spent, Admitted(others, frozenset()), q.epsilon)


def mutant_excludes_after(
    db: Db, q: Query, spent: dict[Hashable, float], limit: float
) -> tuple[float, dict[Hashable, float]]:
    """Answers over every used row and applies the exclusion to the charge only (after the answer)."""
    a = admit(spent, used(db, q), q.epsilon, limit)
    return contributions(db, q, frozenset(used(db, q))), charge(spent, a, q.epsilon)


def count_children_v1(db: Db, q: Query, spent: dict[Hashable, float], limit: float) -> tuple[float, dict]:
    """The correct mechanism for a query with a condition on the children too (v = 1)."""
    a = admit(spent, used(db, q), q.epsilon, limit)
    return float(sum(1 for _, p, v in db.children if p in a.included and v == 1)), charge(spent, a, q.epsilon)


# -- exact loss -----------------------------------------------------------------------------------------------


def sup_ratio(a: float, a2: float, b: float, region: tuple[float, float]) -> float:
    """sup over y in [lo, hi] of (|y − a2| − |y − a|)/b: at a breakpoint inside, or an end."""
    lo, hi = region
    points = [p for p in (a, a2) if lo <= p <= hi] + [lo, hi]
    return max((abs(y - a2) - abs(y - a)) / b for y in points)


def transcript_loss(d1: Db, d2: Db, strategy: Strategy, mechanism: Mechanism, limits: Sequence[float]) -> float:
    """The exact privacy loss of the whole transcript between d1 and d2: max over paths and both directions."""
    worst = 0.0
    for path in itertools.product((False, True), repeat=STEPS - 1):
        s1: dict[Hashable, float] = {}
        s2: dict[Hashable, float] = {}
        up = down = 0.0
        for step in range(STEPS):
            q = strategy(path[:step])
            b = sensitivity(d1) / q.epsilon
            a1, s1 = mechanism(d1, q, s1, limits[step])
            a2, s2 = mechanism(d2, q, s2, limits[step])
            region = ((THRESHOLD, BIG) if path[step] else (-BIG, THRESHOLD)) if step < STEPS - 1 else (-BIG, BIG)
            up += sup_ratio(a1, a2, b, region)
            down += sup_ratio(a2, a1, b, region)
        worst = max(worst, up, down)
    return worst


# -- neighbours -----------------------------------------------------------------------------------------------


def single_neighbours(db: Db) -> list[tuple[str, Db, str]]:
    """(the row that changed, the neighbour, the kind): each value change, each removal, each addition."""
    out = []
    for i, (key, _) in enumerate(db.parents):
        for v in V_VALUES:
            if v != db.values[i]:
                values = (*db.values[:i], v, *db.values[i + 1 :])
                out.append((key, Db(db.parents, (), values), "value"))
        out.append((key, Db(db.parents[:i] + db.parents[i + 1 :], (), db.values[:i] + db.values[i + 1 :]), "rows"))
    for t, v in itertools.product(T_VALUES, V_VALUES):
        out.append(("new", Db((*db.parents, ("new", t)), (), (*db.values, v)), "rows"))
    return out


def join_neighbours(db: Db) -> list[tuple[str, Db, str]]:
    """Removing a parent (its children then join nothing), removing a child, adding a child within TAU,
    adding a parent, changing a child's value."""
    out = []
    for i, (key, _) in enumerate(db.parents):
        out.append((key, Db(db.parents[:i] + db.parents[i + 1 :], db.children, joined=True), "rows"))
    for j, (key, parent, v) in enumerate(db.children):
        out.append((key, Db(db.parents, db.children[:j] + db.children[j + 1 :], joined=True), "rows"))
        changed = (*db.children[:j], (key, parent, 1 - v), *db.children[j + 1 :])
        out.append((key, Db(db.parents, changed, joined=True), "value"))
    for key, _ in db.parents:
        if sum(1 for _, p, _ in db.children if p == key) < TAU:
            for v in V_VALUES:
                out.append(("new", Db(db.parents, (*db.children, ("new", key, v)), joined=True), "rows"))
    for t in T_VALUES:
        out.append(("new", Db((*db.parents, ("new", t)), db.children, joined=True), "rows"))
    return out


def budget_of(row: str, limit: float) -> float:
    """A budgeted row's limit; a child's is its parent's (it reaches an answer only through its parent), the
    same limit here: every budgeted row has the same schedule."""
    return limit


def violations(
    dbs: Sequence[Db],
    neighbours: Callable[[Db], list[tuple[str, Db, str]]],
    mechanism: Mechanism,
    limits: Sequence[float],
    kinds: frozenset[str] = frozenset({"value", "rows"}),
    *,
    first: bool = False,
) -> list[tuple[Db, str, str, float]]:
    """Every (database, changed row, kind, loss) whose loss passes the row's budget (the first only, with
    ``first``: a mutant needs one)."""
    found = []
    for db in dbs:
        for row, other, kind in neighbours(db):
            if kind not in kinds:
                continue
            for strategy in STRATEGIES:
                loss = transcript_loss(db, other, strategy, mechanism, limits)
                if loss > budget_of(row, limits[-1]) + 1e-9:
                    found.append((db, row, kind, loss))
                    if first:
                        return found
    return found


FIXED = (1.0,) * STEPS
RENEWED = (1.0, 1.0, 1.5, 1.5)  # a grant of 0.5 before the third query (sqldp.budgets.renewal)
SINGLE = single_tables(2) + single_tables(3)
JOINS = join_dbs()


def test_the_strategies_spend_more_than_a_row_has() -> None:
    """Without exclusion the transcripts would exceed the budget: the test has teeth."""
    paths = [[s(p[:i]) for i in range(STEPS)] for s in STRATEGIES for p in itertools.product((0, 1), repeat=3)]
    assert max(sum(q.epsilon for q in path) for path in paths) > 1.5


def test_single_table_value_and_row_changes() -> None:
    assert violations(SINGLE, single_neighbours, correct, FIXED) == []


def test_single_table_with_renewal() -> None:
    assert violations(SINGLE, single_neighbours, correct, RENEWED) == []


def test_one_to_n_join_add_remove_and_values() -> None:
    assert violations(JOINS, join_neighbours, correct, FIXED) == []
    one_parent = [d for d in JOINS if len(d.parents) == 1]
    assert violations(one_parent, join_neighbours, count_children_v1, FIXED) == []


def test_one_to_n_join_with_renewal() -> None:
    assert violations(JOINS, join_neighbours, correct, RENEWED) == []


def test_mutant_charging_rows_not_used_is_caught() -> None:
    assert violations(SINGLE, single_neighbours, mutant_charges_unused, FIXED, first=True)
    assert violations(JOINS, join_neighbours, mutant_charges_unused, FIXED, first=True)


def test_mutant_excluding_after_the_answer_is_caught() -> None:
    for kind in ("value", "rows"):
        assert violations(SINGLE, single_neighbours, mutant_excludes_after, FIXED, frozenset({kind}), first=True)
    assert violations(JOINS, join_neighbours, mutant_excludes_after, FIXED, first=True)


def test_exact_loss_matches_the_laplace_bound_on_one_query() -> None:
    """The loss function itself: one COUNT at ε = 0.5 between databases whose answers differ by 1 is 0.5."""
    d1 = Db((("r0", 0),), (), (1,))
    d2 = Db((), (), ())

    def once(bits: tuple[bool, ...]) -> Query:
        return Query("count", 0, 3, 0.5 if not bits else 1e-9)

    assert abs(transcript_loss(d1, d2, once, correct, (10.0,) * STEPS) - 0.5) < 1e-6
