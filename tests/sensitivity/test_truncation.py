"""Declared contribution bounds (``max_rows_per``, docs/truncation.md), checked by brute force on PostgreSQL.

t (k, v, g) may have at most 2 rows per k (declared, not enforced: the query truncates); s (k PRIMARY KEY, w)
is keyed by PostgreSQL. For each query, small databases — a hand-made one that reaches the bounds and
random ones — and every neighbour (one row of a private table added from a small universe, or removed) are
answered by the real pipeline with the truncated plan. Checked: the answer PostgreSQL computes equals a Python
truncation oracle (the partition's first τ rows by (v, g), NULLs last); the change over every neighbour, in ℓ1
over the groups, is at most the reported bound; the bound is reached (so a mutant that doubles it fails); the
same bound on every database; and without the truncation in the rewrite some neighbour exceeds the bound.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from oracles import row_neighbours

import sqldp
from sqldp import rewrite
from sqldp.engine.postgres.dialect import POSTGRES
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.params import resolve_params
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.runner import Prepared
from sqldp.session import Session
from sqldp.strategies.aggregate import compile_form

TAU = 2
LO, HI = -3, 5
POLICY = f"""
[defaults]
epsilon = 1.0
[tables.t]
max_rows_per = {{ k = {TAU} }}
[tables.t.columns.v]
range = [{LO}, {HI}]
[tables.t.columns.g]
domain = [0, 1]
[tables.s]
rows = "{{s_rows}}"
"""
Row = tuple[Any, ...]
DB = dict[str, list[Row]]
# the hand-made database: k = 0 full with v = 5 (an added v = −3 row ranks first and evicts one), k = 1 with one
# row (a second one joins it twice in a self-join), k = 2 full but without an s row (an added s row meets 2)
BASE: DB = {
    "t": [(0, 5, 0), (0, 5, 1), (1, -3, 0), (2, 5, 0), (2, 5, 1), (None, 5, 0)],
    "s": [(0, 1), (1, 1)],
}
T_UNIVERSE = list(itertools.product((0, 1, 2, None), (LO, HI, 1, None), (0, 1)))
S_UNIVERSE = list(itertools.product((0, 1, 2, 3), (0, 1)))


def _truncated(rows: list[Row]) -> list[Row]:
    """Python's truncation: per k (None is one value), the first τ rows ordered by (v, g), NULLs last."""
    by_key: dict[Any, list[Row]] = {}
    for r in rows:
        by_key.setdefault(r[0], []).append(r)
    out = []
    for part in by_key.values():
        out += sorted(part, key=lambda r: tuple((x is None, x if x is not None else 0) for x in r[1:]))[:TAU]
    return out


def _clamp(v: Any) -> float | None:
    return None if v is None else float(min(max(v, LO), HI))


def _sum(values: list[float | None]) -> float:
    return sum(v for v in values if v is not None)


def _groups(pairs: list[tuple[int, float | None]]) -> dict[tuple[Any, ...], float]:
    return {(g,): _sum([v for h, v in pairs if h == g]) for g in (0, 1)}


def _joined(t: list[Row], s: list[Row], *, w: bool = False) -> list[Row]:
    return [a for a in t for b in s if a[0] is not None and a[0] == b[0] and (not w or b[1] > 0)]


