"""Uncorrelated scalar subqueries over private tables, as a workflow (NR §3.2.1.1, §3.3.13.9; docs/subqueries.md):
each subquery is a step, an analysed query of its own released with noise from its share of ε, and the statement
then runs with the released values in its place — post-processing of DP values (Dwork & Roth, "The Algorithmic
Foundations of Differential Privacy", Prop. 2.1), so its analysis treats them as public constants.

A workflow only where the statement itself reads a private table: one over public tables whose subquery reads a
private one stays refused (its rows would be public rows picked by a released value — DP, but the public path
answers exact statements only; tests/frontend/test_public_path.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from sqldp import allowlist, subqueries
from sqldp.errors import RefusedError
from sqldp.form import AnalysisForm
from sqldp.frontend import ParsedQuery, parse_statement
from sqldp.normalize import PublicRelease, relations_read
from sqldp.params import PrivacyParams, resolve_params
from sqldp.postprocess import evaluate
from sqldp.result import Result
from sqldp.rewrite import Statements
from sqldp.runner import Prepared
from sqldp.strategies.aggregate import analysed_text
from sqldp.strategies.base import Context, Privacy
from sqldp.subqueries import ScalarStep


@dataclass
class Workflow:
    """A statement with uncorrelated scalar subqueries as a workflow (module docstring). Sequential composition:
    the shares add up to the statement's ε (and δ), which ``params`` carries and a session or the proxy charges
    before anything is read.

    ``placeholder`` is the statement analysed with each subquery replaced by 1: what is refused before the charge
    (its shape, tables, policy) is refused there; :meth:`outer` analyses the statement again with the released
    values, which may refuse what depends on them (a division by a released 0) — after the charge, on DP values
    only."""

    sql: str
    params: PrivacyParams  # the statement's total ε and δ: the steps' and the outer query's shares added
    steps: tuple[tuple[ScalarStep, Prepared], ...]
    placeholder: Prepared
    context: Context
    outer_share: Privacy  # the privacy arguments the outer statement is analysed at
    shares: tuple[float, ...]  # ε of each step, then of the outer query
    started: float

    public = False
    any_spelling = False  # the released values are spliced into the text as sent
    rho = None  # a workflow's steps are charged sequentially only (their ρ is not added up)

    @property
    def form(self) -> AnalysisForm | PublicRelease:
        return self.placeholder.form

    @property
    def statements(self) -> Statements | None:
        return self.placeholder.statements

    @property
    def longest(self) -> float:
        return self.context.policy.longest_change

    def checks(self) -> list[str]:
        """The statement's (with 1 in the steps' places) and each private step's: each runs statements of its own."""
        return [*self.placeholder.checks(), *(t for _, p in self.steps if not p.public for t in p.checks())]

    def noisy(self) -> tuple[bool, ...] | None:
        return self.placeholder.noisy()

    def outer(self, text: str) -> Prepared:
        """The statement with the steps' values spliced in, analysed at its share."""
        return analysed_text(text, self.context, self.outer_share)

    def run(self) -> Result:
        return self._execute(noisy=True)

    def analyze(self) -> Result:
        """Audit mode: each step's and the statement's figures, the statement analysed with the steps' true
        values (nothing is released)."""
        result = self._execute(noisy=False)
        result.audit = True
        return result

    def describe(self) -> Result:
        result = self.placeholder.describe()
        result.params = self.params
        result.steps = [p.describe() for _, p in self.steps]
        result.notes = [*self._notes(), *result.notes]
        return result

    def _notes(self) -> list[str]:
        out = []
        for (step, prepared), eps in zip(self.steps, self.shares, strict=False):
            how = "evaluated exactly (public tables only)" if prepared.public else f"released with ε = {eps:g}"
            out.append(f"scalar subquery at {step.where}: a workflow step, {how}; its value is a constant of the query")
        return out

    def _execute(self, *, noisy: bool) -> Result:
        text = self.sql
        results = []
        # spliced from the last to the first, so the earlier spans stay where they are
        for step, prepared in sorted(self.steps, key=lambda s: -s[0].start):
            got = prepared.run() if noisy or prepared.public else prepared.analyze()  # public: exact anyway
            text = step.splice(text, _scalar(got, prepared, step, noisy))
            results.append(got)
        outer = self.outer(text)
        result = outer.run() if noisy else outer.analyze()
        result.sql = self.sql
        result.params = self.params
        result.steps = results[::-1]
        result.notes = [*self._notes(), *result.notes]
        result.timings["total"] = time.perf_counter() - self.started
        return result


