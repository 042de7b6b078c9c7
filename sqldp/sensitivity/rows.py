"""Row-level sensitivity: derivative of COUNT/SUM over σθ(U1 × … × Un) w.r.t. row multiplicities, with
self-join pattern unification and β-smoothing (NR §3.3.7.3; evaluation §4.3.4).

For a private table T and each of its uses i, adding a row r to T changes the count by (NR §3.3.7.3, the
product rule and θ[r/Ti])

    ∂Count/∂x_{T;r} ≤ Σ_{i: Ti = T} Count(σθ[r/Ti](∏_{j≠i} Tj))(D).

Only the columns of Ti that θ's equalities tie (transitively) to other uses matter: they form the *pattern*
of r; every other column of Ti is existentially quantified (the conjuncts that still read it are dropped,
which can only increase the count). The counts per pattern are computed by Postgres: θ with Ti's bound
columns replaced by the column they are equal to, grouped by those columns. For a table used once only the
largest count matters (the smoothing is increasing in the count); for a table used several times the
pattern maps of its uses are unified (:mod:`sqldp.sensitivity.patterns`). The other uses may grow with the
distance; :mod:`sqldp.sensitivity.smoothing` turns each count into its β-smooth bound max_k e^(−βk)·A(k). A use
that an enforced key determines (at most one row per fixed key value) does not grow ("uses a declared key
determines" below).

Units: one row of T is at distance G_T (policy ``weight``), so the sensitivity w.r.t. the metric is the
multiplicity derivative divided by G_T; the query's bound is the maximum over its private tables.

Semi-joins and anti-joins (``[NOT] EXISTS``, ``[NOT] IN (SELECT …)``, :mod:`sqldp.subqueries`): the outer
uses' derivatives are computed with the subquery's conjunct dropped (its indicator is at most 1), and a
private table T read by a subquery gets one more term, the derivative w.r.t. a row of the derived table D:
the count of outer rows that ψ ties to one row of D, by D's pattern, as for a use of T in the product. The
terms of a table add (NR §3.3.13.9, c′ + c_D·c′_D with c_D = 1).

The plan runs one scalar query (all local counts and maxima, as scalar subqueries: one round trip) plus one
grouped query per use of a self-joined private table; a data-independent bound runs only the counts it reads
("what a global bound reads" below). Some shapes are computed with less work and the same numbers: a use's
local count and a maximum that groups the same use alone share one scan (``_shared_scan``); two uses of one
table with the same own conjuncts share their local count; a maximum whose pattern columns meet only at one
equality class is computed per part of the join ("splitting a component at a separator" below) instead of
over the product of the parts; and a maximum over two uses that meet at equalities and one comparison (Q17c's
5·l1.l_quantity < l2.l_quantity) by one sorted pass instead of over every pair ("counting pairs across one
inequality" below).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlglot import exp

from sqldp import subqueries
from sqldp.catalog import Catalog, kind_of
from sqldp.errors import RefusedError
from sqldp.form import Aggregate, AnalysisForm, ColumnRef, Conjunct, SemiJoin, TableUse
from sqldp.policy import Policy
from sqldp.sensitivity.disjoint import DisjointSet
from sqldp.sensitivity.intervals import clamp_columns, domain, magnitude
from sqldp.sensitivity.model_check import keys_of
from sqldp.sensitivity.patterns import PatternMap, unify
from sqldp.sensitivity.plan import Bound, ExactUnfolded, Rows
from sqldp.sensitivity.smoothing import Growth, reach, reach_keyed, smooth_count, smooth_keyed
from sqldp.sqlgen import from_uses, where

MAX_PRODUCT_PATTERNS = 200_000  # beyond this, a self-join's pattern map is bounded use by use (still sound)


# -- equality closure -------------------------------------------------------------------------------


def _equality(conj: Conjunct) -> tuple[ColumnRef, ColumnRef] | None:
    return _pair(conj.expr)


def equality_classes(conjuncts: Sequence[Conjunct]) -> DisjointSet[ColumnRef]:
    """The transitive closure of θ's column = column conjuncts (NR §3.3.7.3): the classes of columns that are
    equal in every row of the product. Only columns in such a conjunct are elements."""
    classes: DisjointSet[ColumnRef] = DisjointSet()
    for c in conjuncts:
        pair = _equality(c)
        if pair:
            classes.add(pair[0])
            classes.add(pair[1])
            classes.merge(*pair)
    return classes


def _equal_to(classes: DisjointSet, ref: ColumnRef) -> set[ColumnRef]:
    """The columns θ makes equal to ``ref``, ``ref`` included."""
    return set(classes.subset(ref)) if ref in classes else {ref}


def _pair(e: exp.Expr) -> tuple[ColumnRef, ColumnRef] | None:
    """The two columns of a ``column = column`` conjunct, or None."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.EQ) and isinstance(e.this, exp.Column) and isinstance(e.expression, exp.Column):
        a, b = e.this, e.expression
        if a.table and b.table:
            return ColumnRef(a.table, a.name), ColumnRef(b.table, b.name)
    return None


# -- uses a declared key determines -------------------------------------------------------------------
#
# NR's A(k) = c + ∏_{j≠i}(n_j + k_j) − ∏ n_j lets every other private use grow with the distance. A use j
# whose declared key (PRIMARY KEY, or UNIQUE over NOT NULL columns: model_check.keys_of) has all its columns
# in equality classes of θ that are *fixed* — by the pattern p of the derivative's row (a class holding a
# column of Ti) or by a column of a use already fixed — has at most one row per fixed value on every database
# that satisfies the keys (an equality is never true on NULL, and all members of the class have one type, so
# "=" is the key's own equality). Closing this from p, after choosing some uses F as free (each a use whose
# key cannot be fixed, else the public ones first), every other use K is *determined*: a tuple of the
# derivative's product is a function of its F-part, so for a fixed p
#
#     Count_{D′}(p) ≤ #F-tuples_{D′}(p)  and, while every K row is an old one,
#     Count_{D′}(p) ≤ c + P·(∏_F (n_j + k_j) − ∏_F n_j),
#
# with P the public free uses' counts (a public determined use: min(n_j, 1)). A new row of a private
# determined use costs at least g = the least weight G_t of their tables; then Count_{D′}(p) ≤ c_F + P·(∏_F
# (n_j + k_j) − ∏_F n_j) at the remaining distance k − g, where c_F ≥ max_p #F-tuples_D(p) is the count of the
# free uses alone under the conjuncts that read no determined use (plus the equalities θ implies between free
# columns). So
#
#     A(k) = c + P·X(k) − P·Y                                  for k < g,
#     A(k) = max(c + P·X(k) − P·Y, c_F + P·X(k − g) − P·Y)     for k ≥ g        (X, Y: the free uses only)
#
# and the β-smooth bound is max(S(c), e^(−βg)·S(c_F)) with S the water-filling smoothing of the free uses
# (sqldp.sensitivity.smoothing.smooth_keyed). It is β-smooth on the same argument as NR §3.3.7.3's: adding a
# free row moves c, c_F and n as in NR; adding a determined row leaves n and c_F and puts c ≤ c_F; removing
# rows lowers all three; and A is increasing in c, c_F, n and k. A table with uses both free and determined
# keeps those uses free (one row would be new in both). No private table is free for a derivative → the bound
# is c_F on every database: public data only, a global sensitivity (``RowPlan.data_independent``).
#
# A semi-join's derived table D (its term counts the outer rows one row of D meets, sqldp.subqueries) is treated
# the same way: D's row is the pattern, the outer uses the others (Q21: l2.l_orderkey = l1.l_orderkey fixes
# orders' key, so only l1 grows).
#
# The neighbour relation this assumes: databases that satisfy the keys (NR §3.3.13, as the model checker's
# global bound). It holds for a catalog read from PostgreSQL, which enforces its keys (``Catalog.enforced``);
# a schema file's keys are claims nothing checks against the data, so they determine nothing here.


def _uniform(form: AnalysisForm, classes: DisjointSet, ref: ColumnRef, types: Types) -> bool:
    """Every column θ makes equal to ``ref`` has one declared type (or all are integers): then θ's "=" on them is
    the type's own equality, the one the key's uniqueness is defined by."""
    found = {_type_of(types, form.use(m.alias), m.column) for m in _equal_to(classes, ref)}
    if None in found:
        return False
    return len(found) == 1 or all(kind_of(t) == "integer" for t in found if t is not None)


def determined_uses(
    form: AnalysisForm,
    use: TableUse,
    others: Sequence[TableUse],
    classes: DisjointSet,
    keys: Keys,
    types: Types,
    private: frozenset[str],
) -> frozenset[str]:
    """The aliases of ``others`` that the pattern of ``use`` and the free uses determine through declared keys
    (the derivation above). ``keys`` holds only keys the database enforces."""
    mine = {a: [r for r in classes if r.alias == a] for a in {use.alias, *(u.alias for u in others)}}

    def keyed(u: TableUse, fixed: set[ColumnRef]) -> bool:
        for key in keys.get(u.table, ()):
            refs = [ColumnRef(u.alias, c) for c in key]
            if all(r in classes and classes[r] in fixed and _uniform(form, classes, r, types) for r in refs):
                return True
        return False

    everything = {classes[r] for refs in mine.values() for r in refs}

    def assign(banned: set[str]) -> tuple[list[str], list[str]]:
        fixed = {classes[r] for r in mine[use.alias]}
        known: list[str] = []
        free: list[str] = []
        while True:
            progress = True
            while progress:  # close: every use whose key the fixed classes hold is determined
                progress = False
                for u in others:
                    if u.alias in known or u.alias in free or u.alias in banned or not keyed(u, fixed):
                        continue
                    known.append(u.alias)
                    fixed.update(classes[r] for r in mine[u.alias])
                    progress = True
            rest = [u for u in others if u.alias not in known and u.alias not in free]
            if not rest:
                return known, free
            # free first a use no assignment can determine (Q5's lineitem: l_linenumber is in no class), then a
            # public one (it never grows), then by alias — any choice is sound, this one keeps F small
            pick = min(
                rest, key=lambda u: (u.alias not in banned and keyed(u, everything), u.table in private, u.alias)
            )
            free.append(pick.alias)
            fixed.update(classes[r] for r in mine[pick.alias])

    banned: set[str] = set()
    while True:
        known, free = assign(banned)
        free_tables = {u.table for u in others if u.alias in free and u.table in private}
        clash = {u.alias for u in others if u.alias in known and u.table in free_tables}
        if not clash:
            return frozenset(known)
        banned |= clash


