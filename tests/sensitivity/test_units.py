"""Privacy units along foreign keys, answered with R2T (Dong, Fang, Yi, Tao and Machanavajjhala, "R2T:
Instance-optimal Truncation for Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022).

The oracles are independent of the code under test:

* brute force over tiny databases on real PostgreSQL, where a neighbour removes one unit with every row that
  references it (the unit relation of R2T §2): the truncated answers sqldp reads equal those computed here in
  Python from the database's structure, and the exact privacy loss of the released races — each the grid
  cell distribution of its Laplace noise (``cell_probability``), summed over the races since they are
  independent; the corrections and the maximum are post-processing — stays within ε;
* R2T's error bound (its Theorem 4.2, for races τ_j = b^j): over many seeded runs the released value lies in
  [Q(I) − 2·τ_{j*}·J·L/ε, Q(I)] in at least a 1 − β fraction of runs, τ_{j*} the first race ≥ DS and L the
  correction's factor, computed here by scipy from the event's exact probability.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from oracles import max_log_ratio
from scipy.optimize import brentq

import sqldp
from sqldp import mechanisms
from sqldp.catalog import Catalog
from sqldp.commands.analyze import format_text
from sqldp.errors import PolicyError, RefusedError
from sqldp.frontend import parse
from sqldp.mechanisms import NoiseSource
from sqldp.mechanisms import race as r2t
from sqldp.mechanisms.race import shift
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.result import R2T, Measurement
from sqldp.sensitivity import UnitPlan, plan
from sqldp.sensitivity.units import BASE, races

TPCH = Catalog.from_file("schemas/tpch.sql")
CUSTOMER = """
[units.customer]
key = "c_custkey"
[tables.nation]
rows = "public"
[tables.region]
rows = "public"
[tables.lineitem.columns.l_quantity]
range = [1, 50]
"""


def _plan(sql: str, policy: str = CUSTOMER, catalog: Catalog = TPCH) -> Any:
    p = Policy.from_toml(policy)
    p.validate(catalog)
    return plan(normalize(parse(sql, catalog), catalog, p), catalog, p)


# -- the policy -----------------------------------------------------------------------------------


def test_members_follow_the_catalogs_foreign_keys() -> None:
    p = Policy.from_toml(CUSTOMER + '[units.supplier]\nkey = "s_suppkey"\n')
    members = p.members(TPCH)
    assert set(members["customer"]) == {"customer", "orders", "lineitem"}
    assert set(members["supplier"]) == {"supplier", "partsupp", "lineitem"}
    # lineitem reaches supplier directly and through partsupp's composite key
    assert len(members["supplier"]["lineitem"]) == 2
    assert [str(h) for h in members["customer"]["lineitem"][0]] == [
        "lineitem(l_orderkey) → orders(o_orderkey)",
        "orders(o_custkey) → customer(c_custkey)",
    ]


def test_declared_foreign_keys_extend_the_catalogs() -> None:
    catalog = Catalog.from_ddl("CREATE TABLE a (id INT PRIMARY KEY); CREATE TABLE b (x INT, a_id INT);")
    policy = '[units.a]\nkey = "id"\n[[foreign_keys]]\ntable = "b"\ncolumns = ["a_id"]\nreferences = "a"\n'
    p = Policy.from_toml(policy)
    p.validate(catalog)
    assert set(p.members(catalog)["a"]) == {"a", "b"}
    assert _plan("SELECT COUNT(*) FROM b WHERE b.x > 0", policy, catalog).unit.name == "a"


@pytest.mark.parametrize(
    ("policy", "message"),
    [
        ('[units.customer]\ntable = "customer"\n', "missing key 'key'"),
        ('[units.customer]\nkey = "c_custkey"\nmax_contribution = 0.5\n', "max_contribution"),
        ('[units.customer]\nkey = "c_custkey"\nkye = 1\n', "unknown key 'kye'"),
        ('[units.customer]\nkey = "nope"\n', "column 'nope' is not in table 'customer'"),
        ('[units.customer]\nkey = "c_custkey"\n[tables.orders]\nrows = "public"\n', "belongs to unit 'customer'"),
        ('[units.customer]\nkey = "c_custkey"\n[tables.lineitem]\nweight = 2\n', "remove weight"),
        (
            '[units.customer]\nkey = "c_custkey"\n[[foreign_keys]]\ntable = "orders"\ncolumns = ["o_custkey"]\n'
            'references = "customer"\nref_columns = ["c_name"]\n',
            "not a primary key or UNIQUE",
        ),
        ('[[foreign_keys]]\ntable = "orders"\ncolumns = []\nreferences = "customer"\n', "non-empty list"),
    ],
)
def test_policy_errors_name_the_key(policy: str, message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        Policy.from_toml(policy).validate(TPCH)


# -- what the analysis accepts --------------------------------------------------------------------


def test_a_foreign_key_join_is_one_unit_per_join_row() -> None:
    q3 = (
        "SELECT COUNT(*) FROM customer, orders, lineitem WHERE o_custkey = c_custkey AND l_orderkey = o_orderkey "
        "AND o_orderdate < date '1997-01-01' AND l_shipdate > date '1994-01-01'"
    )
    p = _plan(q3)
    assert isinstance(p, UnitPlan) and p.data_independent and p.joined == ()
    assert p.thresholds == races(1e6) and len(p.thresholds) == 8
    assert p.describe() == {
        "unit": "customer",
        "table": "customer",
        "key": "c_custkey",
        "gs": 1e6,
        "races": 8,
        "signs": [1],
        "beta": 0.1,
        "joined": [],
    }
    # a table alone is joined along its path to find its unit
    alone = _plan("SELECT COUNT(*) FROM lineitem")
    assert alone.joined == ("orders AS __unit0 ON __unit0.o_orderkey = lineitem.l_orderkey",)
    # the orders unit: a line item's unit is its own l_orderkey, no join needed
    q12 = _plan(
        "SELECT COUNT(*) FROM orders, lineitem WHERE o_orderkey = l_orderkey", '[units.orders]\nkey = "o_orderkey"\n'
    )
    assert q12.joined == () and q12.unit.name == "orders"


@pytest.mark.parametrize(
    ("sql", "policy", "message"),
    [
        ("SELECT COUNT(*) FROM orders, part", CUSTOMER, "belongs to no privacy unit"),
        # a histogram needs every join row in one unit: a self-join's rows may be two customers'
        (
            "SELECT o1.o_orderstatus, COUNT(*) FROM orders o1, orders o2 WHERE o1.o_orderdate = o2.o_orderdate "
            "GROUP BY o1.o_orderstatus",
            CUSTOMER,
            "GROUP BY under a privacy unit where a join row may belong to several units",
        ),
        ("SELECT MAX(l_quantity) FROM lineitem", CUSTOMER, "only COUNT, SUM and AVG"),
    ],
)
def test_refusals_say_what_is_missing(sql: str, policy: str, message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        _plan(sql, policy)


@pytest.mark.parametrize(
    ("sql", "policy", "owners"),
    [
        # a self-join: the two orders may be of different customers
        ("SELECT COUNT(*) FROM orders o1, orders o2 WHERE o1.o_orderdate = o2.o_orderdate", CUSTOMER, 2),
        # unlinked uses: a customer row and an order of any customer
        ("SELECT COUNT(*) FROM customer, orders WHERE c_acctbal > 0", CUSTOMER, 2),
        # two units: a line item belongs to a customer and a supplier (the supplier by l_suppkey and by
        # partsupp's key, equal under the foreign key's own columns: one key)
        ("SELECT COUNT(*) FROM lineitem", CUSTOMER + '[units.supplier]\nkey = "s_suppkey"\n', 2),
    ],
)
def test_rows_of_several_units_go_to_the_linear_program(sql: str, policy: str, owners: int) -> None:
    p = _plan(sql, policy)
    assert isinstance(p, UnitPlan) and len(p.owners) == owners
    assert p.describe()["truncation"] == "linear program" and p.grouped_scan == (False,)
    assert len(p.query.args["group"].expressions) == owners


def test_a_policy_without_units_is_unchanged() -> None:
    assert not isinstance(_plan("SELECT COUNT(*) FROM orders", "[tables.orders]\n"), UnitPlan)


# -- brute force over tiny databases ---------------------------------------------------------------

DDL = """
CREATE TABLE u (id INT PRIMARY KEY, g INT NOT NULL);
CREATE TABLE o (oid INT PRIMARY KEY, uid INT NOT NULL REFERENCES u (id), d INT NOT NULL);
CREATE TABLE l (lid INT PRIMARY KEY, oid INT NOT NULL REFERENCES o (oid), q INT NOT NULL);
"""
EPS = 1.0
GS = 40  # races τ = 5.5, 30.25: small enough that the truncations bite on these databases
POLICY = f"""
[defaults]
epsilon = {EPS}
[units.u]
key = "id"
max_contribution = {GS}
[tables.l.columns.q]
range = [0, 3]
"""
# a database: per unit, its orders; per order, (d, the q of each of its line items)
Db = dict[int, list[tuple[int, list[int]]]]
DATABASES: list[Db] = [
    {1: [(0, [1, 2]), (1, [3])], 2: [(1, [0])]},
    {1: [(1, [1] * 5), (1, [2] * 4)], 2: [(1, [3])], 3: []},  # unit 1 has 9 line items: above τ = 8
    {1: [(0, [3, 3, 3])], 2: [(1, [1, 2]), (1, [])], 3: [(1, [2] * 3), (1, [3] * 3)]},
    {1: [], 2: [(1, [])]},
    {1: [(1, [3, 0, 3])] * 12, 2: [(0, [1])]},  # unit 1: 12 orders, 36 line items, above τ = 30.25
]
# (query, the contribution of one unit's orders to each raced part, in Python: the independent oracle)
QUERIES = [
    (
        "SELECT COUNT(*) FROM u, o, l WHERE u.id = o.uid AND o.oid = l.oid",
        lambda orders: [sum(len(ls) for _, ls in orders)],
    ),
    ("SELECT COUNT(*) FROM l", lambda orders: [sum(len(ls) for _, ls in orders)]),
    ("SELECT COUNT(*) FROM o WHERE o.d > 0", lambda orders: [sum(1 for d, _ in orders if d > 0)]),
    (
        "SELECT SUM(l.q) FROM o, l WHERE o.oid = l.oid AND o.d > 0",
        lambda orders: [sum(sum(ls) for d, ls in orders if d > 0)],
    ),
    # a value that may be negative: its positive and negative parts race apart, each with ε/2
    (
        "SELECT SUM(l.q - 1) FROM l",
        lambda orders: [
            sum(max(q - 1, 0) for _, ls in orders for q in ls),
            sum(max(1 - q, 0) for _, ls in orders for q in ls),
        ],
    ),
]


@pytest.fixture
def tiny(pg_dsn: str) -> Iterator[tuple[sqldp.session.Session, psycopg.Connection]]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
        yield sqldp.connect(pg_dsn, Policy.from_toml(POLICY)), conn


def _load(conn: psycopg.Connection, db: Db) -> None:
    conn.execute("DELETE FROM l; DELETE FROM o; DELETE FROM u")
    oid = lid = 0
    for unit, orders in db.items():
        conn.execute("INSERT INTO u VALUES (%s, 0)", (unit,))
        for d, lines in orders:
            oid += 1
            conn.execute("INSERT INTO o VALUES (%s, %s, %s)", (oid, unit, d))
            for q in lines:
                lid += 1
                conn.execute("INSERT INTO l VALUES (%s, %s, %s)", (lid, oid, q))


def _truncated(db: Db, contribution: Any) -> list[float]:
    per_unit = [contribution(orders) for orders in db.values()]
    parts = len(per_unit[0])
    return [float(sum(min(c[p], t) for c in per_unit)) for p in range(parts) for t in races(GS)]


def _loss(f1: float, f2: float, scale: float) -> float:
    """The exact max |ln P_f1(k) − ln P_f2(k)| over printed values k of one race (Laplace cells on the release
    grid): cells between and around both centres and in both tails, where the ratio is monotone or constant."""
    g = mechanisms.GRID_EXPONENT
    lo, hi = min(f1, f2) - 3 * scale, max(f1, f2) + 3 * scale
    points = [lo + (hi - lo) * i / 40 for i in range(41)]
    points += [c + d * scale for c in (f1, f2) for d in (-60, -1e-9, 0, 1e-9, 60)]
    cells = sorted({round(v / 2.0**g) for v in points})
    p, q = (
        {k: mechanisms.cell_probability("laplace", f, scale, k, grid_exponent=g)[0] for k in cells} for f in (f1, f2)
    )
    return max_log_ratio(p, q)


def _measure(s: sqldp.session.Session, sql: str) -> Measurement:
    m = s.analyze(sql, audit=True).measurements[0][0]
    assert m.mechanism == R2T
    return m


@pytest.mark.parametrize(("sql", "contribution"), QUERIES)
def test_every_unit_neighbour_is_within_epsilon(
    tiny: tuple[sqldp.session.Session, psycopg.Connection], sql: str, contribution: Any
) -> None:
    s, conn = tiny
    worst = 0.0
    for db in DATABASES:
        _load(conn, db)
        m = _measure(s, sql)
        assert list(m.truncated) == _truncated(db, contribution)
        assert m.unit is not None
        parts = len(m.unit["signs"])
        scales = [sc for sc, _ in r2t.race_scales(m.thresholds, m.epsilon / parts, 0.1)] * parts
        for unit in db:
            # the neighbour without this unit, its orders and their line items
            _load(conn, {u: orders for u, orders in db.items() if u != unit})
            m2 = _measure(s, sql)
            assert (m2.thresholds, m2.epsilon) == (m.thresholds, m.epsilon)  # the scales are the policy's
            loss = sum(_loss(a, b, sc) for a, b, sc in zip(m.truncated, m2.truncated, scales, strict=True))
            assert loss <= EPS * (1 + 1e-9)
            worst = max(worst, loss)
    assert worst > 0.5 * EPS  # the neighbours do use the budget


def test_a_run_releases_the_top_of_the_race(tiny: tuple[sqldp.session.Session, psycopg.Connection]) -> None:
    s, conn = tiny
    _load(conn, DATABASES[2])
    sql = "SELECT COUNT(*) FROM u, o, l WHERE u.id = o.uid AND o.oid = l.oid"
    out = s.run(sql)
    j = out.to_json()
    m = j["measurements"][0][0]
    assert j["mechanism"] == R2T and m["mechanism"] == R2T
    # the analyst sees the unit, GS and the race count; no truncated answer, scale from data or error bar
    assert m["unit"] == {
        "unit": "u",
        "table": "u",
        "key": "id",
        "gs": 40.0,
        "races": 2,
        "signs": [1],
        "beta": 0.1,
        "joined": [],
    }
    assert set(m) == {"aggregate", "epsilon", "delta", "mechanism", "noisy_value", "unit"}
    assert out.answer is not None and out.answer >= 0
    audit = out.to_json(audit=True)["measurements"][0][0]
    # contributions 3, 2 and 6 line items: Σ min(c, τ) for τ = 5.5, 30.25
    assert list(audit["truncated"]) == [10.5, 11.0] and list(audit["thresholds"]) == [5.5, 30.25]
    # the plan an analyst may see before anything is read names the unit too
    assert s.analyze(sql, audit=False).to_json()["plan"][0]["unit"]["races"] == 2
    assert "COUNT(*): unit u (u.id), GS 40, 2 races (R2T, β = 0.1)" in format_text(j)
    assert "Q(I, τ) for τ = 5.5, 30.25: 10.5, 11" in format_text(out.to_json(audit=True))


# -- R2T's error bound -----------------------------------------------------------------------------


def _shift_oracle(j: int, beta: float) -> float:
    """L with P[no race overshoots its correction and the race at τ ≥ DS is not pushed down by more than it]
    = 1 − β, for J independent Laplace races: (1 − e^{−L}/2)^{J−1}·(1 − e^{−L}) = 1 − β, solved by scipy."""
    return float(
        brentq(lambda x: (1 - math.exp(-x) / 2) ** (j - 1) * (1 - math.exp(-x)) - (1 - beta), 1e-6, 100, xtol=1e-14)
    )


@pytest.mark.parametrize("gs", [2.0**10, 1e6])
def test_the_error_is_within_r2ts_bound(gs: float) -> None:
    """Theorem 4.2 of the paper, for races τ_j = b^j: with probability ≥ 1 − β, Q(I) − 2·C_{j*} ≤ Q̃(I) ≤ Q(I),
    C_{j*} = τ_{j*}·J·L/ε the correction of the first race with τ_{j*} ≥ DS (b = 2, L = ln(J/β) give the paper's
    4·J·ln(J/β)·DS/ε). 400 seeded runs on skewed contributions; the bound must fail in at most a β fraction
    plus three standard deviations of the binomial."""
    contributions = [1 + (i * 7919) % 37 for i in range(3000)] + [400, 250]  # DS = 400
    true = float(sum(contributions))
    thresholds = races(gs)
    eps, beta, runs = 0.8, 0.1, 400
    m = Measurement(
        aggregate="COUNT(*)",
        epsilon=eps,
        delta=None,
        beta=0.0,
        sensitivity=gs,
        noise_scale=0.0,
        half_width=0.0,
        terms={},
        mechanism=R2T,
        unit={"beta": beta},
        thresholds=thresholds,
        truncated=tuple(float(sum(min(c, t) for c in contributions)) for t in thresholds),
    )
    j = len(thresholds)
    star = min(t for t in thresholds if t >= max(contributions))
    assert star < BASE * max(contributions)
    bound = 2 * star * j * _shift_oracle(j, beta) / eps
    assert r2t.race_bound(thresholds, eps, beta, max(contributions)) == pytest.approx(bound, rel=1e-9)
    noise = NoiseSource.seeded(7)
    errors = [true - r2t.race(m, noise) for _ in range(runs)]
    failures = sum(1 for e in errors if not 0 <= e <= bound)
    assert failures <= runs * beta + 3 * math.sqrt(runs * beta * (1 - beta))
    errors.sort()
    assert 0 < errors[runs // 2] < bound  # the median error: positive (R2T underestimates) and within it


@pytest.mark.parametrize(("j", "beta"), [(1, 0.1), (8, 0.1), (20, 0.05), (8, 0.5)])
def test_the_correction_is_exact_for_its_event(j: int, beta: float) -> None:
    """The correction's factor makes Theorem 4.2's event exactly 1 − β likely (scipy's root as the oracle), and
    is below the paper's union bound ln(J/β)."""
    assert shift(j, beta) == pytest.approx(_shift_oracle(j, beta), abs=1e-9)
    assert shift(j, beta) < math.log(j / beta) or j == 1


def test_thresholds_are_powers_of_the_base_up_to_gs() -> None:
    assert races(1) == (BASE,) and races(40) == (BASE, BASE**2) and races(BASE**3) == (BASE, BASE**2, BASE**3)
    assert len(races(1e6)) == 8 and races(1e6)[-1] <= 1e6 < BASE * races(1e6)[-1]
