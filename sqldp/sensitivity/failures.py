"""Where PostgreSQL may fail on the data: an error is an answer too.

The statements sqldp runs for a private answer read private data. If PostgreSQL can fail on some values — a
division by zero, SQRT or LN of a negative number, a fractional power of one, a text that is not a number
— then whether the noisy answer or an error comes back tells the analyst something about the data, without
noise (``SELECT COUNT(*) FROM t WHERE 1 / t.a > 0`` fails exactly when some row has a = 0). sqldp refuses
such expressions before any query runs, wherever they read a column: in the WHERE (public and private
conjuncts alike: PostgreSQL may evaluate a conjunct on public rows only after a join with private ones),
in GROUP BY keys and in aggregate arguments. A function reading a column must be on the list of those
PostgreSQL defines for every value (``_TOTAL``), so that an unknown one is refused, not trusted. A divisor
is safe when it is a non-zero constant or written ``NULLIF(x, 0)`` (x / NULL is NULL, which WHERE treats as
false and aggregates skip); SQRT and fractional powers when their argument is non-negative by its form
(ABS, squares, norms, EXP, sums and products of those). The row-level SUM bounds its own argument
(:mod:`sqldp.sensitivity.intervals` clamps its columns to their declared ranges and refuses divisors, roots
and powers whose range reaches 0 or below, and any node it does not know).

Overflow: INTEGER arithmetic is run in BIGINT (:func:`sqldp.sqlgen.widen_integers`), where it cannot
overflow for sums and products of two INTEGER values; intervals refuse SUM arguments that overflow double
precision over the declared ranges; the value-level analysis runs EXP(g) as EXP(LEAST(g, 300))
(:func:`cap_exponentials`). Not covered (documented in the README): overflow of BIGINT arithmetic (a product
of three INTEGER values, or BIGINT columns) and of other floating-point products, which needs values near
those limits in the data.
"""

from __future__ import annotations

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.pg_arithmetic import KindOf, case_values, integer_valued, keeps_value, reads_column
from sqldp.sensitivity.intervals import constant

# functions with a domain narrower than their argument's type (NR does not need them; PostgreSQL fails outside)
_PARTIAL = (exp.Ln, exp.Log)
# functions PostgreSQL defines for every value of their arguments (those checked below: where they are safe);
# any other function reading a column is refused: the check lists what is known to be safe, not what fails
_TOTAL = (
    exp.Connector,
    exp.AggFunc,
    exp.Case,
    exp.If,
    exp.Cast,
    exp.Exp,
    exp.Sqrt,
    exp.Pow,
    exp.Abs,
    exp.Greatest,
    exp.Least,
    exp.Coalesce,
    exp.Nullif,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Extract,
    exp.TimestampTrunc,
    exp.DateTrunc,
    exp.Length,
    exp.Lower,
    exp.Upper,
    exp.Trim,
    exp.Concat,
    exp.StrPosition,
    exp.Substring,
)
_TEXT_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR}


def nonnegative(e: exp.Expression) -> bool:
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


def _safe_divisor(d: exp.Expression) -> bool:
    """NULLIF(x, 0), or a constant that is not 0 (one that is fails on every row but not on no rows)."""
    while isinstance(d, exp.Paren) or (isinstance(d, exp.Cast) and keeps_value(d.to)):
        d = d.this  # not a rounding cast: CAST(0.4 AS INTEGER) is 0
    if isinstance(d, exp.Nullif):
        z = d.expression
        return isinstance(z, exp.Literal) and not z.is_string and float(z.this) == 0
    v = constant(d)
    return v is not None and v != 0


def _numeric(e: exp.Expression, kind_of: KindOf) -> bool:
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
    return isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Abs, exp.Sqrt, exp.Exp, exp.Pow))


