"""Spark SQL with PostgreSQL's meaning: the rewriter's last rule when the engine is Spark (sqldp.rewrite).

Every statement sqldp runs is a sqlglot tree whose meaning is PostgreSQL's: the analyses bound what
PostgreSQL computes (sqldp.pg_arithmetic, sqldp.sensitivity.operators). sqlglot's Spark generator writes the
same tree in Spark's syntax, but where the two engines give one spelling different meanings it translates the
spelling, not the meaning. This rule changes such nodes into the Spark SQL that computes PostgreSQL's value,
or refuses the query with the reason where no Spark expression does (a refusal depends on the query's text,
the catalog and the policy, never on the data). The differences, each checked on Spark 4 with ANSI mode on
(its default, so overflow and division by zero are errors as in PostgreSQL):

* ``a / b`` of two integers truncates in PostgreSQL and is a DOUBLE in Spark → Spark's ``a DIV b`` (BIGINT,
  truncating towards zero, as PostgreSQL);
* an unconstrained ``NUMERIC`` (sqldp sums in it, sqldp.sqlgen.aggregate_expr) is ``DECIMAL(10, 0)`` in
  Spark, which rounds to an integer and overflows at 10¹⁰ → ``DECIMAL(38, 0)`` for an integer (a sum of
  2⁶³ BIGINTs fits: 2¹²⁶ < 10³⁸) and ``DOUBLE`` otherwise (the sum of a clamped value, NR §3.3.7.3, within
  float rounding of PostgreSQL's exact NUMERIC);
* a cast of a non-integer to an integer type rounds in PostgreSQL (half away from zero for NUMERIC, to even
  for DOUBLE PRECISION) and truncates in Spark; ROUND rounds DOUBLEs half up in Spark; CEIL and FLOOR of a
  DOUBLE are BIGINTs in Spark and fail past 2⁶³ → refused, since which rule applies depends on a type the
  catalog's kinds do not tell apart;
* ``LOG(x)`` is the base-10 logarithm in PostgreSQL and the natural one in Spark → ``LOG(10, x)``;
* ``EXTRACT(DOW …)`` counts Sunday as 0 in PostgreSQL and 1 in Spark → minus 1; the other fields sqldp
  passes (YEAR, MONTH, DAY, QUARTER, DOY) agree, the rest are refused;
* ``date − date`` is an INTEGER of days in PostgreSQL and an INTERVAL in Spark → ``DATEDIFF``;
* ``SUBSTRING(s, k, …)`` with k ≤ 0 counts from the start in PostgreSQL and from the end in Spark → refused
  unless k is a literal ≥ 1.

LEAST and GREATEST skip NULLs in both, TANH/COSH/EXP/LN/SQRT/POWER agree on the values where PostgreSQL does
not fail (sqldp refuses expressions it may fail on), and COUNT(*) … FILTER, CASE, scalar subqueries and
ORDER BY … NULLS LAST (which sqlglot writes out) are the same.

Table names are written with :data:`SNAPSHOT` in front: the Spark engine binds them, per query, to each
table pinned to its files or copied (sqldp.engine.spark), so the answer and its sensitivity read one version.
A statement over public tables only goes through :func:`public_statement`, which adds the checks its
arbitrary (allow-listed) expressions need.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

import sqlglot
from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import CatalogError, RefusedError
from sqldp.form import ColumnRef
from sqldp.frontend import inside
from sqldp.pg_arithmetic import KindOf, integer_valued, rounds, truncates
from sqldp.policy import Policy

SNAPSHOT = "__sqldp_snapshot__"  # prefix of a table name in Spark statements; the engine replaces it
FALLBACK = "__sqldp_fallback_"  # message of the RAISE_ERROR standing for a deferred CASE branch (defer_fallbacks)
_SAME_FIELDS = {"YEAR", "MONTH", "DAY", "QUARTER", "DOY"}
_INTEGER_TYPES = exp.DataType.INTEGER_TYPES


def _refuse(node: exp.Expr, why: str) -> RefusedError:
    return RefusedError(f"{node.sql(dialect='postgres')}: {why}, so Spark would compute something else")


def _is_date(e: exp.Expr, kind_of: KindOf) -> bool:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "date"
    return isinstance(e, exp.Cast) and e.to.is_type(exp.DataType.Type.DATE)


def _days(node: exp.Sub, kind_of: KindOf) -> bool:
    """``a − b`` is PostgreSQL's date − date: both dates, or one a date and the other a column of a subquery
    (whose kind the catalog does not know: the value analysis counts a date column ``x`` of its own subquery
    in days as ``x − DATE '1970-01-01'``; PostgreSQL has no other ``− date`` but timestamp − date, and sqldp
    analyses no timestamp arithmetic)."""
    a, b = node.this, node.expression
    if _is_date(a, kind_of) and _is_date(b, kind_of):
        return True
    return any(_is_date(x, kind_of) and _unknown(y, kind_of) for x, y in ((a, b), (b, a)))


def _unknown(e: exp.Expr, kind_of: KindOf) -> bool:
    while isinstance(e, exp.Paren):
        e = e.this
    return isinstance(e, exp.Column) and (not e.table or kind_of(ColumnRef(e.table, e.name)) == "other")


def _integral(e: exp.Expr, kind_of: KindOf) -> bool:
    return integer_valued(e, kind_of) or isinstance(e, exp.IntDiv)


def to_spark(tree: exp.Expr, kind_of: KindOf) -> exp.Expr:
    """A copy of ``tree`` (PostgreSQL's meaning) whose Spark SQL computes the same values, or RefusedError."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}

    def decide(node: exp.Expr) -> str | None:
        """What the node becomes, judged on the PostgreSQL tree (before any node is changed: an integer
        division already written as DIV would no longer read as an integer to the division above it)."""
        if isinstance(node, exp.Literal) and node.is_string and SNAPSHOT in node.this:
            raise _refuse(node, f"the text {SNAPSHOT!r} names sqldp's table snapshots in Spark statements")
        if isinstance(node, exp.Literal) and node.is_string and FALLBACK in node.this:
            raise _refuse(node, f"the text {FALLBACK!r} marks sqldp's deferred subqueries in Spark statements")
        if isinstance(node, exp.Table) and node.name and node.name.lower() not in ctes:
            return "snapshot"
        if isinstance(node, exp.Div) and truncates(node, kind_of):
            return "div"
        if isinstance(node, exp.Cast):
            if node.to.is_type(*_INTEGER_TYPES) and rounds(node, kind_of):
                raise _refuse(node, "PostgreSQL rounds a non-integer cast to an integer type, Spark truncates")
            if node.to.is_type(exp.DataType.Type.DECIMAL) and not node.to.expressions:
                return "decimal" if _integral(node.this, kind_of) else "double"
        if isinstance(node, (exp.Ceil, exp.Floor, exp.Round)) and not _integral(node.this, kind_of):
            raise _refuse(node, "PostgreSQL's and Spark's rounding functions differ on non-integers (type, halves)")
        if isinstance(node, exp.Log) and node.args.get("expression") is None:
            return "log10"
        if isinstance(node, exp.Extract):
            field = node.name.upper()
            if field == "DOW":
                return "dow"
            if field not in _SAME_FIELDS:
                raise _refuse(node, f"EXTRACT({field}) is not checked to agree between PostgreSQL and Spark")
        if isinstance(node, exp.Sub) and _days(node, kind_of):
            return "datediff"
        if isinstance(node, exp.Substring):
            start = node.args.get("start")
            if start is None or not (isinstance(start, exp.Literal) and start.this.isdigit() and int(start.this) >= 1):
                raise _refuse(node, "SUBSTRING from a position below 1 counts from the end of the text in Spark")
        return None

    def change(node: exp.Expr, how: str) -> exp.Expr:
        if how == "snapshot":
            # the snapshot keeps the name the columns qualify with (sqldp's statements alias every table)
            alias = node.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name))
            return exp.Table(this=exp.to_identifier(SNAPSHOT + node.name.lower()), alias=alias)
        if how == "div":
            return exp.IntDiv(this=node.this, expression=node.args["expression"])
        if how in ("decimal", "double"):
            return exp.cast(node.this, "DECIMAL(38, 0)" if how == "decimal" else "DOUBLE")
        if how == "log10":
            return exp.Log(this=exp.Literal.number(10), expression=node.this)
        if how == "dow":
            return exp.Paren(this=exp.Sub(this=node.copy(), expression=exp.Literal.number(1)))
        assert how == "datediff"
        return exp.DateDiff(this=node.this, expression=node.args["expression"], unit=exp.var("DAY"))

    root = tree.copy()
    plan = [(node, how) for node in root.dfs() if (how := decide(node)) is not None]
    # descendants before their ancestors (sqlglot's transform does not visit a replaced node's children)
    for node, how in reversed(plan):
        new = change(node, how)
        if node is root:
            root = new
        else:
            node.replace(new)
    return root


