"""Private selection of public rows (sqldp.strategies.selection, TPC-H Q20's shape), on a real PostgreSQL.

* TPC-H SF 0.01 under ``tpch_catalog``: the un-noised pipeline (audit mode: the exact witness counts, kept when
  above 1/2) returns PostgreSQL's own answer to the unmodified Q20, row for row; a noisy run returns rows of
  that query only, and costs ε with δ = 0.
* Brute force over every neighbour of a tiny database (each private row removed, each row of a small universe
  added, each sensitive value moved by its grid step and by a larger step): the released vector of noisy
  witness counts has privacy loss exactly ‖W(D) − W(D′)‖₁/scale (Laplace: the sup over outputs of the log
  density ratio), which must be ≤ ε·d(D, D′); the kept set (post-processing) is checked with its exact
  probabilities too. The bound is attained by a grid step of the summed column.
* Mutants the brute force kills: ``indicator`` (the ramp replaced by the predicate's exact indicator, the
  claimed per-row bound unchanged: a change of 0.01 flips a witness) and ``no-multiplicity`` (m taken as 1:
  two rows of the public table share one correlation key).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from oracles import (
    laplace_exceeds,
    max_log_ratio,
    product_law,
    product_rows,
    rows_added,
    rows_removed,
    sql_statements,
    values_changed,
    values_set,
)

import sqldp
from sqldp.errors import RefusedError
from sqldp.strategies import selection

QUERIES = Path(__file__).resolve().parents[2] / "benchmarks" / "tpch" / "queries"
EPSILON = 1.0

DDL = """
CREATE TABLE sup (sk INT PRIMARY KEY, name TEXT NOT NULL, nation INT NOT NULL);
CREATE TABLE ps (pk INT NOT NULL, sk INT NOT NULL, avail INT NOT NULL);
CREATE TABLE li (id INT PRIMARY KEY, pk INT NOT NULL, sk INT NOT NULL, q DECIMAL(15, 2) NOT NULL,
                 d DATE NOT NULL, f DOUBLE PRECISION NOT NULL);
INSERT INTO sup VALUES (1, 'one', 0), (2, 'two', 0), (3, 'three', 0), (4, 'four', 1);
-- (1, 1) twice: two rows of the public table share a correlation key (m = 2); (2, 3)'s margin is 0
INSERT INTO ps VALUES (1, 1, 2), (1, 1, 2), (2, 1, 9), (1, 2, 1), (2, 3, 2), (1, 4, 1);
INSERT INTO li VALUES (1, 1, 1, 3.00, '2020-01-10', 0), (2, 1, 2, 1.00, '2020-01-12', 0),
                      (3, 2, 3, 4.00, '2020-01-11', 0), (4, 1, 4, 1.00, '2020-01-20', 0);
"""
POLICY = """
[defaults]
epsilon = 1.0
[tables.sup]
rows = "public"
[tables.ps]
rows = "public"
[tables.li]
rows = "private"
weight = 1.0
norm = "l1(q, d, f)"
[tables.li.columns.q]
range = [0, 10]
[tables.li.columns.d]
range = ["2020-01-01", "2020-02-01"]
unit = "day"
"""
QUERY = """
SELECT name FROM sup WHERE nation = 0 AND sk IN (
    SELECT ps.sk FROM ps WHERE ps.avail > (
        SELECT 0.5 * SUM(li.q) FROM li WHERE li.pk = ps.pk AND li.sk = ps.sk AND li.d >= DATE '2020-01-10'))
