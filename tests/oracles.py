"""Exact oracles for the brute-force privacy tests: every neighbour of a tiny database, and the exact privacy
loss between the output laws of two neighbours.

Written from the definitions, not from sqldp: nothing here imports sqldp (an oracle that calls the code under
test proves nothing). tests/test_oracles.py checks each function against a value worked out by hand.

Databases are plain data: a mapping of table name → list of rows, a row a tuple (columns by position) or a dict
(columns by name). A neighbour carries its distance d(D, D′) in the policy's metric (a row added or removed
weighs its table's weight; a value moved by δ in a norm weighs ‖w·δ‖_p; a unit added or removed weighs 1),
and a change's description for the failure message.

The losses:

- pure ε: the worst-case log density ratio sup_y ln p(y)/q(y) of two noisy values (Laplace: closed form;
  generalized Cauchy: a fine grid refined by a bounded search, and the tails, where the ratio tends to a
  constant), and its sum over a vector of independent coordinates;
- δ: the hockey-stick divergence H_{e^ε}(P‖Q) = sup_S P(S) − e^ε·Q(S) = ∫ max(0, p − e^ε·q): the Gaussian
  shift's closed form (Balle and Wang, ICML 2018, Theorem 8), the Laplace shift's closed form, a quadrature for
  unequal scales, and the exact sum for discrete laws (the exponential mechanism, partition selection, the
  sampler's grid).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal

Row = tuple[Any, ...] | dict[str, Any]
Db = Mapping[str, Sequence[Row]]
Column = int | str  # a tuple row's position or a dict row's key
Norm = Literal["l1", "l2", "linf"]
Noise = Literal["laplace", "cauchy", "gaussian"]

GAMMA = 4.0  # the generalized Cauchy's exponent γ that sqldp releases with (NR §4.3.3)


# -- neighbours ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Neighbour:
    """A neighbouring database, its distance from the original and what changed: the rows removed from and
    added to each table (a value change removes the old row and adds the new one), for a test that applies the
    change to a loaded database instead of loading ``db`` whole."""

    db: dict[str, list[Row]]
    distance: float
    change: str
    removed: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)
    added: Mapping[str, tuple[Row, ...]] = field(default_factory=dict)

    @property
    def table(self) -> str:
        """The one table a row-level change touches."""
        (table,) = set(self.removed) | set(self.added)
        return table

    @property
    def op(self) -> Literal["add", "remove", "change"]:
        """What a one-table change does: adds rows, removes them, or both (a value moved)."""
        return "change" if self.removed and self.added else "add" if self.added else "remove"

    @property
    def row(self) -> Row:
        """The one row a row-level change adds or removes."""
        (row,) = (*self.removed.get(self.table, ()), *self.added.get(self.table, ()))
        return row


def _copy(db: Db) -> dict[str, list[Row]]:
    return {table: list(rows) for table, rows in db.items()}


def _with(db: Db, table: str, rows: list[Row]) -> dict[str, list[Row]]:
    out = _copy(db)
    out[table] = rows
    return out


def rows_removed(db: Db, table: str, weight: float = 1.0, *, distinct: bool = False) -> Iterator[Neighbour]:
    """Each row of ``table`` removed (one at a time), at the table's weight; with ``distinct``, one of each set
    of equal rows (removing either gives the same database)."""
    rows = list(db[table])
    seen: list[Row] = []
    for i, row in enumerate(rows):
        if distinct and row in seen:
            continue
        seen.append(row)
        rest = rows[:i] + rows[i + 1 :]
        yield Neighbour(_with(db, table, rest), weight, f"{table} {row!r} removed", removed={table: (row,)})


def rows_added(db: Db, table: str, candidates: Iterable[Row], weight: float = 1.0) -> Iterator[Neighbour]:
    """Each candidate row added to ``table`` (one at a time, at the end), at the table's weight."""
    rows = list(db[table])
    for row in candidates:
        yield Neighbour(_with(db, table, [*rows, row]), weight, f"{table} {row!r} added", added={table: (row,)})


