"""The frontend messages a logged-in client may send (PostgreSQL manual §55.7), each answered by its handler:
:data:`MESSAGES` maps a message's type byte to its handler and to how the connection loop
(sqldp.proxy.connection) treats it around errors (:class:`Flow`). A handler reads its message's body, changes the
connection's state (sqldp.proxy.backend) and writes its replies; an error it raises (a
:class:`~sqldp.errors.SqldpError`) is answered by the loop. Adding a wire message = its handler here + one entry
in :data:`MESSAGES` (docs/layout.md, "Adding a wire message")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from sqldp.errors import ForbiddenError, RefusedError, SqldpError, SqlSyntaxError
from sqldp.proxy import kinds, statements
from sqldp.proxy import protocol as pr
from sqldp.proxy import values as v
from sqldp.proxy.analysis import UNKNOWN, Description, statement_shape
from sqldp.proxy.backend import Backend
from sqldp.proxy.cursors import Portal
from sqldp.proxy.outcome import BUDGET_COLUMNS, BUDGET_TYPES, Outcome


@dataclass(frozen=True)
class Flow:
    """How the loop treats a message around the extended protocol's error recovery (§55.2.3: after an error
    the backend discards messages until Sync)."""

    syncs: bool = False  # ends the discarding (Query, Sync)
    skipped: bool = False  # discarded then
    ready: bool = False  # its error is followed by ReadyForQuery; without: its error starts the discarding
    held: bool = False  # its replies wait for the next Sync or Flush (sqldp.proxy.connection.Replies)


SIMPLE = Flow(syncs=True, ready=True)  # Query (§55.2.2), Sync
EXTENDED = Flow(skipped=True, held=True)  # Parse, Bind, Describe, Execute, Close (§55.2.3)
CALL = Flow(skipped=True, ready=True)  # FunctionCall (§55.2.6): answered like a Query, discarded like Parse
ASIDE = Flow()  # Flush, Terminate, CopyData/CopyDone/CopyFail outside COPY: nothing to answer


class Terminated(Exception):
    """Terminate (§55.2.9): the client closes the connection."""


Handler = Callable[[Backend, bytes], Awaitable[None]]


@dataclass(frozen=True)
class Message:
    handle: Handler
    flow: Flow
    bodiless: bool = False  # has no body (§55.7): an oversize one means the framing is lost


# -- the simple query protocol (§55.2.2) ----------------------------------------------------------


async def query(b: Backend, body: bytes) -> None:
    outcome = await kinds.answer(b, pr.parse_query(body), simple=True, raw=True)
    if outcome is None:
        b.writer.write(pr.empty_query())
    else:
        if outcome.raw is not None:  # the public fast path: the rows as PostgreSQL sent them
            b.writer.write(_raw_description(outcome.raw, outcome.raw.types))
            b.writer.write(b"".join(outcome.rows))
        elif outcome.columns is not None:
            types = await _runner_types(b, outcome) if outcome.query is not None else outcome.types or []
            b.writer.write(pr.row_description(_fields(outcome.columns, types)))
            b.writer.write(
                b"".join(pr.data_row(v.encode_text(x, types[i]) for i, x in enumerate(row)) for row in outcome.rows)
            )
        b.writer.write(pr.command_complete(outcome.tag))
    b.writer.write(pr.ready_for_query(b.transaction.status))


async def sync(b: Backend, body: bytes) -> None:
    b.writer.write(pr.ready_for_query(b.transaction.status))


async def flush(b: Backend, body: bytes) -> None:
    """Flush: everything written is sent, by the loop (a Flush is not held)."""


async def terminate(b: Backend, body: bytes) -> None:
    raise Terminated()


async def function_call(b: Backend, body: bytes) -> None:
    """FunctionCall (§55.2.6): no function is called through sqldp. Refused as PostgreSQL answers a failed call,
    with ErrorResponse then ReadyForQuery (CALL): libpq's PQfn waits for the ReadyForQuery, and no Sync
    follows a call."""
    raise ForbiddenError("the function call protocol is not available through sqldp")


async def ignore(b: Backend, body: bytes) -> None:
    """CopyData, CopyDone and CopyFail outside COPY are ignored, as the server does (no COPY runs here)."""


# -- the extended query protocol (§55.2.3) --------------------------------------------------------


async def parse(b: Backend, body: bytes) -> None:
    msg = pr.parse_parse(body)
    if len(await b.off(_parsed, msg.query)) > 1:
        raise RefusedError("cannot insert multiple commands into a prepared statement")
    b.prepared.add(msg.name, msg.query, msg.param_types, b.server.limits)
    b.writer.write(pr.parse_complete())


async def bind(b: Backend, body: bytes) -> None:
    msg = pr.parse_bind(body)
    b.prepared.require(msg.statement)
    # binary parameters need their types, binary results the columns' (§55.2.3), and every execution
    # the same columns whichever path it takes: the statement's description (kept by the server)
    desc = await _description(b, msg.statement)
    query_, types = b.prepared[msg.statement]
    announced = b.prepared.announced.get(msg.statement)
    if msg.portal and msg.portal not in b.portals:
        b.portals.room(b.server.limits)
    sql, empty, spans = await b.off(_bind, query_, types, msg)
    columns = announced if announced is not None else desc.columns if desc is not None else None
    b.portals[msg.portal] = Portal(sql, msg.result_formats, empty=empty, types=columns, spans=spans)
    b.writer.write(pr.bind_complete())


async def describe(b: Backend, body: bytes) -> None:
    target, name = pr.parse_describe_or_close(body, "Describe")
    if target == "S":
        await _describe_statement(b, name)
        return
    portal = b.portals.portal(name)
    outcome = await _outcome(b, portal)
    if outcome.raw is not None:
        b.writer.write(_raw_description(outcome.raw, _result_types(portal, outcome)))
    elif outcome.columns is None:
        b.writer.write(pr.no_data())
    else:
        fields = _fields(outcome.columns, _result_types(portal, outcome))
        b.writer.write(pr.row_description(fields, _formats(portal.result_formats, len(fields))))


async def execute(b: Backend, body: bytes) -> None:
    name, max_rows = pr.parse_execute(body)
    portal = b.portals.portal(name)
    if portal.cursor is not None:  # a declared cursor's portal: Execute fetches forward from its position
        count = max_rows if max_rows > 0 else statements.ALL
        got = b.portals.fetch(statements.Fetch(name, "forward", count, move=False))
        oids = got.types or []
        b.writer.write(b"".join(pr.data_row(v.encode_text(x, oids[i]) for i, x in enumerate(r)) for r in got.rows))
        more = 0 < max_rows == len(got.rows)
        b.writer.write(pr.portal_suspended() if more else pr.command_complete(f"SELECT {len(got.rows)}"))
        return
    outcome = await _outcome(b, portal)
    if portal.empty:
        b.writer.write(pr.empty_query())
        return
    if outcome.raw is not None:  # DataRow messages already, in text format (the portal asked for text)
        end = len(outcome.rows) if max_rows <= 0 else min(len(outcome.rows), portal.sent + max_rows)
        b.writer.write(b"".join(outcome.rows[portal.sent : end]))
        portal.sent = end
        if end < len(outcome.rows):
            b.writer.write(pr.portal_suspended())
            return
    elif outcome.columns is not None:
        column_types = _result_types(portal, outcome)
        formats = _formats(portal.result_formats, len(column_types))
        end = len(outcome.rows) if max_rows <= 0 else min(len(outcome.rows), portal.sent + max_rows)
        chunk = []
        for row in outcome.rows[portal.sent : end]:
            chunk.append(
                pr.data_row(
                    v.encode_binary(x, column_types[i]) if formats[i] else v.encode_text(x, column_types[i])
                    for i, x in enumerate(row)
                )
            )
        b.writer.write(b"".join(chunk))
        portal.sent = end
        if end < len(outcome.rows):
            b.writer.write(pr.portal_suspended())
            return
    b.writer.write(pr.command_complete(outcome.tag))


async def close(b: Backend, body: bytes) -> None:
    target, name = pr.parse_describe_or_close(body, "Close")
    if target == "S":
        b.prepared.close(name)
    else:
        b.portals.pop(name, None)
    b.writer.write(pr.close_complete())


MESSAGES: dict[bytes, Message] = {
    b"Q": Message(query, SIMPLE),  # Query
    b"P": Message(parse, EXTENDED),  # Parse
    b"B": Message(bind, EXTENDED),  # Bind
    b"D": Message(describe, EXTENDED),  # Describe
    b"E": Message(execute, EXTENDED),  # Execute
    b"C": Message(close, EXTENDED),  # Close
    b"S": Message(sync, SIMPLE, bodiless=True),  # Sync
    b"H": Message(flush, ASIDE, bodiless=True),  # Flush
    b"X": Message(terminate, ASIDE, bodiless=True),  # Terminate
    b"F": Message(function_call, CALL),  # FunctionCall
    b"d": Message(ignore, ASIDE),  # CopyData
    b"c": Message(ignore, ASIDE),  # CopyDone
    b"f": Message(ignore, ASIDE),  # CopyFail
}


# -- what the handlers share ----------------------------------------------------------------------


async def _outcome(b: Backend, portal: Portal) -> Outcome:
    """The portal's answer, computed at its first Describe or Execute and kept for the next ones."""
    if portal.outcome is None:
        try:
            # rows as PostgreSQL sent them only where every result column is asked for in text
            text = not any(portal.result_formats)
            portal.outcome = Outcome("") if portal.empty else await kinds.answer(b, portal.sql, raw=text)
        except SqldpError as err:
            if err.position is not None:  # into the statement as the client wrote it, with its $n
                err.position = statements.unbound(portal.spans, err.position)
            raise
        if portal.types is None and portal.outcome.query is not None:
            portal.types = tuple(await _runner_types(b, portal.outcome))
    return portal.outcome


