"""SQL text → relational algebra (pipeline step 1 of 6, docs/layout.md).

Exactly one PostgreSQL statement is parsed with sqlglot, checked against the catalog (unknown tables and
columns are refused with their position), qualified (every column gets its table use's alias; sqlglot's
``qualify`` only names things, it does not rewrite semantics) and turned into :mod:`sqldp.algebra` nodes.
sqlglot's *optimizer* rewrites are never used for SQL that runs (they are not always equivalent).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import sqlglot
from sqlglot import exp
from sqlglot.errors import OptimizeError, ParseError, TokenError
from sqlglot.optimizer.qualify import qualify
from sqlglot.tokens import TokenType

from sqldp import algebra as ra
from sqldp import dates, literals
from sqldp.catalog import Catalog
from sqldp.errors import (
    CatalogError,
    ForbiddenError,
    InputError,
    RefusedError,
    SqldpError,
    SqlSyntaxError,
    syntax_error,
)

WHERE = "query"


class _QuietFallback(logging.Filter):
    """sqlglot logs a warning when it parses an unknown statement (VACUUM, CALL, …) as a raw command; sqldp
    refuses such statements with its own one-line error, and a second line on stderr would break that."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_QuietFallback())

# Bounds on the work one statement may cost before any analysis (the parser, the qualifier and the analyses
# all recurse over the tree, and their cost grows with its size): a statement beyond them is refused with a
# one-line InputError instead of a RecursionError or a minute of parsing. TPC-H's queries stay far below:
# at most about 700 tokens, 8 nested parentheses and a tree 20 levels deep.
MAX_CHARS = 100_000
MAX_TOKENS = 10_000
MAX_PARENS = 32  # sqlglot's recursive-descent parser needs about 20 Python frames per parenthesis
MAX_DEPTH = 100  # nodes from the root to the deepest leaf of the parsed tree


@dataclass(frozen=True)
class ParsedQuery:
    sql: str
    tree: exp.Query  # qualified
    algebra: ra.Node
    statement: exp.Expr | None = None  # as parsed, before qualification: what the public path runs


def position(sql: str, node: exp.Expr | None) -> str:
    """``query:LINE:COL`` of a node's first character, or ``query`` when sqlglot kept no position."""
    # sqlglot keeps positions on identifiers and literals; the node starts at the first of them in the text
    # (not the first in tree order: `t.d` holds `d` before `t`)
    starts = [c.meta["start"] for c in (node.walk() if node is not None else ()) if c.meta.get("start") is not None]
    if not starts:
        return WHERE
    start = min(starts)
    line = sql.count("\n", 0, start) + 1
    col = start - (sql.rfind("\n", 0, start) + 1) + 1
    return f"{WHERE}:{line}:{col}"


def locate(sql: str, statement: exp.Expr | None, err: SqldpError) -> str | None:
    """Where ``err`` is in the text: its own ``where`` if it has one, else, for an error about a key of the
    analysis form (``err.subject``: qualified, rewritten, no positions kept), ``query:LINE:COL`` of the GROUP BY
    item in the statement as written that stands for it — the first item that reads the key's columns, else the
    first GROUP BY item, ``query`` when there is none; None without either."""
    subject = err.subject
    if err.where is not None or subject is None:
        return err.where
    if statement is None or not isinstance(subject, exp.Expr):
        return WHERE
    names = {c.name for c in subject.find_all(exp.Column)}
    items = [item for group in statement.find_all(exp.Group) for item in group.expressions]
    for item in items:
        if names and names <= {c.name for c in item.find_all(exp.Column)}:
            return position(sql, item)
    return position(sql, items[0]) if items else WHERE


def too_deep() -> InputError:
    return InputError(f"the statement is nested too deeply (at most {MAX_DEPTH} levels)", where=WHERE)


