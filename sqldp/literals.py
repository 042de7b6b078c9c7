"""Untyped literals resolved as PostgreSQL resolves them, before any analysis sees them.

PostgreSQL gives a quoted literal no type of its own ("unknown"): in ``o_orderdate < '1995-01-01'`` or
``o_totalprice > '1000'`` it takes the type of the other operand (PostgreSQL's documentation, "Type
Conversion", §10.2 "Operators": "If one argument of a binary operator invocation is of the unknown type, then
assume it is the same type as the other argument for this check"; BETWEEN and IN are comparisons of their
left side with each bound or element). Clients bind parameters so: pg8000 and SQLAlchemy with pg8000 inline
them as quoted literals, psycopg sends a ``str`` untyped, and the proxy binds an untyped parameter as a quoted
literal. The analyses read a number or a ``date '…'`` (a private filter is a linear form in the columns,
NR §3.3.8.4), so such a literal is rewritten here, on the qualified tree, into the typed form PostgreSQL
resolves it to:

* against an integer (SMALLINT, INTEGER, BIGINT): the number when the text is a plain integer in the type's
  range; otherwise ``CAST('…' AS type)``, which PostgreSQL evaluates (or refuses: ``'1.5'`` is no integer) as
  it would have the literal;
* against NUMERIC: the number when the text is a plain decimal (the type's modifier does not apply: PostgreSQL
  resolves to ``numeric`` without it, so ``'1000.555'`` stays 1000.555 beside a NUMERIC(15, 2) column);
  otherwise ``CAST('…' AS NUMERIC)`` (``'NaN'``);
* against DATE, TIMESTAMP[TZ], DOUBLE PRECISION, REAL: ``CAST('…' AS type)``, exactly what PostgreSQL does.

A number in place of the cast is equivalent because the comparison's result is a boolean whatever the type
of its operands: ``numeric_col > 1000`` and ``numeric_col > '1000'::numeric`` are true for the same rows. For
the same reason an explicit ``CAST('1000.5' AS NUMERIC)`` (or to an integer type, or NUMERIC(p, s), rounded as
PostgreSQL rounds) that is itself an operand of a comparison becomes the number. A constant
``MAKE_DATE(y, m, d)`` of a valid date becomes ``CAST('yyyy-mm-dd' AS DATE)`` wherever it is (the same type and
value, and it can no longer fail). A comparison with an untyped ``NULL`` (a parameter bound as NULL while a
client describes a statement) is NULL — PostgreSQL's comparison operators are strict — and becomes ``CAST(NULL
AS BOOLEAN)``. Anything else is left as written: the analyses refuse it with their reason, or PostgreSQL
evaluates it in a statement over exact data. The types come from the catalog (a column of a table, or of a
derived table that passes one through) and the cast or arithmetic around it; nothing reads the data.
"""

from __future__ import annotations

import datetime as dt
import re
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from sqlglot import exp
from sqlglot.errors import ParseError
from sqlglot.optimizer.scope import Scope, traverse_scope

from sqldp.catalog import Catalog

T = exp.DataType.Type
_COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
_INTEGERS = {T.SMALLINT: 15, T.INT: 31, T.BIGINT: 63}  # bits beside the sign
_CAST_TO = {T.DATE, T.TIMESTAMP, T.TIMESTAMPTZ, T.DOUBLE, T.FLOAT}  # sqlglot's FLOAT is PostgreSQL's REAL
_INTEGER_TEXT = re.compile(r"\s*([+-]?)(\d+)\s*")
_DECIMAL_TEXT = re.compile(r"\s*([+-]?)((?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)\s*")


def resolve(tree: exp.Expr, catalog: Catalog) -> exp.Expr:
    """``tree`` (qualified, changed in place and returned) with the literals above resolved."""
    for call in list(tree.find_all(exp.Anonymous)):
        folded = _make_date(call)
        if folded is not None:
            call.replace(folded)
    changes: list[tuple[exp.Expr, exp.Expr]] = []
    for scope in traverse_scope(tree):
        for node in scope.walk():
            if isinstance(node, _COMPARISONS):
                changes += _comparison(node, scope, catalog)
            elif isinstance(node, exp.Between):
                changes += _against(node.this, (node.args["low"], node.args["high"]), scope, catalog)
            elif isinstance(node, exp.In) and node.expressions and not node.args.get("query"):
                changes += _against(node.this, tuple(node.expressions), scope, catalog)
    for old, new in changes:
        if new.meta.get("start") is None and old.meta.get("start") is not None:
            new.meta.update(old.meta)  # a refusal about the new node points where the literal was written
        old.replace(new)
    return tree


