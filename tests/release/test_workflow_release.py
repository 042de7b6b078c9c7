"""The release of queries with subqueries at the workflow's composed global bound (NR §3.3.13.9, Proposition 3.2;
sqldp.sensitivity.global_bound.workflow_plan), checked by the exact privacy loss over every neighbour.

Tiny real PostgreSQL tables with keys PostgreSQL enforces: o (k PRIMARY KEY, g), s (k PRIMARY KEY, w), l (k, n,
PRIMARY KEY (k, n)), all rows private. For every neighbour that adds one row (from the key-respecting universe
over {0, 1, 2}) or removes one, the released distributions on both sides are the exact ones the sampler draws
from (``cell_probability``, the helper of test_global_mechanism), and their largest log-ratio is compared with ε;
for GROUP BY, the joint loss of the vector (Σ_g |Δ_g| / scale, Laplace of one scale) is.

The shapes (EXISTS, IN, a WITH query, GROUP BY, a correlated scalar subquery) tie the outer tables only through
the subquery's derived table D (o.k = D.k = s.k): the outer product alone is a cross product, so the single-block
bound is ∞ and only the workflow, which joins D as a table with its key, gives a finite one. In the first two, o
is read inside too, so one row of o moves the count by 2 — its own join row and, through D, another outer row:
c′ + c_D·r_D·S_D = 1 + 1·1·1.

Mutant killed: the composition without the steps' terms (c_D·r_D·S_D dropped, here by r_D = 0) releases shape
1 at scale 1/ε, and a neighbour that moves the count by 2 then has privacy loss 2ε.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from oracles import joint_loss, product_rows, row_neighbours
from test_global_mechanism import _loss

import sqldp
from sqldp import mechanisms, sensitivity
from sqldp.catalog import Catalog
from sqldp.frontend import parse
from sqldp.normalize import normalize
from sqldp.policy import Policy
from sqldp.result import GLOBAL
from sqldp.sensitivity import global_bound
from sqldp.sensitivity import model_check_workflow as mw
from sqldp.sensitivity.global_bound import WORKFLOW_SOURCE, GlobalPlan

EPS = 1.0
DDL = (
    "CREATE TABLE o (k INT PRIMARY KEY, g INT NOT NULL);"
    "CREATE TABLE s (k INT PRIMARY KEY, w INT NOT NULL);"
    "CREATE TABLE l (k INT NOT NULL, n INT NOT NULL, PRIMARY KEY (k, n));"
)
POLICY = """
[defaults]
epsilon = 1.0
[tables.o]
[tables.o.columns.g]
range = [0, 2]
[tables.s]
[tables.s.columns.w]
domain = [0, 1]
[tables.l]
"""
DOMAIN = (0, 1, 2)
BASE: dict[str, list[tuple[int, int]]] = {"o": [(0, 1), (2, 2)], "s": [(0, 1), (1, 0), (2, 1)], "l": [(0, 1), (1, 0)]}

EXISTS = "SELECT COUNT(*) FROM o, s WHERE EXISTS (SELECT * FROM o o2 WHERE o2.g = o.k AND o2.g = s.k)"
IN = "SELECT COUNT(*) FROM o, s WHERE s.k IN (SELECT o2.g FROM o o2 WHERE o2.g = o.k)"
WITH = (
    "WITH x AS (SELECT s.k AS k FROM s WHERE s.w > 0) "
    "SELECT SUM(o.g) FROM o, x WHERE EXISTS (SELECT * FROM l WHERE l.k = o.k AND l.k = x.k)"
)
GROUPED = (
    "SELECT s.w, COUNT(*) FROM o, s WHERE EXISTS (SELECT * FROM o o2 WHERE o2.g = o.k AND o2.g = s.k) GROUP BY s.w"
)
# a correlated scalar subquery: a step grouped by l.k (r_D = 2: a changed group is a row out and one in), which
# ties o and s; one l row really flips one (o, s) pair, so the bound is not reached here
SCALAR = "SELECT COUNT(*) FROM o, s WHERE o.g < (SELECT MAX(l.n) FROM l WHERE l.k = o.k AND l.k = s.k)"
# per query: the composed bound (o: 1 + 1 for the first two; SUM(o.g) ≤ 2 per join row for the WITH query;
# l: 1·2·1 for the scalar step) and the largest change a neighbour of BASE makes
BOUNDS = {EXISTS: 2.0, IN: 2.0, WITH: 2.0, GROUPED: 2.0, SCALAR: 2.0}
MOVED = {**BOUNDS, SCALAR: 1.0}


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(DDL)
        yield c


def _load(conn: psycopg.Connection, db: dict[str, list[tuple[int, int]]]) -> None:
    for table, rows in db.items():
        conn.execute(f"DELETE FROM {table}")
        for row in rows:
            conn.execute(f"INSERT INTO {table} VALUES (%s, %s)", row)


def _neighbours() -> list[dict[str, list[tuple[int, int]]]]:
    """Every database one row away from BASE that keeps the keys (PostgreSQL rejects the others)."""

    def key(table: str, row: tuple[int, int]) -> object:
        return row if table == "l" else row[0]

    added = {
        table: [r for r in product_rows(DOMAIN, DOMAIN) if key(table, r) not in {key(table, x) for x in rows}]
        for table, rows in BASE.items()
    }
    return [n.db for n in row_neighbours(BASE, added)]


def _release(session: sqldp.session.Session, sql: str) -> tuple[list[float], float]:
    """The true values (one per group) and the one Laplace scale they are released with, at the global bound."""
    out = session.analyze(sql, audit=True)
    ms = [g[0] for g in out.measurements]
    assert {m.mechanism for m in ms} == {GLOBAL} and {m.bound for m in ms} == {WORKFLOW_SOURCE}, sql
    assert len({m.noise_scale for m in ms}) == 1 and {m.epsilon for m in ms} == {EPS}
    return [m.true_value or 0.0 for m in ms], ms[0].noise_scale


def _worst_loss(conn: psycopg.Connection, session: sqldp.session.Session, sql: str) -> tuple[float, float]:
    """The largest exact privacy loss over every neighbour, and the largest ℓ1 change of the true answer."""
    _load(conn, BASE)
    f, scale = _release(session, sql)
    worst = moved = 0.0
    for db in _neighbours():
        _load(conn, db)
        f2, scale2 = _release(session, sql)
        assert scale2 == scale  # the scale does not depend on the rows
        change = sum(abs(a - b) for a, b in zip(f, f2, strict=True))
        moved = max(moved, change)
        if len(f) == 1:  # one value: the exact loss on the printed grid
            grid = mechanisms.GRID_EXPONENT
            worst = max(worst, _loss((f[0], scale, grid), (f2[0], scale2, grid)))
        else:  # a histogram with one Laplace scale: Σ_g |Δ_g| / scale, attained in the tails
            worst = max(worst, joint_loss([(x, scale, GLOBAL) for x in f], [(y, scale2, GLOBAL) for y in f2]))
    return worst, moved


@pytest.mark.parametrize("sql", [EXISTS, IN, WITH, GROUPED, SCALAR])
def test_every_neighbour_is_within_epsilon(conn: psycopg.Connection, pg_dsn: str, sql: str) -> None:
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    plan = session.prepare(sql).plans[0]  # type: ignore[union-attr]
    assert isinstance(plan, GlobalPlan) and plan.source == WORKFLOW_SOURCE and plan.bound == BOUNDS[sql]
    # the single-block bound alone is ∞ here (the outer product is a cross product): the workflow is needed
    assert (
        global_bound.global_plan(sensitivity.plan_rows(plan.form, session.catalog, session.policy), session.catalog)
        is None
    )
    worst, moved = _worst_loss(conn, session, sql)
    assert worst <= EPS * (1 + 1e-9), sql
    assert moved == MOVED[sql] and worst > 0.5 * MOVED[sql] / BOUNDS[sql] * EPS  # the neighbours use the budget


def test_released_json_names_the_bound_and_the_mechanism(conn: psycopg.Connection, pg_dsn: str) -> None:
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    _load(conn, BASE)
    out = session.run(EXISTS).to_json()
    assert out["audit"] is False and out["mechanism"] == GLOBAL
    m = out["measurements"][0][0]
    assert m["mechanism"] == GLOBAL and m["bound"] == WORKFLOW_SOURCE and m["noise_scale"] == BOUNDS[EXISTS] / EPS
    assert session.analyze(EXISTS, audit=False).to_json()["plan"][0]["bound"] == WORKFLOW_SOURCE  # nothing read
    # a data-dependent release names no bound and shows no scale
    smoothed = session.run("SELECT COUNT(*) FROM o, s WHERE o.g = s.w").to_json()["measurements"][0][0]
    assert not {"bound", "noise_scale"} & smoothed.keys()


def test_mutant_without_the_steps_terms_exceeds_epsilon(
    conn: psycopg.Connection, pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """c′ alone (every c_D·r_D·S_D dropped): the bound of EXISTS falls to 1, and the neighbour that adds o's row
    (1, 0) — its own join row and, through D = {0, 1}, o(0)'s — moves the count by 2: loss 2ε."""
    monkeypatch.setattr(mw.Step, "rows_per_group", property(lambda self: 0))
    monkeypatch.setattr(global_bound, "_workflow_cache", {})
    session = sqldp.connect(pg_dsn, Policy.from_toml(POLICY))
    plan = session.prepare(EXISTS).plans[0]  # type: ignore[union-attr]
    assert isinstance(plan, GlobalPlan) and plan.bound == 1.0
    worst, moved = _worst_loss(conn, session, EXISTS)
    assert moved == 2.0 and worst > 1.5 * EPS


