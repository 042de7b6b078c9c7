"""Group identity follows PostgreSQL's equality (NR §3.3.10.4: parallel composition needs groups that are
really disjoint). The released vector of a GROUP BY is checked by its exact joint privacy loss on
neighbouring tiny databases: one person's row must never cost more than ε in total."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from oracles import joint_loss, rows_added
from sqlglot import exp

import sqldp
from sqldp.errors import PolicyError, RefusedError
from sqldp.policy import Policy

EPSILON = 1.0


DDL = """
CREATE TABLE k (name VARCHAR(5) PRIMARY KEY);
CREATE TABLE t (id INT PRIMARY KEY, name VARCHAR(5), c CHAR(3));
INSERT INTO k VALUES ('a'), ('a '), ('a  ');
"""


@pytest.fixture
def tiny(pg_dsn: str, tmp_path: Path) -> Iterator[tuple[str, Path]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    yield pg_dsn, tmp_path


def _released(dsn: str, policy: Path, sql: str, rows: list[tuple[int, str]]) -> list[tuple[float, float, str]]:
    """Load ``rows`` into t and release ``sql``: (true value, noise scale, mechanism) per released group."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM t")
        for i, name in rows:
            conn.execute("INSERT INTO t VALUES (%s, %s, %s)", (i, name, name))
    result = sqldp.connect(dsn, policy, seed=1).run(sql, epsilon=EPSILON)
    assert result.released
    return [(m.true_value, m.noise_scale, m.mechanism) for group in result.measurements for m in group]


@pytest.mark.parametrize(
    ("policy", "sql"),
    [
        # public VARCHAR keys that differ only in trailing blanks: PostgreSQL keeps them apart
        (
            '[tables.k]\nrows = "public"\n',
            "SELECT k.name, COUNT(*) FROM t JOIN k ON t.name = k.name GROUP BY k.name",
        ),
        # a declared VARCHAR domain with the same values: distinct groups, each row in one of them
        ('[tables.t.columns.name]\ndomain = ["a", "a ", "a  "]\n', "SELECT name, COUNT(*) FROM t GROUP BY name"),
    ],
)
def test_groups_differing_in_trailing_blanks_cost_at_most_epsilon(
    tiny: tuple[str, Path], policy: str, sql: str
) -> None:
    dsn, tmp = tiny
    path = tmp / "policy.toml"
    path.write_text(policy)
    names = ["a", "a ", "a  "]
    for base in ([], [(1, "a")], [(1, "a"), (2, "a ")]):
        # every database with one more person (any key) than base
        for n in rows_added({"t": base}, "t", [(99, name) for name in names]):
            d, d2 = base, n.db["t"]
            x, y = _released(dsn, path, sql, d), _released(dsn, path, sql, d2)
            assert len(x) == 3  # one released value per PostgreSQL group, never one per printed name
            loss = joint_loss(x, y)
            assert loss <= EPSILON + 1e-9, (d, d2, loss)


def test_char_keys_match_their_padded_values(tiny: tuple[str, Path]) -> None:
    """CHAR(n) pads: the declared 'a' is the group of the stored 'a  ' (PostgreSQL's bpchar equality)."""
    dsn, tmp = tiny
    path = tmp / "policy.toml"
    path.write_text('[tables.t.columns.c]\ndomain = ["a", "b"]\n')
    got = _released(dsn, path, "SELECT c, COUNT(*) FROM t GROUP BY c", [(1, "a"), (2, "a"), (3, "b")])
    assert [v for v, *_ in got] == [2.0, 1.0]