async def _runner_types(b: Backend, outcome: Outcome) -> list[int]:
    """The result types of a statement the runner answered, as a Describe of it announces them (its
    bound text: no parameters left); the types of its values where it has no description."""
    columns = outcome.columns or []
    if outcome.query is None or not columns:
        return outcome.types or []
    desc = b.server.known_description(outcome.query, (), b.analyst.privacy)
    if desc is UNKNOWN:
        desc = await b.in_executor(b.server.description, outcome.query, (), b.analyst.privacy)
    if isinstance(desc, Description) and len(desc.columns) == len(columns):
        return list(desc.columns)
    return outcome.types or []


async def _describe_statement(b: Backend, name: str) -> None:
    """Parameter types as declared (unspecified ones as text) and, for a SELECT, the result columns as far as
    they are known without running it: names from the select list, each typed text until executed."""
    b.prepared.require(name)
    n, names = await b.off(statement_shape, b.prepared[name][0])
    desc = await _description(b, name) if names is not None else None
    query_, types = b.prepared[name]
    oids = [(types[i] if i < len(types) and types[i] else v.TEXT) for i in range(n)]
    b.writer.write(pr.parameter_description(oids))
    fetched = b.portals.cursor_shape(query_) if names is None else None
    if fetched is not None and fetched.columns is not None:
        announced = list(fetched.types or [])
        names = fetched.columns
    elif names is None:
        b.writer.write(pr.no_data())
        return
    elif desc is not None:
        names, announced = list(desc.names), list(desc.columns)
    elif names == list(BUDGET_COLUMNS):
        announced = list(BUDGET_TYPES)
    else:  # not known before it runs: text, and its executions are sent as text alike (Bind: announced)
        announced = [v.TEXT] * len(names)
    b.prepared.announced[name] = tuple(announced)
    b.writer.write(pr.row_description(_fields(names, announced)))


