"""Value-level sensitivity (NR §3.3.8) against independent oracles.

* Finite differences on random small databases (real PostgreSQL): sensitive values are changed by small
  random amounts, the true change of the query is measured and compared with the analysis. By Lemma 3.78,
  |f(x′) − f(x)| ≤ e^(β‖x′−x‖)·c(x)·‖x′ − x‖ for the continuous q_m; with exact step filters q_m equals the
  query on every database of the column types, so the plain query's change must obey it. Smoothness:
  c(x) ≤ e^(β‖x−x′‖)·c(x′) in both directions.
* Hypothesis: the Table 10 / Fig. 41 bounds, evaluated by a small independent evaluator of the generated
  SQL expressions, are upper bounds of |e| and |∂e/∂v| and are β-smooth.
* Routing: refusals are one line; queries without sensitive columns keep the row plan.
"""

from __future__ import annotations

import math
import random
import re
import zlib
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

import sqldp
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Policy, parse_norm
from sqldp.sensitivity.columns import ColumnPlan
from sqldp.sensitivity.expressions import RangeOps, SqlOps, bound, column_weights, dual, norm_separates
from sqldp.sensitivity.filters import SIGMOID_ALPHA, approximate

DDL = """
CREATE TABLE t (id INT PRIMARY KEY, k INT, a INT, x NUMERIC(6,2), d DATE);
CREATE TABLE u (id INT PRIMARY KEY, k INT, b INT);
"""
POLICY = """
[tables.t]
rows = "public"
norm = "l1(a, 0.5*x, linf(d))"
[tables.u]
rows = "public"
norm = "l2(b)"
"""
BETA = 0.1
QUERIES = [
    "SELECT SUM(t.x) FROM t WHERE t.a >= 2",
    "SELECT COUNT(*) FROM t WHERE t.a > 1 AND t.d < date '2020-01-05'",
    "SELECT SUM(t.x * t.a) FROM t WHERE t.a <= 3 OR t.x > 1.5",
    "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.a > u.b",
    "SELECT SUM(t.x * u.b) FROM t, u WHERE t.k = u.k AND u.b < 2",
    "SELECT SUM(t.x + u.b) FROM t, u WHERE t.k = u.id AND t.a > 1",  # u's key fixed: t's bound needs no GROUP BY
    "SELECT SUM(t.a - 2 * t.x) FROM t WHERE t.x BETWEEN 0.5 AND 2.5 AND NOT t.a = 1",
    "SELECT SUM(EXP(0.05 * t.a)) FROM t WHERE t.x > 1",  # L = 0.05 ≤ β: e^g exactly (NR Table 10, e^(rx))
    "SELECT SUM(SQRT(t.a * t.a + t.x * t.x)) FROM t, u WHERE t.k = u.k",  # ℓ2 norm (NR Table 10, ‖x‖_p)
    "SELECT SUM(POWER(ABS(t.x), 1.5) - t.a) FROM t",  # a real power ≥ 1 (NR Table 10, x^r)
    "SELECT SUM(t.x * CAST(t.k * 0.4 AS INTEGER)) FROM t",  # a rounding cast of a public value: |round(v)| ≤ |v| + ½
]


def _load(dsn: str, t_rows: list[tuple], u_rows: list[tuple]) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("TRUNCATE t, u")
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s, %s, date '2020-01-01' + %s)", t_rows)
            cur.executemany("INSERT INTO u VALUES (%s, %s, %s)", u_rows)


def _released(session: Any, query: str) -> tuple[float, float]:
    """c(x) at β and q_m, the continuous function the noise is added to (with a sigmoid filter it is not the
    plain query, which jumps where a row crosses the threshold)."""
    res = session.analyze(query, epsilon=1.0, beta=BETA)
    return float(res.to_json()["sensitivity"]), float(res.measurements[0][0].true_value or 0.0)


