"""The rewriter (pipeline step 4 of 6, docs/layout.md): the SQL that actually runs, built from the answer
query and the plans' queries by an ordered list of tree → tree rules, as sqlglot's optimizer composes its
rules. None of them changes what a query computes:

1. ``fold`` — the sensitivity queries that scan the answer's product are computed in the answer's scan;
   ``unclamp`` — a clamp to a declared range that a validated CHECK constraint already enforces is left out;
   ``centred`` — a centred SUM(x − m) is computed from SUM(x) and COUNT(x), which the answer computes anyway;
   ``unjoin`` — a one-row bound over a join drops the tables only an enforced foreign key joins and none of
   its items reads (TPC-H Q14's part: MAX(ABS(l_discount)) over lineitem ⋈ part is the MAX over lineitem);
2. ``match_groups`` — each answer row is matched to its released group by PostgreSQL's ``=`` (sqldp.groups);
3. ``widen_integers`` — INTEGER arithmetic runs in BIGINT, so no overflow error answers for the data (sqlgen);
4. ``truncate`` — a table whose declared contribution bound (``max_rows_per``) the plans rely on is read
   through a truncation to τ rows per key. This one does change what a query computes where the data breaks
   the declaration: that is its purpose (docs/truncation.md), and the bound holds on the truncated data;
5. the engine dialect's own rules (sqldp.engine.Dialect.rules): on Spark the Spark SQL that keeps
   PostgreSQL's meaning, or a refusal (sqldp.engine.spark.sql); the statements are then written in the
   dialect's SQL (sqldp.engine.Dialect.name) instead of PostgreSQL's.

``sqldp explain`` prints the statements this module produces. Pure: no database.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from sqlglot import exp

from sqldp.catalog import Catalog, Table, constant, exact_type
from sqldp.errors import CatalogError, RefusedError
from sqldp.form import KEY_PREFIX, AnalysisForm, ColumnRef
from sqldp.frontend import conjuncts
from sqldp.groups import DOMAIN_ALIAS, KeyDomain, match_groups
from sqldp.pg_arithmetic import case_values
from sqldp.policy import Policy
from sqldp.sensitivity import model_check
from sqldp.sensitivity.global_bound import ALL, CUT, IN, OVER, RANK, Truncation
from sqldp.sensitivity.intervals import domain
from sqldp.sensitivity.operators import clamped
from sqldp.sensitivity.plan import Plan
from sqldp.sqlgen import widen_integers

if TYPE_CHECKING:
    from sqldp.engine import Dialect


@dataclass
class Scope:
    """What the rules read: the form, its plans and group domains, and each column's kind."""

    form: AnalysisForm
    plans: Sequence[Plan]
    domains: Sequence[KeyDomain]
    kind: Callable[[ColumnRef], str]
    # plan query (its index over all plans' queries) → the answer row's columns that hold its one result row
    folded: dict[int, tuple[int, int]] = field(default_factory=dict)
    catalog: Catalog | None = None
    truncations: tuple[Truncation, ...] = ()  # the declared bounds the plans rely on (``truncate``)
    # the engine's SQL (sqldp.engine.Dialect): ``truncate`` writes its order for it, ``centred`` asks it
    dialect: Dialect = field(kw_only=True)


Rule = Callable[[exp.Select, Scope], exp.Select]


def tables(tree: exp.Expr) -> set[str]:
    """The catalog tables a statement reads (its FROM and JOIN tables, in subqueries too, CTE names not)."""
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    return {t.name.lower() for t in tree.find_all(exp.Table) if t.name and t.name.lower() not in ctes}


def fold(answer: exp.Select, scope: Scope) -> exp.Select:
    # no unjoin under a truncation (``unjoin``): nor a bound kept apart from the answer for it
    merged, scope.folded = _fold(scope.form, answer, scope.plans, None if scope.truncations else scope.catalog)
    return merged


def unjoin(query: exp.Select, scope: Scope) -> exp.Select:
    if scope.truncations:  # a truncated table's rows are not the table's: no key of the catalog speaks of them
        return query
    return unjoined(query, scope.catalog) or query


def groups(answer: exp.Select, scope: Scope) -> exp.Select:
    # under partition selection the groups are the answer's own (PostgreSQL's GROUP BY decides identity)
    if not scope.form.group_by or any(d.private for d in scope.domains):
        return answer
    return match_groups(answer, scope.domains)


