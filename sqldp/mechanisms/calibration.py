"""A calibrated noise — ``value + scale·η`` for one released value, and what it was calibrated from — and the
refusal of a sensitivity no noise can cover. Shared by the distributions' modules."""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqldp.errors import RefusedError
from sqldp.mechanisms.exact import Noise
from sqldp.mechanisms.registry import Name

GAMMA = 4.0  # NR §4.3.3: the tool fixes γ = 4 for generalized Cauchy (sqldp.mechanisms.cauchy)


@dataclass(frozen=True)
class Calibration:
    """The noise of one released value: ``value + scale · η``."""

    noise: Noise  # the distribution of η (sqldp.mechanisms.exact.Noise)
    epsilon: float
    delta: float | None
    beta: float
    b: float
    sensitivity: float  # c_β(x), the β-smooth sensitivity bound used
    scale: float  # c_β(x)/b
    gamma: float = GAMMA

    def half_width(self, confidence: float) -> float:
        """The a·scale with P(|noise| ≤ a·scale) = confidence (NR §3.3.8.5). The grid of ``release`` moves the
        answer by at most Λ/2 more, which these half-widths do not add (Λ is below any scale they print)."""
        if self.scale == 0.0:
            return 0.0
        return self.scale * self.noise.abs_quantile(confidence, self.gamma)

    @property
    def mechanism(self) -> Name:
        """The noise distribution's name (sqldp.mechanisms.registry)."""
        return self.noise.name


def check_sensitivity(c: float) -> float:
    if math.isnan(c) or c < 0:
        raise RefusedError(f"the sensitivity analysis returned {c}; nothing is released")
    if math.isinf(c):
        raise RefusedError("the sensitivity is unbounded for this query; nothing is released")
    return float(c)
