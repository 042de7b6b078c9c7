"""How the value-level bounds are scanned: the reductions of a per-row maximum (skyline, corner), the public
envelope of a private filter, and the answer query that computes one-row bounds in its own scan.

Oracles: the per-row maximum ``SELECT MAX(D(r))`` evaluated by PostgreSQL over every row (the definition the
reductions replace), the approximation of a filter evaluated row by row, and the same analysis with folding
or pipelining switched off.
"""

from __future__ import annotations

import math
import random
from typing import Any

import psycopg
import pytest
import sqlglot
from sqlglot import exp

import sqldp
from sqldp import rewrite
from sqldp.form import ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity import columns
from sqldp.sensitivity.expressions import SqlOps, bound
from sqldp.sensitivity.filters import approximate, envelope

DDL = "CREATE TABLE t (id INT PRIMARY KEY, p INT, a INT, x NUMERIC(6,2), c INT)"
POLICY = """
[tables.t]
rows = "public"
norm = "l1(a, 0.5*x, c)"
[tables.t.columns.a]
range = [-5, 5]
[tables.t.columns.c]
range = [0, 3]
[tables.t.columns.p]
domain = [0, 1, 2, 3]
"""
BETA = 0.1
WEIGHTS = {"a": 1.0, "x": 0.5, "c": 1.0}


def _rows(rng: random.Random, n: int) -> list[tuple]:
    return [
        (i, rng.randint(0, 3), rng.randint(-5, 5), round(rng.uniform(-40, 40), 2), rng.randint(0, 3)) for i in range(n)
    ]


def _load(conn: psycopg.Connection, rows: list[tuple]) -> None:
    conn.execute("TRUNCATE t")
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s)", rows)


def _items(text: str) -> list[exp.Expression]:
    """The kinds of per-row bounds a plan scans: ub(e), each d_v(e), and a constant floor."""
    e = sqlglot.parse_one(text, read="postgres")
    ub, d = bound(e, lambda r: WEIGHTS.get(r.column), SqlOps(), BETA, lambda a, b: True)
    return [ub, *d.values(), exp.Greatest(this=exp.Literal.number(1), expressions=[ub.copy()])]


def _form(dsn: str, sql: str) -> Any:
    return sqldp.connect(dsn, policy=Policy.from_toml(POLICY)).prepare(sql, epsilon=1.0).form


def _one(conn: psycopg.Connection, q: exp.Select) -> list[float | None]:
    rows = conn.execute(q.sql(dialect="postgres")).fetchall()
    return [None if v is None else float(v) for v in rows[0]] if rows else []


