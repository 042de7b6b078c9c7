"""Operational guards of the library and the CLI (docs/limits.md): how long a statement may run on
PostgreSQL, and how many rows PostgreSQL's planner may expect a step of a private query's statements to
produce before sqldp refuses it, uncharged. Both are per session (``sqldp.connect(statement_timeout=…,
max_estimated_rows=…)``, ``--statement-timeout``, ``--max-estimated-rows``); 0 or None: no limit. Kept apart
from sqldp.session so that the CLI can name the defaults in its help without importing the analyses."""

from __future__ import annotations

import math

from sqldp.errors import InputError

# seconds: TPC-H's statements at SF 1 run in seconds; a cross join the analysis lets through runs for hours
DEFAULT_STATEMENT_TIMEOUT = 300.0
# rows of one plan step: TPC-H's 22 queries at SF 0.01 expect at most 7.1·10⁵ (Q5's statements; ≈ 7·10⁸ at
# SF 10), a cross join of orders and lineitem at SF 0.01 expects 5.3·10⁸ and ran 36 s, one more table 10¹¹
DEFAULT_MAX_ESTIMATED_ROWS = 1e9


def check_limit(name: str, limit: object) -> None:
    """Refuse a limit that is not a finite number ≥ 0 (None: no limit) with a one-line InputError."""
    if limit is not None and not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0):
        raise InputError(f"{name} must be a finite number ≥ 0 (0: no limit), got {limit!r}", where=name)