# -- key columns a conjunct keeps among a few integers ----------------------------------------------------
#
# TPC-H's lineitem has the key (l_orderkey, l_linenumber): θ ties l_orderkey to orders' key, never l_linenumber,
# so above lineitem is determined by nothing and stays free (it grows with the distance, and c_F counts all of
# its rows). A conjunct ``l_linenumber BETWEEN 1 AND 7`` of θ changes that: on every database that satisfies the
# key, once the key's other columns are fixed at most 7 rows of lineitem pass θ (one per integer value of
# l_linenumber), on the data and on every neighbour alike, since the conjunct is part of the query that is
# answered. A use whose key has all its columns fixed but such *ranged* ones, with f_K the product of their
# numbers of values, is determined with fan-out f_K: for a fixed F-part a tuple of the derivative's product is
# one of at most Π_K f_K (choose each determined use's row in closing order; each choice fixes its classes),
# so with f = Π_{K private} f_K · Π_{K public} min(n_K, f_K) the derivation above (NR §3.3.7.3's A(k), the keys
# as NR §3.3.13's Dis_r) holds with P·f for P and f·c_F for c_F:
#
#     A(k) = c + f·P·(X(k) − Y)                                   for k < g,
#     A(k) = max(c + f·P·(X(k) − Y), f·c_F + f·P·(X(k − g) − Y))    for k ≥ g,
#
# β-smooth on the same argument (adding a determined row puts c ≤ f·c_F; f reads public rows only). The policy
# supplies the conjunct (``with_key_ranges``): a key column that θ does not fix, of integer type, outside the
# table's norm, with a declared range (or integer domain), gets ``col BETWEEN lo AND hi`` in the query's WHERE —
# the same bias as clamping a SUM's argument to its declared range (no row outside it is counted), none on
# data that keeps the declaration. Which uses are free is then chosen among all sets of them
# (``fanout_assignment``); the bound is the smaller of that choice's and the one without fan-outs (both are
# β-smooth upper bounds on databases that satisfy the keys).

Ranges = Mapping[ColumnRef, float]  # column → how many integers a conjunct of θ keeps it among
# a declared range or domain with more values is not added to a query: its fan-out would not beat the plain
# choice, and a long IN list would slow the statement
MAX_RANGED_VALUES = 1000


def _integer(e: exp.Expr) -> int | None:
    """The value of an integer literal (``-3`` included), else None."""
    negative = False
    while isinstance(e, (exp.Paren, exp.Neg)):
        negative ^= isinstance(e, exp.Neg)
        e = e.this
    if isinstance(e, exp.Literal) and e.is_number and re.fullmatch(r"[0-9]+", e.this):
        return -int(e.this) if negative else int(e.this)
    return None


def key_ranges(form: AnalysisForm, types: Types) -> dict[ColumnRef, float]:
    """The integer columns a conjunct of θ keeps among finitely many values: ``c BETWEEN lo AND hi`` (hi − lo + 1
    values) or ``c IN (v1, …)`` (the distinct values), with integer literals. NULL passes neither."""
    out: dict[ColumnRef, float] = {}
    for conj in form.conjuncts:
        e = conj.expr
        while isinstance(e, exp.Paren):
            e = e.this
        if not isinstance(e, (exp.Between, exp.In)) or not isinstance(e.this, exp.Column) or not e.this.table:
            continue
        ref = ColumnRef(e.this.table, e.this.name)
        if kind_of(_type_of(types, form.use(ref.alias), ref.column) or "") != "integer":
            continue
        if isinstance(e, exp.Between):
            if e.args.get("symmetric"):
                continue
            lo, hi = _integer(e.args["low"]), _integer(e.args["high"])
            if lo is None or hi is None:
                continue
            n = float(max(hi - lo + 1, 0))
        else:
            if e.args.get("query") is not None or e.args.get("unnest") is not None or e.args.get("field") is not None:
                continue
            values = [_integer(v) for v in e.expressions]
            if not values or any(v is None for v in values):
                continue
            n = float(len(set(values)))
        out[ref] = min(out.get(ref, math.inf), n)
    return out


def with_key_ranges(form: AnalysisForm, catalog: Catalog, policy: Policy) -> AnalysisForm:
    """The form with ``col BETWEEN lo AND hi`` (or ``col IN (…)``) for each column of an enforced key of a
    private-row table that θ's equalities leave free while they tie another column of that key, when the
    policy bounds the column (a declared range or integer domain), it is of integer type and outside the
    table's norm ("key columns a conjunct keeps among a few integers" above). Decided from the query's shape,
    the policy and the catalog, never the data; unchanged without enforced keys."""
    if not catalog.enforced:
        return form
    classes = equality_classes(form.conjuncts)
    types = {u.table: {c.name: c.type_sql for c in catalog.table(u.table).columns.values()} for u in form.uses}
    have = key_ranges(form, types)
    added: dict[ColumnRef, Conjunct] = {}
    for u in form.uses:
        tp = policy.table(u.table)
        if not tp.rows_private:
            continue
        for key in keys_of(catalog.table(u.table)):
            refs = [ColumnRef(u.alias, c) for c in key]
            loose = [r for r in refs if r not in classes and r not in have]
            if not loose or len(loose) == len(refs) or not any(r in classes for r in refs):
                continue
            conds = {r: _declared_range(r, u, catalog, policy) for r in loose}
            if all(c is not None for c in conds.values()):
                added.update({r: c for r, c in conds.items() if c is not None})
    if not added:
        return form
    return dataclasses.replace(form, conjuncts=(*form.conjuncts, *(added[r] for r in sorted(added, key=str))))


def _declared_range(ref: ColumnRef, use: TableUse, catalog: Catalog, policy: Policy) -> Conjunct | None:
    """``col IN (domain)`` or ``col BETWEEN lo AND hi`` from the policy's declaration of an integer column outside
    the table's norm (a value-sensitive column would make the conjunct a private filter)."""
    tp = policy.table(use.table)
    if ref.column in tp.sensitive_columns or catalog.table(use.table).column(ref.column).kind != "integer":
        return None
    cp = tp.column(ref.column)
    col = exp.column(ref.column, table=ref.alias)
    if cp.domain is not None and cp.domain and all(type(v) is int for v in cp.domain):
        values = sorted(set(cp.domain))
        if len(values) > MAX_RANGED_VALUES:
            return None
        expr: exp.Expr = exp.In(this=col, expressions=[exp.Literal.number(v) for v in values])
    elif cp.range is not None and all(math.isfinite(x) for x in cp.range):
        lo, hi = math.ceil(cp.range[0]), math.floor(cp.range[1])
        if hi < lo or hi - lo + 1 > MAX_RANGED_VALUES:
            return None
        expr = exp.Between(this=col, low=exp.Literal.number(lo), high=exp.Literal.number(hi))
    else:
        return None
    return Conjunct(expr, frozenset({ref}), False)


@dataclass(frozen=True)
class Fanned:
    """A choice of free uses with fan-outs ("key columns a conjunct keeps among a few integers"): the determined
    uses and their f_K, the scalar queries whose product is c_F (None: no private use determined), and g."""

    fanout: Mapping[str, float]
    free: tuple[int, ...] | None
    gap: float

    @property
    def determined(self) -> frozenset[str]:
        return frozenset(self.fanout)


MAX_FANOUT_CHOICES = 12  # other uses beyond this: no search over the sets of free uses (the plain choice stays)


def fanout_assignment(
    form: AnalysisForm,
    use: TableUse,
    others: Sequence[TableUse],
    classes: DisjointSet,
    keys: Keys,
    types: Types,
    private: frozenset[str],
    ranges: Ranges,
) -> dict[str, float] | None:
    """The determined uses and their fan-outs for the best set F of free uses, or None when no ranged key column
    helps. Every set F is tried: its closure (a use whose key's columns are all in fixed classes or ranged is
    determined, with f_K the product of its ranged unfixed columns' counts) must reach every other use, and no
    private table may have uses both free and determined. The least F by (free private uses that no equality ties
    to ``use``'s row — their c_F counts all their rows —, free private uses, free public uses, Π f_K, aliases)
    wins: a choice from the query's shape only."""
    if not ranges or len(others) > MAX_FANOUT_CHOICES:
        return None
    if not any(ColumnRef(u.alias, c) in ranges for u in others for key in keys.get(u.table, ()) for c in key):
        return None
    mine = {a: {classes[r] for r in classes if r.alias == a} for a in {use.alias, *(u.alias for u in others)}}
    # per use and key, per column: the class that fixes it (None: none may, see _uniform) and its range's count
    cells = {
        u.alias: [
            [
                (
                    classes[r] if r in classes and _uniform(form, classes, r, types) else None,
                    ranges.get(r),
                )
                for r in (ColumnRef(u.alias, c) for c in key)
            ]
            for key in keys.get(u.table, ())
        ]
        for u in others
    }

    def fan(u: TableUse, fixed: set[Any]) -> tuple[float, bool] | None:
        """(f_K, whether a ranged column counts in it) for the key with the least f_K, or None."""
        best = None
        for key in cells[u.alias]:
            f, ranged = 1.0, False
            for cls, count in key:
                if cls is not None and cls in fixed:
                    continue
                if count is not None:
                    f, ranged = f * count, True
                    continue
                break
            else:
                best = (f, ranged) if best is None else min(best, (f, ranged))
        return best

    tied = mine[use.alias]
    best: tuple[tuple[Any, ...], dict[str, float]] | None = None  # (cost, fan-outs)
    for size in range(len(others) + 1):
        for chosen in itertools.combinations(others, size):
            free = {u.alias for u in chosen}
            fixed = set(tied)
            for u in chosen:
                fixed |= mine[u.alias]
            known: dict[str, float] = {}
            ranged = False
            progress = True
            while progress:
                progress = False
                for u in others:
                    if u.alias in free or u.alias in known:
                        continue
                    found = fan(u, fixed)
                    if found is not None:
                        known[u.alias] = found[0]
                        ranged |= found[1]
                        fixed |= mine[u.alias]
                        progress = True
            if len(known) + len(free) < len(others):
                continue
            free_tables = {u.table for u in chosen if u.table in private}
            if any(u.alias in known and u.table in free_tables for u in others):
                continue
            untied = sum(1 for u in chosen if u.table in private and not mine[u.alias] & tied)
            cost = (
                not ranged,  # the plain choice covers those without a ranged column
                untied,
                sum(1 for u in chosen if u.table in private),
                sum(1 for u in chosen if u.table not in private),
                math.prod(known.values()),
                sorted(free),
            )
            if best is None or cost < best[0]:
                best = (cost, known)
    if best is None or best[0][0]:
        return None  # no ranged column in any closure: the plain choice covers it
    return best[1]


def free_term(form: AnalysisForm, use: TableUse, classes: DisjointSet, determined: frozenset[str]) -> UseTerm:
    """The derivative's term over the free uses alone (c_F above): the conjuncts that read no determined use,
    plus, per equality class, the equalities θ implies between its members outside the determined uses (Q9's
    l_suppkey = ps_suppkey when s_suppkey, between them, is determined). Its count bounds the free parts of
    the full term's tuples."""
    kept = [c for c in form.conjuncts if not any(r.alias in determined for r in c.columns)]
    present = {frozenset(pair) for c in kept if (pair := _equality(c))}
    for members in classes.subsets():
        rest = sorted((m for m in members if m.alias not in determined), key=str)
        for a, b in itertools.pairwise(rest):
            if frozenset((a, b)) not in present:
                kept.append(Conjunct(exp.EQ(this=_col(a), expression=_col(b)), frozenset((a, b)), False))
    uses = tuple(u for u in form.uses if u.alias not in determined)
    reduced = dataclasses.replace(form, uses=uses, conjuncts=tuple(kept), semijoins=())
    return use_term(reduced, use, equality_classes(reduced.conjuncts))