# (SQL, s public?, the bound the truncated plan must report, Python oracle over (truncated t, s))
CASES: list[tuple[str, bool, float, Callable[[list[Row], list[Row]], dict[tuple[Any, ...], float]]]] = [
    # COUNT: the evicted row's join rows cancel the new one's (|a − b| ≤ N); s's row meets τ rows of t
    ("SELECT COUNT(*) FROM t, s WHERE t.k = s.k", False, 2.0, lambda t, s: {(): float(len(_joined(t, s)))}),
    # SUM over both signs: one in, one out of [−3, 5] → 8 = 1·(5 − (−3)) (s public: only t counts)
    (
        "SELECT SUM(t.v) FROM t, s WHERE t.k = s.k",
        True,
        8.0,
        lambda t, s: {(): _sum([_clamp(a[1]) for a in _joined(t, s)])},
    ),
    # a histogram: the in-row and the out-row in two groups → 2 in ℓ1
    (
        "SELECT t.g, COUNT(*) FROM t, s WHERE t.k = s.k GROUP BY t.g",
        True,
        2.0,
        lambda t, s: _groups([(a[2], 1.0) for a in _joined(t, s)]),
    ),
    # a self-join on the declared key: one row meets ≤ 2τ − 1 rows (itself once)
    (
        "SELECT COUNT(*) FROM t a, t b WHERE a.k = b.k",
        True,
        2.0 * TAU - 1,
        lambda t, s: {(): float(sum(1 for a in t for b in t if a[0] is not None and a[0] == b[0]))},
    ),
    # both private: s's row meets τ rows of value ≤ 5 → 10 (t's swap gives 8)
    (
        "SELECT SUM(t.v) FROM t, s WHERE t.k = s.k AND s.w > 0",
        False,
        10.0,
        lambda t, s: {(): _sum([_clamp(a[1]) for a in _joined(t, s, w=True)])},
    ),
    (
        "SELECT t.g, SUM(t.v) FROM t, s WHERE t.k = s.k GROUP BY t.g",
        False,
        10.0,
        lambda t, s: _groups([(a[2], _clamp(a[1])) for a in _joined(t, s)]),
    ),
]


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (k INT, v INT, g INT)")  # no key: the declared bound is not enforced
        c.execute("CREATE TABLE s (k INT PRIMARY KEY, w INT NOT NULL)")
        yield c


def _session(dsn: str, s_public: bool) -> Session:
    return sqldp.connect(dsn, Policy.from_toml(POLICY.replace("{s_rows}", "public" if s_public else "private")))


def _prepared(session: Session, sql: str, *, truncation: bool | None = True) -> Prepared:
    """The pipeline of Session.prepare with the truncation decided by the test (True: whenever it applies)."""
    form = normalize(parse(sql, session.catalog), session.catalog, session.policy)
    params = resolve_params(session.policy, outputs=len(form.aggregates))
    domains, plans, statements = compile_form(
        form, session.catalog, session.policy, None, params=params, truncation=truncation
    )
    return Prepared(session.engine, session.noise, sql, form, params, plans, domains, statements, time.perf_counter())


def _load(conn: psycopg.Connection, db: DB) -> None:
    conn.execute("DELETE FROM t")
    conn.execute("DELETE FROM s")
    with conn.cursor() as cur:
        if db["t"]:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", db["t"])
        if db["s"]:
            cur.executemany("INSERT INTO s VALUES (%s, %s)", db["s"])


def _answer(prepared: Prepared) -> tuple[dict[tuple[Any, ...], float], float, set[str]]:
    """Per group (key values; () without GROUP BY) the true value the release would add noise to, the bound,
    and the mechanisms."""
    result = prepared.analyze()
    keys = [(0,), (1,)] if result.grouped else [()]  # the declared domain of t.g, in its order
    values: dict[tuple[Any, ...], float] = {}
    bounds, mechanisms = set(), set()
    for key, group in zip(keys, result.measurements, strict=True):
        [m] = group
        values[key] = m.true_value or 0.0
        bounds.add(m.sensitivity)
        mechanisms.add(m.mechanism)
    [bound] = bounds
    return values, bound, mechanisms


def _neighbours(db: DB, private: tuple[str, ...]) -> Iterator[DB]:
    for table in private:
        keys = {x[0] for x in db[table]}
        universe = T_UNIVERSE if table == "t" else [r for r in S_UNIVERSE if r[0] not in keys]
        for n in row_neighbours(db, {table: universe}):  # s: only rows PostgreSQL's PRIMARY KEY admits
            yield n.db


def _random(rng: random.Random) -> DB:
    t = [rng.choice(T_UNIVERSE) for _ in range(rng.randrange(0, 7))]
    s = [(k, rng.randrange(2)) for k in sorted(rng.sample(range(4), rng.randrange(0, 4)))]
    return {"t": t, "s": s}


def _l1(a: dict[tuple[Any, ...], float], b: dict[tuple[Any, ...], float]) -> float:
    return sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in a.keys() | b.keys())


