"""Declared groups an OR of constant filters excludes (sqldp.groups._constant_filter): TPC-H Q7's
``(n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE')``
keeps each nation key among {FRANCE, GERMANY}, so the other 23 declared nations of each key are never
released (and their share of ε, and the β the histogram allows, go to the groups that can hold rows).

Oracle: a table holding every row of a small domain (each key in {a, b, c, d, NULL}, x in {0, 1, NULL}).
Whether a group is non-empty on a database depends only on whether the database holds a row that has that key
and passes the (row-local) WHERE; every such row is in this table, so the keys PostgreSQL finds here passing
the WHERE are the groups that are non-empty on *some* database. Every declared group among them must be kept:
a dropped group is then empty on every database, and dropping it depends on the query and the policy only.
The Q7-shaped filters must also drop something (the test fails if the OR is not read).

Mutants (each fails here): an OR branch that says nothing about the key taken as excluding every value (drops
groups ``(k1 = 'a') OR (x = 1)`` keeps); NOT read through (``NOT (k1 = 'a' OR k1 = 'b')`` kept as {a, b}).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import psycopg
import pytest
from sqlglot import exp

from sqldp import groups
from sqldp.catalog import Catalog
from sqldp.form import AnalysisForm
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy

DDL = "CREATE TABLE p (id INT PRIMARY KEY, k1 TEXT, k2 TEXT, x INT);"
DOMAIN = ("a", "b", "c", "d")
POLICY = """
[tables.p.columns.k1]
domain = ["a", "b", "c", "d"]
[tables.p.columns.k2]
domain = ["a", "b", "c", "d"]
"""
# (WHERE, the groups of k1 and of k2 the filter keeps; None: all four declared)
FILTERS = [
    ("(p.k1 = 'a' AND p.k2 = 'b') OR (p.k1 = 'b' AND p.k2 = 'a')", ("a", "b"), ("a", "b")),
    ("(p.k1 = 'a' AND p.x = 1) OR p.k1 IN ('c', 'd')", ("a", "c", "d"), None),
    ("((p.k1 = 'a' OR p.k1 = 'b') AND p.x = 0) OR ('c' = p.k1)", ("a", "b", "c"), None),
    ("(p.k1 = 'a') OR (p.x = 1)", None, None),
    ("NOT (p.k1 = 'a' OR p.k1 = 'b')", None, None),
    ("(p.k1 = 'a' AND p.k2 = 'b') OR (p.k1 = 'b' AND p.k2 = 'a') OR p.k2 IS NULL", None, None),
    ("p.k1 = 'a' AND (p.k2 = 'c' OR p.k2 = 'c')", ("a",), ("c",)),
]


def _kept(where: str, catalog: Catalog, policy: Policy) -> list[tuple[object, ...] | None]:
    sql = f"SELECT p.k1, p.k2, COUNT(*) FROM p WHERE {where} GROUP BY p.k1, p.k2"
    form = normalize(parse(sql, catalog), catalog, policy)
    assert isinstance(form, AnalysisForm)
    return [d.values for d in groups.key_domains(form, policy, catalog)]


def _oracle(conn: psycopg.Connection, where: str, key: str) -> set[object]:
    """The values of ``key`` some row passing ``where`` has: the groups non-empty on some database."""
    return {r[0] for r in conn.execute(f"SELECT DISTINCT p.{key} FROM p WHERE {where}").fetchall()}


def _check(conn: psycopg.Connection, catalog: Catalog, policy: Policy) -> None:
    for where, want1, want2 in FILTERS:
        kept = _kept(where, catalog, policy)
        for key, domain, want in (("k1", kept[0], want1), ("k2", kept[1], want2)):
            assert domain is not None
            reachable = _oracle(conn, where, key) & set(DOMAIN)
            assert reachable <= set(domain), (where, key, domain, reachable)  # no non-empty group dropped
            assert tuple(domain) == (want or DOMAIN), (where, key, domain)


@pytest.fixture
def full(pg_dsn: str, tmp_path: Path) -> tuple[psycopg.Connection, Catalog, Policy]:
    conn = psycopg.connect(pg_dsn, autocommit=True)
    conn.execute(DDL)
    values = (*DOMAIN, None)
    rows = itertools.product(values, values, (0, 1, None))
    for i, (k1, k2, x) in enumerate(rows):
        conn.execute("INSERT INTO p VALUES (%s, %s, %s, %s)", (i, k1, k2, x))
    return conn, Catalog.from_database(conn), Policy.from_toml(POLICY)


def test_groups_an_or_of_constant_filters_excludes_are_empty_on_every_database(
    full: tuple[psycopg.Connection, Catalog, Policy],
) -> None:
    conn, catalog, policy = full
    with conn:
        _check(conn, catalog, policy)


def test_an_or_branch_that_says_nothing_taken_as_excluding_fails_the_oracle(
    full: tuple[psycopg.Connection, Catalog, Policy], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, catalog, policy = full
    real = groups._implied_literals

    def mutant(e: exp.Expr, key: exp.Expr) -> list[exp.Literal] | None:
        while isinstance(e, exp.Paren):
            e = e.this
        if isinstance(e, exp.Or):  # the mutant: branches that say nothing are skipped
            found = [f for b in e.flatten() if (f := mutant(b, key)) is not None]
            return [v for f in found for v in f] if found else None
        return real(e, key)

    with conn:
        monkeypatch.setattr(groups, "_implied_literals", mutant)
        with pytest.raises(AssertionError, match=r"no non-empty group dropped|k1 = 'a'"):
            _check(conn, catalog, policy)


def test_not_read_through_fails_the_oracle(
    full: tuple[psycopg.Connection, Catalog, Policy], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, catalog, policy = full
    real = groups._implied_literals

    def mutant(e: exp.Expr, key: exp.Expr) -> list[exp.Literal] | None:
        return real(e.this, key) if isinstance(e, exp.Not) else real(e, key)

    with conn:
        monkeypatch.setattr(groups, "_implied_literals", mutant)
        with pytest.raises(AssertionError, match="NOT"):
            _check(conn, catalog, policy)


def test_tpch_q7_keeps_two_nations_per_key() -> None:
    """Under both shipped TPC-H policies Q7's two nation keys are one joint domain (sqldp.groups._joint_domains:
    the OR conjunct links n1 and n2): the pairs of nations the OR lets through, each key within the two nations
    it restricts it to — 2 pairs × 2 years, where the product of each key's values was 2 × 2 × 2 (of 25 × 25 × 2;
    tests/sensitivity/test_tpch_answers.py reads the pairs)."""
    root = Path(__file__).resolve().parents[2]
    catalog = Catalog.from_file(root / "schemas" / "tpch.sql")
    sql = (root / "benchmarks" / "tpch" / "queries" / "q07.sql").read_text()
    for name in ("tpch", "tpch_catalog"):
        policy = Policy.from_file(name)
        form = normalize(parse(sql, catalog), catalog, policy)
        assert isinstance(form, AnalysisForm)
        n1, n2, year = groups.key_domains(form, policy, catalog)
        assert year.values == (1995, 1996), name
        assert n1.joint == n2.joint == (0, 1) and n1.query is n2.query and n1.query is not None, name
        text = n1.query.sql(dialect="postgres")
        assert "n1.n_name IN ('FRANCE', 'GERMANY')" in text and "n2.n_name IN ('GERMANY', 'FRANCE')" in text, name
        assert "(n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY'" in text, name