def _exact(e: exp.Expr, scope: Scope) -> bool:
    """Whether PostgreSQL computes ``e`` in an integer type or NUMERIC, never in floating point: columns of those
    types, numeric literals, + − × / (integer division truncates, NUMERIC division rounds: either way a value of
    an exact type), CASE whose values are exact, casts to exact types."""
    if isinstance(e, (exp.Paren, exp.Neg)):
        return _exact(e.this, scope)
    if isinstance(e, exp.Column):
        if not e.table or scope.catalog is None:
            return False
        try:
            column = scope.catalog.table(scope.form.use(e.table).table).column(e.name)
        except (KeyError, CatalogError):
            return False
        return exact_type(column.type_sql)
    if isinstance(e, exp.Literal):
        return not e.is_string
    if isinstance(e, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        return _exact(e.this, scope) and _exact(e.expression, scope)
    if isinstance(e, exp.Case) and e.this is None:
        return all(_exact(v, scope) for v in case_values(e))
    if isinstance(e, exp.Cast):
        return e.to.is_type(*exp.DataType.INTEGER_TYPES, exp.DataType.Type.DECIMAL)
    return False


def _clamped_column(e: exp.Expr) -> exp.Column | None:
    """c when ``e`` is ``CASE WHEN c < lo THEN lo WHEN c > hi THEN hi ELSE c END`` (the clamp of
    :func:`sqldp.sensitivity.intervals.clamp_columns`) or one of its branches alone (``unclamp`` leaves that):
    NULL exactly where c is. Else None."""
    if not isinstance(e, exp.Case) or e.this is not None:
        return None
    c, ifs = e.args.get("default"), e.args.get("ifs") or []
    if not isinstance(c, exp.Column) or not ifs or len(ifs) > 2:
        return None
    for branch in ifs:
        test = branch.this
        if not isinstance(test, (exp.LT, exp.GT)) or test.this != c or branch.args.get("true") != test.expression:
            return None
        bound = test.expression
        if constant(bound) is None or (isinstance(bound, exp.Literal) and bound.is_string):
            return None
    return c


def unclamp(query: exp.Select, scope: Scope) -> exp.Select:
    """A clamp ``CASE WHEN c < lo THEN lo WHEN c > hi THEN hi ELSE c END`` (the analyses' guarantee that c's
    declared range [lo, hi] holds on any data) becomes c where PostgreSQL enforces a range within [lo, hi] on
    every row of c's table by a validated CHECK constraint (``Column.checked``, read from the database only): on
    every database the query can run on, the clamp returns c itself, NULL included. One side checked drops
    that side's branch. Saves two comparisons per row and clamped column (TPC-H Q1 clamps seven).

    The column's table is the one its qualifier names in this statement; a qualifier that names a derived table
    (a CTE too), or two different tables, leaves the clamp."""
    if scope.catalog is None or not scope.catalog.enforced:
        return query
    catalog = scope.catalog
    # each qualifier's tables in this statement ("": a derived table, a VALUES list, or a table name a CTE shadows)
    ctes = {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}
    named: dict[str, set[str]] = {}
    for node in query.find_all(exp.Table, exp.Subquery, exp.CTE, exp.Values):
        real = isinstance(node, exp.Table) and node.name.lower() not in ctes
        named.setdefault(node.alias_or_name.lower(), set()).add(node.name.lower() if real else "")

    def checked(c: exp.Column) -> tuple[Decimal | None, Decimal | None] | None:
        tables = named.get(c.table.lower(), set())
        if len(tables) != 1 or "" in tables:
            return None
        try:
            return catalog.table(next(iter(tables))).column(c.name).checked
        except CatalogError:
            return None

    def replace(node: exp.Expr) -> exp.Expr:
        parts = clamped(node)  # the two-sided clamp
        c = parts[0] if parts is not None else None
        if not isinstance(c, exp.Column) or not c.table:
            return node
        # the bounds as written (exact: the float clamped() reads them as could differ from the SQL literal)
        lo, hi = (constant(branch.args["true"]) for branch in node.args["ifs"])
        interval = checked(c)
        if lo is None or hi is None or interval is None:
            return node
        low_ok = interval[0] is not None and interval[0] >= lo
        high_ok = interval[1] is not None and interval[1] <= hi
        if low_ok and high_ok:
            return c.copy()
        if not (low_ok or high_ok):
            return node
        kept = node.args["ifs"][1 if low_ok else 0].copy()
        return exp.Case(ifs=[kept], default=c.copy())

    return query.transform(replace)  # type: ignore[return-value]


def _unclamped(e: exp.Expr) -> exp.Expr:
    """The column c of a clamp of c (:func:`_clamped_column`: NULL exactly where c is), else ``e``."""
    return _clamped_column(e) or e


def centred(answer: exp.Select, scope: Scope) -> exp.Select:
    """Each answer aggregate ``SUM(CAST(x − m AS NUMERIC))``, the centred sum of an AVG or a variance
    (sqldp.aggregates), becomes ``SUM(CAST(x AS NUMERIC)) − m·COUNT(x)`` where x is of an exact type. The two
    are equal: x − m is exact there, NUMERIC sums exactly, and both are NULL when no x is. The answer already
    has SUM(x) when the query sums x too (Q1's AVG(l_quantity) beside SUM(l_quantity)) and COUNT(x) as the AVG's
    other measurement: PostgreSQL computes an aggregate written twice once, so the centred sum costs nothing
    where it cost a subtraction, a cast and a NUMERIC addition per row. PostgreSQL only: Spark's DECIMAL has a
    bounded precision."""
    if not scope.dialect.unbounded_numeric:
        return answer
    answer = answer.copy()
    for item in answer.expressions:
        total = item.this if isinstance(item, exp.Alias) and item.alias.startswith("__agg") else None
        cast = total.this if isinstance(total, exp.Sum) else None
        if not isinstance(cast, exp.Cast) or not cast.to.is_type(exp.DataType.Type.DECIMAL):
            continue
        sub = cast.this
        if not isinstance(sub, exp.Sub) or not isinstance(sub.expression, exp.Literal):
            continue
        if sub.expression.is_string or not _exact(sub.this, scope):
            continue
        x = sub.this
        count = exp.Count(this=_unclamped(x).copy())
        shifted = exp.Sub(
            this=exp.Sum(this=exp.cast(x.copy(), "NUMERIC")),
            expression=exp.Mul(this=sub.expression.copy(), expression=count),
        )
        item.set("this", exp.Paren(this=shifted))
    return answer


def widen(query: exp.Select, scope: Scope) -> exp.Select:
    return widen_integers(query, scope.kind)  # type: ignore[return-value]


def truncate(query: exp.Select, scope: Scope) -> exp.Select:
    """Every read of a truncated table t becomes a subquery with the same alias that keeps, per value v of its
    key k (NULL is one value, as PARTITION BY groups NULLs), the first τ rows of the partition P_v in a total
    order: at most τ rows per value of k, so the declaration the plan relies on holds on whatever data the
    query reads.

    The order (:func:`total_order`) is total and data-independent: which rows are kept is a function of the
    multiset of rows, never of their physical order. Then adding one row r to the table changes the truncated
    table by r in and at most one row of r's key out (the τ-th, when r ranks before it), and removing one by
    at most one out and one in — the stability the bounds of :mod:`sqldp.sensitivity.global_bound` are
    computed for (docs/truncation.md). Reading, counting, casting to text and sorting cannot fail, so the
    truncation adds no data-dependent error. On Spark the same rows are kept (:func:`total_order` with
    Spark's dialect), or the query is refused before anything runs.

    The SQL (:func:`truncated_read`) ranks only the partitions that are over τ; the others pass whole, which
    is what the window keeps of them. The same rows on every database, and rows of keys under τ need no sort
    (TPC-H Q13 at SF 0.1: no customer is over 64 orders, and the window sorted all 150 000)."""
    if not scope.truncations or scope.catalog is None:
        return query
    catalog = scope.catalog
    cuts = {t.table: t for t in scope.truncations}

    def replace(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Table) or node.name.lower() not in cuts or node.name.lower() in ctes:
            return node
        alias = node.args["alias"].copy() if node.args.get("alias") else exp.TableAlias(this=node.this.copy())
        # each read its own CTE name: sqlglot writes Spark's nested WITHs as one top-level WITH, where two reads'
        # (a self-join) would clash — a name unused by the query's CTEs, which share that WITH then
        over = next(n for i in itertools.count() if (n := f"{OVER}{i}") not in ctes)
        ctes.add(over)
        return exp.Subquery(this=truncated_read(cuts[node.name.lower()], catalog, scope.dialect, over), alias=alias)

    ctes = {c.alias_or_name.lower() for c in query.find_all(exp.CTE)}
    return query.transform(replace)  # type: ignore[return-value]


def truncated_read(cut: Truncation, catalog: Catalog, dialect: Dialect, over: str = OVER) -> exp.Query:
    """The rows of ``cut.table`` that a truncation to ``cut.tau`` rows per ``cut.column`` keeps: those of
    ``ROW_NUMBER() OVER (PARTITION BY k ORDER BY <total order>) <= τ`` over the whole table, computed as ::

        WITH __sqldp_over AS (SELECT k FROM t GROUP BY k HAVING COUNT(*) > τ)   -- the keys over τ
        SELECT <columns> FROM t AS __sqldp_all                                   -- (1) keys at most τ: whole
          WHERE __sqldp_all.k IS NOT NULL
            AND NOT EXISTS (SELECT 1 FROM __sqldp_over WHERE __sqldp_over.k = __sqldp_all.k)
        UNION ALL
        SELECT <columns> FROM (                                                  -- (2) the window, over
          SELECT <columns>, ROW_NUMBER() OVER (PARTITION BY k ORDER BY …) AS __sqldp_rank FROM (
            SELECT <columns> FROM t AS __sqldp_all WHERE EXISTS (… __sqldp_over.k = __sqldp_all.k)
            UNION ALL SELECT <columns> FROM t AS __sqldp_all WHERE __sqldp_all.k IS NULL
          ) AS __sqldp_in) AS __sqldp_cut                                        --     keys over τ and NULL
        WHERE __sqldp_rank <= τ

    The same rows as the window over t (the multiset), partition by partition: GROUP BY, the ``=`` of the
    EXISTS and PARTITION BY compare k by the same equality (its type's default operator class, under its
    collation), so for a non-NULL v either |P_v| ≤ τ — v is not in __sqldp_over, all of P_v comes through (1),
    none through (2), and the window keeps all of P_v since every rank is ≤ τ — or |P_v| > τ — v is in
    __sqldp_over, none of P_v comes through (1), and all of P_v, alone in its partition, enters the window of
    (2), whose ranks within it are those of the window over t, the order being the same. The NULL partition
    (never equal under ``=``) always takes path (2), whole. GROUP BY, COUNT, EXISTS and the window cannot fail
    on any data, and one statement reads one snapshot, so the counts are those of the rows ranked. The NULL
    branch is left out where PostgreSQL enforces NOT NULL on k (an ``enforced`` catalog): it would read
    nothing. On PostgreSQL, (1) is a hash anti-join against a usually empty set and the conditions of the
    query on t are pushed into both branches; the sort runs over the partitions over τ only. ``dialect``:
    the engine's SQL for the order (:func:`total_order`); WITH in a subquery, EXISTS and UNION ALL mean the
    same on Spark."""
    if any(t.startswith(OVER) for t in catalog.tables):  # global_bound.declared_truncations offers none then
        raise RefusedError(f"a table named {OVER}… would be hidden by the truncation's SQL (docs/truncation.md)")
    table = catalog.table(cut.table)

    def columns() -> list[exp.Expr]:
        return [exp.column(c, quoted=True) for c in table.columns]

    def key(of: str) -> exp.Column:
        return exp.column(cut.column, table=of, quoted=True)

    def read() -> exp.Table:
        return exp.Table(
            this=exp.to_identifier(cut.table, quoted=True), alias=exp.TableAlias(this=exp.to_identifier(ALL))
        )

    def is_over() -> exp.Exists:  # the row's key is one of the keys over τ
        return exp.Exists(
            this=exp.select(exp.Literal.number(1)).from_(over).where(exp.EQ(this=key(over), expression=key(ALL)))
        )

    counted = (
        exp.select(exp.column(cut.column, quoted=True))
        .from_(exp.Table(this=exp.to_identifier(cut.table, quoted=True)))
        .group_by(exp.column(cut.column, quoted=True))
        .having(exp.GT(this=exp.Count(this=exp.Star()), expression=exp.Literal.number(cut.tau)))
    )
    null = exp.Is(this=key(ALL), expression=exp.Null())
    whole = exp.select(*columns()).from_(read()).where(exp.and_(exp.not_(null.copy()), exp.not_(is_over())))
    ranked: exp.Query = exp.select(*columns()).from_(read()).where(is_over())
    if not (catalog.enforced and not table.columns[cut.column].nullable):
        ranked = exp.union(ranked, exp.select(*columns()).from_(read()).where(null), distinct=False)
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[exp.column(cut.column, quoted=True)],
        # NULLS LAST written out: PostgreSQL's default for ASC, Spark's is NULLS FIRST (the same rows kept)
        order=exp.Order(
            expressions=[
                exp.Ordered(this=e, nulls_first=False) for e in total_order(table, cut.column, catalog, dialect)
            ]
        ),
    )
    window = exp.select(*columns(), exp.alias_(rank, RANK)).from_(
        exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier(IN)))
    )
    cut_rows = (
        exp.select(*columns())
        .from_(exp.Subquery(this=window, alias=exp.TableAlias(this=exp.to_identifier(CUT))))
        .where(exp.LTE(this=exp.column(RANK), expression=exp.Literal.number(cut.tau)))
    )
    return exp.union(whole, cut_rows, distinct=False).with_(over, as_=counted)