def _check_size(sql: str) -> None:
    """Size, token count and parenthesis nesting, from the tokenizer (which does not recurse)."""
    if len(sql) > MAX_CHARS:
        raise InputError(f"the statement is {len(sql)} characters long; at most {MAX_CHARS} are accepted", where=WHERE)
    try:
        tokens = sqlglot.Dialect.get_or_raise("postgres").tokenize(sql)
    except TokenError as exc:
        raise SqlSyntaxError(f"syntax error: {exc}", where=WHERE) from None
    if len(tokens) > MAX_TOKENS:
        raise InputError(f"the statement has {len(tokens)} tokens; at most {MAX_TOKENS} are accepted", where=WHERE)
    depth = 0
    for token in tokens:
        if token.token_type == TokenType.L_PAREN:
            depth += 1
            if depth > MAX_PARENS:
                raise InputError(
                    f"parentheses are nested more than {MAX_PARENS} deep", where=f"{WHERE}:{token.line}:{token.col}"
                )
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1


def token_key(sql: str) -> tuple[object, ...] | None:
    """The token stream the parser reads — each token's type, text and comments — as a cache key: two texts
    with the same stream parse to the same tree, hence the same analysis and the same generated statements;
    they differ only in whitespace and line breaks between tokens. None for a text the analysis refuses for
    its size (tokenizing it first is what the limit prevents) or one that does not tokenize."""
    if len(sql) > MAX_CHARS:
        return None
    try:
        tokens = sqlglot.Dialect.get_or_raise("postgres").tokenize(sql)
    except TokenError:
        return None
    return tuple((t.token_type, t.text, tuple(t.comments)) for t in tokens)


def _check_depth(tree: exp.Expr) -> None:
    """The tree's depth, iteratively: long AND chains and sums parse into trees as deep as they are long."""
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise too_deep()
        stack.extend((child, depth + 1) for child in node.iter_expressions())


def parse_statement(sql: str) -> exp.Expr:
    """Parse exactly one statement; syntax errors carry ``query:line:col``."""
    if not sql.strip():
        raise SqlSyntaxError("empty query", where=WHERE)
    _check_size(sql)
    try:
        statements = [s for s in sqlglot.parse(sql, read="postgres") if s is not None]
    except ParseError as exc:
        raise syntax_error(exc, "syntax error", WHERE) from None
    except TokenError as exc:
        raise SqlSyntaxError(f"syntax error: {exc}", where=WHERE) from None
    except RecursionError:
        raise too_deep() from None
    if not statements:
        raise SqlSyntaxError("empty query", where=WHERE)
    if len(statements) > 1:
        raise SqlSyntaxError(
            f"expected exactly one statement, got {len(statements)}",
            where=position(sql, statements[1]) if statements[1].meta else WHERE,
        )
    _check_depth(statements[0])
    return statements[0]


def _check_tables(sql: str, tree: exp.Expr, catalog: Catalog) -> None:
    cte_names = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if name.startswith("pg_") and not table.args.get("db"):
            # PostgreSQL searches pg_catalog before the public schema: an unqualified pg_class, pg_stats, …
            # is the system catalog (statistics of private tables) even if a policy table has that name
            raise ForbiddenError(
                f"{name} is a PostgreSQL system catalog, not a policy table", where=position(sql, table)
            )
        if not name or name in cte_names:
            continue
        if table.args.get("db") and table.args["db"].name.lower() not in ("public",):
            raise CatalogError(
                f"table {table.sql(dialect='postgres')!r} is not in the catalog", where=position(sql, table)
            )
        if name not in catalog.tables:
            raise CatalogError(f"table {table.name!r} does not exist", where=position(sql, table))


_POS = re.compile(r"Line: (\d+), Col: (\d+)")


def _token_start(sql: str, tree: exp.Expr, line: int, col: int) -> str:
    """``query:LINE:COL`` of the first character of the token sqlglot's qualifier reports by its last (its
    ``Line: …, Col: …`` is the token's end), as :func:`position` gives every other error and as PostgreSQL
    points at an unknown column; sqlglot's own figures when no node of ``tree`` ends there."""
    for node in tree.walk():
        if node.meta.get("line") == line and node.meta.get("col") == col and node.meta.get("start") is not None:
            return position(sql, node)
    return f"{WHERE}:{line}:{col}"


