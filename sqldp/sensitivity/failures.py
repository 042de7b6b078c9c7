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

Values that leave their type (overflow, underflow, casts out of range, dates moved out of theirs) are
bounded over what the columns' TYPES can hold, not over the policy's ranges, which nothing enforces on the
data except in the row-level SUM, which clamps its columns (``value_failure``, below); what may fail is
refused with the safe spelling. What runs is what is checked: INTEGER arithmetic runs in BIGINT
(:func:`sqldp.sqlgen.widen_integers`), SUM in NUMERIC (:func:`sqldp.sqlgen.aggregate_expr`), and the
value-level analysis runs EXP(g) as EXP(LEAST(g, 300)) (:func:`cap_exponentials`). Not covered: the
analyses' own bound queries (their SQL is generated, not written by the analyst), and resource limits.
"""

from __future__ import annotations

import decimal
from collections.abc import Callable
from dataclasses import dataclass, replace

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.pg_arithmetic import KindOf, case_values, integer_valued, keeps_value, reads_column
from sqldp.sensitivity.intervals import Domain, constant

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
    if isinstance(e, (exp.Greatest, exp.Least, exp.Coalesce)):
        return all(_numeric(x, kind_of) for x in [e.this, *e.expressions])
    if isinstance(e, (exp.Nullif, exp.Round, exp.Floor, exp.Ceil)):
        return _numeric(e.this, kind_of)
    return isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Neg, exp.Abs, exp.Sqrt, exp.Exp, exp.Pow))


def _dated(e: exp.Expression, kind_of: KindOf) -> bool:
    """``e`` is a DATE that reads a column (a column of kind date, or arithmetic on one)."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "date"
    if isinstance(e, exp.Cast):
        return e.to.this == exp.DataType.Type.DATE and reads_column(e)
    return isinstance(e, (exp.Add, exp.Sub)) and any(_dated(x, kind_of) for x in (e.this, e.expression))


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
    length = node.args.get("length") if isinstance(node, exp.Substring) else None
    if length is not None and (constant(length) or 0) < 0:
        return "takes a substring of negative length (PostgreSQL fails on each row it reaches, so on some data only)"
    if isinstance(node, (exp.Add, exp.Sub)) and any(_dated(x, kind_of) for x in (node.this, node.expression)):
        return (
            "moves or subtracts a date read from the data (a date near its type's ends leaves the range, "
            "'infinity' cannot be subtracted); compare the column with a constant date instead (t.d < DATE '…' - 30)"
        )
    if isinstance(node, (exp.DateTrunc, exp.TimestampTrunc)) and _dated(node.this, kind_of):
        return "truncates a date read from the data (a date after the year 294276 is no timestamp); use EXTRACT"
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
        if _dated(x, kind_of) and to.this != exp.DataType.Type.DATE:
            return f"casts a date read from the data to {to.sql(dialect='postgres')} (not every date converts)"
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


def check(form: AnalysisForm, dom: Domain, *, bounded_sum: bool) -> None:
    """Refuse a form with an expression PostgreSQL may fail on (module docstring), naming the expression, where
    it is and the safe spelling. ``bounded_sum``: the SUM argument is bounded by
    :mod:`sqldp.sensitivity.intervals` over clamped columns (row-level), which refuses its unsafe divisors and
    roots itself; its values are those of the declared ranges. Under value-level privacy an aggregate's
    argument runs with its EXPs capped (:func:`cap_exponentials`), and is checked so."""
    parts: list[tuple[str, exp.Expression, bool]] = [("WHERE", c.expr, False) for c in form.conjuncts]
    parts += [("GROUP BY", g, False) for g in form.group_by]
    for agg in form.aggregates:
        if agg.arg is None:
            continue
        if bounded_sum and agg.kind == "sum":
            parts.append((agg.sql, agg.arg, True))
        else:
            parts.append((agg.sql, agg.arg if bounded_sum else cap_exponentials(agg.arg), False))
    for where, e, clamped in parts:
        for node in e.walk():
            why = None if clamped else failure(node, dom.kind)
            if why is not None:
                raise _refusal(node, where, why)
        found = value_failure(e, dom, clamped=clamped)
        if found is not None:
            raise _refusal(found[0], where, found[1])
        if where in {a.sql for a in form.aggregates if a.kind == "sum"}:
            with decimal.localcontext(_CTX):
                v = _Values(dom, clamped)(e)
            if v is not None and v.typ == "numeric" and v.big > SUM_MAX:  # sqlgen sums in NUMERIC
                why = f"sums values up to {_sci(v.big)}, whose total may overflow NUMERIC (clamp with {_CLAMP})"
                raise _refusal(e, where, why)


