"""Groups owned by one row (sqldp.strategies.owned): an independent brute-force oracle over every neighbour of a tiny
database.

Three private tables with enforced keys, ``cust(ck)``, ``ord(ok)`` and ``line(lk, ln)``, and the shapes of TPC-H
Q10 (a customer owns its group; its balance is a relabelled key), Q3 (an order owns its group; a customer owns
up to 2 of them through the declared ``max_rows_per = { ck = 2 }``, read truncated to the first 2 orders per
customer by ``ok``), Q18 (Q3 with an IN over ``line`` grouped by its key) and Q3 keyed by the customer's balance
too (TPC-H Q18's key holds the customer's columns: a balance change relabels each of its orders' groups).

For the base database and EVERY neighbour — each row removed, rows added (a 3rd order for a customer with 2,
which evicts one, orders and lines joining orphans, ...), each sensitive value moved by one grid step and by 5
(within its declared range) — this file computes in plain Python, independently of sqldp, the groups present and
their SUMs on both sides (the truncation written out here), and checks sqldp's own figures from
``session.analyze`` against them:

* the groups sqldp measures are the ones present, with the true SUMs, and each selector's true value is the
  group's indicator 1;
* at most ``owned_groups`` (k) groups are present on one side only;
* at most one common group's SUM moves, by at most the values' bound times the distance (a global bound:
  noise_scale·ε share; a data-dependent one: e^(β·d)·c(x)·d, NR Lemma 3.78, and c itself β-smooth, NR Def. 3.56);
* the selector's ε share is 0 and the values' shares add up to ε;
* the exact privacy loss: a one-sided group o is released with p_o = P[v + Lap(b_s) > τ] (the exact Laplace
  tail, with sqldp's true value v, scale b_s and threshold τ), the groups are independent, so the hockey-stick
  divergence of the whole output at e^(ε·d) is at most (1 − Π_o(1 − p_o)) + H(the changed common group), H
  computed exactly (tests/oracles.py's ``selection_hockey_stick``; numerically for unequal scales); it must be
  ≤ δ in both directions.

The run path is checked too: over seeded runs each group present is released with probability δ/k.

Mutants this file kills (each checked by editing sqldp, running the file, reverting; (a) and (c) are also kept
here as monkeypatched tests):

(a) k without the truncation's fan-out (a customer reaching 1 group instead of 2): Q3 keyed by the balance —
    one balance step relabels both of a customer's orders, 4 one-sided groups > k = 2, loss ≈ 2δ;
(b) the selector's true value not clamped to 1 (``release.measure``): the selector's true value is a group's
    COUNT(*), and a one-sided group of 2 rows is released with probability e·δ/k: loss up to 0.34 > δ under
    Q10, and the run path releases too often;
(c) τ without k (1 + ln(1/(2δ))): two one-sided groups (Q10's relabel, Q3's eviction) each released with
    probability δ: loss ≈ 2δ (Q18 survives it: its selector has δ/2 of δ);
(d) a conjunct mixing an owning row's sensitive value with another table's column not refused: the refusal is
    asserted (``test_refusals``); with the refusal removed, the oracle (given that query's semantics) finds a
    balance step of 0.01 dropping line 2 of customer 5's order, a common group moving by 4 > 10·0.01.

The query's own COUNT(*) stays a value: the owned selector is then a hidden COUNT(*) of its own
(``sqldp.strategies.owned.own_selector``), so the released count is the count, not the noisy indicator.
"""

from __future__ import annotations

import datetime
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from oracles import (
    hockey_stick_continuous,
    laplace_exceeds,
    rows_added,
    rows_removed,
    selection_hockey_stick,
    values_changed,
)

import sqldp
from sqldp import release
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.policy import Policy
from sqldp.result import GLOBAL, Measurement
from sqldp.strategies import owned

DDL = """
CREATE TABLE cust (ck INT PRIMARY KEY, bal NUMERIC(6, 2));
CREATE TABLE ord (ok INT PRIMARY KEY, ck INT NOT NULL, od DATE);
CREATE TABLE line (lk INT, ln INT, price NUMERIC(8, 2), PRIMARY KEY (lk, ln));
"""

