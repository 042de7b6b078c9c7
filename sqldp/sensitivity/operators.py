"""One table of the scalar operators sqldp analyses: what each one means to every analysis, in one place.

sqlglot keeps one expression class per operator (``exp.Add``, ``exp.Sqrt``, …) and so does this table: a node
gets the entry of its nearest class in the table, as ``isinstance`` would find it (:func:`lookup`). An entry
(:class:`Operator`) says, for one operator:

* ``fails`` — why PostgreSQL may fail on it for some value of the columns it reads, judged by its form (a
  divisor that may be 0, SQRT of a value that may be negative; :mod:`sqldp.sensitivity.failures`), or None
  where PostgreSQL defines it for every value. A function missing from the table is refused there: the table
  lists what is known, not what fails;
* ``value`` — PostgreSQL's type and range of its result, over those of its arguments' types, raising where a
  value may leave its type (overflow, underflow; failures.py);
* ``interval`` — [lo, hi] of its values from its arguments' (:mod:`sqldp.sensitivity.intervals`: the row-level
  SUM over the declared ranges, NR §3.3.7.3 and §3.3.11);
* ``derivative`` — β-smooth upper bounds of |e| and of |∂e/∂v| from its arguments' (NR §3.3.8.3, Table 10,
  Fig. 41; :mod:`sqldp.sensitivity.expressions`);
* ``linear`` — its linear form inside a private filter's comparison (NR §3.3.8.4;
  :mod:`sqldp.sensitivity.filters`);
* ``step`` — whether PostgreSQL computes a step of its arguments (integer division truncates, casts round:
  :mod:`sqldp.pg_arithmetic`), in the words of the refusal: NR §3.3.8 differentiates real functions, and a
  step has no derivative bound at its jumps, so the value-level analysis refuses steps over sensitive values
  (:func:`steps`);
* ``section`` — where in the report its rules come from.

A missing rule is a refusal by that analysis, and the refusals that say what is supported are generated from
the table (:func:`supported`). Each analysis hands a rule a context — the bound of a sub-expression (the
recursion), the columns' kinds, how to refuse — so the rules live here next to their entries and this module
imports none of the analyses: adding an operator is adding its entry and its rules.
"""

from __future__ import annotations

import decimal
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Generic, Literal, Protocol, TypeVar

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.groups import date_guard  # a date group key's guard (sqldp.groups.guard_date_trunc)
from sqldp.pg_arithmetic import KindOf, case_values, integer_valued, keeps_value, reads_column, rounds, truncates
from sqldp.sensitivity.representations import Linear, Ops, Value

Interval = tuple[float, float]
Bounds = tuple[Any, dict[ColumnRef, Any]]  # (ub, d) of expressions.bound, in the Ops' representation
Constant = Callable[[exp.Expr], "float | None"]  # intervals.constant: PostgreSQL's value of a constant


# -- what the analyses hand their rules --------------------------------------------------------------------


@dataclass(frozen=True)
class FailureContext:
    """What a ``fails`` rule is given (:func:`sqldp.sensitivity.failures.failure`)."""

    kind: KindOf
    constant: Constant


Fail = Callable[[str], Exception]


