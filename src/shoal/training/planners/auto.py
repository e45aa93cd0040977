"""shoal's default planner: a best-first branch and bound over plan shapes and data-parallel
degrees, with Sailor's space widened.

The space, beyond the ``sailor`` strategy's:
- every TP degree that fits a node, not only the smallest that fits in memory;
- for shallow pipelines every contiguous layer split, and for every depth the layers re-split
  so each stage's slowest GPU takes about equal time (a linear-partition dynamic program);
- every data-parallel degree worth trying, not only the walk that stops at the first
  non-improvement;
- for cost objectives, the cheapest allocation under several levels (bounds on the slowest
  option's cost to the iteration), so time-cost trade-offs reach the estimator and the Pareto
  front;
- every objective uses every pipeline depth (Sailor's public planner keeps min-cost searches to
  one stage), and activation recompute where the job allows it;
- each pair of a balanced split also gets the ``sailor`` strategy's own allocation (each kind at
  Sailor's TP, ``sailor.sailor_tp``), so every plan that strategy costs is costed here;
- a pair whose allocation puts stages in more than one region also gets the allocation of each
  region's own GPUs (the program counts no sends), and an allocation in a region of several
  zones is also placed from each of them (``_packings``);
- after the search, the best plans' layer boundaries are tuned on their own replicas
  (``refine``, run by ``planners.search``).

The search: (when minimising cost, Sailor's single-stage walk first, for an incumbent) every
(shape, degree) pair gets a lower bound on iteration time and on $/iteration
that holds for any allocation of the pool (see ``Bounds``). Pairs are taken cheapest bound
first; each is given its allocation by the stage dynamic program and costed by the estimator in
batches; the search stops when the next bound cannot beat the best plan found. A pair taken is
first given a tighter bound, per option rather than per term (``Bounds.refined``: what a replica
of each option costs the iteration, and the GPUs of the options under a level): when that
cannot beat the best plan, the pair's own split is not allocated, and of a re-split shape only
the re-split is (under its own refined bound). Inside a pair,
an allocation whose pipelines can neither beat the best plan found nor join the throughput-cost
front of the plans found (``Worth``: each pipeline's replicas run their microbatches at their
option times with the least sends, plus the pair's least sync and update) is not built, and when
the pair's least level already cannot, neither are the variants the program would give on fewer
options or fewer GPUs. Only bounds cut the space, so on it the result is the same as costing
every pair, and inside the pairs taken so is the front.

A pair's own allocations are the program's over its options' levels (``Bounds.option_levels``:
each option's least cost to the whole iteration, its stage's gradient ring and update after the
last backward included) rather than over their compute times: the fastest-compute allocation
gives a stage of many parameters (the embeddings) replicas at the smallest TP, whose gradient
ring can take longer than all its microbatches.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shoal.estimate.kernel import intra_terms, ring_bound_at, ring_bound_terms, ring_from_terms
from shoal.estimate.pipeline import stage_span, stage_spans
from shoal.jit import compiled
from shoal.profiles.network import bandwidth
from shoal.training.planners import sailor
from shoal.training.planners.allocate import (
    Allocation,
    Option,
    OutOfTime,
    fastest,
    kind_weights,
    slots,
    tradeoffs,
    upgraded,
)
from shoal.training.planners.build import build_spec, shares
from shoal.training.planners.common import Evaluator, cannot_beat, score
from shoal.training.planners.space import Space, balanced_split

ALL_SPLITS_UP_TO = 5  # pipeline depths whose every contiguous split is tried ...
MAX_SPLITS = 120  # ... when there are at most this many
PERMUTE_UP_TO = 5  # pipeline depths whose stage orders are permuted (when every split is tried)
PACKINGS = ("stage", "chain", "pipeline")  # zone placements tried for each allocation
_ANY_REGIONS = np.zeros(1, dtype=bool)  # _least_level's one-region flags of one row
_NO_FLOOR, _NONE_YET = np.full(1, -np.inf), np.full(1, np.inf)  # its floor, best of one degree
BATCH = 12  # (shape, degree) pairs allocated and costed per estimator call


def every_split(L: int, P: int) -> bool:
    """Whether every contiguous split of L layers into P > 1 stages is tried: shallow
    pipelines, when the splits are not too many."""
    return 1 < P <= ALL_SPLITS_UP_TO and math.comb(L - 1, P - 1) <= MAX_SPLITS


def splits_for(L: int, P: int) -> list[tuple[tuple[int, int], ...]]:
    """The balanced split, and every contiguous split where ``every_split``."""
    out = [balanced_split(L, P)]
    if every_split(L, P):
        for c in itertools.combinations(range(1, L), P - 1):
            edges = (0, *c, L)
            out.append(tuple((edges[i], edges[i + 1]) for i in range(P)))
    return list(dict.fromkeys(out))


def rebalanced(space: Space, alloc: Allocation, opts: list[list[Option]], L: int, mbs: int,
               recompute: bool) -> tuple[tuple[int, int], ...]:
    """Layers re-split so each stage's slowest replica type takes about equal time: the linear
    partition of the layer list minimising the slowest stage (dynamic program over cuts),
    kept per (GPU, TP) of the stages (``Space.resplits``)."""
    slow = []
    for st, o in zip(alloc.per_stage, opts, strict=True):
        k, tp, _ = st[0] if len(st) == 1 else max(
            st, key=lambda x: next(op.time_s for op in o if op.kind == x[0] and op.tp == x[1]))
        slow.append((space.kinds[k].gpu, tp))
    key = (tuple(slow), L, mbs, recompute)
    if key not in space.resplits:
        space.resplits[key] = _linear_partition(space, slow, L, mbs, recompute)
    return space.resplits[key]


def _linear_partition(space: Space, slow: list[tuple[str, int]], L: int, mbs: int,
                      recompute: bool) -> tuple[tuple[int, int], ...]:
    """The split of L layers over stages of these (GPU, TP) minimising the slowest stage."""
    P = len(slow)
    cum = np.array([space.tb.cum_step(g, tp, mbs, recompute) for g, tp in slow], dtype=float)
    arg = np.zeros((P, L + 1), dtype=np.int64)
    _min_max_cuts(cum, L, arg)
    edges = [L]
    for i in range(P - 1, 0, -1):
        edges.append(int(arg[i, edges[-1]]))
    edges.append(0)
    edges.reverse()
    return tuple((edges[i], edges[i + 1]) for i in range(P))


@compiled
def _min_max_cuts(cum, L, arg):
    """``_linear_partition``'s dynamic program over cuts, compiled: best[i, j], the smallest
    slowest stage placing layers [0, j) on stages 0..i (``cum[i]``: stage i's cumulative layer
    times), and in ``arg[i, j]`` where stage i starts in it (of equal ones, the first)."""
    P = cum.shape[0]
    best = np.full((P, L + 1), np.inf)
    for j in range(1, L + 1):
        best[0, j] = cum[0, j] - cum[0, 0]
    for i in range(1, P):
        for j in range(i + 1, L + 1):
            q = i
            for c in range(i, j):
                v = max(best[i - 1, c], cum[i, j] - cum[i, c])
                if c == i or v < best[i, j]:
                    best[i, j], q = v, c
            arg[i, j] = q


@compiled
def _refined_level(fpre, t, f, post, upd, move, lat, stage, bsum, P, n, D, sync, one_f1b):
    """``Bounds.refined``'s levels per option (``_refine_parts``' arrays, one row per set of
    option times: ``fpre``, ``t``, ``f``, ``post`` (rows, options) and ``bsum`` (rows,
    stages); ``move``, ``lat``: its ring terms, as ``kernel.ring_from_terms`` combines them;
    ``sync``: ``Bounds.sync_terms``), compiled: each option's own least exposed ring over D
    members and update; per row and stage the least of those; and L(s, o) per row
    (``one_f1b``: the plans run 1F1B, ``stage_span``)."""
    sync_scale, overlap, sync_on, upd_div = sync[0], sync[1], sync[2], sync[3]
    own = upd / upd_div
    if D > 1:
        # the ring hides behind the backward of the replica that ends its stage last: of
        # any option of the stage (the most time per microbatch bounds it)
        busy = np.zeros(P)
        for i in range(len(own)):
            busy[stage[i]] = max(busy[stage[i]], t[0, i])
        d = float(D)
        c_move, c_lat = 2.0 * (d - 1) / d, 2.0 * (d - 1)
        for i in range(len(own)):
            best = np.inf
            for j in range(move.shape[1]):
                best = min(best, (c_move * move[i, j] + c_lat * lat[i, j]) * sync_scale)
            own[i] += sync_on * max(best - overlap * busy[stage[i]], 0.0)
    least = np.full(P, np.inf)  # per stage, its least ring and update
    for i in range(len(own)):
        least[stage[i]] = min(least[stage[i]], own[i])
    level = np.empty(t.shape)
    earlier = np.empty(P)
    for r in range(t.shape[0]):
        # per stage s, the most max_{s' < s} (bsum[s] - bsum[s'] + least[s']) (none for s = 0)
        most = -np.inf
        for s in range(P):
            earlier[s] = most + bsum[r, s]
            most = max(most, least[s] - bsum[r, s])
        for i in range(len(own)):
            span = stage_span(n, min(P - 1 - stage[i], n), f[r, i], t[r, i] - f[r, i],
                              post[r, i], one_f1b)
            level[r, i] = fpre[r, i] + span + max(own[i], earlier[stage[i]])
    return level


@compiled
def _least_cost(level, rate, stage, P, least, overhead):
    """``Bounds.refined``'s cost per pipeline: a plan whose options (stage by stage, at
    ``level`` each) are all at or under theta takes at least max(theta, ``least``) +
    ``overhead`` seconds and pays each stage's replica at least the least ``rate`` (USD/s)
    of that stage's options at or under theta; the least such cost over theta (inf when no
    theta holds an option of every stage)."""
    order = np.argsort(level)
    low = np.full(P, np.inf)  # per stage, its least rate so far
    best = np.inf
    i = 0
    while i < len(order):
        theta = level[order[i]]
        while i < len(order) and level[order[i]] == theta:  # options at theta join together
            o = order[i]
            low[stage[o]] = min(low[stage[o]], rate[o])
            i += 1
        total = 0.0
        for s in range(P):
            total += low[s]
        if total < np.inf:
            best = min(best, (max(theta, least) + overhead) * total)
    return best


@compiled
def _least_level(levels, one_region, floor, best, tp, kind, stage, P, Ds, avail, region_of,
                 region_N, W):
    """Per degree D in ``Ds``, ``Bounds.refined``'s level: over the rows of ``levels`` (each
    a level per option), the smallest level at which the pool holds D replicas of each of
    the P stages among the options at or under it in that row, by the conditions of
    ``Bounds._tau`` (per stage in one region, the stages per region, and the GPUs all stages
    take from each kind together: LP dual bounds at weights ``W``; on the rows where
    ``one_region`` is set, also all stages in one region), when under ``best`` (a degree's
    answer so far; inf: none). Once a degree's answer is down to its ``floor`` the later rows
    are not searched. Feasibility only grows with the level, so a bisection over a row's
    sorted levels finds it; it only shrinks as D grows, so a degree at least the one before
    starts where that one's answer is in the row."""
    K, R = len(avail), len(region_N)
    out = best.copy()
    for v in range(levels.shape[0]):
        level = levels[v]
        order = np.argsort(level)
        ranked = level[order]
        start = 0
        for i in range(len(Ds)):
            D = Ds[i]
            lo = start if i > 0 and Ds[i - 1] <= D else 0
            if out[i] <= floor[i]:
                start = lo
                continue
            # only levels under the best answer so far can improve on it
            hi = max(lo, np.searchsorted(ranked, out[i]))
            end = hi
            while lo < hi:
                mid = (lo + hi) // 2
                theta = level[order[mid]]
                c = np.full((P, K), np.inf)  # fewest GPUs per replica of stage s from kind k
                for o in range(len(level)):
                    if level[o] <= theta and tp[o] < c[stage[o], kind[o]]:
                        c[stage[o], kind[o]] = tp[o]
                # per stage and region: the replicas it can hold, the fewest GPUs of one
                cap = np.zeros((P, R))
                low = np.full((P, R), np.inf)
                for s in range(P):
                    for k in range(K):
                        if c[s, k] < np.inf:
                            cap[s, region_of[k]] += np.floor(avail[k] / c[s, k])
                            low[s, region_of[k]] = min(low[s, region_of[k]], c[s, k])
                ok = True
                for s in range(P):
                    if cap[s].max() < D:
                        ok = False
                if ok:
                    stages = 0.0
                    for r in range(R):
                        gmin = low[:, r].min()
                        if gmin < np.inf:
                            stages += np.floor(region_N[r] / (gmin * D))
                    ok = stages >= P
                if ok and one_region[v]:
                    ok = False
                    for r in range(R):
                        need = 0.0  # GPUs of region r that D replicas of every stage take
                        for s in range(P):
                            need += D * low[s, r] if cap[s, r] >= D else np.inf
                        if need <= region_N[r]:
                            ok = True
                m = 0
                while ok and m < W.shape[0]:
                    den, have = 0.0, 0.0
                    for k in range(K):
                        have += W[m, k] * avail[k]
                    for s in range(P):
                        fewest = np.inf  # the stage's fewest weighted GPUs per replica
                        for k in range(K):
                            if c[s, k] < np.inf:
                                fewest = min(fewest, W[m, k] * c[s, k])
                        den += fewest
                    ok = not (den > 0 and D * den > have)
                    m += 1
                if ok:
                    hi = mid
                else:
                    lo = mid + 1
            if lo < end:
                out[i] = level[order[lo]]
            start = lo
    return out


