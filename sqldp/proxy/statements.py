"""What kind of statement a client sent, and binding ``$n`` parameters into its text.

A small lexer (PostgreSQL manual §4.1: string constants, quoted identifiers, dollar quoting, comments) finds
statement boundaries and ``$n`` placeholders outside literals; the statement itself is analysed by the
runner's own parser, which is the only judge of what a SELECT means.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from sqldp.errors import ForbiddenError, RefusedError, SqldpError, SqlSyntaxError

T = TypeVar("T")
# what the lexer found is kept for the KEPT most recent texts of up to KEPT_BELOW characters (:class:`_Kept`)
KEPT_BELOW = 4096
KEPT = 1024


class _Kept(Generic[T]):
    """``fn``, remembered for the :data:`KEPT` most recent texts of up to :data:`KEPT_BELOW` characters: clients
    send the same texts again and again (a prepared statement's every Bind, a dashboard's refresh), and each
    execution lexed its text six times (bound, split, classified, fingerprinted). ``fn`` must be a function of
    the text alone returning an immutable value; what it raises is raised again each time, not kept."""

    def __init__(self, fn: Callable[[str], T]) -> None:
        self.fn = fn
        self.cached = functools.lru_cache(maxsize=KEPT)(fn)
        functools.update_wrapper(self, fn)

    def __call__(self, sql: str) -> T:
        return self.cached(sql) if len(sql) <= KEPT_BELOW else self.fn(sql)


_DOLLAR_TAG = re.compile(r"\$([A-Za-z_][A-Za-z_0-9]*)?\$")
_PARAM = re.compile(r"\$(\d+)")
_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_COMMENT_EDGE = re.compile(r"/\*|\*/")
# the rest of a quoted string or identifier up to its closing quote (a doubled quote stands for itself); the
# possessive *+ never gives back a doubled quote, so "'ab''" is unterminated as in PostgreSQL's lexer
_QUOTED_BODY = {q: re.compile(f"(?:[^{q}]|{q}{q})*+{q}") for q in "'\""}
_ESCAPED = re.compile(r"(?:[^'\\]|\\.|'')*+'", re.S)  # E'…' strings: a backslash escapes any character
_PLAIN = re.compile(r"[^-/'\";$]+")  # a run of characters that cannot start a literal, comment or separator


def _tokens(sql: str) -> Iterator[tuple[str, int, int]]:
    """(kind, start, end) for 'code' characters, 'literal' spans, 'comment' spans and ';' separators."""
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c == "-" and sql.startswith("--", i):
            j = sql.find("\n", i)
            j = n if j < 0 else j + 1
            yield "comment", i, j
            i = j
        elif c == "/" and sql.startswith("/*", i):
            depth = 1  # block comments nest in PostgreSQL; only their edges are visited (a long one is one scan)
            for edge in _COMMENT_EDGE.finditer(sql, i + 2):
                depth += 1 if edge.group() == "/*" else -1
                if not depth:
                    break
            if depth:
                raise SqlSyntaxError("unterminated /* comment", where=f"position {i + 1}")
            yield "comment", i, edge.end()
            i = edge.end()
        elif c in "'\"":
            escape = (
                c == "'" and i > 0 and sql[i - 1] in "eE" and (i < 2 or not (sql[i - 2].isalnum() or sql[i - 2] == "_"))
            )
            # the closing quote by a regular expression, not a loop over characters: a literal may be 1 MB long
            m = (_ESCAPED if escape else _QUOTED_BODY[c]).match(sql, i + 1)
            if m is None:
                raise SqlSyntaxError(
                    "unterminated " + ("string" if c == "'" else "quoted identifier"), where=f"position {i + 1}"
                )
            yield "literal", i, m.end()
            i = m.end()
        elif (
            c == "$"
            and (m := _DOLLAR_TAG.match(sql, i))
            and not (i > 0 and (sql[i - 1].isalnum() or sql[i - 1] == "_"))
        ):
            tag = m.group(0)
            end = sql.find(tag, m.end())
            if end < 0:
                raise SqlSyntaxError("unterminated dollar-quoted string", where=f"position {i + 1}")
            yield "literal", i, end + len(tag)
            i = end + len(tag)
        elif c == ";":
            yield ";", i, i + 1
            i += 1
        else:
            m = _PLAIN.match(sql, i)
            j = m.end() if m and m.end() > i else i + 1
            yield "code", i, j
            i = j


def split(sql: str) -> list[str]:
    """The non-empty statements of a query string (comments kept inside each)."""
    return list(_split(sql))


@_Kept
def _split(sql: str) -> tuple[str, ...]:
    out, start = [], 0
    for kind, s, _e in _tokens(sql):
        if kind == ";":
            out.append(sql[start:s])
            start = s + 1
    out.append(sql[start:])
    return tuple(s for s in out if _code(s).strip())


def _code(sql: str) -> str:
    """The statement with comments blanked and literals replaced by a placeholder."""
    parts = []
    for kind, s, e in _tokens(sql):
        if kind == "code" or kind == ";":
            parts.append(sql[s:e])
        elif kind == "literal":
            parts.append(" 'x' ")
        else:
            parts.append(" ")
    return "".join(parts)


# Where a bound statement's literals stand: (start, end) in the statement as written, (start, end) in the bound one
Span = tuple[int, int, int, int]


def bind(sql: str, value_of: Callable[[int], str], spans: list[Span] | None = None) -> str:
    """Replace each ``$n`` outside literals and comments by ``value_of(n)`` (a validated SQL literal). Each
    replacement's place is appended to ``spans`` when given (:func:`unbound` maps positions back)."""
    places = _placeholders(sql)
    if not places:
        return sql
    parts, last, size = [], 0, 0
    for s, end, n in places:
        parts.append(sql[last:s])
        size += s - last
        value = value_of(n)
        parts.append(value)
        if spans is not None:
            spans.append((s, end, size, size + len(value)))
        size += len(value)
        last = end
    parts.append(sql[last:])
    return "".join(parts)


