"""``[tables.T]``: which tables' rows and which columns' values are private, and how much a change weighs.

Per table: whether its rows are private (adding/removing one row is a neighbouring change, NR §3.3.7) and
the weight G of such a change; ``max_rows_per``, a declared bound τ on how many rows share a value of one
column (the contribution bound a query enforces by truncation, docs/truncation.md); the composite norm over
its value-sensitive columns (§3.3.8, the norms of §4.3.3.3); per column, value bounds, a declared domain for
GROUP BY, the unit a DATE counts in and the attacker's prior knowledge (Fig. 44, :mod:`sqldp.policy.priors`).

Fail closed: a table the policy does not mention is private (rows, weight 1).

Validation (every check names the key): table and column names compare as PostgreSQL folds unquoted
identifiers (lower case), so ``[tables.ORDERS]`` is ``orders`` and a second spelling of it is refused rather
than silently replacing the first; a declared domain is a non-empty list of distinct scalars of one type (no
NaN or ∞: a repeated group would be released twice with the full ε, NR §3.3.10.4); ranges are finite with
low ≤ high and within ±MAX_BOUND; table and norm weights lie in [MIN_WEIGHT, MAX_WEIGHT]; a norm is at most
MAX_NORM_CHARS long and nests at most MAX_NORM_DEPTH levels; :func:`domain_fits` checks domain value types
against the catalog.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp.errors import PolicyError
from sqldp.policy.keys import check_keys
from sqldp.policy.priors import Knowledge, parse_knowledge
from sqldp.policy.values import positive, to_number

DAYS_PER_UNIT = {"day": 1.0, "week": 7.0, "month": 365.2425 / 12, "year": 365.2425}
# A weight scales how much one step of change counts (NR §3.3.7, §4.3.3.3, where the weights span 0.0001 to
# 50). Beyond six orders of magnitude either way the products in the bounds lose all precision or overflow
# (1e308 becomes ∞), so such weights are refused rather than half-honoured.
MIN_WEIGHT, MAX_WEIGHT = 1e-6, 1e6
MAX_NORM_CHARS, MAX_NORM_DEPTH = 10_000, 16
MAX_P = 64.0  # lp(P, …) beyond this is linf for all practical purposes: use linf
MAX_DOMAIN = 10_000  # declared groups per key column (each is released, with noise)
# τ of ``max_rows_per``: the model-checking analysis proves bounds up to its cap (64 rows), so a larger τ never
# gives a finite bound; a million is far beyond it and still refuses nonsense such as 1e300
MAX_ROWS_PER = 1_000_000
TABLE_KEYS = {"rows", "weight", "norm", "columns", "max_rows_per", "budget", "row_epsilon", "renewal"}
RENEWAL_KEYS = {"every_days", "epsilon", "start", "max"}
COLUMN_KEYS = {"range", "unit", "domain", "knowledge"}


# -- norms ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NormTerm:
    """``weight · column`` or ``weight · ‖…‖`` inside a composite norm."""

    weight: float
    column: str | None = None
    norm: Norm | None = None

    def __str__(self) -> str:
        inner = self.column if self.column is not None else str(self.norm)
        return inner if self.weight == 1 else f"{self.weight:g}*{inner}"


@dataclass(frozen=True)
class Norm:
    """A composite ℓp norm ‖w1·a1, …, wn·an‖_p over columns and nested norms (NR §4.3.3.3)."""

    p: float
    terms: tuple[NormTerm, ...]

    @property
    def columns(self) -> frozenset[str]:
        out: set[str] = set()
        for t in self.terms:
            if t.column is not None:
                out.add(t.column)
            elif t.norm is not None:
                out |= t.norm.columns
        return frozenset(out)

    def __str__(self) -> str:
        args = ", ".join(str(t) for t in self.terms)
        if math.isinf(self.p):
            return f"linf({args})"
        if self.p in (1, 2):
            return f"l{int(self.p)}({args})"
        return f"lp({self.p:g}, {args})"

    def evaluate(self, values: Mapping[str, float]) -> float:
        """The norm of a vector of per-column changes (missing columns count 0)."""
        parts = []
        for t in self.terms:
            v = abs(values.get(t.column, 0.0)) if t.column is not None else t.norm.evaluate(values)  # type: ignore[union-attr]
            parts.append(abs(t.weight) * v)
        top = max(parts, default=0.0)
        if math.isinf(self.p) or top == 0.0 or math.isinf(top):
            return top
        return top * sum((x / top) ** self.p for x in parts) ** (1 / self.p)  # scaled: x**p cannot overflow


def parse_norm(text: str, where: str) -> Norm:
    """Parse ``l1(a, 0.5*b, 30*linf(c, d))``; also ``l2``, ``linf`` and ``lp(P, …)``."""
    if not text.strip():
        raise PolicyError("must not be empty (e.g. 'l1(a, 2*b)')", where=where)
    if len(text) > MAX_NORM_CHARS:
        raise PolicyError(f"is longer than {MAX_NORM_CHARS} characters", where=where)
    depth = deepest = 0
    for ch in text:  # before the parser: its recursion must not be what stops a deep norm
        depth += (ch == "(") - (ch == ")")
        deepest = max(deepest, depth)
    if deepest > MAX_NORM_DEPTH:
        raise PolicyError(f"nests deeper than {MAX_NORM_DEPTH} parentheses", where=where)
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except ParseError as exc:
        detail = exc.errors[0]["description"] if exc.errors else str(exc)
        raise PolicyError(f"cannot parse norm {text!r}: {detail}", where=where) from None
    except (sqlglot.errors.SqlglotError, RecursionError, ValueError) as exc:  # the tokenizer's own errors
        raise PolicyError(f"cannot parse norm {text!r}: {type(exc).__name__}", where=where) from None
    if not isinstance(tree, exp.Expr):
        raise PolicyError(f"cannot parse norm {text!r}", where=where)
    node = _norm(tree, where)
    if not isinstance(node, Norm):
        raise PolicyError(f"norm must be l1(…), l2(…), linf(…) or lp(P, …), got {text!r}", where=where)
    _products(node, 1.0, where)
    return node


def _products(norm: Norm, factor: float, where: str) -> None:
    """A column's weight is the product of the weights on its path (30*linf(…) scales the inner ones)."""
    for t in norm.terms:
        w = factor * t.weight
        if t.column is not None:
            _weight(w, f"column {t.column} weighs {w:g} in all", where)
        elif t.norm is not None:
            _products(t.norm, w, where)


