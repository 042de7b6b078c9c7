"""DP partition selection for group keys of private tables without a declared domain (sqldp.groups.
partition_selection): a group present in the data is released only if its noisy COUNT(*) passes
τ = c·(1 + ln(1/(2δ))/ε).

Oracles: the exact tail of the Laplace distribution (a group that exists on one side of a neighbouring pair
is released with probability exactly δ, and never more), the release frequencies of groups of size 1 and of
neighbouring sizes over seeded runs on PostgreSQL against δ and e^ε, and the fail-closed refusals (pure ε,
a count whose bound depends on the data, a row that touches several groups)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import psycopg
import pytest
from oracles import laplace_exceeds, row_neighbours, selection_hockey_stick, values_changed

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.release import selection_threshold
from sqldp.result import GLOBAL, Measurement

POLICY = '[tables.t]\nrows = "private"\n[tables.u]\nrows = "private"\n'


@pytest.fixture
def session(pg_dsn: str) -> Iterator[sqldp.session.Session]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INT PRIMARY KEY, g TEXT, x INT)")
        # group a: 1 row; b: 5; c: 6; d: 60
        rows = [("a", 1), ("b", 5), ("c", 6), ("d", 60)]
        conn.execute(
            "INSERT INTO t SELECT row_number() OVER (), g, 1 FROM (VALUES "
            + ", ".join(f"('{g}', {n})" for g, n in rows)
            + ") AS v(g, n), generate_series(1, n)"
        )
        conn.execute("CREATE TABLE u (id INT PRIMARY KEY, g TEXT)")
        conn.execute("INSERT INTO u VALUES (1, 'a'), (2, 'a')")
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=17)


@pytest.mark.parametrize(
    ("epsilon", "delta", "c", "weight"),
    [
        (1.0, 1e-6, 1.0, 1.0),
        (0.3, 0.01, 1.0, 1.0),
        (2.0, 1e-9, 3.0, 1.0),
        (1.0, 1e-6, 0.5, 2.0),
        (1.0, 1e-6, 0.05, 20.0),
    ],
)
def test_a_group_on_one_side_only_is_released_with_probability_delta(
    epsilon: float, delta: float, c: float, weight: float
) -> None:
    """A neighbour at distance G adds or removes up to M = c·G rows of one group (c per unit of distance): a group
    with count M on one side and absent on the other is released with P[M + Lap(c/ε) > τ] = ½·exp(−ε(τ − M)/c),
    which must be ≤ δ (here = δ exactly) at every weight G; a common group's release probability moves by at most
    e^(εG) when its count moves by c·G."""
    one_change = c * weight
    selector = Measurement(
        "COUNT(*)", epsilon, delta, 0.0, c, c / epsilon, 0.0, {}, mechanism=GLOBAL, one_sided=one_change
    )
    tau = selection_threshold(selector)
    released = 0.5 * math.exp(-epsilon * (tau - one_change) / c)
    assert released == pytest.approx(delta, rel=1e-9) and released <= delta * (1 + 1e-9)
    for n in (c, 2 * c, tau, tau + c):
        ratio = laplace_exceeds(n + one_change, tau, c / epsilon) / laplace_exceeds(n, tau, c / epsilon)
        assert ratio <= math.exp(epsilon * weight) * (1 + 1e-9)


def test_the_threshold_fails_closed_without_a_one_sided_count() -> None:
    selector = Measurement("COUNT(*)", 1.0, 1e-6, 0.0, 1.0, 1.0, 0.0, {}, mechanism=GLOBAL)
    with pytest.raises(RefusedError, match="bound on the count of a group that one change creates"):
        selection_threshold(selector)


def test_groups_present_in_the_data_are_selected_by_their_noisy_count(session: sqldp.session.Session) -> None:
    """δ = 0.01, ε = 1, the query's own COUNT(*) selects: τ = 1 + ln 50 ≈ 4.91. Each group is released as often
    as P[n + Lap(1) > τ] says (a: 1 row, ≈ δ; b: 5, ≈ 0.55; c: 6, ≈ 0.83; d: 60, always), within 4 standard
    errors over the seeded runs; a run releases exactly the measurements of the groups it shows."""
    sql = "SELECT t.g, COUNT(*) AS n FROM t GROUP BY t.g"
    runs = 1500
    seen = {"a": 0, "b": 0, "c": 0, "d": 0}
    for _ in range(runs):
        result = session.run(sql, epsilon=1.0, mechanism="laplace", delta=0.01)
        assert len(result.measurements) == len(result.rows)  # how many groups the data has does not leak
        for row in result.rows:
            seen[row["key"]["g"]] += 1
    tau = 1 + math.log(1 / (2 * 0.01))
    for group, n in (("a", 1), ("b", 5), ("c", 6), ("d", 60)):
        p = laplace_exceeds(n, tau, 1.0)
        assert abs(seen[group] / runs - p) <= 4 * math.sqrt(p * (1 - p) / runs) + 1e-12, group


def test_selection_fails_closed(session: sqldp.session.Session) -> None:
    with pytest.raises(RefusedError, match=r"allow δ > 0 .* for DP partition selection"):
        session.prepare("SELECT t.g, COUNT(*) FROM t GROUP BY t.g", epsilon=1.0)  # pure ε (Cauchy)
    with pytest.raises(RefusedError, match=r"partition selection .* needs a count whose bound holds on every database"):
        session.prepare(
            "SELECT t.g, COUNT(*) FROM t, u WHERE t.g = u.g GROUP BY t.g", epsilon=1.0, mechanism="laplace", delta=0.01
        )


def test_select_distinct_releases_the_values_present_by_partition_selection(session: sqldp.session.Session) -> None:
    """SELECT DISTINCT t.g is GROUP BY t.g with a hidden COUNT(*) as the only measurement (full ε and δ): each
    value is released as often as P[n + Lap(1) > τ] says, and only the values, never a count."""
    runs = 800
    seen = {"a": 0, "b": 0, "c": 0, "d": 0}
    for _ in range(runs):
        result = session.run("SELECT DISTINCT t.g FROM t ORDER BY t.g", epsilon=1.0, mechanism="laplace", delta=0.01)
        assert result.columns == ["g"] and all(row["values"] == {} for row in result.rows)
        keys = [row["key"]["g"] for row in result.rows]
        assert keys == sorted(keys) and len(result.measurements) == len(keys)
        for g in keys:
            seen[g] += 1
    tau = 1 + math.log(1 / (2 * 0.01))
    for group, n in (("a", 1), ("b", 5), ("c", 6), ("d", 60)):
        p = laplace_exceeds(n, tau, 1.0)
        assert abs(seen[group] / runs - p) <= 4 * math.sqrt(p * (1 - p) / runs) + 1e-12, group
    with pytest.raises(RefusedError, match=r"SELECT DISTINCT over private tables releases which values occur"):
        session.prepare("SELECT DISTINCT t.g FROM t", epsilon=1.0)


# -- exact privacy loss over every neighbour of a tiny database ------------------------------------------------

RANGED = POLICY + "[tables.t.columns.x]\nrange = [0, 3]\n"


def _group_output(
    session: sqldp.session.Session, sql: str, epsilon: float, delta: float, present: list[str]
) -> dict[str, list]:
    """Per group present: [(true value, noise scale, ε share, τ or None)] for its measurements, the selector first,
    from the real analysis (sqldp's own scales, shares and threshold; the true values are the analysis' too).
    ``analyze`` measures the groups present in key order and releases no keys: ``present`` names them."""
    result = session.analyze(sql, epsilon=epsilon, mechanism="laplace", delta=delta)
    out: dict[str, list] = {}
    for g, measured in zip(present, result.measurements, strict=True):
        sel = next(m for m in measured if m.aggregate == "COUNT(*)")
        rest = [m for m in measured if m is not sel]
        out[g] = [(sel.true_value, sel.noise_scale, sel.epsilon, selection_threshold(sel))] + [
            (m.true_value, m.noise_scale, m.epsilon, None) for m in rest
        ]
    return out


FANOUT = '[tables.p]\nrows = "public"\n'


def _loaded(
    dsn: str, session: sqldp.session.Session, rows: list[tuple[int, str, int]], sql: str, eps: float, delta: float
) -> dict[str, list]:
    """t holding ``rows``, and sqldp's per-group figures for ``sql`` (:func:`_group_output`)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE t")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", rows)
    return _group_output(session, sql, eps, delta, sorted({g for _, g, _ in rows}))


