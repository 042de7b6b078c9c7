"""Execution engines (pipeline step 5 of 6, docs/layout.md): the only code that talks to a database.

An engine runs the statements of one analysed query (:class:`sqldp.rewrite.Statements`) in ONE snapshot, so
the answer and its sensitivity see the same data, and hands back plain rows (the protocol,
:class:`sqldp.engine.base.Engine`); what to run is decided before (sqldp.rewrite), what to release after
(sqldp.release). Each engine is a package — PostgreSQL :mod:`sqldp.engine.postgres`, Apache Spark
:mod:`sqldp.engine.spark` — with its engine, its :class:`Dialect` and its catalog reader, and one line in
:data:`ENGINES`.

The analyses never ask which engine runs a query: they ask its :class:`Dialect`, a value that says what the
statements are written in and what of PostgreSQL's meaning the engine keeps. This module is imported by the
analyses (sqldp.rewrite), so it imports nothing of sqldp at run time: no engine, no database driver.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # not even sqlglot at run time: ``sqldp --help`` imports this module (ENGINES)
    from sqlglot import exp

    from sqldp.catalog import Catalog, Table
    from sqldp.policy import Policy

    # a rewrite rule (sqldp.rewrite.Rule) the dialect applies after sqldp.rewrite's own, to every statement;
    # its second argument is the rewrite's sqldp.rewrite.Scope (typed loosely: this module imports no analysis)
    DialectRule = Callable[[exp.Select, Any], exp.Select]


@dataclass(frozen=True)
class Dialect:
    """What the analyses may ask of an engine's SQL. Every analysis bounds what PostgreSQL computes
    (sqldp.pg_arithmetic, sqldp.sensitivity.operators) and writes its statements as sqlglot trees with
    PostgreSQL's meaning; an engine's dialect says how those trees become its SQL and which of the constructs
    whose meaning only PostgreSQL has been checked for it keeps. The defaults are PostgreSQL's own: a dialect
    that changes nothing writes PostgreSQL. Each flag names the analysis that reads it."""

    name: str  # sqlglot's name of the SQL the statements are written in (sqldp.rewrite.Statements.dialect)
    # the statements are a translation of PostgreSQL's meaning (rules, public_statement), not PostgreSQL's
    # own text: a statement over public tables inside a private one (sqldp.strategies.selection's candidates) is then
    # checked as the public path checks one, so that it passes the translation's refusals first
    translated: bool = False
    # NUMERIC sums exactly at any precision (PostgreSQL's NUMERIC): sqldp.rewrite.centred may replace a centred
    # sum by SUM(x) − m·COUNT(x); Spark's DECIMAL has a bounded precision
    unbounded_numeric: bool = True
    # NUMERIC division rounds as PostgreSQL's does, which the rounding argument of GROUP BY under a privacy
    # unit relies on (sqldp.sensitivity.units.grouped_answer, docs/units.md)
    numeric_division_rounding: bool = True
    # DP partition selection of the counts of a histogram of per-key counts (sqldp.strategies.nested, δ > 0) has been
    # compared with PostgreSQL on this engine; without it only the declared domain 0 … τ runs
    histogram_partition_selection: bool = True
    # the proxy's budget ledger (sqldp.proxy.ledger) can live beside the data: ``sqldp run --budget``
    has_ledger: bool = True

    @property
    def rules(self) -> tuple[DialectRule, ...]:
        """Rewrite rules that turn a statement's tree into this dialect's meaning, after sqldp.rewrite's."""
        return ()

    def total_order(self, table: Table, partition: str, catalog: Catalog) -> list[exp.Expr] | None:
        """The ORDER BY items of a truncation's total order in this dialect (sqldp.rewrite.total_order says
        what they must keep), or None for PostgreSQL's own (written there)."""
        return None

    def public_statement(self, sql: str, catalog: Catalog, policy: Policy) -> str:
        """A statement over public tables only (the public path), as the engine runs it: checked and
        translated, or sqldp.errors.RefusedError before anything runs."""
        return sql

    def engine_statement(self, sql: str, catalog: Catalog, derived: Mapping[tuple[str, str], str]) -> str:
        """A whole statement written in PostgreSQL (sqldp.strategies.selection's), as the engine runs it; ``derived``
        gives the kinds of the columns of its own derived tables."""
        return sql


# the engines ``--engine`` names, each the package that implements it, with its ``DIALECT`` (a Dialect) and a
# ``cli`` module: ``open_session(args, limits)`` (a session from the command line's arguments) and, where
# ``sqldp load`` does not write the data set into PostgreSQL, ``load(args)`` (Spark: Parquet files and their
# DDL). Imported on use only (importlib): the PostgreSQL engine imports psycopg, the Spark engine pyspark; and
# the ``cli`` modules name the session, which the packages (imported by the analyses for their dialect) may not.
ENGINES: Mapping[str, str] = {"postgres": "sqldp.engine.postgres", "spark": "sqldp.engine.spark"}
DEFAULT_ENGINE = "postgres"


def registered(name: str) -> ModuleType:
    """The package of the engine called ``name`` in :data:`ENGINES` (a KeyError for another name; the
    command line offers only these)."""
    return importlib.import_module(ENGINES[name])


def command_line(name: str) -> ModuleType:
    """The ``cli`` module of the engine called ``name`` in :data:`ENGINES`."""
    return importlib.import_module(ENGINES[name] + ".cli")
