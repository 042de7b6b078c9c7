"""Outputs that are expressions of group keys and HAVING conjuncts over group keys alone (sqldp.groups.
key_expressions): ``SELECT age + 1, COUNT(*) … GROUP BY age``, ``HAVING age < 21``, ``HAVING married``.

What must hold: PostgreSQL computes each expression over the group domain's values (declared constants of
the key column's type, or a public domain's statement), so a released key expression equals PostgreSQL's own
value for that group, also for a group with no rows; a HAVING conjunct over keys keeps exactly the groups of
the domain it holds for (NULL drops, as in SQL), whatever the private rows, and the values kept are
PostgreSQL's own GROUP BY … HAVING; over every neighbour adding one row the released groups are the same and
the exact privacy loss is at most ε. Mutants caught: the expression computed over the data's rows (a group
with no rows would have none), the HAVING filter applied to the noisy values or ignored (groups ≥ 21 released),
a filter that treats NULL as true."""

from __future__ import annotations

import math
from collections.abc import Iterator

import psycopg
import pytest
from oracles import joint_loss, product_rows, rows_added

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy

EPSILON = 1.0
DDL = """
DROP TABLE IF EXISTS pums, f, w;
CREATE TABLE pums (id INT PRIMARY KEY, age INT NOT NULL, married BOOLEAN, income INT NOT NULL);
CREATE TABLE w (wk INT PRIMARY KEY, w_name TEXT NOT NULL);
CREATE TABLE f (id INT PRIMARY KEY, wk INT NOT NULL REFERENCES w (wk));
INSERT INTO w VALUES (1, 'north depot'), (2, 'north yard'), (3, 'south depot'), (4, 'x');
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.pums.columns.age]
domain = [18, 19, 20, 21, 22]
[tables.pums.columns.married]
domain = [true, false]
[tables.pums.columns.income]
range = [0, 100]
[tables.w]
rows = "public"
"""
BASES = [
    [],
    [(1, 19, True, 10)],
    [(1, 19, True, 10), (2, 19, False, 50), (3, 21, None, 0), (4, 22, True, 100), (5, 30, False, 7)],
]


