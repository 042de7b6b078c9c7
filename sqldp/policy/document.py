"""The data owner's privacy policy: one TOML file, read as a whole.

Its sections are ``[tables.T]`` (:mod:`sqldp.policy.tables`), ``[defaults]`` for ε, δ, β, mechanism,
confidence and a guessing-advantage target (below), ``[[goals]]`` (:mod:`sqldp.policy.goals`), and the
proxy's ``[proxy]`` and ``[analysts.NAME]`` (:mod:`sqldp.policy.analysts`, read only when a proxy starts), and
the privacy units ``[units.NAME]`` with ``[[foreign_keys]]`` (:mod:`sqldp.policy.units`), and ``[estimates]``,
the record of the DP estimates ``sqldp policy init`` made (:mod:`sqldp.policy.estimated`).
Every problem is reported as ``file: key: problem`` and nothing is guessed; every table's keys go through
:func:`sqldp.policy.keys.check_keys`, which reports a key that does not belong as
``file: table: unknown key 'k' (allowed: …)``.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqldp.errors import PolicyError
from sqldp.mechanisms.registry import DEFAULT, Name, choices, smoothed
from sqldp.policy.goals import Goal, parse_goals
from sqldp.policy.keys import check_keys
from sqldp.policy.tables import TablePolicy, domain_fits, parse_tables, resolve_name
from sqldp.policy.units import (
    Path as UnitPath,
)
from sqldp.policy.units import (
    Reference,
    Unit,
    check_members,
    check_units,
    memberships,
    parse_references,
    parse_units,
    references,
)
from sqldp.policy.values import positive

SECTIONS = {"defaults", "tables", "goals", "analysts", "proxy", "units", "foreign_keys", "estimates"}
# the privacy parameters of one query: [defaults] gives them for everyone, [analysts.NAME] per analyst
# checked in this order
PRIVACY_KEYS = ("mechanism", "epsilon", "delta", "beta", "confidence", "advantage", "bar_share")


def parse_privacy(d: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The privacy parameters ``d`` gives, checked as the runner would check them (ε > 0; δ, the confidence
    and the advantage target in (0, 1); β ≥ 0; the mechanism by name)."""
    out: dict[str, Any] = {}
    for k in PRIVACY_KEYS:
        if k not in d:
            continue
        v = d[k]
        if k == "mechanism":
            name = smoothed(v)
            if name is None:
                raise PolicyError(f"must be {choices()}, got {v!r}", where=f"{where}.{k}")
            out[k] = name
        else:
            upper = None if k in ("epsilon", "beta") else 1
            out[k] = positive(v, f"{where}.{k}", allow_zero=k in ("beta", "bar_share"), upper=upper)
    return out


@dataclass(frozen=True)
class Defaults:
    epsilon: float | None = None
    delta: float | None = None
    beta: float | None = None
    mechanism: Name = DEFAULT
    confidence: float = 0.78
    advantage: float | None = None
    # the share of a smoothed measurement's ε that buys its error bar (sqldp.mechanisms.smooth_bar); 0: none
    bar_share: float = 0.0


def _defaults(d: Any, where: str) -> Defaults:
    check_keys(d, PRIVACY_KEYS, (), where)
    return Defaults(**parse_privacy(d, where))


