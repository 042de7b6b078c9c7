"""The analysed query: aggregates over private tables (the form of sqldp.normalize, one sensitivity plan per
aggregate, the rewriter's SQL), or a statement over public tables answered exactly — the last strategy, which
answers every statement the others pass over (or refuses it with the analyses' reason).

Its parts: a histogram of per-key counts compiles by :mod:`sqldp.strategies.nested`, groups owned by one private
row by :mod:`sqldp.strategies.owned`. :func:`analysed` is also what the other strategies call for their
sub-queries (a set operation's branch, a workflow's step, the public statements of a selection).
"""

from __future__ import annotations

import dataclasses
import time

from sqldp import sensitivity
from sqldp.catalog import Catalog
from sqldp.engine import Dialect
from sqldp.engine.postgres.dialect import POSTGRES
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm, single_aggregate
from sqldp.frontend import ParsedQuery, locate, parse
from sqldp.groups import KeyDomain, key_domains, partition_selection
from sqldp.normalize import PublicRelease, normalize
from sqldp.params import PrivacyParams, check_beta, resolve_params
from sqldp.policy import Policy
from sqldp.release import choose_truncation, declared_groups, shares, smoothed
from sqldp.rewrite import Statements, rewrite
from sqldp.runner import Prepared
from sqldp.sensitivity import unit_bounds
from sqldp.sensitivity.global_bound import declared_truncations
from sqldp.sensitivity.plan import Plan
from sqldp.sensitivity.units import grouped_answer, histograms
from sqldp.sqlgen import answer_query
from sqldp.strategies import nested, owned
from sqldp.strategies.base import Context, Privacy