def total_order(table: Table, partition: str, catalog: Catalog, dialect: Dialect) -> list[exp.Expr]:
    """ORDER BY items under which two rows of ``table`` with the same ``partition`` value tie only when they
    are identical — equal under every operator a query may apply — so the rows a truncation keeps depend on
    the multiset of rows alone.

    * A key PostgreSQL enforces (PRIMARY KEY, UNIQUE NOT NULL; an ``enforced`` catalog): its columns. No two
      rows are equal on it under its own btree equality, which is the ORDER BY's; and the truncation can read
      the key's index (lineitem's (l_orderkey, l_linenumber) is already ordered as the window asks).
    * Otherwise every column in the table's order: INTEGER, DATE, BOOLEAN and NUMERIC(p, s) compare equal only
      when identical (the typmod fixes a NUMERIC's scale); text in the "C" collation (bytewise: a
      nondeterministic collation's equal strings differ there); any other kind (DOUBLE PRECISION's −0 and 0,
      an unconstrained NUMERIC's 1.0 and 1.00, types without a btree order) by its text in "C" — exact for
      floats under PostgreSQL's default extra_float_digits = 1, which sqldp's connections keep.

    Another ``dialect`` may write the items of the same order in its SQL (sqldp.engine.Dialect.total_order);
    Spark's (sqldp.engine.spark.dialect.SparkDialect.total_order), so that Spark keeps the rows PostgreSQL
    keeps (the caller writes NULLS LAST, PostgreSQL's ASC default). Spark enforces no key (its catalog is not
    ``enforced``), so every column is ordered. INTEGER, DATE, BOOLEAN and DECIMAL(p, s) order as in
    PostgreSQL. Text: Spark's default collation UTF8_BINARY compares the UTF-8 bytes, as PostgreSQL's "C"
    does (memcmp, then the shorter first), so the column is ordered as it is, without COLLATE; a column
    with another collation has another type name in the catalog (``string collate …``, kind other). A
    CHAR(n) column is padded with blanks when Spark reads it, where PostgreSQL's CHAR compares without
    trailing blanks: ordered by RTRIM (which removes trailing blanks only). The kinds PostgreSQL orders by
    their text (floats, unconstrained NUMERIC, others) are refused, since that text differs between the
    engines (Spark prints ``1.0E10`` where PostgreSQL prints ``10000000000``); so is such a partition
    column, whose equality under PARTITION BY (−0 and 0, NaN) is not checked to agree. The refusal depends on
    the catalog only and comes while the statements are written, before anything is charged or read."""
    own = dialect.total_order(table, partition, catalog)
    if own is not None:
        return own
    keys = model_check.keys_of(table) if catalog.enforced else []
    if keys:
        return [exp.column(c, quoted=True) for c in keys[0] if c != partition]
    out: list[exp.Expr] = []
    for c in table.columns.values():
        if c.name == partition:
            continue
        col = exp.column(c.name, quoted=True)
        if c.kind in ("integer", "date", "boolean") or (c.kind == "numeric" and scaled(c.type_sql)):
            out.append(col)
        elif c.kind == "text":
            out.append(exp.Collate(this=col, expression=exp.column("C", quoted=True)))
        else:
            text = exp.Collate(this=exp.cast(col.copy(), "TEXT"), expression=exp.column("C", quoted=True))
            out.extend([col, text] if c.kind == "numeric" else [text])
    return out