def row_neighbours(
    db: Db, added: Mapping[str, Iterable[Row]], weights: Mapping[str, float] | None = None, *, distinct: bool = False
) -> Iterator[Neighbour]:
    """Add/remove one row: for every private table (a key of ``added``), each of its rows removed, then each
    of its candidate rows added; at the table's weight (``weights``, 1 where it says nothing)."""
    for table, candidates in added.items():
        weight = (weights or {}).get(table, 1.0)
        yield from rows_removed(db, table, weight, distinct=distinct)
        yield from rows_added(db, table, candidates, weight)


def product_rows(*columns: Iterable[Any]) -> list[tuple[Any, ...]]:
    """Every row whose i-th column takes each of the i-th values (the candidates to add)."""
    return list(itertools.product(*columns))


def _get(row: Row, column: Column) -> Any:
    return row[column] if isinstance(row, dict) else row[int(column)]


def _set(row: Row, changes: Mapping[Column, Any]) -> Row:
    if isinstance(row, dict):
        return {**row, **changes}
    out = list(row)
    for column, value in changes.items():
        out[int(column)] = value
    return tuple(out)


def norm_distance(shifts: Sequence[float], weights: Sequence[float], norm: Norm) -> float:
    """‖(w_i·δ_i)_i‖_p, the distance of a row whose values move by δ_i with column weights w_i."""
    scaled = [abs(w * d) for w, d in zip(weights, shifts, strict=True)]
    if norm == "l1":
        return math.fsum(scaled)
    if norm == "l2":
        return math.sqrt(math.fsum(x * x for x in scaled))
    if norm == "linf":
        return max(scaled, default=0.0)
    raise ValueError(f"unknown norm {norm!r}")


def values_changed(
    db: Db,
    table: str,
    columns: Mapping[Column, float],
    shifts: Iterable[Any],
    *,
    norm: Norm = "l1",
    joint: bool = False,
    within: Callable[[Column, Any], bool] | None = None,
    add: Callable[[Any, Any], Any] = lambda value, shift: value + shift,
    size: Callable[[Any], float] = lambda shift: float(abs(shift)),
) -> Iterator[Neighbour]:
    """Each row of ``table`` with its values moved, the row kept: ``columns`` maps a column to its weight in the
    norm. Each column alone moves by each of ``shifts`` (distance |δ|·w); with ``joint``, every combination of
    shifts over the columns (0 included, all-zero left out) moves together, at ‖w·δ‖_p of ``norm`` — the grid
    points of the ball. ``within(column, value)`` drops moves outside a declared range; ``add`` and ``size``
    apply and measure a shift (dates move by a timedelta, whose size is in days, say)."""
    names = list(columns)
    weights = [columns[c] for c in names]
    steps = list(shifts)
    if joint:
        # each column stays (None) or moves by a nonzero shift
        options = [[None, *(s for s in steps if size(s) != 0)]] * len(names)
        combos = [c for c in itertools.product(*options) if any(s is not None for s in c)]
    else:
        combos = [tuple(s if j == i else None for j in range(len(names))) for i in range(len(names)) for s in steps]
    rows = list(db[table])
    for i, row in enumerate(rows):
        for combo in combos:
            moves = {c: s for c, s in zip(names, combo, strict=True) if s is not None and size(s) != 0}
            if not moves:
                continue
            new = {c: add(_get(row, c), s) for c, s in moves.items()}
            if within is not None and not all(within(c, v) for c, v in new.items()):
                continue
            sizes = [size(s) if s is not None else 0.0 for s in combo]
            d = norm_distance(sizes, weights, norm)
            moved = _set(row, new)
            out = _with(db, table, [*rows[:i], moved, *rows[i + 1 :]])
            yield Neighbour(out, d, f"{table} {row!r} → {moved!r}", removed={table: (row,)}, added={table: (moved,)})


