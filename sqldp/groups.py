"""The set of groups a GROUP BY query answers (NR §3.3.10.4; issue 3, item 2).

Which groups exist must not itself leak: a group appears in the output because the policy declares it
(``domain = [...]`` on the key column) or because the key is a column of a public table, never because
private rows happen to carry it. Declared groups with no rows are answered too (with noise), and groups
outside the declared domain are never released.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from sqlglot import exp

from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.policy import Policy


@dataclass(frozen=True)
class KeyDomain:
    values: tuple[object, ...] | None  # declared in the policy
    query: exp.Select | None  # SELECT DISTINCT over a public table, run by the runner


def key_domains(form: AnalysisForm, policy: Policy) -> tuple[KeyDomain, ...]:
    out = []
    for key in form.group_by:
        if not isinstance(key, exp.Column) or not key.table:
            raise RefusedError(
                f"GROUP BY {key.sql(dialect='postgres')}: only plain columns can be group keys "
                "(their domain must come from the policy or a public table)"
            )
        table = form.use(key.table).table
        tp = policy.table(table)
        col = tp.column(key.name)
        if col.domain is not None:
            out.append(KeyDomain(col.domain, None))
        elif tp.public:
            q = (
                exp.select(exp.column(key.name))
                .distinct()
                .from_(exp.to_table(table))
                .where(exp.column(key.name).is_(exp.null()).not_())
            )
            out.append(KeyDomain(None, q))
        else:
            raise RefusedError(
                f"GROUP BY {key.sql(dialect='postgres')}: which groups exist in private table {table!r} would "
                f"leak; declare the column's domain in the policy (tables.{table}.columns.{key.name}.domain)"
            )
    return tuple(out)


def all_groups(domains: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Every combination of key values, in a stable order."""
    return [tuple(g) for g in itertools.product(*domains)]


def normalise_key(value: object) -> object:
    """Compare keys the way the database returns them (CHAR(n) pads with blanks)."""
    return value.rstrip() if isinstance(value, str) else value