def _plan(sql: str, policy: str, *, enforced: bool = True) -> Any:
    catalog = dataclasses.replace(Catalog.from_ddl(DDL), enforced=enforced)
    p = Policy.from_toml(policy)
    return sensitivity.plan(normalize(parse(sql, catalog), catalog, p), catalog, p)


def test_only_row_level_neighbours_with_enforced_keys() -> None:
    """The model checker counts rows: a value-level change (a norm on o) is not one row added or removed, so
    the value plan answers (as for a single block); keys a schema file states are claims nothing enforces."""
    assert _plan(EXISTS, POLICY).source == WORKFLOW_SOURCE
    assert not _plan(EXISTS, POLICY, enforced=False).data_independent
    valued = POLICY.replace("[tables.o]\n", '[tables.o]\nnorm = "l1(g)"\n')
    assert not isinstance(
        _plan("SELECT SUM(o.g) FROM o, s WHERE EXISTS (SELECT * FROM l WHERE l.k = o.k AND l.k = s.k)", valued),
        GlobalPlan,
    )


# -- sqldp explain ------------------------------------------------------------------------------------------


def _explain(sql: str, *, enforced: bool = True) -> tuple[dict[str, Any], str]:
    from sqldp.commands.explain import _text, explain

    catalog = dataclasses.replace(Catalog.from_ddl(DDL), enforced=enforced)
    out = explain(sql, catalog, Policy.from_toml(POLICY))
    return out, _text(out)


