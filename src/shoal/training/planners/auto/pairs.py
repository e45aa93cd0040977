"""The plans of one (shape, degree) pair: its allocations, their zone packings, variants
and re-split."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from shoal.training.planners import sailor
from shoal.training.planners.allocate import (
    Allocation,
    Memoised,
    Option,
    Pool,
    fastest,
    slots,
    tradeoffs,
    upgraded,
)
from shoal.training.planners.auto.shapes import (
    PERMUTE_UP_TO,
    Shape,
    every_split,
    rebalanced,
)
from shoal.training.planners.auto.worth import Worth
from shoal.training.planners.build import Form, build_spec
from shoal.training.planners.space import Space

PACKINGS = ("stage", "chain", "pipeline")  # zone placements tried for each allocation


class Pair(NamedTuple):
    """A (shape, degree) pair: ``D`` pipelines of ``sh``, whose slowest replicas take at
    least ``tau`` seconds an iteration (its bound), ``total`` microbatches an iteration."""

    sh: Shape
    D: int
    tau: float
    total: int


class Guide(NamedTuple):
    """What the search knows of a pair before allocating it: ``levels`` allocations per
    program (one for the fastest, several for the cost objectives), ``levels_of``'s option
    levels (``Bounds.option_levels``), ``worth`` (allocations that cannot beat the incumbent
    are not built), ``reach`` (nor plans of a split whose shape cannot, ``Bounds.refined``;
    ``own``: what it says of the pair's own shape, when the caller has asked), ``slowest``
    (where a re-split's allocation program starts, ``Bounds.slowest``), ``least_level`` (a
    lower bound on the program's least level, ``Bounds.refined_level``'s third) and
    ``floor_level`` (a lower bound on any plan's time before the step overhead)."""

    levels_of: Callable[[Shape], list[list[Option]]]
    levels: int = 1
    worth: Worth | None = None
    reach: Callable[[Shape], bool] | None = None
    slowest: Callable[[Shape], float] | None = None
    own: bool | None = None
    least_level: float = 0.0
    floor_level: float = 0.0


class _Work(NamedTuple):
    """What building one pair's plans works with: the pair, its pool and guide, the deadline
    of an allocation, the pair's stage options and its allocation memo."""

    space: Space
    pair: Pair
    pool: Pool
    guide: Guide
    deadline: float | None
    opts: list[list[Option]]
    memo: Memoised

    @property
    def least_s(self) -> float:
        """The least slowest-replica time of any allocation of the pair."""
        return self.pair.tau / slots(self.pair.D, self.pair.total)[0]

    def ok(self, a: Allocation) -> bool:
        """Whether allocation ``a`` may beat the incumbent (the guide's ``worth``)."""
        return self.guide.worth is None or self.guide.worth(a, self.pair.D, self.pair.total)

    def spec(self, a: Allocation, opts: list[list[Option]] | None = None, packing: str = "stage",
             home: str | None = None):
        """``build_spec`` of allocation ``a`` of the pair's shape (over ``opts``, default the
        pair's)."""
        sh = self.pair.sh
        return build_spec(self.space, a, self.opts if opts is None else opts,
                          Form(sh.split, sh.mbs, sh.recompute), self.pair.D, packing=packing,
                          home=home)


def pair_specs(space: Space, pair: Pair, pool: Pool, guide: Guide,
               deadline: float | None = None) -> list:
    """Plans of one (shape, degree) pair: its allocations of least level (the allocation
    program over the guide's option levels), each in every zone packing, and their variants,
    as far as the ``guide`` lets them beat the incumbent. Raises OutOfTime once an allocation
    passes ``deadline``."""
    sh, D = pair.sh, pair.D
    work = _Work(space, pair, pool, guide, deadline, [list(o) for o in sh.opts],
                 Memoised(space.alloc_memo, (sh.split, sh.mbs, sh.recompute)))
    own = guide.own
    if own is None and guide.reach is not None:
        own = guide.reach(sh)
    if own is not None and not own:
        return _resplit_only(work) if sh.rebalance else []
    by_level, allocs = _least_level(work)
    # the program's allocations on some of the options or fewer GPUs take no less than the
    # least level on all of them: none where it has none, none worth building beyond the bar
    variants = bool(allocs) and (guide.worth is None or not guide.worth.beyond_level(
        max(by_level[0].bottleneck_s, guide.floor_level), D))
    out = [work.spec(a, packing=pk, home=home)
           for a in allocs if work.ok(a) for pk, home in packings(space, a)]
    if sh.sailors is not None and variants:
        out += _sailors_allocation(work, allocs)
    if allocs and len(sh.split) <= PERMUTE_UP_TO and every_split(space.problem.n_layers,
                                                                  len(sh.split)):
        out += _permuted(work, allocs)
    if sh.rebalance and allocs:
        out += resplit(space, pair, allocs[0], pool, guide, deadline)
    if variants:
        out += _on_subpools(work, allocs)
    return [s for s in out if s is not None]


def _resplit_only(work: _Work) -> list:
    """Only the re-split may beat the incumbent: the slowest replicas of an allocation at the
    least bottleneck give its layers (any such allocation: its own plans are not built, and on
    three kinds or more the cheapest takes a MIP). Not the allocation of least level that a
    pair whose own plans are built re-splits to: here that program is the slower one, and its
    re-splits are no better (benchmarks/NOTES.md)."""
    pair = work.pair
    a = fastest(work.opts, pair.D, work.pool, at_least=work.least_s, total=pair.total,
                memo=work.memo, deadline=work.deadline, cheapest=False)
    return [] if a is None else resplit(work.space, pair, a, work.pool, work.guide, work.deadline)


def _least_level(work: _Work) -> tuple[list[Allocation], list[Allocation]]:
    """(the allocation program's allocations, the pair's allocations to build): those of least
    level (``levels_of``: each option's least cost to the whole iteration, its stage's gradient
    ring and update included), and for cost objectives the cheapest under several levels, with
    their slowest replicas' compute times; then the same kinds at larger TPs, and faster kinds
    where GPUs are left."""
    guide, pair, memo = work.guide, work.pair, work.memo
    by_level = tradeoffs(guide.levels_of(pair.sh), pair.D, work.pool, levels=guide.levels,
                         at_least=guide.least_level, total=None,
                         memo=Memoised(memo.memo, (*memo.key, "levels", work.space.zone_sets)),
                         deadline=work.deadline)
    allocs = [Allocation(a.per_stage, a.usage, slowest_s(a, work.opts)) for a in by_level]
    if allocs:
        avail, _, region_of = work.pool
        for up in (upgraded(allocs[0], work.opts, avail),
                   upgraded(allocs[0], work.opts, avail, region_of)):
            if all(up.per_stage != a.per_stage for a in allocs):
                allocs = [*allocs, up]
    return by_level, allocs


def _sailors_allocation(work: _Work, allocs: list[Allocation]) -> list:
    """The `sailor` strategy's allocation of the pair (each kind at Sailor's TP): the
    bottleneck program over every TP can choose allocations the estimate ranks below it, and
    with it every plan that strategy costs is costed here too."""
    pair, memo = work.pair, work.memo
    o_min = [list(o) for o in pair.sh.sailors]
    a_min = fastest(o_min, pair.D, work.pool, at_least=work.least_s, total=pair.total,
                    memo=Memoised(memo.memo, (*memo.key, "sailor's tp")),
                    deadline=work.deadline)
    if (a_min is not None and all(a_min.per_stage != a.per_stage for a in allocs)
            and work.ok(a_min)):
        return [work.spec(a_min, o_min)]  # as that strategy packs it
    return []


def _permuted(work: _Work, allocs: list[Allocation]) -> list:
    """Shallow pipelines of a short model: the same GPUs with the stages' replica mixes in
    every other order (the bottleneck program ranks by compute; the sends, the fill and
    drain and the optimizer steps may prefer another order)."""
    out = []
    fits = [{(o.kind, o.tp) for o in oo} for oo in work.opts]
    for a in dict.fromkeys((allocs[0], allocs[-1])):
        for perm in dict.fromkeys(itertools.permutations(a.per_stage)):
            if perm != a.per_stage and all({(k, tp) for k, tp, _ in mix} <= f
                                           for mix, f in zip(perm, fits, strict=True)):
                ap = Allocation(perm, a.usage, a.bottleneck_s)
                if work.ok(ap):
                    out.append(work.spec(ap))
    return out


def _on_subpools(work: _Work, allocs: list[Allocation]) -> list:
    """The allocation pools the zones of a region (H6) and counts no sends between zones, so
    on a pool spread over zones it may take a faster GPU in another zone where the estimate,
    with the sends and egress across zones, prefers the same plan inside one zone; and where
    its stages are in more than one region, the same pair on one region's GPUs may be faster."""
    space, pair, opts = work.space, work.pair, work.opts
    avail, price, region_of = work.pool
    need = pair.D * sum(min(o.tp for o in st) for st in opts)
    subpools: list[tuple[str | None, np.ndarray]] = []
    if len({region_of[st[0][0]] for st in allocs[0].per_stage}) > 1:
        regions = np.asarray(region_of)
        subpools += [(None, np.where(regions == r, avail, 0)) for r in np.unique(regions)]
    subpools += space.zone_pools()
    out = []
    for z, sub in subpools:
        if sub.sum() < need:
            continue
        a3 = fastest(opts, pair.D, Pool(sub, price, region_of), at_least=work.least_s,
                     total=pair.total, memo=work.memo, deadline=work.deadline)
        a3 = None if a3 is None else upgraded(a3, opts, sub)
        if a3 is not None and work.ok(a3):
            out += [work.spec(a3, packing=pk, home=home)
                    for pk, home in (packings(space, a3) if z is None else [("chain", z)])]
    return out


def slowest_s(a: Allocation, opts: list[list[Option]]) -> float:
    """The compute time per microbatch of allocation ``a``'s slowest replica (over
    ``opts``)."""
    return max(o.time_s for st, oo in zip(a.per_stage, opts, strict=True) for o in oo
               if any((o.kind, o.tp) == (k, tp) for k, tp, _ in st))


def packings(space: Space, a: Allocation) -> list[tuple[str, str | None]]:
    """(packing, home) pairs to place allocation ``a`` with: each of ``PACKINGS`` from the
    zone with most free GPUs, and when its first stage's region has several zones, the
    chain of stages from each of them (starting in the largest zone can leave a later stage
    no room beside the stage before it)."""
    zones = space.zones_of[space.kinds[a.per_stage[0][0][0]]]
    return [(pk, None) for pk in PACKINGS] + (
        [("chain", z) for z, _ in zones] if len(zones) > 1 else [])


def resplit(space: Space, pair: Pair, alloc: Allocation, pool: Pool, guide: Guide,
            deadline: float | None) -> list:
    """The plan of the layers re-split to allocation ``alloc``'s slowest replica types
    (``rebalanced``) given the fastest allocation of the new split: none when the split is
    the same, some stage would get no layer, or the guide's ``reach`` or ``worth`` rules it
    out (the allocation program starts from its ``slowest``'s least slowest-replica time).
    On three kinds or more and for the fastest allocation alone (``guide.levels`` 1: not the
    cost objectives and caps), the allocation is the one the program's search met at that
    bottleneck, not necessarily the cheapest, which would take a MIP per re-split
    (benchmarks/NOTES.md)."""
    sh, D, _, total = pair
    opts = [list(o) for o in sh.opts]
    # the re-split's shape (or None), kept with the stage options: it depends on the kinds
    # and their TPs, not on the GPU counts; one shape object per split (the bounds keep their
    # parts by shape object)
    key = ("resplit", alloc.per_stage, sh.split, sh.mbs, sh.recompute)
    sh2 = space.stage_opts.get(key, False)
    if sh2 is False:
        new = rebalanced(space, alloc, opts, space.problem.n_layers, sh.mbs, sh.recompute)
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
    if guide.reach is not None and not guide.reach(sh2):
        return []
    least = 0.0 if guide.slowest is None else guide.slowest(sh2)
    if not np.isfinite(least):
        return []  # no allocation holds D replicas of every stage
    a2 = fastest(o2, D, pool, at_least=least / slots(D, total)[0], total=total,
                 memo=Memoised(space.alloc_memo, (new, sh.mbs, sh.recompute)),
                 deadline=deadline, cheapest=guide.levels > 1)
    if a2 is None or (guide.worth is not None and not guide.worth(a2, D, total, other=sh2)):
        return []
    sp = build_spec(space, a2, o2, Form(new, sh.mbs, sh.recompute), D)
    return [] if sp is None else [sp]
