"""Answering one statement, by its kind (:func:`sqldp.proxy.statements.classify`): :data:`KINDS` maps each kind
to its handler.

A handler runs in a worker thread (or inline, for a short text) while the connection's task waits for it, so
the connection's state is its to change. It answers a statement that reads no data itself (an
:class:`~sqldp.proxy.outcome.Outcome`), or returns what is left to do on the event loop (:data:`Later`): the
runner's answer and its charge (sqldp.proxy.charging), the ledger's or the shadow catalog's I/O, a DECLARE's
query. Messages to send before the answer go to :attr:`Request.notes` (the writer belongs to the event loop).
Adding a statement kind = its handler here + one entry in :data:`KINDS` (and its classification in
sqldp.proxy.statements)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqldp.errors import ForbiddenError, SqldpError
from sqldp.proxy import charging, harmless, passthrough, statements
from sqldp.proxy import protocol as pr
from sqldp.proxy.backend import Backend
from sqldp.proxy.cursors import Cursor, Portal
from sqldp.proxy.errors import InFailedTransaction, locate
from sqldp.proxy.outcome import BUDGET_SHOW, Outcome

Later = Callable[[], Awaitable[Outcome]]  # the rest of an answer, on the event loop


@dataclass(frozen=True)
class Request:
    sql: str  # the text as the client sent it
    stmt: statements.Statement
    notes: list[bytes]  # messages to send before the answer (ParameterStatus after a SET)
    raw: bool = False  # the answer may be rows as PostgreSQL sent them (text format; sqldp.proxy.passthrough)


Handler = Callable[[Backend, Request], "Outcome | Later"]


@typing.overload
async def answer(b: Backend, sql: str, *, raw: bool = ...) -> Outcome: ...
@typing.overload
async def answer(b: Backend, sql: str, *, simple: bool, raw: bool = ...) -> Outcome | None: ...
async def answer(b: Backend, sql: str, *, simple: bool = False, raw: bool = False) -> Outcome | None:
    """The answer to ``sql``: its kind's handler in a worker thread (:func:`answer_now`), then what it left for
    the event loop. ``simple``: a Query message's text, checked there too (None: no statement in it). ``raw``:
    the caller sends text-format results and can send a public answer's rows as PostgreSQL sent them
    (:attr:`Outcome.raw`)."""
    notes: list[bytes] = []
    now = await b.off(answer_now, b, sql, notes, simple, raw)
    b.writer.write(b"".join(notes))
    if now is None or isinstance(now, Outcome):
        return now
    return await now()


def answer_now(
    b: Backend, sql: str, notes: list[bytes], simple: bool = False, raw: bool = False
) -> Outcome | Later | None:
    """In a worker thread: the statement's kind and its handler's answer. One hand-off per statement: the simple
    protocol's checks are made here too."""
    if simple and not _simple_statements(sql):
        return None
    stmt = statements.classify(sql)
    if b.transaction.failed and stmt.kind not in IN_FAILED_BLOCK:
        raise InFailedTransaction()
    return KINDS[stmt.kind](b, Request(sql, stmt, notes, raw))


def _simple_statements(sql: str) -> list[str]:
    """The statements of a simple Query; a ``$n`` there has no value (the upstream failed on it with a
    connection error, 08000, as if the database had failed)."""
    n = statements.param_count(sql)
    if n:
        raise statements.NoParameter(n, " (parameters need the extended query protocol)")
    return statements.split(sql)


# -- the transaction block (sqldp.proxy.transaction) --------------------------------------------


def begin(b: Backend, r: Request) -> Outcome:
    b.transaction.begin()
    return Outcome("BEGIN")


def end(b: Backend, r: Request) -> Outcome:
    """COMMIT or ROLLBACK, and the cursors the block's end closes."""
    committed = b.transaction.end(commit=r.stmt.kind == "commit")
    b.portals.close_cursors(committed=committed)
    return Outcome("COMMIT" if committed else "ROLLBACK")


