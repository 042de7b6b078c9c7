"""The shared oracles (tests/oracles.py), each against a value worked out by hand or by an independent method:
a brute-force test is only as good as the loss it compares with."""

from __future__ import annotations

import datetime
import math
from decimal import Decimal
from fractions import Fraction

import pytest
from oracles import (
    Neighbour,
    cauchy_log_ratio,
    cauchy_loss,
    check_neighbours,
    exponential_law,
    gaussian_delta,
    gencauchy_density,
    hockey_stick,
    hockey_stick_both,
    hockey_stick_continuous,
    joint_loss,
    laplace_cdf,
    laplace_delta,
    laplace_density,
    laplace_exceeds,
    laplace_log_ratio,
    laplace_loss,
    max_log_ratio,
    norm_distance,
    product_law,
    product_rows,
    row_neighbours,
    rows_added,
    rows_removed,
    selection_hockey_stick,
    selection_hockey_stick_2,
    sql_statements,
    unit_rows,
    units_added,
    units_removed,
    values_changed,
    values_set,
)
from scipy import integrate

DB = {"t": [(1, "a"), (2, "b")], "u": [(7,)]}


# -- neighbours ------------------------------------------------------------------------------------------------


def test_rows_removed_and_added_at_the_tables_weight() -> None:
    gone = list(rows_removed(DB, "t", weight=2.0))
    assert [n.db["t"] for n in gone] == [[(2, "b")], [(1, "a")]]
    assert {n.distance for n in gone} == {2.0} and all(n.db["u"] == [(7,)] for n in gone)
    added = list(rows_added(DB, "t", [(3, "c")]))
    assert added[0].db["t"] == [(1, "a"), (2, "b"), (3, "c")] and added[0].distance == 1.0
    assert DB["t"] == [(1, "a"), (2, "b")]  # the original is never changed
    assert (gone[0].table, gone[0].row, added[0].table, added[0].row) == ("t", (1, "a"), "t", (3, "c"))
    twice = {"t": [(1, "a"), (1, "a"), (2, "b")]}
    assert [n.row for n in rows_removed(twice, "t", distinct=True)] == [(1, "a"), (2, "b")]
    assert len(list(rows_removed(twice, "t"))) == 3
    both = list(row_neighbours(DB, {"t": product_rows([3], ["x", "y"])}, {"t": 0.5}))
    assert [n.db["t"][-1] for n in both[2:]] == [(3, "x"), (3, "y")]
    assert len(both) == 4 and {n.distance for n in both} == {0.5}  # u is public: it has no neighbours


def test_norm_distances() -> None:
    assert norm_distance([3.0, -4.0], [1.0, 1.0], "l1") == 7.0
    assert norm_distance([3.0, -4.0], [1.0, 1.0], "l2") == 5.0
    assert norm_distance([3.0, -4.0], [2.0, 1.0], "linf") == 6.0


@pytest.mark.parametrize(("norm", "distances"), [("l1", [2, 1, 3]), ("l2", [2, 1, math.sqrt(5)]), ("linf", [2, 1, 2])])
def test_values_changed_on_the_grid_of_the_ball(norm: str, distances: list[float]) -> None:
    """Row (0, 0), column weights 1 and 2, shift 1: (0, 1) at 2, (1, 0) at 1, (1, 1) at ‖(1, 2)‖_p."""
    db = {"r": [(0, 0)]}
    moved = list(values_changed(db, "r", {0: 1.0, 1: 2.0}, [1], norm=norm, joint=True))  # type: ignore[arg-type]
    assert [n.db["r"][0] for n in moved] == [(0, 1), (1, 0), (1, 1)]
    assert [n.distance for n in moved] == pytest.approx(distances)
    one_at_a_time = list(values_changed(db, "r", {0: 1.0, 1: 2.0}, [1, -2]))
    assert [(n.db["r"][0], n.distance) for n in one_at_a_time] == [((1, 0), 1), ((-2, 0), 2), ((0, 1), 2), ((0, -2), 4)]
    assert (one_at_a_time[0].removed, one_at_a_time[0].added) == ({"r": ((0, 0),)}, {"r": ((1, 0),)})


