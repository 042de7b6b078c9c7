"""Loading what a command works with: DSN, catalog, policy and query text, from CLI-style options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqldp.catalog import Catalog
from sqldp.db import connect, resolve_dsn
from sqldp.policy import Policy


@dataclass(frozen=True)
class Context:
    catalog: Catalog
    policy: Policy
    dsn: str | None  # None when no database was needed


def load_context(
    *,
    dsn: str | None,
    data_dir: str | None,
    schema: str | Path | None,
    policy: str | Path | None,
    need_database: bool,
) -> Context:
    """The policy, the catalog (from ``schema`` or the database) and, when needed, the DSN."""
    pol = Policy.from_file(policy) if policy else Policy()
    resolved = resolve_dsn(dsn, data_dir) if (need_database or schema is None) else None
    if schema is not None:
        catalog = Catalog.from_file(schema)
    else:
        assert resolved is not None
        with connect(resolved) as conn:
            catalog = Catalog.from_database(conn)
    pol.validate(catalog)
    return Context(catalog, pol, resolved)