@pytest.fixture
def dsn(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    yield pg_dsn


def _load(dsn: str, rows: list[tuple[int, int, bool | None, int]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM pums")
        for row in rows:
            conn.execute("INSERT INTO pums VALUES (%s, %s, %s, %s)", row)


def _run(dsn: str, sql: str, seed: int = 2) -> sqldp.result.Result:
    result = sqldp.connect(dsn, Policy.from_toml(POLICY), seed=seed).run(sql, epsilon=EPSILON)
    assert result.released
    return result


def _plain(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


AGES = [18, 19, 20, 21, 22]


def _in_domain(key: tuple[object, ...]) -> bool:
    """Whether a group of PostgreSQL's answer is one of the declared domains' (age 30, married NULL are not)."""
    return all(v in (True, False) if isinstance(v, bool) else v in AGES for v in key if v is not None) and (
        None not in key
    )


def test_an_output_of_a_declared_key_is_postgres_value_for_every_group(dsn: str) -> None:
    sql = "SELECT age + 1 AS a1, age / 2 AS half, COUNT(*) AS n FROM pums GROUP BY age"
    for rows in BASES:
        _load(dsn, rows)
        result = _run(dsn, sql)
        # every declared age, with PostgreSQL's integer arithmetic (age / 2 truncates), rows or not
        assert [(r["key"]["a1"], r["key"]["half"]) for r in result.rows] == [(a + 1, a // 2) for a in AGES]
        plain = {(a1, half): float(n) for a1, half, n in _plain(dsn, sql)}
        got = {
            (r["key"]["a1"], r["key"]["half"]): ms[0].true_value
            for r, ms in zip(result.rows, result.measurements, strict=True)
        }
        assert got == {k: plain.get(k, 0.0) for k in got}
        # PostgreSQL's only other group is age 30's, outside the declared domain
        assert set(plain) - set(got) == ({(31, 15)} if any(r[1] == 30 for r in rows) else set())


@pytest.mark.parametrize(
    ("sql", "kept"),
    [
        ("SELECT age, COUNT(*) AS n FROM pums GROUP BY age HAVING age < 21", [(18,), (19,), (20,)]),
        ("SELECT age, COUNT(*) AS n FROM pums GROUP BY age HAVING age % 2 = 0 AND age > 18", [(20,), (22,)]),
        # NULLIF(20, 20) < 21 is NULL: the group is dropped, as PostgreSQL's HAVING drops it
        ("SELECT age, COUNT(*) AS n FROM pums GROUP BY age HAVING NULLIF(age, 20) < 21", [(18,), (19,)]),
        ("SELECT married, COUNT(*) AS n FROM pums GROUP BY married HAVING married", [(True,)]),
        ("SELECT married, COUNT(*) AS n FROM pums GROUP BY married HAVING NOT married", [(False,)]),
        (
            "SELECT age, married, SUM(income) AS s FROM pums GROUP BY age, married HAVING age >= 21 AND married",
            [(21, True), (22, True)],
        ),
    ],
)
def test_having_over_keys_keeps_the_domain_groups_it_holds_for(dsn: str, sql: str, kept: list[tuple]) -> None:
    for rows in BASES:
        _load(dsn, rows)
        result = _run(dsn, sql)
        keys = [tuple(r["key"].values()) for r in result.rows]
        assert keys == kept, rows
        # the kept groups' values are PostgreSQL's GROUP BY … HAVING (0 where it has no row)
        width = len(kept[0])
        plain = {tuple(r[:width]): float(r[width]) for r in _plain(dsn, sql) if _in_domain(tuple(r[:width]))}
        assert set(plain) <= set(kept)
        values = {}
        for row in result.rows:
            key = tuple(row["key"].values())
            values[key] = _true(result, row)
        assert values == {k: plain.get(k, 0.0) for k in kept}, rows


def _true(result: sqldp.result.Result, row: dict) -> float | None:
    """The true value of a released row's one aggregate: its group's measurement, found by its index among
    all groups of the domain (the rows are the kept groups, in domain order)."""
    index = result.rows.index(row)
    kept = [i for i, ms in enumerate(result.measurements) if ms[0].noisy_value is not None]
    return result.measurements[kept[index]][0].true_value


def test_having_over_keys_and_aggregates_filters_both(dsn: str) -> None:
    """A key conjunct filters the domain, an aggregate conjunct the noisy values: only ages below 21 remain, and
    of them those whose noisy count passes."""
    _load(dsn, BASES[2])
    result = _run(dsn, "SELECT age, COUNT(*) AS n FROM pums GROUP BY age HAVING age < 21 AND COUNT(*) > -1000")
    assert [r["key"]["age"] for r in result.rows] == [18, 19, 20]
    result = _run(dsn, "SELECT age, COUNT(*) AS n FROM pums GROUP BY age HAVING age < 21 AND COUNT(*) > 1e9")
    assert result.rows == []


def test_expressions_of_a_public_key(dsn: str) -> None:
    """Over a public key the expressions are computed by the domain's statement: the key's values are those
    of the public rows, and HAVING over the key drops 'x' whatever the private rows."""
    sql = (
        "SELECT SUBSTRING(w.w_name, 1, 5) AS p, UPPER(w.w_name) AS u, COUNT(*) AS n FROM f, w WHERE f.wk = w.wk "
        "GROUP BY w.w_name HAVING w.w_name <> 'x' ORDER BY u DESC"
    )
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO f VALUES (1, 1), (2, 1), (3, 3), (4, 4)")
    result = _run(dsn, sql, seed=3)  # rounded counts that differ: the rows map to their measurements by value
    assert [(r["key"]["p"], r["key"]["u"]) for r in result.rows] == [
        ("south", "SOUTH DEPOT"),
        ("north", "NORTH YARD"),
        ("north", "NORTH DEPOT"),
    ]
    counts = {r["key"]["u"]: ms[0].true_value for r, ms in zip(result.rows, _kept(result), strict=True)}
    assert counts == {"NORTH DEPOT": 2.0, "NORTH YARD": 0.0, "SOUTH DEPOT": 1.0}


def shown(noisy: float) -> float:
    """A released count as the rows show it: the noisy value rounded half away from zero, at least 0."""
    return max(0.0, float(math.floor(abs(noisy) + 0.5)) * (1 if noisy >= 0 else -1))


def _kept(result: sqldp.result.Result) -> list[list]:
    """The measurements of the released groups, in the released rows' order (ORDER BY applies to rows only)."""
    by_key = {}
    kept = [ms for ms in result.measurements if ms[0].noisy_value is not None]
    for ms in kept:
        by_key[shown(ms[0].noisy_value)] = ms
    return [by_key[r["values"]["n"]] for r in result.rows]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT age + COUNT(*) FROM pums GROUP BY age", "combines GROUP BY keys with aggregates"),
        (
            "SELECT age + CAST(married AS INT), COUNT(*) FROM pums GROUP BY age, married",
            "domains are independent",
        ),
        ("SELECT age, COUNT(*) FROM pums GROUP BY age HAVING age < income", "outside an aggregate"),
    ],
)
def test_what_stays_refused_says_why(dsn: str, sql: str, message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        _run(dsn, sql)


# the neighbours: one more person than the base, any age (also outside the domain), marital status and an
# extreme income
ADDED = [(99, *row) for row in product_rows((15, 18, 20, 21, 30), (True, False, None), (0, 100))]


def _vector(dsn: str, sql: str, rows: list[tuple[int, int, bool | None, int]]) -> tuple[list, list]:
    _load(dsn, rows)
    result = _run(dsn, sql)
    keys = [tuple(r["key"].values()) for r in result.rows]
    out = [(m.true_value, m.noise_scale, m.mechanism) for ms in result.measurements for m in ms]
    return keys, out


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT age - 18 AS years, married, COUNT(*) AS n FROM pums GROUP BY age, married HAVING age < 21",
        "SELECT NOT married AS single, SUM(income) AS s FROM pums GROUP BY married HAVING married IS NOT NULL",
        "SELECT age / 10 AS decade, COUNT(*) AS n FROM pums GROUP BY age / 10",
    ],
)
def test_one_more_person_costs_at_most_epsilon(dsn: str, sql: str) -> None:
    for base in BASES[1:]:
        keys, x = _vector(dsn, sql, base)
        for n in rows_added({"pums": base}, "pums", ADDED):
            other, y = _vector(dsn, sql, n.db["pums"])
            assert other == keys  # the released groups never follow the private rows
            # every measured group's coordinate (the released ones are a subset: post-processing)
            loss = joint_loss(x, y)
            assert loss <= EPSILON + 1e-9, (n.change, loss)


def test_order_by_expressions_of_keys_and_of_released_aggregates(dsn: str) -> None:
    """ORDER BY an expression that is no output: of the keys (computed over the domain, PostgreSQL's %), or of
    aggregates the query releases anyway (computed on their noisy values); one that would need another
    measurement stays refused."""
    _load(dsn, BASES[2])
    by_key = _run(dsn, "SELECT age, COUNT(*) AS n FROM pums GROUP BY age ORDER BY age % 3, -age")
    assert [r["key"]["age"] for r in by_key.rows] == sorted(AGES, key=lambda a: (a % 3, -a))
    by_noise = _run(
        dsn, "SELECT age, COUNT(*) AS n, SUM(income) AS s FROM pums GROUP BY age ORDER BY SUM(income) - COUNT(*) DESC"
    )
    differences = [r["values"]["s"] - r["values"]["n"] for r in by_noise.rows]
    assert len(differences) == len(AGES) and differences == sorted(differences, reverse=True)
    with pytest.raises(RefusedError, match="not an output of the query"):
        _run(dsn, "SELECT age, COUNT(*) AS n FROM pums GROUP BY age ORDER BY MAX(income)")


def test_a_key_expression_of_a_declared_column_takes_its_values_over_the_domain(dsn: str) -> None:
    """``GROUP BY age / 10`` with age declared 18 … 22: the groups are PostgreSQL's age / 10 over the declared
    values (1 and 2), rows or not; a group holds every row with that value, as PostgreSQL's GROUP BY (age 15 is
    outside the declared domain and still a row of decade 1), and a value outside the set (age 30's 3) is never
    released. An output over the key expression is computed over the same values."""
    sql = "SELECT age / 10 AS decade, age / 10 * 10 AS lo, COUNT(*) AS n FROM pums GROUP BY age / 10"
    for rows in [*BASES, [(1, 15, True, 3), (2, 30, None, 4), (3, 20, False, 5)]]:
        _load(dsn, rows)
        result = _run(dsn, sql)
        assert [(r["key"]["decade"], r["key"]["lo"]) for r in result.rows] == [(1, 10), (2, 20)]
        plain = {(d, lo): float(n) for d, lo, n in _plain(dsn, sql) if d in (1, 2)}
        got = {
            (r["key"]["decade"], r["key"]["lo"]): ms[0].true_value
            for r, ms in zip(result.rows, result.measurements, strict=True)
        }
        assert got == {k: plain.get(k, 0.0) for k in got}, rows
    with pytest.raises(RefusedError, match="only plain columns"):
        _run(dsn, "SELECT income / 10, COUNT(*) FROM pums GROUP BY income / 10")  # income has a range, no domain
