"""Statements restructured for speed (issue #21) against the statements they replace, on TPC-H SF 0.01.

Each restructuring keeps what a statement computes; these tests run the new and the old text side by side on the
same data and require the same rows, and show that the data tells a wrong restructuring apart (a mutant of the
new text gives other rows), so the comparison is not vacuous.

* The answer's [NOT] EXISTS over the subquery's table (sqldp.form.SemiJoin.exists) against [NOT] EXISTS over
  the derived table D = SELECT DISTINCT … (SemiJoin.predicate, what the answer ran before), and against the
  inner join with D that an EXISTS or IN whose D is joinable ran as (TPC-H Q4).
* One-row bounds over the same scan run as one statement (sqldp.rewrite.merge_scans) against each on its own:
  every figure of the run is the same.
* The largest count per value of a key PostgreSQL enforces as a COUNT capped at 1 (sqldp.sensitivity.rows)
  against the GROUP BY it replaces: every figure of the run is the same.
* A row statement with shared scans run in pieces on the two connections, each distinct piece once
  (sqldp.engine.postgres.engine.layout): the pieces give the statement's row (the figures of every TPC-H query on one
  and on two connections are compared in tests/engine/test_snapshot_queue.py).
* A scalar another term asks again read from the shared scan that computes it (sqldp.sensitivity.rows._twins)
  against the scalar run on its own: every figure of the run is the same.
* A c_F (the free uses' count) that groups one use by the key a derivative fixes, computed by the shared scan of
  that use's local count, against both run on their own: every figure of the run is the same.
* Two maxima of one GROUP BY, the second with a use whose enforced key the grouping keys fix (Q21's orders), in
  one scan (sqldp.sensitivity.rows._keyed_pairs) against each on its own, on data where they differ.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import psycopg
import pytest
import sqlglot
from sqlglot import exp

import sqldp
from sqldp import rewrite, sqlgen
from sqldp.catalog import Catalog
from sqldp.commands.explain import explain
from sqldp.datasets import dataset_path
from sqldp.engine.postgres import engine as postgres
from sqldp.form import AnalysisForm, SemiJoin, TableUse
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.runner import Prepared
from sqldp.sensitivity import rows
from sqldp.sensitivity.columns import ColumnPlan

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


def _statements(dsn: str, sql: str, policy: str | Policy) -> rewrite.Statements:
    session = sqldp.connect(dsn, policy=policy)
    try:
        prepared = session.prepare(sql, epsilon=1.0)
        assert isinstance(prepared, Prepared)
        return prepared.statements
    finally:
        session.close()


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


# EXISTS and IN whose D is joinable (every column of D equal to an outer expression): before, an inner join with D
JOINABLE = [
    (QUERIES / "q04.sql").read_text(encoding="utf-8"),
    "SELECT p_brand, COUNT(*) FROM partsupp, part WHERE p_partkey = ps_partkey AND ps_partkey IN (SELECT "
    "l_partkey FROM lineitem WHERE l_shipmode = 'AIR') GROUP BY p_brand",
    "SELECT SUM(o_totalprice) FROM orders WHERE o_orderkey IN (SELECT l_orderkey FROM lineitem WHERE l_quantity > 45)",
]


@pytest.mark.parametrize("sql", JOINABLE, ids=["q04", "in-grouped", "in-sum"])
def test_exists_over_the_table_equals_the_join_with_d(
    tpch_dsn: tuple[str, dict[str, int], object], catalog: Catalog, policy: Policy, sql: str
) -> None:
    form = _form(sql, catalog, policy)
    assert form.semijoins and all(s.joinable and not s.scalar for s in form.semijoins)
    new = sqlgen.answer_query(form)
    assert "DISTINCT" not in new.sql(dialect="postgres") and "EXISTS" in new.sql(dialect="postgres")
    old = sqlgen.answer_query(dataclasses.replace(form, semijoins=()))  # the join with D, as it ran before
    for semi in form.semijoins:
        old = old.join(semi.derived(), join_type="cross").where(*(e.copy() for e in semi.correlation))
    dsn = tpch_dsn[0]
    got = _rows(dsn, new)
    assert got and got == _rows(dsn, old)
    # the mutant that joins the subquery's table itself (no set, no EXISTS) counts matches: other rows here
    bag = dataclasses.replace(form, semijoins=())
    for semi in form.semijoins:
        bag = dataclasses.replace(bag, uses=(*bag.uses, semi.use))
    plain = sqlgen.answer_query(bag)
    for semi in form.semijoins:
        plain = plain.where(*(e.copy() for e in (*semi.inner, *semi.correlation)))
    assert _rows(dsn, plain) != got


def test_exists_keeps_d_for_a_scalar_subquery(catalog: Catalog, policy: Policy) -> None:
    """A decorrelated scalar subquery's D is grouped by its keys and compared on its value: not an EXISTS."""
    form = _form((QUERIES / "q17.sql").read_text(encoding="utf-8"), catalog, policy)
    (semi,) = form.semijoins
    assert semi.scalar and semi.exists().sql() == SemiJoin.predicate(semi).sql()


