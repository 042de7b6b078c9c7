"""The plan contract every sensitivity analysis implements (pipeline step 3 of 6, docs/layout.md).

An analysis is a pure function from (analysis form, catalog, policy) to a plan; the plan carries its own bound,
as Tumult Core and OpenDP pair every transformation with its stability map. Nothing here touches a database:
the engine executes :attr:`Plan.queries` in the answer's snapshot and hands the result rows to
:meth:`Plan.bind`, which returns the β-smooth bound as a function of β (NR Def. 3.56; the release step
chooses β by NR Theorem 3.73).

R2T under a privacy unit (:mod:`sqldp.sensitivity.units`) implements this contract for what it shares with the
others — its SQL, the aggregate it releases, the conjuncts it keeps, folding into the answer's scan — but not
its noise: R2T releases the top of several noisy truncated answers, not one answer with noise scaled to one
bound, so the release step runs it as a mechanism of its own (:func:`sqldp.release.race`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sqlglot import exp

from sqldp.form import Aggregate, AnalysisForm, Conjunct

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


class ExactUnfolded:
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