def test_values_changed_keeps_to_the_declared_range_and_dict_rows() -> None:
    db = {"r": [{"id": 1, "x": 9}]}
    moved = list(values_changed(db, "r", {"x": 1.0}, [1, 2, -3], within=lambda c, v: 0 <= v <= 10))
    assert [n.db["r"][0]["x"] for n in moved] == [10, 6] and [n.distance for n in moved] == [1, 3]


def test_values_set_to_the_ends_of_a_range() -> None:
    db = {"r": [(1, 0.5), (2, 4.0)]}
    moved = list(values_set(db, "r", {1: (-4.0, 4.0)}, {1: 0.5}))
    assert [n.db["r"] for n in moved] == [[(1, -4.0), (2, 4.0)], [(1, 4.0), (2, 4.0)], [(1, 0.5), (2, -4.0)]]
    assert [n.distance for n in moved] == [2.25, 1.75, 4.0]  # 2 → 4.0 is no change: left out


def test_sql_statements_make_and_undo_a_neighbour() -> None:
    db = {"li": [(1, Decimal("3.00"), datetime.date(2020, 1, 10), "it's")]}
    cols = {"li": ("id", "q", "d", "c")}
    (gone,) = rows_removed(db, "li")
    assert sql_statements(gone, cols) == (
        "DELETE FROM li WHERE id = 1",
        "INSERT INTO li VALUES (1, 3.00, '2020-01-10', 'it''s')",
    )
    (added,) = rows_added(db, "li", [(9, Decimal("0.50"), datetime.date(2020, 1, 9), None)])
    assert sql_statements(added, cols) == (
        "INSERT INTO li VALUES (9, 0.50, '2020-01-09', NULL)",
        "DELETE FROM li WHERE id = 9",
    )
    (moved,) = values_changed(db, "li", {1: 1.0}, [Decimal("0.01")])
    assert sql_statements(moved, cols) == (
        "UPDATE li SET q = 3.01 WHERE id = 1",
        "UPDATE li SET q = 3.00 WHERE id = 1",
    )


CUSTOMERS = {
    "customer": [(1,), (2,)],
    "orders": [(10, 1), (11, 2), (12, 1)],
    "lineitem": [(100, 10), (101, 11), (102, 12), (103, 12)],
}
OWNER = {10: 1, 11: 2, 12: 1}
LINKS = {"customer": 0, "orders": 1, "lineitem": lambda row: OWNER[row[1]]}


def test_a_unit_leaves_with_its_rows_in_every_table() -> None:
    """Customer 1 owns orders 10 and 12 and, through them, line items 100, 102 and 103."""
    assert unit_rows(CUSTOMERS, LINKS, 1)["lineitem"] == [(100, 10), (102, 12), (103, 12)]
    gone = list(units_removed(CUSTOMERS, LINKS, [1, 2]))
    assert gone[0].db == {"customer": [(2,)], "orders": [(11, 2)], "lineitem": [(101, 11)]}
    assert gone[1].db["lineitem"] == [(100, 10), (102, 12), (103, 12)] and gone[0].distance == 1.0
    assert gone[0].removed == {
        "customer": ((1,),),
        "orders": ((10, 1), (12, 1)),
        "lineitem": ((100, 10), (102, 12), (103, 12)),
    }
    (added,) = units_added(CUSTOMERS, [{"customer": [(3,)], "orders": [(13, 3)]}])
    assert added.db["customer"] == [(1,), (2,), (3,)] and added.db["orders"][-1] == (13, 3)
    assert added.db["lineitem"] == CUSTOMERS["lineitem"]