def scaled(type_sql: str) -> bool:
    """NUMERIC(p, s) or DECIMAL(p, s): every value is stored at scale s."""
    head, _, args = type_sql.upper().replace(" ", "").partition("(")
    return head in ("NUMERIC", "DECIMAL") and bool(args)


ANSWER_RULES: tuple[Rule, ...] = (fold, unclamp, centred, groups, widen, truncate)
QUERY_RULES: tuple[Rule, ...] = (unjoin, unclamp, widen, truncate)


@dataclass(frozen=True)
class Statements:
    """The SQL texts one analysed query runs, generated once (sqlglot's generator costs milliseconds on large
    bounds): the answer, the plan queries not folded into it, each distinct text once, and the queries reading
    the group domains that come from public tables, one per key (None for a domain the policy declares, and
    for the keys of a joint domain after its first, whose statement reads the tuples of them all)."""

    answer: str
    queries: tuple[str, ...]  # distinct texts: two plans often ask the same (c1 and c4 of a combined COUNT)
    domains: tuple[str | None, ...]
    folded: dict[int, tuple[int, int]]
    source: exp.Select  # the answer query before the rules: the released aggregates over the form's scan
    # per plan query that is not folded (in plan order), the index of its text in ``queries``
    order: tuple[int, ...] = ()
    # per plan query that is not folded, the columns of its statement's one row that are its own (``merge_scans``
    # ran it with others over the same scan), or None: the statement is the query itself
    columns: tuple[tuple[int, int] | None, ...] = ()
    dialect: str = "postgres"  # the SQL the texts are written in (sqldp.engine.Dialect.name)
    tables: tuple[str, ...] = ()  # the catalog tables the statements read, sorted
    truncations: tuple[Truncation, ...] = ()  # tables read truncated to their declared bound (``truncate``)
    # why the plans do or do not rely on declared bounds (sqldp.release.BoundChoice.to_json), when the query
    # reads a declared key; and the note a run shows when they do. Both data-independent.
    choice: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()

    def all(self) -> list[str]:
        return [self.answer, *self.queries, *(d for d in self.domains if d is not None)]


