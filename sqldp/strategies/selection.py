"""Private selection of public rows (TPC-H Q20's shape; Q15's argmax below): rows of public tables kept or dropped by a
predicate over private data, released as a differentially private choice; the kept rows are then exact.

The shape (every table outside the one scalar subquery public; T the private table)::

    SELECT … FROM <public tables> WHERE φ_out AND x IN (
        SELECT p.k FROM P AS p WHERE φ_P AND L(p) <cmp> (SELECT α·SUM(t.v) | α·COUNT(*) FROM T AS t
                                                        WHERE t.a1 = e1(p) AND … AND ψ(t)))

The set of rows returned is a function of T, so it cannot leave exactly. It is released as follows
(the transformation; docs/selection.md has the argument in full):

1. The candidates: the distinct values v of x over the rows the statement keeps without the IN conjunct — a
   query over public tables, so a public set.
2. The witness score of a candidate v: W(v) = Σ_{p ∈ P, φ_P(p), p.k = v} r(p), with r(p) ∈ [0, 1] the
   predicate ``L(p) <cmp> S(κ(p))`` written as a ramp of the margin: for ``L > S``,
   r = min(1, max(0, (L − S)/h)) (``>=``: (L − S)/h + 1; ``<``, ``<=`` mirrored), S = α·SUM(v) or α·COUNT(*)
   over the rows of T of p's correlation key κ(p) = (e1(p), …), NULL (SQL's comparison with NULL: false, r = 0)
   when SUM has no row and 0 for COUNT. h = α·1: the ramp equals the predicate's indicator whenever the margin
   is 0 or at least h away from 0 on the wrong side — on TPC-H, where quantities are whole and availqty an
   integer, every margin of Q20 is a multiple of h = 0.5 — and in general the released set is that of the
   ramp, which the tests compare with PostgreSQL's answer.
3. ℓ1 sensitivity of the vector W over the candidates, a bound that holds on every database (Dwork, McSherry,
   Nissim and Smith, "Calibrating Noise to Sensitivity in Private Data Analysis", TCC 2006): a change of one
   row of T — added or removed (distance w_T, the table's row weight, NR §3.3.9), or its sensitive values
   changed (distance the table's norm of the change, NR §3.3.8.2) — changes S for one correlation key κ only
   (the correlation columns of T must be outside the norm, so a value change keeps κ), hence r for the at
   most m rows of P with that key (m counted over P, a public table), each by at most
   min(1, per-column slope × change) and so by at most B·distance with

       B = max(1/w_T (rows private),  1/w_v for the summed column v (the ramp's slope is α/h = 1 per unit),
               1/(w_v·g_v) for a sensitive column v that ψ reads (g_v its type's grid: a change smaller than
               g_v is impossible, and r moves by at most 1)),

   w_v the column's weight in the norm (a change of v alone by |Δ| costs at least w_v·|Δ| in any ℓp norm of
   weighted terms). Each p adds to one W(v). So ‖W(D) − W(D′)‖₁ ≤ m·B·d(D, D′) for neighbours, and by the
   triangle inequality along a path of one-row changes for any two databases (rows and tables combine with ℓ1
   in the metric, NR §3.3.8.2).
4. Release W̃(v) = W(v) + Lap(m·B/ε) for every candidate (the Laplace mechanism over a public domain: ε·d-DP
   for databases at distance d, the metric form of Dwork et al.'s Theorem 1), and keep the candidates with
   W̃(v) > 1/2 — post-processing (Dwork & Roth, "The Algorithmic Foundations of Differential Privacy", Prop.
   2.1): the statement then runs over public tables with ``x IN (<kept values>)`` and its rows are exact.

The statement of step 2 and the final one run on the session's engine: PostgreSQL, or Spark with the same
meaning (:func:`statement_for`; docs/spark.md, "Public rows chosen by private data").

Pure ε (δ = 0), the whole ε on the one histogram. Refused with the reason and position: anything else inside
the IN (several tables, a private P, GROUP BY, other aggregates, several private predicates), a correlation
column or a grid-less column (FLOAT) of T that is value-sensitive, NOT IN, privacy units.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Generic, Protocol, TypeVar

from sqlglot import exp

from sqldp import allowlist, mechanisms
from sqldp.catalog import Catalog, Column
from sqldp.engine.base import Speed
from sqldp.errors import RefusedError
from sqldp.frontend import ParsedQuery, conjuncts, position
from sqldp.mechanisms.registry import LAPLACE
from sqldp.params import PrivacyParams, resolve_params
from sqldp.policy import Policy
from sqldp.policy.tables import TablePolicy
from sqldp.result import GLOBAL, Measurement, Result
from sqldp.rewrite import Statements
from sqldp.rewrite import tables as statement_tables
from sqldp.runner import Prepared
from sqldp.sensitivity.columns import grain
from sqldp.sensitivity.expressions import column_weights
from sqldp.strategies.aggregate import analysed_text
from sqldp.strategies.base import Context, Privacy

THRESHOLD = 0.5  # a candidate is kept when its noisy witness score passes this (exact scores are whole numbers)
RAMP_UNITS = 1.0  # h = α · RAMP_UNITS: the ramp's width in units of the summed column (or of COUNT)
_COMPARE = (exp.GT, exp.GTE, exp.LT, exp.LTE)
_MIRROR: dict[type[exp.Expr], type[exp.Expr]] = {exp.GT: exp.LT, exp.GTE: exp.LTE, exp.LT: exp.GT, exp.LTE: exp.GTE}
_CAND, _AGG, _WIT = "sqldp_candidates", "sqldp_aggregate", "sqldp_witnesses"


@dataclass(frozen=True)
class Shape:
    """What the analysis found, before any data is read."""

    tree: exp.Select  # the qualified statement
    conjunct: exp.Expr  # the IN conjunct of its WHERE (a node of ``tree``)
    x: exp.Expr  # the outer side of the IN
    witness_sql: str  # one statement: per candidate v, W(v) and m (PostgreSQL)
    per_row: float  # B: the bound on one P row's ramp per unit of distance
    table: str  # T
    where: str  # the IN's position
    why: str  # how B was obtained, for the notes
    candidates_sql: str  # the candidates alone: a statement over public tables (PostgreSQL)

    @property
    def statement(self) -> str:
        return self.witness_sql


def _and(parts: list[exp.Expr]) -> exp.Expr | None:
    out: exp.Expr | None = None
    for p in parts:
        out = p.copy() if out is None else exp.and_(out, p.copy())
    return out


def _tables(node: exp.Expr) -> set[str]:
    return {t.name.lower() for t in node.find_all(exp.Table)}


def _from(q: exp.Select) -> exp.From:
    from_ = q.args.get("from_") or q.args.get("from")
    assert isinstance(from_, exp.From)
    return from_


def _from_tables(q: exp.Select) -> list[exp.Table]:
    """The catalog tables a SELECT's own FROM and JOINs name (not those of its subqueries)."""
    from_ = q.args.get("from_") or q.args.get("from")
    items = [from_.this] if from_ is not None else []
    items += [j.this for j in q.args.get("joins") or []]
    return [t for t in items if isinstance(t, exp.Table)] if all(isinstance(t, exp.Table) for t in items) else []