@pytest.mark.parametrize(("sql", "s_public", "expected", "oracle"), CASES, ids=[c[0] for c in CASES])
def test_every_neighbour_of_a_truncated_query_moves_it_by_at_most_the_reached_bound(
    conn: psycopg.Connection,
    pg_dsn: str,
    sql: str,
    s_public: bool,
    expected: float,
    oracle: Callable[[list[Row], list[Row]], dict[tuple[Any, ...], float]],
) -> None:
    session = _session(pg_dsn, s_public)
    prepared = _prepared(session, sql)
    assert prepared.statements is not None and prepared.statements.truncations
    private = ("t",) if s_public else ("t", "s")
    rng = random.Random(sql)
    largest = 0.0
    for db in [BASE, *(_random(rng) for _ in range(4))]:
        _load(conn, db)
        before, bound, mechanisms = _answer(prepared)
        assert mechanisms == {GLOBAL} and bound == expected  # data-independent: the same on every database
        assert before == oracle(_truncated(db["t"]), db["s"])  # PostgreSQL's truncation is Python's
        for other in _neighbours(db, private):
            _load(conn, other)
            after, _, _ = _answer(prepared)
            assert after == oracle(_truncated(other["t"]), other["s"])
            change = _l1(before, after)
            assert change <= bound, (db, other)
            largest = max(largest, change)
    assert largest == expected  # reached: a bound twice as large would not be the query's


def test_without_the_truncation_a_neighbour_exceeds_the_bound(
    conn: psycopg.Connection, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same plan and bound, with the ``truncate`` rule taken out of the rewriter: on data that breaks the
    declaration (three rows with k = 1) one added s row moves the COUNT by 3 > 2."""
    monkeypatch.setattr(rewrite, "ANSWER_RULES", tuple(r for r in rewrite.ANSWER_RULES if r is not rewrite.truncate))
    prepared = _prepared(_session(pg_dsn, False), "SELECT COUNT(*) FROM t, s WHERE t.k = s.k")
    assert prepared.statements is not None and "ROW_NUMBER" not in prepared.statements.answer
    db: DB = {"t": [(1, 1, 0), (1, 2, 0), (1, 3, 1)], "s": []}
    _load(conn, db)
    before, bound, _ = _answer(prepared)
    _load(conn, {**db, "s": [(1, 0)]})
    after, _, _ = _answer(prepared)
    assert bound == 2.0 and _l1(before, after) == 3.0 > bound


def test_the_cheaper_bound_is_chosen_and_noted(conn: psycopg.Connection, pg_dsn: str) -> None:
    """Both private: the untruncated join is smoothed (generalized Cauchy, ≥ 2.8·2/ε in median at the declared
    bound) against Laplace at 2/ε: truncated, with a note naming τ. Over a public s the untruncated bound is
    already global: not truncated. Truncation can be refused per call (``truncation=False``)."""
    sql = "SELECT COUNT(*) FROM t, s WHERE t.k = s.k"
    private = _session(pg_dsn, False)
    _load(conn, BASE)
    out = private.run(sql, audit=True)
    [[m]] = out.measurements
    assert (m.mechanism, m.sensitivity) == (GLOBAL, 2.0)
    assert any("t: at most 2 rows per k" in n for n in out.notes)
    assert any("t: at most 2 rows per k" in n for n in out.to_json()["notes"])  # the analyst's view too
    public = _session(pg_dsn, True).run(sql, audit=True)
    assert not any("max_rows_per" in n for n in public.notes)
    plain = _prepared(private, sql, truncation=False)
    assert plain.statements is not None and not plain.statements.truncations
    assert plain.analyze().measurements[0][0].mechanism == "cauchy"


def test_a_key_postgresql_enforces_is_not_truncated(pg_dsn: str) -> None:
    """τ = 1 on a PRIMARY KEY column: the database holds it already; nothing to truncate, nothing to choose."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE a (id INT PRIMARY KEY, x INT)")
        c.execute("CREATE TABLE b (id INT, y INT)")
    policy = Policy.from_toml("[defaults]\nepsilon = 1.0\n[tables.a]\nmax_rows_per = { id = 1 }\n")
    session = sqldp.connect(pg_dsn, policy)
    prepared = session.prepare("SELECT COUNT(*) FROM a, b WHERE a.id = b.id")
    assert prepared.statements is not None and not prepared.statements.truncations
    assert prepared.statements.choice is None