@dataclass(frozen=True)
class Shape:
    recompute: bool
    mbs: int
    split: tuple[tuple[int, int], ...]
    opts: tuple[tuple[Option, ...], ...]
    rebalance: bool
    # the `sailor` strategy's options for this shape (each kind at Sailor's TP), on the shapes
    # that strategy plans: balanced splits, its recompute setting
    sailors: tuple[tuple[Option, ...], ...] | None = None


class Bounds:
    """Lower bounds on the iteration time and $/iteration of any plan of a shape with D
    pipelines, whatever GPUs of the pool it is given. With n = total microbatches:

    - tail_s(D): a stage's gradient all-reduce plus its fastest update; every worker's compute
      ends at least min_s tail_s before the iteration does. The all-reduce takes at least its
      ring over the fastest link of the problem its replicas can span, and (on a shape whose
      splits are not redone) over the fastest hops of the one or two options it may mix
      (``_option_sync``): the bound holds for plans whose stages mix at most two options, as
      every allocation of ``allocate`` and its variants does;
    - the slowest replica, tau(D), is at least the smallest stage time for which the pool holds
      enough GPUs: per stage from the kinds fast enough, per region, and for all stages at once
      (the GPUs their replicas take from each kind: an LP relaxation, bounded through its dual);
      pipeline 0 pairs the slowest replicas and runs floor(n / D) microbatches:
      T >= floor(n/D) tau + min tail, with tau over per-microbatch times that include the
      replica's sends (over its own TP's flows) and blocking receives;
    - the busiest pipeline runs ceil(n / D) microbatches, each at least the stage's fastest
      option: T >= ceil(n/D) t_min,s + tail_s for every stage;
    - work: GPU-seconds of compute (fastest option per stage, plus the sends every stage makes),
      and the fill/drain each worker of stage s idles (the stages before it), weighted per kind
      by its speed, fit in the pool's weighted GPU-seconds before the tail (an LP dual bound);
    - cost: each worker is paid for its busy time, its idle fill/drain and the tail, and the whole
      allocation for T; the cheaper kind per stage bounds both.
    """

    def __init__(self, space: Space, avail: np.ndarray, price_h: np.ndarray,
                 region_of: list[int]):
        pb, tb = space.problem, space.tb
        self.space, self.tc = space, pb.timing
        self.avail = avail.astype(float)
        self.N = float(avail.sum())
        self.region_of = np.asarray(region_of)
        self.region_N = np.bincount(self.region_of, weights=self.avail)
        self.price_s = price_h / 3600.0
        self.gi = np.array([tb.gi(k.gpu) for k in space.kinds])
        # the planners' plans run 1F1B unless the job rules it out (``Evaluator.cost``)
        self.one_f1b = "1f1b" in pb.job.schedule
        self.lat_min = float(tb.flat_lat.min())
        # fastest send per microbatch size and sender's TP degree (its flows), and over all
        M, T = len(tb.mbs), len(tb.tps)
        self.p2p_tp = (tb.p2p_time.reshape(M, -1, T).min(axis=1) * self.tc.p2p_scale
                       + self.tc.p2p_overhead_s)  # (M, T)
        self.p2p_min = self.p2p_tp.min(axis=1)
        # the kernel's gradient sync: hidden behind a replica's backward as far as the stack
        # overlaps it; none after the backward under ZeRO-3; the update sharded under ZeRO 1+
        zeros = pb.job.zero_stage
        self.sync_on = 0.0 if 3 in zeros else 1.0
        self.gpn_most = float(tb.gpus_per_node.max())
        self.upd_div_on = any(z >= 1 for z in zeros)
        self.overlap = self.tc.grad_reduce_overlap
        self.lat_min = min(self.lat_min, float(tb.intra_lat.min()))
        # link classes by where the two ends are: 0 same zone, 1 same region, 2 across regions
        G, Z, _, _, T = tb.link_div.shape
        _, za, _, zb, _ = np.indices((G, Z, G, Z, T)).reshape(5, -1)
        reg = np.array([pb.zone_region[z] for z in tb.zones])
        self.link_class = np.where(za == zb, 0, np.where(reg[za] == reg[zb], 1, 2))
        # the most GPUs one zone / one region holds: a ring over more must leave it
        per_zone: dict[str, int] = {}
        for (_, z), n in pb.avail.items():
            per_zone[z] = per_zone.get(z, 0) + n
        per_region: dict[str, int] = {}
        for z, n in per_zone.items():
            per_region[pb.zone_region[z]] = per_region.get(pb.zone_region[z], 0) + n
        self.zone_most = max(per_zone.values(), default=0)
        # fastest send per microbatch size and TP between regions (None: one region)
        self.cross = None
        if len(self.region_N) > 1:
            p2p = tb.p2p_time * self.tc.p2p_scale + self.tc.p2p_overhead_s  # (M, links)
            tpi = np.arange(p2p.shape[1]) % T
            self.cross = np.array([[p2p[m, (self.link_class == 2) & (tpi == ti)].min(initial=np.inf)
                                    for ti in range(T)] for m in range(M)])
        self.region_most = max(per_region.values(), default=0)
        self._option_rings: dict[tuple, np.ndarray] = {}  # these depend on the GPU counts
        # what does not depend on the GPU counts, shared by every pool of the same kinds in
        # the same zones (``Space.bound_memo``)
        memo = self._memo = space.bound_memo
        self._sync: dict[tuple[int, int], np.ndarray] = memo.setdefault("sync", {})
        self._tails: dict[tuple, float] = memo.setdefault("tails", {})
        self._hops: dict[tuple, np.ndarray] = memo.setdefault("hops", {})  # a hop's link ids
        self._hop_times: dict[tuple, float] = memo.setdefault("hop times", {})  # one degree
        self._hop_terms: dict[tuple, tuple] = memo.setdefault("hop terms", {})  # ring_terms
        self._rings_of: dict[tuple, list] = memo.setdefault("option rings", {})  # _option_hops
        self._refined: dict[tuple, tuple] = memo.setdefault("refined", {})  # _refine_parts
        self._levels: dict[tuple, tuple] = memo.setdefault("levels", {})  # option_levels
        self._stages: dict[tuple, tuple] = memo.setdefault("stages", {})  # _stage_parts
        # the same two, by shape object (cheaper to look up than by content; shapes are kept
        # across pools): (shape, parts) by (which, id)
        self._by_shape: dict[tuple, tuple] = memo.setdefault("by shape", {})
        # the shapes' option times with their least sends (``option_times``), by shape object
        self._times: dict[int, tuple[Shape, _OptionTimes]] = memo.setdefault("times", {})
        self._weights_grid = kind_weights(len(self.avail))

    def _ring_bytes_time(self, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Seconds per 2(D-1)/D of a stage's gradients: (3, TPs) over the fastest link of
        each class (same zone, same region, across regions; no faster class counts for the
        slower ones), per TP degree of the replicas (a TP group sends over that many flows, or
        more where replicas share a node); and (TPs,) over one node's GPU-to-GPU links, for
        rings whose members fit one node (``kernel._dp_ring``)."""
        key = (a, b)
        if key not in self._sync:
            tb = self.space.tb
            nbytes = self.space.grad_bytes(a, b)
            div = tb.flat_div
            t = nbytes / (div * bandwidth(tb.flat_curve, nbytes / div))
            T = len(tb.tps)
            tpi = np.arange(len(t)) % T
            out = np.full((3, T), np.inf)
            for c in range(3):
                for ti in range(T):
                    sel = (self.link_class >= c) & (tpi >= ti)
                    if sel.any():
                        out[c, ti] = t[sel].min()
            inside = np.array([intra_terms(tb, np.arange(len(tb.gpus)), nbytes / tp)[0].min()
                               for tp in tb.tps])
            self._sync[key] = (out, inside)
        return self._sync[key]

    @property
    def sync_terms(self) -> np.ndarray:
        """(sync scale, overlap, whether the sync follows the backward, the update's divisor
        under ZeRO) as ``_refined_level`` takes them; the divisor is 1 here, the caller's D
        where ZeRO shards the update (``refined_level``)."""
        return np.array([self.tc.sync_scale, self.overlap, self.sync_on, 1.0])

    def _exposed(self, ring: np.ndarray, busy: np.ndarray) -> np.ndarray:
        """A stage's least exposed gradient sync from its least ring and the most compute
        time per microbatch of its replicas (their backward is shorter): what the stack
        hides behind the last backward comes off; nothing follows the backward under
        ZeRO-3."""
        return self.sync_on * np.maximum(ring - self.overlap * busy, 0.0)

    def __call__(self, sh: Shape, Ds: np.ndarray, total: int):
        """(time, cost, slowest replica's compute time) lower bounds for each degree in ``Ds``;
        inf where the pool cannot hold D replicas of every stage. A shape whose layers the
        search re-splits (``rebalance``) also yields plans of other splits, which only the
        looser terms bound: its time bound leaves out the joint GPU count and each option's
        own sends."""
        loose = sh.rebalance
        tc = self.tc
        P = len(sh.split)
        D = Ds.astype(float)
        n_hi, n_lo = np.ceil(total / D), np.floor(total / D)
        (tmin, fmin, bmin, upd, busy_w, idle_w, busy_c, rate, ring_s, y, t_all, full_all, tps_,
         kinds_, stage_, tmax) = self._shape_parts(sh)
        upd = upd[:, None] / D[None, :] if self.upd_div_on else upd[:, None]  # ZeRO shards it
        pre = np.concatenate([[0.0], np.cumsum(tmin)[:-1]])  # forward and backward before s
        fpre = np.concatenate([[0.0], np.cumsum(fmin)[:-1]])  # forwards before s
        post = np.concatenate([np.cumsum(tmin[::-1])[::-1][1:], [0.0]])  # stages after s
        # a stage whose D replicas (at its fewest GPUs each) outnumber one zone's or one
        # region's GPUs all-reduces over at least one link between zones or regions
        min_tp = np.array([min(o.tp for o in opts) for opts in sh.opts], dtype=float)
        span = ((D[None, :] * min_tp[:, None] > self.zone_most).astype(int)
                + (D[None, :] * min_tp[:, None] > self.region_most))
        ring = np.take_along_axis(ring_s[:, :3], span, axis=1)  # (P, nD)
        # a stage whose D replicas fit one node may ring inside it
        fits = D[None, :] * min_tp[:, None] <= self.gpn_most
        ring = np.where(fits, np.minimum(ring, ring_s[:, 3:]), ring)
        sync = np.where(D[None, :] > 1, ((2 * (D - 1) / D)[None, :] * ring
                                         + 2 * (D - 1)[None, :] * self.lat_min) * tc.sync_scale, 0.0)
        if not loose:
            sync = np.maximum(sync, np.array([self._option_sync(ab, opts, Ds)
                                              for ab, opts in zip(sh.split, sh.opts, strict=True)]))
        tail = self._exposed(sync, tmax[:, None]) + upd  # (P, nD)
        tail_min = tail.min(axis=0)
        work = (total * busy_w.sum() + D * (pre * idle_w).sum()) / max(float(y @ self.avail), 1e-300)
        tau = self._tau(t_all, tps_, kinds_, stage_, P, Ds)
        if loose:
            slow = (self._tau(t_all, tps_, kinds_, stage_, P, Ds, joint=False)
                    + float((full_all - t_all).min()))
        else:
            slow = self._tau(full_all, tps_, kinds_, stage_, P, Ds)  # with sends
        # the busiest pipeline's replica of stage s: it starts after the forwards before it,
        # runs n microbatches with the waits of its schedule (``stage_span``), then the
        # earlier stages' backwards and stage 0's tail follow; or its own tail follows directly
        chain = stage_spans(n_hi, np.minimum(P - 1 - np.arange(P)[:, None], n_hi[None, :]),
                            fmin, bmin, post, self.one_f1b)
        T = np.maximum.reduce([
            tail_min + work,
            n_lo * slow + tail_min,
            (pre[:, None] + chain).max(axis=0) + tail[0],
            (fpre[:, None] + chain + tail).max(axis=0),
        ])
        T = T + tc.step_overhead_s
        if loose:
            # the other splits are re-splits of the shape's own allocation: where the joint
            # GPU count leaves the shape none, the pair has no plan at all
            T = np.where(np.isfinite(tau), T, np.inf)
        with np.errstate(invalid="ignore"):  # inf x 0 on free GPUs: replaced below
            C = np.maximum(T * D * rate.sum(), total * busy_c.sum()
                           + D * (rate[:, None] * (pre[:, None] + tail)).sum(axis=0))
        C = np.where(np.isfinite(T), C, np.inf)
        return T, C, tau, tail_min + tc.step_overhead_s

    def _shape_parts(self, sh: Shape) -> tuple:
        """What ``__call__`` needs of ``sh`` at any degree and pool of the same kinds and
        zones, per stage: the least time per microbatch with sends, forward with sends,
        backward and update; the least weighted and USD GPU-seconds per microbatch, weighted
        GPUs and USD/s per replica; its gradients' ring seconds per link class (``_sync``);
        the kinds' weights; and per option (stage by stage) its compute time, its time with
        sends, its TP, kind and stage."""
        loose = sh.rebalance
        mine = self._by_shape.get(("shape", id(sh)))
        if mine is not None and mine[0] is sh:
            return mine[1]
        key = ("shape", sh.split, sh.mbs, sh.opts, loose)
        got = self._memo.get(key)
        if got is not None:
            self._by_shape[("shape", id(sh))] = (sh, got)
            return got
        tb, tc = self.space.tb, self.tc
        P = len(sh.split)
        mi = tb.mi(sh.mbs)
        y = self._weights(sh)
        # every option of every stage at once, stage by stage: per-stage least values are
        # minima over each stage's run of options
        t_c, tp, k, st = self._options_of(sh)
        ti = np.array([tb.ti(o.tp) for opts in sh.opts for o in opts])
        starts = np.concatenate([[0], np.cumsum([len(opts) for opts in sh.opts])[:-1]])
        a = np.array([ab[0] for ab in sh.split])[st]
        b = np.array([ab[1] for ab in sh.split])[st]
        f_extra, b_extra = self._sends(st, P, mi, ti, loose)
        g = self.gi[k]
        f = (tb.cum_f[g, ti, mi, b] - tb.cum_f[g, ti, mi, a]) * tc.compute_scale
        t = t_c + f_extra + b_extra

        def least(x: np.ndarray) -> np.ndarray:
            return np.minimum.reduceat(x, starts)

        tmax = np.maximum.reduceat(t_c, starts)  # the most compute per microbatch

        tmin, fmin, bmin = least(t), least(f + f_extra), least(t_c - f + b_extra)
        upd = least(tb.cum_u[g, ti, b] - tb.cum_u[g, ti, a])
        busy_w = least(y[k] * t * tp)  # weighted GPU-seconds per microbatch
        idle_w = least(y[k] * tp)  # weighted GPUs per replica
        busy_c = least(self.price_s[k] * t * tp)  # USD per microbatch
        rate = least(self.price_s[k] * tp)  # USD/s per replica
        ring_s = np.empty((P, 4))  # per class, and inside one node
        for s, (ab, lo, hi) in enumerate(zip(sh.split, starts, [*starts[1:], len(st)],
                                             strict=True)):
            spread, inside = self._ring_bytes_time(*ab)
            tis = np.unique(ti[lo:hi])
            ring_s[s, :3] = spread[:, tis].min(axis=1)
            ring_s[s, 3] = min(inside[tis].min(), ring_s[s, 0])
        got = self._memo[key] = (tmin, fmin, bmin, upd, busy_w, idle_w, busy_c, rate, ring_s, y,
                                 t_c, t, tp, k, st, tmax)
        self._by_shape[("shape", id(sh))] = (sh, got)
        return got

    def _options_of(self, sh: Shape) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per option of ``sh`` (stage by stage): its compute time per microbatch, its TP, its
        kind and its stage (by shape object)."""
        mine = self._by_shape.get(("options", id(sh)))
        if mine is not None and mine[0] is sh:
            return mine[1]
        flat = [o for opts in sh.opts for o in opts]
        got = (np.array([o.time_s for o in flat]), np.array([o.tp for o in flat], dtype=float),
               np.array([o.kind for o in flat]),
               np.repeat(np.arange(len(sh.opts)), [len(opts) for opts in sh.opts]))
        self._by_shape[("options", id(sh))] = (sh, got)
        return got

    def slowest(self, sh: Shape, D: int) -> float:
        """The least time per microbatch of the slowest replica of any plan of ``sh``'s own
        split with D pipelines, as ``__call__``'s third value (``_tau``)."""
        t_all, tps_, kinds_, stage_ = self._options_of(sh)
        return float(self._tau(t_all, tps_, kinds_, stage_, len(sh.split), np.array([D]))[0])

    def refined(self, sh: Shape, D: int, total: int) -> tuple[float, float]:
        """(time, cost) lower bounds on the plans of ``sh``'s own split (``refined_level``)."""
        return self.refined_level(sh, D, total)[:2]

    def refined_level(self, sh: Shape, D: int, total: int) -> tuple[float, float, float]:
        """(time, cost) lower bounds on the plans of ``sh``'s own split with D pipelines, per
        option rather than per term (one degree at a time, so the search asks it of the pairs
        it takes, not of every pair). With n = floor(total / D), the fewest microbatches a
        pipeline runs, a replica of option o in stage s (forward f_o and backward b_o per
        microbatch, with its least sends) starts no sooner than the least forwards of the
        stages before s, and its stage's last backward ends no sooner than that plus the longer
        of n (f_o + b_o) and n f_o + (the later stages' least forward and backward) + b_o (the
        last microbatch goes down the pipeline and back before its backward). Then its stage's
        ring all-reduce takes at least the hop out of it (its fastest link to any kind,
        ``_hop_s``) and its update follows; and each earlier stage s' ends at least the least
        backwards of stages s'..s-1 later, and then takes at least its own least ring and
        update: the iteration takes at least L(s, o), the largest of these. The smallest
        level at which the pool holds D replicas of every stage among the options with
        L(s, o) under it (``_least_level``: the conditions of ``_tau``) bounds the time. A
        plan whose options are all at level theta or under takes at least the larger of theta
        and that, and pays each replica of a stage at least the least USD/s of that stage's
        options at or under theta: the least of that over theta, D times over, bounds the
        cost (``_least_cost``). On a pool of several regions the time is the least of two
        such levels: over the plans in one region (the pool of that region must hold them),
        and over the plans that send across regions between some stages b and b + 1, whose
        options on those two stages take that send (``_crossing``), as do the other stages'
        least forwards and backwards before and after them (``_crossing_rows``): each stage's replicas
        are in one region (H5), so a plan in two regions crosses between some two stages, on
        every pipeline. Third: the least level over any regions without those sends, a lower
        bound on the least largest level of the options any allocation of the pool takes
        (``option_levels``)."""
        fpre, t, f, post, upd, _, tp, kind, stage, bsum = self._refine_parts(sh)
        ring = self._ring_rows(sh, D)
        P = len(sh.split)
        rest = (P, total // D, D, self._sync_at(D), self.one_f1b)
        pool = (tp, kind, stage, P, np.array([D], dtype=np.int64), self.avail, self.region_of,
                self.region_N, self._weights_grid)
        base = _refined_level(fpre[None, :], t[None, :], f[None, :], post[None, :], upd,
                              ring[0], ring[1], stage, bsum[None, :], *rest)
        T = _least_level(base, _ANY_REGIONS, _NO_FLOOR, _NONE_YET, *pool)
        any_region = float(T[0])
        if self.cross is not None and P > 1:
            # a plan in more than one region (each stage's replicas in one, H5) sends across
            # regions between some stages b and b + 1, on every pipeline: the least level
            # over the plans in one region and, for each b, those crossing there
            fp, tb_, fb_, po, bs = self._crossing_rows(sh)
            rows = _refined_level(fp, tb_, fb_, po, upd, ring[0], ring[1], stage, bs, *rest)
            T = _least_level(np.concatenate([base, rows]),
                             np.arange(P) == 0, T, _NONE_YET, *pool)
        least = float(T[0])
        # the cost: at least that long, every replica of every stage at the least rate of the
        # options it may take in a plan of that level
        cost = _least_cost(base[0], self.price_s[kind] * tp, stage, P, least,
                           self.tc.step_overhead_s) if np.isfinite(least) else np.inf
        return least + self.tc.step_overhead_s, cost * D, any_region

    def _sync_at(self, D: int) -> np.ndarray:
        """``sync_terms`` for D pipelines."""
        terms = self.sync_terms
        if self.upd_div_on:
            terms[3] = float(D)
        return terms

    def option_levels(self, sh: Shape, D: int, total: int) -> list[list[Option]]:
        """Per stage of ``sh``'s own split, its options with their levels L(s, o) at D
        pipelines (``refined``) as their times: a plan of that split that gives stage s a
        replica of option o takes at least L(s, o) plus the step overhead. Unlike the compute
        time the allocation program ranks options by, a level counts the option's gradient
        ring and update after its stage's last backward (large for a stage of many
        parameters at a small TP) and the pipeline's fill. They do not depend on the GPU
        counts: kept across pools."""
        key = (id(sh), D, total)
        got = self._levels.get(key)
        if got is None or got[0] is not sh:
            fpre, t, f, post, upd, _, tp, kind, stage, bsum = self._refine_parts(sh)
            ring = self._ring_rows(sh, D)
            P = len(sh.split)
            level = _refined_level(fpre[None, :], t[None, :], f[None, :], post[None, :], upd,
                                   ring[0], ring[1], stage, bsum[None, :], P, total // D, D,
                                   self._sync_at(D), self.one_f1b)[0]
            per: list[list[Option]] = [[] for _ in range(P)]
            for s, k, g, lv in zip(stage.tolist(), kind.tolist(), tp.tolist(), level.tolist(),
                                   strict=True):
                per[s].append(Option(k, int(g), lv))
            got = self._levels[key] = (sh, per)
        return got[1]

    def crossed_times(self, sh: Shape, per_stage, times: _OptionTimes | None = None
                      ) -> tuple[list[dict[tuple[int, int], float]], ...] | None:
        """Per stage, (kind, TP) -> time per microbatch and forward per microbatch (of
        ``times``, or else ``option_times(sh)``) for an allocation (``Allocation.per_stage``)
        of ``sh``'s microbatch size whose stages are in more than one region, with the sends
        across regions between its stages b and b + 1 in different ones (as ``_crossing``);
        None when its stages are in one region (every stage's replicas are in one region,
        H5)."""
        if self.cross is None:
            return None
        regions = [self.region_of[st[0][0]] for st in per_stage]
        if all(r == regions[0] for r in regions):
            return None
        tb, rf = self.space.tb, self.tc.recv_fraction
        mi = tb.mi(sh.mbs)
        got = self.option_times(sh) if times is None else times
        times, fwd = list(got.times), list(got.fwd)
        for b in range(len(regions) - 1):
            if regions[b] != regions[b + 1]:
                # the receiver's on the sender's link: the fastest of stage b's TPs
                xr = self._across(mi, [tb.ti(tp) for _, tp, _ in per_stage[b]])[1]
                tps = sorted({tp for _, tp in times[b]})  # the sender's, per its own TP
                xs = dict(zip(tps, self._across(mi, [tb.ti(tp) for tp in tps])[0].tolist(),
                              strict=True))
                # the sender sends on its forward and receives on its backward, the receiver
                # the other way round (``recv_fraction`` of a transfer on the receiving end)
                times[b] = {(k, tp): v + (1 + rf) * xs[tp] for (k, tp), v in times[b].items()}
                fwd[b] = {(k, tp): v + xs[tp] for (k, tp), v in fwd[b].items()}
                times[b + 1] = {key: v + (1 + rf) * xr for key, v in times[b + 1].items()}
                fwd[b + 1] = {key: v + rf * xr for key, v in fwd[b + 1].items()}
        return times, fwd

    def _across(self, mi: int, sender_ti) -> tuple[np.ndarray, float]:
        """Seconds a send across regions adds, one way, per microbatch of size index ``mi``
        over the least send ``_sends`` already counts: on the sender's side, per TP index in
        ``sender_ti``; on the receiver's, from a sender at any of them (the fastest)."""
        ti = np.asarray(sender_ti, dtype=np.int64)
        across = self.cross[mi, ti]
        return across - self.p2p_tp[mi, ti], float(across.min() - self.p2p_min[mi])

    def _crossing(self, sh: Shape) -> tuple[np.ndarray, ...]:
        """Per option of ``sh`` (as ``_refine_parts``), its time per microbatch and its
        forward when its stage sends across regions to the next stage (its own TP's fastest
        link between regions), and when it receives from the stage before across regions
        (any TP's): the kernel charges a send both ways on the sender's link, the sender for
        the activations and the receiver for the gradients, and ``recv_fraction`` of each on
        the other end."""
        mine = self._by_shape.get(("cross", id(sh)))
        if mine is not None and mine[0] is sh:
            return mine[1]
        _, t, f, *_ = self._refine_parts(sh)
        tb, rf = self.space.tb, self.tc.recv_fraction
        mi = tb.mi(sh.mbs)
        xs = self._across(mi, [tb.ti(o.tp) for opts in sh.opts for o in opts])[0]
        xr = self._across(mi, range(len(tb.tps)))[1]  # from a sender at any TP
        got = (t + (1 + rf) * xs, f + xs, t + (1 + rf) * xr, f + rf * xr)
        self._by_shape[("cross", id(sh))] = (sh, got)
        return got

    def _crossing_rows(self, sh: Shape) -> tuple[np.ndarray, ...]:
        """``_refine_parts``' (fpre, t, f, post, bsum) of ``sh``, a row per b in 0..P-2 (arrays
        of P-1 rows, as ``_refined_level`` takes them), for plans that
        send across regions between stages b and b + 1: those two stages' options take the
        send (``_crossing``), and so do the sums of least times the other stages' options
        count (the forwards before a stage, the forwards and backwards after it, and the
        backwards before it)."""
        mine = self._by_shape.get(("cross rows", id(sh)))
        if mine is not None and mine[0] is sh:
            return mine[1]
        _, t, f, *_, stage, _ = self._refine_parts(sh)
        ts, fs, tr, fr = self._crossing(sh)
        P = len(sh.split)
        starts = np.concatenate([[0], np.nonzero(np.diff(stage))[0] + 1])
        rows = []
        for b in range(P - 1):
            tb_ = np.where(stage == b, ts, np.where(stage == b + 1, tr, t))
            fb_ = np.where(stage == b, fs, np.where(stage == b + 1, fr, f))
            fmin = np.minimum.reduceat(fb_, starts)
            tmin = np.minimum.reduceat(tb_, starts)
            bmin = np.minimum.reduceat(tb_ - fb_, starts)
            fpre = np.concatenate([[0.0], np.cumsum(fmin)[:-1]])
            post = np.concatenate([np.cumsum(tmin[::-1])[::-1][1:], [0.0]])
            bsum = np.concatenate([[0.0], np.cumsum(bmin)[:-1]])
            rows.append((fpre[stage], tb_, fb_, post[stage], bsum))
        got = tuple(np.stack(x) for x in zip(*rows, strict=True))
        self._by_shape[("cross rows", id(sh))] = (sh, got)
        return got

    def _refine_parts(self, sh: Shape):
        """Per option of ``sh`` (stage by stage), what ``refined`` needs at any degree: the
        least forwards of the stages before its stage; its time per microbatch and its
        forward, with its least sends; the least forward and backward of the stages after its
        stage; its update; the ``ring_terms`` of its stage's gradients over the links out of
        it to any kind (``_links``; a row padded with its own last link); its TP, kind and
        stage. Per stage, the least backwards of the stages before it."""
        mine = self._by_shape.get(("refine", id(sh)))
        if mine is not None and mine[0] is sh:
            return mine[1]
        key = (sh.split, sh.mbs, sh.opts)
        got = self._refined.get(key)
        if got is None:
            P, mi = len(sh.split), self.space.tb.mi(sh.mbs)
            stages = [self._stage_parts(ab, mi, s == 0, s == P - 1, opts)
                      for s, (ab, opts) in enumerate(zip(sh.split, sh.opts, strict=True))]
            per = [len(x[4]) for x in stages]
            fmin = np.array([x[0] for x in stages])
            tmin = np.array([x[2].min() for x in stages])
            bmin = np.array([(x[2] - x[6]).min() for x in stages])
            fpre = np.concatenate([[0.0], np.cumsum(fmin)[:-1]])
            post = np.concatenate([np.cumsum(tmin[::-1])[::-1][1:], [0.0]])
            ring = [b for x in stages for b in x[3]]  # per option, its ring's candidates
            got = self._refined[key] = (
                np.repeat(fpre, per), np.concatenate([x[2] for x in stages]),
                np.concatenate([x[6] for x in stages]), np.repeat(post, per),
                np.concatenate([x[1] for x in stages]), ring,
                np.concatenate([x[4] for x in stages]), np.concatenate([x[5] for x in stages]),
                np.repeat(np.arange(P), per), np.concatenate([[0.0], np.cumsum(bmin)[:-1]]))
        self._by_shape[("refine", id(sh))] = (sh, got)
        return got

    def _ring_rows(self, sh: Shape, D: int) -> tuple[np.ndarray, np.ndarray]:
        """Per option of ``sh`` (a row each, padded with its own last link's), the ring terms
        of its stage's gradients that bound a ring of D members (``kernel.ring_bound_at``)."""
        key = ("rings", id(sh), D)
        got = self._by_shape.get(key)
        if got is None or got[0] is not sh:
            rows = [ring_bound_at(b, D) for b in self._refine_parts(sh)[5]]
            width = max(m.shape[-1] for m, _ in rows)
            got = self._by_shape[key] = (sh, tuple(
                np.concatenate([_pad_last(np.atleast_2d(x[i]), width) for x in rows])
                for i in range(2)))
        return got[1]

    def _stage_parts(self, ab: tuple[int, int], mi: int, first: bool, last: bool,
                     opts: tuple[Option, ...]):
        """``_refine_parts`` of one stage over layers ``ab`` (microbatch size index ``mi``):
        its least forward per microbatch with sends; per option its update, its time with its
        least sends and the ``ring_terms`` of the stage's gradients over its links out to any
        kind (a row per option, padded with its own last link); per option its TP, its kind
        and its forward with its least sends."""
        key = (ab, mi, first, last, opts)
        got = self._stages.get(key)
        if got is None:
            tb, tc = self.space.tb, self.tc
            a, b = ab
            k = np.array([o.kind for o in opts])
            ti = np.array([tb.ti(o.tp) for o in opts])
            s = 0 if first else 1
            f_extra, b_extra = self._sends(s, s + 1 if last else s + 2, mi, ti)
            g = self.gi[k]
            f = (tb.cum_f[g, ti, mi, b] - tb.cum_f[g, ti, mi, a]) * tc.compute_scale
            K = len(self.avail)
            rows = [np.concatenate([self._links(o.kind, o.tp, k2) for k2 in range(K)])
                    for o in opts]
            rid = np.empty((len(rows), max(len(r) for r in rows)), dtype=np.int64)
            for i, r in enumerate(rows):
                rid[i, :len(r)] = r
                rid[i, len(r):] = r[-1]
            nbytes = self.space.grad_bytes(a, b)
            got = self._stages[key] = (
                float((f + f_extra).min()), tb.cum_u[g, ti, b] - tb.cum_u[g, ti, a],
                np.array([o.time_s for o in opts]) + f_extra + b_extra,
                [ring_bound_terms(tb, rid[i], int(g[i]), o.tp, nbytes, True)
                 for i, o in enumerate(opts)],
                np.array([o.tp for o in opts], dtype=float), k.astype(np.int64),
                f + f_extra)
        return got

    def _option_sync(self, ab: tuple[int, int], opts: tuple[Option, ...],
                     Ds: np.ndarray) -> np.ndarray:
        """Per degree in ``Ds``, the least seconds the gradient ring all-reduce of a stage over
        layers ``ab`` takes when its D replicas are of one or two of its options ``opts``, as
        every allocation ``auto`` builds mixes (``tails`` counts the hops): on one option o,
        when the pool holds D replicas of it, every hop is o -> o; on two, o1 and o2 (of one
        region, holding D replicas together), the ring has a hop o1 -> o2 and one o2 -> o1.
        Each hop over its fastest link between any zones of its kinds (``_hop_s``).
        """
        n = int(Ds.max())
        key = (ab, opts)
        got = self._option_rings.get(key)
        if got is None or len(got) < n:
            D = np.arange(1, n + 1)
            hold = [np.floor(self.avail[o.kind] / o.tp) for o in opts]  # replicas of each
            got = np.full(n, np.inf)
            for i, j, ring in self._option_hops(ab, opts, n):
                if j < 0:
                    got = np.where(hold[i] >= D, np.minimum(got, ring[:n]), got)
                    continue
                o, o2 = opts[i], opts[j]
                if o2.kind == o.kind:  # at least one replica on each, the rest on the smaller TP
                    room = np.where((D - 1) * min(o.tp, o2.tp) + max(o.tp, o2.tp)
                                    <= self.avail[o.kind], D, 0)
                else:
                    room = np.where((hold[i] >= 1) & (hold[j] >= 1), hold[i] + hold[j], 0)
                got = np.where((D >= 2) & (room >= D), np.minimum(got, ring[:n]), got)
            got = np.where(D > 1, np.where(np.isfinite(got), got, 0.0), 0.0)
            self._option_rings[key] = got
        return got[Ds - 1]

    def _option_hops(self, ab: tuple[int, int], opts: tuple[Option, ...],
                     n: int) -> list[tuple[int, int, np.ndarray]]:
        """``_option_sync``'s rings at degrees 1..n or more, whatever the pool holds: (i, -1,
        its ring on option i alone) and (i, j, the ring with hops between options i and j of
        one region)."""
        got = self._rings_of.get(key := (ab, opts))
        if got is None or len(got[0][2]) < n:
            a, b = ab
            D = np.arange(1, n + 1)
            got = []
            for i, o in enumerate(opts):
                got.append((i, -1, self._hop_s(a, b, D, o.kind, o.tp, o.kind)))
                for j in range(i + 1, len(opts)):
                    o2 = opts[j]
                    if self.region_of[o.kind] != self.region_of[o2.kind]:
                        continue
                    got.append((i, j, np.maximum(self._hop_s(a, b, D, o.kind, o.tp, o2.kind),
                                                 self._hop_s(a, b, D, o2.kind, o2.tp, o.kind))))
            self._rings_of[key] = got
        return got

    def tails(self, split: tuple[tuple[int, int], ...], per_stage, D: int,
              compute: list[dict[tuple[int, int], float]]) -> np.ndarray:
        """Per stage of an allocation (``Allocation.per_stage``, D replicas a stage) on the
        layer ranges ``split``: the least seconds its exposed gradient ring all-reduce and then
        its slowest replica's update take, whatever zones the replicas get. The ring joins
        consecutive replicas, each option's together (``build_spec``): a hop from each option
        to another (any, when the stage mixes more than two), and one inside an option of two
        replicas or more. A hop takes at least its fastest link between any zones of its two kinds,
        and the ring is as slow as its slowest hop (``kernel.ring_allreduce_s``); it hides
        behind the backward of the replica that ends the stage last as far as the stack
        overlaps them (the most compute per microbatch of the stage's options, ``compute``'s
        (kind, TP) entries, bounds that)."""
        tb = self.space.tb
        out = np.empty(len(split))
        div = float(D) if self.upd_div_on else 1.0
        for s, ((a, b), st) in enumerate(zip(split, per_stage, strict=True)):
            key = (a, b, D, st, self.overlap and tuple(compute[s].get((k, tp), 0.0)
                                                       for k, tp, _ in st))
            got = self._tails.get(key)
            if got is None:
                upd = max(float(tb.cum_u[self.gi[k], tb.ti(tp), b] - tb.cum_u[self.gi[k],
                                                                              tb.ti(tp), a])
                          for k, tp, _ in st) / div
                ring = 0.0
                for k, tp, n in st if D > 1 else ():
                    # the hop out of this option's last replica, to another option's, and
                    # between its own replicas
                    out_s = [self._hop_s(a, b, D, k, tp, k2) for k2, tp2, _ in st
                             if (k2, tp2) != (k, tp)]
                    if out_s:
                        ring = max(ring, min(out_s))
                    if n > 1 or not out_s:
                        ring = max(ring, self._hop_s(a, b, D, k, tp, k))
                # hidden behind the backward of whichever replica ends the stage last
                busy = max(compute[s].get((k, tp), np.inf) for k, tp, _ in st)
                sync = float(self._exposed(np.array(ring), np.array(busy)))
                got = self._tails[key] = sync + upd
            out[s] = got
        return out

    def _hop_s(self, a: int, b: int, D, k: int, tp: int, k2: int):
        """The least seconds a ring all-reduce of D members over layers [a, b) takes when one
        of its hops goes from a replica of kind ``k`` (TP ``tp``) to one of kind ``k2``, over
        its fastest link between any zones of the two kinds (``kernel.ring_allreduce_s``; D:
        a number, or an array of them)."""
        if np.ndim(D) == 0:
            got = self._hop_times.get(one := (a, b, int(D), k, tp, k2))
            if got is None:
                got = self._hop_times[one] = self._hop_s(a, b, np.array([D]), k, tp, k2)[0]
            return float(got)
        bound = self._hop_terms.get(key := (a, b, k, tp, k2))
        if bound is None:
            tb = self.space.tb
            nbytes = self.space.grad_bytes(a, b)
            bound = self._hop_terms[key] = ring_bound_terms(
                tb, self._links(k, tp, k2), int(self.gi[k]), tp, nbytes, k == k2)
        d = np.asarray(D, dtype=float)
        sc = self.tc.sync_scale
        own = ring_from_terms(bound.own, d[..., None], sc).min(axis=-1)
        if bound.node is None:
            return own
        inside = ring_from_terms(bound.inside, d, sc)
        node = ring_from_terms(bound.node, d[..., None], sc).min(axis=-1)
        # (``kernel.ring_bound_at``: one node's links while the members fit one)
        return np.minimum(own, np.where(d <= bound.per_node, inside, node))

    def _links(self, k: int, tp: int, k2: int) -> np.ndarray:
        """Link ids from a replica of kind ``k`` at TP ``tp`` to one of kind ``k2``, between
        any zones of the two kinds."""
        rid = self._hops.get((k, tp, k2))
        if rid is None:
            sp, tb = self.space, self.space.tb
            za = [tb.zones.index(z) for z, _ in sp.zones_of[sp.kinds[k]]]
            zb = [tb.zones.index(z) for z, _ in sp.zones_of[sp.kinds[k2]]]
            rid = self._hops[(k, tp, k2)] = np.array([
                tb.link_id(self.gi[k], x, self.gi[k2], y, tb.ti(tp)) for x in za for y in zb])
        return rid

    def _sends(self, s: int, P: int, mi: int, ti: np.ndarray, loose: bool = False):
        """(forward, backward) seconds per microbatch that stage ``s``'s replicas of TP
        indices ``ti`` spend on sends and blocking receives, over the fastest links, as the
        kernel adds them (``s``: a stage, or an array of each option's stage): the
        activations a replica sends (and its wait for the gradients back) go over its own
        TP's flows (``loose``: any TP's), those from the stage before over the neighbour's
        (any TP's)."""
        p2p = self.p2p_min[mi]
        own = p2p if loose else self.p2p_tp[mi, ti]
        rf = self.tc.recv_fraction
        return (own * (s < P - 1) + p2p * rf * (s > 0),
                p2p * (s > 0) + own * rf * (s < P - 1))

    def option_times(self, sh: Shape) -> _OptionTimes:
        """Per stage of ``sh``, per (kind, TP) option: its forward and backward per
        microbatch with the least sends and receives (``_sends``); and what bounds every
        allocation of the shape (``_OptionTimes``)."""
        got = self._times.get(id(sh))
        if got is None or got[0] is not sh:
            tb, P = self.space.tb, len(sh.split)
            mi = tb.mi(sh.mbs)
            times, compute, fwd, sends, rate = [], [], [], [], 0.0
            for s, ((a, b_), opts) in enumerate(zip(sh.split, sh.opts, strict=True)):
                ti = np.array([tb.ti(o.tp) for o in opts])
                f, b = self._sends(s, P, mi, ti)
                t_c = np.array([o.time_s for o in opts])
                t = t_c + f + b
                g = self.gi[[o.kind for o in opts]]
                f_c = (tb.cum_f[g, ti, mi, b_] - tb.cum_f[g, ti, mi, a]) * self.tc.compute_scale
                times.append({(o.kind, o.tp): float(x) for o, x in zip(opts, t, strict=True)})
                fwd.append({(o.kind, o.tp): float(x)
                            for o, x in zip(opts, f_c + f, strict=True)})
                compute.append({(o.kind, o.tp): o.time_s for o in opts})
                sends.append(float((t - t_c).min()))
                rate += min(self.price_s[o.kind] * o.tp for o in opts)
            got = self._times[id(sh)] = (sh, _OptionTimes(times, min(sends), rate, compute,
                                                          fwd))
        return got[1]

    def _weights(self, sh: Shape) -> np.ndarray:
        """Per kind, 1 / (its mean GPU-seconds per stage and microbatch); 0 for kinds that fit
        no stage (they cannot be used)."""
        K = len(self.avail)
        acc, cnt = np.zeros(K), np.zeros(K)
        for opts in sh.opts:
            best: dict[int, float] = {}
            for o in opts:
                best[o.kind] = min(best.get(o.kind, np.inf), o.time_s * o.tp)
            for k, v in best.items():
                acc[k] += v
                cnt[k] += 1
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(acc > 0, cnt / acc, 0.0)

    def _tau(self, t, tp, k, st, P: int, Ds: np.ndarray, joint: bool = True) -> np.ndarray:
        """Per degree, the smallest slowest-replica time the pool's GPU counts allow: in all,
        per stage (its D replicas in one region, H5), stages per region, and the GPUs all
        stages' replicas take from each kind together (an LP dual bound, at
        ``allocate.kind_weights``; without ``joint``, the GPUs of all kinds together)."""
        W = self._weights_grid if joint else np.ones((1, len(self.avail)))
        args = (np.asarray(t, dtype=float), np.asarray(tp, dtype=float),
                np.asarray(k, dtype=np.int64), np.asarray(st, dtype=np.int64), P)
        Ds = np.asarray(Ds, dtype=np.int64)
        return _least_level(args[0][None, :], _ANY_REGIONS, np.full(len(Ds), -np.inf),
                            np.full(len(Ds), np.inf), *args[1:], Ds, self.avail,
                            self.region_of, self.region_N, W)


def _pad_last(a: np.ndarray, width: int) -> np.ndarray:
    """``a`` (2-D) widened to ``width`` columns by repeating each row's last."""
    if a.shape[1] == width:
        return a
    return np.concatenate([a, np.repeat(a[:, -1:], width - a.shape[1], axis=1)], axis=1)


def _shapes(space: Space, mbs_values: list[int], max_stages: int | None):
    problem = space.problem
    L = problem.n_layers
    settings = sorted(set(problem.job.recompute))
    for recompute in settings:
        for P in range(1, min(L, max_stages or L) + 1):
            for mbs in mbs_values:
                bal = balanced_split(L, P)
                for split in splits_for(L, P):
                    opts = sailor.stage_options(space, split, mbs, recompute, 0, 1, all_tp=True)
                    if opts is None:
                        yield None
                        continue
                    if (recompute and False in settings
                            and _fits_without_recompute(space, split, mbs, opts)):
                        yield False  # recompute only slows a shape that already fits
                        continue
                    sailors = None
                    if split == bal and recompute == sailor.recompute_of(problem):
                        # per stage and kind, Sailor's TP (one of the fitting TPs listed)
                        sailors = tuple(tuple(st) for st in sailor.stage_options(
                            space, split, mbs, recompute, 0, 1))
                    yield Shape(recompute, mbs, split, tuple(tuple(o) for o in opts),
                                rebalance=P > 1 and split == bal and not every_split(L, P),
                                sailors=sailors)


def _fits_without_recompute(space: Space, split, mbs: int, opts) -> bool:
    """True when, without recompute, every stage already fits each GPU at the same TP."""
    plain = sailor.stage_options(space, split, mbs, False, 0, 1, all_tp=True)
    if plain is None:
        return False
    return all({(o.kind, o.tp) for o in a} == {(o.kind, o.tp) for o in b}
               for a, b in zip(plain, opts, strict=True))


def search(ev: Evaluator, space: Space, objective: str, mbs_values: list[int],
           max_stages: int | None = None) -> None:
    problem = space.problem
    gbs = problem.job.global_batch
    avail, price, region_of = sailor.arrays(space)
    bounds = Bounds(space, avail, price, region_of)
    cons = ev.constraints
    shapes: list[Shape] = []
    rows = []  # per shape: degrees, time bounds, cost bounds, slowest-replica bounds
    # the shapes depend on the kinds and their TPs, not on the GPU counts: kept with the
    # stage options for every pool of the same kinds
    key = ("shapes", tuple(mbs_values), max_stages)
    if key not in space.stage_opts:
        space.stage_opts[key] = list(_shapes(space, mbs_values, max_stages))
    for sh in space.stage_opts[key]:
        if sh is None:
            ev.stats.no_fit += 1
            continue
        if sh is False:
            ev.stats.pruned += 1
            continue
        total = gbs // sh.mbs
        Dmax = sailor.max_dp(space, [list(o) for o in sh.opts], total)
        Ds = np.arange(1, Dmax + 1, dtype=np.int64)
        if len(Ds) == 0:
            ev.stats.pruned += 1
            continue
        T, C, tau, after = bounds(sh, Ds, total)
        ok = np.isfinite(T)
        ev.stats.pruned += int((~ok).sum())
        shapes.append(sh)
        rows.append((np.full(int(ok.sum()), len(shapes) - 1), Ds[ok], T[ok], C[ok], tau[ok],
                     after[ok]))
    if not shapes:
        return
    sid, Ds, T, C, tau, after = (np.concatenate(x) for x in zip(*rows, strict=True))
    keep = np.ones(len(sid), dtype=bool)  # the constraints, on the bounds
    if cons.min_iters_per_s is not None:
        keep &= 1.0 / cons.min_iters_per_s >= T
    if cons.max_cost_per_iteration_usd is not None:
        keep &= cons.max_cost_per_iteration_usd >= C
    if cons.max_gpus is not None:
        fewest = np.array([sum(min(o.tp for o in st) for st in sh.opts) for sh in shapes])
        keep &= Ds * fewest[sid] <= cons.max_gpus
    ev.stats.pruned += int((~keep).sum())
    if objective == "min-cost":
        # Sailor's walk up the data-parallel degree of single-stage plans is quick and lands
        # near the cheapest plan: an incumbent that prunes most of the cost bounds at once
        sailor.search(ev, space, objective, mbs_values, max_stages)
    run = _BranchAndBound(ev, space, bounds, shapes, sid, Ds, tau, after, avail, price,
                          region_of)
    most_s = min(1.0 / cons.min_iters_per_s if cons.min_iters_per_s else np.inf,
                 cons.deadline.within / cons.deadline.iterations if cons.deadline else np.inf)
    limits = (most_s, cons.max_cost_per_iteration_usd
              if cons.max_cost_per_iteration_usd is not None else np.inf)
    run(keep, _key(T, C, objective), T, objective, lambda: ev.incumbent, limits)
    if not ev.feasible and (not keep.all() or np.isfinite(limits).any()):
        # the constraints cut every plan: cost the fastest (cheapest) plans anyway, so the
        # error can tell a constraint from memory (``planners._nearest`` then finds how far
        # to relax it)
        if cons.max_cost_per_iteration_usd is not None:
            run(np.ones(len(sid), dtype=bool), C, T, "min-cost", lambda: ev.cheapest)
        if cons.min_iters_per_s is not None or cons.max_gpus is not None:
            run(np.ones(len(sid), dtype=bool), T, T, "max-throughput", lambda: ev.fastest)


class _BranchAndBound:
    """Takes (shape, degree) pairs by increasing bound, allocates and costs them in batches,
    and stops when the next bound cannot beat the best plan so far."""

    def __init__(self, ev, space, bounds, shapes, sid, Ds, tau, after, avail, price, region_of):
        self.ev, self.space, self.bounds, self.shapes = ev, space, bounds, shapes
        self.sid, self.Ds, self.tau, self.after = sid, Ds, tau, after
        self.avail, self.price, self.region_of = avail, price, region_of

    def __call__(self, mask: np.ndarray, key: np.ndarray, times: np.ndarray, objective: str,
                 best, limits: tuple[float, float] = (np.inf, np.inf)) -> None:
        """Takes the pairs of ``mask`` by ``key`` under ``objective`` (``times``: their time
        bounds; ``best``: the plan to beat); ``limits``: the most seconds and USD an
        iteration may take (the constraints), beyond which no allocation is worth building.
        Taken by key, a pair that cannot beat the incumbent is followed by none that can;
        but against a free incumbent (``cannot_beat``) only the times tell, pair by pair."""
        ev = self.ev
        idx = np.nonzero(mask)[0]
        idx = idx[np.argsort(key[idx], kind="stable")]
        # the fastest allocation of a pair, or under a cost or GPU cap (which may rule the
        # fastest out while a cheaper one fits) and the cost objectives, the cheapest under
        # several bottleneck bounds
        cons = ev.constraints
        capped = cons.max_cost_per_iteration_usd is not None or cons.max_gpus is not None
        levels = 1 if objective == "max-throughput" and not capped else 4
        L = self.space.problem.n_layers
        i = 0
        while i < len(idx):
            if ev.out_of_time():
                return
            if ev.max_pairs is not None and i >= ev.max_pairs:
                ev.stats.truncated = True
                ev.stats.pruned += len(idx) - i
                return
            inc = best()
            bar = score(inc, objective)[0] if inc is not None else np.inf
            bar_t = inc.iteration_time_s if inc is not None else np.inf

            def hopeless(e: int, bar=bar, bar_t=bar_t) -> bool:
                return cannot_beat(key[e], times[e], bar, bar_t)

            if bar > 0 and hopeless(idx[i]):
                ev.stats.pruned += len(idx) - i
                return
            if bar == 0:
                while i < len(idx) and hopeless(idx[i]):
                    ev.stats.pruned += 1
                    i += 1
                if i == len(idx):
                    return
            specs = []
            j = i
            cut = False  # the budget ran out inside an allocation: cost what is built, stop
            try:
                while (j < len(idx) and j < i + BATCH and not hopeless(idx[j])
                       and (j == i or not ev.out_of_time())):
                    e = idx[j]
                    sh = self.shapes[self.sid[e]]
                    D = int(self.Ds[e])
                    worth = Worth(objective, bar, bar_t, float(self.after[e]),
                                  self.space.problem.timing.step_overhead_s, self.price,
                                  self.bounds.option_times(sh), ev.beaten,
                                  functools.partial(self.bounds.tails, D=D),
                                  functools.partial(self.bounds.crossed_times, sh), limits,
                                  sh.split, self.bounds.option_times, self.bounds.one_f1b)
                    total = self.space.problem.job.global_batch // sh.mbs

                    def reach(s: Shape, D=D, total=total, worth=worth) -> bool:
                        return not worth.out_of_reach(*self.bounds.refined(s, D, total))

                    # the pair's own split may beat the incumbent
                    refined_t, refined_usd, least_level = self.bounds.refined_level(sh, D, total)
                    own = not worth.out_of_reach(refined_t, refined_usd)
                    if not sh.rebalance and not own:
                        ev.stats.pruned += 1  # its refined bound cannot beat the incumbent
                    else:
                        specs += _specs(self.space, sh, D, float(self.tau[e]), self.avail,
                                        self.price, self.region_of, levels, L,
                                        functools.partial(self.bounds.option_levels, D=D,
                                                          total=total),
                                        ev.allocation_deadline(), worth, reach,
                                        functools.partial(self.bounds.slowest, D=D), own,
                                        least_level,
                                        refined_t - self.space.problem.timing.step_overhead_s)
                    j += 1
            except OutOfTime:
                cut = ev.stats.truncated = ev.stats.timed_out = True
                ev.stats.pruned += len(idx) - j
            i = j
            ev.cost([s for s in dict.fromkeys(specs) if s not in ev.feasible])
            if cut:
                return


def _key(T, C, objective: str):
    """What ``objective`` ranks by, from times ``T`` and costs ``C`` (arrays or numbers)."""
    if objective == "max-throughput":
        return T
    if objective == "min-cost":
        return C
    return T * C


@dataclass(frozen=True)
class _OptionTimes:
    """A shape's option times with their least sends (``Bounds.option_times``), the least
    sends per microbatch of any replica (``send_s``) and the least USD/s of one replica of
    every stage (``rate_usd_s``)."""

    times: list[dict[tuple[int, int], float]]
    send_s: float
    rate_usd_s: float
    compute: list[dict[tuple[int, int], float]]  # the options' compute times (their order)
    fwd: list[dict[tuple[int, int], float]]  # their forwards with their least sends


@dataclass(frozen=True)
class Worth:
    """Whether an allocation may beat the incumbent (score ``bar`` under ``objective``) or
    join the throughput-cost front of the plans found (``beaten``: whether plans taking at
    least given seconds and USD per iteration are of no use beyond the incumbent, as
    ``Evaluator.beaten``: always when the search does not look for the front).
    Whatever its zones, a plan of allocation ``a`` takes at least, over its options' times
    with the least sends (``shape``), its pipelines' time (``stage_floors_s`` of the first
    stage) plus ``after_s`` (the pair's least gradient sync and update, and the step overhead),
    and for every stage that stage's end plus its own least sync and update (``tails``) and the
    step overhead; it pays at least that long for its GPUs at their cheapest zone's price
    (``plan_floor``). An allocation whose stages are in more than one region sends across
    regions between them (``crossed``). A plan of another split than the pair's (a re-split,
    ``other``) is given that split's option times (``times_of``), and each of its stages' end
    plus the stage's least sync and update on that split (``tails``) and the step overhead. Plans
    whose floors break a constraint (``limits``) are worth nothing: they would not be
    adopted."""

    objective: str
    bar: float
    bar_t: float  # the incumbent's seconds per iteration (``cannot_beat``)
    after_s: float
    overhead_s: float
    price_h: np.ndarray
    shape: _OptionTimes
    beaten: Callable[[float, float], bool] = lambda t, usd: False
    # per stage of an allocation on layer ranges (split, per_stage) and option compute times:
    # its least sync and update (Bounds.tails at the pair's degree)
    tails: Callable[..., np.ndarray] | None = None
    # the option times of an allocation whose stages are in more than one region, with the
    # sends across (Bounds.crossed_times; None: as given)
    crossed: Callable[..., list | None] | None = None
    # the most seconds and USD an iteration may take (the search's constraints): plans
    # beyond either are not adopted, so they are worth nothing
    limits: tuple[float, float] = (np.inf, np.inf)
    split: tuple[tuple[int, int], ...] = ()  # the pair's layer ranges (for ``tails``)
    # a re-split's option times (``Bounds.option_times``)
    times_of: Callable[[Shape], _OptionTimes] | None = None
    one_f1b: bool = True  # the plans run 1F1B (``stage_span``)

    def __call__(self, a: Allocation, D: int, total: int, other: Shape | None = None) -> bool:
        return not self._bound() or self.below(*self.plan_floor(a, D, total, other))

    def _bound(self) -> bool:
        """Whether anything can be ruled out: there is an incumbent or a constraint."""
        return math.isfinite(self.bar) or any(math.isfinite(x) for x in self.limits)

    def beyond_level(self, level: float, D: int) -> bool:
        """True when no plan of D pipelines that takes at least ``level`` seconds before the
        step overhead can beat the incumbent: it pays at least the least USD/s of a replica
        of every stage (``_OptionTimes.rate_usd_s``), D times, for the iteration."""
        t = level + self.overhead_s
        return self._bound() and not self.below(t, t * D * self.shape.rate_usd_s)

    def plan_floor(self, a: Allocation, D: int, total: int,
                   other: Shape | None = None) -> tuple[float, float]:
        """(seconds, USD) per iteration that any plan of ``a`` takes at least (on the layer
        ranges of ``other``, when given)."""
        own = self.shape if other is None else self.times_of(other)
        crossed = None if self.crossed is None else self.crossed(a.per_stage, own)
        times, fwd = crossed or (own.times, own.fwd)
        ends = stage_floors_s(a, times, fwd, D, total, own.compute, self.one_f1b)
        if other is None:
            t = float(ends[0]) + self.after_s
            split = self.split
        else:
            t = float(ends[0]) + self.overhead_s
            split = other.split
        if self.tails is not None:
            t = max(t, float((ends + self.tails(split, a.per_stage, compute=own.compute)).max())
                    + self.overhead_s)
        usd_s = sum(self.price_h[k] * tp * n for st in a.per_stage for k, tp, n in st) / 3600
        return t, t * usd_s

    def out_of_reach(self, t: float, usd: float) -> bool:
        """Whether plans taking at least ``t`` seconds and ``usd`` per iteration cannot beat
        the incumbent (the front aside: pairs are taken by their bounds against it alone),
        or break a constraint."""
        return bool(self._beyond_limits(t, usd) or self._worse(t, usd))

    def below(self, t: float, usd: float) -> bool:
        """Whether lower bounds ``t`` (iteration seconds) and ``usd`` (per iteration) leave
        room to beat the incumbent or to join the front, within the constraints."""
        if self._beyond_limits(t, usd):
            return False
        return not self._worse(t, usd) or not self.beaten(t, usd)

    def _worse(self, t: float, usd: float) -> bool:
        return bool(math.isfinite(self.bar) and cannot_beat(
            _key(t, usd, self.objective), t, self.bar, self.bar_t, 1e-9))

    def _beyond_limits(self, t: float, usd: float) -> bool:
        return t > self.limits[0] * (1 + 1e-9) or usd > self.limits[1] * (1 + 1e-9)


def stage_floors_s(a: Allocation, times: list[dict[tuple[int, int], float]],
                   fwd: list[dict[tuple[int, int], float]], D: int, total: int,
                   order: list[dict[tuple[int, int], float]], one_f1b: bool = True
                   ) -> np.ndarray:
    """Per stage s, the least time after the iteration's start at which every replica of s has
    run its last backward, in any plan of allocation ``a``, given per stage a lower bound on
    each (kind, TP) replica's time per microbatch (``times``) and forward (``fwd``).
    Pipeline j holds the j-th slowest replica of every stage by compute time (``order``;
    ``build_spec``) and runs m = ``shares(total, D)[j]`` microbatches: its stage b starts
    after the forwards of the stages before it, spans ``stage_span`` (the later stages' times
    its trips), and stages b-1..s then run the last microbatch backward. For s = 0 that is the
    pipeline's end."""
    t_vals, f_vals, counts = [], [], []
    for st, time_of, fwd_of, rank in zip(a.per_stage, times, fwd, order, strict=True):
        # stable, as build_spec
        for k, tp, n in (st if len(st) == 1 else sorted(st, key=lambda r: -rank[(r[0], r[1])])):
            t_vals.append(time_of[(k, tp)])
            f_vals.append(fwd_of[(k, tp)])
            counts.append(n)
    P = len(times)
    t = np.repeat(t_vals, counts).reshape(P, -1)  # (stages, pipelines)
    f = np.repeat(f_vals, counts).reshape(P, -1)
    return _pipeline_ends(f, t - f, np.asarray(shares(total, D), dtype=np.float64), one_f1b)


@compiled
def _pipeline_ends(f, b, m, one_f1b):
    """``stage_floors_s``' ends over the pipelines (columns of ``f``, ``b``: forward and
    backward per microbatch per stage; ``m``: their microbatches), compiled."""
    P, D = f.shape
    out = np.zeros(P)
    for j in range(D):
        later = 0.0
        end = 0.0
        before = np.zeros(P + 1)
        for s in range(P):
            before[s + 1] = before[s] + f[s, j]
        for s in range(P - 1, -1, -1):
            w = min(P - 1 - s, m[j])
            own = before[s] + stage_span(m[j], w, f[s, j], b[s, j], later, one_f1b)
            end = own if s == P - 1 else max(own, end + b[s, j])
            out[s] = max(out[s], end)
            later += f[s, j] + b[s, j]
    return out


def _specs(space: Space, sh: Shape, D: int, tau: float, avail, price, region_of, levels: int,
           L: int, levels_of: Callable[[Shape], list[list[Option]]],
           deadline: float | None = None, worth: Worth | None = None,
           reach: Callable[[Shape], bool] | None = None,
           slowest: Callable[[Shape], float] | None = None, own: bool | None = None,
           least_level: float = 0.0, floor_level: float = 0.0) -> list:
    """Plans of one (shape, degree) pair: its allocations of least level (the allocation
    program over ``levels_of``'s option levels, ``Bounds.option_levels``), each in every zone
    packing, and their variants; allocations ``worth`` says cannot beat the incumbent are
    not built, nor plans of a split whose shape ``reach`` says cannot (``Bounds.refined``;
    ``own``: what it says of ``sh``, when the caller has asked); a re-split's allocation
    program starts from ``slowest`` (``Bounds.slowest``), and the program over the levels
    from ``least_level``, a lower bound on its least level (``Bounds.refined_level``'s third);
    ``floor_level``: a lower bound on any plan's time before the step overhead (the refined
    bound's). Raises OutOfTime once an allocation passes ``deadline``."""
    opts = [list(o) for o in sh.opts]
    total = space.problem.job.global_batch // sh.mbs
    memo, key = space.alloc_memo, (sh.split, sh.mbs, sh.recompute)
    if own is None and reach is not None:
        own = reach(sh)
    if own is not None and not own:
        if not sh.rebalance:
            return []
        # only the re-split may beat the incumbent: the slowest replicas of an allocation at
        # the least bottleneck give its layers (any such allocation: its own plans are not
        # built, and on three kinds or more the cheapest takes a MIP). Not the allocation of
        # least level that a pair whose own plans are built re-splits to: here that program is
        # the slower, and its re-splits found no better plan on planner_speed.py's pools
        a = fastest(opts, D, avail, price, region_of, at_least=tau / slots(D, total)[0],
                    total=total, memo=memo, key=key, deadline=deadline, cheapest=False)
        return [] if a is None else _resplit(space, sh, a, opts, D, L, total, avail, price,
                                             region_of, deadline, worth, reach, slowest,
                                             cheapest=levels > 1)
    # the allocations of least level (``levels_of``: each option's least cost to the whole
    # iteration, its stage's gradient ring and update included), and for cost objectives
    # the cheapest under several levels, with their slowest replicas' compute times
    least = tau / slots(D, total)[0]  # the least slowest-replica time of any allocation
    by_level = tradeoffs(levels_of(sh), D, avail, price, region_of, levels=levels,
                         at_least=least_level, total=None, memo=memo,
                         key=(*key, "levels", space.zone_sets), deadline=deadline)
    allocs = [Allocation(a.per_stage, a.usage, _slowest_s(a, opts)) for a in by_level]
    if allocs:
        # the same kinds at larger TPs, and faster kinds where GPUs are left
        for up in (upgraded(allocs[0], opts, avail), upgraded(allocs[0], opts, avail, region_of)):
            if all(up.per_stage != a.per_stage for a in allocs):
                allocs = [*allocs, up]

    def ok(a: Allocation) -> bool:
        return worth is None or worth(a, D, total)

    # the program's allocations on some of the options or fewer GPUs take no less than the
    # least level on all of them: none where it has none, none worth building beyond the bar
    variants = bool(allocs) and (worth is None or not worth.beyond_level(
        max(by_level[0].bottleneck_s, floor_level), D))

    out = [build_spec(space, a, opts, sh.split, sh.mbs, D, recompute=sh.recompute, packing=pk,
                      home=home)
           for a in allocs if ok(a) for pk, home in _packings(space, a)]
    if sh.sailors is not None and variants:
        # the `sailor` strategy's allocation of the pair (each kind at Sailor's TP): the
        # bottleneck program over every TP can choose allocations the estimate ranks below
        # it, and with it every plan that strategy costs is costed here too
        o_min = [list(o) for o in sh.sailors]
        a_min = fastest(o_min, D, avail, price, region_of, at_least=least,
                        total=total, memo=memo,
                        key=(sh.split, sh.mbs, sh.recompute, "sailor's tp"),
                        deadline=deadline)
        if (a_min is not None and all(a_min.per_stage != a.per_stage for a in allocs)
                and ok(a_min)):
            out.append(build_spec(space, a_min, o_min, sh.split, sh.mbs, D,
                                  recompute=sh.recompute))  # as that strategy packs it
    if allocs and len(sh.split) <= PERMUTE_UP_TO and every_split(L, len(sh.split)):
        # shallow pipelines of a short model: the same GPUs with the stages' replica mixes in
        # every other order (the bottleneck program ranks by compute; the sends, the fill and
        # drain and the optimizer steps may prefer another order)
        fits = [{(o.kind, o.tp) for o in oo} for oo in opts]
        for a in dict.fromkeys((allocs[0], allocs[-1])):
            for perm in dict.fromkeys(itertools.permutations(a.per_stage)):
                if perm != a.per_stage and all({(k, tp) for k, tp, _ in mix} <= f
                                               for mix, f in zip(perm, fits, strict=True)):
                    ap = Allocation(perm, a.usage, a.bottleneck_s)
                    if ok(ap):
                        out.append(build_spec(space, ap, opts, sh.split, sh.mbs, D,
                                              recompute=sh.recompute))
    if sh.rebalance and allocs:
        out += _resplit(space, sh, allocs[0], opts, D, L, total, avail, price, region_of,
                        deadline, worth, reach, slowest, cheapest=levels > 1)
    # the allocation pools the zones of a region (H6) and counts no sends between zones, so
    # on a pool spread over zones it may take a faster GPU in another zone where the estimate,
    # with the sends and egress across zones, prefers the same plan inside one zone; and where
    # its stages are in more than one region, the same pair on one region's GPUs may be faster
    need = D * sum(min(o.tp for o in st) for st in opts)
    subpools: list[tuple[str | None, np.ndarray]] = []
    if variants and len({region_of[st[0][0]] for st in allocs[0].per_stage}) > 1:
        regions = np.asarray(region_of)
        subpools += [(None, np.where(regions == r, avail, 0)) for r in np.unique(regions)]
    subpools += space.zone_pools() if variants else []
    for z, sub in subpools:
        if sub.sum() < need:
            continue
        a3 = fastest(opts, D, sub, price, region_of, at_least=least, total=total,
                     memo=memo, key=key, deadline=deadline)
        a3 = None if a3 is None else upgraded(a3, opts, sub)
        if a3 is not None and ok(a3):
            out += [build_spec(space, a3, opts, sh.split, sh.mbs, D, recompute=sh.recompute,
                               packing=pk, home=home)
                    for pk, home in (_packings(space, a3) if z is None else [("chain", z)])]
    return [s for s in out if s is not None]


def _slowest_s(a: Allocation, opts: list[list[Option]]) -> float:
    """The compute time per microbatch of allocation ``a``'s slowest replica (over
    ``opts``)."""
    return max(o.time_s for st, oo in zip(a.per_stage, opts, strict=True) for o in oo
               if any((o.kind, o.tp) == (k, tp) for k, tp, _ in st))


def _packings(space: Space, a: Allocation) -> list[tuple[str, str | None]]:
    """(packing, home) pairs to place allocation ``a`` with: each of ``PACKINGS`` from the
    zone with most free GPUs, and when its first stage's region has several zones, the
    chain of stages from each of them (starting in the largest zone can leave a later stage
    no room beside the stage before it)."""
    zones = space.zones_of[space.kinds[a.per_stage[0][0][0]]]
    return [(pk, None) for pk in PACKINGS] + (
        [("chain", z) for z, _ in zones] if len(zones) > 1 else [])


def _resplit(space: Space, sh: Shape, alloc: Allocation, opts: list[list[Option]], D: int, L: int,
             total: int, avail, price, region_of, deadline: float | None, worth: Worth | None,
             reach: Callable[[Shape], bool] | None,
             slowest: Callable[[Shape], float] | None, cheapest: bool = True) -> list:
    """The plan of the layers re-split to allocation ``alloc``'s slowest replica types
    (``rebalanced``) given the fastest allocation of the new split: none when the split is
    the same, some stage would get no layer, or ``reach`` or ``worth`` rules it out (the
    allocation program starts from ``slowest``'s least slowest-replica time). On three kinds
    or more and unless ``cheapest`` (the cost objectives and caps), the allocation is the one
    the program's search met at that bottleneck, not necessarily the cheapest, which takes a
    MIP per re-split (planner_speed.py's three-type row: 1,244 MIPs against 1,934, and a
    plan 0.5% faster)."""
    # the re-split's shape (or None), kept with the stage options: it depends on the kinds
    # and their TPs, not on the GPU counts; one shape object per split (the bounds keep their
    # parts by shape object)
    key = ("resplit", alloc.per_stage, sh.split, sh.mbs, sh.recompute)
    sh2 = space.stage_opts.get(key, False)
    if sh2 is False:
        new = rebalanced(space, alloc, opts, L, sh.mbs, sh.recompute)
        sh2 = None
        if new != sh.split and min(b - a for a, b in new) > 0:
            own = ("resplit shape", new, sh.mbs, sh.recompute)
            sh2 = space.stage_opts.get(own, False)
            if sh2 is False:
                o2 = sailor.stage_options(space, new, sh.mbs, sh.recompute, 0, 1, all_tp=True)
                sh2 = space.stage_opts[own] = (
                    Shape(sh.recompute, sh.mbs, new, tuple(tuple(o) for o in o2),
                          rebalance=False) if o2 else None)
        space.stage_opts[key] = sh2
    if sh2 is None:
        return []
    new, o2 = sh2.split, [list(o) for o in sh2.opts]
    if reach is not None and not reach(sh2):
        return []
    least = 0.0 if slowest is None else slowest(sh2)
    if not np.isfinite(least):
        return []  # no allocation holds D replicas of every stage
    a2 = fastest(o2, D, avail, price, region_of, at_least=least / slots(D, total)[0],
                 total=total, memo=space.alloc_memo, key=(new, sh.mbs, sh.recompute),
                 deadline=deadline, cheapest=cheapest)
    if a2 is None or (worth is not None and not worth(a2, D, total, other=sh2)):
        return []
    sp = build_spec(space, a2, o2, new, sh.mbs, D, recompute=sh.recompute)
    return [] if sp is None else [sp]
