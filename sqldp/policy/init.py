"""A first policy file written from the catalog (``sqldp policy init``): what the schema itself proves.

Nothing here reads data. Each declaration is a fact of the catalog, and the file says which one in a ``#``
comment beside it, so the data owner can judge (and tighten) every line:

* a column's type bounds its values: SMALLINT, INTEGER and BIGINT their two's-complement ranges, NUMERIC(p, s)
  ``|x| ≤ 10^(p−s) − 10^(−s)`` (p digits, s after the point), BOOLEAN the domain ``[false, true]``, an enum
  type its labels (a domain);
* a one-column CHECK constraint bounds them further: the conjuncts it is made of that compare the column with
  constants (``BETWEEN``, ``=``, ``<``, ``<=``, ``>``, ``>=``) give a range, ``IN (…)``, ``= ANY (ARRAY[…])`` and
  ``OR`` of equalities a domain. A CHECK ``A AND B`` implies each of A and B, so a conjunct of another form is
  skipped without losing the others; an ``OR`` is used only when every branch is understood. A CHECK lets NULL
  through: the range and domain are of the non-NULL values, as every declared range is;
* an integer column whose range holds at most :data:`SMALL_DOMAIN` integers has exactly those values: a domain
  (GROUP BY answers them all, docs/policy.md "Groups");
* a composite primary key (k, c₁, …) whose other columns take at most τ values together has at most τ rows per
  value of k: ``max_rows_per = { k = τ }`` (docs/truncation.md), when τ ≤ :data:`MAX_TAU`.

Which tables are private is the data owner's word alone (``--private``); every other table is written public.
A declared range is a clamp (docs/policy.md, "Ranges the database enforces"), so a range the data broke would
bias an answer, never its privacy; the ranges written here come from constraints the database checks on every
row (read with ``--dsn``) or that the DDL file claims (``--schema``), and the comment says which.

Pure: the catalog in, the TOML text out (:func:`propose`).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp.catalog import Catalog, Column, ForeignKey, Table
from sqldp.policy.tables import MAX_DOMAIN
from sqldp.policy.values import MAX_BOUND

SMALL_DOMAIN = 100  # an integer range of at most this many values is also written as the column's domain
# τ of a derived max_rows_per: the model-checking analysis proves bounds up to 64 rows (sqldp/policy/tables.py's
# MAX_ROWS_PER comment), so a larger τ would never give a finite bound
MAX_TAU = 64
COMMENT_COLUMN = 48  # where the comments beside the values start

Value = int | Decimal | dt.date | str | bool

_INTEGER_RANGES = {
    "SMALLINT": (-(2**15), 2**15 - 1),
    "INT": (-(2**31), 2**31 - 1),
    "BIGINT": (-(2**63), 2**63 - 1),
}
_INTEGER_NAMES = {
    "INT2": "SMALLINT",
    "SMALLSERIAL": "SMALLINT",
    "SMALLINT": "SMALLINT",
    "INT4": "INT",
    "INT": "INT",
    "INTEGER": "INT",
    "SERIAL": "INT",
    "INT8": "BIGINT",
    "BIGINT": "BIGINT",
    "BIGSERIAL": "BIGINT",
}
_TEXT_TYPES = {exp.DataType.Type.TEXT, exp.DataType.Type.VARCHAR, exp.DataType.Type.CHAR, exp.DataType.Type.BPCHAR}


@dataclass(frozen=True)
class Facts:
    """What the catalog proves about one column's non-NULL values: a closed range and a finite set of values,
    each with the reason (a comment for the file)."""

    low: Value | None = None
    high: Value | None = None
    range_why: str = ""
    values: tuple[Value, ...] | None = None
    values_why: str = ""


@dataclass
class Estimates:
    """The released declarations, ready for :func:`propose`, and the section's text (made by
    :mod:`sqldp.policy.estimated`, kept here so that this module does not import it)."""

    facts: dict[tuple[str, str], Facts] = field(default_factory=dict)
    rows_per: dict[str, tuple[str, int, str]] = field(default_factory=dict)
    section: list[str] = field(default_factory=list)


# -- what a type proves ---------------------------------------------------------------------------


def numeric_precision(type_sql: str) -> tuple[int, int] | None:
    """(p, s) of ``NUMERIC(p, s)``, ``DECIMAL(p)`` (s = 0); None for an unconstrained NUMERIC or another type."""
    m = re.fullmatch(r"\s*(?:NUMERIC|DECIMAL)\s*\(\s*(\d+)\s*(?:,\s*(-?\d+)\s*)?\)\s*", type_sql, re.IGNORECASE)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def type_facts(column: Column) -> Facts:
    """The range or domain the column's type alone proves."""
    head = column.type_sql.upper().split("(")[0].strip()
    if column.labels is not None:
        return Facts(values=column.labels, values_why=f"enum type {column.type_sql.lower()}: its labels")
    if column.kind == "boolean":
        return Facts(values=(False, True), values_why="BOOLEAN: false or true")
    if column.kind == "integer" and head in _INTEGER_NAMES:
        name = _INTEGER_NAMES[head]
        lo, hi = _INTEGER_RANGES[name]
        return Facts(lo, hi, f"{name if name != 'INT' else 'INTEGER'}: the type's range")
    pq = numeric_precision(column.type_sql)
    if pq is not None:
        p, s = pq
        top = Decimal(10) ** (p - s) - Decimal(10) ** (-s)
        if top > Decimal(MAX_BOUND):  # beyond what a policy range may declare
            return Facts()
        top = top.quantize(Decimal(1).scaleb(-s)) if s > 0 else top.to_integral_value()
        return Facts(-top, top, f"NUMERIC({p},{s}): |x| < 10^{p - s}")
    return Facts()