# -- the per-use derivative query --------------------------------------------------------------------


@dataclass(frozen=True)
class UseTerm:
    """What is known about the derivative through one private use i."""

    use: TableUse
    others: tuple[TableUse, ...]
    pattern: tuple[str, ...]  # columns of Ti bound by θ's equalities (NR: the non-* cells)
    reps: tuple[exp.Column, ...]  # for each, the column of another use it equals
    conjuncts: tuple[exp.Expr, ...]  # θ[r/Ti] with the conjuncts that still read Ti dropped


def use_term(form: AnalysisForm, use: TableUse, classes: DisjointSet) -> UseTerm:
    others = tuple(u for u in form.uses if u.alias != use.alias)
    other_aliases = {u.alias for u in others}
    mapping: dict[str, exp.Column] = {}
    pattern: list[str] = []
    for ref in sorted({r for c in form.conjuncts for r in c.columns if r.alias == use.alias}, key=str):
        if ref not in classes:
            continue
        peers = sorted((m for m in classes.subset(ref) if m.alias in other_aliases), key=str)
        if peers:
            pattern.append(ref.column)
            mapping[ref.column] = exp.column(peers[0].column, table=peers[0].alias)

    def bind(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == use.alias and node.name in mapping:
            return mapping[node.name].copy()
        return node

    kept = []
    for c in form.conjuncts:
        bound = c.expr.copy().transform(bind)
        if any(col.table == use.alias for col in bound.find_all(exp.Column)):
            continue  # reads a *-cell of Ti: existentially true (NR: sup over the extensions of r)
        kept.append(bound)
    return UseTerm(use, others, tuple(pattern), tuple(mapping[c] for c in pattern), tuple(kept))


def _components(term: UseTerm) -> list[tuple[list[TableUse], list[exp.Expr], list[int]]]:
    """Split the other uses into groups connected by the kept conjuncts: the count factorises over them
    (a product of independent counts), which keeps the queries from forming cross products."""
    connected = DisjointSet(u.alias for u in term.others)
    refs = [sorted({c.table for c in e.find_all(exp.Column) if c.table}) for e in term.conjuncts]
    for r in refs:
        for a, b in itertools.pairwise(r):
            connected.merge(a, b)
    groups: dict[str, tuple[list[TableUse], list[exp.Expr], list[int]]] = {}
    for u in term.others:
        groups.setdefault(connected[u.alias], ([], [], []))[0].append(u)
    first = connected[term.others[0].alias]
    for e, r in zip(term.conjuncts, refs, strict=True):
        groups[connected[r[0]] if r else first][1].append(e)
    for k, rep in enumerate(term.reps):
        groups[connected[rep.table]][2].append(k)
    return list(groups.values())


def _count_query(uses: list[TableUse], conds: list[exp.Expr], keys: list[exp.Expr]) -> exp.Select:
    items: list[exp.Expr] = [exp.alias_(k.copy(), f"p{i}") for i, k in enumerate(keys)]
    items.append(exp.alias_(exp.Count(this=exp.Star()), "n"))
    q = where(from_uses(exp.select(*items), uses), conds)
    if keys:
        q = q.group_by(*(k.copy() for k in keys), copy=False)
    return q


def _max_of(q: exp.Select) -> exp.Select:
    return exp.select(exp.func("COALESCE", exp.func("MAX", exp.column("n")), exp.Literal.number(0))).from_(
        exp.Subquery(this=q, alias=exp.TableAlias(this=exp.to_identifier("s")))
    )


Keys = Mapping[str, tuple[tuple[str, ...], ...]]  # table → its declared primary and unique keys
Types = Mapping[str, Mapping[str, str]]  # table → column → its declared SQL type (Catalog.sqlglot_schema)


def _max_count(
    uses: list[TableUse],
    conds: list[exp.Expr],
    keys: list[exp.Expr],
    declared: Keys,
    types: Types,
    private: frozenset[str],
    enforced: Keys | None = None,
) -> exp.Select:
    """max over the key values of the component's count: ``MAX(n)`` over its ``GROUP BY keys`` — or the same
    number without forming the product: per part when a separator splits the keys apart (:func:`_split`), by a
    running count when two uses meet at equalities and one inequality (:func:`_pair_count`), by a COUNT capped
    at 1 when the keys hold a key PostgreSQL enforces on the one use (``enforced``, :func:`_unique`)."""
    pairs = _pair_count(uses, conds, keys, types)
    if pairs is not None:
        return pairs
    if _unique(uses, keys, enforced or {}):
        # every group of the GROUP BY is one row (the keys hold an enforced key of the one use): its largest
        # count is 1 when some row passes the conjuncts, else 0 — one COUNT instead of a GROUP BY
        return where(from_uses(exp.select(_at_most_one(exp.Count(this=exp.Star()))), uses), conds)
    grouped = _max_of(_count_query(uses, conds, keys))
    split = _split(uses, conds, keys, declared)
    return grouped if split is None else _factorised(split, grouped, private)


def _unique(uses: Sequence[TableUse], keys: Sequence[exp.Expr], enforced: Keys) -> bool:
    """One use whose GROUP BY ``keys`` hold all the columns of a key PostgreSQL enforces on its table (PRIMARY KEY,
    or UNIQUE over NOT NULL columns: model_check.keys_of). No two rows then agree on the key under its own
    equality, which is GROUP BY's on the same columns, and no key column is NULL: every group is one row, on every
    database the server accepts (the neighbours the guarantee covers satisfy the keys too, "uses a declared key
    determines" above)."""
    if len(uses) != 1 or not keys or not all(isinstance(k, exp.Column) and k.table == uses[0].alias for k in keys):
        return False
    names = {k.name for k in keys}
    return any(set(key) <= names for key in enforced.get(uses[0].table, ()))


def _at_most_one(count: exp.Expr) -> exp.Expr:
    """LEAST(count, 1): the largest group count when every group is one row (1 if any, else 0)."""
    return exp.func("LEAST", count, exp.Literal.number(1))


# -- splitting a component at a separator ------------------------------------------------------------
#
# The derivative through use i is a maximum over patterns p of Count(σθ[p/Ti](∏_{j≠i} Tj)) (NR §3.3.7.3),
# computed as MAX(COUNT(*)) over a GROUP BY of the pattern's columns (the keys). When the keys sit in uses
# that θ links only through one equality class z (Q5's derivative for orders: customer and lineitem meet
# only at c_nationkey = s_nationkey, many-to-many), that GROUP BY forms every (customer, lineitem) pair of a
# nation. Removing z's equalities splits the component into parts P_1 … P_m; with A_q(k_q, v) the count of
# P_q's rows whose keys are k_q and whose z-columns all equal v (θ restricted to P_q),
#
#     Count(k) = Σ_v ∏_q A_q(k_q, v)        (θ ⇔ θ_1 ∧ … ∧ θ_m ∧ all z-columns equal; distributivity)
#
# and F = max_v ∏_q max_{k_q} A_q(k_q, v) ≥ max_k Count(k) always. F is exact when some part q is
# *functional*: each k_q meets at most one v in A_q (a keyless part: at most one v at all). Proof: then
# Count(k) = ∏_q A_q(k_q, v(k_q)) ≤ F for every k; and at the v* attaining F, the k_q maximising each
# A_q(·, v*) give Count = F, since the functional part's k_q meets no other v. Functionality is checked in
# the same statement; where it fails the statement falls back to the GROUP BY above (PostgreSQL evaluates a
# CASE branch's uncorrelated subquery only when the branch is taken), so the number is always today's.
# Which separator to try is chosen from the declared keys (a part whose keys determine v through primary
# keys and equalities is likely functional); the choice only decides the speed, the check decides the number.
# Components with no such separator (a cycle through two classes, an inequality across the parts: Q17c's
# 5·l1.l_quantity < l2.l_quantity) keep the GROUP BY.


@dataclass(frozen=True)
class _Part:
    uses: tuple[TableUse, ...]
    conds: tuple[exp.Expr, ...]  # θ restricted to the part, with its z-columns equated to ``rep``
    rep: exp.Column  # the part's column of the separator class: v
    keys: tuple[exp.Expr, ...]  # the keys (pattern columns) in the part
    checked: bool = False  # likely functional by the declared keys: the statement checks it (the others are
    # taken as not functional, which can only send the statement to the fallback: never a different number)


def _split(uses: list[TableUse], conds: list[exp.Expr], keys: list[exp.Expr], declared: Keys) -> list[_Part] | None:
    """The parts of the best separator class that puts keys into two parts or more, one of them likely
    functional by the declared keys, or None."""
    pairs = [_pair(c) for c in conds]
    classes: DisjointSet[ColumnRef] = DisjointSet()
    for pair in pairs:
        if pair:
            classes.add(pair[0])
            classes.add(pair[1])
            classes.merge(*pair)
    key_tables = [{c.table for c in k.find_all(exp.Column)} for k in keys]
    if any(len(t) != 1 for t in key_tables):
        return None
    candidates: list[tuple[tuple[int, int, int], list[_Part]]] = []
    for z in classes.subsets():
        if len({r.alias for r in z}) < 2:
            continue
        linked = DisjointSet(u.alias for u in uses)
        inside = [p is not None and p[0] in z and p[1] in z for p in pairs]
        for c, is_z in zip(conds, inside, strict=True):
            if not is_z:
                for a, b in itertools.pairwise(sorted({col.table for col in c.find_all(exp.Column)})):
                    linked.merge(a, b)
        groups = [sorted(g) for g in linked.subsets()]
        if len(groups) < 2:
            continue
        parts = []
        for aliases in sorted(groups):
            members = set(aliases)
            zcols = sorted({r for r in z if r.alias in members}, key=str)
            if not zcols:
                break  # a part θ does not reach through z (cannot happen in one component): no split
            rep = zcols[0]
            own = [
                c
                for c, p, is_z in zip(conds, pairs, inside, strict=True)
                if {col.table for col in c.find_all(exp.Column)} <= members
                and (not is_z or (p is not None and p[0].alias in members and p[1].alias in members))
            ]
            # θ's z-equalities that cross parts are replaced by "every z-column of the part equals rep" (and
            # rep = rep: not NULL, as any equality requires), the parts then meet on v
            equate = [exp.EQ(this=_col(r), expression=_col(rep)) for r in zcols]
            parts.append(
                _Part(
                    tuple(u for u in uses if u.alias in members),
                    (*own, *equate),
                    _col(rep),
                    tuple(k for k, t in zip(keys, key_tables, strict=True) if t <= members),
                )
            )
        else:
            held = sum(1 for p in parts if p.keys)
            parts = [dataclasses.replace(p, checked=_determines(p, declared)) for p in parts]
            if held >= 2 and _covers(conds, parts) and any(p.checked for p in parts):
                # most parts holding keys first, then the smallest largest part (the cheapest A_q)
                rank = (-held, max(len(p.uses) for p in parts), -len(parts))
                candidates.append((rank, parts))
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[0])[1]


