"""GROUP BY under a privacy unit: contribution bounding across groups (docs/units.md).

The oracles are independent of the code under test:

* brute force over tiny databases on real PostgreSQL whose units add rows to several groups: every neighbour
  removes one unit with every row that references it (R2T §2). The truncated histograms and masses sqldp
  reads equal those computed here in Python from the database's structure (each unit's per-group
  contributions scaled by min(1, τ/c_u), c_u its total ℓ1 mass over every group and aggregate), and the
  exact privacy loss of what the mechanism draws — the race on the total mass (J independent Laplace
  races) and the histogram at the τ they choose (Laplace on every coordinate) — is within ε: the race's
  loss summed over its races plus, for the worst τ, the histogram's summed over its coordinates, each
  coordinate's the exact loss of its Laplace cells on the release grid (``_loss`` of test_units). The
  released histogram and τ are post-processing of those draws;
* the mutant that bounds each unit per group instead of across groups (c_{u,g} in place of c_u) is run
  through the same loss check and must exceed ε on these databases;
* PostgreSQL's own answer to the unmodified TPC-H Q5, Q7, Q8 and Q9 under the customer unit (SF 0.01): the
  un-noised per-group values are the raw query's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_units import DATABASES, DDL, GS, Db, _load, _loss

import sqldp
from sqldp.commands.analyze import format_text
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.mechanisms import NoiseSource
from sqldp.mechanisms.race import SELECT_SHARE, SLACK, shift
from sqldp.policy import Policy
from sqldp.postprocess import evaluate
from sqldp.result import UNIT_HISTOGRAM
from sqldp.sensitivity.units import races

EPS = 1.0
POLICY = f"""
[defaults]
epsilon = {EPS}
[units.u]
key = "id"
max_contribution = {GS}
[tables.l.columns.q]
range = [0, 3]
[tables.o.columns.d]
domain = [0, 1]
"""
# more databases where one unit's rows spread over both groups, below τ in each but above it in all
GROUPED: list[Db] = [
    *DATABASES,
    {1: [(0, [3] * 5), (1, [3] * 5)], 2: [(1, [1])]},  # unit 1: 5 line items per group, 10 in all
    {1: [(0, [2] * 20), (1, [1] * 20)], 2: [(0, [3])], 3: [(1, [0, 0])]},  # unit 1: 40, above τ = 30.25
    {1: [(0, [])] * 5 + [(1, [2])] * 5, 2: [(0, [1])]},  # unit 1: 5 orders per group
]
# (query, per order (d, line items): each aggregate's contribution, in Python — the independent oracle)
Contribution = Callable[[int, list[int]], list[float]]
QUERIES: list[tuple[str, Contribution]] = [
    ("SELECT o.d, COUNT(*) FROM o, l WHERE o.oid = l.oid GROUP BY o.d", lambda d, ls: [len(ls)]),
    ("SELECT o.d, SUM(l.q) FROM o, l WHERE o.oid = l.oid GROUP BY o.d", lambda d, ls: [sum(ls)]),
    # a signed summand and a second aggregate: one mass over both, |SUM| per (unit, group)
    (
        "SELECT o.d, SUM(l.q - 1), COUNT(*) FROM o, l WHERE o.oid = l.oid GROUP BY o.d",
        lambda d, ls: [sum(q - 1 for q in ls), len(ls)],
    ),
    # orders with no line items count too: COUNT(*) of the orders, grouped by the order's own d
    ("SELECT d, COUNT(*) FROM o GROUP BY d", lambda d, ls: [1]),
]
GROUPS = (0, 1)


def _contributions(db: Db, contribution: Contribution, aggregates: int) -> dict[int, list[list[float]]]:
    """Per unit, per group, per aggregate: the unit's contribution s_{u,g,a}. The join queries skip orders
    without line items (an inner join); the orders query keeps them."""
    out = {}
    for unit, orders in db.items():
        per = [[0.0] * aggregates for _ in GROUPS]
        for d, ls in orders:
            for a, v in enumerate(contribution(d, ls)):
                per[d][a] += v
        out[unit] = per
    return out


def _histogram(s: dict[int, list[list[float]]], tau: float, per_group: bool = False) -> list[list[float]]:
    """H[g][a] at τ: each unit scaled by min(1, τ/c), c its total |contribution| over every group and
    aggregate — or, for the mutant, over the group's aggregates only (``per_group``)."""
    out = [[0.0] * len(s[next(iter(s))][0]) for _ in GROUPS] if s else []
    for per in s.values():
        total = sum(abs(v) for g in per for v in g)
        for g, values in enumerate(per):
            c = sum(abs(v) for v in values) if per_group else total
            for a, v in enumerate(values):
                out[g][a] += v * min(1.0, tau / c) if c else 0.0
    return out


