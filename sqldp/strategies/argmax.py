"""The argmax over a public domain (TPC-H Q15's shape), a strategy of its own beside the selection of public rows
(:mod:`sqldp.strategies.selection`, whose statements and run it shares)::

    WITH V (k, total) AS (SELECT t.g, SUM(e) FROM T AS t WHERE ψ(t) GROUP BY t.g)
    SELECT … FROM <public tables>, V WHERE φ AND a = V.k AND V.total = (SELECT MAX(V.total) FROM V) …

Candidates: the distinct values of a over the public rows φ keeps (a public set). Score of a candidate v:
s(v) = Σ_{t ∈ T, t.g = v, ψ(t)} e(t) with e's columns clamped to their declared ranges (0 when no row).
Δ, the most one change of one row of T moves one score, per unit of distance (a bound on every database): the
row belongs to one group (g is outside the norm, so a value change keeps it), and its term moves by at most
M = max |e| over the ranges when it enters or leaves (added or removed: distance w_T; ψ flips: a change of a
sensitive column ψ reads, at least w_v·g_v), else by at most ‖(∂e/∂v)_v‖ in the dual of the row norm times
the distance (NR Lemmas 3.64–3.66, the data-independent c3 of NR §3.3.9.3). Only one score moves per
neighbour, so the scores are monotone in the sense of McKenna & Sheldon ("Permute-and-Flip: A new mechanism
for differentially private selection", NeurIPS 2020, §2): the exponential mechanism with weights
exp(ε₁·s(v)/Δ) (no factor 2) is ε₁-DP — in one step only s(j) moves, by δ ≤ Δ·d, so P(j) moves by a factor
in [1, e^(ε₁·d)] and every other P(v) by Z/Z′ ∈ [e^(−ε₁·d), 1]. The chosen candidate's score is then released
with Laplace noise Δ/ε₂ (ε₂-DP), the statement's public columns for it are exact, and its total is the noisy
score. ε₁ = ε₂ = ε/2 (sequential composition, NR §3.3.10.4).
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp import allowlist, mechanisms
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import ColumnRef
from sqldp.frontend import ParsedQuery, conjuncts, position
from sqldp.mechanisms import NoiseSource
from sqldp.mechanisms.registry import EXPONENTIAL, LAPLACE
from sqldp.params import resolve_params
from sqldp.pg_arithmetic import integer_valued
from sqldp.policy import Policy
from sqldp.result import GLOBAL, Measurement, Result
from sqldp.sensitivity import expressions
from sqldp.sensitivity.expressions import RangeOps, column_weights, dual
from sqldp.sensitivity.intervals import Domain, clamp_columns, magnitude
from sqldp.strategies.base import Context, Privacy
from sqldp.strategies.selection import (
    _CAND,
    Chosen,
    _and,
    _check_key,
    _from_tables,
    _literal,
    _step,
    _tables,
    public_path,
    statement_for,
)

ARGMAX_SHARE = 0.5  # ε₁ = ε·ARGMAX_SHARE chooses, ε₂ = ε − ε₁ measures


@dataclass(frozen=True)
class ArgmaxShape:
    tree: exp.Select  # the qualified statement
    view: str  # V's name
    key: str  # V's key column (k)
    total: str  # V's aggregate column
    join: exp.Expr  # a = V.k, a node of ``tree``
    top: exp.Expr  # V.total = (SELECT MAX(V.total) FROM V), a node of ``tree``
    a: exp.Expr
    score_sql: str  # per candidate v: (v, s(v)); ordered by v
    per_unit: float  # Δ
    table: str
    aggregate: str  # SUM(e) as written, for the notes
    where: str
    why: str
    candidates_sql: str  # the candidates alone: a statement over public tables (PostgreSQL)

    @property
    def statement(self) -> str:
        return self.score_sql


def _cte(tree: exp.Select) -> tuple[str, exp.Select] | None:
    with_ = tree.args.get("with_") or tree.args.get("with")
    if with_ is None or len(with_.expressions) != 1:
        return None
    cte = with_.expressions[0]
    q = cte.this
    return (cte.alias_or_name, q) if isinstance(q, exp.Select) else None


def _is_max_of(node: exp.Expr, view: str, total: str) -> bool:
    q = node.unnest() if not isinstance(node, exp.Subquery) else node.this
    while isinstance(q, exp.Subquery):
        q = q.this
    if not isinstance(q, exp.Select) or len(q.expressions) != 1 or q.args.get("where") or q.args.get("joins"):
        return False
    tables = _from_tables(q)
    m = q.expressions[0].unalias()
    return (
        len(tables) == 1
        and tables[0].name == view
        and isinstance(m, exp.Max)
        and isinstance(m.this, exp.Column)
        and m.this.name == total
    )


def find_shape(parsed: ParsedQuery, catalog: Catalog, policy: Policy) -> ArgmaxShape | None:
    """The argmax shape above, None for a statement of another shape; a refusal with the position for one of
    this outline that cannot be analysed."""
    tree = parsed.tree
    if not isinstance(tree, exp.Select):
        return None
    found = _cte(tree)
    if found is None:
        return None
    view, q = found
    if not any(not policy.table(t).public for t in _tables(q) if t in catalog.tables):
        return None
    main = tree.copy()
    main.set("with_", None)
    main.set("with", None)
    where = tree.args.get("where")
    parts = conjuncts(where.this if where is not None else None)
    tops = [
        p
        for p in parts
        if isinstance(p, exp.EQ)
        and any(_is_max_of(side, view, c.name) for side in (p.this, p.expression) for c in p.find_all(exp.Column))
    ]
    if len(tops) != 1:
        return None
    outer = [t for t in _from_tables(tree) if t.name != view]
    if not outer or any(not policy.table(t.name.lower()).public for t in outer):
        return None  # rows of a private table would be released: the analyses refuse that with their reason
    at = position(parsed.sql, tops[0])
    try:
        return _argmax(parsed, catalog, policy, tree, view, q, parts, tops[0], at)
    except RefusedError as err:
        if err.where != at:
            raise
        read = ", ".join(f"'{t}'" for t in sorted(_tables(q)) if t in catalog.tables and not policy.table(t).public)
        raise RefusedError(f"{err.message} (it reads private table {read})", where=at) from None


def _argmax(
    parsed: ParsedQuery,
    catalog: Catalog,
    policy: Policy,
    tree: exp.Select,
    view: str,
    q: exp.Select,
    parts: list[exp.Expr],
    top: exp.Expr,
    at: str,
) -> ArgmaxShape:
    what = "the argmax over a WITH query"
    for arg, name in (("having", "HAVING"), ("limit", "LIMIT"), ("joins", "a JOIN"), ("distinct", "DISTINCT")):
        if q.args.get(arg):
            raise RefusedError(f"{what}: {name} in the WITH query is not analysed", where=at)
    t_tables = _from_tables(q)
    group = q.args.get("group")
    if len(t_tables) != 1 or group is None or len(group.expressions) != 1 or len(q.expressions) != 2:
        raise RefusedError(f"{what}: the WITH query must be SELECT g, SUM(e) FROM one table … GROUP BY g", where=at)
    t_name, t_alias = t_tables[0].name.lower(), t_tables[0].alias_or_name
    tp = policy.table(t_name)
    if policy.units:
        raise RefusedError(f"{what}: privacy units are not analysed here", where=at)
    g = group.expressions[0]
    items = {i.alias_or_name: i.unalias() for i in q.expressions}
    keys = [n for n, e in items.items() if e == g]
    sums = [n for n, e in items.items() if isinstance(e, exp.Sum)]
    if len(keys) != 1 or len(sums) != 1 or not (isinstance(g, exp.Column) and g.table == t_alias):
        raise RefusedError(f"{what}: the WITH query must be SELECT g, SUM(e) FROM one table … GROUP BY g", where=at)
    key, total = keys[0], sums[0]
    weights = column_weights(tp.norm) if tp.norm is not None else {}
    if g.name in weights:
        raise RefusedError(f"{what}: the group column {t_name}.{g.name} is value-sensitive", where=at)
    e = items[total].this
    # the main query: public tables and V; a = V.k; V.total = (SELECT MAX …); the rest public
    main_tables = _from_tables(tree)
    views = [t for t in main_tables if t.name == view]
    if len(views) != 1 or any(not policy.table(t.name.lower()).public for t in main_tables if t.name != view):
        raise RefusedError(f"{what}: the statement must join public tables with the WITH query once", where=at)
    v_alias = views[0].alias_or_name
    for arg, name in (("group", "GROUP BY"), ("having", "HAVING")):
        if tree.args.get(arg):
            raise RefusedError(f"{what}: {name} in the statement is not analysed", where=at)
    joins = [p for p in parts if p is not top and v_alias in {c.table for c in p.find_all(exp.Column)}]
    if len(joins) != 1 or not isinstance(joins[0], exp.EQ):
        raise RefusedError(f"{what}: the WITH query must be joined by one equality with its key", where=at)
    join = joins[0]
    a: exp.Expr | None = None
    for side, other in ((join.this, join.expression), (join.expression, join.this)):
        mine = isinstance(side, exp.Column) and side.table == v_alias and side.name == key
        if mine and isinstance(other, exp.Column) and other.table != v_alias:
            a = other
    if a is None:
        raise RefusedError(f"{what}: the WITH query must be joined by its key equal to a public column", where=at)
    _check_key(a, catalog, tree, at)
    others = [p for p in parts if p is not top and p is not join]
    if any(not policy.table(t).public for p in others for t in _tables(p) if t in catalog.tables):
        raise RefusedError(f"{what}: the statement's other conditions must read public tables only", where=at)
    rest = tree.copy()
    rest.set("with_", None)
    rest.set("with", None)
    rest.set("where", None)
    for c in rest.find_all(exp.Column):
        if c.table == v_alias and c.name != total and c.name != key:
            raise RefusedError(f"{what}: the statement reads {c.sql()}", where=at)
    if any(isinstance(n, exp.AggFunc) for n in rest.walk()):
        raise RefusedError(f"{what}: aggregates in the statement are not analysed", where=at)
    inner = conjuncts(q.args["where"].this if q.args.get("where") is not None else None)
    if any(isinstance(n, exp.Subquery) for p in inner for n in p.walk()):
        raise RefusedError(f"{what}: subqueries in the WITH query are not analysed", where=at)
    dom = _domain(catalog, policy, t_name)
    per_unit, why, clamped = _sum_bound(catalog, policy, t_name, e, inner, dom, at)
    kinds = catalog.table(t_name)

    def kind(ref: ColumnRef) -> str:
        return kinds.column(ref.column).kind if ref.alias == t_alias and ref.column in kinds.columns else "other"

    integer = integer_valued(clamped, kind)  # what is summed: e with its columns clamped
    sql, cand = _score_sql(tree, view, a, join, top, others, t_tables[0], g, clamped, inner, integer)
    agg = items[total].sql(dialect="postgres")
    return ArgmaxShape(tree, v_alias, key, total, join, top, a, sql, per_unit, t_name, agg, at, why, cand)


def _domain(catalog: Catalog, policy: Policy, table: str) -> Domain:
    """The declared ranges of ``table``'s columns (an integer column's rounded inwards, as the analyses do)."""

    def declared(ref: ColumnRef) -> tuple[float, float] | None:
        r = policy.table(table).column(ref.column).range
        if r is None or catalog.table(table).column(ref.column).kind != "integer":
            return r
        return float(math.ceil(r[0])), float(math.floor(r[1]))

    return Domain(
        declared,
        lambda ref: catalog.table(table).column(ref.column).kind,
        lambda ref: catalog.table(table).column(ref.column).type_sql,
    )


def clamped(e: exp.Expr, dom: Domain) -> exp.Expr:
    """e with every column clamped to its declared range (so that M bounds it on every database)."""
    return clamp_columns(e, dom)


def _sum_bound(
    catalog: Catalog, policy: Policy, t_name: str, e: exp.Expr, inner: list[exp.Expr], dom: Domain, at: str
) -> tuple[float, str, exp.Expr]:
    """Δ of the comment above, how it was obtained, and e clamped."""
    tp = policy.table(t_name)
    weights = column_weights(tp.norm) if tp.norm is not None else {}

    def sensitive(ref: ColumnRef) -> float | None:
        return weights.get(ref.column)

    try:
        m = magnitude(e, dom)
        _, d = expressions.bound(e, sensitive, RangeOps(dom.range), 1.0)
    except RefusedError as err:
        raise RefusedError(f"the argmax over a WITH query: {err.message}", where=at) from None
    candidates: list[tuple[float, str]] = []
    if tp.rows_private:
        candidates.append((m / tp.weight, f"a row of {t_name} added or removed moves one total by ≤ {m:g}"))
    if tp.norm is not None and d:
        lip = float(dual(tp.norm, {ref.column: v for ref, v in d.items()}, "float") or 0.0)
        candidates.append((lip, f"the summed expression's derivative bounds in the dual norm: {lip:g}"))
    for v in sorted({c.name for p in inner for c in p.find_all(exp.Column)}):
        w = weights.get(v)
        if w is None:
            continue
        col = catalog.table(t_name).column(v)
        grid = _step(tp, col, v)
        if grid <= 0 or col.nullable:
            raise RefusedError(
                f"the argmax over a WITH query: a filter on {t_name}.{v} ({col.type_sql}) can flip with an arbitrarily "
                "small change of it",
                where=at,
            )
        flip = filter_flip(m, w, grid)
        candidates.append((flip, f"{t_name}.{v} in a filter: a change of at least {grid:g} moves ≤ {m:g}"))
    if not candidates:
        raise RefusedError("the argmax over a WITH query: its table protects nothing", where=at)
    per_unit, why = max(candidates)
    return per_unit, why, clamped(e, dom)


def filter_flip(m: float, weight: float, grid: float) -> float:
    """A filter on a sensitive column flips with a change of it of one grid step at least (distance weight·grid)
    and moves the row's term by at most m: m per weight·grid of distance."""
    return m / (weight * grid)


