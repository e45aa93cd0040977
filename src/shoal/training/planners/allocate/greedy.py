"""The options a bound allows, the LP bound on the GPUs they need, and the quick greedy fill."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shoal.jit import compiled
from shoal.training.planners.allocate.base import Allocation, Bound, Option, Pool
from shoal.training.planners.allocate.mixes import stage_combos


def allowed_options(opts: list[Option], tau: float, relax: float) -> list[Option]:
    """A stage's options under the bound: per GPU kind only its smallest TP under ``tau`` (for
    the busiest pipelines) and under ``tau * relax`` (for the others), as a larger one uses
    more GPUs of that kind (``keep_options``), by kind, then TP."""
    flat = flatten([opts])
    keep = np.zeros(len(flat.opts), dtype=np.bool_)
    K = max(flat.kinds, default=-1) + 1
    keep_options(flat.start, flat.kinds, flat.tps, flat.times, K, tau, tau * relax, keep,
                 np.empty(K, np.int64))
    return flat.allowed(keep)[0]


class Flat(NamedTuple):
    """A program's stage options as the compiled tests read them: stage s's are
    ``opts[start[s]:start[s + 1]]``, sorted by kind, then TP, with their kinds, TPs and
    times."""

    opts: list[Option]
    start: np.ndarray
    kinds: np.ndarray
    tps: np.ndarray
    times: np.ndarray

    def allowed(self, keep: np.ndarray) -> list[list[Option]]:
        """Per stage, its options marked in ``keep`` (``keep_options``)."""
        edges = self.start.tolist()
        return [[self.opts[i] for i in range(a, b) if keep[i]]
                for a, b in zip(edges, edges[1:], strict=False)]


def flatten(stage_opts: list[list[Option]]) -> Flat:
    opts = [o for st in stage_opts for o in sorted(st, key=lambda o: (o.kind, o.tp))]
    start = np.zeros(len(stage_opts) + 1, dtype=np.int64)
    np.cumsum([len(st) for st in stage_opts], out=start[1:])
    return Flat(opts, start, np.array([o.kind for o in opts], dtype=np.int64),
                 np.array([o.tp for o in opts], dtype=np.int64),
                 np.array([o.time_s for o in opts], dtype=np.float64))


@compiled("i8[::1], i8[::1], i8[::1], f8[::1], i8, f8, f8, b1[::1], i8[::1]")
def keep_options(start, kinds, tps, times, K, tau, tau_relaxed, keep, best):
    """``allowed_options`` for every stage at once, compiled: marks in ``keep`` each stage's options
    it keeps (per kind its smallest TP, then the fastest, within ``tau`` and within
    ``tau_relaxed``); returns whether every stage keeps one within ``tau``. ``best``: K
    scratch (``shoal.jit``: a loop allocates no array)."""
    every = True
    for s in range(len(start) - 1):
        under = False
        for lim in (tau, tau_relaxed):
            best[:] = -1
            for o in range(start[s], start[s + 1]):
                k, b = kinds[o], best[kinds[o]]
                if times[o] <= lim and (b < 0 or tps[o] < tps[b]
                                        or (tps[o] == tps[b] and times[o] < times[b])):
                    best[k] = o
            for k in range(K):
                if best[k] >= 0:
                    keep[best[k]] = True
                    under = under or times[best[k]] <= tau
        every = every and under
    return every


@compiled("i8[::1], i8[::1], i8[::1], f8[::1], b1[::1], f8[::1], f8[::1, :], f8, i8, i8")
def gpu_load(start, kinds, tps, times, keep, avail, W, tau, D, extra):
    """Per weighting of the kinds (``kind_weights``, the columns of ``W``), the GPUs the
    stages need at least over those the pool holds, over the options marked in ``keep``
    (``keep_options``): above 1 under any weighting (a bound of the LP relaxation, through its dual)
    and no allocation fits. Compiled; returns the largest and its weighting (the first of
    equal ones)."""
    K, nW = W.shape
    need = np.zeros(nW)
    for s in range(len(start) - 1):
        for w in range(nW):
            under, over = np.inf, np.inf
            for o in range(start[s], start[s + 1]):
                if keep[o]:
                    v = tps[o] * W[kinds[o], w]
                    if times[o] <= tau:
                        under = min(under, v)
                    else:
                        over = min(over, v)
            least = D * under
            if over < np.inf:  # at most D - extra replicas on an option over the bound
                least = min(least, (D - extra) * over + extra * under)
            need[w] += least
    most, at = -1.0, 0
    for w in range(nW):
        load = 0.0
        if need[w] > 0:
            have = 0.0
            for k in range(K):
                have += avail[k] * W[k, w]
            load = need[w] / have if have > 0 else np.inf
        if load > most:
            most, at = load, w
    return most, at


def each_cheapest(allowed: list[list[Option]], D: int, pool: Pool,
                  bound: Bound) -> Allocation | None:
    """Every stage on its own cheapest combo under the bound, when the pool holds them all
    together: no allocation costs less, so it is the cheapest (else None)."""
    avail, price, region_of = pool
    tau, relax, extra = bound
    K = len(avail)
    usage = np.zeros(K, dtype=np.int64)
    per_stage = []
    for al in allowed:
        combos, CU, ok = stage_combos(al, D, region_of, K, tau, relax, extra)
        idx = np.flatnonzero(ok)
        if len(idx) == 0:
            return None
        c = int(idx[np.argmin(CU[idx] @ price)])
        usage += CU[c]
        per_stage.append(combos[c])
    if (usage > avail).any():
        return None
    return Allocation(tuple(per_stage), tuple(int(u) for u in usage), tau)


@compiled("i8[::1], i8[::1], i8[::1], f8[::1], b1[::1], i8[::1], i8[::1], f8, i8, i8, f8[::1], "
          "i8, i8[::1], i8[:, ::1]")
def greedy(start, kinds, tps, times, keep, region_of, avail, tau, extra, D, weigh, orders,
            left, out):
    """Some allocation under the bound over the options marked in ``keep`` (``keep_options``),
    found quickly or not at all (False says nothing), compiled. The stages are taken in
    ``orders`` orders, each tried with two rules (the smallest share of the GPUs left, and
    the fewest GPUs weighted by ``weigh``). Every order puts the stages that need the most
    GPUs per replica first; among those of equal need, the first order goes by index, the
    second puts first the stages whose kinds differ most in the GPUs a replica takes (a kind
    with no option counting as TP 64), so that the stages that fit any kind alike fill what is
    left, and each further order goes by a fixed hash of the index. Returns whether some
    fill places every stage; the first that does leaves the GPUs it takes from ``avail`` in
    ``left``, and per stage (kind, TP, replicas) of its first option and of its second (kind
    -1: none) in ``out``."""
    S = len(start) - 1
    big = np.int64(1) << np.int64(40)
    need = np.empty(S, np.int64)
    spread = np.empty(S, np.int64)
    per_kind = np.empty(len(avail), np.int64)
    for s in range(S):
        per_kind[:] = big
        for o in range(start[s], start[s + 1]):
            if keep[o] and times[o] <= tau and tps[o] < per_kind[kinds[o]]:
                per_kind[kinds[o]] = tps[o]
        # none within the bound: ``keep_options`` rules that out; no option: TP 64
        least, most = np.int64(64), np.int64(0)
        for k in range(len(avail)):
            tp = per_kind[k] if per_kind[k] < 64 else np.int64(64)
            if tp < least:
                least = tp
            if tp > most:
                most = tp
        need[s], spread[s] = least, most - least
    key = np.empty(S, np.int64)
    order = np.empty(S, np.int64)
    for t in range(2 * orders):
        v = t // 2
        for s in range(S):
            if v == 0:
                tie = np.int64(s)
            elif v == 1:
                tie = (np.int64(64) - spread[s]) * np.int64(S) + s
            else:
                h = (np.int64(s + 1) * np.int64(0x9E3779B1) + np.int64(v) * np.int64(0x85EBCA77)
                     ) & np.int64(0xFFFFFFFF)
                h ^= h >> np.int64(15)
                tie = (h * np.int64(0x2C1B3C6D)) & np.int64(0xFFFFFFFF)
            key[s] = (np.int64(64) - need[s]) * big + tie
        # the stages by key (an insertion sort: numpy's, compiled, costs seconds at a first
        # run; the keys differ unless two hashes meet)
        for s in range(S):
            j = s
            while j > 0 and key[order[j - 1]] > key[s]:
                order[j] = order[j - 1]
                j -= 1
            order[j] = s
        for k in range(len(avail)):  # (an array assigned whole compiles its shape check)
            left[k] = avail[k]
        if fill(start, kinds, tps, times, keep, region_of, left, tau, extra, D, weigh,
                 t % 2 == 1, order, out):
            return True
    return False


@compiled()
def fill(start, kinds, tps, times, keep, region_of, left, tau, extra, D, weigh, weighted,
          order, out):
    """``greedy``'s fill of the stages in ``order``: each given the option, or the pair of
    options of one region (as many replicas on the first as fit), that takes the smallest
    share of the GPUs ``left`` (or, ``weighted``, the fewest GPUs weighted by ``weigh``)."""
    for i in order:
        best_share = np.inf
        pick_a, pick_b, pick_na = -1, -1, 0
        for a in range(start[i], start[i + 1]):
            if not keep[a]:
                continue
            ka = kinds[a]
            cap_a = D - extra if times[a] > tau else D
            for b in range(start[i], start[i + 1]):
                if not keep[b]:
                    continue
                kb = kinds[b]
                if b == a:
                    if cap_a < D:
                        continue
                    na, nb = D, 0
                elif region_of[ka] != region_of[kb] or (times[a] > tau and times[b] > tau):
                    continue
                else:
                    na = min(cap_a, D - 1, left[ka] // tps[a])
                    nb = D - na
                    if na < 1 or (times[b] > tau and nb > D - extra):
                        continue
                ua, ub = na * tps[a], nb * tps[b]
                if b == a or ka == kb:
                    if ua + ub > left[ka]:
                        continue
                    share = ((ua + ub) * weigh[ka] if weighted
                             else (ua + ub) / max(left[ka], 1))
                else:
                    if ua > left[ka] or ub > left[kb]:
                        continue
                    share = (ua * weigh[ka] + ub * weigh[kb] if weighted
                             else ua / max(left[ka], 1) + ub / max(left[kb], 1))
                if share < best_share:
                    best_share, pick_a, pick_b, pick_na = share, a, b, na
        if pick_a < 0:
            return False
        a, b, na = pick_a, pick_b, pick_na
        out[i, 0], out[i, 1], out[i, 2] = kinds[a], tps[a], na
        left[kinds[a]] -= na * tps[a]
        if b == a:
            out[i, 3], out[i, 4], out[i, 5] = -1, 0, 0
        else:
            out[i, 3], out[i, 4], out[i, 5] = kinds[b], tps[b], D - na
            left[kinds[b]] -= (D - na) * tps[b]
    return True
