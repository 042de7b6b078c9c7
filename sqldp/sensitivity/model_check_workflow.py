"""The model-checking global sensitivity (NR §3.3.13) of a query with subqueries, as a workflow of steps.

NR §4.3.6.1 rewrote the TPC-H queries by hand into workflows of join–filter–project steps; this module does it
from the qualified SQL with sqldp's own transformations (:mod:`sqldp.subqueries`), and runs the model checker
(:mod:`sqldp.sensitivity.model_check`) on every step:

* ``[NOT] EXISTS (SELECT … WHERE φ ∧ ψ)`` and ``x [NOT] IN (SELECT k … WHERE φ ∧ ψ)`` (ψ: the conjuncts that read
  the outer query; IN adds ``k = x`` to ψ): a step D = ``SELECT DISTINCT`` (the subquery's columns ψ reads)
  ``… WHERE φ``; the outer step joins D by ψ. D is a set, so all its columns form a key (NR §3.3.13.10), which
  the outer step's formula gets as D's uniqueness constraint. A subquery with GROUP BY (Q18's HAVING) gives
  the same D over its group keys (a changed row changes the groups that hold it, whatever HAVING decides).
* ``NOT EXISTS`` / ``NOT IN`` (an anti-join): the indicator is in [0, 1] whatever D holds, so w.r.t. the outer
  tables the step is the outer query with the conjunct dropped (:mod:`sqldp.subqueries`, argument 1), and a
  row of D flips the outer rows that ψ ties to it: the outer query joined with D by ψ, w.r.t. D (argument 2).
* A correlated scalar subquery ``x op (SELECT e(agg) … WHERE φ ∧ u.k = c …)``: a step D = ``SELECT u.k, e(agg)
  … WHERE φ GROUP BY u.k`` (the group columns are a key, NR §3.3.13.10), joined by ``D.k = c`` and
  ``x op D.v`` (no group: the subquery is NULL and the comparison fails, as the join has no row). A changed
  group is one row of D out and another in: D's rows change by twice its number of changed groups.
* An uncorrelated scalar subquery (Q11, Q15, Q22): a *released* step (NR §3.2.1.1): sqldp answers it with
  noise first and the outer query reads the released number, so the outer step treats it as an unknown
  constant (one z3 variable for all rows) and its own privacy is charged apart (sequential composition); its
  sensitivity is reported but does not enter the outer step's.
* A WITH query or an aggregating / DISTINCT derived table in FROM (Q15's view): a step, as above.

Composition (NR §3.3.13.9, Proposition 3.2): with c′_t the outer step's sensitivity w.r.t. table t and c_D the
one w.r.t. a step D it reads, the query's sensitivity w.r.t. t is c′_t + Σ_D c_D · r_D · S_D(t), where S_D(t) is
D's own (composed) sensitivity and r_D = 2 for a grouped D (a changed group is a row out and a row in), else 1.
An ungrouped aggregate returns one row, so its sensitivities are at most 1, before and after composing.

The measure is NR §4.3.6's: the result rows one added or removed row changes (groups for GROUP BY, Ψ over the
keys, Theorem 3.111; the select list for DISTINCT, Theorem 3.110; the rows for a join–filter query, Φ). ORDER BY
and LIMIT are ignored, as NR §4.3.6.1's rewrites drop them.

``measure="join"`` measures the main step in *join rows* instead (Φ over its product, its steps joined as
tables, no set semantics and no one-row cap): what a COUNT or SUM over the main step moves, in ℓ1 over its
groups, since every join row lies in one group. The inner steps keep their result rows (a step's rows are what
the step after it reads). The release uses this measure (:func:`sqldp.sensitivity.global_bound.workflow_plan`):
|Δ SUM(e)| ≤ max|e| · (c′_t + Σ_D c_D · r_D · S_D(t)) with c′_t and c_D in join rows of the main step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from sqlglot import exp

from sqldp.catalog import Catalog, Column, Table
from sqldp.frontend import inside
from sqldp.sensitivity import model_check as mc
from sqldp.subqueries import recognise

StepKind = Literal["main", "distinct", "grouped", "released"]
Measure = Literal["rows", "join"]


@dataclass(frozen=True)
class Step:
    """One step of the workflow: its query (``sql``), what it is, the key of its result given to the steps that
    read it, and its sensitivity w.r.t. every table and step it reads directly (``direct``)."""

    name: str
    kind: StepKind
    sql: str
    key: tuple[str, ...]
    direct: dict[str, mc.GlobalSensitivity]
    reads: tuple[str, ...]  # the steps (names) it reads
    seconds: float
    one_row: bool  # an ungrouped aggregate: one result row, so every sensitivity is at most 1
    queries: dict[str, str] = field(default_factory=dict)  # per entry of ``direct``: the SQL it analysed

    @property
    def rows_per_group(self) -> int:
        """Rows of this step's result that one changed group or distinct row moves (r_D)."""
        return 2 if self.kind == "grouped" else 1