def _fractional(e: exp.Expr, kind_of: KindOf) -> bool:
    """Whether PostgreSQL gives ``e`` a non-integer type for certain (so ``x / e`` and ``e / x`` divide
    exactly on both engines): a NUMERIC or floating column, a literal with a point or an exponent, a cast to
    one of those types, AVG, and arithmetic with such an operand."""
    while isinstance(e, (exp.Paren, exp.Neg, exp.Abs)):
        e = e.this
    if isinstance(e, exp.Column):
        return bool(e.table) and kind_of(ColumnRef(e.table, e.name)) == "numeric"
    if isinstance(e, exp.Literal):
        return not e.is_string and any(c in e.this.lower() for c in ".e")
    if isinstance(e, exp.Cast):
        return e.to.is_type(exp.DataType.Type.DOUBLE, exp.DataType.Type.FLOAT, exp.DataType.Type.DECIMAL)
    if isinstance(e, exp.Avg):
        return True
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        return _fractional(e.this, kind_of) or _fractional(e.expression, kind_of)
    return False


def public_statement(sql: str, catalog: Catalog, policy: Policy) -> str:
    """An exact statement over public tables (sqldp.normalize.PublicRelease, PostgreSQL text that passed the
    allow-list) in Spark SQL with PostgreSQL's meaning, reading the per-query snapshot of each table (the Spark
    engine binds :data:`SNAPSHOT` names only), or RefusedError — decided on the text, the catalog and the
    policy only. Beyond :func:`to_spark`'s rules, which need each column's kind: the columns are qualified
    against the catalog (sqlglot's ``qualify``), a column whose source the statement does not name
    unambiguously has no kind, and a statement is refused where a kind it lacks could change the meaning —
    such a column under arithmetic, a cast or a rounding function, and a division that is neither of two
    integers (PostgreSQL truncates, :func:`to_spark` writes DIV) nor surely of a non-integer (e.g. COUNT(*) / 2
    truncates in PostgreSQL: its types are not in the catalog's kinds, so it is refused)."""
    from sqlglot.errors import OptimizeError
    from sqlglot.optimizer.qualify import qualify

    tree = sqlglot.parse_one(sql, read="postgres")
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if table.args.get("db") or table.args.get("catalog"):
            raise RefusedError(f"{table.sql(dialect='postgres')}: a qualified name is not a table of the catalog")
        if name in ctes:
            continue
        if name not in catalog.tables or not policy.table(name).public:
            raise RefusedError(f"{name}: the Spark engine answers exactly only statements over public tables")
    try:
        tree = qualify(tree, schema=catalog.sqlglot_schema(), dialect="postgres", quote_identifiers=False)
    except OptimizeError as exc:
        raise RefusedError(f"the statement's columns cannot be resolved against the catalog: {exc}") from exc
    return _checked(tree, catalog, {})


