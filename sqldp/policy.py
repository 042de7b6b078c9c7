"""The data owner's privacy policy (a TOML file).

Per table: whether its rows are private (adding/removing one row is a neighbouring change, NR §3.3.7) and
the weight G of such a change; the composite norm over its value-sensitive columns (§3.3.8, the norms of
§4.3.3.3); per column, value bounds, a declared domain for GROUP BY, the unit a DATE counts in and the
attacker's prior knowledge (Fig. 44). Optional ``[defaults]`` for ε, δ, β, mechanism, confidence and a
guessing-advantage target, and ``[[goals]]`` (see :mod:`sqldp.advantage`).

Fail closed: a table the policy does not mention is private (rows, weight 1). Every problem is reported
as ``file: key: problem`` and nothing is guessed.
"""

from __future__ import annotations

import datetime as dt
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp.errors import PolicyError

Mechanism = Literal["cauchy", "laplace"]
EPOCH = dt.date(1970, 1, 1)
DAYS_PER_UNIT = {"day": 1.0, "week": 7.0, "month": 365.2425 / 12, "year": 365.2425}


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
        if math.isinf(self.p):
            return max(parts, default=0.0)
        return sum(x**self.p for x in parts) ** (1 / self.p)


def parse_norm(text: str, where: str) -> Norm:
    """Parse ``l1(a, 0.5*b, 30*linf(c, d))``; also ``l2``, ``linf`` and ``lp(P, …)``."""
    try:
        tree = sqlglot.parse_one(text, read="postgres")
    except ParseError as exc:
        raise PolicyError(f"cannot parse norm {text!r}: {exc.errors[0]['description']}", where=where) from None
    node = _norm(tree, where)
    if not isinstance(node, Norm):
        raise PolicyError(f"norm must be l1(…), l2(…), linf(…) or lp(P, …), got {text!r}", where=where)
    return node


def _norm(node: exp.Expression, where: str) -> Norm | NormTerm:
    if isinstance(node, exp.Paren):
        return _norm(node.this, where)
    if isinstance(node, exp.Column) and not node.table:
        return NormTerm(1.0, column=node.name.lower())
    if isinstance(node, exp.Mul):
        for num, other in ((node.this, node.expression), (node.expression, node.this)):
            weight = _number(num)
            if weight is not None:
                inner = _norm(other, where)
                if isinstance(inner, Norm):
                    return NormTerm(weight, norm=inner)
                return NormTerm(weight * inner.weight, column=inner.column, norm=inner.norm)
        raise PolicyError(f"a norm term must be NUMBER*column or NUMBER*norm, got {node.sql()!r}", where=where)
    if isinstance(node, (exp.Anonymous, exp.Func)):
        name = (node.name if isinstance(node, exp.Anonymous) else node.sql_name()).lower()
        args = list(node.expressions) if isinstance(node, exp.Anonymous) else _func_args(node)
        if name == "lp":
            p = _number(args[0]) if args else None
            if p is None or p < 1:
                raise PolicyError("lp(P, …) needs a number P ≥ 1 first", where=where)
            args = args[1:]
        elif name == "linf":
            p = math.inf
        elif name.startswith("l") and name[1:].isdigit() and int(name[1:]) >= 1:
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


def _func_args(node: exp.Func) -> list[exp.Expression]:
    out = [node.this] if isinstance(node.this, exp.Expression) else []
    return out + list(node.expressions)


def _number(node: exp.Expression) -> float | None:
    if isinstance(node, exp.Literal) and not node.is_string:
        return float(node.this)
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
    knowledge: Any = None  # a sqldp.priors prior, or None = unknown (worst case)

    @property
    def days_per_unit(self) -> float:
        return DAYS_PER_UNIT[self.unit]


@dataclass(frozen=True)
class TablePolicy:
    name: str
    rows_private: bool = True
    weight: float = 1.0
    norm: Norm | None = None
    columns: Mapping[str, ColumnPolicy] = field(default_factory=dict)

    @property
    def sensitive_columns(self) -> frozenset[str]:
        return self.norm.columns if self.norm is not None else frozenset()

    def column(self, name: str) -> ColumnPolicy:
        return self.columns.get(name) or ColumnPolicy(name)

    @property
    def public(self) -> bool:
        """Reference data: neither rows nor values are protected."""
        return not self.rows_private and self.norm is None


@dataclass(frozen=True)
class Defaults:
    epsilon: float | None = None
    delta: float | None = None
    beta: float | None = None
    mechanism: Mechanism = "cauchy"
    confidence: float = 0.78
    advantage: float | None = None


