"""The names of sqldp's mechanisms: the one place each is spelled. The command line's ``--mechanism`` choices,
the policy's ``mechanism`` keys, the privacy parameters, a measurement's ``mechanism`` field and the release
all read them from here (as :class:`Name` members, which are strings: a measurement's JSON is unchanged).

Two kinds of name: a noise distribution the exact sampler draws from (``cauchy``, ``laplace``,
``gaussian``: sqldp.mechanisms.cauchy, sqldp.mechanisms.laplace, sqldp.mechanisms.gaussian) and a release,
which names how a measurement was made and which distribution it draws from (:data:`NOISE`): Laplace on a
global bound, the Gaussian vector, R2T's race and its histogram, and the two selections
(sqldp.mechanisms.exponential, sqldp.mechanisms.permute_flip). It imports nothing, so that the policy parser,
the results and the command line can read the names from it without an import cycle.
"""

from __future__ import annotations

from enum import StrEnum


class Name(StrEnum):
    """A mechanism's name, as a measurement, a policy and the command line spell it."""

    CAUCHY = "cauchy"  # generalized Cauchy on a β-smooth bound, ε-DP (NR Theorems 3.53, 3.73)
    LAPLACE = "laplace"  # Laplace on a β-smooth bound, (ε, δ)-DP (NR Theorem 3.56); on a global bound ε-DP
    GAUSSIAN = "gaussian"  # the analytic Gaussian (Balle and Wang, ICML 2018)
    # a data-independent bound's Laplace noise at c/ε (sqldp.release.calibrate)
    LAPLACE_GLOBAL = "laplace-global"
    # a query's data-independent bounds released together by one Gaussian vector (sqldp.release.gaussian)
    GAUSSIAN_GLOBAL = "gaussian-global"
    R2T = "r2t"  # the race of truncations under a privacy unit (sqldp.mechanisms.race)
    # GROUP BY under a privacy unit: τ chosen by R2T's race on the total, the histogram truncated across groups
    # and released with Laplace noise at τ/ε (sqldp.mechanisms.race.histogram_release, docs/units.md)
    R2T_HISTOGRAM = "r2t-histogram"
    EXPONENTIAL = "exponential"  # report-noisy-max by the exponential mechanism (sqldp.mechanisms.exponential)
    PERMUTE_AND_FLIP = "permute-and-flip"  # McKenna and Sheldon, NeurIPS 2020 (sqldp.mechanisms.permute_flip)


CAUCHY, LAPLACE, GAUSSIAN = Name.CAUCHY, Name.LAPLACE, Name.GAUSSIAN
LAPLACE_GLOBAL, GAUSSIAN_GLOBAL = Name.LAPLACE_GLOBAL, Name.GAUSSIAN_GLOBAL
R2T, R2T_HISTOGRAM = Name.R2T, Name.R2T_HISTOGRAM
EXPONENTIAL, PERMUTE_AND_FLIP = Name.EXPONENTIAL, Name.PERMUTE_AND_FLIP

# the mechanisms a user chooses for a data-dependent (smoothed) bound: --mechanism, a policy's mechanism key
SMOOTHED: tuple[Name, ...] = (CAUCHY, LAPLACE)
DEFAULT = CAUCHY  # the policy's default: ε-DP, no δ needed
# the one whose guarantee is (ε, δ): it needs a δ before anything runs (sqldp.params.resolve_params)
NEEDS_DELTA = frozenset({LAPLACE})
# mechanisms whose noise scale depends on no private data: their error bars may be shown to analysts
PUBLIC_SCALE = frozenset({LAPLACE_GLOBAL, GAUSSIAN_GLOBAL})
# the noise distribution each additive release draws from (sqldp.mechanisms.exact.release)
NOISE: dict[Name, Name] = {
    CAUCHY: CAUCHY,
    LAPLACE: LAPLACE,
    GAUSSIAN: GAUSSIAN,
    LAPLACE_GLOBAL: LAPLACE,
    GAUSSIAN_GLOBAL: GAUSSIAN,
    R2T: LAPLACE,
    R2T_HISTOGRAM: LAPLACE,
}


def choices(names: tuple[Name, ...] = SMOOTHED) -> str:
    """The names as a refusal lists them: 'cauchy' or 'laplace'."""
    quoted = [f"'{n.value}'" for n in names]
    return " or ".join(quoted) if len(quoted) < 3 else ", ".join(quoted[:-1]) + f" or {quoted[-1]}"


def smoothed(text: object) -> Name | None:
    """The user's mechanism for ``text`` (a flag's or a policy's value), None when it names none."""
    return next((n for n in SMOOTHED if text == n.value), None)