def _norm(node: exp.Expr, where: str) -> Norm | NormTerm:
    if isinstance(node, exp.Paren):
        return _norm(node.this, where)
    if isinstance(node, exp.Column) and not node.table:
        return NormTerm(1.0, column=node.name.lower())
    if isinstance(node, exp.Mul):
        for num, other in ((node.this, node.expression), (node.expression, node.this)):
            weight = _number(num)
            if weight is not None:
                _weight(weight, f"weight {num.sql()}", where)
                inner = _norm(other, where)
                if isinstance(inner, Norm):
                    return NormTerm(weight, norm=inner)
                return NormTerm(_weight(weight * inner.weight, node.sql(), where), column=inner.column, norm=inner.norm)
        raise PolicyError(f"a norm term must be NUMBER*column or NUMBER*norm, got {node.sql()!r}", where=where)
    if isinstance(node, (exp.Anonymous, exp.Func)):
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        args = list(node.expressions) if isinstance(node, exp.Anonymous) else _func_args(node)
        if name == "lp":
            p = _number(args[0]) if args else None
            if p is None or not 1 <= p <= MAX_P:
                raise PolicyError(f"lp(P, …) needs a number 1 ≤ P ≤ {MAX_P:g} first (use linf above)", where=where)
            args = args[1:]
        elif name == "linf":
            p = math.inf
        elif name.startswith("l") and name[1:].isdigit() and len(name) < 6 and 1 <= int(name[1:]) <= MAX_P:
            p = float(name[1:])
        else:
            raise PolicyError(f"unknown norm {name!r} (use l1, l2, linf or lp)", where=where)
        if not args:
            raise PolicyError(f"{name}() needs at least one column", where=where)
        terms = []
        for a in args:
            t = _norm(a, where)
            terms.append(NormTerm(1.0, norm=t) if isinstance(t, Norm) else t)
        return Norm(p, tuple(terms))
    raise PolicyError(f"unexpected {node.sql()!r} in norm", where=where)


def _func_args(node: exp.Func) -> list[exp.Expr]:
    out = [node.this] if isinstance(node.this, exp.Expr) else []
    return out + list(node.expressions)


