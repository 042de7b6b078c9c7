"""The per-analyst privacy budget, kept in PostgreSQL (schema ``sqldp``, outside the analysts' catalog).

``sqldp.budget_ledger`` holds one row per analyst: limits and what was spent; ``sqldp.budget_charges`` one row
per charge (and per reset), so that ``SUM(charges) = spent`` can be audited. A charge is one statement,
committed before the proxy releases the answer it pays for:

    UPDATE … SET epsilon_spent = epsilon_spent + ε … WHERE analyst = A AND epsilon_spent + ε <= epsilon_limit …

Under READ COMMITTED a concurrent UPDATE of the same row waits for the first and then re-checks the WHERE
clause against the committed row (PostgreSQL manual §13.2.1), so concurrent sessions cannot overspend. A
crash between the commit and the release loses budget; it can never release an answer that was not paid for.
Amounts are ``numeric`` so that sums are exact.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from sqldp.errors import BudgetExhaustedError, ForbiddenError

DDL = """
CREATE SCHEMA IF NOT EXISTS sqldp;
CREATE TABLE IF NOT EXISTS sqldp.budget_ledger (
    analyst text PRIMARY KEY,
    epsilon_limit numeric NOT NULL CHECK (epsilon_limit >= 0),
    delta_limit numeric NOT NULL CHECK (delta_limit >= 0),
    epsilon_spent numeric NOT NULL DEFAULT 0 CHECK (epsilon_spent >= 0),
    delta_spent numeric NOT NULL DEFAULT 0 CHECK (delta_spent >= 0),
    queries bigint NOT NULL DEFAULT 0,
    updated timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS sqldp.budget_charges (
    id bigserial PRIMARY KEY,
    analyst text NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    fingerprint text NOT NULL,
    epsilon numeric NOT NULL,
    delta numeric NOT NULL
);
"""

CHARGE = """
WITH c AS (
    UPDATE sqldp.budget_ledger
    SET epsilon_spent = epsilon_spent + %(e)s, delta_spent = delta_spent + %(d)s,
        queries = queries + 1, updated = now()
    WHERE analyst = %(a)s AND epsilon_spent + %(e)s <= epsilon_limit AND delta_spent + %(d)s <= delta_limit
    RETURNING epsilon_spent, epsilon_limit, delta_spent, delta_limit
), logged AS (
    INSERT INTO sqldp.budget_charges (analyst, fingerprint, epsilon, delta)
    SELECT %(a)s, %(f)s, %(e)s, %(d)s FROM c
)
SELECT epsilon_spent, epsilon_limit, delta_spent, delta_limit FROM c
"""


@dataclass(frozen=True)
class Balance:
    analyst: str
    epsilon_limit: Decimal
    delta_limit: Decimal
    epsilon_spent: Decimal
    delta_spent: Decimal
    queries: int = 0

    @property
    def epsilon_left(self) -> Decimal:
        return max(Decimal(0), self.epsilon_limit - self.epsilon_spent)

    def to_json(self) -> dict[str, Any]:
        return {
            "analyst": self.analyst,
            "epsilon_limit": float(self.epsilon_limit),
            "epsilon_spent": float(self.epsilon_spent),
            "epsilon_left": float(self.epsilon_left),
            "delta_limit": float(self.delta_limit),
            "delta_spent": float(self.delta_spent),
            "queries": self.queries,
        }


def amount(x: float | None) -> Decimal:
    """A float as the exact decimal of its shortest repr (so 0.1 is charged as 0.1, not 0.1000000000000000055…)."""
    return Decimal(repr(float(x))) if x else Decimal(0)


def ensure(conn: Any) -> None:
    """Create the ledger tables if needed. ``conn`` is a psycopg connection; serialised by an advisory lock
    because concurrent ``CREATE … IF NOT EXISTS`` can still collide on the catalog."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('sqldp.budget_ledger'))")
        conn.execute(DDL)


