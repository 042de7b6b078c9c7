"""What a policy's declarations imply, table by table, and the mistakes that load without an error
(``sqldp policy check``).

Loading a policy (:meth:`sqldp.policy.Policy.from_file`, then :meth:`~sqldp.policy.Policy.validate` against the
catalog) refuses what cannot be meant. Some declarations are valid and still probably not what the data owner
meant; :func:`warnings` names them:

* ``rows = "public"`` with a ``norm``: the table's rows are public (counted exactly) and only the values in the
  norm are protected (value-level privacy, docs/columns.md) — a table meant private that got a norm and
  ``rows = "public"`` from a copied example is silently much less protected;
* a ``weight`` on a table whose rows are public: it weighs a change nothing makes (only row changes have a
  weight);
* a public table with a foreign key to a table whose rows are private: its exact rows say which keys of the
  private table exist (``SELECT COUNT(*) FROM orders WHERE o_custkey = 7`` is answered without noise).

Pure: the policy and the catalog in, text out.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqldp.catalog import Catalog
from sqldp.policy.document import Policy
from sqldp.policy.tables import ColumnPolicy, TablePolicy
from sqldp.policy.values import EPOCH


def _bound(value: float, kind: str) -> str:
    if kind == "date":
        return (EPOCH + dt.timedelta(days=int(value))).isoformat()
    if value.is_integer() and abs(value) <= 2.0**63:
        return str(int(value))  # 2^63 and a BIGINT's range, not 9.22337e+18
    return f"{value:.15g}"


def _column_kind(catalog: Catalog | None, table: str, column: str) -> str:
    if catalog is None or table not in catalog.tables:
        return "other"
    col = catalog.tables[table].columns.get(column)
    return col.kind if col is not None else "other"


def _declared(t: TablePolicy, catalog: Catalog | None) -> list[str]:
    """The ranges, domains, units and priors a table's columns declare, as short phrases."""
    ranges, domains, priors = [], [], []
    for c in sorted(t.columns.values(), key=lambda c: c.name):
        kind = _column_kind(catalog, t.name, c.name)
        if c.range is not None:
            unit = f" ({c.unit}s)" if kind == "date" and c.unit != "day" else ""
            ranges.append(f"{c.name} [{_bound(c.range[0], kind)}, {_bound(c.range[1], kind)}]{unit}")
        if c.domain is not None:
            domains.append(f"{c.name} ({len(c.domain)} value{'s' if len(c.domain) != 1 else ''})")
        if c.knowledge is not None:
            priors.append(f"{c.name} ({_prior(c)})")
    out = []
    if ranges:
        out.append("ranges " + ", ".join(ranges))
    if domains:
        out.append("domains " + ", ".join(domains))
    if priors:
        out.append("attacker priors " + ", ".join(priors))
    return out


def _prior(c: ColumnPolicy) -> str:
    return c.knowledge.kind if c.knowledge is not None else "unknown"


def table_lines(policy: Policy, catalog: Catalog | None) -> dict[str, str]:
    """One line per table of the catalog (and per table the policy names), saying what protects it."""
    members: dict[str, list[str]] = {}
    if catalog is not None and policy.units:
        for unit, tables in policy.members(catalog).items():
            for table, paths in tables.items():
                how = " or ".join(" → ".join(str(hop) for hop in path) or "its own rows" for path in paths)
                members.setdefault(table, []).append(f"unit {unit} ({how})")
    names = sorted(set(policy.tables) | set(catalog.tables if catalog is not None else ()))
    out: dict[str, str] = {}
    for name in names:
        t = policy.tables.get(name)
        named = t is not None
        t = t or TablePolicy(name)
        parts: list[str] = []
        if name in members:
            parts.append(
                "private by unit: adding or removing one "
                + ", ".join(members[name])
                + " with every row that references it is a neighbouring change"
            )
        elif t.public:
            parts.append("public: rows and values released exactly, without noise")
        elif not t.rows_private:
            parts.append(f"value-private: rows public (counted exactly), the values of {t.norm} protected")
        else:
            weight = f"weight {t.weight:g}" + ("" if named else ", the default: not in the policy")
            parts.append(f"row-private ({weight})")
            if t.norm is not None:
                parts.append(f"values private under {t.norm}")
        for column, tau in t.max_rows_per.items():
            parts.append(
                f"at most {tau} row{'s' if tau != 1 else ''} per {column} (truncated where a query relies on it)"
            )
        parts += _declared(t, catalog)
        out[name] = "; ".join(parts)
    return out


def public_norm_notes(policy: Policy) -> list[str]:
    """A line for each table declared ``rows = "public"`` with a norm: it is value-private, not private."""
    return [
        f'{policy.source}: tables.{t.name}: rows = "public" with a norm: {t.name} is value-private — its rows are '
        f"public (counted exactly) and only the values of {t.norm} are protected"
        for t in sorted(policy.tables.values(), key=lambda t: t.name)
        if not t.rows_private and t.norm is not None
    ]


def warnings(policy: Policy, catalog: Catalog | None) -> list[str]:
    """Declarations that load without an error and are probably not what was meant (the module's list)."""
    out = [
        note + '; write rows = "private" to protect its rows too, or drop the norm'
        for note in public_norm_notes(policy)
    ]
    raw_tables: Any = policy.raw.get("tables", {})
    for t in sorted(policy.tables.values(), key=lambda t: t.name):
        spec: Any = {}
        if isinstance(raw_tables, dict):
            spec = next((v for k, v in raw_tables.items() if k.lower() == t.name), {})
        if not t.rows_private and isinstance(spec, dict) and "weight" in spec:
            out.append(
                f"{policy.source}: tables.{t.name}.weight: has no effect: {t.name}'s rows are public, and only a row "
                "change has a weight"
            )
    if catalog is None:
        return out
    in_unit = {table for tables in policy.members(catalog).values() for table in tables} if policy.units else set()

    def protected(name: str) -> bool:
        return name in in_unit or policy.table(name).rows_private

    for name in sorted(catalog.tables):
        if name in in_unit or policy.table(name).rows_private:
            continue
        for fk in catalog.tables[name].foreign_keys:
            if fk.ref_table in catalog.tables and protected(fk.ref_table):
                out.append(
                    f"{policy.source}: tables.{name}: public, but references private {fk.ref_table} through "
                    f"({', '.join(fk.columns)}): its exact rows tell which {fk.ref_table} keys exist and how often "
                    "each is referenced"
                )
    return out