def _masses(s: dict[int, list[list[float]]], tau: float) -> list[float]:
    """T_g(τ): the group's ℓ1 mass of the truncated contributions."""
    out = [0.0 for _ in GROUPS]
    for per in s.values():
        total = sum(abs(v) for g in per for v in g)
        for g, values in enumerate(per):
            out[g] += sum(abs(v) for v in values) * min(1.0, tau / total) if total else 0.0
    return out


def _mechanism_loss(
    mass1: list[float], mass2: list[float], hist1: list[list[float]], hist2: list[list[float]], eps: float
) -> float:
    """The exact privacy loss of (race on the total mass, histogram at the τ it picks): the race's loss (its
    independent races' losses add) plus the largest over τ_j of the histogram's (its coordinates' add)."""
    thresholds = races(GS)
    j = len(thresholds)
    race = sum(_loss(a, b, t * j / (eps * SELECT_SHARE)) for a, b, t in zip(mass1, mass2, thresholds, strict=True))
    worst = 0.0
    for k, t in enumerate(thresholds):
        scale = t * (1 + SLACK) / (eps * (1 - SELECT_SHARE))
        h = sum(
            _loss(x[k], y[k], scale) for g1, g2 in zip(hist1, hist2, strict=True) for x, y in zip(g1, g2, strict=True)
        )
        worst = max(worst, h)
    return race + worst