def _comparison(node: exp.Expr, scope: Scope, catalog: Catalog) -> list[tuple[exp.Expr, exp.Expr]]:
    left, right = node.this, node.expression
    if _untyped_null(left) or _untyped_null(right):
        return [(node, exp.cast(exp.null(), T.BOOLEAN))]
    for null, other in ((left, right), (right, left)):
        # a typed NULL (a parameter of a declared type, bound as NULL while a client describes): NULL too, where
        # PostgreSQL has the operator for the two types; elsewhere its error stays PostgreSQL's
        inner = null.unnest()
        if isinstance(inner, exp.Cast) and isinstance(inner.this, exp.Null):
            kind = _type(other, scope, catalog)
            if kind is not None and _family(kind.this) is not None and _family(kind.this) == _family(inner.to.this):
                return [(node, exp.cast(exp.null(), T.BOOLEAN))]
    return [*_against(left, (right,), scope, catalog), *_against(right, (left,), scope, catalog)]


# types PostgreSQL compares with one another (its numeric, datetime and string categories)
_FAMILIES = (
    frozenset({*_INTEGERS, T.DECIMAL, T.DOUBLE, T.FLOAT}),
    frozenset({T.DATE, T.TIMESTAMP, T.TIMESTAMPTZ}),
    frozenset({T.TEXT, T.VARCHAR, T.CHAR, T.BPCHAR}),
)


def _family(kind: exp.DType) -> int | None:
    return next((i for i, family in enumerate(_FAMILIES) if kind in family), None)


def _against(
    typed: exp.Expr, others: tuple[exp.Expr, ...], scope: Scope, catalog: Catalog
) -> list[tuple[exp.Expr, exp.Expr]]:
    """Replacements for the string literals and literal casts among ``others``, compared with ``typed``."""
    out: list[tuple[exp.Expr, exp.Expr]] = []
    kind: exp.DataType | None = None
    for other in others:
        inner = other.unnest()
        if isinstance(inner, exp.Cast) and isinstance(inner.this, exp.Literal) and inner.this.is_string:
            number = _number(inner.this.name, inner.to)
            if number is not None:
                out.append((inner, number))
            continue
        if not (isinstance(inner, exp.Literal) and inner.is_string):
            continue
        if kind is None:
            kind = _type(typed, scope, catalog)
        if kind is None:
            return out
        if kind.this in _INTEGERS or kind.this == T.DECIMAL:
            base = exp.DataType.build(kind.this)
            out.append((inner, _number(inner.name, base) or exp.cast(inner.copy(), base)))
        elif kind.this in _CAST_TO:
            out.append((inner, exp.cast(inner.copy(), exp.DataType.build(kind.this))))
    return out


def _untyped_null(e: exp.Expr) -> bool:
    return isinstance(e.unnest(), exp.Null)


def _number(text: str, to: exp.DataType) -> exp.Expr | None:
    """The number PostgreSQL reads ``text`` as in type ``to`` (an integer type or NUMERIC[(p, s)]), written
    as a literal; None when it is no plain number of the type (PostgreSQL's cast then decides)."""
    if to.this in _INTEGERS:
        m = _INTEGER_TEXT.fullmatch(text)
        if m is None or to.expressions:
            return None
        value = int(m.group(1) + m.group(2))
        bits = _INTEGERS[to.this]
        return _literal(str(value)) if -(2**bits) <= value < 2**bits else None
    if to.this != T.DECIMAL:
        return None
    m = _DECIMAL_TEXT.fullmatch(text)
    if m is None:
        return None
    digits = m.group(1) + m.group(2)
    params = [p.this for p in to.expressions]
    if not params:
        return _literal(digits)
    if len(params) > 2 or not all(isinstance(p, exp.Literal) and p.is_int for p in params):
        return None
    precision, scale = int(params[0].name), int(params[1].name) if len(params) == 2 else 0
    try:
        # NUMERIC(p, s) rounds half away from zero to s digits and refuses a value of more than p − s
        # integer digits (numeric_in, apply_typmod)
        rounded = Decimal(digits).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    except InvalidOperation:
        return None
    if not 0 <= scale <= precision or (rounded != 0 and rounded.adjusted() >= precision - scale):
        return None
    return _literal(format(rounded, "f"))