@_Kept
def _placeholders(sql: str) -> tuple[tuple[int, int, int], ...]:
    """(start, end, n) of each ``$n`` outside literals and comments."""
    out = []
    for kind, s, _e in _tokens(sql):
        if kind != "code" or sql[s] != "$":
            continue
        m = _PARAM.match(sql, s)
        if m and (s == 0 or not (sql[s - 1].isalnum() or sql[s - 1] == "_")):
            out.append((s, m.end(), int(m.group(1))))
    return tuple(out)


def unbound(spans: Sequence[Span], pos: int) -> int:
    """A character index into a bound statement as an index into the statement as written: inside a bound
    literal, the ``$n`` it replaced; elsewhere shifted by the lengths the literals added before it."""
    shift = 0
    for start, end, bound_start, bound_end in spans:
        if pos < bound_start:
            break
        if pos < bound_end:
            return start
        shift = bound_end - end
    return pos - shift


class NoParameter(SqldpError):
    sqlstate = "42P02"  # undefined_parameter

    def __init__(self, n: int, why: str = "") -> None:
        super().__init__(f"there is no parameter ${n}{why}")


def replace_code(sql: str, pattern: re.Pattern[str], replacement: str) -> str:
    """``pattern`` replaced by ``replacement`` outside literals and comments. A match cannot span a literal
    or a comment: the code between two of them is matched on its own."""
    parts = []
    for kind, s, e in _tokens(sql):
        parts.append(pattern.sub(replacement, sql[s:e]) if kind == "code" else sql[s:e])
    return "".join(parts)


@_Kept
def param_count(sql: str) -> int:
    """The highest ``$n`` in the statement (0: none). ``$0`` is refused as PostgreSQL refuses it: parameters
    count from 1, and a ``$0`` bound to "the parameter before the first" failed with an IndexError."""
    seen = [0]

    def note(n: int) -> str:
        if n == 0:
            raise NoParameter(0)
        seen[0] = max(seen[0], n)
        return ""

    bind(sql, note)
    return seen[0]


@_Kept
def fingerprint(sql: str) -> str:
    """A short hash of the statement's shape (whitespace and comments ignored, literals kept out of the logs)."""
    norm = " ".join(_code(sql).lower().split())
    return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Statement:
    kind: str  # empty, select, show, set, reset, begin, commit, rollback, discard, deallocate, declare, fetch, close
    sql: str
    words: tuple[str, ...]