def _scalar(result: Result, prepared: Prepared, step: ScalarStep, noisy: bool) -> float | None:
    """The one value a step gave: its released value (in audit mode its true one, which the data owner's
    analysis may read); a public subquery's exact value."""
    if result.public:
        if len(result.columns) != 1 or len(result.rows) > 1:
            raise RefusedError("a scalar subquery must return one column and at most one row", where=step.where)
        value = result.rows[0][result.columns[0]] if result.rows else None
    elif noisy:
        value = result.answer
    else:
        assert isinstance(prepared.form, AnalysisForm)
        (output,) = (o for o in prepared.form.outputs if not o.is_key)
        value = evaluate(output.expr, [m.true_value for m in result.measurements[0]])
    return None if value is None else float(value)


def placeholder(sql: str, steps: tuple[ScalarStep, ...]) -> str:
    """The statement with 1 in place of each step (from the last, so earlier spans stay put)."""
    for step in sorted(steps, key=lambda s: -s.start):
        sql = step.splice(sql, 1.0)
    return sql


def recognise(parsed: ParsedQuery, context: Context, privacy: Privacy) -> Workflow | None:
    """The workflow of a statement with uncorrelated scalar subqueries that reads a private table itself (module
    docstring), None for another statement."""
    steps = subqueries.scalar_steps(parsed, context.catalog)
    if not steps:
        return None
    text = placeholder(parsed.sql, steps)
    if all(context.policy.table(t).public for t in relations_read(parse_statement(text), context.catalog)):
        return None
    return workflow(parsed, steps, text, context, privacy)


def workflow(
    parsed: ParsedQuery, steps: tuple[ScalarStep, ...], placeholder_sql: str, context: Context, privacy: Privacy
) -> Workflow:
    """Each subquery analysed as a query of its own, the statement analysed with 1 in their places, everything
    before the data is read. The split rule (docs/subqueries.md): every measurement of the statement — each step's
    aggregates and the statement's own — gets an equal share of ε (and δ), as the aggregates of one query do
    (sequential composition, NR §3.3.10.4); a step over public tables only is exact and costs nothing."""
    t0 = time.perf_counter()
    sql = parsed.sql
    assert parsed.statement is not None
    allowlist.check(sql, parsed.statement)  # the whole statement, as the public path checks it

    def scalar(p: Prepared, step: ScalarStep) -> Prepared:
        form = p.form
        if isinstance(form, AnalysisForm) and (form.group_by or len(form.outputs) != 1 or form.distinct_rows):
            raise RefusedError("a scalar subquery must return one value: one output, no GROUP BY", where=step.where)
        return p

    first = [scalar(analysed_text(step.sql, context, privacy), step) for step in steps]
    whole = analysed_text(placeholder_sql, context, privacy)
    counts = [0 if p.public else len(p.form.aggregates) for p in (*first, whole)]  # type: ignore[union-attr]
    total = sum(counts)
    if not total:
        raise RefusedError("the statement reads private tables, but no step of it measures anything")
    params = resolve_params(context.policy, outputs=total, **privacy)
    shares = tuple(params.epsilon * c / total for c in counts)

    def share(c: int) -> dict[str, Any]:
        out = {k: v for k, v in privacy.items() if k != "advantage"}
        out["epsilon"] = params.epsilon * c / total
        out["delta"] = params.delta * c / total if params.delta else None
        return out

    prepared = tuple(
        (step, p if p.public else analysed_text(step.sql, context, share(c)))
        for step, p, c in zip(steps, first, counts, strict=False)
    )
    outer_share = share(counts[-1]) if counts[-1] else privacy
    placeholder_prepared = analysed_text(placeholder_sql, context, outer_share)
    return Workflow(sql, params, prepared, placeholder_prepared, context, outer_share, shares, t0)
