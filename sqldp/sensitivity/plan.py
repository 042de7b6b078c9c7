"""The plan contract every sensitivity analysis implements (pipeline step 3 of 6, docs/layout.md).

An analysis is a pure function from (analysis form, catalog, policy) to a plan; the plan carries its own bound,
as Tumult Core and OpenDP pair every transformation with its stability map. Nothing here touches a database:
the engine executes :attr:`Plan.queries` in the answer's snapshot and hands the result rows to
:meth:`Plan.bind`, which returns the β-smooth bound as a function of β (NR Def. 3.56; the release step
chooses β by NR Theorem 3.73).

R2T under a privacy unit (:mod:`sqldp.sensitivity.units`) implements this contract for what it shares with the
others — its SQL, the aggregate it releases, the conjuncts it keeps, folding into the answer's scan — but not
its noise: R2T releases the top of several noisy truncated answers, not one answer with noise scaled to one
bound, so its plan names a mechanism of its own and makes its own measurement (:class:`Releasable`,
sqldp.mechanisms.race).

The release step and ``explain`` ask a plan which mechanism, on which bound, for which share
(:class:`Releasable`), never its class.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from sqlglot import exp

from sqldp.form import Aggregate, AnalysisForm, Conjunct
from sqldp.mechanisms.registry import CAUCHY, GAUSSIAN_GLOBAL, LAPLACE, LAPLACE_GLOBAL, Name

if TYPE_CHECKING:
    from sqldp.result import Measurement

Rows = Sequence[tuple[Any, ...]]  # one query's result rows


@dataclass(frozen=True)
class Bound:
    """A β-smooth sensitivity bound and where it came from: per table, JSON-ready terms."""

    sensitivity: float
    tables: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Plan(Protocol):
    """What the rewriter, the engine and the release step rely on, for one aggregate of one query.

    * ``queries`` run in the answer's snapshot; their results come back to ``bind`` in the same order.
    * ``aggregate`` is the aggregate actually released (e.g. SUM over clamped columns).
    * ``bind(results)`` reads the results once (all that does not depend on β) and returns β ↦ bound; the
      bound covers every group of a GROUP BY.
    * ``disjoint_groups``: a neighbouring change moves the answer and the bound of one group at most
      (parallel composition over the groups, NR §3.3.10.4).
    * ``key_moves``: a neighbouring change can move a row from one group to another (a group key reads a
      value-sensitive column), so the histogram's change is up to twice the bound in ℓ1.
    * ``data_independent``: the bound is the same on every neighbouring database (a global sensitivity);
      it then needs no smoothing and gets Laplace noise at bound/ε.
    * ``grid``: β values where the bound is exact (the value plan rounds other β down to them); the β
      search adds them to its family (NR Theorem 3.73).
    * ``conjuncts``: the answer query's WHERE, which a value-level plan may shrink by moving private
      conjuncts into its own aggregate (NR §3.3.8.4, q_m).
    * ``inline`` / ``grouped_scan`` / ``scan_conjuncts``: which queries scan the form's product under
      ``scan_conjuncts``, so the rewriter may compute them inside the answer's scan (one row each, or a MAX
      over a GROUP BY of that scan).
    """

    @property
    def aggregate(self) -> Aggregate: ...
    @property
    def queries(self) -> tuple[exp.Select, ...]: ...
    @property
    def disjoint_groups(self) -> bool: ...
    @property
    def key_moves(self) -> bool: ...
    @property
    def data_independent(self) -> bool: ...
    @property
    def grid(self) -> tuple[float, ...]: ...
    @property
    def conjuncts(self) -> tuple[Conjunct, ...]: ...
    @property
    def inline(self) -> tuple[bool, ...]: ...
    @property
    def grouped_scan(self) -> tuple[bool, ...]: ...
    @property
    def scan_conjuncts(self) -> tuple[Conjunct, ...]: ...

    def bind(self, results: Sequence[Rows]) -> Callable[[float], Bound]: ...

    # what the release step asks (Releasable has the defaults)
    @property
    def own_mechanism(self) -> Name | None: ...
    @property
    def spends_epsilon(self) -> bool: ...
    @property
    def global_bound(self) -> float | None: ...
    @property
    def bound_source(self) -> str | None: ...
    @property
    def owned_groups(self) -> int | None: ...
    @property
    def privacy_unit(self) -> dict[str, Any] | None: ...
    @property
    def declared_truncations(self) -> tuple[Any, ...]: ...
    @property
    def query_count(self) -> int: ...
    def expected_bound(self) -> float | None: ...
    def mechanism(self, chosen: Name, joint: bool) -> Name: ...
    def template(self, aggregate: str, rows: Sequence[Rows], eps: float) -> Measurement | None: ...


class Releasable:
    """What the release step and ``explain`` ask a plan, with the answers of a plan whose noise is calibrated to
    its bound (the defaults); a plan with a mechanism of its own (R2T), a global number or an ε-free selector
    says so by overriding them.

    * ``own_mechanism``: a mechanism the plan runs itself (R2T's race), None: noise scaled to ``bind``'s bound.
    * ``spends_epsilon``: False for a selector thresholded by δ alone (sqldp.strategies.owned): no ε share.
    * ``global_bound``: the number a global plan's bound is, known before the data (None: it is computed).
    * ``bound_source``: which global bound it is (released: from the query, the schema and the policy).
    * ``owned_groups``: how many groups owned by one row one change can add or remove (sqldp.strategies.owned).
    * ``privacy_unit``: what an analyst may see of the privacy unit (R2T).
    * ``declared_truncations``: the declared contribution bounds the bound relies on (sqldp.rewrite enforces).
    * ``expected_bound()``: the bound when it needs no query (the error to expect, shown before a run).
    * ``mechanism(chosen, joint)``: the one rule for the mechanism of the plan's measurements.
    * ``template(aggregate, rows, eps)``: the plan's own measurement (R2T), None: the release calibrates it.
    """

    @property
    def own_mechanism(self) -> Name | None:
        return None

    @property
    def spends_epsilon(self) -> bool:
        return True

    @property
    def global_bound(self) -> float | None:
        return None

    @property
    def bound_source(self) -> str | None:
        return None

    @property
    def owned_groups(self) -> int | None:
        return None

    @property
    def privacy_unit(self) -> dict[str, Any] | None:
        return None

    @property
    def declared_truncations(self) -> tuple[Any, ...]:
        return ()

    @property
    def query_count(self) -> int:
        return len(self.queries)  # type: ignore[attr-defined]

    def expected_bound(self) -> float | None:
        """A data-independent plan's bound when it reads nothing to compute it (one private table's COUNT, a
        SUM's clamp: no query), else None (a bound from public rows is read when the query runs)."""
        if self.data_independent and self.query_count == 0:  # type: ignore[attr-defined]
            return float(self.bind([])(0.0).sensitivity)  # type: ignore[attr-defined]
        return None

    def mechanism(self, chosen: Name, joint: bool) -> Name:
        """The mechanism the release gives this plan's measurements, from the query's shape, the policy and
        (ε, δ) only (what ``run``, ``analyze`` and ``explain`` name): the plan's own (R2T); the Gaussian vector
        when the query's global bounds are released as one (``joint``, sqldp.release.gaussian); Laplace on a
        data-independent bound; else the user's ``chosen`` smoothed mechanism, except that the smoothed Laplace
        keeps (ε·d, δ) only for bounded distances (sqldp.mechanisms.laplace.laplace_delta_at), so a bound that a
        value in a norm moves — any distance — gets generalized Cauchy, ε·d at every d (NR Theorem 3.53)."""
        if self.own_mechanism is not None:
            return self.own_mechanism
        if joint:
            return GAUSSIAN_GLOBAL
        if self.data_independent:  # type: ignore[attr-defined]
            return LAPLACE_GLOBAL
        distances = getattr(self, "change_distances", (math.inf,))  # fail closed, as sqldp.release does
        if chosen == LAPLACE and not all(math.isfinite(d) for d in distances):
            return CAUCHY
        return chosen

    def template(self, aggregate: str, rows: Sequence[Rows], eps: float) -> Measurement | None:
        return None


class ExactUnfolded(Releasable):
    """The contract's defaults for a plan whose bound is exact at every β (no grid) and whose queries the
    rewriter runs as they are (none folded into the answer's scan), with the form's WHERE as the answer's."""

    form: AnalysisForm
    key_moves: bool = False  # row-level plans: a row's group is fixed by its own values
    grid: tuple[float, ...] = ()
    inline: tuple[bool, ...] = ()
    grouped_scan: tuple[bool, ...] = ()
    scan_conjuncts: tuple[Conjunct, ...] = ()

    @property
    def conjuncts(self) -> tuple[Conjunct, ...]:
        return self.form.conjuncts
