"""The set of groups a GROUP BY query answers (NR §3.3.10.4).

Which groups exist must not itself leak: a group appears in the output because the policy declares it
(``domain = [...]`` on the key column) or because the key is a column of a public table, never because
private rows happen to carry it. Declared groups with no rows are answered too (with noise), and groups
outside the declared domain are never released.

Group identity is PostgreSQL's equality, never a Python normalisation of printed values: parallel
composition (full ε per group) holds only if each row counts in one released group, and PostgreSQL decides
which rows are one group (CHAR(n) pads, VARCHAR keeps trailing blanks, numeric 1 = 1.0, float −0 = 0 and
NaN = NaN, citext and collations compare case-insensitively). So the answer rows are matched to the groups
in SQL (:func:`match_groups`) with PostgreSQL's own ``=``, each answer row to at most one group.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from sqldp.catalog import Catalog
from sqldp.errors import RefusedError, about
from sqldp.form import KEY_PREFIX, Aggregate, AnalysisForm
from sqldp.policy import EPOCH, Policy

DOMAIN_ALIAS = "__s"  # the derived table of a domain statement (its columns: v, v0 …, or __key<j> with key expressions)


@dataclass(frozen=True)
class KeyDomain:
    values: tuple[object, ...] | None  # declared in the policy
    query: exp.Select | None  # SELECT DISTINCT over a public table, run in the answer's snapshot (sqldp.engine)
    # a column of a private table with no declared domain: its groups are those present in the data, each
    # released only if its noisy count passes a threshold (DP partition selection, :func:`partition_selection`)
    private: bool = False
    # keys whose groups are the DISTINCT tuples of public tables (:func:`_joint_domains`), not the product of
    # each key's values: the GROUP BY positions of the keys, in the order of ``query``'s columns; every member
    # carries the same ``query``. Empty for a domain of one key.
    joint: tuple[int, ...] = ()
    # expressions of the part's keys (form.key_exprs: outputs such as age + 1, HAVING conjuncts over keys)
    # written over the domain statement's columns (__s.__key<j> for key j), computed by PostgreSQL next to
    # the values; set on the part's first key, with their indices into form.key_exprs. ``cast``: the SQL type of
    # a declared domain's key column, as which its values are read (the statement lists them as constants)
    extras: tuple[exp.Expr, ...] = ()
    extra_index: tuple[int, ...] = ()
    cast: exp.DataType | None = None
    positions: tuple[int, ...] = ()  # with ``extras``: the part's GROUP BY positions (the statement's columns)

    @property
    def ordered(self) -> exp.Select | None:
        """The public domain's values (tuples, for a joint domain) in ORDER BY order: row i is group i (see
        :func:`match_groups`), followed by the ``extras`` over them. A declared domain with ``extras``: its values,
        as constants of the key's type, in the declared order, and the ``extras``; else None."""
        extras = [e.copy() for e in self.extras]
        keys = [f"{KEY_PREFIX}{j}" for j in self.positions]
        columns = [exp.column(k, table=DOMAIN_ALIAS) for k in keys]
        if self.query is not None:
            names = keys if extras else _value_names(max(1, len(self.joint)))
            q = exp.select(*(columns if extras else names), *extras)
            q = q.from_(exp.Subquery(this=self.query.copy(), alias=_alias(DOMAIN_ALIAS, *names)))
            q.set("order", exp.Order(expressions=[exp.Ordered(this=c) for c in columns]) if extras else _by_v(names))
            return q
        if self.values is None or not self.extras or not self.values:
            return None
        assert self.cast is not None
        rows = [
            exp.Tuple(
                expressions=[
                    exp.Literal.number(i),
                    exp.Cast(this=exp.null() if v is None else _literal(v), to=self.cast.copy()),
                ]
            )
            for i, v in enumerate(self.values)
        ]
        listed = exp.Values(expressions=rows, alias=_alias(DOMAIN_ALIAS, "__i", *keys))
        q = exp.select(*columns, *extras).from_(listed)
        q.set("order", exp.Order(expressions=[exp.Ordered(this=exp.column("__i", table=DOMAIN_ALIAS))]))
        return q


def factors(domains: Sequence[KeyDomain], extras: bool = False) -> list[tuple[int, ...]]:
    """The GROUP BY positions of each independent part of the group domain, in order of their first key: one
    key alone, or the members of a joint domain. The released groups are the product of the parts' groups.
    With ``extras``, each part's positions go on with ``len(domains) + i`` for the key expressions i it
    computes (:attr:`KeyDomain.extra_index`): a group's tuple is then its keys and every key expression."""
    out: list[tuple[int, ...]] = []
    for j, d in enumerate(domains):
        if not d.joint or d.joint[0] == j:
            positions = d.joint or (j,)
            more = tuple(len(domains) + i for i in d.extra_index) if extras else ()
            out.append((*positions, *more))
    return out


def read_factors(
    domains: Sequence[KeyDomain], reads: Sequence[Sequence[object] | None]
) -> list[tuple[tuple[object, ...], ...]]:
    """Each part's groups (:func:`factors`) as tuples of its key values and key expressions (``factors(…,
    extras=True)``), in the order its domain statement (or the policy) lists them: ``reads`` is what the engine
    read per key (the rows of a part's statement at its first key, None at the others and for a declared domain
    without key expressions). A declared key's value is the policy's, as without expressions."""
    out: list[tuple[tuple[object, ...], ...]] = []
    for positions in factors(domains):
        d, read = domains[positions[0]], reads[positions[0]]
        rows = [r if isinstance(r, tuple) else (r,) for r in read or ()]
        if d.values is not None:
            if d.extras:
                out.append(tuple((v, *r[1:]) for v, r in zip(d.values, rows, strict=True)))
            else:
                out.append(tuple((v,) for v in d.values))
        else:
            out.append(tuple(rows))
    return out


