"""Unit-level privacy over foreign-key joins: R2T's truncated answers as a plan.

Under a privacy unit (:mod:`sqldp.policy.units`) neighbouring databases differ by one unit with every row that
references it. COUNT and SUM over a join then have no useful global sensitivity — one customer may own any
number of line items — and R2T (Dong, Fang, Yi, Tao and Machanavajjhala, "R2T: Instance-optimal Truncation for
Differentially Private Query Evaluation with Foreign Keys", SIGMOD 2022) answers them by a race of truncations:
for τ_j = b^j, j = 1 … J (b = 5.5, :func:`races`), the truncated answer

    Q(I, τ) = Σ_units min(contribution(unit), τ)

changes by at most τ between neighbours, because when every join row belongs to one unit, removing a unit
removes exactly its own join rows and leaves every other unit's contribution as it was (R2T §4 for a
self-join-free query with one primary private relation, where Q(I, τ) is this sum and needs no LP).
sqldp.mechanisms.race adds the noise to each race and releases the top (its own mechanism: several noisy
values, not one bound and one noise).

This module decides, from the query and the policy alone:

* the unit of each private use, by following its foreign-key paths: a hop needs no join when the next
  columns are among the referenced ones (lineitem → orders gives the *orders* unit as l_orderkey), uses a
  table the query already joins on the foreign key (θ's equalities, NR §3.3.7.3's classes), and otherwise
  joins the referenced table (its referenced columns are unique, :func:`sqldp.policy.units.references`);
* whether every join row belongs to one unit: the unit keys of all private uses (every unit, every path)
  are provably equal under θ's equalities. Then the SQL computes per unit (GROUP BY the unit's key) its
  contribution, COUNT(…) or the SUM of the clamped argument, and from those the J truncated sums in one row,
  plus the largest contribution (audit only). Otherwise — self-joins, two units in one query (R2T's Q5),
  tables reached by paths to possibly different units — the SQL returns the join rows grouped by all the
  distinct unit keys, and Q(I, τ) is R2T's linear program over them (:mod:`sqldp.sensitivity.unit_lp`, R2T §5);
  GS_Q is then the largest ``max_contribution`` of the units involved.
  R2T needs ψ(q) ≥ 0: a SUM whose declared ranges allow negative values (the centred SUM of an AVG) is raced
  as its positive and its negative part, each with half of ε, and released as their difference.

GROUP BY (docs/units.md): a unit may add rows to many groups, so each unit's contributions are scaled down
together, across groups and aggregates, until their ℓ1 mass is at most τ (:func:`grouped_answer`); the
histogram then moves by at most τ in ℓ1 between neighbours, τ is chosen by R2T's race on the total mass and
every group released with Laplace noise at τ (sqldp.mechanisms.race.histogram_release). Only where every join row
belongs to one unit; a key of the unit's own tables without a declared domain is refused (no partition
selection under a unit).

A row whose unit key is NULL (a nullable foreign key) joins the group of NULLs: it is truncated with it as
one more unit, which only adds protection. Tables in no unit must be public in such a query; row-private
ones would mix two neighbour relations and are refused.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import Aggregate, AnalysisForm, ColumnRef, Conjunct, TableUse
from sqldp.mechanisms.race import SELECT_BETA, SELECT_SHARE, race_template
from sqldp.mechanisms.registry import R2T, R2T_HISTOGRAM, Name
from sqldp.policy import Policy
from sqldp.policy.units import Path, Unit
from sqldp.result import Measurement
from sqldp.sensitivity.intervals import clamp_columns, domain, interval
from sqldp.sensitivity.plan import Bound, Releasable, Rows
from sqldp.sensitivity.rows import equality_classes
from sqldp.sensitivity.unit_lp import truncations
from sqldp.sqlgen import aggregate_expr, from_uses, number, where

BETA = 0.1  # R2T's β: with probability ≥ 1 − β the error is within its bound (the paper's experiments use 0.1)
# The race's base b: τ_j = b^j. The paper's Theorem 4.2 uses b = 2, giving its 4 = 2·2 (the released value is
# within 2·C_{j*} of Q(I) for the first race j* with τ_{j*} ≥ DS, and τ_{j*} < b·DS). Any constant b > 1 keeps
# the proof with 2·b in place of 4 and J = log_b GS races; the bound b·log_b(GS)·ln(J/β) is smallest near b = e,
# and averaged over where DS falls between two races (log DS uniform) the expected τ_{j*}/DS is (b − 1)/ln b,
# so the error ∝ (b − 1)/ln²b, smallest at b ≈ 4.9 and flat on [4, 6.5]. R2T's implementation races b = 5.5
# ("2e for its better practical performance"), whose published TPC-H errors we compare with; so do we.
BASE = 5.5
UNIT_COLUMN, CONTRIBUTION = "unit", "contribution"
KEY = "__key"  # the answer query's group key columns (sqldp.sqlgen.answer_query, sqldp.groups.match_groups)


def races(gs: float) -> tuple[float, ...]:
    """R2T's thresholds τ_j = b^j for j = 1 … J, J = ⌊log_b GS_Q⌋ races (at least one), b = :data:`BASE`: the
    largest race is the largest power of b not above GS_Q, as in R2T's implementation. Which thresholds race is
    decided by the policy alone, so privacy never depends on it (each race is (ε/J)-DP whatever its τ); a unit
    contributing more than τ_J is truncated there, which costs accuracy only (the error bound of Theorem 4.2
    holds for every instance whose largest contribution DS is at most τ_J ≥ GS_Q/b). Powers of 5.5 = 11/2 are
    exact in binary floating point and in SQL numerals up to 5.5^15."""
    top = max(1, math.floor(math.log(gs) / math.log(BASE) + 1e-12))
    return tuple(BASE**j for j in range(1, top + 1))


@dataclass(frozen=True)
class UnitPlan(Releasable):
    """The plan contract (:mod:`sqldp.sensitivity.plan`) for R2T under one privacy unit.

    ``queries`` is one statement returning the truncated answers Q(I, τ_j) and the largest contribution;
    ``data_independent`` holds since the noise of each race, τ_j·J/ε, is decided by the policy's GS_Q alone;
    ``bind`` reports GS_Q as the bound (the release step does not use it: it runs the race)."""

    form: AnalysisForm
    aggregate: Aggregate
    units: tuple[Unit, ...]  # the units the query's tables belong to (sorted by name)
    thresholds: tuple[float, ...]
    signs: tuple[int, ...]  # per raced part: +1, or −1 for the negative part of a SUM (module docstring)
    query: exp.Select
    joined: tuple[str, ...]  # the foreign-key hops joined to find a use's unit (for explain)
    # by linear program: the unit of each key column the query groups by (empty: one key, per-unit sums)
    owners: tuple[str, ...] = ()
    scan_conjuncts: tuple[Conjunct, ...] = ()
    grouped_scan: tuple[bool, ...] = (False,)
    disjoint_groups: bool = False
    key_moves: bool = False
    data_independent: bool = True
    grid: tuple[float, ...] = ()
    inline: tuple[bool, ...] = (False,)
    beta: float = BETA
    # GROUP BY: ``query`` is this aggregate's contribution per (unit, group), and the answer query computes
    # every aggregate's truncated histograms (:func:`grouped_answer`); the release chooses τ by a race on the
    # total and adds Laplace noise to every group (sqldp.mechanisms.race.histogram_release)
    histogram: bool = False
    # where every join row belongs to one unit: the column holding a join row's unit key, and the joins added to
    # reach it (uses and their equalities), which a declared bound on a unit's rows reads
    # (sqldp.sensitivity.unit_bounds)
    unit_key: ColumnRef | None = None
    extra_uses: tuple[TableUse, ...] = ()
    extra_conds: tuple[exp.Expr, ...] = ()

    @property
    def change_distances(self) -> frozenset[float]:
        """A neighbour differs in one unit's rows, at distance 1 (units have no weights)."""
        return frozenset({1.0})

    @property
    def queries(self) -> tuple[exp.Select, ...]:
        return () if self.histogram else (self.query,)

    @property
    def own_mechanism(self) -> Name | None:
        """R2T's race (a GROUP BY: its histogram form), run by sqldp.mechanisms.race, not noise on one bound."""
        return R2T_HISTOGRAM if self.histogram else R2T

    @property
    def privacy_unit(self) -> dict[str, Any] | None:
        return self.describe()

    def expected_bound(self) -> float | None:
        return None  # the race's noise is per threshold, not one bound's

    def template(self, aggregate: str, rows: Sequence[Rows], eps: float) -> Measurement | None:
        """The race's measurement (sqldp.mechanisms.race.race_template)."""
        return race_template(aggregate, self, rows, eps)

    @property
    def unit(self) -> Unit:
        """The first unit (the only one unless the linear program is used)."""
        return self.units[0]

    @property
    def gs(self) -> float:
        """GS_Q: the most one unit may add to the aggregate (the largest ``max_contribution`` of its units)."""
        return max(u.max_contribution for u in self.units)

    @property
    def conjuncts(self) -> tuple[Conjunct, ...]:
        return self.form.conjuncts

    def truncated(self, results: Sequence[Rows]) -> tuple[tuple[float, ...], float]:
        """Q(I, τ_j) for every race of every part (part by part), and the largest contribution of one unit to
        any part (R2T's DS_Q(I), data-dependent)."""
        if self.owners:
            return self._by_lp(results[0])
        row = results[0][0]
        n = len(self.thresholds) * len(self.signs)
        values = tuple(float(v or 0) for v in row[:n])
        return values, max(float(v or 0) for v in row[n:])

    def _by_lp(self, rows: Rows) -> tuple[tuple[float, ...], float]:
        """Each part's Q(I, τ_j) by R2T's linear program over the grouped join rows: a row's owners are its key
        columns' (unit, value) pairs; a NULL key is one more unit of its own, which only adds a constraint."""
        m = len(self.owners)
        owners = [tuple(zip(self.owners, row[:m], strict=True)) for row in rows]
        values: list[float] = []
        largest = 0.0
        for i in range(len(self.signs)):
            got, ds = truncations(owners, [float(row[m + i] or 0) for row in rows], self.thresholds)
            values += got
            largest = max(largest, ds)
        return tuple(values), largest

    def bind(self, results: Sequence[Rows]) -> Callable[[float], Bound]:
        values, largest = self.truncated(results)
        terms = {
            ", ".join(u.name for u in self.units): {
                "thresholds": list(self.thresholds) * len(self.signs),
                "truncated": list(values),
                "largest_contribution": largest,
            }
        }
        return lambda beta: Bound(self.gs, terms)

    def describe(self) -> dict[str, Any]:
        """What an analyst may see: the unit, GS_Q and the races (all from the policy and the query)."""
        out: dict[str, Any] = {
            "unit": ", ".join(u.name for u in self.units),
            "table": ", ".join(u.table for u in self.units),
            "key": ", ".join(u.key for u in self.units),
            "gs": self.gs,
            "races": len(self.thresholds),
            "signs": list(self.signs),
            "beta": self.beta,
            "joined": list(self.joined),
        }
        if self.owners:
            out["truncation"] = "linear program"
        if self.histogram:
            out["truncation"] = "across groups"
            out["selection_share"] = SELECT_SHARE
            out["selection_beta"] = SELECT_BETA
        return out