def _refusal(node: exp.Expression, where: str, why: str) -> RefusedError:
    return RefusedError(
        f"{node.sql(dialect='postgres')} in {where} {why}: PostgreSQL would fail on such data, and an error in "
        "place of the noisy answer would reveal it"
    )


# -- values that leave their type ------------------------------------------------------------------------------
#
# PostgreSQL also fails a statement when a value leaves its type: INTEGER/BIGINT arithmetic out of range, a
# double precision result that overflows or underflows to 0 from non-zero operands (1e−200 · 1e−200), EXP
# beyond e^709 or below e^−708 in double precision, NUMERIC beyond 10^131072 (its EXP from about 6000 on), a
# cast to SMALLINT/INTEGER/BIGINT/NUMERIC(p, s)/REAL out of range or of NaN/Infinity, a DATE moved out of its
# range. Which values the data can hold is fixed by the column's TYPE, not by the policy's range, which nothing
# enforces on the data — except in the row-level SUM, whose columns are clamped to the declared ranges
# (intervals.clamp_columns). ``_value`` types each node as PostgreSQL does (an operator of a NUMERIC and a
# double precision is double precision, integer arithmetic runs in BIGINT: sqlgen.widen_integers) and bounds
# its values over those of the columns' types, raising :class:`_MayFail` where one of them fails.

_D = decimal.Decimal
_CTX = decimal.Context(prec=40, Emax=10**9, Emin=-(10**9), traps=[])
_INF = _D("Infinity")
_ZERO = _D(0)
FLOAT_MAX = _D("1.7976931348623157e308")
FLOAT_LEAST = _D("4.9406564584124654e-324")  # the least non-zero double
FLOAT_ZERO = _D("2.4703282292062328e-324")  # a product or quotient at most this small rounds to 0: underflow
REAL_MAX, REAL_LEAST, REAL_ZERO = _D("3.4028235e38"), _D("1.4e-45"), _D("7.1e-46")
NUMERIC_TOP = _D("1e131072")  # NUMERIC holds less than 10^131072
NUMERIC_MAX = _CTX.subtract(NUMERIC_TOP, _CTX.multiply(NUMERIC_TOP, _D("1e-30")))  # a margin for rounding here
SUM_MAX = _D("1e131053")  # a SUM of at most 2^63 rows of values up to it stays below 10^131072
NUMERIC_EXP = _D(5900)  # EXP of a NUMERIC fails from about 6000 on (PostgreSQL 18)
NUMERIC_POWER = _D(2500)  # a fractional POWER of NUMERICs goes through EXP: results below 10^2500
FLOAT_EXP = (_D(-708), _D(709))  # e^709 < 1.8e308 and e^−708 > 2.2e−308; beyond, overflow or underflow
INT8 = (_D(-(2**63)), _D(2**63 - 1))
_T = exp.DataType.Type
_INT_TYPES = {
    _T.SMALLINT: (_D(-(2**15)), _D(2**15 - 1)),
    _T.SMALLSERIAL: (_D(-(2**15)), _D(2**15 - 1)),
    _T.INT: (_D(-(2**31)), _D(2**31 - 1)),
    _T.SERIAL: (_D(-(2**31)), _D(2**31 - 1)),
    _T.BIGINT: INT8,
    _T.BIGSERIAL: INT8,
}
_NUMBER_KINDS = {"integer", "numeric"}
# the binary floating-point types: largest value, a result rounded to 0 when at most this, the least non-zero
_FLOATS = {
    "float": (FLOAT_MAX, FLOAT_ZERO, FLOAT_LEAST, "double precision"),
    "real": (REAL_MAX, REAL_ZERO, REAL_LEAST, "REAL"),
}
_CLAMP = "LEAST(GREATEST(x, low), high)"


