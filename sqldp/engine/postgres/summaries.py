"""The SQL behind ``sqldp policy init --estimate-epsilon``: the exact summaries of private data that the DP
estimators of :mod:`sqldp.policy.estimate` take as input (a histogram over a fixed grid, the number of values per
row count, the counts of frequent values). They are data-dependent figures: they go to the estimators and
nowhere else (never printed, never written).

Each function reads one column of one table on the owner's connection, inside one read-only snapshot the caller
holds; names are quoted as identifiers and grid points are passed as parameters.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from psycopg import sql

from sqldp.db import DATA_SCHEMA


def _table(table: str) -> sql.Composable:
    return sql.Identifier(DATA_SCHEMA, table)


def grid_histogram(conn: Any, table: str, column: str, grid: Sequence[Decimal | dt.date], kind: str) -> list[int]:
    """The counts of the column's non-NULL values in the ``len(grid) + 1`` cells ``width_bucket`` numbers: below
    grid[0], in [grid[j−1], grid[j]), at or above grid[−1]."""
    cast = sql.SQL("date[]" if kind == "date" else "numeric[]")
    query = sql.SQL(
        "SELECT width_bucket({c}::{t}, %s::{a}) AS b, count(*) FROM {tab} WHERE {c} IS NOT NULL GROUP BY b"
    ).format(
        c=sql.Identifier(column),
        t=sql.SQL("date" if kind == "date" else "numeric"),
        a=cast,
        tab=_table(table),
    )
    cells = [0] * (len(grid) + 1)
    for bucket, count in conn.execute(query, (list(grid),)).fetchall():
        cells[int(bucket)] += int(count)
    return cells


def rows_per_value(conn: Any, table: str, column: str, cap: int) -> dict[int, int]:
    """k → how many values of the column (NULL counting as one value) have exactly k rows, k above ``cap``
    counted at ``cap + 1``."""
    query = sql.SQL(
        "SELECT least(n, %s) AS k, count(*) FROM (SELECT count(*) AS n FROM {tab} GROUP BY {c}) AS per GROUP BY k"
    ).format(c=sql.Identifier(column), tab=_table(table))
    return {int(k): int(n) for k, n in conn.execute(query, (cap + 1,)).fetchall()}


def frequent_values(conn: Any, table: str, column: str, floor: int) -> dict[Any, int]:
    """value → count for the column's non-NULL values with at least ``floor`` rows (at most rows/floor of them:
    all are read, since leaving some out by their number would be a choice the data makes)."""
    query = sql.SQL("SELECT {c}, count(*) FROM {tab} WHERE {c} IS NOT NULL GROUP BY {c} HAVING count(*) >= %s").format(
        c=sql.Identifier(column), tab=_table(table)
    )
    return {v: int(n) for v, n in conn.execute(query, (floor,)).fetchall()}


def text_widths(conn: Any, table: str) -> dict[str, int]:
    """column → the declared length of the table's CHAR(n)/VARCHAR(n) columns: the catalog's, not the data's."""
    query = (
        "SELECT column_name, character_maximum_length FROM information_schema.columns "
        "WHERE table_schema = %s AND table_name = %s AND character_maximum_length IS NOT NULL"
    )
    return {str(c).lower(): int(n) for c, n in conn.execute(query, (DATA_SCHEMA, table)).fetchall()}


class Reader:
    """The three summaries on one connection (sqldp.policy.estimated.Summaries)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def widths(self, table: str) -> dict[str, int]:
        return text_widths(self.conn, table)

    def histogram(self, table: str, column: str, grid: Sequence[Any], kind: str) -> list[int]:
        return grid_histogram(self.conn, table, column, grid, kind)

    def rows_per_value(self, table: str, column: str, cap: int) -> dict[int, int]:
        return rows_per_value(self.conn, table, column, cap)

    def frequent_values(self, table: str, column: str, floor: int) -> dict[Any, int]:
        return frequent_values(self.conn, table, column, floor)
