"""Which rows an answer uses, and whether per-row budgets keep it DP (NR §3.3.12.7), pure.

A query qualifies for the per-row ledger when it reads exactly one use of a table the policy marks
``budget = "per-row"`` (the *budgeted* table) and every other private table it reads hangs off it through
1:n joins: a top-level equality of the joined table's columns with the whole primary key of the budgeted
table, or of a table already attached that way (orders → lineitem; customer → orders → lineitem). Each
joined row then has exactly one budgeted component, its root. Public tables may be joined in any way.

The rows a query uses, and is charged for, are the budgeted table's rows that pass the query's conditions on
that table alone. That set depends on nothing but each row's own data, which is what keeps the budgets of
other rows independent of any one row (the argument in docs/budgets.md):

* removing or adding a budgeted row changes only its own decisions and the joined rows it roots (Lemmas 3.103
  and 3.104 with one budgeted component per joined row: no other row becomes included or excluded);
* a row of an attached table is read only through its root, so it reaches an answer only when its root is
  included and is covered by its root's budget (the root is charged whether or not its children match);
* for a change inside a row (value-level, Banach sensitivity) the used set must not move: the conditions on
  the budgeted table may not read its value-sensitive (``norm``) columns, so the budgets are public (the
  report's first paragraph of §3.3.12.7).

Refused, each with the reason: general joins between private tables (the report's OR-join counterexample:
each row joins up to two rows of the other table and the sensitivity grows with the data), a second use of
the budgeted table (a self-join), plans whose bound depends on the data (their sensitivity queries would read
rows the answer excludes), a truncation of the budgeted table (which rows a truncation keeps depends on other
rows), set operations, workflows and the other shapes the ledger was not proven for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, Conjunct
from sqldp.policy import Policy
from sqldp.policy.tables import RowBudget
from sqldp.rewrite import Statements
from sqldp.sensitivity.plan import Plan


@dataclass(frozen=True)
class Budgeted:
    """The budgeted table use of a query and the rows it uses."""

    table: str
    alias: str
    key: tuple[str, ...]  # the table's primary key: the ledger's key
    budget: RowBudget
    own: tuple[exp.Expr, ...]  # the query's conditions over the budgeted use alone: the rows it uses
    attached: tuple[str, ...]  # aliases of the private uses joined 1:n below it
    neighbours: str  # "rows", "values" (changes inside rows: the table has a norm) or "rows and values"

    @property
    def supported_class(self) -> str:
        """The class of docs/budgets.md the query is in, and the neighbouring changes it protects."""
        shape = "1:n join" if self.attached else "single table"
        return f"{shape}; {self.neighbours}"


def refused(why: str) -> RefusedError:
    return RefusedError(f"per-row budgets (docs/budgets.md): {why}", where="budget")


def budgeted_tables(policy: Policy) -> tuple[str, ...]:
    return tuple(sorted(name for name, t in policy.tables.items() if t.budget is not None))


def analyse(
    form: AnalysisForm, plans: Sequence[Plan], statements: Statements, catalog: Catalog, policy: Policy
) -> Budgeted:
    """The budgeted use of an analysed query, or a :class:`RefusedError` saying why the ledger cannot answer it."""
    budgeted = set(budgeted_tables(policy))
    uses = [u for u in form.uses if u.table in budgeted]
    if not uses:
        raise refused("the query reads no table with budget = 'per-row'")
    if len(uses) > 1:
        raise refused(
            f"the query reads budgeted tables {len(uses)} times ({', '.join(u.alias for u in uses)}); one use of "
            "one budgeted table per query (a self-join gives a row two components)"
        )
    if form.nested is not None or form.semijoins or form.select_by is not None or form.distinct_rows:
        raise refused(
            "subqueries, histograms of counts and partition selection are not among the proven classes "
            "(single table, 1:n joins)"
        )
    use = uses[0]
    policy_table = policy.table(use.table)
    assert policy_table.budget is not None
    table = catalog.table(use.table)
    key = table.primary_key
    if not key:
        raise refused(f"table {use.table!r} has no primary key to key its rows' budgets")
    if any(t.table == use.table for t in statements.truncations):
        raise refused(
            f"the query reads {use.table} truncated to a declared bound; which rows a truncation keeps depends on "
            "other rows"
        )
    mine = [c for c in form.conjuncts if c.columns and {r.alias for r in c.columns} == {use.alias}]
    sensitive = policy_table.sensitive_columns
    for c in mine:
        read = {r.column for r in c.columns} & sensitive
        if read:
            raise refused(
                f"the condition {c.expr.sql(dialect='postgres')} reads value-sensitive column(s) "
                f"{', '.join(sorted(read))} of {use.table}: a change inside a row would change which rows are "
                "charged, and the budgets would no longer be public"
            )
    own = tuple(c.expr for c in mine)
    if set(key) & sensitive:
        raise refused(f"the primary key of {use.table} is value-sensitive")
    attached = _attached(form, use.alias, catalog, policy)
    for plan in plans:
        if not plan.data_independent:
            raise refused(
                "the query's sensitivity depends on the data; its sensitivity queries would read the rows the "
                "answer excludes (declare max_rows_per on the joined tables for a global bound)"
            )
    if statements.queries:
        raise refused("the query runs sensitivity queries besides its answer")
    kinds = [k for k, on in (("rows", policy_table.rows_private), ("values", bool(sensitive))) if on]
    neighbours = " and ".join(kinds)
    return Budgeted(use.table, use.alias, key, policy_table.budget, own, attached, neighbours)


def _attached(form: AnalysisForm, root: str, catalog: Catalog, policy: Policy) -> tuple[str, ...]:
    """The private uses joined 1:n below ``root``, attached one at a time; refused when one is left over."""
    private = {u.alias: u.table for u in form.uses if u.alias != root and not policy.table(u.table).public}
    keys = {u.alias: catalog.table(u.table).primary_key for u in form.uses}
    joined: set[str] = {root}
    order: list[str] = []
    equalities = [pair for c in form.conjuncts if (pair := _equality(c)) is not None]
    progress = True
    while progress:
        progress = False
        for alias in sorted(private):
            if alias in joined:
                continue
            for parent in sorted(joined):
                pk = keys[parent]
                tied = set()
                for a, ac, b, bc in equalities:
                    if a == alias and b == parent:
                        tied.add(bc)
                    elif b == alias and a == parent:
                        tied.add(ac)
                if pk and set(pk) <= tied:
                    joined.add(alias)
                    order.append(alias)
                    progress = True
                    break
    left = sorted(set(private) - joined)
    if left:
        raise refused(
            f"private table use(s) {', '.join(f'{a} ({private[a]})' for a in left)} are not joined 1:n below the "
            "budgeted table (an equality of their columns with the whole primary key of a table above them, as a "
            "top-level AND condition); other joins are not DP with enforced budgets — the OR-join counterexample "
            "of NR §3.3.12.7"
        )
    return tuple(order)


def _equality(c: Conjunct) -> tuple[str, str, str, str] | None:
    """``a.x = b.y`` between two column references of different uses, as (a, x, b, y)."""
    e = c.expr
    if not isinstance(e, exp.EQ):
        return None
    left, right = e.this, e.expression
    if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
        return None
    if not left.table or not right.table or left.table == right.table:
        return None
    return (left.table, left.name.lower(), right.table, right.name.lower())
