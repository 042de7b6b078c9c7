"""Laplace at c/ε when the bound is data-independent (a global sensitivity), checked against brute force.

On tiny databases (real PostgreSQL), every neighbour that adds or removes one private row is built; the
released distribution on each side is the exact one the sampler draws from (``cell_probability``), and the
largest |ln P_D(k) − ln P_D′(k)| over the printed values is compared with ε. Mutants this catches: a bound
that ignores the public join's key frequency, any smoothing dropped from a data-dependent plan that is
wrongly called global (a self-join or a private ⋈ private join must stay generalized Cauchy)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import psycopg
import pytest
from oracles import max_log_ratio, product_rows, row_neighbours

import sqldp
from sqldp import aggregates, mechanisms
from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.sensitivity import plan

DDL = "CREATE TABLE r (a INT, b INT); CREATE TABLE s (b INT, c INT); CREATE TABLE p (b INT, d INT);"
POLICY = """
[defaults]
epsilon = 1.0
[tables.r.columns.a]
range = [0, 2]
[tables.s]
[tables.p]
rows = "public"
"""
DOMAIN = (0, 1, 2)
EPS = 1.0


def _plan(sql: str) -> object:
    catalog = Catalog.from_ddl(DDL)
    policy = Policy.from_toml(POLICY)
    return plan(normalize(parse(sql, catalog), catalog, policy), catalog, policy)


@pytest.mark.parametrize(
    ("sql", "independent"),
    [
        ("SELECT COUNT(*) FROM r", True),
        ("SELECT SUM(r.a) FROM r WHERE r.b > 0", True),
        ("SELECT COUNT(*) FROM r, p WHERE r.b = p.b", True),  # the derivative counts public rows only
        ("SELECT COUNT(*) FROM r, s WHERE r.b = s.b", False),  # r's derivative counts private s rows
        ("SELECT COUNT(*) FROM r r1, r r2 WHERE r1.b = r2.b", False),  # a self-join
    ],
)
def test_data_independence_follows_the_shape(sql: str, independent: bool) -> None:
    assert _plan(sql).data_independent is independent  # type: ignore[attr-defined]


@pytest.fixture
def session(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, int]]]) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", row)


def _release(session: sqldp.session.Session, sql: str) -> tuple[float, float, int, str]:
    m = session.analyze(sql, audit=True).measurements[0][0]
    assert m.true_value is not None
    return m.true_value, m.noise_scale, mechanisms.GRID_EXPONENT, m.mechanism


def _loss(x: tuple[float, float, int], y: tuple[float, float, int]) -> float:
    """The exact max |ln P_x(k) − ln P_y(k)| over printed values k on the release grid: the cells holding and
    next to either centre, 400 cells evenly between 3 scales below and above them, and tail cells out to 60
    scales (for Laplace the ratio is monotone between the centres and constant beyond both)."""
    (f1, s1, g), (f2, s2, g2) = x, y
    assert g == g2
    unit = 2.0**g
    lo, hi = min(f1, f2) - 3 * max(s1, s2), max(f1, f2) + 3 * max(s1, s2)
    points = [lo + (hi - lo) * i / 399 for i in range(400)]
    points += [c + d * s1 for c in (f1, f2) for d in (-60, -10, -1e-9, 0, 1e-9, 10, 60)]
    cells = sorted({round(v / unit) for v in points})

    def law(f: float, s: float) -> dict[int, object]:
        return {k: mechanisms.cell_probability("laplace", f, s, k, grid_exponent=g)[0] for k in cells}

    return max_log_ratio(law(f1, s1), law(f2, s2))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM r",
        "SELECT COUNT(*) FROM r, p WHERE r.b = p.b",
        "SELECT SUM(r.a) FROM r, p WHERE r.b = p.b AND p.d > 0",
    ],
)
def test_every_neighbour_is_within_epsilon(session: tuple[sqldp.session.Session, psycopg.Connection], sql: str) -> None:
    s, conn = session
    # p has a join key twice: one added r row then moves a COUNT by 2, which the bound must cover
    base = {"r": [(1, 0), (2, 1)], "s": [], "p": [(0, 1), (0, 1), (1, 0), (2, 1)]}
    _load(conn, base)
    f, scale, grid, mech = _release(s, sql)
    assert mech == GLOBAL
    worst = 0.0
    moved = 0.0
    for n in row_neighbours(base, {"r": product_rows(DOMAIN, DOMAIN)}):  # one r row removed or added
        _load(conn, n.db)
        f2, scale2, grid2, mech2 = _release(s, sql)
        assert mech2 == GLOBAL and scale2 == scale  # the scale does not depend on the private rows
        moved = max(moved, abs(f2 - f))
        worst = max(worst, _loss((f, scale, grid), (f2, scale2, grid2)))
    assert worst <= EPS * (1 + 1e-9)
    assert moved > 0 and worst > 0.5 * EPS  # the neighbours do use the budget


def test_count_is_released_at_scale_one_over_epsilon(
    session: tuple[sqldp.session.Session, psycopg.Connection],
) -> None:
    s, conn = session
    _load(conn, {"r": [(0, 0)] * 7, "s": [], "p": []})
    out = s.run("SELECT COUNT(*) FROM r", audit=True)
    m = out.measurements[0][0]
    assert (m.mechanism, m.noise_scale, m.beta, m.delta) == (GLOBAL, 1.0 / EPS, 0.0, None)
    j = out.to_json(audit=False)
    assert j["mechanism"] == GLOBAL and j["measurements"][0][0]["mechanism"] == GLOBAL
    # a data-independent scale and error bar are shown to analysts too (a smoothed one never is)
    assert j["measurements"][0][0]["noise_scale"] == 1.0
    assert j["measurements"][0][0]["half_width"] == pytest.approx(-math.log(1 - 0.78))
    smoothed = s.run("SELECT COUNT(*) FROM r, s WHERE r.b = s.b").to_json()["measurements"][0][0]
    assert "noise_scale" not in smoothed and "half_width" not in smoothed
    # a private ⋈ private join stays smoothed (generalized Cauchy): its bound depends on the data
    assert s.analyze("SELECT COUNT(*) FROM r, s WHERE r.b = s.b", audit=True).measurements[0][0].mechanism == "cauchy"


def test_a_histogram_over_a_public_key_is_within_epsilon_in_l1(
    session: tuple[sqldp.session.Session, psycopg.Connection],
) -> None:
    """GROUP BY a public column: one private row may reach several groups (p.b = 0 twice, with different d),
    so the groups are not disjoint; with a global bound every group still gets the full ε because the bound
    covers Σ_g |Δ_g|. The joint loss of the released vector, Σ_g |f_g − f′_g|/s for Laplace noise of one
    scale (attained in the tails; the grid rounding can only lower it), stays within ε over every neighbour.
    Fails if the bound were per group only (c = 1 here, while one row moves the histogram by 2 in ℓ1)."""
    s, conn = session
    sql = "SELECT p.d, COUNT(*) FROM r, p WHERE r.b = p.b GROUP BY p.d"
    base = {"r": [(1, 0), (2, 1)], "s": [], "p": [(0, 1), (0, 2), (1, 2)]}

    def release() -> tuple[list[float], float]:
        out = s.analyze(sql, audit=True)
        ms = [g[0] for g in out.measurements]
        assert {m.mechanism for m in ms} == {GLOBAL} and {m.epsilon for m in ms} == {EPS}
        assert len({m.noise_scale for m in ms}) == 1
        return [m.true_value or 0.0 for m in ms], ms[0].noise_scale

    _load(conn, base)
    f, scale = release()
    assert len(f) == 2  # the public domain of p.d: {1, 2}
    worst = 0.0
    for n in row_neighbours(base, {"r": product_rows(DOMAIN, DOMAIN)}):
        _load(conn, n.db)
        f2, scale2 = release()
        assert scale2 == scale
        worst = max(worst, sum(abs(a - b) for a, b in zip(f, f2, strict=True)) / scale)
    assert 0.5 * EPS < worst <= EPS * (1 + 1e-12)


def test_a_key_bounded_join_uses_the_schemas_global_sensitivity(pg_dsn: str) -> None:
    """NR §3.3.13 from the database's own PRIMARY KEY: a self-join on the key changes one join row per added
    or removed row on every database, so the release is Laplace at 1/ε, checked over every neighbour that
    keeps the key (PostgreSQL rejects the others). Joining on a non-key column stays data-dependent."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE k (id INT PRIMARY KEY, g INT NOT NULL)")
        s = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n[tables.k]\n"))
        sql = "SELECT COUNT(*) FROM k a, k b WHERE a.id = b.id AND a.g > 0"
        base = [(1, 1), (2, 0), (3, 2)]

        def load(rows: list[tuple[int, int]]) -> tuple[float, float, int, str]:
            conn.execute("DELETE FROM k")
            for row in rows:
                conn.execute("INSERT INTO k VALUES (%s, %s)", row)
            return _release(s, sql)

        f, scale, grid, mech = load(base)
        assert (mech, scale) == (GLOBAL, 1.0 / EPS)
        worst = 0.0
        for n in row_neighbours({"k": base}, {"k": [(4, g) for g in (0, 1, 2)]}):
            f2, scale2, _, mech2 = load(n.db["k"])
            assert (mech2, scale2) == (GLOBAL, scale)
            worst = max(worst, _loss((f, scale, grid), (f2, scale2, grid)))
        assert 0.5 * EPS < worst <= EPS * (1 + 1e-9)
        load(base)
        other = s.analyze("SELECT COUNT(*) FROM k a, k b WHERE a.g = b.g", audit=True).measurements[0][0]
        assert other.mechanism == "cauchy"


