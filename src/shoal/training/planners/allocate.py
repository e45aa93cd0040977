"""Resource-stage assignment (Sailor §4.2.2, Eq. 1, Listing 1): which GPUs of the pool each
pipeline stage's replicas take, per resource kind (GPU type in a region).

Each stage gets D replicas, each of one kind at that kind's smallest fitting TP for the stage
(H1, H2), all in one region (H5; zones of a region are one pool, H6). For a bound ``tau`` on the
per-microbatch time of the slowest replica, the cheapest allocation is exact: with one or two
kinds by Sailor's dynamic program over stages on the GPUs still free (keeping after each stage
the GPU-usage vectors that no other dominates), with three kinds or more, where those sets grow
to thousands of vectors per stage, by a MIP over the same choices (unless the options the bound
leaves are of one or two kinds: the dynamic program on those; or every stage's own cheapest
choice fits the pool together: no allocation is cheaper). The smallest feasible ``tau`` is
found by bisection over the distinct stage times (feasibility is monotone in ``tau``).

Pool sizes enter the dynamic program only as caps, so a ``PoolMemo`` keeps each program's last
front computed for the largest pool it serves (``Fronts``) and answers smaller pools from it.
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import NamedTuple

import numpy as np

from shoal.jit import compiled
from shoal.mip import Model

_BIG = np.int64(1) << 60  # no allocation (the dynamic program's fronts)
MEMO_POOLS = 6  # pools remembered per PoolMemo key
DP_KINDS = 2  # up to this many kinds the program is the dynamic program, above it a MIP
# the MIPs are small and mostly solved at the root: HiGHS's feasibility-jump heuristic took
# about half of their time (one-off timing over 300 of them, the same optima without it)
MIP_OPTIONS = {"mip_heuristic_run_feasibility_jump": False}
COMBO_COLUMNS_PER_OPTION = 4  # how the MIP's form is chosen (``_by_choices``) ...
ONE_REGION_COMBOS = 2.5  # ... on one region
COMBO_CACHE = 16_384  # stages' combos kept (``_combos``)
GREEDY_ORDERS = 16  # stage orders the quick fill tries (``_greedy``)
LAZY_ROUNDS = 4  # MIPs holding more and more stages to the mixing rules (``_solve_mip``)
# an LP vertex this close to integers is read as the integers (``_mip_solve``; the model's
# rows are then checked on the integers themselves)
LP_INTEGRAL_TOL = 1e-6


class OutOfTime(Exception):
    """A program passed its caller's deadline (``time.perf_counter`` seconds); nothing of it
    is kept."""


class Option(NamedTuple):
    """One way to run a stage's replica (a tuple: options key the programs' caches, hashed
    often)."""

    kind: int  # index into the kinds
    tp: int
    time_s: float  # per microbatch, forward + backward, one replica


@dataclass(frozen=True)
class Allocation:
    per_stage: tuple[tuple[tuple[int, int, int], ...], ...]  # per stage: (kind, tp, count)
    usage: tuple[int, ...]
    bottleneck_s: float


class Mixes:
    """A stage's combos as arrays, over options of kinds and TPs ``kind_tp``: combo ``c`` puts
    ``na[c]`` replicas on option ``ia[c]`` and the rest on option ``ib[c]`` (-1: all on
    ``ia[c]``); ``self[c]`` is the combo as an allocation's stage ((kind, TP, count), ...).
    The combos depend on the options' kinds and TPs only, so stages of the same kinds and TPs
    share one (``_mixes``)."""

    __slots__ = ("kind_tp", "ia", "ib", "na", "D", "_entries")

    def __init__(self, kind_tp: tuple[tuple[int, int], ...], ia: np.ndarray, ib: np.ndarray,
                 na: np.ndarray, D: int):
        self.kind_tp, self.ia, self.ib, self.na, self.D = kind_tp, ia, ib, na, D
        self._entries: dict[int, tuple[tuple[tuple[int, int, int], ...], int]] = {}

    def entry(self, c: int) -> tuple[tuple[tuple[int, int, int], ...], int]:
        """``self[c]`` and the GPUs it takes of the first kind (kept)."""
        got = self._entries.get(c)
        if got is None:
            a, b, n = int(self.ia[c]), int(self.ib[c]), int(self.na[c])
            mix = ((*self.kind_tp[a], n),) if b < 0 else ((*self.kind_tp[a], n),
                                                          (*self.kind_tp[b], self.D - n))
            got = self._entries[c] = (mix, sum(m * tp for k, tp, m in mix if k == 0))
        return got

    def __len__(self) -> int:
        return len(self.ia)

    def __getitem__(self, c: int) -> tuple[tuple[int, int, int], ...]:
        return self.entry(c)[0]


@cache
def _mix_layout(kind_tp: tuple[tuple[int, int], ...], D: int, region_of: tuple[int, ...],
                K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The combos of options with these (kind, TP), in order: per region (in the order its
    first option comes), each option alone, then with each later option of the region at 1 to
    D - 1 replicas on the first. (ia, ib, na, usage matrix (combos, K))."""
    by_region: dict[int, list[int]] = {}
    for i, (k, _) in enumerate(kind_tp):
        by_region.setdefault(region_of[k], []).append(i)
    ia, ib, na = [], [], []
    counts = np.arange(1, D)
    for ros in by_region.values():
        for j, a in enumerate(ros):
            ia.append(np.array([a]))
            ib.append(np.array([-1]))
            na.append(np.array([D]))
            for b in ros[j + 1:]:
                ia.append(np.full(D - 1, a))
                ib.append(np.full(D - 1, b))
                na.append(counts)
    IA, IB, NA = (np.concatenate([np.zeros(0, np.int64), *x]).astype(np.int64)
                  for x in (ia, ib, na))
    kinds = np.array([k for k, _ in kind_tp], dtype=np.int64)
    tps = np.array([tp for _, tp in kind_tp], dtype=np.int64)
    use = np.zeros((len(IA), K), dtype=np.int64)
    rows = np.arange(len(IA))
    np.add.at(use, (rows, kinds[IA]), NA * tps[IA])
    two = IB >= 0
    np.add.at(use, (rows[two], kinds[IB[two]]), (D - NA[two]) * tps[IB[two]])
    for arr in (IA, IB, NA, use):
        arr.flags.writeable = False
    return IA, IB, NA, use