def _distance(t0: list[tuple], t1: list[tuple], u0: list[tuple], u1: list[tuple]) -> float:
    """The policy metric: ℓ1 over rows of l1(a, 0.5·x, linf(d)) and of l2(b); ℓ1 over tables."""
    dt = sum(abs(r[2] - s[2]) + 0.5 * abs(r[3] - s[3]) + abs(r[4] - s[4]) for r, s in zip(t0, t1, strict=True))
    du = sum(abs(r[2] - s[2]) for r, s in zip(u0, u1, strict=True))
    return dt + du


@pytest.mark.parametrize("query", QUERIES)
def test_finite_differences_never_exceed_the_bound(pg_dsn: str, query: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    rng = random.Random(zlib.crc32(query.encode()))  # the same databases in every run (str hashes are salted)
    for _ in range(3):
        t0 = [
            (i, rng.randint(0, 2), rng.randint(0, 4), round(rng.uniform(0, 3), 2), rng.randint(0, 8)) for i in range(6)
        ]
        u0 = [(i, rng.randint(0, 2), rng.randint(0, 3)) for i in range(4)]
        _load(pg_dsn, t0, u0)
        c0, f0 = _released(session, query)
        for _ in range(4):
            t1 = [list(r) for r in t0]
            u1 = [list(r) for r in u0]
            for _ in range(rng.randint(1, 2)):  # one or two small changes of sensitive values
                if rng.random() < 0.7:
                    r = rng.choice(t1)
                    col = rng.choice([2, 3, 4])
                    r[col] = (
                        r[col] + rng.choice([-1, 1]) if col != 3 else round(r[3] + rng.choice([-0.01, 0.01, 0.5]), 2)
                    )
                else:
                    rng.choice(u1)[2] += rng.choice([-1, 1])
            t1t, u1t = [tuple(r) for r in t1], [tuple(r) for r in u1]
            dist = _distance(t0, t1t, u0, u1t)
            _load(pg_dsn, t1t, u1t)
            c1, f1 = _released(session, query)
            slack = 1e-9 * max(1.0, abs(f0))
            assert abs(f1 - f0) <= math.exp(BETA * dist) * c0 * dist + slack, (t0, t1t, u0, u1t)
            assert abs(f1 - f0) <= math.exp(BETA * dist) * c1 * dist + slack
            assert c0 <= math.exp(BETA * dist) * c1 * (1 + 1e-9) and c1 <= math.exp(BETA * dist) * c0 * (1 + 1e-9)
            _load(pg_dsn, t0, u0)


# -- the expression bounds, by an evaluator independent of PostgreSQL -----------------------------------


def _eval(e: exp.Expression, env: dict[str, float]) -> float:
    if isinstance(e, (exp.Paren, exp.Cast)):
        return _eval(e.this, env)
    if isinstance(e, exp.Literal):
        return float(e.this)
    if isinstance(e, exp.Neg):
        return -_eval(e.this, env)
    if isinstance(e, exp.Column):
        return env[e.name]
    if isinstance(e, exp.Abs):
        return abs(_eval(e.this, env))
    if isinstance(e, exp.Exp):
        return math.exp(_eval(e.this, env))
    if isinstance(e, exp.Sqrt):
        return math.sqrt(_eval(e.this, env))
    if isinstance(e, exp.Pow):
        return _eval(e.this, env) ** _eval(e.expression, env)  # the bounds raise non-negatives only
    if isinstance(e, (exp.Greatest, exp.Least)):
        vals = [_eval(x, env) for x in [e.this, *e.expressions]]
        return max(vals) if isinstance(e, exp.Greatest) else min(vals)
    a, b = _eval(e.this, env), _eval(e.expression, env)
    return {exp.Add: a + b, exp.Sub: a - b, exp.Mul: a * b, exp.Div: a / b if b else math.nan}[type(e)]


EXPRESSIONS = {
    "t.x": lambda x, y: (x, {"x": 1.0, "y": 0.0}),
    "t.x * t.y": lambda x, y: (x * y, {"x": y, "y": x}),
    "t.x * (1 - t.y) * 3": lambda x, y: (3 * x * (1 - y), {"x": 3 * (1 - y), "y": -3 * x}),
    "(t.x + 2 * t.y) / 4": lambda x, y: ((x + 2 * y) / 4, {"x": 0.25, "y": 0.5}),
    "POWER(t.x, 2) - t.y": lambda x, y: (x * x - y, {"x": 2 * x, "y": -1.0}),
    "GREATEST(t.x, t.y)": lambda x, y: (max(x, y), {"x": float(x > y), "y": float(y >= x)}),
    "EXP(0.05 * t.x)": lambda x, y: (math.exp(0.05 * x), {"x": 0.05 * math.exp(0.05 * x), "y": 0.0}),
    "EXP(t.x * 0.02 - t.y * 0.01)": lambda x, y: (
        math.exp(0.02 * x - 0.01 * y),
        {"x": 0.02 * math.exp(0.02 * x - 0.01 * y), "y": -0.01 * math.exp(0.02 * x - 0.01 * y)},
    ),
    "POWER(ABS(t.x), 1.5)": lambda x, y: (abs(x) ** 1.5, {"x": 1.5 * math.copysign(abs(x) ** 0.5, x), "y": 0.0}),
    "SQRT(POWER(t.x, 2) + POWER(t.y, 2))": lambda x, y: (
        math.hypot(x, y),
        {"x": x / math.hypot(x, y), "y": y / math.hypot(x, y)} if x or y else {"x": 0.0, "y": 0.0},
    ),
    "POWER(POWER(ABS(t.x), 3) + POWER(ABS(t.y), 3), 1.0/3)": lambda x, y: _l3(x, y),
    "t.x * SQRT(t.x * t.x + 1)": lambda x, y: (
        x * math.sqrt(x * x + 1),
        {"x": math.sqrt(x * x + 1) + x * x / math.sqrt(x * x + 1), "y": 0.0},
    ),
}
WEIGHTS = {"x": 1.0, "y": 0.25}
# L = Σ_v |∂g/∂v|/w_v of the EXP arguments: the bound is ∞ exactly when L > β (NR Table 10, e^(rx) with |r| ≤ β)
LIPSCHITZ = {"EXP(0.05 * t.x)": 0.05, "EXP(t.x * 0.02 - t.y * 0.01)": 0.02 / 1.0 + 0.01 / 0.25}


def _l3(x: float, y: float) -> tuple[float, dict[str, float]]:
    """‖(x, y)‖_3 and its gradient sign(a)·(|a|/‖·‖)² (0 at the origin, where every direction gives ≤ 1),
    computed on the values scaled by the larger one: cubes of values near 1e-107 are subnormal, and the
    unscaled gradient came out as 1.0000027 where it is exactly 1 (x = 0)."""
    scale = max(abs(x), abs(y))
    if scale == 0:
        return 0.0, {"x": 0.0, "y": 0.0}
    r = scale * ((abs(x) / scale) ** 3 + (abs(y) / scale) ** 3) ** (1 / 3)
    return r, {"x": math.copysign((x / r) ** 2, x), "y": math.copysign((y / r) ** 2, y)}


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(EXPRESSIONS)),
    st.floats(-60, 60),
    st.floats(-60, 60),
    st.floats(-3, 3),
    st.floats(-3, 3),
    st.sampled_from([0.01, 0.1, 0.5]),
    st.sampled_from(["l1", "linf", "l2"]),
)
def test_expression_bounds_are_smooth_upper_bounds(
    text: str, x: float, y: float, dx: float, dy: float, beta: float, p: str
) -> None:
    """Under ℓ1, x and y are separated (a product keeps the whole β in each factor); under ℓ∞ and ℓ2 they
    are not (β is split). The distance is the norm's own, so a wrong separation fails the smoothness check."""
    import sqlglot

    norm = parse_norm(f"{p}(x, 0.25*y)", "test")
    e = sqlglot.parse_one(text, read="postgres")

    def separated(a: frozenset[ColumnRef], b: frozenset[ColumnRef]) -> bool:
        return norm_separates(norm, {r.column for r in a}, {r.column for r in b})

    ub, d = bound(e, lambda r: WEIGHTS.get(r.column), SqlOps(), beta, separated)
    env0, env1 = {"x": x, "y": y}, {"x": x + dx, "y": y + dy}
    parts = (WEIGHTS["x"] * abs(dx), WEIGHTS["y"] * abs(dy))
    dist = {"l1": sum(parts), "linf": max(parts), "l2": math.hypot(*parts)}[p]
    value, grad = EXPRESSIONS[text](x, y)
    u0, u1 = _eval(ub, env0), _eval(ub, env1)
    # EXP: no β-smooth bound when its argument moves faster than β allows; then ∞ everywhere (β unusable)
    assert math.isinf(u0) == (LIPSCHITZ.get(text, 0.0) > beta)
    if math.isinf(u0):
        assert math.isinf(u1) and d and all(math.isinf(_eval(v, env0)) for v in d.values())
        return
    if text in LIPSCHITZ:
        assert u0 == pytest.approx(value, rel=1e-12)  # e^g itself, not a looser bound
    assert abs(value) <= u0 * (1 + 1e-9) + 1e-9
    assert u0 <= math.exp(beta * dist) * u1 * (1 + 1e-9) + 1e-12
    for v in ("x", "y"):
        ref = ColumnRef("t", v)
        d0 = _eval(d[ref], env0) if ref in d else 0.0
        d1 = _eval(d[ref], env1) if ref in d else 0.0
        assert abs(grad[v]) <= d0 * (1 + 1e-9) + 1e-9
        assert d0 <= math.exp(beta * dist) * d1 * (1 + 1e-9) + 1e-12


