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

import time
from dataclasses import dataclass
from functools import cache

import numpy as np

_BIG = np.iinfo(np.int64).max
MAX_FRONT = 4000  # usage vectors kept per stage (the cheapest first) when kinds are many
MEMO_POOLS = 6  # pools remembered per PoolMemo key
GRID_WORK = 50_000_000  # grid cells x sweep steps up to which three kinds' fronts use a grid


class OutOfTime(Exception):
    """A program passed its caller's deadline (``time.perf_counter`` seconds); nothing of it
    is kept."""


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
                combos.extend(((a, na), (b, D - na)) for na in range(1, D))
    use = np.zeros((len(combos), K), dtype=np.int64)
    # per combo: the faster option's time, the slower one's, and how many replicas are slower
    t_fast, t_slow, n_slow = np.zeros(len(combos)), np.zeros(len(combos)), np.zeros(len(combos))
    for c, combo in enumerate(combos):
        for o, n in combo:
            use[c, o.kind] += n * o.tp
        if len(combo) == 1:
            t_fast[c] = t_slow[c] = combo[0][0].time_s
        else:
            (fa, _), (sl, ns) = sorted(combo, key=lambda x: x[0].time_s)
            t_fast[c], t_slow[c], n_slow[c] = fa.time_s, sl.time_s, ns
    return combos, use, t_fast, t_slow, n_slow


_CHUNK = 256


def _prune(U: np.ndarray, price: np.ndarray) -> np.ndarray:
    """Indices of usage vectors not dominated by another (no more of every kind), cheapest
    first; at most MAX_FRONT kept."""
    K = U.shape[1]
    if K == 1:
        return np.array([int(np.argmin(U[:, 0]))])
    if K == 2:
        order = np.lexsort((U[:, 1], U[:, 0]))
        u1 = U[order, 1]
        prev_min = np.minimum.accumulate(np.concatenate([[_BIG], u1[:-1]]))
        return order[u1 < prev_min]
    order = np.argsort(U @ price, kind="stable")
    # In cost order, a vector is dominated only by cheaper (or equal, earlier) ones, and
    # domination is transitive, so a chunk's survivors are those no kept vector and no earlier
    # vector of the chunk dominates.
    kept: list[int] = []
    kept_rows = np.empty((0, K), dtype=U.dtype)
    for c in range(0, len(order), _CHUNK):
        idx = order[c:c + _CHUNK]
        rows = U[idx]
        dom = (kept_rows[None, :, :] <= rows[:, None, :]).all(axis=2).any(axis=1)
        inner = (rows[None, :, :] <= rows[:, None, :]).all(axis=2)  # [i, j]: j <= i everywhere
        inner &= np.tri(len(idx), k=-1, dtype=bool)  # only earlier j
        dom |= inner.any(axis=1)
        new = idx[~dom][:MAX_FRONT - len(kept)]
        kept += new.tolist()
        kept_rows = U[kept]
        if len(kept) >= MAX_FRONT:
            _truncated[0] = True
            break
    return np.array(kept)


def _grid_fits(U: np.ndarray) -> bool:
    """Whether ``_prune3`` takes three kinds' vectors in time: small counts (grid cells times
    at most as many sweep steps as the first kind's largest count)."""
    return (U.shape[1] == 3 and (int(U[:, 1].max()) + 1) * (int(U[:, 2].max()) + 1)
            * (int(U[:, 0].max()) + 1) <= GRID_WORK)


def _prune3(U: np.ndarray, price: np.ndarray) -> np.ndarray:
    """``_prune`` of ``np.unique(U, axis=0)`` for three kinds, as indices into ``U`` (the first
    of equal vectors), in the same order: by cost, then by the vector."""
    keep = np.flatnonzero(_front3(U))
    keep = keep[np.lexsort((U[keep, 2], U[keep, 1], U[keep, 0], U[keep] @ price))]
    if len(keep) > MAX_FRONT:
        _truncated[0] = True
    return keep[:MAX_FRONT]


