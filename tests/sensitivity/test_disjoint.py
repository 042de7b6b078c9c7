"""sqldp.sensitivity.disjoint against scipy's DisjointSet, which the row analysis used before (it imported
most of scipy for it): the same classes, listed in the same order, after random additions and merges."""

from __future__ import annotations

import random

import pytest
from scipy.cluster.hierarchy import DisjointSet as Reference

from sqldp.sensitivity.disjoint import DisjointSet


@pytest.mark.parametrize("seed", range(40))
def test_the_classes_are_scipys(seed: int) -> None:
    rng = random.Random(seed)
    universe = [f"c{i}" for i in range(rng.randint(1, 30))]
    ours: DisjointSet[str] = DisjointSet()
    ref = Reference()
    for _ in range(rng.randint(0, 60)):
        if rng.random() < 0.4:
            x = rng.choice(universe)
            ours.add(x)
            ref.add(x)
        elif len(ref) >= 1:
            x, y = rng.choice(list(ref)), rng.choice(list(ref))
            assert ours.merge(x, y) == ref.merge(x, y)
        assert list(ours) == list(ref) and len(ours) == len(ref)
        assert ours.subsets() == ref.subsets()  # each class a set, in the order of its first element
        for x in ref:
            assert ours.subset(x) == ref.subset(x)
            for y in ref:
                assert ours.connected(x, y) == ref.connected(x, y)
    outside = "not-added"
    assert outside not in ours
    with pytest.raises(KeyError):
        ours.subset(outside)


def test_elements_given_at_construction_are_singletons() -> None:
    ours = DisjointSet(["a", "b", "c"])
    assert ours.subsets() == [{"a"}, {"b"}, {"c"}]
    assert ours.merge("c", "a") and not ours.merge("a", "c")
    assert ours.subsets() == [{"a", "c"}, {"b"}]