def _qualify(sql: str, tree: exp.Expr, catalog: Catalog) -> exp.Expr:
    try:
        return qualify(
            tree.copy(),
            schema=catalog.sqlglot_schema(),
            dialect="postgres",
            identify=False,
            validate_qualify_columns=True,
            quote_identifiers=False,
        )
    except AssertionError:  # sqlglot's qualifier asserts on some shapes (ORDER BY 1 beside scalar subqueries)
        raise RefusedError("sqldp cannot resolve the names in this statement", where=WHERE) from None
    except OptimizeError as exc:
        message = str(exc)
        m = _POS.search(message)
        where = _token_start(sql, tree, int(m.group(1)), int(m.group(2))) if m else WHERE
        text = _POS.sub("", message).strip().rstrip(".")
        unresolved = re.match(r"Column '(.+)' could not be resolved", text)
        if unresolved:
            name = unresolved.group(1)
            owners = [t.name for t in catalog.tables.values() if name.split(".")[-1].lower() in t.columns]
            problem = "is ambiguous; qualify it with a table alias" if len(owners) > 1 else "does not exist"
            raise CatalogError(f"column {name!r} {problem}", where=where, sqlstate="42703") from None
        raise CatalogError(text[:1].lower() + text[1:], where=where, sqlstate="42703") from None


def parse(sql: str, catalog: Catalog) -> ParsedQuery:
    """Parse, check and qualify one query and build its algebra."""
    tree = drop_else_null(rewrite_filters(parse_statement(sql)))
    if not isinstance(tree, exp.Query):
        kind = tree.key.upper()
        raise RefusedError(f"only queries (SELECT) can be answered, not {kind}", where=position(sql, tree))
    try:
        _check_tables(sql, tree, catalog)
        # untyped literals get the type PostgreSQL resolves them to (sqldp.literals), and constant date ±
        # interval becomes the date PostgreSQL computes (sqldp.dates), before any analysis
        qualified = dates.fold_date_arithmetic(literals.resolve(_qualify(sql, tree, catalog), catalog))
        assert isinstance(qualified, exp.Query)
        return ParsedQuery(sql, qualified, Builder(sql).query(qualified, {}), tree)
    except RecursionError:
        raise too_deep() from None


# Aggregates that skip NULL inputs (PostgreSQL's strict aggregates): for these ``agg(x) FILTER (WHERE c)`` is
# ``agg(CASE WHEN c THEN x END)``, the row the filter drops entering as NULL, which the aggregate skips.
_STRICT_AGGREGATES = (
    exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max, exp.Stddev, exp.StddevPop, exp.StddevSamp, exp.Variance,
    exp.VariancePop,
)  # fmt: skip


