"""Ordinary analyst SQL (docs/sql.md): aggregate FILTER clauses, ordinal GROUP BY / ORDER BY, and group keys
whose set of values the query and the schema fix (EXTRACT of a calendar field, a CASE of constants).

FILTER and ordinals are rewrites: the un-noised answers must equal PostgreSQL's for the query as written, and
the analysis must equal that of the hand-rewritten query. The fixed-domain keys are released over their whole
domain by the histogram machinery: checked by the exact privacy loss of the released vector against every
neighbour (one row added, any key) of tiny PostgreSQL databases, and by the true value of every group.

Mutants killed (each by the test named):
* FILTER dropped (``agg(x)`` for ``agg(x) FILTER (WHERE c)``) — ``test_filter_answers_equal_postgresql``;
* FILTER as ``CASE WHEN c THEN x ELSE 0 END`` (AVG and COUNT change) — the same test;
* DISTINCT lost in ``COUNT(DISTINCT x) FILTER`` — the same test;
* ``CASE … ELSE NULL END`` refused, or its NULL read as 0 (AVG changes) — the same test;
* ORDER BY 2 read as the first output, or DESC lost — ``test_ordinals_are_the_named_query``;
* the NULL group matched with ``=`` (always empty), or left out of a nullable column's domain —
  ``test_extract_keys_release_every_field_value``;
* a domain taken from the values present in the data — ``test_fixed_domain_keys_cost_at_most_epsilon``
  (the released vectors of neighbours then differ in length);
* a key over a value-sensitive column accepted under value-level privacy, EXTRACT(HOUR) of a DATE accepted
  — ``test_refusals``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from oracles import joint_loss, rows_added

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.session import Session

EPSILON = 1.0
POLICY = '[tables.t]\nrows = "private"\n[tables.t.columns.x]\nrange = [0, 10]\n'
ROWS = [
    (1, "a", 3, dt.date(2024, 1, 15), dt.datetime(2024, 1, 15, 7, 30)),
    (2, "a", 5, dt.date(2024, 3, 31), dt.datetime(2024, 3, 31, 23, 59)),
    (3, "b", 5, dt.date(2023, 12, 31), dt.datetime(2023, 12, 31, 0, 0)),
    (4, "b", None, None, None),
    (5, "c", 10, dt.date(2024, 7, 4), dt.datetime(2024, 7, 4, 12, 0)),
]


def _load(dsn: str, rows: list[tuple[object, ...]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE IF NOT EXISTS t (id INT PRIMARY KEY, g TEXT, x INT, d DATE, ts TIMESTAMP, "
            "dn DATE NOT NULL DEFAULT DATE '2000-01-01')"
        )
        conn.execute("DELETE FROM t")
        for row in rows:
            conn.execute("INSERT INTO t (id, g, x, d, ts) VALUES (%s, %s, %s, %s, %s)", row)


@pytest.fixture
def tiny(pg_dsn: str) -> Iterator[tuple[str, Session]]:
    _load(pg_dsn, ROWS)
    yield pg_dsn, sqldp.connect(pg_dsn, Policy.from_toml(POLICY), seed=3)


def _true(result: sqldp.result.Result) -> list[list[float | None]]:
    return [[m.true_value for m in group] for group in result.measurements]


def _postgres(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


# -- FILTER (NR §4.3.6.1, transformation (vii)) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("filtered", "rewritten"),
    [
        ("COUNT(*) FILTER (WHERE t.g = 'a')", "COUNT(CASE WHEN t.g = 'a' THEN 1 END)"),
        ("SUM(t.x) FILTER (WHERE t.g <> 'c')", "SUM(CASE WHEN t.g <> 'c' THEN t.x END)"),
        ("AVG(t.x) FILTER (WHERE t.g = 'b')", "AVG(CASE WHEN t.g = 'b' THEN t.x END)"),
        ("COUNT(t.x) FILTER (WHERE t.x > 3)", "COUNT(CASE WHEN t.x > 3 THEN t.x END)"),
        ("COUNT(DISTINCT t.x) FILTER (WHERE t.g <> 'c')", "COUNT(DISTINCT CASE WHEN t.g <> 'c' THEN t.x END)"),
        # ELSE NULL is no ELSE (sqldp.frontend.drop_else_null; TPC-DS q43 writes its sums so)
        ("SUM(CASE WHEN t.g = 'a' THEN t.x ELSE NULL END)", "SUM(CASE WHEN t.g = 'a' THEN t.x END)"),
        ("AVG(CASE WHEN t.x > 3 THEN t.x ELSE NULL END)", "AVG(CASE WHEN t.x > 3 THEN t.x END)"),
    ],
)
def test_filter_answers_equal_postgresql(tiny: tuple[str, Session], filtered: str, rewritten: str) -> None:
    """The un-noised value of ``agg FILTER (WHERE c)`` is PostgreSQL's, and its analysis (plan, answer query)
    is the hand-written CASE form's."""
    dsn, session = tiny
    sql = f"SELECT {filtered} FROM t"
    result = session.run(sql, epsilon=EPSILON)
    (expected,) = _postgres(dsn, sql)
    truth = _true(result)[0]
    # AVG is released as SUM / COUNT (two measurements): its true value is their ratio
    value = truth[0] / truth[1] if len(truth) == 2 and truth[1] else truth[0]
    assert value == pytest.approx(float(expected[0]))  # type: ignore[arg-type]
    a = session.prepare(sql, epsilon=EPSILON)
    b = session.prepare(f"SELECT {rewritten} FROM t", epsilon=EPSILON)
    assert a.statements.answer == b.statements.answer  # type: ignore[union-attr]
    assert [p.aggregate for p in a.plans] == [p.aggregate for p in b.plans]  # type: ignore[union-attr]
    assert a.describe().plan == b.describe().plan  # type: ignore[union-attr]