@functools.lru_cache(maxsize=COMBO_CACHE)
def _combos(opts: tuple[Option, ...], D: int, region_of: tuple[int, ...], K: int):
    """Ways to give a stage D replicas from options of one region, mixing at most two options:
    (the combos (``Mixes``), usage matrix (combos, K), and per combo the faster option's time,
    the slower one's, and how many replicas are on the slower)."""
    kind_tp = tuple((o.kind, o.tp) for o in opts)
    IA, IB, NA, use = _mix_layout(kind_tp, D, region_of, K)
    t = np.array([o.time_s for o in opts])
    two = IB >= 0
    ta, tb = t[IA], t[np.where(two, IB, IA)]
    # of two equally fast options the first counts as the faster
    swap = ta > tb
    t_fast, t_slow = np.minimum(ta, tb), np.maximum(ta, tb)
    n_slow = np.where(two, np.where(swap, NA, D - NA), 0).astype(float)
    return _mixes(kind_tp, D, region_of), use, t_fast, t_slow, n_slow


def slots(D: int, total: int | None) -> tuple[float, int]:
    """(relax, extra): ``extra`` of the D pipelines run one microbatch more than the rest (the
    fastest replicas' pipelines); a replica on one of the others may be ``relax`` times slower
    than the bound and still finish its microbatches as early."""
    if not total or total < D:
        return 1.0, 0
    lo, extra = divmod(total, D)
    return ((lo + 1) / lo if extra else 1.0), extra


def _allowed(opts: list[Option], tau: float, relax: float) -> list[Option]:
    """A stage's options under the bound: per GPU kind only its smallest TP under ``tau`` (for
    the busiest pipelines) and under ``tau * relax`` (for the others), as a larger one uses
    more GPUs of that kind (``_keep``), by kind, then TP."""
    flat = _flatten([opts])
    keep = np.zeros(len(flat.opts), dtype=np.bool_)
    _keep(flat.start, flat.kinds, flat.tps, flat.times, max(flat.kinds, default=-1) + 1, tau,
          tau * relax, keep)
    return flat.allowed(keep)[0]


class _Flat(NamedTuple):
    """A program's stage options as the compiled tests read them: stage s's are
    ``opts[start[s]:start[s + 1]]``, sorted by kind, then TP, with their kinds, TPs and
    times."""

    opts: list[Option]
    start: np.ndarray
    kinds: np.ndarray
    tps: np.ndarray
    times: np.ndarray

    def allowed(self, keep: np.ndarray) -> list[list[Option]]:
        """Per stage, its options marked in ``keep`` (``_keep``)."""
        edges = self.start.tolist()
        return [[self.opts[i] for i in range(a, b) if keep[i]]
                for a, b in zip(edges, edges[1:], strict=False)]


def _flatten(stage_opts: list[list[Option]]) -> _Flat:
    opts = [o for st in stage_opts for o in sorted(st, key=lambda o: (o.kind, o.tp))]
    start = np.zeros(len(stage_opts) + 1, dtype=np.int64)
    np.cumsum([len(st) for st in stage_opts], out=start[1:])
    return _Flat(opts, start, np.array([o.kind for o in opts], dtype=np.int64),
                 np.array([o.tp for o in opts], dtype=np.int64),
                 np.array([o.time_s for o in opts], dtype=np.float64))


@compiled
def _keep(start, kinds, tps, times, K, tau, tau_relaxed, keep):
    """``_allowed`` for every stage at once, compiled: marks in ``keep`` each stage's options
    it keeps (per kind its smallest TP, then the fastest, within ``tau`` and within
    ``tau_relaxed``); returns whether every stage keeps one within ``tau``."""
    best = np.empty(K, dtype=np.int64)
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


def _solve(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
           region_of: list[int], tau: float, total: int | None = None,
           deadline: float | None = None, cheapest: bool = True) -> Allocation | None:
    """Cheapest allocation in which every replica finishes its pipeline's microbatches within
    those of a replica taking ``tau`` per microbatch in the busiest pipeline (with ``total``
    microbatches shared as by ``build.shares``; without, every replica takes at most ``tau``).
    Each stage mixes at most two options, all of one region. With ``cheapest`` False, any
    such allocation (a feasibility test). Raises OutOfTime once past ``deadline``."""
    return _solve_exact(stage_opts, D, avail, price, region_of, tau, total, deadline,
                        cheapest)[0]


def _solve_exact(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
                 region_of: list[int], tau: float, total: int | None,
                 deadline: float | None, cheapest: bool,
                 flat: _Flat | None = None) -> tuple[Allocation | None, bool]:
    """``_solve``'s answer, and whether it is the cheapest (none counts as the cheapest): a
    feasibility test answers with the cheapest allocation when it takes the MIP. ``flat``:
    the stage options flattened (``_flatten``; a program keeps them for all its bounds)."""
    relax, extra = slots(D, total)
    tau = float(tau)  # the compiled programs take it as a float
    if len(avail) <= DP_KINDS:
        return _solve_dp(_tables(stage_opts, D, region_of), avail, price, tau, relax, extra,
                         deadline), True
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime
    flat = flat or _flatten(stage_opts)
    keep = np.zeros(len(flat.opts), dtype=np.bool_)
    K = len(avail)
    # a stage whose every option is over the bound has no replica for the busiest pipelines
    if not _keep(flat.start, flat.kinds, flat.tps, flat.times, K, tau, tau * relax, keep):
        return None, True
    W = kind_weights(K).T
    load, binding = _load(flat.start, flat.kinds, flat.tps, flat.times, keep,
                          np.asarray(avail, dtype=np.float64), W, tau, D, extra)
    if load > 1.0:
        return None, True
    used = np.unique(flat.kinds[keep]).tolist()
    if len(used) <= DP_KINDS:
        # the bound leaves options of one or two kinds: the dynamic program over them
        return _on_kinds(used, flat.allowed(keep), D, avail, price, region_of, tau, relax,
                         extra, deadline), True
    if cheapest:
        own = _each_cheapest(allowed := flat.allowed(keep), D, avail, price, region_of, tau,
                             relax, extra)
        if own is not None:
            return own, True
    else:
        # greedy fills in GREEDY_ORDERS stage orders, each by the share of the GPUs left and
        # by the weighting closest to binding
        out = np.empty((len(flat.start) - 1, 6), dtype=np.int64)
        left = np.empty(len(avail), dtype=np.int64)
        if _greedy(flat.start, flat.kinds, flat.tps, flat.times, keep,
                   np.asarray(region_of, dtype=np.int64), np.asarray(avail, dtype=np.int64),
                   tau, extra, D, W[:, binding], GREEDY_ORDERS, left, out):
            per_stage = tuple(((ka, ta, na),) if kb < 0 else ((ka, ta, na), (kb, tb, nb))
                              for ka, ta, na, kb, tb, nb in out.tolist())
            return Allocation(per_stage, tuple(int(a) - int(b) for a, b in
                                               zip(avail, left, strict=True)), tau), False
        allowed = flat.allowed(keep)
    # a feasibility test that gets here also costs the allocations: when its bound is the
    # one found, the cheapest is then known (a MIP with costs takes about a third longer)
    return _solve_mip(allowed, D, avail, price, region_of, tau, relax, extra, deadline), True