def value_set(db: Db, table: str, index: int, column: Column, value: Any, weight: float = 1.0) -> Neighbour:
    """Row ``index`` of ``table`` with ``column`` set to ``value``, at |new − old|·w (the difference taken in
    the values' own type: Decimals subtract exactly)."""
    rows = list(db[table])
    row = rows[index]
    old = _get(row, column)
    moved = _set(row, {column: value})
    d = float(abs(value - old)) * weight
    out = _with(db, table, [*rows[:index], moved, *rows[index + 1 :]])
    return Neighbour(out, d, f"{table} {row!r} → {moved!r}", removed={table: (row,)}, added={table: (moved,)})


def values_set(
    db: Db, table: str, targets: Mapping[Column, Iterable[Any]], weights: Mapping[Column, float] | None = None
) -> Iterator[Neighbour]:
    """Each row of ``table`` with one value set to each of its targets (the ends of a declared range, say),
    where that changes it; at |new − old|·w (``weights``, 1 where it says nothing)."""
    for i, row in enumerate(db[table]):
        for column, values in targets.items():
            for value in values:
                if value != _get(row, column):
                    yield value_set(db, table, i, column, value, (weights or {}).get(column, 1.0))


def unit_rows(db: Db, links: Mapping[str, Column | Callable[[Row], Hashable]], unit: Hashable) -> dict[str, list[Row]]:
    """The rows of every linked table that belong to ``unit``: ``links`` maps a table to the column holding its
    rows' unit key (the unit table's own key, a foreign key to it), or to a function of the row giving it (a
    row reached through two foreign keys)."""
    out = {}
    for table, link in links.items():
        owner = link if callable(link) else (lambda row, c=link: _get(row, c))
        out[table] = [row for row in db[table] if owner(row) == unit]
    return out


def units_removed(
    db: Db, links: Mapping[str, Column | Callable[[Row], Hashable]], units: Iterable[Hashable], weight: float = 1.0
) -> Iterator[Neighbour]:
    """Each unit removed with all its rows, in every linked table (see ``unit_rows``)."""
    for unit in units:
        mine = unit_rows(db, links, unit)
        out = _copy(db)
        for table, rows in mine.items():
            out[table] = [row for row in db[table] if not any(row is r for r in rows)]
        removed = {t: tuple(rows) for t, rows in mine.items() if rows}
        yield Neighbour(out, weight, f"unit {unit!r} removed ({sum(map(len, mine.values()))} rows)", removed=removed)


def units_added(db: Db, candidates: Iterable[Mapping[str, Sequence[Row]]], weight: float = 1.0) -> Iterator[Neighbour]:
    """Each candidate unit added: a mapping of table → the unit's rows there, appended to those tables."""
    for unit in candidates:
        out = _copy(db)
        for table, rows in unit.items():
            out[table] = [*out.get(table, []), *rows]
        added = {t: tuple(rows) for t, rows in unit.items() if rows}
        yield Neighbour(out, weight, f"unit added: {dict(unit)!r}", added=added)


def sql_literal(value: Any) -> str:
    """A value as a PostgreSQL literal: NULL, a number as written, anything else (text, a date) quoted."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float | Decimal):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _where(cols: Sequence[str], row: Row) -> str:
    return f"{cols[0]} = {sql_literal(_get(row, 0))}"


def _insert(table: str, cols: Sequence[str], row: Row) -> str:
    return f"INSERT INTO {table} VALUES ({', '.join(sql_literal(_get(row, i)) for i in range(len(cols)))})"


def _update(table: str, cols: Sequence[str], row: Row, to: Row) -> str:
    """The columns that differ set by the row's key (a value change keeps the key)."""
    sets = ", ".join(f"{c} = {sql_literal(_get(to, i))}" for i, c in enumerate(cols) if _get(to, i) != _get(row, i))
    return f"UPDATE {table} SET {sets} WHERE {_where(cols, row)}"