# all three tables private (weight G = 1), each with one value in its norm: bal and price on a grid of 0.01,
# od on a grid of one day
UNCAPPED = """
[tables.cust]
rows = "private"
weight = 1.0
norm = "l1(bal)"
[tables.cust.columns.bal]
range = [0, 10]
[tables.ord]
rows = "private"
weight = 1.0
norm = "l1(od)"
[tables.ord.columns.od]
range = ["2020-01-01", "2020-01-10"]
unit = "day"
[tables.line]
rows = "private"
weight = 1.0
norm = "l1(price)"
[tables.line.columns.price]
range = [0, 10]
[tables.line.columns.ln]
range = [1, 3]
"""
CAP = 2  # at most 2 orders per customer, declared: the answer reads the first 2 per ck by ok
POLICY = UNCAPPED.replace('norm = "l1(od)"\n', f'norm = "l1(od)"\nmax_rows_per = {{ ck = {CAP} }}\n')
# without ln's range an order's lines are unbounded: Q10's values (over ord ⋈ line) get a data-dependent,
# smoothed bound (NR Thm 3.56) with its own share of δ
LINES_UNBOUNDED = POLICY.replace("[tables.line.columns.ln]\nrange = [1, 3]\n", "")

EPSILON, DELTA = 1.0, 0.05
DAY0 = datetime.date(2020, 1, 1)
LAST_DAY = datetime.date(2020, 1, 10)
CUTOFF = datetime.date(2020, 1, 5)  # Q10's ord.od < DATE '2020-01-05'
BALANCE, TOTAL = Decimal(5), Decimal(8)  # Q3's cust.bal > 5, Q18's HAVING SUM(price) > 8

JOIN = "FROM cust, ord, line WHERE cust.ck = ord.ck AND line.lk = ord.ok"
Q10 = f"SELECT cust.ck, cust.bal, SUM(line.price) {JOIN} AND ord.od < DATE '{CUTOFF}' GROUP BY cust.ck, cust.bal"
Q3 = f"SELECT line.lk, ord.od, SUM(line.price) {JOIN} AND cust.bal > {BALANCE} GROUP BY line.lk, ord.od"
Q18 = (
    f"SELECT line.lk, ord.od, SUM(line.price) {JOIN} AND cust.bal > {BALANCE} "
    f"AND ord.ok IN (SELECT lk FROM line GROUP BY lk HAVING SUM(price) > {TOTAL}) GROUP BY line.lk, ord.od"
)
Q3_BAL = (
    f"SELECT cust.bal, line.lk, ord.od, SUM(line.price) {JOIN} AND cust.bal > {BALANCE} "
    "GROUP BY cust.bal, line.lk, ord.od"
)

Cust = tuple[int, Decimal]  # (ck, bal)
Ord = tuple[int, int, datetime.date]  # (ok, ck, od)
Line = tuple[int, int, Decimal]  # (lk, ln, price)
Groups = dict[tuple[Any, ...], Decimal]  # group key → SUM(line.price)


@dataclass(frozen=True)
class Db:
    cust: tuple[Cust, ...]
    ord: tuple[Ord, ...]
    line: tuple[Line, ...]


def _day(n: int) -> datetime.date:
    return DAY0 + datetime.timedelta(days=n)


def _d(v: str) -> Decimal:
    return Decimal(v)


# customer 1 sits at Q3's balance threshold from below, 2 from above (2 orders: at the cap), 3 has 3 orders (one
# cut by the truncation), 5's balance is a line number (a step below it would drop line 2 of order 15 under a
# condition cust.bal > line.ln), 6 has an order without lines; order 16 belongs to no customer (4), line 9 to no
# order; order 11's lines add up to Q18's threshold exactly, orders 10 and 11 straddle Q10's date cut-off
BASE = Db(
    cust=((1, _d("5.00")), (2, _d("5.01")), (3, _d("7.00")), (5, _d("2.00")), (6, _d("8.00"))),
    ord=(
        (10, 1, _day(3)),
        (11, 2, _day(4)),
        (12, 2, _day(1)),
        (13, 3, _day(0)),
        (14, 3, _day(6)),
        (15, 5, _day(1)),
        (16, 4, _day(2)),
        (17, 3, _day(2)),
        (20, 6, _day(2)),
    ),
    line=(
        (9, 1, _d("3.00")),
        (10, 1, _d("3.00")),
        (10, 2, _d("4.00")),
        (11, 1, _d("8.00")),
        (12, 1, _d("9.50")),
        (12, 2, _d("0.50")),
        (13, 1, _d("2.00")),
        (13, 2, _d("7.00")),
        (14, 1, _d("1.00")),
        (15, 1, _d("1.00")),
        (15, 2, _d("4.00")),
        (16, 1, _d("4.00")),
        (17, 1, _d("6.00")),
    ),
)