def _determines(part: _Part, declared: Keys) -> bool:
    """Whether the part's keys determine v by the declared keys: the closure of the key columns under the
    part's equalities and its tables' primary and unique keys holds ``rep`` (a guess about the data only)."""
    known = {ColumnRef(k.table, k.name) for k in part.keys if isinstance(k, exp.Column)}
    whole: set[str] = set()  # uses all of whose columns are determined
    pairs = [p for p in map(_pair, part.conds) if p is not None]
    changed = True
    while changed:
        changed = False
        for a, b in pairs:
            for x, y in ((a, b), (b, a)):
                if (x in known or x.alias in whole) and y not in known:
                    known.add(y)
                    changed = True
        for u in part.uses:
            if u.alias not in whole and any(
                ks and all(ColumnRef(u.alias, c) in known for c in ks) for ks in declared.get(u.table, ())
            ):
                whole.add(u.alias)
                changed = True
    rep = ColumnRef(part.rep.table, part.rep.name)
    return rep in known or rep.alias in whole


def _covers(conds: list[exp.Expr], parts: list[_Part]) -> bool:
    """Every conjunct of θ is a z-equality or lies within one part (so θ ⇔ the parts' θ and z)."""
    placed = {id(c) for p in parts for c in p.conds}
    members = [{u.alias for u in p.uses} for p in parts]
    for c in conds:
        if id(c) in placed:
            continue
        pair = _pair(c)
        if pair is None or any({pair[0].alias, pair[1].alias} <= m for m in members):
            return False
    return True


def _col(ref: ColumnRef) -> exp.Column:
    return exp.column(ref.column, table=ref.alias)


def _factorised(parts: list[_Part], fallback: exp.Select, private: frozenset[str]) -> exp.Select:
    """CASE WHEN some part is functional THEN F ELSE ``fallback`` END (the derivation above)."""
    subs = []
    # parts cheap to read whole: no keys, or public tables only (Q5's nation ⋈ region) — a guess about speed only
    small = [p for p in parts if not p.keys or all(u.table not in private for u in p.uses)]
    for q, part in enumerate(parts):
        items = [exp.alias_(k.copy(), f"k{i}") for i, k in enumerate(part.keys)]
        items += [exp.alias_(part.rep.copy(), "v"), exp.alias_(exp.Count(this=exp.Star()), "n")]
        conds = list(part.conds)
        if part.keys and not part.checked:
            # only the v that every other part holds survive F's inner join on v (Q5's nation ⋈ region: the 5
            # nations of ASIA): A_q(k, v) at any other v never enters F, so those rows need not be grouped.
            # A_q at the v kept is unchanged (its rows are all kept), and a checked part keeps every row: its
            # functional check counts the v its keys meet over all of them, as before. The supports read are
            # those of the small parts (another's would cost a scan of its own).
            for other in (p for p in small if p is not part):
                support = where(from_uses(exp.select(other.rep.copy()), other.uses), other.conds)
                conds.append(exp.In(this=part.rep.copy(), query=exp.Subquery(this=support)))
        a = where(from_uses(exp.select(*items), part.uses), conds)
        a = a.group_by(*(k.copy() for k in part.keys), part.rep.copy(), copy=False)
        source = exp.Subquery(this=a, alias=exp.TableAlias(this=exp.to_identifier("a")))
        items = [exp.column("v"), exp.alias_(exp.func("MAX", exp.column("n")), "n")]
        if part.checked:
            # nv: how many values v the row's keys meet (COUNT over the keys' partition of the grouped rows)
            over = exp.Window(
                this=exp.Count(this=exp.Star()), partition_by=[exp.column(f"k{i}") for i in range(len(part.keys))]
            )
            if not part.keys:
                over = exp.Window(this=exp.Count(this=exp.Star()), over="OVER")
            per_row = exp.select(exp.column("v"), exp.column("n"), exp.alias_(over, "nv")).from_(source)
            source = exp.Subquery(this=per_row, alias=exp.TableAlias(this=exp.to_identifier("r")))
            items.append(exp.alias_(exp.func("MAX", exp.column("nv")), "nv"))
        m = exp.select(*items).from_(source).group_by(exp.column("v"), copy=False)
        subs.append(exp.Subquery(this=m, alias=exp.TableAlias(this=exp.to_identifier(f"m{q}"))))
    product: exp.Expr = exp.cast(exp.column("n", table="m0"), "NUMERIC")  # a product of counts passes BIGINT
    for q in range(1, len(parts)):
        product = exp.Mul(this=product, expression=exp.column("n", table=f"m{q}"))
    functional = exp.or_(
        *(
            exp.LTE(
                this=exp.func("COALESCE", exp.func("MAX", exp.column("nv", table=f"m{q}")), exp.Literal.number(0)),
                expression=exp.Literal.number(1),
            )
            for q, part in enumerate(parts)
            if part.checked
        )
    )
    best = exp.func("COALESCE", exp.func("MAX", product), exp.Literal.number(0))
    choice = exp.Case(ifs=[exp.If(this=functional, true=best)], default=exp.Subquery(this=fallback))
    out = exp.select(exp.alias_(choice, "n")).from_(subs[0])
    for q in range(1, len(parts)):
        on = exp.EQ(this=exp.column("v", table=f"m{q}"), expression=exp.column("v", table="m0"))
        out = out.join(subs[q], on=on, join_type="inner", copy=False)
    return out


# -- counting pairs across one inequality -----------------------------------------------------------
#
# Q17c's derivative for part is max over k of the number of pairs (l1, l2) of lineitem rows with
# l1.l_partkey = l2.l_partkey = k and 5·l1.l_quantity < l2.l_quantity: the GROUP BY forms every pair of a key
# (quadratic in the rows per key). In general, a component of two uses X and Y whose conjuncts are X's own,
# Y's own, equalities X.x_i = Y.y_i (the join, j) and one comparison f(X) op g(Y) counts, per key,
#
#     N(k) = Σ_{x ∈ X_k} #{y ∈ Y_k : f(x) op g(y)}
#
# where X_k are X's rows passing its own conjuncts with join values j (non-NULL: an equality never holds for
# NULL) whose key columns are k, likewise Y_k. One sorted pass gives every term: put X's rows (value f, b = 0)
# and Y's (value g, b = 1) in one list, partition it by j and order each partition so that the rows of Y
# satisfying f(x) op g(y) are exactly those before x: for op = "<" by value descending with X first among
# equal values (an equal g is not counted), "<=" the same with Y first, ">" and ">=" ascending likewise. The
# running SUM(b) at x (a ROWS frame: x itself adds 0) is then x's term, and N(k) the sum of the terms of X's
# rows with key k. Rows whose f or g is NULL compare to nothing and are left out; numeric NaN sorts above
# every number and equals itself, as "<" says. The order is the type's own only when the sort and the
# comparison use the same operator family: both sides must be exact numbers (integer or NUMERIC columns; the
# UNION's common type is then an integer type or NUMERIC, exact for both) and each join pair of one type
# (or both integers), so that PARTITION BY groups exactly the values "=" equates.
# The pass evaluates f and g on rows the join may never pair, so they must not be able to fail: a column
# alone, or +, −, × of NUMERIC columns and number literals (no division, no integer overflow; a NUMERIC
# product that could pass NUMERIC's range is refused before any data is read, sqldp.sensitivity.failures).
# Groups with no pair appear with N(k) = 0, which leaves the maximum unchanged (COALESCE(MAX, 0) as before).

# comparison → (order by value descending, the counted side first among equal values)
_SORTS: dict[type[exp.Expr], tuple[bool, bool]] = {
    exp.LT: (True, False),
    exp.LTE: (True, True),
    exp.GT: (False, False),
    exp.GTE: (False, True),
}


def _type_of(types: Types, use: TableUse, column: str) -> str | None:
    return types.get(use.table, {}).get(column)


def _exact_number(type_sql: str | None, *, numeric_only: bool = False) -> bool:
    if type_sql is None:
        return False
    head = type_sql.upper().split("(")[0].strip()
    if head in ("DECIMAL", "NUMERIC"):
        return True
    return not numeric_only and kind_of(type_sql) == "integer"