def failure(node: exp.Expression, kind_of: KindOf) -> str | None:
    """Why PostgreSQL may fail on ``node`` for some value of the columns it reads, or None."""
    if not reads_column(node):
        return None
    if isinstance(node, (exp.Div, exp.Mod, exp.IntDiv)) and not _safe_divisor(node.expression):
        return "divides by a value that may be 0 (write NULLIF(divisor, 0))"
    if isinstance(node, exp.Sqrt) and not nonnegative(node.this):
        return "takes SQRT of a value that may be negative (write SQRT(ABS(x)) or SQRT(GREATEST(x, 0)))"
    if isinstance(node, exp.Pow):
        r = constant(node.expression)
        if r is None:
            return "raises to a power read from the data"
        if r < 0:
            return "raises a value that may be 0 to a negative power (write 1 / NULLIF(x, 0))"
        if not r.is_integer() and not nonnegative(node.this):
            return "raises a value that may be negative to a fractional power (write POWER(ABS(x), r))"
    if isinstance(node, _PARTIAL):
        return "takes a logarithm of a value that may be 0 or negative"
    if isinstance(node, exp.Substring) and any(
        reads_column(a) for k, a in node.args.items() if k != "this" and isinstance(a, exp.Expression)
    ):
        return "takes a substring whose start or length is read from the data (a negative length fails)"
    if isinstance(node, (exp.Like, exp.ILike)) and reads_column(node.expression):
        return "matches a pattern read from the data (a pattern ending in an escape character fails)"
    if isinstance(node, exp.Func) and not isinstance(node, _TOTAL):
        return "calls a function sqldp does not know to be defined for every value of its arguments"
    if isinstance(node, exp.Cast):
        to = node.to
        if to.this in _TEXT_TYPES:
            return None
        # a number to a number fails only by overflow (not covered, above)
        if _numeric(node.this, kind_of) and (keeps_value(to) or to.is_type(*exp.DataType.NUMERIC_TYPES)):
            return None
        x = node.this
        if isinstance(x, exp.Column) and x.table and to.this == exp.DataType.Type.DATE:
            return None if kind_of(ColumnRef(x.table, x.name)) == "date" else "casts a value that may not be a date"
        return f"casts a value to {to.sql(dialect='postgres')} that may not convert"
    return None


EXP_CAP = 300.0  # e^300 ≈ 1.9e130: a product with any value below 1e178 stays a double


def cap_exponentials(e: exp.Expression) -> exp.Expression:
    """``e`` with each EXP(g) written EXP(LEAST(g, 300)) (a copy). The value-level analysis does not clamp the
    data, so EXP of a large value (or its product with one) would overflow double precision and fail: an
    error for the data. The capped function is what is analysed and run; it is at most e^g, its derivative
    at most e^g's (0 beyond the cap), so NR Table 10's bounds cover it (expressions.py takes
    |LEAST(g, c)| ≤ |g| for c ≥ 0), and it differs from e^g only above e^300."""

    def cap(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Exp) and reads_column(node):
            return exp.Exp(this=exp.Least(this=node.this.copy(), expressions=[exp.Literal.number(EXP_CAP)]))
        return node

    return e.copy().transform(cap)


def check(form: AnalysisForm, kind_of: KindOf, *, bounded_sum: bool) -> None:
    """Refuse a form with an expression PostgreSQL may fail on (module docstring). ``bounded_sum``: the SUM
    argument is bounded by :mod:`sqldp.sensitivity.intervals` over clamped columns (row-level), which
    refuses its unsafe divisors and roots itself."""
    parts: list[tuple[str, exp.Expression]] = [("WHERE", c.expr) for c in form.conjuncts]
    parts += [("GROUP BY", g) for g in form.group_by]
    for agg in form.aggregates:
        if agg.arg is not None and not (bounded_sum and agg.kind == "sum"):
            parts.append((agg.sql, agg.arg))
    for where, e in parts:
        for node in e.walk():
            why = failure(node, kind_of)
            if why is not None:
                raise RefusedError(
                    f"{node.sql(dialect='postgres')} in {where} {why}: PostgreSQL would fail on such data, and "
                    "an error in place of the noisy answer would reveal it"
                )
