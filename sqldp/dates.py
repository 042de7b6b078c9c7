"""Constant date arithmetic, folded with PostgreSQL's semantics before the analyses see it.

Analysts write ``o_orderdate < date '1994-01-01' + interval '1' year`` (every dated TPC-H query does). The
sensitivity analyses need the bound as one date: a private filter is a linear form in the columns with
constant terms in days (NR §3.3.8.4), and a year or a month is not a fixed number of days. This module
computes such constants exactly as PostgreSQL does, so the statement that runs means the same as the one
the analyst wrote:

* ``date ± interval`` is ``timestamp ± interval`` (PostgreSQL promotes the date to midnight); the month part
  (years × 12 + months) is added first, the day of month clamped to the length of the resulting month
  (``date '1994-01-31' + interval '1 month'`` is 1994-02-28), then the days (weeks × 7 + days);
  ``d − i`` is ``d + (−i)``. PostgreSQL documents this order under "Date/Time Operators".
* The result is a timestamp at midnight whenever the interval has no time part; compared with a date (or
  with another midnight timestamp), it orders exactly as the date of that midnight does. So a fold happens
  only where the value is an operand of a comparison (``<``, ``<=``, ``>``, ``>=``, ``=``, ``<>``,
  ``BETWEEN``): there the timestamp and the date compare alike, and no output column changes its type.

Anything else (time parts, fractional amounts, forms this module does not read) is left as written; the
analyses then refuse it with their own reason, or PostgreSQL evaluates it in a public statement.
Pure functions of the tree.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re

from sqlglot import exp

_COMPARISONS = (exp.LT, exp.LTE, exp.GT, exp.GTE, exp.EQ, exp.NEQ, exp.Between)

# PostgreSQL's unit spellings for the parts this module folds (its datetime keyword table), in months or days
_MONTH_UNITS = {
    "year": 12, "years": 12, "yr": 12, "yrs": 12, "y": 12,
    "month": 1, "months": 1, "mon": 1, "mons": 1,
}  # fmt: skip
_DAY_UNITS = {"week": 7, "weeks": 7, "w": 7, "day": 1, "days": 1, "d": 1}
_INTEGER = re.compile(r"[+-]?\d{1,9}")


def _literal_date(e: exp.Expr) -> dt.date | None:
    """``DATE 'yyyy-mm-dd'`` / ``CAST('…' AS DATE)`` / ``'…'::date`` as a date, else None."""
    if isinstance(e, exp.Paren):
        return _literal_date(e.this)
    if (
        isinstance(e, exp.Cast)
        and e.to.this == exp.DataType.Type.DATE
        and isinstance(e.this, exp.Literal)
        and e.this.is_string
    ):
        try:
            return dt.date.fromisoformat(e.this.name.strip())
        except ValueError:
            return None
    return None


def _unit_name(unit: exp.Expr) -> str:
    # ``interval '90' day (3)`` parses with the unit as a Day node carrying the precision
    return unit.key if not isinstance(unit, exp.Var) else unit.name


def interval_parts(node: exp.Interval) -> tuple[int, int] | None:
    """(months, days) of an interval literal with no time part, or None when it is not one this module
    reads: ``interval '1' year``, ``interval '90' day``, ``interval '3 months'``, ``interval '1 year 2 mons
    3 days'`` — integer amounts only."""
    if not isinstance(node.this, exp.Literal):
        return None
    text = node.this.name.strip().lower()
    unit = node.args.get("unit")
    if unit is not None:
        # sqlglot moves a single unit out of the text (``interval '3 months'`` arrives as '3' with unit MONTHS),
        # so the spellings of both forms are accepted here
        name = _unit_name(unit).lower()
        if not _INTEGER.fullmatch(text):
            return None
        amount = int(text)
        if name in _MONTH_UNITS:
            return amount * _MONTH_UNITS[name], 0
        if name in _DAY_UNITS:
            return 0, amount * _DAY_UNITS[name]
        return None
    tokens = re.findall(r"[+-]?\d+|[a-z]+", text)
    if not tokens or len(tokens) % 2 or "".join(tokens) != text.replace(" ", ""):
        return None
    months = days = 0
    for amount_text, name in zip(tokens[::2], tokens[1::2], strict=True):
        if not _INTEGER.fullmatch(amount_text):
            return None
        amount = int(amount_text)
        if name in _MONTH_UNITS:
            months += amount * _MONTH_UNITS[name]
        elif name in _DAY_UNITS:
            days += amount * _DAY_UNITS[name]
        else:
            return None
    return months, days


def add_interval(day: dt.date, months: int, days: int) -> dt.date | None:
    """PostgreSQL's ``date + interval`` for an interval of months and days: the months first, the day of
    month clamped to the new month's length, then the days. None when the result leaves the range Python's
    dates cover (PostgreSQL's is wider; the expression is then left for PostgreSQL)."""
    index = day.year * 12 + (day.month - 1) + months
    year, month = divmod(index, 12)
    if not 1 <= year <= 9999:
        return None
    clamped = min(day.day, calendar.monthrange(year, month + 1)[1])
    try:
        return dt.date(year, month + 1, clamped) + dt.timedelta(days=days)
    except OverflowError:
        return None


def _fold(e: exp.Expr) -> dt.date | None:
    """The date a constant ``date ± interval ± …`` evaluates to, or None."""
    if isinstance(e, exp.Paren):
        return _fold(e.this)
    if isinstance(e, (exp.Add, exp.Sub)) and isinstance(e.expression, exp.Interval):
        base = _literal_date(e.this) or _fold(e.this)
        parts = interval_parts(e.expression)
        if base is None or parts is None:
            return None
        sign = 1 if isinstance(e, exp.Add) else -1
        return add_interval(base, sign * parts[0], sign * parts[1])
    if isinstance(e, exp.Add) and isinstance(e.this, exp.Interval):  # interval + date
        return _fold(exp.Add(this=e.expression, expression=e.this))
    return None


def fold_date_arithmetic(tree: exp.Expr) -> exp.Expr:
    """``tree`` with every constant ``date ± interval`` that is an operand of a comparison replaced by the
    date literal PostgreSQL would compute (see the module docstring). Returns a new tree."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.Add, exp.Sub)) and isinstance(node.parent, _COMPARISONS):
            folded = _fold(node)
            if folded is not None:
                return exp.cast(exp.Literal.string(folded.isoformat()), exp.DataType.Type.DATE)
        return node

    return tree.copy().transform(rewrite, copy=False)