def sql_statements(n: Neighbour, columns: Mapping[str, Sequence[str]]) -> tuple[str, str]:
    """The SQL that turns the loaded original into ``n`` and the SQL that turns it back, for tuple rows whose
    first column is a key: rows removed are deleted by key (and inserted back), rows added inserted (and
    deleted), a value change an UPDATE of the columns it changes, by key. ``columns`` names each table's columns."""
    make, undo = [], []
    for table in sorted(set(n.removed) | set(n.added)):
        cols = columns[table]
        gone, new = list(n.removed.get(table, ())), list(n.added.get(table, ()))
        if gone and new:  # a value change keeps the key
            for old, moved in zip(gone, new, strict=True):
                make.append(_update(table, cols, old, moved))
                undo.append(_update(table, cols, moved, old))
            continue
        deletes = [f"DELETE FROM {table} WHERE {_where(cols, row)}" for row in (*gone, *new)]
        make += deletes[: len(gone)] + [_insert(table, cols, row) for row in new]
        undo += [_insert(table, cols, row) for row in gone] + deletes[len(gone) :]
    return "; ".join(make), "; ".join(undo)


# -- densities, written from their definitions -----------------------------------------------------------------


def laplace_density(y: float, mu: float, b: float) -> float:
    """Lap(μ, b): e^(−|y − μ|/b) / (2b)."""
    return math.exp(-abs(y - mu) / b) / (2 * b)


def laplace_cdf(y: float, mu: float, b: float) -> float:
    """P[μ + Lap(b) ≤ y]."""
    return 0.5 * math.exp((y - mu) / b) if y < mu else 1 - 0.5 * math.exp(-(y - mu) / b)


def gencauchy_density(y: float, mu: float, s: float, gamma: float = GAMMA) -> float:
    """μ + s·η, η with density ∝ 1/(1 + |z|^γ); ∫ dz/(1 + |z|^γ) = (2π/γ)/sin(π/γ) normalises it."""
    z = (y - mu) / s
    return gamma * math.sin(math.pi / gamma) / (2 * math.pi) / (1 + abs(z) ** gamma) / s


def gaussian_density(y: float, mu: float, sigma: float) -> float:
    z = (y - mu) / sigma
    return math.exp(-z * z / 2) / (sigma * math.sqrt(2 * math.pi))


def normal_cdf(x: float) -> float:
    """Φ(x) = erfc(−x/√2)/2 (erfc keeps the lower tail's relative precision)."""
    return 0.5 * math.erfc(-x / math.sqrt(2))


DENSITIES: dict[str, Callable[[float, float, float], float]] = {
    "laplace": laplace_density,
    "cauchy": gencauchy_density,
    "gaussian": gaussian_density,
}


# -- pure ε: the worst-case log ratio --------------------------------------------------------------------------


def laplace_log_ratio(v: float, s: float, w: float, t: float) -> float:
    """sup_y ln p(y)/q(y) for p = Lap(v, s), q = Lap(w, t), exactly. ln p − ln q = ln(t/s) − |y − v|/s +
    |y − w|/t is piecewise linear in y with kinks at v and w: its sup is at a kink, or in a tail, where its
    slope 1/t − 1/s (towards ±∞) makes it unbounded when p's tails are heavier (s > t)."""
    if s > t:
        return math.inf
    return max(math.log(t / s) - abs(y - v) / s + abs(y - w) / t for y in (v, w))


def laplace_loss(d: float, b: float) -> float:
    """The Laplace mechanism's privacy loss for a shift d at scale b: |d|/b."""
    return abs(d) / b


def cauchy_log_ratio(v: float, s: float, w: float, t: float, gamma: float = GAMMA) -> float:
    """sup_y ln p(y)/q(y) for y = v + s·η against y = w + t·η, η generalized Cauchy(γ): the best point of a
    fine grid around both centres, refined by a bounded scalar search, and the tails, where the ratio of the
    two densities tends to (s/t)^(γ−1)."""
    from scipy import optimize

    if s == 0.0 or t == 0.0:
        return 0.0 if (s == t and v == w) else math.inf

    def loss(y: float) -> float:
        return math.log(gencauchy_density(y, v, s, gamma)) - math.log(gencauchy_density(y, w, t, gamma))

    span = 60.0 * max(s, t) + abs(v - w)
    lo, n = min(v, w) - span, 20_001
    step = (2 * span + abs(v - w)) / (n - 1)
    best = max((lo + i * step for i in range(n)), key=loss)
    refined = optimize.minimize_scalar(
        lambda y: -loss(y), bounds=(best - step, best + step), method="bounded", options={"xatol": 1e-12}
    )
    tail = (gamma - 1) * math.log(s / t)
    return max(loss(best), -refined.fun, tail)


