"""Operators added to the table of ``sqldp.sensitivity.operators`` as one entry each, against oracles.

* Interval rule — PostgreSQL by brute force: random declared ranges (hypothesis), the expression evaluated by
  the server at every point of a grid over them; the interval must hold every value (and, when given at all,
  PostgreSQL must not fail on any point). SIGN's interval is also exact: its ends are attained.
* Derivative rule — finite differences: where the value-level bound (over the declared ranges) answers,
  |f(x₁) − f(x₀)| ≤ d·|x₁ − x₀| and |f| ≤ ub for points of the range, f evaluated by PostgreSQL. A step of a
  sensitive value must be refused (no derivative bound exists at its jump, NR §3.3.8); its own value-free
  uses must be answered.
* ``test_the_oracles_catch_wrong_rules`` swaps wrong rules into the table (SIGN's derivative 0 everywhere, its
  interval [0, 1]; MOD's interval [0, |b|], as if remainders were never negative) and shows the checks above
  fail on them.
* Failures and types as PostgreSQL has them, and the row-level SUM end to end (sensitivity and true value).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import sqlglot
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pg_support import loaded_database
from sqlglot import exp

import sqldp
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.policy import Policy
from sqldp.sensitivity import operators
from sqldp.sensitivity.expressions import RangeOps, bound
from sqldp.sensitivity.failures import failure, value_failure
from sqldp.sensitivity.intervals import Domain, interval
from sqldp.session import Session

Ranges = dict[str, tuple[float, float]]
KINDS = {"a": "integer", "x": "numeric", "b": "integer", "k": "integer", "f": "numeric"}
TYPES = {"a": "INTEGER", "x": "NUMERIC(8, 2)", "b": "INTEGER", "k": "INTEGER", "f": "DOUBLE PRECISION"}


@pytest.fixture(scope="module")
def conn(pg_server_dsn: str) -> Iterator[psycopg.Connection]:
    with loaded_database(pg_server_dsn, "SELECT 1") as c:
        yield c


def _expr(sql: str) -> exp.Expression:
    return sqlglot.parse_one(sql, read="postgres")


def _domain(ranges: Ranges) -> Domain:
    return Domain(range=lambda ref: ranges[ref.column], kind=lambda ref: KINDS[ref.column])


# -- interval rules against the server ----------------------------------------------------------------------

# every template reads t.a (INTEGER), t.x (NUMERIC, steps of 0.25) or t.b (INTEGER); {c} a quarter, {k} 1..5
INTERVAL_TEMPLATES = [
    "SIGN(t.a)",
    "SIGN(t.x - {c})",
    "SIGN(t.a) * t.x",
    "SIGN(t.a - {k}) + SIGN(t.x)",
    "SIGN(t.a * t.x)",
    "SIGN(t.x) / 2",
    "ABS(SIGN(t.a - t.b))",
    "10 - 3 * SIGN(t.b + {c})",
    "t.a % {k}",
    "t.x % {k}",
    "-t.a % {k}",
    "t.a % -{k}",
    "MOD(t.x * 3, 1.5)",
    "(t.a + t.x) % {k}",
    "SIGN(t.a % {k})",
    "t.a % t.b",  # refused where b's range holds 0 (PostgreSQL then fails on the grid)
    "t.x % (t.b + 0.5)",  # refused where the range of b + 0.5 holds 0 (its values may not)
]
EXACT = {"SIGN(t.a)", "SIGN(t.x - {c})"}  # monotone in one column: the interval's ends are attained


def _grid(ranges: Ranges) -> str:
    (alo, ahi), (xlo, xhi), (blo, bhi) = ranges["a"], ranges["x"], ranges["b"]
    return (
        f"SELECT a, (i * 0.25)::numeric(8, 2) AS x, b FROM generate_series({int(alo)}, {int(ahi)}) a, "
        f"generate_series({int(xlo * 4)}, {int(xhi * 4)}) i, generate_series({int(blo)}, {int(bhi)}) b"
    )


def check_interval(conn: psycopg.Connection, sql: str, ranges: Ranges) -> tuple[float, float] | None:
    """The interval of ``sql`` over ``ranges``, after checking it holds PostgreSQL's every value on the grid
    (None: refused)."""
    try:
        lo, hi = interval(_expr(sql), _domain(ranges))
    except RefusedError:
        return None
    s_lo, s_hi = conn.execute(f"SELECT MIN({sql})::float8, MAX({sql})::float8 FROM ({_grid(ranges)}) t").fetchone()
    slack = 1e-9 * max(1.0, abs(lo), abs(hi))
    assert lo - slack <= s_lo and s_hi <= hi + slack, (sql, ranges, (lo, hi), (s_lo, s_hi))
    return lo, hi


@st.composite
def ranges_(draw: st.DrawFn) -> Ranges:
    def span(lo: int, hi: int, scale: float) -> tuple[float, float]:
        start = draw(st.integers(lo, hi))
        return start * scale, (start + draw(st.integers(0, 6))) * scale

    return {"a": span(-6, 6, 1.0), "x": span(-8, 8, 0.25), "b": span(-4, 4, 1.0)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ranges=ranges_(), template=st.sampled_from(INTERVAL_TEMPLATES), c=st.integers(-8, 8), k=st.integers(1, 5))
@example(ranges={"a": (-3.0, 2.0), "x": (-1.0, 1.0), "b": (0.0, 0.0)}, template="SIGN(t.a)", c=0, k=1)
@example(ranges={"a": (-3.0, 2.0), "x": (-1.0, 1.0), "b": (-1.0, 2.0)}, template="t.a % t.b", c=0, k=1)
@example(ranges={"a": (-6.0, 6.0), "x": (-1.0, 1.0), "b": (-3.0, -1.0)}, template="t.a % t.b", c=0, k=1)
def test_interval_contains_what_postgresql_computes(
    conn: psycopg.Connection, ranges: Ranges, template: str, c: int, k: int
) -> None:
    sql = template.format(c=c * 0.25, k=k)
    got = check_interval(conn, sql, ranges)
    # SIGN never fails, and is bounded by ±1 whatever its argument's range; MOD fails by a divisor of 0 only
    if got is None:
        shift = {"t.a % t.b": 0.0, "t.x % (t.b + 0.5)": 0.5}[template]  # a divisor t.b + shift
        assert ranges["b"][0] + shift <= 0 <= ranges["b"][1] + shift, (sql, ranges)
        if shift == 0:  # b = 0 is on the grid
            with pytest.raises(psycopg.errors.DivisionByZero):
                conn.execute(f"SELECT MIN({sql}) FROM ({_grid(ranges)}) t")
    if template in EXACT:
        server = conn.execute(f"SELECT MIN({sql})::float8, MAX({sql})::float8 FROM ({_grid(ranges)}) t").fetchone()
        assert got == pytest.approx(server), (sql, ranges)


# -- derivative rules against finite differences -------------------------------------------------------------

# t.x is value-sensitive (weight 1), t.k is not; the flag: the expression has a step of a sensitive value
DERIVATIVE_TEMPLATES = [
    ("SIGN(t.x)", True),
    ("SIGN(t.x - {c})", True),
    ("t.x + SIGN(2 * t.x + {c})", True),
    ("SIGN(t.k) * t.x", False),
    ("SIGN(t.k - {k}) * t.x * t.x", False),
    ("t.x - 3 * SIGN(t.k + {c})", False),
    ("t.x % 1.5", True),
    ("(t.x + {c}) % 2", True),
    ("MOD(t.k + 7, t.x + 10)", True),  # a sensitive divisor: 7 % b jumps as b crosses 7/n
    ("(t.k % 2) * t.x", False),
    ("t.x * MOD(t.k, 3) + t.k % 2", False),
]
SENSITIVE = {"x": 1.0}


def check_derivative(
    conn: psycopg.Connection, sql: str, ranges: Ranges, x0: float, x1: float, k: int
) -> tuple[float, float] | None:
    """(ub, d) of ``sql`` over the ranges (None: refused), after checking them against PostgreSQL at two points:
    |f(x₁) − f(x₀)| ≤ d·|x₁ − x₀| (the mean value theorem, d bounding |∂f/∂x| over the whole range) and
    |f| ≤ ub at both."""
    try:
        ub, d = bound(_expr(sql), lambda ref: SENSITIVE.get(ref.column), RangeOps(lambda ref: ranges[ref.column]), 0.1)
    except RefusedError:
        return None
    dx = d.get(ColumnRef("t", "x"), 0.0)
    f0, f1 = (
        float(conn.execute(f"SELECT ({sql})::float8 FROM (SELECT {x!r}::numeric AS x, {k}::int AS k) t").fetchone()[0])
        for x in (x0, x1)
    )

    assert abs(f1 - f0) <= dx * abs(x1 - x0) + 1e-9, (sql, x0, x1, k, f0, f1, dx)
    assert max(abs(f0), abs(f1)) <= ub + 1e-9, (sql, x0, x1, k, ub)
    return ub, dx


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    template=st.sampled_from(DERIVATIVE_TEMPLATES),
    xs=st.tuples(st.integers(-300, 300), st.integers(-300, 300)),
    k=st.integers(-3, 3),
    c=st.integers(-8, 8),
)
@example(template=("SIGN(t.x)", True), xs=(-1, 1), k=0, c=0)  # across the jump
@example(template=("SIGN(t.k) * t.x", False), xs=(-300, 300), k=-2, c=0)
@example(template=("t.x % 1.5", True), xs=(149, 151), k=0, c=0)
@example(template=("t.x * MOD(t.k, 3) + t.k % 2", False), xs=(-300, 300), k=-3, c=0)
def test_derivative_bounds_cover_finite_differences(
    conn: psycopg.Connection, template: tuple[str, bool], xs: tuple[int, int], k: int, c: int
) -> None:
    sql, steps = template[0].format(c=c * 0.25, k=k), template[1]
    ranges: Ranges = {"x": (-3.0, 3.0), "k": (-3.0, 3.0)}
    got = check_derivative(conn, sql, ranges, xs[0] / 100, xs[1] / 100, k)
    # refused exactly where a sensitive value crosses a step: across it, no finite d covers the change
    assert (got is None) == steps, sql


def test_steps_over_sensitive_values_are_refused_in_words(pg_dsn: str) -> None:
    """The value-level analysis names SIGN and MOD as steps, like integer division and rounding casts, and
    answers them of values that are not sensitive."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, k INT, x NUMERIC(6, 2))")
        c.execute("INSERT INTO t SELECT g, g % 5 - 2, (g % 7 - 3) * 0.5 FROM generate_series(1, 50) g")
        plain, plain_mod = c.execute("SELECT SUM(SIGN(k) * x), SUM(x * (k % 3)) FROM t").fetchone()
    policy = Policy.from_toml('[tables.t]\nrows = "public"\nnorm = "l1(x)"\n')
    session = sqldp.connect(pg_dsn, policy=policy)
    with pytest.raises(RefusedError, match=r"SIGN\(t\.x\) is a step"):
        session.analyze("SELECT SUM(SIGN(t.x)) FROM t", epsilon=1.0, beta=0.1)
    with pytest.raises(RefusedError, match=r"t\.x % 2 is a remainder, a step"):
        session.analyze("SELECT SUM(t.x % 2) FROM t", epsilon=1.0, beta=0.1)
    out = session.analyze("SELECT SUM(SIGN(t.k) * t.x) FROM t", epsilon=1.0, beta=0.1)
    assert out.measurements[0][0].true_value == pytest.approx(float(plain))
    # one row's x moves the sum by |SIGN(k)| ≤ 1 per unit: the derivative bound of each row is 1 (ℓ1 norm)
    assert out.to_json()["sensitivity"] == pytest.approx(1.0)
    # a remainder of a value that is not sensitive is exact; |k % 3| ≤ |k| ≤ 2 bounds each row's derivative
    out = session.analyze("SELECT SUM(t.x * (t.k % 3)) FROM t", epsilon=1.0, beta=0.1)
    assert out.measurements[0][0].true_value == pytest.approx(float(plain_mod))
    assert out.to_json()["sensitivity"] == pytest.approx(2.0)
    session.close()


