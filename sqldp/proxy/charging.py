"""A statement the runner answers, and the one place the ledger is charged for it.

The order for every private answer is fixed: analyse (refusals here cost nothing) → charge the ledger and
commit → run and add noise → send, the NOTICE of the charge before the rows. So an answer never leaves without
its charge being durable; a CancelRequest before the charge makes none, after it the charge stands."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import typing
from decimal import Decimal
from typing import Any

from sqldp.engine.postgres.engine import Running, watching
from sqldp.errors import DatabaseError, InputError, RefusedError, SqldpError
from sqldp.proxy import ledger, statements
from sqldp.proxy import protocol as pr
from sqldp.proxy import values as v
from sqldp.proxy.analysis import prepare_query
from sqldp.proxy.backend import Backend, hand_over
from sqldp.proxy.config import Analyst
from sqldp.proxy.errors import Cancelled, Internal, TimedOut, Withheld, from_upstream, locate, log
from sqldp.proxy.outcome import Outcome

if typing.TYPE_CHECKING:
    from sqldp.result import Result


async def answer(b: Backend, text: str, statement: str) -> Outcome:
    """``statement`` (of the client's ``text``) through the runner: cancellable (:meth:`Backend.cancellable`),
    an error's position found in ``text``, and the NOTICE of what it cost written before its rows (psql prints
    it above the result)."""
    try:
        answered = await b.cancellable(_answer(b, statement))
    except SqldpError as err:
        locate(err, text, statement)
        raise
    b.writer.write(answered.notice)
    return answered


async def _answer(b: Backend, sql: str) -> Outcome:
    b.cancel_requested = False
    running = b.running = Running()
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    fp = statements.fingerprint(sql)
    analyst = b.analyst
    try:
        handed: asyncio.Future[tuple[Outcome, tuple[float, float]]] = loop.create_future()
        b.server.executor.submit(hand_over, loop, handed, _charge_and_run, b, sql, fp, analyst, running)
        outcome, charged = await handed
    except Withheld as err:  # charged, then failed: the log (the data owner's) says what PostgreSQL said
        ms = round((time.perf_counter() - t0) * 1000, 3)
        _log(analyst.name, fp, "error", sqlstate=err.sqlstate, upstream_sqlstate=err.upstream, ms=ms)
        raise
    except SqldpError as err:
        decision = "budget_exhausted" if err.sqlstate == "53400" else "refused"
        decision = "timeout" if isinstance(err, TimedOut) else decision
        _log(analyst.name, fp, decision, sqlstate=err.sqlstate, ms=round((time.perf_counter() - t0) * 1000, 3))
        raise
    except Exception as exc:  # a bug or a broken upstream: fail closed, keep the connection
        log.exception("internal error answering a query")
        _log(analyst.name, fp, "error", sqlstate="XX000")
        raise Internal(exc) from exc
    eps, delta = charged
    _log(
        analyst.name,
        fp,
        "answered" if eps else "public",
        epsilon=eps,
        delta=delta,
        rows=len(outcome.rows),
        ms=round((time.perf_counter() - t0) * 1000, 3),
    )
    return outcome


def _charge_and_run(
    b: Backend, sql: str, fingerprint: str, analyst: Analyst, running: Running
) -> tuple[Outcome, tuple[float, float]]:
    """In a worker thread: analyse, charge (committed), run, and shape the answer.

    Every refusal that does not depend on the data happens in ``prepare_query``, before the charge. The noisy
    result set leaves (``Result.table``) with a NOTICE (:func:`notice`) of what is data-independent: the
    charge, the ledger's balance and the error bars of ``laplace-global`` values. No sensitivity, smooth
    noise scale, its error bar or a chosen β: those are functions of the private data (docs/output.md, "What each
    output field reveals")."""
    server = b.server
    try:
        prepared = prepare_query(server.session, sql, analyst.privacy)
    except InputError as err:
        if err.where == "--beta":  # the analyst's β comes from this file's [analysts] table, not a flag
            raise InputError(err.message, where=f"analysts.{analyst.name}.beta") from None
        raise
    eps = delta = 0.0
    balance: ledger.Balance | None = None
    if not prepared.public:
        params = prepared.params
        if params is None:
            raise RefusedError("the query has no privacy parameters; not answered")
        server.check(prepared)
        if b.cancel_requested:
            raise Cancelled()
        eps, delta = float(params.epsilon), float(params.delta or 0.0)
        with server.ledger_pool.connection() as conn:
            balance = ledger.charge(conn, analyst.name, eps, delta, fingerprint)
    deadline = Deadline(running, analyst.statement_timeout)
    try:
        with watching(running), deadline:  # a CancelRequest from now on cancels the upstream queries (cancel)
            result = prepared.run()
    except DatabaseError as err:
        if deadline.fired:
            raise TimedOut(deadline.seconds, charged=not prepared.public) from None
        raise from_upstream(err, public=prepared.public) from err
    columns, rows = result.table()
    types = [v.infer_type([r[i] for r in rows]) for i in range(len(columns))]
    notice_ = notice(result, balance) if balance is not None else b""
    outcome = Outcome(f"SELECT {len(rows)}", list(columns), types, list(rows), notice_, query=sql)
    return outcome, (eps, delta)


class Deadline:
    """The analyst's statement timeout over one statement's run (after its charge): when it passes, the
    statement's upstream queries are cancelled as a client's CancelRequest cancels them (PQcancel on each
    connection it holds; ``Running`` refuses any it would take next). None: no timeout."""

    def __init__(self, running: Running, seconds: float | None) -> None:
        self.running = running
        self.seconds = seconds
        self.fired = False
        self._timer: threading.Timer | None = None

    def _fire(self) -> None:
        self.fired = True
        self.running.cancel()

    def __enter__(self) -> Deadline:
        if self.seconds is not None:
            self._timer = threading.Timer(self.seconds, self._fire)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


def _amount(x: Decimal) -> str:
    """A ledger amount as written in the policy (``2.5``, ``1E-5``), without trailing zeros."""
    text = format(x.normalize(), "f") if x == x.to_integral_value() or abs(x) >= Decimal("0.001") else str(x)
    return text if x else "0"


def notice(result: Result, balance: ledger.Balance) -> bytes:
    """What a private answer may carry besides its values (docs/output.md, "What each output field reveals"): ε and δ
    this statement spent and what the analyst has left (the ledger: a function of the queries asked, not of
    the data), and the error bar of each value whose noise scale is data-independent (``laplace-global``:
    ``sqldp.release.error_bar``; its interval arithmetic reads only the noisy values, post-processing, Dwork &
    Roth Prop. 2.1). Values calibrated to a smooth sensitivity (NR §3.3.7–3.3.9) get no bar: it would
    reveal that sensitivity."""
    p = result.params
    spent_e, spent_d = ledger.amount(p.epsilon if p else 0.0), ledger.amount(p.delta if p else 0.0)
    left_d = max(Decimal(0), balance.delta_limit - balance.delta_spent)
    text = (
        f"sqldp: this statement spent ε = {_amount(spent_e)}, δ = {_amount(spent_d)}; {balance.analyst} has "
        f"ε = {_amount(balance.epsilon_left)} of {_amount(balance.epsilon_limit)} left, "
        f"δ = {_amount(left_d)} of {_amount(balance.delta_limit)}"
    )
    bars = [row.get("errors", {}) for row in result.rows]
    confidence = p.confidence if p else None
    if not any(bars) or confidence is None:
        detail = "no error bars: the noise of these values is scaled to the private data, so its size is not shown"
    else:
        head = f"error bars (± half-width, {confidence:.4g} confidence): "

        def one(row: dict[str, float]) -> str:
            return ", ".join(f"{name} ± {bar:.6g}" for name, bar in row.items()) or "none"

        if all(b == bars[0] for b in bars):
            detail = head + one(bars[0]) + (" in every row" if len(bars) > 1 else "")
        else:
            detail = head + "; ".join(f"row {i}: {one(b)}" for i, b in enumerate(bars, 1))
    return pr.notice_response(text, detail=detail)


def _log(analyst: str, fingerprint: str, decision: str, **extra: Any) -> None:
    """One JSON line per statement: who, which query (fingerprint, never the text or any value), what happened."""
    if not log.isEnabledFor(logging.INFO):
        return
    entry = {"event": "query", "analyst": analyst, "fingerprint": fingerprint, "decision": decision}
    entry.update(extra)
    log.info(json.dumps(entry, default=str))
