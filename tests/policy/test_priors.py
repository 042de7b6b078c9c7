"""Attacker priors (NR Fig. 44): parsing with one-line errors, and the masses g_t(z) the conversion uses."""

from __future__ import annotations

import math

import pytest
from scipy.special import erf

from sqldp.errors import PolicyError
from sqldp.priors import parse_cli_prior, parse_knowledge


def test_range_uniform_masses_interior_and_edge() -> None:
    p = parse_knowledge({"kind": "range_uniform", "lo": 0, "hi": 100}, "w")
    assert p.mass(50, 5) == pytest.approx(0.1)  # interior: 2r/w
    assert p.mass(0, 5) == pytest.approx(0.05)  # edge
    assert p.p_range(5) == [(pytest.approx(0.05), pytest.approx(0.1))]
    assert p.diameter() == 100


def test_normal_mass_and_effective_range() -> None:
    p = parse_knowledge({"kind": "normal", "mu": 2000, "sigma": 235.7}, "w")
    assert p.mass(2000, 100) == pytest.approx(float(erf(100 / (235.7 * math.sqrt(2)))))  # E3: ≈ 0.3286
    assert p.mass(2000, 100) == pytest.approx(0.3286, abs=2e-4)
    assert p.diameter() == pytest.approx(6 * math.sqrt(2) * 235.7)  # μ ± 3√2σ (NR §3.3.10.1)
    lo, hi = p.p_range(100)[0]
    assert hi == pytest.approx(p.mass(2000, 100)) and lo < 1e-3


def test_set_prior_normalises_weights_and_exact_guess() -> None:
    p = parse_knowledge({"kind": "set_prior", "values": ["a", "b", "c"], "weights": [2, 1, 1]}, "w")
    assert [x for x, _ in p.p_range(0)] == [0.25, 0.5]
    q = parse_knowledge({"kind": "set_uniform", "size": 4}, "w")
    assert q.p_range(0) == [(0.25, 0.25)]


def test_numeric_set_with_radius() -> None:
    p = parse_knowledge({"kind": "set_uniform", "values": [1, 2, 3, 10]}, "w")
    assert p.mass(2, 1) == pytest.approx(0.75)
    assert p.mass(10, 1) == pytest.approx(0.25)


def test_range_prior_piecewise_brute_force() -> None:
    p = parse_knowledge({"kind": "range_prior", "pieces": [[0, 10, 3], [10, 40, 1]]}, "w")
    lo, hi = p.p_range(2)[0]
    brute = [p.mass(t / 10, 2) for t in range(0, 401)]  # brute force over a fine grid of true values
    assert lo == pytest.approx(min(brute)) and hi == pytest.approx(max(brute))
    assert hi == pytest.approx(0.75 * 4 / 10)


def test_unknown_and_range_are_worst_case() -> None:
    assert parse_knowledge({"kind": "unknown"}, "w").p_range(1) == [(0.0, 1.0)]
    r = parse_knowledge({"kind": "range", "lo": "2020-01-01", "hi": "2020-12-31"}, "w")
    assert r.p_range(1) == [(0.0, 1.0)] and r.diameter() == 365


@pytest.mark.parametrize(
    ("spec", "key"),
    [
        ({"kind": "gaussian"}, "w.kind"),
        ({"kind": "range_uniform", "lo": 5, "hi": 1}, "w.hi"),
        ({"kind": "normal", "mu": 0, "sigma": 0}, "w.sigma"),
        ({"kind": "set_prior", "values": [1, 2], "weights": [1]}, "w.weights"),
        ({"kind": "set_uniform", "size": 0}, "w.size"),
        ({"kind": "set", "values": [1, 1]}, "w.values"),
        ({"kind": "range_prior", "pieces": [[0, 10, 1], [5, 20, 1]]}, "w.pieces"),
        ("uniform", "w"),
    ],
)
def test_bad_knowledge_names_the_key(spec: object, key: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse_knowledge(spec, "w")
    assert str(err.value).startswith(key + ":") and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"kind": "range_uniform", "lo": 0}, "w: missing key 'hi' for kind 'range_uniform' (required: hi, lo)"),
        (
            {"kind": "range_uniform", "lo": 0, "hi": 10, "mu": 1},
            "w: unknown key 'mu' for kind 'range_uniform' (allowed: hi, kind, lo)",
        ),
    ],
)
def test_knowledge_keys_are_named_with_the_kind(spec: object, message: str) -> None:
    """The keys a kind takes are checked like every table's (sqldp.policy.keys), naming the kind."""
    with pytest.raises(PolicyError) as err:
        parse_knowledge(spec, "w")
    assert str(err.value) == message


def test_cli_short_forms() -> None:
    assert parse_cli_prior("range_uniform:0:60").diameter() == 60
    assert parse_cli_prior("set_uniform:5").p_range(0) == [(0.2, 0.2)]
    assert parse_cli_prior("unknown").kind == "unknown"
    with pytest.raises(PolicyError, match="--prior"):
        parse_cli_prior("range_uniform:0")