def unit_tables(form: AnalysisForm, catalog: Catalog, policy: Policy) -> dict[str, list[str]]:
    """Per table of the query that belongs to a unit, the units it belongs to (empty: no unit involved)."""
    out: dict[str, list[str]] = {}
    for unit, members in policy.members(catalog).items():
        for t in form.tables:
            if t in members:
                out.setdefault(t, []).append(unit)
    return out


class _Resolver:
    """Follows foreign-key paths from a use to its unit's key, joining referenced tables where needed."""

    def __init__(self, form: AnalysisForm, catalog: Catalog) -> None:
        self.form, self.catalog = form, catalog
        self.classes = equality_classes(form.conjuncts)
        self.extra: list[TableUse] = []
        self.extra_conds: list[exp.Expr] = []
        self.joined: list[str] = []

    def equal(self, a: ColumnRef, b: ColumnRef) -> bool:
        return a == b or (a in self.classes and b in self.classes and self.classes.connected(a, b))

    def _materialise(self, table: str, known: dict[str, ColumnRef]) -> str:
        """A use of ``table`` whose row is the one ``known`` (a unique key of it) identifies: a use of the query
        θ already ties to it, else a new join on the key."""
        for u in (*self.form.uses, *self.extra):
            if u.table == table and all(self.equal(ColumnRef(u.alias, c), ref) for c, ref in known.items()):
                return u.alias
        alias = f"__unit{len(self.extra)}"
        self.extra.append(TableUse(alias, table))
        on = " AND ".join(f"{alias}.{c} = {ref}" for c, ref in known.items())
        self.joined.append(f"{table} AS {alias} ON {on}")
        for c, ref in known.items():
            cond = exp.EQ(this=exp.column(c, table=alias), expression=exp.column(ref.column, table=ref.alias))
            self.extra_conds.append(cond)
            self.classes.add(ColumnRef(alias, c))
            self.classes.add(ref)
            self.classes.merge(ColumnRef(alias, c), ref)
        return alias

    def unit_of(self, use: TableUse, path: Path, unit: Unit) -> ColumnRef:
        table: str = use.table
        alias: str | None = use.alias
        known: dict[str, ColumnRef] = {}

        def get(col: str) -> ColumnRef:
            nonlocal alias
            if alias is None:
                if col in known:
                    return known[col]
                alias = self._materialise(table, known)
            return ColumnRef(alias, col)

        for hop in path:
            refs = [get(c) for c in hop.columns]
            table, alias, known = hop.references, None, dict(zip(hop.ref_columns, refs, strict=True))
        return get(unit.key)


