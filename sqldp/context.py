"""Loading what a command works with: DSN, catalog, policy and query text, from CLI-style options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sqldp.catalog import Catalog
from sqldp.db import connect, resolve_dsn
from sqldp.policy import Policy

if TYPE_CHECKING:  # for the types only: psycopg costs ~0.1 s to import, and `explain --schema` reads no database
    import psycopg


@dataclass(frozen=True)
class Context:
    catalog: Catalog
    policy: Policy
    dsn: str | None  # None when no database was needed


def load_policy(policy: Policy | str | Path | None) -> Policy:
    """The policy object, from a file, or the default policy (every table private)."""
    return policy if isinstance(policy, Policy) else Policy.from_file(policy) if policy else Policy()


def load_catalog(schema: Catalog | str | Path | None, conn: psycopg.Connection | None) -> Catalog:
    """The catalog: given, from a schema file, or read from the database on ``conn``."""
    if isinstance(schema, Catalog):
        return schema
    if schema is not None:
        return Catalog.from_file(schema)
    assert conn is not None
    return Catalog.from_database(conn)


def load_context(
    *,
    dsn: str | None,
    data_dir: str | None,
    schema: str | Path | None,
    policy: str | Path | None,
    need_database: bool,
) -> Context:
    """The policy, the catalog (from ``schema`` or the database) and, when needed, the DSN."""
    pol = load_policy(policy)
    resolved = resolve_dsn(dsn, data_dir) if (need_database or schema is None) else None
    if schema is not None:
        catalog = load_catalog(schema, None)
    else:
        assert resolved is not None
        with connect(resolved) as conn:
            catalog = load_catalog(None, conn)
    pol.validate(catalog)
    return Context(catalog, pol, resolved)
