"""Resource-stage assignment (Sailor §4.2.2, Eq. 1, Listing 1), as a dynamic program over
stages on the GPUs still free, per resource kind (GPU type in a region).

Each stage gets D replicas, each of one kind at that kind's smallest fitting TP for the stage
(H1, H2), all in one region (H5; zones of a region are one pool, H6). For a bound ``tau`` on the
per-microbatch time of the slowest replica, the program keeps, after each stage, the set of
GPU-usage vectors that are not dominated (using no more of every kind than another), so
feasibility and the cheapest allocation are exact; the smallest feasible ``tau`` is found by
bisection over the distinct stage times (feasibility is monotone in ``tau``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import numpy as np

MAX_FRONT = 4000  # usage vectors kept per stage (the cheapest first) when kinds are many


@dataclass(frozen=True)
class Option:
    kind: int  # index into the kinds
    tp: int
    time_s: float  # per microbatch, forward + backward, one replica


@dataclass(frozen=True)
class Allocation:
    per_stage: tuple[tuple[tuple[int, int, int], ...], ...]  # per stage: (kind, tp, count)
    usage: tuple[int, ...]
    bottleneck_s: float


@cache
def _combos(opts: tuple[Option, ...], D: int, region_of: tuple[int, ...], K: int):
    """Ways to give a stage D replicas from options of one region, mixing at most two GPU kinds:
    (list of combos as ((option, count), ...), usage matrix (combos, K))."""
    by_region: dict[int, list[Option]] = {}
    for o in opts:
        by_region.setdefault(region_of[o.kind], []).append(o)
    combos: list[tuple[tuple[Option, int], ...]] = []
    for ros in by_region.values():
        for i, a in enumerate(ros):
            combos.append(((a, D),))
            for b in ros[i + 1:]:
                if b.kind == a.kind:
                    continue  # one TP per GPU type in a stage: mixing TPs of one type never pays
                combos.extend(((a, na), (b, D - na)) for na in range(1, D))
    use = np.zeros((len(combos), K), dtype=np.int64)
    for c, combo in enumerate(combos):
        for o, n in combo:
            use[c, o.kind] += n * o.tp
    return combos, use


def _prune(U: np.ndarray, price: np.ndarray) -> np.ndarray:
    """Indices of usage vectors not dominated by another (no more of every kind), cheapest
    first; at most MAX_FRONT kept."""
    K = U.shape[1]
    if K == 1:
        return np.array([int(np.argmin(U[:, 0]))])
    if K == 2:
        order = np.lexsort((U[:, 1], U[:, 0]))
        u1 = U[order, 1]
        prev_min = np.minimum.accumulate(np.concatenate([[np.iinfo(np.int64).max], u1[:-1]]))
        return order[u1 < prev_min]
    order = np.argsort(U @ price, kind="stable")
    kept: list[int] = []
    for i in order:
        if kept and np.all(U[kept] <= U[i], axis=1).any():
            continue
        kept.append(int(i))
        if len(kept) >= MAX_FRONT:
            break
    return np.array(kept)


def _solve(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
           region_of: list[int], tau: float) -> Allocation | None:
    """Cheapest allocation whose slowest replica takes at most ``tau`` per microbatch."""
    K = len(avail)
    U = np.zeros((1, K), dtype=np.int64)
    back: list[tuple[np.ndarray, np.ndarray, list]] = []
    for opts in stage_opts:
        allowed = [o for o in opts if o.time_s <= tau]
        if not allowed:
            return None
        combos, CU = _combos(tuple(allowed), D, tuple(region_of), K)
        new = (U[:, None, :] + CU[None, :, :]).reshape(-1, K)
        fits = new[:, 0] <= avail[0]
        for k in range(1, K):
            fits &= new[:, k] <= avail[k]
        ok = np.nonzero(fits)[0]
        if len(ok) == 0:
            return None
        new = new[ok]
        if K <= 2:  # the Pareto sweep also drops duplicates
            keep = _prune(new, price)
        else:
            _, first = np.unique(new, axis=0, return_index=True)
            keep = first[_prune(new[first], price)]
        parent, combo = np.divmod(ok[keep], len(combos))
        U = new[keep]
        back.append((parent, combo, combos))
    best = int(np.argmin(U @ price))
    per_stage = []
    idx = best
    for parent, combo, combos in reversed(back):
        per_stage.append(tuple((o.kind, o.tp, n) for o, n in combos[combo[idx]]))
        idx = parent[idx]
    per_stage.reverse()
    return Allocation(tuple(per_stage), tuple(int(x) for x in U[best]),
                      _bottleneck(stage_opts, per_stage))


def _bottleneck(stage_opts, per_stage) -> float:
    worst = 0.0
    for opts, st in zip(stage_opts, per_stage, strict=True):
        for k, tp, _ in st:
            worst = max(worst, next(o.time_s for o in opts if o.kind == k and o.tp == tp))
    return worst


def fastest(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
            region_of: list[int]) -> Allocation | None:
    """The allocation with the smallest slowest-replica time (then the cheapest)."""
    taus = sorted({o.time_s for opts in stage_opts for o in opts})
    if not taus:
        return None
    best = _solve(stage_opts, D, avail, price, region_of, taus[-1])
    if best is None:
        return None
    # no bound below the slowest stage's fastest option can be met
    floor = max(min(o.time_s for o in opts) for opts in stage_opts)
    lo, hi = taus.index(floor), len(taus) - 1  # taus[hi] is feasible
    while lo < hi:
        mid = (lo + hi) // 2
        a = _solve(stage_opts, D, avail, price, region_of, taus[mid])
        if a is not None:
            hi, best = mid, a
        else:
            lo = mid + 1
    return best


def tradeoffs(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
              region_of: list[int], levels: int = 6) -> list[Allocation]:
    """Cheapest allocations under several bottleneck bounds, from the fastest feasible up:
    the time-cost trade-offs of one plan shape."""
    best = fastest(stage_opts, D, avail, price, region_of)
    if best is None:
        return []
    taus = sorted({o.time_s for opts in stage_opts for o in opts if o.time_s >= best.bottleneck_s})
    pick = sorted(set(np.linspace(0, len(taus) - 1, min(levels, len(taus))).round().astype(int)))
    out = [best]
    for i in pick[1:]:
        a = _solve(stage_opts, D, avail, price, region_of, taus[i])
        if a is not None and a.usage != out[-1].usage:
            out.append(a)
    return out
