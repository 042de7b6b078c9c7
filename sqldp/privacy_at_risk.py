"""Privacy at risk for the Laplace mechanism (Dandekar, Basu & Bressan, PoPETs 2021).

A Laplace mechanism calibrated at ε₀ keeps its realised privacy loss below a smaller ε with some probability
γ over its own noise ("explicit randomness", Thm 4). γ here is the *compliance* probability
P[|loss| ≤ ε] — the convention of every computation in the paper; its Def. 5 writes the violation
probability 1 − γ. The cost model (§5, Eq. 8–10) prices the privacy level as a GDPR
compensation budget and finds the cheapest ε. Pure functions; a report, never a weaker guarantee unless the
caller opts in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.optimize import brentq, minimize_scalar
from scipy.special import gammainc

from sqldp.errors import InputError


def cdf_t(x: float, k: int = 1) -> float:
    """P(T ≤ x), T = |G₁ − G₂| with G_i ~ Gamma(k, 1): the normalised privacy loss of k Laplace outputs
    (Thm 4; Lemma 9). Closed form of the Bessel density for integer k:
    p_T(t) = 2^{1−k}/Γ(k) · e^{−t} Σ_j (k−1+j)!/(j!(k−1−j)!) 2^{−j} t^{k−1−j}, integrated term by term."""
    _check_k(k)
    if x <= 0:
        return 0.0
    total = 0.0
    for j in range(k):
        m = k - 1 - j  # power of t; ∫_0^x t^m e^{−t} dt = m!·P(m + 1, x)
        coeff = math.factorial(k - 1 + j) / (math.factorial(j) * math.factorial(m)) * 2.0**-j
        total += coeff * math.factorial(m) * float(gammainc(m + 1, x))
    return min(1.0, total * 2.0 ** (1 - k) / math.factorial(k - 1))


def gamma_at(epsilon: float, epsilon0: float, k: int = 1) -> float:
    """γ1 = P(T ≤ ε)/P(T ≤ ε₀) for 0 ≤ ε ≤ ε₀, 1 above (Thm 4, Eq. 3); k = 1: (1 − e^{−ε})/(1 − e^{−ε₀}) (Eq. 4)."""
    _check_eps(epsilon0, "epsilon0")
    if epsilon >= epsilon0:
        return 1.0
    if epsilon <= 0:
        return 0.0
    if k == 1:
        return -math.expm1(-epsilon) / -math.expm1(-epsilon0)
    return cdf_t(epsilon, k) / cdf_t(epsilon0, k)


def epsilon_at(gamma: float, epsilon0: float, k: int = 1) -> float:
    """The ε that the mechanism at ε₀ keeps with probability γ: Eq. 4 for k = 1, a root-finder otherwise."""
    _check_eps(epsilon0, "epsilon0")
    if not 0 < gamma <= 1:
        raise InputError(f"gamma must be in (0, 1], got {gamma}", where="--gamma")
    if gamma == 1:
        return epsilon0
    if k == 1:
        return -math.log(1 - gamma * -math.expm1(-epsilon0))
    target = gamma * cdf_t(epsilon0, k)
    return float(brentq(lambda e: cdf_t(e, k) - target, 0.0, epsilon0, xtol=1e-14))


def calibrate(epsilon: float, gamma: float, k: int = 1) -> float:
    """The least-noise ε₀ whose mechanism is (ε, γ)-private at risk: solve γ·P(T ≤ ε₀) = P(T ≤ ε)
    (k = 1: ε₀ = −ln(1 − (1 − e^{−ε})/γ)). Infeasible targets raise InputError."""
    _check_eps(epsilon, "epsilon")
    if not 0 < gamma <= 1:
        raise InputError(f"gamma must be in (0, 1], got {gamma}", where="--gamma")
    need = cdf_t(epsilon, k) / gamma
    if need >= 1:
        raise InputError(f"no Laplace mechanism keeps the loss below {epsilon:g} with probability only {gamma:g}")
    if k == 1:
        return -math.log(1 - -math.expm1(-epsilon) / gamma)
    hi = epsilon
    while cdf_t(hi, k) < need:
        hi *= 2
    return float(brentq(lambda e0: cdf_t(e0, k) - need, epsilon, hi, xtol=1e-14))


def pairs(
    epsilon0: float, k: int = 1, gammas: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95, 0.99)
) -> list[dict[str, float]]:
    """The (ε, γ) pairs the mechanism at ε₀ with k outputs achieves: the privacy-at-risk report of [DBB] Thm 4."""
    return [{"epsilon": epsilon_at(g, epsilon0, k), "gamma": g} for g in gammas]


# -- cost model (§5) -----------------------------------------------------------------------------------


def compensation(epsilon: float, e: float, *, e_min: float = 0.0, c: float = 1.0) -> float:
    """E^dp_ε = E_min + E·e^{−c/ε} (Eq. 8): the expected compensation per person at privacy level ε."""
    return e_min + e * math.exp(-c / epsilon) if epsilon > 0 else e_min


def compensation_at_risk(
    epsilon: float, epsilon0: float, e: float, *, k: int = 1, e_min: float = 0.0, c: float = 1.0
) -> float:
    """E^par_{ε₀}(ε, γ) = γ·E^dp_ε + (1 − γ)·E^dp_{ε₀} with γ = γ1(ε; ε₀, k) (Eq. 9)."""
    g = gamma_at(epsilon, epsilon0, k)
    return g * compensation(epsilon, e, e_min=e_min, c=c) + (1 - g) * compensation(epsilon0, e, e_min=e_min, c=c)


def eq10_epsilon(epsilon0: float) -> float:
    """Root of 1/ε − ln(1 − (1 − e^{ε})/ε²) = 1/ε₀ on (0, ε₀) (Eq. 10; k = 1, c = 1, E_min = 0)."""
    _check_eps(epsilon0, "epsilon0")

    def f(x: float) -> float:
        return 1 / x - math.log(1 - (1 - math.exp(x)) / x**2) - 1 / epsilon0

    return float(brentq(f, epsilon0 * 1e-6, epsilon0, xtol=1e-14))


@dataclass(frozen=True)
class CostReport:
    people: int
    cost_per_person: float
    epsilon0: float
    budget: float  # N·E^dp_{ε₀}
    epsilon_min: float  # the cost-optimal ε (Eq. 10 generalised: minimiser of Eq. 9)
    gamma_min: float
    budget_min: float  # N·E^par_{ε₀}(ε_min, γ(ε_min))
    saving: float

    def to_json(self) -> dict[str, float | int]:
        return dict(self.__dict__)


def cost_report(
    e: float, people: int, epsilon0: float, *, k: int = 1, e_min: float = 0.0, c: float = 1.0
) -> CostReport:
    """The compensation budget of an ε₀-DP Laplace mechanism and the cost-optimal privacy at risk (§5; P1/P2).
    Eq. 9 is convex in ε (Lemma 4), so a bounded scalar minimisation finds ε_min; for k = 1, c = 1,
    E_min = 0 it is the root of Eq. 10."""
    if not (math.isfinite(e) and e > 0):
        raise InputError(f"must be a positive amount, got {e}", where="--cost-per-person")
    if isinstance(people, bool) or not isinstance(people, int) or people < 1:
        raise InputError(f"must be a positive integer, got {people}", where="--people")
    _check_eps(epsilon0, "epsilon0")
    if not (math.isfinite(c) and c > 0) or not (math.isfinite(e_min) and e_min >= 0):
        raise InputError("the cost rate c must be > 0 and E_min ≥ 0", where="--cost-rate")
    res = minimize_scalar(
        lambda x: compensation_at_risk(x, epsilon0, e, k=k, e_min=e_min, c=c),
        bounds=(epsilon0 * 1e-6, epsilon0),
        method="bounded",
        options={"xatol": 1e-10},
    )
    eps_min = float(res.x)
    budget = people * compensation(epsilon0, e, e_min=e_min, c=c)
    best = people * compensation_at_risk(eps_min, epsilon0, e, k=k, e_min=e_min, c=c)
    return CostReport(people, e, epsilon0, budget, eps_min, gamma_at(eps_min, epsilon0, k), best, budget - best)


def composition(epsilon0: float, epsilon: float, gamma: float, n: int, delta: float) -> float:
    """Thm 3: n ε₀-DP mechanisms that are (ε, γ)-private at risk compose to (ε′, δ)-DP with
    ε′ = ε₀·√(2n·ln(1/δ)) + n·½[γε² + (1 − γ)ε₀²] (the ½ε² mean bound of the proof)."""
    if not 0 < delta < 1 or n < 1:
        raise InputError("composition needs 0 < δ < 1 and n ≥ 1", where="--delta")
    mu = 0.5 * (gamma * epsilon**2 + (1 - gamma) * epsilon0**2)
    return epsilon0 * math.sqrt(2 * n * math.log(1 / delta)) + n * mu


def _check_eps(v: float, name: str) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise InputError(f"{name} must be a positive number, got {v}", where=f"--{name}")


def _check_k(k: int) -> None:
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise InputError(f"the number of outputs k must be a positive integer, got {k}", where="--outputs")
