"""What every engine implements (:class:`Engine`) and hands back (:class:`Fetched`); the package's docstring,
:mod:`sqldp.engine`, says what an engine is. Apart from :mod:`sqldp.engine` itself, which the analyses import
and which therefore imports nothing of sqldp (this module imports sqldp.rewrite for its Statements).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqldp.engine import Dialect
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
    # seconds each statement (or part of one, sqldp.engine.postgres.engine.parts) took when last run on a connection
    # of its own: the two-connection path starts the longest first
    each: dict[str, float] = field(default_factory=dict)


class Engine(Protocol):
    @property
    def dialect(self) -> Dialect:
        """The SQL the engine runs and what of PostgreSQL's meaning it keeps (what the analyses ask)."""
        ...

    def execute(self, statements: Statements, speed: Speed) -> Fetched:
        """Run every statement in one snapshot. Raises :class:`sqldp.errors.DatabaseError` on failure."""
        ...

    def check(self, texts: Sequence[str]) -> None:
        """Have the database parse and type each statement without running it (reads no row). Raises
        :class:`sqldp.errors.StatementError` for one it refuses."""
        ...

    def largest_estimate(self, texts: Sequence[str]) -> tuple[float, int] | None:
        """The planner's row estimate of the largest step among the statements, and the statement's index
        (EXPLAIN, nothing run); None where the engine has no planner estimate to ask."""
        ...

    def connection(self) -> AbstractContextManager[Any]:
        """A connection to the database as the analyst role, for the library user's own statements; raises
        :class:`sqldp.errors.InputError` where the engine has none to give."""
        ...

    def execute_public(self, sql: str) -> tuple[list[str], list[Row]]:
        """Run one statement that reads public relations only: its column names and rows."""
        ...

    def close(self) -> None: ...
