"""Pattern maps and their unification for tables used more than once (NR §3.3.7.3, "Unification of
patterns", Algorithm 3 MergeCPS).

A table T used by uses i ∈ I gives each use a *pattern map*: the columns of T that θ's equalities bind to
the other uses (the rest are ``*``), and for each binding the count of the derivative. The maps of one use
are disjoint (its ``*`` sit in the same places), but the maps of different uses overlap: a row r of T is
matched by at most one pattern of each use, and its derivative is the sum of the counts of those patterns.

NR merges the maps into a closed pattern set (MergeCPS) and reads the maximum of the summed multiplicities.
The smoothing is applied per (pattern, use) before the sum, and sqldp optimises β per answer, so we keep the
*vector* of per-use counts of each merged pattern instead of its sum, and only the vectors that are maximal
componentwise (the smoothing is increasing in each count, so a dominated vector never gives the maximum).
Merging proceeds use by use (NR merges pairwise, "similarly to merge sort"); two partial patterns are kept
apart only while they differ on columns that a later use still binds. The result is exactly the set of
maximal vectors over all rows of T — the property test compares it with the naive enumeration of every
compatible subset of patterns.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

Value = object


@dataclass(frozen=True)
class PatternMap:
    """One use's patterns: the bound columns and, per tuple of their values, the derivative count."""

    columns: tuple[str, ...]
    counts: Mapping[tuple[Value, ...], float]


def _maximal(vectors: Sequence[tuple[float, ...]]) -> list[tuple[float, ...]]:
    """The componentwise-maximal vectors (a Pareto frontier), deduplicated."""
    out: list[tuple[float, ...]] = []
    for v in sorted(set(vectors), key=lambda x: (-sum(x), x)):
        if not any(all(a >= b for a, b in zip(w, v, strict=True)) for w in out):
            out.append(v)
    return out


def unify(maps: Sequence[PatternMap]) -> list[tuple[float, ...]]:
    """The maximal count vectors (one entry per use, 0 where a row matches no pattern of that use) over
    all rows of the table."""
    if not maps:
        return [()]
    # states: assignment (column → value, as a sorted tuple) → maximal vectors so far
    states: dict[tuple[tuple[str, Value], ...], list[tuple[float, ...]]] = {(): [()]}
    for index, pmap in enumerate(maps):
        later = {c for m in maps[index + 1 :] for c in m.columns}
        new: dict[tuple[tuple[str, Value], ...], list[tuple[float, ...]]] = defaultdict(list)
        lookup: dict[tuple[str, ...], dict[tuple[Value, ...], list[tuple[tuple[Value, ...], float]]]] = {}
        for assignment, vectors in states.items():
            bound = dict(assignment)
            shared = tuple(c for c in pmap.columns if c in bound)
            if shared not in lookup:
                index_by: dict[tuple[Value, ...], list[tuple[tuple[Value, ...], float]]] = defaultdict(list)
                pos = [pmap.columns.index(c) for c in shared]
                for values, count in pmap.counts.items():
                    index_by[tuple(values[p] for p in pos)].append((values, count))
                lookup[shared] = index_by
            # the row may match no pattern of this use: its count is then 0
            key = tuple((c, v) for c, v in assignment if c in later)
            new[key].extend((*v, 0.0) for v in vectors)
            for values, count in lookup[shared].get(tuple(bound[c] for c in shared), ()):
                merged = dict(bound)
                merged.update(zip(pmap.columns, values, strict=True))
                key = tuple(sorted((c, v) for c, v in merged.items() if c in later))
                new[key].extend((*v, float(count)) for v in vectors)
        states = {k: _maximal(v) for k, v in new.items()}
    return _maximal([v for vs in states.values() for v in vs])


def unify_naive(maps: Sequence[PatternMap]) -> list[tuple[float, ...]]:
    """The definition, for tests: every choice of at most one pattern per use whose bindings agree."""
    options = [[None, *pmap.counts.items()] for pmap in maps]
    vectors = []
    for choice in itertools.product(*options):
        bound: dict[str, Value] = {}
        ok = True
        vec = []
        for pmap, item in zip(maps, choice, strict=True):
            if item is None:
                vec.append(0.0)
                continue
            values, count = item
            for c, v in zip(pmap.columns, values, strict=True):
                if bound.setdefault(c, v) != v:
                    ok = False
            vec.append(float(count))
        if ok:
            vectors.append(tuple(vec))
    return _maximal(vectors)