# -- one-row statements over one scan run as one (sqldp.rewrite.merge_scans) ------------------------------------


def _figures(dsn: str, sql: str, policy: str | Policy = "tpch_catalog") -> dict[str, object]:
    """Everything a run derives before the noise: the measurements' bounds, scales and true values."""
    session = sqldp.connect(dsn, policy=policy)
    try:
        result = session.analyze(sql)
    finally:
        session.close()
    out = result.to_json(audit=True)
    out.pop("timings_ms", None)
    out["true_values"] = [[m.true_value for m in group] for group in result.measurements]
    return out


def _value_level() -> Policy:
    """tpch_catalog with lineitem's rows public: its values stay private, so Q1's bounds read the data (under
    tpch_catalog itself the combined bound is global and runs no statement, sqldp.sensitivity.columns)."""
    text = dataset_path("tpch_catalog.toml").read_text(encoding="utf-8")
    return Policy.from_toml(text.replace('[tables.lineitem]\nrows = "private"', '[tables.lineitem]\nrows = "public"'))


def test_merged_scans_give_the_figures_of_the_separate_statements(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """TPC-H Q1 under value-level privacy: five one-row bounds over lineitem run as one statement; every figure of
    the run equals the run's with each statement on its own (the rewrite before merging)."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q01.sql").read_text(encoding="utf-8")
    policy = _value_level()
    statements = _statements(dsn, sql, policy)
    assert sum(c is not None for c in statements.columns) == 5  # five queries read their columns of one row
    merged = _figures(dsn, sql, policy)

    def apart(queries: list[exp.Select]) -> tuple[list[tuple[exp.Select, list[int]]], list[tuple[int, None]]]:
        return [(q, [i]) for i, q in enumerate(queries)], [(i, None) for i in range(len(queries))]

    monkeypatch.setattr(rewrite, "merge_scans", apart)
    alone = _statements(dsn, sql, policy)
    assert len(alone.queries) == len(statements.queries) + 4 and not any(alone.columns)
    assert _figures(dsn, sql, policy) == merged


def test_merge_scans_keeps_what_is_not_one_row_over_the_same_scan() -> None:
    """Only aggregates with no GROUP BY, LIMIT, window or column outside an aggregate, over the same FROM and
    WHERE, share a statement; each query's columns are its own items in order."""

    def q(text: str) -> exp.Select:
        parsed = sqlglot.parse_one(text, read="postgres")
        assert isinstance(parsed, exp.Select)
        return parsed

    queries = [
        q("SELECT MAX(t.a) AS v0, COUNT(*) AS v1 FROM t WHERE t.b > 0"),
        q("SELECT MAX(t.a) AS v0 FROM t WHERE t.b > 1"),  # another WHERE
        q("SELECT t.b, MAX(t.a) AS v0 FROM t WHERE t.b > 0 GROUP BY t.b"),  # many rows
        q("SELECT 1 AS v0 FROM t WHERE t.b > 0 LIMIT 1"),  # no aggregate
        q("SELECT SUM(t.a) OVER () AS v0 FROM t WHERE t.b > 0"),  # a window: a row per row
        q("SELECT CASE WHEN COUNT(*) > 0 THEN MIN(t.a) END AS v0, SUM(t.c) FILTER (WHERE t.a > 2) AS v1 FROM t "
          "WHERE t.b > 0"),
    ]  # fmt: skip
    statements, where_is = rewrite.merge_scans(queries)
    assert [members for _, members in statements] == [[0, 5], [1], [2], [3], [4]]
    assert where_is == [(0, (0, 2)), (1, None), (2, None), (3, None), (4, None), (0, (2, 4))]
    assert [e.unalias().sql() for e in statements[0][0].expressions] == [
        "MAX(t.a)",
        "COUNT(*)",
        "CASE WHEN COUNT(*) > 0 THEN MIN(t.a) END",
        "SUM(t.c) FILTER(WHERE t.a > 2)",
    ]


# -- a GROUP BY over an enforced key is one row per group (sqldp.sensitivity.rows._unique) -----------------------

# (Q12 ran such a count for lineitem's derivative, max over o_orderkey of orders' rows; its bound is global and
# reads no count now, so it runs none: tests/sensitivity/test_rows_fanout.py)
KEYED = [("q04", "tpch_catalog"), ("q14", "tpch"), ("q17", "tpch_catalog"), ("q19", "tpch")]
KEYED += [("q21", "tpch_catalog"), ("q08", "tpch_catalog")]


@pytest.mark.parametrize(("query", "policy_name"), KEYED, ids=[f"{q}-{p}" for q, p in KEYED])
def test_counts_over_an_enforced_key_give_the_figures_of_the_group_by(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch, query: str, policy_name: str
) -> None:
    """The largest count per value of an enforced key (Q14's part per p_partkey, Q4's orders per o_orderkey)
    as a COUNT capped at 1 instead of a GROUP BY: every figure of the run equals the run's with the GROUP BY."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / f"{query}.sql").read_text(encoding="utf-8")
    statements = _statements(dsn, sql, policy_name)
    assert any("LEAST(COUNT(*)" in q for q in statements.queries)  # the catalog read from PostgreSQL is enforced
    keyed = _figures(dsn, sql, policy_name)
    monkeypatch.setattr(rows, "_unique", lambda uses, keys, enforced: False)
    grouped = _statements(dsn, sql, policy_name)
    assert not any("LEAST(COUNT(*)" in q for q in grouped.queries)
    assert _figures(dsn, sql, policy_name) == keyed


# -- the row statement's shared scans split into pieces (sqldp.engine.postgres.engine.layout) --------------------------


def test_pieces_of_a_statement_with_shared_scans_give_its_row(pg_dsn: str) -> None:
    """A SELECT of scalar subqueries and columns of one-row FROM subqueries (Q21's row statement) is run as one
    piece per subquery and one per FROM subquery (its own SELECT); reassembled in the statement's order, the
    pieces' row is the whole statement's. A FROM that is not one row, or a subquery reading the FROM, keeps it
    whole."""
    whole = (
        "SELECT (SELECT COUNT(*) FROM t) AS v0, g0.total AS v1, (SELECT MAX(x) FROM t WHERE x > 1) AS v2, "
        "g0.best AS v3 FROM (SELECT COUNT(*) AS total, LEAST(COUNT(*) FILTER(WHERE t.x < 5), 1) AS best FROM t "
        "WHERE t.x > 10) AS g0"
    )
    texts, columns = postgres.layout(whole)
    assert texts == (
        "SELECT (SELECT COUNT(*) FROM t) AS v0",
        "SELECT (SELECT MAX(x) FROM t WHERE x > 1) AS v2",
        "SELECT COUNT(*) AS total, LEAST(COUNT(*) FILTER(WHERE t.x < 5), 1) AS best FROM t WHERE t.x > 10",
    )
    assert columns == (0, 2, 1, 3)
    for kept in (
        whole.replace("FROM t WHERE t.x > 10) AS g0", "FROM t WHERE t.x > 10 GROUP BY t.x) AS g0"),  # many rows
        whole.replace("(SELECT MAX(x) FROM t WHERE x > 1)", "(SELECT MAX(x) FROM t WHERE x > g0.total)"),
        whole.replace("FROM (SELECT COUNT(*)", "FROM t CROSS JOIN (SELECT COUNT(*)"),  # a table in the FROM
    ):
        assert postgres.layout(kept) == ((kept,), None), kept
    assert postgres._unaliased(texts[0]) == postgres._unaliased("SELECT (SELECT COUNT(*) FROM t) AS v7")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); INSERT INTO t SELECT g FROM generate_series(1, 50) g")
        row = conn.execute(whole).fetchall()
        got = tuple(v for p in texts for v in conn.execute(p).fetchall()[0])
    assert [tuple(got[k] for k in columns)] == row == [(50, 40, 50, 0)]
    assert [got] != row  # side by side without the order the row differs: the order is needed


def test_a_statement_that_begins_with_a_shared_scan_column_splits_too(pg_dsn: str) -> None:
    """Q17's row statement under tpch begins with its shared scans' columns (``SELECT g1.total AS v0, …``), not a
    scalar subquery: it splits all the same, and the pieces' row in the statement's order is the whole row."""
    whole = (
        "SELECT g0.total AS v1, (SELECT COUNT(*) FROM t) AS v0, g0.best AS v3, (SELECT MAX(x) FROM t WHERE x > 1) "
        "AS v2 FROM (SELECT COUNT(*) AS total, LEAST(COUNT(*) FILTER(WHERE t.x < 5), 1) AS best FROM t "
        "WHERE t.x > 10) AS g0"
    )
    texts, columns = postgres.layout(whole)
    assert len(texts) == 3 and columns == (2, 0, 3, 1)
    assert postgres.layout(whole.replace("SELECT g0.total", "SELECT h0.total")) == (
        (whole.replace("SELECT g0.total", "SELECT h0.total"),),
        None,
    )  # not the row statement's shape: not parsed
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x INT); INSERT INTO t SELECT g FROM generate_series(1, 50) g")
        row = conn.execute(whole).fetchall()
        got = tuple(v for p in texts for v in conn.execute(p).fetchall()[0])
    assert [tuple(got[k] for k in columns)] == row == [(40, 50, 0, 50)]


def test_a_scalar_asked_twice_reads_the_shared_scan(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q17 under tpch: lineitem's c_F (max over l_partkey of lineitem's rows) is the count part's derivative
    groups by, which a shared scan computes beside lineitem's local count (sqldp.sensitivity.rows._twins): the
    statements group lineitem by l_partkey once, and every figure of the run is the one with the scalar run
    on its own."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q17.sql").read_text(encoding="utf-8")
    per_part = "FROM lineitem AS lineitem GROUP BY lineitem.l_partkey"
    twice = "FROM lineitem AS lineitem WHERE lineitem.l_partkey = lineitem.l_partkey GROUP BY lineitem.l_partkey"
    statements = _statements(dsn, sql, "tpch")
    assert sum(q.count(per_part) for q in statements.queries) == 1
    assert not any(twice in q for q in statements.queries)
    shared = _figures(dsn, sql, "tpch")
    monkeypatch.setattr(rows, "_twins", lambda scalars, source: source)
    assert any(twice in q for q in _statements(dsn, sql, "tpch").queries)
    assert _figures(dsn, sql, "tpch") == shared


def test_a_free_count_shares_the_scan_of_the_local_count(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q21 under tpch_catalog: c_F of the derived tables (the most rows of l1 per l_orderkey: a derived table's
    row fixes the order, which determines orders, and l1 is the free use) is computed by the shared scan of l1's
    local count (sqldp.sensitivity.rows, plan_rows's ``share``): no statement counts lineitem on its own, and
    every figure of the run is the one with each scalar run on its own (no shared scan at all)."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q21.sql").read_text(encoding="utf-8")
    alone = "(SELECT COUNT(*) AS n FROM lineitem AS l1 WHERE l1.l_linenumber BETWEEN 1 AND 7)"
    grouped = "FROM lineitem AS l1 WHERE l1.l_linenumber BETWEEN 1 AND 7 GROUP BY l1.l_orderkey"
    statements = _statements(dsn, sql, "tpch_catalog")
    assert not any(alone in q for q in statements.queries)
    assert all(q.count(grouped) == 1 and "AS total" in q for q in statements.queries if grouped in q)
    shared = _figures(dsn, sql)
    monkeypatch.setattr(rows, "_shared_scan", lambda conds, keys, own, unique=False: None)
    assert any(alone in q for q in _statements(dsn, sql, "tpch_catalog").queries)
    assert _figures(dsn, sql) == shared


def test_a_count_joined_with_a_keyed_use_is_read_from_the_count_without_it(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Q21 under tpch_catalog: orders' derivative (the most rows of supplier ⋈ l1 ⋈ nation per l_orderkey) and the
    derived tables' term (the same joined with orders on its primary key, o_orderstatus = 'F') are one scan
    (sqldp.sensitivity.rows._keyed_pairs): a LEFT JOIN of the first GROUP BY with the orders that pass. Its two
    numbers are the two statements', also on data where they differ (orders of the largest groups made 'O' in a
    copy of orders with its key, which shadows the table), where a scan without orders' own conjunct gives
    another number; and every figure of the run is the one without the pair."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q21.sql").read_text(encoding="utf-8")
    session = sqldp.connect(dsn, policy="tpch_catalog")
    try:
        prepared = session.prepare(sql, epsilon=1.0)
        assert isinstance(prepared, Prepared)
        # the row plans: the aggregate's own, or those of its value-level plan (ColumnPlan)
        every = [getattr(p, a, None) for p in prepared.plans for a in ("row_plan", "count_plan", "semi_plan")]
        found = [
            (plan, scan, reads)
            for plan in [*prepared.plans, *every]
            if isinstance(plan, rows.RowPlan)
            for scan, reads in plan.shared
            if "kept" in reads.values()
        ]
    finally:
        session.close()
    assert found
    plan, scan, reads = found[0]
    by = {column: i for i, column in reads.items()}
    both = scan.sql(dialect="postgres")
    alone = [plan.scalars[by[c]].sql(dialect="postgres") for c in ("best", "kept")]
    assert "orders.o_orderstatus = 'F'" in alone[1] and "orders" not in alone[0]  # each column is its scalar's
    loose = both.replace(" WHERE orders.o_orderstatus = 'F'", "")
    assert loose != both
    with psycopg.connect(dsn) as conn:
        conn.execute("CREATE TEMP TABLE orders AS SELECT * FROM public.orders")
        conn.execute("ALTER TABLE orders ADD PRIMARY KEY (o_orderkey)")
        first = conn.execute(both).fetchone()
        assert first == tuple(conn.execute(q).fetchone()[0] for q in alone)  # type: ignore[index]
        # the orders of every largest group left 'F': the derived tables' count drops below orders' derivative
        top = f"SELECT p0 FROM ({alone[0].split('FROM (', 1)[1].rsplit(') AS s', 1)[0]}) AS g WHERE n = %s"
        conn.execute(f"UPDATE orders SET o_orderstatus = 'O' WHERE o_orderkey IN ({top})", (first[0],))  # type: ignore[index]
        changed = conn.execute(both).fetchone()
        assert changed is not None and changed[0] > changed[1]
        assert changed == tuple(conn.execute(q).fetchone()[0] for q in alone)  # type: ignore[index]
        assert conn.execute(loose).fetchone() != changed  # the data tells a scan without ψ_K apart
        conn.rollback()
    paired = _figures(dsn, sql)
    monkeypatch.setattr(rows, "_keyed_pairs", lambda counted, shared, enforced, types: [])
    assert not any("AS kept" in q for q in _statements(dsn, sql, "tpch_catalog").queries)
    assert _figures(dsn, sql) == paired


def test_a_use_not_fixed_by_its_key_is_not_paired(catalog: Catalog) -> None:
    """_keyed_pairs' rule (sqldp.sensitivity.rows._with_key) pairs a count with its join with orders only when the
    grouping keys fix orders' enforced key through equalities of one type and orders' other conjuncts read
    orders alone."""
    l1, o = TableUse("l1", "lineitem"), TableUse("orders", "orders")
    types = {t: {c.name: c.type_sql for c in catalog.table(t).columns.values()} for t in ("lineitem", "orders")}
    enforced = {"orders": (("o_orderkey",),)}

    def c(text: str) -> exp.Expr:
        return sqlglot.parse_one(text, read="postgres")

    def paired(keys: str, *conds: str) -> bool:
        k = [c(keys)]
        return rows._with_key(([l1], [], k), ([l1, o], [c(x) for x in conds], k), enforced, types) is not None

    assert paired("l1.l_orderkey", "orders.o_orderkey = l1.l_orderkey", "orders.o_orderstatus = 'F'")
    assert not paired("l1.l_orderkey", "orders.o_custkey = l1.l_orderkey")  # not orders' key
    assert not paired("l1.l_suppkey", "orders.o_orderkey = l1.l_suppkey")  # BIGINT = INTEGER
    assert not paired("l1.l_orderkey", "orders.o_orderkey = l1.l_orderkey", "orders.o_totalprice > l1.l_tax")
    assert not paired("l1.l_orderkey", "orders.o_orderkey = l1.l_orderkey + 0")  # not a column equality
    assert not rows._with_key(([l1], [], [c("l1.l_orderkey")]), ([l1, o], [], [c("l1.l_orderkey")]), {}, types)


def test_q21_runs_its_row_statements_in_pieces_once_each(catalog: Catalog) -> None:
    """Q21 (tpch_catalog): both row statements split (they read a shared scan), and the pieces they share —
    the same count under another alias — are one unit each (test_snapshot_queue checks the figures)."""
    tpch_catalog = Policy.from_file(ROOT / "schemas" / "tpch_catalog.toml")
    enforced = dataclasses.replace(catalog, enforced=True)
    statements = explain((QUERIES / "q21.sql").read_text(encoding="utf-8"), enforced, tpch_catalog)["sql"]
    split = [postgres.layout(s) for s in statements[1:]]
    assert sum(len(texts) > 1 and columns is not None for texts, columns in split) == 2
    every = [t for texts, _ in split for t in texts]
    assert len({postgres._unaliased(t) for t in every}) < len(every) - 5


@pytest.mark.parametrize("policy_name", ["tpch", "tpch_catalog"])
def test_plans_count_their_statements_without_building_them(
    tpch_dsn: tuple[str, dict[str, int], object], policy_name: str
) -> None:
    """The runner cuts the fetched rows per plan by ``query_count`` (RowPlan, ColumnPlan), which must be the
    number of statements ``queries`` builds, for every TPC-H query sqldp answers."""
    session = sqldp.connect(tpch_dsn[0], policy=policy_name)
    counted = 0
    try:
        for path in sorted(QUERIES.glob("q*.sql")):
            try:
                prepared = session.prepare(path.read_text(encoding="utf-8"), epsilon=1.0)
            except sqldp.errors.RefusedError:
                continue
            for plan in getattr(prepared, "plans", ()):
                if isinstance(plan, rows.RowPlan | ColumnPlan):
                    assert plan.query_count == len(plan.queries), (path.stem, type(plan).__name__)
                    counted += 1
    finally:
        session.close()
    assert counted >= 10


@pytest.mark.parametrize("policy_name", ["tpch", "tpch_catalog"])
def test_a_decorrelated_value_is_grouped_for_the_keys_the_query_asks(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch, policy_name: str
) -> None:
    """Q17: the per-part average (the derived table D of the decorrelated scalar subquery) is computed only for
    the parts the query's conjuncts on part keep (sqldp.sqlgen.matched_keys): D's rows are the unrestricted D's
    for those parts, fewer than all, and a restriction to other parts gives other rows (the data tells a wrong
    one apart); every figure of the run, the true values among them, is the run's with D over all of lineitem."""
    dsn = tpch_dsn[0]
    # at SF 0.01 no part is a Brand#23 MED BOX: SM PACK has 183 rows of lineitem
    sql = (QUERIES / "q17.sql").read_text(encoding="utf-8").replace("'MED BOX'", "'SM PACK'")
    keys = (
        "lineitem_2.l_partkey IN (SELECT part.p_partkey FROM part AS part WHERE part.p_brand = 'Brand#23' AND "
        "part.p_container = 'SM PACK')"
    )
    answer = _statements(dsn, sql, policy_name).answer
    assert keys in answer
    derived = next(
        s for s in sqlglot.parse_one(answer, read="postgres").find_all(exp.Subquery) if s.alias == "lineitem_2"
    )
    d = derived.this.sql(dialect="postgres")
    assert keys in d
    parts = "SELECT p_partkey FROM part WHERE p_brand = 'Brand#23' AND p_container = 'SM PACK'"
    with psycopg.connect(dsn) as conn:
        kept = sorted(conn.execute(d).fetchall())
        every = sorted(conn.execute(d.replace(" WHERE " + keys, "")).fetchall())
        asked = {r[0] for r in conn.execute(parts).fetchall()}
        other = sorted(conn.execute(d.replace("Brand#23", "Brand#12")).fetchall())
    assert kept == [r for r in every if r[0] in asked] and 0 < len(kept) < len(every)
    assert other != kept
    restricted = _figures(dsn, sql, policy_name)
    monkeypatch.setattr(sqlgen, "matched_keys", lambda derived, semi, form: derived)
    assert keys not in _statements(dsn, sql, policy_name).answer
    assert _figures(dsn, sql, policy_name) == restricted


# -- a semi-join's count over an enforced key in the scan of the local count (sqldp.sensitivity.rows) -------------

SEMI_SHARED = [("q22", "tpch"), ("q22", "tpch_catalog"), ("q04", "tpch")]


def _all_statements(dsn: str, sql: str, policy: str) -> list[str]:
    """Every statement a query runs, each step's of a workflow (Q22's AVG subquery is one) included."""
    session = sqldp.connect(dsn, policy=policy)
    try:
        prepared = session.prepare(sql, epsilon=1.0)
        parts = (
            [prepared] if isinstance(prepared, Prepared) else [*(p for _, p in prepared.steps), prepared.placeholder]
        )
        return [s for p in parts if p.statements is not None for s in p.statements.all()]
    finally:
        session.close()


def _step_figures(dsn: str, sql: str, policy: str) -> dict[str, object]:
    """:func:`_figures` without the steps' timings (a workflow's steps report theirs)."""
    out = _figures(dsn, sql, policy)
    for step in out.get("steps", []):  # type: ignore[attr-defined]
        step.pop("timings_ms", None)
    return out


@pytest.mark.parametrize(("query", "policy_name"), SEMI_SHARED, ids=[f"{q}-{p}" for q, p in SEMI_SHARED])
def test_a_semi_joins_count_shares_the_scan_of_the_local_count(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch, query: str, policy_name: str
) -> None:
    """Q22's customers (NOT EXISTS orders over o_custkey) and Q4's orders (EXISTS lineitem): the semi-join's
    derivative, LEAST(COUNT(*), 1) over the outer use's rows with its key not NULL, and the outer use's local
    count are one scan instead of two; every figure of the run is the run's with the two scalar subqueries."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / f"{query}.sql").read_text(encoding="utf-8")
    apart = "(SELECT LEAST(COUNT(*), 1) FROM"
    statements = _all_statements(dsn, sql, policy_name)
    assert any("LEAST(COUNT(*) FILTER(WHERE" in s for s in statements)
    assert not any(apart in s for s in statements)
    shared = _step_figures(dsn, sql, policy_name)
    monkeypatch.setattr(rows, "_shared_scan", lambda *args, **kwargs: None)
    assert any(apart in s for s in _all_statements(dsn, sql, policy_name))
    assert _step_figures(dsn, sql, policy_name) == shared


# -- a one-row bound without the tables only a foreign key joins (sqldp.rewrite.unjoined) ------------------------

UNJOIN_DDL = """
CREATE TABLE s (k INT PRIMARY KEY);
CREATE TABLE r (k INT PRIMARY KEY, y INT, sk INT NOT NULL REFERENCES s (k));
CREATE TABLE a (id INT PRIMARY KEY, fk INT NOT NULL REFERENCES r (k), nk INT REFERENCES r (k), x NUMERIC(6,2));
"""
UNJOIN = "SELECT MAX(ABS(a.x)) AS v0, COUNT(*) AS v1 FROM a AS a CROSS JOIN r AS r WHERE {}"


def _select(text: str) -> exp.Select:
    parsed = sqlglot.parse_one(text, read="postgres")
    assert isinstance(parsed, exp.Select)
    return parsed


def test_a_bound_drops_only_the_tables_an_enforced_foreign_key_joins() -> None:
    """The use r goes when only a.fk = r.k (an enforced key, a.fk NOT NULL) reads it; not when a conjunct or an
    item reads r otherwise, the key column may be NULL, the equality is not the key's, a subquery could read r,
    or the catalog's keys are a schema file's claims."""
    declared = Catalog.from_ddl(UNJOIN_DDL)
    catalog = dataclasses.replace(declared, enforced=True)
    for condition in ("a.fk = r.k AND a.x > 0", "r.k = a.fk AND a.x > 0"):
        got = rewrite.unjoined(_select(UNJOIN.format(condition)), catalog)
        assert got is not None
        assert got.sql(dialect="postgres") == "SELECT MAX(ABS(a.x)) AS v0, COUNT(*) AS v1 FROM a AS a WHERE a.x > 0"
    chain = "SELECT MAX(ABS(a.x)) AS v0 FROM a AS a CROSS JOIN r AS r CROSS JOIN s AS s WHERE a.fk = r.k AND r.sk = s.k"
    got = rewrite.unjoined(_select(chain), catalog)  # s first, then r, joined by a's key alone once s is gone
    assert got is not None and got.sql(dialect="postgres") == "SELECT MAX(ABS(a.x)) AS v0 FROM a AS a"
    kept = [
        UNJOIN.format("a.nk = r.k"),  # a NULL key has no partner: the join drops that row
        UNJOIN.format("a.fk = r.k AND r.y > 0"),  # r's own conjunct filters a's rows
        UNJOIN.format("a.fk = r.y"),  # not the referenced column
        UNJOIN.format("a.id = r.k"),  # no foreign key on a.id
        "SELECT MAX(r.y) AS v0 FROM a AS a CROSS JOIN r AS r WHERE a.fk = r.k",  # reads r; no key of r refers to a
        "SELECT MAX(a.x) AS v0 FROM a AS a CROSS JOIN r AS r WHERE a.fk = r.k AND a.x > (SELECT MIN(r.y) FROM r)",
        "SELECT a.x FROM a AS a CROSS JOIN r AS r WHERE a.fk = r.k",  # not one row
    ]
    for text in kept:
        assert rewrite.unjoined(_select(text), catalog) is None, text
    assert rewrite.unjoined(_select(UNJOIN.format("a.fk = r.k")), declared) is None


def test_a_bound_without_the_joined_table_is_the_bound_over_the_join(pg_dsn: str) -> None:
    """On data that satisfies the keys, the bound over a alone is the bound over a ⋈ r; the same drop where the
    key column has NULLs, or where r's own conjunct filters, gives another row (the data tells them apart)."""
    catalog = dataclasses.replace(Catalog.from_ddl(UNJOIN_DDL), enforced=True)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(UNJOIN_DDL)
        conn.execute("INSERT INTO s SELECT g FROM generate_series(1, 5) g")
        conn.execute("INSERT INTO r SELECT g, g % 3, 1 + g % 5 FROM generate_series(1, 20) g")
        conn.execute(
            "INSERT INTO a SELECT g, 1 + g % 20, CASE WHEN g % 4 = 0 THEN NULL ELSE 1 + g % 7 END, "
            "(g * 37 % 1000) / 10.0 - 50 FROM generate_series(1, 200) g"
        )
        joined = UNJOIN.format("a.fk = r.k")
        got = rewrite.unjoined(_select(joined), catalog)
        assert got is not None
        assert conn.execute(got.sql(dialect="postgres")).fetchall() == conn.execute(joined).fetchall()
        for wrong in (UNJOIN.format("a.nk = r.k"), UNJOIN.format("a.fk = r.k AND r.y > 0")):
            alone = "SELECT MAX(ABS(a.x)) AS v0, COUNT(*) AS v1 FROM a AS a"
            assert conn.execute(alone).fetchall() != conn.execute(wrong).fetchall()


UNJOINED = [("q14", "tpch"), ("q09", "tpch")]


@pytest.mark.parametrize(("query", "policy_name"), UNJOINED, ids=[f"{q}-{p}" for q, p in UNJOINED])
def test_a_bound_without_the_joined_tables_gives_the_figures_of_the_join(
    tpch_dsn: tuple[str, dict[str, int], object], monkeypatch: pytest.MonkeyPatch, query: str, policy_name: str
) -> None:
    """Q14 under tpch: the value-level bound over lineitem ⋈ part reads lineitem's columns only, and part is
    joined by lineitem's foreign key: the bound scans lineitem alone, and the answer, no longer scanning every
    row for the bound, keeps its month of l_shipdate in WHERE. Q9: orders and nation leave a bound over six
    tables, and then supplier, which only lineitem's key joins once nation is gone. Every figure of the run is
    the run's with the join."""
    dsn = tpch_dsn[0]
    sql = (QUERIES / f"{query}.sql").read_text(encoding="utf-8")
    statements = _statements(dsn, sql, policy_name)
    unjoined = _figures(dsn, sql, policy_name)
    monkeypatch.setattr(rewrite, "unjoined", lambda query, catalog: None)
    joined = _statements(dsn, sql, policy_name)
    assert statements.all() != joined.all()
    if query == "q14":
        assert not statements.folded and joined.folded
        assert any(
            q.endswith("FROM lineitem AS lineitem") and "MAX(ABS(lineitem.l_discount))" in q for q in statements.queries
        )
        assert "l_shipdate" in statements.answer.split(" WHERE ")[-1] and "FILTER" not in statements.answer
    assert _figures(dsn, sql, policy_name) == unjoined
