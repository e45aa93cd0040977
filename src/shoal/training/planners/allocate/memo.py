"""What the allocation programs keep across pools of the same kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from shoal.training.planners.allocate.base import MEMO_POOLS, Allocation, caps
from shoal.training.planners.allocate.dp import Tables, cheapest_at, cheapest_on


class PoolMemo:
    """Allocations found on one pool, reused on smaller pools. A smaller pool allows a subset of
    the allocations, so an allocation found on a pool (the fastest, or the cheapest under a
    bound) that fits a smaller pool is also the fastest (cheapest) there: the one the dynamic
    program, which visits and orders the allocations both allow alike, gives on it, or one as
    cheap as the MIP's; none stays none. A result is also reused only when
    its bottleneck is at or above the caller's ``at_least``. ``key`` names the stage options
    (the caller's: plan shape, degree, ...); prices, regions and the kinds they index are fixed
    per memo (``Space.alloc_memo``). A program cut by its deadline is not remembered."""

    def __init__(self) -> None:
        self._d: dict[tuple, list[tuple[np.ndarray, list[Allocation]]]] = {}
        self.fronts = Fronts()
        # per program (key, degree, microbatches): the bounds ``fastest_of`` searches over
        self.bounds: dict[tuple, tuple[list[float], dict[float, int], float]] = {}
        # per program (key, degree): ``most_used``, the most GPUs its options can use
        self.most: dict[tuple, np.ndarray] = {}

    def get(self, key: tuple, avail: np.ndarray, at_least: float = 0.0) -> list[Allocation] | None:
        for pool, res in self._d.get(key, ()):
            if not (avail <= pool).all():
                continue
            if not res:
                return res
            if res[0].bottleneck_s >= at_least and all(
                    (np.asarray(a.usage) <= avail).all() for a in res):
                return res
        return None

    def put(self, key: tuple, avail: np.ndarray, res: list[Allocation]) -> None:
        entries = self._d.setdefault(key, [])
        entries.append((avail.copy(), res))
        del entries[:-MEMO_POOLS]


class Memoised(NamedTuple):
    """A memo and the key a program's allocations are kept under in it (``PoolMemo``)."""

    memo: PoolMemo
    key: tuple


class Fronts:
    """The dynamic program's last fronts (``dp_front``), per program (stage options, degree,
    microbatches) and bound, each computed at the largest pool its memo has served
    (``ceiling``), so that a smaller pool's program is read off it (``cheapest_on``); and the
    allocations traced back from them, per (program, bound, usage): the combos on the way to a
    pair of the front are the same at any caps that hold it. One or two kinds only (the MIP's
    programs are not kept)."""

    def __init__(self) -> None:
        self.ceiling: np.ndarray | None = None
        self._fronts: dict[tuple, dict[float, tuple[int, int, tuple | None]]] = {}
        self._allocs: dict[tuple, Allocation] = {}
        self._tables: dict[tuple, Tables] = {}

    def tables(self, key: tuple, build: Callable[[], Tables]) -> Tables:
        """The ``Tables`` of program ``key`` (stage options and degree), built once."""
        got = self._tables.get(key)
        if got is None:
            got = self._tables[key] = build()
        return got

    def raise_ceiling(self, avail: np.ndarray) -> None:
        """Programs are computed for pools of up to ``avail`` GPUs per kind from now on."""
        avail = np.asarray(avail, dtype=np.int64)
        self.ceiling = avail.copy() if self.ceiling is None else np.maximum(self.ceiling, avail)

    def usage(self, key: tuple, tau: float, avail: np.ndarray, price: np.ndarray,
              front: Callable[[int, int], tuple[np.ndarray, np.ndarray] | None]
              ) -> tuple[int, ...] | None:
        """The cheapest usage within ``avail`` of program ``key`` under ``tau``, from its front
        at the ceiling (``front(A, B)`` computes it at those caps when it is not kept)."""
        got = self._kept(key, tau, avail, front)
        return None if got is None else cheapest_on(got, avail, price)

    def feasible(self, key: tuple, tau: float, avail: np.ndarray,
                 front: Callable[[int, int], tuple[np.ndarray, np.ndarray] | None]) -> bool:
        """Whether ``usage`` finds one (without finding the cheapest)."""
        got = self._kept(key, tau, avail, front)
        return got is not None and cheapest_at(got, *caps(avail)) is not None

    def _kept(self, key: tuple, tau: float, avail: np.ndarray,
              front: Callable[[int, int], tuple[np.ndarray, np.ndarray] | None]
              ) -> tuple[np.ndarray, np.ndarray] | None:
        """Program ``key``'s front under ``tau`` at caps holding ``avail``, computed at the
        ceiling when it is not kept."""
        A, B = caps(avail)
        kept = self._fronts.setdefault(key, {})
        got = kept.get(tau)
        if got is None or got[0] < A or got[1] < B:
            cap = self.ceiling if self.ceiling is not None else avail
            cA, cB = max(A, int(cap[0])), max(B, int(cap[1])) if len(avail) > 1 else 0
            got = kept[tau] = (cA, cB, front(cA, cB))
        return got[2]

    def known(self, key: tuple, avail: np.ndarray, lo: float, hi: float) -> dict[float, bool]:
        """Per bound in [lo, hi] whose front is kept at caps holding ``avail``: whether an
        allocation of program ``key`` within ``avail`` meets it (nothing is computed)."""
        A, B = caps(avail)
        out = {}
        for tau, (cA, cB, f) in self._fronts.get(key, {}).items():
            if lo <= tau <= hi and cA >= A and cB >= B:
                out[tau] = f is not None and cheapest_at(f, A, B) is not None
        return out

    def allocation(self, key: tuple, usage: tuple[int, ...],
                   solve: Callable[[], Allocation | None]) -> Allocation | None:
        """The allocation of program ``key`` with ``usage``, traced once (``solve``)."""
        got = self._allocs.get((key, usage))
        if got is None:
            got = solve()
            if got is not None:
                self._allocs[(key, got.usage)] = got
        return got


def memoised(memo: PoolMemo | None, key: tuple | None, avail: np.ndarray, at_least: float,
              compute) -> list[Allocation]:
    if memo is None or key is None:
        return compute()
    got = memo.get(key, avail, at_least)
    if got is not None:
        return got
    res = compute()  # OutOfTime leaves the memo as it was
    memo.put(key, avail, res)
    return res
