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

from typing import TYPE_CHECKING, Any

from sqldp.errors import SqldpError

if TYPE_CHECKING:
    from sqldp.session import Session

__all__ = ["SqldpError", "connect"]
__version__ = "0.1.0"


def connect(dsn: str | None = None, policy: Any = None, **kwargs: Any) -> Session:
    """Open a :class:`sqldp.session.Session` on ``dsn`` (default: ``$SQLDP_DSN``, else the embedded server), or
    with ``spark=<SparkSession>`` on Spark (sqldp.engine.spark; keys from ``schema=<DDL file>``)."""
    from sqldp.session import Session

    return Session(dsn, policy, **kwargs)
