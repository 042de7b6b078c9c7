"""Relational algebra → analysis form (pipeline step 2 of 6, docs/layout.md; the shapes of NR §3.3.7.3 and §3.3.8.2).

The analyses handle ``aggregate(expr) over σθ(U1 × … × Un)``. This module flattens selections and
products, inlines FROM-subqueries and WITH references that are plain select-project-join blocks (each
reference becomes its own table uses, so a CTE used twice is a self-join), splits θ into conjuncts and marks
each public or private, writes each SQL aggregate over the primitive ones by its entry in
:mod:`sqldp.aggregates` (AVG as SUM/COUNT) and keeps ORDER BY/LIMIT for after the noise. Everything else is
refused with the reason and the position: sqldp never answers what it cannot analyse.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from sqlglot import exp

from sqldp import aggregates, allowlist, per_key, postprocess, subqueries
from sqldp import algebra as ra
from sqldp import groups as groups_mod
from sqldp.catalog import Catalog
from sqldp.errors import ForbiddenError, RefusedError, SqldpError
from sqldp.form import (
    AGG_PREFIX,
    KEY_PREFIX,
    AggKind,
    Aggregate,
    AnalysisForm,
    ColumnRef,
    Conjunct,
    OrderKey,
    Output,
    SemiJoin,
    TableUse,
    placeholder,
)
from sqldp.frontend import ParsedQuery, position
from sqldp.policy import EPOCH, Policy
from sqldp.sensitivity import intervals
from sqldp.subqueries import Exports, ctes_of, expression_subqueries


@dataclass(frozen=True)
class PublicRelease:
    """A query that reads only public tables: the policy allows its exact answer."""

    sql: str
    tables: tuple[str, ...]
    # the statement that runs: regenerated from the checked tree, so PostgreSQL runs exactly what the
    # allow-list and the relation check saw, never text the two parsers might read differently
    checked_sql: str = ""


def relations_read(tree: exp.Expr, catalog: Catalog, ctes: dict[str, exp.Expr] | None = None) -> tuple[str, ...]:
    """Every catalog table the statement names anywhere: FROM and JOIN items, subqueries in any clause, CTEs
    (used or not, recursive or not), set operations. Found on the whole sqlglot tree, not the algebra, which
    keeps only what the analyses model. A name that is both a CTE and a catalog table counts as the table:
    resolving scopes wrongly could only hide a read, counting it too can only refuse more. With ``ctes``
    (name → body, for a part of a statement), a reference to a CTE counts the tables its body reads."""
    names: dict[str, list[str]] = {}  # lower case → catalog names (a table created quoted keeps its case)
    for key in catalog.tables:
        names.setdefault(key.lower(), []).append(key)
    found: dict[str, None] = {}
    seen: set[str] = set()
    pending = [tree]
    while pending:
        for table in pending.pop().find_all(exp.Table):
            name = table.name.lower()
            found.update(dict.fromkeys(names.get(name, ())))
            if ctes is not None and name in ctes and name not in seen:
                seen.add(name)
                pending.append(ctes[name])
    return tuple(found)


@dataclass
class _SPJ:
    uses: list[TableUse] = field(default_factory=list)
    conditions: list[exp.Expr] = field(default_factory=list)
    exports: Exports = field(default_factory=dict)
    semijoins: list[SemiJoin] = field(default_factory=list)


def columns_of(e: exp.Expr) -> frozenset[ColumnRef]:
    return frozenset(ColumnRef(c.table, c.name) for c in e.find_all(exp.Column) if c.table)


def split_and(e: exp.Expr) -> list[exp.Expr]:
    if isinstance(e, exp.And):
        return split_and(e.this) + split_and(e.expression)
    if isinstance(e, exp.Paren) and isinstance(e.this, exp.And):
        return split_and(e.this)
    return [e]


def _branches(e: exp.Expr) -> list[exp.Expr]:
    """The disjuncts of an OR, through parentheses."""
    if isinstance(e, exp.Paren):
        return _branches(e.this)
    if isinstance(e, exp.Or):
        return _branches(e.this) + _branches(e.expression)
    return [e]


def factor_or(e: exp.Expr) -> list[exp.Expr]:
    """The conjuncts of ``e`` with the terms every branch of an OR shares moved out of it:
    (A ∧ B) ∨ (A ∧ C) becomes A, B ∨ C. A WHERE keeps a row when its condition is TRUE, and the left side is
    TRUE exactly when A is TRUE and B or C is (three-valued logic), so the rows kept are the same; the
    continuous approximation of a private filter (AND = min, OR = max, NR §3.3.8.4) is the same function too,
    max(min(a, b), min(a, c)) = min(a, max(b, c)). What changes is what the analyses see: TPC-H Q19 repeats
    its join p_partkey = l_partkey in each branch, and only as a conjunct of its own does it make the product
    a join (a lineitem row in one product row) instead of lineitem × part. Shared terms are recognised by
    their SQL text."""
    parts = split_and(e)
    if len(parts) != 1 or not isinstance(e, (exp.Or, exp.Paren)) or len(_branches(e)) < 2:
        return parts
    branches = [split_and(b) for b in _branches(e)]
    texts = [[p.sql(dialect="postgres") for p in b] for b in branches]
    shared = [p for p, t in zip(branches[0], texts[0], strict=True) if all(t in other for other in texts[1:])]
    if not shared:
        return parts
    common = {p.sql(dialect="postgres") for p in shared}
    rest = [[p for p, t in zip(b, ts, strict=True) if t not in common] for b, ts in zip(branches, texts, strict=True)]
    if any(not r for r in rest):  # a branch that is only shared terms: the OR holds whenever they do
        return [p.copy() for p in shared]
    ors = [exp.and_(*(p.copy() for p in r)) if len(r) > 1 else r[0].copy() for r in rest]
    disjunction = ors[0]
    for o in ors[1:]:
        disjunction = exp.Or(this=disjunction, expression=o)
    return [*(p.copy() for p in shared), exp.Paren(this=disjunction)]


class Normalizer:
    def __init__(
        self, parsed: ParsedQuery, catalog: Catalog, policy: Policy, keep: frozenset[int] = frozenset()
    ) -> None:
        self.parsed = parsed
        self.sql = parsed.sql
        self.catalog = catalog
        self.policy = policy
        self.aliases: set[str] = set()
        self.notes: list[str] = []
        self.tables: dict[str, str] = {}  # fresh alias → catalog table
        self.ctes = set(ctes_of(parsed.tree))
        # the subqueries (EXISTS, IN) made semi-joins: not refused by the check of the whole statement
        self.handled: list[exp.Expr] = []
        # the uses of the right tables of LEFT JOINs left out (sqldp.subqueries.left_join): alias → why a column
        # of theirs cannot be read
        self.eliminated: dict[str, tuple[str, int]] = {}
        self.keep = keep  # the LEFT JOINs (by id) not to leave out: their right table is read
        self.null_extended: list[subqueries.NullExtended] = []  # LEFT JOINs analysed as inner joins, conditionally

    # -- errors ---------------------------------------------------------------------------------

    def refuse(self, reason: str, node: exp.Expr | None = None) -> RefusedError:
        return RefusedError(reason, where=position(self.sql, node) if node is not None else "query")

    # -- select-project-join blocks -------------------------------------------------------------

    def _fresh(self, alias: str) -> str:
        name, n = alias, 1
        while name in self.aliases:
            n += 1
            name = f"{alias}_{n}"
        self.aliases.add(name)
        return name

    def _substitute(self, e: exp.Expr, exports: Exports) -> exp.Expr:
        def swap(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and node.table:
                scope = exports.get(node.table)
                if scope is None or node.name not in scope:
                    raise self.refuse(f"cannot resolve column {node.sql(dialect='postgres')}", node)
                resolved = scope[node.name]
                if isinstance(resolved, exp.Column) and resolved.table in self.eliminated:
                    why, join = self.eliminated[resolved.table]
                    raise subqueries.ReadsEliminated(why, position(self.sql, node), join)
                return resolved.copy()
            if isinstance(node, (exp.Subquery, exp.Exists)) or (isinstance(node, exp.In) and node.args.get("query")):
                raise self.refuse(
                    "subqueries inside expressions (EXISTS, IN (SELECT …), scalar subqueries) are not supported",
                    node,
                )
            return node

        return e.copy().transform(swap)

    def spj(self, node: ra.Node, above: tuple[exp.Expr, ...] = ()) -> _SPJ:
        """The block of ``node``; ``above`` are the WHERE conjuncts (as written) that filter its rows, for the
        LEFT JOINs inside (sqldp.subqueries.left_join)."""
        if isinstance(node, ra.Relation):
            alias = self._fresh(node.alias)
            self.tables[alias] = node.table
            table = self.catalog.table(node.table)
            out = _SPJ([TableUse(alias, node.table)])
            out.exports[node.alias] = {c: exp.column(c, table=alias) for c in table.columns}
            return out
        if isinstance(node, ra.Select):
            inner = self.spj(node.child, (*above, *split_and(node.condition)))
            for cond in split_and(node.condition):
                # [NOT] EXISTS / [NOT] IN (SELECT …) conjuncts become semi-joins, comparisons with a correlated
                # scalar subquery joins with a grouped derived table (sqldp.subqueries)
                semi = subqueries.semijoin(self, cond, inner.exports) or subqueries.scalar_join(
                    self, cond, inner.exports
                )
                if semi is None:
                    inner.conditions.append(self._substitute(cond, inner.exports))
                else:
                    inner.semijoins.append(semi)
                    self.handled.append(cond)
            return inner
        if isinstance(node, ra.Product):
            out = _SPJ()
            for child in node.children:
                part = self.spj(child, above)
                out.uses += part.uses
                out.conditions += part.conditions
                out.semijoins += part.semijoins
                for alias, cols in part.exports.items():
                    if alias in out.exports:
                        raise self.refuse(f"the alias {alias!r} is used twice in one FROM clause")
                    out.exports[alias] = cols
            return out
        if isinstance(node, ra.Rename):
            child = node.child
            if not isinstance(child, ra.Project):
                raise self.refuse(_why_not_inlinable(child, node.alias))
            inner = self.spj(child.child)
            cols = {name: self._substitute(e, inner.exports) for name, e in child.items}
            self.notes.append(f"inlined derived table {node.alias}")
            return _SPJ(inner.uses, inner.conditions, {node.alias: cols}, inner.semijoins)
        if isinstance(node, ra.OuterJoin):  # the inner join, or the left side alone (NR §4.3.6.1 (ix))
            rewritten, eliminated, conditional = subqueries.left_join(self, node, above, id(node) in self.keep)
            out = self.spj(rewritten, above)
            if conditional:  # the right table's use: the form's aggregates must skip its NULL-extended rows
                assert isinstance(node.right, ra.Relation)
                (alias,) = {c.table for e in out.exports[node.right.alias].values() for c in e.find_all(exp.Column)}
                where = position(self.sql, node.condition)
                self.null_extended.append(subqueries.NullExtended(alias, node.kind, where))
            if eliminated is not None:
                if eliminated.alias in out.exports:
                    raise self.refuse(f"the alias {eliminated.alias!r} is used twice in one FROM clause")
                gone = self._fresh(eliminated.alias)
                # read after all: analysed again with the join kept (normalize)
                self.eliminated[gone] = (f"a column of {eliminated.table} is read outside its LEFT JOIN's ON", id(node))
                table = self.catalog.table(eliminated.table)
                out.exports[eliminated.alias] = {c: exp.column(c, table=gone) for c in table.columns}
            return out
        raise self.refuse(_why_not_inlinable(node, None))

    # -- the whole query ------------------------------------------------------------------------

    def run(self) -> AnalysisForm | PublicRelease:
        statement = self.parsed.statement if self.parsed.statement is not None else self.parsed.tree
        tables = relations_read(statement, self.catalog)
        private = [t for t in tables if not self.policy.table(t).public]
        # no function, cast or construct off the allow-list runs, on either path (grouping sets on the public one)
        allowlist.check(self.sql, statement, public=not private)
        root = self.parsed.algebra
        sort = root if isinstance(root, ra.Sort) else None
        body = sort.child if sort is not None else root
        if not private:
            return PublicRelease(self.sql, tables, statement.sql(dialect="postgres"))
        # SELECT DISTINCT e1, … is GROUP BY e1, … with no aggregate: which rows it has is decided by DP partition
        # selection over the groups present in the data (sqldp.groups.partition_selection)
        distinct_rows = isinstance(body, ra.Distinct) and isinstance(body.child, ra.Project)
        if isinstance(body, ra.Distinct) and isinstance(body.child, ra.Project):
            project = body.child
            body = ra.Aggregate(tuple(e for _, e in project.items), project.items, None, project.child)
            self.notes.append("SELECT DISTINCT → GROUP BY its columns, groups chosen by DP partition selection")
        if not isinstance(body, ra.Aggregate):
            released = [r.table for r in ra.relations(root) if r.table in private]
            if not released:  # the private tables are read only inside expression subqueries
                self._subqueries(statement, private)
            listed = [r.table for r in _unaggregated(root) if r.table in private]
            if released and not listed:
                # every private row is read under a GROUP BY / aggregate of a derived table: what leaves is
                # an outer query over aggregated results, not rows; the cause to name is that shape
                raise ForbiddenError(
                    f"an outer query reads the aggregated results of a derived table over private table "
                    f"{released[0]!r}: post-processing aggregates in an outer query is not supported yet; "
                    "ask the aggregate query itself (ORDER BY and LIMIT may follow its GROUP BY)"
                )
            raise ForbiddenError(
                f"the query releases rows of private table {(listed or released or private)[0]!r}; only "
                f"aggregates ({aggregates.supported()}) over private tables can be answered"
            )
        # SUM/COUNT/AVG over a derived table grouped by one key: the aggregate of its rows it equals (sqldp.per_key)
        body = per_key.flatten(self, body) or body
        histogram = per_key.histogram(self, body, sort)
        if histogram is not None:  # an aggregate over a derived table that aggregates (TPC-H Q13)
            self._subqueries(statement, private)
            return histogram
        block = self.spj(body.child)
        self._subqueries(statement, private)
        conjuncts = []
        for cond in block.conditions:
            for part in (q for p in split_and(cond) for q in factor_or(p)):
                cols = columns_of(part)
                reads_private = any(self._sensitive(block, c) for c in cols)
                conjuncts.append(Conjunct(part, cols, reads_private))
        groups = tuple(self._guard_dates(self._substitute(g, block.exports), block) for g in body.groups)
        for g in groups:
            if isinstance(g, exp.Literal):
                raise self.refuse("GROUP BY by position is not supported; name the expression", g)
        measured: list[Aggregate] = []
        key_exprs: list[exp.Expr] = []  # expressions of the group keys alone (outputs, HAVING conjuncts)
        outputs = tuple(self._output(name, e, block, groups, measured, key_exprs) for name, e in body.items)
        for (name, e), o in zip(body.items, outputs, strict=True):
            if not o.is_key:  # computed on the noisy values after the run: refused now, before any charge
                self._check_post_processed(o.expr, e, f"output {name!r} may combine aggregates and numbers")
                self.notes.extend(f"output {name!r}: {why}" for why in postprocess.unbarred(o.expr))
        having = None
        key_having: list[int] = []
        if body.having is not None:
            # a HAVING conjunct that reads group keys only (HAVING age < 30, HAVING married) keeps or drops a
            # group by its key alone: a filter on the group domain, computed by PostgreSQL over the domain's
            # values (sqldp.groups), post-processing of a domain that is public or declared
            rest = []
            for part in split_and(body.having):
                derived = self._key_expression(self._guard_dates(self._substitute(part, block.exports), block), groups)
                if derived is None:
                    rest.append(part)
                    continue
                key_having.append(len(key_exprs))
                key_exprs.append(derived)
            if key_having:
                self.notes.append("HAVING over the group keys alone filters the group domain (post-processing)")
            if rest:
                # HAVING filters the *noisy* groups: its aggregates are measured (and paid for) like the SELECT
                # list's, and the condition runs on the released values — post-processing, so no extra cost
                condition = rest[0] if len(rest) == 1 else exp.and_(*rest)
                having = self._output("HAVING", condition, block, groups, measured).expr
                self._check_post_processed(having, condition, "HAVING may compare aggregates and numbers")
                self.notes.append("HAVING evaluated on the noisy aggregates (post-processing)")
        order_by, limit = (
            self._order(sort, outputs, body, (block, groups, measured, key_exprs)) if sort is not None else ((), None)
        )
        if groups and not measured and not distinct_rows:
            # GROUP BY with no aggregate lists the groups present in the data, as SELECT DISTINCT does (also
            # over a declared or public key: which occur with the private rows is private)
            distinct_rows = True
            self.notes.append("GROUP BY without aggregates → groups chosen by DP partition selection")
        form = AnalysisForm(
            uses=tuple(block.uses),
            conjuncts=tuple(conjuncts),
            aggregates=tuple(measured),
            outputs=outputs,
            group_by=groups,
            order_by=order_by,
            limit=limit,
            notes=tuple(self.notes),
            having=having,
            distinct_rows=distinct_rows,
            semijoins=tuple(block.semijoins),
            key_exprs=tuple(key_exprs),
            key_having=tuple(key_having),
        )
        subqueries.skips_unmatched(form, self.null_extended)
        return form

    def _subqueries(self, statement: exp.Expr, private: list[str]) -> None:
        """Refuse subqueries in expressions other than the semi-joins made of WHERE conjuncts (``handled``): the
        analyses model no other (NR §3.3.7.2 has no operator for them), and one over a private table run as
        written would release its exact answer. The semi-joins were found on the qualified tree, the check
        runs on the statement as parsed: the qualifier keeps the subqueries and their order, so a handled one
        is skipped by its index, and none is when the two trees do not list as many (fail closed)."""
        ctes = ctes_of(statement)
        found = expression_subqueries(statement)
        if self.handled:
            qualified = expression_subqueries(self.parsed.tree)
            ids = {id(h) for part in self.handled for h in part.walk()}
            skip = [i for i, q in enumerate(qualified) if id(q) in ids]
            if len(qualified) != len(found):  # the qualifier changed the subqueries: refuse them all
                skip = []
            found = [q for i, q in enumerate(found) if i not in skip]
        for sub in found:
            inner = [t for t in relations_read(sub, self.catalog, ctes) if t in private]
            reads = f" (it reads private table {inner[0]!r})" if inner else ""
            raise self.refuse(
                f"subqueries inside expressions (scalar, EXISTS, IN, ANY) are not analysed{reads}; "
                "only FROM-subqueries can be inlined",
                sub,
            )

    def _check_post_processed(self, e: exp.Expr, at: exp.Expr, what: str) -> None:
        """Refuse what the release step cannot compute on the noisy values (sqldp.release's tables)."""
        for node in e.walk():
            bad_column = isinstance(node, exp.Column) and (node.table or not node.name.startswith(AGG_PREFIX))
            if (
                bad_column
                or not isinstance(node, postprocess.POST_PROCESSED)
                or (isinstance(node, exp.Literal) and node.is_string)
            ):
                # the node as the analyst wrote it, or its operator's name where it holds a measured aggregate
                internal = any(isinstance(x, exp.Column) and x.name.startswith(AGG_PREFIX) for x in node.walk())
                shown = node.key.upper() if internal else node.sql(dialect="postgres")
                raise self.refuse(f"{what} ({postprocess.post_processing()}), not {shown}", at)
        try:
            postprocess.check(e)
        except RefusedError as err:
            raise self.refuse(str(err), at) from None

    def _sensitive(self, block: _SPJ, ref: ColumnRef) -> bool:
        table = next(u.table for u in block.uses if u.alias == ref.alias)
        return self.policy.is_sensitive(table, ref.column)

    @staticmethod
    def _keys_written(e: exp.Expr, groups: tuple[exp.Expr, ...]) -> exp.Expr:
        """``e`` with each subexpression equal to group key j written as the column ``__key<j>``."""

        def swap(node: exp.Expr) -> exp.Expr:
            for j, g in enumerate(groups):
                if node == g:
                    return exp.column(f"{KEY_PREFIX}{j}")
            return node

        return e.copy().transform(swap)

    def _key_expression(self, e: exp.Expr, groups: tuple[exp.Expr, ...]) -> exp.Expr | None:
        """``e`` over the group keys (:meth:`_keys_written`) when it reads group keys and nothing else — no other
        column, aggregate, window or subquery; else None. Its value for a group is a function of the group's key
        values only, so it is computed over the group domain's values (public or declared), never over rows."""
        written = self._keys_written(e, groups)
        columns = list(written.find_all(exp.Column))
        if not columns or any(c.table or not c.name.startswith(KEY_PREFIX) for c in columns):
            return None
        banned = (exp.AggFunc, exp.Window, exp.Subquery, exp.Exists, exp.Select, exp.Placeholder, exp.Parameter)
        if any(isinstance(n, banned) for n in written.walk()):
            return None
        return written

    def _output(
        self,
        name: str,
        e: exp.Expr,
        block: _SPJ,
        groups: tuple[exp.Expr, ...],
        aggs: list[Aggregate],
        key_exprs: list[exp.Expr] | None = None,
    ) -> Output:
        expr = self._substitute(e, block.exports)
        guarded = self._guard_dates(expr, block)
        for i, g in enumerate(groups):
            if guarded == g:
                return Output(name, guarded, (), group_key=i)
        derived = self._key_expression(guarded, groups) if key_exprs is not None else None
        if derived is not None and key_exprs is not None:
            # an expression of group keys (SELECT age + 1 … GROUP BY age): a key output, whose value per group
            # PostgreSQL computes over the group domain (sqldp.groups); group_key names the first key it reads
            first = min(int(c.name[len(KEY_PREFIX) :]) for c in derived.find_all(exp.Column))
            key_exprs.append(derived)
            return Output(name, guarded, (), group_key=first, derived=len(key_exprs) - 1)
        used: list[int] = []

        def lift(node: exp.Expr) -> exp.Expr:
            if not isinstance(node, exp.AggFunc):
                return node
            if isinstance(node.parent, exp.Window) or node.find_ancestor(exp.Window):
                raise self.refuse("window functions are not supported", node)
            if isinstance(node.this, exp.Distinct) and not isinstance(node, exp.Count):
                raise self.refuse(f"{node.key.upper()}(DISTINCT …) is not supported (COUNT(DISTINCT e) is)", node)
            rule = aggregates.lookup(node)
            if rule is None:
                raise self.refuse(f"aggregate {node.key.upper()} is not supported ({aggregates.supported()} are)", node)
            return rule.lift(context(node), node)

        def measure(kind: AggKind, arg: exp.Expr | None, distinct: bool = False) -> exp.Expr:
            if kind == "count" and not distinct and arg is not None and self._never_null(arg, block):
                arg = None  # COUNT(x) of a NOT NULL column is COUNT(*): one measurement, not two
            columns = columns_of(arg) if arg is not None else frozenset()
            return self._agg(Aggregate(kind, arg, columns, distinct), aggs, used)

        def note(text: str) -> None:
            if text not in self.notes:  # once per query, however many aggregates it applies to
                self.notes.append(text)

        def context(node: exp.Expr) -> aggregates.Lift:
            return aggregates.Lift(
                measure=measure,
                declared_range=lambda arg: self._declared_range(arg, block),
                non_negative=lambda arg: self._non_negative(arg, block),
                note=note,
                refuse=lambda why: self.refuse(why, node),
            )

        lifted = expr.transform(lift)
        stray = [c for c in lifted.find_all(exp.Column) if c.table]
        if stray and not any(c.table for c in self._keys_written(lifted, groups).find_all(exp.Column)):
            what = "a HAVING conjunct" if name == "HAVING" else f"output {name!r}"
            raise self.refuse(
                f"{what} combines GROUP BY keys with aggregates; it may be an expression of the keys alone or of "
                "aggregates and numbers alone",
                e,
            )
        if stray:
            raise self.refuse(
                f"output {name!r} uses {stray[0].sql(dialect='postgres')} outside an aggregate and the GROUP BY keys", e
            )
        return Output(name, lifted, tuple(dict.fromkeys(used)))

    def _guard_dates(self, e: exp.Expr, block: _SPJ) -> exp.Expr:
        """A group key's ``date_trunc('year' | 'month', d)`` of a DATE column with a declared range, guarded so
        that PostgreSQL cannot fail on it (sqldp.groups.guard_date_trunc)."""

        def declared(column: exp.Column) -> tuple[dt.date, dt.date] | None:
            table = next((u.table for u in block.uses if u.alias == column.table), None)
            if table is None or self.catalog.table(table).column(column.name).kind != "date":
                return None
            span = self.policy.table(table).column(column.name).range
            if span is None:
                return None
            return EPOCH + dt.timedelta(days=int(span[0])), EPOCH + dt.timedelta(days=int(span[1]))

        return groups_mod.guard_date_trunc(e, declared)

    def _declared_range(self, arg: exp.Expr, block: _SPJ) -> tuple[float, float] | None:
        """The policy's range of a numeric column argument (None for anything else: no centring)."""
        if not isinstance(arg, exp.Column) or not arg.table:
            return None
        table = next((u.table for u in block.uses if u.alias == arg.table), None)
        if table is None or self.catalog.table(table).column(arg.name).kind not in ("integer", "numeric"):
            return None
        declared = self.policy.table(table).column(arg.name).range
        return None if declared is None else (float(declared[0]), float(declared[1]))

    def _never_null(self, arg: exp.Expr, block: _SPJ) -> bool:
        """Whether ``arg`` is a column of a table the block reads that is NOT NULL by a catalog the database
        enforces (read from PostgreSQL; a schema file's NOT NULL is a claim nothing checks) and not on the
        NULL-extended side of a LEFT JOIN: COUNT(arg) is then COUNT(*) on every database the catalog allows."""
        if not self.catalog.enforced or not isinstance(arg, exp.Column) or not arg.table:
            return False
        if any(j.alias == arg.table for j in self.null_extended):
            return False
        table = next((u.table for u in block.uses if u.alias == arg.table), None)
        if table is None:
            return False
        column = self.catalog.table(table).columns.get(arg.name)
        return column is not None and not column.nullable

    def _non_negative(self, arg: exp.Expr, block: _SPJ) -> bool:
        """Whether ``arg`` is at least 0 on every row by the declared ranges (sqldp.sensitivity.intervals, over
        which the answer clamps each column); False where the ranges do not bound it."""
        tables = {u.alias: u.table for u in block.uses}
        if any(c.table not in tables for c in arg.find_all(exp.Column)):
            return False
        try:
            lo, _ = intervals.interval(arg, intervals.domain_of(tables.__getitem__, self.catalog, self.policy))
        except (SqldpError, KeyError):
            return False
        return lo >= 0

    @staticmethod
    def _agg(agg: Aggregate, aggs: list[Aggregate], used: list[int]) -> exp.Column:
        # DISTINCT is part of the aggregate: COUNT(x) and COUNT(DISTINCT x) are two measurements
        key = (agg.kind, agg.arg.sql(dialect="postgres") if agg.arg is not None else None, agg.distinct)
        for i, a in enumerate(aggs):
            if (a.kind, a.arg.sql(dialect="postgres") if a.arg is not None else None, a.distinct) == key:
                used.append(i)
                return placeholder(i)
        aggs.append(agg)
        used.append(len(aggs) - 1)
        return placeholder(len(aggs) - 1)

    def _order_expression(
        self,
        key: exp.Expr,
        desc: bool,
        outputs: tuple[Output, ...],
        body: ra.Aggregate,
        scope: tuple[_SPJ, tuple[exp.Expr, ...], list[Aggregate], list[exp.Expr]] | None,
    ) -> OrderKey | None:
        """``ORDER BY e`` for an expression e that is no output (else None): of the group keys alone (a key
        expression, computed over the domain) or of aggregates the query measures anyway (computed on their
        noisy values). One that would need another measurement is refused by the caller."""
        if scope is None or isinstance(key, exp.Literal) or (isinstance(key, exp.Column) and not key.table):
            return None
        if any(key == item for _, item in body.items):
            return None
        block, groups, measured, key_exprs = scope
        shown = key.sql(dialect="postgres")
        derived = self._key_expression(self._guard_dates(self._substitute(key, block.exports), block), groups)
        if derived is not None:
            key_exprs.append(derived)
            return OrderKey(-1, desc, derived=len(key_exprs) - 1, sql=shown)
        if not any(isinstance(n, exp.AggFunc) for n in key.walk()):
            return None
        before = len(measured)
        lifted = self._output("ORDER BY", key, block, groups, measured)
        if len(measured) > before:
            del measured[before:]
            return None  # refused by the caller: sorting by it would need one more measurement
        self._check_post_processed(lifted.expr, key, "ORDER BY may combine released aggregates and numbers")
        return OrderKey(-1, desc, expr=lifted.expr, sql=shown)

    def _order(
        self,
        sort: ra.Sort,
        outputs: tuple[Output, ...],
        body: ra.Aggregate,
        scope: tuple[_SPJ, tuple[exp.Expr, ...], list[Aggregate], list[exp.Expr]] | None = None,
    ) -> tuple[tuple[OrderKey, ...], int | None]:
        """The ORDER BY keys: outputs (by position, name or equal expression), and with ``scope`` (the block, the
        group keys, the measured aggregates and the key expressions) an expression of the group keys alone or
        of aggregates already measured, computed after the noise like an output (post-processing)."""
        if sort.offset:
            raise self.refuse("OFFSET is not supported")
        keys = []
        for key, desc in sort.keys:
            expression = self._order_expression(key, desc, outputs, body, scope)
            if expression is not None:
                keys.append(expression)
                continue
            index = None
            if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
                index = int(key.this) - 1
            elif isinstance(key, exp.Column) and not key.table:
                index = next((i for i, o in enumerate(outputs) if o.name == key.name), None)
            else:
                for i, (_, item) in enumerate(body.items):
                    if key == item:
                        index = i
            if index is None and any(isinstance(n, exp.AggFunc) for n in key.walk()):
                # sorting by it would need one more measurement, which the analyst did not ask to pay for
                raise self.refuse(
                    f"ORDER BY {key.sql(dialect='postgres')}: the aggregate is not an output of the query; add it "
                    "to the SELECT list (only released values can order the rows)",
                    key,
                )
            if index is None or not 0 <= index < len(outputs):
                raise self.refuse("ORDER BY must name an output column of the query", key)
            keys.append(OrderKey(index, desc))
        return tuple(keys), sort.limit


def _why_not_inlinable(node: ra.Node, alias: str | None) -> str:
    what = f"derived table {alias!r}" if alias else "the query"
    if isinstance(node, ra.Aggregate):
        return f"{what} aggregates before the outer query does; nested aggregation is not supported"
    if isinstance(node, ra.Distinct):
        return f"{what} uses DISTINCT, whose sensitivity is not analysed"
    if isinstance(node, ra.SetOp):
        return f"{what} uses {node.op}; set operations are not supported"
    if isinstance(node, ra.Sort):
        return f"{what} uses ORDER BY/LIMIT inside; a LIMIT before aggregation is not supported"
    return f"{what} has an unsupported shape ({type(node).__name__})"


def normalize(parsed: ParsedQuery, catalog: Catalog, policy: Policy) -> AnalysisForm | PublicRelease:
    keep: frozenset[int] = frozenset()
    while True:  # a LEFT JOIN left out whose right table is read: again with it kept (sqldp.subqueries.left_join)
        try:
            return Normalizer(parsed, catalog, policy, keep).run()
        except subqueries.ReadsEliminated as err:
            if err.join in keep:  # cannot happen (a kept join is not left out); fail closed all the same
                raise RefusedError(str(err), where=err.where) from None
            keep |= {err.join}


def _unaggregated(node: ra.Node) -> list[ra.Relation]:
    """The relation uses of ``node`` that no aggregation (γ) or DISTINCT (δ) sits above: the rows an answer
    would list as they are."""
    if isinstance(node, ra.Relation):
        return [node]
    if isinstance(node, (ra.Aggregate, ra.Distinct)):
        return []
    return [r for c in ra.children(node) for r in _unaggregated(c)]