def _score_sql(
    tree: exp.Select,
    view: str,
    a: exp.Expr,
    join: exp.Expr,
    top: exp.Expr,
    others: list[exp.Expr],
    t_table: exp.Table,
    g: exp.Column,
    e: exp.Expr,
    inner: list[exp.Expr],
    integer: bool,
) -> tuple[str, str]:
    """Per candidate v, (v, s(v)) ordered by v; and the candidates' own statement (public tables). An
    integer-valued e is summed in NUMERIC: PostgreSQL's SUM(BIGINT) is NUMERIC, Spark's a BIGINT that fails on
    overflow (sqldp.engine.spark.sql writes the cast DECIMAL(38, 0): the same value). A NUMERIC e's SUM is exact on
    both (Spark's DECIMAL(p + 10, s)); COALESCE gives 0 for a candidate with no row on both."""
    cand = exp.select(exp.alias_(a.copy(), "v")).distinct()
    sources = [t for t in _from_tables(tree) if t.name != view]
    cand = cand.from_(sources[0].copy())
    for t in sources[1:]:
        cand = cand.join(t.copy())
    cond = _and(others)
    if cond is not None:
        cand = cand.where(cond)
    on = _and([exp.EQ(this=g.copy(), expression=exp.column("v", table=_CAND)), *inner])
    summed = exp.cast(e.copy(), "NUMERIC") if integer else e.copy()
    main = exp.select(
        exp.column("v", table=_CAND),
        exp.alias_(exp.func("COALESCE", exp.func("SUM", summed), exp.Literal.number(0)), "s"),
    ).from_(_CAND)
    main = main.join(t_table.copy(), on=on, join_type="LEFT")
    main = main.group_by(exp.column("v", table=_CAND)).order_by(exp.column("v", table=_CAND))
    return main.with_(_CAND, as_=cand).sql(dialect="postgres"), cand.sql(dialect="postgres")


