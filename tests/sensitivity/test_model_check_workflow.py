"""The model checker on workflows (NR §3.3.13.9–10, §4.3.6.1): subqueries and views as steps, the derived
tables' keys given to the next step, and the composition c′ + Σ c_D·r_D·S_D (Proposition 3.2).

* The 22 TPC-H queries: every one but Q13 (LEFT JOIN) decomposes; each step's sensitivity per table is 1, 2 or
  ∞ (NR Table 21), and the composed ones are pinned.
* Brute force on PostgreSQL over every database of a small domain (every r and s over {0, 1, 2} with their
  keys, every removed row): the output rows that really change never exceed the composed bound, and reach it
  on the shapes listed as tight. The mutant that counts a changed group of a grouped step as one row of it
  (r_D = 1) gives 1 on ``GROUPED_VALUE`` where PostgreSQL shows 2.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
import pytest
from test_model_check_oracles import DOMAIN, WORLD, replay

from sqldp.catalog import Catalog
from sqldp.datasets import dataset_path
from sqldp.frontend import parse
from sqldp.sensitivity import model_check_workflow as mw

TPCH = Catalog.from_file(dataset_path("tpch.sql"))
QUERIES = Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries"
INF = math.inf

# composed sensitivities per base table (result rows one added or removed row changes)
EXPECTED = {
    "q02": {"part": INF, "supplier": INF, "partsupp": INF, "nation": INF, "region": INF},
    "q04": {"orders": 1, "lineitem": 1},
    "q11": {"partsupp": 1, "supplier": INF, "nation": INF},
    "q15": {"supplier": 1, "lineitem": 2},  # a changed revenue is one row out and one in
    "q16": {"partsupp": 1, "part": 1, "supplier": INF},
    "q17": {"lineitem": 1, "part": 1},  # one output row
    "q18": {"customer": INF, "orders": 1, "lineitem": 2},  # directly and through the IN step: 1 + 1
    "q20": {"supplier": 1, "nation": INF, "partsupp": 1, "part": INF, "lineitem": 2},
    "q21": {"supplier": 1, "lineitem": INF, "orders": INF, "nation": INF},
    "q22": {"customer": 1, "orders": 1},
}


def _workflow(query: str, catalog: Catalog) -> mw.WorkflowSensitivity:
    return mw.workflow(parse(query, catalog).tree, catalog, timeout=20)


def test_tpch_as_workflows() -> None:
    """The queries with subqueries or views (the single-block ones: test_model_check_oracles.py)."""
    with pytest.raises(ValueError, match="OUTER JOIN"):
        _workflow((QUERIES / "q13.sql").read_text(), TPCH)
    for name, expected in EXPECTED.items():
        w = _workflow((QUERIES / f"{name}.sql").read_text(), TPCH)
        for step in w.steps:
            assert all(g.value in (0, 1, 2, INF) for g in step.direct.values()), (name, step)
        assert w.total == expected, (name, w.total)
    q20 = _workflow((QUERIES / "q20.sql").read_text(), TPCH)
    keys = {s.kind: s.key for s in q20.steps if s.kind == "grouped"}
    assert keys == {"grouped": ("l_partkey", "l_suppkey")}  # NR §3.3.13.10: the group columns are a key
    q4 = _workflow((QUERIES / "q04.sql").read_text(), TPCH)
    assert [(s.kind, s.key) for s in q4.steps] == [("distinct", ("l_orderkey",)), ("main", ())]


def test_refusals_say_why() -> None:
    for query, why in [
        ("SELECT r.a FROM r WHERE EXISTS (SELECT 1 FROM s)", "uncorrelated EXISTS"),
        ("SELECT r.a FROM r WHERE r.b < (SELECT COUNT(*) FROM s WHERE s.b = r.a)", "COUNT"),
        ("SELECT r.a FROM r WHERE r.b NOT IN (SELECT s.c FROM s)", "nullable"),
        ("SELECT r.a FROM r WHERE r.b < (SELECT MAX(s.c) FROM s WHERE s.b < r.a)", "other than '='"),
        ("SELECT r.a FROM r WHERE r.a = 1 OR r.b IN (SELECT s.b FROM s)", "does not decompose"),
    ]:
        with pytest.raises(ValueError, match=why):
            _workflow(query, WORLD)


# -- brute force over every small database on PostgreSQL ----------------------------------------------------------

# (query over r and s, tables, tight: the bound is reached)
GROUPED_VALUE = (
    "WITH g AS (SELECT s.c AS k, COUNT(*) AS n FROM s GROUP BY s.c) SELECT r.b, g.n FROM r, g WHERE r.a = g.k"
)
SHAPES: list[tuple[str, bool]] = [
    ("SELECT r.a FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.b)", True),
    ("SELECT r.a FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.b = r.a AND s.c = 1)", True),
    ("SELECT r.b, COUNT(*) FROM r WHERE r.a IN (SELECT s.c FROM s WHERE s.b > 0) GROUP BY r.b", True),
    ("SELECT r.a FROM r WHERE r.b NOT IN (SELECT s.b FROM s WHERE s.c = 2)", True),
    # r_D = 2 counts the old and the new value of the changed group; here they meet one row of r: 1
    ("SELECT r.a FROM r WHERE r.b < (SELECT MAX(s.c) FROM s WHERE s.b = r.a)", False),
    ("SELECT DISTINCT r.b FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b <> r.b AND s.c = r.a)", False),
    ("SELECT COUNT(*) FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.b = r.a)", True),
    (GROUPED_VALUE, True),
    (
        "SELECT r.a FROM r WHERE r.b IN (SELECT s.b FROM s WHERE s.c IN (SELECT r2.a FROM r AS r2 WHERE r2.b = 1))",
        False,
    ),
]


def _world_sql(query: str) -> str:
    """The query over one world and one removal: each table read through a parameter row p (world, removed key)."""
    tree = parse(query, WORLD).tree
    from sqlglot import exp

    for t in list(tree.find_all(exp.Table)):
        name = t.name.lower()
        if name not in ("r", "s"):
            continue
        cols, key = ("a, b", "a") if name == "r" else ("b, c", "b")
        body = f"SELECT {cols} FROM {name}_w WHERE w{name} = p.w{name} AND {key} IS DISTINCT FROM p.d{name}"
        body += f" AND {key} IS NOT NULL"
        t.replace(exp.Subquery(this=parse_one(body), alias=exp.TableAlias(this=exp.to_identifier(t.alias_or_name))))
    return tree.sql(dialect="postgres")


def parse_one(text: str) -> Any:
    import sqlglot

    return sqlglot.parse_one(text, read="postgres")


def _changes(before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], grouped: bool) -> int:
    if grouped:  # groups whose row appears, disappears or changes (a group's key: all but the last column)
        b = {r[:-1]: r[-1] for r in before}
        a = {r[:-1]: r[-1] for r in after}
        return sum(1 for k in b.keys() | a.keys() if b.get(k) != a.get(k))
    cb, ca = Counter(before), Counter(after)
    return sum(((cb - ca) + (ca - cb)).values())


def _brute(conn: psycopg.Connection, query: str, table: str) -> int:
    """The largest number of result rows one removal of a row of ``table`` changes, over every world."""
    from sqlglot import exp

    tree = parse(query, WORLD).tree
    assert isinstance(tree, exp.Select)
    # groups, or the one row of an ungrouped aggregate: a changed row counts once (NR §3.3.13.8)
    grouped = tree.args.get("group") is not None or any(e.find(exp.AggFunc) for e in tree.expressions)
    worlds = conn.execute("SELECT DISTINCT r.wr, s.ws FROM r_w r, s_w s").fetchall()
    # the worlds with nothing removed, and with each row of ``table`` removed
    key = "a" if table == "r" else "b"
    conn.execute("DROP TABLE IF EXISTS p; CREATE TEMP TABLE p (id int, wr int, ws int, dr int, ds int)")
    rows = []
    removable = {
        (w,): [
            k
            for (k,) in conn.execute(
                f"SELECT {key} FROM {table}_w WHERE w{table} = %s AND {key} IS NOT NULL", (w,)
            ).fetchall()
        ]
        for (w,) in conn.execute(f"SELECT DISTINCT w{table} FROM {table}_w").fetchall()
    }
    for wr, ws in worlds:
        base = len(rows)
        rows.append((base, wr, ws, None, None))
        for k in removable.get((wr if table == "r" else ws,), []):
            rows.append((len(rows), wr, ws, k if table == "r" else None, k if table == "s" else None))
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO p VALUES (%s, %s, %s, %s, %s)", rows)
    inner = _world_sql(query)
    got: dict[int, list[tuple[Any, ...]]] = {}
    for row in conn.execute(f"SELECT p.id, q.* FROM p, LATERAL ({inner}) AS q").fetchall():
        got.setdefault(row[0], []).append(tuple(row[1:]))
    worst = 0
    base_of: dict[tuple[int, int], int] = {}
    for i, wr, ws, dr, ds in rows:
        if dr is None and ds is None:
            base_of[(wr, ws)] = i
            continue
        worst = max(worst, _changes(got.get(base_of[(wr, ws)], []), got.get(i, []), grouped))
    return worst


def _worlds(conn: psycopg.Connection) -> None:
    """r_w(wr, a, b), s_w(ws, b, c): every r and s over the domain with their keys (s.c nullable), and empty."""
    import itertools

    conn.execute("CREATE TABLE r_w (wr int, a int, b int); CREATE TABLE s_w (ws int, b int, c int)")
    for name, values in (("r", DOMAIN), ("s", (*DOMAIN, None))):
        rows = []
        for w, choice in enumerate(itertools.product((False, *((True, v) for v in values)), repeat=len(DOMAIN))):
            rows += [(w, k, pick[1]) for k, pick in zip(DOMAIN, choice, strict=True) if pick]
            if not any(choice):
                rows.append((w, None, None))  # the empty world: a row of NULLs that no table reads
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {name}_w VALUES (%s, %s, %s)", rows)


def test_workflows_against_every_small_database(pg_dsn: str) -> None:
    reached = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _worlds(conn)
        for query, tight in SHAPES:
            w = _workflow(query, WORLD)
            for table in ("r", "s"):
                bound = w.total.get(table, 0.0)
                worst = _brute(conn, query, table)
                assert worst <= bound, (query, table, worst, bound)
                if tight and math.isfinite(bound):
                    assert worst == bound, (query, table, worst, bound)
                    reached += 1
    assert reached >= 8


def test_exact_step_sensitivities_are_witnessed(pg_dsn: str) -> None:
    """Every step's finite exact sensitivity (> 0) on the TPC-H workflows and the shapes above: the model's
    database, with each step's result as a table of its own (its key as the primary key), loaded on PostgreSQL;
    removing the row y changes exactly that many result rows of the step."""
    checked = 0
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        cases = [((QUERIES / f"{name}.sql").read_text(), TPCH) for name in EXPECTED]
        cases += [(query, WORLD) for query, _ in SHAPES]
        for query, catalog in cases:
            w = _workflow(query, catalog)
            assert w.catalog is not None
            for step in w.steps:
                for table, g in step.direct.items():
                    text = step.queries[table]
                    if not (g.exact and 0 < g.value < INF) or "%(released" in text:
                        continue  # a released step's value is a parameter of the step, not a table
                    assert g.witness is not None and g.witness.n == g.value, (step.name, table, g)
                    assert replay(conn, w.catalog, text, table, g) == g.value, (step.name, table, text)
                    conn.execute("SET search_path TO public")
                    checked += 1
    assert checked >= 30
