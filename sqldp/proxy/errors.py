"""The errors the proxy itself answers with, each with PostgreSQL's SQLSTATE for the same condition (PostgreSQL
manual, Appendix A); what the analyst sees of the upstream's failures; and the proxy's log, one JSON line per
record."""

from __future__ import annotations

import json
import logging
import re

from sqldp.errors import DatabaseError, SqldpError

log = logging.getLogger("sqldp.proxy")


class _OneLine(logging.Filter):
    """Every record of the proxy's log is one line: an exception logged with its traceback (``log.exception``)
    becomes the exception's class and first line of text. The log is read line by line (JSON), and a
    traceback's frames are not ours to print."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            text = " ".join(str(exc).split())[:200]
            entry = {"event": "internal_error", "where": record.getMessage(), "error": type(exc).__name__}
            record.msg, record.args = json.dumps({**entry, "text": text}), ()
            record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


log.addFilter(_OneLine())


def internal_log(where: str, exc: BaseException) -> None:
    """One log line for an unexpected exception (no traceback: the log is read by people and by the wire fuzz
    test, and a traceback's locals are not ours to print); its first line of text, shortened."""
    text = " ".join(str(exc).split())[:200]
    log.error(json.dumps({"event": "internal_error", "where": where, "error": exc.__class__.__name__, "text": text}))


class InFailedTransaction(SqldpError):
    sqlstate = "25P02"

    def __init__(self) -> None:
        super().__init__("current transaction is aborted, commands ignored until end of transaction block")


class NoSavepoint(SqldpError):
    sqlstate = "3B001"  # invalid_savepoint_specification

    def __init__(self, name: str) -> None:
        super().__init__(f'savepoint "{name}" does not exist')


class NoTransaction(SqldpError):
    sqlstate = "25P01"

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} can only be used in transaction blocks")


class Internal(SqldpError):
    sqlstate = "XX000"

    def __init__(self, exc: Exception) -> None:
        super().__init__(f"internal error in sqldp ({exc.__class__.__name__}); nothing was released")


class TooLarge(SqldpError):
    sqlstate = "54000"  # program_limit_exceeded


class TooComplex(SqldpError):
    sqlstate = "54001"  # statement_too_complex

    def __init__(self) -> None:
        super().__init__("the statement is nested too deeply to be analysed")


class TimedOut(SqldpError):
    """A statement that ran past the analyst's statement timeout: one fixed message whatever the statement
    was doing (its upstream error is that of the cancel), and for a private one the charge stands: it was made
    before the run, like the charge of an answer (docs/proxy.md, "Statement timeout")."""

    sqlstate = "57014"  # query_canceled, as PostgreSQL's own statement_timeout reports it

    def __init__(self, seconds: float | None, *, charged: bool) -> None:
        cost = "; its charge stands" if charged else ""
        super().__init__(f"canceling statement due to statement timeout ({seconds:g} s, set by the data owner){cost}")
        self.hint = "SHOW sqldp.budget shows what is left" if charged else None


class ScanForward(SqldpError):
    sqlstate = "55000"  # object_not_in_prerequisite_state, as PostgreSQL says it
    hint = "Declare it with SCROLL option to enable backward scan."

    def __init__(self) -> None:
        super().__init__("cursor can only scan forward")


class Shadow(SqldpError):
    """PostgreSQL's error on a catalog query in the shadow database: about definitions only, shown as is."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


class Withheld(SqldpError):
    sqlstate = "22000"  # data_exception: the private data made it fail, as far as the analyst may know

    def __init__(self, upstream: str) -> None:
        super().__init__(
            "PostgreSQL failed while answering this private query, after its charge; what failed is not shown, "
            "since it could depend on the private data"
        )
        self.upstream = upstream  # PostgreSQL's SQLSTATE, for the data owner's log only


class Cancelled(SqldpError):
    sqlstate = "57014"

    def __init__(self) -> None:
        super().__init__("canceling statement due to user request")


def from_upstream(err: DatabaseError, *, public: bool) -> SqldpError:
    """What the analyst sees of PostgreSQL's failure on a query that passed the analysis. Over public tables:
    PostgreSQL's own SQLSTATE and message (they can only depend on public data), except that a lost upstream
    connection (class 08, or no SQLSTATE) is not the client's connection and is reported as 58000
    (system_error): drivers take 08 for a dropped connection of their own. Over private tables, after the
    charge: one fixed SQLSTATE and message whatever failed, since which error it was (and its message, which
    may quote a value) could depend on the private rows (docs/sql.md, "Errors are answers too")."""
    if not public:
        return Withheld(err.sqlstate)
    code = err.sqlstate if not err.sqlstate.startswith("08") else "58000"
    return DatabaseError(err.message, sqlstate=code)


_WHERE = re.compile(r"query:(\d+):(\d+)")


def locate(err: SqldpError, text: str, statement: str) -> None:
    """Set ``err.position`` to the character index in ``text`` (what the client sent) of the ``query:LINE:COL``
    the analysis gave for ``statement`` (the statement in ``text`` that the runner read), if it gave one."""
    m = _WHERE.fullmatch(err.where or "")
    if m is None or err.position is not None:
        return
    line, col = int(m.group(1)), int(m.group(2))
    start = 0
    for _ in range(line - 1):
        start = statement.find("\n", start) + 1
        if start == 0:
            return
    err.position = max(text.find(statement), 0) + start + col - 1
