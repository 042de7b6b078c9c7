"""Post-processing: the output expressions and HAVING over the noisy values (Dwork & Roth, "The Algorithmic
Foundations of Differential Privacy", Prop. 2.1: a function of released values keeps the guarantee).

Two tables give the node classes computed after the noise, :data:`EVALUATE` (values) and :data:`CONDITIONS`
(HAVING); :data:`POST_PROCESSED` is every class they allow, which the normaliser checks before anything runs
(sqldp.normalize), and the release step computes with :func:`evaluate` and :func:`holds` (sqldp.release).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AGG_PREFIX

T = TypeVar("T")

Values = Sequence[float | None]


@dataclass(frozen=True)
class Step(Generic[T]):
    """One node class of the post-processing: its name in the refusal that lists them ("" for the nodes that
    are no operator: parentheses, placeholders, numbers), and how it computes on the noisy values."""

    name: str
    apply: Callable[[exp.Expr, Values], T]


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


def _not_evaluated(e: exp.Expr) -> RefusedError:
    return RefusedError(f"output expression {e.sql(dialect='postgres')} is not supported after aggregation")


def _placeholder(e: exp.Expr, values: Values) -> float | None:
    if not e.name.startswith(AGG_PREFIX):
        raise _not_evaluated(e)
    return values[int(e.name[len(AGG_PREFIX) :])]


def _number(e: exp.Expr, values: Values) -> float | None:
    if e.is_string:
        raise _not_evaluated(e)
    return float(e.this)


def _inner(e: exp.Expr, values: Values) -> float | None:
    """( e ) and CAST(e AS …): the value of e (a cast of a noisy value is not rounded)."""
    return evaluate(e.this, values)


def _negation(e: exp.Expr, values: Values) -> float | None:
    v = evaluate(e.this, values)
    return None if v is None else -v


def _extreme(pick: Callable[[list[float]], float]) -> Callable[[exp.Expr, Values], float | None]:
    """GREATEST/LEAST (the clamps of :mod:`sqldp.aggregates`); NULL if an argument is."""

    def apply(e: exp.Expr, values: Values) -> float | None:
        args = [evaluate(a, values) for a in (e.this, *e.expressions)]
        present = [a for a in args if a is not None]
        return pick(present) if len(present) == len(args) else None

    return apply


def _arithmetic(op: Callable[[float, float], float | None]) -> Callable[[exp.Expr, Values], float | None]:
    def apply(e: exp.Expr, values: Values) -> float | None:
        a, b = evaluate(e.this, values), evaluate(e.expression, values)
        return None if a is None or b is None else op(a, b)

    return apply


def nearest(v: float) -> float:
    """The integer nearest ``v``, halves away from zero as PostgreSQL's ROUND (Python's round takes halves to
    even)."""
    return math.copysign(math.floor(abs(v) + 0.5), v)


def _round(e: exp.Expr, values: Values) -> float | None:
    """ROUND(e): to the nearest integer (ROUND(e, digits) is not supported after aggregation)."""
    if e.args.get("decimals") is not None:
        raise _not_evaluated(e)
    v = evaluate(e.this, values)
    return None if v is None else nearest(v)


def _sqrt(e: exp.Expr, values: Values) -> float | None:
    """SQRT of a noisy value; NULL below 0, where PostgreSQL fails (as a noisy 0 divides to NULL)."""
    v = evaluate(e.this, values)
    return None if v is None or v < 0 else math.sqrt(v)


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


def _if(e: exp.Expr, values: Values) -> float | None:
    otherwise = e.args.get("false")
    if holds(e.this, values) is True:
        return evaluate(e.args["true"], values)
    return None if otherwise is None else evaluate(otherwise, values)


EVALUATE: dict[type[exp.Expr], Step[float | None]] = {
    exp.Column: Step("", _placeholder),  # ``__agg<i>``: a noisy aggregate
    exp.Literal: Step("", _number),
    exp.Paren: Step("", _inner),
    exp.Cast: Step("CAST", _inner),
    exp.Neg: Step("unary −", _negation),
    exp.Add: Step("+", _arithmetic(lambda a, b: a + b)),
    exp.Sub: Step("−", _arithmetic(lambda a, b: a - b)),
    exp.Mul: Step("×", _arithmetic(lambda a, b: a * b)),
    exp.Div: Step("/", _arithmetic(lambda a, b: a / b if b != 0 else None)),  # a noisy 0 divides to NULL
    exp.Greatest: Step("GREATEST", _extreme(max)),
    exp.Least: Step("LEAST", _extreme(min)),
    exp.Sqrt: Step("SQRT", _sqrt),
    exp.Round: Step("ROUND", _round),
    exp.Case: Step("CASE", _case),
    exp.If: Step("", _if),  # a CASE's WHEN … THEN …
    exp.Null: Step("NULL", lambda e, values: None),
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
