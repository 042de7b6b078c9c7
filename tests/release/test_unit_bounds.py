"""Declared contribution bounds under a privacy unit (sqldp.sensitivity.unit_bounds, docs/units.md, "Declared
bounds on a unit's rows"): Laplace at the bound instead of R2T's race, checked by the exact privacy loss over
every unit neighbour of a tiny database on real PostgreSQL.

c (ck PRIMARY KEY, v) is the unit's table, so one row per unit; o (ok PRIMARY KEY, ck → c, x, g) declares
``max_rows_per = { ck = 2 }``, which the query enforces by truncation. Unit 1 owns three orders on the base
database, so the truncation cuts one and removing unit 1 moves the untruncated COUNT by 3. For every neighbour
(a unit removed with all its rows, or one of a few new units added, one with three orders), the released laws
on both sides are the exact ones the sampler draws from (``cell_probability`` on the release grid, summed over
an answer's independent measurements), and their largest log-ratio is compared with ε.

Mutants the checks catch (each run here against the code with the mutation patched in): the declared bound
used without the truncation (as if ``max_rows_per`` held by itself: unit 1's three orders move COUNT by 3 at a
scale of 2), and a bound one row too small (N − 1).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from oracles import units_added, units_removed
from test_global_mechanism import _loss

import sqldp
from sqldp import mechanisms
from sqldp.policy import Policy
from sqldp.result import GLOBAL, R2T
from sqldp.sensitivity import unit_bounds

EPS = 1.0
DDL = (
    "CREATE TABLE c (ck INT PRIMARY KEY, v INT NOT NULL);"
    "CREATE TABLE o (ok INT PRIMARY KEY, ck INT NOT NULL REFERENCES c (ck), x INT NOT NULL, g INT NOT NULL);"
)
POLICY = """
[defaults]
epsilon = 1.0
[units.c]
key = "ck"
[tables.c.columns.v]
range = [-2, 6]
[tables.o]
max_rows_per = { ck = 2 }
[tables.o.columns.x]
range = [0, 4]
[tables.o.columns.g]
domain = [0, 1]
"""
BASE: dict[str, list[tuple[int, ...]]] = {
    "c": [(1, 5), (2, -2)],
    "o": [(10, 1, 4, 0), (11, 1, 3, 1), (12, 1, 4, 1), (13, 2, 1, 0)],
}
LINKS = {"c": 0, "o": 1}
NEW_UNITS: list[dict[str, list[tuple[int, ...]]]] = [
    {"c": [(3, 6)], "o": [(20, 3, 4, 1), (21, 3, 4, 1), (22, 3, 4, 0)]},  # three orders: one cut
    {"c": [(4, -2)], "o": []},
    {"c": [(5, 0)], "o": [(23, 5, 0, 0)]},
]


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(DDL)
        yield c


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, ...]]]) -> None:
    conn.execute("DELETE FROM o")
    conn.execute("DELETE FROM c")
    for table in ("c", "o"):
        for row in db[table]:
            conn.execute(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(row))})", row)


def _neighbours() -> Iterator[Any]:
    yield from units_removed(BASE, LINKS, [1, 2])
    yield from units_added(BASE, NEW_UNITS)


Released = list[tuple[float, float, int]]


def _release(session: sqldp.session.Session, sql: str) -> tuple[Released, set[str], list[float]]:
    """Per group and aggregate: (true value, scale, grid), the mechanisms and the sensitivities."""
    r = session.analyze(sql, audit=True)
    out, mechs, sens = [], set(), []
    for group in r.measurements:
        for m in group:
            assert m.true_value is not None
            out.append((m.true_value, m.noise_scale, mechanisms.GRID_EXPONENT))
            mechs.add(str(m.mechanism))
            sens.append(m.sensitivity)
    return out, mechs, sens


def _worst(conn: psycopg.Connection, pg_dsn: str, sql: str) -> float:
    """The largest exact privacy loss of the answer's measurements over every unit neighbour of BASE."""
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    _load(conn, BASE)
    base, _, _ = _release(session, sql)
    worst = 0.0
    for n in _neighbours():
        _load(conn, n.db)
        other, _, _ = _release(session, sql)
        assert [s for _, s, _ in other] == [s for _, s, _ in base]  # the scales do not depend on the rows
        worst = max(worst, sum(_loss(a, b) for a, b in zip(base, other, strict=True)))
    return worst


CASES = [
    ("SELECT COUNT(*) FROM c", [1.0]),  # the unit's own table: one row per unit
    ("SELECT SUM(c.v) FROM c WHERE c.v > -1", [6.0]),  # max(|−2|, |6|): a row removed, never exchanged
    ("SELECT COUNT(*) FROM o", [2.0]),  # max_rows_per: two orders per unit, read truncated
    ("SELECT SUM(o.x) FROM c, o WHERE c.ck = o.ck AND c.v > 0", [8.0]),  # 2 join rows of ≤ 4
    ("SELECT AVG(o.x) FROM o", [4.0, 2.0]),  # centred SUM(x − 2): 2·2, and COUNT: 2
    ("SELECT o.g, COUNT(*) FROM o GROUP BY o.g", [2.0, 2.0]),  # ℓ1 over the groups: 2, full ε on each
]


