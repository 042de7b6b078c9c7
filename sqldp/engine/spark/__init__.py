"""The Apache Spark engine: :mod:`sqldp.engine.spark.engine` (one snapshot per query on a SparkSession),
:mod:`sqldp.engine.spark.sql` (Spark SQL with PostgreSQL's meaning), :mod:`sqldp.engine.spark.dialect`
(:data:`DIALECT`) and :mod:`sqldp.engine.spark.catalog` (the catalog a SparkSession knows); :func:`open`
builds the engine and its catalog. pyspark is imported only where a SparkSession is started
(sqldp.engine.spark.engine.spark_session): a caller passes its own.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp.engine.spark.catalog import read_catalog
from sqldp.engine.spark.dialect import SPARK
from sqldp.engine.spark.engine import SparkEngine, spark_session
from sqldp.errors import InputError

if TYPE_CHECKING:
    from sqldp.catalog import Catalog
    from sqldp.policy import Policy
    from sqldp.session import Session

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


def open_session(args: argparse.Namespace, limits: Mapping[str, float]) -> Session:
    """The session a command runs on: the Parquet tables of ``--spark-data`` (``sqldp load tpch --engine
    spark``), their keys from ``--schema`` or the DDL beside them, Spark started by ``--spark-master``."""
    import sqldp
    from sqldp import datasets

    if args.dsn:
        raise InputError("--dsn is PostgreSQL's; with --engine spark the data comes from --spark-data", where="--dsn")
    directory = Path(args.spark_data) if args.spark_data else datasets.default_spark_data()
    tables = datasets.parquet_tables(directory)  # checked before Spark starts (seconds)
    keys = args.schema or (directory / datasets.SPARK_SCHEMA if (directory / datasets.SPARK_SCHEMA).is_file() else None)
    spark = spark_session(args.spark_master)
    views = datasets.register_parquet(spark, directory)
    assert set(views) == set(tables)
    return sqldp.connect(policy=args.policy, schema=keys, seed=args.seed, spark=spark, spark_tables=views)


def load(args: argparse.Namespace) -> int:
    """``sqldp load tpch --engine spark``: TPC-H as Parquet plus its DDL (the keys) in one directory, read back
    by Spark to check the files."""
    from sqldp import datasets

    if args.dataset != "tpch":
        raise InputError("--engine spark loads tpch only", where="--engine")
    if args.dsn:
        raise InputError("--dsn is PostgreSQL's; --engine spark writes Parquet to --spark-data", where="--dsn")
    directory = Path(args.spark_data) if args.spark_data else datasets.default_spark_data()
    counts = datasets.load_tpch_spark(spark_session(args.spark_master), args.scale, directory)
    print(f"TPC-H SF {args.scale:g} as Parquet in {directory}: " + ", ".join(f"{t} {n}" for t, n in counts.items()))
    return 0
