"""A statement the runner answers, and the one place the ledger is charged for it.

The order for every private answer is fixed: analyse (refusals here cost nothing) → charge the ledger and
commit → run and add noise → send, the NOTICE of the charge before the rows. So an answer never leaves without
its charge being durable; a CancelRequest before the charge makes none, after it the charge stands."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import threading
import time
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp

from sqldp import budgets
from sqldp.engine.postgres.engine import Running, watching
from sqldp.errors import DatabaseError, InputError, RefusedError, SqldpError
from sqldp.form import AnalysisForm
from sqldp.proxy import ledger, statements
from sqldp.proxy import protocol as pr
from sqldp.proxy import values as v
from sqldp.proxy.analysis import prepare_query
from sqldp.proxy.backend import Backend, hand_over
from sqldp.proxy.config import Analyst
from sqldp.proxy.errors import Cancelled, Internal, TimedOut, Withheld, from_upstream, locate, log
from sqldp.proxy.outcome import Outcome
from sqldp.runner import Prepared

if typing.TYPE_CHECKING:
    from sqldp.result import Result
    from sqldp.session import Session
    from sqldp.strategies import Compiled


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
    per_row: PerRow | None = None
    if not prepared.public:
        params = prepared.params
        if params is None:
            raise RefusedError("the query has no privacy parameters; not answered")
        per_row = per_row_plan(server.session, prepared, sql, server.config.row_budget_fallback)
        server.check(prepared)
        if b.cancel_requested:
            raise Cancelled()
        eps, delta = float(params.epsilon), float(params.delta or 0.0)
        counts_eps = server.config.row_counts_epsilon if per_row is not None and per_row.found is not None else 0.0
        # the analyst-level budget stays the outer limit: the answer's ε and the noisy counts' ε, in one charge
        eps += counts_eps
        balance = server.charges.charge(analyst.name, eps, delta, fingerprint)  # committed with others (group commit)
    deadline = Deadline(running, analyst.statement_timeout)
    try:
        with watching(running), deadline:  # a CancelRequest from now on cancels the upstream queries (cancel)
            if per_row is not None and per_row.found is not None:
                result = per_row.run(server.session, sql, analyst.privacy, server.config.row_counts_epsilon)
            else:
                result = prepared.run()
    except DatabaseError as err:
        if deadline.fired:
            raise TimedOut(deadline.seconds, charged=not prepared.public) from None
        raise from_upstream(err, public=prepared.public) from err
    columns, rows = result.table()
    types = [v.infer_type([r[i] for r in rows]) for i in range(len(columns))]
    notice_ = b""
    if balance is not None:
        # the ledger's charge where it is more than the answer's ε (the noisy counts'); else the answer's, as before
        notice_ = notice(result, balance, spent=eps if per_row is not None and per_row.counts is not None else None)
        if per_row is not None:
            notice_ += per_row.notice(analyst.name)
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


def notice(result: Result, balance: ledger.Balance, *, spent: float | None = None) -> bytes:
    """What a private answer may carry besides its values (docs/output.md, "What each output field reveals"): ε and δ
    this statement spent and what the analyst has left (the ledger: a function of the queries asked, not of
    the data), and the error bar of each value whose noise scale is data-independent (``laplace-global``:
    ``sqldp.release.error_bar``; its interval arithmetic reads only the noisy values, post-processing, Dwork &
    Roth Prop. 2.1). Values calibrated to a smooth sensitivity (NR §3.3.7–3.3.9) get no bar: it would
    reveal that sensitivity. ``spent``: the ε the ledger was charged, when it is more than the answer's (a
    per-row budgeted answer's noisy row counts, :class:`PerRow`)."""
    p = result.params
    spent_e = ledger.amount(spent if spent is not None else p.epsilon if p else 0.0)
    spent_d = ledger.amount(p.delta if p else 0.0)
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

        def dominated(i: int, name: str, bar: float) -> str:
            """Post-processing of the bar and the value: the noise dominates when the bar exceeds |value|."""
            value = result.rows[i].get("values", {}).get(name)
            return " (noise dominates)" if isinstance(value, int | float) and bar >= abs(value) else ""

        def one(i: int, row: dict[str, float]) -> str:
            return ", ".join(f"{name} ± {bar:.6g}{dominated(i, name, bar)}" for name, bar in row.items()) or "none"

        if all(b == bars[0] for b in bars) and not any(
            dominated(i, n, w) for i, b in enumerate(bars) for n, w in b.items()
        ):
            detail = head + one(0, bars[0]) + (" in every row" if len(bars) > 1 else "")
        else:
            detail = head + "; ".join(f"row {i + 1}: {one(i, b)}" for i, b in enumerate(bars))
    return pr.notice_response(text, detail=detail)