def test_explain_shows_the_steps_and_the_composed_bound() -> None:
    out, text = _explain(EXISTS)
    w = out["workflow_sensitivity"]
    assert [(s["name"], s["kind"], s["key"]) for s in w["steps"]] == [("d1", "distinct", ["g"]), ("main", "main", [])]
    main = w["steps"][1]["direct"]
    assert {t: g["sensitivity"] for t, g in main.items()} == {"o": 1, "s": 1, "d1": 1}
    assert w["total"] == {"o": 2, "s": 1} and w["measure"] == "join" and w["why"] == {}
    # the release's choice beside it: Laplace at the workflow's bound
    assert out["mechanisms"] == {"COUNT(*)": GLOBAL} and out["bounds"] == {"COUNT(*)": WORKFLOW_SOURCE}
    assert "Global sensitivity as a workflow" in text
    assert "  step d1 (distinct, key g): rows per row of o 1" in text
    assert "    o: 2\n    s: 1\n" in text
    assert f"COUNT(*) → {GLOBAL} (global bound: {WORKFLOW_SOURCE})" in text


def test_explain_says_why_a_bound_is_infinite() -> None:
    # s is a cross product with o: one s row meets every o row, and one o row every s row
    out, text = _explain("SELECT COUNT(*) FROM o, s WHERE EXISTS (SELECT * FROM l WHERE l.k = o.k)")
    w = out["workflow_sensitivity"]
    assert w["total"] == {"o": "inf", "s": "inf", "l": "inf"}
    assert w["why"]["s"].startswith("main w.r.t. s: ") and "renew without end" in w["why"]["s"]
    assert "    s: ∞ (main w.r.t. s: keys (rows of other tables renew without end))" in text
    assert out["mechanisms"] == {"COUNT(*)": "cauchy"} and "bounds" not in out
    # through a step: o2's rows reach D's rows without bound (o2.g is no key), each D row one outer row
    out, text = _explain("SELECT COUNT(*) FROM s WHERE EXISTS (SELECT * FROM o o2 WHERE o2.g = s.k)")
    assert out["workflow_sensitivity"]["total"] == {"s": 1, "o": 1}
    out, _ = _explain("SELECT COUNT(*) FROM s WHERE EXISTS (SELECT * FROM o o2 WHERE o2.g < s.k)")
    assert out["workflow_sensitivity"]["total"]["o"] == "inf"
    assert out["workflow_sensitivity"]["why"]["o"].startswith("main w.r.t. step d1: ")


def test_explain_shows_a_with_step_and_what_it_does_not_decompose() -> None:
    # a grouped WITH step: a changed group is one row out and one in (r_D = 2)
    out, text = _explain(
        "WITH x AS (SELECT l.k, SUM(l.n) AS t FROM l GROUP BY l.k) "
        "SELECT COUNT(*) FROM o, x WHERE o.k = x.k AND x.t > 1"
    )
    w = out["workflow_sensitivity"]
    assert [(s["kind"], s["key"]) for s in w["steps"]] == [("grouped", ["k"]), ("main", [])]
    assert w["total"] == {"o": 1, "l": 2}
    assert "  step x__step1 (grouped, key k): rows per row of l 1" in text
    out, text = _explain("SELECT COUNT(*) FROM o WHERE EXISTS (SELECT * FROM l WHERE l.n = 1)")
    assert "uncorrelated EXISTS" in out["workflow_sensitivity"]["refused"]
    assert "  not decomposed: " in text
    _, text = _explain(EXISTS, enforced=False)  # keys from a schema file: shown, not relied on
    assert "not enforced by PostgreSQL: the release does not rely on them" in text
    assert "workflow_sensitivity" not in _explain("SELECT COUNT(*) FROM o, s WHERE o.k = s.k")[0]