def argmax_final_sql(shape: ArgmaxShape, chosen: Any, noisy: float | None) -> str:
    """The statement over public tables only: V gone, a = <chosen> (FALSE when there is no candidate), V's key
    read as the chosen value and its total as the released one."""
    tree = shape.tree.copy()
    tree.set("with_", None)
    tree.set("with", None)
    join = next(n for n in tree.walk() if n == shape.join)
    top = next(n for n in tree.walk() if n == shape.top)
    join.replace(exp.EQ(this=shape.a.copy(), expression=_literal(chosen)) if chosen is not None else exp.false())
    top.replace(exp.true())
    for t in list(_from_tables(tree)):
        if t.alias_or_name == shape.view:
            parent = t.parent
            if isinstance(parent, exp.Join):
                parent.pop()
            else:  # in FROM: the first JOIN's table takes its place
                first = tree.args["joins"].pop(0)
                t.replace(first.this)
    for c in list(tree.find_all(exp.Column)):
        if c.table == shape.view:
            value = noisy if c.name == shape.total else chosen
            c.replace(exp.null() if value is None else _literal(value))
    return tree.sql(dialect="postgres")


class Argmax(Chosen[ArgmaxShape]):
    """A prepared argmax (the comment above): nothing has been read."""

    @property
    def rho(self) -> float:
        """Two pure releases, ε₁- and ε₂-DP: (ε₁² + ε₂²)/2-zCDP (Bun & Steinke, TCC 2016, Prop. 1.4 and
        composition, Lemma 2.3)."""
        e1, e2 = self.shares
        return (e1 * e1 + e2 * e2) / 2.0

    @property
    def shares(self) -> tuple[float, float]:
        e1 = self.params.epsilon * ARGMAX_SHARE
        return e1, self.params.epsilon - e1

    def notes(self) -> list[str]:
        e1, e2 = self.shares
        return [
            f"MAX over the WITH query at {self.shape.where}: the key chosen among the public candidates by the "
            f"exponential mechanism (ε = {e1:g}, scores {self.shape.aggregate} with a global bound "
            f"Δ = {self.shape.per_unit:g}: {self.shape.why}), its total released with Laplace noise (ε = {e2:g}); "
            "the chosen row's public columns are exact",
        ]

    def describe(self) -> Result:
        e1, e2 = self.shares
        result = Result(self.sql, self.params, notes=self.notes())
        result.plan = [
            {"aggregate": "argmax (exponential mechanism)", "epsilon": e1, "delta": None, "groups": "one choice"},
            {"aggregate": self.shape.aggregate, "epsilon": e2, "delta": None, "groups": "the chosen key"},
        ]
        return result

    def _execute(self, *, noisy: bool) -> Result:
        t0 = time.perf_counter()
        rows = self.context.engine.execute(self.statements, self.speed).answer
        t_scores = time.perf_counter() - t0
        e1, e2 = self.shares
        delta_ = self.shape.per_unit
        cal = mechanisms.calibrate_global(delta_, e2)
        scores = [(v, float(s)) for v, s in rows]
        result = Result(self.sql, self.params, test_mode=self.context.noise.test_mode, notes=self.notes())
        # audit: every candidate's true score; a run: the one choice (its mechanism and ε share, no value)
        for v, s in scores if not noisy else [("argmax", None)]:
            name = f"score({v})" if not noisy else f"argmax of {self.shape.aggregate}"
            m = Measurement(name, e1, 0.0, 0.0, delta_, 0.0, 0.0, {}, EXPONENTIAL, true_value=s)
            result.measurements.append([m])
        chosen, value = None, None
        if scores:
            if noisy:
                chosen = scores[exponential(scores, e1 / delta_ if delta_ > 0 else math.inf, self.context.noise)][0]
            else:
                chosen = max(scores, key=lambda vs: vs[1])[0]
            true = dict(scores)[chosen]
            value = mechanisms.release(cal.noise, true, cal.scale, self.context.noise) if noisy else true
            agg = Measurement(
                self.shape.aggregate,
                e2,
                0.0,
                0.0,
                delta_,
                cal.scale,
                cal.half_width(self.params.confidence),
                {self.shape.table: {"per_unit": delta_}},
                GLOBAL,
                true_value=true,
                calibration=cal,
                noisy_value=value if noisy else None,
            )
            result.measurements.append([agg])
        out = public_path(argmax_final_sql(self.shape, chosen, value), self.context).run()
        result.columns = out.columns
        totals = {i.alias_or_name for i in self.shape.tree.expressions if _reads(i, self.shape.view, self.shape.total)}
        # the total's noise scale is Δ/ε₂, a function of the policy and the query: its error bar may be shown
        bars = {c: cal.half_width(self.params.confidence) for c in totals} if noisy else {}
        result.rows = [
            {
                "key": {c: r[c] for c in out.columns if c not in totals},
                "values": {c: r[c] for c in totals},
                "errors": bars,
            }
            for r in out.rows
        ]
        result.grouped = True
        result.released = noisy
        result.timings = {"score_query": t_scores, "total": time.perf_counter() - self.started}
        return result


