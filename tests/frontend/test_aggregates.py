"""The aggregate table (sqldp.aggregates): every SQL aggregate sqldp answers is one entry, an expression over
the primitive aggregates the analyses bound; the refusals list the table."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from oracles import row_neighbours
from sqlglot import exp

import sqldp
from sqldp import aggregates, postprocess
from sqldp.catalog import Catalog
from sqldp.errors import ForbiddenError, RefusedError
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.normalize import PublicRelease, normalize
from sqldp.policy import Policy
from sqldp.session import Session

DDL = "CREATE TABLE t (id INT PRIMARY KEY, x INT, y NUMERIC(6, 2), s TEXT);"
POLICY = "[defaults]\nepsilon = 1.0\n[tables.t.columns.x]\nrange = [0, 60]\n[tables.t.columns.y]\nrange = [-5, 15]\n"


def _form(sql: str) -> AnalysisForm:
    catalog = Catalog.from_ddl(DDL)
    form = normalize(parse(sql, catalog), catalog, Policy.from_toml(POLICY))
    assert not isinstance(form, PublicRelease)
    return form


@pytest.mark.parametrize("sql", ["SELECT STRING_AGG(t.s, ',') FROM t", "SELECT BOOL_AND(t.x > 1) FROM t"])
def test_an_unsupported_aggregate_is_refused_with_the_tables_list(sql: str) -> None:
    with pytest.raises(RefusedError) as refused:
        _form(sql)
    listed = aggregates.supported()
    assert f"({listed} are)" in str(refused.value)
    names = [name for rule in aggregates.AGGREGATES.values() for name in (rule.name, *rule.also)]
    assert listed.split(", ") == names
    assert {"COUNT", "SUM", "AVG", "MIN", "MAX"} <= set(names)


def test_releasing_rows_names_the_aggregates_of_the_table() -> None:
    with pytest.raises(ForbiddenError) as refused:
        _form("SELECT * FROM t")
    assert f"only aggregates ({aggregates.supported()}) over private tables" in str(refused.value)


def test_a_having_refusal_lists_what_the_release_step_computes() -> None:
    with pytest.raises(RefusedError) as refused:
        _form("SELECT COUNT(*) FROM t HAVING COUNT(*) > 'a'")
    listed = postprocess.post_processing()
    assert f"({listed})" in str(refused.value)
    assert all(op in listed.split(", ") for op in ("=", "BETWEEN", "NOT", "+", "/", "GREATEST"))


def test_the_entries_write_the_primitive_aggregates() -> None:
    form = _form("SELECT COUNT(*), COUNT(t.x), SUM(t.x), MIN(t.y), MAX(t.y), AVG(t.x) FROM t")
    assert [a.sql for a in form.aggregates] == [
        "COUNT(*)",
        "COUNT(t.x)",
        "SUM(t.x)",
        "MIN(t.y)",
        "MAX(t.y)",
        "SUM(t.x - 30)",  # AVG's centred sum, with AVG's COUNT(t.x) shared with the second output
    ]
    assert [o.aggregates for o in form.outputs] == [(0,), (1,), (2,), (3,), (4,), (5, 1)]


# -- VARIANCE and STDDEV: three measurements, centred, clamped ---------------------------------------------

SPREADS = ("VAR_POP", "VAR_SAMP", "VARIANCE", "STDDEV_POP", "STDDEV_SAMP", "STDDEV")
SQRT2 = math.sqrt(2.0)


def test_the_refusal_lists_the_spreads() -> None:
    with pytest.raises(RefusedError) as refused:
        _form("SELECT STRING_AGG(t.s, ',') FROM t")
    assert all(name in str(refused.value) for name in SPREADS)


def test_a_spread_is_three_measurements_shared_with_avg() -> None:
    form = _form("SELECT AVG(t.x), VAR_POP(t.x), VARIANCE(t.x), STDDEV(t.x), STDDEV_POP(t.x) FROM t")
    assert [a.sql for a in form.aggregates] == ["SUM(t.x - 30)", "COUNT(t.x)", "SUM((t.x - 30) * (t.x - 30))"]
    assert any(n.startswith("VAR_POP → SUM((x − 30)²)/n − (SUM(x − 30)/n)²") for n in form.notes)
    assert any("clamped to [0, 900]" in n and "at most 1800" in n for n in form.notes if n.startswith("VAR_SAMP"))
    # an expression has no declared range: the plain sums, the variance clamped below only
    plain = _form("SELECT VAR_POP(t.x + 1) FROM t")
    assert [a.sql for a in plain.aggregates] == ["COUNT(t.x + 1)", "SUM(t.x + 1)", "SUM((t.x + 1) * (t.x + 1))"]
    assert any("SUM(x²)/n − (SUM(x)/n)²" in n and "at least 0" in n for n in plain.notes)


def test_having_may_compare_a_spread() -> None:
    form = _form("SELECT COUNT(*) FROM t HAVING STDDEV(t.x) > 1")
    assert form.having is not None and form.having.find(exp.Sqrt) is not None


def _spread_of(name: str, values: list[float]) -> float | None:
    """The definition, in exact rationals where the values are."""
    n = len(values)
    sample = name in ("VAR_SAMP", "VARIANCE", "STDDEV_SAMP", "STDDEV")
    if n <= (1 if sample else 0):
        return None
    var = statistics.variance(values) if sample else statistics.pvariance(values)
    return math.sqrt(var) if name.startswith("STDDEV") else float(var)


FINITE = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
COUNTS = st.floats(min_value=-2.0, max_value=4.0) | FINITE | st.none()  # near 1, where n/(n − 1) explodes
SUMS = FINITE | st.none()


@settings(max_examples=300, deadline=None)
@given(n=COUNTS, s1=SUMS, s2=SUMS)
@example(n=1.5, s1=0.0, s2=1e6)  # VAR_POP clamped to 900, times n/(n − 1) = 3: VAR_SAMP needs its own clamp
@example(n=2.0, s1=0.0, s2=1800.0)  # {0, 60}: VAR_POP 900 and VAR_SAMP 1800, both at their bounds
def test_the_released_spread_stays_in_its_clamp_whatever_the_noise(
    n: float | None, s1: float | None, s2: float | None
) -> None:
    """On any noisy values (a negative count, sums far from the truth, a NULL), what is released lies where
    every variance of values in [0, 60] lies: [0, 900] for VAR_POP, [0, 1800] for VAR_SAMP (n/(n − 1)·30² at
    n = 2), their roots for STDDEV; or is NULL, as PostgreSQL's for n ≤ 0 (VAR_POP) and n ≤ 1 (VAR_SAMP)."""
    form = _form("SELECT " + ", ".join(f"{s}(t.x) AS {s.lower()}" for s in SPREADS) + " FROM t")
    noisy = {"COUNT(t.x)": n, "SUM(t.x - 30)": s1, "SUM((t.x - 30) * (t.x - 30))": s2}
    values = [noisy[a.sql] for a in form.aggregates]
    tops = {"VAR_POP": 900.0, "VAR_SAMP": 1800.0, "VARIANCE": 1800.0}
    tops |= {"STDDEV_POP": 30.0, "STDDEV_SAMP": 30.0 * SQRT2, "STDDEV": 30.0 * SQRT2}
    for name, output in zip(SPREADS, form.outputs, strict=True):
        got = postprocess.evaluate(output.expr, values)
        sample = name not in ("VAR_POP", "STDDEV_POP")
        if n is None or n <= (1 if sample else 0) or s1 is None or s2 is None:
            assert got is None, (name, values)
        else:
            assert got is not None and 0.0 <= got <= tops[name] * (1 + 1e-12), (name, values, got)
    if (n, s1, s2) == (2.0, 0.0, 1800.0):
        got = [postprocess.evaluate(o.expr, values) for o in form.outputs]
        assert got == [900.0, 1800.0, 1800.0, 30.0, pytest.approx(30.0 * SQRT2), pytest.approx(30.0 * SQRT2)]


