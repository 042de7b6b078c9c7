"""β-smooth upper bounds of a count's derivative (NR §3.3.7.3, "Smoothing the derivative sensitivity").

For one table use i and one pattern p, the derivative of the count is c = Count(σθ[p/Ti](∏_{j≠i} Tj))(D).
Adding rows to the other uses moves it at most to

    A(k) = c + ∏_{j≠i} (n_j + k_j) − ∏_{j≠i} n_j        with Σ_t G_t·k_t = k            (NR eq. after (33))

where n_j bounds the rows of use j that can join (here: the rows passing the conjuncts that read use j
alone). The β-smooth bound is max_k e^(−βk)·A(k).

Self-joins: NR distributes k over *tables*; when one table has several uses among the j ≠ i, adding one row
to it adds a row to each of those uses at once. We therefore group the other uses by table: table t has
m_t uses with n_t = max of their n_j, and A(k) = c + P·∏_t (n_t + k_t)^(m_t) − P·∏_t n_t^(m_t), P the
product of the (fixed) public uses' counts. For m_t = 1 this is exactly NR's formula. The k that maximises
the product under Σ G_t k_t = k is water-filling: raise the tables with the smallest G_t(n_t + k_t)/m_t
first (NR's "smallest modified count first", generalised), and along that path d ln ∏/dk = 1/λ where λ is
the common level G_t(n_t + k_t)/m_t of the active tables. ln A(k) is concave, so L(k) = −βk + ln A(k) is
unimodal and its maximum is found by bisection on L′ (NR: "binary search to find s").
"""

from __future__ import annotations

import contextvars
import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Growth:
    """How the other private uses can grow: per table, (n_t, m_t, G_t); plus the public product P."""

    tables: tuple[tuple[float, int, float], ...] = ()
    public: float = 1.0

    @property
    def static(self) -> bool:
        """No private table joins with this use: the derivative cannot grow with distance."""
        return not self.tables

    def base(self) -> float:
        """P·∏ n_t^(m_t): the product at distance 0."""
        return self._base

    @functools.cached_property
    def _base(self) -> float:
        out = self.public
        for n, m, _ in self.tables:
            out *= n**m
        return out

    @functools.cached_property
    def _items(self) -> list[tuple[float, float, int, float]]:
        """The tables by their level at distance 0, G_t·n_t/m_t (the order water-filling raises them in): the
        same for every k, so sorted once rather than at each of the bisection's ≈ 50 steps."""
        return sorted(((g * n / m, n, m, g) for n, m, g in self.tables), key=lambda x: x[0])

    def level(self, k: float) -> tuple[float, float, float]:
        """(λ, prod, extra) after distributing distance k by water-filling: prod = P·∏(n_t + k_t)^(m_t) and
        extra = prod − P·∏ n_t^(m_t), computed without cancellation (A(k) = c + extra)."""
        return self._level_one(k) if self._one else self._level_loop(k)

    @functools.cached_property
    def _one(self) -> bool:
        """One table, whose level is finite and whose multiplicity positive: :meth:`_level_one` applies."""
        items = self._items
        return len(items) == 1 and math.isfinite(items[0][0]) and items[0][2] > 0

    def _level_loop(self, k: float) -> tuple[float, float, float]:
        items = self._items
        # the distance needed to raise the active set to level λ is Σ_active (λ·m_t − G_t·n_t)
        lam = items[0][0]
        spent = 0.0
        msum = 0.0
        active = 0
        while True:
            while active < len(items) and items[active][0] <= lam:
                msum += items[active][2]
                active += 1
            nxt = items[active][0] if active < len(items) else math.inf
            step = (nxt - lam) * msum
            if spent + step >= k:
                lam += (k - spent) / msum
                break
            spent += step
            lam = nxt
        prod = self.public
        log_growth = 0.0
        for v, n, m, g in items:
            size = max(n, lam * m / g) if v <= lam else n
            prod *= size**m
            if n > 0:
                log_growth += m * math.log1p((size - n) / n)
        base = self._base
        extra = prod if base == 0 else base * math.expm1(log_growth)
        return lam, prod, extra

    def _level_one(self, k: float) -> tuple[float, float, float]:
        """:meth:`level` for one table (most growths: the other private use of a two-table join), the same
        operations on the same values without the loops: the one table is active at once (msum = 0.0 + m), the
        next level is ∞ so the first step covers any k, and λ = v + (k − 0.0)/msum. The bisection calls it ≈ 40
        times per smoothed count; the floats are the loop's, bit for bit (tests/sensitivity/test_rows_oracle.py)."""
        v, n, m, g = self._items[0]
        msum = 0.0 + m
        lam = v + (k - 0.0) / msum
        size = max(n, lam * m / g) if v <= lam else n
        prod = self.public
        prod *= size**m
        log_growth = 0.0
        if n > 0:
            log_growth += m * math.log1p((size - n) / n)
        base = self._base
        extra = prod if base == 0 else base * math.expm1(log_growth)
        return lam, prod, extra


