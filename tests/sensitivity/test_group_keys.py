"""Group keys derived from a value-sensitive date, and CASE over non-sensitive conditions, under value-level
privacy (NR §3.3.8), against brute force over neighbouring databases on PostgreSQL.

* ``GROUP BY EXTRACT(YEAR FROM d)`` with d in the norm: a change of d
  moves a row between two groups. Each group's answer is the aggregate with an exact step filter on d added
  (sqldp.sensitivity.columns._group_slopes), so one bound c(x) must cover every group: for every neighbour x′
  (one value of one row changed by a step of its grid, or a row added or removed when rows are private) and
  every group g, |f_g(x′) − f_g(x)| ≤ e^(β‖x′−x‖)·c(x)·‖x′ − x‖ (NR Lemma 3.78; with rows, ≤ c(x) per row,
  NR §3.3.9). f_g is PostgreSQL's own answer to the plain query, not sqldp's, so the oracle is independent of
  the analysis; the dates sit around a year's first day, where rows cross between groups.
* ``CASE WHEN <non-sensitive condition> THEN e1 ELSE e2 END`` inside SUM: the same oracle.
* The whole histogram: Σ_g |f_g(x′) − f_g(x)| ≤ h·e^(β‖x′−x‖)·c(x)·‖x′ − x‖ with h the plan's histogram factor
  (2 when a changed d moves a row between two groups, else 1), which the one generalized-Cauchy release of
  all groups relies on (sqldp.release.dilated).
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import random
import zlib
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import psycopg
import pytest
from oracles import row_neighbours, values_changed

import sqldp
from sqldp.errors import RefusedError
from sqldp.mechanisms import GAMMA
from sqldp.policy import Policy
from sqldp.release import histogram_factor

DDL = """
CREATE TABLE t (id INT PRIMARY KEY, k INT, a INT, x NUMERIC(6,2), d DATE);
CREATE TABLE u (id INT PRIMARY KEY, k INT, b INT);
"""


def _policy(rows: str, extra: str = "") -> Policy:
    return Policy.from_toml(
        f"""
[tables.t]
rows = "{rows}"
norm = "l1(a, 0.5*x, linf(d))"
[tables.t.columns.d]
range = ["2019-06-01", "2021-06-30"]
[tables.t.columns.x]
range = [0, 4]
[tables.t.columns.k]
domain = [0, 1, 2]
[tables.t.columns.a]
range = [-2, 6]
domain = [-2, -1, 0, 1, 2, 3, 4, 5, 6]
[tables.u]
rows = "public"
norm = "l2(b)"
[tables.u.columns.b]
range = [-2, 5]
{extra}"""
    )


BETA = 0.1
BASE = dt.date(2019, 12, 29)  # + a few days: rows cross 2020-01-01
GROUPED = [
    "SELECT EXTRACT(YEAR FROM t.d) AS y, COUNT(*) AS n FROM t GROUP BY EXTRACT(YEAR FROM t.d)",
    "SELECT EXTRACT(YEAR FROM t.d) AS y, SUM(t.x) AS s FROM t WHERE t.a >= 2 GROUP BY EXTRACT(YEAR FROM t.d)",
    "SELECT t.k, EXTRACT(YEAR FROM t.d) AS y, SUM(t.x * t.a) AS s FROM t WHERE t.k IN (0, 1) "
    "GROUP BY t.k, EXTRACT(YEAR FROM t.d)",
    "SELECT EXTRACT(YEAR FROM t.d) AS y, SUM(t.x * u.b) AS s FROM t, u WHERE t.k = u.k GROUP BY EXTRACT(YEAR FROM t.d)",
    "SELECT EXTRACT(YEAR FROM t.d) AS y, COUNT(*) AS n FROM t WHERE t.d < DATE '2020-01-02' "
    "GROUP BY EXTRACT(YEAR FROM t.d)",
    # date_trunc keys (sqldp.groups.guard_date_trunc): the same step filters per month or year of d
    "SELECT DATE_TRUNC('month', t.d) AS m, COUNT(*) AS n FROM t GROUP BY DATE_TRUNC('month', t.d)",
    "SELECT DATE_TRUNC('year', t.d) AS y, SUM(t.x) AS s FROM t WHERE t.a >= 2 GROUP BY DATE_TRUNC('year', t.d)",
    # calendar fields: month m of every year (a union of day intervals), the day of the week (every day moves)
    "SELECT EXTRACT(MONTH FROM t.d) AS m, COUNT(*) AS n FROM t GROUP BY EXTRACT(MONTH FROM t.d)",
    "SELECT EXTRACT(DOW FROM t.d) AS w, SUM(t.x) AS s FROM t WHERE t.a >= 2 GROUP BY EXTRACT(DOW FROM t.d)",
    "SELECT t.k, EXTRACT(QUARTER FROM t.d) AS q, COUNT(*) AS n FROM t WHERE t.k IN (0, 1) "
    "GROUP BY t.k, EXTRACT(QUARTER FROM t.d)",
]
CASES = [
    "SELECT SUM(CASE WHEN t.k = 1 THEN t.x ELSE t.a END) AS s FROM t",
    "SELECT SUM(CASE WHEN t.k > 0 THEN t.x * u.b END) AS s FROM t, u WHERE t.k = u.k",
    "SELECT EXTRACT(YEAR FROM t.d) AS y, SUM(CASE WHEN t.k = 0 THEN 1 WHEN t.k = 1 THEN t.x ELSE 0 END) AS s "
    "FROM t GROUP BY EXTRACT(YEAR FROM t.d)",
]
T = tuple[int, int, int, Decimal, dt.date]
U = tuple[int, int, int]


def _load(dsn: str, t_rows: list[T], u_rows: list[U]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE t, u")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, %s)", t_rows)
            cur.executemany("INSERT INTO u VALUES (%s, %s, %s)", u_rows)


def _plain(dsn: str, query: str) -> dict[Any, float]:
    """PostgreSQL's answer per group (the key, or () without GROUP BY); a group with no row is 0 (COUNT, and
    SUM as a function: NR §3.3.8)."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(query).fetchall()
    if "GROUP BY" not in query:
        return {(): float(rows[0][0] or 0)}
    return {tuple(r[:-1]): float(r[-1] or 0) for r in rows}