def _safe_value(e: exp.Expr, use: TableUse, types: Types) -> bool:
    """An exact-number expression over ``use`` that cannot raise: a column, or +, −, × of NUMERIC columns and
    number literals."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Column):
        return e.table == use.alias and _exact_number(_type_of(types, use, e.name))
    arithmetic = False
    for node in e.walk(prune=lambda n: isinstance(n, exp.Column)):
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Neg)):
            arithmetic = True
        elif isinstance(node, exp.Column):
            if node.table != use.alias or not _exact_number(_type_of(types, use, node.name), numeric_only=True):
                return False
        elif isinstance(node, exp.Literal):
            if node.is_string:
                return False
        elif not isinstance(node, exp.Paren):
            return False
    return arithmetic


def _pair_count(uses: list[TableUse], conds: list[exp.Expr], keys: list[exp.Expr], types: Types) -> exp.Select | None:
    """The component's max over keys of its count, as one sorted pass (the derivation above), or None when the
    component is not two uses meeting at equalities and one comparison of exact numbers."""
    if len(uses) != 2 or not keys:
        return None
    byalias = {u.alias: u for u in uses}
    own: dict[str, list[exp.Expr]] = {u.alias: [] for u in uses}
    joins: list[tuple[ColumnRef, ColumnRef]] = []
    comparison: tuple[type[exp.Expr], exp.Expr, exp.Expr] | None = None
    for c in conds:
        tables = {col.table for col in c.find_all(exp.Column)}
        if len(tables) == 1 and tables <= own.keys():
            own[next(iter(tables))].append(c)
            continue
        pair = _pair(c)
        if pair is not None and {pair[0].alias, pair[1].alias} == own.keys():
            joins.append(pair)
            continue
        e = c
        while isinstance(e, exp.Paren):
            e = e.this
        if comparison is not None or type(e) not in _SORTS:
            return None
        left = {col.table for col in e.this.find_all(exp.Column)}
        right = {col.table for col in e.expression.find_all(exp.Column)}
        if len(left) != 1 or len(right) != 1 or left == right or not (left | right) <= own.keys():
            return None
        comparison = (type(e), e.this, e.expression)
    if comparison is None or not joins:
        return None
    op, lhs, rhs = comparison
    x = byalias[next(col.table for col in lhs.find_all(exp.Column))]
    y = next(u for u in uses if u.alias != x.alias)
    if not (_safe_value(lhs, x, types) and _safe_value(rhs, y, types)):
        return None
    # each join pair as (X's column, Y's column), of one type (or both integers)
    sides = [(a, b) if a.alias == x.alias else (b, a) for a, b in joins]
    for a, b in sides:
        ta, tb = _type_of(types, x, a.column), _type_of(types, y, b.column)
        if ta is None or tb is None or not (ta == tb or kind_of(ta) == kind_of(tb) == "integer"):
            return None
    positions = []
    for k in keys:
        if not isinstance(k, exp.Column):
            return None
        ref = ColumnRef(k.table, k.name)
        found = [i for i, (a, b) in enumerate(sides) if ref in (a, b)]
        if not found:
            return None
        positions.append(found[0])
    descending, counted_first = _SORTS[op]

    def branch(use: TableUse, columns: list[ColumnRef], value: exp.Expr, mark: int) -> exp.Select:
        items = [exp.alias_(_col(r), f"j{i}") for i, r in enumerate(columns)]
        items += [exp.alias_(value.copy(), "v"), exp.alias_(exp.Literal.number(mark), "b")]
        present = [exp.Not(this=exp.Is(this=e, expression=exp.Null())) for e in (*map(_col, columns), value.copy())]
        return where(from_uses(exp.select(*items), [use]), [*own[use.alias], *present])

    union = exp.union(
        branch(x, [a for a, _ in sides], lhs, 0), branch(y, [b for _, b in sides], rhs, 1), distinct=False
    )
    part = [exp.column(f"j{i}") for i in range(len(sides))]
    order = [
        exp.Ordered(this=exp.column("v"), desc=descending),
        exp.Ordered(this=exp.column("b"), desc=counted_first),
    ]
    frame = exp.WindowSpec(kind="ROWS", start="UNBOUNDED", start_side="PRECEDING", end="CURRENT ROW")
    running = exp.Window(
        this=exp.func("SUM", exp.column("b")), partition_by=part, order=exp.Order(expressions=order), spec=frame
    )
    w = exp.select(*(exp.column(f"j{i}") for i in range(len(sides))), exp.column("b"), exp.alias_(running, "r"))
    w = w.from_(exp.Subquery(this=union, alias=exp.TableAlias(this=exp.to_identifier("u"))))
    per_key = exp.select(exp.alias_(exp.func("SUM", exp.column("r")), "n"))
    per_key = per_key.from_(exp.Subquery(this=w, alias=exp.TableAlias(this=exp.to_identifier("w"))))
    per_key = per_key.where(exp.EQ(this=exp.column("b"), expression=exp.Literal.number(0)))
    per_key = per_key.group_by(*(exp.column(f"j{i}") for i in dict.fromkeys(positions)), copy=False)
    return _max_of(per_key)


# -- the plan --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _UsePlan:
    term: UseTerm
    factors: tuple[tuple[int, ...], ...]  # per component: indices of its scalar query (max count) or pattern query
    pattern_queries: tuple[int, ...] = ()  # for self-joins: indices into the plan's grouped queries
    pattern_columns: tuple[tuple[int, ...], ...] = ()  # per pattern query: which pattern columns it returns
    # the other uses a declared key determines (determined_uses), the scalar queries whose product is c_F (the
    # free uses' count alone; None when no private use is determined) and g, the least weight of a determined
    # private table (∞: none)
    determined: frozenset[str] = frozenset()
    free: tuple[int, ...] | None = None
    gap: float = math.inf
    fanned: Fanned | None = None  # the choice with ranged key columns, when it differs


@dataclass(frozen=True)
class _SemiPlan:
    """The derivative w.r.t. a row of a semi-join's derived table D: its largest count is the product of
    ``factors`` (indices of scalar queries), over the outer uses ``term.others``."""

    semi: SemiJoin
    term: UseTerm
    factors: tuple[int, ...]
    # as _UsePlan's: the outer uses a declared key determines for D's row, c_F's scalar queries, g
    determined: frozenset[str] = frozenset()
    free: tuple[int, ...] | None = None
    gap: float = math.inf
    fanned: Fanned | None = None


def semi_form(form: AnalysisForm, semi: SemiJoin) -> AnalysisForm:
    """The outer query joined with D by ψ (sqldp.subqueries, argument 2), D a use of the product."""
    conds = tuple(Conjunct(e, frozenset(ColumnRef(c.table, c.name) for c in e.find_all(exp.Column)), False)
                  for e in semi.correlation)  # fmt: skip
    return dataclasses.replace(form, uses=(*form.uses, semi.use), conjuncts=(*form.conjuncts, *conds), semijoins=())


def semi_term(form: AnalysisForm, semi: SemiJoin) -> UseTerm:
    """The use term of D's row in :func:`semi_form`. D's columns that ψ's equalities tie to outer columns are its
    pattern; ψ's other conjuncts that read D are dropped."""
    joined = semi_form(form, semi)
    return use_term(joined, semi.use, equality_classes(joined.conjuncts))


# -- what a global bound reads -----------------------------------------------------------------------------
#
# A data-independent plan (``RowPlan.data_independent``) bounds the count of each private use whose other
# private uses a choice of free uses determines by f·c_F, the least over those choices (``_smoother``): on
# every database that satisfies the enforced keys the count c is at most f·c_F ("uses a declared key
# determines" and "key columns a conjunct keeps among a few integers" above, NR §3.3.7.3 with A(k) constant;
# TPC-H Q12: one orders row meets at most 7 lineitem rows, (l_orderkey, l_linenumber) being lineitem's key and
# the answer reading l_linenumber BETWEEN 1 AND 7, so f = 7 and c_F = 1). f·c_F reads c_F's scalar queries
# (counts over public free uses; none when every other use is determined) and the local counts of public
# determined uses (min(n_j, f_j)), nothing else. The count c at the data, the private uses' local counts and a
# self-join's pattern maps feed only the audit's "derivative" (the unsmoothed count at D), so they are not run
# (``unread``, ``RowPlan.without_unread``): Q12's statement grouping lineitem by l_orderkey goes, the bound is
# the same. A use whose other uses are all public is bounded by its count itself (over public rows only), and
# the counts of a table's uses unify: such a table keeps every query of its uses.