ORDER BY name
"""
# neighbours: (SQL that makes D′ from D, SQL that restores D, distance d(D, D′) in the policy's metric)
Neighbour = tuple[str, str, float]
LI = {
    "li": [
        (1, 1, 1, Decimal("3.00"), dt.date(2020, 1, 10), 0.0),
        (2, 1, 2, Decimal("1.00"), dt.date(2020, 1, 12), 0.0),
        (3, 2, 3, Decimal("4.00"), dt.date(2020, 1, 11), 0.0),
        (4, 1, 4, Decimal("1.00"), dt.date(2020, 1, 20), 0.0),
    ]
}  # li as DDL loads it
LI_COLUMNS = {"li": ("id", "pk", "sk", "q", "d", "f")}


def _neighbours() -> Iterator[Neighbour]:
    def later(d: dt.date, n: int) -> dt.date:
        return d + dt.timedelta(days=n)

    added = [
        (99, pk, sk, Decimal(q), dt.date.fromisoformat(d), 0.0)
        for pk, sk, q, d in product_rows((1, 2), (1, 2, 3), ("0.50", "6.00"), ("2020-01-09", "2020-01-10"))
    ]
    changes = itertools.chain(
        rows_removed(LI, "li"),
        values_changed(LI, "li", {3: 1.0}, [Decimal(x) for x in ("0.01", "-0.01", "1", "-2.5")]),
        values_changed(LI, "li", {4: 1.0}, (1, -1, 3), add=later),
        values_set(LI, "li", {5: (0.001,)}),  # a column the query does not read: nothing it releases may move
        rows_added(LI, "li", added),
    )
    for n in changes:
        yield (*sql_statements(n, LI_COLUMNS), n.distance)


@pytest.fixture(scope="module")
def tiny(pg_server_dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    from pg_support import create_database, drop_database

    dsn = create_database(pg_server_dsn)
    policy = tmp_path_factory.mktemp("selection") / "policy.toml"
    policy.write_text(POLICY)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(DDL)
        yield dsn, policy
    finally:
        drop_database(pg_server_dsn, dsn)


def _counts(session: sqldp.session.Session) -> tuple[dict[str, float], float, list[str]]:
    """The true witness count per candidate, the noise scale and the rows the exact counts keep."""
    result = session.analyze(QUERY, epsilon=EPSILON)
    counts = {m[0].aggregate: float(m[0].true_value or 0.0) for m in result.measurements}
    (scale,) = {m[0].noise_scale for m in result.measurements}
    return counts, scale, [r["key"]["name"] for r in result.rows]


def _kept_loss(w: dict[str, float], w2: dict[str, float], scale: float) -> float:
    """The exact privacy loss of the kept set: max over sets S of |ln P(S | D) − ln P(S | D′)|, each candidate
    kept independently with P(W + Lap(scale) > 1/2)."""
    law, law2 = (product_law({v: laplace_exceeds(x[v], 0.5, scale) for v in x}) for x in (w, w2))
    return max_log_ratio(law, law2)


def _brute_force(dsn: str, policy: Path) -> tuple[float, list[tuple[str, float, float]]]:
    """(the largest loss/d over every neighbour, the neighbours whose loss exceeds ε·d)."""
    session = sqldp.connect(dsn, policy)
    worst, over = 0.0, []
    try:
        w, scale, _ = _counts(session)
        with psycopg.connect(dsn, autocommit=True) as conn:
            for make, undo, d in _neighbours():
                conn.execute(make)
                try:
                    w2, scale2, _ = _counts(session)
                finally:
                    conn.execute(undo)
                assert scale2 == scale and w2.keys() == w.keys()  # m and the candidates are public facts
                loss = sum(abs(w[v] - w2[v]) for v in w) / scale
                assert _kept_loss(w, w2, scale) <= loss + 1e-9  # post-processing
                worst = max(worst, loss / (EPSILON * d))
                if loss > EPSILON * d * (1 + 1e-9):
                    over.append((make, loss, EPSILON * d))
        assert _counts(session)[0] == w  # every change was undone
    finally:
        session.close()
    return worst, over


def test_every_neighbour_within_epsilon_and_the_bound_is_attained(tiny: tuple[str, Path]) -> None:
    dsn, policy = tiny
    session = sqldp.connect(dsn, policy)
    try:
        w, scale, kept = _counts(session)
        assert w == {"witnesses(1)": 2.0, "witnesses(2)": 1.0, "witnesses(3)": 0.0}
        # B = 1 (a row added or removed; q summed at weight 1; d in a filter, one day at weight 1); m = 2
        assert scale == pytest.approx(2.0 / EPSILON)
        with psycopg.connect(dsn) as conn:
            assert kept == [r[0] for r in conn.execute(QUERY).fetchall()]
        assert session.cost(QUERY, epsilon=EPSILON) == (EPSILON, 0.0)
        session.run(QUERY, epsilon=0.5)
        # pure ε-DP: the zCDP account adds ε²/2 (Bun & Steinke Prop. 1.4), the sequential one ε
        assert session.spent == 0.5 and session.rho_spent == pytest.approx(0.125)
    finally:
        session.close()
    worst, over = _brute_force(dsn, policy)
    assert not over, over
    assert worst == pytest.approx(1.0, rel=1e-6), worst  # a grid step of q next to the margin


def test_mutant_indicator_is_killed(tiny: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant ``indicator``: a ramp 10⁻⁶ units wide is the predicate's indicator on the DECIMAL(15, 2) grid; a
    change of q by 0.01 (distance 0.01) then moves a witness count by 1."""
    monkeypatch.setattr(selection, "RAMP_UNITS", 1e-6)
    worst, over = _brute_force(*tiny)
    assert over and worst > 10


