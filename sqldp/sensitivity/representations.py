"""The values the scalar analyses compute per expression node, in a module of their own so that the table of
operators (sqldp.sensitivity.operators) can name them without importing the analyses that import it: ``Ops``,
the representation of sensitivity bounds (sqldp.sensitivity.expressions, NR §3.3.8 Table 10); ``Value``, what a
number-valued node can be on PostgreSQL (sqldp.sensitivity.failures); ``Linear``, a linear form of columns
(sqldp.sensitivity.filters)."""

from __future__ import annotations

import decimal
import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Protocol

from sqlglot import exp

from sqldp.form import ColumnRef

_ZERO = decimal.Decimal(0)


class Ops(Protocol):
    def const(self, v: float) -> Any: ...
    def column(self, ref: ColumnRef, node: exp.Column) -> Any: ...
    def sensitive(self, ref: ColumnRef, node: exp.Column, floor: float) -> Any: ...
    def add(self, a: Any, b: Any) -> Any: ...
    def mul(self, a: Any, b: Any) -> Any: ...
    def greatest(self, parts: list[Any]) -> Any: ...
    def least(self, parts: list[Any]) -> Any: ...
    def power(self, a: Any, r: float) -> Any: ...  # a^r of a non-negative bound, r > 0
    def norm(self, parts: list[Any], p: float) -> Any: ...  # ‖parts‖_p of non-negative bounds, p ≥ 1
    # e^g for the expression g, given an upper bound ub of |g| (same Ops); ∞ unless ``smooth`` (L ≤ β)
    def exponential(self, g: exp.Expr, ub: Any, smooth: bool) -> Any: ...


@dataclass(frozen=True)
class Value:
    """What a number-valued node can be: PostgreSQL's type ("int", "float", "real", "numeric"), the range [lo, hi] of
    its finite values, whether it may be ±Infinity or NaN, and ``least``, a lower bound of its non-zero |·|
    (0: none known)."""

    typ: str
    lo: decimal.Decimal
    hi: decimal.Decimal
    inf: bool = False
    nan: bool = False
    least: decimal.Decimal = _ZERO
    sided: int = 0  # where ``inf``: 1 when only +Infinity, −1 when only −Infinity

    @property
    def pos(self) -> bool:
        return self.inf and self.sided >= 0

    @property
    def neg(self) -> bool:
        return self.inf and self.sided <= 0

    @property
    def big(self) -> decimal.Decimal:
        return max(abs(self.lo), abs(self.hi))


@dataclass(frozen=True)
class Linear:
    """Σ coef·column + const; ``grid`` is g such that the column part is always a multiple of g (or None)."""

    coefs: dict[ColumnRef, float] = field(default_factory=dict)
    const: float = 0.0
    grid: Fraction | None = Fraction(1)

    def scale(self, c: float) -> Linear:
        grid = None if self.grid is None else self.grid * abs(Fraction(c).limit_denominator(10**9))
        if c == 0:
            return Linear({}, 0.0, Fraction(1))
        return Linear({k: v * c for k, v in self.coefs.items()}, self.const * c, grid)

    def add(self, other: Linear) -> Linear:
        coefs = dict(self.coefs)
        for k, v in other.coefs.items():
            coefs[k] = coefs.get(k, 0.0) + v
        coefs = {k: v for k, v in coefs.items() if v != 0}
        return Linear(
            coefs, self.const + other.const, _grid_gcd(self.grid, other.grid, bool(self.coefs), bool(other.coefs))
        )


def _grid_gcd(a: Fraction | None, b: Fraction | None, a_used: bool, b_used: bool) -> Fraction | None:
    if not a_used:
        return b
    if not b_used:
        return a
    if a is None or b is None:
        return None
    # gcd of two rationals: gcd(numerators over a common denominator)
    den = a.denominator * b.denominator // math.gcd(a.denominator, b.denominator)
    return Fraction(math.gcd(int(a * den), int(b * den)), den)