ADDED_CUST: tuple[Cust, ...] = ((4, _d("6.00")), (4, _d("1.00")), (7, _d("8.00")))
ADDED_ORD: tuple[Ord, ...] = (
    (9, 2, _day(2)),  # a 3rd order of customer 2, first by ok: evicts order 12, brings line 9's group
    (19, 2, _day(2)),  # a 3rd order ranked last: cut itself
    (9, 3, _day(2)),  # customer 3 (3 orders): evicts order 14
    (9, 1, _day(3)),  # customer 1's 2nd order
    (9, 6, _day(2)),  # customer 6's first order with lines
    (9, 4, _day(8)),  # an order of no customer
)
ADDED_LINE: tuple[Line, ...] = (
    (10, 3, _d("10.00")),
    (11, 2, _d("0.01")),  # order 11 crosses Q18's threshold
    (14, 2, _d("10.00")),
    (20, 1, _d("2.00")),  # the first line of customer 6's order
    (16, 2, _d("1.00")),
    (17, 2, _d("1.00")),  # an order the truncation cuts
    (18, 1, _d("5.00")),  # a line of no order
)
# one grid step and a large one, each way: bal and price in 0.01, od in days
STEPS: tuple[Decimal, ...] = (Decimal("0.01"), Decimal(5), Decimal("-0.01"), Decimal(-5))
DAYS = (1, 5, -1, -5)


# -- the queries, computed independently -----------------------------------------------------------------------


def _truncated(orders: tuple[Ord, ...]) -> list[Ord]:
    """The first CAP orders of each customer by ok (docs/truncation.md: the declared bound, ordered by the
    enforced key)."""
    kept: list[Ord] = []
    for ck in {o[1] for o in orders}:
        kept += sorted(o for o in orders if o[1] == ck)[:CAP]
    return kept


def _q10(db: Db) -> Groups:
    out: Groups = {}
    for ck, bal in db.cust:
        prices = [p for ok, c, od in db.ord if c == ck and od < CUTOFF for lk, _, p in db.line if lk == ok]
        if prices:
            out[(ck, bal)] = sum(prices, Decimal(0))
    return out


def _q3(db: Db, *, having: bool = False, by_balance: bool = False) -> Groups:
    balance = dict(db.cust)
    out: Groups = {}
    for ok, ck, od in _truncated(db.ord):
        if ck not in balance or not balance[ck] > BALANCE:
            continue
        prices = [p for lk, _, p in db.line if lk == ok]
        if having and not sum(prices, Decimal(0)) > TOTAL:  # the IN reads line untruncated: the same lines here
            continue
        if prices:
            out[(balance[ck], ok, od) if by_balance else (ok, od)] = sum(prices, Decimal(0))
    return out


ORACLES: dict[str, Callable[[Db], Groups]] = {
    Q10: _q10,
    Q3: _q3,
    Q18: lambda db: _q3(db, having=True),
    Q3_BAL: lambda db: _q3(db, by_balance=True),
}


