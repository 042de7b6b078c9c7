"""The privacy parameters of one query: ε (or a guessing-advantage target it is derived from, NR §3.3.10),
δ, β, the mechanism and the confidence of error bars, from the caller's arguments and the policy's
``[defaults]``; and the refusal of a fixed β no noise level can match. Pure: reads no data."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqldp import mechanisms
from sqldp.errors import InputError
from sqldp.mechanisms.registry import LAPLACE, NEEDS_DELTA, Name, choices, smoothed
from sqldp.policy import Policy

MAX_EPSILON = 100.0  # e^100 ≈ 2.7e43: beyond it a "private" answer is the exact one in all but name


@dataclass(frozen=True)
class PrivacyParams:
    epsilon: float
    delta: float | None
    beta: float | None  # None: chosen per answer to minimise noise (Theorem 3.73)
    mechanism: Name
    confidence: float
    advantage: float | None = None
    epsilon_source: str = "epsilon"
    # where a refusal about β points: the flag or the policy key the user set it with (None: chosen by sqldp)
    beta_where: str | None = None
    # the share of each smoothed measurement's ε spent on a noisy upper bound of its noise scale, for an error
    # bar (sqldp.mechanisms.smooth_bar); 0: no bar, the value marked "*"
    bar_share: float = 0.0

    def value_epsilon(self, epsilon: float) -> float:
        """What a smoothed measurement's value gets of its share ε: ε·(1 − bar_share)."""
        return epsilon * (1.0 - self.bar_share)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["beta_where"]
        if not self.bar_share:  # no bar: the figures as before the share existed
            del out["bar_share"]
        return out


def resolve_params(
    policy: Policy,
    *,
    epsilon: float | None = None,
    delta: float | None = None,
    beta: float | None = None,
    mechanism: str | None = None,
    confidence: float | None = None,
    advantage: float | None = None,
    bar_share: float | None = None,
    outputs: int = 1,
) -> PrivacyParams:
    """Explicit arguments win over the policy's ``[defaults]``; ε may come from an advantage target."""
    d = policy.defaults
    mech = smoothed(mechanism or d.mechanism)
    if mech is None:
        raise InputError(f"mechanism must be {choices()}, got {mechanism or d.mechanism!r}", where="--mechanism")
    conf = confidence if confidence is not None else d.confidence
    if not 0 < conf < 1:
        raise InputError(f"confidence must be in (0, 1), got {conf}", where="--confidence")
    if epsilon is not None and advantage is not None:
        raise InputError("give either --epsilon or --advantage, not both", where="--advantage")
    source = "epsilon"
    if epsilon is None and advantage is None:
        epsilon, advantage = d.epsilon, None if d.epsilon is not None else d.advantage
    if epsilon is None and advantage is not None:
        from sqldp.advantage import epsilon_from_policy

        epsilon = epsilon_from_policy(policy, advantage, outputs=outputs)
        source = "advantage"
    if epsilon is None:
        raise InputError("no privacy level: pass --epsilon or --advantage, or set defaults.epsilon in the policy")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise InputError(f"epsilon must be a positive number, got {epsilon}", where="--epsilon")
    if epsilon > MAX_EPSILON:
        raise InputError(
            f"ε = {epsilon:g} bounds the odds of any inference only by e^{epsilon:g}, which protects nothing; "
            f"sqldp accepts ε ≤ {MAX_EPSILON:g} per query",
            where="--epsilon",
        )
    dlt = delta if delta is not None else d.delta
    if mech in NEEDS_DELTA and not dlt:
        raise InputError("the Laplace mechanism gives (ε, δ)-DP: pass --delta (NR Thm 3.56)", where="--delta")
    if dlt is not None and not 0 < dlt < 1:
        raise InputError(f"delta must be in (0, 1), got {dlt}", where="--delta")
    b = beta if beta is not None else d.beta
    # a refusal names only what the user set: the flag, else the policy key, else nothing
    beta_where = "--beta" if beta is not None else "defaults.beta" if d.beta is not None else None
    if b is not None and b < 0:
        raise InputError(f"beta must be ≥ 0, got {b}", where=beta_where)
    share = bar_share if bar_share is not None else d.bar_share
    if not (math.isfinite(share) and 0 <= share < 1):
        where = "--bar-share" if bar_share is not None else "defaults.bar_share"
        raise InputError(f"bar share must be in [0, 1), got {share}", where=where)
    return PrivacyParams(
        epsilon, dlt if mech in NEEDS_DELTA else None, b, mech, conf, advantage, source, beta_where, share
    )


def check_beta(params: PrivacyParams, shares: Sequence[tuple[float, float | None]]) -> None:
    """Refuse a fixed β that no noise level can match at some measurement's ε (and δ) share — before anything
    is read or charged (the proxy charges between prepare and run). NR Theorem 3.53 (generalized Cauchy) needs
    β < ε/(γ + 1); Theorem 3.56 (Laplace) needs β < ε/(ε − 1 − ln(δ/2)). A β chosen by sqldp (Theorem 3.73)
    is taken from a grid inside the feasible interval and needs no check. The value of a smoothed measurement
    gets ε·(1 − bar_share) of its share (:meth:`PrivacyParams.value_epsilon`), which β must match."""
    if params.beta is None:
        return
    for eps, delta in ((params.value_epsilon(e), d) for e, d in shares):
        try:
            if params.mechanism == LAPLACE:
                mechanisms.laplace_b(eps, delta or 0.0, params.beta)
            else:
                mechanisms.cauchy_b(eps, params.beta)
        except InputError as err:
            raise InputError(err.message, where=params.beta_where) from None