def key_expressions(form: AnalysisForm, domains: Sequence[KeyDomain], catalog: Catalog | None) -> tuple[KeyDomain, ...]:
    """The domains with each of the form's key expressions (outputs of group keys, HAVING conjuncts over keys)
    attached to the part whose keys it reads (:attr:`KeyDomain.extras`).

    Its value for a group is a function of the group's key values, which the part's domain lists: PostgreSQL
    computes it over those values (a public domain's statement, or a declared domain's values as constants of
    the key column's type), so its meaning, types and NULLs are PostgreSQL's own. It reads no private row: the
    domain is public or declared, and computing the expression, or keeping the groups whose HAVING conjunct over
    keys is true, is post-processing of the released set of groups (NR §3.3.10.4: that set must not depend on
    private data; a function of it does not). Refused, with the reason: under DP partition selection (no
    domain to compute over), an expression of keys of independent parts, and a declared domain of a key that
    is no plain column (a calendar or CASE domain, whose values' SQL type is not a column's)."""
    if not form.key_exprs:
        return tuple(domains)

    def shown(e: exp.Expr) -> str:
        def back(node: exp.Expr) -> exp.Expr:
            if isinstance(node, exp.Column) and not node.table and node.name.startswith(KEY_PREFIX):
                return form.group_by[int(node.name[len(KEY_PREFIX) :])].copy()
            return node

        return e.copy().transform(back).sql(dialect="postgres")

    if any(d.private for d in domains):
        raise RefusedError(
            f"{shown(form.key_exprs[0])} is an expression of GROUP BY keys, computed over the keys' declared or "
            "public domain; under DP partition selection the groups are the data's and there is none"
        )
    out = list(domains)
    part_of = {j: p for p in factors(domains) for j in p}
    attached: dict[tuple[int, ...], list[int]] = {}
    for i, e in enumerate(form.key_exprs):
        keys = {int(c.name[len(KEY_PREFIX) :]) for c in e.find_all(exp.Column)}
        parts = {part_of[j] for j in keys}
        if len(parts) > 1:
            raise RefusedError(
                f"{shown(e)} reads GROUP BY keys whose domains are independent (their product is the groups); an "
                "expression of keys is computed over one key's domain, or over the tuples of keys of public tables "
                "that public conjuncts link"
            )
        attached.setdefault(parts.pop(), []).append(i)

    for positions, indices in attached.items():
        first = out[positions[0]]

        def over_values(node: exp.Expr) -> exp.Expr:
            # key j as the statement's column __s.__key<j>: qualified, so that the Spark rule (sqldp.engine.spark.sql)
            # knows its type (sqldp.rewrite gives it key j's), and v / 2 truncates there as in PostgreSQL
            if isinstance(node, exp.Column) and not node.table and node.name.startswith(KEY_PREFIX):
                return exp.column(node.name, table=DOMAIN_ALIAS)
            return node

        cast = None
        if first.values is not None:
            key = form.group_by[positions[0]]
            if not isinstance(key, exp.Column) or not key.table or catalog is None:
                raise about(
                    key,
                    RefusedError(
                        f"{shown(form.key_exprs[indices[0]])}: an expression of GROUP BY key "
                        f"{key.sql(dialect='postgres')} is computed over the values of a key column's declared or "
                        "public domain, not over a calendar's or a CASE's"
                    ),
                )
            info = catalog.table(form.use(key.table).table).column(key.name)
            cast = exp.DataType.build(info.type_sql, dialect="postgres")
        extras = tuple(form.key_exprs[i].copy().transform(over_values) for i in indices)
        out[positions[0]] = dataclasses.replace(
            first, extras=extras, extra_index=tuple(indices), cast=cast, positions=positions
        )
    return tuple(out)


def partition_selection(form: AnalysisForm, policy: Policy, delta: float | None) -> AnalysisForm:
    """The form with a hidden COUNT(*) measured for DP partition selection when a group key is a column of a
    private table without a declared domain and δ > 0 is allowed; else the form unchanged (and such a key is
    refused by :func:`key_domains`).

    Which keys occur in a private table is itself private. Partition selection releases a group only if its
    COUNT(*) plus Laplace noise at c/ε exceeds τ = M + (c/ε)·ln(1/(2δ)) (sqldp.release.selection_threshold),
    for c the count's data-independent bound per unit of distance, M the largest count one change gives a group
    that exists on one side only, and a neighbouring change that touches one group: a group whose count moves
    by at most c·d then appears with probability ratio ≤ e^(εd), and one that exists on one side only (count
    ≤ M) with probability ≤ δ — (ε·d, δ)-DP (Korolova, Kenthapadi, Mishra, Ntoulas, "Releasing search queries
    and clicks privately", WWW 2009; Wilson et al., "Differentially private SQL with bounded user
    contribution", PoPETs 2020). The count is the query's own COUNT(*) when it has one, else one more
    measurement with its share of ε and δ (sequential composition); the conditions (a data-independent count
    bound, disjoint groups) are checked on its plan when it is made."""
    if delta is None or not (
        form.distinct_rows or any(_undeclared_private(form, policy, key) for key in form.group_by)
    ):
        return form
    for i, agg in enumerate(form.aggregates):
        if agg.kind == "count" and agg.arg is None:
            # the query's own COUNT(*): released if and only if it passes τ — the thresholded Laplace count
            # itself, no second measurement
            return dataclasses.replace(form, select_by=i)
    count = Aggregate("count", None, frozenset())
    return dataclasses.replace(form, aggregates=(*form.aggregates, count), select_by=len(form.aggregates))


