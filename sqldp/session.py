"""A session: a database, its catalog, a policy, a noise source and a privacy budget; the front door of the
library API (:func:`sqldp.connect`), the CLI and the proxy.

``prepare`` runs every step that reads no data — parse, normalise, plan, rewrite — and caches the result per
query text; :class:`sqldp.runner.Prepared` then runs it on the session's engine and releases the answer.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp import allowlist, nested, owned, selection, sensitivity, setops, subqueries
from sqldp.catalog import Catalog
from sqldp.context import load_policy
from sqldp.engine import Dialect
from sqldp.engine.base import Engine
from sqldp.engine.postgres.dialect import POSTGRES
from sqldp.errors import BudgetExhaustedError, InputError, RefusedError, SqldpError, TooLargeError
from sqldp.form import AnalysisForm, single_aggregate
from sqldp.frontend import ParsedQuery, locate, parse, parse_statement, token_key, too_deep
from sqldp.groups import KeyDomain, key_domains, partition_selection
from sqldp.limits import DEFAULT_MAX_ESTIMATED_ROWS, check_limit
from sqldp.mechanisms import NoiseSource, zcdp_epsilon
from sqldp.normalize import PublicRelease, normalize, relations_read
from sqldp.params import PrivacyParams, check_beta, resolve_params
from sqldp.policy import Policy
from sqldp.release import choose_truncation, declared_groups, longest_change, shares, smoothed, zcdp
from sqldp.result import Result
from sqldp.rewrite import Statements, rewrite
from sqldp.runner import Prepared, Workflow
from sqldp.sensitivity.global_bound import GlobalPlan, declared_truncations
from sqldp.sensitivity.plan import Plan
from sqldp.sensitivity.units import UnitPlan, grouped_answer
from sqldp.setops import SetRelease
from sqldp.sqlgen import answer_query
from sqldp.subqueries import ScalarStep

if TYPE_CHECKING:  # psycopg costs ~0.1 s to import: not for the paths that read no database (explain)
    import psycopg

PREPARED_CACHE = 256  # analysed queries kept per session


class Session:
    """A connection-level handle: a database, its catalog and a policy."""

    def __init__(
        self,
        engine: Engine,
        policy: Policy | str | Path | None = None,
        *,
        catalog: Catalog,
        dsn: str | None = None,
        seed: int | None = None,
        budget: float | None = None,
        delta_budget: float | None = None,
        max_estimated_rows: float | None = DEFAULT_MAX_ESTIMATED_ROWS,
    ) -> None:
        """A session on a built ``engine`` (sqldp.engine.postgres.open, sqldp.engine.spark.open; sqldp.connect
        builds one from a DSN or a SparkSession) whose tables ``catalog`` describes. ``dsn``: the owner's
        PostgreSQL DSN where there is one (the budget ledger, sqldp.commands.budget)."""
        check_limit("max_estimated_rows", max_estimated_rows)
        # the planner's row estimate a private query may reach before it is refused uncharged (check); None or
        # 0: no limit
        self.max_estimated_rows = max_estimated_rows or None
        self.policy = load_policy(policy)
        self.engine = engine
        self.catalog = catalog
        self.policy.validate(self.catalog)
        self.dsn = dsn
        self.noise = NoiseSource.seeded(seed) if seed is not None else NoiseSource()
        # a privacy budget for this session's releases (sequential composition, NR §3.3.10.4): each run is
        # charged its ε (and δ) before anything is read, and refused when the budget does not cover it
        for name, value in (("budget", budget), ("delta_budget", delta_budget)):
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InputError(f"{name} must be a finite number ≥ 0, got {value!r}", where=name)
        self.budget, self.delta_budget = budget, delta_budget
        self.spent, self.delta_spent = 0.0, 0.0  # the runs' (ε, δ) added up (sequential composition)
        # the runs' ρ added up (zCDP, sqldp.release.zcdp), or None once a run spent δ that zCDP cannot express:
        # a second, often tighter, account of the same runs (see guarantee)
        self.rho_spent: float | None = 0.0
        # the longest distance of one neighbouring change among the runs' (sqldp.release.longest_change): the
        # zCDP account's ρ is per unit of distance and converts to (ε·d, δ) for d up to it (mechanisms.zcdp_epsilon)
        self.longest: float = 1.0
        self._lock = threading.Lock()
        # prepare() reads no data and depends only on the text, the privacy arguments, the catalog and the
        # policy, so a repeated query skips parsing and analysis; the proxy's connections share one session,
        # hence one cache. It holds for the policy and catalog it was filled under (_cached_for): replacing
        # either (a policy reload) empties it
        # (text or token stream (sqldp.frontend.token_key), privacy arguments) → the analysed statement, or the
        # refusal of one
        self._prepared: OrderedDict[
            tuple[object, ...], Prepared | Workflow | selection.Chosen | SetRelease | SqldpError
        ] = OrderedDict()
        self._cached_for: tuple[Policy, Catalog] = (self.policy, self.catalog)
        self._checked: set[str] = set()  # answer statements PostgreSQL's parse analysis accepted (check)

    @property
    def dialect(self) -> Dialect:
        """The SQL of the session's engine and what of PostgreSQL's meaning it keeps (sqldp.engine.Dialect)."""
        return self.engine.dialect

    @property
    def analyst_dsn(self) -> str | None:
        """The DSN the engine's statements run on (the analyst role's, sqldp.db.analyst_dsn), where the engine
        has one: a PostgreSQL engine's ``dsn``."""
        dsn = getattr(self.engine, "dsn", None)
        return dsn if isinstance(dsn, str) else None

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection]:
        """An autocommit, read-only connection as the analyst role (sqldp.engine.base.Engine.connection: the
        PostgreSQL engine's; an InputError on an engine without one)."""
        with self.engine.connection() as conn:
            yield conn

    def close(self) -> None:
        self.engine.close()

    def prepare(self, sql: str, **privacy: Any) -> Prepared | Workflow | selection.Chosen | SetRelease:
        """Parse, normalise, plan and resolve the privacy parameters, refusing what cannot be analysed.
        Reads no data: the proxy charges the analyst's budget between this and :meth:`Prepared.run`."""
        t0 = time.perf_counter()
        args = tuple(sorted(privacy.items()))
        key: tuple[object, ...] = (sql, args)
        with self._lock:
            if self._cached_for[0] is not self.policy or self._cached_for[1] is not self.catalog:
                self._prepared.clear()
                self._cached_for = (self.policy, self.catalog)
            cached = self._prepared.get(key)
            if cached is not None:
                self._prepared.move_to_end(key)
        tokens = token_key(sql) if cached is None else None
        if tokens is not None:  # the same statement spelt with other whitespace: the same analysis
            with self._lock:
                current = self._cached_for[0] is self.policy and self._cached_for[1] is self.catalog
                alias = self._prepared.get((tokens, args)) if current else None
                if isinstance(alias, Prepared):
                    cached = dataclasses.replace(alias, sql=sql)  # the result names the text as sent
                    self._prepared[key] = cached
        if isinstance(cached, SqldpError):
            raise copy.copy(cached)  # a fresh exception (its traceback starts here), the same message and place
        if cached is not None:
            return dataclasses.replace(cached, started=t0)
        prepared_under = (self.policy, self.catalog)
        try:
            prepared = self._prepare(sql, t0, **privacy)
        except RecursionError:  # the parser bounds depth; this is the last line should an analysis still recurse
            raise too_deep() from None  # not kept: how deep Python may recurse depends on the calling thread
        except (RefusedError, InputError) as refusal:
            # a refusal is as much a function of the text, privacy arguments, catalog and policy as an analysis
            # (a DatabaseError is not: the database may answer next time); kept under the exact text only, since
            # its message may point into it
            with self._lock:
                if self._cached_for[0] is prepared_under[0] and self._cached_for[1] is prepared_under[1]:
                    self._prepared[key] = refusal
                    while len(self._prepared) > PREPARED_CACHE:
                        self._prepared.popitem(last=False)
            raise
        with self._lock:
            if self._cached_for[0] is not prepared_under[0] or self._cached_for[1] is not prepared_under[1]:
                return prepared  # the policy or catalog changed meanwhile: not kept under the new one
            self._prepared[key] = prepared
            if tokens is not None and isinstance(prepared, Prepared) and not prepared.public:
                # only where the statements that run are generated from the tree (a public statement runs
                # as written; a workflow splices values into its own text at run time)
                self._prepared[(tokens, args)] = prepared
            while len(self._prepared) > PREPARED_CACHE:
                self._prepared.popitem(last=False)
        return prepared

    def _prepare(self, sql: str, t0: float, **privacy: Any) -> Prepared | Workflow | selection.Chosen | SetRelease:
        parsed = parse(sql, self.catalog)
        top = setops.set_operation(parsed.statement) if parsed.statement is not None else None
        if top is not None and any(not self.policy.table(t).public for t in relations_read(top, self.catalog)):
            # UNION / INTERSECT / EXCEPT of queries over private tables: each branch released, the set
            # operation on the released rows (sqldp.setops); over public tables only it runs exactly as written
            assert parsed.statement is not None
            allowlist.check(sql, parsed.statement)
            return setops.prepare(
                sql,
                top,
                privacy,
                lambda text: parse(text, self.catalog),
                self.engine.check,
                lambda branch, share: self._analysed(branch, time.perf_counter(), **share),
                lambda n: resolve_params(self.policy, outputs=n, **privacy),
                t0,
            )
        chosen = self._selection(parsed, t0, **privacy)
        if chosen is not None:
            return chosen
        steps = subqueries.scalar_steps(parsed, self.catalog)
        if steps:
            # a workflow only where the statement itself reads a private table: one over public tables whose
            # subquery reads a private one stays refused (its rows would be public rows picked by a released
            # value — DP, but the public path answers exact statements only; tests/frontend/test_public_path.py)
            placeholder = self._placeholder(sql, steps)
            outer = relations_read(parse_statement(placeholder), self.catalog)
            if any(not self.policy.table(t).public for t in outer):
                return self._workflow(parsed, steps, placeholder, t0, **privacy)
        return self._analysed(parsed, t0, **privacy)

    def _selection(self, parsed: ParsedQuery, t0: float, **privacy: Any) -> selection.Chosen | None:
        """Public rows selected by private data (sqldp.selection: TPC-H Q20 and Q15 shapes): the
        whole statement passes the allow-list as the public path checks it; None for another shape."""

        def public(text: str) -> Prepared:
            return self._analysed(parse(text, self.catalog), time.perf_counter())

        found: selection.Chosen | None = None
        for prepare in (selection.prepare, selection.prepare_argmax):
            found = prepare(parsed, self.catalog, self.policy, self.engine, self.noise, public, t0, **privacy)
            if found is not None:
                break
        if found is not None:
            assert parsed.statement is not None
            allowlist.check(parsed.sql, parsed.statement)
        return found

    def _analysed(self, parsed: ParsedQuery, t0: float, **privacy: Any) -> Prepared:
        sql = parsed.sql
        form = normalize(parsed, self.catalog, self.policy)
        if isinstance(form, PublicRelease):
            if self.dialect.translated:  # the checked statement in the engine's SQL, or refused before anything runs
                form = dataclasses.replace(
                    form, checked_sql=self.dialect.public_statement(form.checked_sql, self.catalog, self.policy)
                )
            return Prepared(self.engine, self.noise, sql, form, None, (), (), None, t0)
        params = resolve_params(self.policy, outputs=max(1, len(form.aggregates)), **privacy)
        if form.nested is not None:  # a histogram of per-key counts (sqldp.nested): its own plan and SQL
            form, domains, plans, statements = nested.compile_histogram(
                form, self.catalog, self.policy, params, self.dialect
            )
            return Prepared(self.engine, self.noise, sql, form, params, plans, domains, statements, t0)
        try:
            form = owned.own_selector(partition_selection(form, self.policy, params.delta), self.catalog, self.policy)
            domains, plans, statements = compile_form(
                form, self.catalog, self.policy, params.beta, self.dialect, params=params
            )
        except RefusedError as err:
            err.where = locate(sql, parsed.statement, err)  # a group key: where it is in the text
            raise
        if statements.notes:  # what the SQL that runs does beyond the query (a truncation): data-independent
            form = dataclasses.replace(form, notes=(*form.notes, *statements.notes))
        # every refusal that does not need the data happens here, before the proxy charges: a fixed β too
        # large for a measurement's ε share would otherwise fail at calibration, after the charge. A group
        # count read from a public table at run time is unknown here: those shares are checked again then.
        check_beta(params, smoothed(shares(form, params, plans, declared_groups(domains)), plans))
        return Prepared(self.engine, self.noise, sql, form, params, plans, domains, statements, t0)

    @staticmethod
    def _placeholder(sql: str, steps: tuple[ScalarStep, ...]) -> str:
        """The statement with 1 in place of each step (from the last, so earlier spans stay put)."""
        for step in sorted(steps, key=lambda s: -s.start):
            sql = step.splice(sql, 1.0)
        return sql

    def _workflow(
        self, parsed: ParsedQuery, steps: tuple[ScalarStep, ...], placeholder_sql: str, t0: float, **privacy: Any
    ) -> Workflow:
        """A statement with uncorrelated scalar subqueries as a workflow (sqldp.runner.Workflow): each subquery
        analysed as a query of its own, the statement analysed with 1 in their places, everything before the
        data is read. The split rule (docs/subqueries.md): every measurement of the statement — each step's
        aggregates and the statement's own — gets an equal share of ε (and δ), as the aggregates of one query
        do (sequential composition, NR §3.3.10.4); a step over public tables only is exact and costs nothing."""
        sql = parsed.sql
        assert parsed.statement is not None
        allowlist.check(sql, parsed.statement)  # the whole statement, as the public path checks it

        def analysed(text: str, share: Mapping[str, Any]) -> Prepared:
            return self._analysed(parse(text, self.catalog), time.perf_counter(), **share)

        def scalar(p: Prepared, step: ScalarStep) -> Prepared:
            form = p.form
            if isinstance(form, AnalysisForm) and (form.group_by or len(form.outputs) != 1 or form.distinct_rows):
                raise RefusedError("a scalar subquery must return one value: one output, no GROUP BY", where=step.where)
            return p

        first = [scalar(analysed(step.sql, privacy), step) for step in steps]
        whole = analysed(placeholder_sql, privacy)
        counts = [0 if p.public else len(p.form.aggregates) for p in (*first, whole)]  # type: ignore[union-attr]
        total = sum(counts)
        if not total:
            raise RefusedError("the statement reads private tables, but no step of it measures anything")
        params = resolve_params(self.policy, outputs=total, **privacy)
        shares = tuple(params.epsilon * c / total for c in counts)

        def share(c: int) -> dict[str, Any]:
            out = {k: v for k, v in privacy.items() if k != "advantage"}
            out["epsilon"] = params.epsilon * c / total
            out["delta"] = params.delta * c / total if params.delta else None
            return out

        prepared = tuple(
            (step, p if p.public else analysed(step.sql, share(c)))
            for step, p, c in zip(steps, first, counts, strict=False)
        )
        outer_share = share(counts[-1]) if counts[-1] else privacy
        placeholder = analysed(placeholder_sql, outer_share)
        return Workflow(sql, params, prepared, placeholder, lambda text: analysed(text, outer_share), shares, t0)

    def analyze(self, sql: str, *, audit: bool = True, **privacy: Any) -> Result:
        """The data owner's analysis: sensitivity and noise scale from the data, nothing released. With
        ``audit=False``, the plan only: nothing is read (what an analyst may see, as ``sqldp analyze``)."""
        prepared = self.prepare(sql, **privacy)
        if audit and not prepared.public:  # it runs the statements a release would: the same checks first
            self.check(prepared)
        return prepared.analyze() if audit else prepared.describe()

    def cost(self, sql: str, **privacy: Any) -> tuple[float, float]:
        """What running ``sql`` would spend, (ε, δ), without reading anything (0 for public data): the
        preview of SmartNoise's ``get_privacy_cost``."""
        params = self.prepare(sql, **privacy).params
        return (0.0, 0.0) if params is None else (params.epsilon, params.delta or 0.0)

    @property
    def remaining(self) -> tuple[float | None, float | None]:
        """(ε, δ) left of the session's budget by :meth:`guarantee`; None where no budget was set."""
        spent, delta_spent = self.guarantee()
        eps = None if self.budget is None else self.budget - spent
        delta = None if self.delta_budget is None else self.delta_budget - delta_spent
        return eps, delta

    def guarantee(self) -> tuple[float, float]:
        """The (ε, δ) the session's runs together are DP with: the tighter in ε of the two accounts that fit
        the budget (the sequential one, else the least ε)."""
        options = self._accounts(self.spent, self.delta_spent, self.rho_spent, self.longest)
        fitting = [o for o in options if self._fits(*o)] or options
        return min(fitting, key=lambda o: o[0])

    def _accounts(self, eps: float, delta: float, rho: float | None, longest: float) -> list[tuple[float, float]]:
        """(ε, δ) pairs that each hold for the whole session, as (ε·d, δ) for one change at distance d:
        sequential composition (Dwork & Roth Thm 3.16), and — when every run is ρ-zCDP — the sum of the ρ's
        (Bun and Steinke, TCC 2016, Lemma 2.3, adaptive) converted at δ′ (their Prop. 1.3) for changes up to the
        runs' ``longest`` distance (sqldp.mechanisms.zcdp_epsilon): δ′ the δ budget if set, else the δ the runs
        were charged, so that the session's δ never exceeds what was allowed or accepted. Every input is
        data-independent."""
        options = [(eps, delta)]
        tail = self.delta_budget if self.delta_budget is not None else delta
        if rho is not None and rho > 0 and tail > 0 and math.isfinite(longest):
            options.append((zcdp_epsilon(rho, tail, longest), tail))
        return options

    def _fits(self, eps: float, delta: float) -> bool:
        over_eps = self.budget is not None and eps > self.budget * (1 + 1e-12)
        over_delta = self.delta_budget is not None and delta > self.delta_budget * (1 + 1e-12)
        return not (over_eps or over_delta)

    def run(self, sql: str, *, audit: bool = False, **privacy: Any) -> Result:
        """The noisy answer; ``audit=True`` makes its serialisation carry the data-dependent figures too. With a
        session budget the query's (ε, δ) is charged first, and a query the budget does not cover is refused
        before anything is read; a charged query that then fails stays charged (its failure is an answer)."""
        prepared = self.prepare(sql, **privacy)
        if prepared.params is not None:
            # PostgreSQL's parse analysis first (reads no row), as the proxy does: a statement it rejects on its
            # text and the schema alone (COUNT(SUM(x)), a type error in WHERE) is a free StatementError, not a
            # charged failure
            self.check(prepared)
            # a workflow's steps are charged sequentially only (their ρ is not added up)
            rho = (
                zcdp(prepared.form, prepared.params, prepared.plans)
                if isinstance(prepared, Prepared) and isinstance(prepared.form, AnalysisForm)
                else prepared.rho
                if isinstance(prepared, (selection.Selection, selection.Argmax))
                else None
            )
            longest = (
                longest_change(prepared.plans)
                if isinstance(prepared, Prepared) and isinstance(prepared.form, AnalysisForm)
                else self.policy.longest_change
            )
            self._charge(prepared.params.epsilon, prepared.params.delta or 0.0, rho, longest)
        result = prepared.run()
        result.audit = audit
        return result

    def check(self, prepared: Prepared | Workflow | selection.Chosen | SetRelease) -> None:
        """Have the engine parse and type the statements a private query will run, without reading a row
        (:meth:`sqldp.engine.base.Engine.check`); raises :class:`sqldp.errors.StatementError` for one it
        rejects. Then, where the engine's planner estimates rows (PostgreSQL), refuse them with
        :class:`sqldp.errors.TooLargeError` when the planner expects a step of more rows than
        ``max_estimated_rows`` (EXPLAIN, nothing run). That estimate comes from the statistics of the private
        tables: an operational guard of whoever holds the session (the data owner's side, docs/output.md "What
        each output field reveals"), a refusal before any charge, never an analyst's figure. Once per answer
        text while the session lives (the schema is the one the catalog was read from)."""
        statements = prepared.statements
        if statements is None:
            return
        with self._lock:
            if statements.answer in self._checked:
                return
        texts = statements.all()
        if isinstance(prepared, Workflow):  # each scalar subquery's step runs statements of its own first
            steps = (p.statements for _, p in prepared.steps if not p.public and p.statements is not None)
            texts = [*texts, *(t for s in steps for t in s.all())]
        self.engine.check(texts)
        # an engine without a planner estimate (Spark) has no such guard (sqldp.engine.base.Engine.largest_estimate)
        estimate = self.engine.largest_estimate(texts) if self.max_estimated_rows is not None else None
        if estimate is not None and self.max_estimated_rows is not None:
            rows, at = estimate
            if rows > self.max_estimated_rows:
                which = "its answer statement" if at == 0 else f"its statement {at + 1} of {len(texts)}"
                raise TooLargeError(
                    f"PostgreSQL's planner expects a step of {rows:.3g} rows in {which}, over this session's "
                    f"limit of {self.max_estimated_rows:.3g} (max_estimated_rows, --max-estimated-rows; 0: no "
                    "limit); nothing was run or charged"
                )
        with self._lock:
            if len(self._checked) >= PREPARED_CACHE:
                self._checked.clear()
            self._checked.add(statements.answer)

    def _charge(self, eps: float, delta: float, rho: float | None = None, longest: float = 1.0) -> None:
        """Charge a run's (ε, δ) (and ρ, None where it is not ρ-zCDP; ``longest``, the longest distance of one
        change that moves its answer); refuse it when no account of the session with it fits the budget."""
        with self._lock:
            total = None if rho is None or self.rho_spent is None else self.rho_spent + rho
            reach = max(self.longest, longest)
            accounts = self._accounts(self.spent + eps, self.delta_spent + delta, total, reach)
            if not any(self._fits(*o) for o in accounts):
                left = self.remaining
                raise BudgetExhaustedError(
                    f"the query costs ε = {eps:g}, δ = {delta:g}; the session's budget has ε = {left[0]}, "
                    f"δ = {left[1]} left (None: no limit)",
                    where="budget",
                )
            self.spent += eps
            self.delta_spent += delta
            self.rho_spent = total
            self.longest = reach


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
    if form.nested is not None:  # a histogram of per-key counts: its own plan and SQL (sqldp.nested)
        d = policy.defaults
        nominal = params or PrivacyParams(d.epsilon or 1.0, d.delta, beta, d.mechanism, d.confidence)
        _, domains, plans, statements = nested.compile_histogram(form, catalog, policy, nominal, dialect)
        return domains, plans, statements
    domains = tuple(key_domains(form, policy, catalog))
    # partition selection whose group key fixes a private row (TPC-H Q10's customers, sqldp.owned): its own
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
    choice = None
    # the same on every engine (the choice is data-independent and may not depend on where the data is): Spark
    # keeps the rows PostgreSQL keeps, or refuses the truncation with the reason (sqldp.rewrite.total_order)
    possible = form.select_by is None and truncation is not False
    cuts = declared_truncations(form, catalog, policy) if possible else ()
    if cuts:
        each = (single_aggregate(form, i) for i in range(len(plans)))
        alternative = [sensitivity.truncated(f, catalog, policy, cuts) for f in each]
        cut_plans = tuple(p for p in alternative if isinstance(p, GlobalPlan))
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
    histograms = [p for p in plans if isinstance(p, UnitPlan) and p.histogram]
    if histograms:
        # GROUP BY under a privacy unit: the answer carries the histograms truncated across groups (docs/units.md)
        assert len(histograms) == len(plans)  # one form: every aggregate reads the same unit's tables
        if not dialect.numeric_division_rounding:  # its rounding argument is PostgreSQL's NUMERIC division
            raise RefusedError("GROUP BY under a privacy unit runs on PostgreSQL only")  # (docs/units.md)
        answer = grouped_answer(form, histograms)
    statements = rewrite(form, answer, plans, domains, catalog, policy, dialect)
    if choice is not None:
        notes = (choice.note(statements.truncations),) if choice.truncated else ()
        statements = dataclasses.replace(statements, choice=choice.to_json(), notes=notes)
    return domains, plans, statements
