"""What every query strategy shares: the :class:`Context` it is given and the :class:`Compiled` query it returns.

A strategy recognises one shape of statement and compiles it — everything decided before the data is read: the
privacy parameters, the plans, the statements — into an object the session, the proxy and the CLI use through
:class:`Compiled` alone, whatever the shape: they check its statements, charge its (ε, δ) and ρ, and run it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqldp.catalog import Catalog
from sqldp.engine import Dialect
from sqldp.engine.base import Engine
from sqldp.frontend import ParsedQuery
from sqldp.mechanisms import NoiseSource
from sqldp.params import PrivacyParams
from sqldp.policy import Policy
from sqldp.result import Result
from sqldp.rewrite import Statements

Privacy = Mapping[str, Any]  # the privacy arguments of a query (epsilon, delta, advantage, …: resolve_params)


@dataclass(frozen=True)
class Context:
    """What a strategy compiles against: the session's catalog and policy (as they are when the query is
    prepared), the engine its statements will run on, its ``dialect`` (sqldp.engine.Dialect: what the
    strategies ask of the engine's SQL, never its name), and the noise
    source of its releases. Strategies read data through nothing else, and only when the compiled query runs."""

    catalog: Catalog
    policy: Policy
    engine: Engine
    noise: NoiseSource
    dialect: Dialect


class Compiled(Protocol):
    """A query compiled by a strategy; nothing has been read yet.

    ``params`` is what running it spends (None: public data, answered exactly and free); ``rho`` the ρ it adds to
    a session's zCDP account (None where it is not expressed as ρ-zCDP: then that account stops), ``longest`` the
    longest distance of one neighbouring change it was calibrated for (sqldp.release.longest_change). The
    ``statements`` are its answer statements (None: none to check), the key of a session's once-per-text check,
    and :meth:`checks` every text the engine parses and types before the charge (a workflow's steps too)."""

    sql: str  # the statement as sent
    started: float  # time.perf_counter() when its preparation began: the result's timings count from it

    @property
    def params(self) -> PrivacyParams | None: ...

    @property
    def public(self) -> bool: ...

    @property
    def statements(self) -> Statements | None: ...

    @property
    def rho(self) -> float | None: ...

    @property
    def longest(self) -> float: ...

    @property
    def any_spelling(self) -> bool:
        """Whether the statements that run are generated from the parsed tree, not the text as sent: the same
        compiled query then answers the statement spelt with other whitespace (sqldp.frontend.token_key)."""
        ...

    def checks(self) -> list[str]: ...

    def noisy(self) -> tuple[bool, ...] | None:
        """Per output column, whether it is released with noise (the proxy describes those as FLOAT8); None
        where the strategy does not say (the columns are then described as PostgreSQL types them)."""
        ...

    def run(self) -> Result: ...

    def analyze(self) -> Result: ...

    def describe(self) -> Result: ...


class Strategy(Protocol):
    """One shape of statement (a module of this package): its compiled query, or None for another shape (the
    next strategy decides). A statement of the shape that cannot be analysed is refused with the reason."""

    def recognise(self, parsed: ParsedQuery, context: Context, privacy: Privacy) -> Compiled | None: ...
