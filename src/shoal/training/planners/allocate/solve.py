"""The cheapest allocation under one bound: the dynamic program, the MIP or the greedy fill."""

from __future__ import annotations

import time

import numpy as np

from shoal.training.planners.allocate.base import (
    DP_KINDS,
    GREEDY_ORDERS,
    Allocation,
    Bound,
    Option,
    OutOfTime,
    Pool,
    kind_weights,
    slots,
)
from shoal.training.planners.allocate.dp import solve_dp, tables_of
from shoal.training.planners.allocate.greedy import (
    Flat,
    each_cheapest,
    flatten,
    gpu_load,
    greedy,
    keep_options,
)
from shoal.training.planners.allocate.mip import solve_mip


def solve_at(stage_opts: list[list[Option]], D: int, pool: Pool, tau: float,
             total: int | None = None, deadline: float | None = None,
             cheapest: bool = True) -> Allocation | None:
    """Cheapest allocation in which every replica finishes its pipeline's microbatches within
    those of a replica taking ``tau`` per microbatch in the busiest pipeline (with ``total``
    microbatches shared as by ``build.shares``; without, every replica takes at most ``tau``).
    Each stage mixes at most two options, all of one region. With ``cheapest`` False, any
    such allocation (a feasibility test). Raises OutOfTime once past ``deadline``."""
    return solve_exact(stage_opts, D, pool, tau, total, deadline, cheapest)[0]


def solve_exact(stage_opts: list[list[Option]], D: int, pool: Pool, tau: float,
                total: int | None, deadline: float | None, cheapest: bool,
                flat: Flat | None = None) -> tuple[Allocation | None, bool]:
    """``solve``'s answer, and whether it is the cheapest (none counts as the cheapest): a
    feasibility test answers with the cheapest allocation when it takes the MIP. ``flat``:
    the stage options flattened (``flatten``; a program keeps them for all its bounds)."""
    avail, price, region_of = pool
    relax, extra = slots(D, total)
    tau = float(tau)  # the compiled programs take it as a float
    if len(avail) <= DP_KINDS:
        return solve_dp(tables_of(stage_opts, D, region_of), avail, price, tau, relax, extra,
                         deadline), True
    if deadline is not None and time.perf_counter() > deadline:
        raise OutOfTime
    flat = flat or flatten(stage_opts)
    keep = np.zeros(len(flat.opts), dtype=np.bool_)
    K = len(avail)
    # a stage whose every option is over the bound has no replica for the busiest pipelines
    if not keep_options(flat.start, flat.kinds, flat.tps, flat.times, K, tau, tau * relax, keep,
                        np.empty(K, np.int64)):
        return None, True
    W = kind_weights(K).T
    load, binding = gpu_load(flat.start, flat.kinds, flat.tps, flat.times, keep,
                          np.asarray(avail, dtype=np.float64), W, tau, D, extra)
    if load > 1.0:
        return None, True
    used = np.unique(flat.kinds[keep]).tolist()
    if len(used) <= DP_KINDS:
        # the bound leaves options of one or two kinds: the dynamic program over them
        return on_kinds(used, flat.allowed(keep), D, pool, Bound(tau, relax, extra),
                        deadline), True
    if cheapest:
        own = each_cheapest(allowed := flat.allowed(keep), D, pool, Bound(tau, relax, extra))
        if own is not None:
            return own, True
    else:
        # greedy fills in GREEDY_ORDERS stage orders, each by the share of the GPUs left and
        # by the weighting closest to binding
        out = np.empty((len(flat.start) - 1, 6), dtype=np.int64)
        left = np.empty(len(avail), dtype=np.int64)
        if greedy(flat.start, flat.kinds, flat.tps, flat.times, keep,
                   np.asarray(region_of, dtype=np.int64), np.asarray(avail, dtype=np.int64),
                   tau, extra, D, W[:, binding], GREEDY_ORDERS, left, out):
            per_stage = tuple(((ka, ta, na),) if kb < 0 else ((ka, ta, na), (kb, tb, nb))
                              for ka, ta, na, kb, tb, nb in out.tolist())
            return Allocation(per_stage, tuple(int(a) - int(b) for a, b in
                                               zip(avail, left, strict=True)), tau), False
        allowed = flat.allowed(keep)
    # a feasibility test that gets here also costs the allocations: when its bound is the
    # one found, the cheapest is then known (a MIP with costs takes about a third longer)
    return solve_mip(allowed, D, pool, Bound(tau, relax, extra), deadline), True


def on_kinds(used: list[int], allowed: list[list[Option]], D: int, pool: Pool, bound: Bound,
             deadline: float | None) -> Allocation | None:
    """``solve``'s cheapest allocation when the stages' options under the bound (``allowed``)
    are of the kinds ``used`` alone (one or two): the dynamic program on those kinds, its
    allocation in the pool's kinds."""
    avail, price, region_of = pool
    tau, relax, extra = bound
    local = {k: i for i, k in enumerate(used)}
    opts = [[Option(local[o.kind], o.tp, o.time_s) for o in al] for al in allowed]
    got = solve_dp(tables_of(opts, D, [region_of[k] for k in used]), avail[used], price[used],
                    tau, relax, extra, deadline)
    if got is None:
        return None
    usage = np.zeros(len(avail), dtype=np.int64)
    usage[used] = got.usage
    return Allocation(tuple(tuple((used[k], tp, n) for k, tp, n in st) for st in got.per_stage),
                      tuple(int(u) for u in usage), tau)
