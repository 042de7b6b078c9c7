"""Execution engines (pipeline step 5 of 6, docs/layout.md): the only code that talks to a database.

An engine runs the statements of one analysed query (:class:`sqldp.rewrite.Statements`) in ONE snapshot, so
the answer and its sensitivity see the same data, and hands back plain rows; what to run is decided before
(sqldp.rewrite), what to release after (sqldp.release). PostgreSQL is :mod:`sqldp.engine.postgres`, Apache
Spark :mod:`sqldp.engine.spark` (its statements in Spark SQL, :mod:`sqldp.spark_sql`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqldp.rewrite import Statements

Row = tuple[Any, ...]


@dataclass
class Fetched:
    """What one run read: the answer rows, each plan query's rows (in :attr:`Statements.queries` order), each
    public group domain's values (None where the policy declares it), and how long it took (seconds)."""

    answer: list[Row]
    queries: list[list[Row]]
    domains: list[tuple[Any, ...] | None]
    answer_seconds: float
    queries_seconds: float


@dataclass
class Speed:
    """How long a query's statements took last time, which decides how the engine runs them next time; shared
    by the copies of a prepared query."""

    last: float = 0.0
    # seconds each statement (or part of one, sqldp.engine.postgres.parts) took when last run on a connection
    # of its own: the two-connection path starts the longest first
    each: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        """Run every statement in one snapshot. Raises :class:`sqldp.errors.DatabaseError` on failure."""
        ...

    def check(self, texts: Sequence[str]) -> None:
        """Have the database parse and type each statement without running it (reads no row). Raises
        :class:`sqldp.errors.StatementError` for one it refuses."""
        ...

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        """Run one statement that reads public relations only: its column names and rows."""
        ...

    def close(self) -> None: ...
