"""shoal's default planner: Sailor's space and more, searched wider, costed in batches.

On top of the ``sailor`` strategy (whose plans it always costs too, so it is never worse):
- every TP degree that fits a node, not only the smallest that fits in memory;
- for shallow pipelines every contiguous layer split, and for every depth the layers re-split
  so each stage's slowest GPU takes about equal time (a linear-partition dynamic program);
- every data-parallel degree, not only the walk that stops at the first non-improvement;
- for each plan shape, the cheapest allocation under several bottleneck bounds, so time-cost
  trade-offs reach the estimator and the Pareto front;
- every objective uses every pipeline depth (Sailor's public planner keeps min-cost searches to
  one stage);
- activation recompute where the job allows it (it lets smaller GPUs or smaller TP fit);
- all candidates of a shape are costed in one batched kernel call.
"""

from __future__ import annotations

import itertools

import numpy as np

from shoal.training.planners import sailor
from shoal.training.planners.allocate import Allocation, Option, fastest, tradeoffs
from shoal.training.planners.build import build_spec
from shoal.training.planners.common import Evaluator, score
from shoal.training.planners.space import Space, balanced_split

ALL_SPLITS_UP_TO = 3  # pipeline depths whose every contiguous split is tried ...
MAX_SPLITS = 120  # ... when there are at most this many


def splits_for(L: int, P: int) -> list[tuple[tuple[int, int], ...]]:
    """The balanced split, and for shallow pipelines every contiguous split (when not too many)."""
    out = [balanced_split(L, P)]
    if P <= ALL_SPLITS_UP_TO:
        cuts = list(itertools.combinations(range(1, L), P - 1))
        if len(cuts) <= MAX_SPLITS:
            for c in cuts:
                edges = (0, *c, L)
                out.append(tuple((edges[i], edges[i + 1]) for i in range(P)))
    return list(dict.fromkeys(out))


def rebalanced(space: Space, alloc: Allocation, opts: list[list[Option]], L: int, mbs: int,
               recompute: bool) -> tuple[tuple[int, int], ...]:
    """Layers re-split so each stage's slowest replica type takes about equal time: the linear
    partition of the layer list minimising the slowest stage (dynamic program over cuts)."""
    P = len(alloc.per_stage)
    slow = []
    for st, o in zip(alloc.per_stage, opts, strict=True):
        k, tp, _ = max(st, key=lambda x: next(op.time_s for op in o if op.kind == x[0] and op.tp == x[1]))
        slow.append((space.kinds[k].gpu, tp))
    cum = [space.tb.cum_step(g, tp, mbs, recompute) for g, tp in slow]
    # best[i][j]: smallest max stage time placing layers [0, j) on stages 0..i
    best = np.full((P, L + 1), np.inf)
    arg = np.zeros((P, L + 1), dtype=int)
    best[0, 1:] = cum[0][1:] - cum[0][0]
    for i in range(1, P):
        for j in range(i + 1, L + 1):
            cand = np.maximum(best[i - 1, i:j], cum[i][j] - cum[i][i:j])
            q = int(np.argmin(cand))
            best[i, j], arg[i, j] = cand[q], i + q
    edges = [L]
    for i in range(P - 1, 0, -1):
        edges.append(int(arg[i, edges[-1]]))
    edges.append(0)
    edges.reverse()
    return tuple((edges[i], edges[i + 1]) for i in range(P))