# (count, growth, β) → smooth_count's answer, while a release calibrates (:func:`remembering`)
_Memo = dict[tuple[float, float, Growth, float], tuple[float, float]]
_memo: contextvars.ContextVar[_Memo | None] = contextvars.ContextVar("sqldp_smooth_memo", default=None)


@contextmanager
def remembering() -> Iterator[None]:
    """Meanwhile :func:`smooth_count` answers each (count, growth, β) once. The release's β search (NR Theorem
    3.73) evaluates every aggregate's bound on one grid, and a value-level bound reads its row-level parts (c1
    and c4 of NR §3.3.9) at each β: the same counts of the same uses smoothed at the same β, six times over
    on TPC-H Q4, and the bisection below is most of a release's time. smooth_count is a pure function of its
    arguments, so a remembered answer is the very float it would compute again. Kept for one release only:
    nothing is carried from one run's data to the next."""
    token = _memo.set({})
    try:
        yield
    finally:
        _memo.reset(token)


def smooth_count(count: float, growth: Growth, beta: float) -> tuple[float, float]:
    """max_k e^(−βk)·A(k) and the maximising k (NR §3.3.7.3). ``count`` is c for one (pattern, use)."""
    memo = _memo.get()
    if memo is None:
        return _smooth_count(count, growth, beta)
    key = (count, math.copysign(1.0, count), growth, beta)  # 0.0 == −0.0, but c is returned as given
    out = memo.get(key)
    if out is None:
        out = memo[key] = _smooth_count(count, growth, beta)
    return out


def _smooth_count(count: float, growth: Growth, beta: float) -> tuple[float, float]:
    if count < 0:
        raise ValueError("a count is never negative")
    if growth.static:
        return count, 0.0
    if beta <= 0:
        return math.inf, math.inf

    def slope(k: float) -> float:
        """L′(k) = −β + (dA/dk)/A, with dA/dk = prod/λ along the water-filling path."""
        lam, prod, extra = growth.level(k)
        a = count + extra
        if lam <= 0 or a <= 0:
            return math.inf
        return -beta + prod / (lam * a)

    if slope(0.0) <= 0:
        return count, 0.0
    lo, hi = 0.0, 1.0
    for _ in range(200):  # L′ → −β as k → ∞, so a sign change exists
        if slope(hi) <= 0:
            break
        lo, hi = hi, hi * 2.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if slope(mid) > 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
    k = 0.5 * (lo + hi)
    return math.exp(-beta * k) * (count + growth.level(k)[2]), k


def reach(count: float, growth: Growth, k: float) -> float:
    """A(k) = c + P·∏(n_t + k_t)^(m_t) − P·∏ n_t^(m_t) at the water-filling k_t: what ``smooth_count`` weighs by
    e^(−βk) (the brute-force tests compare it with the local sensitivity at distance k)."""
    return count if growth.static else count + growth.level(k)[2]


def reach_keyed(count: float, free: float, gap: float, growth: Growth, k: float) -> float:
    """A(k) when declared keys determine some of the other uses (sqldp.sensitivity.rows, "uses a declared key
    determines"): ``growth`` holds the free uses only, ``free`` is c_F (the free uses' count alone) and ``gap`` g
    the least weight of a determined private table (∞: none). Below g no determined row can be new; from g on
    one can, and the count is then at most the free uses' count at the remaining distance."""
    out = reach(count, growth, k)
    if k >= gap:
        out = max(out, reach(free, growth, k - gap))
    return out


def smooth_keyed(count: float, free: float, gap: float, growth: Growth, beta: float) -> float:
    """max_k e^(−βk)·reach_keyed(k) = max(S(c), e^(−βg)·S(c_F)), S the smoothing above (k − g ranges over [0, ∞)
    like k)."""
    out = smooth_count(count, growth, beta)[0]
    if math.isfinite(gap):
        out = max(out, math.exp(-beta * gap) * smooth_count(free, growth, beta)[0])
    return out
