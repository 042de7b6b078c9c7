"""The per-row ledger's SQL, generated (pure): its side table, the exclusion predicate and the statement that
answers and charges in one snapshot (NR §3.3.12.7).

The ledger of a budgeted table ``T`` is the table ``row_budget_T`` of schema ``sqldp``: T's primary key,
``spent`` (numeric, exact sums) and ``uses``, one row per row of T that was ever charged (a row it lacks has
spent nothing). It lives beside the analyst ledger (sqldp.proxy.ledger), created and written only by sqldp's
own role; the analyst role has no right on it.

One statement does everything, so that the answer and the charge read the same snapshot::

    WITH __used AS (SELECT key FROM T AS t WHERE <conditions on t> AND NOT <exhausted>),
         __charge AS (INSERT INTO <the ledger> … SELECT … FROM __used ON CONFLICT … DO UPDATE …)
    SELECT * FROM (<the answer, with AND NOT <exhausted> on t>) AS __answer

All parts of a WITH statement see one snapshot, and the INSERT's changes are invisible to the answer
(PostgreSQL manual §7.8.4), so the rows excluded from the answer are exactly the used rows the charge skips:
the exclusion happens inside the statement, before the answer, and the charge is applied to exactly the rows
the answer used. Two budgeted queries on one table are serialised by a transaction-level advisory lock taken
before the statement (sqldp.engine.postgres.engine.ChargedAnswer), so the second reads the first one's charges.
"""

from __future__ import annotations

from decimal import Decimal

import sqlglot
from sqlglot import exp

from sqldp.budgets.analysis import Budgeted

SCHEMA = "sqldp"


def ledger_name(table: str) -> str:
    return f"row_budget_{table}"


def ledger_table(table: str) -> exp.Table:
    return exp.Table(this=exp.to_identifier(ledger_name(table), quoted=True), db=exp.to_identifier(SCHEMA))


def ledger_sql(table: str) -> str:
    return ledger_table(table).sql(dialect="postgres")


def amount(x: float) -> exp.Expr:
    """An ε as an exact NUMERIC (the decimal of its shortest repr, as sqldp.proxy.ledger charges it)."""
    return exp.cast(exp.Literal.string(str(Decimal(repr(float(x))))), "NUMERIC")


def exhausted(b: Budgeted, epsilon: float, limit: float) -> exp.Expr:
    """``EXISTS (a ledger row of this row whose spent + ε passes the limit)``: a row it holds is excluded."""
    ledger = "__l"
    match = [exp.EQ(this=exp.column(k, table=ledger), expression=exp.column(k, table=b.alias)) for k in b.key]
    over = exp.GT(
        this=exp.Add(this=exp.column("spent", table=ledger), expression=amount(epsilon)), expression=amount(limit)
    )
    inner = exp.select(exp.Literal.number(1)).from_(exp.alias_(ledger_table(b.table), ledger, table=True))
    inner = inner.where(exp.and_(*match, over))
    return exp.Exists(this=inner)


def excluding(answer: str, b: Budgeted, epsilon: float, limit: float) -> exp.Expr:
    """The answer statement with ``AND NOT exhausted`` on the SELECT that reads the budgeted use."""
    tree = sqlglot.parse_one(answer, dialect="postgres")
    reads = [t for t in tree.find_all(exp.Table) if t.name.lower() == b.table and (t.alias_or_name.lower() == b.alias)]
    if len(reads) != 1:
        raise ValueError(f"the answer reads {b.table} AS {b.alias} {len(reads)} times")  # analyse() prevents it
    select = reads[0].find_ancestor(exp.Select)
    assert select is not None
    select.where(exp.Not(this=exhausted(b, epsilon, limit)), append=True, copy=False)
    return tree


def used_rows(b: Budgeted, epsilon: float, limit: float, *, included: bool = True) -> exp.Select:
    """The key of every used row that has room for ε (``included``) or has not (the excluded ones)."""
    table = exp.alias_(exp.to_table(b.table), b.alias, table=True)
    room = exhausted(b, epsilon, limit)
    select = exp.select(*(exp.column(k, table=b.alias) for k in b.key)).from_(table)
    return select.where(exp.and_(*(e.copy() for e in b.own), exp.Not(this=room) if included else room))


def charged_statement(answer: str, b: Budgeted, epsilon: float, limit: float) -> str:
    """The answer with the exclusion, and the charge of exactly the rows it used, in one statement."""
    keys = ", ".join(exp.to_identifier(k).sql(dialect="postgres") for k in b.key)
    used = used_rows(b, epsilon, limit).sql(dialect="postgres")
    ledger = ledger_sql(b.table)
    eps = amount(epsilon).sql(dialect="postgres")
    body = excluding(answer, b, epsilon, limit).sql(dialect="postgres")
    return (
        f"WITH __used AS ({used}), "
        f"__charge AS (INSERT INTO {ledger} AS __l ({keys}, spent, uses, updated) "
        f"SELECT {keys}, {eps}, 1, now() FROM __used "
        f"ON CONFLICT ({keys}) DO UPDATE SET spent = __l.spent + EXCLUDED.spent, uses = __l.uses + 1, "
        f"updated = EXCLUDED.updated RETURNING 1) "
        f"SELECT * FROM ({body}) AS __answer"
    )


def counts_statement(b: Budgeted, epsilon: float, limit: float) -> str:
    """The numbers of used rows a query would charge and would exclude (explain: released with noise)."""
    charged = exp.select(exp.Count(this=exp.Star())).from_(used_rows(b, epsilon, limit).subquery("__c"))
    excluded = exp.select(exp.Count(this=exp.Star())).from_(
        used_rows(b, epsilon, limit, included=False).subquery("__x")
    )
    return exp.select(charged.subquery(), excluded.subquery()).sql(dialect="postgres")


def ledger_ddl(table: str, key: tuple[str, ...]) -> list[str]:
    """The side table's DDL: T's key columns with their types (copied from T), spent, uses, updated."""
    ledger = ledger_sql(table)
    cols = ", ".join(exp.to_identifier(k).sql(dialect="postgres") for k in key)
    source = exp.to_table(table).sql(dialect="postgres")
    return [
        f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}",
        f"CREATE TABLE {ledger} AS SELECT {cols} FROM {source} WITH NO DATA",
        f"ALTER TABLE {ledger} ADD PRIMARY KEY ({cols}), "
        "ADD COLUMN spent numeric NOT NULL DEFAULT 0 CHECK (spent >= 0), "
        "ADD COLUMN uses bigint NOT NULL DEFAULT 0, ADD COLUMN updated timestamptz NOT NULL DEFAULT now()",
        f"REVOKE ALL ON {ledger} FROM PUBLIC",
    ]
