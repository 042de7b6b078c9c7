"""Uses that a declared key determines contribute no growth (sqldp.sensitivity.rows, "uses a declared key
determines"), checked by brute force on tiny PostgreSQL databases whose PRIMARY KEYs PostgreSQL enforces.

For Q5's shape (a fact table l ⋈ o on o's key ⋈ c on c's key, l ⋈ s on s's key, and the many-to-many
c.c_nat = s.s_nat) and a few smaller joins, on random databases that satisfy the keys:

* the local sensitivity at distance k = 0 … 3 — the largest change of the COUNT by one key-respecting row
  addition or removal, over every database reachable by k key-respecting changes (weights: s counts 2) — is at
  most the plan's A(k) (``RowPlan.reach``), computed from the statistics PostgreSQL returns;
* the smooth bound covers that local sensitivity weighted by e^(−βk), and it is β-smooth over every
  key-respecting neighbour (both ways, at the neighbour's weight), each neighbour's bound computed on PostgreSQL.

Mutants: the bound that ignores the keys (a schema-file catalog, whose keys are not enforced: NR's plain A(k)) is
larger, and the keyed one is tight where it is static; a mutant that takes a non-key join column for a key
(``keys_of`` patched) fails the brute-force check on a database where that column repeats.
A join whose private uses are all determined is data-independent: Laplace at the global bound, which covers
every neighbour of every database and is reached. It runs only the public counts its bound reads ("what a
global bound reads" in sqldp.sensitivity.rows), with the bound of the plan running every query; the mutant that
leaves out a count the bound reads fails instead of answering.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from oracles import product_rows, row_neighbours

import sqldp
from sqldp import sensitivity
from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.sensitivity import rows as rows_module
from sqldp.sensitivity.rows import RowPlan

DDL = """
CREATE TABLE o (o_key INT PRIMARY KEY, o_c INT NOT NULL);
CREATE TABLE c (c_key INT PRIMARY KEY, c_nat INT NOT NULL);
CREATE TABLE s (s_key INT PRIMARY KEY, s_nat INT NOT NULL);
CREATE TABLE l (l_o INT NOT NULL, l_s INT NOT NULL);
CREATE TABLE n (n_key INT PRIMARY KEY, n_reg INT NOT NULL);
"""
COLUMNS = {
    "o": ("o_key", "o_c"),
    "c": ("c_key", "c_nat"),
    "s": ("s_key", "s_nat"),
    "l": ("l_o", "l_s"),
    "n": ("n_key", "n_reg"),
}
KEYED = {"o", "c", "s", "n"}  # the first column is the PRIMARY KEY
WEIGHTS = {"o": 1.0, "c": 1.0, "s": 2.0, "l": 1.0}
POLICY = """
[tables.o]
weight = 1.0
[tables.c]
weight = 1.0
[tables.s]
weight = 2.0
[tables.l]
weight = 1.0
[tables.n]
rows = "public"
"""
VALUES = (0, 1)
BETAS = (0.05, 0.3, 1.5)
MAX_K = 3

Row = tuple[int, int]
DB = dict[str, tuple[Row, ...]]  # sorted rows per table (l is a multiset)
Check = Callable[[dict[str, Row], DB], bool]  # a row per FROM table, and the database

# (SQL, the FROM tables in order, the WHERE as a Python predicate over one row per table)
Q5 = (
    "SELECT COUNT(*) FROM l, o, c, s WHERE l.l_o = o.o_key AND o.o_c = c.c_key AND l.l_s = s.s_key "
    "AND c.c_nat = s.s_nat",
    ("l", "o", "c", "s"),
    lambda r, db: (
        r["l"][0] == r["o"][0] and r["o"][1] == r["c"][0] and r["l"][1] == r["s"][0] and r["c"][1] == r["s"][1]
    ),
)
CHAIN = (  # fact ⋈ dim on the key ⋈ dim2 on the key, and a public dimension on its key
    "SELECT COUNT(*) FROM l, o, c, n WHERE l.l_o = o.o_key AND o.o_c = c.c_key AND c.c_nat = n.n_key",
    ("l", "o", "c", "n"),
    lambda r, db: r["l"][0] == r["o"][0] and r["o"][1] == r["c"][0] and r["c"][1] == r["n"][0],
)
MANY = (  # only the many-to-many equality: nothing is determined for c, s is determined for nothing
    "SELECT COUNT(*) FROM c, s WHERE c.c_nat = s.s_nat",
    ("c", "s"),
    lambda r, db: r["c"][1] == r["s"][1],
)
EXISTS = (  # Q21's shape: the derived table's row fixes l_o, which determines o; the outer l stays free
    "SELECT COUNT(*) FROM l, o WHERE l.l_o = o.o_key "
    "AND EXISTS (SELECT * FROM l l2 WHERE l2.l_o = l.l_o AND l2.l_s <> l.l_s)",
    ("l", "o"),
    lambda r, db: r["l"][0] == r["o"][0] and any(x[0] == r["l"][0] and x[1] != r["l"][1] for x in db["l"]),
)
QUERIES = {"q5": Q5, "chain": CHAIN, "many": MANY, "exists": EXISTS}


def _catalog(conn: psycopg.Connection) -> Catalog:
    catalog = Catalog.from_database(conn)
    assert catalog.enforced  # the keys are PostgreSQL's own
    return catalog


def _plan(sql: str, catalog: Catalog) -> RowPlan:
    policy = Policy.from_toml(POLICY)
    plan = sensitivity.plan(normalize(parse(sql, catalog), catalog, policy), catalog, policy)
    assert isinstance(plan, RowPlan)
    return plan


def _load(conn: psycopg.Connection, db: DB) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} ({', '.join(COLUMNS[table])}) VALUES (%s, %s)", row)


def _random_db(rng: random.Random) -> DB:
    db: DB = {}
    for table in COLUMNS:
        if table in KEYED:
            keys = [k for k in VALUES if rng.random() < 0.7]
            db[table] = tuple(sorted((k, rng.choice(VALUES)) for k in keys))
        else:
            db[table] = tuple(sorted((rng.choice(VALUES), rng.choice(VALUES)) for _ in range(rng.randint(0, 3))))
    return db


def _count(db: DB, tables: tuple[str, ...], where: Check) -> int:
    rows = itertools.product(*(db[t] for t in tables))
    return sum(1 for combo in rows if where(dict(zip(tables, combo, strict=True)), db))


def _moves(db: DB, table: str) -> list[DB]:
    """Every database one row of ``table`` away that keeps the keys: each row whose key is free added, each
    present row removed (one copy of a repeated l row)."""
    present = db[table]
    free = [r for r in product_rows(VALUES, VALUES) if table not in KEYED or all(x[0] != r[0] for x in present)]
    return [{**db, table: tuple(sorted(n.db[table]))} for n in row_neighbours(db, {table: free}, distinct=True)]


def _local(db: DB, tables: tuple[str, ...], where: Check, table: str) -> int:
    """The local sensitivity in ``table``'s rows: the largest |Δ COUNT| over its key-respecting neighbours."""
    here = _count(db, tables, where)
    return max((abs(_count(other, tables, where) - here) for other in _moves(db, table)), default=0)


