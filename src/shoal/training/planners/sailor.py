"""Sailor's planner (Strati et al., §4.2): enumerate pipeline depth and microbatch size, split
the layers evenly, give each GPU type a TP per stage as Sailor's public planner does (H1, H2:
the smallest that fits, raised while it scales, ``sailor_tp``), walk data
parallelism from the largest degree down until throughput stops rising (H3) — or, when
minimising cost, single-stage plans from the smallest degree up until cost stops falling (H4, as
Sailor's public planner does) — and give each stage its replicas by the dynamic program over
the GPUs left (Eq. 1, Listing 1) with each stage in one region (H5) and the zones of a region
pooled (H6). Every plan the program returns is costed by shoal's estimator; the best under the
objective and constraints wins.
"""

from __future__ import annotations

import numpy as np

from shoal.training.planners.allocate import Option, OutOfTime, Pool, fastest, tradeoffs
from shoal.training.planners.build import Form, build_spec
from shoal.training.planners.common import score
from shoal.training.planners.space import Kind, Space, balanced_split
from shoal.training.planners.strategy import Context, Proposals

WALK_CHUNK = 4  # data-parallel degrees allocated and costed together on the H3/H4 walk
# Sailor's public planner raises a GPU type's TP over its smallest fitting one while each larger
# TP speeds the stage up by at least a constant factor (its SPEEDUP_THRESHOLD, defined in a
# header the reference does not include). Each TP it chose on the runs of
# reference/sailor/sailor_runs.md needs a factor of at most 1.52 (the least speedup along those
# choices in its measured profiles), and every value from 1.0 to 1.5 gives the `sailor`
# strategy the same plans on those runs (benchmarks/sailor_faithfulness.py, benchmarks/NOTES.md)
TP_SPEEDUP = 1.2


def stage_options(space: Space, split, mbs: int, recompute: bool, zero: int, dp: int,
                  all_tp: bool = False) -> list[list[Option]] | None:
    """Per stage: every resource kind with Sailor's TP (``sailor_tp``) and that replica's time;
    with ``all_tp``, every fitting TP of the node, from the smallest."""
    P = len(split)
    out = []
    for i, (a, b) in enumerate(split):
        key = (a, b, P - i, mbs, recompute, zero, dp, all_tp)
        opts = space.stage_opts.get(key)
        if opts is None:
            opts = space.stage_opts[key] = []
            for k, kind in enumerate(space.kinds):
                tp = space.min_tp(kind.gpu, mbs, a, b, P - i, recompute, zero, dp)
                if tp is None or tp not in space.kind_tps[kind]:
                    continue
                tps = ([t for t in space.kind_tps[kind] if t >= tp] if all_tp
                       else [sailor_tp(space, kind, tp, mbs, a, b)])
                opts += [Option(k, t, space.stage_time(kind.gpu, t, mbs, a, b, recompute))
                         for t in tps]
        if not opts:
            return None
        out.append(list(opts))
    return out


def sailor_tp(space: Space, kind: Kind, smallest: int, mbs: int, a: int, b: int) -> int:
    """The TP Sailor's public planner gives ``kind``'s replicas of layers [a, b), whose
    smallest fitting TP is ``smallest`` (H2). Its planner takes the GPU types in name order;
    on a pool of several types the first keeps its smallest fitting TP, and every other type
    (every type, on a pool of one) takes the larger of that and the TP the stage scales to:
    from the node's smallest TP up, each next TP is taken while it runs the stage's forward
    and backward at least ``TP_SPEEDUP`` times faster than the last one taken."""
    gpus = sorted({k.gpu for k in space.kinds})
    if len(gpus) > 1 and kind.gpu == gpus[0]:
        return smallest
    scaled, last = smallest, np.inf
    for tp in space.kind_tps[kind]:
        cum = space.tb.cum_step(kind.gpu, tp, mbs, False)
        now = float(cum[b] - cum[a])
        if now > 0 and last / now < TP_SPEEDUP:
            break
        scaled, last = tp, now
    return max(smallest, scaled)


def max_dp(space: Space, stage_opts: list[list[Option]], total_mb: int) -> int:
    """An upper bound on the data-parallel degree: GPUs over the cheapest stage footprint."""
    need = sum(min(o.tp for o in opts) for opts in stage_opts)
    return int(min(total_mb, sum(space.avail.values()) // max(need, 1)))


def arrays(space: Space) -> Pool:
    """The space's pool as the allocation programs take it."""
    avail = np.array([space.avail[k] for k in space.kinds], dtype=np.int64)
    price = np.array(space.prices)
    regions = sorted({k.region for k in space.kinds})
    region_of = [regions.index(k.region) for k in space.kinds]
    return Pool(avail, price, region_of)


def recompute_of(problem) -> bool:
    """Sailor plans without activation recompute; with it only where the job allows no other
    setting."""
    return False not in problem.job.recompute


def propose(ctx: Context) -> Proposals:
    """Sailor's plans (the module docstring), a few data-parallel degrees at a time."""
    ev, space, objective, max_stages = ctx.state, ctx.space, ctx.objective, ctx.max_stages
    problem = space.problem
    recompute = recompute_of(problem)
    L = problem.n_layers
    gbs = problem.job.global_batch
    pool = arrays(space)
    max_P = min(L, max_stages or L)
    for P in range(1, max_P + 1):
        if objective == "min-cost" and P > 1:
            break  # Sailor's public planner returns single-stage plans when minimising cost
        split = balanced_split(L, P)
        for mbs in ctx.mbs_values:
            total = gbs // mbs
            opts = stage_options(space, split, mbs, recompute, 0, 1)
            if opts is None:
                ev.stats.no_fit += 1
                continue
            Dmax = max_dp(space, opts, total)
            # H4 walks up from the smallest degree, H3 down from the largest, until the
            # objective stops improving; plans are costed a few degrees at a time
            walk = list(range(1, Dmax + 1) if objective == "min-cost" else range(Dmax, 0, -1))
            best, done = None, False
            for at in range(0, len(walk), WALK_CHUNK):
                if ev.out_of_time():
                    return
                specs = []
                for D in walk[at:at + WALK_CHUNK]:
                    deadline = ev.allocation_deadline()
                    try:
                        alloc = (fastest(opts, D, pool, total=total,
                                         deadline=deadline)
                                 if objective != "min-cost"
                                 else (tradeoffs(opts, D, pool, total=total,
                                                 deadline=deadline) or [None])[-1])
                    except OutOfTime:
                        ev.stats.truncated = ev.stats.timed_out = True
                        yield specs
                        return
                    spec = (build_spec(space, alloc, opts, Form(split, mbs, recompute), D)
                            if alloc else None)
                    if spec is None:
                        ev.stats.pruned += 1
                        continue
                    specs.append(spec)
                for cand in (yield specs):
                    if cand is None:
                        continue
                    if best is not None and score(cand, objective) >= score(best, objective):
                        done = True
                        break
                    best = cand
                if done:
                    break