@dataclass(frozen=True)
class WorkflowSensitivity:
    """Every step (the main query last) and the composed sensitivity w.r.t. each base table (NR Prop. 3.2)."""

    steps: tuple[Step, ...]
    total: dict[str, float]
    seconds: float
    catalog: Catalog | None = field(default=None, compare=False)  # with every step's result as a table
    # per base table whose total is ∞: the step and the table or step it reads whose term is ∞, and why
    why: dict[str, str] = field(default_factory=dict, compare=False)
    measure: Measure = field(default="rows", compare=False)

    @property
    def timed_out(self) -> bool:
        """Whether a time limit ended some step's search (its figure is then what was proven by then)."""
        return any(g.timed_out for s in self.steps for g in s.direct.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "steps": [
                {
                    "name": s.name,
                    "kind": s.kind,
                    "sql": s.sql,
                    "key": list(s.key),
                    "direct": {t: g.to_json() for t, g in s.direct.items()},
                }
                for s in self.steps
            ],
            "total": {t: v if math.isfinite(v) else "inf" for t, v in self.total.items()},
            "why": dict(self.why),
            "measure": self.measure,
            "seconds": round(self.seconds, 4),
        }


def _times(a: float, b: float) -> float:
    return 0.0 if a == 0 or b == 0 else a * b


