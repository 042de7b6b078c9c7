"""The histogram of per-key counts over a LEFT OUTER JOIN (TPC-H Q13's shape, sqldp.strategies.nested), checked over
every neighbour of a tiny database: one customer or one order added or removed.

Oracles: the histogram recomputed in Python from the rows (with the truncation to τ orders per customer by
order key, as docs/truncation.md defines it) and PostgreSQL's own answer to the raw query; the exact privacy
loss of the released vector (pure ε over the declared domain 0 … τ: Σ_g |Δ_g| / scale, which must be ≤ ε and
is attained); the exact hockey-stick divergence at e^ε of the partition-selection release (≤ δ) with the scales
and threshold sqldp computes; and a mutant — the lemma's ℓ1 change of 1 instead of 2 — whose loss exceeds ε.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from oracles import joint_loss, row_neighbours, selection_hockey_stick, selection_hockey_stick_2

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.release import selection_threshold
from sqldp.strategies import nested

EPSILON = 1.0
TAU = 2
POLICY = '[tables.customer]\nrows = "private"\n[tables.orders]\nrows = "private"\n'
TRUNCATED = POLICY + f"max_rows_per = {{ ck = {TAU} }}\n"
SQL = (
    "SELECT c_count, COUNT(*) AS custdist FROM (SELECT c.ck, COUNT(o.ok) FROM customer c LEFT OUTER JOIN orders o "
    "ON c.ck = o.ck AND o.cm NOT LIKE '%x%' GROUP BY c.ck) AS co (ck, c_count) GROUP BY c_count "
    "ORDER BY custdist DESC, c_count DESC"
)

Rows = tuple[list[int], list[tuple[int, int, str]]]  # customers; orders (ok, ck, cm)

BASE: Rows = ([1, 2, 3], [(10, 1, "a"), (11, 1, "a"), (12, 2, "x"), (13, 2, "a"), (14, 2, "b")])


# the neighbours: a customer removed or added, an order removed or added (to each customer, 4 being none: the
# order joins nothing; with and without x; before and after the customer's other orders, the truncation
# keeping the first τ)
ADDED = {"customer": [4], "orders": [(ok, ck, cm) for ck in (1, 2, 3, 4) for cm in ("a", "x") for ok in (5, 20)]}


def _neighbours(base: Rows) -> Iterator[Rows]:
    for n in row_neighbours({"customer": base[0], "orders": base[1]}, ADDED):
        yield n.db["customer"], n.db["orders"]


def _histogram(rows: Rows, tau: int | None) -> Counter[int]:
    """The oracle: per customer the number of its orders (the first τ by order key when truncated) whose
    comment does not contain x, then the number of customers per count."""
    customers, orders = rows
    kept = []
    for ck in {o[1] for o in orders}:
        mine = sorted(o for o in orders if o[1] == ck)
        kept += mine if tau is None else mine[:tau]
    per = {c: sum(1 for _, ck, cm in kept if ck == c and "x" not in cm) for c in customers}
    return Counter(per.values())


@pytest.fixture
def db(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE customer (ck INT PRIMARY KEY)")
        conn.execute("CREATE TABLE orders (ok INT PRIMARY KEY, ck INT, cm TEXT)")
    yield pg_dsn


def _load(dsn: str, rows: Rows) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE customer, orders")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO customer VALUES (%s)", [(c,) for c in rows[0]])
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s)", rows[1])


def test_declared_bound_releases_every_count_up_to_tau_with_loss_at_most_epsilon(
    db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pure ε under ``max_rows_per = { ck = τ }``: the buckets 0 … τ are released on every database (the set
    does not depend on the data), each true value is the oracle's truncated histogram, and over every neighbour
    the exact loss Σ_g |Δ_g|/scale of the Laplace vector is ≤ ε, and = ε where an order moves a customer between
    two counts. The mutant with ℓ1 change 1 (nested.L1_CHANGE) halves the scale and loses 2ε there."""
    session = sqldp.connect(db, Policy.from_toml(TRUNCATED), seed=5)

    def released(rows: Rows) -> list[tuple[float, float, str]]:
        _load(db, rows)
        result = session.run(SQL, epsilon=EPSILON)
        assert sorted(r["key"]["c_count"] for r in result.rows) == list(range(TAU + 1))
        truth = _histogram(rows, TAU)
        out = []
        for n, (m,) in zip(range(TAU + 1), result.measurements, strict=True):
            assert m.true_value == truth.get(n, 0), (rows, n)
            assert m.mechanism == "laplace-global" and m.delta is None
            out.append((m.true_value, m.noise_scale, "laplace"))
        return out

    def loss(a: list[tuple[float, float, str]], b: list[tuple[float, float, str]]) -> float:
        assert [s for _, s, _ in a] == [s for _, s, _ in b]  # the scale does not depend on the data
        return joint_loss(a, b)  # Σ_g |Δ_g|/scale

    base = released(BASE)
    worst = max(loss(base, released(rows)) for rows in _neighbours(BASE))
    assert worst == pytest.approx(EPSILON)
    monkeypatch.setattr(nested, "L1_CHANGE", 1.0)
    session = sqldp.connect(db, Policy.from_toml(TRUNCATED), seed=5)
    base = released(BASE)
    assert max(loss(base, released(rows)) for rows in _neighbours(BASE)) == pytest.approx(2 * EPSILON)