def rewrite(
    form: AnalysisForm,
    answer: exp.Select,
    plans: Sequence[Plan],
    domains: Sequence[KeyDomain],
    catalog: Catalog,
    policy: Policy,
    dialect: Dialect,
) -> Statements:
    truncations = tuple(dict.fromkeys(t for p in plans for t in p.declared_truncations))
    kind_of = domain(form, catalog, policy).kind

    def kind(ref: ColumnRef) -> str:
        key = form.group_by[int(ref.column[len(KEY_PREFIX) :])] if _domain_key(ref, len(form.group_by)) else None
        if isinstance(key, exp.Column) and key.table:  # key j in a domain statement (sqldp.groups.key_expressions)
            ref = ColumnRef(key.table, key.name)
        try:
            return kind_of(ref)
        except (KeyError, CatalogError):  # an alias or column of the plans' own subqueries
            return "other"

    scope = Scope(form, plans, domains, kind, catalog=catalog, truncations=truncations, dialect=dialect)
    read: set[str] = set()

    def apply(tree: exp.Select, rules: Sequence[Rule]) -> str:
        read.update(tables(tree))
        for rule in (*rules, *dialect.rules):
            tree = rule(tree, scope)
        return tree.sql(dialect=dialect.name)

    answer_sql = apply(answer, ANSWER_RULES)  # fold sets scope.folded
    every = [q for plan in plans for q in plan.queries]
    unfolded = [q for i, q in enumerate(every) if i not in scope.folded]
    texts = [apply(q, QUERY_RULES) for q in unfolded]
    distinct = list(dict.fromkeys(texts))  # a statement is deterministic in one snapshot: run it once
    # one-row statements over the same scan run as one (``merge_scans``): each text's statement and columns
    trees = {t: q for t, q in zip(texts, unfolded, strict=True)}
    merged, where_is = merge_scans([trees[t] for t in distinct])
    queries = tuple(apply(q, QUERY_RULES) if len(members) > 1 else distinct[members[0]] for q, members in merged)
    order = tuple(where_is[distinct.index(t)][0] for t in texts)
    columns = tuple(where_is[distinct.index(t)][1] for t in texts)
    ordered = []
    for j, d in enumerate(domains):
        query = d.ordered
        # a joint domain's statement is read once, at its first key (sqldp.groups.read_factors)
        first = not d.joint or d.joint[0] == j
        ordered.append(apply(query, QUERY_RULES) if first and query is not None else None)
    return Statements(
        answer_sql,
        queries,
        tuple(ordered),
        scope.folded,
        answer,
        order,
        columns=columns,
        dialect=dialect.name,
        tables=tuple(sorted(read)),
        truncations=truncations,
    )


