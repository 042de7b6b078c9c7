"""Where PostgreSQL may fail on the data: an error is an answer too.

The statements sqldp runs for a private answer read private data. If PostgreSQL can fail on some values — a
division by zero, SQRT or LN of a negative number, a fractional power of one, a text that is not a number
— then whether the noisy answer or an error comes back tells the analyst something about the data, without
noise (``SELECT COUNT(*) FROM t WHERE 1 / t.a > 0`` fails exactly when some row has a = 0). sqldp refuses
such expressions before any query runs, wherever they read a column: in the WHERE (public and private
conjuncts alike: PostgreSQL may evaluate a conjunct on public rows only after a join with private ones),
in GROUP BY keys and in aggregate arguments. A function reading a column must be in the operator table
(:mod:`sqldp.sensitivity.operators`), whose ``fails`` rules say where PostgreSQL fails, so that an unknown one is
refused, not trusted. A divisor is safe when it is a non-zero constant or written ``NULLIF(x, 0)`` (x / NULL
is NULL, which WHERE treats as false and aggregates skip); SQRT and fractional powers when their argument is
non-negative by its form (ABS, squares, norms, EXP, sums and products of those). The row-level SUM bounds its
own argument (:mod:`sqldp.sensitivity.intervals` clamps its columns to their declared ranges and refuses
divisors, roots and powers whose range reaches 0 or below, and any node it does not know).

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
from dataclasses import replace

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, ColumnRef
from sqldp.pg_arithmetic import KindOf, case_values, reads_column
from sqldp.sensitivity import operators
from sqldp.sensitivity.intervals import Domain, constant
from sqldp.sensitivity.operators import Fail, FailureContext
from sqldp.sensitivity.representations import Value


def failure(node: exp.Expr, kind_of: KindOf) -> str | None:
    """Why PostgreSQL may fail on ``node`` for some value of the columns it reads, or None: the ``fails`` rule
    of its operator (:mod:`sqldp.sensitivity.operators`). A function reading a column must be in that table,
    so that an unknown one is refused, not trusted."""
    if not reads_column(node):
        return None
    op = operators.lookup(node)
    if op is None:
        if isinstance(node, exp.Func):
            return "calls a function sqldp does not know to be defined for every value of its arguments"
        return None
    return None if op.fails is None else op.fails(FailureContext(kind_of, constant), node)


EXP_CAP = 300.0  # e^300 ≈ 1.9e130: a product with any value below 1e178 stays a double


def cap_exponentials(e: exp.Expr) -> exp.Expr:
    """``e`` with each EXP(g) written EXP(LEAST(g, 300)) (a copy). The value-level analysis does not clamp the
    data, so EXP of a large value (or its product with one) would overflow double precision and fail: an
    error for the data. The capped function is what is analysed and run; it is at most e^g, its derivative
    at most e^g's (0 beyond the cap), so NR Table 10's bounds cover it (expressions.py takes
    |LEAST(g, c)| ≤ |g| for c ≥ 0), and it differs from e^g only above e^300."""

    def cap(node: exp.Expr) -> exp.Expr:
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
    parts: list[tuple[str, exp.Expr, bool]] = [("WHERE", c.expr, False) for c in form.conjuncts]
    parts += [("GROUP BY", g, False) for g in form.group_by]
    for agg in form.aggregates:
        if agg.arg is None:
            continue
        if bounded_sum and agg.kind == "sum":
            parts.append((agg.sql, agg.arg, True))
        else:
            parts.append((agg.sql, agg.arg if bounded_sum else cap_exponentials(agg.arg), False))
    for where, e, clamped in parts:
        for node in e.find_all(exp.Expr):
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


def _refusal(node: exp.Expr, where: str, why: str) -> RefusedError:
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

    def __init__(self, node: exp.Expr, why: str) -> None:
        super().__init__(why)
        self.node, self.why = node, why


def _of_type(t: exp.DataType) -> Value | None:
    if t.this in _INT_TYPES:
        lo, hi = _INT_TYPES[t.this]
        return Value("int", lo, hi, least=_D(1))
    if t.this == _T.DOUBLE:
        return Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)
    if t.this == _T.FLOAT:  # REAL
        return Value("real", -REAL_MAX, REAL_MAX, inf=True, nan=True, least=REAL_LEAST)
    if t.this == _T.MONEY:  # a BIGINT count of cents: its arithmetic leaves the type where BIGINT's does
        return Value("int", INT8[0], INT8[1], least=_D(1))
    if t.this == _T.DECIMAL:
        if t.expressions:
            p = int(t.expressions[0].sql())
            s = int(t.expressions[1].sql()) if len(t.expressions) > 1 else 0
            top = _CTX.power(10, p - s) - _CTX.power(10, -s)
            return Value("numeric", -top, top, nan=True, least=_CTX.power(10, -s))
        return Value("numeric", -NUMERIC_TOP, NUMERIC_TOP, inf=True, nan=True)
    return None


def _typ(*vs: Value, choice: bool = False) -> str:
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
        self.memo: dict[int, Value | None] = {}

    def column(self, e: exp.Column) -> Value | None:
        ref = ColumnRef(e.table, e.name)
        if self.dom.kind(ref) not in _NUMBER_KINDS:
            return None
        if self.dom.type is not None:
            v = _of_type(exp.DataType.build(self.dom.type(ref), dialect="postgres"))
        else:
            v = _of_type(exp.DataType.build("BIGINT" if self.dom.kind(ref) == "integer" else "NUMERIC"))
        if v is None:  # a number kind of a type not listed above: any value
            v = Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)
        r = self.dom.range(ref) if self.clamped else None
        if r is not None:  # the row-level SUM clamps the column (NaN too: NaN > hi) into its declared range
            lo, hi = _D(repr(float(r[0]))), _D(repr(float(r[1])))
            least = v.least if lo <= 0 <= hi else min(abs(lo), abs(hi))
            v = Value(v.typ, lo, hi, least=least)
        return v

    def __call__(self, e: exp.Expr) -> Value | None:
        key = id(e)
        if key not in self.memo:
            self.memo[key] = self._value(e)
        return self.memo[key]

    def _value(self, e: exp.Expr) -> Value | None:
        def fail(why: str) -> _MayFail:
            return _MayFail(e, why)

        if isinstance(e, exp.Paren):
            return self(e.this)
        if isinstance(e, exp.Literal):
            if e.is_string:
                return None
            v = _D(e.this)
            typ = "int" if e.this.isdigit() and v <= INT8[1] else "numeric"
            return Value(typ, v, v, least=abs(v))
        if isinstance(e, exp.Column):
            return self.column(e) if e.table else None
        op = operators.lookup(e)
        if op is not None and op.value is not None:
            return op.value(self, e, fail)
        if isinstance(e, (exp.Condition, exp.Func)) and not isinstance(e, exp.Anonymous):
            return None  # comparisons, connectives, text and date functions: not a number (checked on their own)
        # a node of unknown type: any number (its parents are then checked against the widest values)
        return Value("float", -FLOAT_MAX, FLOAT_MAX, inf=True, nan=True, least=FLOAT_LEAST)

    def negation(self, e: exp.Expr, fail: Fail) -> Value | None:
        a = self(e.this)
        if a is None:
            return None
        if a.typ == "int" and a.lo < -INT8[1]:
            raise fail("negates a BIGINT that may be −2^63, out of range (write CAST(x AS NUMERIC))")
        return replace(a, lo=-a.hi, hi=-a.lo, sided=-a.sided)

    def absolute(self, e: exp.Expr, fail: Fail) -> Value | None:
        a = self(e.this)
        if a is None:
            return None
        if a.typ == "int" and a.lo < -INT8[1]:
            raise fail("takes ABS of a BIGINT that may be −2^63, out of range (write ABS(CAST(x AS NUMERIC)))")
        lo = _D(0) if a.lo <= 0 <= a.hi else min(abs(a.lo), abs(a.hi))
        return replace(a, lo=lo, hi=a.big)

    def root(self, e: exp.Expr, fail: Fail) -> Value | None:
        a = self(e.this)
        if a is None:
            return None
        typ = "numeric" if a.typ == "numeric" else "float"
        lo, hi = (_CTX.sqrt(max(x, _D(0))) for x in (a.lo, a.hi))
        return Value(typ, lo, hi, a.inf, a.nan, _CTX.sqrt(a.least))

    def rounding(self, e: exp.Expr, fail: Fail) -> Value | None:
        """ROUND, FLOOR, CEIL: within 1 of the argument."""
        a = self(e.this)
        if a is None:
            return None
        typ = "numeric" if e.args.get("decimals") is not None else "float" if a.typ == "int" else a.typ
        return Value(typ, a.lo - 1, a.hi + 1, a.inf, a.nan)

    def position(self, e: exp.Expr, fail: Fail) -> Value | None:
        """LENGTH and POSITION: an INTEGER count of characters."""
        return Value("int", _D(0), _D(2**31 - 1))

    def field(self, e: exp.Expr, fail: Fail) -> Value | None:
        """EXTRACT: a NUMERIC field of a date or time (±Infinity of 'infinity')."""
        return Value("numeric", -_D("1e15"), _D("1e15"), inf=True, nan=True)

    def convert(self, x: exp.Expr, v: Value, typ: str) -> Value:
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

    def arithmetic(self, e: exp.Expr, fail: Fail) -> Value | None:
        a, b = self(e.this), self(e.expression)
        if a is None or b is None:
            return None  # date or text operands: failure() refuses those that read a column
        typ = _typ(a, b)
        a, b = self.convert(e.this, a, typ), self.convert(e.expression, b, typ)
        nan, inf = a.nan or b.nan or a.inf or b.inf, a.inf or b.inf
        if isinstance(e, (exp.Add, exp.Sub)):
            lo, hi = (a.lo + b.lo, a.hi + b.hi) if isinstance(e, exp.Add) else (a.lo - b.hi, a.hi - b.lo)
            least = _FLOATS[typ][2] if typ in _FLOATS else min(a.least, b.least)
            v = Value(typ, lo, hi, inf, nan, least)
        elif isinstance(e, exp.Mul):
            ends = [x * y for x in (a.lo, a.hi) for y in (b.lo, b.hi)]
            v = Value(typ, min(ends), max(ends), inf, nan, a.least * b.least)
        elif isinstance(e, exp.Div):
            if b.lo == b.hi == 0:
                return Value(typ, _D(0), _D(0), inf, True)  # x / 0: refused as a divisor above, or a constant
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
            v = Value(typ, lo, hi, inf, True, least)
        else:  # % takes the dividend's sign and is smaller than both (PostgreSQL answers 0 for −2^63 % −1)
            top = min(a.big, b.big)
            v = Value(typ, -top, top, inf, nan, _D(1) if typ == "int" else _D(0))
        if not reads_column(e):
            return v
        names: dict[type[exp.Expr], str] = {
            exp.Add: "a sum",
            exp.Sub: "a difference",
            exp.Mul: "a product",
            exp.Div: "a quotient",
        }
        what = names.get(type(e), "a remainder")
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

    def exponential(self, e: exp.Expr, fail: Fail) -> Value | None:
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
            return Value(
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
        return Value("float", _CTX.exp(lo), _CTX.exp(hi), a.inf, a.nan, _CTX.exp(lo))

    def power(self, e: exp.Expr, fail: Fail) -> Value | None:
        a, k = self(e.this), self(e.expression)
        if a is None or k is None:
            return None
        r = constant(e.expression)
        r = None if r is None else float(r)
        typ = "numeric" if "numeric" in {a.typ, k.typ} and not {a.typ, k.typ} & set(_FLOATS) else "float"
        if r is None:  # an exponent read from the data: refused by failure()
            return Value(typ, -_INF, _INF, True, True)
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
        return Value(typ, -top if odd and a.lo < 0 else _D(0), top, a.inf, a.nan, least)

    def cast(self, e: exp.Expr, fail: Fail) -> Value | None:
        assert isinstance(e, exp.Cast)
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
            return Value("int", lo, hi, least=_D(1))
        if target.typ == "numeric" and not target.inf:  # NUMERIC(p, s): |x| rounded to s places below 10^(p−s)
            if a.inf or a.big > target.hi:
                raise fail(
                    f"casts values up to {_sci(a.big)}{' or ±Infinity' if a.inf else ''} to {name}, which holds "
                    f"less than {_sci(target.hi)} (clamp with {_CLAMP} first, or cast to NUMERIC)"
                )
            return Value("numeric", a.lo, a.hi, False, a.nan, min(a.least, target.least))
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

    def choice(self, e: exp.Expr, fail: Fail) -> Value | None:
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
        v = Value(typ, lo, hi, pos or neg, nan, least, 1 if pos and not neg else -1 if neg and not pos else 0)
        if isinstance(e, exp.Nullif) and constant(e.expression) == 0 and v.least == 0:
            v = replace(v, least=_FLOATS[typ][2] if typ in _FLOATS else _D(0))
        return v


def _sci(x: decimal.Decimal) -> str:
    if x.is_infinite() or x.is_nan():
        return str(x)
    return f"{float(x):g}" if abs(x) < _D("1e300") else f"{'-' if x < 0 else ''}1e{x.adjusted()}"


def value_failure(e: exp.Expr, dom: Domain, *, clamped: bool = False) -> tuple[exp.Expr, str] | None:
    """The first node of ``e`` whose value may leave its type for some value of the columns' types (of their
    declared ranges where ``clamped``), and why; None when none can."""
    values = _Values(dom, clamped)
    with decimal.localcontext(_CTX):
        for node in e.find_all(exp.Expr):
            try:
                values(node)
            except _MayFail as err:
                return err.node, err.why
    return None
