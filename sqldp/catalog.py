"""The catalog: tables, columns, types and keys.

Read from PostgreSQL DDL files (parsed with sqlglot) or from a live database (``information_schema``).
The front end qualifies queries against it; the analyses ask it for column kinds (a DATE counts in days,
integer columns allow exact step functions for filters, NR §3.3.8.5).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypedDict

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp.errors import CatalogError, InputError, syntax_error

if TYPE_CHECKING:
    import psycopg

ColumnKind = Literal["integer", "numeric", "date", "text", "boolean", "other"]

_KINDS: dict[ColumnKind, frozenset[str]] = {
    "integer": frozenset({"TINYINT", "SMALLINT", "INT", "BIGINT", "SERIAL", "BIGSERIAL", "SMALLSERIAL"}),
    "numeric": frozenset({"DECIMAL", "FLOAT", "DOUBLE", "REAL", "MONEY", "BIGDECIMAL"}),
    "date": frozenset({"DATE"}),
    "text": frozenset({"CHAR", "VARCHAR", "TEXT", "NCHAR", "NVARCHAR", "NAME", "BPCHAR"}),
    "boolean": frozenset({"BOOLEAN"}),
}


def kind_of(type_name: str) -> ColumnKind:
    """Classify a SQL type name (sqlglot DataType name or information_schema data_type)."""
    head = type_name.upper().split("(")[0].strip()
    aliases = {
        "INTEGER": "INT",
        "INT4": "INT",
        "INT8": "BIGINT",
        "INT2": "SMALLINT",
        "NUMERIC": "DECIMAL",
        "DOUBLE PRECISION": "DOUBLE",
        "FLOAT8": "DOUBLE",
        "FLOAT4": "REAL",
        "CHARACTER VARYING": "VARCHAR",
        "CHARACTER": "CHAR",
        "BOOL": "BOOLEAN",
    }
    head = aliases.get(head, head)
    for kind, names in _KINDS.items():
        if head in names:
            return kind
    return "other"


@dataclass(frozen=True)
class Column:
    name: str
    type_sql: str
    kind: ColumnKind
    nullable: bool = True
    # whole numbers the column is known to lie in, beyond its type's range: only the model-checking analysis'
    # row ranks under a declared contribution bound (1 … τ, sqldp.sensitivity.global_bound) carry one
    bounds: tuple[int, int] | None = None
    # the interval (lo, hi; None: unbounded on that side) a validated CHECK constraint keeps every non-NULL value
    # of an integer or NUMERIC column in: read from PostgreSQL, which enforces it on every row (never from a DDL
    # file, whose constraints are claims). Only the rewriter uses it, to leave out clamps that change no value
    # (sqldp.rewrite.unclamp); the analyses take their ranges from the policy alone
    checked: tuple[Decimal | None, Decimal | None] | None = None
    # the conditions (PostgreSQL SQL, without ``CHECK``) of the CHECK constraints that name this column and no
    # other: validated ones when read from the database, which enforces them, else the DDL file's claims. Only
    # ``sqldp policy init`` reads them (sqldp.policy.init), to propose ranges and domains
    checks: tuple[str, ...] = ()
    # an enum type's labels in their sort order (from the database's pg_enum or the file's CREATE TYPE … AS ENUM)
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ForeignKey:
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    name: str
    columns: Mapping[str, Column]
    primary_key: tuple[str, ...] = ()
    foreign_keys: tuple[ForeignKey, ...] = ()
    unique: tuple[tuple[str, ...], ...] = ()  # UNIQUE constraints (the model-checking analysis uses them)

    def column(self, name: str) -> Column:
        try:
            return self.columns[name]
        except KeyError:
            raise CatalogError(f"column {name!r} does not exist in table {self.name!r}", sqlstate="42703") from None


@dataclass(frozen=True)
class Catalog:
    tables: Mapping[str, Table] = field(default_factory=dict)
    source: str = "<catalog>"
    # the keys and NOT NULLs are PostgreSQL's own (read from the database, which enforces them); a schema
    # file's are claims nothing checks the data against (sqldp.sensitivity.global_bound relies on this)
    enforced: bool = False

    def table(self, name: str) -> Table:
        try:
            return self.tables[name.lower()]
        except KeyError:
            raise CatalogError(f"table {name!r} does not exist") from None

    def sqlglot_schema(self) -> dict[str, object]:
        """The mapping sqlglot's ``qualify`` wants: table → column → type."""
        return {t.name: {c.name: c.type_sql for c in t.columns.values()} for t in self.tables.values()}

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_ddl(cls, text: str, *, source: str = "<ddl>") -> Catalog:
        """Parse CREATE TABLE (and ALTER TABLE … ADD PRIMARY/FOREIGN KEY/CHECK) statements, and the enum types of
        CREATE TYPE … AS ENUM."""
        try:
            statements = sqlglot.parse(text, read="postgres")
        except ParseError as exc:
            raise syntax_error(exc, "cannot parse DDL", source) from None
        tables: dict[str, _DdlTable] = {}
        enums: dict[str, tuple[str, ...]] = {}
        for stmt in statements:
            if stmt is None:
                continue
            if isinstance(stmt, exp.Create) and str(stmt.args.get("kind", "")).upper() == "TYPE":
                _add_enum(enums, stmt)
            elif isinstance(stmt, exp.Create) and str(stmt.args.get("kind", "")).upper() == "TABLE":
                _add_create(tables, stmt, source, enums)
            elif isinstance(stmt, exp.Alter):
                _add_alter(tables, stmt, source)
            # other statements (CREATE INDEX, comments, SET …) do not change the catalog
        if not tables:
            raise InputError("no CREATE TABLE statement found", where=source)
        for t in tables.values():
            for column, condition in t["checks"]:
                col = t["columns"].get(column)
                if col is not None:
                    t["columns"][column] = dataclasses.replace(col, checks=(*col.checks, condition))
        return cls(
            {
                name: Table(name, t["columns"], tuple(t["pk"]), tuple(t["fks"]), tuple(t["unique"]))
                for name, t in tables.items()
            },
            source,
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Catalog:
        """A DDL file, or a schema shipped with sqldp by name (``tpch``, ``cafeteria``)."""
        from sqldp.datasets import read_shipped

        text, source = read_shipped(path, ".sql", "schema")
        return cls.from_ddl(text, source=source)

    @classmethod
    def from_database(cls, conn: psycopg.Connection[Any], schema: str = "public") -> Catalog:
        """Read tables, columns and keys of one schema of a live database."""
        cols = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, numeric_precision, numeric_scale "
            "FROM information_schema.columns "
            "WHERE table_schema = %s ORDER BY table_name, ordinal_position",
            (schema,),
        ).fetchall()
        keys = conn.execute(
            """
            SELECT tc.table_name, tc.constraint_type, tc.constraint_name, kcu.column_name
            FROM information_schema.table_constraints tc
            JOIN information_schema.key_column_usage kcu
              ON kcu.constraint_name = tc.constraint_name AND kcu.table_schema = tc.table_schema
             AND kcu.table_name = tc.table_name
            WHERE tc.table_schema = %s AND tc.constraint_type IN ('PRIMARY KEY', 'UNIQUE')
            ORDER BY tc.table_name, tc.constraint_name, kcu.ordinal_position
            """,
            (schema,),
        ).fetchall()
        tables: dict[str, _DbTable] = {}
        for table, column, dtype, nullable, precision, scale in cols:
            t = tables.setdefault(table, {"columns": {}, "pk": [], "fks": {}, "unique": {}})
            type_sql = dtype.upper()
            if type_sql == "NUMERIC" and precision is not None:
                # keep DECIMAL(p, s): its grid 10^−s decides how a private filter is approximated (filters.py)
                type_sql = f"NUMERIC({precision},{scale or 0})"
            t["columns"][column] = Column(column, type_sql, kind_of(dtype), nullable == "YES")
        for table, ctype, cname, column in keys:
            keyed = tables.get(table)
            if keyed is None:
                continue
            if ctype == "PRIMARY KEY":
                if column not in keyed["pk"]:
                    keyed["pk"].append(column)
            else:
                keyed["unique"].setdefault(cname, []).append(column)
        for table, cname, column, ref_table, ref_column in conn.execute(FOREIGN_KEYS, (schema,)).fetchall():
            keyed = tables.get(table)
            if keyed is not None:  # column i references ref column i: pairs in the constraint's own order
                fk = keyed["fks"].setdefault(cname, ([], ref_table, []))
                fk[0].append(column)
                fk[2].append(ref_column)
        if not tables:
            raise InputError(f"the database has no tables in schema {schema!r}", where="--dsn")
        for table, column, labels in conn.execute(ENUMS, (schema,)).fetchall():
            owner = tables.get(table)
            col = owner["columns"].get(column) if owner is not None else None
            if owner is not None and col is not None:
                owner["columns"][column] = dataclasses.replace(col, labels=tuple(labels))
        for table, column, definition in conn.execute(CHECKS, (schema,)).fetchall():
            owner = tables.get(table)
            col = owner["columns"].get(column) if owner is not None else None
            if owner is None or col is None:
                continue
            condition = check_condition(definition)
            if condition is not None:
                col = dataclasses.replace(col, checks=(*col.checks, condition))
                owner["columns"][column] = col
            if not exact_type(col.type_sql):
                continue
            interval = checked_interval(definition, column)
            if interval is not None:  # every constraint holds: their intersection
                if col.checked is not None:
                    lows = [x for x in (col.checked[0], interval[0]) if x is not None]
                    highs = [x for x in (col.checked[1], interval[1]) if x is not None]
                    interval = (max(lows) if lows else None, min(highs) if highs else None)
                owner["columns"][column] = dataclasses.replace(col, checked=interval)
        return cls(
            {
                name: Table(
                    name,
                    t["columns"],
                    tuple(t["pk"]),
                    tuple(ForeignKey(tuple(c), rt, tuple(rc)) for c, rt, rc in t["fks"].values()),
                    tuple(tuple(cols) for cols in t["unique"].values()),
                )
                for name, t in tables.items()
            },
            f"database schema {schema}",
            enforced=True,
        )


