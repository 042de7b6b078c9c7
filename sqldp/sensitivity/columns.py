"""Value-level ("column") sensitivity of COUNT/SUM/MIN/MAX over σθ(U1 × … × Un) (NR §3.3.8), and the combination
of COUNT/SUM with row-level sensitivity (NR §3.3.9).

The metric (NR §3.3.8.2, §4.3.3.1): each table with a ``norm`` is a Banach space whose rows are measured by
that composite norm and combined with ℓ1; the tables are combined with ℓ1. The query becomes a continuous
function (§3.3.8.4): public conjuncts filter the product in SQL; private conjuncts become the [0, 1]-valued
s(r) of :mod:`sqldp.sensitivity.filters`, so that

    COUNT = Σ_r s(r),        SUM(e) = Σ_r e(r)·s(r)        (r over the product rows passing the public filter).

Derivative w.r.t. one row t of table T (use i): the rows of the product that contain t change with it, and
they are combined with ℓ∞ (NR §3.3.8.2, "Database as a Banach space"), so the bound is Σ_{r ∋ t} D_i(r) with
D_i(r) the dual row norm (Lemmas 3.64–3.66) of the per-column bounds

    |∂(e·s)/∂v| ≤ ub(e)·slope_v(s) + d_v(e)        (product rule, s ≤ 1)        |∂s/∂v| ≤ slope_v(s).

Rows combine with ℓ1, so the table's bound is max_t; tables combine with ℓ1, so the query's is max_T; the uses
of a self-joined table add up. Every ub and d is β-smooth (:mod:`sqldp.sensitivity.expressions`), and sums
and maxima of β-smooth functions are β-smooth, so the result c0 is a β-smooth upper bound.

MIN/MAX (NR §3.3.8.3, "Min / max"), when every table's rows are public: f = min_r g(r) over the product rows
passing the public filter, and |min_r a_r − min_r b_r| ≤ max_r |a_r − b_r| (min and max are 1-Lipschitz in
ℓ∞), so the bound w.r.t. use i is max_r D_i(r) — a maximum over the product rows, where SUM adds up
Σ_{r ∋ t} D_i(r). Without a private conjunct g = e, released as MIN/MAX(e) itself, and D_i(r) is the dual norm
of the d_v(e). With one, §3.3.8.4 releases MIN(e + (1 − s)·Δ) (MAX: e − (1 − s)·Δ): a row the filter drops
enters shifted past every value, so it does not win while another row passes. NR takes Δ = MAX(e) − MIN(e)
from the data; sqldp takes the width of e's interval over the declared ranges (:mod:`intervals`), a constant,
so |∂g/∂v| ≤ d_v(e) + Δ·slope_v stays per row and β-smooth (a data-dependent Δ would tie every row's g to
the rows attaining MAX and MIN). Exact step filters then leave the WHERE too: a row that fails one must still
enter shifted, or the answer would jump to "no rows". The uses of a self-joined table add up (an upper bound
of max_r Σ_i D_i(r)); maxima of β-smooth functions are β-smooth. Refused: private rows (adding a row can move
MIN/MAX by the whole range; no combined §3.3.9 bound for MIN/MAX).

β: the bounds depend on β through the smoothing floors; Postgres evaluates them at the user's β, or on a fixed
grid in one scan per use, and ``finish(β)`` takes the largest grid point β′ ≤ β (a β′-smooth bound is
β-smooth, NR Def. 3.56); the release step's β optimisation tries these grid points too.

Combined (§3.3.9.3, "Combined sensitivity w.r.t. multiple tables"), when the policy also protects rows:

    c = max(c1, max_i c2_i),  c2_i = max(ĉ0_i, max_{j≠i} e^(−βG_j)·(ĉ0_i + c3_i·c4_j)),  ĉ0_i = c3_i·c4_i

with c1 the row-level bound (:mod:`sqldp.sensitivity.rows`) and c4_j the smoothed count derivative of adding
a row to table j, both computed with the private conjuncts dropped (so they do not depend on sensitive
values, §3.3.9.3), and c3_i the data-independent maximum of D_i over the declared ranges. NR's c2 uses the
value-level bound c0_i in place of ĉ0_i; c0_i reads the rows and jumps additively when one is added, so that
c2 is not β-smooth in the combined metric (tests/sensitivity/test_combined_oracle.py found databases where it is not).
ĉ0_i ≥ Σ_{r ∋ t} D_i(r) for every row t (at most c4_i product rows contain t, each with D_i ≤ c3_i), does not
move when values change and is β-smooth under row changes; NR's e^(−βG_i)·c3_i·c4_i term is below it.

Speed: when the equalities of the public filter fix a primary key of every other use, starting from use i
(a foreign key chain such as lineitem → orders → customer), each row of use i is in at most one product row,
so Σ_{r ∋ t} D_i(r) = max_{r ∋ t} D_i(r) and the per-use query is a MAX over the join with no GROUP BY.
For COUNT (constant D), key columns left free but bounded by the policy multiply that count instead
(:func:`_fanout`). The maxima themselves are reduced to a few aggregates (:func:`_extreme_query`). A SUM
whose private step filters vanish outside a window of one column weighs each row by its distance to the
window and reads only the rows near it (:class:`_Window`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlglot import exp

from sqldp import subqueries
from sqldp.catalog import Catalog
from sqldp.errors import RefusedError, about
from sqldp.form import Aggregate, AnalysisForm, ColumnRef, Conjunct, TableUse
from sqldp.groups import EXTRACT_FIELDS, date_key
from sqldp.policy import EPOCH, Norm, Policy
from sqldp.sensitivity import failures, operators
from sqldp.sensitivity.expressions import RangeOps, SqlOps, bound, column_weights, dual, norm_separates
from sqldp.sensitivity.filters import Filter, approximate, column_sql, combine_supports, envelope
from sqldp.sensitivity.intervals import Domain, clamp_columns, domain, interval
from sqldp.sensitivity.plan import Bound, Releasable, Rows
from sqldp.sensitivity.rows import RowPlan, plan_rows
from sqldp.sqlgen import from_uses, where

# β values evaluated in SQL; finish(β) uses the largest one ≤ β. 0.1 is NR Table 17's β.
BETA_GRID: tuple[float, ...] = (1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
REFERENCE_BETA = 0.1  # the per-column breakdown in the JSON is evaluated at this β


@dataclass(frozen=True)
class _UseQuery:
    alias: str
    table: str
    query: int  # index into ColumnPlan.queries
    grid_cols: tuple[int, ...]  # per grid β: the column of the query's single row
    column_cols: dict[str, int]  # per sensitive column: its dual-scaled term at REFERENCE_BETA
    caps: tuple[float, ...] = ()  # per grid β: a bound for the rows the scan leaves out (_Window), else none


@dataclass(frozen=True)
class ColumnPlan(Releasable):
    """Value-level (and optionally combined) plan; follows the contract of :mod:`sqldp.sensitivity`."""

    form: AnalysisForm
    aggregate: Aggregate
    conjuncts: tuple[Conjunct, ...]  # the answer query's WHERE (private sigmoid conjuncts moved into q_m)
    value_queries: tuple[exp.Select, ...]
    uses: tuple[_UseQuery, ...]
    tables_info: dict[str, dict[str, Any]]
    row_plan: RowPlan | None = None  # c1 (combined only)
    count_plan: RowPlan | None = None  # c4 (combined only)
    c3: dict[str, float] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)  # row-private table → G
    grid: tuple[float, ...] = BETA_GRID  # the β values the queries evaluate
    reference_beta: float = REFERENCE_BETA  # the β of the per-column breakdown
    disjoint_groups: bool = False
    key_moves: bool = False  # a group key reads a value-sensitive date (EXTRACT(YEAR FROM d), _group_slopes)
    # per value query: True when it is ``SELECT <aggregate expressions> FROM <the form's uses> WHERE
    # <scan_conjuncts>`` with one result row, so the rewriter may compute its items inside the answer query's
    # scan (the answer's WHERE adds conjuncts to these, which then become FILTER clauses)
    inline: tuple[bool, ...] = ()
    # per value query: True when it is ``SELECT MAX(s0) AS v0, … FROM (SELECT SUM(…) AS s0, … FROM <the form's
    # uses> WHERE <scan_conjuncts> GROUP BY <keys>) AS per_row``, so the rewriter may compute the answer per group
    grouped_scan: tuple[bool, ...] = ()
    scan_conjuncts: tuple[Conjunct, ...] = ()
    # q_m and q_s are read from the data (NR §3.3.8); the combined bound can be global (_data_independent)
    data_independent: bool = False
    # subqueries whose answer moves with a sensitive value (docs/subqueries.md, "Under value-level privacy"):
    # per semi-join, its per-row factor; their per-key counts of outer rows come from ``semi_plan``
    subquery_terms: tuple[SubqueryTerm, ...] = ()
    semi_plan: RowPlan | None = None

    @property
    def change_distances(self) -> frozenset[float]:
        """The distances of the neighbouring changes that move this aggregate: a change of a sensitive value is at
        its norm's distance, which has no bound (∞), besides the row-private tables' weights."""
        return frozenset({math.inf, *self.weights.values()}) if self.tables_info else frozenset(self.weights.values())

    @property
    def queries(self) -> tuple[exp.Select, ...]:
        out = list(self.value_queries)
        for p in (self.row_plan, self.count_plan, self.semi_plan):
            if p is not None:
                out.extend(p.queries)
        return tuple(out)

    @property
    def query_count(self) -> int:
        """``len(self.queries)`` without building the row plans' statements (the runner asks it at every run)."""
        plans = (self.row_plan, self.count_plan, self.semi_plan)
        return len(self.value_queries) + sum(p.query_count for p in plans if p is not None)

    def grid_index(self, beta: float) -> int | None:
        """The largest grid point β′ ≤ β, whose bound is used at β (a β′-smooth bound is β-smooth)."""
        return max((k for k, b in enumerate(self.grid) if b <= beta * (1 + 1e-12)), default=None)

    def value_bounds(self, results: Sequence[Rows], beta: float) -> dict[str, float]:
        """c0 per value-sensitive table at β (NR §3.3.8.2: uses of one table add up)."""
        idx = self.grid_index(beta)
        out: dict[str, float] = {t: 0.0 for t in self.tables_info}
        for u in self.uses:
            if idx is None:
                out[u.table] = math.inf
                continue
            v = results[u.query][0][u.grid_cols[idx]] if results[u.query] else None
            out[u.table] += max(float(v or 0.0), u.caps[idx] if u.caps else 0.0)
        return out

    def bind(self, results: Sequence[Rows]) -> Callable[[float], Bound]:
        """The bound as a function of β; the row-level parts (§3.3.9: c1 and c4) read their results once."""
        n = len(self.value_queries)
        row_at = count_at = semi_at = None
        if self.row_plan is not None and self.count_plan is not None:
            k = self.row_plan.query_count
            row_at = self.row_plan.bind(results[n : n + k])
            n += k
            k = self.count_plan.query_count
            count_at = self.count_plan.bind(results[n : n + k])
            n += k
        if self.semi_plan is not None:
            semi_at = self.semi_plan.bind(results[n : n + self.semi_plan.query_count])

        # without the row-level parts the bound is constant between grid points: the β search asks ≈ 60 βs
        cache: dict[int | None, Bound] = {}

        def subqueries(beta: float) -> tuple[dict[str, float], dict[str, float], dict[str, Any]]:
            """Per table, Σ over its subqueries of factor × (smoothed outer rows per key), Σ of the factors,
            and the JSON of each term (docs/subqueries.md, "Under value-level privacy")."""
            total: dict[str, float] = {}
            factors: dict[str, float] = {}
            shown: dict[str, Any] = {}
            if semi_at is None:
                return total, factors, shown
            counts = semi_at(beta).tables
            for term in self.subquery_terms:
                outer_rows = _outer_rows(counts, term)
                total[term.table] = total.get(term.table, 0.0) + term.factor * outer_rows
                factors[term.table] = factors.get(term.table, 0.0) + term.factor
                shown.setdefault(term.table, {})[term.alias] = {
                    "source": term.source,
                    "step_columns": list(term.columns),
                    "per_row": term.factor,
                    "outer_rows_per_key": outer_rows,
                    "bound": term.factor * outer_rows,
                }
            return total, factors, shown

        def at(beta: float) -> Bound:
            if self.data_independent:
                # the bound (c1 and c3·c4) is the same at every β; the data-dependent c0 and column terms are
                # shown (audit only) at the reference β, where the grid has them
                if None not in cache:
                    cache[None] = evaluate(self.reference_beta)
                return cache[None]
            if row_at is None and semi_at is None:
                idx = self.grid_index(beta)
                if idx not in cache:
                    cache[idx] = evaluate(beta)
                return cache[idx]
            return evaluate(beta)

        def evaluate(beta: float) -> Bound:
            c0 = self.value_bounds(results, beta)
            sub, sub_factors, sub_shown = subqueries(beta)
            for t, extra in sub.items():  # the uses of a table add up, the subquery's among them
                c0[t] = c0.get(t, 0.0) + extra
            tables: dict[str, Any] = {}
            for t, info in self.tables_info.items():
                cols: dict[str, float] = {}
                for u in self.uses:
                    if u.table != t:
                        continue
                    for col, k in u.column_cols.items():
                        v = results[u.query][0][k] if results[u.query] else None
                        cols[col] = cols.get(col, 0.0) + float(v or 0.0)
                tables[t] = dict(info)
                if any(u.table == t for u in self.uses):  # c0 is not read for a global bound (plan_columns)
                    tables[t].update(
                        value_sensitivity=c0[t], column_terms={"at_beta": self.reference_beta, "terms": cols}
                    )
                if t in sub_shown:
                    tables[t]["subqueries"] = sub_shown[t]
            best = max(c0.values(), default=0.0)
            if row_at is not None and count_at is not None:
                row_bound = row_at(beta)
                c4 = {t: float(v["smooth_derivative"]) for t, v in count_at(beta).tables.items()}
                c2: dict[str, float] = {}
                for i in c0:
                    # c0_i reads the data and jumps when a row is added (a new row, or new product rows with
                    # an existing one), so it is not β-smooth in the combined metric; c3_i·c4_i is: it bounds
                    # Σ_{r ∋ t} D_i(r) ≤ #{r ∋ t}·max D_i, does not move with values, and c4_i is β-smooth
                    # under row changes (tests/sensitivity/test_combined_oracle.py found the jump)
                    # a subquery's term (factor × smoothed outer rows per key) is data-independent per row as
                    # c3_i is, and a new row of j adds at most c4_j outer rows to one key: it joins both terms
                    c3_i, c4_i = self.c3.get(i, 0.0), c4.get(i, 0.0)
                    c0_i = c3_i * c4_i + sub.get(i, 0.0)
                    terms = [c0_i]
                    for j, g_j in self.weights.items():
                        # a global c4 bounds #{r ∋ t} on every database, so a row added to j cannot raise
                        # ĉ0_i: no growth term (and no β) in a data-independent bound (see _data_independent)
                        if j != i and not self.data_independent:
                            reach = (c3_i + sub_factors.get(i, 0.0)) * c4.get(j, 0.0)
                            terms.append(math.exp(-beta * g_j) * (c0_i + reach))
                    c2[i] = max(terms)
                    tables[i]["combined_sensitivity"] = c2[i]
                    tables[i]["c3"] = c3_i
                    tables[i]["c4"] = c4_i
                for t, v in row_bound.tables.items():
                    tables.setdefault(t, {})["rows"] = v
                best = max([row_bound.sensitivity, *c2.values()])
            return Bound(best, tables)

        return at

    def finish(self, results: Sequence[Rows], beta: float) -> Bound:
        return self.bind(results)(beta)


