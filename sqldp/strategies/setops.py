"""Top-level UNION [ALL], INTERSECT [ALL] and EXCEPT [ALL] of queries that read private tables (docs/sql.md).

Each branch (a SELECT of the set operation) is analysed and released as a query of its own; the set operation,
then ORDER BY, LIMIT and OFFSET, run on the released rows (NR §3.3.13.3 gives the set semantics; here they are
applied after the noise). Privacy:

* sequential composition (Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Thm 3.16):
  the branches' measurements share ε (and δ) equally, as the aggregates of one query do (NR §3.3.10.4) —
  a branch with k aggregates gets k/n of ε for n aggregates in all. Disjoint branches (which would allow
  parallel composition) are not recognised: sqldp would have to prove that no row reaches two branches,
  and sequential composition is sound whatever the branches read;
* a branch over public tables only is exact and costs nothing;
* the set operation and the ordering are functions of the released rows only: post-processing (Dwork &
  Roth, Prop. 2.1), free. Row equality is Python's on the released values (NULL equals NULL, as in
  PostgreSQL's set operations); on noisy values it is a deterministic function of them, which is all
  post-processing needs.

Everything is decided before any data is read: the branches' shapes, the column counts and the shares, so a
refusal does not depend on the data.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp import allowlist
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.frontend import ParsedQuery, parse
from sqldp.frontend import _output_name as output_name
from sqldp.normalize import relations_read
from sqldp.params import PrivacyParams, resolve_params
from sqldp.release import _sort_key
from sqldp.result import Result
from sqldp.runner import Prepared
from sqldp.strategies.aggregate import analysed
from sqldp.strategies.base import Context, Privacy

Row = tuple[Any, ...]
OPS: dict[type[exp.SetOperation], str] = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}


@dataclass(frozen=True)
class Branch:
    """One SELECT of the set operation: its text (regenerated from the parsed tree) and its position."""

    sql: str
    index: int


@dataclass(frozen=True)
class Combine:
    op: str  # UNION, INTERSECT, EXCEPT
    distinct: bool
    left: Combine | Branch
    right: Combine | Branch


def set_operation(statement: exp.Expr) -> exp.SetOperation | None:
    """The statement's top-level set operation, or None."""
    return statement if isinstance(statement, exp.SetOperation) else None


def split(statement: exp.SetOperation) -> tuple[Combine, list[Branch]]:
    """The tree of set operations and its branches, left to right. Refused: WITH around the set operation
    (the branches would each need the CTEs)."""
    if statement.args.get("with_") or statement.args.get("with"):
        raise RefusedError("WITH around a set operation is not supported; write the CTEs inside each branch")
    branches: list[Branch] = []

    def walk(node: exp.Expr) -> Combine | Branch:
        while isinstance(node, exp.Subquery) and not node.args.get("alias"):
            if any(node.args.get(k) for k in ("order", "limit", "offset")):
                break
            node = node.this
        if isinstance(node, exp.SetOperation) and not any(node.args.get(k) for k in ("order", "limit", "offset")):
            op = OPS.get(type(node))
            if op is None:
                raise RefusedError(f"unsupported set operation {node.key.upper()}")
            return Combine(op, bool(node.args.get("distinct")), walk(node.this), walk(node.expression))
        branch = Branch(node.sql(dialect="postgres"), len(branches))
        branches.append(branch)
        return branch

    op = OPS.get(type(statement))
    if op is None:
        raise RefusedError(f"unsupported set operation {statement.key.upper()}")
    root = Combine(op, bool(statement.args.get("distinct")), walk(statement.this), walk(statement.expression))
    return root, branches


def combine(node: Combine | Branch, rows: list[list[Row]]) -> list[Row]:
    """The set operation over the branches' rows, as PostgreSQL defines it: UNION ALL concatenates, UNION
    also removes duplicates; INTERSECT ALL keeps a row min(m, n) times, EXCEPT ALL max(m − n, 0) times (m and
    n its counts on the left and the right), and their distinct forms keep each such row once. NULLs are
    equal to each other here, as in PostgreSQL's set operations. Rows keep the order of their first
    occurrence (PostgreSQL promises none without ORDER BY)."""
    if isinstance(node, Branch):
        return list(rows[node.index])
    left, right = combine(node.left, rows), combine(node.right, rows)
    if node.op == "UNION":
        out = left + right
    elif node.distinct:  # INTERSECT and EXCEPT keep each row of the left once, if it is (is not) on the right
        present = set(right)
        out = [row for row in left if (row in present) == (node.op == "INTERSECT")]
    else:
        out, budget = [], Counter(right)
        for row in left:  # each occurrence on the right pairs with one on the left
            paired = budget[row] > 0
            budget[row] -= paired
            if paired == (node.op == "INTERSECT"):
                out.append(row)
    return list(dict.fromkeys(out)) if node.distinct else out


