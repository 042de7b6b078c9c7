"""Nested aggregation over one table (sqldp.strategies.nested): aggregates of a derived table grouped by one key, and
the histogram of its per-key counts, checked over every neighbour of a tiny database (an order added or removed).

Oracles: PostgreSQL's own answer to the nested query as written (the un-noised values, on every neighbour), the
per-key counts recomputed in Python (truncated to the first τ orders per customer by order key, docs/truncation.md),
and the exact privacy loss of the released Laplace vector, Σ |Δ|/scale ≤ ε and attained; under partition
selection the exact hockey-stick divergence at e^ε (≤ δ). Mutants killed: the histogram's ℓ1 change 1 instead
of 2 (nested.L1_CHANGE: loss 2ε), COUNT(*) over the derived table taken as the rows' COUNT(*) rather than the
number of keys, and COUNT(x) and COUNT(DISTINCT x) merged into one measurement (both: the un-noised values
differ from PostgreSQL's), a NULL key group left uncounted (refused: the key must be NOT NULL).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest
from oracles import joint_loss, row_neighbours
from test_nested_histogram import selection_divergence

import sqldp
from sqldp.errors import RefusedError
from sqldp.policy import Policy
from sqldp.release import selection_threshold
from sqldp.strategies import nested

EPSILON = 1.0
TAU = 3
POLICY = '[tables.orders]\nrows = "private"\n'
TRUNCATED = POLICY + f"max_rows_per = {{ ck = {TAU} }}\n"

Orders = list[tuple[int, int, str]]  # (ok, ck, cm)

BASE: Orders = [(10, 1, "a"), (11, 1, "a"), (12, 2, "x"), (13, 2, "a"), (14, 2, "b"), (15, 3, "a"), (16, 1, "b")]


# every neighbour: an order removed, or one added (to each customer, 4 a new one; with and without x; before
# and after the customer's other orders, the truncation keeping the first τ)
ADDED = [(ok, ck, cm) for ck in (1, 2, 3, 4) for cm in ("a", "x") for ok in (5, 20)]
NEIGHBOURS: list[Orders] = [n.db["orders"] for n in row_neighbours({"orders": BASE}, {"orders": ADDED})]


def _counts(rows: Orders, tau: int | None) -> dict[int, int]:
    """Per customer with an order kept, its orders without x in the comment (the first τ by order key)."""
    out: dict[int, int] = {}
    for ck in sorted({o[1] for o in rows}):
        mine = sorted(o for o in rows if o[1] == ck)
        kept = mine if tau is None else mine[:tau]
        passing = [o for o in kept if "x" not in o[2]]
        if passing:
            out[ck] = len(passing)
    return out


@pytest.fixture
def db(pg_dsn: str) -> Iterator[str]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE orders (ok INT PRIMARY KEY, ck INT NOT NULL, cm TEXT, ckn INT)")
    yield pg_dsn


def _load(dsn: str, rows: Orders) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE orders")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO orders VALUES (%s, %s, %s, %s)", [(*o, o[1]) for o in rows])


def _plain(dsn: str, sql: str) -> list[tuple[object, ...]]:
    with psycopg.connect(dsn) as conn:
        return [tuple(r) for r in conn.execute(sql).fetchall()]


AGGREGATES = (
    "WITH t AS (SELECT ck, COUNT(*) AS n FROM orders WHERE cm <> 'x' GROUP BY ck) "
    "SELECT SUM(n) AS s, COUNT(*) AS k, AVG(n) AS a, COUNT(n) AS kn FROM t"
)


def test_sum_count_and_avg_of_per_key_counts_are_the_rows_aggregates(db: str) -> None:
    """SUM(n) is the COUNT(*) of the rows, COUNT(*) and COUNT(n) the number of keys (COUNT(DISTINCT ck), ck NOT
    NULL), AVG(n) their ratio: on every neighbour the two measurements' un-noised values give PostgreSQL's answer
    to the nested query, the scales do not depend on the data, and the exact loss Σ |Δ|/scale is ≤ ε, attained
    where an order of a new customer adds a row and a key."""
    session = sqldp.connect(db, Policy.from_toml(POLICY), seed=2)

    def released(rows: Orders) -> list[tuple[float, float, str]]:
        _load(db, rows)
        result = session.analyze(AGGREGATES, epsilon=EPSILON)
        ((s, k, a, kn),) = _plain(db, AGGREGATES)
        (ms,) = result.measurements
        rows_, keys = (m.true_value for m in ms)
        assert (rows_, keys, kn) == (s, k, k)
        assert [m.aggregate for m in ms] == ["COUNT(*)", "COUNT(DISTINCT orders.ck)"]
        assert rows_ / keys == pytest.approx(float(a))
        assert all(m.mechanism == "laplace-global" for m in ms)
        return [(m.true_value, m.noise_scale, "laplace") for m in ms]

    base = released(BASE)
    worst = 0.0
    for rows in NEIGHBOURS:
        other = released(rows)
        assert [s for _, s, _ in other] == [s for _, s, _ in base]
        worst = max(worst, joint_loss(base, other))  # Σ |Δ|/scale
    assert worst == pytest.approx(EPSILON)


HISTOGRAM = (
    "SELECT n, COUNT(*) AS customers FROM (SELECT ck, COUNT(*) AS n FROM orders WHERE cm <> 'x' GROUP BY ck) AS t "
    "GROUP BY n ORDER BY n"
)


def test_histogram_of_one_tables_counts_over_the_declared_domain(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pure ε under ``max_rows_per = { ck = τ }``: the buckets 1 … τ are released on every database (a key group of
    one table has a row), each true value is the oracle's truncated histogram, and the exact loss of the Laplace
    vector is ≤ ε over every neighbour, = ε where an order moves a customer between two counts; the mutant with
    ℓ1 change 1 (nested.L1_CHANGE) loses 2ε."""

    def released(session: sqldp.session.Session, rows: Orders) -> list[tuple[float, float, str]]:
        _load(db, rows)
        result = session.run(HISTOGRAM, epsilon=EPSILON)
        assert [r["key"]["n"] for r in result.rows] == list(range(1, TAU + 1))
        truth = Counter(_counts(rows, TAU).values())
        out = []
        for n, (m,) in zip(range(1, TAU + 1), result.measurements, strict=True):
            assert m.true_value == truth.get(n, 0), (rows, n)
            assert m.mechanism == "laplace-global"
            out.append((m.true_value, m.noise_scale, "laplace"))
        return out

    def worst(session: sqldp.session.Session) -> float:
        base = released(session, BASE)
        return max(joint_loss(base, released(session, rows)) for rows in NEIGHBOURS)  # Σ |Δ|/scale

    assert worst(sqldp.connect(db, Policy.from_toml(TRUNCATED), seed=5)) == pytest.approx(EPSILON)
    monkeypatch.setattr(nested, "L1_CHANGE", 1.0)
    assert worst(sqldp.connect(db, Policy.from_toml(TRUNCATED), seed=5)) == pytest.approx(2 * EPSILON)