@pytest.mark.parametrize(
    "text",
    [
        "SQRT(t.x)",  # DS of √x is unbounded near 0
        "SQRT(POWER(t.x, 2) - POWER(t.y, 2))",  # not a norm
        "SQRT(t.x * t.y + 1)",
        "SQRT(POWER(t.x, 2) + POWER(t.y, 2) - 1)",
        "SQRT(POWER(t.x, 2) + t.y)",
        "POWER(POWER(ABS(t.x), 3) + POWER(ABS(t.y), 3), 0.5)",  # outer exponent is not 1/p
        "POWER(POWER(ABS(t.x), 3) + POWER(ABS(t.y), 2), 1.0/3)",  # summands of different exponents
        "POWER(POWER(t.x, 3) + POWER(t.y, 3), 1.0/3)",  # x³ < 0 for x < 0: not |x|³
        "POWER(POWER(ABS(t.x), 3) + POWER(ABS(t.y), 3), 1/3)",  # integer division: POWER(…, 0)
        "POWER(t.x, 0.5)",
        "POWER(ABS(t.x), 1.0/3)",
        "EXP(t.x * t.y)",  # ∂g/∂x = y is not a constant
        "EXP(EXP(0.01 * t.x))",
        "EXP(0.01 * POWER(t.x, 2))",
    ],
)
def test_lookalikes_of_the_norm_power_and_exp_rules_are_refused(text: str) -> None:
    import sqlglot

    e = sqlglot.parse_one(text, read="postgres")
    with pytest.raises(RefusedError) as err:
        bound(e, lambda r: WEIGHTS.get(r.column), SqlOps(), 0.1)
    assert "\n" not in str(err.value)