def _neighbours(db: Db, g: float = 1.0) -> Iterator[tuple[Db, float, str]]:
    """Every neighbour of ``db`` with its distance: a row removed or added (G = ``g``, every table's weight), a
    sensitive value moved by one grid step or by a large step within its declared range (the norm's distance,
    ℓ1 of one column)."""
    assert not {c[0] for c in ADDED_CUST} & {x[0] for x in db.cust}
    assert not {o[0] for o in ADDED_ORD} & {x[0] for x in db.ord}
    assert not {ln[:2] for ln in ADDED_LINE} & {x[:2] for x in db.line}
    tables = {"cust": db.cust, "ord": db.ord, "line": db.line}

    def in_range(_: object, v: Decimal) -> bool:
        return 0 <= v <= 10

    def in_days(_: object, day: datetime.date) -> bool:
        return DAY0 <= day <= LAST_DAY

    def later(day: datetime.date, n: int) -> datetime.date:
        return day + datetime.timedelta(days=n)

    changes = itertools.chain(
        rows_removed(tables, "cust", g),
        values_changed(tables, "cust", {1: 1.0}, STEPS, within=in_range),
        rows_removed(tables, "ord", g),
        values_changed(tables, "ord", {2: 1.0}, DAYS, within=in_days, add=later),
        rows_removed(tables, "line", g),
        values_changed(tables, "line", {2: 1.0}, STEPS, within=in_range),
        rows_added(tables, "cust", ADDED_CUST, g),
        rows_added(tables, "ord", ADDED_ORD, g),
        rows_added(tables, "line", ADDED_LINE, g),
    )
    for n in changes:
        yield Db(*(tuple(n.db[t]) for t in ("cust", "ord", "line"))), n.distance, n.change


# -- sqldp's figures -------------------------------------------------------------------------------------------


@dataclass
class Side:
    groups: Groups  # computed here
    measured: dict[tuple[Any, ...], tuple[Measurement, list[Measurement]]]  # sqldp's: selector, values


def _load(dsn: str, db: Db) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn, conn.cursor() as cur:
        cur.execute("TRUNCATE cust, ord, line")
        cur.executemany("INSERT INTO cust VALUES (%s, %s)", db.cust)
        cur.executemany("INSERT INTO ord VALUES (%s, %s, %s)", db.ord)
        cur.executemany("INSERT INTO line VALUES (%s, %s, %s)", db.line)


def _side(session: sqldp.session.Session, dsn: str, sql: str, db: Db, found: list[str], what: str) -> Side:
    """sqldp's measurements of ``db``, matched to the groups computed here (``analyze`` measures the groups
    present in key order); a mismatch is recorded in ``found``."""
    _load(dsn, db)
    groups = ORACLES[sql](db)
    result = session.analyze(sql, epsilon=EPSILON, mechanism="laplace", delta=DELTA)
    if len(result.measurements) != len(groups):
        found.append(f"{what}: sqldp measures {len(result.measurements)} groups, present are {sorted(groups)}")
        return Side(groups, {})
    measured = {}
    for key, ms in zip(sorted(groups), result.measurements, strict=True):
        (sel,) = [m for m in ms if m.owned_groups is not None]
        values = [m for m in ms if m is not sel]
        measured[key] = (sel, values)
        if sel.true_value != 1.0:
            found.append(f"{what}: group {key}: the selector's true value is {sel.true_value}, not the indicator 1")
        if len(values) != 1 or not math.isclose(values[0].true_value or 0.0, float(groups[key]), abs_tol=1e-9):
            found.append(f"{what}: group {key}: sqldp's SUM {[m.true_value for m in values]}, here {groups[key]}")
        if sel.epsilon != 0.0 or not math.isclose(sum(m.epsilon for m in values), EPSILON, rel_tol=1e-12):
            found.append(f"{what}: ε shares {sel.epsilon} (selector), {[m.epsilon for m in values]} (values)")
        if sel.mechanism != GLOBAL or sel.noise_scale != 1.0:
            found.append(f"{what}: the selector's noise is {sel.mechanism} at {sel.noise_scale}, not Laplace at 1")
    return Side(groups, measured)