# -- what a CHECK constraint proves ---------------------------------------------------------------


def _strip(e: exp.Expr) -> exp.Expr:
    while isinstance(e, exp.Paren):
        e = e.this
    return e


def _is_column(e: exp.Expr, column: Column) -> bool:
    """The column itself; or, for a text column, cast to a text type (PostgreSQL writes ``(c)::text = ANY …``
    for a VARCHAR), which changes no value."""
    e = _strip(e)
    if isinstance(e, exp.Cast) and column.kind == "text" and e.to.this in _TEXT_TYPES:
        e = _strip(e.this)
    return isinstance(e, exp.Column) and not e.table and e.name.lower() == column.name.lower()


def _constant(e: exp.Expr, column: Column) -> Value | None:
    """A constant as the column's kind reads it (``(50)::numeric``, ``'-999.99'::numeric``, ``'1992-01-01'::date``,
    ``'A'::bpchar``, ``- 3``); None for anything else."""
    negative = False
    while True:
        e = _strip(e)
        if isinstance(e, exp.Cast):
            e = e.this
        elif isinstance(e, exp.Neg):
            negative, e = not negative, e.this
        else:
            break
    if not isinstance(e, exp.Literal):
        return None
    text = str(e.this)
    if column.kind == "text" or (column.labels is not None):
        return None if negative or not e.is_string else text
    if column.kind == "date":
        if negative:
            return None
        try:
            return dt.date.fromisoformat(text)
        except ValueError:
            return None
    if column.kind in ("integer", "numeric"):
        try:
            value = Decimal(text)
        except InvalidOperation:
            return None
        if not value.is_finite():
            return None
        return -value if negative else value
    return None


def _values(e: exp.Expr, column: Column) -> tuple[Value, ...] | None:
    """The values ``c IN (…)``, ``c = ANY (ARRAY[…])``, ``c = v`` or an OR of these allow; None for another form."""
    e = _strip(e)
    if isinstance(e, exp.Or):
        out: list[Value] = []
        for branch in e.flatten():
            got = _values(branch, column)
            if got is None:
                return None
            out.extend(v for v in got if v not in out)
        return tuple(out)
    if isinstance(e, exp.In) and _is_column(e.this, column) and not e.args.get("query") and not e.args.get("not"):
        items = [_constant(v, column) for v in e.expressions]
    elif isinstance(e, exp.EQ) and _is_column(e.this, column):
        target = _strip(e.expression)
        if isinstance(target, exp.Any):
            array = _strip(target.this)
            while isinstance(array, (exp.Cast, exp.Paren)):
                array = _strip(array.this)
            if not isinstance(array, exp.Array):
                return None
            items = [_constant(v, column) for v in array.expressions]
        else:
            items = [_constant(target, column)]
    else:
        return None
    if not items or any(v is None for v in items):
        return None
    out = []
    for v in items:
        if v is not None and v not in out:
            out.append(v)
    return tuple(out)


