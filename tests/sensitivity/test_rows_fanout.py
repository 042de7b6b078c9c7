"""Key columns a conjunct keeps among a few integers (sqldp.sensitivity.rows, "key columns a conjunct keeps among
a few integers"): a use whose key has every column fixed by θ's equalities but one the policy bounds — TPC-H's
lineitem (l_orderkey, l_linenumber) with l_linenumber in [1, 7] — is determined with a fan-out, and the query
reads that column's range in its WHERE. Checked by brute force on tiny PostgreSQL databases whose keys
PostgreSQL enforces, as tests/sensitivity/test_rows_keys.py does for plain keys:

* l(l_o, l_n) has the PRIMARY KEY (l_o, l_n) and the declared range l_n ∈ [1, 2]; the databases and every
  neighbour hold l_n = 3 rows too (outside the declaration), which the answered query leaves out;
* the local sensitivity at distance k = 0 … 3 (the largest change of the answered COUNT by one key-respecting
  row addition or removal, over every database reachable by k such changes; c counts 2) is at most the plan's
  A(k) (``RowPlan.reach``), computed from the statistics PostgreSQL returns — for the self-join (two uses of l,
  both determined by o's key) at most A(k + 1), as tests/sensitivity/test_rows_oracle.py allows a self-join's
  convex step;
* the smooth bound covers it weighted by e^(−βk), and is β-smooth over every key-respecting neighbour (both
  ways, at the neighbour's weight), each neighbour's bound computed on PostgreSQL;
* a join whose private uses are all determined through the ranged key is data-independent: Laplace at the
  global bound 2 = the fan-out, which every neighbour of every database respects and some neighbour reaches;
  that bound reads no count, so no sensitivity query runs (sqldp.sensitivity.rows, "what a global bound
  reads"), and the bound is the one the plan running every query gives. TPC-H Q12 under both policies: the
  answer alone runs, at the bound 7.

Mutants (each fails a check here): the fan-out taken as 1 (the ranged column treated as fixed: o's bound 1 while
a new o row meets two l rows); the range not added to the query while the analysis still takes the fan-out (a
new o row meets the l_n = 3 row too: 3 > 2). Dropping f from c_F, or a private use's f_K from the growth, fails
the brute force on the chain and the other shapes (checked by hand when this was written).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from oracles import product_rows, row_neighbours
from test_rows_keys import local_at_distance

import sqldp
from sqldp.catalog import Catalog
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.runner import Prepared
from sqldp.sensitivity import rows as rows_module
from sqldp.sensitivity.rows import RowPlan

DDL = """
CREATE TABLE o (o_key INT PRIMARY KEY, o_c INT NOT NULL);
CREATE TABLE c (c_key INT PRIMARY KEY, c_nat INT NOT NULL);
CREATE TABLE l (l_o INT NOT NULL, l_n INT NOT NULL, PRIMARY KEY (l_o, l_n));
"""
COLUMNS = {"o": ("o_key", "o_c"), "c": ("c_key", "c_nat"), "l": ("l_o", "l_n")}
DOMAINS = {"o": ((0, 1), (0, 1)), "c": ((0, 1), (0, 1)), "l": ((0, 1), (1, 2, 3))}
KEY = {"o": (0,), "c": (0,), "l": (0, 1)}  # the PRIMARY KEY's positions
WEIGHTS = {"o": 1.0, "c": 2.0, "l": 1.0}
POLICY = """
[tables.o]
weight = 1.0
[tables.c]
weight = 2.0
[tables.l]
weight = 1.0
[tables.l.columns.l_n]
range = [1, 2]
"""
BETAS = (0.05, 0.3, 1.5)
MAX_K = 3
RANGED = "l.l_n BETWEEN 1 AND 2"

Row = tuple[int, int]
DB = dict[str, tuple[Row, ...]]
Check = Callable[[dict[str, Row], DB], bool]


def _kept(r: Row) -> bool:
    return 1 <= r[1] <= 2  # the declared range, which the answered query reads


# (SQL, the FROM tables, the answered WHERE as a Python predicate over one row per table and the database)
CHAIN = (  # Q5's lineitem → orders → customer: o's row determines l (fan-out 2) and c; c's makes o free
    "SELECT COUNT(*) FROM l, o, c WHERE l.l_o = o.o_key AND o.o_c = c.c_key",
    ("l", "o", "c"),
    lambda r, db: _kept(r["l"]) and r["l"][0] == r["o"][0] and r["o"][1] == r["c"][0],
)
MANY = (  # c meets o on a non-key column: o free for c (tied to c's row), l determined by o with fan-out 2
    "SELECT COUNT(*) FROM c, o, l WHERE c.c_nat = o.o_c AND l.l_o = o.o_key",
    ("c", "o", "l"),
    lambda r, db: _kept(r["l"]) and r["c"][1] == r["o"][1] and r["l"][0] == r["o"][0],
)
EXISTS = (  # Q21's shape: the derived table's row fixes l_o, which determines the outer l (fan-out 2) and o
    "SELECT COUNT(*) FROM l, o WHERE l.l_o = o.o_key AND EXISTS (SELECT * FROM l l2 WHERE l2.l_o = l.l_o "
    "AND l2.l_n <> l.l_n)",
    ("l", "o"),
    lambda r, db: (
        _kept(r["l"]) and r["l"][0] == r["o"][0] and any(x[0] == r["l"][0] and x[1] != r["l"][1] for x in db["l"])
    ),
)
SELF = (  # two uses of l, each determined by o's key up to its two l_n values: o's derivative is 2 · 2
    "SELECT COUNT(*) FROM o, l l1, l l2 WHERE l1.l_o = o.o_key AND l2.l_o = o.o_key",
    ("o", "l1", "l2"),
    lambda r, db: _kept(r["l1"]) and _kept(r["l2"]) and r["l1"][0] == r["o"][0] == r["l2"][0],
)
QUERIES = {"chain": CHAIN, "many": MANY, "exists": EXISTS, "self": SELF}
ALIASES = {"l1": "l", "l2": "l"}  # a self-join's uses: FROM entries that are not table names


def _catalog(conn: psycopg.Connection) -> Catalog:
    catalog = Catalog.from_database(conn)
    assert catalog.enforced  # the keys are PostgreSQL's own
    return catalog


def _plan(sql: str, catalog: Catalog, ranged: bool = True) -> RowPlan:
    """The row plan (sensitivity.plan may prefer the model checker's global bound where it finds one) of the form
    with the declared ranges its keys use, as sensitivity.plan reads it (``ranged``: with_key_ranges applied)."""
    policy = Policy.from_toml(POLICY)
    form = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(form, AnalysisForm)
    return rows_module.plan_rows(
        rows_module.with_key_ranges(form, catalog, policy) if ranged else form, catalog, policy
    )


def _answer_sql(plan: RowPlan) -> str:
    """The answered COUNT: the form's product under the plan's WHERE (sqldp.session builds it the same way)."""
    where = " AND ".join(c.sql for c in plan.conjuncts)
    uses = ", ".join(u.table if u.alias == u.table else f"{u.table} {u.alias}" for u in plan.form.uses)
    return f"SELECT COUNT(*) FROM {uses} WHERE {where}"


def _scalar(conn: psycopg.Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def _load(conn: psycopg.Connection, db: DB) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} ({', '.join(COLUMNS[table])}) VALUES (%s, %s)", row)


def _keys_free(rows: tuple[Row, ...], row: Row, table: str) -> bool:
    return all(tuple(r[i] for i in KEY[table]) != tuple(row[i] for i in KEY[table]) for r in rows)


def _random_db(rng: random.Random) -> DB:
    db: DB = {}
    for table, (first, second) in DOMAINS.items():
        rows: list[Row] = []
        for row in itertools.product(first, second):
            if rng.random() < 0.45 and _keys_free(tuple(rows), row, table):
                rows.append(row)
        db[table] = tuple(sorted(rows))
    return db


def _count(db: DB, tables: tuple[str, ...], where: Check) -> int:
    """The answered COUNT: product rows, one row per FROM entry (``tables``: aliases), passing ``where``."""
    rows = itertools.product(*(db[ALIASES.get(t, t)] for t in tables))
    return sum(1 for combo in rows if where(dict(zip(tables, combo, strict=True)), db))


def _moves(db: DB, table: str) -> list[DB]:
    """Every database one row of ``table`` away that keeps the keys: a row whose key is free added (l_n = 3
    included), a present row removed."""
    free = [row for row in product_rows(*DOMAINS[table]) if _keys_free(db[table], row, table)]
    return [{**db, table: tuple(sorted(n.db[table]))} for n in row_neighbours(db, {table: free})]


def _local(db: DB, tables: tuple[str, ...], where: Check, table: str) -> int:
    here = _count(db, tables, where)
    return max((abs(_count(other, tables, where) - here) for other in _moves(db, table)), default=0)


def _local_at_distance(db: DB, tables: tuple[str, ...], where: Check, table: str) -> list[int]:
    """For k = 0 … MAX_K: the largest local sensitivity over every database within distance k."""
    return local_at_distance(db, sorted(WEIGHTS), WEIGHTS, _moves, lambda d: _local(d, tables, where, table), MAX_K)


def _statistics(conn: psycopg.Connection, plan: RowPlan) -> list[Any]:
    return [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]


@pytest.mark.parametrize("name", list(QUERIES))
def test_fanned_bound_covers_the_local_sensitivity_at_each_distance_and_is_smooth(pg_dsn: str, name: str) -> None:
    sql, tables, where = QUERIES[name]
    rng = random.Random(name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(sql, _catalog(conn))
        # the answered query reads the declared range, for each use of l
        assert {c.sql for c in plan.conjuncts} >= {RANGED.replace("l.", f"{a}.") for a in tables if a.startswith("l")}
        assert any(p.fanned is not None for p in plan.uses) or any(s.fanned is not None for s in plan.semis)
        private = sorted({ALIASES.get(t, t) for t in tables} & set(WEIGHTS))
        for i in range(3):
            db = _random_db(rng)
            if i == 0:  # a full l: two rows per l_o in the range, one outside
                db = {**db, "l": tuple(itertools.product((0, 1), (1, 2, 3)))}
            _load(conn, db)
            if name != "exists":  # the oracle is PostgreSQL's answer to the answered query
                assert _scalar(conn, _answer_sql(plan)) == _count(db, tables, where)
            results = _statistics(conn, plan)
            reach = plan.reach(results)
            bounds = {beta: plan.finish(results, beta).tables for beta in BETAS}
            for table in private:
                local = _local_at_distance(db, tables, where, table)
                # a self-join's count is convex along a row's multiplicity: one step changes it by at most the
                # derivative at its far end, one step further (tests/sensitivity/test_rows_oracle.py, NR §3.3.9)
                step = WEIGHTS[table] if name == "self" else 0.0
                for k, ls in enumerate(local):  # (A(k) leaves a subquery's derived table out: its sum only)
                    assert name == "exists" or ls <= reach[table](k + step) + 1e-9, (name, table, k, db)
                for beta in BETAS:
                    smooth = math.exp(beta * step) * bounds[beta][table]["smooth_derivative"]
                    assert all(math.exp(-beta * k) * ls <= smooth * (1 + 1e-9) for k, ls in enumerate(local))
            for t in private:
                for other in _moves(db, t):
                    _load(conn, other)
                    there = {beta: plan.finish(_statistics(conn, plan), beta).tables for beta in BETAS}
                    for beta, table in itertools.product(BETAS, private):
                        a, b = bounds[beta][table]["sensitivity"], there[beta][table]["sensitivity"]
                        assert a <= math.exp(beta * WEIGHTS[t]) * b * (1 + 1e-9) + 1e-12, (name, table, t, other)
                        assert b <= math.exp(beta * WEIGHTS[t]) * a * (1 + 1e-9) + 1e-12, (name, table, t, other)


STATIC = "SELECT COUNT(*) FROM o, l WHERE o.o_key = l.l_o"


def _static_check(conn: psycopg.Connection, plan: RowPlan, bound: float) -> int:
    """Every key-respecting neighbour of a few databases moves the answered COUNT by at most ``bound``; the
    largest move seen."""
    tables = ("o", "l")
    where: Check = lambda r, db: _kept(r["l"]) and r["o"][0] == r["l"][0]  # noqa: E731
    rng = random.Random("static")
    largest = 0
    for i in range(4):
        db = _random_db(rng)
        if i == 0:
            db = {**db, "o": (), "l": ((0, 1), (0, 2), (0, 3))}
        _load(conn, db)
        here = _count(db, tables, where)
        for t in tables:
            for other in _moves(db, t):
                move = abs(_count(other, tables, where) - here)
                largest = max(largest, move)
                assert move <= bound, (db, other)
    return largest


def test_a_join_determined_through_a_ranged_key_gets_laplace_at_the_fan_out(pg_dsn: str) -> None:
    """o ⋈ l on o's key: o's row determines l up to its two l_n values, l's row determines o. The bound is 2 on
    every database, Laplace at 2/ε; some neighbour (a new o row meeting two l rows) reaches it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(STATIC, _catalog(conn))
        assert plan.data_independent
        _load(conn, {"o": ((0, 0),), "c": (), "l": ((0, 1),)})
        bound = plan.finish(_statistics(conn, plan), 0.3).sensitivity
        assert bound == 2.0
        assert _static_check(conn, plan, bound) == 2
        session = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n" + POLICY))
        [[m]] = session.run(STATIC, audit=True).measurements
        assert (m.mechanism, m.sensitivity) == (GLOBAL, 2.0)
        # the answer leaves the row outside the declaration out: (0, 1) and (0, 2) meet o's row, (0, 3) does not
        _load(conn, {"o": ((0, 0),), "c": (), "l": ((0, 1), (0, 2), (0, 3))})
        assert _scalar(conn, _answer_sql(plan)) == 2


def test_a_join_determined_through_a_ranged_key_runs_no_sensitivity_query(pg_dsn: str) -> None:
    """sqldp.sensitivity.rows, "what a global bound reads": STATIC's bound 2 = f·c_F (c_F = 1: no free use) reads no
    count, so the plan has no query, on every database the bound is the one the plan running every query gives
    (``unread`` emptied, which also shows the derivative at the data), and the brute force over every neighbour
    holds it. The answer still reads the range (the fan-out's premise); the session runs the answer alone."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(STATIC, _catalog(conn))
        full = dataclasses.replace(plan, unread=frozenset(), unread_grouped=frozenset())
        assert plan.data_independent and plan.queries == () and plan.query_count == 0
        assert full.queries and full.query_count == len(full.queries)
        rng = random.Random("unread")
        for _ in range(3):
            _load(conn, _random_db(rng))
            kept = plan.finish([], 0.3)
            every = full.finish(_statistics(conn, full), 0.3)
            assert kept.sensitivity == every.sensitivity == 2.0
            for table in ("o", "l"):
                assert "derivative" in every.tables[table] and "derivative" not in kept.tables[table]
                assert {k: v for k, v in every.tables[table].items() if k != "derivative"} == kept.tables[table]
        assert _static_check(conn, plan, plan.finish([], 0.3).sensitivity) == 2
        assert RANGED in [c.sql for c in plan.conjuncts]
        session = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n" + POLICY))
        prepared = session.prepare(STATIC)
        assert isinstance(prepared, Prepared) and prepared.statements is not None
        assert prepared.statements.queries == () and RANGED in prepared.statements.answer
        [[m]] = prepared.run().measurements
        assert (m.mechanism, m.sensitivity) == (GLOBAL, 2.0)


@pytest.mark.parametrize("policy", ["tpch", "tpch_catalog"])
def test_q12_runs_its_answer_alone_at_the_fan_out_bound(tpch_dsn: tuple[str, object, object], policy: str) -> None:
    """TPC-H Q12 (orders ⋈ lineitem, l_linenumber in [1, 7] and (l_orderkey, l_linenumber) lineitem's key): the
    combined bound (NR §3.3.9) is global, max(c1, c3·c4) = 7 with c1 = 7 from one orders row meeting at most 7
    lineitem rows; neither c1 nor c4 reads a count, so the only statement is the answer (which keeps
    l_linenumber BETWEEN 1 AND 7), and the audit shows orders' 7 without a derivative at the data."""
    session = sqldp.connect(tpch_dsn[0], policy=policy)
    sql = (Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries" / "q12.sql").read_text()
    prepared = session.prepare(sql, epsilon=1.0)
    assert isinstance(prepared, Prepared) and prepared.statements is not None
    assert prepared.statements.queries == ()
    assert "lineitem.l_linenumber BETWEEN 1 AND 7" in prepared.statements.answer
    result = session.run(sql, epsilon=1.0, audit=True)
    for group in result.measurements:
        for m in group:
            assert (m.mechanism, m.sensitivity) == (GLOBAL, 7.0)
            orders = m.tables["orders"]["rows"]
            assert orders["sensitivity"] == 7.0 and "derivative" not in orders


def test_a_fan_out_taken_as_one_fails_the_brute_force_check(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: the ranged column counted as one value (as if fixed). o's derivative is then static at 1, but a new
    o row meets both l rows of its key: the neighbour's move is 2."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        catalog = _catalog(conn)
        original = rows_module.key_ranges
        monkeypatch.setattr(rows_module, "key_ranges", lambda *a: dict.fromkeys(original(*a), 1.0))
        wrong = _plan(STATIC, catalog)
        _load(conn, {"o": (), "c": (), "l": ((0, 1), (0, 2))})
        bound = wrong.finish(_statistics(conn, wrong), 0.3).sensitivity
        assert bound == 1.0
        with pytest.raises(AssertionError):
            _static_check(conn, wrong, bound)


def test_a_fan_out_without_the_range_in_the_query_fails_the_brute_force_check(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutant: the analysis takes the fan-out 2 but the query does not read the range (with_key_ranges left
    out). A new o row then meets the l_n = 3 row too: the unfiltered COUNT moves by 3 > 2."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        catalog = _catalog(conn)
        l_n = rows_module.ColumnRef("l", "l_n")
        monkeypatch.setattr(rows_module, "key_ranges", lambda *a: {l_n: 2.0})
        wrong = _plan(STATIC, catalog, ranged=False)
        assert RANGED not in [c.sql for c in wrong.conjuncts]
        _load(conn, {"o": (), "c": (), "l": ((0, 1), (0, 2), (0, 3))})
        bound = wrong.finish(_statistics(conn, wrong), 0.3).sensitivity
        assert bound == 2.0
        here = _scalar(conn, STATIC)
        conn.execute("INSERT INTO o VALUES (0, 0)")
        assert _scalar(conn, STATIC) - here == 3 > bound


def _conjuncts(sql: str, policy: str = POLICY, enforced: bool = True) -> list[str]:
    catalog = dataclasses.replace(Catalog.from_ddl(DDL), enforced=enforced)
    pol = Policy.from_toml(policy)
    parsed = normalize(parse(sql, catalog), catalog, pol)
    assert isinstance(parsed, AnalysisForm)
    form = rows_module.with_key_ranges(parsed, catalog, pol)
    return [c.sql for c in form.conjuncts]


def test_the_range_is_added_only_where_a_key_can_use_it() -> None:
    """Added: l_n is l's key column θ leaves free while it ties l_o. Not added: no enforced keys (a schema file's
    claims), l read alone (no key column tied), no declared range, l_n in l's norm (a private filter then), l's
    rows public."""
    joined = "SELECT COUNT(*) FROM o, l WHERE o.o_key = l.l_o"
    assert RANGED in _conjuncts(joined)
    assert RANGED not in _conjuncts(joined, enforced=False)
    assert RANGED not in _conjuncts("SELECT COUNT(*) FROM l")
    assert RANGED not in _conjuncts(joined, POLICY.replace("[tables.l.columns.l_n]\nrange = [1, 2]\n", ""))
    assert "l.l_n BETWEEN 1 AND 1000" in _conjuncts(joined, POLICY.replace("range = [1, 2]", "range = [1, 1000]"))
    assert "BETWEEN" not in " ".join(_conjuncts(joined, POLICY.replace("range = [1, 2]", "range = [1, 1001]")))
    assert "l.l_n IN (1, 3)" in _conjuncts(joined, POLICY.replace("range = [1, 2]", "domain = [3, 1]"))
    assert RANGED not in _conjuncts(joined, POLICY.replace("[tables.l]\n", '[tables.l]\nnorm = "l1(l_n)"\n'))
    assert RANGED not in _conjuncts(joined, POLICY.replace("[tables.l]\nweight = 1.0", '[tables.l]\nrows = "public"'))
    # a range the query already reads is not added twice, and a column θ ties is no free column
    assert _conjuncts(joined + " AND " + RANGED).count(RANGED) == 1
    assert RANGED not in _conjuncts("SELECT COUNT(*) FROM o, l WHERE o.o_key = l.l_o AND o.o_c = l.l_n")


def test_key_ranges_counts_the_integers_a_conjunct_keeps() -> None:
    """BETWEEN lo AND hi keeps hi − lo + 1 integers, IN its distinct literals; NOT BETWEEN, a bound that is no
    integer literal, a non-integer column or BETWEEN SYMMETRIC (its bounds may come in either order) keep no
    counted set."""
    catalog = dataclasses.replace(Catalog.from_ddl(DDL.replace("o_c INT", "o_c NUMERIC(5, 2)")), enforced=True)
    pol = Policy.from_toml(POLICY)
    types = {t: {c.name: c.type_sql for c in catalog.table(t).columns.values()} for t in COLUMNS}

    def ranges(cond: str) -> dict[str, float]:
        form = normalize(parse(f"SELECT COUNT(*) FROM o, l WHERE o.o_key = l.l_o AND {cond}", catalog), catalog, pol)
        assert isinstance(form, AnalysisForm)
        return {str(r): n for r, n in rows_module.key_ranges(form, types).items()}

    assert list(ranges("l.l_n BETWEEN 1 AND 2").values()) == [2.0]
    assert list(ranges("l.l_n BETWEEN -1 AND 2").values()) == [4.0]
    assert list(ranges("l.l_n BETWEEN 3 AND 2").values()) == [0.0]
    assert list(ranges("l.l_n IN (1, 3, 3)").values()) == [2.0]
    assert ranges("l.l_n NOT BETWEEN 1 AND 2") == {}
    assert ranges("l.l_n BETWEEN 1 AND o.o_key") == {}
    assert ranges("l.l_n BETWEEN 1.5 AND 2") == {}
    assert ranges("o.o_c BETWEEN 1 AND 2") == {}
    assert ranges("l.l_n BETWEEN SYMMETRIC 2 AND 1") == {}
