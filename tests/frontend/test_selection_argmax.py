"""The argmax over a grouped WITH query (sqldp.strategies.argmax, TPC-H Q15's shape), on a real PostgreSQL.

* TPC-H SF 0.01 under ``tpch_catalog``: the un-noised pipeline (audit mode: the true argmax, its true total)
  returns PostgreSQL's own answer to the unmodified Q15; a noisy run returns one supplier row.
* Brute force over every neighbour of a tiny database (each private row removed, rows of a small universe
  added — one beyond the declared range —, each sensitive value moved): the exact privacy loss of the joint
  output (the chosen key, its noisy total) is max over keys v of |ln P(v | D) − ln P(v | D′)| +
  |s_v(D) − s_v(D′)|/b, with P the exponential mechanism's probabilities exp(ε₁·s/Δ)/Z computed exactly from
  the scores and b = Δ/ε₂ the Laplace scale; it must be ≤ ε·d(D, D′).
* Mutants the brute force kills: ``no-clamp`` (the SUM over the raw values: a row beyond the declared range
  moves a score by more than Δ) and ``no-filter-flip`` (Δ without the term of a filter on a sensitive date: a
  one-day change moves a row's whole term in or out of the window).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from oracles import (
    exponential_law,
    laplace_loss,
    max_log_ratio,
    product_rows,
    rows_added,
    rows_removed,
    sql_statements,
    values_changed,
)

import sqldp
from sqldp.strategies import argmax

QUERIES = Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries"
EPSILON = 1.0

DDL = """
CREATE TABLE sup (sk INT PRIMARY KEY, name TEXT NOT NULL);
CREATE TABLE li (id INT PRIMARY KEY, sk INT NOT NULL, q DECIMAL(15, 2) NOT NULL, d DATE NOT NULL);
INSERT INTO sup VALUES (1, 'one'), (2, 'two'), (3, 'three');
INSERT INTO li VALUES (1, 1, 3.00, '2020-01-10'), (2, 1, 1.00, '2020-01-12'), (3, 2, 4.00, '2020-01-11'),
                      (4, 2, 9.00, '2020-01-09');
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.sup]
rows = "public"
[tables.li]
rows = "private"
weight = 2.0
norm = "l1(q, d)"
[tables.li.columns.q]
range = [0, 10]
[tables.li.columns.d]
range = ["2020-01-01", "2020-02-01"]
unit = "day"
"""
QUERY = """
WITH rev (supplier_no, total) AS (SELECT sk, SUM(q) FROM li WHERE d >= DATE '2020-01-10' GROUP BY sk)
SELECT sup.sk, name, total FROM sup, rev
WHERE sup.sk = supplier_no AND total = (SELECT MAX(total) FROM rev) ORDER BY sup.sk
"""
LI = {
    "li": [
        (1, 1, Decimal("3.00"), dt.date(2020, 1, 10)),
        (2, 1, Decimal("1.00"), dt.date(2020, 1, 12)),
        (3, 2, Decimal("4.00"), dt.date(2020, 1, 11)),
        (4, 2, Decimal("9.00"), dt.date(2020, 1, 9)),
    ]
}  # li as DDL loads it
LI_COLUMNS = {"li": ("id", "sk", "q", "d")}


def _neighbours() -> Iterator[tuple[str, str, float]]:
    """(SQL making D′, SQL restoring D, d(D, D′)): rows weigh 2, q and d 1 per unit (a day)."""

    def later(d: dt.date, n: int) -> dt.date:
        return d + dt.timedelta(days=n)

    added = [  # q = 100: beyond the declared range, clamped to 10
        (99, sk, Decimal(q), dt.date.fromisoformat(d))
        for sk, q, d in product_rows((1, 2, 3), ("0.50", "10.00", "100.00"), ("2020-01-09", "2020-01-10"))
    ]
    changes = itertools.chain(
        rows_removed(LI, "li", 2.0),
        values_changed(LI, "li", {2: 1.0}, [Decimal(x) for x in ("0.01", "-0.01", "2", "-3")]),
        values_changed(LI, "li", {3: 1.0}, (1, -1, 2), add=later),
        rows_added(LI, "li", added, 2.0),
    )
    for n in changes:
        yield (*sql_statements(n, LI_COLUMNS), n.distance)


@pytest.fixture(scope="module")
def tiny(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from pg_support import create_database, drop_database

    dsn = create_database(pg_server_dsn)
    policy = tmp_path_factory.mktemp("argmax") / "policy.toml"
    policy.write_text(POLICY)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
        yield dsn, policy
    finally:
        drop_database(pg_server_dsn, dsn)


def _scores(session: sqldp.session.Session) -> tuple[dict[str, float], float, list[tuple[Any, ...]]]:
    """The true score per candidate, Δ, and the rows of the un-noised pipeline."""
    result = session.analyze(QUERY, epsilon=EPSILON)
    scores = {m[0].aggregate: float(m[0].true_value or 0.0) for m in result.measurements[:-1]}
    delta = result.measurements[-1][0].sensitivity
    rows = [tuple({**r["key"], **r["values"]}.values()) for r in result.rows]
    return scores, delta, rows


def _brute_force(dsn: str, policy: Path) -> tuple[float, list[tuple[str, float, float]]]:
    session = sqldp.connect(dsn, policy)
    e1 = EPSILON * argmax.ARGMAX_SHARE
    e2 = EPSILON - e1
    worst, over = 0.0, []
    try:
        s, delta, _ = _scores(session)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for make, undo, d in _neighbours():
                conn.execute(make)
                try:
                    s2, delta2, _ = _scores(session)
                finally:
                    conn.execute(undo)
                assert delta2 == delta and s2.keys() == s.keys()
                p, p2 = exponential_law(s, e1 / delta), exponential_law(s2, e1 / delta)
                # the choice of v, then its score released with Laplace at Δ/ε₂
                loss = max(max_log_ratio({v: p[v]}, {v: p2[v]}) + laplace_loss(s[v] - s2[v], delta / e2) for v in s)
                worst = max(worst, loss / (EPSILON * d))
                if loss > EPSILON * d * (1 + 1e-9):
                    over.append((make, loss, EPSILON * d))
        assert _scores(session)[0] == s
    finally:
        session.close()
    return worst, over


def test_every_neighbour_within_epsilon(tiny: tuple[str, Path]) -> None:
    dsn, policy = tiny
    session = sqldp.connect(dsn, policy)
    try:
        scores, delta, rows = _scores(session)
        assert scores == {"score(1)": 4.0, "score(2)": 4.0, "score(3)": 0.0}
        # Δ = max(10/2 a row of weight 2, 1 the derivative of q, 10/(1·1) the date filter flipped by one day)
        assert delta == 10.0
        with psycopg.connect(dsn) as conn:
            plain = [tuple(r) for r in conn.execute(QUERY).fetchall()]
        assert rows == [plain[0]]  # a tie: PostgreSQL returns both, the argmax one (the first)
        assert session.cost(QUERY, epsilon=EPSILON) == (EPSILON, 0.0)
        out = session.run(QUERY, epsilon=EPSILON)
        assert session.rho_spent == pytest.approx(2 * 0.5**2 / 2)  # two pure releases of ε/2 each
        (row,) = out.table()[1]
        assert row[:2] in {(1, "one"), (2, "two"), (3, "three")}
    finally:
        session.close()
    worst, over = _brute_force(dsn, policy)
    assert not over, over
    assert worst > 0.5, worst


def test_mutant_no_clamp_is_killed(tiny: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(argmax, "clamped", lambda e, dom: e)
    _, over = _brute_force(*tiny)
    assert over and all("100.00" in make for make, _, _ in over)


def test_mutant_no_filter_flip_is_killed(tiny: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(argmax, "filter_flip", lambda m, weight, grid: 0.0)
    _, over = _brute_force(*tiny)
    assert over and any("SET d = " in make for make, _, _ in over)  # a date moved


def test_explain_shows_the_choice_without_reading_data() -> None:
    from sqldp.catalog import Catalog
    from sqldp.commands.explain import explain
    from sqldp.datasets import dataset_path
    from sqldp.policy import Policy

    catalog = Catalog.from_file(dataset_path("tpch.sql"))
    policy = Policy.from_file(dataset_path("tpch_catalog.toml"))
    out = explain((QUERIES / "q15.sql").read_text(encoding="utf-8"), catalog, policy)
    assert out["refused"] is None and out["selection"]["score_bound"] == 104950.0
    assert out["sql"] == out["selection"]["sql"] and "sqldp_candidates" in out["sql"][0]


def _plain(v: Any) -> Any:
    return v.rstrip() if isinstance(v, str) else v


def test_q15_unnoised_is_postgres_answer_on_tpch(tpch_dsn: tuple[str, Any, Any]) -> None:
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q15.sql").read_text(encoding="utf-8")
    with psycopg.connect(dsn) as conn:
        plain = [tuple(_plain(v) for v in row) for row in conn.execute(sql).fetchall()]
    session = sqldp.connect(dsn, policy="tpch_catalog", seed=7)
    try:
        prepared = session.prepare(sql, epsilon=EPSILON)
        assert isinstance(prepared, argmax.Argmax)
        audit = prepared.analyze()
        assert [tuple(_plain(v) for v in {**r["key"], **r["values"]}.values()) for r in audit.rows] == plain
        out = session.run(sql, epsilon=EPSILON)
        columns, rows = out.table()
        assert columns == ["s_suppkey", "s_name", "s_address", "s_phone", "total_revenue"] and len(rows) == 1
        assert out.to_json()["epsilon"] == EPSILON and out.to_json()["delta"] is None
        # Δ = 104,950 (docs/selection.md), ε₂ = ε/2: the total's error bar is data-independent
        (record,) = out.records()
        assert record["total_revenue_error"] == pytest.approx(104950 / 0.5 * -math.log(1 - 0.78))
    finally:
        session.close()


def _frequencies_match(draw: Any) -> bool:
    """30,000 seeded draws of ``draw(scores, rate, source)`` against exp(rate·s)/Z, each within 5 standard errors."""
    from sqldp.mechanisms import NoiseSource

    scores = [("a", 0.0), ("b", -1.0), ("c", -2.0), ("d", 0.0)]
    source = NoiseSource.seeded(11)
    n = 30_000
    counts = [0] * len(scores)
    for _ in range(n):
        counts[draw(scores, 0.7, source)] += 1
    expected = exponential_law(dict(scores), 0.7)
    return all(
        abs(c / n - expected[v]) < 5 * math.sqrt(expected[v] * (1 - expected[v]) / n)
        for (v, _), c in zip(scores, counts, strict=True)
    )


def test_the_sampler_draws_the_exponential_mechanism() -> None:
    """The sampler against the closed-form probabilities; the mutant ``doubled-rate`` (weights exp(2·rate·s), as
    if the factor 2 were applied the wrong way) fails the same check."""
    assert _frequencies_match(argmax.exponential)
    assert not _frequencies_match(lambda scores, rate, source: argmax.exponential(scores, 2 * rate, source))