def plan_units(form: AnalysisForm, catalog: Catalog, policy: Policy) -> UnitPlan:
    """The R2T plan for a form with one aggregate whose tables belong to a privacy unit (module docstring)."""
    if len(form.aggregates) != 1:
        raise ValueError("plan_units takes a form with one aggregate")
    agg = form.aggregates[0]
    members = policy.members(catalog)
    of_table = unit_tables(form, catalog, policy)
    involved = sorted({u for us in of_table.values() for u in us})
    for u in form.uses:
        if u.table not in of_table and not policy.table(u.table).public:
            raise RefusedError(
                f"table {u.table} belongs to no privacy unit and is not public: a query may not mix unit-level "
                f"privacy (unit {', '.join(involved)}) with row-level privacy; declare it public or make it "
                "reference the unit"
            )
    if form.select_by is not None or form.distinct_rows:
        raise RefusedError(
            "DP partition selection (GROUP BY a private column without a declared domain, or SELECT DISTINCT) is "
            "not implemented under a privacy unit: a unit may add rows to many groups, and a key of the unit's "
            "own tables (an order, a customer) is mostly one unit's, so no such group could pass a selection "
            "threshold; declare the key's domain or group by columns of public tables (docs/units.md)"
        )
    dom = domain(form, catalog, policy)
    signs: tuple[int, ...] = (1,)
    if agg.kind == "count":
        released = agg
        parts: list[exp.Expr] = [aggregate_expr(agg)]
    elif agg.kind == "sum":
        assert agg.arg is not None
        lo, hi = interval(agg.arg, dom, "SUM under a privacy unit")
        released = dataclasses.replace(agg, arg=clamp_columns(agg.arg, dom))
        assert released.arg is not None
        value = released.arg
        # R2T truncates non-negative contributions (its ψ ≥ 0): a value that may be negative is split into its
        # positive and negative parts, SUM(e) = SUM(max(e, 0)) − SUM(max(−e, 0)), each raced with half of ε
        if lo >= 0 or form.group_by:  # a histogram truncates signed contributions by their ℓ1 mass (below)
            pieces = [value]
        elif hi <= 0:
            signs, pieces = (-1,), [exp.Neg(this=exp.Paren(this=value.copy()))]
        else:
            signs = (1, -1)
            pieces = [
                exp.Greatest(this=value.copy(), expressions=[exp.Literal.number(0)]),
                exp.Greatest(this=exp.Neg(this=exp.Paren(this=value.copy())), expressions=[exp.Literal.number(0)]),
            ]
        parts = [aggregate_expr(Aggregate("sum", p)) for p in pieces]
    else:
        raise RefusedError(f"{agg.sql}: under a privacy unit only COUNT, SUM and AVG are answered (R2T)")

    resolver = _Resolver(form, catalog)
    found: list[tuple[str, ColumnRef]] = []  # per use, per unit it belongs to, per path: the unit's key
    for u in form.uses:
        for name in of_table.get(u.table, []):
            found += [(name, resolver.unit_of(u, p, policy.units[name])) for p in members[name][u.table]]
    keys: list[tuple[str, ColumnRef]] = []  # the distinct ones, by θ's equalities (after every join was added)
    for name, ref in sorted(found, key=lambda nk: (nk[0], str(nk[1]))):
        if not any(n == name and resolver.equal(ref, k) for n, k in keys):
            keys.append((name, ref))
    units = tuple(policy.units[n] for n in involved)
    thresholds = races(max(x.max_contribution for x in units))
    contributions = [f"{CONTRIBUTION}{i}" for i in range(len(parts))]
    joined = tuple(dict.fromkeys(resolver.joined))
    uses = (*form.uses, *resolver.extra)
    conds: tuple[Conjunct | exp.Expr, ...] = (*form.conjuncts, *resolver.extra_conds)

    def unit_plan(query: exp.Select, **shape: Any) -> UnitPlan:
        return UnitPlan(
            form=form,
            aggregate=released,
            units=units,
            thresholds=thresholds,
            signs=signs,
            query=query,
            joined=joined,
            unit_key=keys[0][1] if len(keys) == 1 else None,
            extra_uses=tuple(resolver.extra),
            extra_conds=tuple(resolver.extra_conds),
            **shape,
        )

    if form.group_by:
        if len(keys) > 1:
            raise RefusedError(
                "GROUP BY under a privacy unit where a join row may belong to several units (two units, a "
                "self-join, two foreign-key paths) is not implemented: R2T's linear program bounds one total, "
                "not a histogram"
            )
        key = exp.column(keys[0][1].column, table=keys[0][1].alias)
        inner = exp.select(
            exp.alias_(key, UNIT_COLUMN),
            *(exp.alias_(g.copy(), f"{KEY}{i}") for i, g in enumerate(form.group_by)),
            exp.alias_(parts[0], f"{CONTRIBUTION}0"),
        )
        inner = where(from_uses(inner, uses), conds).group_by(
            key.copy(), *(g.copy() for g in form.group_by), copy=False
        )
        return unit_plan(inner, histogram=True)
    if len(keys) > 1:
        # a join row may belong to several units (two units, a self-join, two paths to possibly different
        # units): the join rows grouped by the units they own, for R2T's linear program (sqldp.sensitivity.unit_lp)
        columns = [exp.column(k.column, table=k.alias) for _, k in keys]
        query = exp.select(
            *(exp.alias_(c, f"{UNIT_COLUMN}{i}") for i, c in enumerate(columns)),
            *(exp.alias_(p, c) for p, c in zip(parts, contributions, strict=True)),
        )
        query = where(from_uses(query, uses), conds).group_by(*(c.copy() for c in columns), copy=False)
        return unit_plan(query, owners=tuple(n for n, _ in keys))
    key = exp.column(keys[0][1].column, table=keys[0][1].alias)
    inner = exp.select(
        exp.alias_(key, UNIT_COLUMN), *(exp.alias_(p, c) for p, c in zip(parts, contributions, strict=True))
    )
    inner = where(from_uses(inner, uses), conds)
    inner = inner.group_by(key.copy(), copy=False)
    items: list[exp.Expr] = [
        exp.alias_(exp.Sum(this=exp.Least(this=exp.column(c), expressions=[number(t)])), f"r{i}_{j}")
        for i, c in enumerate(contributions)
        for j, t in enumerate(thresholds)
    ]
    items += [exp.alias_(exp.Max(this=exp.column(c)), f"largest{i}") for i, c in enumerate(contributions)]
    query = exp.select(*items).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("per_unit"))))
    own_scan = not resolver.extra  # no extra join: the rewriter may fold the race into the answer's scan
    return unit_plan(query, scan_conjuncts=form.conjuncts if own_scan else (), grouped_scan=(own_scan,))