class _MayFail(Exception):
    """Not an error of sqldp: a node PostgreSQL may fail on, and why."""

    def __init__(self, node: exp.Expression, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


@dataclass(frozen=True)
class _Value:
    """What a number-valued node can be: PostgreSQL's type ("int", "float", "real", "numeric"), the range [lo, hi] of
    its finite values, whether it may be ±Infinity or NaN, and ``least``, a lower bound of its non-zero |·|
    (0: none known)."""

    typ: str
    lo: decimal.Decimal
    hi: decimal.Decimal
    inf: bool = False
    nan: bool = False
    least: decimal.Decimal = _ZERO
    sided: int = 0  # where ``inf``: 1 when only +Infinity, −1 when only −Infinity

    @property
    def pos(self) -> bool:
        return self.inf and self.sided >= 0

    @property
    def neg(self) -> bool:
        return self.inf and self.sided <= 0

    @property
    def big(self) -> decimal.Decimal:
        return max(abs(self.lo), abs(self.hi))


def _of_type(t: exp.DataType) -> _Value | None:
    if t.this in _INT_TYPES:
        lo, hi = _INT_TYPES[t.this]
        return _Value("int", lo, hi, least=_D(1))
    if t.this == _T.DOUBLE:
        return _Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)
    if t.this == _T.FLOAT:  # REAL
        return _Value("real", -REAL_MAX, REAL_MAX, inf=True, nan=True, least=REAL_LEAST)
    if t.this == _T.MONEY:  # a BIGINT count of cents: its arithmetic leaves the type where BIGINT's does
        return _Value("int", INT8[0], INT8[1], least=_D(1))
    if t.this == _T.DECIMAL:
        if t.expressions:
            p = int(t.expressions[0].sql())
            s = int(t.expressions[1].sql()) if len(t.expressions) > 1 else 0
            top = _CTX.power(10, p - s) - _CTX.power(10, -s)
            return _Value("numeric", -top, top, nan=True, least=_CTX.power(10, -s))
        return _Value("numeric", -NUMERIC_TOP, NUMERIC_TOP, inf=True, nan=True)
    return None


def _typ(*vs: _Value, choice: bool = False) -> str:
    """The type of an operator of these (REAL with REAL is REAL, with anything else double precision); of
    GREATEST, CASE and the like with ``choice`` (REAL with an integer or a NUMERIC stays REAL)."""
    typs = {v.typ for v in vs}
    if "float" in typs or ("real" in typs and not choice and typs != {"real"}):
        return "float"
    return "real" if "real" in typs else "numeric" if "numeric" in typs else "int"