def _norm(policy: Policy, table: str) -> Norm:
    """The norm of a value-sensitive table (only those are analysed at value level)."""
    norm = policy.table(table).norm
    assert norm is not None, f"{table} has no norm"
    return norm


def grain(type_sql: str, kind: str) -> float | None:
    """The smallest change of a value of the type: 1 for integers and dates (a day), 10^-s for DECIMAL(p, s);
    None where a value can change by arbitrarily little."""
    if kind in ("integer", "date"):
        return 1.0
    if kind == "numeric" and "(" in type_sql and type_sql.upper().startswith(("DECIMAL", "NUMERIC")):
        args = type_sql[type_sql.index("(") + 1 : type_sql.rindex(")")].split(",")
        scale = int(args[1]) if len(args) > 1 else 0
        return 10.0**-scale
    return None


@dataclass(frozen=True)
class _Scope:
    """What every step of :func:`plan_columns` reads: the form, the catalog, the policy, the declared value
    domain and each value-sensitive table's norm weights."""

    form: AnalysisForm
    catalog: Catalog
    policy: Policy
    dom: Domain
    weights_of: dict[str, dict[str, float]]

    @classmethod
    def of(cls, form: AnalysisForm, catalog: Catalog, policy: Policy) -> _Scope:
        tables = dict.fromkeys([*form.tables, *(s.use.table for s in form.semijoins)])
        weights_of = {t: column_weights(norm) for t in tables if (norm := policy.table(t).norm) is not None}
        return cls(form, catalog, policy, domain(form, catalog, policy), weights_of)

    def weight(self, ref: ColumnRef) -> float | None:
        """The column's weight in its table's norm; None for a column whose values are not private."""
        return self.weights_of.get(self.form.use(ref.alias).table, {}).get(ref.column)

    def separated(self, first: frozenset[ColumnRef], second: frozenset[ColumnRef]) -> bool:
        """Whether no table's norm entangles the two column sets (NR §3.3.8.2: tables, and rows, combine with
        ℓ1 in the metric, so only columns of one table can be entangled; the uses of a self-joined table are
        the same rows, hence compared by column name)."""
        use = self.form.use
        for t in {use(r.alias).table for r in first} & {use(r.alias).table for r in second}:
            a = {r.column for r in first if use(r.alias).table == t}
            b = {r.column for r in second if use(r.alias).table == t}
            if not norm_separates(_norm(self.policy, t), a, b):
                return False
        return True

    def info(self, ref: ColumnRef) -> tuple[str, float | None, float, bool]:
        """A filter column's kind, grain, days per unit (dates) and whether its values are private."""
        table = self.form.use(ref.alias).table
        col = self.catalog.table(table).column(ref.column)
        dpu = self.policy.table(table).column(ref.column).days_per_unit if col.kind == "date" else 1.0
        return col.kind, grain(col.type_sql, col.kind), dpu, self.weight(ref) is not None

    def span(self, ref: ColumnRef) -> float | None:
        """The width of a column's declared range (days for a DATE; None without one): it bounds the width
        of a private filter's ramp (:func:`sqldp.sensitivity.filters.ramp_width`)."""
        r = self.dom.range(ref)
        return None if r is None else r[1] - r[0]

    def distinct(self, ref: ColumnRef) -> float:
        """How many values |ref| can take by the policy (a domain, or a range on the type's grid); only
        chooses how a maximum is computed, never what it is."""
        table = self.form.use(ref.alias).table
        cp = self.policy.table(table).column(ref.column)
        if cp.domain is not None:
            return float(len(cp.domain))
        col = self.catalog.table(table).column(ref.column)
        step = grain(col.type_sql, col.kind)
        if cp.range is None or step is None:
            return math.inf
        return (cp.range[1] - cp.range[0]) / step + 1

    def bounded(self, u: TableUse, col: str) -> tuple[float, exp.Expr] | None:
        """A free key column's number of values, and the conjunct that keeps it in them (public columns)."""
        if self.weight(ColumnRef(u.alias, col)) is not None:
            return None
        if self.catalog.table(u.table).column(col).kind != "integer":
            return None
        cp = self.policy.table(u.table).column(col)
        ref = exp.column(col, table=u.alias)
        if cp.domain is not None and all(isinstance(v, int) for v in cp.domain):
            values = [exp.Literal.number(v) for v in cp.domain]
            return float(len(set(cp.domain))), exp.In(this=ref, expressions=values)
        if cp.range is not None:
            lo, hi = math.ceil(cp.range[0]), math.floor(cp.range[1])
            cond = exp.Between(this=ref, low=exp.Literal.number(lo), high=exp.Literal.number(hi))
            return float(max(hi - lo + 1, 0)), cond
        return None