def test_filter_on_the_public_path_runs_as_postgresql(pg_dsn: str) -> None:
    """A public table's FILTER runs exactly (as the CASE form, the same function of the rows)."""
    _load(pg_dsn, ROWS)
    session = sqldp.connect(pg_dsn, Policy.from_toml('[tables.t]\nrows = "public"\n'))
    sql = "SELECT t.g, COUNT(*) FILTER (WHERE t.x >= 5), SUM(t.x) FILTER (WHERE t.d IS NOT NULL) FROM t GROUP BY 1"
    out = session.run(sql)
    assert sorted(map(tuple, out.table()[1])) == sorted(_postgres(pg_dsn, sql + " ORDER BY 1"))


def test_filters_that_are_not_rewritten_stay_refused(tiny: tuple[str, Session]) -> None:
    """A FILTER on an aggregate that does not skip NULLs (or on a window) is not the CASE form: refused."""
    _, session = tiny
    with pytest.raises(sqldp.errors.SqldpError, match="FILTER"):
        session.prepare("SELECT STRING_AGG(t.g, ',') FILTER (WHERE t.x > 1) FROM t", epsilon=EPSILON)


# -- ordinals ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("ordinal", "named"),
    [
        (
            "SELECT t.g, COUNT(*) FROM t WHERE t.g IN ('a', 'b', 'c') GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 2",
            "SELECT t.g, COUNT(*) AS n FROM t WHERE t.g IN ('a', 'b', 'c') GROUP BY t.g ORDER BY n DESC, t.g LIMIT 2",
        ),
        (
            "SELECT t.g, SUM(t.x) FROM t WHERE t.g IN ('a', 'b', 'c') GROUP BY 1 ORDER BY SUM(t.x)",
            "SELECT t.g, SUM(t.x) AS s FROM t WHERE t.g IN ('a', 'b', 'c') GROUP BY t.g ORDER BY s",
        ),
    ],
)
def test_ordinals_are_the_named_query(tiny: tuple[str, Session], ordinal: str, named: str) -> None:
    """GROUP BY 1 / ORDER BY 2 / ORDER BY an output's aggregate mean what PostgreSQL means: the analysis form's
    keys, order and limit are the named query's, and the un-noised groups are PostgreSQL's."""
    dsn, session = tiny
    a = session.prepare(ordinal, epsilon=EPSILON).form  # type: ignore[union-attr]
    b = session.prepare(named, epsilon=EPSILON).form  # type: ignore[union-attr]
    assert (a.group_by, a.order_by, a.limit) == (b.group_by, b.order_by, b.limit)  # type: ignore[union-attr]
    assert a.order_by[0].output == 1  # type: ignore[union-attr]
    assert a.order_by[0].descending == ("DESC" in ordinal)  # type: ignore[union-attr]
    result = session.run(ordinal, epsilon=EPSILON)
    # the measurements follow the domain ('a', 'b', 'c'); the rows are sorted and cut after the noise
    truth = {g: m[0].true_value for g, m in zip("abc", result.measurements, strict=True)}
    expected = {g: float(v) for g, v in _postgres(dsn, ordinal.split(" ORDER BY")[0])}  # type: ignore[arg-type]
    assert {g: truth[g] for g in expected} == expected
    noisy = [next(iter(r["values"].values())) for r in result.rows]
    assert noisy == sorted(noisy, reverse="DESC" in ordinal)
    assert len(result.rows) == (a.limit or 3)  # type: ignore[union-attr]