@dataclass(frozen=True)
class RowPlan(ExactUnfolded):
    """SQL for Postgres and how to turn its results into a β-smooth bound (the plan contract)."""

    form: AnalysisForm
    aggregate: Aggregate  # the released aggregate (SUM over clamped columns)
    multiplier: float  # max |e| for SUM(e), 1 for COUNT
    scalars: tuple[exp.Expr, ...]  # scalar subqueries, run together as one SELECT
    grouped: tuple[exp.Select, ...]  # pattern maps of self-joined uses
    uses: tuple[_UsePlan, ...]
    local: dict[str, int]  # use alias → index of its local count in the scalar row
    weights: dict[str, float]  # private table → G
    private: frozenset[str]
    disjoint_groups: bool
    semis: tuple[_SemiPlan, ...] = ()  # one per semi-join reading a private table
    # scans two scalars share (_shared_scan): the grouped scan, and which scalar reads its total or its best
    shared: tuple[tuple[exp.Select, dict[int, str]], ...] = ()
    # the scalar and pattern queries a data-independent bound does not read ("what a global bound reads" below):
    # not run; ``bind`` holds NaN and None in their places, and a bound that read one would fail, not answer
    unread: frozenset[int] = frozenset()
    unread_grouped: frozenset[int] = frozenset()

    @property
    def change_distances(self) -> frozenset[float]:
        """The distances of the neighbouring changes that move this aggregate: one row of a private table t is at
        its weight G_t (row-level privacy: no value changes)."""
        return frozenset(self.weights[t] for t in self.private) or frozenset({1.0})

    @property
    def query_count(self) -> int:
        """``len(self.queries)`` without building them: the runner and ColumnPlan.bind ask it at every run."""
        return (1 if len(self.unread) < len(self.scalars) else 0) + len(self.grouped) - len(self.unread_grouped)

    @property
    def queries(self) -> tuple[exp.Select, ...]:
        head = []
        read = [i for i in range(len(self.scalars)) if i not in self.unread]
        if read:
            source = {i: (f"g{j}", column) for j, (_, reads) in enumerate(self.shared) for i, column in reads.items()}
            source = _twins(self.scalars, source)
            items = [
                exp.alias_(
                    exp.column(source[i][1], table=source[i][0]) if i in source else exp.Subquery(this=self.scalars[i]),
                    f"v{i}",
                )
                for i in read
            ]
            select = exp.select(*items)
            scans = {source[i][0] for i in read if i in source}  # a shared scan none of whose numbers is read goes
            for j, (scan, _) in enumerate(self.shared):
                if f"g{j}" not in scans:
                    continue
                table = exp.Subquery(this=scan.copy(), alias=exp.TableAlias(this=exp.to_identifier(f"g{j}")))
                first = select.args.get("from_") is None and select.args.get("from") is None
                select = select.from_(table, copy=False) if first else select.join(table, join_type="cross", copy=False)
            head = [select]
        return (*head, *(q for k, q in enumerate(self.grouped) if k not in self.unread_grouped))

    def _fetched(self, results: Sequence[Rows]) -> tuple[list[float], list[Rows]]:
        """The scalar row's numbers and the pattern queries' rows, in plan order: NaN and no rows for the queries
        that are not run (``unread``)."""
        scal = [math.nan] * len(self.scalars)
        rest = iter(results)
        if len(self.unread) < len(self.scalars):
            row = next(rest)[0]
            for value, i in zip(row, (i for i in range(len(self.scalars)) if i not in self.unread), strict=True):
                scal[i] = float(value or 0)
        grouped: list[Rows] = [[] if k in self.unread_grouped else next(rest) for k in range(len(self.grouped))]
        return scal, grouped

    def settled(self, p: _UsePlan) -> bool:
        """Whether a data-independent plan bounds ``p``'s count by f·c_F alone (a choice of free uses that
        determines every other private use, with c_F over public uses only, ``_smoother``): then the count c it
        read at the data is not part of the bound."""
        return self.data_independent and any(c.free is not None for c in _covering(p, self.private))

    @property
    def data_independent(self) -> bool:
        """True when no private use's derivative reads another private use that a declared key does not
        determine: then every derivative counts public rows only (or is 1) or is bounded by c_F, the count of
        its free uses alone, which are all public ("uses a declared key determines" above: the count is at most
        c_F on every database that satisfies the keys); no growth term exists (``Growth.static``), and the bound
        is the same on every database that differs in private rows — a global sensitivity, which needs no
        smoothing (NR §3.3.7.3 with A(k) constant). Decided from the query's shape, the policy and the
        enforced keys, never the data."""
        uses = all(_covering(p, self.private) for p in self.uses)
        return uses and all(o.table not in self.private for s in self.semis for o in s.term.others)

    @property
    def keyed(self) -> bool:
        """Whether a declared key determines a private use for some derivative (the bound relies on the keys)."""
        plans: list[_UsePlan | _SemiPlan] = [*self.uses, *self.semis]
        return any(p.free is not None or p.fanned is not None for p in plans)

    def bind(self, results: Sequence[Rows]) -> Callable[[float], Bound]:
        """Read the query results once — the counts, the unified pattern maps of self-joined tables, the
        growth of the other uses, none of which depends on β — and return the bound as a function of β
        (the release step evaluates it on the whole β grid of Theorem 3.73)."""
        scal, grouped = self._fetched(results)
        per_table = []
        for table in sorted(self.private):
            plans = [p for p in self.uses if p.term.use.table == table]
            vectors = self._counts(plans, scal, grouped)
            static = self.data_independent
            smoothers = [self._smoother(p, scal, static) for p in plans]
            mine = [s for s in self.semis if s.semi.use.table == table]
            semis = [
                (
                    math.prod(scal[i] for i in s.factors),
                    self._smoother(s, scal, static),
                )
                for s in mine
            ]
            per_table.append((table, plans, vectors, smoothers, mine, semis))

        def at(beta: float) -> Bound:
            terms: dict[str, dict[str, Any]] = {}
            best = 0.0
            for table, plans, vectors, smoothers, mine, semis in per_table:
                smoothed = 0.0
                witness: tuple[float, ...] = ()
                for vec in vectors:
                    total = _computed(sum(smooth(c, beta) for c, smooth in zip(vec, smoothers, strict=True)))
                    if total >= smoothed:
                        smoothed, witness = total, vec
                # the derived tables' terms add to the product's (sqldp.subqueries, arguments 2 and 3)
                derived = {s.semi.use.alias: smooth(c, beta) for s, (c, smooth) in zip(mine, semis, strict=True)}
                smoothed += sum(derived.values())
                witness += tuple(c for c, _ in semis)
                g_t = self.weights[table]
                sens = self.multiplier * smoothed / g_t
                best = max(best, _computed(sens))
                terms[table] = {"uses": [p.term.use.alias for p in plans] + list(derived), "weight": g_t}
                derivative = self.multiplier * sum(witness)  # the unsmoothed count derivative at D
                if not math.isnan(derivative):  # a settled bound reads no count at D: none to show
                    terms[table]["derivative"] = derivative
                terms[table].update(smooth_derivative=self.multiplier * smoothed, sensitivity=sens)
                if derived:  # per derived table, its smoothed count (the value-level analysis of subqueries reads it)
                    terms[table]["derived_tables"] = {a: self.multiplier * v for a, v in derived.items()}
            return Bound(best, terms)

        return at

    def finish(self, results: Sequence[Rows], beta: float) -> Bound:
        """The bound at one β; it does not depend on the group, it is an upper bound for every group."""
        return self.bind(results)(beta)

    def reach(self, results: Sequence[Rows]) -> dict[str, Callable[[float], float]]:
        """Per private table, k ↦ the bound on its count derivative at distance k whose e^(−βk)-weighted maximum is
        the smooth bound (NR §3.3.7.3's A(k); with determined uses the smaller of the keyed and the plain one), each
        use at its largest count; semi-joins' derived tables are left out. The brute-force tests compare it with
        the local sensitivity at distance k."""
        scal, grouped = self._fetched(results)
        out: dict[str, Callable[[float], float]] = {}
        for table in sorted(self.private):
            plans = [p for p in self.uses if p.term.use.table == table]
            vectors = self._counts(plans, scal, grouped)
            counts = [max((v[i] for v in vectors), default=0.0) for i in range(len(plans))]
            parts: list[tuple[float, Growth, list[tuple[Growth, float, float]]]] = []
            for p, c in zip(plans, counts, strict=True):
                if self.settled(p):  # A(k) = f·c_F at every k (``_smoother``'s data-independent bound)
                    caps = [self._cap(p.term, ch, scal) for ch in _covering(p, self.private) if ch.free is not None]
                    parts.append((min(caps), Growth(), []))
                    continue
                plain = self._growth(p.term, scal)
                choices = [self._keyed(p.term, choice, scal) for choice in _choices(p)]
                parts.append((c, plain, choices))

            def at(k: float, parts: list[tuple[float, Growth, list[tuple[Growth, float, float]]]] = parts) -> float:
                total = 0.0
                for c, plain, choices in parts:
                    a = reach(c, plain, k)
                    for keyed, free, gap in choices:
                        a = min(a, reach_keyed(c, free, gap, keyed, k))
                    total += a
                return total

            out[table] = at
        return out

    def _smoother(self, p: _UsePlan | _SemiPlan, scal: list[float], static: bool) -> Callable[[float, float], float]:
        """(c, β) ↦ the β-smooth bound of one use's (or derived table's) count c. With determined uses: the
        keyed bound (smooth_keyed) of each choice of free uses (without and with fan-outs), or the NR bound that
        ignores the keys, the smallest (all are β-smooth upper bounds on databases that satisfy the keys, so their
        minimum is one); when the plan is data-independent, f·c_F of the choice that determines every private
        use, which counts public rows only."""
        covering = [choice for choice in _covering(p, self.private) if choice.free is not None]
        if static and covering:
            least = min(self._cap(p.term, choice, scal) for choice in covering)
            return lambda c, beta: least
        plain = self._growth(p.term, scal)
        choices = [self._keyed(p.term, choice, scal) for choice in _choices(p)]
        if not choices:
            return lambda c, beta: smooth_count(_computed(c), plain, beta)[0]
        return lambda c, beta: min(
            smooth_count(_computed(c), plain, beta)[0],
            *(smooth_keyed(c, free, gap, keyed, beta) for keyed, free, gap in choices),
        )

    def _keyed(self, term: UseTerm, choice: Fanned, scal: list[float]) -> tuple[Growth, float, float]:
        """One choice's growth of the free uses (P times f), f·c_F and g."""
        return self._growth(term, scal, choice.determined, choice.fanout), self._cap(term, choice, scal), choice.gap

    def _cap(self, term: UseTerm, choice: Fanned, scal: list[float]) -> float:
        """f·c_F of one choice: it reads c_F's scalar queries and the local counts of public determined uses only
        (``_reads_of_cap``)."""
        free = math.prod(scal[i] for i in choice.free) if choice.free is not None else 0.0
        # f: at most this many tuples per F-tuple (public determined uses: at most their rows, and their fan-out)
        fan = 1.0
        for u in term.others:
            if u.alias in choice.fanout:
                f = choice.fanout[u.alias]
                fan *= min(scal[self.local[u.alias]], f) if u.table not in self.private else f
        return _computed(free * fan)

    def _reads_of_cap(self, term: UseTerm, choice: Fanned) -> set[int]:
        """The scalar queries :meth:`_cap` reads."""
        reads = set(choice.free or ())
        reads |= {self.local[u.alias] for u in term.others if u.alias in choice.fanout and u.table not in self.private}
        return reads

    def _counts(self, plans: list[_UsePlan], scal: list[float], grouped: Sequence[Rows]) -> list[tuple[float, ...]]:
        """The count vectors of a table's uses (``_vectors``); NaN when their queries did not run (``unread``: every
        use settled, so no bound reads them; one that did would be NaN and fail)."""
        if not plans:
            return [()]
        counted = {i for p in plans for f in p.factors for i in f}
        if counted & self.unread or any(q in self.unread_grouped for p in plans for q in p.pattern_queries):
            return [(math.nan,) * len(plans)]
        return self._vectors(plans, scal, grouped)

    def without_unread(self) -> RowPlan:
        """The plan with the queries its bound does not read left out ("what a global bound reads" below)."""
        if not self.data_independent:
            return self
        scalars: set[int] = set()
        grouped: set[int] = set()
        for table in self.private:
            plans = [p for p in self.uses if p.term.use.table == table]
            settled = all(self.settled(p) for p in plans)
            for p in plans:
                if settled:  # the bound is the least f·c_F (``_smoother``): its c_F and public f only
                    for choice in _covering(p, self.private):
                        if choice.free is not None:
                            scalars |= self._reads_of_cap(p.term, choice)
                    continue
                # a count the bound reads (public uses only): everything the plain and keyed bounds read
                scalars |= {i for f in p.factors for i in f} | {self.local[u.alias] for u in p.term.others}
                grouped |= set(p.pattern_queries)
                for choice in _choices(p):
                    scalars |= self._reads_of_cap(p.term, choice)
        for s in self.semis:
            scalars |= set(s.factors) | {self.local[u.alias] for u in s.term.others}
            for choice in _choices(s):
                scalars |= self._reads_of_cap(s.term, choice)
        return dataclasses.replace(
            self,
            unread=frozenset(range(len(self.scalars))) - scalars,
            unread_grouped=frozenset(range(len(self.grouped))) - grouped,
        )

    def _growth(
        self,
        term: UseTerm,
        scal: list[float],
        determined: frozenset[str] = frozenset(),
        fanout: Mapping[str, float] | None = None,
    ) -> Growth:
        """The free uses' growth: per private table of a free use (n_t, m_t, G_t), and P, the product of the
        public free uses' counts and min(n_j, 1) per public determined use (at most one row per fixed key) —
        with fan-outs, f_j per private determined use and min(n_j, f_j) per public one."""
        by_table: dict[str, list[float]] = {}
        public = 1.0
        for u in term.others:
            n = _computed(scal[self.local[u.alias]])
            if u.alias in determined:
                f = fanout.get(u.alias, 1.0) if fanout is not None else 1.0
                public *= min(n, f) if u.table not in self.private else f
            elif u.table in self.private:
                by_table.setdefault(u.table, []).append(n)
            else:
                public *= n
        tables = tuple((max(ns), len(ns), self.weights[t]) for t, ns in sorted(by_table.items()))
        return Growth(tables, public)

    def _vectors(self, plans: list[_UsePlan], scal: list[float], grouped: Sequence[Rows]) -> list[tuple[float, ...]]:
        if len(plans) == 1:
            p = plans[0]
            count = 1.0 if not p.term.others else math.prod(scal[i] for f in p.factors for i in f)
            return [(count,)]
        maps = []
        bounded_each = False
        for p in plans:
            if not p.term.others:
                maps.append(PatternMap((), {(): 1.0}))
                continue
            constant = math.prod(scal[i] for f in p.factors for i in f)
            parts = [(p.pattern_columns[k], grouped[q]) for k, q in enumerate(p.pattern_queries)]
            size = math.prod(len(rows) for _, rows in parts)
            if size > MAX_PRODUCT_PATTERNS:
                bounded_each = True
                break
            counts: dict[tuple[Any, ...], float] = {(): constant}
            columns: tuple[str, ...] = ()
            for cols, rows in parts:
                columns += tuple(p.term.pattern[c] for c in cols)
                counts = {k + tuple(r[:-1]): v * float(r[-1]) for k, v in counts.items() for r in rows}
            # the same column bound twice (i.c = j.d AND i.c = j.e) appears once per pattern
            uniq = tuple(dict.fromkeys(columns))
            cleaned: dict[tuple[Any, ...], float] = {}
            for key, v in counts.items():
                seen: dict[str, Any] = {}
                if all(seen.setdefault(c, x) == x for c, x in zip(columns, key, strict=True)):
                    k2 = tuple(seen[c] for c in uniq)
                    cleaned[k2] = max(cleaned.get(k2, 0.0), v)
            maps.append(PatternMap(uniq, cleaned))
        if bounded_each:
            # too many patterns to unify: every use at its own maximum (an upper bound of the unification)
            maxima = []
            for p in plans:
                if not p.term.others:
                    maxima.append(1.0)
                    continue
                constant = math.prod(scal[i] for f in p.factors for i in f)
                for q in p.pattern_queries:
                    constant *= max((float(r[-1]) for r in grouped[q]), default=0.0)
                maxima.append(constant)
            return [tuple(maxima)]
        return unify(maps)


def _choices(p: _UsePlan | _SemiPlan) -> list[Fanned]:
    """The choices of free uses a use's bound takes the least of: the plain one (when it determines a use) and
    the one with fan-outs."""
    out = [Fanned(dict.fromkeys(p.determined, 1.0), p.free, p.gap)] if p.determined else []
    return out + ([p.fanned] if p.fanned is not None else [])