def _domain_key(ref: ColumnRef, keys: int) -> bool:
    """Whether ``ref`` is ``__s.__key<j>``, group key j's column in a domain statement with key expressions."""
    if ref.alias != DOMAIN_ALIAS or not ref.column.startswith(KEY_PREFIX):
        return False
    index = ref.column[len(KEY_PREFIX) :]
    return index.isdigit() and int(index) < keys


def one_row(q: exp.Expr) -> bool:
    """An aggregate over a scan with no GROUP BY, HAVING, DISTINCT, window, set-returning function, ORDER BY,
    LIMIT or WITH: exactly one row, whatever the scan holds (SQL's aggregate of no rows is one row), each item
    an expression of aggregates over the scan's rows (``merge_scans`` here, the engine's pieces in
    sqldp.engine.postgres.engine.layout)."""
    if not isinstance(q, exp.Select) or q.args.get("from_") is None or not q.expressions:
        return False
    if any(q.args.get(k) for k in ("group", "having", "distinct", "order", "limit", "offset", "with_", "with")):
        return False
    if any(q.args.get(k) for k in ("qualify", "windows", "locks", "sample", "laterals")):
        return False
    for item in q.expressions:
        own = [n for n in item.walk(prune=lambda n: isinstance(n, exp.Subquery)) if not isinstance(n, exp.Subquery)]
        if any(isinstance(n, (exp.Window, exp.Explode, exp.Unnest)) for n in own):
            return False
        if not any(isinstance(n, exp.AggFunc) for n in own):
            return False
        # a column outside every aggregate (not valid SQL without GROUP BY, but never merged)
        if any(isinstance(n, exp.Column) and not n.find_ancestor(exp.AggFunc, exp.Filter, exp.Subquery) for n in own):
            return False
    return True


def _scan_key(q: exp.Select) -> str:
    """The statement's scan: FROM, joins and WHERE, as text."""
    scan = _without_items(q)
    scan.set("expressions", [exp.Literal.number(1)])
    return scan.sql(dialect="postgres")


def _without_items(q: exp.Select) -> exp.Select:
    """A copy of ``q`` without its items: its FROM, joins and WHERE copied, not its bounds (a bound's items are
    most of its tree, and Q22's outer step is analysed, and its statements merged, at every run)."""
    out = exp.Select()
    for k, v in q.args.items():
        if k == "expressions" or v is None:
            continue
        out.set(
            k,
            [x.copy() if isinstance(x, exp.Expr) else x for x in v]
            if isinstance(v, list)
            else (v.copy() if isinstance(v, exp.Expr) else v),
        )
    return out


def merge_scans(
    queries: Sequence[exp.Select],
) -> tuple[list[tuple[exp.Select, list[int]]], list[tuple[int, tuple[int, int] | None]]]:
    """Statements to run for ``queries`` (distinct texts): one-row aggregates over the same scan — the same
    FROM, joins and WHERE (:func:`one_row`) — as one statement whose items are theirs side by side, the others
    as they are. TPC-H Q1's five bounds over lineitem (each a MAX and a COUNT over the whole table) are one
    scan instead of five.

    Same values: an aggregate is a function of the rows of its scan, and the scans are one; the items of a
    SELECT are evaluated apart. Same errors: an item that fails fails the statement, as it failed its own, and
    the release fails either way (nothing is released when one statement fails). Returns each statement with
    the indices of the queries it computes, and per query (statement index, its columns (start, stop) of the
    one row, or None when the statement is the query itself)."""
    groups: dict[str, list[int]] = {}
    singles: list[int] = []
    for i, q in enumerate(queries):
        if one_row(q):
            groups.setdefault(_scan_key(q), []).append(i)
        else:
            singles.append(i)
    out: list[tuple[exp.Select, list[int]]] = []
    where_is: list[tuple[int, tuple[int, int] | None]] = [(0, None)] * len(queries)
    first = {members[0]: members for members in groups.values()}
    for i, q in enumerate(queries):
        members = first.get(i)
        if members is None and i not in singles:
            continue  # merged into the statement of its group's first query
        if members is None or len(members) == 1:
            where_is[i] = (len(out), None)
            out.append((q, [i]))
            continue
        items: list[exp.Expr] = []
        for m in members:
            start = len(items)
            items += [
                exp.alias_(e.unalias().copy(), f"m{len(items) + k}") for k, e in enumerate(queries[m].expressions)
            ]
            where_is[m] = (len(out), (start, len(items)))
        merged = _without_items(q)
        merged.set("expressions", items)
        out.append((merged, members))
    return out, where_is