def _front3(U: np.ndarray) -> np.ndarray:
    """Mask of the usage vectors of three kinds that no other vector dominates (of equal ones,
    the first): a sweep over the first kind's counts, with a grid of the (second, third) counts
    the vectors swept so far dominate."""
    a, b, c = U[:, 0], U[:, 1], U[:, 2]
    covered = np.zeros((int(b.max()) + 1, int(c.max()) + 1), dtype=bool)
    keep = np.zeros(len(U), dtype=bool)
    order = np.lexsort((c, b, a))
    starts = np.flatnonzero(np.diff(a[order], prepend=-1))
    for lo, hi in zip(starts, [*starts[1:], len(order)], strict=True):
        g = order[lo:hi]  # one count of the first kind, by (second, third)
        gc = c[g]
        prev = np.minimum.accumulate(np.concatenate([[_BIG], gc[:-1]]))
        ok = (gc < prev) & ~covered[b[g], c[g]]
        keep[g[ok]] = True
        if ok.any():
            mark = np.zeros_like(covered)
            mark[b[g[ok]], c[g[ok]]] = True
            covered |= np.logical_or.accumulate(np.logical_or.accumulate(mark, axis=0), axis=1)
    return keep


def slots(D: int, total: int | None) -> tuple[float, int]:
    """(relax, extra): ``extra`` of the D pipelines run one microbatch more than the rest (the
    fastest replicas' pipelines); a replica on one of the others may be ``relax`` times slower
    than the bound and still finish its microbatches as early."""
    if not total or total < D:
        return 1.0, 0
    lo, extra = divmod(total, D)
    return ((lo + 1) / lo if extra else 1.0), extra


@cache
def _weights(K: int) -> np.ndarray:
    """(K, W) per-kind weights for the completion test of ``_solve``: every 0/1 vector but
    zero when kinds are few, else each kind alone and all together."""
    if K <= 6:
        rows = [[(m >> k) & 1 for k in range(K)] for m in range(1, 2 ** K)]
    else:
        rows = [*np.eye(K, dtype=int).tolist(), [1] * K]
    return np.array(rows, dtype=np.int64).T