def sync_limits(conn: Any, limits: Iterable[tuple[str, float, float]]) -> None:
    """Insert or update each analyst's limits from the policy; what was spent is kept."""
    with conn.transaction():
        for name, eps, delta in limits:
            conn.execute(
                "INSERT INTO sqldp.budget_ledger (analyst, epsilon_limit, delta_limit) VALUES (%s, %s, %s) "
                "ON CONFLICT (analyst) DO UPDATE SET epsilon_limit = EXCLUDED.epsilon_limit, "
                "delta_limit = EXCLUDED.delta_limit, updated = now()",
                (name, amount(eps), amount(delta)),
            )


def charge(conn: Any, analyst: str, epsilon: float, delta: float | None, fingerprint: str) -> Balance:
    """Charge (ε, δ) in one committed statement, or raise :class:`BudgetExhaustedError` and charge nothing.
    ``conn`` must be in autocommit mode: the statement is its own transaction and is durable on return."""
    e, d = amount(epsilon), amount(delta)
    row = conn.execute(CHARGE, {"a": analyst, "e": e, "d": d, "f": fingerprint}).fetchone()
    if row is not None:
        return Balance(analyst, row[1], row[3], row[0], row[2])
    raise refusal(conn, analyst, e, d)


def refusal(conn: Any, analyst: str, e: Decimal, d: Decimal) -> ForbiddenError | BudgetExhaustedError:
    """Why a charge of (``e``, ``d``) that updated no row was refused (nothing was charged)."""
    current = balance(conn, analyst)
    if current is None:
        return ForbiddenError(f"analyst {analyst!r} has no budget in the ledger")
    if current.delta_spent + d > current.delta_limit:
        return BudgetExhaustedError(
            f"privacy budget exhausted: the query needs δ = {d}, analyst {analyst!r} has "
            f"{max(Decimal(0), current.delta_limit - current.delta_spent)} of δ left"
        )
    return BudgetExhaustedError(
        f"privacy budget exhausted: the query needs ε = {e}, analyst {analyst!r} has {current.epsilon_left} of "
        f"{current.epsilon_limit} left"
    )


@dataclass
class _Charge:
    analyst: str
    e: Decimal
    d: Decimal
    fingerprint: str
    done: bool = False
    row: tuple[Any, ...] | None = None
    error: BaseException | None = None


