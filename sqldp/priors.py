"""The probabilities of an attacker's prior (NR §3.3.11.1, the grammar of Fig. 44).

The policy states what an attacker knows about a column as a ``knowledge`` table, parsed and checked by
:mod:`sqldp.policy.priors` into a :class:`~sqldp.policy.priors.Knowledge`. What the guessing-advantage
conversion (:mod:`sqldp.advantage`) needs from it is ``mass(t, z)``, the prior probability that the attribute
lies within ``z`` of the true value ``t`` (g(z) of [LP] §3.2), and which values of that probability are
possible over all true values t (:meth:`Prior.p_range`). A prior whose distribution is not known gives the
whole interval [0, 1]: the conversion then takes the worst case p = (1 − δ)/2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from scipy.special import erf

from sqldp.policy import priors as stated
from sqldp.policy.priors import Interval, Knowledge
from sqldp.policy.values import is_number


@dataclass(frozen=True)
class Prior(Knowledge):
    """A :class:`Knowledge` with the probabilities it implies."""

    @classmethod
    def of(cls, knowledge: Knowledge) -> Prior:
        """The prior a policy's knowledge states (itself if it is one already)."""
        if isinstance(knowledge, Prior):
            return knowledge
        return cls(**{f.name: getattr(knowledge, f.name) for f in fields(knowledge)})

    def mass(self, t: float, z: float) -> float:
        """g_t(z) = Pr_pre[|X − t| ≤ z]; only for a known distribution."""
        if self.kind == "normal":
            s = self.sigma * math.sqrt(2)
            return float(erf((t + z - self.mu) / s) - erf((t - z - self.mu) / s)) / 2
        if self.kind in ("range_uniform", "range_prior"):
            total = 0.0
            for lo, hi, m in self.pieces:
                width = hi - lo
                overlap = max(0.0, min(hi, t + z) - max(lo, t - z))
                total += m * (overlap / width if width > 0 else float(lo >= t - z and lo <= t + z))
            return min(1.0, total)
        if self.kind == "exact":
            return 1.0
        if self.kind == "set_uniform" and not self.values:
            return 1.0 / self.size  # only exact guesses: values unknown
        return min(1.0, sum(w for v, w in zip(self.values, self.weights, strict=True) if _within(v, t, z)))

    def true_values(self, radii: tuple[float, ...] = ()) -> list[Any]:
        """True values t at which the extremes of ``mass(t, ·)`` over t lie. For piecewise-uniform priors
        mass(t, z) is piecewise linear in t with kinks at piece ends ± z, so its extremes (and those of a
        ratio of two such functions, which is monotone between kinks) are at these points."""
        if self.kind in ("set_uniform", "set_prior"):
            return list(self.values) if self.values else [None]
        if self.kind == "exact":
            return [self.values[0]]
        if self.kind == "normal":
            lo, hi = self.support()  # type: ignore[misc]
            return [self.mu + (hi - self.mu) * k / 16 for k in range(-16, 17)]
        lo, hi = self.support()  # type: ignore[misc]
        points = {lo, hi}
        for a, b, _ in self.pieces:
            for end in (a, b):
                for z in (0.0, *radii):
                    points.update((end - z, end + z))
        return sorted(x for x in points if lo <= x <= hi)

    def p_range(self, radius: float) -> list[Interval]:
        """The possible values of p = Pr_pre[X′] over all true values t (X′ = the ball of ``radius``):
        a list of intervals; points for discrete priors, [0, 1] when the distribution is unknown."""
        if not self.known_distribution:
            if self.kind == "set" and len(self.values) == 1:
                return [(1.0, 1.0)]
            return [(0.0, 1.0)]
        if self.discrete:
            return sorted({(p, p) for p in (self.mass(t, radius) for t in self.true_values())})
        if self.kind == "normal":
            lo, _ = self.support()  # type: ignore[misc]
            return [(self.mass(lo, radius), self.mass(self.mu, radius))]  # unimodal in t: extremes here
        ps = [self.mass(t, radius) for t in self.true_values((radius,))]
        return [(min(ps), max(ps))]


UNKNOWN = Prior("unknown")


def _within(v: Any, t: Any, z: float) -> bool:
    if is_number(v) and is_number(t):
        return abs(float(v) - float(t)) <= z
    return bool(v == t)


def parse_knowledge(spec: Any, where: str) -> Prior:
    """:func:`sqldp.policy.priors.parse_knowledge`, as a prior."""
    return Prior.of(stated.parse_knowledge(spec, where))


def parse_cli_prior(text: str, where: str = "--prior") -> Prior:
    """:func:`sqldp.policy.priors.parse_cli_prior`, as a prior."""
    return Prior.of(stated.parse_cli_prior(text, where))