def _on_kinds(used: list[int], allowed: list[list[Option]], D: int, avail: np.ndarray,
              price: np.ndarray, region_of: list[int], tau: float, relax: float, extra: int,
              deadline: float | None) -> Allocation | None:
    """``_solve``'s cheapest allocation when the stages' options under the bound (``allowed``)
    are of the kinds ``used`` alone (one or two): the dynamic program on those kinds, its
    allocation in the pool's kinds."""
    local = {k: i for i, k in enumerate(used)}
    opts = [[Option(local[o.kind], o.tp, o.time_s) for o in al] for al in allowed]
    got = _solve_dp(_tables(opts, D, [region_of[k] for k in used]), avail[used], price[used],
                    tau, relax, extra, deadline)
    if got is None:
        return None
    usage = np.zeros(len(avail), dtype=np.int64)
    usage[used] = got.usage
    return Allocation(tuple(tuple((used[k], tp, n) for k, tp, n in st) for st in got.per_stage),
                      tuple(int(u) for u in usage), tau)


@compiled
def _load(start, kinds, tps, times, keep, avail, W, tau, D, extra):
    """Per weighting of the kinds (``kind_weights``, the columns of ``W``), the GPUs the
    stages need at least over those the pool holds, over the options marked in ``keep``
    (``_keep``): above 1 under any weighting (a bound of the LP relaxation, through its dual)
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


def _each_cheapest(allowed: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
                   region_of: list[int], tau: float, relax: float,
                   extra: int) -> Allocation | None:
    """Every stage on its own cheapest combo under the bound, when the pool holds them all
    together: no allocation costs less, so it is the cheapest (else None)."""
    K = len(avail)
    usage = np.zeros(K, dtype=np.int64)
    per_stage = []
    for al in allowed:
        combos, CU, ok = _stage_combos(al, D, region_of, K, tau, relax, extra)
        idx = np.flatnonzero(ok)
        if len(idx) == 0:
            return None
        c = int(idx[np.argmin(CU[idx] @ price)])
        usage += CU[c]
        per_stage.append(combos[c])
    if (usage > avail).any():
        return None
    return Allocation(tuple(per_stage), tuple(int(u) for u in usage), tau)


def _stage_combos(al: list[Option], D: int, region_of: list[int], K: int, tau: float,
                  relax: float, extra: int):
    """A stage's combos of its allowed options and their GPU usage, with the mask of those the
    bound allows: the slower replicas take the first pipelines, relaxed only if all of those
    run fewer microbatches."""
    combos, CU, t_fast, t_slow, n_slow = _combos(tuple(al), D, tuple(region_of), K)
    ok = (t_fast <= tau) & np.where(n_slow <= D - extra, t_slow <= tau * relax, t_slow <= tau)
    return combos, CU, ok


@compiled
def _greedy(start, kinds, tps, times, keep, region_of, avail, tau, extra, D, weigh, orders,
            left, out):
    """Some allocation under the bound over the options marked in ``keep`` (``_keep``),
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
    need = np.empty(S, dtype=np.int64)
    spread = np.empty(S, dtype=np.int64)
    per_kind = np.empty(len(avail), dtype=np.int64)
    for s in range(S):
        per_kind[:] = big
        for o in range(start[s], start[s + 1]):
            if keep[o] and times[o] <= tau and tps[o] < per_kind[kinds[o]]:
                per_kind[kinds[o]] = tps[o]
        need[s] = min(per_kind.min(), 64)  # none within the bound: ``_keep`` rules that out
        spread[s] = np.minimum(per_kind, 64).max() - need[s]  # no option: TP 64
    key = np.empty(S, dtype=np.int64)
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
        left[:] = avail
        if _fill(start, kinds, tps, times, keep, region_of, left, tau, extra, D, weigh,
                 t % 2 == 1, np.argsort(key), out):
            return True
    return False


@compiled
def _fill(start, kinds, tps, times, keep, region_of, left, tau, extra, D, weigh, weighted,
          order, out):
    """``_greedy``'s fill of the stages in ``order``: each given the option, or the pair of
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


def _solve_dp(tables: _Tables, avail: np.ndarray, price: np.ndarray, tau: float, relax: float,
              extra: int, deadline: float | None) -> Allocation | None:
    """``_solve`` for one or two kinds: the dynamic program of ``_dp_front``, the cheapest GPU
    usage on its last front (of equally cheap ones, the fewest of the first kind), and the
    stages' combos traced back from it."""
    back: list[tuple[np.ndarray, _Tables]] = []
    front = _dp_front(tables, *_caps(avail), tau, relax, extra, deadline, back)
    usage = None if front is None else _cheapest(front, avail, price)
    return None if usage is None else _trace(back, usage, tau)


def _trace(back: list[tuple[np.ndarray, _Tables]], usage: tuple[int, ...],
           tau: float) -> Allocation:
    """The allocation reaching ``usage`` on ``_dp_front``'s last front, from its choices."""
    pick, t = back[0]
    per_stage = []
    x = usage[0]
    for s, c in reversed(list(enumerate(t.of_stage.tolist()))):
        stage, first = t.mixes(c).entry(int(pick[s, x]))
        per_stage.append(stage)
        x -= first
    per_stage.reverse()
    return Allocation(tuple(per_stage), usage, tau)