# -- the oracles catch wrong rules ---------------------------------------------------------------------------


def test_the_oracles_catch_wrong_rules(conn: psycopg.Connection, monkeypatch: pytest.MonkeyPatch) -> None:
    """With SIGN's derivative rule claiming 0 everywhere, or its interval [0, 1], the checks above fail."""
    entry = operators.OPERATORS[exp.Sign]
    flat = operators.Rule(lambda c, e: (c.ops.const(1.0), {k: c.ops.const(0.0) for k in c.of(e.this)[1]}))
    monkeypatch.setattr(operators, "_FOUND", {})
    monkeypatch.setitem(operators.OPERATORS, exp.Sign, dataclasses.replace(entry, derivative=flat))
    with pytest.raises(AssertionError):
        check_derivative(conn, "SIGN(t.x)", {"x": (-3.0, 3.0), "k": (0.0, 0.0)}, -0.01, 0.01, 0)
    monkeypatch.setattr(operators, "_FOUND", {})
    monkeypatch.setitem(
        operators.OPERATORS, exp.Sign, dataclasses.replace(entry, interval=operators.Rule(lambda c, e: (0.0, 1.0)))
    )
    with pytest.raises(AssertionError):
        check_interval(conn, "SIGN(t.a)", {"a": (-3.0, 2.0), "x": (0.0, 0.0), "b": (0.0, 0.0)})
    positive = operators.Rule(lambda c, e: (0.0, max(abs(v) for v in c.of(e.expression))))
    monkeypatch.setattr(operators, "_FOUND", {})
    monkeypatch.setitem(
        operators.OPERATORS, exp.Mod, dataclasses.replace(operators.OPERATORS[exp.Mod], interval=positive)
    )
    with pytest.raises(AssertionError):
        check_interval(conn, "t.a % 3", {"a": (-7.0, 7.0), "x": (0.0, 0.0), "b": (0.0, 0.0)})


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("t.a % 3", (-2, 2)),  # integers: at most |b| − 1, with a's sign
        ("t.a % -4", (-3, 3)),  # the divisor's sign does not matter
        ("(t.a + 6) % 4", (0, 3)),  # a ≥ 0
        ("t.a % 10", (-6, 6)),  # |a| < |b|: a itself
        ("MOD(t.x, 7)", (-1.5, 1.5)),
        ("7 % 3", (1, 1)),  # a constant, as PostgreSQL computes it
        ("-7.5 % 2", (-1.5, -1.5)),
    ],
)
def test_mod_interval_is_tight_on_the_grid(conn: psycopg.Connection, sql: str, expected: tuple[float, float]) -> None:
    ranges: Ranges = {"a": (-6.0, 6.0), "x": (-1.5, 1.5), "b": (1.0, 1.0)}
    assert check_interval(conn, sql, ranges) == pytest.approx(expected)
    server = conn.execute(f"SELECT MIN({sql})::float8, MAX({sql})::float8 FROM ({_grid(ranges)}) t").fetchone()
    assert server == pytest.approx(expected)