def test_mutant_no_multiplicity_is_killed(tiny: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutant ``no-multiplicity``: the sensitivity without m; one row of li moves both ps rows of key (1, 1)."""
    monkeypatch.setattr(selection, "bound", lambda m, per_row: per_row)
    worst, over = _brute_force(*tiny)
    assert over and worst == pytest.approx(2.0)


def _witness_rows(dsn: str, policy: Path, *, restrict: bool) -> list[tuple[Any, ...]]:
    """The witness statement's rows (candidate, W, m) on the database as it is, with the aggregate over li read
    through the scored rows' keys (``restrict``, sqldp.strategies.selection._witness_sql) or over every row of li."""
    session = sqldp.connect(dsn, policy)
    try:
        shape = selection.find_shape(sqldp.frontend.parse(QUERY, session.catalog), session.catalog, session.policy)
    finally:
        session.close()
    assert shape is not None
    sql = shape.witness_sql
    restriction = " AND (li.pk, li.sk) IN (SELECT ps.pk, ps.sk FROM ps AS ps WHERE ps.sk IN (SELECT v FROM "
    restriction += "sqldp_candidates))"
    assert restriction in sql  # INT = INT: restricted
    if not restrict:
        sql = sql.replace(restriction, "")
    with psycopg.connect(dsn) as conn:
        return conn.execute(sql).fetchall()


def test_witnesses_read_through_the_scored_keys_are_the_same_on_every_neighbour(tiny: tuple[str, Path]) -> None:
    """The aggregate over li restricted to the keys of the scored rows of ps (the candidates' rows) gives the
    statement's rows of the aggregate over every row of li, on the database and on each of its neighbours (rows
    of li added at keys no scored row has, (1, 4) of supplier 4 outside the candidates, keys moved by a row's
    removal, values moved)."""
    dsn, policy = tiny
    with psycopg.connect(dsn, autocommit=True) as conn:
        changes = [
            *_neighbours(),
            ("INSERT INTO li VALUES (98, 3, 3, 2.00, '2020-01-15', 0)", "DELETE FROM li WHERE id = 98", 1),
        ]
        for make, undo, _ in [("SELECT 1", "SELECT 1", 0.0), *changes]:
            conn.execute(make)
            try:
                assert _witness_rows(dsn, policy, restrict=True) == _witness_rows(dsn, policy, restrict=False), make
            finally:
                conn.execute(undo)


def test_witnesses_are_not_restricted_across_types() -> None:
    """A correlation pair of two types (li.pk BIGINT, ps.pk INT: "=" is then a cross-type operator, not the one
    GROUP BY groups li.pk by) keeps the aggregate over every row of li."""
    from sqldp.catalog import Catalog
    from sqldp.policy import Policy

    same = DDL.split("INSERT")[0]
    policy = Policy.from_toml(POLICY)
    for ddl, restricted in (
        (same, True),
        (same.replace("pk INT NOT NULL, sk INT NOT NULL, q", "pk BIGINT NOT NULL, sk INT NOT NULL, q"), False),
    ):
        catalog = Catalog.from_ddl(ddl)
        shape = selection.find_shape(sqldp.frontend.parse(QUERY, catalog), catalog, policy)
        assert shape is not None
        assert ("IN (SELECT ps.pk, ps.sk FROM ps" in shape.witness_sql) is restricted


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        (QUERY.replace("li.pk = ps.pk", "li.q = ps.pk"), "correlation column li.q is value-sensitive"),
        (QUERY.replace("li.d >= DATE '2020-01-10'", "li.f > 1"), "arbitrarily small change"),
        (QUERY.replace("SUM(li.q)", "MAX(li.q)"), "must be SUM(column) or COUNT(*)"),
        (QUERY.replace("ps.avail >", "ps.avail ="), "must compare with >, >=, <, <="),
        (QUERY.replace("FROM ps WHERE", "FROM ps WHERE ps.pk IN (SELECT pk FROM li) AND"), "exactly one conjunct"),
        (QUERY.replace("FROM ps WHERE", "FROM ps WHERE ps.pk = sup.nation AND"), "correlated with the outer query"),
    ],
    ids=["sensitive-key", "float-filter", "max", "equality", "two-private", "correlated-in"],
)
def test_refusals_name_the_reason_the_table_and_the_position(tiny: tuple[str, Path], sql: str, reason: str) -> None:
    dsn, policy = tiny
    session = sqldp.connect(dsn, policy)
    try:
        with pytest.raises(RefusedError, match=r"^query:2:") as info:
            session.prepare(sql, epsilon=EPSILON)
    finally:
        session.close()
    assert reason in str(info.value) and "'li'" in str(info.value)