def _neighbours(t0: list[T], u0: list[U], rows_private: bool) -> Iterator[tuple[list[T], list[U], float]]:
    """Every database one step away: one value of one row moved by a step of its grid (a ±1, x ±0.01 and
    ±0.5, d ±1 and ±3 days, b ±1), and with private rows every row of t removed and one row added; with the
    distance of the policy's metric (a removed or added row: 1, its weight G)."""
    db = {"t": t0, "u": u0}

    def later(d: dt.date, n: int) -> dt.date:
        return d + dt.timedelta(days=n)

    changes = [
        values_changed(db, "t", {2: 1.0}, (1, -1)),
        values_changed(db, "t", {3: 0.5}, [Decimal(s) for s in ("0.01", "-0.01", "0.5", "-0.5")]),
        values_changed(db, "t", {4: 1.0}, (1, -1, 3, -3), add=later),
        values_changed(db, "u", {2: 1.0}, (1, -1)),
    ]
    if rows_private:
        changes.append(row_neighbours(db, {"t": [(99, 1, 2, Decimal("1.50"), BASE + dt.timedelta(days=3))]}))
    for n in itertools.chain(*changes):
        yield n.db["t"], n.db["u"], n.distance


def _random_database(rng: random.Random) -> tuple[list[T], list[U]]:
    t = [
        (
            i,
            rng.randint(0, 2),
            rng.randint(-1, 5),
            Decimal(rng.randint(0, 300)) / 100,
            BASE + dt.timedelta(days=rng.randint(0, 6)),
        )
        for i in range(5)
    ]
    u = [(i, rng.randint(0, 2), rng.randint(-1, 4)) for i in range(3)]
    return t, u


@pytest.mark.parametrize("rows", ["public", "private"])
@pytest.mark.parametrize("query", GROUPED + CASES)
def test_every_group_moves_within_the_bound_on_every_neighbour(pg_dsn: str, query: str, rows: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=_policy(rows))
    rng = random.Random(zlib.crc32(f"{query}/{rows}".encode()))  # the same databases in every run
    crossed = 0
    for _ in range(2):
        t0, u0 = _random_database(rng)
        _load(pg_dsn, t0, u0)
        c = float(session.analyze(query, epsilon=100.0, beta=BETA).to_json()["sensitivity"])  # ε: noise only
        assert math.isfinite(c)
        factor = histogram_factor(session.prepare(query, epsilon=100.0, beta=BETA).plans[0])
        f0 = _plain(pg_dsn, query)
        for t1, u1, dist in _neighbours(t0, u0, rows == "private"):
            _load(pg_dsn, t1, u1)
            f1 = _plain(pg_dsn, query)
            l1 = 0.0
            for g in f0.keys() | f1.keys():
                change = abs(f1.get(g, 0.0) - f0.get(g, 0.0))
                assert change <= math.exp(BETA * dist) * c * dist + 1e-9, (query, g, t0, t1, u0, u1, c)
                l1 += change
            assert l1 <= factor * math.exp(BETA * dist) * c * dist + 1e-9, (query, t0, t1, u0, u1, c, factor)
            crossed += f0.keys() != f1.keys() or any(f0[g] != f1.get(g) for g in f0)
    assert crossed  # the neighbours did move the answer (rows crossed between groups)