def plan_columns(form: AnalysisForm, catalog: Catalog, policy: Policy, beta: float | None = None) -> ColumnPlan:
    """The value-level plan (NR §3.3.8), combined with the row-level one (NR §3.3.9) when rows are private.

    ``beta``: the β the user fixed, if any; the queries then evaluate the bound at that β only, instead of on
    the whole grid (each grid point is one more expression per row of the scan)."""
    grid = (beta,) if beta is not None and beta > 0 else BETA_GRID
    reference = grid[0] if len(grid) == 1 else REFERENCE_BETA
    if len(form.aggregates) != 1:
        raise ValueError("plan_columns takes a form with one aggregate")
    agg = form.aggregates[0]
    _check_aggregate(form, catalog, agg)
    scope = _Scope.of(form, catalog, policy)
    shift = _extremum_shift(scope, agg)
    private = [c for c in form.conjuncts if c.private]
    _check_steps(scope, agg, private)
    public = [c for c in form.conjuncts if not c.private] + _envelopes(scope, private)
    filters = [(c, approximate(c.expr, scope.info, scope.span)) for c in private]
    if agg.distinct:
        check_distinct(agg, filters)
    slopes: dict[ColumnRef, float] = _group_slopes(scope)
    key_moves = bool(slopes)  # only the group keys' slopes so far
    for _, f in filters:
        for k, v in f.slopes.items():
            slopes[k] = max(slopes.get(k, 0.0), v)
    steps = _subquery_steps(scope, agg)
    for st in steps:  # a decorrelated comparison's outer side: a step of the outer row's own indicator
        for ref in st.outer:
            slopes[ref] = max(slopes.get(ref, 0.0), _step_slope(scope, ref, st.semi.source))
    stepped = [st for st in steps if st.inner]
    base_public = list(public)  # before the fan-out and window conjuncts: what the subqueries' counts read

    row_private = sorted({u.table for u in form.uses if policy.table(u.table).rows_private})
    # a subquery's table with private rows: a row added to it moves D (the row analysis's term, NR §3.3.9)
    row_private = sorted({*row_private, *subqueries.private_tables(form, policy)})
    combined = bool(row_private)
    row_plan = count_plan = None
    arg = None if agg.arg is None else failures.cap_exponentials(agg.arg)  # EXP must not overflow on the data
    if combined:
        public_form = dataclasses.replace(form, conjuncts=tuple(public))
        row_plan = plan_rows(public_form, catalog, policy)  # c1: no sensitive value read (NR §3.3.9.3)
    if agg.kind == "sum" and (combined or stepped):
        # a subquery's term bounds each outer row's weight by max |e| over the declared ranges: clamped, that
        # holds for any data (as under row privacy)
        assert arg is not None
        arg = clamp_columns(arg, scope.dom)
    released, hard = _released(agg, arg, filters, shift)
    value_tables = sorted(
        {form.use(r.alias).table for r in set(slopes) | {r for r in agg.columns if scope.weight(r) is not None}}
    )
    if combined:
        count_plan = _count_plan(scope, public, value_tables)  # c4

    # COUNT's per-row bounds are constants: a key-bounded fan-out replaces the GROUP BY per row of a use
    # (TPC-H Q4: an order has at most 7 lines, (l_orderkey, l_linenumber) being lineitem's key and
    # l_linenumber in [1, 7]); the conjuncts that keep the free key columns in range join the WHERE first
    # (_fanout reads only the equalities, so the range conjuncts added here do not change its answers)
    fanout_bound = scope.bounded if agg.kind == "count" and not combined else None
    fans = {
        u.alias: _fanout(form, u.alias, public, catalog, fanout_bound) for t in value_tables for u in form.uses_of(t)
    }
    for fan in fans.values():
        _add_public(public, fan[1] if fan is not None else [])
    window = None
    if agg.kind == "sum" and not combined and arg is not None:
        support = combine_supports("and", [f.support for _, f in filters])
        # the window's cap bounds the rows it does not scan by max D over the declared ranges, which holds
        # only for data inside them: with a window the summed columns are clamped to their ranges, as SUM's
        # are under row privacy (NULLs kept, intervals.clamp_columns); the per-column parts read the clamped
        # ``arg``, so the caps and the per-row bounds below are those of the clamped function that is released
        clamped = clamp_columns(arg, scope.dom)
        window = _window(
            form,
            catalog,
            policy,
            support,
            value_tables,
            public,
            grid,
            reference,
            sensitive=scope.weight,
            separated=scope.separated,
            info=scope.info,
            bounded=scope.bounded,
            parts_for=functools.partial(_parts, scope, agg, clamped, slopes, shift),
            arg=clamped,
        )
        if window is not None:
            arg = clamped
            released, hard = _released(agg, arg, filters, shift)
    kept = tuple(public) + hard  # the answer's WHERE (private sigmoid conjuncts moved into q_m)
    parts = functools.partial(_parts, scope, agg, arg, slopes, shift)

    queries: list[exp.Select] = []
    inline: list[bool] = []
    grouped: list[bool] = []
    uses: list[_UseQuery] = []
    tables_info: dict[str, dict[str, Any]] = {}
    c3: dict[str, float] = {}
    # a global combined bound max(c1, c3·c4) reads no value query: c0 would be shown (audit) and nothing else,
    # so its scans, which read the whole product per row (TPC-H Q10's 1.5 s of per-order sums at SF 0.1), go
    independent = _data_independent(row_plan, count_plan, stepped, key_moves)
    for t in value_tables:
        tables_info[t] = _table_info(scope, t, agg, slopes)
        if window is not None:
            tables_info[t]["window"] = window.to_json(grid, reference)
        if agg.kind in ("min", "max") and slopes:
            tables_info[t]["filtered_out_shift"] = shift
        if combined:
            c3[t] = _global_dual(scope, t, parts)
        for u in () if independent else form.uses_of(t):
            query, flat, per_group, use = _use_query(
                scope, u, agg, public, grid, reference, parts, fans[u.alias], window, len(queries)
            )
            queries.append(query)
            inline.append(flat)
            grouped.append(per_group)
            uses.append(use)

    subquery_terms: list[SubqueryTerm] = []
    semi_plan = None
    if stepped:
        weight = 1.0
        if agg.kind == "sum":
            assert arg is not None
            lo, hi = interval(arg, scope.dom, f"{agg.sql} with a subquery under value-level privacy (max |e| per row)")
            weight = max(abs(lo), abs(hi))
        for st in stepped:
            t = st.semi.use.table
            per_column = {r.column: _step_slope(scope, r, st.semi.source) for r in sorted(st.inner, key=str)}
            factor = weight * float(dual(_norm(policy, t), per_column, "float") or 0.0)
            subquery_terms.append(SubqueryTerm(t, st.semi.use.alias, st.semi.source, factor, tuple(per_column)))
            if t not in tables_info:
                tables_info[t] = _table_info(scope, t, agg, slopes)
        semi_plan = _semi_plan(scope, base_public, stepped)
    if form.semijoins:  # the answer's scan joins the derived tables: the bounds keep their own scans
        inline = [False] * len(inline)
        grouped = [False] * len(grouped)

    return ColumnPlan(
        data_independent=independent,
        form=form,
        aggregate=released,
        conjuncts=tuple(kept),
        value_queries=tuple(queries),
        uses=tuple(uses),
        tables_info=tables_info,
        row_plan=row_plan,
        count_plan=count_plan,
        c3=c3,
        weights={t: policy.table(t).weight for t in row_private},
        grid=grid,
        reference_beta=reference,
        inline=tuple(inline),
        grouped_scan=tuple(grouped),
        scan_conjuncts=tuple(public),
        key_moves=key_moves,
        subquery_terms=tuple(subquery_terms),
        semi_plan=semi_plan,
    )


def _data_independent(
    row_plan: RowPlan | None, count_plan: RowPlan | None, stepped: Sequence[Any], key_moves: bool
) -> bool:
    """Whether the combined bound c = max(c1, max_i c3_i·c4_i) is a global sensitivity (NR §3.3.9.3 with
    constant parts), so that the release adds Laplace noise at c/ε (Dwork, McSherry, Nissim and Smith, TCC
    2006) instead of smoothing a constant, where generalized Cauchy costs c/(ε/(γ + 1) − β) ≥ 5c/ε.

    It is when c1 and c4 are (``RowPlan.data_independent``: every derivative counts public rows only, the
    same on every database that differs in private rows or values), there is no subquery term (its smoothed
    outer rows per key read private rows) and no group key reads a sensitive value. Then, on every database:

    * adding or removing a row of T moves the answer by at most c1 (the row-level bound, of the function
      with the private filters dropped: |e·s| ≤ |e| for s ∈ [0, 1], e clamped to its declared ranges);
    * a value change of row t of T_i at distance d moves it by at most d·Σ_{r ∋ t} D_i(r) ≤ d·c4_i·c3_i: c3_i
      bounds D_i over the declared ranges (the summed columns are clamped to them), and c4_i, a global bound
      of the count's derivative, bounds #{r ∋ t} on every database along the change's path, which moves no
      key;
    * over the groups of a GROUP BY on public keys, each product row is in one group that the change does not
      move, so both bounds cover the ℓ1 norm of the histogram's change (the global bound's whole share,
      ``sqldp.release.shares``). A key on a sensitive date moves rows between groups: not global here.

    Decided from the query's shape and the policy only, never from the data."""
    return (
        row_plan is not None
        and count_plan is not None
        and row_plan.data_independent
        and count_plan.data_independent
        and not stepped
        and not key_moves
    )