def _solve(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
           region_of: list[int], tau: float, total: int | None = None,
           deadline: float | None = None) -> Allocation | None:
    """Cheapest allocation in which every replica finishes its pipeline's microbatches within
    those of a replica taking ``tau`` per microbatch in the busiest pipeline (with ``total``
    microbatches shared as by ``build.shares``; without, every replica takes at most ``tau``).
    Raises OutOfTime once past ``deadline``."""
    K = len(avail)
    relax, extra = slots(D, total)
    def stage_combos(opts: list[Option]):
        """The stage's combos and their usage (those the bound forbids: too much), and the
        usage of the allowed ones; None when none is allowed."""
        # per GPU kind only its smallest TP under the bound (for the busiest pipelines) and under
        # the relaxed bound (for the others): a larger one uses more GPUs of that kind
        pick: dict[tuple[int, bool], Option] = {}
        for o in opts:
            for slow, lim in ((False, tau), (True, tau * relax)):
                cur = pick.get((o.kind, slow))
                if o.time_s <= lim and (cur is None or (o.tp, o.time_s) < (cur.tp, cur.time_s)):
                    pick[(o.kind, slow)] = o
        if not pick:
            return None
        allowed = sorted(set(pick.values()), key=lambda o: (o.kind, o.tp))
        combos, CU, t_fast, t_slow, n_slow = _combos(tuple(allowed), D, tuple(region_of), K)
        # the slower replicas take the first pipelines: relaxed only if all of those run fewer
        ok_c = (t_fast <= tau) & np.where(n_slow <= D - extra, t_slow <= tau * relax,
                                          t_slow <= tau)
        if not ok_c.any():
            return None
        return combos, np.where(ok_c[:, None], CU, _BIG // 4), CU[ok_c]

    later = None
    if K >= 3:
        # with three kinds or more the fronts grow large: a partial allocation that leaves
        # fewer GPUs (weighed per kind, ``_weights``) than the later stages need at least is
        # dropped, as it cannot be completed
        stages = [stage_combos(opts) for opts in stage_opts]
        if any(st is None for st in stages):
            return None
        W = _weights(K)
        cap = avail @ W
        later = np.zeros((len(stages) + 1, W.shape[1]), dtype=np.int64)
        for i in range(len(stages) - 1, -1, -1):
            later[i] = later[i + 1] + (stages[i][2] @ W).min(axis=0)
    U = np.zeros((1, K), dtype=np.int64)
    back: list[tuple[np.ndarray, np.ndarray, list]] = []
    for i, opts in enumerate(stage_opts):
        if deadline is not None and time.perf_counter() > deadline:
            raise OutOfTime
        st = stages[i] if later is not None else stage_combos(opts)
        if st is None:
            return None
        combos, CU, CU_ok = st
        new = (U[:, None, :] + CU[None, :, :]).reshape(-1, K)
        fits = new[:, 0] <= avail[0]
        for k in range(1, K):
            fits &= new[:, k] <= avail[k]
        ok = np.nonzero(fits)[0]
        if later is not None and len(ok):
            room = cap - later[i + 1]
            if ((U.max(axis=0) + CU_ok.max(axis=0)) @ W > room).any():
                ok = ok[(new[ok].astype(float) @ W <= room).all(axis=1)]
        if len(ok) == 0:
            return None
        new = new[ok]
        if K <= 2:  # the Pareto sweep also drops duplicates
            keep = _prune(new, price)
        elif _grid_fits(new):
            keep = _prune3(new, price)
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
    return Allocation(tuple(per_stage), tuple(int(x) for x in U[best]), tau)


class PoolMemo:
    """Allocations found on one pool, reused on smaller pools. A smaller pool allows a subset of
    the allocations, and the dynamic program visits and orders the ones both allow alike, so an
    allocation found on a pool (the fastest, or the cheapest under a bound) that fits a smaller
    pool is the one the smaller pool gives; none stays none. A result is also reused only when
    its bottleneck is at or above the caller's ``at_least``. ``key`` names the stage options
    (the caller's: plan shape, degree, ...); prices, regions and the kinds they index are fixed
    per memo (``Space.alloc_memo``). Only exact programs are remembered (MAX_FRONT never cut)."""

    def __init__(self) -> None:
        self._d: dict[tuple, list[tuple[np.ndarray, list[Allocation]]]] = {}

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


_truncated = [False]  # set when a program cut its front at MAX_FRONT (its result is not memoised)


def _memoised(memo: PoolMemo | None, key: tuple | None, avail: np.ndarray, at_least: float,
              compute) -> list[Allocation]:
    if memo is None or key is None:
        return compute()
    got = memo.get(key, avail, at_least)
    if got is not None:
        return got
    _truncated[0] = False
    res = compute()
    if not _truncated[0]:
        memo.put(key, avail, res)
    return res


def fastest(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
            region_of: list[int], at_least: float = 0.0,
            total: int | None = None, memo: PoolMemo | None = None,
            key: tuple | None = None, deadline: float | None = None) -> Allocation | None:
    """The allocation with the smallest slowest-replica time (then the cheapest).

    ``at_least``: a known lower bound on that time (a caller's relaxation); the bisection over
    the stage times starts there. ``memo``, ``key``: see PoolMemo. Raises OutOfTime once past
    ``deadline`` (``time.perf_counter`` seconds)."""
    got = _memoised(memo, None if key is None else ("fastest", D, total, *key), avail, at_least,
                    lambda: [a] if (a := _fastest(stage_opts, D, avail, price, region_of,
                                                  at_least, total, deadline)) else [])
    return got[0] if got else None


def _fastest(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
             region_of: list[int], at_least: float, total: int | None,
             deadline: float | None = None) -> Allocation | None:
    relax, _ = slots(D, total)
    taus = sorted({t for opts in stage_opts for o in opts for t in (o.time_s, o.time_s / relax)})
    if not taus:
        return None
    # no bound below the slowest stage's fastest option can be met
    floor = max(max(min(o.time_s for o in opts) for opts in stage_opts) / relax, at_least)
    lo = int(np.searchsorted(taus, floor - 1e-15 * max(floor, 1.0)))
    hi = len(taus) - 1
    lo = min(lo, hi)  # a bound above every stage time: the answer does not depend on it
    best = _solve(stage_opts, D, avail, price, region_of, taus[hi], total, deadline)
    if best is None:
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        a = _solve(stage_opts, D, avail, price, region_of, taus[mid], total, deadline)
        if a is not None:
            hi, best = mid, a
        else:
            lo = mid + 1
    return best


def tradeoffs(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
              region_of: list[int], levels: int = 6, at_least: float = 0.0,
              total: int | None = None, memo: PoolMemo | None = None,
              key: tuple | None = None, deadline: float | None = None) -> list[Allocation]:
    """Cheapest allocations under several bottleneck bounds, from the fastest feasible up:
    the time-cost trade-offs of one plan shape. ``memo``, ``key``: see PoolMemo; ``deadline``:
    see ``fastest``."""
    return _memoised(memo, None if key is None else ("tradeoffs", D, total, levels, *key), avail,
                     at_least, lambda: _tradeoffs(stage_opts, D, avail, price, region_of, levels,
                                                  at_least, total, deadline))


def _tradeoffs(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
               region_of: list[int], levels: int, at_least: float,
               total: int | None, deadline: float | None = None) -> list[Allocation]:
    best = _fastest(stage_opts, D, avail, price, region_of, at_least, total, deadline)
    if best is None:
        return []
    relax, _ = slots(D, total)
    taus = sorted({t for opts in stage_opts for o in opts for t in (o.time_s, o.time_s / relax)
                   if t >= best.bottleneck_s})
    pick = sorted(set(np.linspace(0, len(taus) - 1, min(levels, len(taus))).round().astype(int)))
    out = [best]
    for i in pick[1:]:
        a = _solve(stage_opts, D, avail, price, region_of, taus[i], total, deadline)
        if a is not None and a.usage != out[-1].usage:
            out.append(a)
    return out


def upgraded(alloc: Allocation, stage_opts: list[list[Option]], avail: np.ndarray,
             region_of: list[int] | None = None) -> Allocation:
    """``alloc`` with its replicas moved to faster options while the pool has GPUs left, the
    slowest stage first: to a larger TP of the same GPU kind, and, given ``region_of``, to a
    faster kind of the same region. The bottleneck program picks the cheapest replicas that
    meet the bound, but shorter non-bottleneck stages also shorten the pipeline's fill and
    drain."""
    left = avail - np.asarray(alloc.usage)
    per_stage = [list(st) for st in alloc.per_stage]
    time_of = [{(o.kind, o.tp): o.time_s for o in opts} for opts in stage_opts]

    def extra(k: int, tp: int, k2: int, tp2: int, n: int) -> int | None:
        """GPUs of ``k2`` the move takes (None: not allowed)."""
        if k2 == k:
            return n * (tp2 - tp) if tp2 > tp else None
        if region_of is None or region_of[k2] != region_of[k]:
            return None
        return n * tp2

    changed = True
    while changed:
        changed = False
        order = sorted(range(len(per_stage)), key=lambda i: -max(
            time_of[i][(k, tp)] for k, tp, _ in per_stage[i]))
        for i in order:
            for k, tp, n in per_stage[i]:
                faster = []
                for (k2, tp2), t2 in time_of[i].items():
                    take = extra(k, tp, k2, tp2, n)
                    if take is not None and t2 < time_of[i][(k, tp)] and take <= left[k2]:
                        faster.append((t2, k2, tp2, take))
                if faster:
                    _, k2, tp2, take = min(faster)
                    left[k2] -= take
                    if k2 != k:
                        left[k] += n * tp
                    # the moved replicas join any the stage already has of (k2, tp2)
                    have = sum(c for kk, tt, c in per_stage[i] if (kk, tt) == (k2, tp2))
                    per_stage[i] = [*(e for e in per_stage[i]
                                      if (e[0], e[1]) not in ((k, tp), (k2, tp2))),
                                    (k2, tp2, n + have)]
                    changed = True
                    break
            if changed:
                break
    usage = tuple(int(x) for x in avail - left)
    return Allocation(tuple(tuple(st) for st in per_stage), usage, alloc.bottleneck_s)