@pytest.mark.parametrize("weight", [0.5, 1.0, 2.0, 20.0])
@pytest.mark.parametrize(
    ("sql", "epsilon", "delta"),
    [
        ("SELECT t.g, COUNT(*) AS n FROM t GROUP BY t.g", 1.0, 0.01),
        ("SELECT t.g, COUNT(*) AS n, SUM(t.x) AS s FROM t GROUP BY t.g", 0.7, 1e-3),
        # a fan-out to a public table: one row of t is two join rows (p holds each key twice)
        ("SELECT t.g, COUNT(*) AS n FROM t JOIN p ON p.k = t.x GROUP BY t.g", 1.0, 0.01),
    ],
)
def test_exact_privacy_loss_over_every_neighbour(
    pg_dsn: str, sql: str, epsilon: float, delta: float, weight: float
) -> None:
    """Every neighbour (one row of t removed, or one added to a present or a new group) of a tiny database, t at
    ``weight`` G (one row at distance G): the released outputs' hockey-stick divergence at e^(εG), in both
    directions, is ≤ δ — the README's "(ε·d, δ) for one change at distance d" — with the scales, shares and
    threshold sqldp computes (not restated here). Groups untouched by the changed row have equal output
    distributions and integrate out; the changed row touches exactly one group. The bound is attained (a group
    present on one side only is released with probability δ), so a lower threshold fails it: the threshold
    c·(1 + ln(1/(2δ))/ε) that ignored G gave 0.9986 at G = 20."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INT PRIMARY KEY, g TEXT, x INT)")
        conn.execute("CREATE TABLE u (id INT PRIMARY KEY, g TEXT)")
        conn.execute("CREATE TABLE p (id INT PRIMARY KEY, k INT)")
        conn.execute("INSERT INTO p SELECT i, i / 2 FROM generate_series(0, 7) AS i")  # keys 0 … 3, twice each
    policy = RANGED.replace('[tables.t]\nrows = "private"\n', f'[tables.t]\nrows = "private"\nweight = {weight}\n')
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy + FANOUT), seed=3)
    base = [(1, "a", 1), (2, "a", 3), (3, "b", 0), (4, "c", 2)]
    added = [(9, g, x) for g in ("a", "b", "new") for x in (0, 3)]  # to a present group or a new one

    def load(rows: list[tuple[int, str, int]]) -> dict[str, list]:
        return _loaded(pg_dsn, session, rows, sql, epsilon, delta)

    d0 = load(base)
    worst = 0.0
    for n in row_neighbours({"t": base}, {"t": added}):
        d1 = load(n.db["t"])
        changed = [g for g in set(d0) | set(d1) if d0.get(g) != d1.get(g)]
        assert len(changed) == 1, changed
        g = changed[0]
        for p, q in ((d0.get(g), d1.get(g)), (d1.get(g), d0.get(g))):
            h = selection_hockey_stick(p, q, epsilon * weight)
            assert h <= delta * (1 + 1e-6), (n.change, g, h)
            worst = max(worst, h)
    assert worst == pytest.approx(delta, rel=1e-3)  # a group of the changed row only, on one side: released w.p. δ


def test_value_changes_under_partition_selection(pg_dsn: str) -> None:
    """x in t's norm. A change of one row's x by k units (distance k) leaves every selection count and group as
    it was, so COUNT's release is the same on both sides (loss 0 at every k); a SUM over x under partition
    selection would move with it in a way the value-level plan does not bound per group, and is refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (id INT PRIMARY KEY, g TEXT, x INT)")
        conn.execute("CREATE TABLE u (id INT PRIMARY KEY, g TEXT)")
    policy = RANGED.replace('[tables.t]\nrows = "private"\n', '[tables.t]\nrows = "private"\nnorm = "l1(x)"\n')
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy), seed=3)
    sql, epsilon, delta = "SELECT t.g, COUNT(*) AS n FROM t GROUP BY t.g", 0.7, 1e-3
    base = [(1, "a", 0), (2, "a", 3), (3, "b", 0), (4, "c", 2)]

    def load(rows: list[tuple[int, str, int]]) -> dict[str, list]:
        return _loaded(pg_dsn, session, rows, sql, epsilon, delta)

    d0 = load(base)
    changes = list(values_changed({"t": base}, "t", {2: 1.0}, (-3, -2, -1, 1, 2, 3), within=lambda _, x: 0 <= x <= 3))
    assert len(changes) == 12
    for n in changes:
        assert load(n.db["t"]) == d0, n.change
    with pytest.raises(RefusedError, match="several groups"):
        session.prepare(
            "SELECT t.g, COUNT(*) AS n, SUM(t.x) AS s FROM t GROUP BY t.g", epsilon=1.0, delta=1e-3, mechanism="laplace"
        )