@pytest.fixture
def session(pg_dsn: str) -> Iterator[Session]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=7)


def _load(session: Session, rows: list[tuple[int | None, Decimal | None]]) -> None:
    with psycopg.connect(session.dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM t")
        for i, (x, y) in enumerate(rows):
            conn.execute("INSERT INTO t VALUES (%s, %s, %s, NULL)", (i, x, y))


def _without_noise(session: Session, sql: str) -> list[float | None]:
    """Each output evaluated on the measurements' true values: the formula, noise removed."""
    prepared = session.prepare(sql)
    assert isinstance(prepared.form, AnalysisForm)
    (measured,) = session.analyze(sql, audit=True).measurements
    truth = [m.true_value for m in measured]
    return [postprocess.evaluate(o.expr, truth) for o in prepared.form.outputs]


XS = st.integers(min_value=0, max_value=60) | st.none()
YS = st.decimals(min_value=-5, max_value=15, places=2, allow_nan=False, allow_infinity=False) | st.none()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(XS, YS), max_size=7))
@example(rows=[])
@example(rows=[(7, Decimal("-5.00"))])  # n = 1: VAR_SAMP and STDDEV are NULL, VAR_POP is 0
@example(rows=[(0, Decimal("-5.00")), (60, Decimal("15.00"))])  # n = 2 at both ends: the largest variances
@example(rows=[(None, None), (3, Decimal("0.01"))])
def test_without_noise_the_formula_is_postgresqls_answer(session: Session, rows: list) -> None:
    _load(session, rows)
    for column in ("x", "y"):
        sql = "SELECT " + ", ".join(f"{s}({column})" for s in SPREADS) + " FROM t"
        with psycopg.connect(session.dsn) as conn:
            expected = conn.execute(sql).fetchone()
        assert expected is not None
        got = _without_noise(session, sql)
        values = [float(v) for v, _ in ((r[0], r[1]) if column == "x" else (r[1], r[0]) for r in rows) if v is not None]
        for name, pg, ours in zip(SPREADS, expected, got, strict=True):
            if pg is None:
                assert ours is None, (name, column, rows)
                assert _spread_of(name, values) is None
            else:
                # compared as variances: s2/n − (s1/n)² in double precision cancels to within ~1e-16·s2 of
                # PostgreSQL's exact NUMERIC answer, which the square root of a variance near 0 magnifies
                power = 2 if name.startswith("STDDEV") else 1
                assert ours is not None, (name, rows)
                assert math.isclose(ours**power, float(pg) ** power, rel_tol=1e-9, abs_tol=1e-9), (name, rows)


