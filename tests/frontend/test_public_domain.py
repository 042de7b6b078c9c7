"""Groups of a public table's column narrowed by the query's conjuncts over public tables alone
(sqldp.groups._public_domain): TPC-H Q5's n_name, joined to region with r_name = 'ASIA', has the 5 Asian
nations as groups, not 25.

What must hold: the released groups are exactly the key values the public conjuncts let through (with the
declared domain, within it), present in the private data or not, so the set is the same on every database
with these public tables — a private conjunct never narrows it (the mutant that also takes conjuncts reading
private columns releases a set that follows the private rows, and fails here), and a group outside it is
empty on every database (the answers equal PostgreSQL's own GROUP BY where it has rows)."""

from __future__ import annotations

import psycopg
import pytest
from sqlglot import exp

import sqldp
from sqldp.policy import Policy

DDL = """
DROP TABLE IF EXISTS f, d;
CREATE TABLE d (k INT PRIMARY KEY, name TEXT NOT NULL, region TEXT NOT NULL);
CREATE TABLE f (id INT PRIMARY KEY, k INT NOT NULL REFERENCES d (k), v INT NOT NULL);
INSERT INTO d VALUES (1, 'ann', 'east'), (2, 'bob', 'east'), (3, 'cid', 'west'), (4, 'dan', 'east');
"""
POLICY = '[tables.d]\nrows = "public"\n[tables.f]\nrows = "private"\n[tables.f.columns.v]\nrange = [0, 10]\n'
DECLARED = POLICY + '[tables.d.columns.name]\ndomain = ["ann", "bob", "cid", "eve"]\n'
QUERY = "SELECT d.name, COUNT(*) AS n FROM f, d WHERE f.k = d.k AND d.region = 'east' {extra}GROUP BY d.name"


def _load(dsn: str, rows: list[tuple[int, int, int]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(DDL)
        for row in rows:
            conn.execute("INSERT INTO f VALUES (%s, %s, %s)", row)


def _groups(dsn: str, policy: str, extra: str = "") -> dict[str, float]:
    session = sqldp.connect(dsn, Policy.from_toml(policy), seed=3)
    result = session.run(QUERY.format(extra=extra), epsilon=1.0)
    return {r["key"]["name"]: m.true_value for r, (m,) in zip(result.rows, result.measurements, strict=True)}


@pytest.mark.parametrize(("policy", "expected"), [(POLICY, {"ann", "bob", "dan"}), (DECLARED, {"ann", "bob"})])
def test_public_conjuncts_narrow_the_groups_whatever_the_private_rows(
    pg_dsn: str, policy: str, expected: set[str]
) -> None:
    for rows in ([], [(1, 1, 5)], [(1, 1, 5), (2, 3, 0), (3, 2, 7), (4, 2, 0)]):
        _load(pg_dsn, rows)
        for extra in ("", "AND f.v > 3 "):  # a private conjunct never narrows the released set
            got = _groups(pg_dsn, policy, extra)
            assert set(got) == expected, (rows, extra, got)
            with psycopg.connect(pg_dsn) as conn:
                plain = dict(conn.execute(QUERY.format(extra=extra)).fetchall())
            assert {k: v for k, v in got.items() if v} == {k: float(n) for k, n in plain.items() if k in expected}


def test_only_public_conjuncts_linked_to_the_key_narrow_it(pg_dsn: str) -> None:
    """A filter on a public table the key's table is not joined to (through public conjuncts) does not narrow
    the key's values; the domain statement leaves it out rather than reading a cross product."""
    from sqldp import groups
    from sqldp.catalog import Catalog
    from sqldp.form import AnalysisForm
    from sqldp.frontend import parse
    from sqldp.normalize import normalize

    _load(pg_dsn, [(1, 1, 5)])
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS e; CREATE TABLE e (z INT PRIMARY KEY); INSERT INTO e VALUES (1), (2)")
        catalog = Catalog.from_database(conn)
    policy = Policy.from_toml(POLICY + '[tables.e]\nrows = "public"\n')
    sql = "SELECT d.name, COUNT(*) FROM f, d, e WHERE f.k = d.k AND d.region = 'east' AND e.z = 1 GROUP BY d.name"
    form = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(form, AnalysisForm)
    (domain,) = groups.key_domains(form, policy, catalog)
    assert domain.query is not None
    assert {t.name for t in domain.query.find_all(exp.Table)} == {"d"}