def _present(session: sqldp.session.Session, rows: Rows, delta: float) -> dict[int, tuple[float, float, float]]:
    """Per count present in the data: (true value, noise scale, τ) of its selection count, from sqldp's own
    analysis; the true values are checked against the untruncated oracle."""
    result = session.analyze(SQL, epsilon=EPSILON, mechanism="laplace", delta=delta)
    truth = _histogram(rows, None)
    out = {}
    for n, (m,) in zip(sorted(truth), result.measurements, strict=True):
        assert m.true_value == truth[n]
        out[n] = (m.true_value, m.noise_scale, selection_threshold(m))
    return out


Present = dict[int, tuple[float, float, float]]  # bucket → (count, noise scale, threshold) of partition selection


def selection_divergence(d0: Present, d1: Present, delta: float, where: object, eps: float = EPSILON) -> float:
    """The larger hockey-stick divergence at e^``eps`` (ε·G for a change at distance G), both ways, of the joint
    output of the buckets that differ between two neighbours' partition selections (at most two: one row moves
    one key's count); asserted ≤ δ."""
    changed = sorted(n for n in set(d0) | set(d1) if d0.get(n) != d1.get(n))
    assert len(changed) <= 2, (where, changed)
    worst = 0.0
    for p, q in ((d0, d1), (d1, d0)):
        if len(changed) == 1:
            one = [None if x is None else [(x[0], x[1], 0.0, x[2])] for x in (p.get(changed[0]), q.get(changed[0]))]
            h = selection_hockey_stick(one[0], one[1], eps)
        elif len(changed) == 2:
            h = selection_hockey_stick_2([p.get(n) for n in changed], [q.get(n) for n in changed], eps)
        else:
            h = 0.0
        assert h <= delta * (1 + 1e-4), (where, changed, h)
        worst = max(worst, h)
    return worst


@pytest.mark.parametrize("weight", [0.5, 1.0, 2.0, 20.0])
def test_partition_selection_of_the_counts_over_every_neighbour(db: str, weight: float) -> None:
    """δ > 0 and no declared bound: the counts present are released by partition selection, the selection count
    Laplace at 2/(G·ε) with sqldp's threshold, both tables at weight G. Over every neighbour (a row at distance G)
    at most two buckets change (a customer moves from one count to another, or appears or leaves), by 1 each;
    the exact hockey-stick divergence at e^(εG) of those buckets' joint output, both ways, is ≤ δ (the others
    are equal in law and integrate out), attained by a bucket of count 1 appearing: its one-sided count is 1 at
    every weight (τ = 1 + (c/ε)·ln(1/(2δ))). The threshold c·(1 + ln(1/(2δ))/ε) refused G > 2 and gave
    δ·e^(−ε/2) at G = 1."""
    delta = 0.05
    weighted = POLICY.replace('rows = "private"\n', f'rows = "private"\nweight = {weight}\n')
    session = sqldp.connect(db, Policy.from_toml(weighted), seed=5)
    _load(db, BASE)
    with psycopg.connect(db) as conn:  # PostgreSQL's own answer is the un-noised one
        plain = dict(conn.execute(SQL).fetchall())
    d0 = _present(session, BASE, delta)
    assert {n: v[0] for n, v in d0.items()} == plain
    worst = 0.0
    for rows in _neighbours(BASE):
        _load(db, rows)
        worst = max(worst, selection_divergence(d0, _present(session, rows, delta), delta, rows, EPSILON * weight))
    assert worst == pytest.approx(delta, rel=1e-3)  # a count of 1 appearing: ½·e^{−(τ−1)/b} = δ