def engine_statement(sql: str, catalog: Catalog, derived: Mapping[tuple[str, str], str]) -> str:
    """A statement sqldp builds itself (sqldp.strategies.selection's witness and score statements: PostgreSQL text over
    the catalog's tables, every column already qualified by the frontend) in Spark SQL with PostgreSQL's
    meaning, or RefusedError before anything runs. The same checks as :func:`public_statement` (a column
    without a kind under arithmetic, a cast or a rounding function, a division of unknown integer-ness are
    refused), with ``derived`` giving the kind of the columns of sqldp's own derived tables, (alias, column) →
    kind, which the catalog cannot know. Private tables may be read: the statement is one of an analysis."""
    tree = sqlglot.parse_one(sql, read="postgres")
    _catalog_tables(tree, catalog)
    return _checked(tree, catalog, derived)


def _catalog_tables(tree: exp.Expr, catalog: Catalog) -> set[str]:
    """The statement's CTE names; RefusedError for a table that is neither one nor a table of the catalog."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if table.args.get("db") or table.args.get("catalog"):
            raise RefusedError(f"{table.sql(dialect='postgres')}: a qualified name is not a table of the catalog")
        if name not in ctes and name not in catalog.tables:
            raise RefusedError(f"{name}: not a table of the catalog")
    return ctes


def _checked(tree: exp.Expr, catalog: Catalog, derived: Mapping[tuple[str, str], str]) -> str:
    """``tree`` (qualified columns) through :func:`to_spark` with each column's kind from the catalog (a
    column of a table alias naming one catalog table) or ``derived``, after refusing what a missing kind
    could mistranslate (:func:`public_statement`)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    sources: dict[str, set[str]] = {}
    for table in tree.find_all(exp.Table):
        sources.setdefault(table.alias_or_name.lower(), set()).add(
            "" if table.name.lower() in ctes else table.name.lower()
        )
    named: dict[str, int] = {}  # derived tables and CTEs per alias
    for source in tree.find_all(exp.Subquery, exp.CTE):
        if source.alias_or_name:
            sources.setdefault(source.alias_or_name.lower(), set()).add("")
            named[source.alias_or_name.lower()] = named.get(source.alias_or_name.lower(), 0) + 1
    known = {(a.lower(), c.lower()): k for (a, c), k in derived.items()}

    def kind_of(ref: ColumnRef) -> str:
        alias = ref.alias.lower()
        found = sources.get(alias, set())
        if found == {""} and named.get(alias) == 1:  # one derived table of that name: sqldp's, if it declares it
            return known.get((alias, ref.column.lower()), "other")
        if len(found) != 1:
            return "other"
        try:
            return catalog.table(next(iter(found))).column(ref.column).kind
        except (KeyError, CatalogError):
            return "other"

    arithmetic = (exp.Add, exp.Sub, exp.Mul, exp.Div, exp.Mod, exp.Cast, exp.Round, exp.Ceil, exp.Floor)
    for node in tree.find_all(*arithmetic):
        for operand in (node.this, node.args.get("expression")):
            e: exp.Expr | None = operand
            while isinstance(e, (exp.Paren, exp.Neg)):
                e = e.this
            if isinstance(e, exp.Column) and kind_of(ColumnRef(e.table, e.name)) == "other":
                raise _refuse(node, "a column of a subquery has no type sqldp knows here")
        fractional = _fractional(node.this, kind_of) or _fractional(node.expression, kind_of)
        if isinstance(node, exp.Div) and not truncates(node, kind_of) and not fractional:
            raise _refuse(node, "a division that may be of integers the catalog's kinds do not show")
    return to_spark(tree, kind_of).sql(dialect="spark")


