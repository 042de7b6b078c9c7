"""The model-checking global sensitivity (NR §3.3.13) against the report's examples, brute force over every
database of a small domain, and witnesses replayed on PostgreSQL.

* NR §4.3.6.4: the self-join ``t1.x ≤ t2.x < t1.x + 5`` has sensitivity 9 (exact method), 10 (fast method).
* NR §4.3.6.1: TPC-H Q10 grouped by order date over an N-day window has sensitivity N w.r.t. customer.
* Theorem 3.109's four cases: tables without a uniqueness constraint give 0 or ∞.
* Brute force: every database over a domain of three values and every removed row; the largest derivative
  never exceeds the analyser's bound, and equals it where the analyser says the bound is reached.
* Witnesses replayed on PostgreSQL and brute force over random shapes: ``test_model_check_oracles.py``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sqldp.catalog import Catalog
from sqldp.datasets import dataset_path
from sqldp.frontend import parse
from sqldp.sensitivity import model_check as mc

TPCH = Catalog.from_file(dataset_path("tpch.sql"))

Q10_BY_DAY = """
SELECT c_custkey, c_name, SUM(l_extendedprice * (1 - l_discount)) AS revenue, c_acctbal, n_name, c_address,
       c_phone, c_comment, o_orderdate
FROM customer, orders, lineitem, nation
WHERE c_custkey = o_custkey AND l_orderkey = o_orderkey AND o_orderdate >= DATE '1993-10-01'
  AND o_orderdate < DATE '1993-10-01' + INTERVAL '{n}' DAY AND l_returnflag = 'R' AND c_nationkey = n_nationkey
GROUP BY c_custkey, c_name, c_acctbal, c_phone, n_name, c_address, c_comment, o_orderdate
"""


def analyse(query: str, catalog: Catalog, table: str, **kw: Any) -> mc.GlobalSensitivity:
    return mc.sensitivity(mc.from_select(parse(query, catalog).tree), catalog, table, **kw)


# -- the report's examples ------------------------------------------------------------------------------

SELF_JOIN_DDL = "CREATE TABLE t (x int4 PRIMARY KEY, y int4 NOT NULL);"
SELF_JOIN = "SELECT t1.y, t2.y FROM t AS t1, t AS t2 WHERE t2.x >= t1.x AND t2.x < t1.x + 5"


def test_self_join_exact_and_fast_methods() -> None:
    """NR §4.3.6.4: 9 by the exact method (§3.3.13.4), 10 by the sum over copies (§3.3.13.6)."""
    cat = Catalog.from_ddl(SELF_JOIN_DDL)
    exact = analyse(SELF_JOIN, cat, "t", method="exact", timeout=30)
    fast = analyse(SELF_JOIN, cat, "t", method="fast", timeout=30)
    auto = analyse(SELF_JOIN, cat, "t", timeout=30)
    assert (exact.value, exact.exact) == (9, True)
    assert (fast.value, fast.exact, fast.method) == (10, False, "smt-fast")
    assert auto.value == 9


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 12])
def test_modified_q10_has_sensitivity_n(n: int) -> None:
    """NR §4.3.6.1: an N-day window of per-day groups; one customer reaches one group per day."""
    query = Q10_BY_DAY.format(n=n)
    customer = analyse(query, TPCH, "customer", timeout=30)
    assert (customer.value, customer.exact) == (n, True)
    for table in ("orders", "lineitem"):
        assert analyse(query, TPCH, table, timeout=30).value == 1
    # one nation holds any number of customers
    assert analyse(query, TPCH, "nation", timeout=30).value == math.inf


def test_theorem_3_109_cases() -> None:
    cat = Catalog.from_ddl(
        "CREATE TABLE k (a INT PRIMARY KEY, b INT NOT NULL);\n"
        "CREATE TABLE n (a INT, b INT);\n"  # no uniqueness constraint: repeated rows
        "CREATE TABLE m (a INT NOT NULL, b INT NOT NULL, UNIQUE (a));\n"
    )
    # case 4: another table may repeat its rows, so one k row joins any number of equal n rows
    assert analyse("SELECT k.a FROM k, n WHERE k.a = n.a", cat, "k").value == math.inf
    # case 2: n itself without keys, used once: its row joins one k row
    assert analyse("SELECT k.a FROM k, n WHERE k.a = n.a", cat, "n").value == 1
    # case 3: n used twice without keys
    assert analyse("SELECT n1.a FROM n n1, n n2 WHERE n1.a = n2.a", cat, "n").value == math.inf
    # an unsatisfiable filter: no row can change the result, whatever the keys
    assert analyse("SELECT k.a FROM k, n WHERE k.a = n.a AND k.a > 3 AND k.a < 2", cat, "k").value == 0
    # a UNIQUE constraint over NOT NULL columns is a key like a primary key
    assert analyse("SELECT k.a FROM k, m WHERE k.b = m.a", cat, "k").value == 1
    assert analyse("SELECT k.a FROM k, m WHERE k.b = m.a", cat, "m").value == math.inf


def test_column_domains() -> None:
    """Φ's values are the ones PostgreSQL stores (every database satisfies these, so the bound stays an upper
    bound, and "exact" names a database that exists): SMALLINT's range, NUMERIC(p, s)'s grid, VARCHAR(n)'s
    length, CHAR(n)'s blank-insensitive equality."""
    cat = Catalog.from_ddl(
        "CREATE TABLE k (x int PRIMARY KEY);\n"
        "CREATE TABLE i2 (a smallint PRIMARY KEY);\n"
        "CREATE TABLE d (a numeric(3,2) PRIMARY KEY);\n"
        "CREATE TABLE v (a varchar(3) PRIMARY KEY);\n"
        "CREATE TABLE c (a char(3) PRIMARY KEY);\n"
    )
    # 32760 … 32767: eight SMALLINT values (unbounded as mathematical integers)
    assert analyse("SELECT k.x FROM k, i2 WHERE i2.a > 32759", cat, "k").value == 8
    # 0.05, 0.06, 0.07 on the grid of 0.01 (every real in between, as reals)
    assert analyse("SELECT k.x FROM k, d WHERE d.a BETWEEN 0.05 AND 0.07", cat, "k").value == 3
    # 'a' and 'a ' are two VARCHAR values but one CHAR value
    assert analyse("SELECT k.x FROM k, v WHERE v.a IN ('a', 'a ')", cat, "k").value == 2
    assert analyse("SELECT k.x FROM k, c WHERE c.a IN ('a', 'a ')", cat, "k").value == 1
    # a VARCHAR(3) holds no 4-character string
    assert analyse("SELECT k.x FROM k, v WHERE v.a = 'abcd'", cat, "k").value == 0