@dataclass(frozen=True)
class _Tables:
    """A program's stages as ``_dp_stages`` reads them, at any bound. Stages of equal options
    form a class (``of_stage``); class ``c`` has options ``opt_start[c]`` to
    ``opt_start[c + 1]`` (``kinds``, ``tps``, ``times``; sorted by kind, then TP) and combos
    ``cstart[c]`` to ``cend[c]``: every mix of one or two of its options of one region
    (``_mix_layout``; ``ia``, ``ib`` index the class's options, ``na`` replicas on the first),
    with their first- and second-kind GPUs (``ca``, ``cb``). The combos depend only on the
    options' kinds and TPs, so classes of the same kinds and TPs share them; their times are
    read from the options'. A bound allows a subset of each class's options (``_allowed``),
    and the combos of that subset are, in order, those of the class's combos whose options it
    all holds."""

    D: int
    K: int
    of_stage: np.ndarray
    opt_start: np.ndarray
    kinds: np.ndarray
    tps: np.ndarray
    times: np.ndarray
    cstart: np.ndarray
    cend: np.ndarray
    ia: np.ndarray
    ib: np.ndarray
    na: np.ndarray
    ca: np.ndarray
    cb: np.ndarray
    kind_tps: tuple[tuple[tuple[int, int], ...], ...]  # per class, its options' kinds and TPs
    region_of: tuple[int, ...]
    _made: list = field(default_factory=list, compare=False, repr=False)

    def mixes(self, c: int) -> Mixes:
        """Class ``c``'s combos as ``Mixes`` (to trace an allocation back), made once."""
        if not self._made:
            self._made.extend([None] * len(self.kind_tps))
        got = self._made[c]
        if got is None:
            got = self._made[c] = _mixes(self.kind_tps[c], self.D, self.region_of)
        return got


def _tables(stage_opts: list[list[Option]], D: int, region_of: list[int]) -> _Tables:
    """The program's ``_Tables``, from its stages' options (built once per program)."""
    classes: dict[tuple[Option, ...], int] = {}
    of_stage = np.empty(len(stage_opts), dtype=np.int64)
    parts: list[tuple[tuple[tuple[int, int], ...], np.ndarray]] = []
    for s, opts in enumerate(stage_opts):
        c = classes.get(key := tuple(opts))
        if c is None:
            c = classes[key] = len(parts)
            parts.append(_class_options(key))
        of_stage[s] = c
    kind_tps = tuple(kt for kt, _ in parts)
    layouts: dict[tuple[tuple[int, int], ...], int] = {}
    lay = np.array([layouts.setdefault(kt, len(layouts)) for kt in kind_tps], dtype=np.int64)
    ia, ib, na, ca, cb, lstart = _layouts(tuple(layouts), D, tuple(region_of))
    rows = parts[0][1] if len(parts) == 1 else np.concatenate([r for _, r in parts])
    opt_start = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(kt) for kt in kind_tps], out=opt_start[1:])
    return _Tables(D, len(region_of), of_stage, opt_start, rows[:, 0].astype(np.int64),
                   rows[:, 1].astype(np.int64), np.ascontiguousarray(rows[:, 2]), lstart[lay],
                   lstart[lay + 1], ia, ib, na, ca, cb, kind_tps, tuple(region_of))


@functools.lru_cache(maxsize=COMBO_CACHE)
def _class_options(opts: tuple[Option, ...]) -> tuple[tuple[tuple[int, int], ...], np.ndarray]:
    """A stage's options sorted by kind, then TP: their (kind, TP) and rows (kind, TP,
    time)."""
    got = sorted(set(opts), key=lambda o: (o.kind, o.tp))
    rows = np.array(got, dtype=np.float64).reshape(len(got), 3)
    rows.flags.writeable = False
    return tuple((o.kind, o.tp) for o in got), rows