@dataclass(frozen=True)
class OrderKey:
    column: int
    descending: bool


def order_keys(statement: exp.SetOperation, columns: list[str]) -> list[OrderKey]:
    """ORDER BY of a set operation: output positions or output names, as PostgreSQL allows there; NULLs last
    ascending and first descending (PostgreSQL's default, the only order supported)."""
    order = statement.args.get("order")
    keys = []
    for o in order.expressions if order is not None else ():
        key, desc = o.this, bool(o.args.get("desc"))
        if bool(o.args.get("nulls_first")) != desc:
            raise RefusedError("NULLS FIRST/LAST other than PostgreSQL's default is not supported here")
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
            index = int(key.this) - 1
        elif isinstance(key, exp.Column) and not key.table and columns.count(key.name) == 1:
            index = columns.index(key.name)
        else:
            index = -1
        if not 0 <= index < len(columns):
            raise RefusedError(
                f"ORDER BY {key.sql(dialect='postgres')} must name an output column of the set operation"
            )
        keys.append(OrderKey(index, desc))
    return keys


def _count(statement: exp.SetOperation, arg: str) -> int | None:
    node = statement.args.get(arg)
    if node is None:
        return None
    value = node.args.get("expression") or node.this
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    raise RefusedError("LIMIT/OFFSET must be a non-negative integer constant")


def _ordered(rows: list[Row], keys: list[OrderKey], limit: int | None, offset: int | None) -> list[Row]:
    for key in reversed(keys):  # stable sorts, last key first
        rows.sort(key=lambda r, k=key: _sort_key(r[k.column]), reverse=key.descending)  # type: ignore[misc]
    start = offset or 0
    return rows[start : None if limit is None else start + limit]


@dataclass
class SetRelease:
    """A set operation of released branches (module docstring); prepared without reading anything."""

    sql: str
    params: PrivacyParams  # the statement's total ε and δ: the branches' shares added
    branches: tuple[Prepared, ...]
    root: Combine
    order: list[OrderKey]
    limit: int | None
    offset: int | None
    shares: tuple[float, ...]  # ε of each branch
    longest: float  # the policy's longest change (sqldp.policy.Policy.longest_change)
    started: float

    public = False
    statements = None  # each branch's statements are checked as the statement's are when it is prepared
    any_spelling = False
    rho = None  # the branches are charged sequentially only (their ρ is not added up)

    def checks(self) -> list[str]:
        return []

    def noisy(self) -> tuple[bool, ...] | None:
        """A column is noisy if any measured branch releases it with noise."""
        each = [p.noisy() for p in self.branches if not p.public]
        if not each or any(n is None for n in each) or len({len(n) for n in each if n is not None}) != 1:
            return None
        return tuple(any(column) for column in zip(*(n for n in each if n is not None), strict=True))

    @property
    def form(self) -> AnalysisForm | None:
        return None

    def _notes(self) -> list[str]:
        out = []
        for i, (p, eps) in enumerate(zip(self.branches, self.shares, strict=True)):
            how = "evaluated exactly (public tables only)" if p.public else f"released with ε = {eps:g}"
            out.append(f"branch {i + 1} of the set operation: {how}")
        out.append("set operation, ORDER BY and LIMIT applied to the released rows (post-processing)")
        return out

    def describe(self) -> Result:
        result = Result(self.sql, self.params, notes=self._notes())
        result.steps = [p.describe() for p in self.branches]
        result.plan = [step for r in result.steps for step in r.plan]
        return result

    def analyze(self) -> Result:
        """Audit mode: each branch's own analysis; nothing is released."""
        result = Result(self.sql, self.params, notes=self._notes(), audit=True)
        result.steps = [p.run() if p.public else p.analyze() for p in self.branches]
        result.measurements = [g for r in result.steps for g in r.measurements]
        result.timings = {"total": time.perf_counter() - self.started}
        return result

    def run(self) -> Result:
        results = [p.run() for p in self.branches]
        tables = [r.table() for r in results]
        columns = tables[0][0]
        rows = _ordered(combine(self.root, [list(t[1]) for t in tables]), self.order, self.limit, self.offset)
        result = Result(self.sql, self.params, notes=self._notes(), grouped=True, released=True)
        result.columns = list(columns)
        result.test_mode = any(r.test_mode for r in results)
        # each released value keeps its branch's data-independent error bar (docs/output.md), under the set
        # operation's column names; a row found in several branches takes its first occurrence's, as `combine`
        # keeps its first occurrence (equal noisy values from two branches are improbable; exact rows have none)
        bars: dict[Row, dict[str, float]] = {}
        for r, (names, branch_rows) in zip(results, tables, strict=True):
            for values, record in zip(branch_rows, r.rows, strict=True):
                own = record.get("errors", {})
                named = {columns[i]: own[n] for i, n in enumerate(names) if n in own}
                bars.setdefault(tuple(values), named)
        result.rows = []
        for row in rows:
            out: dict[str, Any] = {"key": {}, "values": dict(zip(columns, row, strict=True))}
            if bars.get(row):
                out["errors"] = bars[row]
            result.rows.append(out)
        result.measurements = [g for r in results for g in r.measurements]
        result.steps = results
        result.timings = {"total": time.perf_counter() - self.started}
        return result