def recognise(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Prepared:
    """Every statement: the last of :data:`sqldp.strategies.STRATEGIES`."""
    return analysed(parsed, context, privacy)


def analysed_text(sql: str, context: Context, privacy: Privacy) -> Prepared:
    """:func:`analysed` of a statement's text (a sub-query the other strategies built or cut out)."""
    return analysed(parse(sql, context.catalog), context, privacy)


def analysed(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Prepared:
    """The statement normalised, planned and rewritten at the privacy arguments, refusing what cannot be
    analysed; a statement over public tables only as the public path checked it. Reads no data."""
    t0 = time.perf_counter()
    sql, catalog, policy, dialect = parsed.sql, context.catalog, context.policy, context.dialect
    form = normalize(parsed, catalog, policy)
    if isinstance(form, PublicRelease):
        if dialect.translated:  # the checked statement in the engine's SQL, or refused before anything runs
            form = dataclasses.replace(form, checked_sql=dialect.public_statement(form.checked_sql, catalog, policy))
        return Prepared(context.engine, context.noise, sql, form, None, (), (), None, t0)
    params = resolve_params(policy, outputs=max(1, len(form.aggregates)), **privacy)
    if form.nested is not None:  # a histogram of per-key counts (sqldp.strategies.nested): its own plan and SQL
        form, domains, plans, statements = nested.compile_histogram(form, catalog, policy, params, dialect)
        return Prepared(context.engine, context.noise, sql, form, params, plans, domains, statements, t0)
    try:
        form = owned.own_selector(partition_selection(form, policy, params.delta), catalog, policy)
        domains, plans, statements = compile_form(form, catalog, policy, params.beta, dialect, params=params)
    except RefusedError as err:
        err.where = locate(sql, parsed.statement, err)  # a group key: where it is in the text
        raise
    if statements.notes:  # what the SQL that runs does beyond the query (a truncation): data-independent
        form = dataclasses.replace(form, notes=(*form.notes, *statements.notes))
    # every refusal that does not need the data happens here, before the proxy charges: a fixed β too
    # large for a measurement's ε share would otherwise fail at calibration, after the charge. A group
    # count read from a public table at run time is unknown here: those shares are checked again then.
    check_beta(params, smoothed(shares(form, params, plans, declared_groups(domains)), plans))
    return Prepared(context.engine, context.noise, sql, form, params, plans, domains, statements, t0)


def compile_form(
    form: AnalysisForm,
    catalog: Catalog,
    policy: Policy,
    beta: float | None,
    dialect: Dialect = POSTGRES,
    *,
    params: PrivacyParams | None = None,
    truncation: bool | None = None,
) -> tuple[tuple[KeyDomain, ...], tuple[Plan, ...], Statements]:
    """Everything decided before the data is read, refusing what cannot be analysed: the group domains, one
    sensitivity plan per aggregate (each aggregate is its own measurement) and the SQL that will run, in the
    engine's ``dialect``.

    Declared contribution bounds (``max_rows_per``, docs/truncation.md): when the query reads a declared key,
    the plans with the tables truncated to it are built too, and used — for every aggregate, since they share
    one answer query — when they give less expected noise at ``params`` (the policy's defaults when None), as
    :func:`sqldp.release.choose_truncation` decides from data-independent facts. ``truncation``: None to
    choose so, False never to truncate, True to truncate whenever the declarations give a global bound (the
    tests compare the truncated bound with its data)."""
    if form.nested is not None:  # a histogram of per-key counts: its own plan and SQL (sqldp.strategies.nested)
        d = policy.defaults
        nominal = params or PrivacyParams(d.epsilon or 1.0, d.delta, beta, d.mechanism, d.confidence)
        _, domains, plans, statements = nested.compile_histogram(form, catalog, policy, nominal, dialect)
        return domains, plans, statements
    domains = tuple(key_domains(form, policy, catalog))
    # partition selection whose group key fixes a private row (TPC-H Q10's customers, sqldp.strategies.owned): its own
    # plans; where one of its conditions fails, the count-based selection below may still answer
    try:
        found = owned.analyse(form, catalog, policy)
        unowned: RefusedError | None = None
    except RefusedError as err:
        found, unowned = None, err
    if found is not None:
        plans, statements = owned.compile_owned(form, found, domains, catalog, policy, beta, dialect)
        return domains, plans, statements
    try:
        plans = tuple(
            sensitivity.plan(single_aggregate(form, i), catalog, policy, beta) for i in range(len(form.aggregates))
        )
    except RefusedError:
        if unowned is not None:  # the query's groups are owned rows: why that analysis refused is the reason
            raise unowned from None
        raise
    plans = unit_bounds.agree(plans)  # a unit's declared bounds for every aggregate, or R2T for all
    choice = None
    # the same on every engine (the choice is data-independent and may not depend on where the data is): Spark
    # keeps the rows PostgreSQL keeps, or refuses the truncation with the reason (sqldp.rewrite.total_order)
    possible = form.select_by is None and truncation is not False
    cuts = declared_truncations(form, catalog, policy) if possible else ()
    if cuts:
        each = (single_aggregate(form, i) for i in range(len(plans)))
        alternative = [sensitivity.truncated(f, catalog, policy, cuts) for f in each]
        cut_plans = tuple(p for p in alternative if p is not None)
        if len(cut_plans) == len(plans):
            d = policy.defaults
            nominal = params or PrivacyParams(d.epsilon or 1.0, d.delta, beta, d.mechanism, d.confidence)
            choice = choose_truncation(form, plans, cut_plans, nominal, declared_groups(domains))
            if truncation is not None:
                choice = dataclasses.replace(choice, truncated=truncation)
            if choice.truncated:
                plans = cut_plans
    if form.select_by is not None:
        # partition selection (sqldp.groups.partition_selection) needs a count bound that holds on every
        # database and groups a neighbouring change touches one of; the other aggregates too (parallel
        # composition over groups whose number depends on the data)
        selector = plans[form.select_by]
        # where the groups are owned rows, why that analysis refused is the reason
        if not selector.data_independent:
            raise unowned or RefusedError(
                "DP partition selection (GROUP BY a private column without a declared domain, or SELECT DISTINCT) "
                "needs a count whose bound holds on every database, which this query has not (private rows join "
                "other private rows, or a filter reads value-sensitive columns)"
            )
        if not all(p.disjoint_groups for p in plans):
            raise unowned or RefusedError(
                "DP partition selection (GROUP BY a private column without a declared domain, or SELECT DISTINCT): "
                "a row of a private table can change several groups here, so the groups present in the data "
                "cannot be selected privately"
            )
    # a value-level plan may move private conjuncts into its aggregate (NR §3.3.8.4, q_m); the aggregates
    # share one answer query, so they must agree on what stays in WHERE
    wheres = [p.conjuncts for p in plans]
    if not wheres:  # normalize makes a GROUP BY without aggregates partition selection; nothing else has none
        raise RefusedError("the query measures no aggregate over the private tables it reads")
    if len({tuple(c.sql for c in w) for w in wheres}) > 1:
        raise RefusedError("the aggregates of this query need different continuous filters; ask them one by one")
    answer = answer_query(dataclasses.replace(form, aggregates=tuple(p.aggregate for p in plans), conjuncts=wheres[0]))
    grouped = histograms(plans)
    if grouped:
        # GROUP BY under a privacy unit: the answer carries the histograms truncated across groups (docs/units.md)
        assert len(grouped) == len(plans)  # one form: every aggregate reads the same unit's tables
        if not dialect.numeric_division_rounding:  # its rounding argument is PostgreSQL's NUMERIC division
            raise RefusedError("GROUP BY under a privacy unit runs on PostgreSQL only")  # (docs/units.md)
        answer = grouped_answer(form, grouped)
    statements = rewrite(form, answer, plans, domains, catalog, policy, dialect)
    if choice is not None:
        notes = (choice.note(statements.truncations),) if choice.truncated else ()
        statements = dataclasses.replace(statements, choice=choice.to_json(), notes=notes)
    declared = unit_bounds.notes(plans)  # a declared bound under a unit, not R2T's race (sensitivity.unit_bounds)
    if declared:
        statements = dataclasses.replace(statements, notes=(*statements.notes, *declared))
    return domains, plans, statements