def _undeclared_private(form: AnalysisForm, policy: Policy, key: exp.Expr) -> bool:
    if not isinstance(key, exp.Column) or not key.table or _date_domain(form, policy, key) is not None:
        return False
    if _constant_filter(form, key) is not None:  # the WHERE clause's constants are its domain (listed_domain)
        return False
    tp = policy.table(form.use(key.table).table)
    return tp.column(key.name).domain is None and not tp.public


def key_domains(form: AnalysisForm, policy: Policy, catalog: Catalog | None = None) -> tuple[KeyDomain, ...]:
    if form.distinct_rows:
        # SELECT DISTINCT releases the rows present in the data, also over a declared or public key (which of
        # them occur with the private rows is private): every group is chosen by partition selection
        if form.select_by is None:
            raise RefusedError(
                "SELECT DISTINCT over private tables releases which values occur (so does GROUP BY without "
                "aggregates); allow δ > 0 "
                "(--mechanism laplace --delta D) for DP partition selection"
            )
        return key_expressions(form, tuple(KeyDomain(None, None, private=True) for _ in form.group_by), catalog)
    joint = _joint_domains(form, policy, catalog)
    out = []
    for j, key in enumerate(form.group_by):
        if j in joint:
            out.append(joint[j])
            continue
        years = _date_domain(form, policy, key)
        if years is not None:
            out.append(KeyDomain(years, None))
            continue
        allowed = _constant_filter(form, key)
        fixed = fixed_domain(form, catalog, key) if catalog is not None else None
        if fixed is not None:
            # a NULL key never equals a constant: WHERE key IN (…) leaves no NULL group
            kept = fixed if allowed is None else tuple(v for v in fixed if v is not None and _matches(v, allowed))
            out.append(KeyDomain(kept, None))
            continue
        if not isinstance(key, exp.Column) or not key.table:
            public = _public_key(form, policy, catalog, key)
            if public is not None and allowed is None:
                # an expression of public columns (SUBSTRING(w_name, 1, 20)): its values over the public rows
                # the public conjuncts let through, computed by PostgreSQL (_distinct_tuples)
                out.append(KeyDomain(None, _distinct_tuples(form, policy, [public])))
                continue
            declared = _declared_image(form, policy, catalog, key) if allowed is None else None
            if declared is not None:
                out.append(KeyDomain(None, declared))
                continue
            if allowed is None or not _derived_key(key):
                raise about(
                    key,
                    RefusedError(
                        f"GROUP BY {key.sql(dialect='postgres')}: only plain columns can be group keys (their "
                        "domain must come from the policy or a public table), an expression of public tables' "
                        "columns or of one column with a declared domain, an expression of columns that the "
                        "WHERE clause restricts to constants (key IN (…)), EXTRACT of a field with a fixed set of "
                        f"values ({', '.join(EXTRACT_FIELDS)}) from a date or timestamp, or a CASE whose every "
                        "branch is a constant",
                    ),
                )
            out.append(KeyDomain(listed_domain(allowed), None))
            continue
        table = form.use(key.table).table
        tp = policy.table(table)
        col = tp.column(key.name)
        # a key the WHERE already fixes to constants keeps that list (known before any read, as Q7's nations)
        narrowed = _public_domain(form, policy, key, col.domain) if tp.public and allowed is None else None
        if narrowed is not None:
            out.append(KeyDomain(None, narrowed))
        elif col.domain is not None:
            values = col.domain if allowed is None else tuple(v for v in col.domain if _matches(v, allowed))
            out.append(KeyDomain(values, None))
        elif allowed is not None and not tp.public:
            out.append(KeyDomain(listed_domain(allowed), None))
        elif tp.public:
            q = (
                exp.select(exp.column(key.name))
                .distinct()
                .from_(exp.to_table(table))
                .where(exp.column(key.name).is_(exp.null()).not_())
            )
            if allowed is not None:  # PostgreSQL's own IN on the public column: the same groups the query keeps
                q = q.where(exp.column(key.name).isin(*(v.copy() for v in allowed)))
            out.append(KeyDomain(None, q))
        elif form.select_by is not None:
            out.append(KeyDomain(None, None, private=True))
        else:
            raise about(
                key,
                RefusedError(
                    f"GROUP BY {key.sql(dialect='postgres')}: which groups exist in private table {table!r} would "
                    f"leak; declare the column's domain in the policy (tables.{table}.columns.{key.name}.domain), "
                    "or allow δ > 0 (--mechanism laplace --delta D) for DP partition selection",
                ),
            )
    return key_expressions(form, tuple(out), catalog)


@dataclass(frozen=True)
class _PublicKey:
    """A group key computed from the columns of public table uses only, with what restricts its values: the
    column's declared domain (a plain column's) and the constants a WHERE conjunct keeps it among."""

    expr: exp.Expr
    aliases: frozenset[str]
    declared: tuple[object, ...] | None
    allowed: list[exp.Literal] | None


def _public_key(form: AnalysisForm, policy: Policy, catalog: Catalog | None, key: exp.Expr) -> _PublicKey | None:
    """The key as a :class:`_PublicKey` when every column it reads is of a public use and its domain is not the
    calendar's or the query text's (:func:`_date_domain`, :func:`fixed_domain`, which keep precedence); else
    None."""
    if not _derived_key(key) or _date_domain(form, policy, key) is not None:
        return None
    if catalog is not None and fixed_domain(form, catalog, key) is not None:
        return None
    columns = list(key.find_all(exp.Column))
    aliases = frozenset(c.table for c in columns)
    try:
        if not all(policy.table(form.use(a).table).public for a in aliases):
            return None
    except KeyError:  # a column of a semi-join's derived table: not a product use
        return None
    if not all(any(u.alias == a for u in form.uses) for a in aliases):
        return None
    declared = None
    if isinstance(key, exp.Column):
        declared = policy.table(form.use(key.table).table).column(key.name).domain
    return _PublicKey(key, aliases, declared, _constant_filter(form, key))