def find_shape(parsed: ParsedQuery, catalog: Catalog, policy: Policy) -> Shape | None:
    """The selection shape of the module docstring, None for a statement of another shape (the other paths
    decide about it); a refusal with the position for one of this outline that cannot be analysed."""
    tree = parsed.tree
    if not isinstance(tree, exp.Select) or tree.args.get("with_") or tree.args.get("with"):
        return None
    outer = _from_tables(tree)
    if not outer or any(not policy.table(t.name.lower()).public for t in outer):
        return None
    where = tree.args.get("where")
    parts = conjuncts(where.this if where is not None else None)
    private = [p for p in parts if any(not policy.table(t).public for t in _tables(p))]
    if len(private) != 1 or not isinstance(private[0], exp.In) or private[0].args.get("query") is None:
        return None
    conjunct = private[0]
    # the private read must be in this conjunct only: the SELECT list, ORDER BY, … read public tables
    rest = tree.copy()
    rest.set("where", None)
    if any(not policy.table(t).public for t in _tables(rest)):
        return None
    sub = conjunct.args["query"].unnest()
    if not isinstance(sub, exp.Select):
        return None
    p_tables = _from_tables(sub)
    if len(p_tables) != 1 or sub.args.get("joins") or not policy.table(p_tables[0].name.lower()).public:
        return None
    at = position(parsed.sql, conjunct)
    try:
        return _in_side(parsed, catalog, policy, tree, conjunct, sub, at)
    except RefusedError as err:
        if err.where != at:
            raise
        read = ", ".join(f"'{t}'" for t in sorted(_tables(conjunct)) if not policy.table(t).public)
        raise RefusedError(f"{err.message} (it reads private table {read})", where=at) from None