def check_facts(condition: str, column: Column) -> Facts:
    """What one CHECK condition (its SQL text) proves about ``column``: the range of its comparisons with
    constants and the values its IN lists allow, from the conjuncts of those forms."""
    try:
        tree = sqlglot.parse_one(condition, read="postgres")
    except (ParseError, sqlglot.errors.SqlglotError, ValueError):
        return Facts()
    if not isinstance(tree, exp.Expr):
        return Facts()
    tree = _strip(tree)
    low: Value | None = None
    high: Value | None = None
    values: tuple[Value, ...] | None = None
    whole = column.kind == "integer"
    for part in tree.flatten() if isinstance(tree, exp.And) else [tree]:
        part = _strip(part)
        lo: Value | None = None
        hi: Value | None = None
        if isinstance(part, exp.Between) and _is_column(part.this, column) and not part.args.get("symmetric"):
            lo, hi = _constant(part.args["low"], column), _constant(part.args["high"], column)
            if lo is None or hi is None:
                continue
        elif isinstance(part, (exp.GT, exp.GTE, exp.LT, exp.LTE)):
            left, right = part.this, part.expression
            flipped = not _is_column(left, column)
            if flipped:
                left, right = right, left
            value = _constant(right, column)
            if not _is_column(left, column) or value is None or isinstance(value, str):
                continue
            upper = isinstance(part, (exp.LT, exp.LTE)) != flipped
            strict = isinstance(part, (exp.GT, exp.LT))
            if upper:
                hi = _step(value, -1, whole) if strict else value
            else:
                lo = _step(value, 1, whole) if strict else value
        else:
            got = _values(part, column)
            if got is None:
                continue
            values = got if values is None else tuple(v for v in values if v in got)
            continue
        if lo is not None:
            low = lo if low is None or _less(low, lo) else low
        if hi is not None:
            high = hi if high is None or _less(hi, high) else high
    return Facts(low, high, "", values, "")


def _less(a: Value, b: Value) -> bool:
    """``a < b`` for two bounds of one column (numbers with numbers, dates with dates)."""
    return bool(a < b)  # type: ignore[operator]


def _step(value: Value, direction: int, whole: bool) -> Value:
    """The nearest allowed value past a strict bound: the next integer of an integer column, the next day of a
    DATE; a NUMERIC keeps the bound itself (a closed range that holds every allowed value)."""
    if isinstance(value, dt.date):
        return value + dt.timedelta(days=direction)
    if whole and isinstance(value, Decimal):
        return (
            (value.to_integral_value(rounding="ROUND_FLOOR") + 1)
            if direction > 0
            else value.to_integral_value(rounding="ROUND_CEILING") - 1
        )
    return value


def _bare(condition: str) -> str:
    """The condition without the parentheses PostgreSQL wraps it in (``((a >= 1) AND (a <= 7))`` loses one pair:
    ``(a >= 1) AND (a <= 7)``)."""
    text = condition.strip()
    while text.startswith("(") and text.endswith(")"):
        depth = 0
        for i, ch in enumerate(text):
            depth += (ch == "(") - (ch == ")")
            if depth == 0 and i < len(text) - 1:
                return text  # the first parenthesis closes before the end: "(a) AND (b)"
        text = text[1:-1].strip()
    return text