@pytest.fixture
def tiny(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _read(s: sqldp.session.Session, sql: str) -> tuple[list[list[list[float]]], list[list[float]]]:
    """Per group, per aggregate, the truncated values at every τ_j, and per group its masses, as sqldp read
    them (audit: nothing released)."""
    result = s.analyze(sql, audit=True)
    assert all(m.mechanism == UNIT_HISTOGRAM for g in result.measurements for m in g)
    hist = [[list(m.truncated) for m in g] for g in result.measurements]
    mass = [list(g[0].mass) for g in result.measurements]
    return hist, mass


@pytest.mark.parametrize(("sql", "contribution"), QUERIES)
def test_every_unit_neighbour_is_within_epsilon(
    tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str, contribution: Contribution
) -> None:
    s, conn = tiny
    thresholds = races(GS)
    aggregates = len(contribution(0, [1]))
    worst = mutant_worst = 0.0
    for db in GROUPED:
        _load(conn, db)
        hist, mass = _read(s, sql)
        ours = _contributions(db, contribution, aggregates)
        expected = [_histogram(ours, t) for t in thresholds]  # [τ][g][a]
        for g in GROUPS:
            for a in range(aggregates):
                assert hist[g][a] == pytest.approx([e[g][a] for e in expected], rel=1e-12, abs=1e-12)
            assert mass[g] == pytest.approx([_masses(ours, t)[g] for t in thresholds], rel=1e-12, abs=1e-12)
        total = [sum(mass[g][k] for g in GROUPS) for k in range(len(thresholds))]
        flat = [[[hist[g][a][k] for k in range(len(thresholds))] for a in range(aggregates)] for g in GROUPS]
        for unit in db:
            rest = {u: orders for u, orders in db.items() if u != unit}
            _load(conn, rest)
            hist2, mass2 = _read(s, sql)
            total2 = [sum(mass2[g][k] for g in GROUPS) for k in range(len(thresholds))]
            flat2 = [[[hist2[g][a][k] for k in range(len(thresholds))] for a in range(aggregates)] for g in GROUPS]
            loss = _mechanism_loss(total, total2, _coords(flat), _coords(flat2), EPS)
            assert loss <= EPS * (1 + 1e-9)
            worst = max(worst, loss)
            # the mutant: each unit bounded per group, not across groups
            theirs = _contributions(rest, contribution, aggregates)
            m1, m2 = (
                [[_histogram(x, t, True)[g][a] for t in thresholds] for g in GROUPS for a in range(aggregates)]
                for x in (ours, theirs)
            )
            mutant_worst = max(mutant_worst, _mechanism_loss(total, total2, [m1], [m2], EPS))
    assert worst > 0.5 * EPS  # the neighbours do use the budget
    assert mutant_worst > EPS  # these databases tell the right truncation from the per-group one


def _coords(flat: list[list[list[float]]]) -> list[list[list[float]]]:
    """The histogram as one list of coordinates (every group and aggregate), each its values at every τ_j."""
    return [[values for per_group in flat for values in per_group]]


def test_a_run_releases_tau_and_a_noisy_histogram(tiny: tuple[sqldp.session.Session, psycopg.Connection]) -> None:
    s, conn = tiny
    _load(conn, GROUPED[-1])
    sql = "SELECT o.d, SUM(l.q) AS total, COUNT(*) AS n FROM o, l WHERE o.oid = l.oid GROUP BY o.d"
    s.noise = NoiseSource.seeded(3)
    out = s.run(sql)
    j = out.to_json()
    assert j["mechanism"] == UNIT_HISTOGRAM
    assert [r["key"]["d"] for r in j["rows"]] == [0, 1]
    taus = {m["unit"]["tau"] for g in j["measurements"] for m in g}
    assert len(taus) == 1 and taus <= set(races(GS))  # one τ for every group and aggregate, a race's
    for g in j["measurements"]:
        for m in g:
            # the analyst sees the unit, the races, the chosen τ (a function of noisy values) and the noise
            assert set(m) == {"aggregate", "epsilon", "delta", "mechanism", "noisy_value", "unit"}
            assert m["epsilon"] == pytest.approx(EPS / 2) and m["unit"]["truncation"] == "across groups"
    tau = taus.pop()
    assert f"(R2T, truncated across groups, β = 0.5), τ = {tau:g} chosen by the race" in format_text(j)
    for g in out.measurements:
        for m in g:  # the scale is τ(1 + slack) over the histogram's share of the query's ε
            assert m.noise_scale == pytest.approx(tau * (1 + SLACK) / (EPS * (1 - SELECT_SHARE)), rel=1e-15)
    # the plan an analyst may see before anything is read: the whole share, one release of the histogram
    plan = s.analyze(sql, audit=False).to_json()["plan"]
    assert plan[0]["unit"]["selection_share"] == SELECT_SHARE and plan[0]["epsilon"] == pytest.approx(EPS / 2)
    assert plan[0]["groups"].startswith("full share (ℓ1 over the groups: each unit truncated across them")


def test_the_chosen_tau_is_the_top_of_the_race() -> None:
    """choose_threshold returns the race whose corrected noisy mass is largest (recomputed here with the same
    seeded draws and R2T's scales τ_j·J/ε and corrections L·τ_j·J/ε)."""
    from sqldp import mechanisms
    from sqldp.mechanisms.race import choose_threshold

    thresholds = races(1e6)
    j = len(thresholds)
    masses = [float(sum(min(c, t) for c in [1 + (i * 7919) % 37 for i in range(3000)] + [400.0])) for t in thresholds]
    for seed in range(20):
        got = choose_threshold(thresholds, masses, 0.2, 0.1, NoiseSource.seeded(seed))
        noise = NoiseSource.seeded(seed)
        values = [
            mechanisms.release("laplace", q, t * j / 0.2, noise) - shift(j, 0.1) * t * j / 0.2
            for q, t in zip(masses, thresholds, strict=True)
        ]
        assert got == max(range(j), key=lambda k: values[k])


@pytest.mark.parametrize(
    ("sql", "privacy", "message"),
    [
        # each group a key of the unit's own tables: the groups present are private; with δ partition selection
        # is not offered under a unit (a group of one order is one customer's)
        ("SELECT l.lid, COUNT(*) FROM l GROUP BY l.lid", {}, "which groups exist"),
        ("SELECT l.lid, COUNT(*) FROM l GROUP BY l.lid", {"mechanism": "laplace", "delta": 1e-6}, "not implemented"),
    ],
)
def test_private_keys_are_refused(
    tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str, privacy: dict[str, Any], message: str
) -> None:
    s, _ = tiny
    with pytest.raises(RefusedError, match=message):
        s.prepare(sql, **privacy)


# -- the unmodified TPC-H queries under the customer unit ------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]


def _plain(v: Any) -> Any:
    return float(v) if isinstance(v, Decimal) else v


@pytest.mark.parametrize("name", ["q05", "q07", "q08", "q09"])
def test_unmodified_tpch_unnoised_answers_are_postgresqls(tpch_dsn: tuple[str, Any, Any], name: str) -> None:
    """The function the noise is added to, before truncation (the true values), is the raw query's answer:
    the non-zero outputs of the groups are exactly the values PostgreSQL returns."""
    dsn = tpch_dsn[0]
    sql = (ROOT / "benchmarks" / "tpch" / "queries" / f"{name}.sql").read_text(encoding="utf-8")
    with psycopg.connect(dsn) as conn:
        plain = conn.execute(sql).fetchall()
    session = sqldp.connect(dsn, policy=ROOT / "benchmarks" / "tpch" / "units" / "customer.toml")
    prepared = session.prepare(sql, epsilon=1.0)
    form = prepared.form
    assert isinstance(form, AnalysisForm)
    result = prepared.analyze()
    value = next(i for i, o in enumerate(form.outputs) if not o.is_key)
    ours = []
    for measured in result.measurements:
        assert all(m.mechanism == UNIT_HISTOGRAM for m in measured)
        v = evaluate(form.outputs[value].expr, [m.true_value for m in measured])
        if v is not None and v != 0:
            ours.append(v)
    theirs = [float(_plain(row[value])) for row in plain if row[value] is not None and row[value] != 0]
    assert sorted(ours) == pytest.approx(sorted(theirs), rel=1e-9)
    session.close()


def test_rows_outside_the_released_groups_count_in_the_units_total(pg_dsn: str) -> None:
    """With the domain of o.d declared as [1], rows with d = 0 are in no released group but still in their
    unit's total c_u (only lowering its scale): group 1's truncated values and mass are those of the oracle
    with c_u over both groups, and every neighbour stays within ε."""
    sql = "SELECT o.d, COUNT(*) FROM o, l WHERE o.oid = l.oid GROUP BY o.d"
    contribution: Contribution = lambda d, ls: [len(ls)]  # noqa: E731
    thresholds = races(GS)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        s = sqldp.connect(pg_dsn, Policy.from_toml(POLICY.replace("domain = [0, 1]", "domain = [1]")))
        worst = 0.0
        for db in GROUPED:
            _load(conn, db)
            hist, mass = _read(s, sql)
            assert len(hist) == 1  # the one declared group
            ours = _contributions(db, contribution, 1)
            assert hist[0][0] == pytest.approx([_histogram(ours, t)[1][0] for t in thresholds], rel=1e-12, abs=1e-12)
            assert mass[0] == pytest.approx([_masses(ours, t)[1] for t in thresholds], rel=1e-12, abs=1e-12)
            for unit in db:
                _load(conn, {u: orders for u, orders in db.items() if u != unit})
                hist2, mass2 = _read(s, sql)
                worst = max(worst, _mechanism_loss(mass[0], mass2[0], [hist[0]], [hist2[0]], EPS))
        assert 0.5 * EPS < worst <= EPS * (1 + 1e-9)