def rewrite_filters(tree: exp.Expr) -> exp.Expr:
    """``agg(x) FILTER (WHERE c)`` as ``agg(CASE WHEN c THEN x END)`` and ``COUNT(*) FILTER (WHERE c)`` as
    ``COUNT(CASE WHEN c THEN 1 END)`` — the CASE-in-aggregate form TPC-H's Q8, Q12 and Q14 use (NR §4.3.6.1
    (vii)), which sqldp analyses — for the aggregates that skip NULLs, where the two are the same function of
    the rows: FILTER keeps the rows where c is true, and the CASE is NULL exactly on the others (c false or
    NULL). ``COUNT(DISTINCT x) FILTER`` keeps its DISTINCT around the CASE (NULL is no distinct value). The
    rewritten tree is what every later step checks, analyses and runs (the public path too); a FILTER on any
    other aggregate, or on a window function, stays and the allow-list refuses it."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if not isinstance(node, exp.Filter) or not isinstance(node.this, _STRICT_AGGREGATES):
            return node
        where = node.expression
        condition = where.this if isinstance(where, exp.Where) else None
        agg = node.this
        arg = agg.this
        if condition is None or agg.expressions or isinstance(node.parent, exp.Window):
            return node
        if isinstance(arg, exp.Star) and isinstance(agg, exp.Count):
            inner: exp.Expr = exp.Literal.number(1)
        elif isinstance(arg, exp.Distinct) and len(arg.expressions) == 1:
            inner = arg.expressions[0]
        elif arg is not None and not isinstance(arg, (exp.Star, exp.Distinct)):
            inner = arg
        else:
            return node
        case = exp.Case(ifs=[exp.If(this=condition.copy(), true=inner.copy())])
        out = agg.copy()
        out.set("this", exp.Distinct(expressions=[case]) if isinstance(arg, exp.Distinct) else case)
        return out

    return tree.transform(rewrite)


def drop_else_null(tree: exp.Expr) -> exp.Expr:
    """``CASE … ELSE NULL END`` as ``CASE … END``: PostgreSQL gives the two the same value on every row (a CASE
    without ELSE is NULL when no WHEN holds) and the same type (an untyped NULL takes no part in resolving a
    CASE's type). TPC-DS writes its filtered sums so (``SUM(CASE WHEN d_day_name = 'Sunday' THEN
    ss_sales_price ELSE NULL END)``, q43); the analyses know the form without ELSE. Like
    :func:`rewrite_filters`, the rewritten tree is what every later step checks, analyses and runs."""

    def rewrite(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Case) and isinstance(node.args.get("default"), exp.Null):
            out = node.copy()
            out.set("default", None)
            return out
        return node

    return tree.transform(rewrite)


class Builder:
    """Builds algebra nodes from a qualified sqlglot tree."""

    def __init__(self, sql: str) -> None:
        self.sql = sql

    def query(self, q: exp.Expr, ctes: dict[str, exp.Expr]) -> ra.Node:
        with_ = q.args.get("with_") or q.args.get("with")
        if with_ is not None:
            ctes = dict(ctes)
            if with_.args.get("recursive"):
                raise RefusedError("WITH RECURSIVE is not supported", where=position(self.sql, with_))
            for cte in with_.expressions:
                ctes[cte.alias_or_name.lower()] = cte.this
        if isinstance(q, exp.SetOperation):
            op = {exp.Union: "UNION", exp.Intersect: "INTERSECT", exp.Except: "EXCEPT"}[type(q)]
            node: ra.Node = ra.SetOp(
                op, bool(q.args.get("distinct")), self.query(q.this, ctes), self.query(q.expression, ctes)
            )
            return self._sort(q, node)
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes)
        if not isinstance(q, exp.Select):
            raise RefusedError(f"unsupported query form {q.key.upper()}", where=position(self.sql, q))
        return self._select(q, ctes)

    def _from_item(self, item: exp.Expr, ctes: dict[str, exp.Expr]) -> ra.Node:
        if isinstance(item, exp.Table):
            name = item.name.lower()
            alias = item.alias_or_name.lower()
            if name in ctes and not item.args.get("db"):
                return ra.Rename(alias, self.query(ctes[name], ctes))
            if isinstance(item.this, exp.Func) or not name:
                raise RefusedError("table functions are not supported", where=position(self.sql, item))
            return ra.Relation(name, alias)
        if isinstance(item, exp.Subquery):
            if item.args.get("lateral"):
                raise RefusedError("LATERAL subqueries are not supported", where=position(self.sql, item))
            return ra.Rename(item.alias_or_name.lower(), self.query(item.this, ctes))
        raise RefusedError(f"unsupported FROM item {item.sql(dialect='postgres')!r}", where=position(self.sql, item))

    def _select(self, q: exp.Select, ctes: dict[str, exp.Expr]) -> ra.Node:
        from_ = q.args.get("from_") or q.args.get("from")
        if from_ is None:
            raise RefusedError("a query without FROM reads no table; nothing to protect or analyse", where=WHERE)
        node = self._from_item(from_.this, ctes)
        for join in q.args.get("joins") or []:
            right = self._from_item(join.this, ctes)
            side = (join.args.get("side") or "").upper()
            kind = (join.args.get("kind") or "").upper()
            on = join.args.get("on")
            if join.args.get("using"):
                raise RefusedError("JOIN … USING is not supported; write JOIN … ON", where=position(self.sql, join))
            if side or kind in ("SEMI", "ANTI", "OUTER"):
                node = ra.OuterJoin(" ".join(p for p in (side, kind) if p) or "OUTER", on, node, right)
                continue
            left_items = node.children if isinstance(node, ra.Product) else (node,)
            node = ra.Product((*left_items, right))
            if on is not None and not (isinstance(on, exp.Boolean) and on.this is True):
                node = ra.Select(on, node)
        where = q.args.get("where")
        if where is not None:
            node = ra.Select(where.this, node)
        items = tuple((_output_name(e), e.unalias() if isinstance(e, exp.Alias) else e) for e in q.expressions)
        group = q.args.get("group")
        having = q.args.get("having")
        has_agg = any(_has_aggregate(e) for _, e in items)
        if group is not None or has_agg or having is not None:
            groups = tuple(group.expressions) if group is not None else ()
            node = ra.Aggregate(groups, items, having.this if having is not None else None, node)
        else:
            node = ra.Project(items, node)
        if q.args.get("distinct"):
            node = ra.Distinct(node)
        return self._sort(q, node)

    def _sort(self, q: exp.Expr, node: ra.Node) -> ra.Node:
        order = q.args.get("order")
        keys = tuple((self._ordinal(q, o.this), bool(o.args.get("desc"))) for o in order.expressions) if order else ()
        limit = _int_arg(self.sql, q.args.get("limit"))
        offset = _int_arg(self.sql, q.args.get("offset"))
        if keys or limit is not None or offset is not None:
            return ra.Sort(keys, limit, offset, node)
        return node

    @staticmethod
    def _ordinal(q: exp.Expr, key: exp.Expr) -> exp.Expr:
        """An ORDER BY key as the position of the output it names. sqlglot's qualifier writes ``ORDER BY 2`` and
        ``ORDER BY COUNT(*)`` (an unaliased output) as a reference to the name it gives that output,
        ``_col_1``, which is no output name the analyst sees (:func:`_output_name`): the position is what
        PostgreSQL means."""
        if isinstance(q, exp.Select) and isinstance(key, exp.Column) and not key.table:
            for i, item in enumerate(q.expressions):
                if isinstance(item, exp.Alias) and item.alias == key.name and re.fullmatch(r"_col_\d+", key.name):
                    return exp.Literal.number(i + 1)
        return key


def _int_arg(sql: str, node: exp.Expr | None) -> int | None:
    if node is None:
        return None
    value = node.args.get("expression") or node.this
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    raise RefusedError("LIMIT/OFFSET must be a non-negative integer constant", where=position(sql, node))


def _has_aggregate(e: exp.Expr) -> bool:
    """An aggregate function at this query level (not inside a subquery or window)."""
    for node in e.walk(prune=lambda n: isinstance(n, (exp.Subquery, exp.Query, exp.Window))):
        if isinstance(node, exp.AggFunc) and not isinstance(node.parent, exp.Window):
            return True
    return False


def _output_name(item: exp.Expr) -> str:
    """The column name PostgreSQL gives a SELECT item: its alias, else the column or function name (through
    casts), else ``?column?``. sqlglot's qualifier names unaliased items ``_col_<i>``; clients (and the proxy's
    result sets) expect Postgres' names."""
    name = item.alias_or_name
    if not re.fullmatch(r"_col_\d+", name or ""):
        return name
    e = item.unalias() if isinstance(item, exp.Alias) else item
    while isinstance(e, (exp.Cast, exp.Paren)):
        e = e.this
    if isinstance(e, exp.Column):
        return e.name
    if isinstance(e, exp.Anonymous):
        return str(e.this).lower()
    if isinstance(e, exp.Func):
        return e.sql_name().lower()
    return "?column?"


def inside(node: exp.Expr, ancestor: exp.Expr) -> bool:
    """Whether ``ancestor`` is a proper ancestor of ``node`` in its tree (by identity, not equality)."""
    parent = node.parent
    while parent is not None:
        if parent is ancestor:
            return True
        parent = parent.parent
    return False


def conjuncts(e: exp.Expr | None) -> list[exp.Expr]:
    """The AND-ed terms of a condition (none for no condition), each with its parentheses removed (unlike
    :func:`sqldp.normalize.split_and`, which keeps a term as written, for the positions of its error messages)."""
    if e is None:
        return []
    e = e.unnest()
    return [*conjuncts(e.this), *conjuncts(e.expression)] if isinstance(e, exp.And) else [e]