def _outputs(tree: exp.Expr) -> list[str]:
    """The output names of a qualified query (a set operation's are its first branch's, as in PostgreSQL)."""
    while isinstance(tree, (exp.SetOperation, exp.Subquery)):
        tree = tree.this
    if not isinstance(tree, exp.Select):
        raise RefusedError(f"a branch of a set operation must be a SELECT, not {tree.key.upper()}")
    return [output_name(e) for e in tree.expressions]


def recognise(parsed: ParsedQuery, context: Context, privacy: Privacy) -> SetRelease | None:
    """A top-level set operation that reads a private table; None for another statement (over public tables
    only, a set operation runs exactly as written, on the public path). The whole statement passes the
    allow-list as the public path checks it."""
    top = set_operation(parsed.statement) if parsed.statement is not None else None
    if top is None or all(context.policy.table(t).public for t in relations_read(top, context.catalog)):
        return None
    assert parsed.statement is not None
    allowlist.check(parsed.sql, parsed.statement)
    return prepare(parsed.sql, top, context, privacy)


def prepare(sql: str, statement: exp.SetOperation, context: Context, privacy: Privacy) -> SetRelease:
    """The set operation with each branch analysed at its share of ε (and δ) by the aggregate strategy
    (sqldp.strategies.aggregate.analysed), refusing before anything is read what cannot be answered; the
    statement's parameters are those of n measurements (the policy's defaults, an advantage target)."""
    t0 = time.perf_counter()
    root, branches = split(statement)
    parsed = [parse(b.sql, context.catalog) for b in branches]
    names = [_outputs(p.tree) for p in parsed]
    if len({len(n) for n in names}) > 1:
        raise RefusedError("each branch of a set operation must have the same number of columns")
    order = order_keys(statement, names[0])
    # PostgreSQL's parse analysis of the whole statement (reads no row): the branches' column types must match
    # as PostgreSQL matches them ("UNION types bigint and text cannot be matched"), refused here, on the text
    # and the schema alone, before anything is charged
    context.engine.check([statement.sql(dialect="postgres")])
    first = [analysed(p, context, privacy) for p in parsed]
    counts = [0 if p.public else len(p.form.aggregates) for p in first]  # type: ignore[union-attr]
    total = sum(counts)
    if not total:
        raise RefusedError("the set operation reads private tables, but no branch of it measures anything")
    params = resolve_params(context.policy, outputs=total, **privacy)

    def share(c: int) -> dict[str, Any]:
        out = {k: v for k, v in privacy.items() if k != "advantage"}
        out["epsilon"] = params.epsilon * c / total
        out["delta"] = params.delta * c / total if params.delta else None
        return out

    prepared = tuple(
        p if p.public else analysed(q, context, share(c)) for q, p, c in zip(parsed, first, counts, strict=True)
    )
    shares = tuple(params.epsilon * c / total for c in counts)
    limit, offset = _count(statement, "limit"), _count(statement, "offset")
    longest = context.policy.longest_change
    return SetRelease(sql, params, prepared, root, order, limit, offset, shares, longest, t0)
