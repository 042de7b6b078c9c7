"""Catalog discovery for clients and BI tools: psql's ``\\dt``/``\\d``, SQLAlchemy's ``inspect()``, JDBC's
``DatabaseMetaData.getTables``/``getColumns`` and the like query PostgreSQL's system catalogs.

Those queries never reach the upstream database, whose catalogs hold more than the analyst may see:
``pg_stats`` holds sampled column values, ``pg_class.reltuples`` row counts, ``pg_stat_*`` and
``pg_database_size`` activity and sizes, all of them functions of the private data (docs/sql.md, "Public data").
They run instead in a *shadow* database the proxy creates on the upstream server at start-up, holding the
catalog's tables as empty tables with their column names, types, NOT NULL, primary, unique and foreign keys —
sqldp's catalog, nothing else: no row was ever in them, so no statistic describes data. A catalog query runs
there read only, and only when every relation it reads is one that describes definitions
(:data:`RELATIONS`) and every function it calls is one that formats or looks up definitions
(:data:`FUNCTIONS`); the cluster-wide views and functions (sessions, databases, sizes, activity) are not
among them. Any other query over the system catalogs gets no rows, as before, which is what drivers expect
for something not found.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
import sqlglot
from psycopg import pq, sql
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp import allowlist
from sqldp.catalog import Catalog
from sqldp.proxy import statements

T = TypeVar("T")
Views = dict[str, tuple[str, ...]]  # information_schema view → its columns, in order
SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")

# Catalog relations that describe definitions only (names, types, keys, defaults, comments, indexes): per
# database, so in the shadow they describe the shadow's tables. Not here, so answered with no rows: the
# statistics (pg_statistic, pg_stats, pg_statistic_ext_data), the activity and size views (pg_stat_*,
# pg_locks, pg_settings), and the catalogs shared by the whole cluster (pg_database, pg_roles, pg_authid,
# pg_tablespace, pg_shdescription), which would describe the upstream server.
RELATIONS = frozenset(
    {
        "pg_class", "pg_namespace", "pg_attribute", "pg_type", "pg_index", "pg_constraint", "pg_attrdef",
        "pg_description", "pg_am", "pg_inherits", "pg_trigger", "pg_policy", "pg_collation", "pg_statistic_ext",
        "pg_publication", "pg_publication_namespace", "pg_publication_rel", "pg_proc", "pg_operator",
        "pg_opclass", "pg_enum", "pg_range", "pg_depend", "pg_sequence", "pg_partitioned_table",
        "pg_foreign_table", "pg_rewrite", "pg_tables", "pg_views", "pg_matviews", "pg_indexes", "pg_extension",
        "pg_cast", "pg_language", "pg_aggregate",
        # information_schema
        "tables", "columns", "views", "schemata", "table_constraints", "key_column_usage",
        "constraint_column_usage", "referential_constraints", "check_constraints", "element_types",
        "domains", "sequences", "routines", "parameters", "attributes",
    }
)  # fmt: skip

# Functions PostgreSQL has no sqlglot class for (exp.Anonymous), by name: they format or look up definitions.
FUNCTIONS = frozenset(
    {
        "format_type", "pg_get_expr", "pg_get_indexdef", "pg_get_constraintdef", "pg_get_userbyid",
        "pg_table_is_visible", "pg_type_is_visible", "pg_function_is_visible", "obj_description",
        "col_description", "pg_get_statisticsobjdef_columns", "pg_get_triggerdef", "pg_get_partkeydef",
        "pg_get_partition_constraintdef", "pg_partition_ancestors", "pg_relation_is_publishable",
        "pg_get_viewdef", "pg_get_serial_sequence", "pg_get_function_result", "pg_get_function_arguments",
        "pg_get_function_identity_arguments", "pg_get_ruledef", "quote_ident", "array_upper", "array_lower",
        "generate_subscripts", "string_to_array", "pg_encoding_to_char", "current_schemas", "_pg_expandarray",
        "_pg_char_max_length", "_pg_numeric_precision", "_pg_numeric_scale", "_pg_datetime_precision",
        "_pg_truetypid", "_pg_truetypmod", "_pg_char_octet_length", "_pg_numeric_precision_radix",
        "_pg_interval_type", "_pg_index_position", "pg_index_column_has_property", "pg_get_keywords",
        "array_position", "regexp_replace", "translate", "textcat", "array_to_string", "row_number",
        "json_build_object", "jsonb_build_object", "pg_collation_is_visible",
    }
)  # fmt: skip

# sqlglot's own function classes a catalog query may use besides those on sqldp's allow-list.
CLASSES: frozenset[type[exp.Expr]] = frozenset(
    {
        exp.Case, exp.If, exp.Cast, exp.TryCast, exp.RegexpLike, exp.RegexpILike, exp.Collate, exp.Array,
        exp.ArrayAgg, exp.GroupConcat, exp.ExplodingGenerateSeries, exp.GenerateSeries, exp.Unnest,
        exp.ArrayToString, exp.ArraySize, exp.ArrayContains, exp.ArrayContainsAll, exp.CurrentSchema,
        exp.Explode, exp.ArrayFirst,
    }
)  # fmt: skip


def is_catalog_query(tree: exp.Expr, is_user_table: Callable[[str], bool]) -> bool:
    """Whether the statement reads system catalogs only (at least one relation, all of them system ones)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    tables = [t for t in tree.find_all(exp.Table) if t.name]
    if not tables:
        return False
    for t in tables:
        schema, name = (t.db or "").lower(), t.name.lower()
        if not schema and name in ctes:
            continue
        if not (schema in SYSTEM_SCHEMAS or (not schema and name.startswith("pg_") and not is_user_table(name))):
            return False
    return True