def _in_side(
    parsed: ParsedQuery, catalog: Catalog, policy: Policy, tree: exp.Select, conjunct: exp.In, sub: exp.Select, at: str
) -> Shape:
    p_tables = _from_tables(sub)
    for arg, name in (("group", "GROUP BY"), ("having", "HAVING"), ("limit", "LIMIT"), ("distinct", "DISTINCT")):
        if sub.args.get(arg) is not None:
            raise RefusedError(f"IN (SELECT …) selecting public rows: {name} in it is not analysed", where=at)
    p_alias = p_tables[0].alias_or_name
    if len(sub.expressions) != 1:
        raise RefusedError("IN (SELECT …): the subquery must return one column", where=at)
    k = sub.expressions[0].unalias()
    p_parts = conjuncts(sub.args["where"].this if sub.args.get("where") is not None else None)
    p_private = [p for p in p_parts if any(not policy.table(t).public for t in _tables(p))]
    # the witness statement reads P's conditions without the outer tables: a correlated IN is refused here,
    # before the charge, not by PostgreSQL after it
    for part in [p for p in p_parts if p not in p_private] + [k]:
        if not _reads_only(part, p_alias):
            raise RefusedError(
                "IN (SELECT …) selecting public rows: a subquery correlated with the outer query is not analysed",
                where=at,
            )
    _check_key(conjunct.this, catalog, tree, at)
    if len(p_private) != 1:
        raise RefusedError(
            "IN (SELECT … FROM a public table WHERE …) selecting public rows: exactly one conjunct may read a private "
            "table, a comparison with a correlated scalar subquery (TPC-H Q20's shape)",
            where=at,
        )
    cond = p_private[0]
    if not isinstance(cond, _COMPARE):
        raise RefusedError("selecting public rows: the private conjunct must compare with >, >=, <, <=", where=at)
    left, right = cond.this, cond.expression
    op: type[exp.Expr] = type(cond)
    if isinstance(left.unnest(), exp.Subquery) or isinstance(left, exp.Subquery):
        left, right, op = right, left, _MIRROR[op]
    scalar = right.unnest() if not isinstance(right, exp.Subquery) else right.this
    while isinstance(scalar, exp.Subquery):
        scalar = scalar.this
    if not isinstance(scalar, exp.Select) or any(isinstance(n, exp.Subquery) for n in left.walk()):
        raise RefusedError(
            "selecting public rows: compare an expression of the IN's table with one scalar subquery", where=at
        )
    if any(c.table != p_alias for c in left.find_all(exp.Column)):
        raise RefusedError("selecting public rows: the compared expression must read the IN's table only", where=at)
    return _scalar_side(parsed, catalog, policy, tree, conjunct, k, sub, p_alias, p_parts, cond, left, op, scalar, at)