# -- CASE branches that PostgreSQL evaluates only when taken -----------------------------------------------
#
# PostgreSQL runs an uncorrelated scalar subquery in a CASE branch only when a row takes the branch (an
# InitPlan is evaluated on first use); Spark computes every scalar subquery of a plan before the plan runs.
# The row-level analysis relies on PostgreSQL's order: its separator statement (sqldp.sensitivity.rows,
# _factorised) is CASE WHEN <a part is functional> THEN F ELSE (<the GROUP BY fallback>) END, and the
# fallback is the expensive statement the check avoids (rows/q05: a five-table join grouped by two keys).
# On Spark such a branch is split off: the statement runs with the branch replaced by RAISE_ERROR(<marker>),
# which fails only when a row takes it; then, and only then, the fallback runs as its own statement
# (``SELECT (<subquery>)``, so Spark's scalar-subquery rules — NULL for no row, an error for two — are the
# same), its one value is bound to a view, and the statement runs again reading the value from it. The
# value and its type are the subquery's own, so the numbers are those of the single statement.


@dataclass(frozen=True)
class Deferred:
    """A Spark statement with its deferred CASE branches: ``text`` has ``calls[i]`` (a RAISE_ERROR) where
    branch i was, ``fallbacks[i]`` computes the branch's value as one row of one column."""

    text: str
    calls: tuple[str, ...]
    fallbacks: tuple[str, ...]


