"""The row analysis' running-count statement (sqldp.sensitivity.rows, "counting pairs across one inequality")
against the GROUP BY it replaces, on every neighbour of random tiny databases (real PostgreSQL).

TPC-H Q17c's derivative for part counts, per part key, the pairs of lineitem rows with 5·l1.q < l2.q (NR
§3.3.7.3: the count of σθ[r/part](l1 × l2), largest over r's key). The plan computes it in one sorted pass
instead of forming the pairs. The oracle is the GROUP BY itself (the definition, the statement the plan ran
before): on each random database and on each neighbour (every possible row added to, every present row
removed from each private table) both must give the same number, so every bound derived from it is
unchanged. The values include ties, NULL and NaN (each comparison's edge: a tie counts for <= and >= only,
NULL never, NaN equals itself and exceeds every number); the four comparison operators, a comparison written
either way round, own conjuncts on one side, two join columns with one key, and two different tables are
covered. Two mutants fail here: one that puts the counted side first among equal values for "<" (counting
ties), and one that keeps rows whose join columns are NULL (partitioned together, they would pair).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import psycopg
import pytest
from oracles import product_rows, row_neighbours
from sqlglot import exp

from sqldp import sensitivity
from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.sensitivity import rows
from sqldp.sensitivity.rows import RowPlan

# NUMERIC(10, 2): a product of such columns cannot overflow (else sqldp.sensitivity.failures refuses)
DDL = """
CREATE TABLE l (k INT, m INT, q NUMERIC(10, 2));
CREATE TABLE s (k INT, m INT, w NUMERIC(10, 2));
CREATE TABLE p (k INT, br INT);
"""
COLUMNS = {"l": ("k", "m", "q"), "s": ("k", "m", "w"), "p": ("k", "br")}
PRIVATE = ("l", "s", "p")
POLICY = "".join(f"[tables.{t}]\nweight = 1.0\n" for t in PRIVATE) + "[tables.p.columns.br]\nrange = [0, 1]\n"
KEYS = (0, 1, None)
VALUES = ("0", "0.5", "1", "2", None, "NaN")

QUERIES = [
    # Q17c's shape
    "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND p.br = 1 AND 2 * l1.q < l2.q",
    # the comparison written from the other use, <=, an expression on both sides
    "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND l2.q + 0 >= l1.q + 0.5",
    # two tables, >, an own conjunct of one side
    "SELECT COUNT(*) FROM l, p, s WHERE p.k = l.k AND s.k = p.k AND l.q > s.w AND l.m = 1",
    # two join columns, one of them the key; >=; a SUM
    "SELECT SUM(p.br) FROM l, p, s WHERE p.k = l.k AND s.k = p.k AND l.m = s.m AND l.q <= 2 * s.w",
    # the bare integer columns compared
    "SELECT COUNT(*) FROM l, p, s WHERE p.k = l.k AND s.k = p.k AND l.m <= s.m",
]


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(DDL)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_toml(POLICY)


def _plan(sql: str, catalog: Catalog, policy: Policy) -> RowPlan:
    form = normalize(parse(sql, catalog), catalog, policy)
    plan = sensitivity.plan(form, catalog, policy)
    assert isinstance(plan, RowPlan)
    return plan


def _pairs(sql: str, catalog: Catalog, policy: Policy) -> list[tuple[str, str]]:
    """(running-count statement, the GROUP BY it replaces) for each component the plan counts by the pass."""
    form = normalize(parse(sql, catalog), catalog, policy)
    classes = rows.equality_classes(form.conjuncts)
    types = catalog.sqlglot_schema()
    out = []
    for use in form.uses:
        term = rows.use_term(form, use, classes)
        if not term.others:
            continue
        for uses, conds, keys in rows._components(term):
            reps = [term.reps[k] for k in keys]
            fast = rows._pair_count(uses, conds, reps, types)  # type: ignore[arg-type]
            if fast is not None:
                grouped = rows._max_of(rows._count_query(uses, conds, reps))
                out.append((fast.sql(dialect="postgres"), grouped.sql(dialect="postgres")))
    return out


def test_the_plan_counts_pairs_by_the_running_count(catalog: Catalog, policy: Policy) -> None:
    """Each query's part derivative goes through the pass (else the oracle below proves nothing), and the
    plan's statements hold it."""
    for sql in QUERIES:
        pairs = _pairs(sql, catalog, policy)
        assert len(pairs) == 1, sql
        plan = _plan(sql, catalog, policy)
        assert any(q.sql(dialect="postgres") == pairs[0][0] for q in plan.scalars), sql
        assert any(isinstance(w.args.get("spec"), exp.WindowSpec) for q in plan.scalars for w in q.find_all(exp.Window))