@pytest.mark.parametrize("text", ["t.a * t.x + t.c", "t.x * (1 - t.a)", "t.a + t.c", "t.x"])
def test_skyline_is_the_per_row_maximum_and_the_corner_a_smooth_bound_of_it(pg_dsn: str, text: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        form = _form(pg_dsn, f"SELECT SUM({text}) FROM t")
        items = _items(text)
        per_row = exp.select(*(exp.Max(this=e.copy()) for e in items)).from_("t")
        rng = random.Random(text)
        for _ in range(6):
            rows = _rows(rng, rng.randint(1, 12))
            _load(conn, rows)
            truth = _one(conn, per_row)
            for order in ({"a": 11.0, "c": 4.0, "x": math.inf}, {"a": math.inf, "c": 4.0, "x": 3.0}):
                sky, flat = columns._extreme_query(form, items, [], lambda r, o=order: o[r.column], corner=False)
                assert not flat or len({c.name for c in sqlglot.parse_one(text).find_all(exp.Column)}) == 1
                for got, want in zip(_one(conn, sky), truth, strict=True):
                    assert got == pytest.approx(want, rel=1e-12), (rows, order)
            corner, flat = columns._extreme_query(form, items, [], lambda r: 1.0, corner=True)
            assert flat
            at = _one(conn, corner)
            for got, want in zip(at, truth, strict=True):
                assert got >= want * (1 - 1e-12)
            # β-smoothness of the corner: one or two rows change by a random amount; the distance is the
            # policy's (ℓ1 over rows of l1(a, 0.5·x, c))
            changed = [list(r) for r in rows]
            dist = 0.0
            for _ in range(rng.randint(1, 2)):
                r = rng.choice(changed)
                col = rng.choice([2, 3, 4])
                step = rng.choice([-3, -1, 1, 2]) if col != 3 else round(rng.uniform(-30, 30), 2)
                r[col] += step
                dist += abs(step) * (0.5 if col == 3 else 1.0)
            _load(conn, [tuple(r) for r in changed])
            moved = _one(conn, corner)
            for c0, c1 in zip(at, moved, strict=True):
                assert c0 <= math.exp(BETA * dist) * c1 * (1 + 1e-9) and c1 <= math.exp(BETA * dist) * c0 * (1 + 1e-9)


def test_a_scan_with_no_row_bounds_nothing(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        form = _form(pg_dsn, "SELECT SUM(t.a) FROM t")
        items = [*_items("t.a * t.x"), exp.Literal.number(2)]
        for corner in (False, True):
            q, _ = columns._extreme_query(form, items, [], lambda r: 1.0, corner=corner)
            assert all(v is None for v in _one(conn, q))  # as MAX over no rows: no bound, not the floor
        q, _ = columns._extreme_query(form, [exp.Literal.number(2)], [], lambda r: 1.0)
        assert _one(conn, q) == []
        _load(conn, [(0, 0, 1, 1.0, 0)])
        assert _one(conn, q) == [2.0]


def test_a_bound_that_is_not_monotone_in_its_leaves_is_scanned_row_by_row(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        form = _form(pg_dsn, "SELECT SUM(t.a) FROM t")
        signed = sqlglot.parse_one("t.a * 2", read="postgres")  # a signed column, not |a|
        for e in (signed, exp.Sub(this=exp.Literal.number(5), expression=exp.Abs(this=exp.column("a", "t")))):
            assert not columns._monotone(e)[0]
            q, flat = columns._extreme_query(form, [e], [], lambda r: 1.0, corner=True)
            # one aggregate row over the scan: the answer query can compute it in its own scan
            assert flat and "GROUP BY" not in q.sql() and "MAX(ABS" not in q.sql()


# -- the public envelope of a private filter ---------------------------------------------------------------


def _info(ref: ColumnRef) -> tuple[str, float | None, float, bool]:
    return ("integer", 1.0, 1.0, ref.column in WEIGHTS)


@pytest.mark.parametrize(
    ("cond", "expected"),
    [
        ("(t.p = 1 AND t.a > 2) OR (t.p = 2 AND t.x < 1)", "t.p = 1 OR t.p = 2"),
        ("t.p IN (1, 3) AND t.a BETWEEN 0 AND 2", "t.p IN (1, 3)"),
        ("(t.p = 1 AND t.a > 2) OR t.x < 1", None),  # a branch with no public part: any row may count
        ("NOT (t.p = 1 AND t.a > 2)", None),  # 1 − s is 1 where s is 0
        ("t.a > 2", None),
    ],
)
def test_the_envelope_of_a_filter(pg_dsn: str, cond: str, expected: str | None) -> None:
    e = sqlglot.parse_one(cond, read="postgres")
    env = envelope(e, _info)
    assert (None if env is None else env.sql(dialect="postgres").replace("(", "").replace(")", "")) == (
        None if expected is None else expected.replace("(", "").replace(")", "")
    )
    if env is None:
        return
    # oracle: wherever the envelope is false, the approximation is 0 for every value of the private columns
    s = approximate(e, lambda r: ("numeric", None, 1.0, r.column in WEIGHTS)).sql
    grid = "(VALUES (-3), (0), (1), (2), (3), (7)) AS g(v)"
    q = (
        f"SELECT MAX(ABS({s.sql(dialect='postgres')})) FROM (SELECT p.v AS p, a.v AS a, x.v AS x "
        f"FROM {grid.replace('g(v)', 'p(v)')}, {grid.replace('g(v)', 'a(v)')}, {grid.replace('g(v)', 'x(v)')}) AS t "
        f"WHERE NOT ({env.sql(dialect='postgres')})"
    )
    with psycopg.connect(pg_dsn) as conn:
        assert float(conn.execute(q).fetchone()[0]) == 0.0  # type: ignore[index]


# -- the answer query that also computes the one-row bounds -------------------------------------------------

QUERIES = [
    "SELECT SUM(t.a * t.x) FROM t WHERE t.c <= 2",  # exact step filter: FILTER clause in the merged scan
    "SELECT SUM(t.x) FROM t WHERE t.x > 1.5 AND t.p = 1",  # sigmoid: the answer is q_m
    "SELECT COUNT(*), AVG(t.a) FROM t WHERE (t.p = 1 AND t.a > 0) OR (t.p = 2 AND t.c < 2)",
    "SELECT t.p, SUM(t.a) FROM t WHERE t.c >= 1 GROUP BY t.p",  # grouped: not folded
    "SELECT MAX(t.x * t.a) FROM t WHERE t.p <> 0",
]


@pytest.mark.parametrize("query", QUERIES)
def test_folding_and_pipelining_do_not_change_the_analysis(
    pg_dsn: str, query: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        _load(conn, _rows(random.Random(query), 30))

    def results(session: sqldp.session.Session, *, parallel: bool) -> list[tuple]:
        prepared = session.prepare(query, epsilon=3.0, beta=BETA)
        prepared.speed.last = 10.0 if parallel else 0.0  # the mode the next run takes
        out = prepared.analyze()
        return [(m.true_value, m.sensitivity) for row in out.measurements for m in row]

    folded = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    prepared = folded.prepare(query, epsilon=3.0, beta=BETA)
    assert bool(prepared.statements.folded) == ("GROUP BY" not in query)
    want = results(folded, parallel=False)
    assert results(folded, parallel=True) == want
    monkeypatch.setattr(rewrite, "_fold", lambda form, answer, plans, catalog=None: (answer, {}))
    apart = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    assert not apart.prepare(query, epsilon=3.0, beta=BETA).statements.folded
    for got, expected in zip(results(apart, parallel=False), want, strict=True):
        assert got == pytest.approx(expected, rel=1e-12)
    folded.close()
    apart.close()


# -- a key-bounded fan-out instead of the GROUP BY per row (COUNT) ------------------------------------------

FANOUT_DDL = """
CREATE TABLE o (id INT PRIMARY KEY, pri INT, d INT);
CREATE TABLE l (ok INT, ln INT, c INT, PRIMARY KEY (ok, ln));
"""
O_L_POLICY = """
[tables.o]
rows = "public"
norm = "l1(d)"
[tables.l]
rows = "public"
norm = "l1(c)"
"""
FANOUT_POLICY = O_L_POLICY + "[tables.l.columns.ln]\nrange = [1, 3]\n"
FANOUT_QUERY = "SELECT COUNT(*) FROM o, l WHERE l.ok = o.id AND o.pri = 1 AND o.d >= 5 AND l.c < 2"


def test_an_order_has_at_most_as_many_lines_as_line_numbers(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NR §3.3.8.2: Σ_{r ∋ t} D(r) for a row t of o is D·#{r ∋ t}; with l's key (ok, ln) and ln in [1, 3],
    #{r ∋ t} ≤ 3 for any data once ``l.ln BETWEEN 1 AND 3`` is in the WHERE (rows outside it are not counted)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(FANOUT_DDL)
        conn.execute("INSERT INTO o VALUES (1, 1, 6), (2, 1, 4), (3, 0, 9)")
        conn.execute("INSERT INTO l VALUES (1, 1, 0), (1, 2, 5), (2, 1, 1), (2, 9, 1), (3, 1, 0), (3, 2, 0), (3, 3, 0)")
    policy = Policy.from_toml(FANOUT_POLICY)
    session = sqldp.connect(pg_dsn, policy=policy)
    prepared = session.prepare(FANOUT_QUERY, epsilon=1.0, beta=BETA)
    statements = prepared.statements
    assert "GROUP BY" not in " ".join(statements.queries) and "l.ln BETWEEN 1 AND 3" in statements.answer
    out = prepared.analyze()
    m = out.measurements[0][0]
    assert m.true_value == 1.0  # (1, 1, 0); (2, 9, 1) is outside ln's range and not counted
    # the GROUP BY path (no fan-out, no range conjunct): o's rows have 2 lines each in the scan, slope 1 each
    monkeypatch.setattr(columns, "_fanout", lambda form, start, public, catalog, bounded=None: None)
    exact = sqldp.connect(pg_dsn, policy=policy).analyze(FANOUT_QUERY, epsilon=1.0, beta=BETA)
    assert m.tables["o"]["value_sensitivity"] == pytest.approx(3.0)
    assert exact.measurements[0][0].tables["o"]["value_sensitivity"] == pytest.approx(2.0)


# -- the answer computed per group of the GROUP BY that bounds Σ_{r ∋ t} D(r) ------------------------------

JOIN_POLICY = O_L_POLICY + "[tables.l.columns.c]\nrange = [-4, 4]\n"
JOIN_QUERIES = [
    "SELECT SUM(l.c) FROM o, l WHERE l.ok = o.id AND o.pri = 1 AND o.d >= 5",  # private date-like filter
    "SELECT COUNT(*) FROM o, l WHERE l.ok = o.id AND o.d < 5 AND l.c > 0",
    "SELECT AVG(l.c), COUNT(l.c) FROM o, l WHERE l.ok = o.id AND o.pri <> 1 AND o.d BETWEEN 2 AND 6",
    "SELECT COUNT(*) FROM o, l WHERE l.ok = o.id AND o.pri = 7 AND o.d > 2",  # no row: COUNT 0, not NULL
]


@pytest.mark.parametrize("query", JOIN_QUERIES)
def test_the_answer_computed_per_group_is_the_answer(pg_dsn: str, query: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The grouped fold (rewrite._per_group) re-aggregates the answer's SUM/COUNT/MIN/MAX over the groups of
    the per-row bound query: same answers and bounds as the queries run apart."""
    rng = random.Random(query)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(FANOUT_DDL)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO o VALUES (%s, %s, %s)", [(i, rng.randint(0, 2), rng.randint(0, 9)) for i in range(12)]
            )
            cur.executemany(
                "INSERT INTO l VALUES (%s, %s, %s)",
                [(i, n, rng.randint(-4, 4)) for i in range(12) for n in range(rng.randint(0, 4))],
            )
    policy = Policy.from_toml(JOIN_POLICY)

    def results(session: sqldp.session.Session) -> list[tuple]:
        out = session.analyze(query, epsilon=3.0, beta=BETA)
        return [(m.true_value, m.sensitivity) for row in out.measurements for m in row]

    one = sqldp.connect(pg_dsn, policy=policy)
    prepared = one.prepare(query, epsilon=3.0, beta=BETA)
    # the GROUP BY per row of o is the answer's scan; only l's constant bound (LIMIT 1) runs apart
    statements = prepared.statements
    assert "GROUP BY o.id" in statements.answer and all("GROUP BY" not in q for q in statements.queries)
    want = results(one)
    monkeypatch.setattr(rewrite, "_fold", lambda form, answer, plans, catalog=None: (answer, {}))
    apart = sqldp.connect(pg_dsn, policy=policy)
    assert apart.prepare(query, epsilon=3.0, beta=BETA).statements.queries
    got = results(apart)
    assert [g[0] for g in got] == [w[0] for w in want]  # the answers: exact (integer sums)
    for g, w in zip(got, want, strict=True):
        assert g[1] == pytest.approx(w[1], rel=1e-12)
    if "pri = 7" in query:
        assert want[0][0] == 0.0
    one.close()
    apart.close()


def test_an_aggregate_that_does_not_add_up_over_groups_is_not_folded() -> None:
    merged = sqlglot.parse_one("SELECT COUNT(DISTINCT l.c) FROM o CROSS JOIN l WHERE l.ok = o.id", read="postgres")
    per_row = sqlglot.parse_one(
        "SELECT MAX(s0) AS v0 FROM (SELECT SUM(1) AS s0 FROM o CROSS JOIN l WHERE l.ok = o.id GROUP BY o.id) AS pr",
        read="postgres",
    )
    assert rewrite._per_group(merged, [(0, per_row)]) is None
    merged = sqlglot.parse_one("SELECT SUM(l.c) FILTER (WHERE o.d > 1), MAX(l.c) FROM o CROSS JOIN l WHERE l.ok = o.id")
    two = rewrite._per_group(merged, [(0, per_row)])
    assert two is not None
    sql = two.sql(dialect="postgres")
    assert "SUM(__g0)" in sql and "MAX(__g1)" in sql and "MAX(__p0_s0) AS __s0_0" in sql and "GROUP BY o.id" in sql


# -- a centred SUM(x − m) computed from SUM(x) and COUNT(x) (rewrite.centred) ----------------------------------

CENTRED_DDL = "CREATE TABLE v (id INT PRIMARY KEY, g INT, a INT, x NUMERIC(6,2), f DOUBLE PRECISION)"
CENTRED_POLICY = """
[tables.v]
rows = "private"
[tables.v.columns.g]
domain = [0, 1, 2]
[tables.v.columns.a]
range = [-5, 7]
[tables.v.columns.x]
range = [-40, 41.5]
[tables.v.columns.f]
range = [0, 1]
"""
CENTRED_QUERY = "SELECT g, AVG(a), SUM(a), AVG(x), VAR_POP(x), AVG(f), COUNT(*) FROM v GROUP BY g"


def test_a_centred_sum_is_the_sum_less_the_centre_times_the_count(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """AVG(a) and VAR_POP(x) measure SUM(a − m) (sqldp.aggregates); the answer computes it as SUM(a) − m·COUNT(a)
    for integer and NUMERIC columns, never for a float one (its subtraction rounds). Oracle: the answer with the
    rule switched off, on data with NULLs (which COUNT(a) must skip as SUM does) and values outside the ranges
    (which the clamps move)."""
    rng = random.Random(7)
    rows = [
        (
            i,
            rng.randint(0, 2),
            None if i % 5 == 0 else rng.randint(-9, 9),
            None if i % 7 == 0 else round(rng.uniform(-60, 60), 2),
            None if i % 3 == 0 else rng.uniform(-0.5, 1.5),
        )
        for i in range(60)
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(CENTRED_DDL)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO v VALUES (%s, %s, %s, %s, %s)", rows)
    policy = Policy.from_toml(CENTRED_POLICY)

    def answers(session: sqldp.session.Session) -> tuple[str, list[Any]]:
        prepared = session.prepare(CENTRED_QUERY, epsilon=1.0)
        out = prepared.analyze()
        return prepared.statements.answer, [m.true_value for row in out.measurements for m in row]

    text, got = answers(sqldp.connect(pg_dsn, policy=policy))
    assert " - 1 * COUNT(v.a)" in text and " - 0.75 * COUNT(v.x)" in text  # AVG(a) and AVG(x)/VAR_POP(x)
    assert "COUNT(v.f)) AS" not in text.replace("COUNT(v.f) AS", "")  # AVG(f): the float's own SUM(f − 0.5)
    assert "v.f END - 0.5" in text
    rules = tuple(r for r in rewrite.ANSWER_RULES if r is not rewrite.centred)
    monkeypatch.setattr(rewrite, "ANSWER_RULES", rules)
    plain_text, want = answers(sqldp.connect(pg_dsn, policy=policy))
    assert "* COUNT(" not in plain_text
    assert got == want
    # the data leaves the ranges and has NULLs: the comparison above is not vacuous
    assert any(r[2] is None for r in rows) and any(r[3] is not None and abs(r[3]) > 41.5 for r in rows)


# -- clamps a validated CHECK constraint makes idle (rewrite.unclamp, Catalog.checked) -------------------------

CHECKED_DDL = """
CREATE TABLE w (id INT PRIMARY KEY, g INT, a INT CHECK (a BETWEEN -5 AND 7), x NUMERIC(6,2), y NUMERIC(6,2),
                z INT, f DOUBLE PRECISION CHECK (f >= 0 AND f <= 1));
ALTER TABLE w ADD CONSTRAINT x_low CHECK (x >= -10);
ALTER TABLE w ADD CONSTRAINT x_high CHECK (x < 10.5);
ALTER TABLE w ADD CONSTRAINT y_wide CHECK (y BETWEEN -100 AND 100);
ALTER TABLE w ADD CONSTRAINT z_low CHECK (z >= 0);
ALTER TABLE w ADD CONSTRAINT z_pair CHECK (z <= id);
"""
CHECKED_POLICY = """
[tables.w]
rows = "private"
[tables.w.columns.g]
domain = [0, 1]
[tables.w.columns.a]
range = [-5, 7]
[tables.w.columns.x]
range = [-10, 10.5]
[tables.w.columns.y]
range = [-50, 50]
[tables.w.columns.z]
range = [0, 3]
[tables.w.columns.f]
range = [0, 1]
"""
CHECKED_QUERY = "SELECT g, SUM(a), SUM(x), SUM(y), SUM(z), SUM(f), AVG(x) FROM w GROUP BY g"


def test_checked_interval_reads_postgresql_s_own_definitions() -> None:
    from decimal import Decimal

    from sqldp.catalog import checked_interval

    d = Decimal
    assert checked_interval("CHECK (((q >= (1)::numeric) AND (q <= (50)::numeric)))", "q") == (d(1), d(50))
    balance = "CHECK (((b >= '-999.99'::numeric) AND (b <= 9999.99)))"
    assert checked_interval(balance, "b") == (d("-999.99"), d("9999.99"))
    assert checked_interval("CHECK ((a > 0))", "a") == (d(0), None)
    assert checked_interval("CHECK ((5 >= a))", "a") == (None, d(5))
    assert checked_interval("CHECK ((a = 0))", "a") == (d(0), d(0))
    assert checked_interval("CHECK (((a >= 1) AND (a <= 7) AND (a < 5)))", "a") == (d(1), d(5))
    # a DDL file's CHECK is a claim: not read
    assert sqldp.catalog.Catalog.from_ddl(CHECKED_DDL).table("w").column("a").checked is None
    for other in (
        "CHECK (((a >= 1) OR (a <= 5)))",
        "CHECK ((a > b))",
        "CHECK (((a)::numeric <= 3))",
        "CHECK ((abs(a) <= 3))",
        "CHECK (((a >= 'NaN'::numeric)))",
        "CHECK ((b <= 3))",
    ):
        assert checked_interval(other, "a") is None, other


def test_a_clamp_a_check_constraint_enforces_is_left_out(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """a's and x's CHECKs are the declared ranges (x's from two constraints, one strict): no clamp. y's CHECK is
    wider than its range: the clamp stays and moves the values outside [−50, 50]. z is checked below only (its
    other CHECK reads two columns): only the upper branch stays. f is a float: PostgreSQL's CHECK is not read.
    Oracle: the same answers with the rule switched off; and y's sum is not the raw sum (its clamp works)."""
    rng = random.Random(11)
    rows = [
        (
            i,
            i % 2,
            rng.randint(-5, 7),
            round(rng.uniform(-10, 10.49), 2),
            round(rng.uniform(-100, 100), 2),
            rng.randint(0, min(i, 9)),
            None if i % 4 == 0 else rng.random(),
        )
        for i in range(40)
    ]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(CHECKED_DDL)
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO w VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)
        conn.execute("ALTER TABLE w ADD CONSTRAINT y_unchecked CHECK (y <= 50) NOT VALID")  # not validated: unused
        catalog = sqldp.catalog.Catalog.from_database(conn)
    columns_ = catalog.table("w").columns
    assert columns_["y"].checked is not None and columns_["f"].checked is None and columns_["g"].checked is None
    assert columns_["z"].checked == (0, None)
    policy = Policy.from_toml(CHECKED_POLICY)

    def answers() -> tuple[str, list[Any]]:
        prepared = sqldp.connect(pg_dsn, policy=policy).prepare(CHECKED_QUERY, epsilon=1.0)
        out = prepared.analyze()
        return prepared.statements.answer, [m.true_value for row in out.measurements for m in row]

    text, got = answers()
    assert "SUM(CAST(w.a AS DECIMAL))" in text and "SUM(CAST(w.x AS DECIMAL))" in text
    assert "WHEN w.y < -50 THEN -50 WHEN w.y > 50 THEN 50 ELSE w.y END" in text
    assert "CASE WHEN w.z > 3 THEN 3 ELSE w.z END" in text and "w.z < 0" not in text
    assert "WHEN w.f < 0 THEN 0" in text
    monkeypatch.setattr(rewrite, "ANSWER_RULES", tuple(r for r in rewrite.ANSWER_RULES if r is not rewrite.unclamp))
    plain_text, want = answers()
    assert "WHEN w.a < -5" in plain_text
    assert got == want
    raw_y = sum(r[4] for r in rows if r[1] == 0)
    assert any(abs(r[4]) > 50 for r in rows) and got[2] != pytest.approx(float(raw_y))


def test_only_a_clamp_counts_as_its_column() -> None:
    """COUNT(x) stands for COUNT(clamp(c)) in ``centred`` only where the CASE is NULL exactly where c is."""

    def case(text: str) -> exp.Expr:
        return sqlglot.parse_one(text, read="postgres")

    assert rewrite._unclamped(case("CASE WHEN t.a < 1 THEN 1 WHEN t.a > 5 THEN 5 ELSE t.a END")).sql() == "t.a"
    assert rewrite._unclamped(case("CASE WHEN t.a > 5 THEN 5 ELSE t.a END")).sql() == "t.a"
    for other in (
        "CASE WHEN t.a < 0 THEN NULL ELSE t.a END",  # NULL where a is not
        "CASE WHEN t.a < 1 THEN 2 ELSE t.a END",
        "CASE WHEN t.b < 1 THEN 1 ELSE t.a END",
        "CASE WHEN t.a < t.b THEN t.b ELSE t.a END",  # t.b may be NULL
    ):
        assert rewrite._unclamped(case(other)).sql() == case(other).sql(), other