def _covering(p: _UsePlan | _SemiPlan, private: frozenset[str]) -> list[Fanned]:
    """The choices that determine every private use besides ``p``'s own (then its count is at most f·c_F on every
    database that satisfies the keys: no growth); a use with no private other is covered by nothing to choose."""
    if all(o.table not in private for o in p.term.others):
        return [Fanned({}, None, math.inf)]
    return [c for c in _choices(p) if all(o.table not in private or o.alias in c.fanout for o in p.term.others)]


def _renamed(e: exp.Expr, alias: str) -> exp.Expr:
    """``e`` with the columns of ``alias`` read from a placeholder alias: equal texts for two uses of a table."""

    def rename(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column) and node.table == alias:
            return exp.column(node.name, table="_")
        return node

    return e.copy().transform(rename)


def _local_conjuncts(form: AnalysisForm, alias: str) -> list[exp.Expr]:
    return [c.expr for c in form.conjuncts if c.columns and all(r.alias == alias for r in c.columns)]


def plan_rows(form: AnalysisForm, catalog: Catalog, policy: Policy) -> RowPlan:
    """The row-level plan for a form with exactly one aggregate."""
    if len(form.aggregates) != 1:
        raise ValueError("plan_rows takes a form with one aggregate")
    agg = form.aggregates[0]
    private = frozenset(u.table for u in form.uses if policy.table(u.table).rows_private)
    private |= subqueries.private_tables(form, policy)
    semijoins = [s for s in form.semijoins if s.use.table in private]

    dom = domain(form, catalog, policy)
    if agg.kind == "count":
        multiplier, released = 1.0, agg
    elif agg.kind == "sum":
        assert agg.arg is not None
        multiplier = magnitude(agg.arg, dom)
        released = dataclasses.replace(agg, arg=clamp_columns(agg.arg, dom))
    else:
        raise RefusedError(
            f"{agg.sql}: MIN and MAX need the value-level analysis (NR §3.3.8); row-level privacy (§3.3.7) "
            "covers COUNT, SUM and AVG"
        )

    classes = equality_classes(form.conjuncts)
    declared = {u.table: (catalog.table(u.table).primary_key, *catalog.table(u.table).unique) for u in form.uses}
    read = (*form.uses, *(s.use for s in form.semijoins))
    types = {u.table: {c.name: c.type_sql for c in catalog.table(u.table).columns.values()} for u in read}
    # keys that determine uses: only those PostgreSQL enforces, so that every database the query may see, and
    # every neighbour the guarantee covers, satisfies them (a schema file's keys are claims)
    enforced = {u.table: tuple(keys_of(catalog.table(u.table))) for u in form.uses} if catalog.enforced else {}
    weights = {t: policy.table(t).weight for t in private}
    scalars: list[exp.Expr] = []
    grouped: list[exp.Select] = []
    local: dict[str, int] = {}
    needed = {o.alias for u in form.uses if u.table in private for o in form.uses if o.alias != u.alias}
    if semijoins:  # D's term counts outer rows: every outer use may grow
        needed |= {u.alias for u in form.uses}
    asked: dict[tuple[str, tuple[str, ...]], int] = {}
    for u in form.uses:
        if u.alias in needed:  # n_j: the rows of use j that can join, for the growth of the others (A(k))
            own = _local_conjuncts(form, u.alias)
            # two uses of one table with the same own conjuncts (Q17c's l1 and l2) have the same count: one scan
            same = (u.table, tuple(sorted(_renamed(c, u.alias).sql(dialect="postgres") for c in own)))
            if same not in asked:
                asked[same] = len(scalars)
                scalars.append(_count_query([u], own, []))
            local[u.alias] = asked[same]
    counts_of_table = {t: len(form.uses_of(t)) for t in private}

    def keyed(
        joined: AnalysisForm, use: TableUse, term: UseTerm, classes: DisjointSet
    ) -> tuple[frozenset[str], tuple[int, ...] | None, float]:
        """The other uses a declared key determines for ``use``'s row, the scalar queries whose product is c_F
        (the free uses' count alone, the largest over their patterns; None when no private use is determined)
        and g, the least weight of a determined private table."""
        determined = determined_uses(joined, use, term.others, classes, enforced, types, private)
        return (determined, *free_queries(joined, use, term, classes, determined))

    def free_queries(
        joined: AnalysisForm, use: TableUse, term: UseTerm, classes: DisjointSet, determined: frozenset[str]
    ) -> tuple[tuple[int, ...] | None, float]:
        """c_F's scalar queries (None when no private use is determined) and g."""
        mine = [o for o in term.others if o.alias in determined and o.table in private]
        if not mine:
            return None, math.inf
        reduced = free_term(joined, use, classes, determined)
        free = []
        for comp_uses, conds, keys in _components(reduced) if reduced.others else []:
            free.append(len(scalars))
            reps: list[exp.Expr] = [reduced.reps[k] for k in keys]
            if keys:
                maximum(comp_uses, conds, reps)
                share(comp_uses, conds, reps)
            else:
                scalars.append(_count_query(comp_uses, conds, []))
        return tuple(free), min(weights[o.table] for o in mine)

    def maximum(comp_uses: list[TableUse], conds: list[exp.Expr], bound: list[exp.Expr]) -> None:
        """Append the largest count over ``bound`` (``_max_count``), noting it when it is the plain GROUP BY."""
        q = _max_count(comp_uses, conds, bound, declared, types, private, enforced)
        # the plain GROUP BY's tree is built here from copies and thrown away: generated without the copy that
        # guards a tree against the generator's mutations (an analysis of TPC-H Q8 makes 112 of these)
        plain = _max_of(_count_query(comp_uses, conds, bound)).sql(dialect="postgres", copy=False)
        if q.sql(dialect="postgres") == plain:
            counted[len(scalars)] = (comp_uses, conds, bound)
        scalars.append(q)

    def share(comp_uses: list[TableUse], conds: list[exp.Expr], bound: list[exp.Expr]) -> None:
        """The scalar just appended (a maximum over ``bound`` of one use's count) and that use's local count n_j
        from one scan (``_shared_scan``), when it has that shape and the use is not scanned yet: a derivative's
        factor (Q17's for part) or a c_F (Q21's for the semi-joins' derived table under tpch_catalog: the most
        rows of l1 per l_orderkey)."""
        if len(comp_uses) != 1 or comp_uses[0].alias not in local or comp_uses[0].alias in scanned:
            return
        own = _local_conjuncts(form, comp_uses[0].alias)
        scan = _shared_scan(conds, bound, own, _unique(comp_uses, bound, enforced))
        if scan is not None:
            scanned.add(comp_uses[0].alias)
            shared.append((scan(comp_uses[0]), {local[comp_uses[0].alias]: "total", len(scalars) - 1: "best"}))

    def fanned(joined: AnalysisForm, use: TableUse, term: UseTerm, classes: DisjointSet) -> Fanned | None:
        """The choice of free uses with ranged key columns ("key columns a conjunct keeps among a few
        integers"), when one determines a use with a fan-out."""
        ranges = key_ranges(joined, types) if enforced else {}
        fan = fanout_assignment(joined, use, term.others, classes, enforced, types, private, ranges)
        if fan is None:
            return None
        return Fanned(fan, *free_queries(joined, use, term, classes, frozenset(fan)))

    plans = []
    shared: list[tuple[exp.Select, dict[int, str]]] = []
    scanned: set[str] = set()
    # the scalars that are a plain MAX over a GROUP BY of a count: (uses, conjuncts, keys), for _keyed_pairs
    counted: dict[int, tuple[list[TableUse], list[exp.Expr], list[exp.Expr]]] = {}
    for u in form.uses:
        if u.table not in private:
            continue
        term = use_term(form, u, classes)
        if not term.others:
            plans.append(_UsePlan(term, ()))
            continue
        factors: list[tuple[int, ...]] = []
        pattern_queries: list[int] = []
        pattern_columns: list[tuple[int, ...]] = []
        for comp_uses, conds, keys in _components(term):
            q = _count_query(comp_uses, conds, [term.reps[k] for k in keys])
            if keys and counts_of_table[u.table] > 1:
                pattern_queries.append(len(grouped))
                pattern_columns.append(tuple(keys))
                grouped.append(q)
            else:
                factors.append((len(scalars),))
                if keys:
                    maximum(comp_uses, conds, [term.reps[k] for k in keys])
                else:
                    scalars.append(q)
                if keys:
                    share(comp_uses, conds, [term.reps[k] for k in keys])
        determined, free, gap = keyed(form, u, term, classes)
        plans.append(
            _UsePlan(
                term,
                tuple(factors),
                tuple(pattern_queries),
                tuple(pattern_columns),
                determined,
                free,
                gap,
                fanned(form, u, term, classes),
            )
        )
    semis = []
    for s in semijoins:
        term = semi_term(form, s)
        indices = []
        for comp_uses, conds, keys in _components(term):
            outer: list[exp.Expr] = [term.reps[k] for k in keys]
            q = _count_query(comp_uses, conds, outer)
            indices.append(len(scalars))
            if _unique(comp_uses, outer, enforced):  # one row per group (Q4's orders by o_orderkey): a COUNT
                q = where(from_uses(exp.select(_at_most_one(exp.Count(this=exp.Star()))), comp_uses), conds)
                scalars.append(q)
                # the outer use's local count scans the same rows (Q22's customers: the NOT EXISTS derivative
                # is LEAST(COUNT(*), 1) over the rows the local count counts, with c_custkey = c_custkey): one
                # scan computes both numbers (_shared_scan's flat shape, the same two numbers)
                alias = comp_uses[0].alias
                if alias in local and alias not in scanned:
                    shared_scan = _shared_scan(conds, outer, _local_conjuncts(form, alias), unique=True)
                    if shared_scan is not None:
                        scanned.add(alias)
                        shared.append((shared_scan(comp_uses[0]), {local[alias]: "total", len(scalars) - 1: "best"}))
                continue
            if keys:
                counted[len(scalars)] = (comp_uses, conds, outer)
            scalars.append(_max_of(q) if keys else q)
        joined = semi_form(form, s)
        joined_classes = equality_classes(joined.conjuncts)
        semis.append(
            _SemiPlan(
                s,
                term,
                tuple(indices),
                *keyed(joined, s.use, term, joined_classes),
                fanned(joined, s.use, term, joined_classes),
            )
        )
    shared += _keyed_pairs(counted, shared, enforced, types)
    plan = RowPlan(
        form=form,
        aggregate=released,
        multiplier=multiplier,
        scalars=tuple(scalars),
        grouped=tuple(grouped),
        uses=tuple(plans),
        local=local,
        weights=weights,
        private=private,
        # a row of a derived table flips outer rows of any group: one ℓ1 bound over the groups
        disjoint_groups=_disjoint(form, private, classes) and not semijoins,
        semis=tuple(semis),
        shared=tuple(shared),
    )
    return plan.without_unread()


def _computed(x: float) -> float:
    """``x``, a number a bound reads; a query left out (``RowPlan.unread``) gives NaN, which no comparison or min()
    may quietly drop: refused instead (fail closed)."""
    if math.isnan(x):
        raise RuntimeError("the row-level bound read a count that was not computed (its query was left out)")
    return x


