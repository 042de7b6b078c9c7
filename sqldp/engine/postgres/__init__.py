"""The PostgreSQL engine: :mod:`sqldp.engine.postgres.engine` (connections, one snapshot per query,
pipelining), :mod:`sqldp.engine.postgres.dialect` (:data:`DIALECT`), :func:`open`, which reads the
catalog as the owner and hands back an engine that runs as the analyst role, and
:mod:`sqldp.engine.postgres.cli` (the command line's session). Importing this package imports
no database driver (``sqldp explain`` and ``--help`` read no database): psycopg comes with :func:`open`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.engine.postgres.dialect import POSTGRES
from sqldp.limits import DEFAULT_STATEMENT_TIMEOUT

if TYPE_CHECKING:
    from sqldp.catalog import Catalog
    from sqldp.engine.postgres.engine import PostgresEngine
    from sqldp.policy import Policy

DIALECT = POSTGRES


@dataclass(frozen=True)
class Opened:
    """An engine and what :func:`open` read to build it: the catalog, and the owner's DSN (``dsn``, which
    reads the catalog and grants; the engine's own ``dsn`` is the analyst role's)."""

    engine: PostgresEngine
    catalog: Catalog
    dsn: str


def open(
    dsn: str | None = None,
    *,
    schema: Catalog | str | Path | None = None,
    data_dir: str | Path | None = None,
    analyst_dsn: str | None = None,
    allow_privileged: bool = False,
    pool: Any = None,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
    policy: Policy | None = None,
) -> Opened:
    """The engine on ``dsn`` (default: ``$SQLDP_DSN``, else the embedded server; sqldp.db.resolve_dsn). ``dsn``
    is the owner's: it reads the catalog (from ``schema`` when given: a Catalog or a DDL file) and the grants;
    the engine's statements run on connections to an analyst role that may only read the catalog's tables
    (sqldp.db.analyst_dsn; ``analyst_dsn`` names one, ``allow_privileged`` lets it be the owner). ``pool``: an
    optional psycopg_pool.ConnectionPool of connections set up by sqldp.engine.postgres.engine.configure (the
    proxy reuses connections: opening one per query costs milliseconds). ``statement_timeout``: seconds a
    statement may run (None or 0: no limit). ``policy``: checked against the catalog before any grant."""
    from sqldp import db
    from sqldp.context import load_catalog
    from sqldp.engine.postgres.engine import PostgresEngine

    owner_dsn = db.resolve_dsn(dsn, data_dir)
    with db.connect(owner_dsn) as owner:
        catalog = load_catalog(schema, owner)
        if policy is not None:
            policy.validate(catalog)
        tables = sorted(t.name for t in catalog.tables.values())
        analyst, first = db.analyst_dsn(
            owner_dsn, tables, explicit=analyst_dsn, allow_privileged=allow_privileged, owner_conn=owner
        )
    engine = PostgresEngine(analyst, pool=pool, first=first, statement_timeout=statement_timeout or None)
    return Opened(engine, catalog, owner_dsn)