def test_range_bounds_of_exp_powers_and_norms() -> None:
    """RangeOps (the global c3 of NR §3.3.9.3): maxima over x ∈ [−60, 60], y ∈ [−2, 4]; a global maximum needs
    no smoothing, so EXP keeps its finite value even where L > β."""
    import sqlglot

    ops = RangeOps(lambda r: {"x": (-60.0, 60.0), "y": (-2.0, 4.0)}[r.column])
    x, y = ColumnRef("t", "x"), ColumnRef("t", "y")

    def at(text: str, beta: float = 0.1) -> tuple[float, dict[ColumnRef, float]]:
        return bound(sqlglot.parse_one(text, read="postgres"), lambda r: WEIGHTS.get(r.column), ops, beta)

    for beta in (0.01, 0.1):
        ub, d = at("EXP(t.x * 0.02 - t.y * 0.01)", beta)
        assert ub == pytest.approx(math.exp(1.2 + 0.04)) and d[x] == pytest.approx(0.02 * ub)
        assert d[y] == pytest.approx(0.01 * ub)
    ub, d = at("POWER(ABS(t.x), 1.5)")
    assert ub == pytest.approx(60**1.5) and d[x] == pytest.approx(1.5 * 60**0.5)
    # a constant divisor as PostgreSQL computes it: (1 + 2) / 2 is 1; a rounding cast is not taken for its
    # operand (CAST(2.4 AS INTEGER) divides by 2, not 2.4, which gave a bound below the derivative 0.5)
    assert at("t.x / ((1 + 2) / 2)")[1][x] == pytest.approx(1.0)
    with pytest.raises(RefusedError):
        at("t.x / CAST(2.4 AS INTEGER)")
    ub, d = at("SQRT(POWER(t.x, 2) + POWER(t.y, 2))")
    assert ub == pytest.approx(math.hypot(60, 4)) and d == {x: 1.0, y: 1.0}
    ub, d = at("POWER(POWER(ABS(t.x), 3) + POWER(ABS(t.y), 3) + 8, 1.0/3)")
    assert ub == pytest.approx((60**3 + 4**3 + 8) ** (1 / 3)) and d == {x: 1.0, y: 1.0}