def _literal(text: str) -> exp.Expr:
    """A number literal as sqlglot's parser builds it (a negative one under a unary minus)."""
    return exp.Neg(this=exp.Literal.number(text[1:])) if text.startswith("-") else exp.Literal.number(text.lstrip("+"))


def _make_date(node: exp.Anonymous) -> exp.Expr | None:
    if str(node.this).lower() != "make_date" or len(node.expressions) != 3:
        return None
    parts = [_integer(a) for a in node.expressions]
    if any(p is None for p in parts):
        return None
    year, month, day = (p for p in parts if p is not None)
    if not 1 <= year <= 9999:  # PostgreSQL: year 0 is an error, negative years are BC
        return None
    try:
        date = dt.date(year, month, day)
    except ValueError:  # out of range: PostgreSQL's error, left for the analyses to refuse
        return None
    return exp.cast(exp.Literal.string(date.isoformat()), T.DATE)


def _integer(e: exp.Expr) -> int | None:
    e = e.unnest()
    if isinstance(e, exp.Neg):
        inner = _integer(e.this)
        return None if inner is None else -inner
    if isinstance(e, exp.Literal) and not e.is_string and e.is_int:
        return int(e.name)
    return None


def _type(e: exp.Expr, scope: Scope, catalog: Catalog) -> exp.DataType | None:
    """The type PostgreSQL gives ``e``, for the forms whose type the catalog decides: a column (of a table, or
    passed through a derived table or CTE), a cast, a number, and +, −, ×, / over them; None otherwise."""
    e = e.unnest()
    if isinstance(e, exp.Cast):
        return e.to
    if isinstance(e, exp.Literal) and not e.is_string:
        if not e.is_int:
            return exp.DataType.build(T.DECIMAL)
        return exp.DataType.build(T.INT if -(2**31) <= int(e.name) < 2**31 else T.BIGINT)
    if isinstance(e, exp.Neg):
        return _type(e.this, scope, catalog)
    if isinstance(e, exp.Column) and e.table:
        return _column_type(e, scope, catalog)
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        a, b = _type(e.this, scope, catalog), _type(e.expression, scope, catalog)
        return None if a is None or b is None else _arithmetic(type(e), a.this, b.this)
    return None


def _arithmetic(op: type[exp.Expr], a: exp.DType, b: exp.DType) -> exp.DataType | None:
    """The result type of PostgreSQL's operator for these operand types (the cases above), None otherwise."""
    if a in _INTEGERS and b in _INTEGERS:
        return exp.DataType.build(a if _INTEGERS[a] >= _INTEGERS[b] else b)
    if {a, b} <= {*_INTEGERS, T.DECIMAL}:
        return exp.DataType.build(T.DECIMAL)
    if op in (exp.Add, exp.Sub) and a == T.DATE and b in _INTEGERS:  # date ± integer days
        return exp.DataType.build(T.DATE)
    if op is exp.Add and b == T.DATE and a in _INTEGERS:
        return exp.DataType.build(T.DATE)
    if op is exp.Sub and a == b == T.DATE:  # the days between
        return exp.DataType.build(T.INT)
    return None


def _column_type(col: exp.Column, scope: Scope, catalog: Catalog) -> exp.DataType | None:
    found: Scope | None = scope
    while found is not None and col.table not in found.sources:  # a correlated column: an enclosing query's
        found = found.parent
    if found is None:
        return None
    source = found.sources[col.table]
    if isinstance(source, exp.Table):
        table = catalog.tables.get(source.name.lower())
        column = table.columns.get(col.name) if table is not None else None
        if column is None:
            return None
        try:
            return exp.DataType.build(column.type_sql, dialect="postgres")
        except (ParseError, ValueError):  # a type name sqlglot does not read: PostgreSQL resolves it
            return None
    if isinstance(source, Scope) and isinstance(source.expression, exp.Select):
        for item in source.expression.selects:
            if item.alias_or_name == col.name:
                return _type(item.unalias(), source, catalog)
    return None
