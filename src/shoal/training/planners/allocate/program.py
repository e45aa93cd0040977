"""One allocation problem at any bound: the fastest allocation and the time-cost
trade-offs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from shoal.training.planners.allocate.base import DP_KINDS, Allocation, Option, OutOfTime, Pool, caps, slots
from shoal.training.planners.allocate.dp import (
    Tables,
    dp_front,
    scratch,
    search_taus,
    tables_of,
    trace,
)
from shoal.training.planners.allocate.greedy import Flat, flatten
from shoal.training.planners.allocate.memo import Fronts, Memoised, PoolMemo, memoised
from shoal.training.planners.allocate.solve import solve_exact


@dataclass
class Program:
    """One allocation problem at any bound ``tau``: ``solve(tau)`` is ``solve_at``'s allocation
    and ``usage(tau)`` its GPU usage, both read from the memo's ``Fronts`` when there is one
    (one or two kinds)."""

    stage_opts: list[list[Option]]
    D: int
    pool: Pool
    total: int | None
    deadline: float | None
    memo: PoolMemo | None = None
    key: tuple | None = None
    most: np.ndarray | None = None  # ``most_used`` of the options (None: not computed)
    _solved: dict[tuple[float, bool], Allocation | None] = field(default_factory=dict)
    _back: dict[float, list] = field(default_factory=dict)  # choices of the fronts computed
    _tables: Tables | None = None
    _flat: Flat | None = None

    @property
    def avail(self) -> np.ndarray:
        return self.pool.avail

    @property
    def price(self) -> np.ndarray:
        return self.pool.price

    @property
    def region_of(self) -> list[int]:
        return self.pool.region_of

    @property
    def fronts(self) -> Fronts | None:
        if self.memo is None or self.key is None or len(self.avail) > DP_KINDS:
            return None
        return self.memo.fronts

    def _solve(self, tau: float, cheapest: bool = True) -> Allocation | None:
        if (tau, cheapest) not in self._solved:
            if self._flat is None and len(self.avail) > DP_KINDS:
                self._flat = flatten(self.stage_opts)
            got, exact = solve_exact(self.stage_opts, self.D, self.pool, tau, self.total,
                                     self.deadline, cheapest, self._flat)
            self._solved[(tau, cheapest)] = got
            if exact:
                self._solved[(tau, True)] = got
        return self._solved[(tau, cheapest)]

    def tables(self) -> Tables:
        """The program's ``Tables`` (kept with the fronts when there are fronts)."""
        if self._tables is None:
            fronts = self.fronts
            self._tables = (tables_of(self.stage_opts, self.D, self.region_of) if fronts is None
                            else fronts.tables((*self.key, self.D), lambda: tables_of(
                                self.stage_opts, self.D, self.region_of)))
        return self._tables

    def _front(self, tau: float, A: int, B: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The dynamic program's last front at caps (A, B), or at what the options can use
        when that is less (the same front: no allocation uses more)."""
        if self.most is not None:
            A, B = min(A, int(self.most[0])), min(B, int(self.most[1])) if len(self.most) > 1 else B
        relax, extra = slots(self.D, self.total)
        back = self._back[tau] = []
        return dp_front(self.tables(), A, B, tau, relax, extra, self.deadline, back)

    def search(self, taus: list[float], lo: int, hi: int, near: bool, check_hi: bool) -> int:
        """``fastest_of``'s search over ``taus[lo..hi]`` for the least bound some allocation
        meets (-1: not even ``taus[hi]``, when ``check_hi``; else ``taus[hi]`` is known to be
        met), each test the dynamic program at the pool's caps, all in one compiled call (one
        or two kinds): from a caller's bound (``near``), ``lo`` first, then bounds 1, 3, 7, ...
        above it, then a bisection."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfTime
        t = self.tables()
        relax, extra = slots(self.D, self.total)
        A, B = caps(self.avail)
        ca, cb = t.ca, t.cb
        if len(self.avail) > 1 and B < A:
            # whether a bound is met does not depend on which kind the program indexes its
            # arrays by: the one with fewer GPUs (unlike the allocation traced back, which
            # depends on how ties are broken, so ``_front`` keeps the order)
            A, B, ca, cb = B, A, cb, ca
        return int(search_taus(t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart,
                                t.cend, t.ia, t.ib, t.na, ca, cb, t.K,
                                np.asarray(taus, dtype=np.float64), lo, hi, near, check_hi,
                                relax, t.D - extra, t.D, A, B, *scratch(t, A)))

    def usage(self, tau: float) -> tuple[int, ...] | None:
        """The usage of ``solve_at(tau)`` (under three kinds or more, of any allocation under
        ``tau``: a feasibility test)."""
        fronts = self.fronts
        if fronts is None:
            a = self._solve(tau, cheapest=len(self.avail) <= DP_KINDS)
            return None if a is None else a.usage
        return fronts.usage((*self.key, self.D, self.total), tau, self.avail, self.price,
                            lambda A, B: self._front(tau, A, B))

    def feasible(self, tau: float) -> bool:
        """Whether some allocation meets ``tau`` (``usage`` is not None)."""
        fronts = self.fronts
        if fronts is None:
            return self.usage(tau) is not None
        return fronts.feasible((*self.key, self.D, self.total), tau, self.avail,
                               lambda A, B: self._front(tau, A, B))

    def known(self, lo: float, hi: float) -> dict[float, bool]:
        """``Fronts.known`` for this program (nothing without fronts)."""
        fronts = self.fronts
        return {} if fronts is None else fronts.known((*self.key, self.D, self.total),
                                                     self.avail, lo, hi)

    def solve(self, tau: float, use: tuple[int, ...] | None = None) -> Allocation | None:
        """``solve``'s allocation under ``tau`` (``use``: its usage, when already read)."""
        fronts = self.fronts
        if fronts is None:
            return self._solve(tau)
        use = use or self.usage(tau)
        if use is None:
            return None
        return fronts.allocation((*self.key, self.D, self.total, tau), use,
                                 lambda: self._traced(tau, use, fronts))

    def met(self, tau: float) -> Allocation | None:
        """An allocation under ``tau``: the one a feasibility test found there, else
        ``solve``'s."""
        got = self._solved.get((tau, False))
        return got if got is not None else self.solve(tau)

    def _traced(self, tau: float, use: tuple[int, ...], fronts: Fronts) -> Allocation:
        """The allocation with ``use`` under ``tau``, traced back through the choices of a
        front at caps holding the pool (the same at any such caps)."""
        if tau not in self._back:
            cap = self.avail if fronts.ceiling is None else np.maximum(self.avail,
                                                                       fronts.ceiling)
            self._front(tau, *caps(cap))
        return trace(self._back[tau], use, tau)