# -- densities -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("density", [laplace_density, gencauchy_density])
def test_densities_integrate_to_one(density: object) -> None:
    area = integrate.quad(lambda y: density(y, 1.5, 2.0), -math.inf, math.inf, limit=400)[0]  # type: ignore[operator]
    assert area == pytest.approx(1.0, abs=1e-8)


def test_laplace_cdf_and_the_gencauchy_centre() -> None:
    assert laplace_cdf(0.0, 0.0, 3.0) == 0.5 and laplace_cdf(-1.0, 0.0, 1.0) == pytest.approx(0.5 / math.e)
    assert gencauchy_density(0.0, 0.0, 1.0) == pytest.approx(math.sqrt(2) / math.pi)  # γ = 4: 4·sin(π/4)/(2π)


# -- pure ε ----------------------------------------------------------------------------------------------------


def test_laplace_log_ratio() -> None:
    assert laplace_loss(-3.0, 2.0) == 1.5 == laplace_log_ratio(0.0, 2.0, 3.0, 2.0)
    assert laplace_log_ratio(0.0, 1.0, 0.0, 2.0) == pytest.approx(math.log(2))  # the centre: (1/2)/(1/4)
    assert laplace_log_ratio(0.0, 2.0, 0.0, 1.0) == math.inf  # p's heavier tails


def test_cauchy_log_ratio_on_known_cases() -> None:
    """Same centre, scales 1 and 2: the ratio is largest at the centre (2) one way and in the tails
    ((2/1)^(γ−1) = 8) the other; a pure shift by d at scale s is a function of d/s only. A shift of 1 at scale 1:
    the stationary point of ln(1 + (y − 1)⁴) − ln(1 + y⁴), found by bisection on its derivative, at
    y ≈ −0.95924 (the ratio is antisymmetric about ½, so the maximum is left of it)."""
    assert cauchy_log_ratio(0.0, 1.0, 0.0, 2.0) == pytest.approx(math.log(2), abs=1e-9)
    assert cauchy_log_ratio(0.0, 2.0, 0.0, 1.0) == pytest.approx(3 * math.log(2), abs=1e-9)
    assert cauchy_log_ratio(0.0, 5.0, 1.0, 5.0) == pytest.approx(cauchy_loss(0.2, 1.0), abs=1e-9)
    assert cauchy_log_ratio(3.0, 1.0, 3.0, 1.0) == 0.0
    # the pair tests/sensitivity/test_window_oracle.py found: one centre, scales 76.93 → 33.29, the tails' 3·ln
    assert joint_loss([(0.0, 76.93)], [(0.0, 33.29)]) == pytest.approx(3 * math.log(76.93 / 33.29), rel=1e-9)
    assert cauchy_loss(1.0, 1.0) == pytest.approx(2.142509739587277, abs=1e-9)
    assert cauchy_loss(-1.0, 1.0) == pytest.approx(2.142509739587277, abs=1e-9)


def test_joint_loss_adds_the_coordinates() -> None:
    a, b = [(0.0, 1.0, "laplace"), (0.0, 2.0, "laplace")], [(1.0, 1.0, "laplace"), (1.0, 2.0, "laplace")]
    assert joint_loss(a, b) == pytest.approx(1.5)
    assert joint_loss([(0.0, 1.0)], [(1.0, 1.0)]) == pytest.approx(2.142509739587277, abs=1e-9)  # Cauchy
    with pytest.raises(AssertionError):
        joint_loss(a, b[:1])


# -- δ ---------------------------------------------------------------------------------------------------------