def staircase(total: int, Dmax: int) -> list[int]:
    """The data-parallel degrees worth trying: with ``total`` microbatches over D pipelines the
    busiest pipeline runs ceil(total / D) of them, so among degrees with the same count the
    smallest (fewest GPUs, least gradient traffic) is best: D = ceil(total / k) for each k."""
    return sorted({-(-total // k) for k in range(1, total + 1)} & set(range(1, Dmax + 1)))


def _coarse(degrees: list[int], n: int = 10) -> list[int]:
    """About n of ``degrees`` spread geometrically (throughput over D rises, then flattens or
    falls: a coarse pass finds the region, a local pass the best degree)."""
    if len(degrees) <= n:
        return degrees
    idx = np.unique(np.geomspace(1, len(degrees), n).round().astype(int) - 1)
    return sorted({degrees[0], degrees[-1], *(degrees[i] for i in idx)})


def search(ev: Evaluator, space: Space, objective: str, mbs_values: list[int],
           max_stages: int | None = None) -> None:
    # Sailor's own candidates first, so auto is never worse than the sailor strategy
    sailor.search(ev, space, objective, mbs_values, max_stages)
    if objective == "min-cost":
        sailor.search(ev, space, "max-throughput", mbs_values, max_stages)
    problem = space.problem
    L = problem.n_layers
    gbs = problem.job.global_batch
    avail, price, region_of = sailor.arrays(space)
    for recompute in sorted(set(problem.job.recompute)):
        for P in range(1, min(L, max_stages or L) + 1):
            for mbs in mbs_values:
                total = gbs // mbs
                for split in splits_for(L, P):
                    if ev.out_of_time():
                        return
                    opts = sailor.stage_options(space, split, mbs, recompute, 0, 1, all_tp=True)
                    if opts is None:
                        ev.stats.no_fit += 1
                        continue
                    if recompute and _fits_without_recompute(space, split, mbs, opts):
                        ev.stats.pruned += 1  # recompute only slows a shape that already fits
                        continue
                    _shape(ev, space, opts, split, mbs, recompute, objective, total, avail, price,
                           region_of, rebalance=P > 1 and split == balanced_split(L, P))


def _fits_without_recompute(space: Space, split, mbs: int, opts) -> bool:
    """True when, without recompute, every stage already fits each GPU at the same TP."""
    plain = sailor.stage_options(space, split, mbs, False, 0, 1, all_tp=True)
    if plain is None:
        return False
    return all({(o.kind, o.tp) for o in a} == {(o.kind, o.tp) for o in b}
               for a, b in zip(plain, opts, strict=True))


def _shape(ev, space, opts, split, mbs, recompute, objective, total, avail, price, region_of,
           rebalance: bool) -> None:
    """Search the data-parallel degree of one plan shape: a coarse pass over degrees, then the
    neighbours of the best two, each with its fastest and cheaper allocations."""
    L = space.problem.n_layers
    Dmax = sailor.max_dp(space, opts, total)
    if Dmax < 1:
        ev.stats.pruned += 1
        return

    def specs_for(D: int, levels: int) -> list:
        allocs = tradeoffs(opts, D, avail, price, region_of, levels=levels)
        if not allocs:
            ev.stats.pruned += 1
            return []
        out = [build_spec(space, a, opts, split, mbs, D, recompute=recompute) for a in allocs]
        if rebalance:
            new = rebalanced(space, allocs[0], opts, L, mbs, recompute)
            if new != split and min(b - a for a, b in new) > 0:
                o2 = sailor.stage_options(space, new, mbs, recompute, 0, 1, all_tp=True)
                a2 = fastest(o2, D, avail, price, region_of) if o2 else None
                if a2 is not None:
                    out.append(build_spec(space, a2, o2, new, mbs, D, recompute=recompute))
        return [s for s in out if s is not None]

    # Bound first (the "bounds that prune stage choices before the DP"): every pipeline
    # runs at least ceil(total / D) microbatches through its slowest stage, which takes at least
    # the fastest option of the slowest stage; that bound on time (and, times the cheapest GPUs
    # a stage could use, on cost) skips degrees that cannot beat the best plan found so far.
    stage_floor = max(min(o.time_s for o in st) for st in opts)
    fill = sum(min(o.time_s for o in st) for st in opts)  # one microbatch through every stage
    cheapest_rate = sum(min(o.tp * price[o.kind] for o in st) for st in opts) / 3600.0

    def hopeless(D: int) -> bool:
        inc = ev.incumbent
        if inc is None:
            return False
        t_lb = (-(-total // D) - 1) * stage_floor + fill
        if objective == "max-throughput":
            return t_lb >= inc.iteration_time_s
        if objective == "min-cost":
            return t_lb * cheapest_rate * D >= inc.cost_usd
        return t_lb * t_lb * cheapest_rate * D >= inc.iteration_time_s * inc.cost_usd

    scored: dict[int, float] = {}
    degrees = staircase(total, Dmax)
    if not degrees:
        return
    coarse = [D for D in _coarse(degrees) if not hopeless(D)]
    ev.stats.pruned += len(_coarse(degrees)) - len(coarse)
    if not coarse:
        return
    for D in coarse:
        cands = [c for c in ev.cost(specs_for(D, 1)) if c is not None]
        if cands:
            scored[D] = min(score(c, objective) for c in cands)[0]
    if not scored:
        return
    near: set[int] = set()
    for D in sorted(scored, key=scored.get)[:2]:
        i = coarse.index(D)
        lo = coarse[i - 1] if i > 0 else degrees[0]
        hi = coarse[i + 1] if i + 1 < len(coarse) else degrees[-1]
        near.update(x for x in degrees if lo <= x <= hi)
    specs = []
    for D in sorted(near):
        if hopeless(D):
            ev.stats.pruned += 1
            continue
        specs += specs_for(D, 4)
    ev.cost([s for s in dict.fromkeys(specs) if s not in ev.feasible])