def test_mod_fails_by_its_divisor_only(conn: psycopg.Connection) -> None:
    """The failure table says MOD divides: a divisor that may be 0 is refused with the safe spelling, which
    PostgreSQL indeed answers (NULL) where the plain one fails."""
    kind = _domain({}).kind
    assert "divides by a value that may be 0" in (failure(_expr("t.a % t.b"), kind) or "")
    assert "divides by a value that may be 0" in (failure(_expr("MOD(t.a, t.b - 1)"), kind) or "")
    assert failure(_expr("t.a % NULLIF(t.b, 0)"), kind) is None and failure(_expr("MOD(t.x, 2.5)"), kind) is None
    with pytest.raises(psycopg.errors.DivisionByZero):
        conn.execute("SELECT a % b FROM (SELECT 7 AS a, 0 AS b) t").fetchone()
    assert conn.execute("SELECT a % NULLIF(b, 0) FROM (SELECT 7 AS a, 0 AS b) t").fetchone() == (None,)


# -- failures and types --------------------------------------------------------------------------------------


def test_sign_never_fails_and_has_postgresql_types(conn: psycopg.Connection) -> None:
    """SIGN is in the table with no ``fails`` rule: PostgreSQL defines it everywhere. Its value rule types it as
    the server does (sign(double precision) for integers), so an overflow after it is still found."""
    dom = Domain(range=lambda ref: None, kind=lambda ref: KINDS[ref.column], type=lambda ref: TYPES[ref.column])
    assert failure(_expr("SIGN(t.a)"), dom.kind) is None
    assert conn.execute("SELECT pg_typeof(SIGN(1))::text, pg_typeof(SIGN(1.5))::text").fetchone() == (
        "double precision",
        "numeric",
    )
    assert conn.execute("SELECT SIGN('NaN'::float8), SIGN('-Infinity'::float8)").fetchone() == (0.0, -1.0)
    found = value_failure(_expr("SIGN(t.f) * 1e308 * 10"), dom)
    assert found is not None and "overflow double precision" in found[1]
    with pytest.raises(psycopg.errors.NumericValueOutOfRange):
        conn.execute("SELECT SIGN(f) * 1e308 * 10 FROM (SELECT 1::float8 AS f) t").fetchone()
    assert value_failure(_expr("SIGN(t.x) * 1e308 * 10"), dom) is None  # NUMERIC: 1e309 is a number
    assert conn.execute("SELECT SIGN(x) * 1e308 * 10 > 0 FROM (SELECT 1.5 AS x) t").fetchone() == (True,)