def refusal(tree: exp.Expr) -> str | None:
    """Why the shadow may not answer this catalog query (None: it may)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for t in tree.find_all(exp.Table):
        name = t.name.lower()
        if name and name not in RELATIONS and name not in ctes:
            return f"relation {name}"
    for node in tree.find_all(exp.Func):
        if isinstance(node, exp.Anonymous):
            if str(node.this).lower() not in FUNCTIONS:
                return f"function {node.this}"
        elif type(node) not in allowlist.ALLOWED and type(node) not in CLASSES:
            return f"function {node.sql_name()}"
    for other in tree.find_all(exp.Lock, exp.Into):
        return other.key
    return None


_CURRENT_DATABASE = re.compile(r"(?i)\b(?:pg_catalog\s*\.\s*)?(?:current_database\s*\(\s*\)|current_catalog\b)")


def localize(sql_text: str, database: str, views: Views | None = None, shadow: str = "") -> str:
    """The query as the shadow runs it: ``current_database()`` (JDBC's TABLE_CAT) is the database the client
    connected to, not the shadow's name; so is every ``*_catalog`` column of the ``information_schema`` views
    (``views``: their columns, :meth:`Shadow.views`), which PostgreSQL fills with the shadow's own name
    (``shadow``): ibis lists ``information_schema.tables WHERE table_catalog = '<database>'``."""
    local = statements.replace_code(sql_text, _CURRENT_DATABASE, "'" + database.replace("'", "''") + "'::name")
    if views and "information_schema" in local.lower():
        return _catalog_named(local, database, views, shadow)
    return local


# The columns of the information_schema views that PostgreSQL fills with current_database() (or NULL).
def _is_catalog_column(name: str) -> bool:
    return name.endswith("_catalog") or name == "catalog_name"


def _catalog_named(sql_text: str, database: str, views: Views, shadow: str) -> str:
    """Each ``information_schema.<view>`` read as a derived table of the same name (or alias) whose catalog
    columns say ``database`` where the view says ``shadow``; the text as it was when there is none, or when a
    column is named through the schema (``information_schema.tables.table_name``), which a derived table's
    alias cannot stand for."""
    tree = parse(sql_text)
    if tree is None or any((c.args.get("db") or "") for c in tree.find_all(exp.Column)):
        return sql_text
    changed = False
    for table in list(tree.find_all(exp.Table)):
        columns = views.get(table.name.lower()) if (table.db or "").lower() == "information_schema" else None
        if not columns or not any(_is_catalog_column(c) for c in columns):
            continue
        items: list[exp.Expr] = []
        for name in columns:
            col = exp.column(name, quoted=True)
            if _is_catalog_column(name):
                renamed = exp.If(this=exp.EQ(this=col.copy(), expression=exp.Literal.string(shadow)))
                renamed.set("true", exp.Literal.string(database))
                items.append(exp.alias_(exp.Case(ifs=[renamed], default=col), name, quoted=True))
            else:
                items.append(col)
        source = exp.Table(this=exp.to_identifier(table.name, quoted=True), db=exp.to_identifier("information_schema"))
        alias = table.args.get("alias")
        alias = alias.copy() if alias is not None else exp.TableAlias(this=exp.to_identifier(table.name))
        table.replace(exp.Subquery(this=exp.select(*items).from_(source), alias=alias))
        changed = True
    if not changed:
        return sql_text
    try:
        return tree.sql(dialect="postgres")
    except Exception:  # sqlglot cannot write it back: the text as the client sent it (its catalog as the shadow's)
        return sql_text


def parse(sql_text: str) -> exp.Expr | None:
    try:
        trees = sqlglot.parse(sql_text, read="postgres")
    except ParseError:
        return None
    if len(trees) != 1 or not isinstance(trees[0], exp.Query):
        return None
    return trees[0]


@dataclass
class Rows:
    """A catalog answer as PostgreSQL gave it: column names, type OIDs and values in text format."""

    columns: list[str]
    types: list[int]
    rows: list[tuple[str | None, ...]]


def _type_sql(conn: psycopg.Connection[Any], table: str) -> dict[str, str]:
    """The exact column types of an upstream table as PostgreSQL spells them (``character(25)``, where the
    catalog read through information_schema keeps only ``CHARACTER``): definitions, no data."""
    rows = conn.execute(
        "SELECT a.attname, format_type(a.atttypid, a.atttypmod) FROM pg_attribute a "
        "WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped",
        (sql.Identifier(table).as_string(conn),),
    ).fetchall()
    return {name: typ for name, typ in rows}


def ddl(catalog: Catalog, types: Callable[[str], dict[str, str]]) -> list[sql.Composed]:
    """CREATE TABLE statements for the shadow: the catalog's tables, columns, NOT NULL and keys."""
    out: list[sql.Composed] = []
    fks: list[sql.Composed] = []
    names = set(catalog.tables)
    for table in catalog.tables.values():
        exact = types(table.name)
        items: list[sql.Composable] = []
        for col in table.columns.values():
            typ = exact.get(col.name) or col.type_sql
            null = sql.SQL("") if col.nullable else sql.SQL(" NOT NULL")
            items.append(sql.SQL("{} {}{}").format(sql.Identifier(col.name), sql.SQL(typ), null))
        if table.primary_key:
            items.append(sql.SQL("PRIMARY KEY ({})").format(sql.SQL(", ").join(map(sql.Identifier, table.primary_key))))
        for unique in table.unique:
            items.append(sql.SQL("UNIQUE ({})").format(sql.SQL(", ").join(map(sql.Identifier, unique))))
        out.append(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(table.name), sql.SQL(", ").join(items)))
        for fk in table.foreign_keys:
            if fk.ref_table in names:
                fks.append(
                    sql.SQL("ALTER TABLE {} ADD FOREIGN KEY ({}) REFERENCES {} ({})").format(
                        sql.Identifier(table.name),
                        sql.SQL(", ").join(map(sql.Identifier, fk.columns)),
                        sql.Identifier(fk.ref_table),
                        sql.SQL(", ").join(map(sql.Identifier, fk.ref_columns)),
                    )
                )
    return out + fks


