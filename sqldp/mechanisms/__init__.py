"""The mechanisms: noise calibrated to a sensitivity bound, sampled exactly, each with its privacy map.

Pure functions, no database. One module per distribution, each pairing its calibration (the scale from the
sensitivity, ε, δ and β), its exact sampler on the grid, its half-width at a confidence and its privacy map at a
change distance d (the δ it keeps at the loss ε·d; ρ where it has one), as OpenDP's Measurement pairs a
function with its privacy map:

* sqldp.mechanisms.cauchy — generalized Cauchy on a β-smooth bound, ε-DP (NR Theorems 3.53, 3.73);
* sqldp.mechanisms.laplace — Laplace on a global bound (ε-DP) or a β-smooth one ((ε, δ)-DP, NR Theorem 3.56);
* sqldp.mechanisms.gaussian — the analytic Gaussian on a global ℓ2 bound ((ε, δ)-DP, ρ-zCDP);
* sqldp.mechanisms.exponential and sqldp.mechanisms.permute_flip — the choice of one candidate by its score;
* sqldp.mechanisms.race — R2T's race of truncations under a privacy unit, on Laplace.

sqldp.mechanisms.exact is the exact sampler they share (sqldp.mechanisms.source.NoiseSource the CSPRNG),
sqldp.mechanisms.registry the one place a mechanism's name is spelled. This package gives what the rest
of sqldp calls under the names it had as one module, each loaded from its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqldp.mechanisms.additive import KINDS, NOISES, cell_probability, noise, optimise_beta, release
    from sqldp.mechanisms.calibration import GAMMA, Calibration
    from sqldp.mechanisms.cauchy import (
        BETA_GRID_SIZE,
        beta_grid,
        calibrate_cauchy,
        cauchy_b,
        gencauchy_abs_cdf,
        gencauchy_abs_quantile,
        gencauchy_density,
    )
    from sqldp.mechanisms.exact import GRID_EXPONENT, Noise
    from sqldp.mechanisms.exponential import exponential_index
    from sqldp.mechanisms.gaussian import (
        calibrate_gaussian,
        gaussian_abs_quantile,
        gaussian_delta,
        gaussian_delta_at,
        gaussian_rho,
        gaussian_sigma,
        gaussian_wins,
        zcdp_epsilon,
    )
    from sqldp.mechanisms.laplace import (
        calibrate_global,
        calibrate_laplace,
        laplace_abs_quantile,
        laplace_b,
        laplace_beta,
        laplace_beta_limit,
        laplace_delta,
        laplace_delta_at,
        laplace_selection,
    )
    from sqldp.mechanisms.permute_flip import permute_and_flip_index
    from sqldp.mechanisms.source import NoiseSource

# where each name the rest of sqldp calls lives; loaded on first use (PEP 562), so that reading the registry —
# the policy parser, a result, ``sqldp --help`` — does not load the samplers (gmpy2) and the calibrations
_HOMES: dict[str, str] = {
    "BETA_GRID_SIZE": "sqldp.mechanisms.cauchy",
    "Calibration": "sqldp.mechanisms.calibration",
    "GAMMA": "sqldp.mechanisms.calibration",
    "GRID_EXPONENT": "sqldp.mechanisms.exact",
    "KINDS": "sqldp.mechanisms.additive",
    "NOISES": "sqldp.mechanisms.additive",
    "Noise": "sqldp.mechanisms.exact",
    "NoiseSource": "sqldp.mechanisms.source",
    "beta_grid": "sqldp.mechanisms.cauchy",
    "calibrate_cauchy": "sqldp.mechanisms.cauchy",
    "calibrate_gaussian": "sqldp.mechanisms.gaussian",
    "calibrate_global": "sqldp.mechanisms.laplace",
    "calibrate_laplace": "sqldp.mechanisms.laplace",
    "cauchy_b": "sqldp.mechanisms.cauchy",
    "cell_probability": "sqldp.mechanisms.additive",
    "exponential_index": "sqldp.mechanisms.exponential",
    "gaussian_abs_quantile": "sqldp.mechanisms.gaussian",
    "gaussian_delta": "sqldp.mechanisms.gaussian",
    "gaussian_delta_at": "sqldp.mechanisms.gaussian",
    "gaussian_rho": "sqldp.mechanisms.gaussian",
    "gaussian_sigma": "sqldp.mechanisms.gaussian",
    "gaussian_wins": "sqldp.mechanisms.gaussian",
    "gencauchy_abs_cdf": "sqldp.mechanisms.cauchy",
    "gencauchy_abs_quantile": "sqldp.mechanisms.cauchy",
    "gencauchy_density": "sqldp.mechanisms.cauchy",
    "laplace_abs_quantile": "sqldp.mechanisms.laplace",
    "laplace_b": "sqldp.mechanisms.laplace",
    "laplace_beta": "sqldp.mechanisms.laplace",
    "laplace_beta_limit": "sqldp.mechanisms.laplace",
    "laplace_delta": "sqldp.mechanisms.laplace",
    "laplace_delta_at": "sqldp.mechanisms.laplace",
    "laplace_selection": "sqldp.mechanisms.laplace",
    "noise": "sqldp.mechanisms.additive",
    "optimise_beta": "sqldp.mechanisms.additive",
    "permute_and_flip_index": "sqldp.mechanisms.permute_flip",
    "release": "sqldp.mechanisms.additive",
    "zcdp_epsilon": "sqldp.mechanisms.gaussian",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'sqldp.mechanisms' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


__all__ = [
    "BETA_GRID_SIZE",
    "GAMMA",
    "GRID_EXPONENT",
    "KINDS",
    "NOISES",
    "Calibration",
    "Noise",
    "NoiseSource",
    "beta_grid",
    "calibrate_cauchy",
    "calibrate_gaussian",
    "calibrate_global",
    "calibrate_laplace",
    "cauchy_b",
    "cell_probability",
    "exponential_index",
    "gaussian_abs_quantile",
    "gaussian_delta",
    "gaussian_delta_at",
    "gaussian_rho",
    "gaussian_sigma",
    "gaussian_wins",
    "gencauchy_abs_cdf",
    "gencauchy_abs_quantile",
    "gencauchy_density",
    "laplace_abs_quantile",
    "laplace_b",
    "laplace_beta",
    "laplace_beta_limit",
    "laplace_delta",
    "laplace_delta_at",
    "laplace_selection",
    "noise",
    "optimise_beta",
    "permute_and_flip_index",
    "release",
    "zcdp_epsilon",
]