async def _description(b: Backend, name: str) -> Description | None:
    """The statement's parameter and result types (sqldp.proxy.analysis.describe), once per statement;
    parameters the client left unspecified take the types described, so that binary values are read as such."""
    prepared = b.prepared
    if name not in prepared.described:
        query_, types = prepared[name]
        privacy = b.analyst.privacy
        shadow = b.server.shadow
        local = shadow.localize(query_, b.database) if shadow is not None else query_
        if shadow is not None and await b.off(b.server.answers_catalog, _with_nulls(local)):
            got = await b.in_front(shadow.describe, local, types)
            # its parameters keep the client's types: a text value left untyped is bound as a quoted
            # literal PostgreSQL types in place (a regclass, an oid), which sqldp's binding does not
            prepared.described[name] = Description(*got) if got is not None else None
            return prepared.described[name]
        desc = b.server.known_description(query_, types, privacy)
        if desc is UNKNOWN:
            # the statement's analysis runs here, when a Bind or Describe first needs it: a CancelRequest
            # (JDBC's setQueryTimeout) ends the wait at once, as it ends a running statement's
            b.cancel_requested = False
            desc = await b.cancellable(b.in_executor(b.server.description, query_, types, privacy))
        prepared.described[name] = desc
        if desc is not None:
            merged = tuple(types[i] if i < len(types) and types[i] else t for i, t in enumerate(desc.params))
            prepared.retype(name, merged)
    return prepared.described[name]