def test_gaussian_delta() -> None:
    """At ε = 0 the divergence is the total variation of N(0, 1) and N(1, 1): 2Φ(½) − 1 = erf(1/(2√2)); at
    ε = 1 the quadrature of max(0, p − e·q) agrees; σ ≈ 3.73 gives δ ≈ 10⁻⁵ at ε = 1 (Balle and Wang's
    example); the formula depends on d/σ only."""
    assert gaussian_delta(1.0, 1.0, 0.0) == pytest.approx(math.erf(1 / (2 * math.sqrt(2))), rel=1e-12)
    assert gaussian_delta(1.0, 1.0, 1.0) == pytest.approx(
        hockey_stick_continuous("gaussian", 0.0, 1.0, 1.0, 1.0, 1.0, tails=40), rel=1e-7
    )
    assert 0.9e-5 < gaussian_delta(1.0, 3.73, 1.0) < 1.1e-5
    assert gaussian_delta(2.0, 4.0, 0.3) == pytest.approx(gaussian_delta(0.5, 1.0, 0.3), rel=1e-12)
    assert gaussian_delta(0.0, 1.0, 1.0) == 0.0


def test_laplace_delta() -> None:
    """Shift 3 at b = 1, ε = 1: 1 − e^(−1); the quadrature agrees; no δ where the shift is at most b·ε."""
    assert laplace_delta(3.0, 1.0, 1.0) == pytest.approx(1 - math.exp(-1), rel=1e-12)
    assert laplace_delta(-3.0, 1.0, 1.0) == laplace_delta(3.0, 1.0, 1.0)
    assert laplace_delta(3.0, 1.0, 1.0) == pytest.approx(
        hockey_stick_continuous("laplace", 0.0, 1.0, 3.0, 1.0, 1.0), rel=1e-9
    )
    assert laplace_delta(2.0, 1.0, 2.0) == 0.0 and laplace_delta(2.0, 1.0, 2.5) == 0.0
    assert hockey_stick_continuous("laplace", 0.0, 1.0, 2.0, 1.0, 0.0) == pytest.approx(1 - math.exp(-1), rel=1e-9)


def test_discrete_laws() -> None:
    p, q = {"a": 0.5, "b": 0.5}, {"a": 0.25, "b": 0.75}
    assert max_log_ratio(p, q) == pytest.approx(math.log(2))
    assert hockey_stick(p, q, 0.0) == pytest.approx(0.25) and hockey_stick(q, p, 0.0) == pytest.approx(0.25)
    assert hockey_stick(p, q, math.log(2)) == 0.0
    assert hockey_stick(q, p, math.log(1.25)) == pytest.approx(0.75 - 1.25 * 0.5)
    assert hockey_stick_both(p, q, math.log(1.25)) == pytest.approx(0.5 - 1.25 * 0.25)  # P‖Q: "a"
    assert max_log_ratio(p, {"a": 1.0}) == math.inf  # "b" only on one side
    assert hockey_stick(p, {"a": 1.0}, 5.0) == 0.5
    tiny = Fraction(1, 10**400)  # an exact probability below the smallest double
    assert max_log_ratio({0: tiny}, {0: 2 * tiny}) == pytest.approx(math.log(2))


# -- checking a claim ------------------------------------------------------------------------------------------


def _count(db: object) -> list[tuple[float, float, str]]:
    return [(float(len(db["t"])), 1.0, "laplace")]  # type: ignore[index]


def test_check_neighbours_passes_a_true_claim_and_reports_the_worst() -> None:
    """COUNT(*) with Lap(1) is 1-DP at distance 1, and 2-DP at weight 2 (group privacy)."""
    neighbours = list(row_neighbours(DB, {"t": [(3, "c")]}))
    worst = check_neighbours(DB, neighbours, _count, epsilon=1.0)
    assert worst.loss == pytest.approx(1.0) and worst.pairs == 3 and "removed" in worst.change
    check_neighbours(
        DB,
        row_neighbours(DB, {"t": [(3, "c")]}, {"t": 2.0}),
        lambda db: [(2 * len(db["t"]), 1.0, "laplace")],
        epsilon=1.0,
    )


def test_check_neighbours_fails_a_false_claim() -> None:
    with pytest.raises(AssertionError, match="removed"):
        check_neighbours(DB, rows_removed(DB, "t"), _count, epsilon=0.9)
    with pytest.raises(AssertionError):  # δ: the Gaussian of σ = 1 for a shift 1 at ε = 1 has δ ≈ 0.127
        check_neighbours(
            DB, rows_removed(DB, "t"), lambda db: [(float(len(db["t"])), 1.0)], epsilon=1.0, delta=0.1, kind="gaussian"
        )