def column_facts(column: Column, enforced: bool) -> Facts:
    """The type's facts narrowed by every CHECK on the column (each holds, so their intersection does); each end
    of the range and the domain keep the reason of the fact that set them."""
    facts = type_facts(column)
    low, high, values = facts.low, facts.high, facts.values
    low_why = high_why = facts.range_why
    values_why = facts.values_why
    claim = "" if enforced else " (the schema file's claim)"
    for condition in column.checks:
        got = check_facts(condition, column)
        why = f"CHECK ({_bare(condition)}){claim}"
        if got.low is not None and (low is None or _less(low, got.low)):
            low, low_why = got.low, why
        if got.high is not None and (high is None or _less(got.high, high)):
            high, high_why = got.high, why
        if got.values is not None:
            values = got.values if values is None else tuple(v for v in values if v in got.values)
            values_why = why if values_why == facts.values_why else f"{values_why}; {why}"
    numbers = [v for v in values or () if isinstance(v, Decimal)]
    if column.kind in ("integer", "numeric") and values and len(numbers) == len(values):
        if low is None or _less(low, min(numbers)):
            low, low_why = min(numbers), values_why
        if high is None or _less(max(numbers), high):
            high, high_why = max(numbers), values_why
    if column.kind == "integer":  # an integer column holds integers: a fractional bound rounds inwards
        if isinstance(low, Decimal):
            low = int(low.to_integral_value(rounding="ROUND_CEILING"))
        if isinstance(high, Decimal):
            high = int(high.to_integral_value(rounding="ROUND_FLOOR"))
        if values is not None:
            values = tuple(int(v) for v in values if isinstance(v, Decimal) and v == v.to_integral_value())
    if values is not None and low is not None and high is not None and numbers:
        values = tuple(v for v in values if not _less(v, low) and not _less(high, v))
    if (
        values is None
        and column.kind == "integer"
        and isinstance(low, int)
        and isinstance(high, int)
        and 0 < high - low + 1 <= SMALL_DOMAIN
    ):
        values, values_why = tuple(range(low, high + 1)), "every integer of the range"
    if values is not None and not 0 < len(values) <= MAX_DOMAIN:
        values = None
    if low is not None and high is not None and _less(high, low):  # no value meets the constraints: no row
        low = high = values = None
    range_why = low_why if low_why == high_why else f"low: {low_why}; high: {high_why}"
    return Facts(low, high, range_why, values, values_why)


def rows_per_key(table: Table, facts: dict[str, Facts]) -> tuple[str, int, str] | None:
    """``(k, τ, why)`` when the primary key is (k, c₁, …) and the other columns take at most τ ≤ MAX_TAU values
    together (their domains' sizes multiplied): two rows with one k differ in some cᵢ."""
    key = table.primary_key
    if len(key) < 2:
        return None
    best: tuple[str, int, str] | None = None
    for k in key:
        tau, parts = 1, []
        for c in key:
            if c == k:
                continue
            values = facts[c].values
            if values is None:
                break
            tau *= len(values)
            parts.append(f"{c} takes {len(values)} values")
        else:
            if tau <= MAX_TAU and (best is None or tau < best[1]):
                best = (k, tau, f"primary key ({', '.join(key)}); {', '.join(parts)}")
    return best


# -- writing TOML ---------------------------------------------------------------------------------


def toml_key(name: str) -> str:
    """A bare key where TOML allows one, else a quoted one."""
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else json.dumps(name, ensure_ascii=False)


def toml_value(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, Decimal):
        return format(v, "f")  # 900.00 stays 900.00 (a TOML float), 50 an integer
    if isinstance(v, dt.date):
        return f'"{v.isoformat()}"'
    return json.dumps(v, ensure_ascii=False)


def _line(text: str, why: str) -> str:
    if not why:
        return text
    pad = COMMENT_COLUMN - len(text)
    return f"{text}{' ' * pad if pad > 0 else '  '}# {why}"


def _array(values: Sequence[Value], indent: str = "    ", width: int = 108) -> list[str]:
    """``[a, b, …]`` on one line, or several lines of at most ``width`` characters."""
    items = [toml_value(v) for v in values]
    one = "[" + ", ".join(items) + "]"
    if len(one) <= width - 10:
        return [one]
    lines, current = ["["], indent
    for item in items:
        if len(current) + len(item) + 2 > width and current.strip():
            lines.append(current.rstrip())
            current = indent
        current += item + ", "
    lines.append(current.rstrip())
    lines.append("]")
    return lines