def savepoint(b: Backend, r: Request) -> Outcome:
    b.transaction.require(r.stmt.words[0].upper())
    b.transaction.savepoint(statements.savepoint_name(r.stmt.sql))
    return Outcome("SAVEPOINT")


def release(b: Backend, r: Request) -> Outcome:
    b.transaction.require(r.stmt.words[0].upper())
    b.transaction.release(statements.savepoint_name(r.stmt.sql))
    return Outcome("RELEASE")


def rollback_to(b: Backend, r: Request) -> Outcome:
    """ROLLBACK TO: the cursors declared since the savepoint close."""
    b.transaction.require(r.stmt.words[0].upper())
    for cursor in b.transaction.rollback_to(statements.savepoint_name(r.stmt.sql)):
        b.portals.pop(cursor, None)
    return Outcome("ROLLBACK")


# -- settings -----------------------------------------------------------------------------------


def show(b: Backend, r: Request) -> Outcome | Later:
    if r.stmt.words == BUDGET_SHOW:  # the ledger's row, read in a worker thread: it is I/O
        return lambda: b.in_front(b.server.budget_answer, b.analyst.name)
    a = harmless.show(r.stmt.words, {**b.server.settings, **b.settings})
    return Outcome(a.tag, a.columns, a.types, a.rows)


def set_(b: Backend, r: Request) -> Outcome:
    """SET and RESET of the settings a session may change (sqldp.proxy.harmless), reported back as PostgreSQL
    reports them (ParameterStatus)."""
    name, value = harmless.set_(r.sql, r.stmt.words, b.settings, b.server.settings)
    if name == "all":
        b.settings = {}
    elif value is None:
        b.settings.pop(name, None)
        if name in harmless.REPORTED:  # as PostgreSQL reports a reset: the value in effect again
            r.notes.append(pr.parameter_status(name, b.server.settings.get(name, "")))
    else:
        b.settings[name] = value
        if name in harmless.REPORTED:
            r.notes.append(pr.parameter_status(name, value))
    return Outcome(r.stmt.kind.upper())


def discard(b: Backend, r: Request) -> Outcome:
    b.portals.close_cursors(everything=True)  # DISCARD ALL closes every cursor, as CLOSE ALL does
    return Outcome("DISCARD ALL")


def deallocate(b: Backend, r: Request) -> Outcome:
    target = r.stmt.words[-1] if len(r.stmt.words) > 1 else ""
    b.prepared.deallocate(target)
    return Outcome("DEALLOCATE" + (" ALL" if target == "all" else ""))


# -- named cursors (sqldp.proxy.cursors) --------------------------------------------------------


def declare(b: Backend, r: Request) -> Later:
    d = statements.declare(r.stmt.sql)
    if not d.hold:  # (a failed block took only COMMIT and ROLLBACK, answer_now)
        b.transaction.require("DECLARE CURSOR")
    if d.name in b.portals:
        raise statements.CursorError(f'cursor "{d.name}" already exists', "42P03")
    b.portals.room(b.server.limits)
    return lambda: _declare(b, d)


async def _declare(b: Backend, d: statements.Declare) -> Outcome:
    """DECLARE: the cursor's query answered now, like any other statement (a private one is charged here,
    once, and its noisy rows released in full with the NOTICE of its cost); FETCH then pages through the
    released rows, which is post-processing and costs nothing (Dwork & Roth, "The Algorithmic Foundations
    of Differential Privacy", Prop. 2.1)."""
    try:
        answered = await answer(b, d.query)
    except SqldpError as err:
        if err.position is not None:  # into the DECLARE statement
            err.position += d.offset
        raise
    if answered.columns is None:  # cannot happen: statements.declare admits only a SELECT
        raise ForbiddenError("a cursor can only be declared for a SELECT")
    # the column types a client decodes FETCH by, as Describe gives them for a prepared SELECT (int4 stays
    # int4; noisy values are float8); a query the runner does not answer (a catalog one) keeps its values'
    desc = await b.in_executor(b.server.description, d.query, (), b.analyst.privacy)
    if desc is not None and len(desc.columns) == len(answered.columns):
        answered = dataclasses.replace(answered, types=list(desc.columns))
    cursor = Cursor(d.hold, d.scroll, in_transaction=b.transaction.status == "T")
    b.portals[d.name] = Portal(d.query, (), outcome=answered, cursor=cursor)
    b.transaction.declared(d.name)
    return Outcome("DECLARE CURSOR")