def test_check_neighbours_on_laws_and_with_delta() -> None:
    """Randomized response on "is t empty" with probability 3/4 of the truth: ln 3 pure; at ε = ln 2 its δ is
    3/4 − 2·1/4 = 1/4."""

    def law(db: object) -> dict[bool, float]:
        empty = not db["t"]  # type: ignore[index]
        return {empty: 0.75, not empty: 0.25}

    one = {"t": [(1, "a")]}
    neighbours = [Neighbour({"t": []}, 1.0, "emptied")]
    assert check_neighbours(one, neighbours, law, epsilon=math.log(3), kind="law").loss == pytest.approx(math.log(3))
    worst = check_neighbours(one, neighbours, law, epsilon=math.log(2), delta=0.25, kind="law")
    assert worst.loss == pytest.approx(0.25)
    gaussian = check_neighbours(
        DB, rows_removed(DB, "t"), lambda db: [(float(len(db["t"])), 1.0)], epsilon=1.0, delta=0.13, kind="gaussian"
    )
    assert gaussian.loss == pytest.approx(gaussian_delta(1.0, 1.0, 1.0))


def test_partition_selection_laws() -> None:
    """A group of count 1 at τ = 3, b = 1 is released with probability e^(−2)/2, of count 5 with 1 − e^(−2)/2.
    Counts 2 against 1 at ε = 0: the ⊥ atoms favour Q, so H is the released values' excess,
    P[X > 3] − Q[X > 3] = (e^(−1) − e^(−2))/2; at ε = 1 the densities' ratio above 2 is exactly e: H = 0."""
    assert laplace_exceeds(1.0, 3.0, 1.0) == pytest.approx(0.5 * math.exp(-2), rel=1e-15)
    assert laplace_exceeds(5.0, 3.0, 1.0) == pytest.approx(1 - 0.5 * math.exp(-2), rel=1e-15)
    assert laplace_exceeds(-40.0, 3.0, 1.0) == pytest.approx(0.5 * math.exp(-43), rel=1e-12)  # no cancellation
    one, two = [(1.0, 1.0, 1.0, 3.0)], [(2.0, 1.0, 1.0, 3.0)]
    assert selection_hockey_stick(one, None, 1.0) == pytest.approx(0.5 * math.exp(-2), rel=1e-12)
    assert selection_hockey_stick(None, one, 1.0) == 0.0
    assert selection_hockey_stick(two, one, 0.0) == pytest.approx(0.5 * (math.exp(-1) - math.exp(-2)), rel=1e-8)
    assert selection_hockey_stick(two, one, 1.0) == pytest.approx(0.0, abs=1e-12)
    assert selection_hockey_stick_2([(1.0, 1.0, 3.0), None], [None, None], 0.0) == pytest.approx(
        0.5 * math.exp(-2), rel=1e-8
    )


def test_exponential_and_product_laws() -> None:
    """Scores 0 and ln 3 at rate 1: P = 1/4 and 3/4 (a huge score does not overflow); two items kept with
    probability 1/2 and 1/4: the four sets {} 3/8, {a} 3/8, {b} 1/8, {a, b} 1/8."""
    assert exponential_law({"x": 0.0, "y": math.log(3)}, 1.0) == pytest.approx({"x": 0.25, "y": 0.75})
    assert exponential_law({"x": 1e6, "y": 1e6}, 1.0) == {"x": 0.5, "y": 0.5}
    law = product_law({"a": 0.5, "b": 0.25})
    assert law == pytest.approx(
        {frozenset(): 3 / 8, frozenset("a"): 3 / 8, frozenset("b"): 1 / 8, frozenset("ab"): 1 / 8}
    )
