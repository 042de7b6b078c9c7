"""The command line on Spark (``--engine spark``, sqldp.engine.ENGINES): the session a command runs on and
``sqldp load tpch --engine spark``. Apart from the package: this module names the session."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from sqldp.engine.spark.engine import spark_session
from sqldp.errors import InputError

if TYPE_CHECKING:
    from sqldp.session import Session


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