def _uncorrelated(query: exp.Expr) -> bool:
    """Whether a subquery reads nothing of the query around it: every qualified column names a table or
    derived table of its own, every unqualified one a column its own SELECTs name (sqldp qualifies every
    column of a table; an unqualified name is a derived table's output, e.g. MAX(n))."""
    aliases = {t.alias_or_name.lower() for t in query.find_all(exp.Table)}
    aliases |= {s.alias.lower() for s in query.find_all(exp.Subquery) if s.alias}
    aliases |= {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}
    names = {e.alias_or_name.lower() for s in query.find_all(exp.Select) for e in s.expressions}
    for column in query.find_all(exp.Column):
        if column.table.lower() not in aliases if column.table else column.name.lower() not in names:
            return False
    return True


@functools.lru_cache(maxsize=256)
def defer_fallbacks(text: str) -> Deferred | None:
    """``text`` (Spark SQL as sqldp writes it) with each CASE's ELSE branch that is an uncorrelated scalar
    subquery deferred (above), or None when it has none — or when sqlglot does not write the parsed text
    back exactly, so that nothing but the branches can change. Pure and cached: a prepared query's statements
    are parsed once."""
    if "ELSE (SELECT" not in text:  # the cheap test: most statements have no such branch
        return None
    tree = sqlglot.parse_one(text, read="spark")
    if tree.sql(dialect="spark") != text:
        return None
    branches = []
    for case in tree.find_all(exp.Case):
        default = case.args.get("default")
        if isinstance(default, exp.Subquery) and not default.alias and _uncorrelated(default.this):
            branches.append(default)
    # a branch inside another deferred branch goes with its fallback statement (which is deferred in turn)
    outer = [b for b in branches if not any(o is not b and inside(b, o) for o in branches)]
    if not outer:
        return None
    calls, fallbacks = [], []
    for i, branch in enumerate(outer):
        fallbacks.append(exp.select(exp.alias_(branch.copy(), "v")).sql(dialect="spark"))
        call = exp.Anonymous(this="RAISE_ERROR", expressions=[exp.Literal.string(f"{FALLBACK}{i}__")])
        calls.append(call.sql(dialect="spark"))
        branch.replace(call)
    return Deferred(tree.sql(dialect="spark"), tuple(calls), tuple(fallbacks))


_RAISED = re.compile(r"\[USER_RAISED_EXCEPTION\] " + FALLBACK + r"(\d+)__")


def raised_fallback(exc: BaseException) -> int | None:
    """The deferred branch whose RAISE_ERROR ``exc`` is (a row took it), or None for any other error. Spark
    reports it as USER_RAISED_EXCEPTION, wrapped (a Py4J error) when it fails inside a scalar subquery; only
    :func:`defer_fallbacks` writes the marker (a literal holding it is refused)."""
    found = _RAISED.search(str(exc))
    return None if found is None else int(found.group(1))