def test_order_by_an_aggregate_that_is_no_output_is_refused(tiny: tuple[str, Session]) -> None:
    _, session = tiny
    with pytest.raises(RefusedError, match=r"not an output.*SELECT list"):
        session.prepare("SELECT t.g, COUNT(*) FROM t WHERE t.g IN ('a', 'b') GROUP BY 1 ORDER BY SUM(t.x)")


# -- keys with a fixed domain --------------------------------------------------------------------------------


def test_extract_keys_release_every_field_value(tiny: tuple[str, Session]) -> None:
    """Every value of the field is a released group, empty ones too; the NULL group holds the NULL dates of a
    nullable column, and a NOT NULL column has none; each group's true count is PostgreSQL's."""
    dsn, session = tiny
    cases = [
        ("EXTRACT(MONTH FROM t.d)", [*range(1, 13), None]),
        ("EXTRACT(QUARTER FROM t.d)", [1, 2, 3, 4, None]),
        ("EXTRACT(DOW FROM t.d)", [*range(7), None]),
        ("EXTRACT(ISODOW FROM t.d)", [*range(1, 8), None]),
        ("EXTRACT(DAY FROM t.d)", [*range(1, 32), None]),
        ("EXTRACT(HOUR FROM t.ts)", [*range(24), None]),
        ("EXTRACT(MONTH FROM t.dn)", list(range(1, 13))),
    ]
    for key, domain in cases:
        sql = f"SELECT {key} AS k, COUNT(*) FROM t GROUP BY 1"
        result = session.run(sql, epsilon=EPSILON)
        assert [r["key"]["k"] for r in result.rows] == domain, key
        counts = {k: float(n) for k, n in _postgres(dsn, sql)}  # type: ignore[arg-type]
        released = {r["key"]["k"]: m[0].true_value for r, m in zip(result.rows, result.measurements, strict=True)}
        assert released == {k: counts.get(k, 0.0) for k in domain}, key
        assert all(m[0].noise_scale == 1.0 / EPSILON for m in result.measurements)  # parallel composition


def test_case_keys_release_their_constants(tiny: tuple[str, Session]) -> None:
    dsn, session = tiny
    cases = [
        ("CASE WHEN t.x >= 5 THEN 'big' WHEN t.x >= 0 THEN 'small' END", ["big", "small", None]),
        ("CASE WHEN t.x >= 5 THEN 'big' ELSE 'other' END", ["big", "other"]),
        ("CASE t.g WHEN 'a' THEN 1 WHEN 'b' THEN 2 WHEN 'z' THEN 1 ELSE 3 END", [1, 2, 3]),
        ("CASE WHEN t.d < DATE '2024-01-01' THEN 'old' ELSE NULL END", ["old", None]),
    ]
    for key, domain in cases:
        sql = f"SELECT {key} AS k, COUNT(*), SUM(t.x) FROM t GROUP BY 1"
        result = session.run(sql, epsilon=EPSILON)
        assert [r["key"]["k"] for r in result.rows] == domain, key
        rows = {k: (float(n), float(s or 0)) for k, n, s in _postgres(dsn, sql)}  # type: ignore[arg-type]
        released = {
            r["key"]["k"]: (m[0].true_value, m[1].true_value or 0.0)
            for r, m in zip(result.rows, result.measurements, strict=True)
        }
        assert released == {k: rows.get(k, (0.0, 0.0)) for k in domain}, key