class _Values:
    """``_value`` of the nodes of one expression, each computed once."""

    def __init__(self, dom: Domain, clamped: bool) -> None:
        self.dom, self.clamped = dom, clamped
        self.memo: dict[int, _Value | None] = {}

    def column(self, e: exp.Column) -> _Value | None:
        ref = ColumnRef(e.table, e.name)
        if self.dom.kind(ref) not in _NUMBER_KINDS:
            return None
        if self.dom.type is not None:
            v = _of_type(exp.DataType.build(self.dom.type(ref), dialect="postgres"))
        else:
            v = _of_type(exp.DataType.build("BIGINT" if self.dom.kind(ref) == "integer" else "NUMERIC"))
        if v is None:  # a number kind of a type not listed above: any value
            v = _Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)
        r = self.dom.range(ref) if self.clamped else None
        if r is not None:  # the row-level SUM clamps the column (NaN too: NaN > hi) into its declared range
            lo, hi = _D(repr(float(r[0]))), _D(repr(float(r[1])))
            least = v.least if lo <= 0 <= hi else min(abs(lo), abs(hi))
            v = _Value(v.typ, lo, hi, least=least)
        return v

    def __call__(self, e: exp.Expression) -> _Value | None:
        key = id(e)
        if key not in self.memo:
            self.memo[key] = self._value(e)
        return self.memo[key]

    def _value(self, e: exp.Expression) -> _Value | None:
        def fail(why: str) -> _MayFail:
            return _MayFail(e, why)

        if isinstance(e, exp.Paren):
            return self(e.this)
        if isinstance(e, exp.Literal):
            if e.is_string:
                return None
            v = _D(e.this)
            typ = "int" if e.this.isdigit() and v <= INT8[1] else "numeric"
            return _Value(typ, v, v, least=abs(v))
        if isinstance(e, exp.Column):
            return self.column(e) if e.table else None
        if isinstance(e, exp.Neg):
            a = self(e.this)
            if a is None:
                return None
            if a.typ == "int" and a.lo < -INT8[1]:
                raise fail("negates a BIGINT that may be −2^63, out of range (write CAST(x AS NUMERIC))")
            return replace(a, lo=-a.hi, hi=-a.lo, sided=-a.sided)
        if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod)):
            return self.arithmetic(e, fail)
        if isinstance(e, exp.Abs):
            a = self(e.this)
            if a is None:
                return None
            if a.typ == "int" and a.lo < -INT8[1]:
                raise fail("takes ABS of a BIGINT that may be −2^63, out of range (write ABS(CAST(x AS NUMERIC)))")
            lo = _D(0) if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
            return replace(a, lo=lo, hi=a.big)
        if isinstance(e, exp.Exp):
            return self.exponential(e, fail)
        if isinstance(e, exp.Sqrt):
            a = self(e.this)
            if a is None:
                return None
            typ = "numeric" if a.typ == "numeric" else "float"
            lo, hi = (_CTX.sqrt(max(x, _D(0))) for x in (a.lo, a.hi))
            return _Value(typ, lo, hi, a.inf, a.nan, _CTX.sqrt(a.least))
        if isinstance(e, exp.Pow):
            return self.power(e, fail)
        if isinstance(e, (exp.Round, exp.Floor, exp.Ceil)):
            a = self(e.this)
            if a is None:
                return None
            typ = "numeric" if e.args.get("decimals") is not None else "float" if a.typ == "int" else a.typ
            return _Value(typ, a.lo - 1, a.hi + 1, a.inf, a.nan)
        if isinstance(e, exp.Cast):
            return self.cast(e, fail)
        if isinstance(e, (exp.Greatest, exp.Least, exp.Coalesce, exp.Nullif, exp.Case, exp.If)):
            return self.choice(e, fail)
        if isinstance(e, (exp.Length, exp.StrPosition)):
            return _Value("int", _D(0), _D(2**31 - 1))
        if isinstance(e, exp.Extract):
            return _Value("numeric", -_D("1e15"), _D("1e15"), inf=True, nan=True)
        if isinstance(e, (exp.Condition, exp.Func)) and not isinstance(e, exp.Anonymous):
            return None  # comparisons, connectives, text and date functions: not a number (checked on their own)
        # a node of unknown type: any number (its parents are then checked against the widest values)
        return _Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)

    def convert(self, x: exp.Expression, v: _Value, typ: str) -> _Value:
        """``v`` converted to the floating-point ``typ`` where PostgreSQL mixes it with one: a NUMERIC beyond its
        largest value, or so small it rounds to 0, fails the conversion."""
        if typ not in _FLOATS or v.typ == typ:
            return v
        top, zero, _, name = _FLOATS[typ]
        tiny = v.least <= zero and not (v.lo == v.hi == 0)
        if v.typ == "numeric" and reads_column(x) and (v.big > top or tiny):
            raise _MayFail(
                x,
                f"converts a NUMERIC that may reach {_sci(v.big)}{' or near 0' if tiny else ''} to {name} "
                f"(write CAST(x AS NUMERIC) on the {name} side, or {_CLAMP})",
            )
        return replace(v, typ=typ)

    def arithmetic(self, e: exp.Expression, fail: Callable[[str], _MayFail]) -> _Value | None:
        a, b = self(e.this), self(e.expression)
        if a is None or b is None:
            return None  # date or text operands: failure() refuses those that read a column
        typ = _typ(a, b)
        a, b = self.convert(e.this, a, typ), self.convert(e.expression, b, typ)
        nan, inf = a.nan or b.nan or a.inf or b.inf, a.inf or b.inf
        if isinstance(e, (exp.Add, exp.Sub)):
            lo, hi = (a.lo + b.lo, a.hi + b.hi) if isinstance(e, exp.Add) else (a.lo - b.hi, a.hi - b.lo)
            least = _FLOATS[typ][2] if typ in _FLOATS else min(a.least, b.least)
            v = _Value(typ, lo, hi, inf, nan, least)
        elif isinstance(e, exp.Mul):
            ends = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            v = _Value(typ, min(ends), max(ends), inf, nan, a.least * b.least)
        elif isinstance(e, exp.Div):
            if b.lo == b.hi == 0:
                return _Value(typ, _D(0), _D(0), inf, True)  # x / 0: refused as a divisor above, or a constant
            if b.lo > 0 or b.hi < 0:
                ends = [x / y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
                lo, hi = min(ends), max(ends)
            else:  # NULLIF(y, 0): no less than its least non-zero |value| (a grid of 1 for integers)
                top = a.big / b.least if b.least > 0 else _INF
                lo, hi = -top, top
            least = a.least / b.big if b.big > 0 else _D(0)
            if typ == "int":
                lo, hi = lo.to_integral_value(decimal.ROUND_DOWN), hi.to_integral_value(decimal.ROUND_DOWN)
                least = _D(1)
            elif typ == "numeric" and least < _D("1e-900"):
                least = _D(0)  # NUMERIC rounds quotients to at most 1000 places
            v = _Value(typ, lo, hi, inf, True, least)
        else:  # % takes the dividend's sign and is smaller than both (PostgreSQL answers 0 for −2^63 % −1)
            top = min(a.big, b.big)
            v = _Value(typ, -top, top, inf, nan, _D(1) if typ == "int" else _D(0))
        if not reads_column(e):
            return v
        what = {exp.Add: "a sum", exp.Sub: "a difference", exp.Mul: "a product", exp.Div: "a quotient"}.get(
            type(e), "a remainder"
        )
        if typ == "int" and (v.lo < INT8[0] or v.hi > INT8[1]):
            raise fail(f"computes {what} that may leave BIGINT (up to {_sci(v.big)}; write CAST(x AS NUMERIC))")
        if typ == "numeric" and v.big > NUMERIC_MAX:
            raise fail(f"computes {what} that may overflow NUMERIC (up to {_sci(v.big)}; clamp with {_CLAMP})")
        if typ in _FLOATS:
            top, zero, _, name = _FLOATS[typ]
            if v.big > top:
                raise fail(
                    f"computes {what} that may overflow {name} (up to {_sci(v.big)}; write "
                    f"CAST(x AS NUMERIC) for a {name} operand)"
                )
            if isinstance(e, (exp.Mul, exp.Div)) and v.least <= zero:
                raise fail(
                    f"computes {what} of {name} values that may underflow to 0 (write "
                    f"CAST(x AS NUMERIC) for a {name} operand)"
                )
        return v

    def exponential(self, e: exp.Exp, fail: Callable[[str], _MayFail]) -> _Value | None:
        a = self(e.this)
        if a is None:
            return None
        if a.typ == "numeric":
            if a.hi > NUMERIC_EXP and reads_column(e):
                raise fail(
                    f"takes EXP of a NUMERIC that may reach {_sci(a.hi)} (it fails from 6000 on; write "
                    "EXP(LEAST(x, 700)))"
                )
            # NUMERIC's EXP keeps about 16 significant digits: e^lo is not rounded to 0 above e^−700
            least = _CTX.exp(a.lo) / 10 if a.lo > -700 else _ZERO
            return _Value(
                "numeric",
                _CTX.exp(max(a.lo, _D(-700))) / 10 if a.lo > -700 else _ZERO,
                _CTX.exp(min(a.hi, NUMERIC_EXP)),
                a.inf,
                a.nan,
                least,
            )
        lo, hi = FLOAT_EXP
        if (a.lo < lo or a.hi > hi) and reads_column(e):
            raise fail(
                f"takes EXP of values from {_sci(a.lo)} to {_sci(a.hi)}: double precision overflows beyond "
                "e^709 and underflows below e^−708 (write EXP(LEAST(GREATEST(x, −700), 700)))"
            )
        lo, hi = max(a.lo, lo), min(a.hi, hi)
        return _Value("float", _CTX.exp(lo), _CTX.exp(hi), a.inf, a.nan, _CTX.exp(lo))

    def power(self, e: exp.Pow, fail: Callable[[str], _MayFail]) -> _Value | None:
        a, k = self(e.this), self(e.expression)
        if a is None or k is None:
            return None
        r = constant(e.expression)
        r = None if r is None else float(r)
        typ = "numeric" if "numeric" in {a.typ, k.typ} and not {a.typ, k.typ} & set(_FLOATS) else "float"
        if r is None:  # an exponent read from the data: refused by failure()
            return _Value(typ, -_INF, _INF, True, True)
        rd = _D(repr(r))
        small, big = (_D(0) if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))), a.big
        small = max(small, a.least)
        ends = [_CTX.power(x, rd) if x > 0 else _D(0) for x in (small, big)]
        top, least = max(ends), min(ends)
        if rd == 0:
            top = least = _D(1)
        if reads_column(e):
            if typ == "float" and top > FLOAT_MAX:
                raise fail(
                    f"raises to a power that may overflow double precision (up to {_sci(top)}; write "
                    f"POWER(CAST(x AS NUMERIC), r) or clamp with {_CLAMP})"
                )
            if typ == "float" and rd != 0 and least <= FLOAT_ZERO:
                raise fail(
                    "raises to a power that may underflow to 0 in double precision (write "
                    f"POWER(CAST(x AS NUMERIC), r) or clamp with {_CLAMP})"
                )
            limit = NUMERIC_MAX if r.is_integer() else _CTX.power(10, NUMERIC_POWER)
            if typ == "numeric" and top > limit:
                raise fail(f"raises to a power that may overflow NUMERIC (up to {_sci(top)}; clamp with {_CLAMP})")
        odd = r.is_integer() and int(r) % 2 == 1
        return _Value(typ, -top if odd and a.lo < 0 else _D(0), top, a.inf, a.nan, least)

    def cast(self, e: exp.Cast, fail: Callable[[str], _MayFail]) -> _Value | None:
        to = e.to
        a = self(e.this)
        target = _of_type(to)
        if a is None or target is None:
            return target  # text, dates: failure() decides which of those casts may fail
        name = to.sql(dialect="postgres")
        if not reads_column(e):
            return target if a.lo != a.hi else replace(target, lo=a.lo, hi=a.hi, inf=False, nan=False)
        if target.typ == "int":
            if a.nan or a.inf or a.lo - _D("0.5") < target.lo or a.hi + _D("0.5") > target.hi:
                raise fail(
                    f"casts values from {_sci(a.lo)} to {_sci(a.hi)}{' or NaN/Infinity' if a.nan or a.inf else ''} "
                    f"to {name}, out of its range (clamp with {_CLAMP} first, or cast to NUMERIC)"
                )
            lo, hi = a.lo.to_integral_value(decimal.ROUND_FLOOR), a.hi.to_integral_value(decimal.ROUND_CEILING)
            return _Value("int", lo, hi, least=_D(1))
        if target.typ == "numeric" and not target.inf:  # NUMERIC(p, s): |x| rounded to s places below 10^(p−s)
            if a.inf or a.big > target.hi:
                raise fail(
                    f"casts values up to {_sci(a.big)}{' or ±Infinity' if a.inf else ''} to {name}, which holds "
                    f"less than {_sci(target.hi)} (clamp with {_CLAMP} first, or cast to NUMERIC)"
                )
            return _Value("numeric", a.lo, a.hi, False, a.nan, min(a.least, target.least))
        if target.typ == "numeric":
            if a.typ in _FLOATS:  # to 15 significant digits: 1.7976931348623157e308 becomes 1.79769313486232e308
                slack = _D("1e-14")
                return replace(a, typ="numeric", lo=a.lo - abs(a.lo) * slack, hi=a.hi + abs(a.hi) * slack)
            return replace(a, typ="numeric")
        if target.typ == "real" and a.typ == "float":
            if a.big > REAL_MAX or (a.least <= REAL_ZERO and not (a.lo == a.hi == 0)):
                raise fail(
                    f"casts values up to {_sci(a.big)} or near 0 to REAL, which overflows or underflows "
                    "(cast to DOUBLE PRECISION or NUMERIC)"
                )
            return replace(a, typ="real")
        return self.convert(e.this, a, target.typ) if a.typ == "numeric" else replace(a, typ=target.typ)

    def choice(self, e: exp.Expression, fail: Callable[[str], _MayFail]) -> _Value | None:
        """GREATEST, LEAST, COALESCE, NULLIF and CASE: one of their arguments, in their common type (NaN is
        above every number: LEAST(NaN, 1) is 1, GREATEST(NaN, 1) NaN)."""
        if isinstance(e, exp.Case):
            if e.this is not None:
                return None
            args = case_values(e)
        elif isinstance(e, exp.If):
            args = [x for x in (e.args.get("true"), e.args.get("false")) if x is not None]
        elif isinstance(e, exp.Nullif):
            args = [e.this]
        else:
            args = [e.this, *e.expressions]
        pairs = [(x, self(x)) for x in args]
        vals = [v for _, v in pairs if v is not None]
        if not vals:
            return None
        typ = _typ(*vals, choice=True)
        vals = [self.convert(x, v, typ) for x, v in pairs if v is not None]
        least, nan = min(v.least for v in vals), any(v.nan for v in vals)
        # GREATEST and LEAST skip NULLs (GREATEST(NULL, −100) is −100): only an argument that is never NULL, a
        # constant, bounds them from below (GREATEST) or above (LEAST); the others only widen the hull
        lo, hi = min(v.lo for v in vals), max(v.hi for v in vals)
        sure = [v for x, v in pairs if v is not None and constant(x) is not None]
        if isinstance(e, exp.Greatest):
            lo = max([lo, *(v.lo for v in sure)])
        if isinstance(e, exp.Least):
            hi = min([hi, *(v.hi for v in sure)])
        # GREATEST is +Infinity when one argument may be, −Infinity only when all may be; LEAST the reverse
        pos = (all if isinstance(e, exp.Least) else any)(v.pos for v in vals)
        neg = (all if isinstance(e, exp.Greatest) else any)(v.neg for v in vals)
        if isinstance(e, exp.Least):
            nan = all(v.nan for v in vals)
        v = _Value(typ, lo, hi, pos or neg, nan, least, 1 if pos and not neg else -1 if neg and not pos else 0)
        if isinstance(e, exp.Nullif) and constant(e.expression) == 0 and v.least == 0:
            v = replace(v, least=_FLOATS[typ][2] if typ in _FLOATS else _D(0))
        return v


def _sci(x: decimal.Decimal) -> str:
    if x.is_infinite() or x.is_nan():
        return str(x)
    return f"{float(x):g}" if abs(x) < _D("1e300") else f"{'-' if x < 0 else ''}1e{x.adjusted()}"


def value_failure(e: exp.Expression, dom: Domain, *, clamped: bool = False) -> tuple[exp.Expression, str] | None:
    """The first node of ``e`` whose value may leave its type for some value of the columns' types (of their
    declared ranges where ``clamped``), and why; None when none can."""
    values = _Values(dom, clamped)
    with decimal.localcontext(_CTX):
        for node in e.walk():
            try:
                values(node)
            except _MayFail as err:
                return err.node, err.why
    return None
