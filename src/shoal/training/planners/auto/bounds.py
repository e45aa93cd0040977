"""Lower bounds on the iteration time and cost of any plan of a shape and data-parallel
degree."""

from __future__ import annotations

import numpy as np

from shoal.estimate.pipeline import stage_spans
from shoal.training.planners.allocate import Pool, kind_weights
from shoal.training.planners.auto.kernels import (
    ANY_REGIONS,
    least_level,
)
from shoal.training.planners.auto.refined import RefinedBounds
from shoal.training.planners.auto.rings import RingBounds
from shoal.training.planners.auto.shapes import (
    OptionTimes,
    Shape,
)
from shoal.training.planners.space import Space


class Bounds(RingBounds, RefinedBounds):
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

    def __init__(self, space: Space, pool: Pool):
        avail, price_h, region_of = pool
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
        self._in_a_zone: dict[tuple[int, int], int] = {}  # ``_most_in_a_zone``
        # what does not depend on the GPU counts, shared by every pool of the same kinds in
        # the same zones (``Space.bound_memo``)
        memo = self._memo = space.bound_memo
        self._sync: dict[tuple[int, int], np.ndarray] = memo.setdefault("sync", {})
        self._tails: dict[tuple, float] = memo.setdefault("tails", {})
        self._hops: dict[tuple, np.ndarray] = memo.setdefault("hops", {})  # a hop's link ids
        # per hop, its times at degrees 1..n (``_hop_s``)
        self._hop_times: dict[tuple, np.ndarray] = memo.setdefault("hop times", {})
        self._hop_terms: dict[tuple, tuple] = memo.setdefault("hop terms", {})  # ring_terms
        self._rings_of: dict[tuple, list] = memo.setdefault("option rings", {})  # _option_hops
        self._refined: dict[tuple, tuple] = memo.setdefault("refined", {})  # _refine_parts
        self._levels: dict[tuple, tuple] = memo.setdefault("levels", {})  # option_levels
        self._stages: dict[tuple, tuple] = memo.setdefault("stages", {})  # _stage_parts
        # the same two, by shape object (cheaper to look up than by content; shapes are kept
        # across pools): (shape, parts) by (which, id)
        self._by_shape: dict[tuple, tuple] = memo.setdefault("by shape", {})
        # the shapes' option times with their least sends (``option_times``), by shape object
        self._times: dict[int, tuple[Shape, OptionTimes]] = memo.setdefault("times", {})
        self._weights_grid = kind_weights(len(self.avail))

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

    def option_times(self, sh: Shape) -> OptionTimes:
        """Per stage of ``sh``, per (kind, TP) option: its forward and backward per
        microbatch with the least sends and receives (``_sends``); and what bounds every
        allocation of the shape (``OptionTimes``)."""
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
            got = self._times[id(sh)] = (sh, OptionTimes(times, min(sends), rate, compute,
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
        return least_level(args[0][None, :], ANY_REGIONS, np.full(len(Ds), -np.inf),
                            np.full(len(Ds), np.inf), *args[1:], Ds, self.avail,
                            self.region_of, self.region_N, W)