def _reads(item: exp.Expr, view: str, column: str) -> bool:
    return any(c.table == view and c.name == column for c in item.find_all(exp.Column))


def exponential(scores: list[tuple[Any, float]], rate: float, noise: NoiseSource) -> int:
    """The index of the candidate chosen with probability ∝ exp(rate·s) (the exponential mechanism; rate = ε₁/Δ),
    drawn exactly (sqldp.mechanisms.exponential_index)."""
    return mechanisms.exponential_index([s for _, s in scores], rate, noise)


def recognise(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Argmax | None:
    """The argmax for a statement of this module's shape (refusing what cannot be analysed before anything is
    read), None for any other statement. The whole statement passes the allow-list as the public path checks
    it."""
    shape = find_shape(parsed, context.catalog, context.policy)
    if shape is None:
        return None
    t0 = time.perf_counter()
    params = resolve_params(context.policy, outputs=2, **{k: v for k, v in privacy.items() if k != "mechanism"})
    params = dataclasses.replace(params, delta=None, beta=None, mechanism=LAPLACE)
    public_path(argmax_final_sql(shape, None, None), context)  # the final statement passes the public path now
    statement = statement_for(shape, context)
    assert parsed.statement is not None
    allowlist.check(parsed.sql, parsed.statement)
    return Argmax(context, parsed.sql, shape, params, statement, t0)


def explain(parsed: ParsedQuery, catalog: Catalog, policy: Policy) -> dict[str, Any] | None:
    """What ``sqldp explain`` shows for this shape (reads nothing): the kind, the bound and the SQL that runs;
    None for a statement of another shape. Refusals are raised as by :func:`recognise`."""
    argmax = find_shape(parsed, catalog, policy)
    if argmax is None:
        return None
    return {
        "kind": "argmax over a grouped WITH query (exponential mechanism, then its total with Laplace noise)",
        "where": argmax.where,
        "epsilon_shares": [ARGMAX_SHARE, 1 - ARGMAX_SHARE],
        "score_bound": argmax.per_unit,
        "why": argmax.why,
        "sql": [argmax.score_sql],
    }
