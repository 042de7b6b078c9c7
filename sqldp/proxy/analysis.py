"""What is known of a statement before any row is read: the runner's analysis (:func:`prepare_query`) and, from it
and the upstream's Parse and Describe, the parameter and result types a client learns from Describe
(:func:`describe`)."""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg import pq

from sqldp.errors import SqldpError
from sqldp.proxy import statements
from sqldp.proxy import values as v
from sqldp.proxy.errors import TooComplex
from sqldp.proxy.outcome import BUDGET_COLUMNS, BUDGET_SHOW

if typing.TYPE_CHECKING:
    from sqldp.session import Session
    from sqldp.strategies import Compiled


def prepare_query(session: Session, sql: str, privacy: Mapping[str, Any]) -> Compiled:
    """The runner's two-step API: analyse now (no private data), run later."""
    try:
        return session.prepare(sql, **privacy)
    except RecursionError:  # sqlglot and the analyses recurse over the expression tree
        raise TooComplex() from None


@dataclass(frozen=True)
class Description:
    """A prepared statement as a client learns it from Describe: parameter and result column types."""

    params: tuple[int, ...]
    names: tuple[str, ...]
    columns: tuple[int, ...]


UNKNOWN = object()  # no description kept yet (ProxyServer.known_description)
Shape = tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]]  # parameter types, column names, column types


def parse_describe(conn: Any, query: str, oids: list[int]) -> Shape | None:
    """PostgreSQL's Parse and Describe of ``query`` as the unnamed statement on ``conn`` (a psycopg
    connection): nothing runs, no row is read. None when PostgreSQL refuses it."""
    pg = conn.pgconn
    ok = pq.ExecStatus.COMMAND_OK
    if pg.prepare(b"", query.encode("utf-8"), oids).status != ok:
        return None
    d = pg.describe_prepared(b"")
    if d.status != ok:
        return None
    params = tuple(d.param_type(i) for i in range(d.nparams))
    names = tuple((d.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(d.nfields))
    return params, names, tuple(d.ftype(i) for i in range(d.nfields))


def describe(
    session: Session,
    query: str,
    types: tuple[int, ...],
    privacy: Mapping[str, Any],
    upstream_describe: Callable[[str, list[int]], Shape | None] | None = None,
) -> Description | None:
    """Parameter and result column types of a SELECT, as a client learns them from Describe before it runs:
    asyncpg and pg8000 decode results by these (a noisy value announced as text failed to decode), asyncpg
    encodes parameters by them. None when unknown (the statement is not one the runner accepts).

    The runner's analysis (no data read) says which columns are released exactly; the upstream describes the
    statement (Parse and Describe read no rows) only after the analysis accepted it. Public columns and
    group keys keep the upstream's types; every noisy value is float8. ``upstream_describe`` does the Parse
    and Describe (:meth:`ProxyServer.upstream_describe`); without it a connection of the session's does."""
    try:
        kind = statements.classify(query).kind
        if kind == "declare":  # its parameters are its query's; DECLARE itself returns no rows
            inner = describe(session, statements.declare(query).query, types, privacy, upstream_describe)
            return None if inner is None else Description(inner.params, (), ())
        if kind != "select":
            return None
        n = statements.param_count(query)
        bound = statements.bind(query, lambda k: v.null_literal(types[k - 1] if k - 1 < len(types) else 0))
        prepared = prepare_query(session, bound, privacy)
    except (SqldpError, RecursionError):
        return None
    oids = [types[i] if i < len(types) else 0 for i in range(n)]
    if upstream_describe is None:
        with session.connection() as conn:
            got = parse_describe(conn, query, oids)
    else:
        got = upstream_describe(query, oids)
    if got is None:
        return None
    params, names, upstream = got
    if prepared.public:
        return Description(params, names, upstream)
    # the columns released with noise (a set operation's: those any measured branch releases so)
    noisy = prepared.noisy()
    if noisy is None or len(noisy) != len(upstream):
        return None
    return Description(params, names, tuple(v.FLOAT8 if n else u for u, n in zip(upstream, noisy, strict=True)))


def statement_shape(query: str) -> tuple[int, list[str] | None]:
    """A prepared statement's parameter count and, for a SELECT or SHOW, its result column names as far as
    they are known without running it (None: no result set)."""
    n = statements.param_count(query)
    stmt = statements.classify(query)
    if stmt.words == BUDGET_SHOW:
        return n, list(BUDGET_COLUMNS)
    if stmt.kind == "show":
        return n, [" ".join(stmt.words[1:])]
    if stmt.kind != "select":
        return n, None
    return n, _select_names(statements.bind(query, lambda k: "NULL"))


def _select_names(sql: str) -> list[str]:
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except Exception:
        return []
    if not isinstance(tree, exp.Select):
        return []
    out = []
    for item in tree.expressions:
        name = item.alias_or_name if isinstance(item, (exp.Alias, exp.Column)) else ""
        out.append(name or (item.sql_name().lower() if isinstance(item, exp.Func) else "?column?"))
    return out
