"""Spark's dialect: Spark SQL with PostgreSQL's meaning (sqldp.engine.spark.sql), and what Spark does not keep.

Spark's DECIMAL has a bounded precision (no exact centred sums, sqldp.rewrite.centred); GROUP BY under a
privacy unit, whose rounding argument is PostgreSQL's NUMERIC division, and DP partition selection of a
histogram's counts have not been compared with PostgreSQL there; the budget ledger lives in PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from sqldp.engine import Dialect
from sqldp.engine.spark.sql import engine_statement, public_statement, to_spark
from sqldp.errors import RefusedError
from sqldp.rewrite import scaled

if TYPE_CHECKING:
    from sqldp.catalog import Catalog, Table
    from sqldp.engine import DialectRule
    from sqldp.policy import Policy
    from sqldp.rewrite import Scope


def spark(query: exp.Select, scope: Scope) -> exp.Select:
    """The rewriter's last rule on Spark: the Spark SQL that computes PostgreSQL's value (sqldp.engine.spark.sql)."""
    return to_spark(query, scope.kind)  # type: ignore[return-value]


@dataclass(frozen=True)
class SparkDialect(Dialect):
    name: str = "spark"
    translated: bool = True
    unbounded_numeric: bool = False
    numeric_division_rounding: bool = False
    histogram_partition_selection: bool = False
    has_ledger: bool = False

    @property
    def rules(self) -> tuple[DialectRule, ...]:
        return (spark,)

    def total_order(self, table: Table, partition: str, catalog: Catalog) -> list[exp.Expr] | None:
        return _order(table, partition)

    def public_statement(self, sql: str, catalog: Catalog, policy: Policy) -> str:
        return public_statement(sql, catalog, policy)

    def engine_statement(self, sql: str, catalog: Catalog, derived: Mapping[tuple[str, str], str]) -> str:
        return engine_statement(sql, catalog, derived)


def _order(table: Table, partition: str) -> list[exp.Expr]:
    """sqldp.rewrite.total_order on Spark (its docstring says why each item means what PostgreSQL's does)."""
    out: list[exp.Expr] = []
    for c in table.columns.values():
        if not (c.kind in ("integer", "date", "boolean", "text") or (c.kind == "numeric" and scaled(c.type_sql))):
            raise RefusedError(
                f"{table.name}.{c.name} ({c.type_sql}): a truncation to a declared contribution bound "
                f"(max_rows_per) orders the rows of {table.name} by every column, and PostgreSQL orders a column "
                "of this type by its text, which Spark writes differently, so Spark could keep other rows "
                "(docs/truncation.md)"
            )
        if c.name == partition:
            continue
        col = exp.column(c.name, quoted=True)
        if c.kind == "text" and c.type_sql.upper().split("(")[0].strip() in ("CHAR", "CHARACTER", "BPCHAR", "NCHAR"):
            out.append(exp.func("RTRIM", col))
        else:
            out.append(col)
    return out


SPARK = SparkDialect()