@functools.lru_cache(maxsize=COMBO_CACHE)
def _layouts(kind_tps: tuple[tuple[tuple[int, int], ...], ...], D: int,
             region_of: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The combos (``_mix_layout``) of several classes' kinds and TPs, one after the other:
    (ia, ib, na, first-kind GPUs, second-kind GPUs, where each class's start, and a last
    end)."""
    K = len(region_of)
    parts = [_mix_layout(kt, D, region_of, K) for kt in kind_tps]
    lstart = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p[0]) for p in parts], out=lstart[1:])
    ia, ib, na, use = (np.concatenate(x) for x in zip(*parts, strict=True))
    out = (ia, ib, na, np.ascontiguousarray(use[:, 0]),
           np.ascontiguousarray(use[:, 1]) if K > 1 else np.zeros(len(use), np.int64), lstart)
    for a in out:
        a.flags.writeable = False
    return out


@functools.lru_cache(maxsize=COMBO_CACHE)
def _mixes(kind_tp: tuple[tuple[int, int], ...], D: int, region_of: tuple[int, ...]) -> Mixes:
    """The combos of a stage's options of these kinds and TPs (sorted) as ``Mixes``."""
    IA, IB, NA, _ = _mix_layout(kind_tp, D, region_of, len(region_of))
    return Mixes(kind_tp, IA, IB, NA, D)


def _dp_front(tables: _Tables, A: int, B: int, tau: float, relax: float, extra: int,
              deadline: float | None,
              back: list | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """A dynamic program over the stages that keeps, after each, the GPU-usage pairs no other
    dominates, held as one array: per count ``u`` of the first kind's GPUs (at most ``A``), the
    fewest of the second kind (at most ``B``) an allocation of the stages so far takes with
    exactly ``u`` of the first (a large number where none does, or where that pair is
    dominated). Each stage is a min-plus convolution of the array with the combos of the
    stage's options that ``_allowed`` keeps (``_dp_stages``). Of equal pairs it keeps the one
    whose earlier stages take the fewest of the first kind, then the first combo. Returns the
    last front as (first-kind counts, ascending; second-kind counts, descending), or None when
    it is empty; appends to ``back`` the stages' choices (with the tables).

    Counts enter only as caps: a pair of the front at caps (A, B) is one of the front at any
    larger caps, reached through the same choices, so a front computed for a pool answers
    every smaller pool (``Fronts``)."""
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime
    t = tables
    S = len(t.of_stage)
    fewest = np.empty(A + 1, dtype=np.int64)
    pick = np.empty((S, A + 1), dtype=np.int64)
    done = _dp_stages(t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart, t.cend, t.ia,
                      t.ib, t.na, t.ca, t.cb, t.K, tau, tau * relax, t.D - extra, t.D, A, B,
                      fewest, pick)
    if done < S:
        return None
    if back is not None:
        back.append((pick, t))
    at = np.flatnonzero(fewest < _BIG)
    return at, fewest[at]


@compiled
def _dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
               tau, tau_relaxed, slow_cap, D, A, B, fewest, pick):
    """``_dp_front``'s program (``_Tables``' arrays), compiled. Per class, the options
    ``_allowed`` keeps under ``tau`` and ``tau_relaxed``; a stage takes the combos of
    its class's kept options whose faster option is within ``tau`` and whose slower one is
    within ``tau_relaxed`` when at most ``slow_cap`` replicas are on it, else within ``tau``
    (of two equally fast options the first counts as the faster). Leaves the last front in
    ``fewest`` and each stage's combo per first-kind count in ``pick`` (relative to its
    class's first combo); returns how many stages kept a non-empty front."""
    big = np.int64(1) << np.int64(60)
    kept_opt = np.zeros(len(kinds), dtype=np.bool_)
    _keep(opt_start, kinds, tps, times, K, tau, tau_relaxed, kept_opt)  # per class
    fewest[:] = big
    fewest[0] = 0
    raw = np.empty(A + 1, dtype=np.int64)
    for s in range(len(of_stage)):
        cls = of_stage[s]
        o0, c0, c1 = opt_start[cls], cstart[cls], cend[cls]
        raw[:] = big
        for c in range(c0, c1):
            if not kept_opt[o0 + ia[c]] or (ib[c] >= 0 and not kept_opt[o0 + ib[c]]):
                continue
            t_fast = times[o0 + ia[c]]
            t_slow, n_slow = t_fast, 0
            if ib[c] >= 0:
                t_b = times[o0 + ib[c]]
                if t_fast > t_b:
                    t_fast, t_slow, n_slow = t_b, t_fast, na[c]
                else:
                    t_slow, n_slow = t_b, D - na[c]
            if t_fast > tau or t_slow > (tau_relaxed if n_slow <= slow_cap else tau):
                continue
            a, b = ca[c], cb[c]
            if a > A or b > B:
                continue
            for u in range(a, A + 1):
                f = fewest[u - a]
                if f >= big:
                    continue
                v = f + b
                # of equal counts, the combo taking the most of the first kind (the earlier
                # stages the fewest), then the first
                if v < raw[u] or (v == raw[u] and a > ca[c0 + pick[s, u]]):
                    raw[u] = v
                    pick[s, u] = c - c0
        # only pairs within the caps that no pair with fewer of the first kind dominates
        least = big
        kept = False
        for u in range(A + 1):
            v = raw[u]
            if v <= B and v < least:
                fewest[u] = v
                kept = True
            else:
                fewest[u] = big
            if v < least:
                least = v
        if not kept:
            return s
    return len(of_stage)


def _cheapest(front: tuple[np.ndarray, np.ndarray], avail: np.ndarray,
              price: np.ndarray) -> tuple[int, ...] | None:
    """The cheapest usage of ``front`` (``_dp_front``'s) within ``avail``; of equally cheap
    ones, the fewest of the first kind."""
    run = _cheapest_at(front, *_caps(avail))
    if run is None:
        return None
    at, vals = front
    U = np.stack([at[run], vals[run]], axis=1)[:, :len(avail)]
    return tuple(int(x) for x in U[int(np.argmin(U @ price))])


def _cheapest_at(front: tuple[np.ndarray, np.ndarray], A: int, B: int) -> slice | None:
    """The pairs of ``front`` within caps (A, B): first-kind counts ascend and second-kind
    counts descend, so they are a run (None when empty)."""
    at, vals = front
    hi = int(np.searchsorted(at, A, side="right"))
    if hi == 0 or vals[hi - 1] > B:
        return None
    return slice(int(np.searchsorted(-vals, -B, side="left")), hi)


def _solve_mip(allowed: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
               region_of: list[int], tau: float, relax: float, extra: int,
               deadline: float | None) -> Allocation | None:
    """``_solve`` for three kinds or more, where the program's fronts grow large: a MIP solved
    by HiGHS. First without the rules on how a stage mixes its options (any replicas on any
    of them, ``_by_option`` with no stage ``strict``): when its cheapest allocation keeps
    those rules anyway, as it mostly does (its basic solutions spread few stages over several
    options), no allocation is cheaper, since every allocation that keeps them is one of its.
    Else, on one region, the stages that broke them, and those of the same options, are held
    to them, and so on, for up to ``LAZY_ROUNDS`` solves; then (at once across regions) the
    MIP over the choices themselves (``_by_choices``)."""
    K = len(avail)
    strict: set[int] = set()
    # binaries per region made the option form slow (``_by_choices``): across regions, the
    # stages are held to the rules in the combo form at once
    one_region = len({region_of[o.kind] for al in allowed for o in al}) == 1
    for _ in range(LAZY_ROUNDS if one_region else 1):
        left = np.inf if deadline is None else deadline - time.perf_counter()
        m = Model(maximize=False)
        use: list[tuple[list[int], list[float]]] = [([], []) for _ in range(K)]
        got = _mip_solve(m, use, _by_option(m, use, allowed, D, price, region_of, tau, extra,
                                            strict), avail, left, lp_first=not strict)
        if not isinstance(got, set):
            return _allocation(got, K, tau)
        # the stages of equal options would take the same mix in turn
        classes = _equal_stages(allowed)
        strict.update(i for b in got for i in classes[tuple(allowed[b])])
    return _by_choices(allowed, D, avail, price, region_of, tau, relax, extra, deadline)


def _equal_stages(allowed: list[list[Option]]) -> dict[tuple[Option, ...], list[int]]:
    """The stages of each list of options, in order of first appearance."""
    classes: dict[tuple[Option, ...], list[int]] = {}
    for i, al in enumerate(allowed):
        classes.setdefault(tuple(al), []).append(i)
    return classes


def _by_choices(allowed: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
                region_of: list[int], tau: float, relax: float, extra: int,
                deadline: float | None) -> Allocation | None:
    """``_solve_mip``'s MIP over the choices themselves, in one of two forms (``_by_combo``,
    ``_by_option``). The combo form has no big-M rows, no binaries per region and no symmetry
    between equal stages: on pools of two regions the option form was 10-100x slower. With one
    region the option form was about 16x faster (one-off timings over a few hundred programs
    of each), except where the combos are few: of the 13 programs of one region that reached
    this MIP on planner_speed.py's three-type row, the 5 with at most 10 combo columns per
    option column (4 with no allocation) took 0.054 s in all as combos against 0.915 s as
    options. So: combos when the combo columns are at most COMBO_COLUMNS_PER_OPTION times the
    option columns (ONE_REGION_COMBOS times that on one region)."""
    K = len(avail)
    classes = _equal_stages(allowed)  # equal stages share columns
    n_combo = 0
    for al in classes:
        per_region: dict[int, int] = {}
        for o in al:
            per_region[region_of[o.kind]] = per_region.get(region_of[o.kind], 0) + 1
        n_combo += sum(n + n * (n - 1) // 2 * (D - 1) for n in per_region.values())
    n_option = 2 * sum(len(al) for al in allowed)
    m = Model(maximize=False)
    use = [([], []) for _ in range(K)]
    regions = {region_of[o.kind] for al in classes for o in al}
    scale = 1.0 if len(regions) > 1 else ONE_REGION_COMBOS
    if n_combo <= scale * COMBO_COLUMNS_PER_OPTION * n_option:
        read = _by_combo(m, use, classes, D, price, region_of, tau, relax, extra)
    else:
        read = _by_option(m, use, allowed, D, price, region_of, tau, extra)
    if read is None:
        return None
    left = np.inf if deadline is None else deadline - time.perf_counter()
    return _allocation(_mip_solve(m, use, read, avail, left), K, tau)


def _mip_solve(m: Model, use: list[tuple[list[int], list[float]]], read, avail: np.ndarray,
               left: float, lp_first: bool = False):
    """Solves ``m`` with a row per kind holding its columns (``use``) to the pool's GPUs, and
    returns ``read`` of its solution (None when nothing fits). Raises OutOfTime when the
    time ``left`` runs out first. ``lp_first``: the LP relaxation is solved first; when it
    is infeasible so is the MIP, and when its optimal vertex is integral and keeps every
    row it is the MIP's optimum, within the solvers' tolerances (the relaxation's optimum is
    a bound on the MIP's): the MIP is solved only otherwise."""
    if left <= 0:
        raise OutOfTime
    for k, (idx, val) in enumerate(use):
        if idx:
            m.row(idx, val, hi=float(avail[k]))
    if lp_first:
        started = time.perf_counter()
        lp = m.solve(time_limit_s=left, relaxed=True)
        if lp.infeasible:
            return None
        if lp.x is not None and lp.status == "Optimal":
            x = np.rint(lp.x)
            if np.abs(lp.x - x).max(initial=0.0) <= LP_INTEGRAL_TOL and m.satisfied(x):
                return read(x.astype(np.int64))
        left -= time.perf_counter() - started
        if left <= 0:
            raise OutOfTime
    sol = m.solve(time_limit_s=left, exact=True, options=MIP_OPTIONS)
    if sol.x is None:
        if sol.infeasible:
            return None
        raise OutOfTime
    return read(np.rint(sol.x).astype(np.int64))


def _allocation(per_stage: list | None, K: int, tau: float) -> Allocation | None:
    if per_stage is None:
        return None
    usage = np.zeros(K, dtype=np.int64)
    for mix in per_stage:
        for k, tp, n in mix:
            usage[k] += tp * n
    return Allocation(tuple(per_stage), tuple(int(u) for u in usage), tau)


def _by_combo(m: Model, use, classes: dict[tuple[Option, ...], list[int]], D: int,
              price: np.ndarray, region_of: list[int], tau: float, relax: float, extra: int):
    """Columns: per class of equal stages, how many of them take each combo the bound allows
    (the dynamic program's choices); returns the reader of a solution, or None when a class
    has no combo."""
    K = len(use)
    cols = []
    for al, stages in classes.items():
        combos, CU, ok = _stage_combos(list(al), D, region_of, K, tau, relax, extra)
        idx = np.flatnonzero(ok)
        if len(idx) == 0:
            return None
        cost = CU[idx] @ price
        vs = [m.var(0, len(stages), float(c), integer=True) for c in cost]
        m.row(vs, [1] * len(vs), lo=len(stages), hi=len(stages))
        for v, c in zip(vs, idx, strict=True):
            for k in np.flatnonzero(CU[c]):
                use[k][0].append(v)
                use[k][1].append(float(CU[c, k]))
        cols.append((stages, combos, idx, vs))

    def read(x: np.ndarray) -> list:
        per_stage: list = [()] * sum(len(st) for st, _, _, _ in cols)
        for stages, combos, idx, vs in cols:
            todo = iter(stages)
            for c, v in zip(idx, vs, strict=True):
                for _ in range(int(x[v])):
                    per_stage[next(todo)] = combos[c]
        return per_stage

    return read


def _by_option(m: Model, use, allowed: list[list[Option]], D: int, price: np.ndarray,
               region_of: list[int], tau: float, extra: int, strict: set[int] | None = None):
    """Columns: per stage, the replicas it takes of each allowed option, D in all, at most
    D - extra on the options over ``tau``; on the stages of ``strict`` (None: every stage)
    with a binary per option (at most two used, at most one over ``tau``) and per region
    (the options of one region only). Returns the reader of a solution: the allocation, or,
    when some stage outside ``strict`` breaks those rules, the set of such stages."""
    cols: list[list[tuple[Option, int]]] = []
    for s, al in enumerate(allowed):
        xs, zs, over = [], [], []
        regions: dict[int, list[int]] = {}
        binary = strict is None or s in strict
        for o in al:
            cap = D - extra if o.time_s > tau else D
            x = m.var(0, cap, float(price[o.kind] * o.tp), integer=True)
            xs.append(x)
            use[o.kind][0].append(x)
            use[o.kind][1].append(o.tp)
            if not binary:
                if o.time_s > tau:
                    over.append(x)
                continue
            z = m.var(0, 1, integer=True)
            m.row([x, z], [1, -cap], hi=0)  # replicas only on a used option
            zs.append(z)
            if o.time_s > tau:
                over.append(z)
            regions.setdefault(region_of[o.kind], []).append(z)
        m.row(xs, [1] * len(xs), lo=D, hi=D)
        if not binary:
            if len(over) > 1:
                m.row(over, [1] * len(over), hi=D - extra)
            cols.append(list(zip(al, xs, strict=True)))
            continue
        m.row(zs, [1] * len(zs), hi=2)
        if len(over) > 1:
            m.row(over, [1] * len(over), hi=1)
        if len(regions) > 1:
            rs = [m.var(0, 1, integer=True) for _ in regions]
            for r, zz in zip(rs, regions.values(), strict=True):
                m.row([*zz, r], [1] * len(zz) + [-2], hi=0)  # options of a chosen region only
            m.row(rs, [1] * len(rs), hi=1)
        cols.append(list(zip(al, xs, strict=True)))

    def read(x: np.ndarray) -> list | set[int]:
        per_stage = [[(o, int(x[c])) for o, c in st if x[c] > 0] for st in cols]
        broken = {s for s, mix in enumerate(per_stage)
                  if len(mix) > 2 or sum(o.time_s > tau for o, _ in mix) > 1
                  or len({region_of[o.kind] for o, _ in mix}) > 1}
        if broken:
            return broken
        return [tuple((o.kind, o.tp, n) for o, n in mix) for mix in per_stage]

    return read


WEIGHT_VALUES = (0, 1, 2, 4, 8)  # per-kind weights of the LP dual bounds ...
WEIGHT_GRID_UP_TO = 4  # ... in every combination up to this many kinds (``kind_weights``)


@cache
def kind_weights(K: int) -> np.ndarray:
    """(W, K) weightings of the kinds at which LP dual bounds on GPU counts are taken: every
    vector of WEIGHT_VALUES per kind when kinds are few (TP degrees are powers of two, so for
    two kinds these hold the dual's optimum), else every 0/1 vector, or each kind alone, all
    but one, and all. Any nonnegative weights give a valid bound."""
    if K <= WEIGHT_GRID_UP_TO:
        grid = np.array(list(itertools.product(WEIGHT_VALUES, repeat=K)), dtype=float)
    elif K <= 8:
        grid = np.array(list(itertools.product((0.0, 1.0), repeat=K)))
    else:
        eye = np.eye(K)
        grid = np.vstack([eye, 1 - eye, np.ones((1, K))])
    return grid[grid.sum(axis=1) > 0]


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
        # per program (key, degree, microbatches): the bounds ``_fastest`` searches over
        self.bounds: dict[tuple, tuple[list[float], dict[float, int], float]] = {}

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


class Fronts:
    """The dynamic program's last fronts (``_dp_front``), per program (stage options, degree,
    microbatches) and bound, each computed at the largest pool its memo has served
    (``ceiling``), so that a smaller pool's program is read off it (``_cheapest``); and the
    allocations traced back from them, per (program, bound, usage): the combos on the way to a
    pair of the front are the same at any caps that hold it. One or two kinds only (the MIP's
    programs are not kept)."""

    def __init__(self) -> None:
        self.ceiling: np.ndarray | None = None
        self._fronts: dict[tuple, dict[float, tuple[int, int, tuple | None]]] = {}
        self._allocs: dict[tuple, Allocation] = {}
        self._tables: dict[tuple, _Tables] = {}

    def tables(self, key: tuple, build: Callable[[], _Tables]) -> _Tables:
        """The ``_Tables`` of program ``key`` (stage options and degree), built once."""
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
        return None if got is None else _cheapest(got, avail, price)

    def feasible(self, key: tuple, tau: float, avail: np.ndarray,
                 front: Callable[[int, int], tuple[np.ndarray, np.ndarray] | None]) -> bool:
        """Whether ``usage`` finds one (without finding the cheapest)."""
        got = self._kept(key, tau, avail, front)
        return got is not None and _cheapest_at(got, *_caps(avail)) is not None

    def _kept(self, key: tuple, tau: float, avail: np.ndarray,
              front: Callable[[int, int], tuple[np.ndarray, np.ndarray] | None]
              ) -> tuple[np.ndarray, np.ndarray] | None:
        """Program ``key``'s front under ``tau`` at caps holding ``avail``, computed at the
        ceiling when it is not kept."""
        A, B = _caps(avail)
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
        A, B = _caps(avail)
        out = {}
        for tau, (cA, cB, f) in self._fronts.get(key, {}).items():
            if lo <= tau <= hi and cA >= A and cB >= B:
                out[tau] = f is not None and _cheapest_at(f, A, B) is not None
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


def _caps(avail: np.ndarray) -> tuple[int, int]:
    return int(avail[0]), int(avail[1]) if len(avail) > 1 else 0


def _memoised(memo: PoolMemo | None, key: tuple | None, avail: np.ndarray, at_least: float,
              compute) -> list[Allocation]:
    if memo is None or key is None:
        return compute()
    got = memo.get(key, avail, at_least)
    if got is not None:
        return got
    res = compute()  # OutOfTime leaves the memo as it was
    memo.put(key, avail, res)
    return res


def fastest(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
            region_of: list[int], at_least: float = 0.0,
            total: int | None = None, memo: PoolMemo | None = None,
            key: tuple | None = None, deadline: float | None = None,
            cheapest: bool = True) -> Allocation | None:
    """The allocation with the smallest slowest-replica time (then the cheapest).

    ``at_least``: a known lower bound on that time (a caller's relaxation); the bisection over
    the stage times starts there. ``memo``, ``key``: see PoolMemo. Raises OutOfTime once past
    ``deadline`` (``time.perf_counter`` seconds). ``cheapest`` False: of the allocations with
    that time, the one the search met (on three kinds or more, the greedy fill's when it
    found one, which spares the MIP that finds the cheapest); not kept in the memo, whose
    allocations are the cheapest."""
    prog = _Program(stage_opts, D, avail, price, region_of, total, deadline, memo, key)
    if not cheapest and len(avail) > DP_KINDS:
        return _fastest(prog, at_least, cheapest=False)
    got = _memoised(memo, None if key is None else ("fastest", D, total, *key), avail, at_least,
                    lambda: [a] if (a := _fastest(prog, at_least)) else [])
    return got[0] if got else None


@dataclass
class _Program:
    """One allocation problem at any bound ``tau``: ``solve(tau)`` is ``_solve``'s allocation
    and ``usage(tau)`` its GPU usage, both read from the memo's ``Fronts`` when there is one
    (one or two kinds)."""

    stage_opts: list[list[Option]]
    D: int
    avail: np.ndarray
    price: np.ndarray
    region_of: list[int]
    total: int | None
    deadline: float | None
    memo: PoolMemo | None = None
    key: tuple | None = None
    _solved: dict[tuple[float, bool], Allocation | None] = field(default_factory=dict)
    _back: dict[float, list] = field(default_factory=dict)  # choices of the fronts computed
    _tables: _Tables | None = None
    _flat: _Flat | None = None

    @property
    def fronts(self) -> Fronts | None:
        if self.memo is None or self.key is None or len(self.avail) > DP_KINDS:
            return None
        return self.memo.fronts

    def _solve(self, tau: float, cheapest: bool = True) -> Allocation | None:
        if (tau, cheapest) not in self._solved:
            if self._flat is None and len(self.avail) > DP_KINDS:
                self._flat = _flatten(self.stage_opts)
            got, exact = _solve_exact(self.stage_opts, self.D, self.avail, self.price,
                                      self.region_of, tau, self.total, self.deadline, cheapest,
                                      self._flat)
            self._solved[(tau, cheapest)] = got
            if exact:
                self._solved[(tau, True)] = got
        return self._solved[(tau, cheapest)]

    def tables(self) -> _Tables:
        """The program's ``_Tables`` (kept with the fronts when there are fronts)."""
        if self._tables is None:
            fronts = self.fronts
            self._tables = (_tables(self.stage_opts, self.D, self.region_of) if fronts is None
                            else fronts.tables((*self.key, self.D), lambda: _tables(
                                self.stage_opts, self.D, self.region_of)))
        return self._tables

    def _front(self, tau: float, A: int, B: int) -> tuple[np.ndarray, np.ndarray] | None:
        relax, extra = slots(self.D, self.total)
        back = self._back[tau] = []
        return _dp_front(self.tables(), A, B, tau, relax, extra, self.deadline, back)

    def search(self, taus: list[float], lo: int, hi: int, near: bool, check_hi: bool) -> int:
        """``_fastest``'s search over ``taus[lo..hi]`` for the least bound some allocation
        meets (-1: not even ``taus[hi]``, when ``check_hi``; else ``taus[hi]`` is known to be
        met), each test the dynamic program at the pool's caps, all in one compiled call (one
        or two kinds): from a caller's bound (``near``), ``lo`` first, then bounds 1, 3, 7, ...
        above it, then a bisection."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise OutOfTime
        t = self.tables()
        relax, extra = slots(self.D, self.total)
        A, B = _caps(self.avail)
        return int(_search_taus(t.of_stage, t.opt_start, t.kinds, t.tps, t.times, t.cstart,
                                t.cend, t.ia, t.ib, t.na, t.ca, t.cb, t.K,
                                np.asarray(taus, dtype=np.float64), lo, hi, near, check_hi,
                                relax, t.D - extra, t.D, A, B))

    def usage(self, tau: float) -> tuple[int, ...] | None:
        """The usage of ``solve(tau)`` (under three kinds or more, of any allocation under
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
        """``_solve``'s allocation under ``tau`` (``use``: its usage, when already read)."""
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
            self._front(tau, *_caps(cap))
        return _trace(self._back[tau], use, tau)


def _fastest(prog: _Program, at_least: float, cheapest: bool = True) -> Allocation | None:
    """The search over the stage times asks only whether a bound can be met (the fronts
    answer that for one or two kinds, beyond them the LP bound, the dynamic program when the
    bound leaves one or two kinds, a quick greedy fill, else the MIP, which finds the cheapest
    allocation then: ``_solve_exact``); the cheapest allocation is found once, at the bound
    found. It bisects, except from a caller's bound (``at_least``), where the answer mostly
    is or is a few bounds above: that bound is tried first, then bounds 1, 3, 7, ... above
    it until one is met, then the bisection narrows the last step. Feasibility is monotone
    in the bound, so the answer is the same either way. ``cheapest`` False: the allocation
    found at that bound (``_Program.met``)."""
    taus, index, least = _bounds(prog)
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


@compiled
def _search_taus(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
                 taus, lo, hi, near, check_hi, relax, slow_cap, D, A, B):
    """``_Program.search``, compiled: the tests of ``_fastest`` (``_dp_stages`` at caps A, B:
    a bound is met when every stage keeps a non-empty front)."""
    S = len(of_stage)
    fewest = np.empty(A + 1, dtype=np.int64)
    pick = np.empty((S, A + 1), dtype=np.int64)
    if near and lo < hi and _dp_stages(
            of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
            taus[lo], taus[lo] * relax, slow_cap, D, A, B, fewest, pick) == S:
        return lo
    if check_hi and _dp_stages(
            of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb, K,
            taus[hi], taus[hi] * relax, slow_cap, D, A, B, fewest, pick) < S:
        return -1
    step = 1
    while near and lo < hi:
        probe = min(lo + step, hi)
        if probe == hi or _dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia,
                                     ib, na, ca, cb, K, taus[probe], taus[probe] * relax,
                                     slow_cap, D, A, B, fewest, pick) == S:
            hi = probe
            break
        lo, step = probe, 2 * step
    if near and lo < hi:
        lo += 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _dp_stages(of_stage, opt_start, kinds, tps, times, cstart, cend, ia, ib, na, ca, cb,
                      K, taus[mid], taus[mid] * relax, slow_cap, D, A, B, fewest, pick) == S:
            hi = mid
        else:
            lo = mid + 1
    return hi


def _bounds(prog: _Program) -> tuple[list[float], dict[float, int], float]:
    """The bounds ``_fastest`` searches over: every stage time, and every one over the
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


def tradeoffs(stage_opts: list[list[Option]], D: int, avail: np.ndarray, price: np.ndarray,
              region_of: list[int], levels: int = 6, at_least: float = 0.0,
              total: int | None = None, memo: PoolMemo | None = None,
              key: tuple | None = None, deadline: float | None = None) -> list[Allocation]:
    """Cheapest allocations under several bottleneck bounds, from the fastest feasible up:
    the time-cost trade-offs of one plan shape. ``memo``, ``key``: see PoolMemo; ``deadline``:
    see ``fastest``."""
    prog = _Program(stage_opts, D, avail, price, region_of, total, deadline, memo, key)
    return _memoised(memo, None if key is None else ("tradeoffs", D, total, levels, *key), avail,
                     at_least, lambda: _tradeoffs(prog, levels, at_least))


def _tradeoffs(prog: _Program, levels: int, at_least: float) -> list[Allocation]:
    best = _fastest(prog, at_least)
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