@dataclass(frozen=True)
class SubqueryTerm:
    """A semi-join (or decorrelated scalar subquery) whose answer moves with sensitive values of its table:
    a change of one of ``columns`` in one row of ``table`` by one step of its grid moves the subquery's
    answer for that row's key only, flipping at most the outer rows with that key, each worth at most max |e|;
    ``factor`` is max |e| times the dual norm of the per-column steps (1/grain), the per-row bound per outer
    row (docs/subqueries.md, "Under value-level privacy")."""

    table: str
    alias: str  # the semi-join's use (D's alias)
    source: str
    factor: float
    columns: tuple[str, ...]


def _outer_rows(counts: dict[str, Any], term: SubqueryTerm) -> float:
    """The smoothed count of outer rows one row of the term's derived table meets (the row plan's term)."""
    return float(counts[term.table]["derived_tables"][term.alias])


def _subquery_steps(scope: _Scope, agg: Aggregate) -> tuple[subqueries.ValueSteps, ...]:
    """The semi-joins' value-sensitive reads (refused where a correlation reads one), after the checks that
    only COUNT and SUM are analysed with subqueries here."""
    form = scope.form
    if not form.semijoins:
        return ()
    if agg.kind not in ("count", "sum"):
        s = form.semijoins[0]
        raise RefusedError(
            f"{agg.sql} with {s.source} (SELECT … FROM {s.use.table}) is not analysed under value-level privacy: "
            "the subquery's argument (docs/subqueries.md) bounds COUNT and SUM, whose outer rows add up",
            where=s.where,
        )
    return subqueries.value_steps(form, lambda r: scope.weight(r) is not None)


def _step_slope(scope: _Scope, ref: ColumnRef, source: str) -> float:
    """The slope, per unit of the norm, of a step in ``ref`` on its grid (NR §3.3.8.5): an indicator moves by
    at most 1 per step of one grain, so 1/grain (a DATE: days per unit, its grain being one day); refused
    for a column without a grid (a change below any bound could flip it)."""
    kind, grain, days_per_unit, _ = scope.info(ref)
    if grain is None:
        raise RefusedError(
            f"{source} (SELECT …) compares value-sensitive {ref} by a step, and its type has no grid (an "
            "integer, DATE or NUMERIC(p, s) column): an arbitrarily small change could flip it (NR §3.3.8.5)"
        )
    return days_per_unit if kind == "date" else 1.0 / grain


def _semi_plan(scope: _Scope, public: Sequence[Conjunct], stepped: Sequence[subqueries.ValueSteps]) -> RowPlan:
    """Per semi-join, the smoothed count of the outer rows one row of its derived table meets (the row
    analysis's derived-table term, rows.semi_term: the outer query with its public conjuncts, joined with D
    by the correlation's equalities): a value-independent count, β-smooth when rows are private too. The
    subquery's table is treated as having private rows for this count only."""
    policy = scope.policy
    tables = {st.semi.use.table for st in stepped}
    count_policy = dataclasses.replace(
        policy,
        tables={**policy.tables, **{t: dataclasses.replace(policy.table(t), rows_private=True) for t in tables}},
    )
    count_form = dataclasses.replace(
        scope.form,
        conjuncts=tuple(public),
        aggregates=(Aggregate("count", None),),
        semijoins=tuple(st.semi for st in stepped),
    )
    return plan_rows(count_form, scope.catalog, count_policy)


def _check_aggregate(form: AnalysisForm, catalog: Catalog, agg: Aggregate) -> None:
    """COUNT, SUM, MIN and MAX are analysed (NR §3.3.8.3), over numbers: the bound's SQL (ABS, the Δ shift,
    the noise) is arithmetic on numbers, not on DATE values."""
    if agg.kind not in ("count", "sum", "min", "max"):
        raise RefusedError(f"{agg.sql}: aggregate {agg.kind.upper()} is not supported under value-level privacy")
    if agg.kind == "count" or agg.arg is None:
        return
    dated = sorted(
        {
            c.sql(dialect="postgres")
            for c in agg.arg.find_all(exp.Column)
            if c.table and catalog.table(form.use(c.table).table).column(c.name).kind == "date"
        }
    )
    if dated:
        raise RefusedError(
            f"{agg.sql}: {agg.kind.upper()} over DATE values ({', '.join(dated)}) is not implemented under "
            "value-level privacy (dates are analysed as days in filters only)"
        )


def check_distinct(agg: Aggregate, filters: Sequence[tuple[Conjunct, Filter]]) -> None:
    """COUNT(DISTINCT e) under value-level privacy, e reading no column of any norm
    (:func:`sqldp.sensitivity.plan` refuses the others): analysed as COUNT(e), whose bounds hold for it.
    Refused here when a private filter is not an exact step (its released function would not be the count).

    Proof. Write the function the analyses bound for COUNT(e) in group g as F_g = Σ_r w_r, over the product
    rows r passing the public conjuncts, with w_r = m(r)·s(r) for e(r) not NULL: m(r) the product of its rows'
    multiplicities (NR §3.3.7.3; semi- and anti-joins as the row analysis models them), s(r) ∈ [0, 1] the
    private filters' continuous approximation and the group key's step (NR §3.3.8.4; AND = min, a key on a
    sensitive value is one more step, :func:`_group_slopes`). Define

        C_g = Σ_v min(1, max_{r: e(r) = v} w_r)        (v over e's non-NULL values).

    (a) It is the released answer. e reads no value in a norm, so the partition of the product rows by e(r)
    does not move under value changes (NR §3.3.8.2: only the norm's columns move), and a row enters or leaves
    a class only with its multiplicity. On a database the multiplicities are integers and the values lie on
    their grids, where every filter and key step here is exact (equal to its indicator; a soft one is refused
    below): w_r ∈ {0} ∪ [1, ∞), so min(1, max) is 1 exactly when some row with e = v passes, and C_g is
    COUNT(DISTINCT e) in g — what the answer query computes, its exact step conjuncts in its WHERE.

    (b) Its derivatives are dominated by F_g's. C_g is a finite composition of min, max and the w_r (products
    of multiplicities and ramps), locally Lipschitz, so along any path of the metric its one-sided derivative
    exists almost everywhere and is that of an active piece: |dC_g| ≤ Σ_v |dw_{r*(v)}| ≤ Σ_r |dw_r| for one
    maximising row r*(v) per value (min(1, ·) only sets some terms to 0). Per coordinate z (a multiplicity or a
    sensitive value of one row t), |∂C_g/∂z| ≤ Σ_{r ∋ t} |∂w_r/∂z|, and over the groups Σ_g |∂C_g/∂z| ≤
    Σ_g Σ_{r ∈ g, r ∋ t} |∂w_r/∂z|. These sums of per-product-row absolute derivatives are what every bound
    of COUNT(e) here bounds: NR §3.3.8.2's Σ_{r ∋ t} D_i(r), D_i the dual norm (monotone in the components'
    absolute values, Lemmas 3.64–3.66) of per-column bounds of |∂w_r|; the row analysis's counts of product
    rows containing t (§3.3.7.3, a multilinear polynomial with non-negative terms) and of outer rows one
    derived row flips (semi-joins); and the combined c of §3.3.9.3 built from them. So each of those bounds,
    global or β-smooth, bounds C_g's derivative sensitivity, per group and in ℓ1 over the groups
    (:func:`sqldp.release.dilated`; twice when a key moves a row between groups, as for COUNT).

    (c) The mechanisms. NR Theorem 3.53's (and 3.56's) proof integrates |dC_g| along a path between neighbours
    and uses only the bound of (b) and the β-smoothness of the bound, which is COUNT(e)'s own: it applies to
    C_g as it applies to the ramps (min/max of linear pieces, NR §3.3.8.5) and to MIN/MAX (§3.3.8.3 "Min /
    max") that the analysis already releases. For a discrete neighbour (a row added or removed, a value moved
    by any amount) (b) integrates to |ΔC_g| ≤ Σ_r |Δw_r|: each product row a neighbour adds or removes moves
    the distinct count by at most 1, as the row-level argument for COUNT(DISTINCT) has it (sqldp.sensitivity).

    A soft filter (a sigmoid, or a ramp wider than its grid) is in (0, 1) on some databases, where C_g is not
    COUNT(DISTINCT e) (it is Σ_v max s, which the released query does not compute): refused."""
    soft = [c for c, f in filters if not f.exact]
    if soft:
        raise RefusedError(
            f"{agg.sql} under value-level privacy needs every private filter to be an exact step on its grid "
            f"(an integer, a date, a narrow NUMERIC(p, s) range; docs/columns.md); "
            f"{soft[0].expr.sql(dialect='postgres')} is approximated continuously, and a distinct count of "
            "weighted rows is not the count the query computes"
        )