# -- a count joined with a use its keys determine -------------------------------------------------------
#
# Two of the plan's maxima often group the same product by the same keys, one with a use K more (Q21 under
# tpch_catalog: orders' derivative, the most rows of supplier ⋈ l1 ⋈ nation per l_orderkey, and the derived
# tables' term, the same with orders ⋈ on o_orderkey = l1.l_orderkey AND o_orderstatus = 'F'). When K's other
# conjuncts read K alone and its conjuncts with the rest are equalities of K's columns with the grouping keys
# that cover a key PostgreSQL enforces on K (each pair of one declared type, so "=" is the key's own
# equality), a group k of the first count meets at most one row of K, and exactly one when k's values are
# those of a row of K that passes K's own conjuncts:
#
#     Count_K(k) = Count(k) · [∃ r ∈ K: r's tied columns = k's, ψ_K(r)]
#
# (a NULL in k meets no row, as the equality fails on both sides; ψ_K, K's own conjuncts, is a deterministic
# predicate of K's row, the allow-list admitting no volatile function, sqldp.allowlist). Both maxima are then
# one pass over the first GROUP BY, the second the largest count among the groups a LEFT JOIN with K's rows
# matches:
#
#     SELECT COALESCE(MAX(s.n), 0) AS best, COALESCE(MAX(CASE WHEN NOT k.c0 IS NULL THEN s.n END), 0) AS kept
#     FROM (<the first GROUP BY>) AS s LEFT JOIN (SELECT K.a AS c0 … FROM K WHERE ψ_K) AS k ON s.p_i = k.c0 …
#
# (at most one row of K per group: the LEFT JOIN keeps each group once, so MAX(s.n) is the first maximum; a
# key column is never NULL, so a matched group has c0 non-NULL). The same numbers, the product with K never
# formed.


def _with_key(
    plain: tuple[list[TableUse], list[exp.Expr], list[exp.Expr]],
    joined: tuple[list[TableUse], list[exp.Expr], list[exp.Expr]],
    enforced: Keys,
    types: Types,
) -> tuple[TableUse, list[exp.Expr], list[tuple[str, int]]] | None:
    """When ``joined`` is ``plain`` with one use K more as described above: K, its own conjuncts and, per column
    of K tied to a grouping key, (the column, the key's index); else None."""
    uses, conds, keys = plain
    uses_k, conds_k, keys_k = joined
    mine = {u.alias: u for u in uses}
    extra = [u for u in uses_k if u.alias not in mine]
    if len(extra) != 1 or len(uses_k) != len(uses) + 1 or any(mine[u.alias] != u for u in uses_k if u is not extra[0]):
        return None
    k = extra[0]
    key_texts = [e.sql(dialect="postgres") for e in keys]
    if key_texts != [e.sql(dialect="postgres") for e in keys_k] or not all(isinstance(e, exp.Column) for e in keys):
        return None
    have = {c.sql(dialect="postgres") for c in conds}
    more = {c.sql(dialect="postgres"): c for c in conds_k}
    if not have <= more.keys():
        return None
    local: list[exp.Expr] = []
    tied: dict[str, int] = {}
    for text, c in more.items():
        if text in have:
            continue
        if {col.table for col in c.find_all(exp.Column)} == {k.alias} and not any(c.find_all(exp.Query)):
            local.append(c)
            continue
        pair = _pair(c)
        if pair is None:
            return None
        ours, other = (pair[0], pair[1]) if pair[0].alias == k.alias else (pair[1], pair[0])
        if ours.alias != k.alias or other.alias == k.alias or other.alias not in mine or ours.column in tied:
            return None
        at = (
            key_texts.index(_col(other).sql(dialect="postgres"))
            if _col(other).sql(dialect="postgres") in key_texts
            else -1
        )
        kind, kind_k = _type_of(types, mine[other.alias], other.column), _type_of(types, k, ours.column)
        if at < 0 or kind is None or kind_k is None or kind.upper() != kind_k.upper():
            return None
        tied[ours.column] = at
    if not any(set(key) <= tied.keys() for key in enforced.get(k.table, ())):
        return None
    return k, local, sorted(tied.items())


def _keyed_pairs(
    counted: Mapping[int, tuple[list[TableUse], list[exp.Expr], list[exp.Expr]]],
    shared: Sequence[tuple[exp.Select, dict[int, str]]],
    enforced: Keys,
    types: Types,
) -> list[tuple[exp.Select, dict[int, str]]]:
    """One scan for each pair of maxima where one is the other's count with a use its keys determine (above), the
    scalars no shared scan computes yet; each scalar in one pair at most."""
    taken = {i for _, reads in shared for i in reads}
    out: list[tuple[exp.Select, dict[int, str]]] = []
    for i, plain in counted.items():
        for j, joined in counted.items():
            if i == j or i in taken or j in taken:
                continue
            found = _with_key(plain, joined, enforced, types)
            if found is None:
                continue
            k, local, tied = found
            inner = exp.select(*(exp.alias_(_col(ColumnRef(k.alias, c)), f"c{n}") for n, (c, _) in enumerate(tied)))
            inner = where(from_uses(inner, [k]), local)
            on = exp.and_(
                *(
                    exp.EQ(this=exp.column(f"p{at}", table="s"), expression=exp.column(f"c{n}", table="k"))
                    for n, (_, at) in enumerate(tied)
                )
            )
            matched = exp.Not(this=exp.Is(this=exp.column("c0", table="k"), expression=exp.Null()))
            kept = exp.Case(ifs=[exp.If(this=matched, true=exp.column("n", table="s"))])
            zero = exp.Literal.number(0)
            scan = (
                exp.select(
                    exp.alias_(exp.func("COALESCE", exp.func("MAX", exp.column("n", table="s")), zero), "best"),
                    exp.alias_(exp.func("COALESCE", exp.func("MAX", kept), zero.copy()), "kept"),
                )
                .from_(exp.Subquery(this=_count_query(*plain), alias=exp.TableAlias(this=exp.to_identifier("s"))))
                .join(
                    exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("k"))), on=on, join_type="LEFT"
                )
            )
            out.append((scan, {i: "best", j: "kept"}))
            taken |= {i, j}
    return out


def _twins(scalars: Sequence[exp.Expr], source: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """``source`` (scalar → the shared scan and column that compute it) with every other scalar of the same SQL
    text as one of those read from there too. Another term asks the same number (Q17 under tpch: c_F for
    lineitem, max over l_partkey of lineitem's rows, is the count part's derivative groups by, which the shared
    scan g1 computes beside lineitem's local count): one SQL text in one snapshot is one number (COUNT and MAX
    over the same rows, nothing volatile), and the scan already computes it (``_shared_scan``), so the
    statement scans lineitem once instead of twice."""
    text = {scalars[i].sql(dialect="postgres"): i for i in source}
    out = dict(source)
    for i, q in enumerate(scalars):
        twin = text.get(q.sql(dialect="postgres"))
        if i not in out and twin is not None:
            out[i] = source[twin]
    return out


def _shared_scan(
    conds: list[exp.Expr], keys: list[exp.Expr], own: list[exp.Expr], unique: bool = False
) -> Callable[[TableUse], exp.Select] | None:
    """One scan for a use's local count n_j and a derivative that groups the same use alone (Q17's for part:
    max over l_partkey of lineitem's rows). The derivative's conjuncts are the use's own plus ``k = k`` for
    bound key columns (θ[r/Ti] where r's column equals k; true exactly when k is not NULL, NaN included):

        SELECT COALESCE(SUM(n), 0) AS total, COALESCE(MAX(n) FILTER (WHERE p_i = p_i …), 0) AS best
        FROM (SELECT keys AS p_i, COUNT(*) AS n FROM T WHERE own GROUP BY keys)

    total is COUNT(*) over ``own`` (the groups partition those rows) and best the largest group whose keys
    pass the ``k = k`` conjuncts: both the numbers the two statements give. None for any other shape.

    When every group is one row (``unique``: the keys hold a key PostgreSQL enforces, :func:`_unique`) the same
    two numbers need no GROUP BY (Q14's derivative for lineitem under tpch: max over p_partkey of part's rows):

        SELECT COUNT(*) AS total, LEAST(COUNT(*) FILTER (WHERE k_i = k_i …), 1) AS best FROM T WHERE own"""
    own_text = {c.sql(dialect="postgres") for c in own}
    keyed = {k.sql(dialect="postgres"): i for i, k in enumerate(keys)}
    selfeq: list[int] = []
    for c in conds:
        pair = _pair(c)
        text = c.sql(dialect="postgres")
        if text in own_text:
            continue
        if pair is None or pair[0] != pair[1]:
            return None
        column = _col(pair[0]).sql(dialect="postgres")
        if column not in keyed:
            return None
        selfeq.append(keyed[column])
    if own_text - {c.sql(dialect="postgres") for c in conds} or not all(isinstance(k, exp.Column) for k in keys):
        return None

    def flat(use: TableUse) -> exp.Select:
        count: exp.Expr = exp.Count(this=exp.Star())
        passing = [exp.EQ(this=keys[i].copy(), expression=keys[i].copy()) for i in selfeq]
        if passing:
            count = exp.Filter(this=count, expression=exp.Where(this=exp.and_(*passing)))
        items = [exp.alias_(exp.Count(this=exp.Star()), "total"), exp.alias_(_at_most_one(count), "best")]
        return where(from_uses(exp.select(*items), [use]), own)

    def scan(use: TableUse) -> exp.Select:
        inner = _count_query([use], own, keys)
        best: exp.Expr = exp.func("MAX", exp.column("n"))
        if selfeq:
            test = exp.and_(*(exp.EQ(this=exp.column(f"p{i}"), expression=exp.column(f"p{i}")) for i in selfeq))
            best = exp.Filter(this=best, expression=exp.Where(this=test))
        zero = exp.Literal.number(0)
        return exp.select(
            exp.alias_(exp.func("COALESCE", exp.func("SUM", exp.column("n")), zero), "total"),
            exp.alias_(exp.func("COALESCE", best, zero.copy()), "best"),
        ).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("s"))))

    return flat if unique else scan


def _disjoint(form: AnalysisForm, private: frozenset[str], classes: DisjointSet) -> bool:
    """Parallel composition over groups (NR §3.3.10.4) needs (1) each neighbouring change to move one group
    only and (2) the noise scale of the other groups not to move. Both hold when exactly one use is private
    (its derivative counts only public rows, so its bound is data-independent) and every group key is tied
    to a column of that use."""
    uses = [u for u in form.uses if u.table in private]
    if len(uses) != 1 or not form.group_by:
        return False
    alias = uses[0].alias
    for key in form.group_by:
        # a key is a deterministic function of its columns (a column, EXTRACT(YEAR FROM d), …): when each
        # of them is the private use's own or equal to one of its columns, a row of it lands in one group
        columns = [key] if isinstance(key, exp.Column) else list(key.find_all(exp.Column))
        if not columns or any(not c.table for c in columns):
            return False
        for c in columns:
            ref = ColumnRef(c.table, c.name)
            if ref.alias != alias and not any(m.alias == alias for m in _equal_to(classes, ref)):
                return False
    return True