# the most combinations of declared values a key over several columns is computed on (the VALUES list PostgreSQL
# reads; the groups released are its distinct images, fewer or as many)
DECLARED_PRODUCT_LIMIT = 10_000


def _declared_image(form: AnalysisForm, policy: Policy, catalog: Catalog | None, key: exp.Expr) -> exp.Select | None:
    """For a key that is an expression of columns c1 … ck with declared domains (``GROUP BY age / 10``,
    ``GROUP BY age + LENGTH(name)``), the statement of its groups: ``SELECT DISTINCT e(v0, …) FROM (VALUES
    (CAST(d1 AS T1), …), …) AS __s(v0, …) WHERE e(v0, …) IS NOT NULL``, the expression's values over every
    combination of the columns' declared values as constants of their types, computed by PostgreSQL (its
    arithmetic, its functions); else None (a column without a declared domain, more than
    :data:`DECLARED_PRODUCT_LIMIT` combinations).

    The set is a function of the policy and the query text, as the declared domains are, so releasing a noisy
    value for each of its values is the declared-domain mechanism (NR §3.3.11: a derived column's domain follows
    from the constraints on the columns it is computed from). A group is every row whose key has that value —
    PostgreSQL's GROUP BY, also for a row whose columns lie outside the declared domains — and a row whose key is
    outside the set (or NULL) is in no released group; each row is in at most one, as for any key computed from
    the row. The combinations are a superset of those the rows hold: a value no row takes is a group with no rows,
    as any declared value."""
    if catalog is None or not _derived_key(key):
        return None
    columns = sorted({(c.table, c.name) for c in key.find_all(exp.Column)})
    if not columns or not all(alias for alias, _ in columns):
        return None
    domains: list[tuple[object, ...]] = []
    types: list[exp.DataType] = []
    for alias, name in columns:
        try:
            use = form.use(alias)
        except KeyError:
            return None
        declared = policy.table(use.table).column(name).domain
        if not declared or not any(u.alias == use.alias for u in form.uses):
            return None
        domains.append(tuple(v for v in declared if v is not None))
        types.append(exp.DataType.build(catalog.table(use.table).column(name).type_sql, dialect="postgres"))
    if math.prod(len(d) for d in domains) > DECLARED_PRODUCT_LIMIT:
        return None
    names = _value_names(len(columns))
    rows = [
        exp.Tuple(expressions=[exp.Cast(this=_literal(v), to=t.copy()) for v, t in zip(combo, types, strict=True)])
        for combo in itertools.product(*domains)
    ]
    if not rows:
        return None
    position = {c: i for i, c in enumerate(columns)}

    def over_v(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Column):
            return exp.column(names[position[(node.table, node.name)]])
        return node

    image = key.copy().transform(over_v)
    q = exp.select(image).distinct().from_(exp.Values(expressions=rows, alias=_alias("__s", *names)))
    return q.where(image.copy().is_(exp.null()).not_())


def _linked(form: AnalysisForm, policy: Policy, start: frozenset[str]) -> tuple[list[str], list[exp.Expr]]:
    """The public uses linked to ``start`` through conjuncts that read public uses only (transitively), and those
    conjuncts; ``start``'s aliases first. A conjunct over an unlinked public table would only multiply the rows
    a DISTINCT over them reads (a cross product) without narrowing the keys."""
    public = {u.alias for u in form.uses if policy.table(u.table).public}
    candidates = [
        (c.expr, {r.alias for r in c.columns})
        for c in form.conjuncts
        if c.columns and {r.alias for r in c.columns} <= public and not c.expr.find(exp.Subquery, exp.Exists)
    ]
    aliases: dict[str, None] = dict.fromkeys(sorted(start))
    conjuncts: list[exp.Expr] = []
    grown = True
    while grown:
        grown = False
        for expr, reads in candidates:
            if not any(expr is c for c in conjuncts) and reads & aliases.keys():
                conjuncts.append(expr)
                aliases.update(dict.fromkeys(sorted(reads)))
                grown = True
    return list(aliases), conjuncts


def _distinct_tuples(form: AnalysisForm, policy: Policy, keys: Sequence[_PublicKey]) -> exp.Select:
    """``SELECT DISTINCT k1, …, km FROM <the public uses linked to the keys' uses> WHERE <the public conjuncts
    linking them> AND every ki IS NOT NULL [AND ki IN (its declared domain, its constants)]``.

    Every row of the query's product satisfies every conjunct, in particular those reading public uses only,
    so its keys' values form one of these tuples: a group outside the set is empty on every database with
    these public tables, whatever the private rows (the form is an inner product; semi- and anti-joins only
    remove rows). The set is a function of the public tables alone, so releasing a noisy value for each of its
    tuples, present in the private rows or not, is the same mechanism as over a declared domain (docs/sql.md,
    "Group domains from public tables"); a NULL key is never a group, as for one public column."""
    start = frozenset(a for k in keys for a in k.aliases)
    aliases, conjuncts = _linked(form, policy, start)
    q = exp.select(*(k.expr.copy() for k in keys)).distinct()
    for i, alias in enumerate(aliases):
        source = exp.to_table(form.use(alias).table).as_(alias)
        q = q.from_(source) if i == 0 else q.join(source, join_type="cross")
    for k in keys:
        q = q.where(k.expr.copy().is_(exp.null()).not_())
    for c in conjuncts:
        q = q.where(c.copy())
    for k in keys:
        if k.declared is not None:
            q = q.where(k.expr.copy().isin(*(_literal(v) for v in k.declared if v is not None)))
        if k.allowed is not None:  # PostgreSQL's own IN on the key: the same groups the query keeps
            q = q.where(k.expr.copy().isin(*(v.copy() for v in k.allowed)))
    return q