def cauchy_loss(d: float, b: float, gamma: float = GAMMA) -> float:
    """The generalized Cauchy mechanism's privacy loss for a shift d at scale b (both directions agree)."""
    return cauchy_log_ratio(0.0, b, d, b, gamma)


def log_ratio(noise: str, v: float, s: float, w: float, t: float) -> float:
    """sup_y ln p(y)/q(y) of ``noise`` around v at scale s against around w at scale t (pure ε only: the
    Gaussian has no finite one)."""
    if noise in ("laplace", "laplace-global"):
        return laplace_log_ratio(v, s, w, t)
    if noise == "cauchy":
        return cauchy_log_ratio(v, s, w, t)
    raise ValueError(f"no pure-ε loss for {noise!r}")


def joint_loss(a: Sequence[tuple[Any, ...]], b: Sequence[tuple[Any, ...]]) -> float:
    """The exact privacy loss (the larger direction) of two released vectors of independent noise: ``a`` and
    ``b`` are (true value, noise scale[, mechanism]) per released coordinate, in release order; the mechanism is
    generalized Cauchy unless it says Laplace ("laplace", "laplace-global"). The supremum of a sum of functions
    of separate coordinates is the sum of their suprema."""
    assert len(a) == len(b), "the set of released coordinates must not depend on the data"

    def one(x: tuple[Any, ...], y: tuple[Any, ...]) -> float:
        mech = x[2] if len(x) > 2 else "cauchy"
        assert mech == (y[2] if len(y) > 2 else "cauchy"), "the mechanism must not depend on the data"
        return log_ratio("laplace" if mech in ("laplace", "laplace-global") else "cauchy", x[0], x[1], y[0], y[1])

    there = sum(one(x, y) for x, y in zip(a, b, strict=True))
    back = sum(one(y, x) for x, y in zip(a, b, strict=True))
    return max(there, back)


# -- δ: the hockey-stick divergence ----------------------------------------------------------------------------


def gaussian_delta(d: float, sigma: float, epsilon: float) -> float:
    """H_{e^ε}(N(0, σ²)‖N(d, σ²)) = Φ(D/2 − ε/D) − e^ε·Φ(−D/2 − ε/D), D = |d|/σ (Balle and Wang, ICML 2018,
    Theorem 8); for a vector, d is the ℓ2 norm of the shift over a common σ (or D of the shifts over their σ's
    with σ = 1). The second term is taken in logs: e^ε overflows long before the product does."""
    from scipy import special

    if d == 0:
        return 0.0
    big_d = abs(d) / sigma
    first = float(special.ndtr(big_d / 2 - epsilon / big_d))
    second = math.exp(epsilon + float(special.log_ndtr(-big_d / 2 - epsilon / big_d)))
    return max(0.0, first - second)


def laplace_delta(d: float, b: float, epsilon: float) -> float:
    """H_{e^ε}(Lap(0, b)‖Lap(d, b)) = 1 − e^((ε − |d|/b)/2) when |d| > b·ε, else 0: the log ratio is |d|/b left
    of both centres, falls linearly between them, and exceeds ε left of y₀ = (|d| − bε)/2, where the two
    terms P[Y < y₀] = 1 − e^(−y₀/b)/2 and e^ε·Q[Y < y₀] = e^ε·e^(−(|d| − y₀)/b)/2 both leave e^((ε − |d|/b)/2)/2."""
    if abs(d) <= b * epsilon:
        return 0.0
    return -math.expm1((epsilon - abs(d) / b) / 2)


