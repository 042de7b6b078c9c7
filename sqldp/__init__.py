"""sqldp: differentially private answers to ordinary PostgreSQL queries.

The pipeline (data flows one way): ``frontend`` (SQL text → relational algebra) → ``normalize``
(algebra → analysis form) → ``sensitivity`` (analysis form + policy → plan) → ``rewrite`` (the SQL that
runs) → ``engine`` (the only code that talks to the database) → ``release`` (composition, β, noise from
``mechanisms``, post-processing). ``session`` holds them together; ``runner`` runs one prepared query.

    import sqldp
    session = sqldp.connect(policy="policy.toml")      # embedded PostgreSQL, or a DSN
    result = session.run("SELECT COUNT(*) FROM t", epsilon=1.0)
    result.answer, result.to_json()  # the noisy answer and data-independent figures; audit=True adds the rest

    session = sqldp.connect(spark=spark_session, policy="policy.toml", schema="keys.sql")   # on Apache Spark
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.errors import SqldpError
from sqldp.limits import DEFAULT_MAX_ESTIMATED_ROWS, DEFAULT_STATEMENT_TIMEOUT

if TYPE_CHECKING:
    from sqldp.catalog import Catalog
    from sqldp.engine.base import Engine
    from sqldp.policy import Policy
    from sqldp.session import Session

__all__ = ["SqldpError", "connect"]
__version__ = "0.1.0"


def connect(
    dsn: str | None = None,
    policy: Policy | str | Path | None = None,
    *,
    schema: Catalog | str | Path | None = None,
    data_dir: str | Path | None = None,
    seed: int | None = None,
    pool: Any = None,
    analyst_dsn: str | None = None,
    allow_privileged: bool = False,
    budget: float | None = None,
    delta_budget: float | None = None,
    spark: Any = None,
    spark_tables: Mapping[str, str] | None = None,
    statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
    max_estimated_rows: float | None = DEFAULT_MAX_ESTIMATED_ROWS,
) -> Session:
    """Open a :class:`sqldp.session.Session` on ``dsn`` (default: ``$SQLDP_DSN``, else the embedded server;
    sqldp.engine.postgres.open says what the other PostgreSQL arguments do), or with ``spark=<SparkSession>``
    on Spark (sqldp.engine.spark.open; keys from ``schema=<DDL file>``). The engine is built here, the session
    receives it."""
    from sqldp.context import load_policy
    from sqldp.errors import InputError
    from sqldp.limits import check_limit
    from sqldp.session import Session

    check_limit("statement_timeout", statement_timeout)
    check_limit("max_estimated_rows", max_estimated_rows)
    pol = load_policy(policy)
    if spark is not None:
        if dsn is not None or pool is not None or analyst_dsn is not None:
            raise InputError("give either a SparkSession or a PostgreSQL DSN, not both", where="spark")
        from sqldp.engine import spark as on_spark

        on = on_spark.open(spark, spark_tables, schema, policy=pol)
        engine: Engine = on.engine
        catalog, owner = on.catalog, None
    else:
        from sqldp.engine import postgres

        opened = postgres.open(
            dsn,
            schema=schema,
            data_dir=data_dir,
            analyst_dsn=analyst_dsn,
            allow_privileged=allow_privileged,
            pool=pool,
            statement_timeout=statement_timeout,
            policy=pol,
        )
        engine, catalog, owner = opened.engine, opened.catalog, opened.dsn
    return Session(
        engine,
        pol,
        catalog=catalog,
        dsn=owner,
        seed=seed,
        budget=budget,
        delta_budget=delta_budget,
        max_estimated_rows=max_estimated_rows,
    )