@dataclass(frozen=True)
class Policy:
    tables: Mapping[str, TablePolicy] = field(default_factory=dict)
    defaults: Defaults = field(default_factory=Defaults)
    goals: tuple[Goal, ...] = ()
    source: str = "<default policy>"
    raw: Mapping[str, Any] = field(default_factory=dict)
    # privacy units and the foreign keys the policy declares (sqldp.policy.units); empty: row-level only
    units: Mapping[str, Unit] = field(default_factory=dict)
    foreign_keys: tuple[Reference, ...] = ()

    def members(self, catalog: Any) -> dict[str, dict[str, tuple[UnitPath, ...]]]:
        """Per unit, the tables that belong to it and their foreign-key paths to its key (R2T §2)."""
        if not self.units:
            return {}
        refs = references(catalog, self.foreign_keys, f"{self.source}: foreign_keys")
        return memberships(self.units, refs, f"{self.source}: units")

    def table(self, name: str) -> TablePolicy:
        """The table's policy; fail closed for tables the policy does not name (private rows, G = 1)."""
        return self.tables.get(name.lower()) or TablePolicy(name.lower())

    @property
    def longest_change(self) -> float:
        """The longest distance one neighbouring change can have under this policy, whatever the query reads: the
        largest weight of a row-private table (1 for the tables it does not name), ∞ when a table has values in a
        norm (a value change has no bounded distance). The session's zCDP account converts at it for the runs
        whose plans do not say their own (sqldp.release.longest_change)."""
        if any(t.norm is not None for t in self.tables.values()):
            return math.inf
        return max([1.0, *(t.weight for t in self.tables.values() if t.rows_private)])

    def is_sensitive(self, table: str, column: str) -> bool:
        return column.lower() in self.table(table).sensitive_columns

    def validate(self, catalog: Any) -> None:
        """Check that every table and column the policy names exists in the catalog (names as PostgreSQL
        folds them), that declared domain values are of the column's type and distinct in PostgreSQL, and that
        an integer column's range is of whole numbers."""
        for t in self.tables.values():
            where = f"{self.source}: tables.{t.name}"
            name = resolve_name(t.name, catalog.tables, where)
            if name is None:
                raise PolicyError(f"table {t.name!r} is not in the schema ({catalog.source})", where=where)
            known = catalog.tables[name].columns
            if t.budget is not None and not catalog.tables[name].primary_key:
                # the per-row ledger is keyed by the table's primary key (sqldp.budgets.sql)
                raise PolicyError(
                    f"table {t.name!r} has no primary key to key its rows' budgets", where=f"{where}.budget"
                )
            for col in sorted(t.sensitive_columns | set(t.columns) | set(t.max_rows_per)):
                if resolve_name(col, known, where) is None:
                    raise PolicyError(f"column {col!r} is not in table {t.name!r}", where=where)
            for c in t.columns.values():
                column = known[resolve_name(c.name, known, where)]
                if c.domain is not None:
                    domain_fits(c.domain, column, f"{where}.columns.{c.name}.domain")
                if c.range is not None and column.kind == "integer" and not all(x.is_integer() for x in c.range):
                    # the analyses would round it inwards (sqldp.sensitivity.intervals): a range meant for another
                    # column, or a typo, would then bound this one without a word
                    raise PolicyError(
                        f"column {t.name}.{c.name} is {column.type_sql}: its range must be whole numbers, got "
                        f"[{c.range[0]:g}, {c.range[1]:g}]",
                        where=f"{where}.columns.{c.name}.range",
                    )
        for i, goal in enumerate(self.goals):  # a goal about a column that does not exist protects nothing
            where = f"{self.source}: goals[{i}]"
            refs: list[tuple[str, str | None, str]] = [
                (a.table, a.column, f"{where}.attributes.{a.name}") for a in goal.attributes
            ]
            if goal.membership is not None:
                refs.append((goal.membership, None, f"{where}.membership"))
            for table, ref, w in refs:
                found = resolve_name(table, catalog.tables, w)
                if found is None:
                    raise PolicyError(f"table {table!r} is not in the schema ({catalog.source})", where=w)
                if ref is not None and resolve_name(ref, catalog.tables[found].columns, w) is None:
                    raise PolicyError(f"column {ref!r} is not in table {table!r}", where=w)
        if self.units:
            check_units(self.units, catalog, self.source)
            check_members(self.members(catalog), self.tables, self.source)

    @classmethod
    def from_file(cls, path: str | Path) -> Policy:
        """A policy file, or a policy shipped with sqldp by name (``tpch``, ``cafeteria``)."""
        from sqldp.datasets import read_shipped

        text, source = read_shipped(path, ".toml", "policy", PolicyError)
        return cls.from_toml(text, source=source)

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<policy>") -> Policy:
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"invalid TOML: {exc}", where=source) from None
        except RecursionError:  # tomllib recurses once per level of nested arrays and inline tables
            raise PolicyError("invalid TOML: arrays or tables nested too deeply", where=source) from None
        return cls.from_dict(raw, source=source)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], *, source: str = "<policy>") -> Policy:
        """The policy in ``raw``. ``[proxy]`` and ``[analysts]`` stay unparsed in ``raw`` until a proxy asks
        for them (:func:`sqldp.policy.analysts.parse_proxy`): a query run from the command line needs neither."""
        check_keys(raw, SECTIONS, (), source)
        defaults = _defaults(raw.get("defaults", {}), f"{source}: defaults")
        tables = parse_tables(raw.get("tables", {}), f"{source}: tables")
        goals = tuple(parse_goals(raw["goals"], tables, f"{source}: goals")) if "goals" in raw else ()
        units = parse_units(raw.get("units", {}), f"{source}: units")
        fks = parse_references(raw.get("foreign_keys", []), f"{source}: foreign_keys")
        if "estimates" in raw:  # the record of what `sqldp policy init` estimated: checked, never used by a query
            from sqldp.policy.estimated import parse_section

            parse_section(raw["estimates"], f"{source}: estimates")
        return cls(tables, defaults, goals, source, raw, units, fks)
