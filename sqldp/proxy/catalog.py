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

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import sqlglot
from psycopg import pq, sql
from sqlglot import exp
from sqlglot.errors import ParseError

from sqldp import allowlist
from sqldp.catalog import Catalog
from sqldp.proxy import statements

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


def localize(sql_text: str, database: str) -> str:
    """The query as the shadow runs it: ``current_database()`` (JDBC's TABLE_CAT) is the database the client
    connected to, not the shadow's name."""
    return statements.replace_code(sql_text, _CURRENT_DATABASE, "'" + database.replace("'", "''") + "'::name")


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


class Shadow:
    """The shadow database: created from the catalog at start-up, dropped by :meth:`close` of the process that
    created it (``owned``); the worker processes of a proxy (sqldp.proxy.workers) attach to their parent's."""

    def __init__(self, owner_dsn: str, name: str, *, owned: bool = True) -> None:
        self.owner_dsn = owner_dsn
        self.name = name
        self.owned = owned
        self.dsn = psycopg.conninfo.make_conninfo(owner_dsn, dbname=name)
        self._conn: psycopg.Connection[Any] | None = None
        self._lock = threading.Lock()

    @classmethod
    def create(cls, owner_dsn: str, catalog: Catalog) -> Shadow | None:
        """The shadow of ``catalog`` next to the upstream database, or None when the owner may not create a
        database (catalog queries then get no rows)."""
        with psycopg.connect(owner_dsn, autocommit=True) as owner:
            upstream = owner.info.dbname
            shadow = cls(owner_dsn, f"sqldp_catalog_{upstream}"[:63])
            try:
                owner.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(shadow.name)))
                owner.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(shadow.name)))
            except psycopg.Error:
                return None
            statements = ddl(catalog, lambda t: _type_sql(owner, t))
        try:
            with psycopg.connect(shadow.dsn, autocommit=True) as conn, conn.transaction():
                for stmt in statements:
                    conn.execute(stmt)
        except psycopg.Error:
            shadow.close()
            return None
        return shadow

    def select(self, text: str) -> Rows:
        """Run one catalog query in the shadow, read only; values in PostgreSQL's text format."""
        with self._lock:
            res = self._connection().pgconn.exec_params(text.encode("utf-8"), [], result_format=0)
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
        with self._lock:
            conn = self._connection()
            if conn.pgconn.prepare(b"", text.encode("utf-8"), list(param_types)).status != pq.ExecStatus.COMMAND_OK:
                return None
            d = conn.pgconn.describe_prepared(b"")
            if d.status != pq.ExecStatus.COMMAND_OK:
                return None
            params = tuple(d.param_type(i) for i in range(d.nparams))
            names = tuple((d.fname(i) or b"?column?").decode("utf-8", "replace") for i in range(d.nfields))
            return params, names, tuple(d.ftype(i) for i in range(d.nfields))

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.dsn, autocommit=True)
            self._conn.execute("SET default_transaction_read_only = on")
            self._conn.execute("SET statement_timeout = '10s'")  # an empty database: no data to time
        return self._conn

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
        if not self.owned:
            return
        try:
            with psycopg.connect(self.owner_dsn, autocommit=True) as owner:
                owner.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(self.name)))
        except psycopg.Error:
            pass  # an empty database left behind; the next start drops it


class ShadowError(Exception):
    """PostgreSQL refused a catalog query in the shadow (an empty database of definitions: its errors say
    nothing about the data)."""

    def __init__(self, sqlstate: str, message: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate
