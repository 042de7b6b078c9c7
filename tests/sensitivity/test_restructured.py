"""Statements restructured for speed (issue #21) against the statements they replace, on TPC-H SF 0.01.

Each restructuring keeps what a statement computes; these tests run the new and the old text side by side on the
same data and require the same rows, and show that the data tells a wrong restructuring apart (a mutant of the
new text gives other rows), so the comparison is not vacuous.

* The answer's [NOT] EXISTS over the subquery's table (sqldp.form.SemiJoin.exists) against [NOT] EXISTS over
  the derived table D = SELECT DISTINCT … (SemiJoin.predicate, what the answer ran before).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psycopg
import pytest
from sqlglot import exp

from sqldp import sqlgen
from sqldp.catalog import Catalog
from sqldp.datasets import dataset_path
from sqldp.form import AnalysisForm, SemiJoin
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "benchmarks" / "tpch" / "queries"
ROWS_POLICY = ROOT / "benchmarks" / "tpch" / "policy_rows.toml"


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_file(dataset_path("tpch.sql"))


@pytest.fixture(scope="module")
def policy(catalog: Catalog) -> Policy:
    p = Policy.from_file(ROWS_POLICY)
    p.validate(catalog)
    return p


def _form(sql: str, catalog: Catalog, policy: Policy) -> AnalysisForm:
    form = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(form, AnalysisForm)
    return form


def _rows(dsn: str, query: exp.Select) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return sorted(conn.execute(query.sql(dialect="postgres")).fetchall(), key=repr)


# semi-joins and anti-joins that run as EXISTS (not an inner join with D): a correlation that is not an
# equality (Q21's l2.l_suppkey <> l1.l_suppkey), an anti-join, the subquery's own conditions (φ)
SEMI = [
    (QUERIES / "q21.sql").read_text(encoding="utf-8"),
    "SELECT o_orderpriority, COUNT(*) FROM orders WHERE NOT EXISTS (SELECT * FROM lineitem WHERE l_orderkey = "
    "o_orderkey AND l_commitdate < l_receiptdate) GROUP BY o_orderpriority",
    "SELECT COUNT(*) FROM orders WHERE EXISTS (SELECT * FROM lineitem WHERE l_orderkey = o_orderkey AND "
    "l_quantity > 45 AND l_linenumber <> o_shippriority + 1)",
    "SELECT c_mktsegment, SUM(c_acctbal) FROM customer WHERE NOT EXISTS (SELECT * FROM orders WHERE o_custkey = "
    "c_custkey AND o_orderstatus = 'F') GROUP BY c_mktsegment",
]


@pytest.mark.parametrize("sql", SEMI, ids=["q21", "not-exists", "exists-inequality", "not-exists-sum"])
def test_exists_over_the_table_equals_exists_over_d(
    tpch_dsn: tuple[str, dict[str, int], object], catalog: Catalog, policy: Policy, sql: str
) -> None:
    form = _form(sql, catalog, policy)
    assert form.semijoins and not any(s.joinable for s in form.semijoins)
    new = sqlgen.answer_query(form)
    assert "DISTINCT" not in new.sql(dialect="postgres")  # the restructured text is the one that runs
    old = new.copy()
    for semi in form.semijoins:  # each EXISTS over the table replaced by the EXISTS over D it stands for
        target = semi.exists().sql(dialect="postgres")
        found = [c for c in old.find_all(exp.Exists, exp.Not) if c.sql(dialect="postgres") == target]
        found[0].replace(semi.predicate())
    assert "DISTINCT" in old.sql(dialect="postgres")
    dsn = tpch_dsn[0]
    got = _rows(dsn, new)
    assert got and got == _rows(dsn, old)
    # the mutant that drops the subquery's own conditions (φ) gives other rows on this data
    if any(s.inner for s in form.semijoins):
        bare = dataclasses.replace(form, semijoins=tuple(dataclasses.replace(s, inner=()) for s in form.semijoins))
        assert _rows(dsn, sqlgen.answer_query(bare)) != got


def test_exists_keeps_d_for_a_scalar_subquery(catalog: Catalog, policy: Policy) -> None:
    """A decorrelated scalar subquery's D is grouped by its keys and compared on its value: not an EXISTS."""
    form = _form((QUERIES / "q17.sql").read_text(encoding="utf-8"), catalog, policy)
    (semi,) = form.semijoins
    assert semi.scalar and semi.exists().sql() == SemiJoin.predicate(semi).sql()
