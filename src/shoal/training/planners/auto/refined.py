"""``Bounds``' per-option bounds of one (shape, degree) pair: the levels of the options and
the sends across regions."""

from __future__ import annotations

import numpy as np

from shoal.estimate.kernel import ring_bound_terms
from shoal.training.planners.allocate import (
    Option,
)
from shoal.training.planners.auto.kernels import (
    ANY_REGIONS,
    NO_FLOOR,
    NONE_YET,
    least_cost,
    least_level,
    refined_levels,
)
from shoal.training.planners.auto.shapes import (
    OptionTimes,
    Shape,
)


class RefinedBounds:
    """``Bounds``' per-option methods (the attributes are ``Bounds``')."""

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
        L(s, o) under it (``least_level``: the conditions of ``_tau``) bounds the time. A
        plan whose options are all at level theta or under takes at least the larger of theta
        and that, and pays each replica of a stage at least the least USD/s of that stage's
        options at or under theta: the least of that over theta, D times over, bounds the
        cost (``least_cost``). On a pool of several regions the time is the least of two
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
        base = refined_levels((fpre[None, :], t[None, :], f[None, :], post[None, :],
                               bsum[None, :]), upd, ring, stage, *rest)
        T = least_level(base, ANY_REGIONS, NO_FLOOR, NONE_YET, *pool)
        any_region = float(T[0])
        if self.cross is not None and P > 1:
            # a plan in more than one region (each stage's replicas in one, H5) sends across
            # regions between some stages b and b + 1, on every pipeline: the least level
            # over the plans in one region and, for each b, those crossing there
            fp, tb_, fb_, po, bs = self._crossing_rows(sh)
            rows = refined_levels((fp, tb_, fb_, po, bs), upd, ring, stage, *rest)
            T = least_level(np.concatenate([base, rows]),
                             np.arange(P) == 0, T, NONE_YET, *pool)
        least = float(T[0])
        # the cost: at least that long, every replica of every stage at the least rate of the
        # options it may take in a plan of that level
        cost = least_cost(base[0], self.price_s[kind] * tp, stage, P, least,
                           self.tc.step_overhead_s) if np.isfinite(least) else np.inf
        return least + self.tc.step_overhead_s, cost * D, any_region

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
            level = refined_levels((fpre[None, :], t[None, :], f[None, :], post[None, :],
                                    bsum[None, :]), upd, ring, stage, P, total // D, D,
                                   self._sync_at(D), self.one_f1b)[0]
            per: list[list[Option]] = [[] for _ in range(P)]
            for s, k, g, lv in zip(stage.tolist(), kind.tolist(), tp.tolist(), level.tolist(),
                                   strict=True):
                per[s].append(Option(k, int(g), lv))
            got = self._levels[key] = (sh, per)
        return got[1]

    def crossed_times(self, sh: Shape, per_stage, times: OptionTimes | None = None
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
        of P-1 rows, as ``refined_levels`` takes them), for plans that
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