def test_group_key_domains_come_from_the_declared_range(pg_dsn: str) -> None:
    """The groups are the years of d's declared range (NR §3.3.11), narrowed by constant bounds in WHERE,
    whatever the data holds; each gets ε over the groups (a changed d moves a row between two)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    rng = random.Random(7)
    _load(pg_dsn, *_random_database(rng))
    session = sqldp.connect(pg_dsn, policy=_policy("public"))
    years = session.analyze(GROUPED[0], epsilon=1.0, beta=BETA / 10)
    assert len(years.measurements) == 3  # 2019, 2020, 2021
    # three groups: one release of the histogram at the full ε, its ℓ1 sensitivity twice the bound (a changed d
    # moves a row between two years) and the smoothing paid per group: scale 2c/(ε/(γ+1) − 3β)
    for (m,) in years.measurements:
        assert m.epsilon == pytest.approx(1.0)
        # the plan's own bound (rows public: the largest value sensitivity over the tables), doubled
        assert m.sensitivity == pytest.approx(2 * max(t["value_sensitivity"] for t in m.terms.values()), rel=1e-12)
        assert m.noise_scale == pytest.approx(m.sensitivity / (1.0 / (GAMMA + 1) - 3 * BETA / 10), rel=1e-12)
    assert histogram_factor(session.prepare(GROUPED[0], epsilon=1.0).plans[0]) == 2
    # two groups: the vector would cost 2c/(ε/(γ+1) − 2β) against c/(ε/(2(γ+1)) − β) split: the same at
    # β = 0, so the share is split (ε/2 each) and the sensitivity not doubled
    narrowed_plan = session.analyze(GROUPED[4], epsilon=1.0, beta=BETA / 10)
    assert [m.epsilon for (m,) in narrowed_plan.measurements] == pytest.approx([0.5, 0.5])
    assert [r["key"]["y"] for r in session.run(GROUPED[0], epsilon=1.0).rows] == [2019, 2020, 2021]
    narrowed = session.run(GROUPED[4], epsilon=1.0)
    assert [r["key"]["y"] for r in narrowed.rows] == [2019, 2020]
    # date_trunc('month'): the first days of the 25 months of the range, released as dates
    months = session.run(GROUPED[5], epsilon=1.0)
    assert [r["key"]["m"] for r in months.rows] == [
        dt.date(2019 + (5 + i) // 12, (5 + i) % 12 + 1, 1) for i in range(25)
    ]


@pytest.mark.parametrize(
    ("query", "why"),
    [
        ("SELECT SUM(CASE WHEN t.a > 1 THEN t.x ELSE 0 END) FROM t", "reads a value-sensitive column"),
        # an INTEGER key with a declared domain is a step per value for COUNT and SUM (columns._integer_key,
        # tests/sensitivity/test_distinct_value_oracle.py), not for MIN/MAX
        ("SELECT t.a, MIN(t.x) FROM t GROUP BY t.a", "reads value-sensitive column t.a"),
        ("SELECT EXTRACT(MONTH FROM t.x), COUNT(*) FROM t GROUP BY EXTRACT(MONTH FROM t.x)", "t.x"),
        ("SELECT DATE_TRUNC('week', t.d), COUNT(*) FROM t GROUP BY DATE_TRUNC('week', t.d)", "only plain columns"),
        ("SELECT DATE_TRUNC('year', t.d) FROM t", "releases rows of private table"),
    ],
)
def test_steps_of_sensitive_values_are_refused_with_the_reason(pg_dsn: str, query: str, why: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=_policy("public"))
    with pytest.raises(RefusedError, match=None) as refusal:
        session.analyze(query, epsilon=1.0)
    assert why in str(refusal.value) and "\n" not in str(refusal.value)


def test_a_refused_group_key_is_located_in_the_text(pg_dsn: str) -> None:
    """The refusal points at the GROUP BY item as written (line and column), though the analysis found it on
    the qualified form, which keeps no positions."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=_policy("public"))
    for query, where in (
        # value-sensitive (an INTEGER key is a step per value for COUNT and SUM, not for MIN)
        ("SELECT MIN(t.x)\nFROM t\nGROUP BY t.k,\n  a", "query:4:3"),
        ("SELECT COUNT(*) FROM t GROUP BY\n   t.d + 1", "query:2:4"),  # not a plain column
    ):
        with pytest.raises(RefusedError) as refusal:
            session.analyze(query, epsilon=1.0)
        assert refusal.value.where == where, (query, str(refusal.value))


def test_explain_says_when_a_run_time_group_count_decides_the_histogram_release(pg_dsn: str) -> None:
    """A year key beside a public table's key: the group count is read at run time, and a key-moving histogram
    is one release only above histogram_factor groups, so what explain shows before the run says both cases."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        conn.execute("CREATE TABLE v (k INT PRIMARY KEY); INSERT INTO v VALUES (0), (1), (2)")
    _load(pg_dsn, *_random_database(random.Random(7)))
    session = sqldp.connect(pg_dsn, policy=_policy("public", '[tables.v]\nrows = "public"\n'))
    query = (
        "SELECT v.k, EXTRACT(YEAR FROM t.d) AS y, COUNT(*) AS n FROM t, v WHERE t.k = v.k "
        "GROUP BY v.k, EXTRACT(YEAR FROM t.d)"
    )
    planned = session.analyze(query, epsilon=1.0, audit=False).to_json()["plan"]
    assert [p["groups"] for p in planned] == [
        "full share (ℓ1 over the groups, one generalized-Cauchy release of the histogram if it has more than 2"
        " groups, else the share divided among them)"
    ]