def _extremum_shift(scope: _Scope, agg: Aggregate) -> float:
    """MIN/MAX with a private filter: the Δ of NR §3.3.8.4 (f + (1 − σ)·Δ), from the declared ranges; 0 for
    other aggregates. MIN/MAX over private rows is refused (NR §3.3.9 covers COUNT, SUM and AVG only)."""
    if agg.kind not in ("min", "max"):
        return 0.0
    shift = 0.0
    if any(c.private for c in scope.form.conjuncts):
        assert agg.arg is not None
        lo, hi = interval(
            agg.arg,
            scope.dom,
            f"{agg.sql} with a filter on a value-sensitive column (NR §3.3.8.4, the Δ of f + (1 − σ)·Δ)",
        )
        shift = hi - lo
    # NR §3.3.9: adding or removing a row can move MIN/MAX by the whole range of the expression
    hidden_rows = sorted({u.table for u in scope.form.uses if scope.policy.table(u.table).rows_private})
    if hidden_rows:
        raise RefusedError(
            f"{agg.sql}: MIN/MAX over a table with private rows ({', '.join(hidden_rows)}) is not implemented: "
            "adding a row can move MIN/MAX by the whole range, and the combined bound (NR §3.3.9) covers "
            "COUNT, SUM and AVG only"
        )
    return shift


def _group_slopes(scope: _Scope) -> dict[ColumnRef, float]:
    """The slopes the group keys add, per value-sensitive column they read (NR §3.3.8.4, §3.3.8.5).

    A key that reads a value-sensitive column is allowed when it is ``EXTRACT(YEAR FROM d)`` of a DATE column
    d (:func:`sqldp.groups.date_key`; another calendar field, :func:`_calendar_field`, makes g a union of such
    intervals, with the same slope): group g is then the rows whose d lies in one year [a_g, b_g), and its
    answer is the aggregate with the filter ``d >= a_g AND d < b_g`` added, an exact step filter on the
    one-day grid of dates (min of two ramps of slope 1 per day, equal to the indicator on every date, NR
    §3.3.8.5 "integer" steps). Its slope does not depend on g, so one plan bounds every group: per row, the
    derivative of e·min(s, s_g) w.r.t. d is at most d_d(e) + ub(e)·max(slope_d(s), 1 day⁻¹) — the rule of a
    private AND (min), which is what adding this slope to the others' maxima computes. A changed d moves a
    row between two groups, so the groups are not disjoint (each released group gets its share of ε over the
    groups, NR §3.3.10.4); the key domain comes from d's declared range (:mod:`sqldp.groups`). Other keys over
    value-sensitive columns are refused."""
    out: dict[ColumnRef, float] = {}
    for g in scope.form.group_by:
        of_day = date_key(g) is not None or _calendar_field(g)
        refs = [ColumnRef(c.table, c.name) for c in g.find_all(exp.Column) if c.table]
        for ref in refs:
            if scope.weight(ref) is None:
                continue
            kind, _, days_per_unit, _ = scope.info(ref)
            if not of_day and _integer_key(scope, g, ref):
                # group v is the rows with k = v: the exact step 1 − min(1, |k − v|) on the integer grid (NR
                # §3.3.8.5), slope 1 per unit of k whatever v is (see _integer_key)
                out[ref] = max(out.get(ref, 0.0), 1.0)
                continue
            if not of_day or kind != "date":
                raise about(
                    g,
                    RefusedError(
                        f"GROUP BY {g.sql(dialect='postgres')} reads value-sensitive column {ref}; groups would "
                        "leak it (only EXTRACT(field FROM d), date_trunc('year' | 'month', d) of a DATE column d "
                        "are analysed, as exact step filters on d's one-day grid, and for COUNT and SUM an INTEGER "
                        "column with a declared domain of integers, as an exact step per value)",
                    ),
                )
            # one day of change costs 1/days_per_unit in the norm: the step's slope per unit is days_per_unit
            out[ref] = max(out.get(ref, 0.0), days_per_unit)
    return out


def _calendar_field(key: exp.Expr) -> bool:
    """Whether a key is ``EXTRACT(f FROM d)`` for a calendar field f of :data:`sqldp.groups.EXTRACT_FIELDS`
    (month, quarter, day, day of week, day of year, week): like the year, a function of the day alone, so on
    the one-day grid of a DATE its group's indicator is a step filter of slope 1 per day — a union of day
    intervals (month m of every year) rather than one, which changes neither the slope nor the fact that a
    changed d moves a row between two groups only (the docstring of :func:`_group_slopes`)."""
    return (
        isinstance(key, exp.Extract)
        and key.this.name.upper() in EXTRACT_FIELDS
        and isinstance(key.expression, exp.Column)
        and bool(key.expression.table)
    )


def _integer_key(scope: _Scope, key: exp.Expr, ref: ColumnRef) -> bool:
    """Whether ``GROUP BY k`` of a value-sensitive column k is analysed as one exact step filter per group:
    k is the key itself, an INTEGER column, with a declared ``domain`` of integers (TPC-H Q16's p_size).

    The groups are the domain's values (:func:`sqldp.groups.key_domains`, never the data's), and group v's
    answer is the aggregate with the private filter ``k = v`` added. On the integer grid (grain 1, NR
    §3.3.8.5 "integer" steps) that filter is the ramp 1 − min(1, |k − v|), which equals the indicator on every
    integer k and v, so the answer the query computes is the continuous function's; its slope is 1 per unit
    of k for every v, so, as for a year of a date (above), one bound covers every group: the slope is added to
    the private filters' as one more AND (min) would be. A changed k moves a row from one group to another,
    so the groups are not disjoint (``key_moves``: each group its share of ε, or one histogram whose ℓ1 change
    is twice the bound, :func:`sqldp.release.dilated`). A non-integer declared value v would make the ramp
    0.5 at integers next to it, not the indicator: refused, as are keys without a declared domain. COUNT and
    SUM only: MIN/MAX release each group's extreme of its own rows with no step for the key (whether a group
    has a row at all would jump with k)."""
    if scope.form.aggregates[0].kind not in ("count", "sum"):
        return False
    if not isinstance(key, exp.Column) or ColumnRef(key.table, key.name) != ref:
        return False
    table = scope.form.use(ref.alias).table
    if scope.catalog.table(table).column(ref.column).kind != "integer":
        return False
    values = scope.policy.table(table).column(ref.column).domain
    return values is not None and all(isinstance(v, int) and not isinstance(v, bool) for v in values)


def _check_steps(scope: _Scope, agg: Aggregate, private: Sequence[Conjunct]) -> None:
    """NR §3.3.8 differentiates real functions; PostgreSQL's integer division and rounding casts are steps.
    In the aggregate they are refused where they read a sensitive column; in a private filter wherever they
    read a column, since its continuous approximation would not be the filter PostgreSQL evaluates."""
    kind = scope.dom.kind
    checks = [("aggregate", agg.arg, True)] if agg.arg is not None else []
    for part, e, sensitive_only in [*checks, *(("filter", c.expr, False) for c in private)]:
        for node in operators.steps(e, kind):
            refs = [ColumnRef(x.table, x.name) for x in node.find_all(exp.Column) if x.table]
            if not sensitive_only or any(scope.weight(r) is not None for r in refs):
                raise RefusedError(
                    f"{agg.sql}: under value-level privacy (NR §3.3.8, a continuous function of the sensitive "
                    f"values) the {part}'s {operators.describe(node, kind)}"
                )


def _envelopes(scope: _Scope, private: Sequence[Conjunct]) -> list[Conjunct]:
    """Public conjuncts implied by the private ones: a row outside a private filter's public envelope has
    s(r) = 0 for all values (NR §3.3.8.4), so the scan may drop it."""
    out = []
    for c in private:
        env = envelope(c.expr, scope.info)
        if env is not None:
            refs = frozenset(ColumnRef(x.table, x.name) for x in env.find_all(exp.Column) if x.table)
            out.append(Conjunct(env, refs, False))
    return out


def _released(
    agg: Aggregate, arg: exp.Expr | None, filters: Sequence[tuple[Conjunct, Filter]], shift: float
) -> tuple[Aggregate, tuple[Conjunct, ...]]:
    """The released aggregate q_m and the private conjuncts that stay in the answer's WHERE (NR §3.3.8.4).
    Exact step filters stay in WHERE (they equal the indicator on the grid), except under MIN/MAX, where a
    filtered-out row still enters as e ± Δ; smooth filters become the factor s(r) of the aggregate."""
    soft = [f for _, f in filters if not f.exact]
    if agg.kind in ("min", "max") and filters:
        sigma = [f.sql for _, f in filters]
        s_all = sigma[0] if len(sigma) == 1 else exp.Least(this=sigma[0], expressions=sigma[1:])
        out = exp.Mul(
            this=exp.Paren(this=exp.Sub(this=exp.Literal.number(1), expression=exp.Paren(this=s_all))),
            expression=exp.Literal.number(repr(shift)),
        )
        assert arg is not None
        shifted = (exp.Add if agg.kind == "min" else exp.Sub)(this=exp.Paren(this=arg.copy()), expression=out)
        return Aggregate(agg.kind, shifted, agg.columns), ()
    if soft:
        s_sql: exp.Expr = (
            soft[0].sql if len(soft) == 1 else exp.Least(this=soft[0].sql, expressions=[f.sql for f in soft[1:]])
        )
        body: exp.Expr
        if agg.kind == "count":
            body = s_sql
            if agg.arg is not None:
                body = exp.Case(
                    ifs=[exp.If(this=exp.Is(this=agg.arg.copy(), expression=exp.Null()), true=exp.Literal.number(0))],
                    default=s_sql,
                )
        else:
            assert arg is not None
            body = exp.Mul(this=exp.Paren(this=arg.copy()), expression=exp.Paren(this=s_sql))
        return Aggregate("sum", body, agg.columns), tuple(c for c, f in filters if f.exact)
    return (dataclasses.replace(agg, arg=arg) if agg.kind == "sum" else agg), tuple(c for c, _ in filters)


