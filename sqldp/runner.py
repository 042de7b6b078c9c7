"""A prepared query and its run: the pipeline's last two steps put together (docs/layout.md).

:class:`Prepared` holds what the aggregate strategy (:mod:`sqldp.strategies.aggregate`) decided without reading
data — the form, the privacy parameters, one sensitivity plan per aggregate and the SQL the rewriter produced.
``run`` hands the SQL to the engine (one snapshot for the answer and its sensitivity), the rows to the release
step (composition, calibration, noise, post-processing) and returns the :class:`~sqldp.result.Result`.

Composition (NR §3.3.10.4): the k aggregates of a query are k measurements and share ε equally, and δ
equally among those that spend it (sequential composition). The groups of a GROUP BY are answered with the
full share when every private table's row can touch at most one group (parallel composition, disjoint
groups) and with share/m otherwise.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from sqldp import release
from sqldp.engine.base import Engine, Speed
from sqldp.form import AnalysisForm
from sqldp.groups import KeyDomain, factors, read_factors
from sqldp.mechanisms import NoiseSource
from sqldp.normalize import PublicRelease
from sqldp.params import PrivacyParams
from sqldp.result import Result
from sqldp.rewrite import Statements
from sqldp.sensitivity.plan import Plan


@dataclass
class Prepared:
    """A query that passed the analyses, with its privacy parameters; nothing has been read yet."""

    engine: Engine
    noise: NoiseSource
    sql: str
    form: AnalysisForm | PublicRelease
    params: PrivacyParams | None  # None: public data, answered exactly
    plans: tuple[Plan, ...]  # one sensitivity plan per aggregate
    domains: tuple[KeyDomain, ...]
    statements: Statements | None  # None for public data
    started: float
    # how long the statements took last time; shared by the copies the session's cache hands out
    speed: Speed = field(default_factory=Speed)

    @property
    def public(self) -> bool:
        return isinstance(self.form, PublicRelease)

    @property
    def any_spelling(self) -> bool:
        """Its statements are generated from the tree, except a public statement's, which runs as written."""
        return not self.public

    @property
    def rho(self) -> float | None:
        """The ρ of its zCDP account (sqldp.release.zcdp); None for public data."""
        if not isinstance(self.form, AnalysisForm) or self.params is None:
            return None
        return release.zcdp(self.form, self.params, self.plans)

    @property
    def longest(self) -> float:
        """The longest distance of one change that moves its answer (sqldp.release.longest_change)."""
        return release.longest_change(self.plans)

    def checks(self) -> list[str]:
        return self.statements.all() if self.statements is not None else []

    def noisy(self) -> tuple[bool, ...] | None:
        if not isinstance(self.form, AnalysisForm):
            return None
        return tuple(not o.is_key for o in self.form.outputs)

    def analyze(self) -> Result:
        """The data owner's analysis (audit mode): reads the data, releases nothing."""
        result = self._execute(noisy=False)
        result.audit = True
        return result

    def describe(self) -> Result:
        """What ``analyze`` may show an analyst: the plan and the data-independent figures. Reads nothing —
        not even the sensitivity queries, whose outcome (a bound, or a refusal of an unbounded one) depends on
        the data and would leave without noise and without a charge."""
        result = Result(self.sql, self.params, public=self.public, notes=list(getattr(self.form, "notes", [])))
        if isinstance(self.form, AnalysisForm) and self.params is not None:
            result.plan = release.describe(self.form, self.params, self.plans, self.domains)
        return result

    def run(self) -> Result:
        return self._execute(noisy=True)

    def _execute(self, *, noisy: bool) -> Result:
        if isinstance(self.form, PublicRelease):
            return self._public(self.form, noisy)
        form, params, statements = self.form, self.params, self.statements
        assert params is not None and statements is not None
        t_plan = time.perf_counter()
        fetched = self.engine.execute(statements, self.speed)
        answer_rows, results = self._split(form, statements, fetched.answer, fetched.queries)
        # each independent part of the group domain: one key's values, or a joint domain's tuples
        parts = factors(self.domains, extras=True)  # a group's tuple: its keys, then each key expression
        domain_values = read_factors(self.domains, fetched.domains)
        result = Result(self.sql, params, test_mode=self.noise.test_mode, notes=list(form.notes))
        result.grouped = bool(form.group_by)
        # under partition selection every aggregate has disjoint groups (checked when prepared): full shares
        groups = math.prod(len(v) for v in domain_values) if form.group_by and form.select_by is None else 1
        made = release.templates(form, params, self.plans, results, groups)
        keys, result.measurements = release.measure(form, made, answer_rows, domain_values, parts)
        if noisy:
            release.release(form, result, keys, self.noise)
        result.timings = {
            "analysis": t_plan - self.started,
            "answer_query": fetched.answer_seconds,
            "sensitivity_queries": fetched.queries_seconds,
            "total": time.perf_counter() - self.started,
        }
        return result

    def _split(
        self, form: AnalysisForm, statements: Statements, answer_rows: list[Any], flat: list[Any]
    ) -> tuple[list[Any], list[list[Any]]]:
        """The answer rows and, per plan, its queries' rows: a folded query's one row is cut out of the answer's
        (sqldp.rewrite.fold), the others in plan order, a text asked by several plans read once."""
        columns = statements.columns or (None,) * len(statements.order)
        # a query merged with others over one scan (sqldp.rewrite.merge_scans): its columns of the one row
        flat = [
            flat[j] if cut is None else [tuple(flat[j][0][cut[0] : cut[1]])]
            for j, cut in zip(statements.order, columns, strict=True)
        ]
        if statements.folded:  # one row (no GROUP BY): the answer's aggregates, then the folded queries' items
            row = answer_rows[0]
            for i in sorted(statements.folded):
                start, stop = statements.folded[i]
                flat.insert(i, [tuple(row[start:stop])])
            answer_rows = [row[: len(form.aggregates)]]
        results = []
        for plan in self.plans:
            # a row or value plan builds its statements' trees at each ``queries``: count them without
            size = plan.query_count
            results.append(flat[:size])
            del flat[:size]
        return answer_rows, results

    def _public(self, form: PublicRelease, noisy: bool) -> Result:
        result = Result(form.sql, None, public=True, notes=[f"reads only public tables: {', '.join(form.tables)}"])
        if noisy:
            # the statement as sqldp checked it (allow-list, relations read), regenerated from its tree
            result.columns, rows = self.engine.execute_public(form.checked_sql or form.sql)
            result.rows = [dict(zip(result.columns, r, strict=True)) for r in rows]
            result.released = True
        result.timings = {"total": time.perf_counter() - self.started}
        return result