# -- end to end under the row-level policy ---------------------------------------------------------------------

ROWS_POLICY = """
[tables.t.columns.time]
range = [0, 60]
"""


@pytest.fixture
def rows_db(pg_dsn: str, tmp_path: Path) -> Iterator[Session]:
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute("CREATE TABLE t (id INT PRIMARY KEY, time INT)")
        c.execute("INSERT INTO t SELECT g, g % 61 FROM generate_series(1, 300) g")
    session = sqldp.connect(pg_dsn, policy=Policy.from_toml(ROWS_POLICY), seed=1)
    yield session
    session.close()


@pytest.mark.parametrize(
    ("query", "plain", "sensitivity"),
    [
        # one row moves SUM(e) by max |e| over the declared range (NR §3.3.7.3; one table: COUNT's bound is 1)
        ("SELECT SUM(SIGN(t.time - 30)) FROM t", "SELECT SUM(SIGN(time - 30)) FROM t", 1.0),
        ("SELECT SUM(3 * SIGN(t.time)) FROM t", "SELECT SUM(3 * SIGN(time)) FROM t", 3.0),
        ("SELECT SUM(SIGN(t.time) + t.time) FROM t", "SELECT SUM(SIGN(time) + time) FROM t", 61.0),
        ("SELECT SUM(t.time % 7) FROM t", "SELECT SUM(time % 7) FROM t", 6.0),  # 0 ≤ time % 7 ≤ 6
        ("SELECT SUM(MOD(t.time, 7) - 3) FROM t", "SELECT SUM(MOD(time, 7) - 3) FROM t", 3.0),
        ("SELECT SUM(t.time % 100) FROM t", "SELECT SUM(time % 100) FROM t", 60.0),  # time itself
    ],
)
def test_row_level_sum(rows_db: Session, pg_dsn: str, query: str, plain: str, sensitivity: float) -> None:
    with psycopg.connect(pg_dsn) as c:
        expected = float(c.execute(plain).fetchone()[0])
    m = rows_db.run(query, epsilon=1.0).measurements[0][0]
    assert m.sensitivity == pytest.approx(sensitivity) and math.isclose(float(m.true_value), expected)