def _joint_domains(form: AnalysisForm, policy: Policy, catalog: Catalog | None) -> dict[int, KeyDomain]:
    """The joint domains of the GROUP BY keys computed from public uses: the keys whose uses are linked
    through conjuncts over public uses only (or are one use) form one part, and a part of two or more keys
    has the DISTINCT tuples of its public uses as groups (:func:`_distinct_tuples`), not the product of each
    key's values — TPC-DS's ``GROUP BY i_item_id, i_item_desc`` has the 1,356 pairs of its item rows, not
    900 × 1,347. Keys in parts that no public conjunct links (an item and a store, joined only through
    private sales) are independent: their product is the right domain, and that of the parts' DISTINCT
    tuples. Positions → domain, for the members of parts of two or more keys."""
    keys = {j: _public_key(form, policy, catalog, key) for j, key in enumerate(form.group_by)}
    public = {j: k for j, k in keys.items() if k is not None}
    parts: list[tuple[list[int], set[str]]] = []
    for j, k in public.items():
        reach = set(_linked(form, policy, k.aliases)[0])
        touching = [p for p in parts if p[1] & reach]
        merged = ([j], reach)
        for p in touching:
            parts.remove(p)
            merged = (sorted(merged[0] + p[0]), merged[1] | p[1])
        parts.append(merged)
    out: dict[int, KeyDomain] = {}
    for members, _ in parts:
        if len(members) < 2:
            continue
        query = _distinct_tuples(form, policy, [public[j] for j in members])
        for j in members:
            out[j] = KeyDomain(None, query, joint=tuple(members))
    return out


def _public_domain(
    form: AnalysisForm,
    policy: Policy,
    key: exp.Column,
    declared: tuple[object, ...] | None,
) -> exp.Select | None:
    """The groups of a public table's column when conjuncts over public tables alone restrict it (else None:
    the column's declared domain or all its values): its values those conjuncts let through — TPC-H Q5's
    n_name joined to region with r_name = 'ASIA' has 5 groups, not 25 — within the declared domain if any.

    Every row of the query's product satisfies every conjunct, in particular those reading public uses only,
    so its key value is among ``SELECT DISTINCT key FROM <those public uses> WHERE <those conjuncts>``: a
    group outside that set is empty on every database with these public tables, whatever the private rows
    (the form is an inner product; semi- and anti-joins only remove rows). The set reads public tables only,
    so releasing exactly its groups (each with noise, present in the data or not) reveals nothing private,
    as with the whole column (NR §3.3.10.4: the released set must not depend on private data). Fewer groups
    leave more budget per group or a larger β."""
    # only conjuncts linked to the key's table through other such conjuncts narrow its values (_linked)
    aliases, conjuncts = _linked(form, policy, frozenset({key.table}))
    if not conjuncts:
        return None
    q = exp.select(key.copy()).distinct()
    for i, alias in enumerate(aliases):
        source = exp.to_table(form.use(alias).table).as_(alias)
        q = q.from_(source) if i == 0 else q.join(source, join_type="cross")
    q = q.where(key.copy().is_(exp.null()).not_())
    for c in conjuncts:
        q = q.where(c.copy())
    if declared is not None:
        q = q.where(key.copy().isin(*(exp.convert(v) for v in declared if v is not None)))
    return q


# EXTRACT fields whose values form a set fixed by the calendar, whatever the data (PostgreSQL's documented
# ranges), and the column types PostgreSQL computes them for (EXTRACT(HOUR FROM a DATE) is an error)
EXTRACT_FIELDS: dict[str, tuple[range, frozenset[str]]] = {
    "MONTH": (range(1, 13), frozenset({"date", "timestamp"})),
    "QUARTER": (range(1, 5), frozenset({"date", "timestamp"})),
    "DAY": (range(1, 32), frozenset({"date", "timestamp"})),
    "DOW": (range(0, 7), frozenset({"date", "timestamp"})),
    "ISODOW": (range(1, 8), frozenset({"date", "timestamp"})),
    "DOY": (range(1, 367), frozenset({"date", "timestamp"})),
    "WEEK": (range(1, 54), frozenset({"date", "timestamp"})),
    "HOUR": (range(0, 24), frozenset({"timestamp"})),
    "MINUTE": (range(0, 60), frozenset({"timestamp"})),
}


