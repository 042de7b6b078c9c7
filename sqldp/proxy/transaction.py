"""A connection's transaction block as its client sees it: the status ReadyForQuery reports (PostgreSQL manual
§55.7: I idle, T in a block, E in a failed block) and the block's savepoints.

Nothing is written upstream: every statement the proxy runs is read only, in a snapshot of its own, so a block
only has to behave as PostgreSQL's does towards the client — BEGIN, COMMIT and ROLLBACK, SAVEPOINT, RELEASE and
ROLLBACK TO, an error failing the block until it ends — and to say which named cursors (sqldp.proxy.cursors) a
block's end or a rollback to a savepoint closes."""

from __future__ import annotations

from sqldp.proxy.errors import NoSavepoint, NoTransaction


class Transaction:
    def __init__(self) -> None:
        self.status = "I"  # ReadyForQuery: I idle, T in a transaction block, E failed transaction block
        # the open block's savepoints, innermost last, each with the cursors declared since it (ROLLBACK TO
        # closes those, as PostgreSQL drops the portals of a rolled-back subtransaction)
        self.savepoints: list[tuple[str, set[str]]] = []

    @property
    def failed(self) -> bool:
        return self.status == "E"

    def fail(self) -> None:
        """An error: an open block fails, and takes only COMMIT, ROLLBACK and ROLLBACK TO until then."""
        if self.status == "T":
            self.status = "E"

    def begin(self) -> None:
        """BEGIN (inside a block PostgreSQL only warns; so does nothing here)."""
        if self.status == "I":
            self.status = "T"

    def end(self, *, commit: bool) -> bool:
        """COMMIT (``commit``) or ROLLBACK; whether the block committed: a failed block rolls back either way."""
        committed = commit and self.status != "E"
        self.savepoints.clear()
        self.status = "I"
        return committed

    def require(self, what: str) -> None:
        """25P01 outside a block, for ``what`` (SAVEPOINT, DECLARE without HOLD, …), which needs one."""
        if self.status == "I":
            raise NoTransaction(what)

    def declared(self, cursor: str) -> None:
        """A cursor declared now: a rollback to a savepoint set before closes it."""
        if self.savepoints and self.status == "T":
            self.savepoints[-1][1].add(cursor)

    def savepoint(self, name: str) -> None:
        self.savepoints.append((name, set()))

    def release(self, name: str) -> None:
        """RELEASE: the savepoint and those after it go; what was declared since merges into the enclosing level."""
        _, since = self._unwind(name)
        self.savepoints.pop()
        if self.savepoints:
            self.savepoints[-1][1].update(since)

    def rollback_to(self, name: str) -> set[str]:
        """ROLLBACK TO: the block is no longer failed, the savepoint stays, those after it go; the cursors
        declared since it, to close."""
        at, since = self._unwind(name)
        self.savepoints[at][1].clear()
        self.status = "T"
        return since

    def _unwind(self, name: str) -> tuple[int, set[str]]:
        """The latest savepoint of that name (PostgreSQL manual, SAVEPOINT: the latest of a repeated name is
        meant), with those after it dropped, and the cursors declared since it."""
        at = next((i for i in range(len(self.savepoints) - 1, -1, -1) if self.savepoints[i][0] == name), None)
        if at is None:
            raise NoSavepoint(name)
        since = set().union(*(declared for _, declared in self.savepoints[at:]))
        del self.savepoints[at + 1 :]
        return at, since