KEYS = [
    "EXTRACT(MONTH FROM t.d)",
    "EXTRACT(QUARTER FROM t.d)",
    "CASE WHEN t.x >= 5 THEN 'big' WHEN t.g = 'a' THEN 'a' END",
]
NEW_ROWS = [
    (99, "a", 0, dt.date(2024, 2, 1), None),
    (99, "z", 7, dt.date(2024, 12, 1), None),
    (99, "a", None, None, None),
    (99, "c", 10, dt.date(2023, 5, 5), None),
]


@pytest.mark.parametrize("key", KEYS)
def test_fixed_domain_keys_cost_at_most_epsilon(pg_dsn: str, key: str) -> None:
    """The released vector (COUNT and SUM per group, ε split between them) of a database and of each neighbour
    with one more row, whatever its key: the same groups, and an exact joint privacy loss ≤ ε."""
    sql = f"SELECT {key}, COUNT(*), SUM(t.x) FROM t GROUP BY 1"
    policy = Policy.from_toml(POLICY)

    def released(rows: list[tuple[object, ...]]) -> list[tuple[float, float, str]]:
        _load(pg_dsn, rows)
        result = sqldp.connect(pg_dsn, policy, seed=1).run(sql, epsilon=EPSILON)
        return [(m.true_value or 0.0, m.noise_scale, m.mechanism) for group in result.measurements for m in group]

    for base in (ROWS[:1], ROWS):
        x = released(list(base))
        for n in rows_added({"t": list(base)}, "t", NEW_ROWS):
            y = released(n.db["t"])
            loss = joint_loss(x, y)
            assert loss <= EPSILON + 1e-9, (key, n.change, loss)
            assert math.isfinite(loss)


def test_refusals(pg_dsn: str, tmp_path: Path) -> None:
    """Under value-level privacy a changed date or amount moves a row between groups: keys over such columns
    are refused with the reason; fields PostgreSQL does not compute for a type, and CASE keys with a
    non-constant branch, are refused as not having a fixed domain."""
    _load(pg_dsn, ROWS)
    value = Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(x)"\n[tables.t.columns.x]\nrange = [0, 10]\n')
    session = sqldp.connect(pg_dsn, value)
    with pytest.raises(RefusedError, match=r"reads value-sensitive column .*x; groups would leak it"):
        session.prepare(
            "SELECT CASE WHEN t.x > 5 THEN 'big' ELSE 'small' END, COUNT(*) FROM t GROUP BY 1", epsilon=EPSILON
        )
    dates = Policy.from_toml(
        '[tables.t]\nrows = "private"\nnorm = "l1(dn)"\n[tables.t.columns.dn]\nrange = ["1990-01-01", "2030-12-31"]\n'
    )
    with pytest.raises(RefusedError, match=r"reads value-sensitive column .*dn; groups would leak it"):
        sqldp.connect(pg_dsn, dates).prepare(
            "SELECT CASE WHEN t.dn > DATE '2000-01-01' THEN 'new' ELSE 'old' END, COUNT(*) FROM t GROUP BY 1",
            epsilon=EPSILON,
        )
    # a calendar field of the date is a step filter on its day grid (tests/sensitivity/test_group_keys.py)
    months = sqldp.connect(pg_dsn, dates).prepare(
        "SELECT EXTRACT(MONTH FROM t.dn), COUNT(*) FROM t GROUP BY 1", epsilon=EPSILON
    )
    assert len(months.domains[0].values or ()) >= 12
    rows = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    for key in ("EXTRACT(HOUR FROM t.d)", "EXTRACT(SECOND FROM t.ts)", "CASE WHEN t.x > 5 THEN t.g ELSE 'b' END"):
        with pytest.raises(RefusedError, match="only plain columns can be group keys"):
            rows.prepare(f"SELECT {key}, COUNT(*) FROM t GROUP BY 1", epsilon=EPSILON)