def _scalar_side(
    parsed: ParsedQuery,
    catalog: Catalog,
    policy: Policy,
    tree: exp.Select,
    conjunct: exp.In,
    k: exp.Expr,
    sub: exp.Select,
    p_alias: str,
    p_parts: list[exp.Expr],
    cond: exp.Expr,
    left: exp.Expr,
    op: type[exp.Expr],
    scalar: exp.Select,
    at: str,
) -> Shape:
    what = "selecting public rows: the scalar subquery"
    for arg, name in (("group", "GROUP BY"), ("having", "HAVING"), ("limit", "LIMIT"), ("joins", "a JOIN")):
        if scalar.args.get(arg):
            raise RefusedError(f"{what} with {name} is not analysed", where=at)
    t_tables = _from_tables(scalar)
    if len(t_tables) != 1:
        raise RefusedError(f"{what} must read one table", where=at)
    t_name, t_alias = t_tables[0].name.lower(), t_tables[0].alias_or_name
    if policy.units:
        raise RefusedError(f"{what}: privacy units are not analysed here (a unit's rows change many keys)", where=at)
    if len(scalar.expressions) != 1:
        raise RefusedError(f"{what} must return one value", where=at)
    value = scalar.expressions[0].unalias()
    alpha, agg = _scaled_aggregate(value)
    if agg is None or not (alpha > 0 and math.isfinite(alpha)):
        raise RefusedError(
            f"{what}'s value must be SUM(column) or COUNT(*), times a positive number: {value.sql(dialect='postgres')}",
            where=at,
        )
    summed: str | None = None
    if isinstance(agg, exp.Sum):
        arg = agg.this
        if not (isinstance(arg, exp.Column) and arg.table == t_alias):
            raise RefusedError(f"{what}: SUM must read one column of its table", where=at)
        summed = arg.name
        col = catalog.table(t_name).column(summed)
        if not (col.kind == "integer" or col.type_sql.upper().startswith(("NUMERIC", "DECIMAL"))):
            raise RefusedError(f"{what}: SUM of {col.type_sql} may overflow (an error the data decide)", where=at)
    elif not (isinstance(agg, exp.Count) and isinstance(agg.this, exp.Star)):
        raise RefusedError(f"{what}'s value must be SUM(column) or COUNT(*)", where=at)
    inner: list[exp.Expr] = []
    keys: list[tuple[exp.Column, exp.Expr]] = []  # (T's column, the expression of P it equals)
    for part in conjuncts(scalar.args["where"].this if scalar.args.get("where") is not None else None):
        if any(isinstance(n, exp.Subquery) for n in part.walk()):
            raise RefusedError(f"{what}: nested subqueries in it are not analysed", where=at)
        aliases = {c.table for c in part.find_all(exp.Column)}
        if aliases <= {t_alias}:
            inner.append(part)
            continue
        key = _correlation(part, t_alias, p_alias)
        if key is None:
            raise RefusedError(
                f"{what}: only equalities of its table's columns with the IN's table's are correlations, not "
                f"{part.sql(dialect='postgres')}",
                where=at,
            )
        keys.append(key)
    if not keys:
        raise RefusedError(f"{what} is not correlated with the IN's table", where=at)
    per_row, why = _per_row_bound(catalog, policy, t_name, summed, keys, inner, at)
    integer = summed is not None and catalog.table(t_name).column(summed).kind == "integer"
    # the aggregate may read only the scored rows' keys when each correlation pair is two columns of one type
    # (_witness_sql, ``restrict``)
    p_columns = catalog.table(_from_tables(sub)[0].name.lower())
    t_columns = catalog.table(t_name)
    restrict = t_alias != p_alias and all(
        isinstance(e, exp.Column)
        and e.table == p_alias
        and t_columns.column(c.name).type_sql.upper() == p_columns.column(e.name).type_sql.upper()
        for c, e in keys
    )
    sql, cand = _witness_sql(
        tree, conjunct, k, sub, p_alias, p_parts, cond, left, op, scalar, t_alias, keys, inner, alpha, integer,
        restrict=restrict,
    )  # fmt: skip
    return Shape(tree, conjunct, conjunct.this, sql, per_row, t_name, at, why, cand)


def _reads_only(e: exp.Expr, alias: str) -> bool:
    """Every column of ``e`` is the use ``alias``'s or one of a table a subquery inside ``e`` reads itself."""
    own = {t.alias_or_name for t in e.find_all(exp.Table)} | {alias}
    return all(c.table in own for c in e.find_all(exp.Column))


def _check_key(x: exp.Expr, catalog: Catalog, tree: exp.Select, at: str) -> None:
    """The chosen values return to the statement as literals: x must be a column of a number, text or date type."""
    tables = {t.alias_or_name: t.name.lower() for t in _from_tables(tree)}
    kind = None
    if isinstance(x, exp.Column) and x.table in tables:
        kind = catalog.table(tables[x.table]).column(x.name).kind
    if kind not in ("integer", "numeric", "text", "date"):
        raise RefusedError(
            "selecting public rows: the compared key must be a column of a number, text or date type", where=at
        )


def _scaled_aggregate(e: exp.Expr) -> tuple[float, exp.AggFunc | None]:
    """(α, AGG) for AGG, α * AGG or AGG * α with α a number literal; (nan, None) otherwise."""
    e = e.unnest()
    if isinstance(e, exp.AggFunc):
        return 1.0, e
    if isinstance(e, exp.Mul):
        for a, b in ((e.this, e.expression), (e.expression, e.this)):
            a, b = a.unnest(), b.unnest()
            if isinstance(a, exp.Literal) and not a.is_string and isinstance(b, exp.AggFunc):
                return float(a.this), b
    return math.nan, None


def _correlation(part: exp.Expr, t_alias: str, p_alias: str) -> tuple[exp.Column, exp.Expr] | None:
    e = part.unnest()
    if not isinstance(e, exp.EQ):
        return None
    for side, other in ((e.this, e.expression), (e.expression, e.this)):
        others = {c.table for c in other.find_all(exp.Column)}
        if isinstance(side, exp.Column) and side.table == t_alias and others == {p_alias}:
            return side, other
    return None