@dataclass
class PerRow:
    """A private statement over a table the policy marks ``budget = "per-row"`` (docs/budgets.md): ``found``, the
    budgeted use :meth:`sqldp.session.Session.run_budgeted` answers it through, or None with ``reason`` when
    it is outside the proven classes and ``[proxy] row_budget_fallback`` answers it on the analyst-level
    account alone. After :meth:`run`: the noisy counts of the rows it used and excluded, if any were asked."""

    found: budgets.Budgeted | None
    reason: str = ""
    on: dt.date = field(default_factory=lambda: dt.datetime.now(dt.UTC).date())
    epsilon: float = 0.0  # ε charged to each used row
    counts: dict[str, Any] | None = None  # Session.budget_counts, released with Laplace noise

    def run(self, session: Session, sql: str, privacy: Mapping[str, Any], counts_epsilon: float) -> Result:
        """The counts first (they read the ledger as the answer will: before its charge), then the answer and its
        charge in one transaction (sqldp.engine.postgres.engine.ChargedAnswer). Both analyse ``sql`` as the proxy
        did, so neither refuses it now."""
        if counts_epsilon > 0:
            self.counts = session.budget_counts(sql, epsilon=counts_epsilon, on=self.on, **privacy)
        result = session.run_budgeted(sql, on=self.on, **privacy)
        self.epsilon = float(result.params.epsilon) if result.params is not None else 0.0
        return result

    def notice(self, analyst: str) -> bytes:
        """The per-row charge, as a second NOTICE: the table, its class, the ε charged to each used row and its
        limit today (the policy's public schedule), and how many rows were used and excluded only as the noisy
        counts of Session.budget_counts (Laplace at 1/ε, an ℓ1 sensitivity of 1, charged to the analyst above);
        an exact count of either depends on the data and never leaves."""
        if self.found is None:
            return pr.notice_response(
                f"sqldp: per-row budgets not used (docs/budgets.md): {self.reason}; answered on {analyst}'s "
                "analyst-level account only, which covers every row ([proxy] row_budget_fallback = true)"
            )
        b = self.found
        limit = budgets.limit_on(b.budget, self.on)
        conditions = " AND ".join(e.sql(dialect="postgres") for e in b.own) or "every row"
        text = (
            f"sqldp: per-row budgets ({b.supported_class}): each row of {b.table} the answer used was charged "
            f"ε = {self.epsilon:g} of its limit {limit:g}; "
        )
        c = self.counts
        if c is None:
            text += "how many rows it used and excluded is not released ([proxy] row_counts_epsilon = 0)"
        else:
            text += (
                f"rows used ≈ {c['charged']:.1f}, excluded (no room left) ≈ {c['excluded']:.1f} (noisy counts: "
                f"Laplace scale {c['noise_scale']:g}, ε = {c['epsilon']:g} of this statement's charge)"
            )
        detail = (
            f"the rows used: those of {b.table} with {conditions}; a used row whose spent ε plus this charge would "
            "pass its limit is left out of the answer inside the statement (docs/budgets.md)"
        )
        return pr.notice_response(text, detail=detail)


def per_row_plan(session: Session, prepared: Compiled, sql: str, fallback: bool) -> PerRow | None:
    """Whether a private statement goes through the per-row ledger: None when it reads no per-row-budgeted
    table; else its budgeted use (:func:`sqldp.budgets.analyse`, pure: no row read, nothing charged yet), or,
    outside the proven classes, a :class:`RefusedError` naming the reason — or, with ``fallback``, the
    reason kept for the NOTICE. Mirrors :meth:`sqldp.session.Session.run_budgeted`'s own checks."""
    budgeted = set(budgets.budgeted_tables(session.policy))
    if not budgeted or not budgeted & _tables(sql):
        return None
    try:
        if not isinstance(prepared, Prepared) or not isinstance(prepared.form, AnalysisForm):
            raise budgets.refused("only a single query (no set operation, workflow or selection) has per-row budgets")
        assert prepared.statements is not None
        found = budgets.analyse(prepared.form, prepared.plans, prepared.statements, session.catalog, session.policy)
    except RefusedError as err:
        if not fallback:
            raise
        return PerRow(None, reason=err.message.removeprefix("per-row budgets (docs/budgets.md): "))
    return PerRow(found)


def _tables(sql: str) -> set[str]:
    """The names of the tables ``sql`` mentions anywhere (a CTE of the same name counts too: it errs on the
    side of the per-row check)."""
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except sqlglot.errors.ParseError:
        return set()
    return {t.name.lower() for t in tree.find_all(exp.Table)}


def _log(analyst: str, fingerprint: str, decision: str, **extra: Any) -> None:
    """One JSON line per statement: who, which query (fingerprint, never the text or any value), what happened."""
    if not log.isEnabledFor(logging.INFO):
        return
    entry = {"event": "query", "analyst": analyst, "fingerprint": fingerprint, "decision": decision}
    entry.update(extra)
    log.info(json.dumps(entry, default=str))