def _scaled(value: exp.Expr, tau: float) -> exp.Expr:
    """A unit's contribution ``value`` to one group, scaled by min(1, τ/c) for the unit's total mass c: as it
    is when c ≤ τ, else value·τ/c in NUMERIC (no division by zero: c > τ > 0 there)."""
    total = exp.column("c")
    scaled = exp.Div(
        this=exp.Mul(this=exp.cast(value.copy(), "NUMERIC"), expression=number(tau)),
        expression=total.copy(),
        typed=True,  # PostgreSQL's own NUMERIC division (sqlglot would otherwise divide in DOUBLE PRECISION)
    )
    return exp.Case(ifs=[exp.If(this=exp.LTE(this=total, expression=number(tau)), true=value.copy())], default=scaled)


def grouped_answer(form: AnalysisForm, plans: Sequence[UnitPlan]) -> exp.Select:
    """The answer query of a GROUP BY under a privacy unit: per group, its keys (``__key<i>``), every aggregate's
    true value (``__agg<i>``), every aggregate's truncated value at every race τ_j (``__h<i>_<j>``), the ℓ1 mass
    of the truncated contributions at τ_j (``__t<j>``) and the largest unit total touching it (audit only).

    Contribution bounding across groups and aggregates (docs/units.md): s_{u,a,g} is unit u's contribution to
    aggregate a in group g (COUNT or SUM of the clamped summand over u's join rows there), c_u = Σ_{a,g}
    |s_{u,a,g}| its total mass, and the truncated histogram at τ is H_{a,g}(τ) = Σ_u s_{u,a,g}·min(1, τ/c_u).
    Removing u (with every row referencing it) removes exactly its own s_{u,·,·}, since every join row belongs
    to one unit (plan_units checks it), and leaves every other unit's scale as it was: the whole vector H(τ)
    moves by Σ_{a,g} |s_{u,a,g}|·min(1, τ/c_u) = min(c_u, τ) ≤ τ in ℓ1. So does the mass T(τ) = Σ_u min(c_u,
    τ), restricted to any set of groups. Rows a group key puts outside the released groups still count in
    c_u, which only lowers the scales."""
    base = plans[0]
    assert all(p.histogram for p in plans)
    inner = base.query.copy()
    first = f"{CONTRIBUTION}0"
    for i, p in enumerate(plans[1:], start=1):
        item = next(e for e in p.query.expressions if e.alias == first)
        inner.select(exp.alias_(item.this.copy(), f"{CONTRIBUTION}{i}"), copy=False)
    contributions = [exp.column(f"{CONTRIBUTION}{i}") for i in range(len(plans))]
    masses = [exp.func("COALESCE", exp.Abs(this=c.copy()), exp.Literal.number(0)) for c in contributions]
    mass: exp.Expr = masses[0]
    for m in masses[1:]:
        mass = exp.Add(this=mass, expression=m)
    window = exp.Window(this=exp.Sum(this=mass.copy()), partition_by=[exp.column(UNIT_COLUMN)])
    middle = exp.select(exp.Star(), exp.alias_(mass, "m"), exp.alias_(window, "c")).from_(
        exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("per_group")))
    )
    keys = [exp.column(f"{KEY}{i}") for i in range(len(form.group_by))]
    items: list[exp.Expr] = [k.copy() for k in keys]
    items += [exp.alias_(exp.Sum(this=c.copy()), f"__agg{i}") for i, c in enumerate(contributions)]
    items += [
        exp.alias_(exp.Sum(this=_scaled(c, t)), f"__h{i}_{j}")
        for i, c in enumerate(contributions)
        for j, t in enumerate(base.thresholds)
    ]
    items += [exp.alias_(exp.Sum(this=_scaled(exp.column("m"), t)), f"__t{j}") for j, t in enumerate(base.thresholds)]
    items.append(exp.alias_(exp.Max(this=exp.column("c")), "__largest"))
    query = exp.select(*items).from_(
        exp.Subquery(this=middle, alias=exp.TableAlias(this=exp.to_identifier("per_unit")))
    )
    return query.group_by(*keys, copy=False)


def histogram_columns(groups: int, aggregates: int, races: int, index: int) -> tuple[slice, slice, int]:
    """Where a grouped answer row (:func:`grouped_answer`, without its group indices) holds aggregate
    ``index``'s truncated values, the group's masses T_g(τ_j) and its largest unit total."""
    start = groups + aggregates
    own = slice(start + index * races, start + (index + 1) * races)
    masses = slice(start + aggregates * races, start + (aggregates + 1) * races)
    return own, masses, start + (aggregates + 1) * races


def histograms(plans: Sequence[object]) -> list[UnitPlan]:
    """The plans that release a GROUP BY's histograms under a privacy unit (``UnitPlan.histogram``): their
    answer is :func:`grouped_answer`'s."""
    return [p for p in plans if isinstance(p, UnitPlan) and p.histogram]


def is_unit(plan: object) -> bool:
    """Whether ``plan`` bounds an aggregate under a privacy unit (R2T, this module)."""
    return isinstance(plan, UnitPlan)