def test_a_beta_without_a_smooth_bound_is_unusable(pg_dsn: str) -> None:
    """EXP(0.05·a) has no β-smooth bound for β < 0.05 (NR Table 10, e^(rx) with |r| ≤ β): those β give ∞,
    which the β search skips, and a user's β below 0.05 is refused."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, [(1, 0, 2, 1.5, 3), (2, 1, 4, 0.25, 1)], [(1, 0, 1)])
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    for query in ("SELECT SUM(EXP(0.05 * t.a)) FROM t", "SELECT SUM(EXP(0.05 * t.a)) FROM t WHERE t.x > 1"):
        out = session.analyze(query, epsilon=1.0).to_json()  # β chosen among the grid points ≥ 0.05
        assert math.isfinite(float(out["sensitivity"])) and float(out["sensitivity"]) > 0
        with pytest.raises(RefusedError, match="unbounded"):
            session.analyze(query, epsilon=1.0, beta=0.01)
    # |∂/∂a| = 0.05·e^(0.05·a), largest at a = 4 (a has weight 1); e^g is exact, not a looser bound
    out = session.analyze("SELECT SUM(EXP(0.05 * t.a)) FROM t", epsilon=1.0, beta=0.1).to_json()
    assert float(out["sensitivity"]) == pytest.approx(0.05 * math.exp(0.05 * 4))


def test_norm_separation() -> None:
    # NR §4.3.3.3's lineitem norm: an ℓ1 node separates its terms; inside linf(dates) nothing is separated
    norm = parse_norm("l1(q, 0.0001*p, 50*disc, linf(s, c, r))", "test")
    assert norm_separates(norm, {"p"}, {"disc"}) and norm_separates(norm, {"p", "q"}, {"disc", "s"})
    assert not norm_separates(norm, {"s"}, {"c"}) and not norm_separates(norm, {"p"}, {"p"})
    assert norm_separates(parse_norm("linf(a, l1(b, c))", "test"), {"b"}, {"c"})
    assert not norm_separates(parse_norm("l2(a, l1(b, c))", "test"), {"a"}, {"b"})


def test_dual_norm_of_the_lineitem_norm() -> None:
    # NR Lemmas 3.64–3.66: l1(q, 1e-4·p, 50·disc, linf(dates)) has dual max(|∂q|, 1e4·|∂p|, |∂disc|/50, Σ|∂date|)
    norm = parse_norm("l1(q, 0.0001*p, 50*disc, linf(s, c, r))", "test")
    parts = {"q": 1.0, "p": 2.0, "disc": 100.0, "s": 1.0, "c": 1.0, "r": 1.0}
    assert dual(norm, parts, "float") == pytest.approx(max(1.0, 2e4, 2.0, 3.0))
    assert column_weights(norm) == {"q": 1.0, "p": 0.0001, "disc": 50.0, "s": 1.0, "c": 1.0, "r": 1.0}


# -- routing and refusals ----------------------------------------------------------------------------


def test_plans_refusals_and_breakdown(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, [(1, 0, 2, 1.5, 3), (2, 1, 4, 0.25, 1)], [(1, 0, 1)])
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    assert session.catalog.table("t").column("x").type_sql == "NUMERIC(6,2)"  # the scale survives the catalog
    prepared = session.prepare("SELECT SUM(t.x) FROM t WHERE t.a >= 2", epsilon=1.0, beta=BETA)
    assert isinstance(prepared.plans[0], ColumnPlan)
    out = session.analyze("SELECT SUM(t.x) FROM t WHERE t.a >= 2", epsilon=1.0, beta=BETA).to_json()
    cols = out["tables"]["t"]["columns"]
    assert set(cols) == {"a", "x"} and cols["x"]["norm_weight"] == 0.5
    # the released aggregate of an exact-step query is the plain query's
    res = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY), seed=1).run(
        "SELECT COUNT(*) FROM t WHERE t.a >= 3", epsilon=100.0
    )
    assert res.measurements[0][0].true_value == pytest.approx(1.0, abs=1e-3)
    for bad in (
        "SELECT MIN(t.x) FROM t WHERE t.a >= 2",  # MIN/MAX with a private filter (NR §3.3.8.4's Δ)
        "SELECT SUM(t.x / t.a) FROM t",
        "SELECT COUNT(*) FROM t WHERE t.a * t.x > 1",
    ):
        with pytest.raises(RefusedError) as err:
            session.analyze(bad, epsilon=1.0)
        assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("query", "real", "step"),
    [
        ("SELECT SUM(t.a / 2) FROM t", "SELECT SUM(t.a / 2.0) FROM t", "t.a / 2 is an integer division"),
        (
            "SELECT SUM(t.x * ((t.a + 1) / 3)) FROM t",
            "SELECT SUM(t.x * ((t.a + 1) / 3.0)) FROM t",
            "(t.a + 1) / 3 is an integer division",
        ),
        (  # clamped first: CAST(NaN AS INTEGER) fails, and NUMERIC(6, 2) holds NaN (failures.py refuses that)
            "SELECT SUM(CAST(LEAST(GREATEST(t.x, -100), 100) AS INTEGER)) FROM t",
            "SELECT SUM(CAST(t.x AS DOUBLE PRECISION)) FROM t",
            "rounds",
        ),
        ("SELECT MAX(t.x::numeric(6, 1)) FROM t", "SELECT MAX(t.x::numeric) FROM t", "rounds"),
        ("SELECT COUNT(*) FROM t WHERE t.a / 2 > 1", "SELECT COUNT(*) FROM t WHERE t.a / 2.0 > 1", "filter's t.a / 2"),
        (  # u.b is sensitive too, but any column counts in a private filter: its step is not approximated
            "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.x > u.b / 2",
            "SELECT COUNT(*) FROM t, u WHERE t.k = u.k AND t.x > u.b / 2.0",
            "filter's u.b / 2",
        ),
    ],
)
def test_postgresql_steps_over_sensitive_values_are_refused(pg_dsn: str, query: str, real: str, step: str) -> None:
    """Integer division and rounding casts are steps (sqldp/pg_arithmetic.py): refused with the fix in one
    line, while the real-valued spellings of the same queries are analysed."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    _load(pg_dsn, [(1, 0, 2, 1.5, 3), (2, 1, 4, 0.25, 1)], [(1, 0, 1)])
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    with pytest.raises(RefusedError, match=re.escape(step)) as err:
        session.analyze(query, epsilon=1.0, beta=BETA)
    assert "\n" not in str(err.value) and ("2.0" in str(err.value) or "DOUBLE PRECISION" in str(err.value))
    assert session.analyze(real, epsilon=1.0, beta=BETA).to_json()["sensitivity"] > 0