def test_shapes_outside_the_pass_keep_the_group_by(policy: Policy) -> None:
    """A float column (its order and NUMERIC's could differ), a division (it may fail on rows the join never
    pairs), join columns of different types, or two comparisons: the GROUP BY stays."""
    catalog = Catalog.from_ddl(
        "CREATE TABLE l (k INT, m INT, q DOUBLE PRECISION);\nCREATE TABLE s (k TEXT, m INT, w NUMERIC);\n"
        "CREATE TABLE p (k INT, br INT);\n"
    )
    for sql in [
        "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND l1.q < l2.q",
        "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND l1.m / 2 < l2.m",
        "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND l1.m < l2.m AND l1.m > l2.k",
        "SELECT COUNT(*) FROM l, p, s WHERE p.k = l.k AND CAST(s.k AS INT) = p.k AND l.m = s.k AND l.m < s.m",
    ]:
        assert _pairs(sql, catalog, policy) == [], sql
    bare = Catalog.from_ddl(DDL)
    # integer arithmetic may overflow on a row the join never pairs: only a bare integer column is taken
    sql = "SELECT COUNT(*) FROM l l1, p, l l2 WHERE p.k = l1.k AND l2.k = p.k AND 2 * l1.m < l2.m"
    assert _pairs(sql, bare, policy) == []


def _random_db(rng: random.Random) -> dict[str, list[tuple[object, ...]]]:
    def row(table: str) -> tuple[object, ...]:
        if table == "p":
            return (rng.choice(KEYS), rng.choice((0, 1)))
        return (rng.choice(KEYS), rng.choice(KEYS), rng.choice(VALUES))

    return {t: [row(t) for _ in range(rng.randint(1, 7))] for t in COLUMNS}


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[object, ...]]]) -> None:
    for table, table_rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        cols = COLUMNS[table]
        for r in table_rows:
            conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})", r)


def _every_neighbour(conn: psycopg.Connection, seed: str, databases: int = 6) -> Iterator[str]:
    """Loads random databases and yields inside a transaction at each one and at each of its neighbours."""
    rng = random.Random(seed)
    for _ in range(databases):
        db = _random_db(rng)
        _load(conn, db)
        added = {t: product_rows(*([KEYS, (0, 1)] if t == "p" else [KEYS, KEYS, VALUES])) for t in PRIVATE}
        neighbours = row_neighbours(db, added, distinct=True)  # one private row away
        changes = [("", "", ()), *((n.table, n.op, n.row) for n in neighbours)]
        for table, op, r in changes:
            conn.execute("BEGIN")
            cols = COLUMNS.get(table, ())
            if op == "add":
                conn.execute(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join(['%s'] * len(cols))})", r)
            elif op == "remove":
                match = " AND ".join(f"{c} IS NOT DISTINCT FROM %s" for c in cols)
                conn.execute(f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} WHERE {match} LIMIT 1)", r)
            yield f"{db} {op} {table} {r}"
            conn.execute("ROLLBACK")


@pytest.mark.parametrize("sql", QUERIES)
def test_running_count_equals_group_by_on_every_neighbour(
    pg_dsn: str, catalog: Catalog, policy: Policy, sql: str
) -> None:
    pairs = _pairs(sql, catalog, policy)
    compared = 0
    positive = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for where in _every_neighbour(conn, sql):
            for fast, grouped in pairs:
                got, want = conn.execute(fast).fetchone()[0], conn.execute(grouped).fetchone()[0]
                assert got == want, (where, fast)
                compared += 1
                positive += want > 0
    assert compared > 300
    assert positive >= 50, "the databases must have pairs to count"
