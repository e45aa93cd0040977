"""The branch and bound over (shape, degree) pairs (the package's docstring)."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from shoal.training.planners import sailor
from shoal.training.planners.allocate import OutOfTime, Pool
from shoal.training.planners.auto.bounds import Bounds
from shoal.training.planners.auto.pairs import Guide, Pair, pair_specs
from shoal.training.planners.auto.shapes import (
    Shape,
    shapes_of,
)
from shoal.training.planners.auto.worth import Worth, rank_key
from shoal.training.planners.common import cannot_beat, score
from shoal.training.planners.space import Space
from shoal.training.planners.strategy import Context, Proposals, SearchState

BATCH = 12  # (shape, degree) pairs allocated and costed per estimator call


class Pairs(NamedTuple):
    """The (shape, degree) pairs the search may take, as arrays: each pair's shape (index
    into the shapes), degree, least slowest-replica time of an iteration and what every
    worker's compute ends at least that long before (``Bounds.__call__``)."""

    sid: np.ndarray
    Ds: np.ndarray
    tau: np.ndarray
    after: np.ndarray


def propose(ctx: Context) -> Proposals:
    """shoal's default planner (the package's docstring)."""
    ev, space, objective = ctx.state, ctx.space, ctx.objective
    pool = sailor.arrays(space)
    bounds = Bounds(space, pool)
    cons = ev.constraints
    got = _pairs(ctx, bounds)
    if got is None:
        return
    shapes, pairs, T, C = got
    sid, Ds = pairs.sid, pairs.Ds
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
        yield from sailor.propose(ctx)
    run = BranchAndBound(ev, space, bounds, pool, shapes, pairs)
    most_s = min(1.0 / cons.min_iters_per_s if cons.min_iters_per_s else np.inf,
                 cons.deadline.within / cons.deadline.iterations if cons.deadline else np.inf)
    limits = (most_s, cons.max_cost_per_iteration_usd
              if cons.max_cost_per_iteration_usd is not None else np.inf)
    yield from run(keep, rank_key(T, C, objective), T, objective, lambda: ev.incumbent, limits)
    if not ev.feasible and (not keep.all() or np.isfinite(limits).any()):
        # the constraints cut every plan: cost the fastest (cheapest) plans anyway, so the
        # error can tell a constraint from memory (``planners._nearest`` then finds how far
        # to relax it)
        if cons.max_cost_per_iteration_usd is not None:
            yield from run(np.ones(len(sid), dtype=bool), C, T, "min-cost", lambda: ev.cheapest)
        if cons.min_iters_per_s is not None or cons.max_gpus is not None:
            yield from run(np.ones(len(sid), dtype=bool), T, T, "max-throughput",
                           lambda: ev.fastest)


def _pairs(ctx: Context, bounds: Bounds
           ) -> tuple[list[Shape], Pairs, np.ndarray, np.ndarray] | None:
    """The shapes, and every (shape, degree) pair whose bounds are finite with its time and
    cost bounds (None: no pair)."""
    ev, space = ctx.state, ctx.space
    gbs = space.problem.job.global_batch
    shapes: list[Shape] = []
    rows = []  # per shape: degrees, time bounds, cost bounds, slowest-replica bounds
    # the shapes depend on the kinds and their TPs, not on the GPU counts: kept with the
    # stage options for every pool of the same kinds
    key = ("shapes", tuple(ctx.mbs_values), ctx.max_stages)
    if key not in space.stage_opts:
        space.stage_opts[key] = list(shapes_of(space, list(ctx.mbs_values), ctx.max_stages))
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
        return None
    sid, Ds, T, C, tau, after = (np.concatenate(x) for x in zip(*rows, strict=True))
    return shapes, Pairs(sid, Ds, tau, after), T, C


class _Bar(NamedTuple):
    """What the pairs of one batch are judged against: the objective, the incumbent's score
    and iteration time (``score``), the most seconds and USD an iteration may take (the
    constraints) and the allocation program's levels."""

    objective: str
    score: float
    time_s: float
    limits: tuple[float, float]
    levels: int


class BranchAndBound:
    """Takes (shape, degree) pairs by increasing bound, allocates and costs them in batches,
    and stops when the next bound cannot beat the best plan so far."""

    def __init__(self, ev: SearchState, space: Space, bounds: Bounds, pool: Pool,
                 shapes: list[Shape], pairs: Pairs):
        self.ev, self.space, self.bounds, self.pool, self.shapes = ev, space, bounds, pool, shapes
        self.sid, self.Ds, self.tau, self.after = pairs

    def __call__(self, mask: np.ndarray, key: np.ndarray, times: np.ndarray, objective: str,
                 best, limits: tuple[float, float] = (np.inf, np.inf)) -> Proposals:
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
            specs, j, cut = self._batch(idx, i, hopeless,
                                        _Bar(objective, bar, bar_t, limits, levels))
            i = j
            yield [s for s in dict.fromkeys(specs) if s not in ev.feasible]
            if cut:
                return

    def _batch(self, idx: np.ndarray, i: int, hopeless, bar: _Bar) -> tuple[list, int, bool]:
        """(plans, next position, whether the budget ran out inside an allocation) of the pairs
        ``idx[i:]`` taken in one batch: up to ``BATCH`` of them, while they are not
        ``hopeless`` and time remains."""
        ev = self.ev
        specs: list = []
        j = i
        cut = False  # the budget ran out inside an allocation: cost what is built, stop
        try:
            while (j < len(idx) and j < i + BATCH and not hopeless(idx[j])
                   and (j == i or not ev.out_of_time())):
                specs += self._pair_specs(idx[j], bar)
                j += 1
        except OutOfTime:
            cut = ev.stats.truncated = ev.stats.timed_out = True
            ev.stats.pruned += len(idx) - j
        return specs, j, cut

    def _pair_specs(self, e: int, bar: _Bar) -> list:
        """The plans of pair ``e`` that may beat the incumbent, none when its refined bound
        cannot."""
        ev = self.ev
        sh = self.shapes[self.sid[e]]
        D = int(self.Ds[e])
        worth = Worth(bar.objective, bar.score, bar.time_s, float(self.after[e]),
                      self.space.problem.timing.step_overhead_s, self.pool.price,
                      self.bounds.option_times(sh), ev.beaten,
                      functools.partial(self.bounds.tails, D=D),
                      functools.partial(self.bounds.crossed_times, sh), bar.limits,
                      sh.split, self.bounds.option_times, self.bounds.one_f1b)
        total = self.space.problem.job.global_batch // sh.mbs

        def reach(s: Shape, D=D, total=total, worth=worth) -> bool:
            return not worth.out_of_reach(*self.bounds.refined(s, D, total))

        # the pair's own split may beat the incumbent
        refined_t, refined_usd, least_level = self.bounds.refined_level(sh, D, total)
        own = not worth.out_of_reach(refined_t, refined_usd)
        if not sh.rebalance and not own:
            ev.stats.pruned += 1  # its refined bound cannot beat the incumbent
            return []
        guide = Guide(functools.partial(self.bounds.option_levels, D=D, total=total),
                      bar.levels, worth, reach, functools.partial(self.bounds.slowest, D=D), own,
                      least_level, refined_t - self.space.problem.timing.step_overhead_s)
        return pair_specs(self.space, Pair(sh, D, float(self.tau[e]), total), self.pool, guide,
                          ev.allocation_deadline())