# validated one-column CHECK constraints of a schema's tables that every row of the table, its inheritance
# children and partitions included, satisfies (NO INHERIT ones bind the parent's own rows only: left out)
CHECKS = """
SELECT c.relname, a.attname, pg_get_constraintdef(k.oid)
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.conkey[1]
WHERE n.nspname = %s AND k.contype = 'c' AND k.convalidated AND NOT k.connoinherit AND cardinality(k.conkey) = 1
ORDER BY c.relname, a.attname, k.conname
"""


# each foreign key's columns with the column each references, in the constraint's order (information_schema's
# constraint_column_usage lists the referenced columns unordered: a composite key's pairs would be guessed)
FOREIGN_KEYS = """
SELECT c.relname, k.conname, a.attname, r.relname, ra.attname
FROM pg_constraint k
JOIN pg_class c ON c.oid = k.conrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_class r ON r.oid = k.confrelid
CROSS JOIN LATERAL unnest(k.conkey, k.confkey) WITH ORDINALITY AS u(col, ref, pos)
JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.col
JOIN pg_attribute ra ON ra.attrelid = k.confrelid AND ra.attnum = u.ref
WHERE n.nspname = %s AND k.contype = 'f'
ORDER BY c.relname, k.conname, u.pos
"""

# the labels of each enum-typed column of a schema's tables, in the enum's sort order
ENUMS = """
SELECT c.relname, a.attname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
FROM pg_attribute a
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN pg_enum e ON e.enumtypid = a.atttypid
WHERE n.nspname = %s AND a.attnum > 0 AND NOT a.attisdropped AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
GROUP BY c.relname, a.attname
ORDER BY c.relname, a.attname
"""