def _weight(w: float, what: str, where: str) -> float:
    if not MIN_WEIGHT <= w <= MAX_WEIGHT:
        raise PolicyError(f"{what}: a weight must be in [{MIN_WEIGHT:g}, {MAX_WEIGHT:g}]", where=where)
    return w


def _number(node: exp.Expr) -> float | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        try:
            v = float(node.this)
        except ValueError:
            return None
        return v if math.isfinite(v) else None
    if isinstance(node, exp.Neg):
        inner = _number(node.this)
        return -inner if inner is not None else None
    return None


# -- tables and columns ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ColumnPolicy:
    name: str
    range: tuple[float, float] | None = None  # DATE bounds converted to days since 1970-01-01
    unit: str = "day"
    domain: tuple[Any, ...] | None = None
    knowledge: Knowledge | None = None  # None: unknown (the worst case)

    @property
    def days_per_unit(self) -> float:
        return DAYS_PER_UNIT[self.unit]


@dataclass(frozen=True)
class Renewal:
    """Budget renewal (NR §3.3.12.7, "Increasing budgets"): every ``every_days`` days from ``start`` each row's
    budget grows by ``epsilon``, up to ``max`` in all. A public schedule: the grant is the same for every row,
    so it reveals nothing about the data."""

    every_days: float
    epsilon: float
    start: dt.date
    max: float | None = None


@dataclass(frozen=True)
class RowBudget:
    """``budget = "per-row"`` with ``row_epsilon`` (each row's initial ε) and an optional ``renewal``."""

    row_epsilon: float
    renewal: Renewal | None = None


@dataclass(frozen=True)
class TablePolicy:
    name: str
    rows_private: bool = True
    weight: float = 1.0
    norm: Norm | None = None
    columns: Mapping[str, ColumnPolicy] = field(default_factory=dict)
    # column → τ: at most τ rows of this table share one value of the column (NULL counts as one value). A
    # declaration, not a fact: a query that relies on it reads the table truncated to τ rows per value
    # (sqldp.rewrite.truncate), so the bound holds on every database. At most one column per table.
    max_rows_per: Mapping[str, int] = field(default_factory=dict)
    # ``budget = "per-row"``: every row has its own ε (NR §3.3.12.7, sqldp.budgets); None: the analyst-level
    # budget only
    budget: RowBudget | None = None

    @property
    def sensitive_columns(self) -> frozenset[str]:
        return self.norm.columns if self.norm is not None else frozenset()

    def column(self, name: str) -> ColumnPolicy:
        return self.columns.get(name.lower()) or ColumnPolicy(name.lower())

    @property
    def public(self) -> bool:
        """Reference data: neither rows nor values are protected."""
        return not self.rows_private and self.norm is None


def parse_tables(raw: Any, where: str) -> dict[str, TablePolicy]:
    """``[tables.T]`` for every T, keyed by the name in lower case (as PostgreSQL folds unquoted names)."""
    if not isinstance(raw, dict):
        raise PolicyError("must be a table of tables", where=where)
    check_folded(raw, where)
    return {name.lower(): _table(name.lower(), spec, f"{where}.{name}") for name, spec in raw.items()}


def _table(name: str, spec: Any, where: str) -> TablePolicy:
    check_keys(spec, TABLE_KEYS, (), where)
    rows = spec.get("rows", "private")
    if rows not in ("private", "public"):
        raise PolicyError(f"must be 'private' or 'public', got {rows!r}", where=f"{where}.rows")
    weight = positive(spec.get("weight", 1.0), f"{where}.weight")
    _weight(weight, f"weight {weight:g}", f"{where}.weight")
    norm = None
    if "norm" in spec:
        if not isinstance(spec["norm"], str):
            raise PolicyError("must be a string such as 'l1(a, 2*b)'", where=f"{where}.norm")
        norm = parse_norm(spec["norm"], f"{where}.norm")
    cols_raw = spec.get("columns", {})
    if not isinstance(cols_raw, dict):
        raise PolicyError("must be a table of column tables", where=f"{where}.columns")
    check_folded(cols_raw, f"{where}.columns")
    columns = {c.lower(): _column(c.lower(), s, f"{where}.columns.{c}") for c, s in cols_raw.items()}
    per = _max_rows_per(spec["max_rows_per"], f"{where}.max_rows_per") if "max_rows_per" in spec else {}
    return TablePolicy(name, rows == "private", weight, norm, columns, per, _budget(spec, where))


