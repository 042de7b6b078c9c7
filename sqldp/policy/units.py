"""``[units.NAME]`` and ``[[foreign_keys]]``: privacy units, and the foreign-key paths by which rows belong to them.

A *unit* is the individual the policy protects — a customer with all their orders and line items — rather
than a single row (Dong, Fang, Yi, Tao and Machanavajjhala, "R2T: Instance-optimal Truncation for
Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022, §2: the *primary private relation*
and the relations that reference it through foreign keys)::

    [units.customer]
    table = "customer"          # optional: the unit's name by default
    key = "c_custkey"           # the column whose value identifies one unit
    max_contribution = 1e6      # optional: GS_Q, the largest COUNT or SUM one unit may add (R2T §4)

    [[foreign_keys]]            # only where the database declares none: the catalog's are read as well
    table = "orders"
    columns = ["o_custkey"]
    references = "customer"
    ref_columns = ["c_custkey"] # optional: the referenced table's primary key

Neighbouring databases differ by one unit: the unit table's rows with one key value and every row that
references them, transitively, along foreign keys (R2T §2). A table belongs to a unit when a chain of foreign
keys leads from it to the unit's key (:func:`memberships`); a table reachable from no unit is public or
row-private as ``[tables.T]`` says. Membership follows from the catalog, so it is resolved in
:meth:`sqldp.policy.Policy.validate`, where a unit member declared ``rows = "public"`` (or with a ``weight`` or
``norm``, which the unit supersedes) is an error rather than silently overridden.

``max_contribution`` bounds the race of thresholds only: a unit contributing more is truncated (accuracy, not
privacy, depends on it), so the default is R2T's own default for GS_Q, 10⁶.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqldp.errors import PolicyError
from sqldp.policy.keys import check_keys
from sqldp.policy.tables import check_folded
from sqldp.policy.values import is_number

UNIT_KEYS = {"table", "key", "max_contribution"}
FK_KEYS = {"table", "columns", "references", "ref_columns"}
DEFAULT_CONTRIBUTION = 1e6  # R2T's default GS_Q (its -G option)
MAX_CONTRIBUTION = 2.0**62  # τ = 2^j up to 2^62: 62 races at most
MAX_PATHS = 64  # paths per (table, unit): a schema with more is refused rather than explored


@dataclass(frozen=True)
class Unit:
    """One privacy unit: the rows of ``table`` with one value of ``key`` and everything referencing them."""

    name: str
    table: str
    key: str
    max_contribution: float = DEFAULT_CONTRIBUTION


@dataclass(frozen=True)
class Reference:
    """A foreign key ``table(columns) → references(ref_columns)``, from the catalog or the policy."""

    table: str
    columns: tuple[str, ...]
    references: str
    ref_columns: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.table}({', '.join(self.columns)}) → {self.references}({', '.join(self.ref_columns)})"


Path = tuple[Reference, ...]  # the hops from a member table to the unit's table; () for the unit's own table


def parse_units(raw: Any, where: str) -> dict[str, Unit]:
    """``[units.NAME]`` for every NAME (names and columns lower case, as PostgreSQL folds them)."""
    if not isinstance(raw, dict):
        raise PolicyError("must be a table of tables", where=where)
    check_folded(raw, where)
    out = {}
    for name, spec in raw.items():
        at = f"{where}.{name}"
        check_keys(spec, UNIT_KEYS, ("key",), at)
        table, key = spec.get("table", name), spec["key"]
        for k, v in (("table", table), ("key", key)):
            if not isinstance(v, str) or not v:
                raise PolicyError(f"must be a non-empty string, got {v!r}", where=f"{at}.{k}")
        gs = spec.get("max_contribution", DEFAULT_CONTRIBUTION)
        if not is_number(gs) or not (1 <= gs <= MAX_CONTRIBUTION):
            raise PolicyError(f"must be a number in [1, 2^62], got {gs!r}", where=f"{at}.max_contribution")
        out[name.lower()] = Unit(name.lower(), table.lower(), key.lower(), float(gs))
    tables = [u.table for u in out.values()]
    for u in out.values():
        if tables.count(u.table) > 1:
            raise PolicyError(f"table {u.table!r} is the table of two units; declare it once", where=where)
    return out


def parse_references(raw: Any, where: str) -> tuple[Reference, ...]:
    """``[[foreign_keys]]``: foreign keys the database does not declare (``ref_columns`` may be left to the
    referenced table's primary key, filled in by :func:`memberships`)."""
    if not isinstance(raw, list):
        raise PolicyError("must be an array of tables ([[foreign_keys]])", where=where)
    out = []
    for i, spec in enumerate(raw):
        at = f"{where}[{i}]"
        check_keys(spec, FK_KEYS, ("table", "columns", "references"), at)
        names = {}
        for k in ("table", "references"):
            if not isinstance(spec[k], str) or not spec[k]:
                raise PolicyError(f"must be a non-empty string, got {spec[k]!r}", where=f"{at}.{k}")
            names[k] = spec[k].lower()
        cols = {}
        for k in ("columns", "ref_columns"):
            v = spec.get(k, [])
            if not isinstance(v, list) or not all(isinstance(c, str) and c for c in v) or (k == "columns" and not v):
                raise PolicyError("must be a non-empty list of column names", where=f"{at}.{k}")
            cols[k] = tuple(c.lower() for c in v)
        if cols["ref_columns"] and len(cols["ref_columns"]) != len(cols["columns"]):
            raise PolicyError("columns and ref_columns must have the same length", where=at)
        out.append(Reference(names["table"], cols["columns"], names["references"], cols["ref_columns"]))
    return tuple(out)


def references(catalog: Any, declared: tuple[Reference, ...], where: str) -> tuple[Reference, ...]:
    """The catalog's foreign keys and the policy's, each checked against the catalog: the columns exist and the
    referenced ones are the referenced table's primary key or a UNIQUE constraint, so that a row references
    at most one row and hence belongs to at most one unit through it (R2T §2 assumes foreign keys to primary
    keys; PostgreSQL itself requires a unique referenced key)."""
    out: list[Reference] = []
    for t in catalog.tables.values():
        for fk in t.foreign_keys:
            ref = catalog.tables.get(fk.ref_table)
            ref_cols = fk.ref_columns or (ref.primary_key if ref is not None else ())
            out.append(Reference(t.name, tuple(fk.columns), fk.ref_table, tuple(ref_cols)))
    for i, r in enumerate(declared):
        at = f"{where}: foreign_keys[{i}]"
        for table, cols in ((r.table, r.columns), (r.references, r.ref_columns)):
            if table not in catalog.tables:
                raise PolicyError(f"table {table!r} is not in the schema ({catalog.source})", where=at)
            for c in cols:
                if c not in catalog.tables[table].columns:
                    raise PolicyError(f"column {c!r} is not in table {table!r}", where=at)
        target = catalog.tables[r.references]
        ref_cols = r.ref_columns or target.primary_key
        if len(ref_cols) != len(r.columns):
            raise PolicyError(f"{r.references}'s primary key has {len(ref_cols)} columns; give ref_columns", where=at)
        out.append(Reference(r.table, r.columns, r.references, tuple(ref_cols)))
    for r in out:
        target = catalog.tables.get(r.references)
        keys = [target.primary_key, *target.unique] if target is not None else []
        if not any(set(k) == set(r.ref_columns) for k in keys if k):
            raise PolicyError(
                f"foreign key {r}: the referenced columns are not a primary key or UNIQUE, so a row could "
                "reference several rows (and belong to several units)",
                where=where,
            )
    return tuple(dict.fromkeys(out))


def memberships(
    units: Mapping[str, Unit], refs: tuple[Reference, ...], where: str
) -> dict[str, dict[str, tuple[Path, ...]]]:
    """Per unit, the tables that belong to it and every foreign-key path from each to the unit's key (a path
    visits a table at most once: a cycle of foreign keys adds no way to belong)."""
    by_target: dict[str, list[Reference]] = {}
    for r in refs:
        by_target.setdefault(r.references, []).append(r)
    out: dict[str, dict[str, tuple[Path, ...]]] = {}
    for unit in units.values():
        paths: dict[str, list[Path]] = {unit.table: [()]}
        # walk backwards from the unit's table: a table that references a member belongs to the unit (the first
        # hop must reference the unit's key itself; any unique key of a member identifies its row further on)
        frontier: list[tuple[str, Path]] = [(unit.table, ())]
        while frontier:
            table, path = frontier.pop()
            for r in by_target.get(table, []):
                if r.table == unit.table or any(h.table == r.table for h in path):
                    continue
                if not path and unit.key not in r.ref_columns:
                    continue  # references another unique column of the unit's table, not the unit's key
                longer = (r, *path)
                found = paths.setdefault(r.table, [])
                found.append(longer)
                if len(found) > MAX_PATHS:
                    raise PolicyError(
                        f"unit {unit.name}: table {r.table!r} reaches it by more than {MAX_PATHS} foreign-key paths",
                        where=where,
                    )
                frontier.append((r.table, longer))
        out[unit.name] = {t: tuple(p) for t, p in sorted(paths.items())}
    return out


def check_units(units: Mapping[str, Unit], catalog: Any, where: str) -> None:
    """Each unit's table and key exist."""
    for u in units.values():
        at = f"{where}: units.{u.name}"
        if u.table not in catalog.tables:
            raise PolicyError(f"table {u.table!r} is not in the schema ({catalog.source})", where=at)
        if u.key not in catalog.tables[u.table].columns:
            raise PolicyError(f"column {u.key!r} is not in table {u.table!r}", where=f"{at}.key")


def check_members(members: Mapping[str, Mapping[str, tuple[Path, ...]]], tables: Mapping[str, Any], where: str) -> None:
    """No unit member is declared public or given a row weight or norm: the unit protects all its rows and their
    values, and a second model for the same rows would be ambiguous."""
    for unit, paths in members.items():
        for table in paths:
            t = tables.get(table)
            if t is None:
                continue
            clash = [
                k
                for k, bad in (("rows", not t.rows_private), ("weight", t.weight != 1.0), ("norm", t.norm is not None))
                if bad
            ]
            if clash:
                path = paths[table][0]
                via = " via " + ", ".join(map(str, path)) if path else ""
                raise PolicyError(
                    f"table {table!r} belongs to unit {unit!r}{via}: all its rows and values are protected with the "
                    f"unit; remove {', '.join(clash)}",
                    where=f"{where}: tables.{table}",
                )