def _count_plan(scope: _Scope, public: Sequence[Conjunct], value_tables: Sequence[str]) -> RowPlan:
    """c4 of NR §3.3.9.3 for every table, value-sensitive ones included (treated as row-private for this count
    only): it bounds #{r ∋ t}, the product rows one row of t is in, and does not move when values change."""
    policy = scope.policy
    count_policy = dataclasses.replace(
        policy,
        tables={**policy.tables, **{t: dataclasses.replace(policy.table(t), rows_private=True) for t in value_tables}},
    )
    count_form = dataclasses.replace(scope.form, conjuncts=tuple(public), aggregates=(Aggregate("count", None),))
    return plan_rows(count_form, scope.catalog, count_policy)


def _parts(
    scope: _Scope,
    agg: Aggregate,
    arg: exp.Expr | None,
    slopes: dict[ColumnRef, float],
    shift: float,
    alias: str,
    beta: float,
    ops: Any,
) -> dict[str, Any]:
    """Per sensitive column of use ``alias``, the bound on the derivative of one product row's contribution
    (NR §3.3.8.4), in ``ops``' arithmetic (SQL expressions, or numbers over the declared ranges). COUNT: the
    filter's slope. SUM: d_v(e) + ub(e)·slope_v (product rule, s ≤ 1). MIN/MAX: d_v(e) + Δ·slope_v, the
    derivative of e ± (1 − s)·Δ with a data-independent Δ."""
    if agg.kind == "count":
        return {r.column: ops.const(v) for r, v in slopes.items() if r.alias == alias}
    assert arg is not None
    ub, d = bound(arg, scope.weight, ops, beta, scope.separated)
    factor = ops.const(shift) if agg.kind in ("min", "max") else ub
    out = {}
    for c in sorted({r.column for r in (set(d) | set(slopes)) if r.alias == alias}):
        ref = ColumnRef(alias, c)
        term = ops.mul(factor, ops.const(slopes[ref])) if ref in slopes else ops.const(0.0)
        if ref in d:
            term = ops.add(term, d[ref])
        out[c] = term
    return out


Parts = Callable[[str, float, Any], dict[str, Any]]


def _table_info(scope: _Scope, t: str, agg: Aggregate, slopes: dict[ColumnRef, float]) -> dict[str, Any]:
    """The JSON breakdown of one value-sensitive table: its norm, row privacy and per column weight and slope."""
    form, tp, w = scope.form, scope.policy.table(t), scope.weights_of[t]
    read = {r.column for u in form.uses_of(t) for r in set(slopes) | set(agg.columns) if r.alias == u.alias}
    return {
        "norm": str(tp.norm),
        "row_privacy": "private" if tp.rows_private else "public",
        "columns": {
            c: {
                "norm_weight": w[c],
                "filter_slope": max(
                    (v for r, v in slopes.items() if r.column == c and form.use(r.alias).table == t), default=0.0
                ),
            }
            for c in sorted(read & w.keys())
        },
    }


def _global_dual(scope: _Scope, t: str, parts: Parts) -> float:
    """c3_t of NR §3.3.9.3: the data-independent maximum of D_t over the declared ranges. One row of a
    self-joined table may fill several uses of a product row: their derivatives add."""
    norm = _norm(scope.policy, t)
    range_ops = RangeOps(scope.dom.range)
    summed: dict[str, float] = {}
    for u in scope.form.uses_of(t):
        for c, v in parts(u.alias, 1.0, range_ops).items():
            summed[c] = summed.get(c, 0.0) + v
    return float(dual(norm, summed, "float") or 0.0)


def _use_query(
    scope: _Scope,
    u: TableUse,
    agg: Aggregate,
    public: Sequence[Conjunct],
    grid: tuple[float, ...],
    reference: float,
    parts: Parts,
    fan: tuple[float, list[exp.Expr]] | None,
    window: _Window | None,
    index: int,
) -> tuple[exp.Select, bool, bool, _UseQuery]:
    """The query bounding Σ_{r ∋ t} D_u(r) over the rows t of use ``u`` (NR §3.3.8.2), one column per grid β
    and one per sensitive column at the reference β; whether it is one row over the scan (``inline``) or a
    MAX over a GROUP BY of the scan (``grouped_scan``); and where its columns are (query ``index``)."""
    form = scope.form
    norm = _norm(scope.policy, u.table)
    w = scope.weights_of[u.table]
    sql_ops = SqlOps()
    slots = _Items()
    decays = grid if window is not None else (None,) * len(grid)
    grid_cols = [
        slots.add(dual(norm, parts(u.alias, b, sql_ops)) or exp.Literal.number(0), d)
        for b, d in zip(grid, decays, strict=True)
    ]
    column_cols = {}
    for c, term in parts(u.alias, reference, sql_ops).items():
        if w[c] != 1.0:
            term = exp.Mul(this=exp.Paren(this=term), expression=exp.Literal.number(repr(1.0 / w[c])))
        # one column of weight 1: its term is often the dual norm itself
        column_cols[c] = slots.add(term, reference if window is not None else None)
    items, decay = slots.items, slots.decay
    if fan is not None and fan[0] > 1:
        # constants (COUNT): Σ_{r ∋ t} D = D·#{r ∋ t} ≤ N·D wherever the scan has a row
        items = [exp.Mul(this=exp.Literal.number(repr(fan[0])), expression=exp.Paren(this=e)) for e in items]
    weights = (window, decay) if window is not None else None
    extremum = agg.kind in ("min", "max")
    if not extremum and fan is None and len(form.uses) > 1:
        query, flat, per_group = _max_query(form, u, items, public, scope.catalog, weights), False, True
    else:
        query, flat = _extreme_query(form, items, public, scope.distinct, corner=not form.group_by, window=weights)
        per_group = False
    caps = window.caps.get(u.alias, ()) if window is not None else ()
    return query, flat, per_group, _UseQuery(u.alias, u.table, index, tuple(grid_cols), column_cols, caps)


Bounded = Callable[[TableUse, str], tuple[float, exp.Expr] | None]


def _fanout(
    form: AnalysisForm,
    start: str,
    public: list[Conjunct],
    catalog: Catalog,
    bounded: Bounded | None = None,
    until: str | None = None,
) -> tuple[float, list[exp.Expr]] | None:
    """An upper bound N of #{r ∋ t}, the product rows one row t of ``start`` is in, from the keys; None when
    some use is not reached. With ``until``: stop once that use is reached (without ``bounded``, an answer
    means every product row containing t has the same row of that use).

    A use is reached through public equalities (to a reached use's column or to a constant) that fix its
    whole primary key: one row per reached combination. With ``bounded``, a primary key column left free may
    also be one whose values are bounded (a declared integer range or domain of a column the metric does not
    protect): then at most that many rows share the fixed part of the key, and the conjunct that keeps the
    column in its range must join the WHERE (so the bound holds for any data, as SUM arguments are clamped)."""
    fixed: dict[str, set[tuple[str, str | None]]] = {}  # alias → (its column, the other side's alias or None)
    for c in public:
        e = c.expr
        if not isinstance(e, exp.EQ):
            continue
        sides = [e.this, e.expression]
        cols = [x for x in sides if isinstance(x, exp.Column) and x.table]
        if len(cols) == 2:
            a, b = cols
            fixed.setdefault(a.table, set()).add((a.name, b.table))
            fixed.setdefault(b.table, set()).add((b.name, a.table))
        elif len(cols) == 1 and any(isinstance(x, exp.Literal) for x in sides):
            fixed.setdefault(cols[0].table, set()).add((cols[0].name, None))
    reached = {start}
    n = 1.0
    conditions: list[exp.Expr] = []
    while len(reached) < len(form.uses) and (until is None or until not in reached):
        best: tuple[float, str, list[exp.Expr]] | None = None
        for u in form.uses:
            pk = set(catalog.table(u.table).primary_key)
            if u.alias in reached or not pk:
                continue
            free = pk - {col for col, other in fixed.get(u.alias, ()) if other is None or other in reached}
            if free and bounded is None:
                continue
            size, conds = 1.0, list[exp.Expr]()
            for col in sorted(free):
                key_bound = bounded(u, col) if bounded is not None else None
                if key_bound is None:
                    break
                size *= key_bound[0]
                conds.append(key_bound[1])
            else:
                if best is None or size < best[0]:
                    best = (size, u.alias, conds)
        if best is None:
            return None
        n *= best[0]
        reached.add(best[1])
        conditions.extend(best[2])
    return n, conditions


@dataclass
class _Items:
    """A query's items without repeats; per item the β of its window weight (None: no window)."""

    items: list[exp.Expr] = field(default_factory=list)
    decay: list[float | None] = field(default_factory=list)
    seen: dict[tuple[str, float | None], int] = field(default_factory=dict)

    def add(self, item: exp.Expr, decay: float | None) -> int:
        key = (item.sql(dialect="postgres"), decay)
        if key not in self.seen:
            self.seen[key] = len(self.items)
            self.items.append(item)
            self.decay.append(decay)
        return self.seen[key]


# the window's scan reaches K = ln(WINDOW_DECAY)/(β·w) units beyond the filter's support: rows further out
# weigh at most 1/WINDOW_DECAY at the reference β
WINDOW_DECAY = 100.0


