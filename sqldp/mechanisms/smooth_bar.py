"""A DP error bar for a value whose noise is scaled to a β-smooth bound (docs/privacy.md, "An error bar for a
smoothed bound").

The noise scale s(x) = c_β(x)/b of generalized Cauchy (NR Theorem 3.53) and of the smoothed Laplace (NR
Theorem 3.56) is private: its size would reveal the smooth bound c_β(x). But c_β is β-smooth,
c_β(x) ≤ e^(β·d)·c_β(y) for databases at distance d, so ln s moves by at most β·d; so does the logarithm of
Theorem 3.73's min over a fixed family of (c_I/b_I) whose β_I are all ≤ β (a minimum of functions that each move
by ≤ β·d moves by ≤ β·d). Hence L = ln s + Lap(β/ε_b) is ε_b·d-DP (the Laplace mechanism, Dwork et al. TCC 2006),
and U = exp(L + (β/ε_b)·ln(1/(2m))) ≥ s except with probability m: P(Lap(λ) < −λ·ln(1/(2m))) = ½·(2m) = m.

The value itself is released at ε − ε_b (sequential composition: (ε − ε_b)·d + ε_b·d = ε·d at distance d, and
the value's δ unchanged). The bar is post-processing of (value, L): the value's half-width at confidence 1 − m
computed with U in place of s holds the truth with probability ≥ 1 − 2m (a union bound).
Pure functions and one mutable holder; the draw uses the exact Laplace sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqldp.mechanisms.additive import release
from sqldp.mechanisms.registry import LAPLACE
from sqldp.mechanisms.source import NoiseSource


def log_noise_scale(beta: float, epsilon: float) -> float:
    """The Laplace scale of the release of ln s: its sensitivity β per unit of distance over ε_b."""
    return beta / epsilon


def upper_bound(noisy_log: float, beta: float, epsilon: float, miss: float) -> float:
    """U = exp(L + (β/ε_b)·ln(1/(2·miss))), which is ≥ the true scale with probability ≥ 1 − miss (miss ≤ ½)."""
    if not 0.0 < miss <= 0.5:
        raise ValueError(f"miss probability must be in (0, ½], got {miss}")
    if noisy_log == -math.inf:
        return 0.0
    return math.exp(noisy_log + log_noise_scale(beta, epsilon) * math.log(1.0 / (2.0 * miss)))


@dataclass
class SmoothBar:
    """The noisy upper bound of one measurement's noise scale, shared by every group's copy of the measurement
    (they share one bound, so one release serves them all). ``beta`` (the smoothness of ln s per unit of
    distance) and ``epsilon`` (ε_b) are data-independent and released; ``log_scale`` is ln s, private, never
    serialised; ``noisy_log`` is L once drawn."""

    beta: float
    epsilon: float
    share: float
    confidence: float  # the bar's: half its miss goes to U, half to the value's noise
    log_scale: float
    noisy_log: float | None = None

    def draw(self, source: NoiseSource) -> float:
        """L, drawn once. A zero scale (c_β = 0 on one database is 0 on every one, by smoothness) stays −∞."""
        if self.noisy_log is None:
            if self.log_scale == -math.inf:
                self.noisy_log = -math.inf
            else:
                scale = log_noise_scale(self.beta, self.epsilon)
                self.noisy_log = release(LAPLACE, self.log_scale, scale, source)
        return self.noisy_log

    def upper(self, miss: float) -> float:
        assert self.noisy_log is not None
        return upper_bound(self.noisy_log, self.beta, self.epsilon, miss)

    def to_json(self) -> dict[str, float | None]:
        """What the analyst sees: the share, ε_b, the smoothness, L and U at the bar's half of the miss."""
        miss = (1.0 - self.confidence) / 2.0
        noisy = self.noisy_log
        return {
            "share": self.share,
            "epsilon": self.epsilon,
            "beta": self.beta,
            "noisy_log_scale": None if noisy is None or noisy == -math.inf else noisy,
            "scale_upper_bound": None if noisy is None else self.upper(miss),
            "scale_confidence": 1.0 - miss,
        }