class ValueContext(Protocol):
    """What a ``value`` rule is given: the values of a sub-expression, and the value analysis' rules of
    PostgreSQL's types (:class:`sqldp.sensitivity.failures._Values`) that the entries below call; ``fail(why)``
    is the exception to raise for the node."""

    def __call__(self, e: exp.Expr) -> Value | None: ...
    def arithmetic(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def negation(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def absolute(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def exponential(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def root(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def power(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def rounding(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def cast(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def choice(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def position(self, e: exp.Expr, fail: Fail) -> Value | None: ...
    def field(self, e: exp.Expr, fail: Fail) -> Value | None: ...


@dataclass(frozen=True)
class IntervalContext:
    """What an ``interval`` rule is given (:func:`sqldp.sensitivity.intervals.interval`): ``refuse(why)`` says
    "cannot bound <the node> for <purpose>: <why>"."""

    of: Callable[[exp.Expr], Interval]
    kind: KindOf
    refuse: Callable[[str], RefusedError]


class DerivativeContext(Protocol):
    """What a ``derivative`` rule is given (:func:`sqldp.sensitivity.expressions.bound`): the bounds of a
    sub-expression at the node's β (or another), the product and EXP rules, which split or check β."""

    @property
    def ops(self) -> Ops: ...
    @property
    def beta(self) -> float: ...
    def of(self, e: exp.Expr, beta: float | None = None) -> Bounds: ...
    def product(self, a: exp.Expr, b: exp.Expr) -> Bounds: ...
    def exponential(self, g: exp.Expr) -> Bounds: ...
    def constant(self, e: exp.Expr) -> float | None: ...
    def reads_sensitive(self, e: exp.Expr) -> bool: ...
    def refuse(self, e: exp.Expr, why: str) -> RefusedError: ...


LinearOf = Callable[[exp.Expr], "Linear"]

FailRule = Callable[[FailureContext, exp.Expr], "str | None"]
ValueRule = Callable[[ValueContext, exp.Expr, Fail], "Value | None"]
IntervalRule = Callable[[IntervalContext, exp.Expr], "Interval | None"]
DerivativeRule = Callable[[DerivativeContext, exp.Expr], "Bounds | None"]
LinearRule = Callable[[LinearOf, exp.Expr], "Linear | None"]
StepRule = Callable[[exp.Expr, KindOf], "str | None"]

F = TypeVar("F")


@dataclass(frozen=True)
class Rule(Generic[F]):
    """One analysis' rule for an operator (None from ``apply``: not covered, refused), and how the refusals
    list what it covers: ``covers`` None is the operator's name, "" is not listed (a form sqldp writes itself)."""

    apply: F
    covers: str | None = None


@dataclass(frozen=True)
class Operator:
    """One scalar operator (module docstring): its name in messages, the report's section for its rules, and
    one rule per analysis (None: refused by it; ``fails`` None: defined for every value)."""

    name: str
    section: str
    fails: FailRule | None = None
    value: ValueRule | None = None
    interval: Rule[IntervalRule] | None = None
    derivative: Rule[DerivativeRule] | None = None
    linear: Rule[LinearRule] | None = None
    step: StepRule | None = None


# -- interval arithmetic (NR §3.3.11: ranges propagated through the expression) ----------------------------

MAX_EXP = 709.0  # e^709.78 is the largest double; PostgreSQL's exp() fails above it


def _mul(a: Interval, b: Interval) -> Interval:
    products = [x * y for x in a for y in b if not (math.isinf(x) and y == 0) and not (math.isinf(y) and x == 0)]
    return min(products, default=0.0), max(products, default=0.0)


def _real(f: Callable[[float], float], x: float) -> float:
    try:
        return f(x)
    except OverflowError:
        return math.inf


def _ipow(x: float, n: int) -> float:
    try:
        return x**n
    except OverflowError:
        return math.copysign(math.inf, x) if n % 2 else math.inf


def _abs(a: Interval) -> Interval:
    top = max(abs(a[0]), abs(a[1]))
    return (0.0 if a[0] <= 0 <= a[1] else min(abs(a[0]), abs(a[1]))), top


def _power(a: Interval, r: float, refuse: Callable[[str], RefusedError]) -> Interval:
    """a^r as PostgreSQL's POWER computes it (in double precision; an error for a negative base with a
    fractional exponent, or 0 with a negative one)."""
    lo, hi = a
    if r.is_integer():
        n = int(r)
        if n < 0:
            if lo <= 0 <= hi:
                raise refuse(f"the base's range {list(a)} contains 0")
            return _power((1.0 / hi, 1.0 / lo), float(-n), refuse)
        if n % 2 == 0:  # x^n is decreasing below 0 and increasing above
            small, big = _abs(a)
            return _ipow(small, n), _ipow(big, n)
        return _ipow(lo, n), _ipow(hi, n)
    if lo < 0 or (r < 0 and lo == 0):
        raise refuse(
            f"a fractional power of a base whose range {list(a)} reaches {'below 0' if lo < 0 else '0'} fails "
            "in PostgreSQL"
        )
    ends = (_real(lambda x: x**r, lo), _real(lambda x: x**r, hi))
    return min(ends), max(ends)


def _cast_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    lo, hi = c.of(e.this)
    # a rounding cast moves a value by at most 1/2 (to NUMERIC(p, s): 10^(−s)/2), monotonically
    return (math.floor(lo), math.ceil(hi)) if rounds(e, c.kind) else (lo, hi)


def _neg_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    lo, hi = c.of(e.this)
    return -hi, -lo


def _add_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    a, b = c.of(e.this), c.of(e.expression)
    return a[0] + b[0], a[1] + b[1]


def _sub_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    a, b = c.of(e.this), c.of(e.expression)
    return a[0] - b[1], a[1] - b[0]


def _mul_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    return _mul(c.of(e.this), c.of(e.expression))


def _div_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    a, b = c.of(e.this), c.of(e.expression)
    if b[0] <= 0 <= b[1]:
        raise c.refuse(f"the divisor's range {list(b)} contains 0")
    lo, hi = _mul(a, (1.0 / b[1], 1.0 / b[0]))
    # integer division truncates towards zero, a non-decreasing function of the real quotient
    return (math.trunc(lo), math.trunc(hi)) if truncates(e, c.kind) else (lo, hi)


def _abs_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    return _abs(c.of(e.this))


def _exp_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    lo, hi = c.of(e.this)
    if hi > MAX_EXP:  # PostgreSQL fails on the data beyond it, an error that would answer for it
        raise c.refuse(f"EXP of values up to {hi:g} overflows double precision (e^{MAX_EXP:g} is the largest)")
    return _real(math.exp, lo), _real(math.exp, hi)


def _sqrt_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    lo, hi = c.of(e.this)
    if lo < 0:
        raise c.refuse(f"its argument's range {[lo, hi]} reaches below 0, where SQRT fails in PostgreSQL")
    return math.sqrt(lo), math.sqrt(hi)


def _pow_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    r_lo, r_hi = c.of(e.expression)
    if r_lo != r_hi:
        raise c.refuse("the exponent is not a constant")
    return _power(c.of(e.this), r_lo, c.refuse)


def _extreme_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    parts = [c.of(x) for x in [e.this, *e.expressions]]
    pick = max if isinstance(e, exp.Greatest) else min  # both ends are monotone in every argument
    return pick(p[0] for p in parts), pick(p[1] for p in parts)


def _case_interval(c: IntervalContext, e: exp.Expr) -> Interval | None:
    if not isinstance(e, exp.Case) or e.this is not None:
        return None
    # CASE WHEN … THEN v1 … ELSE v0 END takes one of its branch values (a missing ELSE is NULL, which SUM
    # skips): the hull of the branches bounds it, whatever the conditions read
    branches = [c.of(v) for v in case_values(e)]
    if e.args.get("default") is None:
        branches.append((0.0, 0.0))
    return min(b[0] for b in branches), max(b[1] for b in branches)


# -- derivative bounds (NR §3.3.8.3, Table 10, Fig. 41; the rules in expressions.py's docstring) -----------


def _same_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    """−e and ABS(e): |·| and |∂·| are those of e."""
    return c.of(e.this)


def _cast_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    u, d = c.of(e.this)
    if isinstance(e, exp.Cast) and keeps_value(e.to):
        return u, d
    # a cast that may round (to an integer or NUMERIC(p, s)) moves |e| by at most 1/2; the value-level analysis
    # has refused those over sensitive columns (``step``), so d is the operand's
    return c.ops.add(u, c.ops.const(0.5)), d


def _sum_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    """Fig. 41 (+_S), (+_D); Lemma 3.70.1: the bounds add up."""
    u1, d1 = c.of(e.this)
    u2, d2 = c.of(e.expression)
    d = dict(d1)
    for k, v in d2.items():
        d[k] = c.ops.add(d[k], v) if k in d else v
    return c.ops.add(u1, u2), d


def _product_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    return c.product(e.this, e.expression)


def _quotient_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds | None:
    den = c.constant(e.expression)  # as PostgreSQL computes it: CAST(2.4 AS INTEGER) divides by 2
    if den is None or den == 0:
        return None
    inv = c.ops.const(1.0 / abs(den))
    u, d = c.of(e.this)
    return c.ops.mul(u, inv), {k: c.ops.mul(v, inv) for k, v in d.items()}


def _strip(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def _summands(e: exp.Expr) -> list[exp.Expr]:
    e = _strip(e)
    if isinstance(e, exp.Add):
        return [*_summands(e.this), *_summands(e.expression)]
    return [e]


def _power_term(e: exp.Expr, constant: Constant) -> tuple[exp.Expr, float] | float | None:
    """A summand of an ℓp norm: (a, p) for |a|^p, a constant c ≥ 0 as itself, else None."""
    c = constant(e)
    if c is not None:
        return c if c >= 0 else None
    if isinstance(e, exp.Pow):
        p = constant(e.expression)
        if p is None or not 1 <= p < math.inf:
            return None
        if isinstance(_strip(e.this), exp.Abs) or (p.is_integer() and int(p) % 2 == 0):  # |a|^p = a^p
            return e.this, p
        return None
    if isinstance(e, exp.Mul) and _strip(e.this) == _strip(e.expression):  # a·a = |a|^2
        return e.this, 2.0
    return None


def lp_norm(e: exp.Expr, constant: Constant) -> tuple[list[exp.Expr | float], float] | None:
    """(a_1, …, a_k; p) when e is ‖(a_1, …, a_k)‖_p written SQRT(a1^2 + …) or POWER(|a1|^p + …, 1/p); a
    constant summand c ≥ 0 is the constant c^(1/p). None for anything else (SQRT(x), a difference, a summand
    of another exponent, an outer exponent other than 1/p, no summand that is not constant)."""
    if isinstance(e, exp.Sqrt):
        outer: float | None = 0.5
    elif isinstance(e, exp.Pow):
        outer = constant(e.expression)
    else:
        return None
    if outer is None or not 0 < outer <= 1:
        return None
    terms = [_power_term(t, constant) for t in _summands(e.this)]
    if any(t is None for t in terms):
        return None
    powers = {t[1] for t in terms if isinstance(t, tuple)}
    if len(powers) != 1:
        return None
    p = powers.pop()
    if abs(outer - 1 / p) > 1e-9:
        return None
    return [t[0] if isinstance(t, tuple) else float(t) ** (1 / p) for t in terms if t is not None], p


def _norm_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds | None:
    """Table 10 "‖x‖_p" (DS = 1 w.r.t. ℓp): (‖(u_i)‖_p, ‖(d_i[v])_i‖_p); checked before the powers, where
    POWER(…, 1/p) and SQRT would be refused."""
    norm = lp_norm(e, c.constant)
    if norm is None:
        return None
    terms, p = norm
    parts = [(c.ops.const(a), {}) if isinstance(a, float) else c.of(a) for a in terms]
    keys = sorted({k for _, d in parts for k in d}, key=str)
    return c.ops.norm([u for u, _ in parts], p), {k: c.ops.norm([d[k] for _, d in parts if k in d], p) for k in keys}


def _power_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds | None:
    norm = _norm_derivative(c, e)
    if norm is not None:
        return norm
    k = e.expression
    if isinstance(k, exp.Literal) and not k.is_string and float(k.this).is_integer() and 1 <= float(k.this) <= 8:
        n = int(float(k.this))
        if n == 1:
            return c.of(e.this)
        return c.product(e.this, exp.Pow(this=e.this.copy(), expression=exp.Literal.number(n - 1)))
    r = c.constant(k)
    if r is not None and r >= 1 and math.isfinite(r):
        # Table 10 "x^r, r ≥ 1": u^r with u (β/r)-smooth is β-smooth; so is r·u^(r−1)·d ((r−1)β/r + β/r);
        # |∂(g^r)/∂v| = r·|g|^(r−1)·|∂g/∂v|
        if r == 1:
            return c.of(e.this)
        u, d = c.of(e.this, c.beta / r)
        slope = c.ops.mul(c.ops.const(r), c.ops.power(u, r - 1))
        return c.ops.power(u, r), {v: c.ops.mul(slope, dv) for v, dv in d.items()}
    return None


def _exp_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    return c.exponential(e.this)


def clamped(e: exp.Expr) -> tuple[exp.Expr, float, float] | None:
    """(x, lo, hi) when ``e`` is a clamp written by :func:`sqldp.sensitivity.intervals.clamp_columns`, else
    None."""
    if not isinstance(e, exp.Case) or e.this is not None or len(e.args.get("ifs", [])) != 2:
        return None
    below, above = e.args["ifs"]
    x = e.args.get("default")
    if not (isinstance(below.this, exp.LT) and isinstance(above.this, exp.GT)) or x is None:
        return None
    lo, hi = below.args["true"], above.args["true"]
    lo_value, hi_value = _signed_number(lo), _signed_number(hi)
    if lo_value is None or hi_value is None:
        return None
    if below.this.this != x or above.this.this != x or below.this.expression != lo or above.this.expression != hi:
        return None
    return x, lo_value, hi_value


def _signed_number(e: exp.Expr) -> float | None:
    """A number literal, or a negated one (sqlglot writes −2 as ``Neg(2)``: the clamp of a range below 0)."""
    if isinstance(e, exp.Neg):
        inner = _signed_number(e.this)
        return None if inner is None else -inner
    if isinstance(e, exp.Literal) and not e.is_string:
        return float(e.this)
    return None


def _clamp_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds | None:
    clamp = clamped(e)
    if clamp is None:
        return None
    # |clamp(x, lo, hi)| ≤ min(max(|x|, |lo|), max(|lo|, |hi|)); a min of β-smooth bounds is β-smooth
    x, lo, hi = clamp
    u, d = c.of(x)
    return c.ops.least([c.ops.greatest([u, c.ops.const(lo)]), c.ops.const(max(abs(lo), abs(hi)))]), d


def _case_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds | None:
    """A searched CASE: the clamps sqldp writes (:func:`_clamp_derivative`), else a choice among branches by
    conditions that read no value-sensitive column (TPC-H Q12's order priorities, Q14's part types, Q8's
    nation). Under the data owner's norm only value-sensitive columns move (NR §3.3.8.2), so such conditions
    pick the same branch for a row on both sides of a change: the CASE is that branch there, and
    (max ub, max d) over the branches bounds it (a missing ELSE is NULL, which the aggregates skip: 0), as
    for GREATEST (NR §3.3.8.3 "Min / max": a maximum of β-smooth bounds is β-smooth). A condition that reads a
    value-sensitive column makes the CASE a step of it, which jumps where the condition flips by as much as
    the branches differ: no derivative bound exists at the jump (NR §3.3.8), so it is refused with that
    reason (a filter in WHERE is approximated continuously instead, NR §3.3.8.4)."""
    if not isinstance(e, exp.Case) or e.this is not None:
        return None
    if clamped(e) is not None:
        return _clamp_derivative(c, e)
    for branch in e.args.get("ifs", []):
        if c.reads_sensitive(branch.this):
            raise c.refuse(
                e,
                f"its condition {branch.this.sql(dialect='postgres')} reads a value-sensitive column, so the CASE "
                "jumps where the condition flips (a step, with no derivative bound at the jump, NR §3.3.8); "
                "move the condition into WHERE, where it is approximated continuously (NR §3.3.8.4)",
            )
    parts = [c.of(v) for v in case_values(e)]
    if e.args.get("default") is None:
        parts.append((c.ops.const(0.0), {}))
    keys = {k for _, d in parts for k in d}
    return c.ops.greatest([u for u, _ in parts]), {
        k: c.ops.greatest([d[k] for _, d in parts if k in d]) for k in sorted(keys, key=str)
    }


def _greatest_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    """NR §3.3.8.3 "Min / max": (max ub, max d)."""
    parts = [c.of(x) for x in [e.this, *e.expressions]]
    keys = {k for _, d in parts for k in d}
    return c.ops.greatest([u for u, _ in parts]), {
        k: c.ops.greatest([d[k] for _, d in parts if k in d]) for k in sorted(keys, key=str)
    }


def _least_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    args = [e.this, *e.expressions]
    free = [x for x in args if not (isinstance(x, exp.Literal) and not x.is_string and float(x.this) >= 0)]
    if len(free) == 1:  # LEAST(g, c), c ≥ 0 (failures.cap_exponentials): |·| ≤ |g|, |∂·| ≤ |∂g|
        return c.of(free[0])
    return _greatest_derivative(c, e)


# -- linear forms in private filters (NR §3.3.8.4) ----------------------------------------------------------


def _same_linear(of: LinearOf, e: exp.Expr) -> Linear:
    return of(e.this)


def _neg_linear(of: LinearOf, e: exp.Expr) -> Linear:
    return of(e.this).scale(-1.0)


def _sum_linear(of: LinearOf, e: exp.Expr) -> Linear:
    a, b = of(e.this), of(e.expression)
    return a.add(b if isinstance(e, exp.Add) else b.scale(-1.0))


def _scaled_linear(of: LinearOf, e: exp.Expr) -> Linear | None:
    a, b = of(e.this), of(e.expression)
    if not a.coefs:
        return b.scale(a.const)
    if not b.coefs:
        return a.scale(b.const)
    return None


def _quotient_linear(of: LinearOf, e: exp.Expr) -> Linear | None:
    a, b = of(e.this), of(e.expression)
    if not b.coefs and b.const != 0:
        return a.scale(1.0 / b.const)
    return None


# -- where PostgreSQL fails by an expression's form (failures.py's module docstring) -------------------------

_TEXT_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR}


def nonnegative(e: exp.Expr) -> bool:
    """Whether ``e`` is ≥ 0 (or NULL) for every value of its columns, by its form alone."""
    if isinstance(e, exp.Paren):
        return nonnegative(e.this)
    if isinstance(e, (exp.Abs, exp.Sqrt, exp.Exp)):
        return True
    if isinstance(e, exp.Literal):
        return not e.is_string and float(e.this) >= 0
    if isinstance(e, exp.Pow):
        k = e.expression
        even = isinstance(k, exp.Literal) and not k.is_string and float(k.this).is_integer() and float(k.this) % 2 == 0
        return even or nonnegative(e.this)
    if isinstance(e, exp.Mul) and e.this == e.expression:  # a square written x * x
        return True
    if isinstance(e, (exp.Add, exp.Mul, exp.Div)):
        return nonnegative(e.this) and nonnegative(e.expression)
    if isinstance(e, exp.Greatest):
        return any(nonnegative(x) for x in [e.this, *e.expressions])
    if isinstance(e, exp.Least):
        return all(nonnegative(x) for x in [e.this, *e.expressions])
    if isinstance(e, exp.Case) and e.this is None:
        return all(nonnegative(b) for b in case_values(e))
    return False


def _numeric(e: exp.Expr, kind_of: KindOf) -> bool:
    if isinstance(e, exp.Paren):
        return _numeric(e.this, kind_of)
    if integer_valued(e, kind_of):
        return True
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "numeric"
    if isinstance(e, exp.Literal):
        return not e.is_string
    if isinstance(e, exp.Cast):
        return keeps_value(e.to)
    if isinstance(e, (exp.Greatest, exp.Least, exp.Coalesce)):
        return all(_numeric(x, kind_of) for x in [e.this, *e.expressions])
    if isinstance(e, (exp.Nullif, exp.Round, exp.Floor, exp.Ceil)):
        return _numeric(e.this, kind_of)
    return isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Abs, exp.Sqrt, exp.Exp, exp.Pow))


def _dated(e: exp.Expr, kind_of: KindOf) -> bool:
    """``e`` is a DATE that reads a column (a column of kind date, or arithmetic on one)."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "date"
    if isinstance(e, exp.Cast):
        return e.to.this == exp.DataType.Type.DATE and reads_column(e)
    return isinstance(e, (exp.Add, exp.Sub)) and any(_dated(x, kind_of) for x in (e.this, e.expression))


def _divides(c: FailureContext, node: exp.Expr) -> str | None:
    """NULLIF(x, 0), or a constant that is not 0 (one that is fails on every row but not on no rows), is a
    safe divisor."""
    d = node.expression
    while isinstance(d, exp.Paren) or (isinstance(d, exp.Cast) and keeps_value(d.to)):
        d = d.this  # not a rounding cast: CAST(0.4 AS INTEGER) is 0
    if isinstance(d, exp.Nullif):
        z = d.expression
        if isinstance(z, exp.Literal) and not z.is_string and float(z.this) == 0:
            return None
    else:
        v = c.constant(d)
        if v is not None and v != 0:
            return None
    return "divides by a value that may be 0 (write NULLIF(divisor, 0))"


def _moves_date(c: FailureContext, node: exp.Expr) -> str | None:
    if any(_dated(x, c.kind) for x in (node.this, node.expression)):
        return (
            "moves or subtracts a date read from the data (a date near its type's ends leaves the range, "
            "'infinity' cannot be subtracted); compare the column with a constant date instead (t.d < DATE '…' - 30)"
        )
    return None


def _root_fails(c: FailureContext, node: exp.Expr) -> str | None:
    if nonnegative(node.this):
        return None
    return "takes SQRT of a value that may be negative (write SQRT(ABS(x)) or SQRT(GREATEST(x, 0)))"


def _power_fails(c: FailureContext, node: exp.Expr) -> str | None:
    r = c.constant(node.expression)
    if r is None:
        return "raises to a power read from the data"
    if r < 0:
        return "raises a value that may be 0 to a negative power (write 1 / NULLIF(x, 0))"
    if not r.is_integer() and not nonnegative(node.this):
        return "raises a value that may be negative to a fractional power (write POWER(ABS(x), r))"
    return None


def _logarithm_fails(c: FailureContext, node: exp.Expr) -> str:
    # a domain narrower than the argument's type (NR does not need logarithms; PostgreSQL fails outside)
    return "takes a logarithm of a value that may be 0 or negative"


def _substring_fails(c: FailureContext, node: exp.Expr) -> str | None:
    if any(reads_column(a) for k, a in node.args.items() if k != "this" and isinstance(a, exp.Expr)):
        return "takes a substring whose start or length is read from the data (a negative length fails)"
    length = node.args.get("length")
    if length is not None and (c.constant(length) or 0) < 0:
        return "takes a substring of negative length (PostgreSQL fails on each row it reaches, so on some data only)"
    return None


def _truncates_date(c: FailureContext, node: exp.Expr) -> str | None:
    branch = node.parent
    if isinstance(branch, exp.If) and branch.args.get("true") is node and isinstance(node.this, exp.Column):
        guarded = date_guard(branch.this, node.this)  # evaluated only for dates of the years 1 … 9999: timestamps
        if guarded:
            return None
    if _dated(node.this, c.kind):
        return "truncates a date read from the data (a date after the year 294276 is no timestamp); use EXTRACT"
    return None


def _pattern_fails(c: FailureContext, node: exp.Expr) -> str | None:
    if reads_column(node.expression):
        return "matches a pattern read from the data (a pattern ending in an escape character fails)"
    return None


def _cast_fails(c: FailureContext, node: exp.Expr) -> str | None:
    assert isinstance(node, exp.Cast)
    to = node.to
    if to.this in _TEXT_TYPES:
        return None
    # a number to a number fails only by overflow (the value rules)
    if _numeric(node.this, c.kind) and (keeps_value(to) or to.is_type(*exp.DataType.NUMERIC_TYPES)):
        return None
    x = node.this
    if _dated(x, c.kind) and to.this != exp.DataType.Type.DATE:
        return f"casts a date read from the data to {to.sql(dialect='postgres')} (not every date converts)"
    if isinstance(x, exp.Column) and x.table and to.this == exp.DataType.Type.DATE:
        return None if c.kind(ColumnRef(x.table, x.name)) == "date" else "casts a value that may not be a date"
    return f"casts a value to {to.sql(dialect='postgres')} that may not convert"


# -- steps of PostgreSQL's arithmetic (sqldp.pg_arithmetic) ------------------------------------------------


def _truncating(node: exp.Expr, kind_of: KindOf) -> str | None:
    if not truncates(node, kind_of):
        return None
    sql = node.sql(dialect="postgres")
    return f"{sql} is an integer division (PostgreSQL truncates: 7 / 2 = 3); write a non-integer divisor (… / 2.0)"


def _rounding(node: exp.Expr, kind_of: KindOf) -> str | None:
    if not rounds(node, kind_of):
        return None
    return f"{node.sql(dialect='postgres')} rounds or converts its value; cast to DOUBLE PRECISION or NUMERIC instead"


# -- SIGN ------------------------------------------------------------------------------------------------------


def _sign(x: float) -> float:
    return float((x > 0) - (x < 0))


def _sign_value(v: ValueContext, e: exp.Expr, fail: Fail) -> Value | None:
    """PostgreSQL has sign(double precision), which integers and REAL take too, and sign(numeric): −1, 0 or 1
    (±Infinity give ±1; NaN gives 0 in double precision and stays NaN in NUMERIC). It never fails."""
    a = v(e.this)
    if a is None:
        return None
    numeric = a.typ == "numeric"
    ends = [_sign(float(a.lo)), _sign(float(a.hi))]
    if a.pos:
        ends.append(1.0)
    if a.neg:
        ends.append(-1.0)
    if a.nan and not numeric:
        ends.append(0.0)  # sign('NaN'::float8) is 0
    lo, hi = (decimal.Decimal(int(x)) for x in (min(ends), max(ends)))
    typ = "numeric" if numeric else "float"
    return replace(a, typ=typ, lo=lo, hi=hi, inf=False, nan=a.nan and numeric, least=decimal.Decimal(1), sided=0)


def _sign_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    """SIGN is non-decreasing: its values over [lo, hi] are those between SIGN(lo) and SIGN(hi)."""
    lo, hi = c.of(e.this)
    return _sign(lo), _sign(hi)


def _sign_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    """Of a value that does not move (no sensitive column): |SIGN| ≤ 1, derivative 0 (NR §3.3.8.3 uses the exact
    values of non-sensitive data). Of a sensitive value: SIGN jumps by 1 at 0, so no bound of its derivative
    exists there (NR §3.3.8 bounds derivatives of functions of the sensitive values; a step has none at its
    jump, as integer division and rounding casts, ``step`` below): refused."""
    if c.reads_sensitive(e.this):
        raise c.refuse(e, "SIGN jumps at 0 (a step), where no derivative bound exists (NR §3.3.8)")
    return c.ops.const(1.0), {}


def _sign_step(node: exp.Expr, kind_of: KindOf) -> str:
    return (
        f"{node.sql(dialect='postgres')} is a step (−1, 0 or 1) that jumps at 0, where no derivative bound exists; "
        "count the rows above and below 0 in private filters instead (NR §3.3.8.4 approximates those)"
    )


# -- % (MOD) -----------------------------------------------------------------------------------------------------


def _mod_interval(c: IntervalContext, e: exp.Expr) -> Interval:
    """PostgreSQL's a % b (MOD(a, b)) is a − trunc(a / b)·b, for integers and NUMERIC alike: 0 or of a's sign,
    no larger than |a|, smaller than |b| (at most |b| − 1 for integers); a itself where |a| < |b|. A divisor
    whose range holds 0 fails (failures.py refuses it too)."""
    a, b = c.of(e.this), c.of(e.expression)
    if b[0] <= 0 <= b[1]:
        raise c.refuse(f"the divisor's range {list(b)} contains 0")
    if a[0] == a[1] and b[0] == b[1]:  # a constant, as PostgreSQL computes it (C's fmod truncates too)
        r = math.fmod(a[0], b[0])
        return r, r
    small, big = min(abs(b[0]), abs(b[1])), max(abs(b[0]), abs(b[1]))
    if max(abs(a[0]), abs(a[1])) < small:
        return a
    top = big - 1 if integer_valued(e.this, c.kind) and integer_valued(e.expression, c.kind) else big
    return (max(a[0], -top) if a[0] < 0 else 0.0), (min(a[1], top) if a[1] > 0 else 0.0)


def _mod_derivative(c: DerivativeContext, e: exp.Expr) -> Bounds:
    """Of values that do not move (no sensitive column): |a % b| ≤ |a|, derivative 0. A remainder of a sensitive
    value jumps by |b| wherever a / b crosses an integer (a sawtooth), and no derivative bound exists at a jump
    (NR §3.3.8): refused, as SIGN and integer division are (``step``)."""
    if c.reads_sensitive(e):
        why = "a remainder jumps wherever the quotient crosses an integer (a step), where no derivative bound exists"
        raise c.refuse(e, why + " (NR §3.3.8)")
    u, _ = c.of(e.this)
    return u, {}


def _mod_step(node: exp.Expr, kind_of: KindOf) -> str:
    return (
        f"{node.sql(dialect='postgres')} is a remainder, a step that jumps wherever the quotient crosses an "
        "integer, where no derivative bound exists; take remainders of values that are not sensitive only"
    )


# -- the table ------------------------------------------------------------------------------------------------

OPERATORS: dict[type[exp.Expr], Operator] = {
    exp.Add: Operator(
        "+",
        "NR §3.3.8.3, Fig. 41 (+_S, +_D), Lemma 3.70.1; §3.3.8.4 (linear filters); §3.3.11 (ranges)",
        fails=_moves_date,
        value=lambda v, e, fail: v.arithmetic(e, fail),
        interval=Rule(_add_interval),
        derivative=Rule(_sum_derivative),
        linear=Rule(_sum_linear),
    ),
    exp.Sub: Operator(
        "−",
        "NR §3.3.8.3, Fig. 41 (+_S, +_D), Lemma 3.70.1; §3.3.8.4 (linear filters); §3.3.11 (ranges)",
        fails=_moves_date,
        value=lambda v, e, fail: v.arithmetic(e, fail),
        interval=Rule(_sub_interval),
        derivative=Rule(_sum_derivative),
        linear=Rule(_sum_linear),
    ),
    exp.Mul: Operator(
        "×",
        "NR §3.3.8.3, Fig. 41 (*_S), Lemma 3.70.2; §3.3.8.4 (linear filters); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.arithmetic(e, fail),
        interval=Rule(_mul_interval),
        derivative=Rule(_product_derivative),
        linear=Rule(_scaled_linear, "× by a constant"),
    ),
    exp.Div: Operator(
        "/",
        "NR §3.3.8.3 (e / c scales the bounds of e); §3.3.8.4 (linear filters); §3.3.11 (ranges)",
        fails=_divides,
        value=lambda v, e, fail: v.arithmetic(e, fail),
        interval=Rule(_div_interval),
        derivative=Rule(_quotient_derivative, "/ by a constant"),
        linear=Rule(_quotient_linear, "/ by a constant"),
        step=_truncating,
    ),
    exp.Mod: Operator(
        "% (MOD)",
        "NR §3.3.8 (a step: refused over sensitive values, exact over the others); §3.3.11 (ranges)",
        fails=_divides,
        value=lambda v, e, fail: v.arithmetic(e, fail),
        interval=Rule(_mod_interval),
        derivative=Rule(_mod_derivative, "% (MOD) of non-sensitive values"),
        step=_mod_step,
    ),
    exp.IntDiv: Operator("DIV", "PostgreSQL (no rule in NR)", fails=_divides),
    exp.Neg: Operator(
        "unary −",
        "NR §3.3.8.3 (−e has the bounds of e); §3.3.8.4 (linear filters); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.negation(e, fail),
        interval=Rule(_neg_interval),
        derivative=Rule(_same_derivative),
        linear=Rule(_neg_linear),
    ),
    exp.Abs: Operator(
        "ABS",
        "NR §3.3.8.3 (|e| has the bounds of e); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.absolute(e, fail),
        interval=Rule(_abs_interval),
        derivative=Rule(_same_derivative),
    ),
    exp.Exp: Operator(
        "EXP",
        "NR §3.3.8.3, Table 10 (e^(rx), |r| ≤ β; composition with a real function); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.exponential(e, fail),
        interval=Rule(_exp_interval),
        derivative=Rule(
            _exp_derivative,
            "EXP of an expression with constant derivative bounds (e.g. affine in the sensitive columns)",
        ),
    ),
    exp.Sqrt: Operator(
        "SQRT",
        "NR §3.3.8.3, Table 10 (‖x‖_p); §3.3.11 (ranges)",
        fails=_root_fails,
        value=lambda v, e, fail: v.root(e, fail),
        interval=Rule(_sqrt_interval),
        derivative=Rule(_norm_derivative, "ℓ2 norms SQRT(a^2 + b^2 + …)"),
    ),
    exp.Pow: Operator(
        "POWER",
        "NR §3.3.8.3, Table 10 (x^r, r ≥ 1; ‖x‖_p), Lemma 3.70.2; §3.3.11 (ranges)",
        fails=_power_fails,
        value=lambda v, e, fail: v.power(e, fail),
        interval=Rule(_pow_interval, "POWER by a constant"),
        derivative=Rule(_power_derivative, "powers by a constant ≥ 1, ℓp norms POWER(|a|^p + |b|^p + …, 1/p)"),
    ),
    exp.Sign: Operator(
        "SIGN",
        "NR §3.3.8 (a step: refused over sensitive values, exact over the others); §3.3.11 (ranges)",
        value=_sign_value,
        interval=Rule(_sign_interval),
        derivative=Rule(_sign_derivative, "SIGN of non-sensitive values"),
        step=_sign_step,
    ),
    exp.Greatest: Operator(
        "GREATEST",
        "NR §3.3.8.3 (Min / max); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.choice(e, fail),
        interval=Rule(_extreme_interval),
        derivative=Rule(_greatest_derivative),
    ),
    exp.Least: Operator(
        "LEAST",
        "NR §3.3.8.3 (Min / max); §3.3.11 (ranges)",
        value=lambda v, e, fail: v.choice(e, fail),
        interval=Rule(_extreme_interval),
        derivative=Rule(_least_derivative),
    ),
    exp.Case: Operator(
        "CASE",
        "NR §3.3.11 (ranges: the hull of the branches); §3.3.8.3 (Min / max: the clamps sqldp writes, and a "
        "choice by conditions on non-sensitive columns)",
        value=lambda v, e, fail: v.choice(e, fail),
        interval=Rule(_case_interval, "CASE over such branches"),
        derivative=Rule(_case_derivative, "CASE WHEN over conditions on non-sensitive columns"),
    ),
    exp.Cast: Operator(
        "casts",
        "NR §3.3.8 (a rounding cast is a step); §3.3.11 (ranges)",
        fails=_cast_fails,
        value=lambda v, e, fail: v.cast(e, fail),
        interval=Rule(_cast_interval),
        derivative=Rule(_cast_derivative),
        linear=Rule(_same_linear),
        step=_rounding,
    ),
    exp.Coalesce: Operator("COALESCE", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.choice(e, fail)),
    exp.Nullif: Operator("NULLIF", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.choice(e, fail)),
    exp.If: Operator("IF", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.choice(e, fail)),
    exp.Round: Operator("ROUND", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.rounding(e, fail)),
    exp.Floor: Operator("FLOOR", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.rounding(e, fail)),
    exp.Ceil: Operator("CEIL", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.rounding(e, fail)),
    exp.Ln: Operator("LN", "PostgreSQL (no rule in NR)", fails=_logarithm_fails),
    exp.Log: Operator("LOG", "PostgreSQL (no rule in NR)", fails=_logarithm_fails),
    exp.Connector: Operator("AND, OR", "NR §3.3.8.4 (AND is min, OR is max)"),
    exp.AggFunc: Operator("aggregates", "NR §3.3.7, §3.3.8"),
    exp.Extract: Operator("EXTRACT", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.field(e, fail)),
    exp.TimestampTrunc: Operator("DATE_TRUNC", "PostgreSQL (no rule in NR)", fails=_truncates_date),
    exp.DateTrunc: Operator("DATE_TRUNC", "PostgreSQL (no rule in NR)", fails=_truncates_date),
    exp.Length: Operator("LENGTH", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.position(e, fail)),
    exp.StrPosition: Operator("POSITION", "PostgreSQL (no rule in NR)", value=lambda v, e, fail: v.position(e, fail)),
    exp.Lower: Operator("LOWER", "PostgreSQL (no rule in NR)"),
    exp.Upper: Operator("UPPER", "PostgreSQL (no rule in NR)"),
    exp.Trim: Operator("TRIM", "PostgreSQL (no rule in NR)"),
    exp.Concat: Operator("CONCAT", "PostgreSQL (no rule in NR)"),
    exp.Substring: Operator("SUBSTRING", "PostgreSQL (no rule in NR)", fails=_substring_fails),
    exp.Like: Operator("LIKE", "PostgreSQL (no rule in NR)", fails=_pattern_fails),
    exp.ILike: Operator("ILIKE", "PostgreSQL (no rule in NR)", fails=_pattern_fails),
}


_FOUND: dict[type[exp.Expr], Operator | None] = {}


def lookup(node: exp.Expr) -> Operator | None:
    """The entry of ``node``'s nearest class in the table (a subclass, e.g. TryCast, is its base's), or None."""
    cls = type(node)
    if cls not in _FOUND:
        _FOUND[cls] = next((OPERATORS[c] for c in cls.__mro__ if c in OPERATORS), None)
    return _FOUND[cls]


def supported(aspect: Literal["interval", "derivative", "linear"]) -> str:
    """What the ``aspect``'s rules cover, in table order, for the refusal that lists it."""
    words: list[str] = []
    for op in OPERATORS.values():
        rule: Rule[Any] | None = getattr(op, aspect)
        word = None if rule is None else op.name if rule.covers is None else rule.covers
        if word and word not in words:
            words.append(word)
    return ", ".join(words)


def steps(e: exp.Expr, kind_of: KindOf) -> list[exp.Expr]:
    """The steps of PostgreSQL's arithmetic in ``e`` that read a column (integer divisions, rounding casts, …),
    outermost first."""
    return [n for n in e.find_all(exp.Expr) if describe(n, kind_of) is not None and reads_column(n)]


def describe(node: exp.Expr, kind_of: KindOf) -> str | None:
    """A user's words for a step: what PostgreSQL computes and how to write the real function instead; None
    when ``node`` is no step."""
    op = lookup(node)
    return None if op is None or op.step is None else op.step(node, kind_of)