@dataclass(frozen=True)
class _Window:
    """A column x whose private step filters vanish, with all their partial derivatives, on a neighbourhood of
    every x outside [lo, hi] (:attr:`sqldp.sensitivity.filters.Filter.support`; NR §3.3.8.4, exact steps), and
    the bound it gives: for each grid β, c_β = max(S_β, cap_β) with

        S_β = max over the rows t the scan reads of Σ_{r ∋ t} W(r)·D(r),   W(r) = e^(−β·w·dist(x_r, [lo, hi])),

    D(r) the usual per-product-row bound (dual row norm of ub(e)·slope_v + d_v(e)), w the metric's cost of one
    unit of x, and cap_β = e^(−β·w·K)·N·max D over the declared ranges (N: the use's key fan-out).

    Proof that c_β is a β-smooth upper bound on the derivative sensitivity w.r.t. the use's table (NR §3.3.8.3,
    "smooth upper bounds"):

    1. Upper bound. Outside [lo, hi] the filter is 0 with its derivatives on a neighbourhood of x_r, so the
       product row r adds nothing to the derivative; inside, W(r) = 1. So |∂(e·s)(r)/∂v| ≤ W(r)·D(r), and
       G_β = max over all rows t of Σ_{r ∋ t} W(r)·D(r) bounds the derivative sensitivity (NR §3.3.8.2: the
       rows of t combine with ℓ∞, rows with ℓ1).
    2. G_β is β-smooth. W is NR Lemma 3.67's β-smooth upper bound of the support's indicator in x, max over
       x′ ∈ [lo, hi] of e^(−β·w·|x − x′|), so W(x′) ≤ e^(β·w·|x − x′|)·W(x), and w·|x − x′| is at most the
       metric distance of the change. D is β-smooth in e's columns (Table 10 bounds, :mod:`expressions`), which
       the norm separates from x (an ℓ1 node, or another table): the distance of a change is d_x + d_e, so
       W·D moves by at most e^(β·d_x)·e^(β·d_e) — each row's own W times its own D is β-smooth (Lemma 3.70
       without the split of β). Sums of non-negative β-smooth functions over r ∋ t and their maximum over t
       are β-smooth (§3.3.8.3, "Sum", "Min / max"). The product must be taken per row: max_r W × max_r D,
       with the two maxima from different rows, is β-smooth over all rows but not over the scanned ones — a
       row leaving the scan took the max D with it (tests/sensitivity/test_window_oracle.py: a pair of neighbours lost
       2.51 at ε = 1).
    3. The scan. It reads x ∈ [⌊lo − K⌋, ⌈hi + K⌉], so an unread row has dist > K and W ≤ e^(−β·w·K). When
       x's row is the same in every product row containing t (keys, :func:`_fanout` ``until``), t is read
       with all its product rows or with none. An unread t has Σ_{r ∋ t} W·D ≤ e^(−β·w·K)·N·max D = cap_β,
       provided D(r) ≤ max D over the declared ranges: the summed columns are clamped to those ranges
       (:func:`plan_columns`), and ``RangeOps(smoothed=True)`` takes the maximum of the smoothed ub there.
       Hence S_β ≤ G_β and every t whose term exceeds cap_β is read in full: max(S_β, cap_β) =
       max(G_β, cap_β) for every real x, not only grid values.
    4. max(G_β, cap_β) is a maximum of a β-smooth function and a constant: β-smooth, continuous, ≥ G_β.

    β: K and the caps are fixed by the reference β and the grid, never by the data. ``finish(β)`` uses the
    largest grid β′ ≤ β, and a β′-smooth bound is β-smooth (NR Def. 3.56), so each member (b_I, β_I) of the
    family searched by ``mechanisms.optimise_beta`` has a continuous β_I-smooth upper bound, as NR Theorem 3.73
    asks; the minimum of c_I/b_I is then ε-DP."""

    ref: ColumnRef
    lo: float
    hi: float
    rate: float  # w per unit of x
    reach: float  # K
    x: exp.Expr  # x in its unit (days for a DATE), as SQL
    column: exp.Column  # x as stored (the skyline groups by it)
    values: float  # how many values x can take in the scanned range (on its grid; inf without one)
    caps: dict[str, tuple[float, ...]]  # per use alias, per grid β
    conjunct: Conjunct

    def dist(self, column: exp.Expr | None = None) -> exp.Expr:
        """dist(x, [lo, hi]) of a row, as SQL; ``column``: what stands for x's column (a grouped query's key)."""
        x = self.x.copy()
        if column is not None:
            x = x.transform(lambda n: column.copy() if n == self.column else n, copy=False)
        x = exp.cast(x, "DOUBLE PRECISION")
        return exp.Greatest(
            this=exp.Sub(this=exp.Literal.number(repr(self.lo)), expression=x),
            expressions=[exp.Sub(this=x.copy(), expression=exp.Literal.number(repr(self.hi))), exp.Literal.number(0)],
        )

    def weigh(self, item: exp.Expr, beta: float | None, dist: exp.Expr) -> exp.Expr:
        """W·item, W = e^(−β·w·dist); ``dist`` a row's distance, or the least over rows (then W is their largest)."""
        if beta is None:
            return item
        w = exp.Exp(this=exp.Mul(this=exp.Literal.number(repr(-beta * self.rate)), expression=dist.copy()))
        return exp.Mul(this=w, expression=exp.Paren(this=item))

    def to_json(self, grid: tuple[float, ...], reference: float) -> dict[str, Any]:
        k = grid.index(reference)
        return {
            "column": str(self.ref),
            "support": [self.lo, self.hi],
            "scanned": [self.lo - self.reach, self.hi + self.reach],
            "far_rows_bound": {alias: caps[k] for alias, caps in self.caps.items()},
        }


def _window(
    form: AnalysisForm,
    catalog: Catalog,
    policy: Policy,
    support: dict[ColumnRef, tuple[float, float]],
    value_tables: list[str],
    public: list[Conjunct],
    grid: tuple[float, ...],
    reference: float,
    *,
    sensitive: Callable[[ColumnRef], float | None],
    separated: Callable[[frozenset[ColumnRef], frozenset[ColumnRef]], bool],
    info: Callable[[ColumnRef], tuple[str, float | None, float, bool]],
    bounded: Bounded,
    parts_for: Callable[[str, float, Any], dict[str, Any]],
    arg: exp.Expr,
) -> _Window | None:
    """The narrowest usable window of a SUM's private filters (:class:`_Window`), or None: none is bounded on
    both sides, separated from the summed expression's columns, determined by the keys from every
    value-sensitive use, narrower than half the column's declared range, with declared ranges for the caps."""
    summed = frozenset(
        ColumnRef(c.table, c.name)
        for c in arg.find_all(exp.Column)
        if c.table and sensitive(ColumnRef(c.table, c.name))
    )
    uses = [u for t in value_tables for u in form.uses_of(t)]
    maybe = [_fanout(form, u.alias, public, catalog, bounded) for u in uses]
    fans = [fan for fan in maybe if fan is not None]
    if len(fans) < len(maybe):
        return None
    # the cap bounds the far rows' smoothed D, which is above D itself where |x| is under the floor
    dom = domain(form, catalog, policy)
    range_ops = RangeOps(dom.range, smoothed=True)
    best: tuple[float, _Window] | None = None
    for ref, (lo, hi) in sorted(support.items(), key=lambda kv: str(kv[0])):
        w = sensitive(ref)
        declared = dom.range(ref)
        if w is None or not (math.isfinite(lo) and math.isfinite(hi)) or declared is None:
            continue
        if ref in summed or (summed and not separated(frozenset({ref}), summed)):
            continue
        rate = w / info(ref)[2]  # the metric's cost of one day of a DATE is w per unit / days per unit
        reach = math.log(WINDOW_DECAY) / (reference * rate)
        width = hi - lo + 2 * reach
        if width > 0.5 * (declared[1] - declared[0]):
            continue
        if any(_fanout(form, u.alias, public, catalog, until=ref.alias) is None for u in uses):
            continue  # a use whose rows t are not tied to one row of x by the keys
        try:
            caps = {
                u.alias: tuple(
                    math.exp(-b * rate * reach)
                    * fan[0]
                    * float(dual(_norm(policy, u.table), parts_for(u.alias, b, range_ops), "float") or 0.0)
                    for b in grid
                )
                for u, fan in zip(uses, fans, strict=True)
            }
        except RefusedError:  # a summed column without a declared range (RangeOps)
            continue
        x = column_sql(ref, info)
        low: exp.Expr
        high: exp.Expr
        if info(ref)[0] == "date":
            ends = [EPOCH + dt.timedelta(days=math.floor(lo - reach)), EPOCH + dt.timedelta(days=math.ceil(hi + reach))]
            low, high = (exp.cast(exp.Literal.string(d.isoformat()), "DATE") for d in ends)
        else:
            low, high = (
                exp.Literal.number(repr(math.floor(lo - reach))),
                exp.Literal.number(repr(math.ceil(hi + reach))),
            )
        column = exp.column(ref.column, table=ref.alias)
        near = exp.Between(this=column.copy(), low=low, high=high)
        grain = info(ref)[1]
        values = (math.ceil(hi + reach) - math.floor(lo - reach)) / grain + 1 if grain else math.inf
        window = _Window(ref, lo, hi, rate, reach, x, column, values, caps, Conjunct(near, frozenset({ref}), False))
        if best is None or width < best[0]:
            best = (width, window)
    if best is None:
        return None
    window = best[1]
    _add_public(public, [c for fan in fans if fan is not None for c in fan[1]] + [window.conjunct.expr])
    return window


def _add_public(public: list[Conjunct], conditions: list[exp.Expr]) -> None:
    """Public conjuncts the scans need (key ranges of a fan-out, a window's range), each once."""
    for cond in conditions:
        if all(cond.sql() != c.expr.sql() for c in public):
            refs = frozenset(ColumnRef(x.table, x.name) for x in cond.find_all(exp.Column))
            public.append(Conjunct(cond, refs, False))


Weights = tuple[_Window, list[float | None]]  # a window and, per item, the β of its weight W