def _group_loss(
    p: tuple[Measurement, list[Measurement]], q: tuple[Measurement, list[Measurement]], eps: float
) -> float:
    """The hockey-stick divergence at e^ε of one common group's output (⊥, or the noisy selector above τ and the
    noisy SUM) on the two sides."""
    (sel, (val,)), (sel2, (val2,)) = p, q
    tau, tau2 = release.selection_threshold(sel), release.selection_threshold(sel2)
    assert val.true_value is not None and val2.true_value is not None
    if val.noise_scale == val2.noise_scale:  # data-independent scales: test_partition_selection's exact H
        row = [
            (sel.true_value, sel.noise_scale, sel.epsilon, tau),
            (val.true_value, val.noise_scale, val.epsilon, None),
        ]
        row2 = [
            (sel2.true_value, sel2.noise_scale, sel2.epsilon, tau2),
            (val2.true_value, val2.noise_scale, val2.epsilon, None),
        ]
        return selection_hockey_stick(row, row2, eps)
    # data-dependent scales: when the selector's release probability is the same on both sides (the caller
    # checks it is: true value 1, scale 1, τ from the query), H factors into it times the values' H
    if (sel.true_value, sel.noise_scale, tau) != (sel2.true_value, sel2.noise_scale, tau2):
        return 1.0  # not certified here; the caller has recorded why
    assert sel.true_value is not None
    kept = laplace_exceeds(sel.true_value, tau, sel.noise_scale)
    assert val.mechanism == val2.mechanism
    # the values' noise law: Laplace, or generalized Cauchy where a value's changes have no bounded distance
    # (sqldp.release.calibrate); unequal scales: H numerically
    return kept * hockey_stick_continuous(
        val.mechanism, val.true_value, val.noise_scale, val2.true_value, val2.noise_scale, eps, tails=60
    )


def _bound(side: Side, what: str, found: list[str]) -> Measurement | None:
    """The value measurement of a side (its bound is one for all groups: condition 5, a change touches one group),
    None when no group is present."""
    values = [v for _, vs in side.measured.values() for v in vs]
    if len({(v.mechanism, v.sensitivity, v.noise_scale, v.beta) for v in values}) > 1:
        found.append(f"{what}: the groups' value bounds differ: {[(v.mechanism, v.sensitivity) for v in values]}")
    return values[0] if values else None


def _compare(a: Side, b: Side, d: float, what: str, found: list[str]) -> float:
    """The oracle's checks for one neighbouring pair; returns the worse exact loss of the two directions."""
    if set(a.measured) != set(a.groups) or set(b.measured) != set(b.groups):
        return 0.0  # sqldp measured other groups than are present: recorded by _side
    selectors = [s for s, _ in (*a.measured.values(), *b.measured.values())]
    if not selectors:
        return 0.0  # no group on either side: nothing is released
    ks = {s.owned_groups for s in selectors}
    if len(ks) != 1:
        found.append(f"{what}: k differs between the groups or sides: {ks}")
        return 0.0
    (k,) = ks
    assert k is not None
    one_sided = set(a.groups) ^ set(b.groups)
    if len(one_sided) > k:
        found.append(f"{what}: {len(one_sided)} groups on one side only {sorted(one_sided)} > k = {k}")
    # the values' bound: global (noise_scale·ε share, the same on both sides) or β-smooth (NR Def. 3.56)
    bounds = {}
    for x, y in ((a, b), (b, a)):
        val, val2 = _bound(x, what, found), _bound(y, what, found)
        if val is None:
            continue
        if val.mechanism == GLOBAL:
            bounds[id(x)] = val.noise_scale * val.epsilon
            if val.sensitivity != pytest.approx(bounds[id(x)]) or (val2 and val2.sensitivity != val.sensitivity):
                found.append(f"{what}: global bound {val.sensitivity}, scale·ε {bounds[id(x)]}, other side {val2}")
        else:
            grow = math.exp(val.beta * d)
            bounds[id(x)] = grow * val.sensitivity  # NR Lemma 3.78: |Δ| ≤ e^(β·d)·c(x)·d
            # smoothness compares one β: generalized Cauchy picks β from a fixed family per database (NR Thm
            # 3.73), so the two sides' bounds may be at different β; the exact loss below covers that case
            same_beta = val2 is not None and val2.beta == val.beta
            if same_beta and val2 is not None and val2.sensitivity > grow * val.sensitivity * (1 + 1e-9):
                found.append(f"{what}: not smooth: c = {val.sensitivity} → {val2.sensitivity} at d = {d}")
    common = set(a.groups) & set(b.groups)
    changed = [g for g in common if a.groups[g] != b.groups[g]]
    if len(changed) > 1:
        found.append(f"{what}: {len(changed)} common groups changed: {changed}")
    for g in changed:
        sel, sel2 = a.measured[g][0], b.measured[g][0]
        tau, tau2 = release.selection_threshold(sel), release.selection_threshold(sel2)
        if (sel.true_value, sel.noise_scale, tau) != (sel2.true_value, sel2.noise_scale, tau2):
            found.append(f"{what}: common group {g}'s selector differs: {sel.true_value} vs {sel2.true_value}")
        delta = abs(float(a.groups[g] - b.groups[g]))
        for bound in bounds.values():
            if delta > bound * d * (1 + 1e-9) + 1e-9:
                found.append(f"{what}: group {g} moved by {delta} > {bound}·{d}")
    # the groups whose released value differs in law: the changed one, and — where the values share a noise scale
    # read from the data — every common group whose scale moved with it. The release shows at most one group
    # then (sqldp.strategies.owned, "One noise scale for every group"), so the loss is at most the one-sided part plus
    # the sum over these groups of P[shown]·H (coupling the common groups' selector draws); with several groups shown
    # that sum would not bound the product's loss
    differ = [g for g in common if g in changed or a.measured[g][1][0].noise_scale != b.measured[g][1][0].noise_scale]
    worst = 0.0
    for x, y in ((a, b), (b, a)):
        stays = 1.0
        for g in one_sided:
            sel, _ = (x if g in x.measured else y).measured[g]
            assert sel.true_value is not None
            stays *= 1.0 - laplace_exceeds(sel.true_value, release.selection_threshold(sel), sel.noise_scale)
        h = 1.0 - stays + sum(_group_loss(x.measured[g], y.measured[g], EPSILON * d) for g in differ)
        if h > DELTA * (1 + 1e-6):
            found.append(f"{what}: exact loss H_(e^εd) = {h} > δ = {DELTA} ({len(one_sided)} one-sided groups)")
        worst = max(worst, h)
    return worst