class GroupCommit:
    """Charges of concurrent answers written in one transaction, one commit (one WAL flush) for all: group
    commit, with "no answer without a durable charge" kept — :meth:`charge` returns only once the transaction
    holding its charge has committed, and raises (nothing charged, since the transaction rolled back) if it
    failed.

    Leader and followers, no thread of its own: a thread that charges while no other is writing becomes the
    leader and writes every charge waiting then (its own among them) as ``BEGIN; charge; …; COMMIT`` in one
    message of the simple query protocol, one round trip; charges arriving meanwhile wait, and when it is done
    one of their threads leads the next batch. One client alone pays what a single autocommit charge costs
    (a batch of one is that statement alone); under load the batch grows with the number of answers waiting.
    Within a batch the charges run in order in one transaction, so each one's ``WHERE … <= limit`` sees the
    charges before it (the same row updated twice by one transaction): a batch never overspends, and a
    refused charge (no row updated) is refused alone, as before."""

    def __init__(self, pool: Any, max_batch: int = 64) -> None:
        self.pool = pool
        self.max_batch = max_batch
        self._cv = threading.Condition()
        self._pending: list[_Charge] = []
        self._leading = False
        self.batches = 0  # committed batches and charges in them (tests and benchmarks)
        self.charges = 0

    def charge(self, analyst: str, epsilon: float, delta: float | None, fingerprint: str) -> Balance:
        req = _Charge(analyst, amount(epsilon), amount(delta), fingerprint)
        with self._cv:
            self._pending.append(req)
        while True:
            with self._cv:
                while not req.done and self._leading:
                    self._cv.wait()
                if req.done:
                    break
                self._leading = True
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            try:
                self._write(batch)
            except BaseException as exc:
                for r in batch:
                    r.error = exc
            finally:
                with self._cv:
                    for r in batch:
                        r.done = True
                    self._leading = False
                    self._cv.notify_all()
        if req.error is not None:
            raise req.error
        if req.row is not None:
            return Balance(analyst, req.row[1], req.row[3], req.row[0], req.row[2])
        with self.pool.connection() as conn:
            raise refusal(conn, analyst, req.e, req.d)

    def _write(self, batch: list[_Charge]) -> None:
        """The batch's charges in one transaction, committed (durable on return) — or an exception, and none."""
        import psycopg
        from psycopg.pq import ExecStatus

        with self.pool.connection() as conn:
            params = [{"a": r.analyst, "e": r.e, "d": r.d, "f": r.fingerprint} for r in batch]
            if len(batch) == 1:
                rows = [conn.execute(CHARGE, params[0]).fetchone()]
            else:
                text = psycopg.ClientCursor(conn)
                body = ";".join(text.mogrify(CHARGE, p) for p in params)
                cur = conn.execute(f"BEGIN;{body};COMMIT")
                rows = []
                more: bool | None = True
                while more:
                    res = cur.pgresult
                    if res is not None and res.status == ExecStatus.TUPLES_OK:
                        rows.append(cur.fetchone())
                    more = cur.nextset()
                if len(rows) != len(batch) or res is None or res.status != ExecStatus.COMMAND_OK:
                    raise psycopg.OperationalError("the ledger's batch did not commit as sent")
        for r, row in zip(batch, rows, strict=True):
            r.row = tuple(row) if row is not None else None
        self.batches += 1
        self.charges += len(batch)


def balance(conn: Any, analyst: str) -> Balance | None:
    row = conn.execute(
        "SELECT analyst, epsilon_limit, delta_limit, epsilon_spent, delta_spent, queries "
        "FROM sqldp.budget_ledger WHERE analyst = %s",
        (analyst,),
    ).fetchone()
    return Balance(*row) if row else None


def balances(conn: Any) -> list[Balance]:
    rows = conn.execute(
        "SELECT analyst, epsilon_limit, delta_limit, epsilon_spent, delta_spent, queries "
        "FROM sqldp.budget_ledger ORDER BY analyst"
    ).fetchall()
    return [Balance(*r) for r in rows]


def reset(conn: Any, analyst: str | None) -> int:
    """Set spent to zero (one analyst or all); the reset is logged as a negative charge. Returns rows reset."""
    with conn.transaction():
        where, args = ("WHERE analyst = %s", (analyst,)) if analyst else ("", ())
        conn.execute(
            "INSERT INTO sqldp.budget_charges (analyst, fingerprint, epsilon, delta) "
            f"SELECT analyst, 'reset', -epsilon_spent, -delta_spent FROM sqldp.budget_ledger {where}",
            args,
        )
        cur = conn.execute(
            f"UPDATE sqldp.budget_ledger SET epsilon_spent = 0, delta_spent = 0, updated = now() {where}", args
        )
        return int(cur.rowcount)


def audit(conn: Any) -> list[tuple[str, Decimal, Decimal]]:
    """Analysts whose spent ε differs from the sum of their charges: (analyst, spent, sum). Empty when consistent."""
    rows = conn.execute(
        "SELECT l.analyst, l.epsilon_spent, COALESCE(SUM(c.epsilon), 0) FROM sqldp.budget_ledger l "
        "LEFT JOIN sqldp.budget_charges c ON c.analyst = l.analyst GROUP BY l.analyst, l.epsilon_spent "
        "HAVING l.epsilon_spent <> COALESCE(SUM(c.epsilon), 0)"
    ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]
