"""Post-processing: the output expressions and HAVING over the noisy values (Dwork & Roth, "The Algorithmic
Foundations of Differential Privacy", Prop. 2.1: a function of released values keeps the guarantee).

One table, :data:`EVALUATE`, gives per sqlglot node class how a value is computed after the noise: its
PostgreSQL result type (:func:`kind`: integer, numeric or double precision, by PostgreSQL's function
resolution), its value over the noisy aggregates (:func:`evaluate`, with PostgreSQL's semantics: integer
division truncates towards zero, ROUND and casts of a numeric round halves away from zero and those of a double
precision to even, NULL propagates, an error of PostgreSQL's — division by zero, the logarithm of 0 — is NULL),
and how an interval holding the true aggregates maps through it for the error bar (:func:`interval_of`: a
monotone function maps the endpoints, swapped where it decreases; a non-monotone one is withheld with its
reason, :func:`unbarred`). :data:`CONDITIONS` gives HAVING's. :data:`POST_PROCESSED` is every class they allow,
which the normaliser checks before anything runs (sqldp.normalize); the release step computes with them
(sqldp.release).

A noisy aggregate (a placeholder ``__agg<i>``) is a NUMERIC: a real number. A released COUNT is a BIGINT, as
PostgreSQL's: sqldp.aggregates.counted casts it, so ``COUNT(*) / 2`` truncates as PostgreSQL does.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Generic, TypeVar

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AGG_PREFIX

T = TypeVar("T")

Values = Sequence[float | None]
Interval = tuple[float, float]
Boxes = Mapping[int, Interval]  # aggregate index → an interval holding its true value
IntervalRule = Callable[[exp.Expr, Boxes], Interval | None]

# PostgreSQL's numeric types as the post-processing tells them apart, in the order of its implicit casts
# (an integer meets a numeric as a numeric, a numeric meets a double precision as a double precision)
INTEGER, NUMERIC, DOUBLE = "integer", "numeric", "double precision"
_RANK = {INTEGER: 0, NUMERIC: 1, DOUBLE: 2}


@dataclass(frozen=True)
class Step(Generic[T]):
    """One node class of the post-processing: its name in the refusal that lists them ("" for the nodes that
    are no operator: parentheses, placeholders, numbers), how it computes on the noisy values, its PostgreSQL
    result type, how it maps intervals of the true values (None: no bar), and, where the bar is withheld for a
    reason of the function itself, that reason."""

    name: str
    apply: Callable[[exp.Expr, Values], T]
    kind: Callable[[exp.Expr], str] | None = None
    interval: IntervalRule | None = None
    withheld: str | None = None


def _lookup(table: Mapping[type[exp.Expr], Step[T]], e: exp.Expr) -> Step[T] | None:
    """The entry of ``e``'s nearest class in ``table`` (a subclass, e.g. TryCast, is its base's), or None."""
    return next((table[c] for c in type(e).__mro__ if c in table), None)


def evaluate(e: exp.Expr, values: Values) -> float | None:
    """Evaluate an output expression over (noisy) aggregate values by the entries of :data:`EVALUATE`; NULL
    (None) propagates as in SQL."""
    step = _lookup(EVALUATE, e)
    if step is None:
        raise _not_evaluated(e)
    return step.apply(e, values)


def holds(e: exp.Expr, values: Values) -> bool | None:
    """A HAVING condition over (noisy) aggregate values by the entries of :data:`CONDITIONS`, with SQL's
    three-valued AND/OR/NOT."""
    step = _lookup(CONDITIONS, e)
    if step is None:
        raise RefusedError(f"HAVING condition {e.sql(dialect='postgres')} is not supported after aggregation")
    return step.apply(e, values)


def kind(e: exp.Expr) -> str:
    """PostgreSQL's result type of ``e`` (:data:`INTEGER`, :data:`NUMERIC` or :data:`DOUBLE`)."""
    step = _lookup(EVALUATE, e)
    if step is None:
        raise _not_evaluated(e)
    return NUMERIC if step.kind is None else step.kind(e)


