"""Front end and normalisation: SQL → algebra → analysis form, and precise refusals."""

from __future__ import annotations

import pytest
from sqlglot import exp

from sqldp import algebra as ra
from sqldp.catalog import Catalog
from sqldp.errors import CatalogError, ForbiddenError, RefusedError, SqlSyntaxError
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.normalize import PublicRelease, normalize
from sqldp.policy import Policy

DDL = """
CREATE TABLE region (r_regionkey INT PRIMARY KEY, r_name CHAR(25));
CREATE TABLE nation (n_nationkey INT PRIMARY KEY, n_name CHAR(25), n_regionkey INT REFERENCES region(r_regionkey));
CREATE TABLE t (id INT PRIMARY KEY, faculty TEXT, time INT, d DATE);
"""
POLICY = """
[tables.region]
rows = "public"
[tables.nation]
rows = "public"
[tables.t]
norm = "l1(time)"
[tables.t.columns.time]
range = [0, 60]
"""


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_toml(POLICY)


def form(sql: str, catalog: Catalog, policy: Policy) -> AnalysisForm:
    f = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(f, AnalysisForm)
    return f


def test_self_join_keeps_two_uses(catalog: Catalog, policy: Policy) -> None:
    f = form("SELECT COUNT(*) FROM t a, t b WHERE a.faculty = b.faculty AND a.time < 10", catalog, policy)
    assert [(u.alias, u.table) for u in f.uses] == [("a", "t"), ("b", "t")]
    assert [c.sql for c in f.conjuncts] == ["a.faculty = b.faculty", "a.time < 10"]
    # time is in t's norm, faculty is not (NR §4.3.3.3: columns outside the norm are insensitive)
    assert [c.private for c in f.conjuncts] == [False, True]


def test_join_on_becomes_selection_over_product(catalog: Catalog, policy: Policy) -> None:
    parsed = parse("SELECT COUNT(*) FROM t JOIN nation ON t.id = nation.n_nationkey WHERE t.time > 3", catalog)
    sel = parsed.algebra.child  # type: ignore[union-attr]
    assert isinstance(sel, ra.Select) and isinstance(sel.child, ra.Select)
    assert isinstance(sel.child.child, ra.Product)
    f = normalize(parsed, catalog, policy)
    assert isinstance(f, AnalysisForm)
    assert {c.sql for c in f.conjuncts} == {"t.id = nation.n_nationkey", "t.time > 3"}


def test_with_used_twice_is_inlined_as_two_uses(catalog: Catalog, policy: Policy) -> None:
    sql = """WITH m AS (SELECT id, time FROM t WHERE faculty = 'math')
             SELECT COUNT(*) FROM m x, m y WHERE x.id < y.id"""
    f = form(sql, catalog, policy)
    assert [u.table for u in f.uses] == ["t", "t"]
    assert len({u.alias for u in f.uses}) == 2
    sqls = [c.sql for c in f.conjuncts]
    assert sum("faculty = 'math'" in s for s in sqls) == 2  # each use keeps its own filter
    assert any(s.endswith(".id") and "<" in s for s in sqls)


def test_from_subquery_is_flattened_with_expressions_substituted(catalog: Catalog, policy: Policy) -> None:
    f = form("SELECT SUM(s.m) FROM (SELECT time * 2 AS m, faculty FROM t) s WHERE s.faculty = 'cs'", catalog, policy)
    assert f.aggregates[0].kind == "sum"
    assert f.aggregates[0].arg is not None and f.aggregates[0].arg.sql() == "t.time * 2"
    assert [c.sql for c in f.conjuncts] == ["t.faculty = 'cs'"]


def test_avg_becomes_sum_over_count_and_order_limit_kept_for_after_noise(catalog: Catalog, policy: Policy) -> None:
    f = form(
        "SELECT faculty, AVG(time) AS a, COUNT(*) AS n FROM t GROUP BY faculty ORDER BY n DESC LIMIT 2",
        catalog,
        policy,
    )
    assert [a.kind for a in f.aggregates] == ["sum", "count", "count"]
    assert f.outputs[0].is_key and f.outputs[1].expr.find(exp.Div) is not None
    assert f.order_by[0].output == 2 and f.order_by[0].descending and f.limit == 2


