"""The additive noises by name: the distribution a mechanism's release draws from (sqldp.mechanisms.registry.NOISE
maps a release's name to it), the exact sampler and its cell probabilities from a name, and the choice of β for
the user's smoothed mechanism."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gmpy2 import mpfr

from sqldp.errors import InputError
from sqldp.mechanisms import cauchy, gaussian, laplace
from sqldp.mechanisms.calibration import GAMMA, Calibration
from sqldp.mechanisms.exact import GRID_EXPONENT, Noise
from sqldp.mechanisms.exact import cell_probability as _cell_probability
from sqldp.mechanisms.exact import release as _release
from sqldp.mechanisms.registry import CAUCHY, LAPLACE, NOISE, Name
from sqldp.mechanisms.source import NoiseSource

# the noise distributions the exact sampler draws from, by name; a release's name maps to one (registry.NOISE)
NOISES: dict[Name, Noise] = {n.name: n for n in (cauchy.NOISE, laplace.NOISE, gaussian.NOISE)}
KINDS = tuple(NOISES)


def noise(name: str) -> Noise:
    """The noise distribution a mechanism's release draws from (``laplace-global`` draws Laplace)."""
    try:
        return NOISES[NOISE[Name(name)]]
    except (ValueError, KeyError):
        raise ValueError(f"unknown mechanism {name!r}") from None


def release(
    kind: str | Noise, value: float, scale: float, source: NoiseSource, *, grid_exponent: int = GRID_EXPONENT
) -> float:
    """:func:`sqldp.mechanisms.exact.release` from the distribution or a mechanism's name."""
    return _release(kind if isinstance(kind, Noise) else noise(kind), value, scale, source, grid_exponent=grid_exponent)


def cell_probability(
    kind: str | Noise, value: float, scale: float, k: int, *, grid_exponent: int = GRID_EXPONENT, precision: int = 256
) -> tuple[mpfr, mpfr]:
    """:func:`sqldp.mechanisms.exact.cell_probability` from the distribution or a mechanism's name."""
    dist = kind if isinstance(kind, Noise) else noise(kind)
    return _cell_probability(dist, value, scale, k, grid_exponent=grid_exponent, precision=precision)


def optimise_beta(
    smooth: Callable[[float], float],
    epsilon: float,
    mechanism: str,
    *,
    delta: float | None = None,
    gamma: float = GAMMA,
    extra: Sequence[float] = (),
    distances: Sequence[float] = (1.0,),
) -> Calibration:
    """Choose β to minimise the noise scale c_β(x)/b_β over the fixed grid (NR Theorem 3.73).

    ``extra``: more data-independent β values to try (an analysis that evaluates its bound on its own grid
    passes those points, where its bound is tightest); the feasible ones join the family.

    Theorem 3.73 is proved for generalized Cauchy (sqldp.mechanisms.cauchy.optimise). For Laplace it is not, so
    the Laplace mechanism uses one data-independent β: the one that spends half of ε on b (b = ε/2), lowered
    where the query's changes reach beyond distance 1 (sqldp.mechanisms.laplace.optimise; ``distances``, from
    the query and the policy)."""
    if mechanism == LAPLACE:
        return laplace.optimise(smooth, epsilon, delta, distances)
    if mechanism != CAUCHY:
        raise InputError(f"no β to choose for the mechanism {mechanism!r}")
    return cauchy.optimise(smooth, epsilon, gamma, extra)