def hockey_stick_continuous(
    noise: str, mu1: float, s1: float, mu2: float, s2: float, epsilon: float, *, tails: float = 200.0
) -> float:
    """H_{e^ε}(P‖Q) = ∫ max(0, p − e^ε·q) for P around mu1 at scale s1 and Q around mu2 at s2 of ``noise``'s
    law, by quadrature over ``tails`` scales beyond both centres (unequal scales have no closed form here)."""
    from scipy import integrate

    density = DENSITIES["laplace" if noise.startswith("laplace") else noise]
    k = math.exp(epsilon)

    def excess(y: float) -> float:
        return max(0.0, density(y, mu1, s1) - k * density(y, mu2, s2))

    width = tails * max(s1, s2)
    lo, hi = min(mu1, mu2) - width, max(mu1, mu2) + width
    return integrate.quad(excess, lo, hi, points=sorted({mu1, mu2}), limit=2000, epsabs=1e-14)[0]


def _log_ratio(a: Any, b: Any) -> float:
    """ln a/b for floats, ints, Fractions or gmpy2 numbers, without underflowing a tiny exact value (the
    difference of two gmpy2 logs is taken before it is rounded to a float)."""
    if type(a).__module__.startswith("gmpy2") or type(b).__module__.startswith("gmpy2"):
        import gmpy2

        return float(gmpy2.log(a) - gmpy2.log(b))
    if isinstance(a, Fraction) or isinstance(b, Fraction):
        r = Fraction(a) / Fraction(b)
        return math.log(r.numerator) - math.log(r.denominator)
    return math.log(a) - math.log(b)


def max_log_ratio(p: Mapping[Any, Any], q: Mapping[Any, Any], outcomes: Iterable[Any] | None = None) -> float:
    """max over outcomes of |ln P(o) − ln Q(o)| for two discrete laws (both directions); ∞ where one gives an
    outcome the other never does. ``outcomes`` defaults to both supports (a law absent from a key gives 0)."""
    keys = set(p) | set(q) if outcomes is None else set(outcomes)
    worst = 0.0
    for o in keys:
        a, b = p.get(o, 0), q.get(o, 0)
        if a == 0 and b == 0:
            continue
        if a == 0 or b == 0:
            return math.inf
        worst = max(worst, abs(_log_ratio(a, b)))
    return worst


def hockey_stick(p: Mapping[Any, Any], q: Mapping[Any, Any], epsilon: float) -> float:
    """H_{e^ε}(P‖Q) = Σ_o max(0, P(o) − e^ε·Q(o)) for two discrete laws (the set S is where P > e^ε·Q)."""
    k = math.exp(epsilon)
    return math.fsum(max(0.0, float(p.get(o, 0)) - k * float(q.get(o, 0))) for o in set(p) | set(q))


def hockey_stick_both(p: Mapping[Any, Any], q: Mapping[Any, Any], epsilon: float) -> float:
    """The larger of H_{e^ε}(P‖Q) and H_{e^ε}(Q‖P): (ε, δ)-DP bounds both."""
    return max(hockey_stick(p, q, epsilon), hockey_stick(q, p, epsilon))


def exponential_law(scores: Mapping[Any, float], rate: float) -> dict[Any, float]:
    """The exponential mechanism's output law: P(v) ∝ e^(rate·score(v)) (rate = ε/(2Δ) or ε/Δ as the caller's
    theorem has it), computed from the top score down so that nothing overflows."""
    top = max(scores.values())
    w = {v: math.exp(rate * (x - top)) for v, x in scores.items()}
    z = math.fsum(w.values())
    return {v: x / z for v, x in w.items()}


def product_law(marginals: Mapping[Any, float]) -> dict[frozenset[Any], float]:
    """The law of the set of items kept when each is kept independently with its probability (a few items:
    the law has 2^n outcomes)."""
    items = list(marginals)
    out = {}
    for bits in itertools.product((False, True), repeat=len(items)):
        p = 1.0
        for item, kept in zip(items, bits, strict=True):
            p *= marginals[item] if kept else 1 - marginals[item]
        out[frozenset(i for i, kept in zip(items, bits, strict=True) if kept)] = p
    return out


