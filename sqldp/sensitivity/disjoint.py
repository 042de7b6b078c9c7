"""Union–find over hashable elements: the equality classes of a form's columns (:mod:`sqldp.sensitivity.rows`).

scipy's ``DisjointSet`` did this, but importing ``scipy.cluster`` loads numpy and most of scipy (≈ 0.4 s of
CPU) for a dozen lines of code, on every analysis. Same behaviour: :meth:`subsets` lists the classes in the
order their first element was added, each as a set.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T", bound=Hashable)


class DisjointSet(Generic[T]):
    def __init__(self, elements: Iterable[T] = ()) -> None:
        self._parent: dict[T, T] = {}  # insertion-ordered: the order of :meth:`__iter__` and :meth:`subsets`
        self._members: dict[T, list[T]] = {}  # per root, every element of its class
        for x in elements:
            self.add(x)

    def __contains__(self, x: object) -> bool:
        return x in self._parent

    def __iter__(self) -> Iterator[T]:
        return iter(self._parent)

    def __len__(self) -> int:
        return len(self._parent)

    def add(self, x: T) -> None:
        if x not in self._parent:
            self._parent[x] = x
            self._members[x] = [x]

    def __getitem__(self, x: T) -> T:
        """The root of ``x``'s class (KeyError when ``x`` was never added)."""
        parent = self._parent
        root = x
        while parent[root] != root:
            root = parent[root]
        while parent[x] != root:  # path compression: the next lookup is one step
            parent[x], x = root, parent[x]
        return root

    def merge(self, x: T, y: T) -> bool:
        """Join the classes of ``x`` and ``y``; False when they were one already."""
        rx, ry = self[x], self[y]
        if rx == ry:
            return False
        if len(self._members[rx]) < len(self._members[ry]):  # the smaller class moves: O(n log n) in all
            rx, ry = ry, rx
        self._parent[ry] = rx
        self._members[rx].extend(self._members.pop(ry))
        return True

    def connected(self, x: T, y: T) -> bool:
        return self[x] == self[y]

    def subset(self, x: T) -> set[T]:
        return set(self._members[self[x]])

    def subsets(self) -> list[set[T]]:
        out, seen = [], set()
        for x in self._parent:
            root = self[x]
            if root not in seen:
                seen.add(root)
                out.append(set(self._members[root]))
        return out