def unjoined(query: exp.Select, catalog: Catalog | None) -> exp.Select | None:
    """``query`` (a one-row bound, :func:`one_row`, ``FROM T1 AS a CROSS JOIN T2 AS r … WHERE …``) without the
    uses that only a foreign key joins and that none of its items reads; None when no use can go.

    A use r goes when its table is the referenced table of a foreign key of another use a, the WHERE's only
    conjuncts that read r are a.fk_i = r.ref_i for exactly that key's columns, and a's key columns are NOT NULL.
    PostgreSQL enforces the key (the catalog is ``enforced``: read from the database): every row of a has
    exactly one row of r with those values (the referenced columns are a primary key or UNIQUE, and a NOT
    NULL key column has a partner), so the join has the rows of a, one each, and an aggregate of a's columns
    over it — MAX(ABS(l_discount)), COUNT(*) over lineitem ⋈ part in TPC-H Q14 — is the aggregate over a
    alone: the same number from a scan without the join. Were the key violated, a's rows would be a superset
    of the join's: each bound, a MAX of non-negative non-decreasing terms (sqldp.sensitivity.columns
    ._extreme_query) or a COUNT, could only grow, so it stays an upper bound; the figures are the same
    wherever the key holds. Not for a query that reads r's columns outside that equality, nor one with a
    subquery (it could read r)."""
    joins = query.args.get("joins") or []
    # the cheap tests first: every statement of every run passes here (Q22's outer step is analysed per run)
    if catalog is None or not catalog.enforced or not joins or query.args.get("where") is None:
        return None
    if not one_row(query):
        return None
    source = query.args["from_"].this
    uses: dict[str, str] = {}  # alias → table, in FROM order
    for node in (source, *(j.this for j in joins)):
        if not isinstance(node, exp.Table) or not node.alias or node.args.get("db") or node.alias in uses:
            return None
        uses[node.alias] = node.name.lower()
    if any(j.args.get("on") or j.args.get("using") or (j.kind or "").upper() not in ("CROSS", "") for j in joins):
        return None
    if any(query.find_all(exp.Subquery)) or any(not c.table for c in query.find_all(exp.Column)):
        return None
    read = {c.table for item in query.expressions for c in item.find_all(exp.Column)}
    terms = conjuncts(query.args["where"].this)
    dropped = False
    again = True
    while again:  # a use dropped may leave another joined by a key alone (Q9: nation, then supplier)
        again = False
        for r in list(uses):
            if r in read or len(uses) == 1:
                continue
            mine = [t for t in terms if any(c.table == r for c in t.find_all(exp.Column))]
            pairs = [_key_pair(t, r) for t in mine]
            if not mine or any(p is None for p in pairs) or len({p[0] for p in pairs if p}) != 1:
                continue
            a = pairs[0][0]  # type: ignore[index]
            if a not in uses:
                continue
            try:
                table, referenced = catalog.table(uses[a]), catalog.table(uses[r])
            except CatalogError:
                return None
            want = {(p[1], p[2]) for p in pairs if p}
            keys = {tuple(sorted(k)) for k in (referenced.primary_key, *referenced.unique) if k}
            if not any(
                fk.ref_table.lower() == referenced.name.lower()
                and len(fk.columns) == len(fk.ref_columns)
                and set(zip(fk.columns, fk.ref_columns, strict=True)) == want
                and tuple(sorted(fk.ref_columns)) in keys
                and all(c in table.columns and not table.columns[c].nullable for c in fk.columns)
                for fk in table.foreign_keys
            ):
                continue
            del uses[r]
            terms = [t for t in terms if t not in mine]
            dropped = again = True
    if not dropped:
        return None
    out = exp.select(*(e.copy() for e in query.expressions))
    for i, (alias, table_name) in enumerate(uses.items()):
        node = exp.alias_(exp.to_table(table_name), alias, table=True)
        out = out.from_(node, copy=False) if i == 0 else out.join(node, join_type="cross", copy=False)
    if terms:
        out = out.where(exp.and_(*(t.copy() for t in terms)), copy=False)
    return out


def _key_pair(term: exp.Expr, r: str) -> tuple[str, str, str] | None:
    """For ``a.y = r.x`` (either way round, a ≠ r): (a, y, x); else None."""
    if not isinstance(term, exp.EQ):
        return None
    left, right = term.this, term.expression
    if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
        return None
    if right.table == r and left.table != r:
        left, right = right, left
    if left.table != r or right.table == r:
        return None
    return right.table, right.name, left.name