# -- partition selection: a group's output is ⊥ or its noisy values above a threshold -------------------------


def laplace_exceeds(n: float, tau: float, b: float) -> float:
    """P[n + Lap(b) > τ]: the probability that partition selection releases a group of count n (the upper tail
    written out, not 1 − cdf, which loses a tiny probability's digits)."""
    return 0.5 * math.exp(-(tau - n) / b) if n <= tau else 1 - 0.5 * math.exp(-(n - tau) / b)


Selected = Sequence[tuple[Any, ...]]  # [(count, scale, ε share, τ), (value, scale, ε share, None), …]


def selection_hockey_stick(p: Selected | None, q: Selected | None, epsilon: float) -> float:
    """H_{e^ε}(P‖Q) = sup_S P(S) − e^ε·Q(S) for one group's output under partition selection: ⊥ (not selected,
    or absent: ``None``) or the noisy values (v_count > τ, then at most one more value), each Laplace around its
    true value. Integrated numerically over the count with the other value's contribution on a fine grid per
    v_count (4001 points over ±40 scales), fine enough for 10⁻⁹."""
    from scipy import integrate

    if p is None:
        return 0.0  # P is ⊥ with probability 1, which Q gives at least e^-ε... ≤ 0 after the sup: nothing to lose
    (n, bc, _, tau), *others = p
    p_bot = laplace_cdf(tau, n, bc)
    if q is None:  # absent on Q's side: every released output of P is an event Q never produces
        return 1.0 - p_bot
    (n2, bc2, _, tau2), *others2 = q
    assert (bc, tau) == (bc2, tau2) and [o[1:] for o in others] == [o[1:] for o in others2]  # data-independent
    q_bot = laplace_cdf(tau, n2, bc)
    # the other measurement's loss: ln(p/q) is independent of v_count; its contribution to the hockey stick is
    # the expectation over it, on a fine grid
    assert len(others) <= 1
    if others:
        (v, bs, _, _), (v2, _, _, _) = others[0], others2[0]
        lo, hi = min(v, v2) - 40 * bs, max(v, v2) + 40 * bs
        ys = [lo + (hi - lo) * i / 4000 for i in range(4001)]
        ws = [laplace_density(y, v, bs) * (hi - lo) / 4000 for y in ys]
        ratios = [laplace_density(y, v2, bs) / laplace_density(y, v, bs) for y in ys]
    else:
        ws, ratios = [1.0], [1.0]
    k = math.exp(epsilon)

    def excess(x: float) -> float:
        fp, fq = laplace_density(x, n, bc), laplace_density(x, n2, bc)
        return sum(w * max(0.0, fp - k * fq * r) for w, r in zip(ws, ratios, strict=True))

    upper = max(n, n2, tau) + 60 * bc
    area, _ = integrate.quad(excess, tau, upper, points=sorted({n, n2}), limit=400)
    return max(0.0, p_bot - k * q_bot) + area


def _bot_or_value(g: tuple[float, float, float] | None) -> tuple[float, Callable[[float], float]]:
    """A group's output law: the mass of ⊥ (not released, or absent) and the density of its released value."""
    if g is None:
        return 1.0, lambda v: 0.0
    n, b, tau = g
    return laplace_cdf(tau, n, b), lambda v: laplace_density(v, n, b) if v > tau else 0.0