def test_time_limit_gives_infinity_and_says_so() -> None:
    cat = Catalog.from_ddl(SELF_JOIN_DDL)
    r = analyse(SELF_JOIN, cat, "t", method="exact", timeout=1e-6)
    assert r.value == math.inf and r.timed_out and not r.exact and r.to_json()["timed_out"] is True
    assert not analyse(SELF_JOIN, cat, "t", timeout=30).timed_out


def test_derived_tables_are_inlined_and_outer_joins_refused() -> None:
    """TPC-H Q7's derived table is a join–filter block: inlined, one lineitem row is one join row and (its
    year an uninterpreted function) at most one group; outer joins are not join–filter queries."""
    q7 = (Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries" / "q07.sql").read_text()
    spj = mc.from_select(parse(q7, TPCH).tree)
    assert {u.alias for u in spj.uses} == {"supplier", "lineitem", "orders", "customer", "n1", "n2"}
    assert mc.sensitivity(spj, TPCH, "lineitem").value == 1
    bag = mc.sensitivity(mc.SPJ(spj.uses, spj.conditions), TPCH, "lineitem")
    assert (bag.value, bag.exact) == (1, True)
    cat = Catalog.from_ddl(BRUTE_DDL)
    with pytest.raises(ValueError, match="JOIN"):
        mc.from_select(parse("SELECT r.a FROM r LEFT JOIN s ON r.b = s.b", cat).tree)
    with pytest.raises(ValueError, match="workflow"):
        mc.from_select(parse("SELECT d.n FROM (SELECT COUNT(*) AS n FROM r) AS d", cat).tree)


def test_untranslatable_filters_only_loosen() -> None:
    """LIKE is not translated: it becomes a free Boolean, and the bound is said to be an upper bound."""
    cat = Catalog.from_ddl(SELF_JOIN_DDL + "CREATE TABLE u (x int4 PRIMARY KEY, s text NOT NULL);")
    r = analyse("SELECT t.y FROM t, u WHERE t.x = u.x AND u.s LIKE 'a%'", cat, "u")
    assert r.value == 1 and not r.exact and r.approximated


# -- brute force ----------------------------------------------------------------------------------------

BRUTE_DDL = "CREATE TABLE r (a INT PRIMARY KEY, b INT NOT NULL);\nCREATE TABLE s (b INT PRIMARY KEY, c INT NOT NULL);\n"
DOMAIN = (0, 1, 2)
Row = tuple[int, int]
Db = dict[str, tuple[Row, ...]]
# (SQL, tables of the product in FROM order, filter over their rows, projection for set semantics or None)
BRUTE: list[tuple[str, tuple[str, ...], Callable[..., bool], Callable[..., tuple] | None]] = [
    ("SELECT r.a FROM r, s WHERE r.b = s.b", ("r", "s"), lambda r, s: r[1] == s[0], None),
    ("SELECT r.a FROM r, s WHERE r.b = s.b AND r.a <= 1", ("r", "s"), lambda r, s: r[1] == s[0] and r[0] <= 1, None),
    ("SELECT r.a FROM r, s WHERE r.a = s.c", ("r", "s"), lambda r, s: r[0] == s[1], None),
    ("SELECT r.a FROM r, s WHERE r.b < s.b", ("r", "s"), lambda r, s: r[1] < s[0], None),
    ("SELECT r1.a FROM r r1, r r2 WHERE r1.b = r2.a", ("r", "r"), lambda x, y: x[1] == y[0], None),
    (
        "SELECT r1.a FROM r r1, r r2 WHERE r2.a >= r1.a AND r2.a < r1.a + 2",
        ("r", "r"),
        lambda x, y: x[0] <= y[0] < x[0] + 2,
        None,
    ),
    ("SELECT DISTINCT s.c FROM r, s WHERE r.b = s.b", ("r", "s"), lambda r, s: r[1] == s[0], lambda r, s: (s[1],)),
    ("SELECT DISTINCT r.b FROM r, s WHERE r.b = s.c", ("r", "s"), lambda r, s: r[1] == s[1], lambda r, s: (r[1],)),
    ("SELECT s.c FROM r, s WHERE r.b = s.b GROUP BY s.c", ("r", "s"), lambda r, s: r[1] == s[0], lambda r, s: (s[1],)),
]


def _databases() -> list[Db]:
    """Every database of r(a PK, b) and s(b PK, c) over the domain: each key absent or mapped to a value."""
    tables = []
    for _ in ("r", "s"):
        options = [
            tuple((k, v) for k, v in zip(DOMAIN, choice, strict=True) if v is not None)
            for choice in itertools.product((None, *DOMAIN), repeat=len(DOMAIN))
        ]
        tables.append(options)
    return [{"r": r, "s": s} for r, s in itertools.product(*tables)]


def _size(db: Db, uses: tuple[str, ...], keep: Callable[..., bool], project: Callable[..., tuple] | None) -> int:
    rows = [combo for combo in itertools.product(*(db[t] for t in uses)) if keep(*combo)]
    return len({project(*c) for c in rows}) if project is not None else len(rows)


@pytest.mark.parametrize("case", range(len(BRUTE)))
def test_brute_force_never_exceeds_the_bound(case: int) -> None:
    query, uses, keep, project = BRUTE[case]
    cat = Catalog.from_ddl(BRUTE_DDL)
    dbs = _databases()
    for table in sorted(set(uses)):
        worst = 0
        for db in dbs:
            full = _size(db, uses, keep, project)
            for y in db[table]:
                smaller = {**db, table: tuple(r for r in db[table] if r != y)}
                worst = max(worst, full - _size(smaller, uses, keep, project))
        got = analyse(query, cat, table, timeout=30)
        assert worst <= got.value, (query, table, worst, got)
        if got.exact and got.value <= len(DOMAIN) - 1:
            # small enough to be reached inside the domain: brute force finds exactly the bound
            assert worst == got.value, (query, table, worst, got)


# (witnesses replayed on PostgreSQL, and brute force over random shapes: test_model_check_oracles.py)


def test_explain_shows_the_global_sensitivity() -> None:
    """`sqldp explain` prints each private table's global sensitivity (no data needed): Q12's shape, where an
    order reaches the two ship modes the IN list keeps (NR Table 21: Q12 = 2)."""
    from sqldp.commands.explain import explain
    from sqldp.policy import Policy

    query = (
        "SELECT l_shipmode, COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey "
        "AND l_shipmode IN ('MAIL', 'SHIP') GROUP BY l_shipmode"
    )
    out = explain(query, TPCH, Policy.from_file(dataset_path("tpch.toml")))
    g = out["global_sensitivity"]
    assert g["orders"]["groups"]["sensitivity"] == 2 and g["orders"]["join_rows"]["sensitivity"] == "inf"
    assert g["lineitem"]["groups"]["sensitivity"] == 1 and g["lineitem"]["join_rows"]["sensitivity"] == 1


def test_untranslatable_group_keys_give_an_upper_bound() -> None:
    """A group key the translation does not cover (UPPER) is a free value per row, so the bound may only grow,
    said so; EXTRACT(YEAR …) (TPC-H Q7–Q9) is translated exactly now."""
    query = "SELECT UPPER(o_clerk), COUNT(*) FROM orders GROUP BY UPPER(o_clerk)"
    r = analyse(query, TPCH, "orders")
    assert r.value == 1 and not r.exact and r.approximated
    query = "SELECT EXTRACT(YEAR FROM o_orderdate), COUNT(*) FROM orders GROUP BY EXTRACT(YEAR FROM o_orderdate)"
    r = analyse(query, TPCH, "orders")
    assert r.value == 1 and r.exact and not r.approximated


# -- translations: EXTRACT(YEAR), SUBSTRING, CASE, LIKE ---------------------------------------------------------

YEARS = """
SELECT EXTRACT(YEAR FROM o_orderdate), COUNT(*) FROM orders, customer
WHERE o_custkey = c_custkey AND o_orderdate BETWEEN DATE '{lo}' AND DATE '{hi}'
GROUP BY EXTRACT(YEAR FROM o_orderdate)
"""
# a mutant that reads EXTRACT(YEAR) as "days // 365" would put 1996-12-31 (day 365 of a leap year) in 1997
YEAR_CASES = [("1995-01-01", "1996-12-31", 2), ("1995-06-01", "1998-02-01", 4), ("1996-12-31", "1997-01-01", 2)]


@pytest.mark.parametrize(("lo", "hi", "years"), YEAR_CASES)
def test_extract_year_counts_the_calendar_years_of_a_window(lo: str, hi: str, years: int) -> None:
    """One customer's orders reach one group per calendar year the window touches: exact, witnessed on
    PostgreSQL in test_model_check_oracles."""
    r = analyse(YEARS.format(lo=lo, hi=hi), TPCH, "customer", timeout=30)
    assert (r.value, r.exact, r.approximated) == (years, True, ())


SUBSTRING = (
    "SELECT SUBSTRING(c_phone FROM 1 FOR 1), COUNT(*) FROM customer, nation WHERE c_nationkey = n_nationkey "
    "AND c_phone IN ('ab', 'ac', 'bd', 'b') GROUP BY SUBSTRING(c_phone FROM 1 FOR 1)"
)
CASE = (
    "SELECT o_orderkey FROM orders, lineitem WHERE o_orderkey = l_orderkey "
    "AND CASE WHEN l_linenumber BETWEEN 1 AND 3 THEN 1 ELSE 0 END = 1"
)


def test_substring_and_case_are_exact() -> None:
    """SUBSTRING(s FROM a FOR b) is z3's str.substr; CASE over NOT NULL columns a nested If."""
    r = analyse(SUBSTRING, TPCH, "nation", timeout=30)
    assert (r.value, r.exact) == (2, True)  # 'a…' and 'b…'
    r = analyse(CASE, TPCH, "orders", timeout=30)
    assert (r.value, r.exact) == (3, True)  # line numbers 1, 2, 3


def test_like_is_one_predicate_per_pattern() -> None:
    """LIKE is an uninterpreted predicate of the value: the same value gets the same answer on every row (a
    free Boolean per row would let one part both match and not), and the bound is not called exact."""
    query = (
        "SELECT p1.p_partkey FROM part AS p1, part AS p2 WHERE p1.p_name = p2.p_name "
        "AND p1.p_name LIKE '%green%' AND NOT p2.p_name LIKE '%green%'"
    )
    r = analyse(query, TPCH, "part", timeout=30)
    assert r.value == 0 and r.approximated
    r = analyse("SELECT p_partkey FROM part WHERE p_name LIKE '%green%'", TPCH, "part")
    assert r.value == 1 and not r.exact
