"""The row analysis' separator statements (sqldp.sensitivity.rows, "splitting a component at a separator")
against the GROUP BY they replace, on every neighbour of random tiny databases (real PostgreSQL).

The derivative through a private use is a maximum over patterns of a join's count (NR §3.3.7.3). Where the
pattern's columns sit in parts of the join that meet at one equality class only (TPC-H Q5's derivative for
orders: customer and lineitem meet at the nation key), sqldp computes that maximum per part and checks in
the statement that the product formula is exact, else falls back to the GROUP BY. The oracle here is the
GROUP BY itself (the definition, as the plan computed it before): on each random database and on each of its
neighbours (every possible row added to, every present row removed from each private table) both statements
must give the same number, so every bound the plan derives from them is unchanged. The catalog declares
keys (they choose the separator) but the test tables have no constraints, so duplicate keys send some
databases to the fallback; the test checks that both branches were taken.
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
from sqldp.sensitivity.rows import RowPlan

# declared keys (what the catalog says) …
CATALOG = """
CREATE TABLE c (ck INT PRIMARY KEY, nk INT);
CREATE TABLE o (ok INT PRIMARY KEY, ck INT);
CREATE TABLE l (ok INT, sk INT);
CREATE TABLE s (sk INT PRIMARY KEY, nk INT);
CREATE TABLE n (nk INT PRIMARY KEY, rk INT);
"""
# … but the database enforces none of them: a key may repeat, and the statements must stay exact
TABLES = {"c": ("ck", "nk"), "o": ("ok", "ck"), "l": ("ok", "sk"), "s": ("sk", "nk"), "n": ("nk", "rk")}
DDL = "".join(f"CREATE TABLE {t} ({a} INT, {b} INT);\n" for t, (a, b) in TABLES.items())
PRIVATE = ("c", "o", "l", "s")
POLICY = (
    "".join(f"[tables.{t}]\nweight = 1.0\n" for t in PRIVATE)
    + '[tables.l.columns.sk]\nrange = [0, 2]\n[tables.n]\nrows = "public"\n'
)
DOMAIN = (0, 1, 2, None)  # NULL keys: a GROUP BY makes them a group, an equality never holds for them

QUERIES = [
    # Q5's shape: the derivative for o groups by (c.ck, l.ok), which meet only at c.nk = s.nk = n.nk
    "SELECT COUNT(*) FROM c, o, l, s, n WHERE c.ck = o.ck AND l.ok = o.ok AND l.sk = s.sk AND c.nk = s.nk "
    "AND s.nk = n.nk AND n.rk < 2",
    # Q7's shape: two uses of the public table, an OR across them
    "SELECT COUNT(*) FROM s, l, o, c, n n1, n n2 WHERE s.sk = l.sk AND o.ok = l.ok AND c.ck = o.ck "
    "AND s.nk = n1.nk AND c.nk = n2.nk AND ((n1.rk = 0 AND n2.rk = 1) OR (n1.rk = 1 AND n2.rk = 0))",
    # no public table; a SUM
    "SELECT SUM(l.sk) FROM c, o, l, s WHERE c.ck = o.ck AND l.ok = o.ok AND l.sk = s.sk AND c.nk = s.nk",
    "SELECT COUNT(*) FROM c, o, l, s WHERE c.ck = o.ck AND l.ok = o.ok AND l.sk = s.sk AND c.nk < s.nk",
]
# the uses whose derivative is factorised: in Q5's shape also c's (o.ck and n.nk meet at the nation key, and
# n's key is v itself); in the others c's keys (o.ck, n2.nk or s.nk) meet through s.sk, which no key fixes
SPLIT_EXPECTED = {0: {"o", "l", "c"}, 1: {"o", "l"}, 2: {"o", "l"}, 3: {"l"}}


# the neighbours: every database one private row away, each possible row added, each present row removed
ADDED = {t: product_rows(DOMAIN, DOMAIN) for t in PRIVATE}


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.from_ddl(CATALOG)


@pytest.fixture(scope="module")
def policy() -> Policy:
    return Policy.from_toml(POLICY)


def _plan(sql: str, catalog: Catalog, policy: Policy) -> RowPlan:
    form = normalize(parse(sql, catalog), catalog, policy)
    plan = sensitivity.plan(form, catalog, policy)
    assert isinstance(plan, RowPlan)
    return plan


def _pairs(plan: RowPlan) -> list[tuple[exp.Select, exp.Select, exp.Expr]]:
    """(separator statement, the GROUP BY it replaces, its functional check) for each factorised scalar."""
    out = []
    for q in plan.scalars:
        case = q.find(exp.Case) if isinstance(q, exp.Select) else None
        if case is None or not isinstance(case.args.get("default"), exp.Subquery):
            continue
        assert isinstance(q, exp.Select)
        check = q.copy()
        check.set("expressions", [case.args["ifs"][0].this.copy()])
        out.append((q, case.args["default"].this, check))
    return out


def _random_db(rng: random.Random) -> dict[str, list[tuple[int, int]]]:
    db = {t: [(rng.choice(DOMAIN), rng.choice(DOMAIN)) for _ in range(rng.randint(1, 5))] for t in TABLES}
    if rng.random() < 0.5:  # a database that keeps the declared keys: the product formula's branch
        for t in ("c", "o", "s", "n"):
            db[t] = list({r[0]: r for r in db[t]}.values())
    return db


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, int]]]) -> None:
    for table, table_rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        a, b = TABLES[table]
        for row in table_rows:
            conn.execute(f"INSERT INTO {table} ({a}, {b}) VALUES (%s, %s)", row)


def _factorised(plan: RowPlan) -> set[str]:
    statements = [s for s, _, _ in _pairs(plan)]
    return {p.term.use.alias for p in plan.uses for f in p.factors if any(plan.scalars[j] in statements for j in f)}


def test_separator_is_chosen_where_expected(catalog: Catalog, policy: Policy) -> None:
    """The queries above do exercise the separator statements (else the oracle test proves nothing)."""
    for i, sql in enumerate(QUERIES):
        assert _factorised(_plan(sql, catalog, policy)) == SPLIT_EXPECTED[i], sql


def test_no_separator_without_declared_keys(policy: Policy) -> None:
    """Without declared keys a part is likely functional only when a key is v itself (c's derivative in Q5's
    shape, grouped by n.nk at the nation key): o's and l's keep the GROUP BY."""
    bare = Catalog.from_ddl(DDL)
    assert [_factorised(_plan(sql, bare, policy)) for sql in QUERIES] == [{"c"}, set(), set(), set()]


def test_inequality_across_the_parts_keeps_the_group_by(catalog: Catalog, policy: Policy) -> None:
    """With c.nk < s.nk in place of the nation equality, o's derivative has no separator (the inequality ties
    c to l's supplier, Q17c's 5·l1.q < l2.q does the same): it keeps the GROUP BY. l's still splits at the
    customer key, the inequality lying inside one part."""
    sql = "SELECT COUNT(*) FROM c, o, l, s WHERE c.ck = o.ck AND l.ok = o.ok AND l.sk = s.sk AND c.nk < s.nk"
    assert _factorised(_plan(sql, catalog, policy)) == {"l"}


def _every_neighbour(conn: psycopg.Connection, seed: str, databases: int = 5) -> Iterator[str]:
    """Loads random databases and yields inside a transaction at each one and at each of its neighbours."""
    rng = random.Random(seed)
    for _ in range(databases):
        db = _random_db(rng)
        _load(conn, db)
        for table, op, row in [
            ("", "", (0, 0)),
            *((n.table, n.op, n.row) for n in row_neighbours(db, ADDED, distinct=True)),
        ]:
            conn.execute("BEGIN")
            if op:
                a, b = TABLES[table]
                if op == "add":
                    conn.execute(f"INSERT INTO {table} ({a}, {b}) VALUES (%s, %s)", row)
                else:
                    conn.execute(
                        f"DELETE FROM {table} WHERE ctid = (SELECT ctid FROM {table} WHERE {a} IS NOT DISTINCT FROM "
                        f"%s AND {b} IS NOT DISTINCT FROM %s LIMIT 1)",
                        row,
                    )
            yield f"{db} {op} {table} {row}"
            conn.execute("ROLLBACK")


@pytest.mark.parametrize("sql", QUERIES)
def test_separator_statement_equals_group_by_on_every_neighbour(
    pg_dsn: str, catalog: Catalog, policy: Policy, sql: str
) -> None:
    plan = _plan(sql, catalog, policy)
    statements = [tuple(q.sql(dialect="postgres") for q in triple) for triple in _pairs(plan)]
    assert statements
    branches: set[bool] = set()
    compared = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for where in _every_neighbour(conn, sql):
            for fast, grouped, check in statements:
                assert conn.execute(fast).fetchone()[0] == conn.execute(grouped).fetchone()[0], (where, fast)
                branches.add(bool(conn.execute(check).fetchone()[0]))
                compared += 1
    assert branches == {True, False}, "both the product formula and the fallback must be exercised"
    assert compared > 100


SHARED = [
    # Q17's shape: the derivative for s groups l alone by l.sk, beside l's own count (one scan for both)
    "SELECT COUNT(*) FROM l, s WHERE l.sk = s.sk AND l.ok < 2 AND s.nk > 0",
    "SELECT COUNT(*) FROM c, o WHERE c.ck = o.ck AND c.nk = o.ok",  # two bound columns, two keys
    QUERIES[0],  # no shared scan: separator statements beside plain scalar subqueries
]


@pytest.mark.parametrize("sql", SHARED)
def test_head_statement_equals_each_scalar_on_every_neighbour(
    pg_dsn: str, catalog: Catalog, policy: Policy, sql: str
) -> None:
    """The one-row statement the plan runs (shared scans, separator statements) gives, column by column, what
    each scalar statement gives run alone: the plan reads the numbers it read before."""
    plan = _plan(sql, catalog, policy)
    assert bool(plan.shared) == (sql != QUERIES[0])
    head = plan.queries[0].sql(dialect="postgres")
    alone = [exp.select(exp.Subquery(this=q.copy())).sql(dialect="postgres") for q in plan.scalars]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for where in _every_neighbour(conn, sql, databases=3):
            got = [float(v or 0) for v in conn.execute(head).fetchone()]
            want = [float(conn.execute(q).fetchone()[0] or 0) for q in alone]
            assert got == want, (where, head)


def test_parts_with_keys_read_only_the_keyless_parts_values(catalog: Catalog, policy: Policy) -> None:
    """In Q5's shape n's part has no key: the unchecked parts with keys read only the v that n's part holds
    (an IN over it), so the oracle above compares that restriction too (a mutant with NOT IN fails there)."""
    plan = _plan(QUERIES[0], catalog, policy)
    restricted = [s for s, _, _ in _pairs(plan) if any(isinstance(i.args.get("query"), exp.Subquery)
                                                         for i in s.find_all(exp.In))]  # fmt: skip
    assert restricted
