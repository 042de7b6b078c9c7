"""sqldp: differentially private answers to ordinary PostgreSQL queries.

The pipeline (data flows one way): ``frontend`` (SQL text → relational algebra) → ``normalize``
(algebra → analysis form) → ``sensitivity`` (analysis form + policy → plan) → ``privacy`` (noise) →
``runner`` (the only module that talks to the database).
"""

from sqldp.errors import SqldpError

__all__ = ["SqldpError"]
__version__ = "0.1.0"