def test_nested_shapes_outside_the_lemma_are_refused(db: str) -> None:
    """Fail closed: pure ε without a declared bound, a join condition reading the preserved table, a WHERE on the
    counted table over the LEFT JOIN, a FULL JOIN, and value-sensitive columns each refuse with the reason."""
    session = sqldp.connect(db, Policy.from_toml(POLICY))
    with pytest.raises(RefusedError, match="allow δ > 0"):
        session.prepare(SQL, epsilon=1.0)
    bad = {
        "ON c.ck = o.ck AND c.ck > 1": "besides the key equality",
        "ON c.ck = o.ck WHERE o.cm = 'a'": "WHERE may read customer only",
    }
    for tail, why in bad.items():
        sql = (
            "SELECT n, COUNT(*) FROM (SELECT c.ck, COUNT(o.ok) AS n FROM customer c LEFT JOIN orders o "
            f"{tail} GROUP BY c.ck) AS d GROUP BY n"
        )
        with pytest.raises(RefusedError, match=why):
            session.prepare(sql, epsilon=1.0, mechanism="laplace", delta=1e-6)
    full = (
        "SELECT n, COUNT(*) FROM (SELECT c.ck, COUNT(o.ok) AS n FROM customer c FULL JOIN orders o ON c.ck = o.ck "
        "GROUP BY c.ck) AS d GROUP BY n"
    )
    with pytest.raises(RefusedError, match="only LEFT OUTER JOIN"):
        session.prepare(full, epsilon=1.0, mechanism="laplace", delta=1e-6)
    valued = sqldp.connect(db, Policy.from_toml(POLICY + 'norm = "l1(ok)"\n'))
    with pytest.raises(RefusedError, match="value-sensitive column"):
        valued.prepare(SQL, epsilon=1.0, mechanism="laplace", delta=1e-6)
    with pytest.raises(RefusedError, match="self-join"):
        session.prepare(
            "SELECT n, COUNT(*) FROM (SELECT a.ck, COUNT(b.ck) AS n FROM customer a LEFT JOIN customer b "
            "ON a.ck = b.ck GROUP BY a.ck) AS d GROUP BY n",
            epsilon=1.0,
            mechanism="laplace",
            delta=1e-6,
        )


def test_the_inner_join_shape_and_the_plan_an_analyst_sees(db: str) -> None:
    """The same histogram over an inner join (customers without orders have no group), and ``describe`` — what
    ``sqldp analyze`` shows an analyst — reads nothing and states the data-independent bound."""
    _load(db, BASE)
    sql = (
        "SELECT n, COUNT(*) AS k FROM (SELECT c.ck, COUNT(*) AS n FROM customer c, orders o WHERE c.ck = o.ck "
        "AND o.cm NOT LIKE '%x%' GROUP BY c.ck) AS d GROUP BY n"
    )
    with psycopg.connect(db) as conn:
        plain = dict(conn.execute(sql).fetchall())
    selected = sqldp.connect(db, Policy.from_toml(POLICY), seed=1)
    result = selected.analyze(sql, epsilon=1.0, mechanism="laplace", delta=1e-6)
    assert {n: m.true_value for n, (m,) in zip(sorted(plain), result.measurements, strict=True)} == plain
    session = sqldp.connect(db, Policy.from_toml(TRUNCATED), seed=1)
    plan = session.analyze(SQL, audit=False, epsilon=1.0).plan
    assert plan is not None and "global bound" in plan[0]["groups"] and plan[0]["epsilon"] == 1.0
