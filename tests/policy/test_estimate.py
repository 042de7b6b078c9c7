"""The DP estimators of ``sqldp policy init --estimate-epsilon`` (sqldp.policy.estimate): the exact privacy loss of
each over every pair of neighbouring tiny datasets (one row added or removed) against its claimed ε (and δ), and
mutants — half the noise, a grid chosen from the data, a threshold without its margin — that the same check
catches."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from decimal import Decimal

import pytest

from sqldp.catalog import Catalog
from sqldp.errors import PolicyError
from sqldp.mechanisms.source import NoiseSource
from sqldp.policy import estimate
from sqldp.policy.estimated import parse_section, plan, run

UNIVERSE = (1, 2, 3, 4, 5)
GRID = (0, 2, 4, 6)  # fixed before the data: the cells are <0, [0,2), [2,4), [4,6), ≥6


def datasets(universe: Sequence[object], most: int) -> list[tuple[object, ...]]:
    return [d for n in range(most + 1) for d in itertools.combinations_with_replacement(universe, n)]


def neighbours(d: tuple[object, ...], universe: Sequence[object]) -> list[tuple[object, ...]]:
    """d with one row added (each value of the universe)."""
    return [tuple(sorted((*d, v), key=str)) for v in universe]


def cells(d: Sequence[int], grid: Sequence[int] = GRID) -> list[int]:
    out = [0] * (len(grid) + 1)
    for x in d:
        out[bisect.bisect_right(grid, x)] += 1  # PostgreSQL's width_bucket numbering
    return out


def loss(p: dict[object, float], q: dict[object, float]) -> float:
    worst = 0.0
    for k in set(p) | set(q):
        a, b = p.get(k, 0.0), q.get(k, 0.0)
        if (a == 0) != (b == 0):
            return math.inf
        if a > 0:
            worst = max(worst, abs(math.log(a / b)))
    return worst


def quantile_release(d: Sequence[int], q: float, epsilon: float, anchor: int) -> dict[object, float]:
    """The distribution of the released grid value."""
    w = estimate.weights(estimate.quantile_scores(cells(d), q), estimate.quantile_rate(epsilon, q), anchor)
    return dict(zip(GRID, w, strict=True))


def worst_pure(
    release: Callable[[tuple[object, ...]], dict[object, float]], universe: Sequence[object], most: int
) -> float:
    return max(loss(release(d), release(e)) for d in datasets(universe, most) for e in neighbours(d, universe))


@pytest.mark.parametrize("q", [estimate.LOW_QUANTILE, 0.5, estimate.HIGH_QUANTILE])
@pytest.mark.parametrize("anchor", [0, 2])
def test_quantile_loss_within_epsilon(q: float, anchor: int) -> None:
    eps = 0.7
    worst = worst_pure(lambda d: quantile_release(d, q, eps, anchor), UNIVERSE, 4)  # type: ignore[arg-type]
    assert worst <= eps * (1 + 1e-9)
    # at the median the claim is nearly tight (scores move both ways); at the extreme quantiles, on datasets this small,
    # one direction moves by at most min(q, 1 − q), so the loss is about half of it
    assert worst >= (0.85 if q == 0.5 else 0.45) * eps


def test_quantile_mutant_half_the_noise_is_caught() -> None:
    """Rate ε/Δ (forgetting that scores move either way) loses more than ε on some neighbours."""
    eps, q = 0.7, 0.5

    def mutant(d: tuple[object, ...]) -> dict[object, float]:
        scores = estimate.quantile_scores(cells(d), q)  # type: ignore[arg-type]
        w = estimate.weights(scores, 2 * estimate.quantile_rate(eps, q), 0)
        return dict(zip(GRID, w, strict=True))

    assert worst_pure(mutant, UNIVERSE, 4) > eps * 1.05


def test_quantile_mutant_data_dependent_grid_is_caught() -> None:
    """A grid built from the data's values (here: the values themselves) releases a value only some neighbours
    hold: infinite loss."""
    eps = 0.7

    def mutant(d: tuple[object, ...]) -> dict[object, float]:
        grid = sorted(set(d)) or [0]
        c = [0] * (len(grid) + 1)
        for x in d:
            c[bisect.bisect_right(grid, x)] += 1
        w = estimate.weights(estimate.quantile_scores(c, 0.999), estimate.quantile_rate(eps, 0.999), 0)
        return dict(zip(grid, w, strict=True))

    assert worst_pure(mutant, UNIVERSE, 3) == math.inf


def rows_release(d: Sequence[object], epsilon: float, rate: float | None = None) -> dict[object, float]:
    per = Counter(Counter(d).values())
    per_capped = Counter({min(k, estimate.MAX_TAU + 1): n for k, n in per.items()})
    r = estimate.rows_rate(epsilon) if rate is None else rate
    w = estimate.weights(estimate.rows_scores(per_capped, estimate.ROWS_QUANTILE), r, 0)
    return dict(zip(estimate.tau_grid(), w, strict=True))


def test_rows_per_value_loss_within_epsilon() -> None:
    eps = 0.9
    keys = ("a", "b", "c")
    worst = worst_pure(lambda d: rows_release(d, eps), keys, 5)
    assert eps * 0.95 <= worst <= eps * (1 + 1e-9)  # rate ε, not ε/2: tight (one key's count moving)


def test_rows_per_value_mutant_half_the_noise_is_caught() -> None:
    eps = 0.9
    worst = worst_pure(lambda d: rows_release(d, eps, rate=2 * estimate.rows_rate(eps)), ("a", "b", "c"), 5)
    assert worst > eps * 1.05


def selection_delta(
    d: Sequence[object], e: Sequence[object], universe: Sequence[object], eps: float, prob: Callable[[int], float]
) -> float:
    """Exact δ(ε) from d to e of releasing the set of selected values: Σ_S max(0, P_d(S) − e^ε·P_e(S))."""
    cd, ce = Counter(d), Counter(e)
    total = 0.0
    for bits in itertools.product((False, True), repeat=len(universe)):
        pd = pe = 1.0
        for v, kept in zip(universe, bits, strict=True):
            a, b = prob(cd[v]), prob(ce[v])
            pd *= a if kept else 1 - a
            pe *= b if kept else 1 - b
        total += max(0.0, pd - math.exp(eps) * pe)
    return total


def worst_selection_delta(eps: float, prob: Callable[[int], float]) -> float:
    universe = ("x", "y", "z")
    worst = 0.0
    for d in datasets(universe, 4):
        for e in neighbours(d, universe):
            worst = max(worst, selection_delta(d, e, universe, eps, prob), selection_delta(e, d, universe, eps, prob))
    return worst


@pytest.mark.parametrize("floor", [1, 3])
def test_partition_selection_within_epsilon_delta(floor: int) -> None:
    eps, delta = 1.0, 0.05
    worst = worst_selection_delta(eps, lambda c: estimate.release_probability(c, eps, delta, floor))
    assert worst <= delta * (1 + 1e-9)
    assert worst >= 0.5 * delta  # the margin is not loose: a count reaching the floor passes with probability δ


def test_partition_selection_mutants_are_caught() -> None:
    eps, delta = 1.0, 0.05

    def no_margin(c: int) -> float:  # threshold = floor: a value appearing once passes half the time
        return 0.0 if c < 1 else (0.5 if c == 1 else 1 - 0.5 * math.exp(-eps * (c - 1)))

    def floor_not_shifted(c: int) -> float:  # floor 3 in SQL, but the threshold of floor 1
        return 0.0 if c < 3 else estimate.release_probability(c, eps, delta, 1)

    assert worst_selection_delta(eps, no_margin) > 2 * delta
    assert worst_selection_delta(eps, floor_not_shifted) > 2 * delta


def test_select_values_samples_the_analysed_distribution() -> None:
    """The sampler keeps each value with the probability the tests analyse (seeded, test mode)."""
    eps, delta, floor = 1.0, 0.05, 1
    source = NoiseSource.seeded(7)
    kept = Counter()
    for _ in range(2000):
        kept.update(estimate.select_values({"a": 2, "b": 4, "c": 0}, eps, delta, floor, source))
    for v, c in (("a", 2), ("b", 4)):
        p = estimate.release_probability(c, eps, delta, floor)
        assert abs(kept[v] / 2000 - p) < 4 * math.sqrt(p * (1 - p) / 2000) + 0.01
    assert kept["c"] == 0


def test_grids_are_fixed_by_the_catalog() -> None:
    g = estimate.numeric_grid(Decimal("-99999.99"), Decimal("99999.99"), 2, False)
    assert g[0] == Decimal("-99999.99") and g[-1] == Decimal("99999.99") and Decimal(0) in g
    assert all(a < b for a, b in itertools.pairwise(g))
    assert all(x == int(x) for x in estimate.numeric_grid(None, None, 2, True))
    assert estimate.date_grid()[0].day == 1 and len(estimate.date_grid()) == 200 * 12 + 1
    assert estimate.tau_grid() == list(range(1, estimate.MAX_TAU + 2))


class FakeSummaries:
    """The summaries of a table t (x NUMERIC, d DATE, s CHAR(3), k → u) computed in Python."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def widths(self, table: str) -> dict[str, int]:
        return {"s": 3}

    def histogram(self, table: str, column: str, grid: Sequence[object], kind: str) -> list[int]:
        self.calls.append(f"histogram {column}")
        return [0] * (len(grid) + 1)

    def rows_per_value(self, table: str, column: str, cap: int) -> dict[int, int]:
        self.calls.append(f"rows {column}")
        return {3: 100}

    def frequent_values(self, table: str, column: str, floor: int) -> dict[object, int]:
        self.calls.append(f"values {column}")
        return {"a": 10_000}