_TX = {
    "begin": "begin",
    "start": "begin",
    "commit": "commit",
    "end": "commit",
    "rollback": "rollback",
    "abort": "rollback",
}
_REFUSE = {
    "insert",
    "update",
    "delete",
    "merge",
    "copy",
    "create",
    "drop",
    "alter",
    "truncate",
    "grant",
    "revoke",
    "vacuum",
    "analyze",
    "analyse",
    "cluster",
    "reindex",
    "lock",
    "comment",
    "security",
    "refresh",
    "call",
    "do",
    "import",
    "load",
    "listen",
    "notify",
    "unlisten",
    "prepare",
    "execute",
    "checkpoint",
    "explain",
    "reassign",
    "savepoint",
    "release",
}


@_Kept
def classify(sql: str) -> Statement:
    """One statement's kind; several statements, and anything that could write or change what matters, refused."""
    stmts = split(sql)
    if not stmts:
        return Statement("empty", sql, ())
    if len(stmts) > 1:
        raise RefusedError("several statements in one query are not accepted; send one statement at a time")
    code = _code(stmts[0])
    words = tuple(w.lower() for w in _WORD.findall(code))
    first = words[0] if words else code.strip()[:1]
    if first in ("select", "with", "values", "table") or code.lstrip().startswith("("):
        if {"into", "for"} & set(words) and re.search(r"\b(into|for\s+(update|share|no\s+key|key))\b", code, re.I):
            raise ForbiddenError("SELECT … INTO and row locks write or lock data; only reading queries are answered")
        return Statement("select", stmts[0], words)
    if first == "show":
        return Statement("show", stmts[0], words)
    if first in ("set", "reset"):
        return Statement(first, stmts[0], words)  # which settings may change is decided by the session
    if first == "savepoint" or first == "release" or (first in ("rollback", "abort") and "to" in words[1:3]):
        # savepoints inside a read-only transaction block; SQLAlchemy uses them around its type probes
        return Statement(
            "savepoint" if first == "savepoint" else first if first == "release" else "rollback_to", stmts[0], words
        )
    if first in _TX:
        if "write" in words:
            raise ForbiddenError("transactions that write are not allowed through sqldp (READ WRITE)")
        return Statement(_TX[first], stmts[0], words)
    if first == "discard":
        return Statement("discard", stmts[0], words)
    if first == "deallocate":
        return Statement("deallocate", stmts[0], words)
    if first in ("declare", "fetch", "move", "close"):
        # named cursors: psycopg's server-side cursors (:func:`declare` checks that the query is a SELECT)
        return Statement("fetch" if first == "move" else first, stmts[0], words)
    if first in _REFUSE:
        raise ForbiddenError(f"{first.upper()} is not allowed through sqldp: only SELECT queries are answered")
    if not _WORD.match(first or ""):
        raise SqlSyntaxError(f"syntax error at or near {first!r}", where="position 1")
    raise SqlSyntaxError(f"syntax error at or near {first!r}: only SELECT queries are answered", where="position 1")


# -- named cursors (DECLARE, FETCH, MOVE, CLOSE; PostgreSQL manual, SQL commands) ---------------------------

_CURSOR_TOKEN = re.compile(r"[A-Za-z_][A-Za-z_0-9$]*|[+-]?\d+|\S")
ALL = 2**63 - 1  # FETCH's count for ALL: PostgreSQL's FETCH_ALL (LONG_MAX), so FETCH 9223372036854775807 is ALL


class CursorError(SqldpError):
    sqlstate = "34000"  # invalid_cursor_name

    def __init__(self, message: str, sqlstate: str | None = None) -> None:
        super().__init__(message)
        if sqlstate:
            self.sqlstate = sqlstate


def _cursor_tokens(sql: str) -> list[tuple[str, int]]:
    """(token, start): words lowered, signed numbers and punctuation; a quoted identifier unquoted, with a
    leading '"' to tell it apart; a string constant as the one token "'"."""
    masked = list(sql)  # the code alone, each literal and comment blanked in place (a '-' and its digits join)
    out = []
    for kind, s, e in _tokens(sql):
        if kind in ("literal", "comment"):
            masked[s:e] = " " * (e - s)
        if kind == "literal":
            text = sql[s:e]
            out.append(('"' + text[1:-1].replace('""', '"') if text[0] == '"' else "'", s))
    for m in _CURSOR_TOKEN.finditer("".join(masked)):
        text = m.group()
        out.append((text.lower() if text[0].isalpha() or text[0] == "_" else text, m.start()))
    return sorted(out, key=lambda t: t[1])


