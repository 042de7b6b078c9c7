"""The aggregate table (sqldp.aggregates): every SQL aggregate sqldp answers is one entry, an expression over
the primitive aggregates the analyses bound; the refusals list the table."""

from __future__ import annotations

import pytest

from sqldp import aggregates, release
from sqldp.catalog import Catalog
from sqldp.errors import ForbiddenError, RefusedError
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.normalize import PublicRelease, normalize
from sqldp.policy import Policy

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
    names = [rule.name for rule in aggregates.AGGREGATES.values()]
    assert f"({', '.join(names)} are)" in str(refused.value)
    assert {"COUNT", "SUM", "AVG", "MIN", "MAX"} <= set(names)


def test_releasing_rows_names_the_aggregates_of_the_table() -> None:
    with pytest.raises(ForbiddenError) as refused:
        _form("SELECT * FROM t")
    assert f"only aggregates ({aggregates.supported()}) over private tables" in str(refused.value)


def test_a_having_refusal_lists_what_the_release_step_computes() -> None:
    with pytest.raises(RefusedError) as refused:
        _form("SELECT COUNT(*) FROM t HAVING COUNT(*) > 'a'")
    listed = release.post_processing()
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