def fetch(b: Backend, r: Request) -> Outcome:
    return b.portals.fetch(statements.fetch(r.stmt.sql))


def close(b: Backend, r: Request) -> Outcome:
    target = statements.close(r.stmt.sql)
    if target is None:
        b.portals.close_cursors(everything=True)
        return Outcome("CLOSE CURSOR ALL")
    b.portals.close_cursor(target)
    return Outcome("CLOSE CURSOR")


# -- queries ------------------------------------------------------------------------------------


def select(b: Backend, r: Request) -> Outcome | Later:
    """A query: answered here if it reads no table (a constant, a catalog probe of sqldp's own), by the shadow
    catalog if it reads the system catalog, else by the runner with its charge (sqldp.proxy.charging)."""
    stmt, analyst = r.stmt, b.user
    context = {
        "version": b.server.settings.get("version", ""),
        "current_database": b.database,
        "current_catalog": b.database,
        "current_user": analyst,
        "session_user": analyst,
        "user": analyst,
        "current_schema": "public",
        "pg_backend_pid": b.key[0],
    }
    # cheap pre-filters on the statement's words spare the common case a second SQL parse
    if "from" not in stmt.words:
        constant = harmless.constant_select(stmt.sql, context)
        if constant is not None:
            return Outcome(constant.tag, constant.columns, constant.types, constant.rows)
    if any(w.startswith("pg_") or w == "information_schema" for w in stmt.words):
        shadow = b.server.shadow
        local = shadow.localize(stmt.sql, b.database) if shadow is not None else stmt.sql
        if b.server.answers_catalog(local):  # in a worker thread: the shadow database is I/O
            return lambda: b.in_front(b.server.catalog_answer, local)
        tables = b.server.session.catalog.tables
        probe = harmless.catalog_select(stmt.sql, lambda name: name in tables)
        if probe is not None:
            return Outcome(probe.tag, probe.columns, probe.types, probe.rows)
    if r.raw:  # a public statement analysed before: on the event loop, its rows passed on (sqldp.proxy.passthrough)
        known = b.server.session.cached(stmt.sql, **b.analyst.privacy)
        if known is not None and passthrough.usable(b, known):
            return lambda: _passthrough(b, r.sql, stmt.sql, known)
    return lambda: charging.answer(b, r.sql, stmt.sql)


async def _passthrough(b: Backend, text: str, statement: str, known: Any) -> Outcome:
    b.cancel_requested = False
    try:
        return await b.cancellable(passthrough.answer(b, b.server.passthrough, known))
    except SqldpError as err:
        locate(err, text, statement)
        raise
    finally:
        b.running = None


KINDS: dict[str, Handler] = {
    "begin": begin,
    "commit": end,
    "rollback": end,
    "savepoint": savepoint,
    "release": release,
    "rollback_to": rollback_to,
    "show": show,
    "set": set_,
    "reset": set_,
    "discard": discard,
    "deallocate": deallocate,
    "declare": declare,
    "fetch": fetch,
    "close": close,
    "select": select,
    "empty": select,  # not reached: a text without a statement is answered before (EmptyQueryResponse)
}
# what a failed transaction block still accepts; anything else is 25P02 until it ends (PostgreSQL does the same)
IN_FAILED_BLOCK = frozenset(("commit", "rollback", "rollback_to"))