def test_histogram_of_one_tables_counts_by_partition_selection(db: str) -> None:
    """δ > 0 and no declared bound: the counts present are released by partition selection; the un-noised counts
    are PostgreSQL's answer, and over every neighbour the exact hockey-stick divergence at e^ε of the changed
    buckets' joint output is ≤ δ both ways, attained at δ (a bucket of count 1 appearing)."""
    delta = 0.05
    session = sqldp.connect(db, Policy.from_toml(POLICY), seed=5)

    def present(rows: Orders) -> dict[int, tuple[float, float, float]]:
        _load(db, rows)
        plain = dict(_plain(db, HISTOGRAM))
        result = session.analyze(HISTOGRAM, epsilon=EPSILON, mechanism="laplace", delta=delta)
        assert plain == dict(Counter(_counts(rows, None).values()))
        out = {}
        for n, (m,) in zip(sorted(plain), result.measurements, strict=True):
            assert m.true_value == plain[n]
            out[n] = (m.true_value, m.noise_scale, selection_threshold(m))
        return out

    d0 = present(BASE)
    worst = max(selection_divergence(d0, present(rows), delta, rows) for rows in NEIGHBOURS)
    assert worst == pytest.approx(delta, rel=1e-3)


@pytest.mark.parametrize(
    ("sql", "why"),
    [
        # a NULL key is a group of its own that COUNT(DISTINCT key) would not count
        ("SELECT COUNT(*) FROM (SELECT ckn, COUNT(*) AS n FROM orders GROUP BY ckn) t", "declared NOT NULL"),
        ("SELECT MAX(n) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck) t", "MAX"),
        ("SELECT COUNT(DISTINCT n) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck) t", "DISTINCT"),
        ("SELECT AVG(s) FROM (SELECT ck, SUM(ok) AS s FROM orders GROUP BY ck) t", "AVG"),  # a group's SUM may be NULL
        ("SELECT SUM(n) + MIN(ck) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck) t", "MIN"),
        ("SELECT SUM(n) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck HAVING COUNT(*) > 1) t", "HAVING"),
        ("SELECT SUM(n) FROM (SELECT ck, MAX(ok) AS n FROM orders GROUP BY ck) t", "a COUNT or a SUM"),
        ("SELECT n, COUNT(*) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck) t GROUP BY n", "allow δ > 0"),
        ("SELECT n, SUM(n) FROM (SELECT ck, COUNT(*) AS n FROM orders GROUP BY ck) t GROUP BY n", "COUNT"),
    ],
)
def test_nested_shapes_without_an_equal_flat_query_are_refused(db: str, sql: str, why: str) -> None:
    session = sqldp.connect(db, Policy.from_toml(POLICY))
    with pytest.raises(RefusedError, match=why):
        session.prepare(sql, epsilon=1.0)