def _per_row_bound(
    catalog: Catalog,
    policy: Policy,
    t_name: str,
    summed: str | None,
    keys: list[tuple[exp.Column, exp.Expr]],
    inner: list[exp.Expr],
    at: str,
) -> tuple[float, str]:
    """B of the module docstring (step 3) and how it was obtained."""
    tp = policy.table(t_name)
    weights = column_weights(tp.norm) if tp.norm is not None else {}
    bounds: list[tuple[float, str]] = []
    if tp.rows_private:
        bounds.append((1.0 / tp.weight, f"a row of {t_name} added or removed (weight {tp.weight:g})"))
    for column, _ in keys:
        if column.name in weights:
            raise RefusedError(
                f"selecting public rows: the correlation column {t_name}.{column.name} is value-sensitive; a changed "
                "value would move a row between keys",
                where=at,
            )
    filtered = {c.name for part in inner for c in part.find_all(exp.Column)}
    for v in sorted(filtered | ({summed} if summed else set())):
        w = weights.get(v)
        if w is None:
            continue
        col = catalog.table(t_name).column(v)
        if col.nullable:
            raise RefusedError(
                f"selecting public rows: {t_name}.{v} is value-sensitive and nullable; a change to or from NULL has no "
                "distance in the norm",
                where=at,
            )
        if v in filtered:
            grid = _step(tp, col, v)
            if grid <= 0:
                raise RefusedError(
                    f"selecting public rows: a filter on {t_name}.{v} ({col.type_sql}) can flip with an arbitrarily "
                    "small change of it",
                    where=at,
                )
            bounds.append((1.0 / (w * grid), f"{t_name}.{v} in a filter: a change of at least {grid:g} (weight {w:g})"))
        else:
            bounds.append((1.0 / w, f"{t_name}.{v} summed: the ramp moves 1 per unit (weight {w:g})"))
    if not bounds:  # T public: nothing private (the public path answers such statements)
        raise RefusedError("selecting public rows: the subquery's table protects nothing", where=at)
    b, why = max(bounds)
    return b, why


def _step(tp: TablePolicy, col: Column, v: str) -> float:
    """The smallest change of value-sensitive column v of T (0: arbitrarily small): a DATE moves by one day at
    least, in the column's unit; other types by their grain (sqldp.sensitivity.columns.grain)."""
    return 1.0 / tp.column(v).days_per_unit if col.kind == "date" else grain(col.type_sql, col.kind) or 0.0