def fixed_domain(form: AnalysisForm, catalog: Catalog, key: exp.Expr) -> tuple[object, ...] | None:
    """The groups of a key whose set of values the query text and the schema fix, whatever the data; None
    for any other key.

    * ``EXTRACT(f FROM d)`` of a DATE or TIMESTAMP column d for a field f of :data:`EXTRACT_FIELDS`: the
      calendar's values of f (months 1 … 12, quarters 1 … 4, days of the week 0 … 6, …), and NULL when d is
      nullable (EXTRACT of NULL is NULL; of ±infinity too, so on a NOT NULL column such rows fall in no
      released group). YEAR needs d's declared range (:func:`_date_domain`).
    * ``CASE WHEN c1 THEN k1 … [ELSE k0] END`` (or ``CASE x WHEN …``) whose every result is a constant, all
      strings or all numbers: the constants, in the order written, each once, and NULL when there is no ELSE
      (or ELSE NULL). The conditions may read any column of the row; each row is in exactly one group.

    As for a declared domain (NR §3.3.10.4), every group is released, with noise, even when no row has it, so
    the released set depends on the query and the schema only. A row is in one group, so whether the groups
    get parallel composition is decided as for any key computed from the private use's columns
    (sqldp.sensitivity.rows, ``_disjoint``). Under value-level privacy a
    changed value may move a row between groups: sqldp.sensitivity.columns refuses such keys over
    value-sensitive columns (``_group_slopes``)."""
    if isinstance(key, exp.Extract) and isinstance(key.expression, exp.Column) and key.expression.table:
        field = EXTRACT_FIELDS.get(key.this.name.upper())
        column = key.expression
        use = next((u for u in form.uses if u.alias == column.table), None)
        if field is None or use is None:
            return None
        info = catalog.table(use.table).column(column.name)
        kind = "timestamp" if info.type_sql.upper().startswith("TIMESTAMP") else info.kind
        if kind not in field[1]:
            return None
        return (*field[0], *((None,) if info.nullable else ()))
    if isinstance(key, exp.Case):
        results = [branch.args.get("true") for branch in key.args.get("ifs") or ()]
        default = key.args.get("default")
        literals = [r for r in results if isinstance(r, exp.Literal)]
        constant_default = default is None or isinstance(default, (exp.Literal, exp.Null))
        if not results or len(literals) != len(results) or not constant_default:
            return None
        if isinstance(default, exp.Literal):
            literals.append(default)
        if len({lit.is_string for lit in literals}) != 1:
            return None
        return (*listed_domain(literals), *((None,) if not isinstance(default, exp.Literal) else ()))
    return None


def date_key(key: exp.Expr) -> exp.Column | None:
    """The column d when a group key is ``EXTRACT(YEAR FROM d)`` or ``date_trunc('year' | 'month', d)`` (under the
    guard :func:`guard_date_trunc` writes), else None: a step function of d, constant on a calendar year or
    month and jumping at its first day, so a group is the rows whose d lies in one interval of days (NR
    §3.3.11: the key is a column derived from d)."""
    found = date_period(key)
    return None if found is None else found[0]


def date_period(key: exp.Expr) -> tuple[exp.Column, str, bool] | None:
    """(d, "year" or "month", whether the key is EXTRACT's number rather than a truncated date) for a date key
    (:func:`date_key`), else None. A bare ``date_trunc`` is recognised too; sqldp.sensitivity.failures refuses
    it (a date after the year 294276 is no timestamp, so PostgreSQL may fail on it), the guarded one it
    accepts."""
    year = isinstance(key, exp.Extract) and key.this.name.upper() in ("YEAR", "YEARS")
    if year and isinstance(key.expression, exp.Column) and key.expression.table:
        return key.expression, "year", True
    if isinstance(key, exp.Case) and len(key.args.get("ifs") or ()) == 1 and key.args.get("default") is None:
        branch = key.args["ifs"][0]
        inner = branch.args.get("true")
        found = _truncated(inner) if inner is not None else None
        return found if found is not None and date_guard(branch.this, found[0]) else None
    return _truncated(key)


def _truncated(key: exp.Expr) -> tuple[exp.Column, str, bool] | None:
    if isinstance(key, (exp.TimestampTrunc, exp.DateTrunc)) and isinstance(key.this, exp.Column) and key.this.table:
        unit = key.args.get("unit")
        name = unit.name.upper() if isinstance(unit, (exp.Var, exp.Literal)) else ""
        if name in ("YEAR", "YEARS", "MONTH", "MONTHS"):
            return key.this, "year" if name.startswith("YEAR") else "month", False
    return None


def date_guard(condition: exp.Expr, column: exp.Column) -> bool:
    """``column BETWEEN DATE 'a' AND DATE 'b'`` with a and b dates Python reads (years 1 … 9999): inside it
    ``date_trunc`` of the column cannot fail (a DATE of those years is a timestamp)."""
    return (
        isinstance(condition, exp.Between)
        and condition.this == column
        and _date_literal(condition.args.get("low")) is not None
        and _date_literal(condition.args.get("high")) is not None
    )


def guard_date_trunc(e: exp.Expr, declared: Callable[[exp.Column], tuple[dt.date, dt.date] | None]) -> exp.Expr:
    """``e`` with each ``date_trunc('year' | 'month', d)`` of a DATE column d with a declared range (``declared``
    gives it, None for any other column) run as ``CASE WHEN d BETWEEN first AND last THEN date_trunc(…, d)
    END``, first and last the first and last days of the periods the range spans: the same value for every
    row whose period is a group of the domain (:func:`_date_domain`), NULL — no group — for the others, and
    never PostgreSQL's "date out of range for timestamp" on a date beyond the year 294276, whose error would
    answer for the data. PostgreSQL evaluates a CASE branch only for the rows its condition holds for."""

    def guard(node: exp.Expr) -> exp.Expr:
        found = _truncated(node)
        if found is None or isinstance(node.parent, exp.If):
            return node
        column, unit, _ = found
        span = declared(column)
        if span is None:
            return node
        first, last = _period_start(span[0], unit), _period_end(span[1], unit)
        condition = exp.Between(this=column.copy(), low=_date(first), high=_date(last))
        return exp.Case(ifs=[exp.If(this=condition, true=node.copy())])

    return e.copy().transform(guard)


def _date(day: dt.date) -> exp.Expr:
    return exp.cast(exp.Literal.string(day.isoformat()), exp.DataType.Type.DATE)


def _period_start(day: dt.date, unit: str) -> dt.date:
    return dt.date(day.year, 1 if unit == "year" else day.month, 1)


def _period_end(day: dt.date, unit: str) -> dt.date:
    if unit == "year" or day.month == 12:
        return dt.date(day.year, 12, 31)
    return dt.date(day.year, day.month + 1, 1) - dt.timedelta(days=1)