def _fold(
    form: AnalysisForm, answer: exp.Select, plans: Sequence[Plan], catalog: Catalog | None = None
) -> tuple[exp.Select, dict[int, tuple[int, int]]]:
    """The answer query with the sensitivity queries that scan the same product computed in its scan (the
    issue's "both in one scan where possible"; NR §4.3.4 ran q_m and q_s separately, Table 16).

    Two shapes of plan query fold (the plan says which, ``inline`` and ``grouped_scan``): one-row queries
    ``FROM <uses> WHERE <scan conjuncts>``, whose items join the answer's; and ``MAX`` over a ``GROUP BY`` of
    that scan (max over rows t of Σ_{r ∋ t} D(r), NR §3.3.8.2), which becomes the merged query's inner level:
    the answer's aggregates are computed per group there and re-aggregated outside (SUM and COUNT add up, MIN
    and MAX of the groups' MIN and MAX), so one scan of the join serves both. The scan conjuncts are a subset
    of the answer's WHERE: the merged query keeps them and moves the answer's other conjuncts into FILTER
    clauses of its aggregates. Grouped answers are not folded (the bounds are over the whole scan). Nor is a
    one-row query that needs fewer tables than its scan (:func:`unjoined`) where the answer reads fewer rows
    than that scan: the answer keeps its whole WHERE and the bound runs without the join."""
    if form.group_by:
        return answer, {}
    where_node = answer.args.get("where")
    kept = {_key(c): c for c in conjuncts(where_node.this)} if where_node is not None else {}
    scan: set[str] | None = None
    rows: list[tuple[int, exp.Select]] = []  # one-row queries
    grouped: list[tuple[int, exp.Select]] = []  # MAX over one GROUP BY of the scan
    offset = 0
    for plan in plans:
        inline, per_group = plan.inline, plan.grouped_scan
        mine = {_key(x) for c in plan.scan_conjuncts for x in conjuncts(c.expr)}
        for j, q in enumerate(plan.queries):
            if not (mine <= kept.keys() and (scan is None or mine == scan)):
                continue
            if j < len(inline) and inline[j]:
                if kept.keys() - mine and unjoined(q, catalog) is not None:
                    # the answer reads fewer rows than the bound's scan (a private filter, TPC-H Q14's month of
                    # l_shipdate) and the bound needs fewer tables (:func:`unjoined`): two cheaper scans (the
                    # answer with its whole WHERE, the bound without the join) instead of the join of all rows
                    continue
                scan = mine
                rows.append((offset + j, q))
            elif j < len(per_group) and per_group[j] and _same_groups(q, grouped):
                scan = mine
                grouped.append((offset + j, q))
        offset += len(plan.queries)
    if scan is None:
        return answer, {}
    merged = answer.copy()
    extra = [c for k, c in kept.items() if k not in scan]
    if extra:
        condition = exp.Where(this=exp.and_(*(c.copy() for c in extra)))
        for item in merged.expressions:
            item.set("this", exp.Filter(this=item.this, expression=condition.copy()))
    merged.set("where", exp.Where(this=exp.and_(*(kept[k].copy() for k in kept if k in scan))) if scan else None)
    folded: dict[int, tuple[int, int]] = {}
    width = len(merged.expressions)
    for i, q in rows:
        items = [e.this if isinstance(e, exp.Alias) else e for e in q.expressions]
        merged = merged.select(*(exp.alias_(e.copy(), f"__s{i}_{k}") for k, e in enumerate(items)), copy=False)
        folded[i] = (width, width + len(items))
        width += len(items)
    if grouped:
        two = _per_group(merged, grouped)
        if two is None:  # an aggregate that does not re-aggregate: the grouped queries run on their own
            return (merged, folded) if rows else (answer, {})
        merged = two
        for i, q in grouped:
            folded[i] = (width, width + len(q.expressions))
            width += len(q.expressions)
    return merged, folded


# how an aggregate of the groups' aggregates gives the aggregate of all rows (COUNT of nothing is 0, not NULL)
_REAGGREGATE = {exp.Sum: exp.Sum, exp.Count: exp.Sum, exp.Min: exp.Min, exp.Max: exp.Max}


def _inner(q: exp.Select) -> exp.Select:
    """The grouped level of ``SELECT MAX(s0) … FROM (SELECT … GROUP BY …) AS per_row``."""
    return q.args["from_"].this.this


def _same_groups(q: exp.Select, grouped: list[tuple[int, exp.Select]]) -> bool:
    return not grouped or _inner(q).args["group"].sql() == _inner(grouped[0][1]).args["group"].sql()


def _per_group(merged: exp.Select, grouped: list[tuple[int, exp.Select]]) -> exp.Select | None:
    """``merged`` (one row) computed as an aggregate over the groups of the grouped queries' inner level, with
    their MAX items appended; None when one of its aggregates cannot be re-aggregated (COUNT DISTINCT, …)."""
    inner = exp.select().from_(merged.args["from_"].copy(), copy=False)
    for j in merged.args.get("joins") or ():
        inner.append("joins", j.copy())
    if merged.args.get("where") is not None:
        inner.set("where", merged.args["where"].copy())
    inner.set("group", _inner(grouped[0][1]).args["group"].copy())
    outer_items = []
    names: dict[str, str] = {}
    for item in merged.expressions:
        item = item.copy()
        aggs = [a for a in item.find_all(exp.AggFunc) if not isinstance(a.parent, exp.Filter)]
        aggs += [f for f in item.find_all(exp.Filter)]
        for node in aggs:
            agg = node.this if isinstance(node, exp.Filter) else node
            outer = _REAGGREGATE.get(type(agg))
            if outer is None or isinstance(agg.this, exp.Distinct) or agg.find_ancestor(exp.AggFunc):
                return None
            key = node.sql()
            if key not in names:  # the bounds repeat MAX(ABS(x)) and COUNT(*): computed once per group
                names[key] = f"__g{len(names)}"
                inner.select(exp.alias_(node.copy(), names[key]), copy=False)
            again: exp.Expr = outer(this=exp.column(names[key]))
            if isinstance(agg, exp.Count):
                again = exp.func("COALESCE", again, exp.Literal.number(0))
            item = again if node is item else item  # an item that is the aggregate itself has no parent
            node.replace(again)
        outer_items.append(item)
    for i, q in grouped:
        level = {s.alias: s for s in _inner(q).expressions}  # SUM(…) AS s<k> (and the window's MIN(…) AS dist)
        for name, node in level.items():
            inner.select(exp.alias_(node.this.copy(), f"__p{i}_{name}"), copy=False)

        def rename(n: exp.Expr, i: int = i, level: dict = level) -> exp.Expr:
            return exp.column(f"__p{i}_{n.name}") if isinstance(n, exp.Column) and n.name in level else n

        for k, item in enumerate(q.expressions):  # MAX(<expression of the level's columns>) AS v<k>
            outer_items.append(exp.alias_(item.this.copy().transform(rename), f"__s{i}_{k}"))
    return exp.select(*outer_items).from_(exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier("g"))))


def _key(e: exp.Expr) -> str:
    return e.unnest().sql(dialect="postgres")
