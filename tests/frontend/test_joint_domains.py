"""Group domains of several public keys (sqldp.groups._joint_domains): the DISTINCT tuples of the public
tables under the query's conjuncts over public tables alone, not the product of each key's values.

What must hold: the released groups are exactly those tuples (times the other parts' groups: a declared
domain, a key of a public table no public conjunct links), the same on every database with these public
tables whatever the private rows — a private conjunct never narrows them; the true values are PostgreSQL's
own GROUP BY where it has rows and 0 elsewhere; and over every neighbour adding one private row the exact
privacy loss of the whole released vector is at most ε. The mutants these catch: the product of each key's
values (9 groups where 4 pairs exist), a domain that also reads a private conjunct or the private table
(its set follows the private rows), keys matched to the wrong tuple (the values no longer PostgreSQL's)."""

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
DROP TABLE IF EXISTS sales, item, brand, store;
CREATE TABLE brand (bk INT PRIMARY KEY, bname TEXT NOT NULL);
CREATE TABLE item (ik INT PRIMARY KEY, item_id TEXT NOT NULL, descr TEXT, cat TEXT NOT NULL,
                   bk INT NOT NULL REFERENCES brand (bk));
CREATE TABLE store (sk INT PRIMARY KEY, state TEXT NOT NULL);
CREATE TABLE sales (id INT PRIMARY KEY, ik INT NOT NULL REFERENCES item (ik), sk INT NOT NULL REFERENCES store (sk),
                    channel TEXT NOT NULL, qty INT NOT NULL);
INSERT INTO brand VALUES (1, 'acme'), (2, 'zeta'), (3, 'omni');
INSERT INTO item VALUES (1, 'A', 'red shoe', 'x', 1), (2, 'A', 'blue hat', 'x', 2), (3, 'B', 'red shoe', 'y', 1),
                        (4, 'C', 'green cap', 'x', 1), (5, 'C', NULL, 'y', 3), (6, 'B', 'red shoe', 'y', 1);