@dataclass(frozen=True)
class Policy:
    tables: Mapping[str, TablePolicy] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)
    goals: tuple[Any, ...] = ()
    source: str = "<default policy>"
    raw: Mapping[str, Any] = field(default_factory=dict)

    def table(self, name: str) -> TablePolicy:
        """The table's policy; fail closed for tables the policy does not name (private rows, G = 1)."""
        return self.tables.get(name.lower()) or TablePolicy(name.lower())

    def is_sensitive(self, table: str, column: str) -> bool:
        return column.lower() in self.table(table).sensitive_columns

    def validate(self, catalog: Any) -> None:
        """Check that every table and column the policy names exists in the catalog."""
        for t in self.tables.values():
            where = f"{self.source}: tables.{t.name}"
            if t.name not in catalog.tables:
                raise PolicyError(f"table {t.name!r} is not in the schema ({catalog.source})", where=where)
            known = catalog.tables[t.name].columns
            for col in sorted(t.sensitive_columns | set(t.columns)):
                if col not in known:
                    raise PolicyError(f"column {col!r} is not in table {t.name!r}", where=where)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise PolicyError(f"cannot read policy file: {exc.strerror}", where=str(p)) from None
        return cls.from_toml(text, source=str(p))

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<policy>") -> Policy:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"invalid TOML: {exc}", where=source) from None
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "<policy>") -> Policy:
        _keys(raw, {"defaults", "tables", "goals", "analysts", "proxy"}, source)
        defaults = _defaults(raw.get("defaults", {}), source)
        tables_raw = raw.get("tables", {})
        if not isinstance(tables_raw, dict):
            raise PolicyError("must be a table of tables", where=f"{source}: tables")
        tables = {
            name.lower(): _table(name.lower(), spec, f"{source}: tables.{name}") for name, spec in tables_raw.items()
        }
        goals: tuple[Any, ...] = ()
        if "goals" in raw:
            from sqldp.advantage import parse_goals

            goals = tuple(parse_goals(dict(raw), source))
        return cls(tables, defaults, goals, source, raw)


def _keys(d: Any, allowed: set[str], where: str) -> None:
    """Refuse unknown keys: a typo must not silently weaken the policy. ``where`` is ``file`` or
    ``file: dotted.key``."""
    if not isinstance(d, dict):
        raise PolicyError("must be a TOML table", where=where)
    unknown = sorted(set(d) - allowed)
    if unknown:
        sep = "." if ": " in where else ": "
        raise PolicyError(
            f"unknown key (expected one of {', '.join(sorted(allowed))})", where=f"{where}{sep}{unknown[0]}"
        )


def _positive(value: Any, where: str, *, allow_zero: bool = False, upper: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(f"must be a number, got {value!r}", where=where)
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero) or (upper is not None and v >= upper):
        bound = f" and < {upper:g}" if upper is not None else ""
        raise PolicyError(f"must be {'≥' if allow_zero else '>'} 0{bound}, got {value!r}", where=where)
    return v


def _defaults(d: Any, source: str) -> Defaults:
    w = f"{source}: defaults"
    _keys(d, {"epsilon", "delta", "beta", "mechanism", "confidence", "advantage"}, w)
    mech = d.get("mechanism", "cauchy")
    if mech not in ("cauchy", "laplace"):
        raise PolicyError(f"must be 'cauchy' or 'laplace', got {mech!r}", where=f"{w}.mechanism")
    return Defaults(
        epsilon=_positive(d["epsilon"], f"{w}.epsilon") if "epsilon" in d else None,
        delta=_positive(d["delta"], f"{w}.delta", upper=1) if "delta" in d else None,
        beta=_positive(d["beta"], f"{w}.beta", allow_zero=True) if "beta" in d else None,
        mechanism=mech,
        confidence=_positive(d.get("confidence", 0.78), f"{w}.confidence", upper=1),
        advantage=_positive(d["advantage"], f"{w}.advantage", upper=1) if "advantage" in d else None,
    )


def _table(name: str, spec: Any, where: str) -> TablePolicy:
    _keys(spec, {"rows", "weight", "norm", "columns"}, where)
    rows = spec.get("rows", "private")
    if rows not in ("private", "public"):
        raise PolicyError(f"must be 'private' or 'public', got {rows!r}", where=f"{where}.rows")
    weight = _positive(spec.get("weight", 1.0), f"{where}.weight")
    norm = None
    if "norm" in spec:
        if not isinstance(spec["norm"], str):
            raise PolicyError("must be a string such as 'l1(a, 2*b)'", where=f"{where}.norm")
        norm = parse_norm(spec["norm"], f"{where}.norm")
    cols_raw = spec.get("columns", {})
    if not isinstance(cols_raw, dict):
        raise PolicyError("must be a table of column tables", where=f"{where}.columns")
    columns = {c.lower(): _column(c.lower(), s, f"{where}.columns.{c}") for c, s in cols_raw.items()}
    return TablePolicy(name, rows == "private", weight, norm, columns)


def to_number(value: Any, where: str) -> float:
    """A bound as a number; ISO dates become days since 1970-01-01 (dates count in days)."""
    if isinstance(value, bool):
        raise PolicyError(f"must be a number or an ISO date, got {value!r}", where=where)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return float((value - EPOCH).days)
    if isinstance(value, str):
        try:
            return float((dt.date.fromisoformat(value) - EPOCH).days)
        except ValueError:
            pass
    raise PolicyError(f"must be a number or an ISO date, got {value!r}", where=where)


def _column(name: str, spec: Any, where: str) -> ColumnPolicy:
    _keys(spec, {"range", "unit", "domain", "knowledge"}, where)
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
    if unit not in DAYS_PER_UNIT:
        raise PolicyError(f"must be one of {', '.join(DAYS_PER_UNIT)}, got {unit!r}", where=f"{where}.unit")
    domain = None
    if "domain" in spec:
        if not isinstance(spec["domain"], list) or not spec["domain"]:
            raise PolicyError("must be a non-empty list of values", where=f"{where}.domain")
        domain = tuple(spec["domain"])
    knowledge = None
    if "knowledge" in spec:
        from sqldp.priors import parse_knowledge

        knowledge = parse_knowledge(spec["knowledge"], f"{where}.knowledge")
    return ColumnPolicy(name, rng, unit, domain, knowledge)