class _Builder:
    def __init__(self, catalog: Catalog, timeout: float, cap: int, measure: Measure = "rows") -> None:
        self.catalog = catalog
        self.timeout, self.cap = timeout, cap
        self.measure = measure
        self.steps: list[Step] = []
        self.count = 0

    # -- naming ----------------------------------------------------------------------------------------

    def _fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def _add_table(self, name: str, columns: dict[str, Column], key: tuple[str, ...]) -> None:
        self.catalog = dataclasses.replace(
            self.catalog, tables={**self.catalog.tables, name: Table(name, columns, key, (), ())}
        )

    # -- steps -----------------------------------------------------------------------------------------

    def query(self, tree: exp.Expr, name: str, kind: StepKind) -> Step:
        """Decompose ``tree`` (a qualified SELECT) into steps, analyse them, and return its own step."""
        t0 = time.perf_counter()
        if not isinstance(tree, exp.Select):
            raise ValueError(f"{name}: only SELECT blocks (set operations of workflows are not decomposed)")
        tree = tree.copy()
        tree.set("order", None)
        tree.set("limit", None)
        tree.set("offset", None)
        reads: list[str] = []
        with_ = tree.args.get("with") or tree.args.get("with_")
        if with_ is not None:
            for cte in with_.expressions:
                step = self._derived(cte.this, cte.alias_or_name.lower())
                reads.append(step.name)
                for t in tree.find_all(exp.Table):
                    if t.name.lower() == cte.alias_or_name.lower() and not t.args.get("db"):
                        t.set("this", exp.to_identifier(step.name))
            tree.set("with", None)
            tree.set("with_", None)
        # HAVING filters groups by their aggregates: a group it drops or keeps holds a changed row, so the
        # groups that change are among those Ψ counts without it; its subqueries are released steps
        having = tree.args.get("having")
        if having is not None:
            for sub in _subqueries(having):
                self._released(sub)
            tree.set("having", None)
        antis: list[tuple[str, exp.Select, list[exp.Expr]]] = []  # (D, the block, its join conditions)
        for block in _blocks(tree):
            self._from_steps(block, reads)
            antis += self._where(block, reads)
        for sub in _subqueries_outside_where(tree):
            self._released(sub)
        variants: dict[str, exp.Select] = {"": tree}
        for d, block, conditions in antis:
            variant = tree.copy()
            # the same block in the copy (blocks are listed in a fixed order); the other anti-joins stay dropped
            at = next(i for i, b in enumerate(_blocks(tree)) if b is block)
            _join(_blocks(variant)[at], d, conditions)
            variants[d] = variant
        direct: dict[str, mc.GlobalSensitivity] = {}
        queries: dict[str, str] = {}
        base = variants[""]
        spj = mc.from_select(base)
        for table in dict.fromkeys(u.table for u in spj.uses):
            direct[table] = self._measure(base, table, kind)
            queries[table] = base.sql(dialect="postgres")
        for d in variants:
            if d:
                direct[d] = self._measure(variants[d], d, kind)
                queries[d] = variants[d].sql(dialect="postgres")
        step = Step(
            name,
            kind,
            tree.sql(dialect="postgres"),
            self._key_of(name),
            direct,
            tuple(dict.fromkeys(reads)),
            time.perf_counter() - t0,
            not (kind == "main" and self.measure == "join")
            and base.args.get("group") is None
            and any(e.find(exp.AggFunc) is not None for e in base.expressions),
            queries,
        )
        self.steps.append(step)
        return step

    def _key_of(self, name: str) -> tuple[str, ...]:
        table = self.catalog.tables.get(name)
        return tuple(table.primary_key) if table is not None and table.primary_key else ()

    def _measure(self, tree: exp.Select, table: str, kind: StepKind) -> mc.GlobalSensitivity:
        spj = mc.from_select(tree)
        if kind == "main" and self.measure == "join":
            # the join rows of the main step (module docstring): what its COUNT or SUM moves, ℓ1 over its groups
            return mc.sensitivity(
                mc.SPJ(spj.uses, spj.conditions), self.catalog, table, timeout=self.timeout, cap=self.cap
            )
        if kind == "grouped" or (spj.semantics == "set"):
            return mc.sensitivity(spj, self.catalog, table, timeout=self.timeout, cap=self.cap)
        bag = mc.SPJ(spj.uses, spj.conditions)
        rows = mc.sensitivity(bag, self.catalog, table, timeout=self.timeout, cap=self.cap)
        if any(e.find(exp.AggFunc) is not None for e in tree.expressions):
            # an ungrouped aggregate: one result row, which changes iff some join row does
            return dataclasses.replace(rows, value=min(rows.value, 1.0), exact=rows.exact and rows.value <= 1)
        return rows

    def _derived(self, body: exp.Expr, prefix: str) -> Step:
        """A WITH query or FROM subquery that aggregates or is DISTINCT: a step whose result is a table with the
        key of NR §3.3.13.10 (the group columns; all columns for DISTINCT)."""
        body = body.unnest()
        if not isinstance(body, exp.Select):
            raise ValueError(f"{prefix}: only SELECT blocks are decomposed")
        name = self._fresh(f"{prefix}__step")
        columns: dict[str, Column] = {}
        group = body.args.get("group")
        group_sql = {g.sql() for g in group.expressions} if group is not None else set()
        key: list[str] = []
        for item in body.expressions:
            inner = item.unalias()
            columns[item.alias_or_name] = self._column_of(item.alias_or_name, inner, body)
            if inner.sql() in group_sql:
                key.append(item.alias_or_name)
        if group is not None:
            if len(key) != len(group.expressions):
                raise ValueError(f"{prefix}: a group column that is not in the select list (no key for the step)")
            kind: StepKind = "grouped"
        elif body.args.get("distinct") is not None:
            key, kind = list(columns), "distinct"
        elif _aggregates(body):
            raise ValueError(f"{prefix}: an ungrouped aggregate as a table is a released step, not decomposed")
        else:
            raise ValueError(f"{prefix}: a join–filter derived table is inlined, not a step")
        self._add_table(name, columns, tuple(key))
        return self.query(body, name, kind)

    def _column_of(self, name: str, e: exp.Expr, scope: exp.Select) -> Column:
        """A step's output column: a column of a table in ``scope``'s FROM keeps its type and NULL-ness; any
        other is any number (the model admits every value, which keeps the bound an upper bound)."""
        if isinstance(e, exp.Column):
            for src in mc._sources(scope):
                if isinstance(src, exp.Table) and src.alias_or_name == e.table:
                    table = self.catalog.tables.get(src.name.lower())
                    if table is not None and e.name in table.columns:
                        return dataclasses.replace(table.column(e.name), name=name)
        return Column(name, "NUMERIC", "numeric", nullable=True)

    def _from_steps(self, block: exp.Select, reads: list[str]) -> None:
        """FROM subqueries that aggregate or are DISTINCT become steps read as tables."""
        for src in mc._sources(block):
            if isinstance(src, exp.Subquery) and isinstance(src.this, exp.Select):
                inner = src.this
                if inner.args.get("group") or inner.args.get("distinct") or _aggregates(inner):
                    if any(
                        isinstance(n, exp.Join) and (n.args.get("side") or n.args.get("kind")) for n in inner.walk()
                    ):
                        raise ValueError("an outer join inside a derived table is not a join–filter step")
                    step = self._derived(inner, src.alias_or_name)
                    reads.append(step.name)
                    src.replace(
                        exp.Table(
                            this=exp.to_identifier(step.name),
                            alias=exp.TableAlias(this=exp.to_identifier(src.alias_or_name)),
                        )
                    )

    def _where(self, block: exp.Select, reads: list[str]) -> list[tuple[str, exp.Select, list[exp.Expr]]]:
        """Replace the subquery conjuncts of the block's WHERE; return the anti-joins (D, block, ψ) whose join is
        analysed w.r.t. D in a variant of the query of their own."""
        where = block.args.get("where")
        if where is None:
            return []
        kept: list[exp.Expr] = []
        antis = []
        for part in mc._split(where.this):
            if not any(isinstance(n, exp.Query) for n in part.walk()):
                kept.append(part)
                continue
            found = recognise(part)
            if found is not None:
                sub, x, anti, source = found
                d, conditions = self._semijoin(sub.unnest(), x, source)
                reads.append(d)
                if anti:
                    antis.append((d, block, conditions))
                else:
                    _join(block, d, [])
                    kept += conditions
                continue
            scalar = _scalar_comparison(part)
            if scalar is not None and _correlated(scalar[0]):
                d, conditions = self._scalar_join(scalar[0], part)
                reads.append(d)
                _join(block, d, [])
                kept += conditions
                continue
            for sub in _subqueries(part):
                if _correlated(sub) or isinstance(sub.parent, (exp.In, exp.Exists, exp.Any, exp.All)):
                    # a set, not one value (IN / EXISTS under OR or NOT): not a released step
                    raise ValueError(f"a subquery the workflow does not decompose: {part.sql()[:80]}")
                self._released(sub)
            kept.append(part)
        block.set("where", exp.Where(this=exp.and_(*kept)) if kept else None)
        return antis

    def _split_correlation(self, sub: exp.Select) -> tuple[list[exp.Expr], list[exp.Expr], set[str]]:
        own = {t.alias_or_name for t in sub.find_all(exp.Table)} | {
            s.alias for s in sub.find_all(exp.Subquery) if s.alias
        }
        where = sub.args.get("where")
        phi: list[exp.Expr] = []
        psi: list[exp.Expr] = []
        for part in mc._split(where.this) if where is not None else []:
            (psi if any(c.table not in own for c in part.find_all(exp.Column)) else phi).append(part)
        mine = {t.alias_or_name for t in mc._sources(sub) if isinstance(t, (exp.Table, exp.Subquery))}
        return phi, psi, mine

    def _semijoin(self, sub: exp.Expr, x: exp.Expr | None, source: str) -> tuple[str, list[exp.Expr]]:
        if not isinstance(sub, exp.Select):
            raise ValueError(f"{source}: only SELECT subqueries are decomposed")
        phi, psi, mine = self._split_correlation(sub)
        if x is not None:
            if len(sub.expressions) != 1:
                raise ValueError(f"{source}: the subquery must return one column")
            k = sub.expressions[0].unalias()
            if not (isinstance(k, exp.Column) and k.table in mine):
                raise ValueError(f"{source}: the subquery's column must be a column of its own tables")
            psi.append(exp.EQ(this=k.copy(), expression=x.copy()))
            if source == "NOT IN" and (
                self._column_of(k.name, k, sub).nullable
                or any(c.table not in mine and self._nullable_outer(c, sub) for c in x.find_all(exp.Column))
            ):
                # a NULL in D makes NOT IN unknown for every outer row: one row of D flips them all
                raise ValueError("NOT IN over a nullable column is not NOT EXISTS (sqldp.subqueries refuses it)")
        read = list(dict.fromkeys((c.table, c.name) for p in psi for c in p.find_all(exp.Column) if c.table in mine))
        group = sub.args.get("group")
        if group is not None:
            keys = {g.sql() for g in group.expressions}
            if any(exp.column(c, table=t).sql() not in keys for t, c in read):
                raise ValueError(f"{source}: a grouped subquery tied by a column that is not a group key")
        names = _names(read)
        d_select = sub.copy()
        d_select.set("expressions", [exp.alias_(exp.column(c, table=t), names[(t, c)]) for t, c in read])
        d_select.set("where", exp.Where(this=exp.and_(*[p.copy() for p in phi])) if phi else None)
        d_select.set("distinct", exp.Distinct())
        if group is not None:
            # D = the distinct keys of the groups (HAVING decides which; a changed row changes its groups only)
            d_select.set("group", None)
            d_select.set("having", None)
        if not read:
            raise ValueError(f"{source}: an uncorrelated EXISTS flips every outer row (∞); not decomposed")
        name = self._fresh("d")
        self._add_table(
            name,
            {names[(t, c)]: self._column_of(names[(t, c)], exp.column(c, table=t), sub) for t, c in read},
            tuple(names[r] for r in read),
        )
        self.query(d_select, name, "distinct")
        conditions = [_rename(p, mine, name, names) for p in psi]
        return name, conditions

    def _scalar_join(self, sub: exp.Select, part: exp.Expr) -> tuple[str, list[exp.Expr]]:
        phi, psi, mine = self._split_correlation(sub)
        if sub.args.get("group") or sub.args.get("having") or len(sub.expressions) != 1:
            raise ValueError("a correlated scalar subquery with GROUP BY or several columns is not decomposed")
        value = sub.expressions[0].unalias()
        if any(c.table not in mine for c in value.find_all(exp.Column)):
            raise ValueError("a correlated scalar subquery whose value reads the outer query is not decomposed")
        if value.find(exp.AggFunc) is None or value.find(exp.Count) is not None:
            # COUNT is 0 over no rows, where the join has no row: not the same query
            raise ValueError("a correlated scalar subquery without an aggregate, or with COUNT, is not decomposed")
        keys: list[tuple[str, str]] = []
        for p in psi:
            if not isinstance(p, exp.EQ):
                raise ValueError("a correlated scalar subquery tied by a condition other than '=' is not decomposed")
            a, b = p.this.unnest(), p.expression.unnest()
            own = a if isinstance(a, exp.Column) and a.table in mine else b
            other = b if own is a else a
            if not (isinstance(own, exp.Column) and own.table in mine) or any(
                c.table in mine for c in other.find_all(exp.Column)
            ):
                raise ValueError("a correlated scalar subquery must be tied by own column = outer expression")
            keys.append((own.table, own.name))
        keys = list(dict.fromkeys(keys))
        names = _names(keys)
        value_name = "__value"
        d_select = sub.copy()
        d_select.set(
            "expressions",
            [
                *(exp.alias_(exp.column(c, table=t), names[(t, c)]) for t, c in keys),
                exp.alias_(value.copy(), value_name),
            ],
        )
        d_select.set("where", exp.Where(this=exp.and_(*[p.copy() for p in phi])) if phi else None)
        d_select.set("group", exp.Group(expressions=[exp.column(c, table=t) for t, c in keys]))
        name = self._fresh("d")
        columns = {names[(t, c)]: self._column_of(names[(t, c)], exp.column(c, table=t), sub) for t, c in keys}
        columns[value_name] = Column(value_name, "NUMERIC", "numeric", nullable=True)
        self._add_table(name, columns, tuple(names[k] for k in keys))
        self.query(d_select, name, "grouped")
        conditions = [_rename(p, mine, name, names) for p in psi]
        compared = part.copy()
        for node in list(compared.walk()):
            if isinstance(node, exp.Subquery):
                node.replace(exp.column(value_name, table=name))
                break
        return name, [*conditions, compared]

    def _nullable_outer(self, c: exp.Column, sub: exp.Expr) -> bool:
        """Whether an outer column read next to ``sub`` may be NULL (unknown tables: yes)."""
        node = sub.parent
        while node is not None:
            if isinstance(node, exp.Select):
                for src in mc._sources(node):
                    if isinstance(src, exp.Table) and src.alias_or_name == c.table:
                        table = self.catalog.tables.get(src.name.lower())
                        return table is None or c.name not in table.columns or table.column(c.name).nullable
            node = node.parent
        return True

    def _released(self, sub: exp.Expr) -> None:
        """An uncorrelated scalar subquery: answered (with noise) before the step that reads it, which sees an
        unknown constant (:func:`_placeholders`); its sensitivity is listed, not composed."""
        inner = sub.unnest()
        name = self._fresh("released")
        self.query(inner, name, "released")
        sub.replace(exp.Placeholder(this=name))