def fastest_of(prog: Program, at_least: float, cheapest: bool = True) -> Allocation | None:
    """The search over the stage times asks only whether a bound can be met (the fronts
    answer that for one or two kinds, beyond them the LP bound, the dynamic program when the
    bound leaves one or two kinds, a quick greedy fill, else the MIP, which finds the cheapest
    allocation then: ``solve_exact``); the cheapest allocation is found once, at the bound
    found. It bisects, except from a caller's bound (``at_least``), where the answer mostly
    is or is a few bounds above: that bound is tried first, then bounds 1, 3, 7, ... above
    it until one is met, then the bisection narrows the last step. Feasibility is monotone
    in the bound, so the answer is the same either way. ``cheapest`` False: the allocation
    found at that bound (``Program.met``)."""
    taus, index, least = bounds_of(prog)
    take = prog.solve if cheapest else prog.met
    if not taus:
        return None
    floor = max(least, at_least)
    lo = int(np.searchsorted(taus, floor - 1e-15 * max(floor, 1.0)))
    hi = len(taus) - 1
    lo = min(lo, hi)  # a bound above every stage time: the answer does not depend on it
    # bounds whose fronts are kept narrow the bisection (feasibility is monotone in the bound)
    klo, khi = lo, hi + 1  # above the last bound kept infeasible; the first kept feasible
    for t, ok in prog.known(taus[lo], taus[hi]).items():
        i = index.get(t, -1)
        if lo <= i <= hi:
            if ok:
                khi = min(khi, i)
            else:
                klo = max(klo, i + 1)
    near, check_hi = False, False
    if khi <= hi and klo <= khi:
        lo, hi = klo, khi  # the bound at hi is met
    elif khi > hi:
        if klo > hi:
            return None  # not even the largest bound is met
        lo = klo
        near = at_least > 0.0  # a caller's bound: the answer is mostly at it or a few above
        check_hi = True
    else:
        check_hi = True  # kept fronts that disagree: they are not used
    if prog.fronts is not None:
        found = prog.search(taus, lo, hi, near, check_hi)
        return None if found < 0 else prog.solve(taus[found])
    if near and lo < hi and prog.feasible(taus[lo]):
        return take(taus[lo])
    if check_hi and not prog.feasible(taus[hi]):
        return None  # not even the largest bound is met
    # from a caller's bound, gallop up from the first bound, then bisect
    step = 1
    while near and lo < hi:
        probe = min(lo + step, hi)
        if probe == hi or prog.feasible(taus[probe]):
            hi = probe
            break
        lo, step = probe, 2 * step
    lo += 1 if near and lo < hi else 0
    while lo < hi:
        mid = (lo + hi) // 2
        if prog.feasible(taus[mid]):
            hi = mid
        else:
            lo = mid + 1
    return take(taus[hi])


