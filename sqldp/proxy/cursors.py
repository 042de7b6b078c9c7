"""What a connection keeps by name between messages: prepared statements (Parse), portals (Bind) and the named
cursors DECLARE makes, each a portal whose rows were released when it was declared; FETCH and MOVE page through
those, CLOSE, a transaction block's end (sqldp.proxy.transaction) and DISCARD ALL close them."""

from __future__ import annotations

from dataclasses import dataclass

from sqldp.errors import SqldpError, SqlSyntaxError
from sqldp.proxy import statements
from sqldp.proxy.analysis import Description
from sqldp.proxy.errors import ScanForward, TooLarge
from sqldp.proxy.outcome import Outcome


@dataclass(frozen=True)
class Limits:
    """What one connection may keep (PostgreSQL sets no limit; a client could otherwise grow the proxy without
    bound): named prepared statements, the bytes of their text, open portals."""

    prepared: int
    prepared_bytes: int
    portals: int


@dataclass
class Cursor:
    """A named cursor (DECLARE): its portal's outcome holds every row, released in full when it was declared;
    FETCH and MOVE page through them (:func:`statements.run_fetch`)."""

    hold: bool  # WITH HOLD: outlives COMMIT
    scroll: bool | None  # NO SCROLL (False) refuses backward moves, as PostgreSQL does
    position: int = 0  # 0: before the first row, k: on row k, len(rows) + 1: after the last
    in_transaction: bool = False  # declared in the open transaction block: ROLLBACK closes it, even WITH HOLD


@dataclass
class Portal:
    sql: str
    result_formats: tuple[int, ...]
    outcome: Outcome | None = None
    sent: int = 0
    empty: bool = False  # no statement in it (only comments or blanks): EmptyQueryResponse
    types: tuple[int, ...] | None = None  # result column types as Describe of its statement announced them
    spans: tuple[statements.Span, ...] = ()  # where its parameters were bound (error positions map back)
    cursor: Cursor | None = None  # a portal made by DECLARE


class Portals(dict[str, Portal]):
    """The connection's open portals by name, the unnamed one included; a declared cursor is one of them."""

    def portal(self, name: str) -> Portal:
        portal = self.get(name)
        if portal is None:
            raise SqlSyntaxError(f'portal "{name}" does not exist')
        return portal

    def room(self, limits: Limits) -> None:
        """54000 when the connection holds as many portals as it may."""
        if len(self) >= limits.portals:
            raise TooLarge(f"too many open portals on this connection (limit {limits.portals}); close some")

    def cursor(self, name: str) -> tuple[Cursor, Outcome]:
        portal = self.get(name)
        if portal is None or portal.cursor is None or portal.outcome is None:
            raise statements.CursorError(f'cursor "{name}" does not exist')
        return portal.cursor, portal.outcome

    def fetch(self, f: statements.Fetch) -> Outcome:
        """FETCH or MOVE on a declared cursor, from its released rows (no statement runs)."""
        cursor, outcome = self.cursor(f.name)
        n = len(outcome.rows)
        if cursor.scroll is False and statements.scrolls_back(cursor.position, n, f):
            raise ScanForward()
        rows, cursor.position = statements.run_fetch(cursor.position, n, f)
        if f.move:
            return Outcome(f"MOVE {len(rows)}")
        return Outcome(f"FETCH {len(rows)}", outcome.columns, outcome.types, [outcome.rows[i] for i in rows])

    def close_cursor(self, name: str) -> None:
        """CLOSE name: 34000 if there is no such cursor (a portal of Bind is none)."""
        self.cursor(name)
        del self[name]

    def close_cursors(self, *, committed: bool = False, everything: bool = False) -> None:
        """At the end of a transaction block: cursors WITHOUT HOLD close; so do those WITH HOLD declared in a
        block that rolls back (PostgreSQL manual, DECLARE). ``everything``: CLOSE ALL, DISCARD ALL."""
        for name, portal in list(self.items()):
            c = portal.cursor
            if c is None:
                continue
            if everything or not c.hold or (c.in_transaction and not committed):
                del self[name]
            else:
                c.in_transaction = False

    def cursor_shape(self, query: str) -> Outcome | None:
        """For Describe of a prepared FETCH: the cursor's columns (None if it is no FETCH of a cursor)."""
        try:
            if statements.classify(query).kind != "fetch":
                return None
            f = statements.fetch(query)
            return None if f.move else self.cursor(f.name)[1]
        except SqldpError:
            return None


class PreparedStatements:
    """The connection's prepared statements by name (Parse; the unnamed one is replaced by the next), with what
    Describe learnt and announced of each."""

    def __init__(self) -> None:
        self.texts: dict[str, tuple[str, tuple[int, ...]]] = {}  # name → (text, parameter types)
        self.described: dict[str, Description | None] = {}  # statement name → what the upstream said of it
        # statement name → the result types its Describe announced: a Bind of it encodes by those (pgjdbc
        # reads a named statement's executions by the columns it was told once)
        self.announced: dict[str, tuple[int, ...]] = {}

    def __contains__(self, name: object) -> bool:
        return name in self.texts

    def __getitem__(self, name: str) -> tuple[str, tuple[int, ...]]:
        return self.texts[name]

    def require(self, name: str) -> None:
        """42601 (PostgreSQL: 26000) for a statement that was never prepared or is closed."""
        if name not in self.texts:
            raise SqlSyntaxError(f'prepared statement "{name}" does not exist')

    def retype(self, name: str, types: tuple[int, ...]) -> None:
        """The parameter types Describe found for those the client left unspecified (0)."""
        self.texts[name] = (self.texts[name][0], types)

    def add(self, name: str, query: str, types: tuple[int, ...], limits: Limits) -> None:
        """Parse: a named statement is new (42P05 in PostgreSQL, 42601 here), and every statement counts against
        the connection's limits; the unnamed one replaces its predecessor."""
        if name and name in self.texts:
            raise SqlSyntaxError(f'prepared statement "{name}" already exists')
        kept = [q for other, (q, _) in self.texts.items() if other != name]
        if name and len(kept) >= limits.prepared:
            raise TooLarge(f"too many prepared statements on this connection (limit {limits.prepared}); close some")
        if sum(map(len, kept)) + len(query) > limits.prepared_bytes:
            raise TooLarge(
                f"prepared statements on this connection would hold over {limits.prepared_bytes} bytes; close some"
            )
        self.texts[name] = (query, types)
        self.described.pop(name, None)
        self.announced.pop(name, None)

    def close(self, name: str) -> None:
        """Close of a statement: nothing happens for one that does not exist (§55.2.3)."""
        self.texts.pop(name, None)
        self.described.pop(name, None)
        self.announced.pop(name, None)

    def deallocate(self, target: str) -> None:
        """DEALLOCATE name, or ALL (``all``): every named statement, the unnamed one stays."""
        if target == "all":
            self.texts = {k: s for k, s in self.texts.items() if not k}
        else:
            self.texts.pop(target, None)