def _cursor_name(token: str | None, what: str, noun: str = "cursor") -> str:
    if token is None or not (token[0] == '"' or _WORD.fullmatch(token)):
        raise SqlSyntaxError(f"syntax error in {what}: a {noun} name is expected")
    if token[0] == '"':
        if len(token) == 1:
            raise CursorError(f'invalid {noun} name ""')
        return token[1:]
    return token


def savepoint_name(sql: str) -> str:
    """The savepoint a SAVEPOINT, RELEASE [SAVEPOINT] or ROLLBACK [WORK | TRANSACTION] TO [SAVEPOINT] names: the
    statement's last word (folded to lower case unless quoted, as PostgreSQL's identifiers)."""
    words = [t for t, _ in _cursor_tokens(sql)]
    what = words[0].upper() if words else "SAVEPOINT"
    if len(words) < 2 or words[-1] == "to":  # TO is reserved: never a name unquoted
        raise SqlSyntaxError(f"syntax error in {what}: a savepoint name is expected")
    return _cursor_name(words[-1], what, "savepoint")


@dataclass(frozen=True)
class Declare:
    """``DECLARE name [BINARY] [ASENSITIVE | INSENSITIVE] [[NO] SCROLL] CURSOR [{WITH | WITHOUT} HOLD] FOR
    query``: the query as written and where it starts in the statement (for error positions)."""

    name: str
    query: str
    offset: int
    hold: bool
    scroll: bool | None  # None: not said (PostgreSQL then scrolls where the plan allows; a materialised one can)


def declare(sql: str) -> Declare:
    toks = _cursor_tokens(sql)
    words = [t for t, _ in toks]
    name = _cursor_name(words[1] if len(words) > 1 else None, "DECLARE")
    i, scroll = 2, None
    while i < len(words) and words[i] in ("binary", "asensitive", "insensitive", "no", "scroll"):
        if words[i] == "binary":
            raise RefusedError("binary cursors are not available through sqldp; fetch in binary format instead")
        if words[i] == "no":
            if words[i + 1 : i + 2] != ["scroll"]:
                break
            scroll, i = False, i + 1
        elif words[i] == "scroll":
            scroll = True
        i += 1
    if words[i : i + 1] != ["cursor"]:
        raise SqlSyntaxError("syntax error in DECLARE: CURSOR is expected after the name and options")
    i += 1
    hold = False
    if words[i : i + 2] in (["with", "hold"], ["without", "hold"]):
        hold, i = words[i] == "with", i + 2
    if words[i : i + 1] != ["for"] or i + 1 >= len(toks):
        raise SqlSyntaxError("syntax error in DECLARE: FOR and a SELECT are expected")
    offset = toks[i + 1][1]
    query = sql[offset:]
    if classify(query).kind != "select":
        raise ForbiddenError("a cursor can only be declared for a SELECT")
    return Declare(name, query, offset, hold, scroll)


@dataclass(frozen=True)
class Fetch:
    """``FETCH``/``MOVE [direction] [FROM | IN] name``, the direction in PostgreSQL's own terms (forward,
    backward, absolute, relative) with a count (:data:`ALL` for ALL)."""

    name: str
    direction: str
    count: int
    move: bool


_DIRECTIONS = {
    "next": ("forward", 1),
    "prior": ("backward", 1),
    "first": ("absolute", 1),
    "last": ("absolute", -1),
    "all": ("forward", ALL),
}


def _count(token: str | None) -> int | None:
    if token is not None and token.lstrip("+-").isdigit():
        n = int(token)
        if abs(n) > ALL:
            raise SqlSyntaxError(f"FETCH count {token} is out of range")
        return n
    return None