def test_explain_shows_the_choice_and_trusts_only_declared_bounds_from_a_schema_file() -> None:
    """From a DDL file (keys are claims, not enforced): lineitem ⋈ orders is bounded only when both tables
    declare their join key — orders' PRIMARY KEY in the file does not count — and then both are truncated."""
    from sqldp.catalog import Catalog
    from sqldp.commands.explain import _text, explain

    catalog = Catalog.from_ddl(
        "CREATE TABLE orders (o_orderkey INT PRIMARY KEY, o_custkey INT);"
        "CREATE TABLE lineitem (l_orderkey INT NOT NULL, l_quantity INT);"
    )
    sql = "SELECT COUNT(*) FROM lineitem, orders WHERE l_orderkey = o_orderkey"
    one = Policy.from_toml("[defaults]\nepsilon = 1.0\n[tables.lineitem]\nmax_rows_per = { l_orderkey = 7 }\n")
    assert "truncation" not in explain(sql, catalog, one)  # orders unbounded: nothing to rely on
    both = Policy.from_toml(
        "[defaults]\nepsilon = 1.0\n[tables.lineitem]\nmax_rows_per = { l_orderkey = 7 }\n"
        "[tables.orders]\nmax_rows_per = { o_orderkey = 1 }\n"
    )
    out = explain(sql, catalog, both)
    assert out["truncation"]["chosen"] == "truncated global bound"
    assert out["truncation"]["truncated"] == [
        {"table": "lineitem", "column": "l_orderkey", "max_rows": 7},
        {"table": "orders", "column": "o_orderkey", "max_rows": 1},
    ]
    assert out["mechanisms"] == {"COUNT(*)": GLOBAL}
    assert out["sql"][0].count("ROW_NUMBER() OVER (PARTITION BY") == 2
    assert "Declared contribution bounds: truncated global bound (lineitem ≤ 7 rows per l_orderkey" in _text(out)


def test_the_choice_compares_median_noise_from_the_plans_alone() -> None:
    """No data read: Laplace at the truncated bound against the smooth mechanism's floor where the declaration
    is reached (generalized Cauchy: 5·median|η| ≈ 2.8 per unit; smoothed Laplace with a fixed β: ln 2). A
    histogram doubles the truncated bound (one row in, one out, in two groups) while the smooth plan splits ε
    over the 2 groups: with a fixed-β Laplace the two tie, and a tie keeps the query untruncated."""
    from sqldp.catalog import Catalog
    from sqldp.params import PrivacyParams

    catalog = Catalog.from_ddl(
        "CREATE TABLE orders (o_orderkey INT PRIMARY KEY, o_custkey INT);"
        "CREATE TABLE lineitem (l_orderkey INT NOT NULL, l_shipmode TEXT);"
    )
    policy = Policy.from_toml(
        "[defaults]\nepsilon = 1.0\n[tables.lineitem]\nmax_rows_per = { l_orderkey = 7 }\n"
        "[tables.lineitem.columns.l_shipmode]\ndomain = ['MAIL', 'SHIP']\n"
        "[tables.orders]\nmax_rows_per = { o_orderkey = 1 }\n"
    )
    join = "FROM lineitem, orders WHERE l_orderkey = o_orderkey"

    def choice(sql: str, mechanism: str, beta: float | None) -> dict[str, Any]:
        form = normalize(parse(sql, catalog), catalog, policy)
        params = PrivacyParams(1.0, 1e-6 if mechanism == "laplace" else None, beta, mechanism, 0.78)
        *_, statements = compile_form(form, catalog, policy, beta, params=params)
        assert statements.choice is not None
        return statements.choice

    count = choice(f"SELECT COUNT(*) {join}", "cauchy", None)
    assert count["chosen"] == "truncated global bound" and count["untruncated_is_floor"]
    assert count["truncated_median_noise"] == pytest.approx(7 * 0.693147, rel=1e-5)  # orders: 7 lineitems
    assert 2.8 * 7 < count["untruncated_median_noise"] < 2.9 * 7
    grouped = f"SELECT l_shipmode, COUNT(*) {join} GROUP BY l_shipmode"
    assert choice(grouped, "cauchy", None)["chosen"] == "truncated global bound"
    tie = choice(grouped, "laplace", 0.01)
    assert tie["truncated_median_noise"] == tie["untruncated_median_noise"]  # ln 2·14/ε against ln 2·7/(ε/2)
    assert tie["chosen"] == "untruncated bound"