def test_numeric_and_float_keys_follow_postgres_equality(pg_dsn: str, tmp_path: Path) -> None:
    """numeric 1 = 1.0 and float -0 = 0 in PostgreSQL: the declared group takes every such row; NaN = NaN."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE n (id INT PRIMARY KEY, x NUMERIC, f DOUBLE PRECISION)")
        conn.execute("INSERT INTO n VALUES (1, 1, 0.0), (2, 1.0, '-0'), (3, 1.00, 'NaN'), (4, 2, 1)")
    path = tmp_path / "policy.toml"
    path.write_text("[tables.n.columns.x]\ndomain = [1, 2]\n[tables.n.columns.f]\ndomain = [0.0, 1.0]\n")
    session = sqldp.connect(pg_dsn, path, seed=1)
    x = session.run("SELECT x, COUNT(*) FROM n GROUP BY x", epsilon=EPSILON)
    assert [m.true_value for g in x.measurements for m in g] == [3.0, 1.0]
    f = session.run("SELECT f, COUNT(*) FROM n GROUP BY f", epsilon=EPSILON)
    assert [m.true_value for g in f.measurements for m in g] == [2.0, 1.0]  # NaN is outside the domain


def test_keys_equal_only_case_insensitively_are_one_group(pg_dsn: str, tmp_path: Path) -> None:
    """citext compares case-insensitively: the declared 'A' is the group of the stored 'a', whichever spelling
    the GROUP BY happens to print (the printed one is a private row's)."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION citext")
        conn.execute("CREATE TABLE t (id INT PRIMARY KEY, name CITEXT)")
        conn.execute("INSERT INTO t VALUES (1, 'a'), (2, 'a'), (3, 'B')")
    path = tmp_path / "policy.toml"
    path.write_text('[tables.t.columns.name]\ndomain = ["A", "b"]\n')
    out = sqldp.connect(pg_dsn, path, seed=1).run("SELECT name, COUNT(*) FROM t GROUP BY name", epsilon=EPSILON)
    assert [m.true_value for g in out.measurements for m in g] == [2.0, 1.0]
    assert [r["key"]["name"] for r in out.to_json()["rows"]] == ["A", "b"]  # the policy's names, not the data's


def test_match_groups_sql() -> None:
    """Declared values become untyped literals compared with '=' (PostgreSQL types them as the key column);
    a public domain is joined and numbered in its ORDER BY."""
    from sqldp.groups import KeyDomain, match_groups

    answer = exp.select("t.x AS __key0", "COUNT(*) AS __agg0").from_("t").group_by("t.x")
    q = exp.select("k.y").distinct().from_("k")
    sql = match_groups(answer, (KeyDomain(("a", 1, 2.5, True), None), KeyDomain(None, q))).sql(dialect="postgres")
    assert "CASE WHEN __a.__key0 = 'a' THEN 0 WHEN __a.__key0 = 1 THEN 1" in sql
    assert "WHEN __a.__key0 = 2.5 THEN 2 WHEN __a.__key0 = TRUE THEN 3" in sql
    assert "ROW_NUMBER() OVER (ORDER BY" in sql and "ON __a.__key1 = __d1.v" in sql


@pytest.mark.parametrize(
    ("domain", "problem"),
    [
        ("[0, 1, 1, 1, 2]", "1 appears twice"),
        ("[1, 1.0]", "appears twice"),
        ("[0.0, -0.0]", "appears twice"),
        ('["a", "a"]', "'a' appears twice"),
        ("[nan, 1.0]", "NaN"),
        ("[1, 'a']", "one type"),
        ("[['a'], ['b']]", "scalar"),
        ("[{x = 1}]", "scalar"),
    ],
)
def test_bad_domains_are_refused_naming_the_key(domain: str, problem: str) -> None:
    with pytest.raises(PolicyError, match=problem) as err:
        Policy.from_toml(f"[tables.t.columns.x]\ndomain = {domain}\n", source="p.toml")
    assert err.value.where == "p.toml: tables.t.columns.x.domain"


def test_a_group_released_three_times_costs_three_times() -> None:
    """What the old code did: one group released k times with the full ε costs k times one release."""
    scale = 1 / (0.2 - 0.0)
    one = joint_loss([(0.0, scale)], [(1.0, scale)])
    three = joint_loss([(0.0, scale)] * 3, [(1.0, scale)] * 3)
    assert one <= EPSILON and three == pytest.approx(3 * one) and three > EPSILON


def test_declared_groups_a_constant_filter_excludes_are_not_released(tiny: tuple[str, Path]) -> None:
    """``WHERE name IN ('a', 'a ')`` leaves one declared group always empty: it is not released, and its ε
    share is not spent on it (TPC-H Q12 keeps 2 of 7 ship modes). The choice reads the query and the policy
    only."""
    dsn, tmp = tiny
    path = tmp / "policy.toml"
    path.write_text('[tables.t.columns.name]\ndomain = ["a", "a ", "a  "]\n')
    session = sqldp.connect(dsn, path)
    for sql, kept in (
        ("SELECT name, COUNT(*) FROM t WHERE name IN ('a', 'a ') GROUP BY name", ["a", "a "]),
        ("SELECT name, COUNT(*) FROM t WHERE 'a  ' = name GROUP BY name", ["a  "]),
        ("SELECT name, COUNT(*) FROM t WHERE name <> 'a' GROUP BY name", ["a", "a ", "a  "]),
    ):
        out = session.run(sql, epsilon=1.0)
        assert [r["key"]["name"] for r in out.rows] == kept, sql


def test_group_by_year_of_a_declared_date_range(pg_dsn: str) -> None:
    """EXTRACT(YEAR FROM d) takes its groups from d's declared range (NR §3.3.11), narrowed by constant
    bounds in WHERE; a row lands in one year, so each year gets the full ε (parallel composition), and a
    year outside the declared range is never released, whatever the data holds."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE e (id INT PRIMARY KEY, d DATE NOT NULL)")
        conn.execute("INSERT INTO e VALUES (1, '2001-03-01'), (2, '2001-07-09'), (3, '2003-01-01'), (4, '1999-05-05')")
    policy = Policy.from_toml('[defaults]\nepsilon = 1.0\n[tables.e.columns.d]\nrange = ["2000-01-01", "2004-12-31"]\n')
    session = sqldp.connect(pg_dsn, policy)
    out = session.analyze("SELECT EXTRACT(YEAR FROM e.d) AS y, COUNT(*) FROM e GROUP BY EXTRACT(YEAR FROM e.d)")
    assert len(out.measurements) == 5  # 2000 … 2004; 1999's row is outside the declared range
    assert {m.epsilon for g in out.measurements for m in g} == {1.0}
    true = {2001: 2.0, 2003: 1.0}
    released = session.run("SELECT EXTRACT(YEAR FROM e.d) AS y, COUNT(*) AS n FROM e GROUP BY EXTRACT(YEAR FROM e.d)")
    assert [r["key"]["y"] for r in released.rows] == [2000, 2001, 2002, 2003, 2004]
    assert [g[0].true_value for g in released.measurements] == [true.get(y, 0.0) for y in range(2000, 2005)]
    narrowed = session.run(
        "SELECT EXTRACT(YEAR FROM e.d) AS y, COUNT(*) AS n FROM e "
        "WHERE e.d BETWEEN DATE '2001-01-01' AND DATE '2002-12-31' GROUP BY EXTRACT(YEAR FROM e.d)"
    )
    assert [r["key"]["y"] for r in narrowed.rows] == [2001, 2002]


PHONES = """
CREATE TABLE c (id INT PRIMARY KEY, phone CHAR(15) NOT NULL, bal INT NOT NULL);
"""


def _phones(dsn: str, rows: list[tuple[int, str]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM c")
        for i, phone in rows:
            conn.execute("INSERT INTO c VALUES (%s, %s, 1)", (i, phone))


def test_a_key_expression_restricted_by_an_in_list_takes_the_list_as_its_domain(pg_dsn: str) -> None:
    """TPC-H Q22's shape: ``GROUP BY SUBSTRING(phone FROM 1 FOR 2)`` with ``WHERE SUBSTRING(phone FROM 1 FOR 2)
    IN ('13', '31', '23')``. The groups are the listed constants whatever the data holds (NR §3.3.11: the
    WHERE clause's constraint propagated to the derived key), each released with the full ε (a row has one
    key): over every neighbour adding one row — a listed prefix, an unlisted one — the released groups are the
    same three and the exact privacy loss is at most ε; the true values are PostgreSQL's own GROUP BY."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PHONES)
    policy = Policy.from_toml("[defaults]\nepsilon = 1.0\n")
    sql = (
        "SELECT SUBSTRING(phone FROM 1 FOR 2) AS code, COUNT(*) AS n FROM c "
        "WHERE SUBSTRING(phone FROM 1 FOR 2) IN ('13', '31', '23') GROUP BY SUBSTRING(phone FROM 1 FOR 2)"
    )
    base = [(1, "13-555"), (2, "13-777"), (3, "31-000"), (4, "99-000")]
    released = []
    for extra in ([], [(9, "23-111")], [(9, "13-111")], [(9, "55-111")], [(9, "3")]):
        _phones(pg_dsn, [*base, *extra])
        result = sqldp.connect(pg_dsn, policy, seed=1).run(sql, epsilon=EPSILON)
        assert [r["key"]["code"] for r in result.rows] == ["13", "31", "23"]
        with psycopg.connect(pg_dsn) as conn:
            plain = dict(conn.execute(sql).fetchall())
        assert [g[0].true_value for g in result.measurements] == [float(plain.get(k, 0)) for k in ("13", "31", "23")]
        released.append([(m.true_value, m.noise_scale, m.mechanism) for g in result.measurements for m in g])
    for other in released[1:]:
        assert joint_loss(released[0], other) <= EPSILON + 1e-9


def test_an_undeclared_private_column_restricted_by_an_in_list_is_grouped_by_the_list(pg_dsn: str) -> None:
    """The same rule for a plain column of a private table without a declared domain: the IN list is the
    domain, so no partition selection (and no δ) is needed; without the list the key stays refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(PHONES)
    _phones(pg_dsn, [(1, "a"), (2, "b"), (3, "b"), (4, "z")])
    session = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n"), seed=1)
    out = session.run("SELECT phone, COUNT(*) FROM c WHERE phone IN ('b', 'a', 'q') GROUP BY phone")
    assert [r["key"]["phone"] for r in out.rows] == ["b", "a", "q"]
    assert [g[0].true_value for g in out.measurements] == [2.0, 1.0, 0.0]
    assert out.params is not None and out.params.delta is None
    with pytest.raises(RefusedError, match="which groups exist in private table"):
        session.run("SELECT phone, COUNT(*) FROM c GROUP BY phone")
    with pytest.raises(RefusedError, match=r"restricts to constants \(key IN"):
        session.run("SELECT SUBSTRING(phone FROM 1 FOR 1), COUNT(*) FROM c GROUP BY SUBSTRING(phone FROM 1 FOR 1)")


def test_date_trunc_keys_take_their_periods_from_the_declared_range_and_cannot_fail(pg_dsn: str) -> None:
    """``date_trunc('month' | 'year', d)`` of a DATE column with a declared range: the groups are the periods the
    range spans (NR §3.3.11), released as the DATE of their first day, with PostgreSQL's counts. The key runs
    guarded (sqldp.groups.guard_date_trunc): a date after the year 294276, on which PostgreSQL's own
    date_trunc fails ("date out of range for timestamp"), falls in no group instead of failing the statement —
    an error there would answer for the data. Without the guard's declared range the key stays refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE e (id INT PRIMARY KEY, d DATE NOT NULL)")
        conn.execute(
            "INSERT INTO e VALUES (1, '2001-03-01'), (2, '2001-03-31'), (3, '2001-05-09'), (4, '1999-05-05'), "
            "(5, '2001-12-31')"
        )
    policy = Policy.from_toml('[defaults]\nepsilon = 1.0\n[tables.e.columns.d]\nrange = ["2001-02-10", "2001-06-30"]\n')
    session = sqldp.connect(pg_dsn, policy, seed=1)
    sql = "SELECT date_trunc('month', e.d) AS m, COUNT(*) AS n FROM e GROUP BY date_trunc('month', e.d)"
    with psycopg.connect(pg_dsn) as conn:
        plain = {k.date(): float(n) for k, n in conn.execute(sql).fetchall()}
    out = session.analyze(sql)
    months = [dt.date(2001, m, 1) for m in range(2, 7)]
    assert [g[0].true_value for g in out.measurements] == [plain.get(m, 0.0) for m in months]
    assert [r["key"]["m"] for r in session.run(sql).rows] == months
    years = session.run("SELECT date_trunc('year', e.d) AS y, COUNT(*) FROM e GROUP BY date_trunc('year', e.d)")
    assert [r["key"]["y"] for r in years.rows] == [dt.date(2001, 1, 1)]
    assert [g[0].true_value for g in years.measurements] == [4.0]  # 2001's rows, inside and outside the range
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO e VALUES (6, '300000-01-01')")
        with pytest.raises(psycopg.errors.DatetimeFieldOverflow):
            conn.execute(sql)
    assert [g[0].true_value for g in session.analyze(sql).measurements] == [plain.get(m, 0.0) for m in months]
    bare = sqldp.connect(pg_dsn, Policy.from_toml("[defaults]\nepsilon = 1.0\n"))
    with pytest.raises(RefusedError, match="only plain columns"):
        bare.analyze(sql)
