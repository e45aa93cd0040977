"""What the data-parallel gradient ring of a stage costs at least, whatever the placement
(``Bounds``' part on rings)."""

from __future__ import annotations

import numpy as np

from shoal.estimate.kernel import intra_terms, ring_bound_at, ring_bound_terms, ring_from_terms
from shoal.profiles.network import bandwidth
from shoal.training.planners.allocate import (
    Option,
)
from shoal.training.planners.auto.shapes import (
    Shape,
    pad_last,
)


class RingBounds:
    """``Bounds``' methods on the stages' gradient rings (the attributes are ``Bounds``')."""

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
        under ZeRO) as ``refined_levels`` takes them; the divisor is 1 here, the caller's D
        where ZeRO shards the update (``refined_level``)."""
        return np.array([self.tc.sync_scale, self.overlap, self.sync_on, 1.0])

    def _exposed(self, ring: np.ndarray, busy: np.ndarray) -> np.ndarray:
        """A stage's least exposed gradient sync from its least ring and the most compute
        time per microbatch of its replicas (their backward is shorter): what the stack
        hides behind the last backward comes off; nothing follows the backward under
        ZeRO-3."""
        return self.sync_on * np.maximum(ring - self.overlap * busy, 0.0)

    def _sync_at(self, D: int) -> np.ndarray:
        """``sync_terms`` for D pipelines."""
        terms = self.sync_terms
        if self.upd_div_on:
            terms[3] = float(D)
        return terms

    def _ring_rows(self, sh: Shape, D: int) -> tuple[np.ndarray, np.ndarray]:
        """Per option of ``sh`` (a row each, padded with its own last link's), the ring terms
        of its stage's gradients that bound a ring of D members (``kernel.ring_bound_at``)."""
        # the terms depend on D only through whether D members fit one node
        fit = self._by_shape.get(key := ("most per node", id(sh)))
        if fit is None or fit[0] is not sh:
            fit = self._by_shape[key] = (sh, max(
                (b.per_node for b in self._refine_parts(sh)[5]), default=0))
        D = min(D, fit[1] + 1)
        key = ("rings", id(sh), D)
        got = self._by_shape.get(key)
        if got is None or got[0] is not sh:
            rows = [ring_bound_at(b, D) for b in self._refine_parts(sh)[5]]
            width = max(m.shape[-1] for m, _ in rows)
            got = self._by_shape[key] = (sh, tuple(
                np.concatenate([pad_last(np.atleast_2d(x[i]), width) for x in rows])
                for i in range(2)))
        return got[1]

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
        replicas or more, which crosses zones when its replicas cannot all be in one zone of
        its kind. A hop takes at least its fastest link between any zones of its two kinds
        (between two different zones for that one), and the ring is as slow as its slowest
        hop (``kernel.ring_allreduce_s``); it hides behind the backward of the replica that
        ends the stage last as far as the stack overlaps them (the most compute per
        microbatch of the stage's options, ``compute``'s (kind, TP) entries, bounds that)."""
        tb = self.space.tb
        out = np.empty(len(split))
        div = float(D) if self.upd_div_on else 1.0
        for s, ((a, b), st) in enumerate(zip(split, per_stage, strict=True)):
            # (which options' replicas cannot all be in one zone: this depends on the counts)
            apart = tuple(n > self._most_in_a_zone(k, tp) for k, tp, n in st)
            key = (a, b, D, st, apart, self.overlap and tuple(compute[s].get((k, tp), 0.0)
                                                              for k, tp, _ in st))
            got = self._tails.get(key)
            if got is None:
                upd = max(float(tb.cum_u[self.gi[k], tb.ti(tp), b] - tb.cum_u[self.gi[k],
                                                                              tb.ti(tp), a])
                          for k, tp, _ in st) / div
                ring = 0.0
                for (k, tp, n), far in zip(st, apart, strict=True) if D > 1 else ():
                    # the hop out of this option's last replica, to another option's, and
                    # between its own replicas
                    out_s = [self._hop_s(a, b, D, k, tp, k2) for k2, tp2, _ in st
                             if (k2, tp2) != (k, tp)]
                    if out_s:
                        ring = max(ring, min(out_s))
                    if n > 1 or not out_s:
                        ring = max(ring, self._hop_s(a, b, D, k, tp, k))
                    if far:  # a hop between two of its zones
                        ring = max(ring, self._hop_s(a, b, D, k, tp, k, apart=True))
                # hidden behind the backward of whichever replica ends the stage last
                busy = max(compute[s].get((k, tp), np.inf) for k, tp, _ in st)
                sync = float(self._exposed(np.array(ring), np.array(busy)))
                got = self._tails[key] = sync + upd
            out[s] = got
        return out

    def _most_in_a_zone(self, k: int, tp: int) -> int:
        """The most replicas at TP ``tp`` that one zone of kind ``k`` holds."""
        got = self._in_a_zone.get((k, tp))
        if got is None:
            sp = self.space
            got = self._in_a_zone[(k, tp)] = max(n // tp for _, n in sp.zones_of[sp.kinds[k]])
        return got

    def _hop_s(self, a: int, b: int, D, k: int, tp: int, k2: int, apart: bool = False):
        """The least seconds a ring all-reduce of D members over layers [a, b) takes when one
        of its hops goes from a replica of kind ``k`` (TP ``tp``) to one of kind ``k2``, over
        its fastest link between any zones of the two kinds, or between two different zones
        (``apart``; such a hop is inside no node) (``kernel.ring_allreduce_s``; D: a number,
        or an array of them)."""
        if np.ndim(D) == 0:  # read off the hop's times at degrees 1..n, n doubled as needed
            d = int(D)
            got = self._hop_times.get(one := (a, b, k, tp, k2, apart))
            if got is None or len(got) < d:
                n = max(d, 64 if got is None else 2 * len(got))
                got = self._hop_times[one] = self._hop_s(a, b, np.arange(1, n + 1), k, tp, k2,
                                                         apart)
            return float(got[d - 1])
        bound = self._hop_terms.get(key := (a, b, k, tp, k2, apart))
        if bound is None:
            tb = self.space.tb
            nbytes = self.space.grad_bytes(a, b)
            bound = self._hop_terms[key] = ring_bound_terms(
                tb, self._links(k, tp, k2, apart), int(self.gi[k]), tp, nbytes,
                k == k2 and not apart)
        d = np.asarray(D, dtype=float)
        sc = self.tc.sync_scale
        own = ring_from_terms(bound.own, d[..., None], sc).min(axis=-1)
        if bound.node is None:
            return own
        inside = ring_from_terms(bound.inside, d, sc)
        node = ring_from_terms(bound.node, d[..., None], sc).min(axis=-1)
        # (``kernel.ring_bound_at``: one node's links while the members fit one)
        return np.minimum(own, np.where(d <= bound.per_node, inside, node))

    def _links(self, k: int, tp: int, k2: int, apart: bool = False) -> np.ndarray:
        """Link ids from a replica of kind ``k`` at TP ``tp`` to one of kind ``k2``, between
        any zones of the two kinds (``apart``: two different ones)."""
        rid = self._hops.get((k, tp, k2, apart))
        if rid is None:
            sp, tb = self.space, self.space.tb
            za = [tb.zones.index(z) for z, _ in sp.zones_of[sp.kinds[k]]]
            zb = [tb.zones.index(z) for z, _ in sp.zones_of[sp.kinds[k2]]]
            rid = self._hops[(k, tp, k2, apart)] = np.array([
                tb.link_id(self.gi[k], x, self.gi[k2], y, tb.ti(tp)) for x in za for y in zb
                if not (apart and x == y)])
        return rid
