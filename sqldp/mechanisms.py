"""Noise: generalized Cauchy (ε-DP) and Laplace ((ε, δ)-DP) calibrated to a β-smooth sensitivity bound.

Pure functions, no database (DESIGN.md, step 4). The mechanisms are those of NR §3.3.7.1:

* Theorem 3.53 / 3.62 — ``f(x) + c(x)/b · η`` with η ~ GenCauchy(γ), density ∝ 1/(1 + |x|^γ), is ε-DP when
  c is a β-smooth upper bound on the derivative sensitivity and ε = (γ + 1)(b + β), i.e.
  b = ε/(γ + 1) − β (FORMULAS.md §1.9; the "ε/γ − β" printed in NR §3.3.8.5 is a typo).
* Theorem 3.56 — the same with η ~ Lap(1) and b + β ≤ ε is (ε, δ)-DP with δ = 2·e^(ε − 1 − (ε − b)/β).
* Theorem 3.73 — for generalized Cauchy, the noise level may be min over a fixed family of (b_I, β_I) of
  c_I(x)/b_I: β is chosen per input to minimise the noise. The family (the β grid) is fixed in advance and
  never depends on the data.

Noise is drawn from the operating system's CSPRNG (``secrets``) and turned into GenCauchy/Laplace variates by
the exact inverse CDF. A seeded generator exists only for tests; results made with it are marked.
"""

from __future__ import annotations

import functools
import math
import random
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from scipy import special

from sqldp.errors import InputError, RefusedError

GAMMA = 4.0  # NR l.7595: the tool fixes γ = 4 for generalized Cauchy
BETA_GRID_SIZE = 48


class NoiseSource:
    """Uniform variates on (0, 1) from the OS CSPRNG, or (test mode only) from a seeded PRNG."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else secrets.SystemRandom()
        self.test_mode = rng is not None

    @classmethod
    def seeded(cls, seed: int) -> NoiseSource:
        """TEST MODE: reproducible noise. Every result built with it carries ``test_mode = True``."""
        return cls(random.Random(seed))

    def uniform(self) -> float:
        """A uniform variate in the open interval (0, 1)."""
        while True:
            u = self._rng.random()
            if u > 0.0:
                return u

    def sign(self) -> float:
        return 1.0 if self._rng.random() < 0.5 else -1.0


# -- distributions --------------------------------------------------------------------------------


def gencauchy_abs_cdf(a: float, gamma: float = GAMMA) -> float:
    """P(|η| ≤ a) for η ~ GenCauchy(γ).

    With t = a^γ/(1 + a^γ), ∫₀^a dx/(1 + x^γ) = (1/γ)·B(t; 1/γ, 1 − 1/γ), so P(|η| ≤ a) is the regularised
    incomplete beta function I_t(1/γ, 1 − 1/γ). For γ = 4 it equals the closed form of FORMULAS.md §1.9.
    """
    if a <= 0:
        return 0.0
    if math.isinf(a):
        return 1.0
    t = 1.0 / (1.0 + a ** (-gamma))
    return float(special.betainc(1.0 / gamma, 1.0 - 1.0 / gamma, t))


def gencauchy_abs_quantile(p: float, gamma: float = GAMMA) -> float:
    """The a with P(|η| ≤ a) = p (η ~ GenCauchy(γ)): t = I⁻¹(p; 1/γ, 1 − 1/γ), a = (t/(1 − t))^(1/γ); for
    p ≥ 1/2 through 1 − t = I⁻¹(1 − p; 1 − 1/γ, 1/γ), so that the tail (p → 1) keeps its precision."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    if p == 0.0:
        return 0.0
    if p < 0.5:
        t = float(special.betaincinv(1.0 / gamma, 1.0 - 1.0 / gamma, p))
        return (t / (1.0 - t)) ** (1.0 / gamma)
    s = float(special.betaincinv(1.0 - 1.0 / gamma, 1.0 / gamma, 1.0 - p))  # s = 1 − t
    return ((1.0 - s) / s) ** (1.0 / gamma)


def gencauchy_density(x: float, gamma: float = GAMMA) -> float:
    """The normalised density: γ·sin(π/γ)/(2π) · 1/(1 + |x|^γ)."""
    return gamma * math.sin(math.pi / gamma) / (2.0 * math.pi) / (1.0 + abs(x) ** gamma)


def laplace_abs_quantile(p: float) -> float:
    """The a with P(|η| ≤ a) = p for η ~ Lap(1): a = −ln(1 − p) (FORMULAS.md §1.9)."""
    if not 0.0 <= p < 1.0:
        raise ValueError(f"probability must be in [0, 1), got {p}")
    return -math.log1p(-p)


def sample(kind: str, source: NoiseSource, *, gamma: float = GAMMA) -> float:
    """One standard variate: GenCauchy(γ) for ``"cauchy"``, Lap(1) for ``"laplace"`` (inverse CDF)."""
    u = source.uniform()
    if kind == "cauchy":
        return source.sign() * gencauchy_abs_quantile(u, gamma)
    if kind == "laplace":
        return source.sign() * laplace_abs_quantile(u)
    raise ValueError(f"unknown mechanism {kind!r}")


# -- calibration ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Calibration:
    """The noise of one released value: ``value + scale · η``."""

    mechanism: str
    epsilon: float
    delta: float | None
    beta: float
    b: float
    sensitivity: float  # c_β(x), the β-smooth sensitivity bound used
    scale: float  # c_β(x)/b
    gamma: float = GAMMA

    def half_width(self, confidence: float) -> float:
        """The a·scale with P(|noise| ≤ a·scale) = confidence (NR §3.3.8.5; FORMULAS.md §1.9)."""
        if self.scale == 0.0:
            return 0.0
        if self.mechanism == "cauchy":
            return self.scale * _confidence_quantile(confidence, self.gamma)
        return self.scale * laplace_abs_quantile(confidence)