@pytest.mark.parametrize(("sql", "bounds"), CASES)
def test_every_unit_neighbour_is_within_epsilon(
    conn: psycopg.Connection, pg_dsn: str, sql: str, bounds: list[float]
) -> None:
    """Mutant: the bound of a unit's rows from ``max_rows_per`` without reading o truncated, or N − 1 (below)."""
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    _load(conn, BASE)
    _, mechs, sens = _release(session, sql)
    assert mechs == {str(GLOBAL)} and sens == bounds
    assert session.analyze(sql).notes[-1].startswith("unit c: at most")  # the note says which bound, and why
    worst = _worst(conn, pg_dsn, sql)
    assert 0.5 * EPS < worst <= EPS * (1 + 1e-9)


def test_the_truncated_answer_is_pythons(conn: psycopg.Connection, pg_dsn: str) -> None:
    """The released COUNT and SUM are over o with at most two orders per unit (the first two by o's key, the
    truncation's order), on the base database and every neighbour."""
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    for db in (BASE, *(n.db for n in _neighbours())):
        _load(conn, db)
        kept: list[tuple[int, ...]] = []
        for ck in {row[1] for row in db["o"]}:
            kept += sorted(r for r in db["o"] if r[1] == ck)[:2]
        r = session.analyze("SELECT COUNT(*), SUM(o.x) FROM o", audit=True).measurements[0]
        assert [m.true_value for m in r] == [len(kept), sum(row[2] for row in kept)]


@pytest.mark.parametrize(
    ("mutant", "sql"),
    [
        ("untruncated", "SELECT COUNT(*) FROM o"),
        ("one too small", "SELECT COUNT(*) FROM o"),
        ("one too small", "SELECT COUNT(*) FROM c"),
    ],
)
def test_mutants_exceed_epsilon(
    conn: psycopg.Connection, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, mutant: str, sql: str
) -> None:
    """The checks above fail for the code with a mutation: the declared τ used with nothing truncated, or a
    bound of one join row fewer (a COUNT of c at a bound of 0 cannot be released: the smallest is 1/2 there)."""
    rows = unit_bounds.join_rows
    if mutant == "untruncated":
        monkeypatch.setattr(unit_bounds, "unit_truncations", lambda *a: ())
        monkeypatch.setattr(unit_bounds, "join_rows", lambda plan, catalog, cuts: 2.0)
    else:
        monkeypatch.setattr(unit_bounds, "join_rows", lambda *a: max(0.5, rows(*a) - 1))
    assert _worst(conn, pg_dsn, sql) > EPS * 1.4


def test_without_a_declared_bound_the_race_runs(pg_dsn: str, conn: psycopg.Connection) -> None:
    """A table with no ``max_rows_per`` on its foreign key to the unit has no bound on a unit's rows: R2T."""
    policy = POLICY.replace("max_rows_per = { ck = 2 }", "")
    session = sqldp.connect(pg_dsn, Policy.from_toml(policy))
    _load(conn, BASE)
    assert session.analyze("SELECT COUNT(*) FROM o", audit=True).measurements[0][0].mechanism == R2T
    assert session.analyze("SELECT COUNT(*) FROM c", audit=True).measurements[0][0].mechanism == GLOBAL


def test_the_aggregates_of_a_query_agree(pg_dsn: str, conn: psycopg.Connection) -> None:
    """A GROUP BY's COUNT takes the declared bound (2 ≤ 5.5/0.8) but its SUM of x ≤ 4 would not (8 > 6.9): they
    share one answer query, so both race (the truncated histogram), rather than an internal error. Mutant: the
    per-aggregate choice kept (the answer query then mixes a histogram plan and a global one)."""
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    _load(conn, BASE)
    r = session.analyze("SELECT o.g, COUNT(*), SUM(o.x) FROM o GROUP BY o.g", audit=True)
    assert {str(m.mechanism) for group in r.measurements for m in group} == {"r2t-histogram"}
    alone = session.analyze("SELECT o.g, COUNT(*) FROM o GROUP BY o.g", audit=True)
    assert {m.mechanism for group in alone.measurements for m in group} == {GLOBAL}


def test_the_error_is_at_the_declared_bounds_scale(pg_dsn: str, conn: psycopg.Connection) -> None:
    """COUNT(*) of 1,000 units' rows (one row each) in test mode (seeded): 400 released counts are Laplace at
    1/ε rounded, median |error| ≈ ln 2 and 99th percentile ≈ ln 100 = 4.6, where R2T's race (the same query
    with the declared path removed) has a noise scale of 10⁶-odd on its top race (the issue's 1.35·10⁶ at its
    99th percentile). Mutant: the race kept — its errors are two orders of magnitude larger."""
    conn.execute("INSERT INTO c SELECT i, 0 FROM generate_series(1, 1000) i")
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=20261202)
    errors = []
    for _ in range(400):
        r = session.run("SELECT COUNT(*) AS n FROM c", epsilon=EPS)
        errors.append(abs(float(r.rows[0]["values"]["n"]) - 1000))
    errors.sort()
    assert 0.3 <= statistics.median(errors) <= 1.2  # ln 2 ≈ 0.69 (rounded to whole counts)
    assert errors[int(0.99 * len(errors))] <= 2 * math.log(100) / EPS
    m = session.analyze("SELECT COUNT(*) FROM c", audit=True).measurements[0][0]
    assert m.mechanism == GLOBAL and m.noise_scale == 1.0 / EPS
