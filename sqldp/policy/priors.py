"""A column's ``knowledge``: the attacker's prior knowledge of one attribute (NR §3.3.11.1, the grammar of
Fig. 44), as the policy states it.

A policy states it per column as ``knowledge = { kind = "…", … }``:

==================  ==========================================  ============================================
kind                keys                                        meaning
==================  ==========================================  ============================================
``exact``           ``value``                                   the attacker already knows the value
``range``           ``lo``, ``hi``                              in [lo, hi], distribution unknown (worst case)
``set``             ``values``                                  one of the values, distribution unknown
``range_uniform``   ``lo``, ``hi``                              uniform on [lo, hi]
``set_uniform``     ``values`` or ``size``                      each of k values equally likely
``set_prior``       ``values``, ``weights``                     value i with probability ∝ weights[i]
``range_prior``     ``pieces = [[lo, hi, weight], …]``          piecewise uniform, mass ∝ weight per piece
``normal``          ``mu``, ``sigma``                           N(μ, σ²), effective range μ ± 3√2σ
``unknown``         (none)                                      nothing known: the worst-case prior
==================  ==========================================  ============================================

Bounds may be ISO dates (they become days since 1970-01-01, :func:`sqldp.policy.values.to_number`).

This module parses and checks it into a :class:`Knowledge` (what values are possible, with which weights);
the probabilities the guessing-advantage conversion needs from it are computed by :class:`sqldp.priors.Prior`.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any

from sqldp.errors import PolicyError
from sqldp.policy.keys import check_keys
from sqldp.policy.values import finite, is_number, to_number

KINDS = ("exact", "range", "set", "range_uniform", "set_uniform", "set_prior", "range_prior", "normal", "unknown")
NORMAL_REACH = 3 * math.sqrt(2)  # NR §3.3.10.1: μ ± 3√2σ covers erf(3) ≈ 0.9999779 of the mass
KEYS: dict[str, set[str]] = {  # per kind, besides ``kind`` itself
    "exact": {"value"},
    "range": {"lo", "hi"},
    "set": {"values"},
    "range_uniform": {"lo", "hi"},
    "set_uniform": {"values", "size"},  # one of the two, checked below
    "set_prior": {"values", "weights"},
    "range_prior": {"pieces"},
    "normal": {"mu", "sigma"},
    "unknown": set(),
}

Interval = tuple[float, float]


@dataclass(frozen=True)
class Knowledge:
    """One attribute's prior as stated. ``values``/``weights`` describe discrete kinds, ``pieces`` continuous
    ones (piecewise uniform ``(lo, hi, mass)``; a normal keeps ``mu``/``sigma``)."""

    kind: str
    values: tuple[Any, ...] = ()
    weights: tuple[float, ...] = ()
    pieces: tuple[tuple[float, float, float], ...] = ()
    mu: float = 0.0
    sigma: float = 0.0
    size: int = 0  # set_uniform given by size only

    @property
    def discrete(self) -> bool:
        return self.kind in ("exact", "set", "set_uniform", "set_prior")

    @property
    def known_distribution(self) -> bool:
        return self.kind not in ("range", "set", "unknown")

    @property
    def numeric(self) -> bool:
        """Values are numbers, so a precision radius makes sense."""
        if self.kind in ("range", "range_uniform", "range_prior", "normal"):
            return True
        return bool(self.values) and all(is_number(v) for v in self.values)

    def support(self) -> Interval | None:
        """[low, high] of the values in value units (the normal's effective range); None if unknown."""
        if self.kind in ("range", "range_uniform", "range_prior"):
            return (min(p[0] for p in self.pieces), max(p[1] for p in self.pieces))
        if self.kind == "normal":
            return (self.mu - NORMAL_REACH * self.sigma, self.mu + NORMAL_REACH * self.sigma)
        if self.values and self.numeric:
            nums = [float(v) for v in self.values]
            return (min(nums), max(nums))
        return None

    def diameter(self) -> float | None:
        """R in value units: the largest distance between two possible values."""
        s = self.support()
        return None if s is None else s[1] - s[0]

    def describe(self) -> str:
        if self.kind in ("range", "range_uniform"):
            return f"{self.kind}({self.pieces[0][0]:g}, {self.pieces[0][1]:g})"
        if self.kind == "normal":
            return f"normal(μ={self.mu:g}, σ={self.sigma:g})"
        if self.kind == "set_uniform" and not self.values:
            return f"set_uniform(size={self.size})"
        if self.kind == "range_prior":
            return f"range_prior({len(self.pieces)} pieces)"
        if self.values:
            return f"{self.kind}({len(self.values)} values)"
        return self.kind


UNKNOWN = Knowledge("unknown")


def parse_knowledge(spec: Any, where: str) -> Knowledge:
    """Parse ``{ kind = "range_uniform", lo = 0, hi = 60 }`` and friends; every key is checked."""
    if not isinstance(spec, dict):
        raise PolicyError('must be a table such as { kind = "range_uniform", lo = 0, hi = 60 }', where=where)
    kind = spec.get("kind")
    if kind not in KINDS:
        raise PolicyError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", where=f"{where}.kind")
    required = set() if kind == "set_uniform" else KEYS[kind]
    check_keys(spec, KEYS[kind] | {"kind"}, required, where, what=f"kind {kind!r}")

    if kind == "unknown":
        return UNKNOWN
    if kind == "exact":
        return Knowledge("exact", values=(_value(spec["value"], f"{where}.value"),), weights=(1.0,))
    if kind in ("range", "range_uniform"):
        lo, hi = to_number(spec["lo"], f"{where}.lo"), to_number(spec["hi"], f"{where}.hi")
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo >= hi:
            raise PolicyError(f"needs finite lo < hi, got lo={spec['lo']!r}", where=f"{where}.hi")
        return Knowledge(kind, pieces=((lo, hi, 1.0),))
    if kind == "normal":
        mu, sigma = finite(spec["mu"], f"{where}.mu"), finite(spec["sigma"], f"{where}.sigma")
        if sigma <= 0:
            raise PolicyError(f"must be > 0, got {spec['sigma']!r}", where=f"{where}.sigma")
        return Knowledge("normal", mu=mu, sigma=sigma)
    if kind == "range_prior":
        return _range_prior(spec["pieces"], f"{where}.pieces")
    if kind == "set_uniform" and "size" in spec:
        if "values" in spec:
            raise PolicyError("give either values or size, not both", where=f"{where}.size")
        size = spec["size"]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise PolicyError(f"must be a positive integer, got {size!r}", where=f"{where}.size")
        return Knowledge("set_uniform", size=size)
    if kind == "set_uniform" and "values" not in spec:
        raise PolicyError("kind 'set_uniform' needs 'values' or 'size'", where=f"{where}.values")
    values = _values(spec["values"], f"{where}.values")
    if kind == "set_prior":
        weights = spec["weights"]
        w = f"{where}.weights"
        if not isinstance(weights, list) or len(weights) != len(values):
            raise PolicyError(f"must be a list of {len(values)} numbers, one per value", where=w)
        ws = [finite(x, w) for x in weights]
        if any(x < 0 for x in ws):
            raise PolicyError("weights must be ≥ 0 and not all 0", where=w)
        total = _total(ws, w)
        return Knowledge("set_prior", values=values, weights=tuple(x / total for x in ws))
    k = len(values)
    return Knowledge(kind, values=values, weights=tuple(1.0 / k for _ in values), size=k)


def _value(v: Any, where: str) -> Any:
    if isinstance(v, str):
        try:
            return to_number(v, where)  # an ISO date
        except PolicyError:
            return v
    if is_number(v):
        return to_number(v, where)  # finite and bounded: NaN ≠ NaN would pass the distinctness check
    if hasattr(v, "isoformat"):
        return to_number(v, where)
    raise PolicyError(f"must be a number, a string or a date, got {v!r}", where=where)


def _values(raw: Any, where: str) -> tuple[Any, ...]:
    if not isinstance(raw, list) or not raw:
        raise PolicyError("must be a non-empty list of values", where=where)
    vals = tuple(_value(v, where) for v in raw)
    if len(set(vals)) != len(vals):
        raise PolicyError("values must be distinct", where=where)
    return vals


def _total(weights: list[float], where: str) -> float:
    """The sum the weights are normalised by: positive and finite (1e308 + 1e308 = ∞ made every weight 0)."""
    total = math.fsum(weights)
    if not 0 < total < math.inf:
        raise PolicyError("weights must be ≥ 0, not all 0, and sum to a finite number", where=where)
    return total


def _range_prior(raw: Any, where: str) -> Knowledge:
    if not isinstance(raw, list) or not raw:
        raise PolicyError("must be a non-empty list of [lo, hi, weight]", where=where)
    pieces = []
    for i, piece in enumerate(raw):
        w = f"{where}[{i}]"
        if not isinstance(piece, list) or len(piece) != 3:
            raise PolicyError("must be [lo, hi, weight]", where=w)
        lo, hi, m = to_number(piece[0], w), to_number(piece[1], w), finite(piece[2], w)
        if not lo < hi or m < 0:
            raise PolicyError(f"needs lo < hi and weight ≥ 0, got {piece!r}", where=w)
        pieces.append((lo, hi, m))
    pieces.sort()
    for (_, hi, _), (lo, _, _) in itertools.pairwise(pieces):
        if lo < hi:
            raise PolicyError("pieces must not overlap", where=where)
    total = _total([m for _, _, m in pieces], where)
    return Knowledge("range_prior", pieces=tuple((lo, hi, m / total) for lo, hi, m in pieces))


def parse_cli_prior(text: str, where: str = "--prior") -> Knowledge:
    """The command line's short form: ``range_uniform:0:60``, ``set_uniform:5``, ``normal:2000:235.7``,
    ``set_prior:0.2,0.1,0.25`` (weights of anonymous values), ``range:0:60``, ``unknown``."""
    kind, _, rest = text.partition(":")
    args = rest.split(":") if rest else []
    try:
        if kind in ("range", "range_uniform") and len(args) == 2:
            return parse_knowledge({"kind": kind, "lo": float(args[0]), "hi": float(args[1])}, where)
        if kind == "normal" and len(args) == 2:
            return parse_knowledge({"kind": kind, "mu": float(args[0]), "sigma": float(args[1])}, where)
        if kind == "set_uniform" and len(args) == 1:
            return parse_knowledge({"kind": kind, "size": int(args[0])}, where)
        if kind == "set_prior" and len(args) == 1:
            ws = [float(x) for x in args[0].split(",")]
            return parse_knowledge({"kind": kind, "values": [f"v{i}" for i in range(len(ws))], "weights": ws}, where)
        if kind == "unknown" and not args:
            return UNKNOWN
    except ValueError:
        pass
    raise PolicyError(
        f"cannot read prior {text!r} (use range_uniform:LO:HI, range:LO:HI, normal:MU:SIGMA, set_uniform:K, "
        "set_prior:W1,W2,… or unknown)",
        where=where,
    )