def _witness_sql(
    tree: exp.Select,
    conjunct: exp.In,
    k: exp.Expr,
    sub: exp.Select,
    p_alias: str,
    p_parts: list[exp.Expr],
    cond: exp.Expr,
    left: exp.Expr,
    op: type[exp.Expr],
    scalar: exp.Select,
    t_alias: str,
    keys: list[tuple[exp.Column, exp.Expr]],
    inner: list[exp.Expr],
    alpha: float,
    integer: bool,
    restrict: bool = False,
) -> tuple[str, str]:
    """One statement: for each candidate v, (v, W(v), m) — m the most rows of P (among those scored) sharing
    one correlation key; no row when there is no candidate. And the candidates' own statement (public tables).

    With ``restrict`` (each correlation pair is a column of T and a column of P of one declared type), the
    aggregate over T reads only the rows whose key is a scored row's of P: ``(a1, …) IN (SELECT e1, … FROM P
    WHERE φ_P AND k IN (candidates))``. The same S for every scored row: the LEFT JOIN matches a scored row p
    with the group of T's key equal to p's, and every row of that group has a key equal to p's (one type: "="
    is the type's own equality, the one GROUP BY groups by), so passes the IN through p itself; groups no
    scored row matches are dropped by the join either way; a NULL key matches nothing on either side. It
    reads public tables only, and lets PostgreSQL look up T's rows by an index on the key instead of
    aggregating every row of T (TPC-H Q20: 760 rows of partsupp against a year of lineitem, 150 ms → 6 ms at
    SF 0.1).

    Every construct means the same in PostgreSQL and in Spark SQL as sqldp.engine.spark.sql writes it (checked
    against PostgreSQL in tests/engine/test_spark.py): a SUM of an integer column is taken in NUMERIC
    (PostgreSQL's SUM(BIGINT) is NUMERIC, Spark's a BIGINT that fails on overflow; the cast is DECIMAL(38, 0)
    there, the same value); the margin is cast to DOUBLE PRECISION before it is divided by h (no integer
    division on either engine); LEAST and GREATEST skip NULL on both, so the ramp of a SUM over no row (NULL)
    is GREATEST(0, NULL) = 0, then COALESCE'd."""
    cand = exp.select(exp.alias_(conjunct.this.copy(), "v")).distinct()
    cand.set("from_", _from(tree).copy())
    if tree.args.get("joins"):
        cand.set("joins", [j.copy() for j in tree.args["joins"]])
    outer_where = _and([p for p in conjuncts(tree.args["where"].this) if p is not conjunct])
    if outer_where is not None:
        cand = cand.where(outer_where)
    agg = exp.select(*[exp.alias_(c.copy(), f"k{i}") for i, (c, _) in enumerate(keys)])
    value = scalar.expressions[0].unalias().copy()
    if integer:  # summed in NUMERIC: the same value on PostgreSQL, no BIGINT overflow on Spark
        for total in list(value.find_all(exp.Sum)):
            total.set("this", exp.cast(total.this.copy(), "NUMERIC"))
    agg = agg.select(exp.alias_(value, "s"))
    agg.set("from_", _from(scalar).copy())
    p_where = [p for p in p_parts if p is not cond]
    in_cand = exp.In(this=k.copy(), query=exp.select("v").from_(_CAND).subquery())
    restriction: list[exp.Expr] = []
    if restrict:
        scored = exp.select(*[e.copy() for _, e in keys])
        scored.set("from_", _from(sub).copy())
        scored = scored.where(_and([*p_where, in_cand]))
        mine: exp.Expr = keys[0][0].copy() if len(keys) == 1 else exp.Tuple(expressions=[c.copy() for c, _ in keys])
        restriction.append(exp.In(this=mine, query=scored.subquery()))
    inner_where = _and([*inner, *restriction])
    if inner_where is not None:
        agg = agg.where(inner_where)
    agg = agg.group_by(*[c.copy() for c, _ in keys])
    is_count = isinstance(_scaled_aggregate(scalar.expressions[0].unalias())[1], exp.Count)
    s: exp.Expr = exp.column("s", table=_AGG)
    if is_count:  # COUNT over no rows is 0, not NULL
        s = exp.func("COALESCE", s, exp.Literal.number(0))
    h = exp.Literal.number(repr(alpha * RAMP_UNITS))
    lhs = exp.paren(left.copy())
    margin = exp.Sub(this=lhs, expression=s) if op in (exp.GT, exp.GTE) else exp.Sub(this=s, expression=lhs)
    ramp: exp.Expr = exp.Div(this=exp.cast(exp.paren(margin), "DOUBLE PRECISION"), expression=h)
    if op in (exp.GTE, exp.LTE):
        ramp = exp.Add(this=ramp, expression=exp.Literal.number(1))
    r = exp.func("LEAST", exp.Literal.number(1), exp.func("GREATEST", exp.Literal.number(0), ramp))
    wit = exp.select(exp.alias_(k.copy(), "v"))
    wit = wit.select(*[exp.alias_(e.copy(), f"c{i}") for i, (_, e) in enumerate(keys)])
    wit = wit.select(exp.alias_(exp.func("COALESCE", r, exp.Literal.number(0)), "r"))
    wit.set("from_", _from(sub).copy())
    on = _and([exp.EQ(this=e.copy(), expression=exp.column(f"k{i}", table=_AGG)) for i, (_, e) in enumerate(keys)])
    wit = wit.join(agg.subquery(_AGG), on=on, join_type="LEFT")
    wit = wit.where(_and([*p_where, in_cand]))
    per_key = exp.select(exp.alias_(exp.func("COUNT", exp.Star()), "n")).from_(_WIT)
    per_key = per_key.where(
        _and([exp.Not(this=exp.Is(this=exp.column(f"c{i}"), expression=exp.Null())) for i in range(len(keys))])
    )
    per_key = per_key.group_by(*[exp.column(f"c{i}") for i in range(len(keys))])
    m = exp.select(exp.func("COALESCE", exp.func("MAX", exp.column("n")), exp.Literal.number(0)))
    m = m.from_(per_key.subquery("g"))
    main = exp.select(
        exp.column("v", table=_CAND),
        exp.alias_(exp.func("COALESCE", exp.func("SUM", exp.column("r", table=_WIT)), exp.Literal.number(0)), "w"),
        exp.alias_(exp.Subquery(this=m), "m"),
    ).from_(_CAND)
    main = main.join(
        _WIT, on=exp.EQ(this=exp.column("v", table=_WIT), expression=exp.column("v", table=_CAND)), join_type="LEFT"
    )
    main = main.group_by(exp.column("v", table=_CAND)).order_by(exp.column("v", table=_CAND))
    main = main.with_(_CAND, as_=cand).with_(_WIT, as_=wit)
    return main.sql(dialect="postgres"), cand.sql(dialect="postgres")


def bound(m: int, per_row: float) -> float:
    """The ℓ1 sensitivity of the witness counts (module docstring, step 3): m rows of the public table per
    correlation key, each moving by at most ``per_row`` per unit of distance."""
    return m * per_row


