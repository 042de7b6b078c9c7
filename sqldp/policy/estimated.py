"""DP-estimated declarations for ``sqldp policy init --estimate-epsilon E --estimate-delta D``: which figures to
estimate, the budget each gets, the releases (:mod:`sqldp.policy.estimate`), and the ``[estimates]`` section
that records them in the policy.

Which figures are estimated is decided from the catalog alone, before any data is read: for every private table

* a ``range`` for each number column outside the table's keys whose range no CHECK constraint states (its type's
  range, if any, only narrows the grid of candidates), and for each DATE column without one;
* a ``domain`` for each CHAR(n)/VARCHAR(n) column outside the keys with n ≤ :data:`DOMAIN_WIDTH` and no domain
  (only with D > 0: partition selection is (ε, δ)-DP);
* ``max_rows_per`` for one column per table (one is all a table may declare), when the catalog proves no bound:
  the first column of a composite primary key, else the first single-column foreign key to another private
  table (the joins whose contribution a bound limits).

ε is split evenly over the figures (a range's two ends are two figures), δ evenly over the domains; by basic
composition the estimates together are (E, D)-DP. The section lists every figure with its share and mechanism,
so the budget spent is auditable.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Literal, Protocol

from sqldp.catalog import Catalog, Column, Table
from sqldp.errors import PolicyError
from sqldp.mechanisms.source import NoiseSource
from sqldp.policy import estimate
from sqldp.policy.init import Estimates, Facts, column_facts, numeric_precision, rows_per_key, toml_value
from sqldp.policy.keys import check_keys
from sqldp.policy.tables import MAX_DOMAIN

DOMAIN_WIDTH = 25  # text columns up to this declared width get a domain estimate (names, codes; not comments)
DEFAULT_SCALE = 4  # the grid's least step for a number column whose type states no scale (REAL, NUMERIC)
Figure = Literal["low", "high", "domain", "max_rows_per"]
SECTION_KEYS = ("epsilon", "delta", "date", "source", "figures")
FIGURE_KEYS = ("what", "epsilon", "delta", "mechanism")


class Summaries(Protocol):
    """The exact summaries the estimators read (sqldp.engine.postgres.summaries, on the owner's connection)."""

    def widths(self, table: str) -> dict[str, int]: ...

    def histogram(self, table: str, column: str, grid: Sequence[Any], kind: str) -> list[int]: ...

    def rows_per_value(self, table: str, column: str, cap: int) -> dict[int, int]: ...

    def frequent_values(self, table: str, column: str, floor: int) -> dict[Any, int]: ...


@dataclass(frozen=True)
class Task:
    table: str
    column: str
    figure: Figure


def _key_columns(table: Table) -> set[str]:
    out = set(table.primary_key)
    for fk in table.foreign_keys:
        out.update(fk.columns)
    return out


def _width(column: Column, widths: Mapping[str, int]) -> int | None:
    if column.name.lower() in widths:
        return widths[column.name.lower()]
    m = re.fullmatch(
        r"\s*(?:CHAR|CHARACTER|BPCHAR|VARCHAR|CHARACTER VARYING)\s*\(\s*(\d+)\s*\)\s*", column.type_sql, re.I
    )
    return int(m.group(1)) if m else None


def plan(
    catalog: Catalog, private: Iterable[str], with_domains: bool, widths: Mapping[str, Mapping[str, int]]
) -> list[Task]:
    """The figures to estimate, from the catalog alone (see the module's docstring; ``widths``: table → column →
    declared CHAR/VARCHAR length, where the catalog's type text leaves it out)."""
    tasks: list[Task] = []
    enforced = catalog.enforced
    chosen = set(private)
    for name in sorted(chosen):
        table = catalog.tables[name]
        keys = _key_columns(table)
        facts = {c: column_facts(col, enforced) for c, col in table.columns.items()}
        for c, col in table.columns.items():
            if c in keys:
                continue
            f = facts[c]
            checked = "CHECK" in f.range_why or f.values is not None
            number = col.kind in ("integer", "numeric") and not checked
            if number or (col.kind == "date" and f.low is None and f.high is None):
                tasks += [Task(name, c, "low"), Task(name, c, "high")]
            elif with_domains and col.kind == "text" and f.values is None:
                width = _width(col, widths.get(name, {}))
                if width is not None and width <= DOMAIN_WIDTH:
                    tasks.append(Task(name, c, "domain"))
        if rows_per_key(table, facts) is None:
            candidates = [fk.columns[0] for fk in table.foreign_keys if len(fk.columns) == 1 and fk.ref_table in chosen]
            if len(table.primary_key) > 1:
                candidates.insert(0, table.primary_key[0])
            if candidates:
                tasks.append(Task(name, candidates[0], "max_rows_per"))
    return tasks


def _grid(column: Column, facts: Facts) -> tuple[list[Any], int]:
    if column.kind == "date":
        grid_d = estimate.date_grid()
        return grid_d, estimate.date_anchor(grid_d)
    pq = numeric_precision(column.type_sql)
    scale = 0 if column.kind == "integer" else (pq[1] if pq else DEFAULT_SCALE)
    low = facts.low if isinstance(facts.low, (int, Decimal)) else None
    high = facts.high if isinstance(facts.high, (int, Decimal)) else None
    grid_n = estimate.numeric_grid(low, high, scale, column.kind == "integer")
    return grid_n, estimate.numeric_anchor(grid_n)


def _as_value(v: Any, column: Column) -> Any:
    if column.kind == "integer" and isinstance(v, Decimal):
        return int(v)
    return v


def _text(v: Any, column: Column) -> Any:
    return v.rstrip() if isinstance(v, str) and column.type_sql.upper().startswith(("CHAR", "BPCHAR")) else v


def run(
    catalog: Catalog,
    private: Iterable[str],
    epsilon: float,
    delta: float,
    summaries: Summaries,
    source: NoiseSource,
    *,
    origin: str = "",
    today: dt.date | None = None,
) -> Estimates:
    """Estimate every planned figure with its share of (ε, δ) and return the declarations and the section."""
    if not epsilon > 0:
        raise PolicyError("must be > 0", where="--estimate-epsilon")
    if not 0 <= delta < 1:
        raise PolicyError("must be in [0, 1)", where="--estimate-delta")
    private = list(private)
    tasks = plan(catalog, private, delta > 0, {t: summaries.widths(t) for t in private})
    out = Estimates()
    if not tasks:
        return out
    eps_share = epsilon / len(tasks)
    n_domains = sum(t.figure == "domain" for t in tasks)
    delta_share = delta / n_domains if n_domains else 0.0
    enforced = catalog.enforced
    released: dict[tuple[str, str, str], Any] = {}
    records: list[tuple[str, float, float, str]] = []
    for t in tasks:
        col = catalog.tables[t.table].columns[t.column]
        base = column_facts(col, enforced)
        where = f"{t.table}.{t.column}"
        if t.figure in ("low", "high"):
            grid, anchor = _grid(col, base)
            cells = summaries.histogram(t.table, t.column, grid, "date" if col.kind == "date" else "numeric")
            q = estimate.LOW_QUANTILE if t.figure == "low" else estimate.HIGH_QUANTILE
            j = estimate.quantile_index(cells, q, eps_share, anchor, source)
            released[(t.table, t.column, t.figure)] = grid[j]
            records.append(
                (f"{where} range {t.figure} (quantile {q:g})", eps_share, 0.0, "exponential over a fixed grid")
            )
        elif t.figure == "domain":
            floor = estimate.selection_floor(eps_share, delta_share)
            counts = summaries.frequent_values(t.table, t.column, floor)
            chosen = estimate.select_values(counts, eps_share, delta_share, floor, source)
            released[(t.table, t.column, "domain")] = chosen
            records.append((f"{where} domain", eps_share, delta_share, "Laplace partition selection"))
        else:
            per = summaries.rows_per_value(t.table, t.column, estimate.MAX_TAU)
            taus = estimate.tau_grid()
            j = estimate.rows_quantile_index(per, estimate.ROWS_QUANTILE, eps_share, source)
            released[(t.table, t.column, "max_rows_per")] = taus[j]
            records.append(
                (
                    f"{where} max_rows_per (quantile {estimate.ROWS_QUANTILE:g} of rows per value)",
                    eps_share,
                    0.0,
                    "exponential over τ = 1 … 65",
                )
            )
    note = f"DP estimate, ε {eps_share:.3g}"
    for (table, column, figure), value in released.items():
        col = catalog.tables[table].columns[column]
        base = out.facts.get((table, column)) or column_facts(col, enforced)
        if figure in ("low", "high"):
            lo, hi = released[(table, column, "low")], released[(table, column, "high")]
            if lo > hi:  # two independent releases may cross: the range holds both (post-processing)
                lo, hi = hi, lo
            why = f"{note} per end ([estimates])"
            out.facts[(table, column)] = Facts(
                _as_value(lo, col), _as_value(hi, col), why, base.values, base.values_why
            )
        elif figure == "domain":
            names = sorted({str(_text(v, col)) for v in value})
            if 0 < len(names) <= MAX_DOMAIN:
                why = f"{note}, δ {delta_share:.3g}: the values found often enough ([estimates])"
                out.facts[(table, column)] = Facts(base.low, base.high, base.range_why, tuple(names), why)
        elif value <= estimate.MAX_TAU:
            out.rows_per[table] = (column, int(value), f"{note} ([estimates]); rows past τ are left out")
    out.section = _section(records, epsilon, delta, origin, today or dt.date.today())
    return out


def _section(
    records: list[tuple[str, float, float, str]], epsilon: float, delta: float, origin: str, day: dt.date
) -> list[str]:
    lines = [
        "",
        "# -- estimates ---------------------------------------------------------------------------------------",
        "# What `sqldp policy init --estimate-epsilon` read from the data, each a DP release with its share of the",
        "# budget (the shares add up to epsilon and delta: basic composition). The declarations above that cite",
        "# [estimates] are these releases; queries enforce them (clamp, domain, truncation), so using them is",
        '# post-processing (docs/policy.md, "Estimated declarations"). Spent once, when this file was written.',
        "[estimates]",
        f"epsilon = {epsilon!r}",
        f"delta = {delta!r}",
        f'date = "{day.isoformat()}"',
        f"source = {toml_value(origin)}",
    ]
    for what, eps, dlt, mechanism in records:
        lines += [
            "[[estimates.figures]]",
            f"what = {toml_value(what)}",
            f"epsilon = {eps!r}",
            f"delta = {dlt!r}",
            f"mechanism = {toml_value(mechanism)}",
        ]
    return lines


def parse_section(raw: Any, where: str) -> dict[str, Any]:
    """Check an ``[estimates]`` section: known keys, ε > 0, δ in [0, 1), and figures whose shares add up to no
    more than the stated totals."""
    if not isinstance(raw, Mapping):
        raise PolicyError("must be a table", where=where)
    check_keys(raw, SECTION_KEYS, (), where)
    total = {}
    for k in ("epsilon", "delta"):
        v = raw.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or (k == "epsilon" and v == 0):
            raise PolicyError("must be a positive number" if k == "epsilon" else "must be ≥ 0", where=f"{where}.{k}")
        total[k] = float(v)
    figures = raw.get("figures", [])
    if not isinstance(figures, list):
        raise PolicyError("must be an array of tables", where=f"{where}.figures")
    spent = {"epsilon": 0.0, "delta": 0.0}
    for i, f in enumerate(figures):
        w = f"{where}.figures[{i}]"
        if not isinstance(f, Mapping):
            raise PolicyError("must be a table", where=w)
        check_keys(f, FIGURE_KEYS, ("what", "epsilon"), w)
        for k in ("epsilon", "delta"):
            v = f.get(k, 0.0)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise PolicyError("must be a number ≥ 0", where=f"{w}.{k}")
            spent[k] += float(v)
    for k in ("epsilon", "delta"):
        if spent[k] > total[k] * (1 + 1e-9) + 1e-15:
            raise PolicyError(
                f"the figures spend {spent[k]:g}, more than the {total[k]:g} stated", where=f"{where}.{k}"
            )
    return dict(raw)