SCHEMA = """
CREATE TABLE u (id INTEGER PRIMARY KEY);
CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER REFERENCES u (id), x NUMERIC(7,2), d DATE, s CHAR(3),
                c NUMERIC(5,1) CHECK (c BETWEEN 0 AND 10), note VARCHAR(200));
"""


def test_the_shares_add_up_to_the_stated_budget(tmp_path: object) -> None:
    import pathlib

    ddl = pathlib.Path(str(tmp_path)) / "s.sql"
    ddl.write_text(SCHEMA, encoding="utf-8")
    catalog = Catalog.from_file(ddl)
    tasks = plan(catalog, ["t", "u"], True, {"t": {"s": 3, "note": 200}})
    # x and d get two ends each, s a domain, k (a foreign key to private u) a max_rows_per; c (CHECK), note
    # (too wide) and the keys get nothing
    assert sorted((t.column, t.figure) for t in tasks) == [
        ("d", "high"),
        ("d", "low"),
        ("k", "max_rows_per"),
        ("s", "domain"),
        ("x", "high"),
        ("x", "low"),
    ]
    fake = FakeSummaries()
    out = run(catalog, ["t", "u"], 0.6, 1e-6, fake, NoiseSource.seeded(1), origin="test")
    import tomllib

    section = tomllib.loads("\n".join(out.section))["estimates"]
    assert math.isclose(sum(f["epsilon"] for f in section["figures"]), 0.6)
    assert math.isclose(sum(f["delta"] for f in section["figures"]), 1e-6)
    assert len(section["figures"]) == 6 and len(fake.calls) == 6  # each figure read once, paid once
    assert out.rows_per["t"][:2] == ("k", 3)
    assert out.facts[("t", "s")].values == ("a",)
    parse_section(section, "p.toml: estimates")
    section["figures"][0]["epsilon"] = 1.0  # a record spending more than it states is refused
    with pytest.raises(PolicyError, match=r"more than the 0\.6 stated"):
        parse_section(section, "p.toml: estimates")