def test_the_rows_kept_do_not_depend_on_the_physical_order(pg_dsn: str) -> None:
    """Rows equal under every column's equality but not identical (NUMERIC 1.0 and 1.00, −0 and 0, strings
    a nondeterministic collation would merge): the truncation keeps the same one whichever was stored
    first. With an enforced key, the order is the key's columns."""
    from sqldp.catalog import Catalog

    rows = [(1, "1.0", "0", "a"), (1, "1.00", "-0", "a"), (1, "1.00", "0", "a"), (1, "1.0", "-0", "a")]
    kept = set()
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE u (k INT, x NUMERIC, f DOUBLE PRECISION, s TEXT)")
        c.execute("CREATE TABLE w (id INT PRIMARY KEY, k INT, x NUMERIC)")
        catalog = Catalog.from_database(c)
        order = ", ".join(
            e.sql(dialect="postgres") for e in rewrite.total_order(catalog.table("u"), "k", catalog, POSTGRES)
        )
        sql = f"SELECT x::text, f::text FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY {order}) n FROM u) q"
        for perm in itertools.permutations(rows):
            c.execute("DELETE FROM u")
            for r in perm:
                c.execute("INSERT INTO u VALUES (%s, %s::numeric, %s::float8, %s)", r)
            kept.add(tuple(c.execute(sql + " WHERE n = 1").fetchall()))
        keyed = [e.sql(dialect="postgres") for e in rewrite.total_order(catalog.table("w"), "k", catalog, POSTGRES)]
    assert len(kept) == 1
    assert keyed == ['"id"']


def _window_oracle(rows: list[Row], tau: int) -> list[Row]:
    """The first τ rows per k (None is one value) by (x, s bytewise), NULLs last: what the window keeps."""
    by_key: dict[Any, list[Row]] = {}
    for r in rows:
        by_key.setdefault(r[0], []).append(r)

    def order(r: Row) -> tuple[Any, ...]:
        return tuple((v is None, v.encode() if isinstance(v, str) else v or 0) for v in r[1:])

    return [r for part in by_key.values() for r in sorted(part, key=order)[:tau]]


