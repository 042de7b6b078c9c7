"""The DP error bar of a smoothed bound (sqldp.mechanisms.smooth_bar, docs/privacy.md "An error bar for a
smoothed bound").

* Brute force (real PostgreSQL, tests/oracles.py): on tiny databases, every row added or removed (tables of
  weight 1 and 2): the exact privacy loss of the released pair (value, L) — generalized Cauchy around the true
  value at the scale computed on each database, and Laplace around ln(scale) at β/ε_b — is ≤ ε·d; the same for
  values moved in an ℓ1 norm (distance |shift|); for the smoothed Laplace the value is (ε_v·d, δ) and L ε_b·d.
  A mutant that releases L at β/ε (the share forgotten) fails it.
* Coverage: ≥ 200 seeded releases on a fixed database; the share of bars that hold the true value is at least
  the stated confidence − 3 points. A mutant with the shift's sign reversed fails it.
* The outputs carry the bar: JSON (the noisy U, ε_b), the text's ``±``, to_pandas().
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from oracles import check_neighbours, product_rows, row_neighbours, sql_statements, values_changed

import sqldp
from sqldp import release
from sqldp.mechanisms import smooth_bar
from sqldp.policy import Policy
from sqldp.result import Measurement
from sqldp.session import Session

DDL = "CREATE TABLE r (k INT, b INT, a INT);\nCREATE TABLE s (k INT, b INT);\n"
POLICY = "[tables.r]\nweight = 1.0\n[tables.r.columns.a]\nrange = [0, 2]\n[tables.s]\nweight = 2.0\n"
COLUMNS = {"r": ("k", "b", "a"), "s": ("k", "b")}
DB: dict[str, list[Any]] = {
    "r": [(1, 0, 2), (2, 0, 1), (3, 1, 0)],
    "s": [(1, 0), (2, 0), (3, 1)],
}
ADDED = {"r": [(9, b, a) for b, a in product_rows((0, 1), (0, 2))], "s": [(9, b) for b in (0, 1)]}
QUERIES = ["SELECT COUNT(*) FROM r, s WHERE r.b = s.b", "SELECT SUM(r.a) FROM r, s WHERE r.b = s.b"]
EPSILON, SHARE = 1.0, 0.25
CONFIDENCE = 0.95  # the bar's: half its miss to the noisy bound U, half to the value's noise


def _load(conn: psycopg.Connection, db: dict[str, list[Any]]) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(row))})", row)


@pytest.fixture
def session(pg_dsn: str) -> Iterator[Session]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        _load(conn, DB)
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=11)


def _measured(session: Session, sql: str, **privacy: Any) -> Measurement:
    (group,) = session.analyze(sql, audit=True, epsilon=EPSILON, bar_share=SHARE, **privacy).measurements
    (m,) = group
    return m


def _pair_losses(session: Session, sql: str, **privacy: Any) -> tuple[float, int, float]:
    """check_neighbours over every row neighbour of DB: the pair (value, L) held to ε·d. Returns the worst
    share of the claim, the number of pairs and the largest |Δ ln scale|/(β·d) (1: L's loss reaches ε_b·d)."""
    with psycopg.connect(session.dsn, autocommit=True) as conn:
        truth: dict[int, list[tuple[float, float, str]]] = {}

        def output(db: Any) -> list[tuple[float, float, str]]:
            key = id(db)
            return truth[key]

        def measure() -> list[tuple[float, float, str]]:
            m = _measured(session, sql, **privacy)
            assert m.bar is not None and m.true_value is not None
            lam = smooth_bar.log_noise_scale(m.bar.beta, m.bar.epsilon)
            # the value's noise (the measurement's own mechanism) and L's Laplace, independent coordinates
            return [(m.true_value, m.noise_scale, m.mechanism), (m.bar.log_scale, lam, "laplace")]

        truth[id(DB)] = measure()
        neighbours = list(row_neighbours(DB, ADDED, {"r": 1.0, "s": 2.0}))
        for n in neighbours:
            make, undo = sql_statements(n, COLUMNS)
            conn.execute(make)
            truth[id(n.db)] = measure()
            conn.execute(undo)
        worst = check_neighbours(DB, neighbours, output, epsilon=EPSILON)
    (_, (log0, lam0, _)) = truth[id(DB)]
    beta = lam0 * EPSILON * SHARE
    moved = max(abs(truth[id(n.db)][1][0] - log0) / (beta * n.distance) for n in neighbours)
    return worst.share, worst.pairs, moved


@pytest.mark.parametrize("sql", QUERIES)
@pytest.mark.parametrize("beta", [None, 0.05])
def test_the_pair_value_and_log_scale_costs_at_most_epsilon_d(session: Session, sql: str, beta: float | None) -> None:
    share, pairs, moved = _pair_losses(session, sql, beta=beta)
    assert pairs == 3 + 4 + 3 + 2  # every row removed, every candidate added, in r (weight 1) and s (weight 2)
    assert share <= 1.0 + 1e-9, share
    assert share > 0.3, share  # the neighbours come near the claim: a share forgotten would show
    assert moved <= 1.0 + 1e-9  # ln(scale) moves by at most β·d: the smoothness L's noise is calibrated to
    if beta is not None:  # a fixed β: some neighbour moves ln(scale) by exactly β·d, L's loss reaches ε_b·d
        assert moved > 0.99, moved


def test_releasing_l_at_the_whole_epsilon_fails_the_oracle(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    made = release.smooth_bar

    def forgetting_the_share(*args: Any) -> smooth_bar.SmoothBar | None:
        bar = made(*args)
        if bar is not None:
            bar.epsilon /= bar.share  # the mutant: L at β/ε
        return bar

    monkeypatch.setattr(release, "smooth_bar", forgetting_the_share)
    with pytest.raises(AssertionError):
        _pair_losses(session, QUERIES[0], beta=0.05)


def _coverage(session: Session, sql: str, runs: int, **privacy: Any) -> float:
    """The share of ``runs`` seeded releases whose bar holds the true value."""
    truth = _measured(session, sql, **privacy).true_value
    assert truth is not None
    held = 0
    for _ in range(runs):
        out = session.run(sql, epsilon=EPSILON, bar_share=SHARE, confidence=CONFIDENCE, **privacy).to_json()
        (name,) = out["values"]
        width = out["errors"][name]
        held += abs(out["values"][name] - truth) <= width
    return held / runs


@pytest.mark.parametrize(("sql", "privacy"), [(QUERIES[0], {"beta": 0.1}), (QUERIES[1], {})])
def test_the_bars_hold_the_truth_at_the_stated_confidence(session: Session, sql: str, privacy: dict) -> None:
    rate = _coverage(session, sql, 200, **privacy)
    assert rate >= CONFIDENCE - 0.03, rate


def test_a_reversed_shift_fails_the_coverage(session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    def wrong_sign(noisy_log: float, beta: float, epsilon: float, miss: float) -> float:
        return math.exp(noisy_log - smooth_bar.log_noise_scale(beta, epsilon) * math.log(1.0 / (2.0 * miss)))

    monkeypatch.setattr(smooth_bar, "upper_bound", wrong_sign)
    assert _coverage(session, QUERIES[0], 200, beta=0.1) < CONFIDENCE - 0.03


def test_every_output_carries_the_bar(session: Session) -> None:
    result = session.run(QUERIES[0], epsilon=EPSILON, bar_share=SHARE, beta=0.05)
    out = result.to_json()
    (name,) = out["values"]
    width = out["errors"][name]
    (m,) = out["measurements"][0]
    bar = m["bar"]
    assert bar["share"] == SHARE and bar["epsilon"] == pytest.approx(EPSILON * SHARE)
    assert "log_scale" not in bar and "noise_scale" not in m  # the true scale stays private
    assert bar["scale_upper_bound"] > 0 and math.isfinite(bar["noisy_log_scale"])
    text = str(result)
    assert " ± " in text and "no ± bar" not in text
    assert ("noise dominates" in text) == (width >= abs(out["values"][name]))
    frame = result.to_pandas()
    assert frame[f"{name}_error"].iloc[0] == width
    # without a share: the value is marked, no bar
    plain = session.run(QUERIES[0], epsilon=EPSILON, beta=0.05)
    assert not plain.to_json()["errors"] and "no ± bar" in str(plain)
    assert "bar" not in plain.to_json()["measurements"][0][0]


def test_the_smoothed_laplace_keeps_delta_at_the_value_share_and_l_its_epsilon_b(session: Session) -> None:
    """(ε, δ): the value is (ε_v·d, δ) at ε_v = (1 − s)·ε (the hockey-stick divergence, both directions) and L
    pure ε_b·d, so the pair is (ε·d, δ) by sequential composition."""
    sql, delta = QUERIES[0], 1e-6
    values: dict[int, list[tuple[float, float, str]]] = {}
    logs: dict[int, list[tuple[float, float, str]]] = {}
    neighbours = list(row_neighbours(DB, ADDED, {"r": 1.0, "s": 2.0}))
    with psycopg.connect(session.dsn, autocommit=True) as conn:
        for key, n in [(id(DB), None), *((id(n.db), n) for n in neighbours)]:
            if n is not None:
                make, undo = sql_statements(n, COLUMNS)
                conn.execute(make)
            m = _measured(session, sql, mechanism="laplace", delta=delta)
            assert m.mechanism == "laplace" and m.bar is not None and m.true_value is not None
            values[key] = [(m.true_value, m.noise_scale, "laplace")]
            logs[key] = [(m.bar.log_scale, smooth_bar.log_noise_scale(m.bar.beta, m.bar.epsilon), "laplace")]
            if n is not None:
                conn.execute(undo)
    value_eps = EPSILON * (1 - SHARE)
    check_neighbours(DB, neighbours, lambda db: values[id(db)], epsilon=value_eps, delta=delta)
    worst = check_neighbours(DB, neighbours, lambda db: logs[id(db)], epsilon=EPSILON * SHARE)
    assert worst.share > 0.99  # ln(scale) moves by exactly β·d somewhere: L's noise is not wasted


VALUE_DDL = "CREATE TABLE v (k INT PRIMARY KEY, b INT, a INT);"
VALUE_POLICY = '[tables.v]\nrows = "public"\nnorm = "l1(a)"\n'
VALUE_DB: dict[str, list[Any]] = {"v": [(1, 0, 1), (2, 0, 3), (3, 1, 2)]}


def test_a_value_moved_in_its_norm_costs_the_pair_at_most_epsilon_d(pg_dsn: str) -> None:
    """Values private in an ℓ1 norm (rows public): each value moved by ±1 and ±2 (distance |shift|), the pair
    (value, L) held to ε·d as for rows."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(VALUE_DDL)
        _load(conn, VALUE_DB)
    session = sqldp.connect(pg_dsn, Policy.from_toml(VALUE_POLICY), seed=5)
    sql = "SELECT SUM(v.a * v.a) FROM v WHERE v.b = 0"
    neighbours = list(values_changed(VALUE_DB, "v", {2: 1.0}, [1, -1, 2, -2]))
    truth: dict[int, list[tuple[float, float, str]]] = {}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for key, n in [(id(VALUE_DB), None), *((id(n.db), n) for n in neighbours)]:
            if n is not None:
                make, undo = sql_statements(n, {"v": ("k", "b", "a")})
                conn.execute(make)
            m = _measured(session, sql, beta=0.05)
            assert m.mechanism == "cauchy" and m.bar is not None and m.true_value is not None
            lam = smooth_bar.log_noise_scale(m.bar.beta, m.bar.epsilon)
            truth[key] = [(m.true_value, m.noise_scale, m.mechanism), (m.bar.log_scale, lam, "laplace")]
            if n is not None:
                conn.execute(undo)
    worst = check_neighbours(VALUE_DB, neighbours, lambda db: truth[id(db)], epsilon=EPSILON)
    assert worst.pairs == 12 and worst.share > 0.2, (worst.pairs, worst.share)  # the pairs do move