def _budget(spec: Mapping[str, Any], where: str) -> RowBudget | None:
    """``budget = "per-row"``, ``row_epsilon = ε`` and ``renewal = { every_days, epsilon, start, max }``
    (sqldp.budgets, docs/budgets.md); ``row_epsilon`` and ``renewal`` only with ``budget``."""
    if "budget" not in spec:
        for key in ("row_epsilon", "renewal"):
            if key in spec:
                raise PolicyError('needs budget = "per-row" in the same table', where=f"{where}.{key}")
        return None
    if spec["budget"] != "per-row":
        raise PolicyError(f"must be 'per-row', got {spec['budget']!r}", where=f"{where}.budget")
    if "row_epsilon" not in spec:
        raise PolicyError('budget = "per-row" needs row_epsilon, each row\'s ε', where=f"{where}.row_epsilon")
    row_epsilon = positive(spec["row_epsilon"], f"{where}.row_epsilon")
    if "renewal" not in spec:
        return RowBudget(row_epsilon)
    raw = check_keys(spec["renewal"], RENEWAL_KEYS, ("every_days", "epsilon", "start"), f"{where}.renewal")
    every = positive(raw["every_days"], f"{where}.renewal.every_days")
    grant = positive(raw["epsilon"], f"{where}.renewal.epsilon")
    start = raw["start"]
    if isinstance(start, str):
        try:
            start = dt.date.fromisoformat(start)
        except ValueError:
            raise PolicyError(f"must be a date YYYY-MM-DD, got {start!r}", where=f"{where}.renewal.start") from None
    if isinstance(start, dt.datetime) or not isinstance(start, dt.date):
        raise PolicyError(f"must be a date YYYY-MM-DD, got {start!r}", where=f"{where}.renewal.start")
    cap = positive(raw["max"], f"{where}.renewal.max") if "max" in raw else None
    if cap is not None and cap < row_epsilon:
        raise PolicyError(f"must be ≥ row_epsilon ({row_epsilon:g}), got {cap:g}", where=f"{where}.renewal.max")
    return RowBudget(row_epsilon, Renewal(every, grant, start, cap))


def _max_rows_per(raw: Any, where: str) -> dict[str, int]:
    """``{ column = τ }``: one column, τ a whole number in [1, MAX_ROWS_PER]. One column only: truncating by
    two keys in turn is no longer a one-row-in, one-row-out change (docs/truncation.md)."""
    if not isinstance(raw, dict):
        raise PolicyError("must be a table { column = τ }, e.g. { l_orderkey = 7 }", where=where)
    check_folded(raw, where)
    if len(raw) != 1:
        raise PolicyError(f"must name exactly one column, got {len(raw)}", where=where)
    ((column, tau),) = raw.items()
    if isinstance(tau, bool) or not isinstance(tau, int) or not 1 <= tau <= MAX_ROWS_PER:
        raise PolicyError(f"{column}: τ must be a whole number in [1, {MAX_ROWS_PER}], got {tau!r}", where=where)
    return {column.lower(): tau}


def _column(name: str, spec: Any, where: str) -> ColumnPolicy:
    check_keys(spec, COLUMN_KEYS, (), where)
    rng = None
    if "range" in spec:
        r = spec["range"]
        if not isinstance(r, list) or len(r) != 2:
            raise PolicyError("must be [low, high]", where=f"{where}.range")
        lo, hi = to_number(r[0], f"{where}.range"), to_number(r[1], f"{where}.range")
        if lo > hi:
            raise PolicyError(f"low {r[0]!r} is above high {r[1]!r}", where=f"{where}.range")
        rng = (lo, hi)
    unit = spec.get("unit", "day")
    if not isinstance(unit, str) or unit not in DAYS_PER_UNIT:
        raise PolicyError(f"must be one of {', '.join(DAYS_PER_UNIT)}, got {unit!r}", where=f"{where}.unit")
    domain = _domain(spec["domain"], f"{where}.domain") if "domain" in spec else None
    knowledge = parse_knowledge(spec["knowledge"], f"{where}.knowledge") if "knowledge" in spec else None
    return ColumnPolicy(name, rng, unit, domain, knowledge)