def _bind(query: str, types: tuple[int, ...], bind: pr.Bind) -> tuple[str, bool, tuple[statements.Span, ...]]:
    """The statement with the Bind message's parameters as validated literals, whether it is empty, and where
    the literals stand (:func:`statements.unbound`)."""
    n = len(bind.params)
    wanted = statements.param_count(query)
    if n != wanted:
        raise SqlSyntaxError(f"bind message supplies {n} parameters, but prepared statement requires {wanted}")
    if len(bind.param_formats) not in (0, 1, n):
        raise pr.ProtocolError("invalid number of parameter format codes in Bind message")

    def fmt(i: int) -> int:
        return bind.param_formats[0 if len(bind.param_formats) == 1 else i] if bind.param_formats else 0

    spans: list[statements.Span] = []
    sql = statements.bind(
        query,
        lambda k: v.literal(bind.params[k - 1], fmt(k - 1), types[k - 1] if k - 1 < len(types) else 0, k),
        spans,
    )
    return sql, not statements.split(sql), tuple(spans)


def _parsed(query: str) -> list[str]:
    """A Parse message's statements, its ``$n`` checked as PostgreSQL checks them at Parse ($0 is refused)."""
    statements.param_count(query)
    return statements.split(query)


def _with_nulls(query: str) -> str:
    return statements.bind(query, lambda k: "NULL")


def _result_types(portal: Portal, outcome: Outcome) -> list[int]:
    """The result's column types: as announced by Describe of the statement if it was described (a client
    decodes by those), else as the outcome's values say."""
    if portal.types is not None and outcome.columns is not None and len(portal.types) == len(outcome.columns):
        return list(portal.types)
    return outcome.types or []


def _raw_description(raw: Any, types: list[int]) -> bytes:
    """RowDescription of a fast-path result (sqldp.proxy.passthrough.Raw): upstream's names, sizes and type
    modifiers, the types announced for the statement where it was described (a client decodes by those), all
    text. No table oid or column number: the client's catalog is the shadow's, where these would name nothing."""
    same = len(types) == len(raw.types)
    fields = [
        pr.Field(n, types[i] if same else raw.types[i], raw.sizes[i] if not same or types[i] == raw.types[i] else -1,
                 raw.mods[i] if not same or types[i] == raw.types[i] else -1)
        for i, n in enumerate(raw.names)
    ]  # fmt: skip
    return pr.row_description(fields)


def _fields(columns: list[str], types: list[int]) -> list[pr.Field]:
    return [pr.Field(c, t, v.TYPE_SIZE.get(t, -1)) for c, t in zip(columns, types, strict=True)]


def _formats(codes: tuple[int, ...], n: int) -> list[int]:
    if not codes:
        return [0] * n
    if len(codes) == 1:
        return [codes[0]] * n
    if len(codes) != n:
        raise pr.ProtocolError(f"Bind message has {len(codes)} result formats but the query has {n} columns")
    return list(codes)