@dataclass
class Report:
    found: list[str]
    worst: float  # the largest exact loss over the neighbours
    one_sided: int  # neighbours with a group on one side only
    moved: int  # neighbours that moved a common group's SUM
    neighbours: int
    mechanisms: set[str]  # the values' noise on the base database


def _oracle(dsn: str, sql: str, policy: str = POLICY, weight: float = 1.0) -> Report:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(dsn, Policy.from_toml(policy.replace("weight = 1.0", f"weight = {weight}")), seed=11)
    found: list[str] = []
    base = _side(session, dsn, sql, BASE, found, "base")
    report = Report(found, 0.0, 0, 0, 0, {v.mechanism for _, vs in base.measured.values() for v in vs})
    for db, d, what in _neighbours(BASE, weight):
        other = _side(session, dsn, sql, db, found, what)
        report.worst = max(report.worst, _compare(base, other, d, what, found))
        report.neighbours += 1
        report.one_sided += bool(set(base.groups) ^ set(other.groups))
        report.moved += any(base.groups[g] != other.groups[g] for g in set(base.groups) & set(other.groups))
    return report


@pytest.mark.parametrize(
    ("sql", "policy", "noise"),
    [
        (Q10, POLICY, GLOBAL),
        # a data-dependent bound over line's price, a value in a norm: its changes have no bounded distance, where
        # the smoothed Laplace keeps no δ, so the values get generalized Cauchy (docs/privacy.md)
        (Q10, LINES_UNBOUNDED, "cauchy"),
        (Q3, POLICY, GLOBAL),
        (Q18, POLICY, "cauchy"),  # the IN's HAVING steps with a price: a data-dependent bound
        (Q3_BAL, POLICY, GLOBAL),
    ],
    ids=["Q10", "Q10-data-dependent", "Q3", "Q18", "Q3-by-balance"],
)
def test_every_neighbour_of_a_tiny_database(pg_dsn: str, sql: str, policy: str, noise: str) -> None:
    report = _oracle(pg_dsn, sql, policy)
    assert report.mechanisms == {noise}  # both kinds of bound are exercised
    assert report.found == []
    # the database tests something: groups appear and disappear, and common groups move
    assert report.one_sided and report.moved, report
    assert 0.0 < report.worst <= DELTA * (1 + 1e-6)