# The advisory lock (in the upstream database, taken by the data owner's login) under which a proxy creates,
# attaches to and drops shadow databases: several proxies on one upstream (docs/proxy.md, "Worker processes";
# any number of proxy processes may share a ledger) start and stop in any order.
_LOCK = "SELECT pg_advisory_lock(hashtext('sqldp.catalog'))"
# A holder builds a shadow in about a second; a lock held far longer is a process that hangs, which must not
# hold up every other proxy's start and stop for ever (the wait fails, the start goes on without a shadow).
_LOCK_TIMEOUT = "SET lock_timeout = '30s'"
_UNLOCK = "SELECT pg_advisory_unlock(hashtext('sqldp.catalog'))"
_PREFIX = "sqldp_catalog_"
# How long a stopping proxy waits for the connections of other processes to its shadow to end before it
# leaves the database in place: its own worker processes' backends may take a moment to exit.
_IN_USE_WAIT = 1.0


def _marker(upstream: str, digest: str) -> str:
    """The comment a finished shadow carries (COMMENT ON DATABASE, set in the transaction that fills it): a
    shadow without it was left half built by a proxy that died building it."""
    return f"sqldp catalog of database {upstream}: {digest}"


class Shadow:
    """A shadow database, shared by every proxy on the same upstream database with the same catalog.

    Its name holds a digest of the upstream database's name and of the DDL, so proxies with the same catalog
    share one and proxies with different catalogs (another policy's schema file) each have their own. A proxy
    creates it if it is absent and otherwise attaches to it, under an advisory lock; attached means holding a
    connection to it, which is how the others see that it is in use. A stopping proxy that created or attached
    to it as an owner (``owned``) drops it only when no other connection to it is left, so stopping one of
    several proxies leaves the others' catalog working; nobody drops one in use (no ``WITH (FORCE)``). The
    worker processes of a proxy (sqldp.proxy.workers) attach without owning."""

    def __init__(self, owner_dsn: str, name: str, *, owned: bool = True) -> None:
        self.owner_dsn = owner_dsn
        self.name = name
        self.owned = owned
        self.dsn = psycopg.conninfo.make_conninfo(owner_dsn, dbname=name)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()
        self._ddl: list[str] | None = None  # what fills it, to build it again if it was dropped meanwhile
        self._marker = ""
        self.views: Views = {}  # the information_schema views' columns (read on attaching): localize

    @classmethod
    def create(cls, owner_dsn: str, catalog: Catalog, *, owned: bool = True) -> Shadow | None:
        """The shadow of ``catalog`` next to the upstream database, created or attached to, or None when the
        owner may not create a database (catalog queries then get no rows)."""
        try:
            with psycopg.connect(owner_dsn, autocommit=True) as owner:
                upstream = owner.info.dbname
                statements = [s.as_string(owner) for s in ddl(catalog, lambda t: _type_sql(owner, t))]
        except psycopg.Error:
            return None
        digest = hashlib.sha256("\0".join([upstream, *statements]).encode("utf-8")).hexdigest()[:12]
        # at most 63 bytes (NAMEDATALEN - 1): the prefix, up to 36 of the upstream's, "_" and the digest
        head = upstream.encode("utf-8")[:36].decode("utf-8", "ignore")
        shadow = cls(owner_dsn, f"{_PREFIX}{head}_{digest}", owned=owned)
        shadow._ddl, shadow._marker = statements, _marker(upstream, digest)
        try:
            with shadow._lock:
                shadow._ensure()
        except psycopg.Error:
            shadow.close()
            return None
        return shadow

    def _ensure(self) -> None:
        """Under the advisory lock: create the shadow if it is absent (or half built), then attach (this
        process's connection to it); then drop the unused shadows of this upstream that another catalog left."""
        assert self._ddl is not None
        with psycopg.connect(self.owner_dsn, autocommit=True) as owner:
            owner.execute(_LOCK_TIMEOUT)
            owner.execute(_LOCK)
            try:
                row = owner.execute(
                    "SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = %s", (self.name,)
                ).fetchone()
                if row is not None and row[0] != self._marker:  # half built: its builder died (none attached)
                    owner.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(self.name)))
                    row = None
                if row is None:
                    owner.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(self.name)))
                    with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
                        for stmt in self._ddl:
                            conn.execute(stmt.encode("utf-8"))
                        comment = sql.SQL("COMMENT ON DATABASE {} IS {}")
                        conn.execute(comment.format(sql.Identifier(self.name), sql.Literal(self._marker)))
                self._attach()
                self._drop_unused(owner)
            finally:
                owner.execute(_UNLOCK)

    def _attach(self) -> None:
        if self._conn is None or self._conn.closed:
            conn = psycopg.connect(self.dsn, autocommit=True)
            conn.execute("SET default_transaction_read_only = on")
            conn.execute("SET statement_timeout = '10s'")  # an empty database: no data to time
            if not self.views:
                rows = conn.execute(
                    "SELECT table_name, column_name FROM information_schema.columns "
                    "WHERE table_schema = 'information_schema' ORDER BY table_name, ordinal_position"
                ).fetchall()
                views: dict[str, list[str]] = {}
                for table, column in rows:
                    views.setdefault(table, []).append(column)
                self.views = {t: tuple(c) for t, c in views.items()}
            self._conn = conn

    def localize(self, sql_text: str, database: str) -> str:
        """:func:`localize` with this shadow's name and views."""
        return localize(sql_text, database, self.views, self.name)

    def _drop_unused(self, owner: psycopg.Connection[Any]) -> None:
        """Drop this upstream's other shadows (a catalog since changed, a proxy killed before it could drop
        its own) that nobody is connected to. Under the lock, so nobody attaches meanwhile."""
        upstream = owner.info.dbname
        prefix = _marker(upstream, "")
        stale = owner.execute(
            "SELECT d.datname FROM pg_database d WHERE d.datname <> %s"
            " AND (left(shobj_description(d.oid, 'pg_database'), length(%s)) = %s OR d.datname = %s)"
            " AND NOT EXISTS (SELECT FROM pg_stat_activity a WHERE a.datid = d.oid)",
            # the name earlier versions gave the one shadow of an upstream, left by a proxy that was killed
            (self.name, prefix, prefix, (_PREFIX + upstream)[:63]),
        ).fetchall()
        for (name,) in stale:
            with contextlib.suppress(psycopg.Error):  # someone connected meanwhile, or another role's
                owner.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(name)))

    def _on_connection(self, run: Callable[[pq.abc.PGconn], T]) -> T:
        """``run`` on the shadow connection; once more on a new one if the connection broke meanwhile (the
        server restarted, the database was dropped): a catalog query is read only, so it may be repeated."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    conn = self._connection()
                except psycopg.Error as exc:
                    text = " ".join(str(exc).split())[:200]
                    raise ShadowError("58000", f"the proxy's catalog database is not available: {text}") from None
                out = run(conn.pgconn)
                if not conn.closed or attempt == 2:
                    return out
            raise AssertionError("unreachable")

    def select(self, text: str) -> Rows:
        """Run one catalog query in the shadow, read only; values in PostgreSQL's text format."""
        res = self._on_connection(lambda pg: pg.exec_params(text.encode("utf-8"), [], result_format=0))
        if res.status != pq.ExecStatus.TUPLES_OK:
            raise ShadowError(
                (res.error_field(pq.DiagnosticField.SQLSTATE) or b"XX000").decode("ascii"),
                (res.error_field(pq.DiagnosticField.MESSAGE_PRIMARY) or b"failed").decode("utf-8", "replace"),
            )
        columns = [(res.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(res.nfields)]
        types = [res.ftype(i) for i in range(res.nfields)]
        rows = []
        for r in range(res.ntuples):
            values = (res.get_value(r, c) for c in range(res.nfields))
            rows.append(tuple(None if x is None else x.decode("utf-8", "replace") for x in values))
        return Rows(columns, types, rows)

    def describe(
        self, text: str, param_types: tuple[int, ...]
    ) -> tuple[tuple[int, ...], tuple[str, ...], tuple[int, ...]] | None:
        """Parameter types, result column names and types of a catalog query with ``$n`` parameters, as the
        shadow's PostgreSQL describes it (Parse and Describe: nothing runs)."""

        def run(pg: pq.abc.PGconn) -> pq.abc.PGresult | None:
            if pg.prepare(b"", text.encode("utf-8"), list(param_types)).status != pq.ExecStatus.COMMAND_OK:
                return None
            return pg.describe_prepared(b"")

        try:
            d = self._on_connection(run)
        except ShadowError:
            return None
        if d is None or d.status != pq.ExecStatus.COMMAND_OK:
            return None
        params = tuple(d.param_type(i) for i in range(d.nparams))
        names = tuple((d.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(d.nfields))
        return params, names, tuple(d.ftype(i) for i in range(d.nfields))

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            try:
                self._attach()
            except psycopg.OperationalError:
                if self._ddl is None:
                    raise
                # gone: dropped while this proxy held no connection to it (the server restarted, and another
                # proxy starting then took it for unused); built again as at start-up
                self._ensure()
        assert self._conn is not None
        return self._conn

    def close(self) -> None:
        with self._lock:
            ours = None
            if self._conn is not None:
                with contextlib.suppress(psycopg.Error):
                    ours = self._conn.info.backend_pid
                self._conn.close()
                self._conn = None
        if not self.owned:
            return
        try:
            with psycopg.connect(self.owner_dsn, autocommit=True) as owner:
                owner.execute(_LOCK_TIMEOUT)
                owner.execute(_LOCK)
                # in use by another proxy (or by this one's worker processes, whose backends may still be on
                # their way out): left in place, and dropped by the last one to stop
                deadline = time.monotonic() + _IN_USE_WAIT
                while True:
                    row = owner.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid IS DISTINCT FROM %s",
                        (self.name, ours),
                    ).fetchone()
                    if not row or not row[0] or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                if row and not row[0]:
                    # no FORCE: a connection that arrives meanwhile makes it fail (after PostgreSQL's 5 s wait)
                    owner.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(self.name)))
        except psycopg.Error:
            pass  # an empty database left behind: the next proxy with this catalog attaches to it


class ShadowError(Exception):
    """PostgreSQL refused a catalog query in the shadow (an empty database of definitions: its errors say
    nothing about the data)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