@functools.lru_cache(maxsize=64)
def _confidence_quantile(confidence: float, gamma: float) -> float:
    # every release asks for the same few confidences; scipy's inverse beta costs ≈ 15 µs a call
    return gencauchy_abs_quantile(confidence, gamma)


def cauchy_b(epsilon: float, beta: float, gamma: float = GAMMA) -> float:
    """b = ε/(γ + 1) − β (Theorem 3.53); refuse when no noise level can give ε."""
    b = epsilon / (gamma + 1.0) - beta
    if b <= 0:
        raise InputError(
            f"β = {beta:g} is too large for ε = {epsilon:g}: generalized Cauchy needs β < ε/(γ+1) = "
            f"{epsilon / (gamma + 1.0):g} (NR Theorem 3.53)",
            where="--beta",
        )
    return b


def laplace_b(epsilon: float, delta: float, beta: float) -> float:
    """The b of Theorem 3.56 for a target δ: δ = 2e^(ε − 1 − (ε − b)/β) ⇔ b = ε − β(ε − 1 − ln(δ/2)).
    β = 0 means a global (0-smooth) bound: b = ε, δ unused."""
    if beta == 0.0:
        return epsilon
    b = epsilon - beta * (epsilon - 1.0 - math.log(delta / 2.0))
    if b <= 0 or b + beta > epsilon:
        raise InputError(
            f"β = {beta:g} is too large for ε = {epsilon:g} and δ = {delta:g}: the Laplace mechanism needs "
            f"β < ε/(ε − 1 − ln(δ/2)) = {laplace_beta_limit(epsilon, delta):g} (NR Theorem 3.56)",
            where="--beta",
        )
    return b


def laplace_beta_limit(epsilon: float, delta: float) -> float:
    return epsilon / (epsilon - 1.0 - math.log(delta / 2.0))


def laplace_delta(epsilon: float, b: float, beta: float) -> float:
    """δ of Theorem 3.56 (with the factor 2; FORMULAS.md D8: ε = 1, b = β = 0.1 → 2.4682e−4)."""
    if beta == 0.0:
        return 0.0
    return 2.0 * math.exp(epsilon - 1.0 - (epsilon - b) / beta)


def _check_sensitivity(c: float) -> float:
    if math.isnan(c) or c < 0:
        raise RefusedError(f"the sensitivity analysis returned {c}; nothing is released")
    if math.isinf(c):
        raise RefusedError("the sensitivity is unbounded for this query; nothing is released")
    return float(c)


def calibrate_cauchy(sensitivity: float, epsilon: float, beta: float, gamma: float = GAMMA) -> Calibration:
    b = cauchy_b(epsilon, beta, gamma)
    c = _check_sensitivity(sensitivity)
    return Calibration("cauchy", epsilon, None, beta, b, c, c / b, gamma)


def calibrate_laplace(sensitivity: float, epsilon: float, delta: float | None, beta: float) -> Calibration:
    if not delta:
        raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Theorem 3.56)", where="--delta")
    b = laplace_b(epsilon, delta, beta)
    c = _check_sensitivity(sensitivity)
    return Calibration("laplace", epsilon, delta, beta, b, c, c / b)


def beta_grid(epsilon: float, gamma: float = GAMMA) -> list[float]:
    """The fixed, data-independent family of β values of Theorem 3.73 for generalized Cauchy: geometric steps
    inside the feasible interval (0, ε/(γ + 1)), where β = ε/(γ + 1) would make b = 0."""
    limit = epsilon / (gamma + 1.0)
    # from β_max/10⁴ up to 0.98·β_max: small β suits data far from its worst case, large β the rest
    lo, hi = limit * 1e-4, limit * 0.98
    n = BETA_GRID_SIZE
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def optimise_beta(
    smooth: Callable[[float], float],
    epsilon: float,
    mechanism: str,
    *,
    delta: float | None = None,
    gamma: float = GAMMA,
    extra: Sequence[float] = (),
) -> Calibration:
    """Choose β to minimise the noise scale c_β(x)/b_β over the fixed grid (NR Theorem 3.73).

    ``extra``: more data-independent β values to try (an analysis that evaluates its bound on its own grid
    passes those points, where its bound is tightest); the feasible ones join the family.

    Theorem 3.73 is proved for generalized Cauchy. For Laplace it is not, so the Laplace mechanism uses one
    data-independent β: the one that spends half of ε on b (b = ε/2)."""
    if mechanism == "laplace":
        if not delta:
            raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Theorem 3.56)", where="--delta")
        beta = 0.5 * laplace_beta_limit(epsilon, delta)
        return calibrate_laplace(smooth(beta), epsilon, delta, beta)
    best: Calibration | None = None
    limit = epsilon / (gamma + 1.0)
    for beta in sorted({*beta_grid(epsilon, gamma), *(b for b in extra if 0 < b < limit)}):
        c = smooth(beta)
        if not math.isfinite(c):  # some analyses have no bound for very small β: skip those family members
            continue
        cal = calibrate_cauchy(c, epsilon, beta, gamma)
        if best is None or cal.scale < best.scale:
            best = cal
    if best is None:
        raise RefusedError("the sensitivity is unbounded for this query at every β; nothing is released")
    return best
