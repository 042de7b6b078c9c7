"""The Apache Spark engine: :mod:`sqldp.engine.spark.engine` (one snapshot per query on a SparkSession),
:mod:`sqldp.engine.spark.sql` (Spark SQL with PostgreSQL's meaning), :mod:`sqldp.engine.spark.dialect`
(:data:`DIALECT`), :mod:`sqldp.engine.spark.catalog` (the catalog a SparkSession knows) and
:mod:`sqldp.engine.spark.cli` (the command line's session and ``sqldp load``); :func:`open` builds the engine
and its catalog. pyspark is imported only where a SparkSession is started
(sqldp.engine.spark.engine.spark_session): a caller passes its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.engine.spark.catalog import read_catalog
from sqldp.engine.spark.dialect import SPARK
from sqldp.engine.spark.engine import SparkEngine

if TYPE_CHECKING:
    from sqldp.catalog import Catalog
    from sqldp.policy import Policy

DIALECT = SPARK


@dataclass(frozen=True)
class Opened:
    """An engine and the catalog :func:`open` read for it."""

    engine: SparkEngine
    catalog: Catalog


def open(
    spark: Any,
    tables: Mapping[str, str] | None = None,
    schema: Catalog | str | Path | None = None,
    *,
    policy: Policy | None = None,
) -> Opened:
    """The engine on ``spark`` (a SparkSession, local or Spark Connect): the catalog from the session's tables
    (``tables`` maps catalog names to Spark's, default every table Spark lists), the keys from ``schema`` (a
    Catalog or a DDL file; Spark enforces none, sqldp.engine.spark.catalog.read_catalog). ``policy``: checked
    against the catalog before the engine is built."""
    from sqldp.context import load_catalog

    keys = load_catalog(schema, None) if schema is not None else None
    catalog = read_catalog(spark, keys, tables)
    if policy is not None:
        policy.validate(catalog)
    return Opened(SparkEngine(spark, tables), catalog)