def local_at_distance(
    db: DB,
    private: list[str],
    weights: dict[str, float],
    moves: Callable[[DB, str], list[DB]],
    local: Callable[[DB], int],
    max_k: int,
) -> list[int]:
    """For k = 0 … max_k: the largest local sensitivity (``local``) over every database within distance k, by a
    search over the changes ``moves`` makes to rows of the ``private`` tables, each costing the table's weight
    G_t. Shared by the key oracles (here and tests/sensitivity/test_rows_fanout.py)."""
    best: dict[tuple[tuple[str, tuple[Row, ...]], ...], float] = {}
    start = tuple(sorted(db.items()))
    best[start] = 0.0
    frontier = [start]
    while frontier:
        nxt = []
        for state in frontier:
            cost = best[state]
            for t in private:
                if cost + weights[t] > max_k:
                    continue
                for other in moves(dict(state), t):
                    key = tuple(sorted(other.items()))
                    if key not in best or best[key] > cost + weights[t]:
                        best[key] = cost + weights[t]
                        nxt.append(key)
        frontier = nxt
    out = [0] * (max_k + 1)
    for state, cost in best.items():
        ls = local(dict(state))
        for k in range(math.ceil(cost), max_k + 1):
            out[k] = max(out[k], ls)
    return out


def _local_at_distance(db: DB, tables: tuple[str, ...], where: Check, table: str) -> list[int]:
    """For k = 0 … MAX_K: the largest local sensitivity over every database within distance k (each change of
    a row of t costs G_t), by a search over key-respecting changes."""
    private = [t for t in tables if t in WEIGHTS]
    return local_at_distance(db, private, WEIGHTS, _moves, lambda d: _local(d, tables, where, table), MAX_K)


def _statistics(conn: psycopg.Connection, plan: RowPlan) -> list[Any]:
    return [conn.execute(q.sql(dialect="postgres")).fetchall() for q in plan.queries]


@pytest.mark.parametrize("name", list(QUERIES))
def test_keyed_bound_covers_the_local_sensitivity_at_each_distance_and_is_smooth(pg_dsn: str, name: str) -> None:
    sql, tables, where = QUERIES[name]
    rng = random.Random(name)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(sql, _catalog(conn))
        private = [t for t in tables if t in WEIGHTS]
        for _ in range(3):
            db = _random_db(rng)
            _load(conn, db)
            assert conn.execute(sql).fetchone()[0] == _count(db, tables, where)  # the oracle is PostgreSQL's count
            results = _statistics(conn, plan)
            reach = plan.reach(results)
            bounds = {beta: plan.finish(results, beta).tables for beta in BETAS}
            for table in private:
                local = _local_at_distance(db, tables, where, table)
                for k, ls in enumerate(local):  # (A(k) leaves a subquery's derived table out: its sum only)
                    assert name == "exists" or ls <= reach[table](float(k)) + 1e-9, (name, table, k, db)
                for beta in BETAS:
                    smooth = bounds[beta][table]["smooth_derivative"]
                    assert all(math.exp(-beta * k) * ls <= smooth * (1 + 1e-9) for k, ls in enumerate(local))
            # β-smooth over every key-respecting neighbour, at the neighbour's distance G
            for t in private:
                for other in _moves(db, t):
                    _load(conn, other)
                    there = {beta: plan.finish(_statistics(conn, plan), beta).tables for beta in BETAS}
                    for beta, table in itertools.product(BETAS, private):
                        a, b = bounds[beta][table]["sensitivity"], there[beta][table]["sensitivity"]
                        assert a <= math.exp(beta * WEIGHTS[t]) * b * (1 + 1e-9) + 1e-12, (name, table, t, other)
                        assert b <= math.exp(beta * WEIGHTS[t]) * a * (1 + 1e-9) + 1e-12, (name, table, t, other)


def test_ignoring_the_keys_gives_a_larger_bound_and_the_keyed_one_is_tight(pg_dsn: str) -> None:
    """Mutant "ignore the key" = the old analysis (a schema-file catalog: its keys are not enforced). On Q5's
    shape its bound for the fact table l grows with o, c and s; the keyed one is static: exactly the local
    sensitivity c = 1 (o, c and s determined by l's row: at most one join row per l row). For o, only l is
    free (s is determined by l's row), so the keyed bound is below the plain one too."""
    sql = Q5[0]
    db: DB = {
        "o": ((0, 0), (1, 1)),
        "c": ((0, 0), (1, 1)),
        "s": ((0, 0), (1, 1)),
        "l": ((0, 0), (0, 0), (1, 1), (1, 1)),
        "n": (),
    }
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        keyed = _plan(sql, _catalog(conn))
        plain = _plan(sql, Catalog.from_ddl(DDL))  # the same keys, declared only
        _load(conn, db)
        for beta in BETAS:
            new = keyed.finish(_statistics(conn, keyed), beta).tables
            old = plain.finish(_statistics(conn, plain), beta).tables
            assert new["l"]["smooth_derivative"] == 1.0 == _local(db, Q5[1], Q5[2], "l")
            assert old["l"]["smooth_derivative"] > 1.0
            for table in ("o", "c"):  # at a large β both may sit at c; at a small one the keyed is below
                assert new[table]["smooth_derivative"] <= old[table]["smooth_derivative"]
                if beta == BETAS[0]:
                    assert new[table]["smooth_derivative"] < old[table]["smooth_derivative"]