def _max_query(
    form: AnalysisForm,
    use: TableUse,
    items: list[exp.Expr],
    public: Sequence[Conjunct],
    catalog: Catalog,
    window: Weights | None = None,
) -> exp.Select:
    """max over rows t of the use of Σ_{r ∋ t} D(r): one scan (NR §3.3.8.2, rows of t_r combined with ℓ∞).
    With a window, Σ_{r ∋ t} W(r)·D(r) ≤ W_t·Σ_{r ∋ t} D(r) with W_t from the least distance of t's rows (the
    window's column is one row's for all of them, :class:`_Window`, so this is equality): one exp() per t."""
    pk = catalog.table(use.table).primary_key
    keys = [exp.column(c, table=use.alias) for c in pk] if pk else [exp.column("ctid", table=use.alias)]
    inner = exp.select(*(exp.alias_(exp.Sum(this=e), f"s{k}") for k, e in enumerate(items)))
    if window is not None:
        inner = inner.select(exp.alias_(exp.Min(this=window[0].dist()), "dist"), copy=False)
    inner = where(from_uses(inner, form.uses), public).group_by(*keys, copy=False)
    outer = exp.select(
        *(
            exp.alias_(
                exp.Max(this=window[0].weigh(exp.column(f"s{k}"), window[1][k], exp.column("dist")))
                if window is not None
                else exp.Max(this=exp.column(f"s{k}")),
                f"v{k}",
            )
            for k in range(len(items))
        )
    )
    return outer.from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("per_row"))))


# a skyline whose group keys can take more value combinations than this is not tried (per-row maximum instead)
SKYLINE_GROUPS = 10_000


def _leaf(node: exp.Expr) -> exp.Column | None:
    """The column of ``ABS(col)`` or ``ABS(CAST(col AS …))``, the only way SqlOps reads a column."""
    if not isinstance(node, exp.Abs):
        return None
    inner = node.this.this if isinstance(node.this, exp.Cast) else node.this
    return inner if isinstance(inner, exp.Column) and inner.table else None


def _monotone(e: exp.Expr) -> tuple[bool, bool]:
    """(non-decreasing in every |column| leaf, never negative), by the node types SqlOps and ``dual`` write;
    anything else is reported as not monotone."""
    if _leaf(e) is not None:
        return True, True
    if isinstance(e, exp.Literal) and not e.is_string:
        return True, float(e.this) >= 0
    if isinstance(e, (exp.Paren, exp.Cast)):
        return _monotone(e.this)
    if isinstance(e, exp.Exp):
        return _monotone(e.this)[0], True
    if isinstance(e, exp.Sqrt):  # an ℓ2 norm of non-negative bounds (expressions.SqlOps.norm)
        m, n = _monotone(e.this)
        return m and n, True
    if isinstance(e, (exp.Greatest, exp.Least)):
        parts = [_monotone(x) for x in [e.this, *e.expressions]]
        nonneg = any(n for _, n in parts) if isinstance(e, exp.Greatest) else all(n for _, n in parts)
        return all(m for m, _ in parts), nonneg
    if isinstance(e, (exp.Add, exp.Mul)):
        (ma, na), (mb, nb) = _monotone(e.this), _monotone(e.expression)
        ok = ma and mb and (isinstance(e, exp.Add) or (na and nb))  # a product of non-negatives
        return ok, na and nb
    if isinstance(e, (exp.Sub, exp.Div, exp.Pow)):
        ma, na = _monotone(e.this)
        k = e.expression
        const = float(k.this) if isinstance(k, exp.Literal) and not k.is_string else None
        if const is None:
            return False, False
        if isinstance(e, exp.Sub):
            return ma, False
        return ma and const > 0 and (na or isinstance(e, exp.Div)), na
    return False, False


def _extreme_query(
    form: AnalysisForm,
    items: list[exp.Expr],
    public: Sequence[Conjunct],
    distinct: Callable[[ColumnRef], float],
    *,
    corner: bool = False,
    window: Weights | None = None,
) -> tuple[exp.Select, bool]:
    """``SELECT MAX(D_k(r))`` over the product rows (NR §3.3.8.2 for a row in one product row; §3.3.8.3, Min /
    max: MIN/MAX move by the largest change of e over the rows r ∋ t, not the sum), and whether the query is
    one aggregate row over the form's scan (the rewriter may fold it into the answer query).

    Every bound D is built from |column| leaves by non-decreasing operations on non-negative values, so its
    maximum over rows is reached where the leaves are largest. One leaf: max_r D(|x_r|) = D(max_r |x_r|),
    which is MAX(ABS(x)) — no per-row exp(), and the answer query can compute it in its own scan. Several
    leaves: grouped by all of them but the one with the most values, the largest |x| per group gives the
    same maximum (a skyline) from a handful of rows. No leaf: the constants, if the scan has a row (LIMIT 1).
    These are the exact maximum.

    ``corner`` (the answer has no GROUP BY, so a one-row query can share its scan): several leaves also get
    D(max_r |x_r|, max_r |y_r|, …), which is ≥ the maximum (equal when one row holds every maximum; on the
    NAPLES TPC-H queries at most 1.1% above it, Q1_4) and saves the second scan. It is β-smooth: D is β-smooth
    in the leaves and non-decreasing, and a change of the database moves the vector of maxima by at most
    Σ_t |Δx_t| per column, whose norm is at most the distance (rows and tables combine with ℓ1, the table norms
    are absolute). A table used twice would count one change twice, so self-joins keep the skyline.

    A window's weight W (:class:`_Window`) multiplies each row's own D: per row, or in a skyline that also
    groups by the window's column x (W is a function of x), so the maximum is still the exact max_r W(r)·D(r).
    Only constant D use (max_r W)·D, which is the same. Not (max_r W)·(max_r D) with the maxima from
    different rows: over the scanned rows that is not β-smooth (a row leaving the scan took max D with it;
    :class:`_Window`, step 2). With a window the scan is the window's, so even constants are an aggregate
    over it."""

    def weigh(e: exp.Expr, k: int, dist: exp.Expr | None = None) -> exp.Expr:
        if window is None:
            return e
        return window[0].weigh(e, window[1][k], dist if dist is not None else exp.Min(this=window[0].dist()))

    def per_row() -> tuple[exp.Select, bool]:
        row_dist = window[0].dist() if window is not None else None
        sel = exp.select(*(exp.alias_(exp.Max(this=weigh(e, k, row_dist)), f"v{k}") for k, e in enumerate(items)))
        return where(from_uses(sel, form.uses), public), True

    leaves: dict[ColumnRef, exp.Column] = {}
    columns = in_leaves = 0
    for it in items:
        columns += sum(1 for _ in it.find_all(exp.Column))
        for node in it.find_all(exp.Abs):
            col = _leaf(node)
            if col is not None:
                in_leaves += 1
                leaves[ColumnRef(col.table, col.name)] = col
    if columns != in_leaves or not all(_monotone(it)[0] for it in items):
        return per_row()

    def substitute(e: exp.Expr, at: dict[ColumnRef, exp.Expr]) -> exp.Expr:
        def swap(node: exp.Expr) -> exp.Expr:
            col = _leaf(node)
            return at[ColumnRef(col.table, col.name)].copy() if col is not None else node

        return e.copy().transform(swap, copy=False)

    def double(e: exp.Expr) -> exp.Expr:
        return exp.cast(e, "DOUBLE PRECISION")

    def absolute(col: exp.Column) -> exp.Expr:
        return exp.Abs(this=col.copy())

    def skyline(keys: list[ColumnRef], free: ColumnRef, weights: Weights | None) -> tuple[exp.Select, bool]:
        """Grouped by the |keys| (and by the window's column x, whose value fixes W), the largest |free| per
        group: the exact maximum of W·D, since D is non-decreasing in each leaf and W is one per group."""
        groups = math.prod(distinct(r) for r in keys) * (weights[0].values if weights is not None else 1.0)
        if groups > SKYLINE_GROUPS:
            return per_row()
        by = [absolute(leaves[r]) for r in keys]
        inner = exp.select(
            *(exp.alias_(absolute(leaves[r]), f"g{i}") for i, r in enumerate(keys)),
            exp.alias_(exp.Max(this=absolute(leaves[free])), "m"),
        )
        dist = None
        if weights is not None:  # W is a function of x: one value per group, computed once per group outside
            inner = inner.select(exp.alias_(weights[0].column.copy(), "x"), copy=False)
            by.append(weights[0].column.copy())
            dist = weights[0].dist(exp.column("x"))
        inner = where(from_uses(inner, form.uses), public).group_by(*by, copy=False)
        at = {r: double(exp.column(f"g{i}")) for i, r in enumerate(keys)}
        at[free] = double(exp.column("m"))
        outer = exp.select(
            *(exp.alias_(exp.Max(this=weigh(substitute(e, at), k, dist)), f"v{k}") for k, e in enumerate(items))
        )
        return outer.from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("skyline")))), False

    refs = sorted(leaves, key=lambda r: (distinct(r), str(r)))
    if not refs and window is None:
        # constants: their maximum over a non-empty scan is themselves, and the first row says it is not empty
        # (not folded into the answer: that would scan the rows its private step filters leave out; TPC-H Q4)
        sel = exp.select(*(exp.alias_(e.copy(), f"v{k}") for k, e in enumerate(items)))
        return where(from_uses(sel, form.uses), public).limit(1, copy=False), False
    tables = [form.use(r.alias).table for r in refs]
    if window is not None and refs:
        return skyline(refs[:-1], refs[-1], window)
    if len(refs) <= 1 or (corner and all(len(form.uses_of(t)) == 1 for t in tables)):
        at = {r: double(exp.Max(this=absolute(leaves[r]))) for r in refs}
        any_row = exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(0))
        sel = exp.select(
            *(
                exp.alias_(exp.Case(ifs=[exp.If(this=any_row.copy(), true=weigh(substitute(e, at), k))]), f"v{k}")
                for k, e in enumerate(items)
            )
        )
        return where(from_uses(sel, form.uses), public), True
    return skyline(refs[:-1], refs[-1], None)


__all__ = ["BETA_GRID", "ColumnPlan", "Filter", "plan_columns"]
