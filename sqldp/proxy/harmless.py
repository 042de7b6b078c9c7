"""What clients send on connecting, answered without touching private data.

``SELECT version()``, ``current_database()``, ``current_user``, constants (``SELECT 1`` as a liveness check),
``SHOW`` of standard settings and ``SET`` of settings that change nothing sqldp releases. Values come from
the upstream server once, at start-up (:func:`server_settings`), and from the analyst's own session. Every
other SET is refused: a setting that could change what the runner computes is the data owner's to choose.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import Dialect, exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sqldp.errors import ForbiddenError
from sqldp.proxy import values as v

# Settings a client may read; (name as PostgreSQL spells it in ParameterStatus, upstream or fixed value).
SHOWABLE = (
    "server_version",
    "server_version_num",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "max_identifier_length",
    "transaction_isolation",
    "default_transaction_isolation",
    "transaction_read_only",
    "default_transaction_read_only",
    "application_name",
    "extra_float_digits",
    "search_path",
    "is_superuser",
    "lc_collate",
    "lc_ctype",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "bytea_output",
    "client_min_messages",
    "in_hot_standby",
)
FIXED = {
    "client_encoding": "UTF8",
    "server_encoding": "UTF8",
    "DateStyle": "ISO, MDY",
    "IntervalStyle": "postgres",
    "integer_datetimes": "on",
    "standard_conforming_strings": "on",
    "transaction_read_only": "on",
    "default_transaction_read_only": "on",
    "is_superuser": "off",
    "bytea_output": "hex",
    "search_path": "public",
    "in_hot_standby": "off",
}
# What the proxy announces in ParameterStatus after authentication (§55.2.7 lists the ones libpq expects).
REPORTED = (
    "server_version",
    "server_encoding",
    "client_encoding",
    "DateStyle",
    "IntervalStyle",
    "TimeZone",
    "integer_datetimes",
    "standard_conforming_strings",
    "application_name",
    "is_superuser",
    "default_transaction_read_only",
    "in_hot_standby",
)
# SET that only changes the client's own view of the session; nothing sqldp computes depends on them.
SETTABLE = {"application_name", "extra_float_digits", "client_min_messages"}
_ALIASES = {"transaction isolation level": "transaction_isolation", "time zone": "timezone"}
# Settings a client may SET only to the value in effect (or RESET to it): the proxy does not pass a SET on to
# the upstream, whose sessions keep the server's, so another value would be a promise the answers do not keep
# (a zone changes how timestamptz values print and compare with dates; DMY changes how '01/02/2024' is read).
# Drivers and shells send them on connecting: pgcli sets its local zone, JDBC and psycopg2 the encoding and
# date style, often quoted.
PINNED = {"TimeZone", "DateStyle", "client_encoding"}
# Names of the zone UTC in the time zone database (links to one zone): equal to each other as settings.
_UTC = {"utc", "etc/utc", "uct", "etc/uct", "gmt", "etc/gmt", "gmt0", "etc/gmt0", "gmt+0", "etc/gmt+0", "gmt-0"}
_UTC |= {"etc/gmt-0", "greenwich", "etc/greenwich", "universal", "etc/universal", "zulu", "etc/zulu"}


def server_settings(conn: Any) -> dict[str, str]:
    """Read the showable settings and ``version()`` from the upstream (a psycopg connection)."""
    out = {}
    for name in SHOWABLE:
        if name in FIXED:
            out[name] = FIXED[name]
            continue
        row = conn.execute("SELECT current_setting(%s, true)", (name,)).fetchone()
        out[name] = row[0] if row and row[0] is not None else ""
    out["version"] = conn.execute("SELECT version()").fetchone()[0]
    out["database"] = conn.execute("SELECT current_database()").fetchone()[0]
    conn.rollback() if not conn.autocommit else None
    return out


@dataclass
class Answer:
    columns: list[str]
    types: list[int]
    rows: list[tuple[Any, ...]]
    tag: str


def _canonical(name: str) -> str | None:
    low = " ".join(name.strip().strip('"').lower().split())
    low = _ALIASES.get(low, low)
    for known in SHOWABLE:
        if known.lower() == low:
            return known
    return None


def show(words: tuple[str, ...], settings: Mapping[str, str]) -> Answer:
    name = " ".join(words[1:])
    known = _canonical(name)
    if known is None:
        raise ForbiddenError(f"SHOW {name} is not available through sqldp (only standard client settings are)")
    return Answer(
        [known.lower() if known != "TimeZone" else "TimeZone"], [v.TEXT], [(settings.get(known, ""),)], "SHOW"
    )


def set_(
    sql: str, words: tuple[str, ...], session: dict[str, str], server: Mapping[str, str] | None = None
) -> tuple[str, str | None]:
    """Apply a harmless SET/RESET to the session's own settings; return (name, new value or None for reset).
    ``server`` holds the upstream's settings (:func:`server_settings`), the values a :data:`PINNED` setting
    may be set to."""
    rest = [w for w in words[1:] if w not in ("session", "local")]
    if words[0] == "reset":
        name = " ".join(rest)
        if name == "all":
            return "all", None
        if name in SETTABLE:
            return name, None
        pinned = _canonical(name)
        if pinned in PINNED:
            return pinned, None
        raise ForbiddenError(f"RESET {name} is not allowed through sqldp")
    if rest[:1] == ["transaction"] or rest[:3] == ["characteristics", "as", "transaction"]:
        return _transaction_characteristics(rest[1:] if rest[0] == "transaction" else rest[3:])
    name = rest[0] if rest else ""
    if name in ("default_transaction_read_only", "default_transaction_isolation", "transaction_isolation"):
        if name == "default_transaction_read_only" and not {"on", "true", "1", "yes"} & set(rest[1:]):
            raise ForbiddenError("transactions that write are not allowed through sqldp (read only is fixed)")
        return "transaction", None
    pinned = _canonical("time zone" if rest[:2] == ["time", "zone"] else "client_encoding" if name == "names" else name)
    if pinned in PINNED:
        return _pinned(pinned, sql, {**FIXED, **(server or {})})
    if name not in SETTABLE:
        raise ForbiddenError(f"SET {name or '…'} is not allowed through sqldp (only {', '.join(sorted(SETTABLE))})")
    try:
        tree = sqlglot.parse_one(sql, read="postgres")
        item = tree.find(exp.EQ) or tree.find(exp.SetItem)
        value_node = item.expression if isinstance(item, exp.EQ) else None
        value = value_node.name if value_node is not None else ""
    except (ParseError, AttributeError):
        value = ""
    if not value:
        raise ForbiddenError(f"SET {name}: could not read the value")
    return name, value


_VALUE_TOKENS = {TokenType.STRING, TokenType.IDENTIFIER, TokenType.VAR, TokenType.NUMBER, TokenType.DEFAULT}


def _set_values(sql: str) -> list[str] | None:
    """The values of ``SET [SESSION | LOCAL] name {TO | =} v1, v2 …`` (``SET TIME ZONE v``, ``SET NAMES v``) as
    written, quoted or not: strings without their quotes, words and numbers as they stand; None when the value
    is anything else (an INTERVAL, an expression)."""
    try:
        tokens = list(Dialect.get_or_raise("postgres").tokenize(sql))
    except (ParseError, TokenError):
        return None
    texts = [t.text.lower() for t in tokens]
    i = 1
    while i < len(texts) and texts[i] in ("session", "local"):
        i += 1
    i += 2 if texts[i : i + 2] == ["time", "zone"] else 1
    if i < len(texts) and (texts[i] == "to" or tokens[i].token_type == TokenType.EQ):
        i += 1
    values, want_value = [], True
    for t in tokens[i:]:
        if want_value and t.token_type in _VALUE_TOKENS:
            values.append(t.text)
        elif not want_value and t.token_type == TokenType.COMMA:
            pass
        elif t.token_type == TokenType.SEMICOLON and not want_value:
            break
        else:
            return None
        want_value = not want_value
    return values if values and not want_value else None


def _pinned(name: str, sql: str, server: Mapping[str, str]) -> tuple[str, str | None]:
    """SET of a :data:`PINNED` setting: accepted when it names the value in effect, in any spelling PostgreSQL
    takes for it (quoted or not, any case, another name of the same zone); DEFAULT and LOCAL reset it."""
    values = _set_values(sql)
    current = server.get(name, "")
    if values is None:
        raise ForbiddenError(f"SET {name}: could not read the value (through sqldp it stays {current})")
    low = [x.lower() for x in values]
    if low in (["default"], ["local"]):
        return name, None
    if name == "TimeZone" and len(low) == 1:
        if low[0] == current.lower() or (low[0] in _UTC and current.lower() in _UTC):
            return name, current  # the zone in effect, as the server spells it
    elif name == "client_encoding" and len(low) == 1:
        if "".join(c for c in low[0] if c.isalnum()) in ("utf8", "unicode"):
            return name, "UTF8"
    elif name == "DateStyle":
        # output style ISO and field order MDY are the server's (FIXED); "US" and "NonEuropean" also mean MDY
        parts = {p for x in low for p in x.replace(",", " ").split()}
        if parts and parts <= {"iso", "mdy", "us", "noneuropean"}:
            return name, current
    shown = ", ".join(values)
    err = ForbiddenError(
        f"SET {name} TO {shown} is not available through sqldp: the proxy's sessions keep {name} = {current}"
    )
    if name == "TimeZone":  # pgcli sets the machine's zone on connecting unless its config says not to
        err.hint = "convert in the client instead (pgcli: use_local_timezone = False in its config)"
    raise err


_TX_WORDS = {"read", "only", "isolation", "level", "serializable", "repeatable", "committed", "uncommitted"}
_TX_WORDS |= {"deferrable", "not"}


def _transaction_characteristics(words: list[str]) -> tuple[str, None]:
    """SET TRANSACTION … and SET SESSION CHARACTERISTICS AS TRANSACTION … (JDBC's setReadOnly and
    setTransactionIsolation send them) are accepted and change nothing: every statement sqldp runs is read
    only, in a snapshot of its own. READ WRITE is refused, as in BEGIN."""
    if "write" in words:
        raise ForbiddenError("transactions that write are not allowed through sqldp (READ WRITE)")
    unknown = [w for w in words if w not in _TX_WORDS]
    if unknown or not words:
        raise ForbiddenError(f"SET TRANSACTION {' '.join(unknown or words).upper()} is not available through sqldp")
    return "transaction", None


# -- constant SELECTs -----------------------------------------------------------------------------

_FUNCS = {
    "version": v.TEXT,
    "current_database": v.NAME,
    "current_catalog": v.NAME,
    "current_user": v.NAME,
    "session_user": v.NAME,
    "user": v.NAME,
    "current_schema": v.NAME,
    "pg_backend_pid": v.INT4,
}


def _function_name(node: exp.Expr) -> str | None:
    if isinstance(node, exp.Dot) and isinstance(node.this, exp.Identifier) and node.this.name.lower() == "pg_catalog":
        node = node.expression
    if isinstance(node, exp.CurrentVersion):
        return "version"
    if isinstance(node, exp.CurrentUser):
        return "current_user"
    if isinstance(node, exp.CurrentSchema):
        return "current_schema"
    if isinstance(node, exp.Anonymous) and not node.expressions:
        return str(node.this).lower()
    if (
        isinstance(node, exp.Column)
        and not node.table
        and node.name.lower() in ("session_user", "user", "current_user", "current_catalog")
    ):
        return node.name.lower()
    if isinstance(node, exp.Func) and not node.args.get("this") and not node.expressions:
        return node.sql_name().lower()
    return None


def constant_select(sql: str, context: Mapping[str, Any]) -> Answer | None:
    """The answer to a SELECT without FROM whose items are constants or the functions above; None otherwise."""
    try:
        trees = sqlglot.parse(sql, read="postgres")
    except ParseError:
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select):
        return None
    tree = trees[0]
    if any(tree.args.get(k) for k in ("from_", "from", "where", "group", "having", "joins", "with", "order", "limit")):
        return None
    cols: list[str] = []
    types: list[int] = []
    row: list[Any] = []
    for item in tree.expressions:
        alias = item.alias if isinstance(item, exp.Alias) else None
        node = item.this if isinstance(item, exp.Alias) else item
        if isinstance(node, exp.Literal):
            if node.is_string:
                value, oid, name = node.this, v.TEXT, "?column?"
            elif node.this.lstrip("-").isdigit() and abs(int(node.this)) < 2**31:
                value, oid, name = int(node.this), v.INT4, "?column?"
            else:
                return None
        elif isinstance(node, exp.Boolean):
            value, oid, name = bool(node.this), v.BOOL, "bool"
        elif isinstance(node, exp.Null):
            value, oid, name = None, v.TEXT, "?column?"
        else:
            fn = _function_name(node)
            if fn not in _FUNCS:
                return None
            value, oid, name = context[fn], _FUNCS[fn], fn
        cols.append(alias or name)
        types.append(oid)
        row.append(value)
    if not cols:
        return None
    return Answer(cols, types, [tuple(row)], "SELECT 1")


# -- system catalogs ------------------------------------------------------------------------------

SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")


def catalog_select(sql: str, is_user_table: Callable[[str], bool]) -> Answer | None:
    """A SELECT that reads only system catalogs (``pg_type`` probes by drivers, e.g. psycopg's ``TypeInfo``)
    is answered with no rows: the proxy does not expose the upstream's catalogs (``pg_stats`` alone holds
    sampled column values), and "not found" is what drivers handle for optional types such as hstore."""
    try:
        trees = sqlglot.parse(sql, read="postgres")
    except ParseError:
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Select):
        return None
    tables = list(trees[0].find_all(exp.Table))
    if not tables:
        return None
    for t in tables:
        schema = t.db.lower() if t.db else ""
        name = t.name.lower()
        system = schema in SYSTEM_SCHEMAS or (not schema and name.startswith("pg_") and not is_user_table(name))
        if not system:
            return None
    names = []
    for item in trees[0].expressions:
        names.append(item.alias_or_name or "?column?")
    return Answer(names, [v.TEXT] * len(names), [], "SELECT 0")