def resolve_name(name: str, known: Mapping[str, Any], where: str) -> str | None:
    """The catalog's name for a policy name (lower case, as PostgreSQL folds unquoted names): itself, else
    the one catalog name equal to it in lower case (a table created quoted, "Orders"); two are ambiguous."""
    if name in known:
        return name
    hits = sorted(k for k in known if k.lower() == name)
    if len(hits) > 1:
        raise PolicyError(f"{name!r} matches {', '.join(map(repr, hits))} in the schema; rename one", where=where)
    return hits[0] if hits else None


def check_folded(d: Mapping[str, Any], where: str) -> None:
    """Refuse two spellings of one name: PostgreSQL folds unquoted identifiers to lower case, so
    ``[tables.ORDERS]`` beside ``[tables.orders]`` names one table twice, and one of them would be dropped."""
    seen: dict[str, str] = {}
    for name in d:
        if name.lower() in seen:
            raise PolicyError(
                f"{name!r} and {seen[name.lower()]!r} are the same name (PostgreSQL folds unquoted names to lower "
                "case); keep one",
                where=f"{where}.{name}",
            )
        seen[name.lower()] = name


# -- declared domains -----------------------------------------------------------------------------

_SCALAR: dict[type, str] = {str: "string", int: "number", float: "number", bool: "boolean", dt.date: "date"}


def _scalar_type(v: Any) -> str | None:
    if isinstance(v, (dt.datetime, dt.time)):
        return None  # TOML date-times and times: no GROUP BY key sqldp analyses has such values
    return _SCALAR.get(type(v))


def _domain(raw: Any, where: str) -> tuple[Any, ...]:
    """Distinct scalars of one type. Each value is a released group (NR §3.3.10.4, parallel composition): a
    value given twice would release one group twice, each time with the full ε."""
    if not isinstance(raw, list) or not raw:
        raise PolicyError("must be a non-empty list of values", where=where)
    if len(raw) > MAX_DOMAIN:
        raise PolicyError(f"has {len(raw)} values; at most {MAX_DOMAIN} groups per column", where=where)
    kinds = set()
    for v in raw:
        kind = _scalar_type(v)
        if kind is None:
            raise PolicyError(f"values must be scalar strings, numbers, booleans or dates, got {v!r}", where=where)
        if isinstance(v, float) and not math.isfinite(v):
            raise PolicyError(f"{v!r} is not a group value (NaN and ∞ are refused)", where=where)
        if isinstance(v, str) and "\x00" in v:
            raise PolicyError(f"{v!r}: PostgreSQL strings cannot contain NUL", where=where)
        kinds.add(kind)
    if len(kinds) > 1:
        raise PolicyError(f"values must be of one type, got {' and '.join(sorted(kinds))}", where=where)
    seen: set[Any] = set()
    for v in raw:
        if v in seen:  # Python's == here is at least PostgreSQL's for numbers: 1 = 1.0, -0.0 = 0.0
            raise PolicyError(f"{v!r} appears twice; each group must be declared once", where=where)
        seen.add(v)
    return tuple(raw)


def domain_fits(values: tuple[Any, ...], column: Any, where: str) -> None:
    """The declared values against the column's type: a value of another kind would make PostgreSQL fail
    the statement, and CHAR(n) compares padded, so 'a' and 'a ' are one group there."""
    kind = column.kind
    expect: dict[str, tuple[str, ...]] = {
        "integer": ("number",),
        "numeric": ("number",),
        "text": ("string",),
        "boolean": ("boolean",),
        "date": ("date", "string"),
    }
    got = _scalar_type(values[0])
    if kind in expect and got not in expect[kind]:
        raise PolicyError(f"column {column.name!r} is {column.type_sql}; got {values[0]!r}", where=where)
    if kind == "integer" and any(isinstance(v, float) and not v.is_integer() for v in values):
        bad = next(v for v in values if isinstance(v, float) and not v.is_integer())
        raise PolicyError(f"column {column.name!r} is {column.type_sql}; {bad!r} is not an integer", where=where)
    if kind == "date" and got == "string":
        for v in values:
            to_number(v, where)
    if kind == "text" and column.type_sql.upper().split("(")[0].strip() in ("CHAR", "CHARACTER", "BPCHAR", "NCHAR"):
        seen: dict[str, str] = {}
        for v in values:
            if v.rstrip(" ") in seen:
                raise PolicyError(
                    f"{v!r} and {seen[v.rstrip(' ')]!r} are one value in {column.type_sql} (blank-padded)",
                    where=where,
                )
            seen[v.rstrip(" ")] = v