@pytest.mark.parametrize(
    ("grain", "exact", "slope"),
    [(1.0, True, 1.0), (0.01, False, SIGMOID_ALPHA / 4), (0.5, False, SIGMOID_ALPHA / 4), (None, False, 1.25)],
)
def test_a_step_filter_is_used_only_where_it_is_not_steeper_than_the_sigmoid(
    grain: float | None, exact: bool, slope: float
) -> None:
    # NR §3.3.8.5: a grid of width g gives an exact step of slope 1/g; DECIMAL(15, 2) would give 100
    import sqlglot

    ref = ColumnRef("t", "x")
    f = approximate(sqlglot.parse_one("t.x > 3"), lambda r: ("numeric", grain, 1.0, True))
    assert f.exact is exact and f.slopes[ref] == pytest.approx(slope)


@pytest.mark.parametrize(
    ("cond", "formula"),
    [
        ("t.x > 3", lambda x: 1 / (1 + math.exp(-SIGMOID_ALPHA * (x - 3)))),  # NR Table 9: sigmoid
        ("t.x <= 3", lambda x: 1 / (1 + math.exp(-SIGMOID_ALPHA * (3 - x)))),
        ("t.x = 3", lambda x: 2 / (math.exp(SIGMOID_ALPHA * (x - 3)) + math.exp(-SIGMOID_ALPHA * (x - 3)))),  # tauoid
        ("t.x <> 3", lambda x: 1 - 2 / (math.exp(SIGMOID_ALPHA * (x - 3)) + math.exp(-SIGMOID_ALPHA * (x - 3)))),
    ],
)
def test_sigmoid_and_tauoid_sql_are_the_formulas_without_overflow(pg_dsn: str, cond: str, formula: Any) -> None:
    """The filters' SQL (written with tanh and cosh) evaluated by PostgreSQL equals NR Table 9's formulas, and
    arguments far beyond exp()'s range (e^709) give 0 or 1 instead of an overflow error."""
    import sqlglot

    f = approximate(sqlglot.parse_one(cond), lambda r: ("numeric", None, 1.0, True))
    assert not f.exact
    points = [-1e6, -200.0, 0.0, 2.5, 2.9, 3.0, 3.1, 3.5, 7.0, 200.0, 1e6]
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (x DOUBLE PRECISION)")
        conn.cursor().executemany("INSERT INTO t VALUES (%s)", [(x,) for x in points])
        got = conn.execute(f"SELECT t.x, {f.sql.sql(dialect='postgres')} FROM t ORDER BY t.x").fetchall()
    for x, value in got:
        want = formula(max(-100.0, min(100.0, x)))  # flat beyond (within e^−485 of 0 or 1); exp(1e6) overflows
        assert value == pytest.approx(want, rel=1e-9, abs=1e-12), (cond, x)