# The oracle: on tiny databases, every neighbour one row away (each row removed; a row added with each value of
# the declared range, or NULL) moves each of the three measurements by at most the sensitivity the analysis
# gave it, and some neighbour moves it by exactly that much.
ORACLE_DDL = "CREATE TABLE o (x INT, y NUMERIC(4, 2));"
ORACLE_POLICY = (
    "[defaults]\nepsilon = 1.0\n[tables.o.columns.x]\nrange = [0, 4]\n[tables.o.columns.y]\nrange = [-1, 2]\n"
)
ADDED = {
    "x": [None, 0, 1, 2, 3, 4],
    "y": [None, Decimal("-1"), Decimal("-0.25"), Decimal("0.5"), Decimal("1.75"), Decimal("2")],
}
HALF_WIDTH = {"x": 2.0, "y": 1.5}  # (hi − lo)/2: the count moves by 1, the centred sum by h, the squares by h²


@pytest.mark.parametrize("column", ["x", "y"])
def test_every_neighbour_moves_each_measurement_within_its_bound(pg_dsn: str, column: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(ORACLE_DDL)
    session = sqldp.connect(pg_dsn, Policy.from_toml(ORACLE_POLICY), seed=3)
    sql = f"SELECT VAR_SAMP({column}), STDDEV_POP({column}) FROM o"

    def measured() -> list[tuple[str, float, float]]:
        (ms,) = session.analyze(sql, audit=True).measurements
        return [(m.aggregate, m.true_value or 0.0, m.sensitivity) for m in ms]

    def load(conn: psycopg.Connection, db: list[Any]) -> None:
        conn.execute("DELETE FROM o")
        for v in db:
            conn.execute(f"INSERT INTO o ({column}) VALUES (%s)", (v,))

    def neighbours(db: list[Any]) -> Iterator[list[Any]]:
        yield from (n.db["o"] for n in row_neighbours({"o": db}, {"o": ADDED[column]}))

    rng = random.Random(column)
    largest: dict[str, float] = {}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for _ in range(6):
            db = [rng.choice(ADDED[column]) for _ in range(rng.randint(0, 3))]
            load(conn, db)
            before = measured()
            for other in neighbours(db):
                load(conn, other)
                for (agg, f0, c0), (_, f1, c1) in zip(before, measured(), strict=True):
                    change = abs(f1 - f0)
                    assert change <= max(c0, c1) * (1 + 1e-12), (agg, db, other)
                    largest[agg] = max(largest.get(agg, 0.0), change)
    h = HALF_WIDTH[column]
    bounds = {agg: c for agg, _, c in measured()}
    assert sorted(bounds.values()) == [1.0, h, h * h]  # centred: not max(|lo|, |hi|) = 4 or 2 and its square
    assert largest == bounds  # and tight: adding a value at an end of the range moves each by its bound


def test_released_spreads_stay_in_the_clamp(session: Session) -> None:
    _load(session, [(x % 61, Decimal(x % 21 - 5)) for x in range(1, 41)])
    sql = "SELECT VAR_POP(x) AS p, VAR_SAMP(x) AS s, STDDEV(y) AS d FROM t"
    runs = [session.run(sql, epsilon=0.3).rows[0]["values"] for _ in range(100)]
    assert all(r["p"] is None or 0.0 <= r["p"] <= 900.0 for r in runs)
    assert all(r["s"] is None or 0.0 <= r["s"] <= 1800.0 for r in runs)
    assert all(r["d"] is None or 0.0 <= r["d"] <= 10.0 * SQRT2 for r in runs)
    assert any(r["p"] in (0.0, 900.0) for r in runs)  # at ε = 0.3 the noise does reach the clamp


# -- post-processing what is known: counts are non-negative integers, sums of non-negative terms at least 0 --


def test_a_count_is_rounded_and_clamped_and_a_sum_only_where_its_terms_are_non_negative() -> None:
    form = _form("SELECT COUNT(*) AS n, SUM(t.x) AS sx, SUM(t.y) AS sy, SUM(t.x - 1) AS sd FROM t")
    n, sx, sy, sd = (o.expr for o in form.outputs)
    assert postprocess.evaluate(n, [-2.4, 0.0, 0.0, 0.0]) == 0.0 and postprocess.evaluate(n, [7.5, 0, 0, 0]) == 8.0
    assert postprocess.evaluate(sx, [0.0, -3.5, 0.0, 0.0]) == 0.0  # x ∈ [0, 60]: every term is at least 0
    # y ∈ [−5, 15] and x − 1 ∈ [−1, 59] may be negative: their sums are released as measured
    assert sy == exp.column("__agg2") and sd == exp.column("__agg3")
    assert aggregates.COUNT_NOTE in form.notes and aggregates.SUM_NOTE in form.notes


def test_a_count_at_a_tiny_epsilon_is_a_non_negative_integer_whose_bar_covers_the_truth(session: Session) -> None:
    """400 seeded releases of a count of 3 at ε = 0.05 (Laplace scale 20, so about half the raw draws are
    negative): every value is a non-negative integer, and the bar, mapped through the rounding and the clamp,
    covers 3 at least as often as the confidence c (the policy's default, 0.78) says, less 3 binomial standard
    deviations (√(c(1 − c)/400) ≈ 0.021: failing by chance has probability about 0.1 %)."""
    _load(session, [(1, None), (2, None), (3, None)])
    runs = [session.run("SELECT COUNT(*) AS n FROM t", epsilon=0.05) for _ in range(400)]
    assert runs[0].params is not None
    c = runs[0].params.confidence
    values = [r.rows[0]["values"]["n"] for r in runs]
    bars = [r.rows[0]["errors"]["n"] for r in runs]
    assert all(v >= 0 and float(v).is_integer() for v in values)
    assert values.count(0) > 100  # the clamp did act (P(raw < 0.5) ≈ 0.44)
    covered = sum(abs(v - 3) <= b for v, b in zip(values, bars, strict=True)) / len(values)
    assert covered >= c - 3 * math.sqrt(c * (1 - c) / 400)


def test_a_sum_that_may_be_negative_is_released_negative(session: Session) -> None:
    """SUM(y) with y ∈ [−5, 15]: the true sum may be negative (here −15), so clamping it at 0 would bias it; a
    mutant that clamps every SUM fails."""
    _load(session, [(1, Decimal("-5.00")), (2, Decimal("-5.00")), (3, Decimal("-5.00"))])
    values = [session.run("SELECT SUM(y) AS s FROM t", epsilon=1.0).rows[0]["values"]["s"] for _ in range(20)]
    assert sum(v < 0 for v in values) > 10


def test_count_of_a_not_null_column_is_count_star_and_a_nullable_ones_is_not(session: Session) -> None:
    prepared = session.prepare("SELECT COUNT(*) AS a, COUNT(id) AS b, COUNT(x) AS c, AVG(x) AS d FROM t")
    assert isinstance(prepared.form, AnalysisForm)
    # id is the primary key (NOT NULL, as PostgreSQL enforces it): COUNT(id) is COUNT(*); x may be NULL, so
    # COUNT(x) is its own measurement (shared with AVG(x)'s count)
    assert [a.sql for a in prepared.form.aggregates] == ["COUNT(*)", "COUNT(t.x)", "SUM(t.x - 30)"]
    assert [o.aggregates for o in prepared.form.outputs] == [(0,), (0,), (1,), (2, 1)]


def test_tpch_q1_measures_eight_values_at_an_eighth_of_epsilon_each(tpch_dsn: tuple[str, Any, Any]) -> None:
    """Q1's three AVGs count l_quantity, l_extendedprice and l_discount, NOT NULL columns: their counts are the
    query's COUNT(*), so 8 measurements (4 sums, 3 centred sums, 1 count) share ε, not 11."""
    sql = (Path(__file__).parents[2] / "benchmarks" / "tpch" / "queries" / "q01.sql").read_text(encoding="utf-8")
    session = sqldp.connect(tpch_dsn[0], policy="tpch_catalog", seed=7)
    try:
        plan = session.analyze(sql, epsilon=0.8, audit=False).plan
    finally:
        session.close()
    assert len(plan) == 8
    assert [step["aggregate"] for step in plan].count("COUNT(*)") == 1
    assert all(step["epsilon"] == pytest.approx(0.1) for step in plan)