def fetch(sql: str) -> Fetch:
    words = [t for t, _ in _cursor_tokens(sql)]
    what = words[0].upper()
    rest = words[1:]
    direction, count = "forward", 1
    if len(rest) > 1:
        head = rest[0]
        if head in _DIRECTIONS:
            direction, count = _DIRECTIONS[head]
            rest = rest[1:]
        elif head in ("absolute", "relative"):
            n = _count(rest[1])
            if n is None:
                raise SqlSyntaxError(f"syntax error in {what}: {head.upper()} needs a count")
            direction, count, rest = head, n, rest[2:]
        elif head in ("forward", "backward"):
            direction = head
            n = _count(rest[1])
            if n is not None:
                count, rest = n, rest[2:]
            elif rest[1] == "all":
                count, rest = ALL, rest[2:]
            else:
                rest = rest[1:]
        elif (n := _count(head)) is not None:
            count, rest = n, rest[1:]
    if rest[:1] in (["from"], ["in"]):
        rest = rest[1:]
    if len(rest) != 1:
        raise SqlSyntaxError(f"syntax error in {what}: {what} [direction] [FROM | IN] cursor_name expected")
    return Fetch(_cursor_name(rest[0], what), direction, count, what == "MOVE")


def close(sql: str) -> str | None:
    """The cursor ``CLOSE name`` closes; None for ``CLOSE ALL``."""
    words = [t for t, _ in _cursor_tokens(sql)]
    if words[1:] == ["all"]:
        return None
    if len(words) != 2:
        raise SqlSyntaxError("syntax error in CLOSE: CLOSE cursor_name or CLOSE ALL expected")
    return _cursor_name(words[1], "CLOSE")


def run_fetch(position: int, n: int, f: Fetch) -> tuple[list[int], int]:
    """The 0-based indices of the rows ``f`` returns (MOVE: passes over) from a cursor over ``n`` rows at
    ``position`` (0: before the first row, k: on row k, n + 1: after the last), and its new position.

    PostgreSQL's own FETCH (its executor function DoPortalRunFetch) step by step, each step an executor run
    forward or backward over the materialised rows: ABSOLUTE k > 0 rewinds, steps k - 1 rows, returns the
    next; ABSOLUTE k < 0 runs to the end, steps back -k - 1 rows, returns the one before; RELATIVE k steps
    k - 1 rows and returns the next; a count of 0 returns the current row again (MOVE 0 counts it)."""
    pos = position

    def step(forward: bool, k: int) -> list[int]:
        nonlocal pos
        if k == 0 or (pos > n if forward else pos == 0):
            return []
        if forward:
            rows = list(range(pos, min(n, pos + k)))
            pos = pos + len(rows) if len(rows) == k else n + 1
        else:
            rows = list(range(pos - 2, max(-1, pos - 2 - k), -1))
            pos = pos - len(rows) if len(rows) == k else 0
        return rows

    direction, count = f.direction, f.count
    if direction == "absolute":
        if count > 0:
            pos = 0
            step(True, count - 1)
            return step(True, 1), pos
        if count < 0:
            step(True, ALL)
            step(False, -count - 1)
            return step(False, 1), pos
        return [], 0
    if direction == "relative":
        if count > 0:
            step(True, count - 1)
            return step(True, 1), pos
        if count < 0:
            step(False, -count - 1)
            return step(False, 1), pos
        direction = "forward"
    forward = direction == "forward"
    if count < 0:
        forward, count = not forward, -count
    if count == 0:
        return ([pos - 1] if 1 <= pos <= n else []), pos
    return step(forward, count), pos


def scrolls_back(position: int, n: int, f: Fetch) -> bool:
    """Whether ``f`` would run a cursor backward or rewind it, which PostgreSQL refuses for a NO SCROLL cursor
    ("cursor can only scan forward"): the same branches of DoPortalRunFetch as :func:`run_fetch`, where
    PostgreSQL's portalPos counts the rows passed (``n`` at the end) and a rewind at the start is no move."""
    portal_pos = min(position, n)
    count = f.count
    if f.direction == "absolute":
        if count > 0:
            rewinds = count - 1 <= portal_pos // 2 and position != 0
            return rewinds or count <= portal_pos + (position > n)
        return count < 0 or position != 0
    if f.direction == "relative" and count != 0:
        return count < 0
    backward = f.direction == "backward"
    if count < 0:
        backward, count = not backward, -count
    if count == 0:
        return not f.move and (backward or 1 <= position <= n)  # FETCH 0 steps back one row to return it
    return backward