def _literal(v: Any) -> exp.Expr:
    if isinstance(v, bool) or v is None:
        raise RefusedError("selecting public rows: the IN's values must be numbers, text or dates")
    if isinstance(v, (int, Decimal, float)):
        return exp.Literal.number(str(v))
    if isinstance(v, str):
        return exp.Literal.string(v)
    return exp.cast(exp.Literal.string(str(v)), exp.DataType.build("DATE"))


def final_sql(shape: Shape, kept: list[Any]) -> str:
    """The statement with its IN conjunct replaced by ``x IN (<kept values>)`` (FALSE when none is kept): a
    statement over public tables only, answered exactly by the public path."""
    tree = shape.tree.copy()
    target = next(n for n in tree.walk() if n == shape.conjunct and isinstance(n, exp.In))
    # a kept NULL candidate selects nothing: the IN is a conjunct of the WHERE, where NULL IN (…) and x IN (…,
    # NULL) without a match are NULL, so the row is dropped as it is without the NULL (refusing it would come
    # after the charge)
    kept = [v for v in kept if v is not None]
    replacement: exp.Expr = (
        exp.In(this=shape.x.copy(), expressions=[_literal(v) for v in kept]) if kept else exp.false()
    )
    target.replace(replacement)
    return tree.sql(dialect="postgres")


class _Shape(Protocol):
    @property
    def table(self) -> str: ...  # the private table its one statement reads

    @property
    def statement(self) -> str: ...  # that statement (PostgreSQL)

    @property
    def candidates_sql(self) -> str: ...  # its candidates alone, over public tables (PostgreSQL)


S = TypeVar("S", bound=_Shape)
# the columns of the statements' own derived tables that appear under arithmetic, with their kinds: the
# witness statement's L − S reads S = α·SUM(v) or α·COUNT(*) (a number; sqldp.engine.spark.sql.engine_statement)
_DERIVED = {(_AGG, "s"): "numeric"}


@dataclass(frozen=True)
class EngineStatement:
    """A shape's one statement as the session's engine runs it."""

    text: str  # in the engine's dialect
    dialect: str  # its name (sqldp.engine.Dialect.name)
    tables: tuple[str, ...]  # the catalog tables it reads, sorted (the Spark engine snapshots those)


def statement_for(shape: _Shape, context: Context) -> EngineStatement:
    """The shape's statement in the engine's dialect, or RefusedError before anything is read or charged. On
    an engine whose SQL is a translation (sqldp.engine.Dialect.translated; Spark): the candidates, a statement
    over public tables, pass the public path first (on Spark, sqldp.engine.spark.sql.public_statement with its
    checks); the whole statement, PostgreSQL text parsed back, goes through the rule every other statement goes
    through (sqldp.engine.Dialect.engine_statement; on Spark sqldp.engine.spark.sql.to_spark: the snapshot
    prefix, integer division, NUMERIC casts, date arithmetic), each column typed from the catalog or
    :data:`_DERIVED`."""
    import sqlglot

    dialect = context.dialect
    tables = tuple(sorted(statement_tables(sqlglot.parse_one(shape.statement, read="postgres"))))
    if not dialect.translated:
        return EngineStatement(shape.statement, dialect.name, tables)
    public_path(shape.candidates_sql, context)
    return EngineStatement(dialect.engine_statement(shape.statement, context.catalog, _DERIVED), dialect.name, tables)


def public_path(sql: str, context: Context) -> Prepared:
    """A statement over public tables, as the public path checks and answers it (sqldp.strategies.aggregate)."""
    return analysed_text(sql, context, {})


@dataclass
class Chosen(Generic[S]):
    """A selection or an argmax, prepared: its one statement over the private table, the privacy parameters and
    the public path for the final statement. Nothing has been read."""

    context: Context
    sql: str
    shape: S
    params: PrivacyParams
    statement: EngineStatement
    started: float
    speed: Speed = field(default_factory=Speed)

    public = False
    any_spelling = False  # as the session cached it before: under the exact text only

    @property
    def longest(self) -> float:
        return self.context.policy.longest_change

    def checks(self) -> list[str]:
        return self.statements.all()

    def noisy(self) -> tuple[bool, ...] | None:
        return None  # the chosen rows' columns are exact; a released total is the statement's own column

    @property
    def form(self) -> None:
        return None

    @property
    def statements(self) -> Statements:
        s = self.statement
        return Statements(s.text, (), (), {}, exp.select("1"), dialect=s.dialect, tables=s.tables)

    def run(self) -> Result:
        return self._execute(noisy=True)

    def analyze(self) -> Result:
        """Audit mode: the true figures (witness counts or scores, the bound) and the rows they select exactly —
        what the noisy release approximates: the un-noised pipeline."""
        result = self._execute(noisy=False)
        result.audit = True
        return result

    def _execute(self, *, noisy: bool) -> Result:
        raise NotImplementedError