@pytest.mark.parametrize("nulls", [64, 65])
def test_the_truncated_read_keeps_the_rows_of_the_window(pg_dsn: str, nulls: int) -> None:
    """rewrite.truncated_read (only the keys over τ ranked) keeps the multiset the window over the whole table
    keeps, and the rows of a Python truncation: keys with exactly τ = 64 and τ + 1 rows, many more, one row,
    NULL keys (64 or 65 of them: one partition, ranked like the others), and ties in the total order (identical
    rows at the cut, bytewise text order B < a). From the database's catalog (NOT NULL k: no NULL branch) and
    from a DDL file that claims k NOT NULL while the table holds NULLs (a claim: the NULL branch stays)."""
    from sqldp.catalog import Catalog
    from sqldp.sensitivity.global_bound import Truncation

    tau = 64
    rng = random.Random(13)
    rows: list[Row] = [(1, i, "a") for i in range(tau)]  # exactly τ: all kept
    rows += [(2, i // 2, "a") for i in range(tau - 2)] + [(2, 40, "x")] * 3  # τ + 1, identical rows at the cut
    rows += [(3, rng.choice([None, 1, 2]), rng.choice(["a", "B", "b", None])) for _ in range(300)]  # many ties
    rows += [(4, None, None)]
    rows += [(None, rng.choice([None, 1, 2]), rng.choice(["a", "B"])) for _ in range(nulls)]
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE u (k INT, x INT, s TEXT)")  # no key: every column orders
        c.execute("CREATE TABLE n (k INT NOT NULL, x INT, s TEXT)")
        for r in rng.sample(rows, len(rows)):  # stored in no particular order
            c.execute("INSERT INTO u VALUES (%s, %s, %s)", r)
            if r[0] is not None:
                c.execute("INSERT INTO n VALUES (%s, %s, %s)", r)
        enforced = Catalog.from_database(c)
        claimed = Catalog.from_ddl("CREATE TABLE u (k INT NOT NULL, x INT, s TEXT);")
        for table, catalog in (("u", enforced), ("n", enforced), ("u", claimed)):
            cut = Truncation(table, "k", tau)
            text = rewrite.truncated_read(cut, catalog, POSTGRES).sql(dialect="postgres")
            assert text.count("IS NULL") == (2 if table == "u" else 1)  # NOT k IS NULL, and the NULL branch
            got = sorted(c.execute(f"SELECT * FROM ({text}) AS q").fetchall(), key=repr)
            order = ", ".join(
                e.sql(dialect="postgres") for e in rewrite.total_order(catalog.table(table), "k", catalog, POSTGRES)
            )
            window = (
                f"SELECT k, x, s FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY {order}) AS r "
                f"FROM {table}) AS w WHERE r <= {tau}"
            )
            kept = [r for r in rows if table == "u" or r[0] is not None]
            assert got == sorted(c.execute(window).fetchall(), key=repr)
            assert got == sorted(_window_oracle(kept, tau), key=repr)
            assert len(got) == tau + tau + tau + 1 + (tau if table == "u" else 0)


SPARK_DDL = """
CREATE TABLE orders (o_orderkey INT PRIMARY KEY, o_custkey INT, o_status CHAR(1), o_total NUMERIC(15, 2),
                     o_date DATE, o_comment TEXT);
CREATE TABLE lineitem (l_orderkey INT NOT NULL, l_quantity INT{extra});
"""
BOTH = (
    "[defaults]\nepsilon = 1.0\n[tables.lineitem]\nmax_rows_per = { l_orderkey = 7 }\n"
    "[tables.orders]\nmax_rows_per = { o_orderkey = 1 }\n"
)


def test_spark_truncates_as_postgresql_or_refuses_before_anything_runs() -> None:
    """The choice is the same on both engines (the same plans, figures and truncations), and Spark's window
    is PostgreSQL's written for Spark: NULLS LAST spelled out (Spark's ASC default is NULLS FIRST), text as
    it is (UTF8_BINARY is bytewise, as "C"), CHAR without its padding, the snapshot tables. A table with a
    column PostgreSQL orders by its text (here DOUBLE PRECISION) is refused on Spark by compile_form, which
    Session.prepare runs before the charge — only when the truncation is chosen."""
    from sqldp.catalog import Catalog
    from sqldp.engine import Dialect
    from sqldp.engine.spark.dialect import SPARK
    from sqldp.engine.spark.sql import SNAPSHOT
    from sqldp.errors import RefusedError

    sql = "SELECT COUNT(*) FROM lineitem, orders WHERE l_orderkey = o_orderkey"
    policy = Policy.from_toml(BOTH)

    def compiled(catalog: Catalog, dialect: Dialect, policy: Policy = policy) -> Any:
        form = normalize(parse(sql, catalog), catalog, policy)
        return compile_form(form, catalog, policy, None, dialect, params=resolve_params(policy, outputs=1))

    catalog = Catalog.from_ddl(SPARK_DDL.format(extra=""))
    (_, pg_plans, pg), (_, spark_plans, spark) = compiled(catalog, POSTGRES), compiled(catalog, SPARK)
    assert pg.truncations == spark.truncations and len(pg.truncations) == 2
    assert pg.choice == spark.choice and pg.choice is not None and pg.choice["chosen"] == "truncated global bound"
    assert [p.bound for p in pg_plans] == [p.bound for p in spark_plans] == [7.0]
    assert 'ORDER BY "o_custkey", "o_status" COLLATE "C", "o_total", "o_date", "o_comment" COLLATE "C")' in pg.answer
    window = "ORDER BY `o_custkey` NULLS LAST, RTRIM(`o_status`) NULLS LAST, `o_total` NULLS LAST, "
    assert window + "`o_date` NULLS LAST, `o_comment` NULLS LAST)" in spark.answer
    assert "COLLATE" not in spark.answer and f"{SNAPSHOT}orders" in spark.answer

    floats = Catalog.from_ddl(SPARK_DDL.format(extra=", l_tax DOUBLE PRECISION"))
    assert compiled(floats, POSTGRES)[2].truncations  # PostgreSQL orders l_tax by its text
    with pytest.raises(RefusedError, match=r"lineitem\.l_tax \(DOUBLE PRECISION\).*Spark could keep other rows"):
        compiled(floats, SPARK)
    # only lineitem declared: orders is unbounded, nothing is truncated, nothing to refuse
    one = Policy.from_toml("[defaults]\nepsilon = 1.0\n[tables.lineitem]\nmax_rows_per = { l_orderkey = 7 }\n")
    assert not compiled(floats, SPARK, one)[2].truncations
