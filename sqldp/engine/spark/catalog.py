"""The catalog of a SparkSession: its tables and column types as Spark knows them, the keys from a DDL file.

Spark's types are written as PostgreSQL's (``decimal(15,2)`` → ``NUMERIC(15,2)``), since every analysis reads
PostgreSQL's types (sqldp.catalog.kind_of, sqlglot's qualify).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqldp.catalog import Catalog, Column, Table, kind_of
from sqldp.errors import InputError


def read_catalog(spark: Any, keys: Catalog | None = None, tables: Mapping[str, str] | None = None) -> Catalog:
    """Tables and column types as a SparkSession knows them (Parquet, Delta, Hive tables and temporary
    views of the current database); ``tables`` maps names to Spark's names when given (else every table
    Spark lists). Spark enforces no key, so primary, unique and foreign keys and NOT NULL come from
    ``keys`` (a DDL catalog), and like any claim nothing checks them against the data (not ``enforced``)."""
    if tables is not None:
        names = dict(tables)
    else:  # not the per-query snapshot views of a running Spark engine (sqldp.engine.spark)
        names = {t.name.lower(): t.name for t in spark.catalog.listTables() if not t.name.startswith("__sqldp_")}
    if not names:
        raise InputError("the Spark session has no tables (register them, e.g. sqldp load tpch --engine spark)")
    out: dict[str, Table] = {}
    for name, source in sorted(names.items()):
        declared = keys.tables.get(name) if keys is not None else None
        columns: dict[str, Column] = {}
        for f in spark.table(source).schema.fields:
            col = f.name.lower()
            # a CHAR(n) or VARCHAR(n) column is a string whose declared type Spark keeps in the field's metadata
            # (it pads CHAR when reading, as PostgreSQL's CHAR compares): its kind is text either way, and
            # the truncation's order needs to know the padding (sqldp.rewrite.total_order)
            declared_type = (f.metadata or {}).get("__CHAR_VARCHAR_TYPE_STRING")
            type_sql = _spark_type(declared_type if isinstance(declared_type, str) else f.dataType.simpleString())
            nullable = declared.columns[col].nullable if declared is not None and col in declared.columns else True
            columns[col] = Column(col, type_sql, kind_of(type_sql), nullable)
        if declared is None:
            out[name] = Table(name, columns)
        else:
            out[name] = Table(name, columns, declared.primary_key, declared.foreign_keys, declared.unique)
    return Catalog(out, "Spark session" + (f" (keys from {keys.source})" if keys is not None else ""))


# Spark's type names (DataType.simpleString) → PostgreSQL's, for kind_of and sqlglot's qualify
_SPARK_TYPES = {
    "tinyint": "SMALLINT",
    "smallint": "SMALLINT",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "REAL",
    "double": "DOUBLE PRECISION",
    "string": "TEXT",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "timestamp": "TIMESTAMP WITH TIME ZONE",
    "timestamp_ntz": "TIMESTAMP",
    "binary": "BYTEA",
}


def _spark_type(name: str) -> str:
    """``decimal(15,2)`` → ``NUMERIC(15,2)`` (its scale is the grid of a private filter, sqldp.sensitivity.filters),
    ``varchar(25)`` → ``VARCHAR(25)``; a type PostgreSQL has no equivalent for keeps Spark's name (kind other)."""
    if name.startswith("decimal("):
        return "NUMERIC" + name[len("decimal") :]
    if name.startswith(("varchar(", "char(")):
        return name.upper()
    return _SPARK_TYPES.get(name, name.upper())