def check_condition(definition: str) -> str | None:
    """The condition of ``pg_get_constraintdef``'s ``CHECK ((x >= 0))`` as SQL text (``(x >= 0)``); None for
    another form."""
    text = definition.strip()
    if not text.upper().startswith("CHECK"):
        return None
    return text[len("CHECK") :].strip() or None


def exact_type(type_sql: str) -> bool:
    """Integer or NUMERIC, never floating point: comparisons with a CHECK constraint's numbers are exact (no NaN a
    CHECK on a float could let through in other forms), and PostgreSQL's + − × / stay exact or truncate."""
    return kind_of(type_sql) == "integer" or type_sql.upper().split("(")[0].strip() in ("NUMERIC", "DECIMAL")


def constant(e: exp.Expr) -> Decimal | None:
    """The value of a numeric constant as PostgreSQL writes it back (``(50)::numeric``, ``'-999.99'::numeric``,
    ``(- 3)``), else None."""
    negative = False
    while True:
        if isinstance(e, (exp.Paren, exp.Cast)):
            e = e.this
        elif isinstance(e, exp.Neg):
            negative, e = not negative, e.this
        else:
            break
    if not isinstance(e, exp.Literal):
        return None
    try:
        value = Decimal(str(e.this))  # as sqlglot writes it (a float literal by its shortest repr)
    except InvalidOperation:
        return None
    if not value.is_finite():
        return None
    return -value if negative else value


def checked_interval(definition: str, column: str) -> tuple[Decimal | None, Decimal | None] | None:
    """The interval a CHECK constraint's definition (``pg_get_constraintdef``: ``CHECK (((c >= (1)::numeric) AND
    (c <= (50)::numeric)))``) keeps ``column`` in, when it is a conjunction of comparisons of the column with
    constants (``=``, ``<``, ``<=``, ``>``, ``>=``, ``BETWEEN``); None for any other form. A strict comparison gives the
    same closed end: the interval holds every allowed value, which is all the rewriter needs."""
    text = definition.strip()
    if not text.upper().startswith("CHECK"):
        return None
    try:
        tree = sqlglot.parse_one(text[len("CHECK") :].strip(), read="postgres")
    except ParseError:
        return None
    lo: Decimal | None = None
    hi: Decimal | None = None

    def is_column(e: exp.Expr) -> bool:
        while isinstance(e, exp.Paren):
            e = e.this
        return isinstance(e, exp.Column) and not e.table and e.name.lower() == column.lower()

    def tighten(low: Decimal | None, high: Decimal | None) -> None:
        nonlocal lo, hi
        if low is not None:
            lo = low if lo is None else max(lo, low)
        if high is not None:
            hi = high if hi is None else min(hi, high)

    while isinstance(tree, exp.Paren):
        tree = tree.this
    for part in tree.flatten() if isinstance(tree, exp.And) else [tree]:
        while isinstance(part, exp.Paren):
            part = part.this
        if isinstance(part, exp.Between) and is_column(part.this) and not part.args.get("symmetric"):
            low, high = constant(part.args["low"]), constant(part.args["high"])
            if low is None or high is None:
                return None
            tighten(low, high)
        elif isinstance(part, exp.EQ) and (is_column(part.this) or is_column(part.expression)):
            value = constant(part.expression if is_column(part.this) else part.this)
            if value is None:
                return None
            tighten(value, value)
        elif isinstance(part, (exp.GT, exp.GTE, exp.LT, exp.LTE)):
            left, right = part.this, part.expression
            flipped = not is_column(left)
            if flipped:
                left, right = right, left
            value = constant(right)
            if not is_column(left) or value is None:
                return None
            upper = isinstance(part, (exp.LT, exp.LTE)) != flipped
            if upper:
                tighten(None, value)
            else:
                tighten(value, None)
        else:
            return None
    return (lo, hi) if lo is not None or hi is not None else None


class _DdlTable(TypedDict):
    """A table while its CREATE TABLE and ALTER TABLE statements are read."""

    columns: dict[str, Column]
    pk: list[str]
    fks: list[ForeignKey]
    unique: list[tuple[str, ...]]
    checks: list[tuple[str, str]]  # (column, condition) of the one-column CHECK constraints, in file order


class _DbTable(TypedDict):
    """A table while information_schema's rows are read: a key's columns arrive one row each, so foreign keys
    (columns, referenced table, referenced columns) and UNIQUE constraints are gathered by constraint name."""

    columns: dict[str, Column]
    pk: list[str]
    fks: dict[str, tuple[list[str], str, list[str]]]
    unique: dict[str, list[str]]


def _ident(node: exp.Expr) -> str:
    return node.name.lower()