@pytest.mark.parametrize("weight", [0.5, 2.0, 20.0])
def test_every_neighbour_at_other_weights(pg_dsn: str, weight: float) -> None:
    """Q10 with unbounded lines (the values' smoothed bound, one scale shared by the groups) with every table at
    weight G: a row removed or added is a change at distance G, and the exact loss at e^(εG) stays ≤ δ."""
    report = _oracle(pg_dsn, Q10, LINES_UNBOUNDED, weight)
    assert report.found == []
    assert report.one_sided and report.moved, report
    assert 0.0 < report.worst <= DELTA * (1 + 1e-6)


def test_runs_release_each_present_group_with_probability_delta_over_k(pg_dsn: str) -> None:
    """The run path (``session.run``: the selector's noisy value against τ): on the base database each group
    present under Q10 is released with probability P[1 + Lap(1) > τ] = δ/k = 0.025, pooled over its 4 groups and
    the seeded runs within 4 standard errors, and only present groups are ever released."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, BASE)
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=5)
    present = _q10(BASE)
    runs, released, seen = 600, 0, set()
    for _ in range(runs):
        result = session.run(Q10, epsilon=EPSILON, mechanism="laplace", delta=DELTA)
        assert len(result.measurements) == len(result.rows)
        keys = [(row["key"]["ck"], row["key"]["bal"]) for row in result.rows]
        assert set(keys) <= set(present), keys
        released += len(keys)
        seen.update(keys)
    p, n = DELTA / 2, runs * len(present)  # k = 2 under Q10 (the analyses above check sqldp says so)
    assert seen == set(present)  # each present group, its key exact (the balance as NUMERIC)
    assert abs(released / n - p) <= 4 * math.sqrt(p * (1 - p) / n), (released, n)


@pytest.mark.parametrize(("sql", "policy"), [(Q10, LINES_UNBOUNDED), (Q18, POLICY)], ids=["Q10-data-dependent", "Q18"])
def test_a_shared_data_dependent_scale_shows_at_most_one_group(pg_dsn: str, sql: str, policy: str) -> None:
    """The values' noise scale is read from the data and shared by every released group: each run shows at most
    one of the groups selected, drawn uniformly (sqldp.strategies.owned, "One noise scale for every group"), and says
    so. At δ = 0.9 most groups pass, so a release of every group selected would show several."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, BASE)
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy), seed=7)
    shown: set[Any] = set()
    for _ in range(60):
        result = session.run(sql, epsilon=EPSILON, mechanism="laplace", delta=0.9)
        assert len(result.rows) <= 1 and len(result.measurements) == len(result.rows)
        shown.update(tuple(row["key"].values()) for row in result.rows)
    assert len(shown) > 1  # not always the same group: drawn among those selected
    assert any("at most 1 group selected is shown" in n for n in result.notes)