def test_explain_shows_the_choice_without_reading_data() -> None:
    from sqldp.catalog import Catalog
    from sqldp.commands.explain import explain
    from sqldp.datasets import dataset_path
    from sqldp.policy import Policy

    catalog = Catalog.from_file(dataset_path("tpch.sql"))
    policy = Policy.from_file(dataset_path("tpch_catalog.toml"))
    out = explain((QUERIES / "q20.sql").read_text(encoding="utf-8"), catalog, policy)
    assert out["refused"] is None and out["selection"]["per_row_bound"] == 1.0
    # under tpch.toml supplier is private: the statement would release its rows, refused as before
    private = Policy.from_file(dataset_path("tpch.toml"))
    out = explain((QUERIES / "q20.sql").read_text(encoding="utf-8"), catalog, private)
    assert "releases rows of private table 'supplier'" in out["refused"]["reason"]


def _plain(v: Any) -> Any:
    return v.rstrip() if isinstance(v, str) else v


def test_q20_unnoised_is_postgres_answer_on_tpch(tpch_dsn: tuple[str, Any, Any]) -> None:
    dsn = tpch_dsn[0]
    sql = (QUERIES / "q20.sql").read_text(encoding="utf-8")
    with psycopg.connect(dsn) as conn:
        plain = [tuple(_plain(v) for v in row) for row in conn.execute(sql).fetchall()]
    session = sqldp.connect(dsn, policy="tpch_catalog", seed=7)
    try:
        prepared = session.prepare(sql, epsilon=EPSILON)
        assert isinstance(prepared, selection.Selection)
        audit = prepared.analyze()
        assert [tuple(_plain(v) for v in r["key"].values()) for r in audit.rows] == plain
        assert all(m[0].true_value == int(m[0].true_value or 0) for m in audit.measurements)  # margins on h's grid
        noisy = session.run(sql, epsilon=EPSILON)
        columns, rows = noisy.table()
        assert columns == ["s_name", "s_address"]
        with psycopg.connect(dsn) as conn:
            every = {tuple(r) for r in conn.execute("SELECT s_name, s_address FROM supplier").fetchall()}
        assert set(rows) <= every and noisy.to_json()["delta"] is None
    finally:
        session.close()


def test_a_kept_null_candidate_selects_no_row(tiny: tuple[str, Path]) -> None:
    """A NULL among the kept values (a NULL key the noise kept) is left out of the final IN list, which selects
    the same rows in a WHERE conjunct; with only NULL kept the conjunct is FALSE. PostgreSQL agrees."""
    dsn, policy = tiny
    session = sqldp.connect(dsn, policy)
    try:
        shape = selection.find_shape(sqldp.frontend.parse(QUERY, session.catalog), session.catalog, session.policy)
        assert shape is not None
        with psycopg.connect(dsn) as conn:
            both, one = (conn.execute(selection.final_sql(shape, kept)).fetchall() for kept in ([None, 1], [1]))
            assert both == one == [("one",)]
            assert conn.execute(selection.final_sql(shape, [None])).fetchall() == []
    finally:
        session.close()