def test_sum_of_per_key_sums_and_the_un_noised_sum_of_counts(db: str) -> None:
    """SUM of a per-key SUM is the rows' SUM (NULL over no row, as PostgreSQL's); SUM of per-key COUNT(x) is the
    rows' COUNT(x) (a key whose x are all NULL counts 0)."""
    _load(db, [*BASE, (30, 5, None)])  # type: ignore[list-item]
    session = sqldp.connect(db, Policy.from_toml(POLICY + "[tables.orders.columns.ok]\nrange = [0, 40]\n"))
    for sql in (
        "SELECT SUM(s) FROM (SELECT ck, SUM(ok) AS s FROM orders WHERE cm = 'a' GROUP BY ck) t",
        "SELECT SUM(n) FROM (SELECT ck, COUNT(cm) AS n FROM orders GROUP BY ck) t",
    ):
        ((m,),) = session.analyze(sql, epsilon=1.0).measurements
        assert m.true_value == float(_plain(db, sql)[0][0])  # type: ignore[arg-type]
    # COUNT(ck) and COUNT(DISTINCT ck) in one statement: two measurements (merged, both would be the first)
    sql = "SELECT SUM(n), COUNT(*) FROM (SELECT ck, COUNT(ck) AS n FROM orders GROUP BY ck) t"
    (ms,) = session.analyze(sql, epsilon=1.0).measurements
    assert [m.true_value for m in ms] == [float(v) for v in _plain(db, sql)[0]]  # type: ignore[arg-type]


def test_tpch_orders_per_customer_unnoised_are_postgresqls_answer(tpch_dsn: tuple[str, object, object]) -> None:
    """The issue's queries on TPC-H SF 0.01 under the tpch policy: AVG, SUM and COUNT(*) over orders grouped by
    o_custkey from the two measurements, and the histogram of the counts by partition selection, equal
    PostgreSQL's answers to the nested queries as written."""
    dsn = tpch_dsn[0]
    session = sqldp.connect(dsn, policy="tpch")
    sql = (
        "WITH t AS (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey) "
        "SELECT AVG(n), SUM(n), COUNT(*) FROM t"
    )
    ((avg, total, keys),) = _plain(dsn, sql)
    (ms,) = session.analyze(sql, epsilon=1.0).measurements
    assert [m.true_value for m in ms] == [total, keys]
    assert ms[0].true_value / ms[1].true_value == pytest.approx(float(avg))  # type: ignore[operator, arg-type]
    histogram = "SELECT n, COUNT(*) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey) t GROUP BY n"
    plain = dict(_plain(dsn, histogram))
    result = session.analyze(histogram, epsilon=1.0, mechanism="laplace", delta=1e-6)
    assert {n: m.true_value for n, (m,) in zip(sorted(plain), result.measurements, strict=True)} == plain