def test_keys_from_a_schema_file_are_not_trusted() -> None:
    """A schema file's PRIMARY KEY is a claim nothing checks the data against: no global bound from it."""
    catalog = Catalog.from_ddl("CREATE TABLE k (id INT PRIMARY KEY, g INT NOT NULL);")
    policy = Policy.from_toml("[tables.k]\n")
    form = normalize(parse("SELECT COUNT(*) FROM k a, k b WHERE a.id = b.id", catalog), catalog, policy)
    assert not catalog.enforced and not plan(form, catalog, policy).data_independent  # type: ignore[union-attr]
    trusted = dataclasses.replace(catalog, enforced=True)
    assert plan(form, trusted, policy).data_independent  # type: ignore[union-attr]


def test_text_output_shows_a_data_independent_error_bar_only(
    session: tuple[sqldp.session.Session, psycopg.Connection],
) -> None:
    from sqldp.commands.analyze import format_text

    s, conn = session
    _load(conn, {"r": [(0, 0)] * 7, "s": [(0, 0)], "p": []})
    text = format_text(s.run("SELECT COUNT(*) FROM r").to_json())
    answer = next(line for line in text.splitlines() if line.startswith("answer = "))
    # −ln(0.22)/ε = 1.514 at ε = 1, plus 0.5 for the rounding of the count (sqldp.aggregates.counted)
    assert answer.endswith("± 2.0 (78% confidence)")
    smoothed = format_text(s.run("SELECT COUNT(*) FROM r, s WHERE r.b = s.b").to_json())
    # the answer has no bar; the footnote says why ("no ± bar: … computed from the data")
    assert "±" not in next(line for line in smoothed.splitlines() if line.startswith("answer = "))
    assert "no ± bar" in smoothed
    # a GROUP BY result is a psql-like table: header, rule, aligned rows (numbers to the right), row count
    _load(conn, {"r": [(0, 0)] * 7, "s": [], "p": [(0, 1), (0, 22)]})
    grouped = format_text(s.run("SELECT p.d AS d, COUNT(*) AS n FROM r, p WHERE r.b = p.b GROUP BY p.d").to_json())
    assert grouped.splitlines()[-1] == f"note: {aggregates.COUNT_NOTE}"  # the notes follow the table
    table = [line for line in grouped.splitlines() if not line.startswith("note: ")][-5:]
    assert table[0].split("|")[0].strip() == "d" and table[0].split("|")[1].strip() == "n"
    assert set(table[1]) == {"-", "+"} and table[-1] == "(2 rows)"
    assert [line.split("|")[0].strip() for line in table[2:4]] == ["1", "22"]
    assert len({len(line) for line in table[:4]}) == 1  # aligned