def test_mutant_k_without_the_truncations_fan_out_fails(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant (a): a customer reaches 1 group instead of the 2 its truncated orders own, so k = 2. Moving
    customer 2's balance by one grid step relabels both its orders' groups: 4 groups on one side only, each
    released with probability δ/2."""
    original = owned._closure

    def flat(*args: Any, **kwargs: Any) -> Any:
        fixed, known, _, used = original(*args, **kwargs)
        return fixed, known, 1, used

    monkeypatch.setattr(owned, "_closure", flat)
    found = _oracle(pg_dsn, Q3_BAL).found
    assert any("> k = 2" in f for f in found), found
    assert any("exact loss" in f for f in found), found


def test_mutant_threshold_without_k_fails(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant (c): τ = 1 + ln(1/(2δ)) releases each one-sided group with probability δ; Q10's relabel of a
    customer's balance shows two of them (1 − (1 − δ)² ≈ 2δ)."""
    original = release.selection_threshold

    def without_k(selector: Measurement) -> float:
        if selector.owned_groups is None:
            return original(selector)
        assert selector.delta is not None
        return 1.0 + selector.noise_scale * math.log(1.0 / (2.0 * selector.delta))

    monkeypatch.setattr(release, "selection_threshold", without_k)
    found = _oracle(pg_dsn, Q10).found
    assert any("exact loss" in f for f in found), found


@pytest.mark.parametrize(
    ("policy", "sql", "why"),
    [
        # condition 3: a group key reading a column of ord, which the key does not fix (cust owns the group)
        (
            POLICY,
            f"SELECT cust.ck, cust.bal, EXTRACT(MONTH FROM ord.od), SUM(line.price) {JOIN} "
            "GROUP BY cust.ck, cust.bal, EXTRACT(MONTH FROM ord.od)",
            r"cust: the key EXTRACT\(MONTH FROM ord\.od\) is not a column of a row the key fixes",
        ),
        # a plain key column of a non-owned private table: a customer is in as many groups as its orders' dates
        (
            POLICY,
            f"SELECT cust.ck, cust.bal, ord.od, SUM(line.price) {JOIN} GROUP BY cust.ck, cust.bal, ord.od",
            r"cust: a row of cust can be in many groups here .* unbounded",
        ),
        # Q3 without max_rows_per: a customer owns all of its orders' groups
        (UNCAPPED, Q3, r"cust, ord: a row of cust can be in many groups here .* unbounded"),
        # condition 1: an aggregate reading the owning row
        (
            POLICY,
            f"SELECT cust.ck, cust.bal, SUM(line.price + cust.bal) {JOIN} GROUP BY cust.ck, cust.bal",
            r"cust: SUM\(line\.price \+ cust\.bal\) reads a column of a table the group key fixes",
        ),
        # condition 2, mutant (d): the owning row's sensitive value compared with a line's column
        (
            POLICY,
            f"SELECT line.lk, ord.od, SUM(line.price) {JOIN} AND cust.bal > line.ln GROUP BY line.lk, ord.od",
            r"cust, ord: the condition cust\.bal > line\.ln mixes a value-sensitive column of an owning row "
            "with other rows",
        ),
        (
            POLICY,
            f"SELECT line.lk, ord.od, SUM(line.price) {JOIN} AND cust.bal > line.price GROUP BY line.lk, ord.od",
            r"cust, ord: the condition cust\.bal > line\.price reads a value-sensitive column of a table the key "
            "does not fix",
        ),
    ],
)
def test_refusals(pg_dsn: str, policy: str, sql: str, why: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy))
    with pytest.raises(RefusedError, match=f"^groups owned by one row of {why}"):
        session.prepare(sql, epsilon=EPSILON, mechanism="laplace", delta=DELTA)


def test_the_querys_own_count_is_measured_as_a_count(pg_dsn: str) -> None:
    """``SELECT …, COUNT(*) … GROUP BY <owned key>`` (and HAVING COUNT(*)): partition selection would select by
    the query's own COUNT(*), which the owned path measures as an indicator; ``own_selector`` gives it a hidden
    selector instead, so each group's COUNT(*) measures the group's product rows (here computed independently)
    and the selector measures 1."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, BASE)
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    rows: dict[int, int] = {}  # product rows per customer (Q10's shape uses no truncation: a customer owns one group)
    customers = {c[0] for c in BASE.cust}
    orders = {o[0]: o[1] for o in BASE.ord if o[1] in customers}
    for line in BASE.line:
        if line[0] in orders:
            rows[orders[line[0]]] = rows.get(orders[line[0]], 0) + 1
    for sql in (
        f"SELECT cust.ck, cust.bal, COUNT(*), SUM(line.price) {JOIN} GROUP BY cust.ck, cust.bal",
        f"SELECT cust.ck, cust.bal, SUM(line.price) {JOIN} GROUP BY cust.ck, cust.bal HAVING COUNT(*) > 2",
    ):
        prepared = session.prepare(sql, epsilon=EPSILON, mechanism="laplace", delta=DELTA)
        form = prepared.form
        assert isinstance(form, AnalysisForm) and form.select_by == len(form.aggregates) - 1
        result = prepared.analyze()
        counts = sorted(
            m.true_value for measured in result.measurements for m in measured[:-1] if m.aggregate == "COUNT(*)"
        )
        assert counts == sorted(float(n) for n in rows.values())
        assert all(measured[-1].true_value == 1.0 and measured[-1].epsilon == 0.0 for measured in result.measurements)
