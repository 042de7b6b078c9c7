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


@pytest.mark.parametrize(("epsilon", "delta", "c"), [(1.0, 1e-6, 1.0), (0.3, 0.01, 1.0), (2.0, 1e-9, 3.0)])
def test_a_group_on_one_side_only_is_released_with_probability_delta(epsilon: float, delta: float, c: float) -> None:
    """A neighbour adds or removes up to c rows of one group: a group with count c on one side and absent on the
    other is released with P[c + Lap(c/ε) > τ] = ½·exp(−ε(τ − c)/c), which must be ≤ δ (here = δ exactly)."""
    selector = Measurement("COUNT(*)", epsilon, delta, 0.0, c, c / epsilon, 0.0, {}, mechanism=GLOBAL)
    tau = selection_threshold(selector)
    released = 0.5 * math.exp(-epsilon * (tau - c) / c)
    assert released == pytest.approx(delta, rel=1e-9) and released <= delta * (1 + 1e-9)
    # the loss for groups present on both sides: the release probabilities of counts n and n + c differ by at
    # most e^ε (the Laplace tail is e^ε-Lipschitz in the shift)
    for n in (c, 2 * c, tau, tau + c):
        assert _released(n + c, tau, c / epsilon) / _released(n, tau, c / epsilon) <= math.exp(epsilon) * (1 + 1e-9)


def _released(n: float, tau: float, scale: float) -> float:
    """P[n + Lap(scale) > τ]."""
    return 0.5 * math.exp(-(tau - n) / scale) if n <= tau else 1 - 0.5 * math.exp(-(n - tau) / scale)


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
        p = _released(n, tau, 1.0)
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
        p = _released(n, tau, 1.0)
        assert abs(seen[group] / runs - p) <= 4 * math.sqrt(p * (1 - p) / runs) + 1e-12, group
    with pytest.raises(RefusedError, match=r"SELECT DISTINCT over private tables releases which values occur"):
        session.prepare("SELECT DISTINCT t.g FROM t", epsilon=1.0)
