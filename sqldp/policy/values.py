"""Numbers and dates as a policy file writes them, checked the same way in every section.

Bounds and prior parameters are finite and within ±:data:`MAX_BOUND`; ISO dates count as days since
1970-01-01 (:data:`EPOCH`), the unit the sensitivity analysis measures dates in.
"""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from sqldp.errors import PolicyError

EPOCH = dt.date(1970, 1, 1)
MAX_BOUND = 2.0**63  # a value bound beyond BIGINT's range is a typo, and its square overflows the analyses


def is_number(v: Any) -> bool:
    """An int or float, not a bool (TOML's true is not 1)."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def to_number(value: Any, where: str) -> float:
    """A bound as a number; ISO dates become days since 1970-01-01 (dates count in days)."""
    if isinstance(value, bool):
        raise PolicyError(f"must be a number or an ISO date, got {value!r}", where=where)
    if isinstance(value, (int, float)):
        if not -MAX_BOUND <= value <= MAX_BOUND:  # also NaN
            raise PolicyError(f"must be a finite number within ±{MAX_BOUND:.3g}, got {value!r}", where=where)
        return float(value)
    if isinstance(value, dt.datetime):
        value = value.date()
    if isinstance(value, dt.date):
        return float((value - EPOCH).days)
    if isinstance(value, str):
        try:
            return float((dt.date.fromisoformat(value) - EPOCH).days)
        except ValueError:
            pass
    raise PolicyError(f"must be a number or an ISO date, got {value!r}", where=where)


def finite(v: Any, where: str) -> float:
    """A number within ±MAX_BOUND (NaN and ∞ are refused)."""
    if not is_number(v) or not -MAX_BOUND <= v <= MAX_BOUND:
        raise PolicyError(f"must be a finite number within ±{MAX_BOUND:.3g}, got {v!r}", where=where)
    return float(v)


def positive(value: Any, where: str, *, allow_zero: bool = False, upper: float | None = None) -> float:
    """A finite number > 0 (≥ 0 with ``allow_zero``), and < ``upper`` if given."""
    if not is_number(value):
        raise PolicyError(f"must be a number, got {value!r}", where=where)
    v = float(value)
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero) or (upper is not None and v >= upper):
        bound = f" and < {upper:g}" if upper is not None else ""
        raise PolicyError(f"must be {'≥' if allow_zero else '>'} 0{bound}, got {value!r}", where=where)
    return v


def fraction(v: Any, where: str) -> float:
    """A probability strictly between 0 and 1 (an advantage target, a membership prior)."""
    if not is_number(v) or not 0 < v < 1:
        raise PolicyError(f"must be a number in (0, 1), got {v!r}", where=where)
    return float(v)
