"""The release step without a database (sqldp.release): composition over aggregates and groups (NR §3.3.10.4),
the Laplace mechanism on a global bound, post-processing of the noisy values (output arithmetic, HAVING,
ORDER BY, LIMIT), and the rewriter running each distinct statement once. Plans come from the real analyses
over a schema file; the plan queries' rows are given as the database would return them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sqldp import postprocess, release
from sqldp.catalog import Catalog
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.mechanisms import NoiseSource
from sqldp.normalize import normalize
from sqldp.params import resolve_params
from sqldp.policy import Policy
from sqldp.result import GLOBAL, Measurement, Result
from sqldp.strategies.aggregate import compile_form

SCHEMA = """
CREATE TABLE t (
    name    VARCHAR(40) NOT NULL PRIMARY KEY,
    faculty VARCHAR(40) NOT NULL,
    time    INTEGER     NOT NULL
);
"""
POLICY = """
[tables.t]
rows = "private"
[tables.t.columns.time]
range = [0, 60]
[tables.t.columns.faculty]
domain = ["math", "physics", "biology"]
"""


@pytest.fixture(scope="module")
def catalog(tmp_path_factory: pytest.TempPathFactory) -> Catalog:
    path: Path = tmp_path_factory.mktemp("schema") / "t.sql"
    path.write_text(SCHEMA, encoding="utf-8")
    return Catalog.from_file(path)


def compiled(catalog: Catalog, sql: str, policy_text: str = POLICY):  # type: ignore[no-untyped-def]
    policy = Policy.from_toml(policy_text, source="test")
    form = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(form, AnalysisForm)
    params = resolve_params(policy, epsilon=1.0)
    domains, plans, statements = compile_form(form, catalog, policy, params.beta)
    return form, params, domains, plans, statements


def test_aggregates_split_epsilon_and_disjoint_groups_keep_their_share(catalog: Catalog) -> None:
    form, params, domains, plans, _ = compiled(
        catalog, "SELECT t.faculty, COUNT(*), SUM(t.time) FROM t GROUP BY t.faculty"
    )
    assert all(p.disjoint_groups for p in plans)  # a row of t is in one faculty's group
    assert release.shares(form, params, plans, release.declared_groups(domains)) == [(0.5, None), (0.5, None)]


def test_a_global_bound_gets_laplace_at_bound_over_epsilon(catalog: Catalog) -> None:
    form, params, _, plans, _ = compiled(catalog, "SELECT COUNT(*) FROM t")
    assert plans[0].data_independent and not plans[0].queries  # one row moves COUNT by 1 on every database
    [m] = release.templates(form, params, plans, [[]], 1)
    assert m.mechanism == GLOBAL and m.sensitivity == 1.0 and m.noise_scale == pytest.approx(1.0 / params.epsilon)


def test_post_processing_reads_only_the_noisy_values(catalog: Catalog) -> None:
    """HAVING, output arithmetic, ORDER BY and LIMIT act on the noisy values: with a zero noise scale (every
    noisy value is the true one, up to the sampler's 2^-40 grid) the released rows are the SQL answer's."""
    form, params, domains, plans, _ = compiled(
        catalog,
        "SELECT t.faculty, COUNT(*) * 2 AS twice FROM t GROUP BY t.faculty HAVING COUNT(*) > 1 "
        "ORDER BY twice DESC LIMIT 1",
    )
    made = release.templates(form, params, plans, [[] for _ in plans], 3)
    for m in made:
        m.noise_scale = 0.0
    values = [d.values for d in domains]
    # the answer query's rows: the group's index in the domain, the key, COUNT(*)
    answer = [(0, "math", 3), (1, "physics", 1), (2, "biology", 5)]
    keys, measured = release.measure(form, made, answer, values)
    result = Result("q", params, measurements=measured, grouped=True)
    release.release(form, result, keys, NoiseSource.seeded(1))
    assert [(r["key"], r["values"]) for r in result.rows] == [({"faculty": "biology"}, {"twice": pytest.approx(10.0)})]


def test_a_group_without_rows_counts_and_sums_zero(catalog: Catalog) -> None:
    """Every declared group is released, also one the data has no row for (its absence would tell)."""
    sql = "SELECT t.faculty, COUNT(*), SUM(t.time) FROM t GROUP BY t.faculty"
    form, params, domains, plans, _ = compiled(catalog, sql)
    made = release.templates(form, params, plans, [[] for _ in plans], 3)
    keys, measured = release.measure(form, made, [(1, "physics", 2, 70)], [d.values for d in domains])
    assert keys == [("math",), ("physics",), ("biology",)]
    assert [[m.true_value for m in group] for group in measured] == [[0.0, 0.0], [2.0, 70.0], [0.0, 0.0]]


@pytest.mark.parametrize(
    ("having", "values", "expected"),
    [
        ("__agg0 > 1 AND __agg1 < 5", [2.0, 4.0], True),
        ("__agg0 > 1 AND __agg1 < 5", [2.0, None], None),  # NULL AND TRUE is NULL: the group is dropped
        ("__agg0 > 1 OR __agg1 < 5", [2.0, None], True),  # TRUE OR NULL is TRUE
        ("NOT __agg0 BETWEEN 0 AND 1", [0.5, 0.0], False),
    ],
)
def test_having_is_three_valued(having: str, values: list[float | None], expected: bool | None) -> None:
    import sqlglot

    assert postprocess.holds(sqlglot.parse_one(having, dialect="postgres"), values) is expected


def test_output_division_by_a_noisy_zero_is_null() -> None:
    import sqlglot

    assert postprocess.evaluate(sqlglot.parse_one("__agg0 / __agg1"), [1.0, 0.0]) is None
    assert postprocess.evaluate(sqlglot.parse_one("GREATEST(__agg0, 0) + 1"), [-3.0, 0.0]) == 1.0


def test_a_statement_two_plans_ask_runs_once(catalog: Catalog) -> None:
    """The rewriter sends each distinct text once and maps every plan query to it: two SUMs over the same
    self-join ask the same pattern counts, so one statement serves both plans."""
    sql = "SELECT SUM(a.time), SUM(b.time) FROM t a, t b WHERE a.faculty = b.faculty"
    _, _, _, plans, statements = compiled(catalog, sql)
    asked = sum(len(p.queries) for p in plans) - len(statements.folded)
    assert len(statements.order) == asked and len(statements.queries) < asked
    assert sorted(set(statements.order)) == list(range(len(statements.queries)))


def test_a_count_carries_its_own_error_bar(catalog: Catalog) -> None:
    """A global COUNT's bar is its Laplace half-width at the confidence (one measurement: no union bound)."""
    form, params, _, plans, _ = compiled(catalog, "SELECT COUNT(*) FROM t")
    made = release.templates(form, params, plans, [[]], 1)
    keys, measured = release.measure(form, made, [(7,)], [])
    result = Result("q", params, measurements=measured)
    release.release(form, result, keys, NoiseSource.seeded(3))
    [row] = result.rows
    noisy = result.measurements[0][0].noisy_value
    assert noisy is not None
    value, bar = _counted(noisy, made[0].calibration.half_width(params.confidence))
    assert row["values"] == {"count": value} and row["errors"] == {"count": bar}


def _counted(noisy: float, width: float) -> tuple[float, float]:
    """A noisy count released as GREATEST(0, ROUND(n)) (sqldp.aggregates.counted) and its bar: the Laplace
    interval [n − w, n + w] mapped through the rounding and the clamp, around the released value."""

    def known(v: float) -> float:
        return max(0.0, postprocess.nearest(v))

    value = known(noisy)
    return value, max(value - known(noisy - width), known(noisy + width) - value)


def test_error_bars_of_an_average_cover_the_truth(catalog: Catalog) -> None:
    """AVG(time) is a clamped ratio of two noisy sums: its bar comes from interval arithmetic over both
    measurements' bars at confidence 1 − (1 − c)/2. Over many releases the true average lies within
    value ± bar at least a fraction c of the time (binomial margin), and the bar never exceeds the clamp."""
    form, params, _, plans, _ = compiled(catalog, "SELECT AVG(t.time) FROM t")
    made = release.templates(form, params, plans, [[] for _ in plans], 1)
    assert all(m.mechanism == GLOBAL for m in made)
    count, centred_sum = 40.0, 40 * (20.0 - 30.0)  # 40 rows averaging 20 minutes; the sum is centred on 30
    truth = 20.0
    source = NoiseSource.seeded(11)
    runs, inside = 2000, 0
    for _ in range(runs):
        keys, measured = release.measure(form, made, [tuple(_true(form, count, centred_sum))], [])
        result = Result("q", params, measurements=measured)
        release.release(form, result, keys, source)
        [row] = result.rows
        [(name, value)] = row["values"].items()
        bar = row["errors"][name]
        assert 0 <= bar <= 60.0
        inside += abs(value - truth) <= bar
    c = params.confidence
    assert inside / runs >= c - 3 * math.sqrt(c * (1 - c) / runs)


def _true(form: AnalysisForm, count: float, centred_sum: float) -> list[float]:
    """The answer row in the form's aggregate order: COUNT(time) and SUM(time − 30)."""
    return [count if a.kind == "count" else centred_sum for a in form.aggregates]


@pytest.mark.parametrize(("noisy", "relative", "dominated"), [(100.0, 0.05, False), (3.0, None, True)])
def test_a_relative_error_is_given_only_where_the_answer_is_not_noise(
    noisy: float, relative: float | None, dominated: bool
) -> None:
    m = Measurement("COUNT(*)", 1.0, None, 0.1, 1.0, 2.0, 5.0, {}, noisy_value=noisy)
    error = Result("q", None, measurements=[[m]]).to_json(audit=True)["error"]
    assert error["relative"] == (pytest.approx(relative) if relative is not None else None)
    assert error.get("noise_dominates", False) is dominated


def test_records_are_flat_rows_with_their_error_bars(catalog: Catalog) -> None:
    """The library's rows for pandas/pyarrow: one dict per released row, keys and values by column, and the
    data-independent bar of each value as <name>_error."""
    sql = "SELECT t.faculty, COUNT(*) AS n FROM t GROUP BY t.faculty ORDER BY n DESC"
    form, params, domains, plans, _ = compiled(catalog, sql)
    made = release.templates(form, params, plans, [[] for _ in plans], 3)
    keys, measured = release.measure(form, made, [(0, "math", 30), (2, "biology", 5)], [d.values for d in domains])
    result = Result("q", params, measurements=measured, grouped=True)
    release.release(form, result, keys, NoiseSource.seeded(5))
    records = result.records()
    assert records[0]["faculty"] == "math" and len(records) == 3  # ORDER BY the noisy counts: 30 ≫ 5 and 0
    width = made[0].calibration.half_width(params.confidence)
    expected = sorted(_counted(g[0].noisy_value, width) for g in result.measurements if g[0].noisy_value is not None)
    assert all(set(r) == {"faculty", "n", "n_error"} for r in records)
    assert sorted((r["n"], r["n_error"]) for r in records) == expected