_HEAD = (
    "# Every value below is what the schema proves (the comment beside it says how); nothing was read from the",
    "# data. Which tables are private is the data owner's decision: check it, add a norm where values are",
)
_ESTIMATED_HEAD = (
    "# Every value below is what the schema proves or a DP estimate (the comment beside it says which); only",
    "# the estimates listed in [estimates] read the data. Which tables are private is the data owner's decision:",
    "# check it, add a norm where values are",
)


def _fk(fk: ForeignKey) -> str:
    return f"({', '.join(fk.columns)}) → {fk.ref_table}({', '.join(fk.ref_columns) or 'its primary key'})"


def propose(
    catalog: Catalog, private: Iterable[str] | None, *, source: str | None = None, estimates: Estimates | None = None
) -> str:
    """The policy file for ``catalog``: the tables in ``private`` row-private (every table when None, failing
    closed), the others public; per column the range and domain its type and CHECK constraints prove, replaced
    by the DP releases of ``estimates`` where there are some (recorded in its ``[estimates]`` section)."""
    named = None if private is None else {p.lower() for p in private}
    enforced = catalog.enforced
    origin = source or catalog.source
    out = [
        f"# Policy written by `sqldp policy init` from {origin}.",
        *(_ESTIMATED_HEAD if estimates is not None and estimates.section else _HEAD),
        "# private (docs/policy.md), tighten ranges the data owner can vouch for, and run `sqldp policy check`.",
    ]
    if not enforced:
        out += [
            "# The schema file's CHECK constraints are claims nothing checked against the data: a declared range is",
            "# clamped to, so data that breaks one biases an answer, never its privacy.",
        ]
    out += ["", "# [defaults]", "# epsilon = 1.0" + " " * (COMMENT_COLUMN - 15) + "# the ε of a query that gives none"]
    for name in sorted(catalog.tables):
        table = catalog.tables[name]
        is_private = named is None or name in named
        out.append("")
        out.append(f"# -- {name} " + "-" * max(3, 100 - len(name)))
        if table.primary_key:
            out.append(f"# primary key ({', '.join(table.primary_key)})")
        for fk in table.foreign_keys:
            out.append(f"# foreign key {_fk(fk)}")
        if table.primary_key or table.foreign_keys:
            out.append(
                "# (keys are read from the "
                + ("database, which enforces them" if enforced else "schema file")
                + " each time; they are not repeated here)"
            )
        out.append(f"[tables.{toml_key(name)}]")
        if is_private:
            why = "every table (no --private given): fail closed" if named is None else "named in --private"
            out.append(_line('rows = "private"', f"{why}: adding or removing a row is a neighbouring change"))
        else:
            out.append(_line('rows = "public"', "not in --private: its rows are released exactly, without noise"))
        facts = {c: column_facts(col, enforced) for c, col in table.columns.items()}
        per = rows_per_key(table, facts) if is_private else None
        if estimates is not None and is_private:
            facts.update({c: f for (t, c), f in estimates.facts.items() if t == name})
            per = per or estimates.rows_per.get(name)
        if per is not None:
            k, tau, why = per
            out.append(_line(f"max_rows_per = {{ {toml_key(k)} = {tau} }}", why))
        for c, col in table.columns.items():
            f = facts[c]
            has_range = f.low is not None and f.high is not None
            if not has_range and f.values is None:
                continue
            out.append(f"[tables.{toml_key(name)}.columns.{toml_key(c)}]")
            if has_range:
                assert f.low is not None and f.high is not None
                out.append(_line(f"range = [{toml_value(f.low)}, {toml_value(f.high)}]", f.range_why))
                if col.kind == "date":
                    out.append(_line('unit = "day"', "a DATE counts in days"))
            if f.values is not None:
                lines = _array(f.values)
                if len(lines) == 1:
                    out.append(_line(f"domain = {lines[0]}", f.values_why))
                else:
                    out.append(f"# {f.values_why}")
                    out.append(f"domain = {lines[0]}")
                    out.extend(lines[1:])
    if estimates is not None:
        out += estimates.section
    return "\n".join(out) + "\n"
