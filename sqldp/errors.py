"""User-facing errors.

Every problem a user can cause (bad SQL, a broken policy file, a wrong flag) or that sqldp refuses on
principle (a query it cannot analyse) is a :class:`SqldpError`.  The CLI prints ``str(err)`` as one line
on stderr and exits with ``err.exit_code``; the proxy sends it as an ErrorResponse with ``err.sqlstate``.
Nothing else about an error is shown to the user, so the message must say *what* and *where*.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlglot.errors import ParseError


class SqldpError(Exception):
    """Base class: a one-line, user-facing problem."""

    exit_code = 2
    sqlstate = "XX000"
    # 0-based character index of ``where`` in the text a client sent, when a front end worked it out (the proxy
    # sends it as the ErrorResponse's P field, so psql draws its caret); None: no position
    position: int | None = None
    hint: str | None = None  # what the user can do about it (the proxy's H field; psql prints HINT:)
    # the query's part the problem is about, when it was found on a rewritten tree that keeps no positions (a
    # group key of the analysis form): the front end locates it in the text (sqldp.frontend.locate)
    subject: object | None = None

    def __init__(self, message: str, *, where: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.where = where

    def __str__(self) -> str:
        text = " ".join(self.message.split())  # always one line
        return f"{self.where}: {text}" if self.where else text


def about(subject: object, err: SqldpError) -> SqldpError:
    """``err`` with the query part it is about (:attr:`SqldpError.subject`), for the front end to locate."""
    err.subject = subject
    return err


class InputError(SqldpError):
    """Malformed input: SQL, policy or schema files, command-line flags."""

    sqlstate = "22023"  # invalid_parameter_value


class SqlSyntaxError(InputError):
    sqlstate = "42601"  # syntax_error


class CatalogError(InputError):
    """An unknown table or column."""

    sqlstate = "42P01"  # undefined_table (42703 for columns, set per instance)

    def __init__(self, message: str, *, where: str | None = None, sqlstate: str | None = None) -> None:
        super().__init__(message, where=where)
        if sqlstate:
            self.sqlstate = sqlstate


class PolicyError(InputError):
    """A policy file that is missing, malformed or inconsistent with the catalog."""

    sqlstate = "F0000"  # config_file_error


class RefusedError(SqldpError):
    """A query sqldp cannot answer with a privacy guarantee. It is never answered without noise."""

    sqlstate = "0A000"  # feature_not_supported


class ForbiddenError(RefusedError):
    """The policy forbids what the query asks (e.g. releasing a private column)."""

    sqlstate = "42501"  # insufficient_privilege


class TooLargeError(RefusedError):
    """A private query whose statements PostgreSQL's planner expects to be larger than the session allows
    (sqldp.session.Session.check): refused before anything runs or is charged."""

    sqlstate = "54000"  # program_limit_exceeded


class BudgetExhaustedError(SqldpError):
    """The analyst's privacy budget does not cover the query."""

    sqlstate = "53400"  # configuration_limit_exceeded: the closest standard class for a spent quota
    hint = "SHOW sqldp.budget (through the proxy) or sqldp budget show says what is left"


# SQLSTATE classes of a database that cannot serve (PostgreSQL manual, Appendix A): no connection, too few
# resources, shut down by an operator (57P01…, not 57014, a cancelled statement), a system or internal error
UNREACHABLE_CLASSES = ("08", "53", "57P", "58", "XX")


class DatabaseError(SqldpError):
    """The database could not be reached or failed while running sqldp's own SQL. ``sqlstate`` is
    PostgreSQL's own code when it reported one (a division by zero is 22012), else 08000 (no connection).
    The CLI exits 1 for a database that cannot serve (:data:`UNREACHABLE_CLASSES`) and 2, as for other bad
    input, for a statement PostgreSQL rejected or failed on (42883: an operator that does not exist)."""

    exit_code = 1
    sqlstate = "08000"  # connection_exception

    def __init__(self, message: str, *, where: str | None = None, sqlstate: str | None = None) -> None:
        super().__init__(message, where=where)
        if sqlstate:
            self.sqlstate = sqlstate
        self.exit_code = 1 if self.sqlstate.startswith(UNREACHABLE_CLASSES) else 2


class StatementError(InputError):
    """PostgreSQL refused a statement before running it (parse analysis: a literal that is not of its type,
    an operator that does not exist). That depends on the statement and the schema only, never on the rows,
    so its own SQLSTATE and message may be shown to anyone."""

    def __init__(self, message: str, *, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def syntax_error(exc: ParseError, what: str, where: str, *, line: int = 1, col: int = 1) -> SqlSyntaxError:
    """sqlglot's ParseError as one line: ``{what}: {description} near {text!r}`` at ``where:LINE:COL`` of the
    first error sqlglot reports. ``line`` and ``col`` are where the parsed text starts in ``where`` (a
    statement cut out of a longer file); sqlglot counts from the start of the text it was given."""
    err = exc.errors[0] if exc.errors else {}
    detail = err.get("description") or str(exc)
    near = err.get("highlight")
    if near:
        detail = f"{detail} near {near!r}"
    at_line, at_col = err.get("line"), err.get("col")
    if isinstance(at_col, int) and isinstance(near, str) and near and "\n" not in near:
        # sqlglot's column is the highlighted token's last character; PostgreSQL (and psql's caret) point at
        # its first, as ``frontend.position`` does
        at_col = max(1, at_col - len(near) + 1)
    line_s = str(line + at_line - 1) if isinstance(at_line, int) else "?"
    col_s = str(at_col + (col - 1 if at_line == 1 else 0)) if isinstance(at_col, int) else "?"
    return SqlSyntaxError(f"{what}: {detail}", where=f"{where}:{line_s}:{col_s}")