def _date_domain(form: AnalysisForm, policy: Policy, key: exp.Expr) -> tuple[object, ...] | None:
    """``EXTRACT(YEAR FROM d)`` or ``date_trunc('year' | 'month', d)`` of a DATE column with a declared range:
    the years (as numbers), or the first days of the years or months, the range spans (NR §3.3.11: a derived
    column's domain follows from the constraints on the column it is computed from). Rows whose date lies
    outside the declared range fall in periods outside the domain and are never released; the set of
    released groups depends on the policy only. A truncated key is released as the DATE of its period's first
    day (PostgreSQL's ``date_trunc`` of a date gives that day's midnight as a timestamp with time zone)."""
    found = date_period(key)
    if found is None:
        return None
    column, unit, number = found
    declared = policy.table(form.use(column.table).table).column(column.name).range
    if declared is None:
        return None
    first = EPOCH + dt.timedelta(days=int(declared[0]))
    last = EPOCH + dt.timedelta(days=int(declared[1]))
    # constant bounds in WHERE narrow the periods further (TPC-H Q7: BETWEEN 1995-01-01 AND 1996-12-31), as an
    # IN list narrows a declared domain: the periods left out are empty whatever the data
    for c in form.conjuncts:
        e = c.expr
        if isinstance(e, exp.Between) and e.this == column:
            low, high = _date_literal(e.args.get("low")), _date_literal(e.args.get("high"))
            first, last = max(first, low or first), min(last, high or last)
        elif isinstance(e, (exp.GT, exp.GTE, exp.LT, exp.LTE)) and column in (e.this, e.expression):
            flipped = e.expression == column
            bound = _date_literal(e.this if flipped else e.expression)
            if bound is None:
                continue
            upper = isinstance(e, (exp.LT, exp.LTE)) != flipped  # column < bound, or bound > column
            if upper:
                last = min(last, bound)
            else:
                first = max(first, bound)
    if number:
        return tuple(range(first.year, last.year + 1))
    if unit == "year":
        return tuple(dt.date(y, 1, 1) for y in range(first.year, last.year + 1))
    months = range(first.year * 12 + first.month - 1, last.year * 12 + last.month)
    return tuple(dt.date(m // 12, m % 12 + 1, 1) for m in months)


def _date_literal(e: exp.Expr | None) -> dt.date | None:
    """A ``DATE '…'`` constant (after sqldp.dates folded the arithmetic), else None."""
    if isinstance(e, exp.Cast) and e.to.this == exp.DataType.Type.DATE and isinstance(e.this, exp.Literal):
        try:
            return dt.date.fromisoformat(e.this.name)
        except ValueError:
            return None
    return None


def _constant_filter(form: AnalysisForm, key: exp.Expr) -> list[exp.Literal] | None:
    """The literals a top-level conjunct restricts the group key to (the first such conjunct), or None:
    ``key IN (…)``, ``key = …``, or an OR each of whose branches does (alone or in an AND), as TPC-H Q7's
    ``(n1.n_name = 'FRANCE' AND n2.n_name = 'GERMANY') OR (n1.n_name = 'GERMANY' AND n2.n_name = 'FRANCE')``
    keeps n1.n_name and n2.n_name among {FRANCE, GERMANY}: a row passes the OR only through a branch that holds,
    and that branch puts its key among its literals, so among their union. A declared group the WHERE clause
    excludes by constants is always empty: dropping it depends on the query and the policy only, and saves its
    share of ε (TPC-H Q12's two ship modes of 7; Q7's 4 of 625 nation pairs, whose released histogram then
    allows a β 156 times larger, NR §3.3.10.4)."""
    for c in form.conjuncts:
        literals = _implied_literals(c.expr, key)
        if literals is not None:
            return literals
    return None


def _implied_literals(e: exp.Expr, key: exp.Expr) -> list[exp.Literal] | None:
    """Literals that ``key`` equals one of wherever ``e`` is true, or None when ``e`` does not say."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.In) and e.this == key and not e.args.get("query"):
        items = list(e.expressions)
    elif isinstance(e, exp.EQ) and e.this == key:
        items = [e.expression]
    elif isinstance(e, exp.EQ) and e.expression == key:
        items = [e.this]
    elif isinstance(e, exp.And):  # true only where every part is: any part that says is enough
        for part in e.flatten():
            found = _implied_literals(part, key)
            if found is not None:
                return found
        return None
    elif isinstance(e, exp.Or):  # true only where some branch is: every branch must say
        union: list[exp.Literal] = []
        for branch in e.flatten():
            found = _implied_literals(branch, key)
            if found is None:
                return None
            union += [v for v in found if all(v != u for u in union)]
        return union
    else:
        return None
    literals = [i for i in items if isinstance(i, exp.Literal)]
    return literals if items and len(literals) == len(items) else None


def _derived_key(key: exp.Expr) -> bool:
    """A group key computed from the columns of one row: no aggregate, window, subquery or parameter (the
    allow-list, sqldp.allowlist, admits no volatile function, and sqldp.sensitivity.failures refuses a key
    PostgreSQL may fail on, such as SUBSTRING with a negative length)."""
    if not any(c.table for c in key.find_all(exp.Column)):
        return False
    banned = (exp.AggFunc, exp.Window, exp.Subquery, exp.Exists, exp.Select, exp.Placeholder, exp.Parameter)
    return not any(isinstance(n, banned) for n in key.walk())


def listed_domain(literals: list[exp.Literal]) -> tuple[object, ...]:
    """The group domain a ``key IN (c1, …, ck)`` conjunct gives a key (TPC-H Q22's
    ``SUBSTRING(c_phone FROM 1 FOR 2) IN ('13', '31', …)``): the constants, in the order written, each once.

    NR §3.3.11 propagates constraints on attributes to the columns computed from them; here the constraint is
    the query's own: a row reaches the answer only if its key equals one of the constants, so every group the
    answer can hold is one of them, whatever the data, and the set of released groups depends on the query
    text alone. Each is released (with noise) even when no row has it, as a declared domain's groups are. Two
    constants PostgreSQL finds equal but Python does not (CHAR padding, numeric 1 and 1.0) are matched by
    :func:`match_groups`' first-match CASE: the second one is then always empty, which depends on the query
    only."""
    out: dict[object, None] = {}
    for lit in literals:
        if lit.is_string:
            out[lit.name] = None
            continue
        try:
            number = int(lit.name)
        except ValueError:
            number = float(lit.name)  # type: ignore[assignment]
        out[number] = None
    return tuple(out)


def _matches(value: object, literals: list[exp.Literal]) -> bool:
    """Whether a declared value equals one of the literals. Python's equality stands in for PostgreSQL's here;
    where they could differ (padding, collations) the group is kept or dropped by the query text and the
    policy alone, so either way nothing depends on the data, and a kept group is released with noise."""
    for lit in literals:
        if lit.is_string and str(value) == lit.name:
            return True
        if not lit.is_string and isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                if float(lit.name) == float(value):
                    return True
            except ValueError:
                continue
    return False


def all_groups(domains: list[tuple[object, ...]]) -> list[tuple[object, ...]]:
    """Every combination of key values, in a stable order."""
    return [tuple(g) for g in itertools.product(*domains)]


def part_groups(
    parts: Sequence[tuple[int, ...]], values: Sequence[Sequence[tuple[object, ...]]]
) -> list[tuple[object, ...]]:
    """Every group's key values in GROUP BY order: the product of the parts' groups (:func:`factors`,
    :func:`read_factors`), in the order of :func:`all_groups` over the parts."""
    order = [j for positions in parts for j in positions]
    out = []
    for combination in itertools.product(*values):
        key: list[object] = [None] * len(order)
        for j, v in zip(order, (v for part in combination for v in part), strict=True):
            key[j] = v
        out.append(tuple(key))
    return out


def match_groups(answer: exp.Select, domains: Sequence[KeyDomain]) -> exp.Select:
    """The answer query (keys ``__key<j>`` first) with, in front, the index of each part's group (:func:`factors`)
    in its domain (NULL: outside the domain, never released), decided by PostgreSQL's ``=`` on the key column's
    type.

    A declared value is an untyped literal (``__key0 = 'a'``), which PostgreSQL types as the key column, as
    if the analyst had written the comparison; ``CASE`` takes the first value that matches, so an answer row
    is one group even if two declared values were equal in PostgreSQL. A public domain is its DISTINCT values
    (tuples, for a joint domain) numbered in ORDER BY (the order the engine reads them in, in the same
    snapshot) and joined with ``=`` on every key of the part; its tuples are pairwise distinct under that
    ``=``, which is an equivalence on each key (two tuples that agree on every key are one), so a row matches
    one."""
    items: list[exp.Expr] = []
    select = exp.select().from_(exp.Subquery(this=answer.copy(), alias=_alias("__a")))
    for f, positions in enumerate(factors(domains)):
        d = domains[positions[0]]
        if d.values is not None:
            key = exp.column(f"__key{positions[0]}", table="__a")
            case = exp.Case()
            for i, v in enumerate(d.values):
                # the NULL group (fixed_domain): the rows whose key IS NULL, which no = matches
                match = key.copy().is_(exp.null()) if v is None else exp.EQ(this=key.copy(), expression=_literal(v))
                case = case.when(match, exp.Literal.number(i))
            items.append(exp.alias_(case, f"__group{f}"))
        else:
            assert d.query is not None
            names = _value_names(len(positions))
            number = exp.Window(this=exp.RowNumber(), order=_by_v(names))
            ranked = exp.select(exp.alias_(exp.Sub(this=number, expression=exp.Literal.number(1)), "i"), *names).from_(
                exp.Subquery(this=d.query.copy(), alias=_alias("__s", *names))
            )
            on = exp.and_(
                *(
                    exp.EQ(this=exp.column(f"__key{j}", table="__a"), expression=exp.column(v, table=f"__d{f}"))
                    for j, v in zip(positions, names, strict=True)
                )
            )
            select = select.join(exp.Subquery(this=ranked, alias=_alias(f"__d{f}")), on=on)
            items.append(exp.alias_(exp.column("i", table=f"__d{f}"), f"__group{f}"))
    return select.select(*items, exp.Column(this=exp.Star(), table=exp.to_identifier("__a")), copy=False)


def _value_names(n: int) -> list[str]:
    """The columns of a domain statement: ``v`` for one key (the statements of one-key domains keep their text),
    ``v0`` … for a joint domain's keys."""
    return ["v"] if n == 1 else [f"v{i}" for i in range(n)]


def _by_v(names: Sequence[str] = ("v",)) -> exp.Order:
    return exp.Order(expressions=[exp.Ordered(this=exp.column(n)) for n in names])


def _alias(name: str, *columns: str) -> exp.TableAlias:
    return exp.TableAlias(this=exp.to_identifier(name), columns=[exp.to_identifier(c) for c in columns])


def _literal(value: object) -> exp.Expr:
    """A declared domain value as SQL (the policy admits only these scalar types, sqldp.policy)."""
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, (int, float)):
        return exp.Literal.number(repr(value))
    if isinstance(value, (dt.date, dt.datetime, dt.time)):
        return exp.Literal.string(value.isoformat())
    return exp.Literal.string(str(value))