def bounds_of(prog: Program) -> tuple[list[float], dict[float, int], float]:
    """The bounds ``fastest_of`` searches over: every stage time, and every one over the
    slower pipelines' slack (``slots``), ascending, with their positions; and the least bound
    that can be met (the slowest stage's fastest option, over that slack). Kept per program in
    the memo."""
    key = None if prog.memo is None or prog.key is None else (*prog.key, prog.D, prog.total)
    got = None if key is None else prog.memo.bounds.get(key)
    if got is None:
        relax, _ = slots(prog.D, prog.total)
        opts = prog.stage_opts
        taus = sorted({t for st in opts for o in st for t in (o.time_s, o.time_s / relax)})
        least = max(min(o.time_s for o in st) for st in opts) / relax if taus else 0.0
        got = (taus, {t: i for i, t in enumerate(taus)}, least)
        if key is not None:
            prog.memo.bounds[key] = got
    return got


def most_used(stage_opts: list[list[Option]], D: int, kinds: int) -> np.ndarray:
    """The most GPUs of each kind an allocation of these options can use: ``D`` replicas of
    the kind's widest TP on every stage that offers it (each stage has ``D`` replicas)."""
    cap = np.zeros(kinds, dtype=np.int64)
    for opts in stage_opts:
        widest: dict[int, int] = {}
        for o in opts:
            widest[o.kind] = max(widest.get(o.kind, 0), o.tp)
        for k, tp in widest.items():
            cap[k] += D * tp
    return cap


def program(stage_opts: list[list[Option]], D: int, pool: Pool, total: int | None,
            deadline: float | None, memo: Memoised | None) -> Program:
    """The program of these options on ``pool`` as far as they can use it (``most_used``): a
    pool of 10^5 GPUs then costs what a pool of the job's size costs (the dynamic program's
    states and the memo's keys are GPU counts)."""
    memo_, key = memo or (None, None)
    if memo_ is None or key is None:
        most = most_used(stage_opts, D, len(pool.avail))
    else:  # the key names the options
        most = memo_.most.get(k := (key, D))
        if most is None:
            most = memo_.most[k] = most_used(stage_opts, D, len(pool.avail))
    avail = np.minimum(pool.avail, most).astype(pool.avail.dtype)
    if not np.array_equal(avail, pool.avail):
        pool = pool._replace(avail=avail)
    return Program(stage_opts, D, pool, total, deadline, memo_, key, most)


def fastest(stage_opts: list[list[Option]], D: int, pool: Pool, at_least: float = 0.0,
            total: int | None = None, memo: Memoised | None = None,
            deadline: float | None = None, cheapest: bool = True) -> Allocation | None:
    """The allocation with the smallest slowest-replica time (then the cheapest).

    ``at_least``: a known lower bound on that time (a caller's relaxation); the bisection over
    the stage times starts there. ``memo``: see PoolMemo. Raises OutOfTime once past
    ``deadline`` (``time.perf_counter`` seconds). ``cheapest`` False: of the allocations with
    that time, the one the search met (on three kinds or more, the greedy fill's when it
    found one, which spares the MIP that finds the cheapest); not kept in the memo, whose
    allocations are the cheapest."""
    prog = program(stage_opts, D, pool, total, deadline, memo)
    if not cheapest and len(pool.avail) > DP_KINDS:
        return fastest_of(prog, at_least, cheapest=False)
    memo_, key = memo or (None, None)
    got = memoised(memo_, None if key is None else ("fastest", D, total, *key), prog.avail,
                   at_least, lambda: [a] if (a := fastest_of(prog, at_least)) else [])
    return got[0] if got else None


def tradeoffs(stage_opts: list[list[Option]], D: int, pool: Pool, levels: int = 6,
              at_least: float = 0.0, total: int | None = None, memo: Memoised | None = None,
              deadline: float | None = None) -> list[Allocation]:
    """Cheapest allocations under several bottleneck bounds, from the fastest feasible up:
    the time-cost trade-offs of one plan shape. ``memo``: see PoolMemo; ``deadline``:
    see ``fastest``."""
    prog = program(stage_opts, D, pool, total, deadline, memo)
    memo_, key = memo or (None, None)
    return memoised(memo_, None if key is None else ("tradeoffs", D, total, levels, *key),
                    prog.avail, at_least, lambda: tradeoffs_of(prog, levels, at_least))


def tradeoffs_of(prog: Program, levels: int, at_least: float) -> list[Allocation]:
    best = fastest_of(prog, at_least)
    if best is None:
        return []
    relax, _ = slots(prog.D, prog.total)
    taus = sorted({t for opts in prog.stage_opts for o in opts
                   for t in (o.time_s, o.time_s / relax) if t >= best.bottleneck_s})
    pick = sorted(set(np.linspace(0, len(taus) - 1, min(levels, len(taus))).round().astype(int)))
    out = [best]
    for i in pick[1:]:
        use = prog.usage(taus[i]) if prog.fronts is not None else None
        if prog.fronts is not None and use in (None, out[-1].usage):
            continue  # the same usage as the last: not traced back
        a = prog.solve(taus[i], use)
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
