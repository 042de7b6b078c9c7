"""Where PostgreSQL's arithmetic leaves the real numbers: integer division and rounding casts.

The analyses treat an expression as the real function its operators name (NR §3.3.8 differentiates it;
:mod:`sqldp.sensitivity.intervals` bounds it). Two operators of PostgreSQL are steps instead: ``a / b`` of two
integers truncates towards zero (7 / 2 = 3, −7 / 2 = −3), and a cast to an integer type or to a NUMERIC with a
scale rounds. Over a value-sensitive column a step has no derivative bound (a change of 0.01 can move it by
1), and read as real division it is not even the function PostgreSQL computes (``1 − a / 2`` is 1 at a = 1,
not 0.5). The analyses ask this module where the steps are (the ``step`` rules of
:mod:`sqldp.sensitivity.operators`): intervals bound them as steps, the value-level analysis refuses those that
read sensitive columns.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sqldp.form import ColumnRef

KindOf = Callable[[ColumnRef], str]  # the catalog's kind of a column: "integer", "numeric", "date", …

_INTEGER_TYPES = exp.DataType.INTEGER_TYPES
_REAL_TYPES = {exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT, exp.DataType.Type.DECIMAL}


def reads_column(e: exp.Expr) -> bool:
    return any(c.table for c in e.find_all(exp.Column))


def case_values(e: exp.Case) -> list[exp.Expr]:
    """The values a searched CASE takes: its THEN branches and its ELSE, if written (else NULL)."""
    default = e.args.get("default")
    return [i.args["true"] for i in e.args.get("ifs", [])] + ([default] if default is not None else [])


def integer_valued(e: exp.Expr, kind_of: KindOf) -> bool:
    """Whether PostgreSQL gives ``e`` an integer type (so that ``e / k`` truncates), by its typing rules:
    integer columns and literals, LENGTH and POSITION, closed under + − × %, integer division, ABS,
    GREATEST/LEAST/COALESCE, NULLIF, CASE and casts to an integer type."""
    if isinstance(e, (exp.Paren, exp.Neg, exp.Abs)):
        return integer_valued(e.this, kind_of)
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "integer"
    if isinstance(e, exp.Literal):
        return not e.is_string and e.this.isdigit()
    if isinstance(e, exp.Cast):
        return e.to.is_type(*_INTEGER_TYPES)
    if isinstance(e, (exp.Length, exp.StrPosition)):  # INTEGER in PostgreSQL: LENGTH(s) / 2 truncates
        return True
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Mod, exp.Div)):
        return integer_valued(e.this, kind_of) and integer_valued(e.expression, kind_of)
    if isinstance(e, (exp.Greatest, exp.Least, exp.Coalesce)):
        return all(integer_valued(x, kind_of) for x in [e.this, *e.expressions])
    if isinstance(e, exp.Nullif):  # NULLIF(a, 0) has a's type: 7 / NULLIF(t.a, 0) truncates
        return integer_valued(e.this, kind_of)
    if isinstance(e, exp.Case) and e.this is None:
        return all(integer_valued(b, kind_of) for b in case_values(e))
    return False


def truncates(e: exp.Expr, kind_of: KindOf) -> bool:
    """``e`` is ``a / b`` of two integers: PostgreSQL's integer division, truncating towards zero."""
    return isinstance(e, exp.Div) and integer_valued(e.this, kind_of) and integer_valued(e.expression, kind_of)


def keeps_value(to: exp.DataType) -> bool:
    """A cast to DOUBLE PRECISION, REAL (to 24 bits) or unconstrained NUMERIC keeps a number's value; one to
    an integer type or to NUMERIC(p) / NUMERIC(p, s) rounds it."""
    return to.this in _REAL_TYPES and not to.expressions


def rounds(e: exp.Expr, kind_of: KindOf) -> bool:
    """``e`` is a cast that rounds a value which may not be an integer."""
    return isinstance(e, exp.Cast) and not keeps_value(e.to) and not integer_valued(e.this, kind_of)