def test_public_only_query_is_released_exactly(catalog: Catalog, policy: Policy) -> None:
    out = normalize(parse("SELECT n_name FROM nation", catalog), catalog, policy)
    assert isinstance(out, PublicRelease) and out.tables == ("nation",)


@pytest.mark.parametrize(
    ("sql", "error", "fragment"),
    [
        ("SELECT * FROM t", ForbiddenError, "only aggregates"),
        ("SELECT COUNT(*) FROM t LEFT JOIN nation ON t.id = n_nationkey", RefusedError, "LEFT JOIN"),
        # a top-level IN (SELECT …) conjunct is a semi-join now (tests/frontend/test_subqueries.py); under OR not
        ("SELECT COUNT(*) FROM t WHERE id IN (SELECT n_nationkey FROM nation) OR time > 3", RefusedError, "subqueries"),
        # HAVING over the keys alone filters the group domain (tests/frontend/test_key_expressions.py); mixed
        # with an aggregate in one conjunct, or over another column, not
        (
            "SELECT faculty, COUNT(*) FROM t GROUP BY faculty HAVING faculty = 'cs' OR COUNT(*) > 1",
            RefusedError,
            "a HAVING conjunct combines GROUP BY keys with aggregates",
        ),
        ("SELECT faculty, COUNT(*) FROM t GROUP BY faculty HAVING time > 1", RefusedError, "outside an aggregate"),
        ("SELECT faculty, COUNT(*) FROM t GROUP BY faculty HAVING MIN(time) > 'a'", RefusedError, "HAVING may"),
        ("SELECT SUM(DISTINCT time) FROM t", RefusedError, "DISTINCT"),  # COUNT(DISTINCT e) is answered
        ("SELECT COUNT(*) FROM (SELECT faculty, COUNT(*) c FROM t GROUP BY faculty) s", RefusedError, "nested"),
        ("SELECT BOOL_AND(time > 1) FROM t", RefusedError, "not supported"),  # STDDEV is answered now
        ("DELETE FROM t", RefusedError, "only queries"),
    ],
)
def test_refusals_say_why(catalog: Catalog, policy: Policy, sql: str, error: type, fragment: str) -> None:
    with pytest.raises(error) as info:
        normalize(parse(sql, catalog), catalog, policy)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("sql", "error", "where"),
    [
        ("SELECT COUNT(*) FROM", SqlSyntaxError, "query:1:"),
        ("SELECT 1; SELECT 2", SqlSyntaxError, "query"),
        ("SELECT COUNT(*)\nFROM nope", CatalogError, "query:2:6"),
        ("SELECT COUNT(nope) FROM t", CatalogError, "query:1:"),
    ],
)
def test_bad_sql_errors_carry_position(catalog: Catalog, sql: str, error: type, where: str) -> None:
    with pytest.raises(error) as info:
        parse(sql, catalog)
    assert info.value.where is not None and info.value.where.startswith(where)
    assert "\n" not in str(info.value)


def test_policy_fails_closed_for_unnamed_tables() -> None:
    p = Policy.from_toml("[tables.a]\nrows = 'public'")
    assert p.table("a").public and not p.table("b").public and p.table("b").rows_private


def test_an_output_the_release_cannot_compute_is_refused_before_anything_runs(catalog: Catalog) -> None:
    """SIN of a noisy count is no post-processing the release step has: refused by the normaliser (nothing
    read, nothing charged), naming the operator and what is allowed."""
    with pytest.raises(RefusedError, match=r"output 'sin' may combine aggregates and numbers \(.*\), not SIN"):
        normalize(parse("SELECT SIN(COUNT(*)) FROM t", catalog), catalog, Policy())