def selection_hockey_stick_2(
    p: Sequence[tuple[float, float, float] | None], q: Sequence[tuple[float, float, float] | None], epsilon: float
) -> float:
    """H_{e^ε}(P‖Q) for two groups' independent outputs under partition selection, each ⊥ or its count
    (count, scale, τ) released above τ: the four atom/value patterns integrated numerically."""
    from scipy import integrate

    (ap1, fp1), (ap2, fp2) = (_bot_or_value(x) for x in p)
    (aq1, fq1), (aq2, fq2) = (_bot_or_value(x) for x in q)
    k = math.exp(epsilon)
    spans = [x for x in (*p, *q) if x is not None]
    tau = spans[0][2]
    hi = max(x[0] for x in spans) + tau + 60 * spans[0][1]
    total = max(0.0, ap1 * ap2 - k * aq1 * aq2)
    total += integrate.quad(lambda v: max(0.0, ap1 * fp2(v) - k * aq1 * fq2(v)), tau, hi, limit=400)[0]
    total += integrate.quad(lambda v: max(0.0, fp1(v) * ap2 - k * fq1(v) * aq2), tau, hi, limit=400)[0]
    total += integrate.dblquad(
        lambda w, v: max(0.0, fp1(v) * fp2(w) - k * fq1(v) * fq2(w)), tau, hi, tau, hi, epsabs=1e-11
    )[0]
    return total


# -- checking a claim over every neighbour ---------------------------------------------------------------------

Values = Sequence[tuple[Any, ...]]  # (true value, noise scale[, mechanism]) per released coordinate
Law = Mapping[Any, Any]  # a discrete output law: outcome → probability


@dataclass
class Worst:
    """The largest loss seen (ε for a pure claim, δ otherwise), its share of the claim, and where."""

    loss: float = 0.0
    share: float = 0.0
    change: str = ""
    pairs: int = 0


def check_neighbours(
    db: Db,
    neighbours: Iterable[Neighbour],
    output: Callable[[Db], Values | Law],
    *,
    epsilon: float,
    delta: float = 0.0,
    kind: Literal["values", "law", "gaussian"] = "values",
    epsilon_at: Callable[[float], float] | None = None,
    rel: float = 1e-9,
) -> Worst:
    """Assert the claim (ε, δ) on every pair (D, D′): ``output(D)`` is the mechanism's output, as the released
    coordinates' (value, scale[, mechanism]) (``kind="values"``: Laplace or generalized Cauchy noise per
    coordinate; ``"gaussian"``: one Gaussian vector of those σ's) or a discrete law (``"law"``). A neighbour at
    distance d is held to ε·d (``epsilon_at`` to say otherwise) and δ: a pure claim (δ = 0) by the worst-case
    log ratio, both directions; an (ε, δ) one by the hockey-stick divergence, both directions. Returns the
    worst pair, for the caller to assert that the neighbours do reach the claim."""
    at = epsilon_at or (lambda d: epsilon * d)
    x = output(db)
    worst = Worst()
    for n in neighbours:
        y = output(n.db)
        eps = at(n.distance)
        if kind == "law":
            assert isinstance(x, Mapping) and isinstance(y, Mapping)
            loss = hockey_stick_both(x, y, eps) if delta else max_log_ratio(x, y)
        elif kind == "gaussian":
            assert not isinstance(x, Mapping) and not isinstance(y, Mapping)
            assert [v[1] for v in x] == [v[1] for v in y], "the σ's must not depend on the data"
            shift = math.sqrt(math.fsum(((a[0] - b[0]) / a[1]) ** 2 for a, b in zip(x, y, strict=True)))
            loss = gaussian_delta(shift, 1.0, eps)
        else:
            assert not isinstance(x, Mapping) and not isinstance(y, Mapping)
            if delta:
                assert len(x) == 1 and len(y) == 1, "a δ claim over values: one coordinate"
                (a, b) = x[0], y[0]
                mech = a[2] if len(a) > 2 else "cauchy"
                loss = max(
                    hockey_stick_continuous(mech, a[0], a[1], b[0], b[1], eps),
                    hockey_stick_continuous(mech, b[0], b[1], a[0], a[1], eps),
                )
            else:
                loss = joint_loss(x, y)
        bound = delta if delta else eps
        assert loss <= bound * (1 + rel) + (0.0 if delta else 1e-12), (n.change, n.distance, loss, bound)
        share = loss / bound if bound else (0.0 if loss == 0 else math.inf)
        worst.pairs += 1
        if worst.pairs == 1 or share > worst.share:
            worst.loss, worst.share, worst.change = loss, share, n.change
    return worst