class Selection(Chosen[Shape]):
    """A prepared selection (module docstring)."""

    @property
    def rho(self) -> float:
        """A pure ε-DP release is ε²/2-zCDP (Bun & Steinke, "Concentrated Differential Privacy: Simplifications,
        Extensions, and Lower Bounds", TCC 2016, Prop. 1.4): what a session's zCDP account adds."""
        return self.params.epsilon**2 / 2.0

    def notes(self) -> list[str]:
        return [
            f"IN (SELECT …) at {self.shape.where} selects public rows by private data: each candidate's witness "
            f"count released with Laplace noise (ε = {self.params.epsilon:g}, ℓ1 sensitivity m·B, B = "
            f"{self.shape.per_row:g} from {self.shape.why}, m the most rows of the IN's table per correlation key); "
            f"candidates whose noisy count passes {THRESHOLD:g} are kept and their rows returned exactly",
        ]

    def describe(self) -> Result:
        result = Result(self.sql, self.params, notes=self.notes())
        result.plan = [
            {
                "aggregate": "witness count per candidate",
                "epsilon": self.params.epsilon,
                "delta": None,
                "mechanism": GLOBAL,
                "groups": "full share (ℓ1 over the candidates, one Laplace release of the histogram; kept if > 0.5)",
            }
        ]
        return result

    def _execute(self, *, noisy: bool) -> Result:
        t0 = time.perf_counter()
        fetched = self.context.engine.execute(self.statements, self.speed)
        t_witness = time.perf_counter() - t0
        rows = fetched.answer
        m = int(rows[0][2]) if rows else 0
        sensitivity = bound(m, self.shape.per_row)
        cal = mechanisms.calibrate_global(sensitivity, self.params.epsilon)
        result = Result(self.sql, self.params, test_mode=self.context.noise.test_mode, notes=self.notes())
        kept = []
        for v, w, _ in rows:
            true = float(w)
            value = mechanisms.release(cal.noise, true, cal.scale, self.context.noise) if noisy else true
            result.measurements.append(
                [
                    Measurement(
                        f"witnesses({v})",
                        self.params.epsilon,
                        0.0,
                        0.0,
                        sensitivity,
                        cal.scale,
                        cal.half_width(self.params.confidence),
                        {self.shape.table: {"m": m, "per_row": self.shape.per_row}},
                        GLOBAL,
                        true_value=true,
                        calibration=cal,
                        noisy_value=value if noisy else None,
                    )
                ]
            )
            if value > THRESHOLD:
                kept.append(v)
        final = public_path(final_sql(self.shape, kept), self.context)
        out = final.run()
        result.columns = out.columns
        result.rows = [{"key": dict(r), "values": {}} for r in out.rows]
        result.grouped = True
        result.released = noisy
        result.timings = {"witness_query": t_witness, "total": time.perf_counter() - self.started}
        return result


def recognise(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Selection | None:
    """The selection for a statement of this module's shape (refusing what cannot be analysed before anything
    is read), None for any other statement. The whole statement passes the allow-list as the public path
    checks it."""
    shape = find_shape(parsed, context.catalog, context.policy)
    if shape is None:
        return None
    t0 = time.perf_counter()
    params = resolve_params(context.policy, outputs=1, **{k: v for k, v in privacy.items() if k != "mechanism"})
    # Laplace at a global bound: pure ε, no β, no δ spent (the session charges only what is spent)
    params = dataclasses.replace(params, delta=None, beta=None, mechanism=LAPLACE)
    public_path(final_sql(shape, []), context)  # the final statement's shape passes the public path's checks now
    statement = statement_for(shape, context)
    assert parsed.statement is not None
    allowlist.check(parsed.sql, parsed.statement)
    return Selection(context, parsed.sql, shape, params, statement, t0)


def explain(parsed: ParsedQuery, catalog: Catalog, policy: Policy) -> dict[str, Any] | None:
    """What ``sqldp explain`` shows for this shape (reads nothing): the kind, the bound and the SQL that runs;
    None for a statement of another shape. Refusals are raised as by :func:`recognise`."""
    shape = find_shape(parsed, catalog, policy)
    if shape is None:
        return None
    return {
        "kind": "selection of public rows by witness counts (Laplace over the candidates, kept above 1/2)",
        "where": shape.where,
        "per_row_bound": shape.per_row,
        "why": shape.why,
        "sql": [shape.witness_sql],
    }