def test_a_non_key_taken_for_a_key_fails_the_brute_force_check(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant: c_nat taken for a key of c. In ``SELECT COUNT(*) FROM c, s WHERE c.c_nat = s.s_nat`` s's derivative
    then counts at most one c row at every distance, but a second c row with the same c_nat (a new c_key) is a
    key-respecting neighbour and doubles it: the brute force finds the local sensitivity at distance 1 above the
    mutant's A(1). The real analysis lets c grow and covers it."""
    sql, tables, where = MANY
    db: DB = {"o": (), "c": ((0, 0),), "s": ((0, 0),), "l": (), "n": ()}
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        catalog = _catalog(conn)
        _load(conn, db)
        local = _local_at_distance(db, tables, where, "s")
        assert local[:2] == [1, 2]
        real = _plan(sql, catalog)
        assert local[1] <= real.reach(_statistics(conn, real))["s"](1.0)
        original = rows_module.keys_of

        def mutant(table: Any) -> list[tuple[str, ...]]:
            return [*original(table), ("c_nat",)] if table.name == "c" else original(table)

        monkeypatch.setattr(rows_module, "keys_of", mutant)
        wrong = _plan(sql, catalog)
        assert local[1] > wrong.reach(_statistics(conn, wrong))["s"](1.0)


STATIC = "SELECT COUNT(*) FROM o, c, n WHERE o.o_key = c.c_key AND o.o_c = n.n_reg"


def test_a_join_whose_private_uses_are_all_determined_gets_laplace_at_the_global_bound(pg_dsn: str) -> None:
    """o ⋈ c on both keys (1:1) and a public n on a non-key column: o's derivative has c determined and n free
    (public), c's has o determined and n free. The bound is c_F = the largest number of n rows per n_reg, from
    public rows only: data-independent, released with Laplace at c_F/ε; every key-respecting neighbour of every
    database moves the COUNT by at most that, and some neighbour reaches it."""
    where: Check = lambda r, db: r["o"][0] == r["c"][0] and r["o"][1] == r["n"][1]  # noqa: E731
    tables = ("o", "c", "n")
    rng = random.Random("static")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(STATIC, _catalog(conn))
        assert plan.data_independent
        public_n = ((0, 1), (1, 1))  # two n rows share n_reg = 1: c_F = 2
        largest = 0
        for i in range(4):
            db = {**_random_db(rng), "n": public_n}
            if i == 0:
                db = {**db, "o": ((0, 1),), "c": ((0, 0),)}
            _load(conn, db)
            bound = plan.finish(_statistics(conn, plan), 0.3).sensitivity
            assert bound == 2.0
            here = _count(db, tables, where)
            for t in ("o", "c"):
                for other in _moves(db, t):
                    largest = max(largest, abs(_count(other, tables, where) - here))
                    assert abs(_count(other, tables, where) - here) <= bound
        assert largest == 2
        _load(conn, {"o": ((0, 1),), "c": ((0, 0),), "s": (), "l": (), "n": public_n})
        session = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n" + POLICY))
        [[m]] = session.run(STATIC, audit=True).measurements
        assert (m.mechanism, m.sensitivity) == (GLOBAL, 2.0)


def test_a_global_bound_runs_the_public_counts_it_reads_and_no_other(pg_dsn: str) -> None:
    """sqldp.sensitivity.rows, "what a global bound reads": STATIC's bound c_F reads the largest number of n rows per
    n_reg (public); the private local counts of o and c and the counts at the data are not run. On random
    databases the bound equals that of the same plan running every query (``unread`` emptied), and the audit
    term has no derivative at the data. Mutant: leaving out c_F's query too — the bound then reads a count that
    did not run and fails instead of answering (fail closed)."""
    rng = random.Random("reads")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(STATIC, _catalog(conn))
        full = dataclasses.replace(plan, unread=frozenset(), unread_grouped=frozenset())
        assert plan.data_independent and plan.unread and len(plan.unread) < len(plan.scalars)
        [statement] = [q.sql(dialect="postgres") for q in plan.queries]
        assert "FROM n AS n" in statement and "FROM o AS o" not in statement and "FROM c AS c" not in statement
        for _ in range(4):
            _load(conn, {**_random_db(rng), "n": tuple((k, rng.choice((0, 1))) for k in range(rng.randint(0, 3)))})
            kept = plan.finish(_statistics(conn, plan), 0.3).tables
            every = full.finish(_statistics(conn, full), 0.3).tables
            for table in ("o", "c"):
                assert "derivative" not in kept[table] and "derivative" in every[table]
                assert {k: v for k, v in every[table].items() if k != "derivative"} == kept[table]
        mutant = dataclasses.replace(plan, unread=frozenset(range(len(plan.scalars))))
        assert mutant.queries == ()
        with pytest.raises(RuntimeError, match="not computed"):
            mutant.finish([], 0.3)


def test_a_data_dependent_bound_runs_every_query(pg_dsn: str) -> None:
    """Q5's shape is not data-independent (o grows for c's row): nothing is left out."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        plan = _plan(Q5[0], _catalog(conn))
        assert not plan.data_independent and not plan.unread and not plan.unread_grouped
        assert plan.query_count == len(plan.queries) == 1 + len(plan.grouped)


def _determined(sql: str, ddl: str, policy: str = POLICY) -> dict[str, frozenset[str]]:
    """Per private use, the other uses a key determines (the keys marked enforced, as from PostgreSQL)."""
    catalog = dataclasses.replace(Catalog.from_ddl(ddl), enforced=True)
    plan = _plan(sql, catalog) if policy == POLICY else None
    if plan is None:
        pol = Policy.from_toml(policy)
        plan = sensitivity.plan(normalize(parse(sql, catalog), catalog, pol), catalog, pol)
        assert isinstance(plan, RowPlan)
    return {p.term.use.alias: p.determined for p in plan.uses}


def test_which_uses_are_determined() -> None:
    """Q5's shape: l's row determines o, c, s (static); o's determines c, and s once l is free; c's and s's make l
    free (its key is not declared) and then determine the rest. Keys of a schema file determine nothing."""
    assert _determined(Q5[0], DDL) == {
        "l": frozenset({"o", "c", "s"}),
        "o": frozenset({"c", "s"}),
        "c": frozenset({"o", "s"}),
        "s": frozenset({"o", "c"}),
    }
    assert all(not p.determined for p in _plan(Q5[0], Catalog.from_ddl(DDL)).uses)


def test_a_table_free_in_one_use_is_determined_in_none() -> None:
    """o1 is determined by l's key value, but o2 (o_c is no key) is free: one new o row would be new in both, so
    o1 stays free too (the smoothness argument needs the tables of the two kinds apart)."""
    sql = "SELECT COUNT(*) FROM l, o o1, o o2 WHERE l.l_o = o1.o_key AND o1.o_c = o2.o_c"
    assert _determined(sql, DDL)["l"] == frozenset()
    # o public: a public use is never new, so o1 is determined (o2 free, public)
    public = POLICY.replace("[tables.o]\nweight = 1.0", '[tables.o]\nrows = "public"')
    assert _determined(sql, DDL, public)["l"] == frozenset({"o1"})


def test_a_key_compared_across_types_determines_nothing() -> None:
    """l_o NUMERIC = o_key INT: PostgreSQL compares them as NUMERIC, and uniqueness is the INT's: no claim made."""
    ddl = DDL.replace("l_o INT NOT NULL", "l_o NUMERIC NOT NULL")
    assert _determined("SELECT COUNT(*) FROM l, o WHERE l.l_o = o.o_key", ddl)["l"] == frozenset()
    assert _determined("SELECT COUNT(*) FROM l, o WHERE l.l_o = o.o_key", DDL)["l"] == frozenset({"o"})
