"""A session: a database, its catalog, a policy, a noise source and a privacy budget; the front door of the
library API (:func:`sqldp.connect`), the CLI and the proxy.

``prepare`` runs every step that reads no data — parse, then the first query strategy that recognises the
statement (sqldp.strategies: normalise, plan, rewrite) — and caches the result per query text; the compiled
query (:class:`sqldp.strategies.base.Compiled`) then runs on the session's engine and releases the answer.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqldp import budgets, strategies
from sqldp.catalog import Catalog
from sqldp.context import load_policy
from sqldp.db import connect
from sqldp.engine import Dialect
from sqldp.engine.base import Engine
from sqldp.errors import BudgetExhaustedError, InputError, RefusedError, SqldpError, TooLargeError
from sqldp.form import AnalysisForm
from sqldp.frontend import parse, token_key, too_deep
from sqldp.limits import DEFAULT_MAX_ESTIMATED_ROWS, check_limit
from sqldp.mechanisms import NoiseSource, zcdp_epsilon
from sqldp.policy import Policy
from sqldp.result import Result
from sqldp.runner import Prepared
from sqldp.strategies import Compiled, Context

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
        self._prepared: OrderedDict[tuple[object, ...], Compiled | SqldpError] = OrderedDict()
        self._cached_for: tuple[Policy, Catalog] = (self.policy, self.catalog)
        self._checked: set[str] = set()  # answer statements PostgreSQL's parse analysis accepted (check)
        self._ledgers: set[str] = set()  # per-row ledgers known to exist (run_budgeted)

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

    def prepare(self, sql: str, **privacy: Any) -> Compiled:
        """Parse, compile by the first strategy that recognises the statement (sqldp.strategies.compile: normalise,
        plan, resolve the privacy parameters), refusing what cannot be analysed. Reads no data: the proxy charges
        the analyst's budget between this and the compiled query's ``run``."""
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
                if alias is not None and not isinstance(alias, SqldpError) and alias.any_spelling:
                    cached = copy.copy(alias)
                    cached.sql = sql  # the result names the text as sent
                    self._prepared[key] = cached
        if isinstance(cached, SqldpError):
            raise copy.copy(cached)  # a fresh exception (its traceback starts here), the same message and place
        if cached is not None:
            fresh = copy.copy(cached)  # the same analysis (and statement speeds), its own timings
            fresh.started = t0
            return fresh
        prepared_under = (self.policy, self.catalog)
        try:
            prepared = self._compile(sql, **privacy)
            prepared.started = t0
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
            if tokens is not None and prepared.any_spelling:
                # only where the statements that run are generated from the tree (a public statement runs
                # as written; a workflow splices values into its own text at run time)
                self._prepared[(tokens, args)] = prepared
            while len(self._prepared) > PREPARED_CACHE:
                self._prepared.popitem(last=False)
        return prepared

    def cached(self, sql: str, **privacy: Any) -> Compiled | None:
        """The analysis :meth:`prepare` kept for exactly this text and these privacy arguments under the current
        policy and catalog, without parsing anything (a dictionary look-up: the proxy asks on its event loop);
        None when there is none (or a refusal was kept). The object is the cache's own: read it, never run it
        twice concurrently with a mutation (a :meth:`prepare` hands out copies). Only the analysis is kept, a
        function of the text, the arguments, the catalog and the policy: no figure computed from the data."""
        key = (sql, tuple(sorted(privacy.items())))
        with self._lock:
            if self._cached_for[0] is not self.policy or self._cached_for[1] is not self.catalog:
                return None
            got = self._prepared.get(key)
        return None if got is None or isinstance(got, SqldpError) else got

    def invalidate(self) -> None:
        """Forget every kept analysis and refusal: after a DDL or ``ANALYZE``-visible change the catalog does
        not show by a new object (replacing :attr:`catalog` or :attr:`policy`, a reload, empties it too)."""
        with self._lock:
            self._prepared.clear()
            self._checked.clear()

    def _compile(self, sql: str, **privacy: Any) -> Compiled:
        """The statement compiled by the first strategy that recognises it (sqldp.strategies.compile)."""
        return strategies.compile(parse(sql, self.catalog), self._context(), privacy)

    def _context(self) -> Context:
        """What the strategies compile against: the catalog and policy as they are now."""
        return Context(self.catalog, self.policy, self.engine, self.noise, self.dialect)

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
            params = prepared.params
            self._charge(params.epsilon, params.delta or 0.0, prepared.rho, prepared.longest)
        result = prepared.run()
        result.audit = audit
        return result

    def run_budgeted(self, sql: str, *, fallback: bool = False, on: dt.date | None = None, **privacy: Any) -> Result:
        """The noisy answer under per-row budgets (NR §3.3.12.7, docs/budgets.md): the rows of the budgeted
        table the query uses that have no room for its ε are excluded by the statement itself, the others are
        charged its ε in the same transaction as the answer (sqldp.budgets). The session's budget stays the
        outer limit and is charged as :meth:`run` charges it. A query outside the proven classes is refused
        with the reason, or, with ``fallback``, answered by :meth:`run` on the analyst-level account alone.
        ``on``: the date renewal is computed for (today, UTC, when None)."""
        prepared = self.prepare(sql, **privacy)
        try:
            if not isinstance(prepared, Prepared) or not isinstance(prepared.form, AnalysisForm):
                raise budgets.refused(
                    "only a single query (no set operation, workflow or selection) has per-row budgets"
                )
            assert prepared.params is not None and prepared.statements is not None
            if self.dsn is None:
                raise budgets.refused("per-row budgets live in PostgreSQL; this session runs on Spark")
            found = budgets.analyse(prepared.form, prepared.plans, prepared.statements, self.catalog, self.policy)
        except RefusedError:
            if fallback:
                return self.run(sql, **privacy)
            raise
        self.check(prepared)
        eps = prepared.params.epsilon
        limit = budgets.limit_on(found.budget, on or dt.datetime.now(dt.UTC).date())
        from sqldp.engine.postgres.engine import ChargedAnswer, ensure_ledger  # with psycopg: only on PostgreSQL

        name = budgets.ledger_name(found.table)
        if name not in self._ledgers:
            with connect(self.dsn) as owner:
                ensure_ledger(owner, name, budgets.ledger_ddl(found.table, found.key))
            self._ledgers.add(name)
        statement = budgets.charged_statement(prepared.statements.answer, found, eps, limit)
        self._charge(eps, prepared.params.delta or 0.0, prepared.rho, prepared.longest)
        # the PostgreSQL engine's own limit (its ``statement_timeout``, sqldp.engine.postgres.engine.PostgresEngine)
        engine = ChargedAnswer(self.dsn, name, getattr(self.engine, "statement_timeout", None))
        run = dataclasses.replace(
            prepared, engine=engine, statements=dataclasses.replace(prepared.statements, answer=statement)
        )
        result = run.run()
        result.notes.append(budgets.note(found, eps, limit))
        result.timings["ledger_transaction"] = engine.charge_seconds
        return result

    def budget_counts(self, sql: str, *, epsilon: float, on: dt.date | None = None, **privacy: Any) -> dict[str, Any]:
        """How many rows :meth:`run_budgeted` would charge for ``sql`` and how many it would exclude, released
        with Laplace noise at scale 1/``epsilon``: adding or removing one row of the budgeted table moves one of
        the two counts by one (a used row is either charged or excluded, by its own ledger row; the others' do
        not move: the pair's ℓ1 sensitivity is 1), a change inside a row moves neither (the used rows read no
        value-sensitive column, docs/budgets.md). The excluded rows have no per-row budget left, so the counts
        are charged to the session's analyst-level account, which covers every row; nothing is charged to the
        ledger. The query itself is not run."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise InputError(f"epsilon must be a finite number > 0, got {epsilon!r}", where="epsilon")
        prepared = self.prepare(sql, **privacy)
        if not isinstance(prepared, Prepared) or not isinstance(prepared.form, AnalysisForm) or self.dsn is None:
            raise budgets.refused("only a single query on PostgreSQL has per-row budgets")
        assert prepared.params is not None and prepared.statements is not None
        found = budgets.analyse(prepared.form, prepared.plans, prepared.statements, self.catalog, self.policy)
        limit = budgets.limit_on(found.budget, on or dt.datetime.now(dt.UTC).date())
        from sqldp.engine.postgres.engine import ensure_ledger, read_counts  # with psycopg: only on PostgreSQL
        from sqldp.mechanisms import laplace

        name = budgets.ledger_name(found.table)
        if name not in self._ledgers:
            with connect(self.dsn) as owner:
                ensure_ledger(owner, name, budgets.ledger_ddl(found.table, found.key))
            self._ledgers.add(name)
        self._charge(epsilon, 0.0, None, 1.0)
        charged, excluded = read_counts(self.dsn, name, budgets.counts_statement(found, prepared.params.epsilon, limit))
        scale = 1.0 / epsilon
        return {
            "table": found.table,
            "class": found.supported_class,
            "epsilon_per_row": prepared.params.epsilon,
            "limit": limit,
            "charged": laplace.sample(float(charged), scale, self.noise),
            "excluded": laplace.sample(float(excluded), scale, self.noise),
            "noise_scale": scale,
            "epsilon": epsilon,
        }

    def check(self, prepared: Compiled) -> None:
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
        texts = prepared.checks()  # a workflow's steps run statements of their own first
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