def interval_of(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """An interval holding the value of ``e`` at every point of the boxes, by the entries of :data:`EVALUATE`;
    None where an operator has no rule, the result is unbounded (a divisor that may be 0) or may be NULL."""
    step = _lookup(EVALUATE, e)
    if step is None or step.interval is None:
        return None
    span = step.interval(e, boxes)
    return None if span is None or not all(math.isfinite(x) for x in span) else span


def unbarred(e: exp.Expr) -> list[str]:
    """Why an output over ``e`` has no error bar whatever the noise: the reasons of its withheld functions."""
    reasons = []
    for node in e.walk():
        step = _lookup(EVALUATE, node)
        if step is not None and step.withheld is not None:
            reasons.append(f"{node.sql(dialect='postgres')}: {step.withheld}")
    return list(dict.fromkeys(reasons))


def check(e: exp.Expr) -> None:
    """Refuse, before anything runs, a value PostgreSQL would not compute: a cast to a type that is no number,
    ROUND(double precision, n) (PostgreSQL has no such function)."""
    for node in e.walk():
        if isinstance(node, (exp.Cast, exp.Round, exp.Trunc)):
            kind(node)


def _not_evaluated(e: exp.Expr) -> RefusedError:
    return RefusedError(f"output expression {e.sql(dialect='postgres')} is not supported after aggregation")


def _args(e: exp.Expr) -> list[exp.Expr]:
    return [a for a in (e.this, e.args.get("expression"), *(e.expressions or ())) if isinstance(a, exp.Expr)]


def _widest(e: exp.Expr) -> str:
    """The type PostgreSQL resolves the arguments to: the widest of theirs (an untyped NULL is none)."""
    kinds = [kind(a) for a in _args(e) if not isinstance(a, exp.Null)]
    return max(kinds, key=_RANK.__getitem__, default=INTEGER)


def _real(e: exp.Expr) -> str:
    """A function with a numeric and a double precision version (FLOOR, EXP, SQRT …): an integer argument is
    resolved to double precision, PostgreSQL's preferred numeric type."""
    k = kind(e.this)
    return DOUBLE if k == INTEGER else k


# -- values ----------------------------------------------------------------------------------------------------


def _placeholder(e: exp.Expr, values: Values) -> float | None:
    if not e.name.startswith(AGG_PREFIX):
        raise _not_evaluated(e)
    return values[int(e.name[len(AGG_PREFIX) :])]


def _number(e: exp.Expr, values: Values) -> float | None:
    if e.is_string:
        raise _not_evaluated(e)
    return float(e.this)


def _literal_kind(e: exp.Expr) -> str:
    return INTEGER if not e.is_string and e.this.isdigit() else NUMERIC


def _inner(e: exp.Expr, values: Values) -> float | None:
    return evaluate(e.this, values)


def _negation(e: exp.Expr, values: Values) -> float | None:
    v = evaluate(e.this, values)
    return None if v is None else -v


def _extreme(pick: Callable[[list[float]], float]) -> Callable[[exp.Expr, Values], float | None]:
    """GREATEST/LEAST (the clamps of :mod:`sqldp.aggregates`); NULL if an argument is (PostgreSQL skips a NULL
    argument; sqldp keeps a clamp of a NULL, as an AVG whose noisy count is 0, NULL)."""

    def apply(e: exp.Expr, values: Values) -> float | None:
        args = [evaluate(a, values) for a in (e.this, *e.expressions)]
        present = [a for a in args if a is not None]
        return pick(present) if len(present) == len(args) else None

    return apply


def _unary(f: Callable[[float], float | None]) -> Callable[[exp.Expr, Values], float | None]:
    """A function of one argument; NULL in, NULL out; an error of the function (OverflowError) is NULL."""

    def apply(e: exp.Expr, values: Values) -> float | None:
        v = evaluate(e.this, values)
        if v is None:
            return None
        try:
            return f(v)
        except (OverflowError, ValueError):
            return None

    return apply


def _arithmetic(op: Callable[[float, float], float | None]) -> Callable[[exp.Expr, Values], float | None]:
    def apply(e: exp.Expr, values: Values) -> float | None:
        a, b = evaluate(e.this, values), evaluate(e.expression, values)
        return None if a is None or b is None else op(a, b)

    return apply


def nearest(v: float) -> float:
    """The integer nearest ``v``, halves away from zero as PostgreSQL's ROUND of a numeric (Python's round takes
    halves to even, as PostgreSQL's of a double precision)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def _to_integer(v: float, k: str) -> float:
    """A value of type ``k`` as an integer: a numeric rounds halves away from zero, a double precision to even
    (rint)."""
    return float(round(v)) if k == DOUBLE else nearest(v)


def _digits(v: float, places: int, mode: str) -> float:
    """A numeric rounded (ROUND_HALF_UP: halves away from zero) or truncated (ROUND_DOWN) to ``places`` decimal
    digits (negative: to tens, hundreds …), in decimal arithmetic as PostgreSQL's numeric."""
    try:
        return float(Decimal(repr(v)).quantize(Decimal(1).scaleb(-places), rounding=mode))
    except InvalidOperation:  # more digits than a decimal context holds: the value is already that precise
        return v


def _places(e: exp.Expr, values: Values) -> int | None:
    d = e.args.get("decimals")
    if d is None:
        return 0
    v = evaluate(d, values)
    return None if v is None else int(nearest(v))


def _round(e: exp.Expr, values: Values) -> float | None:
    """ROUND(e) and ROUND(e, d): halves away from zero for a numeric, to even for a double precision (PostgreSQL
    has ROUND(double precision) only without d)."""
    v, places = evaluate(e.this, values), _places(e, values)
    if v is None or places is None:
        return None
    if e.args.get("decimals") is None:
        return _to_integer(v, kind(e.this))
    return _digits(v, places, ROUND_HALF_UP)


def _trunc(e: exp.Expr, values: Values) -> float | None:
    """TRUNC(e) and TRUNC(e, d): towards zero."""
    v, places = evaluate(e.this, values), _places(e, values)
    if v is None or places is None:
        return None
    return float(math.trunc(v)) if e.args.get("decimals") is None else _digits(v, places, ROUND_DOWN)


def _rounding_kind(e: exp.Expr) -> str:
    """ROUND/TRUNC with d digits exist for numeric only (an integer argument is cast to one); without, for both."""
    if e.args.get("decimals") is None:
        return _real(e)
    if kind(e.this) == DOUBLE:
        raise RefusedError(
            f"{e.sql(dialect='postgres')}: PostgreSQL has no {e.key.upper()}(double precision, integer); cast the "
            "argument to NUMERIC"
        )
    return NUMERIC


def _cast_kind(e: exp.Expr) -> str:
    to = e.args["to"]
    if to.is_type(*exp.DataType.INTEGER_TYPES):
        return INTEGER
    if to.this in (exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT):
        return DOUBLE
    if to.this == exp.DataType.Type.DECIMAL:
        return NUMERIC
    raise RefusedError(f"{e.sql(dialect='postgres')}: an aggregate is cast to a number type only after aggregation")


def _typmod(to: exp.DataType) -> tuple[int, int] | None:
    """NUMERIC(p, s)'s precision and scale (NUMERIC(p): scale 0); None unconstrained."""
    params = [int(p.this.this) if isinstance(p.this, exp.Literal) else int(p.name) for p in to.expressions]
    if not params:
        return None
    return params[0], params[1] if len(params) > 1 else 0


def _cast(e: exp.Expr, values: Values) -> float | None:
    """CAST(e AS t): to an integer type a numeric rounds halves away from zero and a double precision to even;
    to NUMERIC(p, s) halves away from zero at s digits (NULL where PostgreSQL overflows: |v| ≥ 10^(p−s)); to
    REAL the nearest single precision; to DOUBLE PRECISION or NUMERIC the value."""
    v = evaluate(e.this, values)
    if v is None:
        return None
    target, source = _cast_kind(e), kind(e.this)
    if target == INTEGER:
        return _to_integer(v, source) if source != INTEGER else v
    if e.args["to"].this == exp.DataType.Type.FLOAT:
        return float(struct.unpack("f", struct.pack("f", v))[0])
    typmod = _typmod(e.args["to"]) if target == NUMERIC else None
    if typmod is None:
        return v
    precision, scale = typmod
    out = _digits(v, scale, ROUND_HALF_UP)
    return None if abs(out) >= 10.0 ** (precision - scale) else out


def _quotient_value(e: exp.Expr, values: Values) -> float | None:
    """a / b: of two integers the quotient truncated towards zero (7 / 2 = 3, −7 / 2 = −3), else the real
    quotient; a (noisy) 0 divides to NULL where PostgreSQL fails."""
    a, b = evaluate(e.this, values), evaluate(e.expression, values)
    if a is None or b is None or b == 0:
        return None
    if kind(e.this) == INTEGER and kind(e.expression) == INTEGER:
        q = abs(int(a)) // abs(int(b))
        return float(q if (a >= 0) == (b > 0) else -q)
    return a / b


def _modulo(e: exp.Expr, values: Values) -> float | None:
    """MOD(a, b) and a % b: a − b·trunc(a / b), the sign of a's (C's fmod); NULL for b = 0."""
    a, b = evaluate(e.this, values), evaluate(e.expression, values)
    if a is None or b is None or b == 0:
        return None
    if kind(e.this) == INTEGER and kind(e.expression) == INTEGER:
        return float(math.fmod(int(a), int(b)))
    return float(Decimal(repr(a)) % Decimal(repr(b)))  # Decimal's % truncates as PostgreSQL's numeric MOD


def _power(e: exp.Expr, values: Values) -> float | None:
    """POWER(a, b): NULL where PostgreSQL fails (0 to a negative power, a negative base to a fractional one,
    overflow)."""
    a, b = evaluate(e.this, values), evaluate(e.expression, values)
    if a is None or b is None or (a == 0 and b < 0) or (a < 0 and b != math.floor(b)):
        return None
    try:
        return math.pow(a, b)
    except (OverflowError, ValueError):
        return None


def _power_kind(e: exp.Expr) -> str:
    """POWER has a numeric and a double precision version: two integers resolve to double precision."""
    k = _widest(e)
    return DOUBLE if k == INTEGER else k


def _ln(v: float) -> float | None:
    return math.log(v) if v > 0 else None  # PostgreSQL: cannot take logarithm of zero / a negative number


def _log(e: exp.Expr, values: Values) -> float | None:
    """LOG(x): base 10; LOG(b, x): base b (b > 0, b ≠ 1)."""
    if e.args.get("expression") is None:
        v = evaluate(e.this, values)
        return None if v is None or v <= 0 else math.log10(v)
    b, x = evaluate(e.this, values), evaluate(e.expression, values)
    if b is None or x is None or b <= 0 or x <= 0 or b == 1:
        return None
    return math.log(x) / math.log(b)


def _log_kind(e: exp.Expr) -> str:
    return _real(e) if e.args.get("expression") is None else NUMERIC  # LOG(b, x) exists for numeric only


def _coalesce(e: exp.Expr, values: Values) -> float | None:
    for a in (e.this, *e.expressions):
        v = evaluate(a, values)
        if v is not None:
            return v
    return None


def _nullif(e: exp.Expr, values: Values) -> float | None:
    a, b = evaluate(e.this, values), evaluate(e.expression, values)
    return None if a is not None and b is not None and a == b else a


def _sign(v: float) -> float:
    return 1.0 if v > 0 else -1.0 if v < 0 else 0.0


def _sqrt(v: float) -> float | None:
    """SQRT of a noisy value; NULL below 0, where PostgreSQL fails (as a noisy 0 divides to NULL)."""
    return None if v < 0 else math.sqrt(v)


def _case(e: exp.Expr, values: Values) -> float | None:
    """CASE WHEN c THEN v … ELSE d END (or CASE x WHEN w THEN v …): the first branch whose condition holds (NULL
    does not), else the ELSE value, NULL without one."""
    subject = None if e.this is None else evaluate(e.this, values)
    for branch in e.args.get("ifs") or ():
        if e.this is None:
            taken = holds(branch.this, values) is True
        else:
            when = evaluate(branch.this, values)
            taken = subject is not None and when is not None and subject == when
        if taken:
            return evaluate(branch.args["true"], values)
    default = e.args.get("default")
    return None if default is None else evaluate(default, values)


def _case_kind(e: exp.Expr) -> str:
    branches = [b.args["true"] for b in e.args.get("ifs") or ()]
    if e.args.get("default") is not None:
        branches.append(e.args["default"])
    kinds = [kind(b) for b in branches if not isinstance(b, exp.Null)]
    return max(kinds, key=_RANK.__getitem__, default=INTEGER)


def _if(e: exp.Expr, values: Values) -> float | None:
    otherwise = e.args.get("false")
    if holds(e.this, values) is True:
        return evaluate(e.args["true"], values)
    return None if otherwise is None else evaluate(otherwise, values)


# -- intervals (the error bars): each operator over intervals holding the true values --------------------------


def aggregate_box(e: exp.Expr, boxes: Boxes) -> Interval | None:
    return boxes.get(int(e.name[len(AGG_PREFIX) :])) if e.name.startswith(AGG_PREFIX) else None


def _point(e: exp.Expr, boxes: Boxes) -> Interval | None:
    return None if e.is_string else (float(e.this), float(e.this))


def _both(e: exp.Expr, boxes: Boxes) -> tuple[Interval, Interval] | None:
    a, b = interval_of(e.this, boxes), interval_of(e.expression, boxes)
    return None if a is None or b is None else (a, b)


def _product(a: Interval, b: Interval) -> Interval:
    corners = [x * y for x in a for y in b]
    return min(corners), max(corners)


def _interval_arithmetic(op: Callable[[Interval, Interval], Interval | None]) -> IntervalRule:
    def apply(e: exp.Expr, boxes: Boxes) -> Interval | None:
        pair = _both(e, boxes)
        return None if pair is None else op(*pair)

    return apply


def _quotient(a: Interval, b: Interval) -> Interval | None:
    if b[0] <= 0.0 <= b[1]:
        return None  # the divisor may be 0: unbounded
    return _product(a, (1.0 / b[1], 1.0 / b[0]))


def _interval_quotient(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """a / b over intervals; of two integers the truncation, monotone, maps the ends."""
    pair = _both(e, boxes)
    span = None if pair is None else _quotient(*pair)
    if span is None or not (kind(e.this) == INTEGER and kind(e.expression) == INTEGER):
        return span
    return float(math.trunc(span[0])), float(math.trunc(span[1]))


def _monotone(f: Callable[[float], float], lowest: float | None = None) -> IntervalRule:
    """A function monotone on its domain (x > ``lowest`` where given): the ends map to the ends, swapped where it
    decreases; None where the interval leaves the domain (the value may be NULL)."""

    def apply(e: exp.Expr, boxes: Boxes) -> Interval | None:
        a = interval_of(e.this, boxes)
        if a is None or (lowest is not None and a[0] <= lowest):
            return None
        try:
            x, y = f(a[0]), f(a[1])
        except (OverflowError, ValueError):
            return None
        return min(x, y), max(x, y)

    return apply


def _mapped(evaluate_at: Callable[[exp.Expr, float], float | None]) -> IntervalRule:
    """A function monotone in its first argument, its others fixed numbers (ROUND(e, 2), CAST(e AS INT)):
    computed at the ends by its own evaluation."""

    def apply(e: exp.Expr, boxes: Boxes) -> Interval | None:
        a = interval_of(e.this, boxes)
        if a is None:
            return None
        x, y = evaluate_at(e, a[0]), evaluate_at(e, a[1])
        return None if x is None or y is None else (min(x, y), max(x, y))

    return apply


def _at(rule: Callable[[exp.Expr, Values], float | None]) -> Callable[[exp.Expr, float], float | None]:
    """``rule`` at the number ``v`` in place of the first argument, which keeps its PostgreSQL type; None where
    another argument reads an aggregate (ROUND(x, COUNT(*)) is not monotone in x alone)."""

    def apply(e: exp.Expr, v: float) -> float | None:
        rest = [a for k, a in e.args.items() if k != "this" and isinstance(a, exp.Expr)]
        if any(a.find(exp.Column) for a in rest):
            return None
        copy = e.copy()
        typed = exp.DataType.build(_SQL_OF[kind(e.this)], dialect="postgres")
        copy.set("this", exp.Cast(this=exp.column(f"{AGG_PREFIX}0"), to=typed))
        return rule(copy, [v])

    return apply


_SQL_OF = {INTEGER: "BIGINT", NUMERIC: "NUMERIC", DOUBLE: "DOUBLE PRECISION"}


def _interval_abs(e: exp.Expr, boxes: Boxes) -> Interval | None:
    a = interval_of(e.this, boxes)
    if a is None:
        return None
    if a[0] >= 0:
        return a
    if a[1] <= 0:
        return -a[1], -a[0]
    return 0.0, max(-a[0], a[1])


def _interval_power(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """POWER(a, b): over a positive base monotone in each argument (the corners bound it); over any base with an
    integer exponent k, monotone on each side of 0 (an even k has its least value 0 at a = 0)."""
    pair = _both(e, boxes)
    if pair is None:
        return None
    a, b = pair
    try:
        if a[0] > 0:
            corners = [math.pow(x, y) for x in a for y in b]
            return min(corners), max(corners)
        if b[0] != b[1] or b[0] != math.floor(b[0]):
            return None  # a base that may be ≤ 0 with a fractional or varying exponent: NULL or unbounded
        k = b[0]
        if k < 0 and a[0] <= 0 <= a[1]:
            return None  # 0 to a negative power
        ends = [math.pow(a[0], k), math.pow(a[1], k)]
        low = 0.0 if k > 0 and k % 2 == 0 and a[0] <= 0 <= a[1] else min(ends)
        return low, max(ends)
    except (OverflowError, ValueError):
        return None


def _interval_log(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """LOG(x) = log10 x (increasing); LOG(b, x) = ln x / ln b over the intervals (None if b may be 1)."""
    if e.args.get("expression") is None:
        return _monotone(math.log10, 0.0)(e, boxes)
    pair = _both(e, boxes)
    if pair is None or pair[0][0] <= 0 or pair[1][0] <= 0:
        return None
    (b0, b1), (x0, x1) = pair
    return _quotient((math.log(x0), math.log(x1)), (math.log(b0), math.log(b1)))


def _interval_coalesce(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """The first argument's interval: one that is bounded is never NULL over the boxes (every rule that may
    give NULL has no interval), so COALESCE takes it."""
    return interval_of(e.this, boxes)


def _interval_nullif(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """NULLIF(a, b): a's interval where a and b's intervals are disjoint (the true value is never NULL)."""
    pair = _both(e, boxes)
    if pair is None or not (pair[0][1] < pair[1][0] or pair[1][1] < pair[0][0]):
        return None
    return pair[0]


def _interval_extreme(pick: Callable[[list[float]], float]) -> IntervalRule:
    def apply(e: exp.Expr, boxes: Boxes) -> Interval | None:
        args = [interval_of(a, boxes) for a in (e.this, *e.expressions)]
        if any(a is None for a in args):
            return None
        return pick([a[0] for a in args if a]), pick([a[1] for a in args if a])  # monotone in every argument

    return apply


def _interval_sqrt(e: exp.Expr, boxes: Boxes) -> Interval | None:
    a = interval_of(e.this, boxes)
    return None if a is None or a[1] < 0 else (math.sqrt(max(a[0], 0.0)), math.sqrt(a[1]))


def _interval_case(e: exp.Expr, boxes: Boxes) -> Interval | None:
    """The union of the branches' intervals: which branch the true values take is unknown, but it is one."""
    branches = [b.args["true"] for b in e.args.get("ifs") or ()]
    if e.args.get("default") is not None:
        branches.append(e.args["default"])
    spans = [interval_of(b, boxes) for b in branches if not isinstance(b, exp.Null)]
    if not spans or any(s is None for s in spans):
        return None
    return min(s[0] for s in spans if s), max(s[1] for s in spans if s)


def _interval_negation(e: exp.Expr, boxes: Boxes) -> Interval | None:
    a = interval_of(e.this, boxes)
    return None if a is None else (-a[1], -a[0])


_MOD_WITHHELD = (
    "no ± bar: MOD is not monotone (it wraps around at each multiple of the divisor), so an interval holding the "
    "true aggregates maps to no interval around the value"
)

EVALUATE: dict[type[exp.Expr], Step[float | None]] = {
    exp.Column: Step("", _placeholder, lambda e: NUMERIC, aggregate_box),  # ``__agg<i>``: a noisy aggregate
    exp.Literal: Step("", _number, _literal_kind, _point),
    exp.Paren: Step("", _inner, lambda e: kind(e.this), lambda e, boxes: interval_of(e.this, boxes)),
    exp.Cast: Step("CAST", _cast, _cast_kind, _mapped(_at(_cast))),
    exp.Neg: Step("unary −", _negation, lambda e: kind(e.this), _interval_negation),
    exp.Add: Step(
        "+", _arithmetic(lambda a, b: a + b), _widest, _interval_arithmetic(lambda a, b: (a[0] + b[0], a[1] + b[1]))
    ),
    exp.Sub: Step(
        "−", _arithmetic(lambda a, b: a - b), _widest, _interval_arithmetic(lambda a, b: (a[0] - b[1], a[1] - b[0]))
    ),
    exp.Mul: Step("×", _arithmetic(lambda a, b: a * b), _widest, _interval_arithmetic(_product)),
    exp.Div: Step("/", _quotient_value, _widest, _interval_quotient),  # a noisy 0 divides to NULL
    exp.Mod: Step("MOD", _modulo, _widest, None, _MOD_WITHHELD),
    exp.Greatest: Step("GREATEST", _extreme(max), _widest, _interval_extreme(max)),
    exp.Least: Step("LEAST", _extreme(min), _widest, _interval_extreme(min)),
    exp.Coalesce: Step("COALESCE", _coalesce, _widest, _interval_coalesce),
    exp.Nullif: Step("NULLIF", _nullif, lambda e: kind(e.this), _interval_nullif),
    exp.Abs: Step("ABS", _unary(abs), lambda e: kind(e.this), _interval_abs),
    exp.Sign: Step("SIGN", _unary(_sign), _real, _monotone(_sign)),
    exp.Round: Step("ROUND", _round, _rounding_kind, _mapped(_at(_round))),
    exp.Trunc: Step("TRUNC", _trunc, _rounding_kind, _mapped(_at(_trunc))),
    exp.Floor: Step("FLOOR", _unary(lambda v: float(math.floor(v))), _real, _monotone(lambda v: float(math.floor(v)))),
    exp.Ceil: Step("CEIL", _unary(lambda v: float(math.ceil(v))), _real, _monotone(lambda v: float(math.ceil(v)))),
    exp.Sqrt: Step("SQRT", _unary(_sqrt), _real, _interval_sqrt),
    exp.Cbrt: Step("CBRT", _unary(math.cbrt), lambda e: DOUBLE, _monotone(math.cbrt)),
    exp.Exp: Step("EXP", _unary(math.exp), _real, _monotone(math.exp)),
    exp.Ln: Step("LN", _unary(_ln), _real, _monotone(math.log, 0.0)),
    exp.Log: Step("LOG", _log, _log_kind, _interval_log),
    exp.Pow: Step("POWER", _power, _power_kind, _interval_power),
    exp.Case: Step("CASE", _case, _case_kind, _interval_case),
    exp.If: Step("", _if),  # a CASE's WHEN … THEN …
    exp.Null: Step("NULL", lambda e, values: None, lambda e: INTEGER),
}


def _compare(op: Callable[[float, float], bool]) -> Callable[[exp.Expr, Values], bool | None]:
    def apply(e: exp.Expr, values: Values) -> bool | None:
        x, y = evaluate(e.this, values), evaluate(e.expression, values)
        return None if x is None or y is None else op(x, y)

    return apply


def _not(e: exp.Expr, values: Values) -> bool | None:
    inner = holds(e.this, values)
    return None if inner is None else not inner


def _and(e: exp.Expr, values: Values) -> bool | None:
    a, b = holds(e.this, values), holds(e.expression, values)
    return False if a is False or b is False else None if a is None or b is None else True


def _or(e: exp.Expr, values: Values) -> bool | None:
    a, b = holds(e.this, values), holds(e.expression, values)
    return True if a is True or b is True else None if a is None or b is None else False


def _between(e: exp.Expr, values: Values) -> bool | None:
    x, lo, hi = (evaluate(e.args[k], values) for k in ("this", "low", "high"))
    return None if x is None or lo is None or hi is None else lo <= x <= hi


CONDITIONS: dict[type[exp.Expr], Step[bool | None]] = {
    exp.Paren: Step("", lambda e, values: holds(e.this, values)),
    exp.Boolean: Step("", lambda e, values: bool(e.this)),
    exp.EQ: Step("=", _compare(lambda a, b: a == b)),
    exp.NEQ: Step("<>", _compare(lambda a, b: a != b)),
    exp.LT: Step("<", _compare(lambda a, b: a < b)),
    exp.LTE: Step("<=", _compare(lambda a, b: a <= b)),
    exp.GT: Step(">", _compare(lambda a, b: a > b)),
    exp.GTE: Step(">=", _compare(lambda a, b: a >= b)),
    exp.Between: Step("BETWEEN", _between),
    exp.And: Step("AND", _and),
    exp.Or: Step("OR", _or),
    exp.Not: Step("NOT", _not),
}

# every node class a HAVING condition may contain (the normaliser checks it before anything runs): the two
# tables' and the names inside them (a column's identifier, a cast's type)
POST_PROCESSED: tuple[type[exp.Expr], ...] = (*CONDITIONS, *EVALUATE, exp.Identifier, exp.DataType)


def post_processing() -> str:
    """The operators of the two tables, conditions first, for the refusal that lists them."""
    names = [step.name for step in CONDITIONS.values()] + [step.name for step in EVALUATE.values()]
    return ", ".join(dict.fromkeys(n for n in names if n))