def _add_enum(enums: dict[str, tuple[str, ...]], stmt: exp.Create) -> None:
    """``CREATE TYPE name AS ENUM ('a', 'b')``: the labels by the type's name (other CREATE TYPEs are left out)."""
    target, body = stmt.this, stmt.args.get("expression")
    if isinstance(body, exp.DataType) and body.this == exp.DataType.Type.ENUM and isinstance(target, exp.Expr):
        labels = [v.this for v in body.expressions if isinstance(v, exp.Literal) and v.is_string]
        if len(labels) == len(body.expressions):
            enums[_ident(target)] = tuple(labels)


def _add_check(t: _DdlTable, condition: exp.Expr, column: str | None = None) -> None:
    """A CHECK constraint that names one column (``column``'s own, for a column constraint, names only it)."""
    named = {c.name.lower() for c in condition.find_all(exp.Column)}
    if len(named) == 1 and (column is None or named == {column}):
        t["checks"].append((named.pop(), condition.sql(dialect="postgres")))


def _add_create(
    tables: dict[str, _DdlTable], stmt: exp.Create, source: str, enums: Mapping[str, tuple[str, ...]]
) -> None:
    schema = stmt.this
    if not isinstance(schema, exp.Schema):
        raise InputError("CREATE TABLE … AS is not supported in schema files", where=source)
    name = _ident(schema.this)
    t = tables.setdefault(name, {"columns": {}, "pk": [], "fks": [], "unique": [], "checks": []})
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            col = _ident(item.this)
            kind = item.args.get("kind")
            type_sql = kind.sql(dialect="postgres") if kind is not None else "TEXT"
            not_null = False
            for constraint in item.args.get("constraints") or []:
                ck = constraint.args.get("kind")
                if isinstance(ck, exp.PrimaryKeyColumnConstraint):
                    t["pk"].append(col)
                    not_null = True
                elif isinstance(ck, exp.NotNullColumnConstraint) and not ck.args.get("allow_null"):
                    not_null = True
                elif isinstance(ck, exp.UniqueColumnConstraint):
                    t["unique"].append((col,))
                elif isinstance(ck, exp.Reference):
                    ref = ck.this
                    rt = _ident(ref.this) if isinstance(ref, exp.Schema) else _ident(ref)
                    rc = [_ident(c) for c in ref.expressions] if isinstance(ref, exp.Schema) else []
                    t["fks"].append(ForeignKey((col,), rt, tuple(rc)))
                elif isinstance(ck, exp.CheckColumnConstraint) and isinstance(ck.this, exp.Expr):
                    _add_check(t, ck.this, col)
            labels = None
            if isinstance(kind, exp.DataType) and kind.this == exp.DataType.Type.USERDEFINED:
                labels = enums.get(kind.args["kind"].name.lower()) if kind.args.get("kind") is not None else None
            t["columns"][col] = Column(col, type_sql, kind_of(type_sql), not not_null, labels=labels)
        else:
            _add_constraint(t, item)


def _add_constraint(t: _DdlTable, item: exp.Expr) -> None:
    if isinstance(item, exp.Constraint):  # CONSTRAINT name PRIMARY KEY (…)
        for inner in item.expressions:
            _add_constraint(t, inner)
    elif isinstance(item, exp.CheckColumnConstraint) and isinstance(item.this, exp.Expr):
        _add_check(t, item.this)
    elif isinstance(item, exp.PrimaryKey):
        t["pk"].extend(_ident(c) for c in item.expressions)
    elif isinstance(item, exp.UniqueColumnConstraint) and isinstance(item.this, exp.Schema):
        t["unique"].append(tuple(_ident(c) for c in item.this.expressions))
    elif isinstance(item, exp.ForeignKey):
        ref = item.args.get("reference")
        target = ref.this if ref is not None else None
        if isinstance(target, exp.Schema):
            t["fks"].append(
                ForeignKey(
                    tuple(_ident(c) for c in item.expressions),
                    _ident(target.this),
                    tuple(_ident(c) for c in target.expressions),
                )
            )


def _add_alter(tables: dict[str, _DdlTable], stmt: exp.Alter, source: str) -> None:
    name = _ident(stmt.this)
    if name not in tables:
        raise CatalogError(f"ALTER TABLE of unknown table {name!r}", where=source)
    for action in stmt.args.get("actions") or []:
        if isinstance(action, exp.AddConstraint):
            for item in action.expressions:
                _add_constraint(tables[name], item)