def test_a_use_whose_joins_fix_every_other_key_is_in_one_product_row(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(DDL)
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(POLICY))
    plan = session.prepare("SELECT SUM(t.x + u.b) FROM t, u WHERE t.k = u.id", epsilon=1.0, beta=BETA).plans[0]
    by_alias = {u.alias: plan.value_queries[u.query].sql() for u in plan.uses}
    assert "GROUP BY" not in by_alias["t"] and "GROUP BY" in by_alias["u"]  # t.k = u.id fixes u's key only
    plan = session.prepare("SELECT SUM(t.x + u.b) FROM t, u WHERE t.k = u.k", epsilon=1.0, beta=BETA).plans[0]
    assert all("GROUP BY" in plan.value_queries[u.query].sql() for u in plan.uses)
    # one t row in three product rows: ∂SUM/∂x = 3, in the norm's unit 3/0.5 = 6 (a MAX would say 2)
    _load(pg_dsn, [(1, 1, 2, 1.5, 3)], [(1, 1, 1), (2, 1, 1), (3, 1, 1)])
    out = session.analyze("SELECT SUM(t.x) FROM t, u WHERE t.k = u.k", epsilon=1.0, beta=BETA).to_json()
    assert out["tables"]["t"]["value_sensitivity"] == pytest.approx(6.0)
    out = session.analyze("SELECT SUM(t.x) FROM t, u WHERE t.k = u.id", epsilon=1.0, beta=BETA).to_json()
    assert out["tables"]["t"]["value_sensitivity"] == pytest.approx(2.0)