INSERT INTO store VALUES (1, 'CA'), (2, 'NY'), (3, 'CA');
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.brand]
rows = "public"
[tables.item]
rows = "public"
[tables.store]
rows = "public"
[tables.sales]
rows = "private"
[tables.sales.columns.qty]
range = [0, 5]
[tables.sales.columns.channel]
domain = ["web", "shop"]
"""
# (id, ik, sk, channel, qty)
BASES: list[list[tuple[int, int, int, str, int]]] = [
    [],
    [(1, 1, 1, "web", 2)],
    [(1, 1, 1, "web", 2), (2, 3, 2, "shop", 5), (3, 3, 1, "web", 1), (4, 5, 3, "shop", 0), (5, 6, 2, "web", 4)],
]


def _load(dsn: str, rows: list[tuple[int, int, int, str, int]]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DELETE FROM sales")
        for row in rows:
            conn.execute("INSERT INTO sales VALUES (%s, %s, %s, %s, %s)", row)


@pytest.fixture
def dsn(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    yield pg_dsn


def _plain(dsn: str, sql: str, keys: int) -> dict[tuple[object, ...], float]:
    with psycopg.connect(dsn) as conn:
        return {tuple(r[:keys]): float(r[keys]) for r in conn.execute(sql).fetchall()}


def _public(dsn: str, sql: str) -> set[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return {tuple(r) for r in conn.execute(sql).fetchall()}


def _run(dsn: str, sql: str) -> sqldp.result.Result:
    result = sqldp.connect(dsn, Policy.from_toml(POLICY), seed=5).run(sql, epsilon=EPSILON)
    assert result.released
    return result


def _groups(result: sqldp.result.Result, names: list[str]) -> dict[tuple[object, ...], float]:
    out = {}
    for row, measured in zip(result.rows, result.measurements, strict=True):
        key = tuple(row["key"][n] for n in names)
        assert key not in out, key  # each tuple released once
        assert measured[0].true_value is not None
        out[key] = measured[0].true_value
    return out


PAIRS = "SELECT DISTINCT item_id, descr FROM item WHERE descr IS NOT NULL"
CASES = [
    # two keys of one public use: its 4 existing (item_id, descr) pairs, not 3 x 3
    (
        "SELECT i.item_id, i.descr, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik {extra}"
        "GROUP BY i.item_id, i.descr",
        ["item_id", "descr"],
        PAIRS,
    ),
    # a public conjunct narrows the tuples; the private one ({extra}) never does
    (
        "SELECT i.item_id, i.descr, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik AND i.cat = 'y' {extra}"
        "GROUP BY i.item_id, i.descr",
        ["item_id", "descr"],
        "SELECT DISTINCT item_id, descr FROM item WHERE descr IS NOT NULL AND cat = 'y'",
    ),
    # keys of two public tables a public conjunct links (item.bk = brand.bk): the pairs of the public join
    (
        "SELECT b.bname, i.cat, COUNT(*) AS n FROM sales s, item i, brand b WHERE s.ik = i.ik AND i.bk = b.bk "
        "{extra}GROUP BY b.bname, i.cat",
        ["bname", "cat"],
        "SELECT DISTINCT b.bname, i.cat FROM item i, brand b WHERE i.bk = b.bk",
    ),
    # a part no public conjunct links (store, joined only through the private sales) is independent: the
    # product of the joint pairs with the store states; a declared domain multiplies the same way
    (
        "SELECT i.item_id, s.channel, i.descr, st.state, COUNT(*) AS n FROM sales s, item i, store st "
        "WHERE s.ik = i.ik AND s.sk = st.sk {extra}GROUP BY i.item_id, s.channel, i.descr, st.state",
        ["item_id", "channel", "descr", "state"],
        "SELECT p.item_id, c.channel, p.descr, st.state FROM (" + PAIRS + ") p, "
        "(VALUES ('web'), ('shop')) c (channel), (SELECT DISTINCT state FROM store) st",
    ),
    # an expression of a public column is a public key: its distinct values over the public rows
    (
        "SELECT SUBSTRING(i.descr, 1, 3) AS pre, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik {extra}"
        "GROUP BY SUBSTRING(i.descr, 1, 3)",
        ["pre"],
        "SELECT DISTINCT SUBSTRING(descr, 1, 3) FROM item WHERE descr IS NOT NULL",
    ),
    # … and part of a joint domain with another key of its use
    (
        "SELECT i.cat, SUBSTRING(i.descr, 1, 3) AS pre, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik "
        "{extra}GROUP BY i.cat, SUBSTRING(i.descr, 1, 3)",
        ["cat", "pre"],
        "SELECT DISTINCT cat, SUBSTRING(descr, 1, 3) FROM item WHERE descr IS NOT NULL",
    ),
]


@pytest.mark.parametrize(("sql", "names", "domain"), CASES)
def test_the_groups_are_the_public_tuples_whatever_the_private_rows(
    dsn: str, sql: str, names: list[str], domain: str
) -> None:
    expected = _public(dsn, domain)
    for rows in BASES:
        _load(dsn, rows)
        for extra in ("", "AND s.qty > 1 "):  # a private conjunct never narrows the released set
            text = sql.format(extra=extra)
            got = _groups(_run(dsn, text), names)
            assert set(got) == expected, (rows, extra)
            # PostgreSQL's own answer where it has rows (every one of them inside the domain, but a NULL key:
            # never a group, as for one public column), 0 elsewhere
            plain = {k: v for k, v in _plain(dsn, text, len(names)).items() if None not in k}
            assert set(plain) <= expected
            assert got == {k: plain.get(k, 0.0) for k in expected}, (rows, extra)


def test_the_released_order_and_sql_of_a_joint_domain(dsn: str) -> None:
    """One domain statement reads the tuples (at the first key; none at the second), and the answer is matched to
    them by ``=`` on both keys."""
    session = sqldp.connect(dsn, Policy.from_toml(POLICY), seed=5)
    prepared = session.prepare(CASES[0][0].format(extra=""), epsilon=EPSILON)
    assert prepared.statements is not None
    first, second = prepared.statements.domains
    assert first is not None and second is None
    assert "SELECT DISTINCT i.item_id, i.descr FROM item AS i" in first
    assert "ON __a.__key0 = __d0.v0 AND __a.__key1 = __d0.v1" in prepared.statements.answer


# the neighbours: one more sale than the base, any item, a store of each state, the extreme quantities (the
# channel is no key of these queries)
ADDED = [(99, ik, sk, "web", qty) for ik, sk, qty in product_rows(range(1, 7), (1, 2), (0, 5))]


def _vector(dsn: str, sql: str, rows: list[tuple[int, int, int, str, int]]) -> list[tuple[float, float, str]]:
    _load(dsn, rows)
    result = _run(dsn, sql)
    out = []
    for measured in result.measurements:
        for m in measured:
            assert m.true_value is not None
            out.append((m.true_value, m.noise_scale, m.mechanism))
    return out


@pytest.mark.parametrize(
    "sql",
    [
        CASES[0][0].format(extra=""),
        "SELECT i.item_id, i.descr, st.state, COUNT(*) AS n, SUM(s.qty) AS q FROM sales s, item i, store st "
        "WHERE s.ik = i.ik AND s.sk = st.sk GROUP BY i.item_id, i.descr, st.state",
    ],
)
def test_one_more_sale_costs_at_most_epsilon_over_the_joint_groups(dsn: str, sql: str) -> None:
    for base in BASES[1:]:
        x = _vector(dsn, sql, base)
        for n in rows_added({"sales": base}, "sales", ADDED):
            y = _vector(dsn, sql, n.db["sales"])
            loss = joint_loss(x, y)  # asserts the same released groups on both sides
            assert loss <= EPSILON + 1e-9, (n.change, loss)


def test_a_key_expression_over_a_private_column_without_a_domain_stays_refused(dsn: str) -> None:
    """Only expressions of public columns take their values from the public rows (and of a declared column from
    its domain: UPPER(s.channel) is WEB and SHOP)."""
    with pytest.raises(RefusedError, match="only plain columns"):
        _run(dsn, "SELECT s.qty + 1, COUNT(*) FROM sales s GROUP BY s.qty + 1")
    upper = _run(dsn, "SELECT UPPER(s.channel) AS c, COUNT(*) FROM sales s GROUP BY UPPER(s.channel)")
    assert [r["key"]["c"] for r in upper.rows] == ["SHOP", "WEB"]


def test_expressions_of_a_joint_domains_keys(dsn: str) -> None:
    """An output and a HAVING conjunct over two keys of one joint domain are computed over its tuples by the
    domain's statement: the values are PostgreSQL's, for every pair, rows or not."""
    sql = (
        "SELECT i.item_id || '/' || i.descr AS both, COUNT(*) AS n FROM sales s, item i WHERE s.ik = i.ik "
        "GROUP BY i.item_id, i.descr HAVING i.item_id <> 'B' OR i.descr LIKE 'green%' ORDER BY 1"
    )
    expected = sorted(f"{a}/{b}" for a, b in _public(dsn, PAIRS) if a != "B" or b.startswith("green"))
    for rows in BASES:
        _load(dsn, rows)
        result = _run(dsn, sql)
        assert [r["key"]["both"] for r in result.rows] == expected
        plain = {k: float(n) for k, n in _plain(dsn, sql, 1).items() if k[0] is not None}
        kept = [ms for ms in result.measurements if ms[0].noisy_value is not None]
        assert len(kept) == len(expected)
        got = {
            r["key"]["both"]: next(m for m in kept if shown(m[0].noisy_value) == r["values"]["n"])[0].true_value
            for r in result.rows
        }
        assert got == {k: plain.get((k,), 0.0) for k in expected}, rows


def shown(noisy: float) -> float:
    """A released count as the rows show it: the noisy value rounded half away from zero, at least 0."""
    return max(0.0, float(math.floor(abs(noisy) + 0.5)) * (1 if noisy >= 0 else -1))
