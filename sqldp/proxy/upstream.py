"""Upstream connections shared by analysts: every connection goes back to its pool as it came out.

The runner's connections are pooled (opening one per query costs milliseconds), so anything a statement leaves
in its upstream session — a setting (``set_config(name, value, false)``), a role, an advisory lock, a cursor,
a temporary table — would reach whichever analyst runs next on that connection: a ``statement_timeout`` of
1 ms set by one analyst made another's queries fail. :class:`ResettingPool` calls :func:`Isolation.reset` on
every returned connection, in the thread returning it, before the pool offers it again: the session state is
reset, the connection's own set-up is applied again, and the roles are checked. (psycopg_pool's own ``reset``
callback runs in one of its worker threads: one more thread to wake and hand the GIL to on every use, which
cost more CPU than the reset itself. The proxy returns a statement's connections after handing its answer to
the event loop, sqldp.engine.postgres.engine.returning_after, so the reset is off the answer's path all the same.)
Every ``check_every``-th reset, and the first of each connection, also compares the whole session state
(:data:`STATE`) with what it was right after that set-up: the reset clears what it names for certain, and the
comparison (1-3 ms of catalog reads, more than a small query takes) is there to catch what it might not. A
connection that does not compare equal is closed, never handed out again.

The reset, the set-up (when given as SQL, ``setup_sql``) and the role check are one message of the simple
query protocol, so one round trip: each round trip costs the proxy and PostgreSQL about 0.025 ms of CPU
whatever it carries, and the four the reset took before (reset, two settings, roles) cost 0.16 ms of CPU per
use on each side, one 0.07 in the proxy and 0.06 in PostgreSQL. Skipping the reset after a use whose
statements all ran in a transaction that was rolled back (a rollback undoes ``SET``, ``set_config`` and
``SET ROLE``; PostgreSQL manual, SET) was measured and is no cheaper: the BEGIN and the ROLLBACK are a round
trip each, since psycopg forgets its prepared statements on any ROLLBACK, and a rollback leaves what is not
transactional (advisory locks, sequences' ``currval``) for the comparison to find.

``DISCARD ALL`` would do the reset in one statement but also deallocates the prepared statements the runner
relies on (its analysis queries are prepared once per connection, so re-planning them on every query would
cost more than some queries take); the statements below are what ``DISCARD ALL`` does less ``DEALLOCATE ALL``
and ``DISCARD PLANS`` (PostgreSQL manual, DISCARD). Prepared statements themselves cannot be created by an
analyst (``PREPARE`` is refused) and the check counts any that were.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg_pool import ConnectionPool

RESET = "RESET ALL; SET SESSION AUTHORIZATION DEFAULT; CLOSE ALL; UNLISTEN *; DISCARD TEMP; DISCARD SEQUENCES"
# only where the role may take advisory locks at all (sqldp's analyst role on its embedded server may not:
# sqldp.db revokes the functions, and calling one would fail the reset)
UNLOCK = "; SELECT pg_advisory_unlock_all()"
CAN_LOCK = "SELECT has_function_privilege('pg_advisory_unlock_all()', 'EXECUTE')"
ROLES = "SELECT current_user::text, session_user::text"
# Everything a session can carry over that the reset is meant to clear; compared before and after.
STATE = """SELECT
 (SELECT coalesce(string_agg(name || '=' || setting, ',' ORDER BY name), '')
    FROM pg_settings WHERE source IN ('client', 'session')),
 current_user::text, session_user::text,
 (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory'),
 (SELECT count(*) FROM pg_prepared_statements WHERE from_sql),
 (SELECT count(*) FROM pg_cursors),
 (SELECT count(*) FROM pg_listening_channels()),
 (SELECT count(*) FROM information_schema.tables WHERE table_type = 'LOCAL TEMPORARY')"""
# (information_schema, not pg_class: the analyst role may not read pg_class, sqldp.db; the view reads it as
# its owner and lists the temporary tables the session can see, its own)


class LeftoverState(psycopg.InterfaceError):
    """A returned connection whose session state differs from its set-up's after the reset (the pool closes
    it: psycopg_pool discards a connection whose reset callback raises)."""


def state(conn: psycopg.Connection) -> tuple[Any, ...]:
    row = conn.execute(STATE, prepare=False).fetchone()
    assert row is not None
    return tuple(row)


class Isolation:
    """``configure`` and ``reset`` callbacks for a psycopg_pool.ConnectionPool of autocommit connections.
    ``setup_sql``: the statements ``setup`` runs, when it runs nothing else; the reset then sends them with its
    own statements and the role check, in one message (else it calls ``setup`` after the reset)."""

    def __init__(
        self, setup: Callable[[psycopg.Connection], None], check_every: int = 50, *, setup_sql: Sequence[str] = ()
    ) -> None:
        self.setup = setup
        self.setup_sql = tuple(setup_sql)
        self.check_every = check_every
        self._baseline: weakref.WeakKeyDictionary[psycopg.Connection, tuple[Any, ...]] = weakref.WeakKeyDictionary()
        self._checked: weakref.WeakSet[psycopg.Connection] = weakref.WeakSet()
        self._reset: weakref.WeakKeyDictionary[psycopg.Connection, str] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self.resets = 0  # how many returned connections were reset (for tests and benchmarks)
        self.checks = 0  # how many of them had their whole state compared

    def configure(self, conn: psycopg.Connection) -> None:
        self.setup(conn)
        baseline = state(conn)
        can_lock = conn.execute(CAN_LOCK, prepare=False).fetchone()
        with self._lock:
            self._baseline[conn] = baseline
            self._reset[conn] = RESET + (UNLOCK if can_lock and can_lock[0] else "")

    def reset(self, conn: psycopg.Connection) -> None:
        with self._lock:
            baseline = self._baseline.get(conn)
            reset = self._reset.get(conn, RESET)
        if baseline is None:
            raise LeftoverState("a connection the pool did not set up")
        roles: Any = None
        if self.setup_sql:  # several statements: the simple query protocol, one round trip; ROLES' row last
            cur = conn.cursor()
            cur.execute("; ".join((reset, *self.setup_sql, ROLES)), prepare=False)
            while cur.nextset():
                pass
            roles = cur.fetchone()
        else:
            conn.cursor().execute(reset, prepare=False)
            self.setup(conn)
        with self._lock:
            self.resets += 1
            full = self.resets % self.check_every == 1 or self.check_every == 1 or conn not in self._checked
            self._checked.add(conn)
        if full:
            with self._lock:
                self.checks += 1
            if state(conn) != baseline:
                raise LeftoverState("session state survived the reset")
        else:
            if roles is None:
                roles = conn.execute(ROLES, prepare=False).fetchone()
            if tuple(roles) != baseline[1:3]:
                raise LeftoverState("the session's role survived the reset")


class ResettingPool(ConnectionPool):
    """A psycopg_pool.ConnectionPool of autocommit connections set up by ``isolation.configure`` and reset by
    ``isolation.reset`` in the thread that returns them (:meth:`putconn`; ``connection()`` returns through
    it). A connection still in a transaction is rolled back first, as psycopg_pool does; one whose reset fails
    is closed, and the pool replaces it."""

    def __init__(self, conninfo: str, *, isolation: Isolation, **kwargs: Any) -> None:
        super().__init__(conninfo, configure=isolation.configure, reset=None, **kwargs)
        self.isolation = isolation

    def putconn(self, conn: psycopg.Connection) -> None:
        if not self.closed and not conn.closed:
            try:
                status = conn.info.transaction_status
                if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
                    conn.rollback()
                    status = conn.info.transaction_status
                if status != TransactionStatus.IDLE:
                    raise LeftoverState(f"connection returned in state {status.name}")
                self.isolation.reset(conn)
            except Exception:  # whatever failed, the connection is not offered again (fail closed)
                conn.close()
        super().putconn(conn)