def _aggregates(select: exp.Select) -> bool:
    """Whether the block's own select list aggregates (not a subquery inside it)."""
    return any(
        isinstance(n, exp.AggFunc) and not any(isinstance(p, exp.Query) for p in _parents(n, e))
        for e in select.expressions
        for n in e.walk()
    )


def _parents(node: exp.Expr, top: exp.Expr) -> list[exp.Expr]:
    out = []
    parent = node.parent
    while parent is not None and parent is not top:
        out.append(parent)
        parent = parent.parent
    return out


def _names(read: Sequence[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Column names of a step's result: the column's own, or alias_column when two tables share it."""
    plain = [c for _, c in read]
    return {(t, c): c if plain.count(c) == 1 else f"{t}_{c}" for t, c in read}


def _rename(e: exp.Expr, mine: set[str], table: str, names: dict[tuple[str, str], str]) -> exp.Expr:
    def swap(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table in mine:
            return exp.column(names[(node.table, node.name)], table=table)
        return node

    return e.copy().transform(swap)


def _join(block: exp.Select, table: str, conditions: list[exp.Expr]) -> None:
    block.append(
        "joins",
        exp.Join(this=exp.Table(this=exp.to_identifier(table), alias=exp.TableAlias(this=exp.to_identifier(table)))),
    )
    if conditions:
        where = block.args.get("where")
        parts = ([where.this] if where is not None else []) + conditions
        block.set("where", exp.Where(this=exp.and_(*parts)))


def _blocks(tree: exp.Select) -> list[exp.Select]:
    """The block and its join–filter derived tables in FROM (which :func:`model_check.from_select` inlines)."""
    out = [tree]
    for src in mc._sources(tree):
        if isinstance(src, exp.Subquery) and isinstance(src.this, exp.Select):
            out += _blocks(src.this)
    return out


def _subqueries(e: exp.Expr) -> list[exp.Expr]:
    found: list[exp.Expr] = []
    for node in e.walk():
        if isinstance(node, exp.Subquery) and not any(inside(node, f) for f in found):
            found.append(node)
    return found


def _subqueries_outside_where(tree: exp.Select) -> list[exp.Expr]:
    """Scalar subqueries in the select lists and GROUP BY of the blocks (released steps)."""
    out = []
    for block in _blocks(tree):
        for e in [*block.expressions, *(block.args["group"].expressions if block.args.get("group") else [])]:
            out += _subqueries(e)
    return out


def _scalar_comparison(part: exp.Expr) -> tuple[exp.Select, exp.Expr] | None:
    e = part.unnest()
    if isinstance(e, (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)):
        for side, other in ((e.expression, e.this), (e.this, e.expression)):
            if (
                isinstance(side, exp.Subquery)
                and isinstance(side.this, exp.Select)
                and not any(isinstance(n, exp.Query) for n in other.walk())
            ):
                return side.this, other
    return None


def _correlated(sub: exp.Expr) -> bool:
    own = {t.alias_or_name for t in sub.find_all(exp.Table)} | {s.alias for s in sub.find_all(exp.Subquery) if s.alias}
    return any(c.table and c.table not in own for c in sub.find_all(exp.Column))


def workflow(
    tree: exp.Expr,
    catalog: Catalog,
    *,
    timeout: float = mc.DEFAULT_TIMEOUT,
    cap: int = mc.DEFAULT_CAP,
    measure: Measure = "rows",
) -> WorkflowSensitivity:
    """The steps of a qualified query (:func:`sqldp.frontend.parse`), their sensitivities, and the composed
    sensitivity w.r.t. every base table (NR §3.3.13.9, Proposition 3.2). Raises ValueError for shapes it does
    not decompose (outer joins, set operations of steps, …) with the reason. ``measure``: the main step's result
    rows (NR §4.3.6, Table 21) or its join rows (module docstring)."""
    t0 = time.perf_counter()
    builder = _Builder(catalog, timeout, cap, measure)
    main = builder.query(tree, "main", "main")
    by_name = {s.name: s for s in builder.steps}
    base = set(catalog.tables)
    memo: dict[str, tuple[dict[str, float], dict[str, str]]] = {}

    def composed(step: Step) -> tuple[dict[str, float], dict[str, str]]:
        if step.name in memo:
            return memo[step.name]
        out: dict[str, float] = {}
        why: dict[str, str] = {}  # per table whose term is ∞: the first ∞ factor met and its method
        for t, g in step.direct.items():
            if t in base:
                out[t] = out.get(t, 0.0) + g.value
                if math.isinf(g.value):
                    why.setdefault(t, f"{step.name} w.r.t. {t}: {_reason(g)}")
        for d in step.reads:
            child = by_name[d]
            if child.kind == "released":
                continue
            inner, inner_why = composed(child)
            found = step.direct.get(d)
            c = found.value if found is not None else 0.0
            for t, v in inner.items():
                term = _times(c, _times(child.rows_per_group, v))
                out[t] = out.get(t, 0.0) + term
                if math.isinf(term):
                    # c_D · r_D · S_D(t) is ∞ through c_D (the step's rows D reaches) or through S_D(t)
                    if math.isinf(c) and found is not None:
                        why.setdefault(t, f"{step.name} w.r.t. step {d}: {_reason(found)}")
                    else:
                        why.setdefault(t, inner_why.get(t, f"step {d} w.r.t. {t}"))
        if step.one_row:
            out = {t: min(v, 1.0) for t, v in out.items()}
        why = {t: w for t, w in why.items() if math.isinf(out.get(t, 0.0))}
        memo[step.name] = (out, why)
        return out, why

    total, why = composed(main)
    return WorkflowSensitivity(tuple(builder.steps), total, time.perf_counter() - t0, builder.catalog, why, measure)


def _reason(g: mc.GlobalSensitivity) -> str:
    return f"{g.method}{' (time limit reached)' if g.timed_out else ''}"
