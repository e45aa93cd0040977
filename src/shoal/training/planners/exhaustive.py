"""Every plan of the space, for small problems: the ground truth the other strategies are
tested against.

Every pipeline depth, every contiguous layer split, every microbatch size dividing the batch,
every data-parallel degree, and for each stage every multiset of D replicas (GPU type, TP inside
one node, zone) the pool allows, with the recompute and ZeRO settings the job allows. Replicas are
paired into pipelines slowest first, and microbatches shared as evenly as possible, as the other
strategies do.
"""

from __future__ import annotations

import itertools

from shoal.errors import SpecError
from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec
from shoal.training.planners.build import shares
from shoal.training.planners.space import Space
from shoal.training.planners.strategy import Context, Proposals, SearchState

BATCH = 4096
LIMIT = 5_000_000  # plans; beyond this the pool is too large for exhaustive search
TRIES = 20_000_000  # replica multisets tried (most may not fit the pool), likewise


class _Stop(Exception):
    """The search's time budget ran out inside the enumeration."""


def _too_large() -> SpecError:
    return SpecError("the pool is too large for exhaustive search", field="--strategy",
                     value="exhaustive",
                     allowed=f"pools with at most {LIMIT:,} plans and {TRIES:,} replica "
                             "sets to try; use auto or sailor")


def compositions(n: int, parts: int):
    """Contiguous splits of n layers into ``parts`` non-empty ranges."""
    for cuts in itertools.combinations(range(1, n), parts - 1):
        edges = (0, *cuts, n)
        yield tuple((edges[i], edges[i + 1]) for i in range(parts))


def propose(ctx: Context) -> Proposals:
    """Every plan of the space (module docstring), in batches of ``BATCH``."""
    state = ctx.state
    pending: list[PlanSpec] = []
    tried = [0]  # replica multisets tried, fitting or not
    try:
        for sp in _plans(ctx, tried):
            pending.append(sp)
            if len(pending) >= BATCH:
                yield pending
                pending = []
                if state.out_of_time():
                    raise _Stop
    except _Stop:
        state.stats.truncated = True
    except SpecError:
        # past the limits: with plans found, the result is cut short as a budget cuts it (so
        # a longer budget never turns a result into an error); with none, refuse
        if pending:
            yield pending
            pending = []
        if not state.feasible:
            raise
        state.stats.truncated = True
    if pending:
        yield pending


def _plans(ctx: Context, tried: list[int]):
    """Every plan of the space, one at a time; raises SpecError past ``LIMIT`` plans."""
    space = ctx.space
    problem = space.problem
    L, gbs = problem.n_layers, problem.job.global_batch
    kinds = [(g, tp, z) for (g, z), n in sorted(problem.avail.items()) if n > 0
             for tp in space.tps[g] if tp <= n]
    total_gpus = sum(problem.avail.values())
    count = 0
    for recompute in sorted(set(problem.job.recompute)):
        for zero in sorted(set(problem.job.zero_stage)):
            for P in range(1, min(L, ctx.max_stages or L, total_gpus) + 1):
                for split in compositions(L, P):
                    for mbs in ctx.mbs_values:
                        total = gbs // mbs
                        for D in range(1, min(total, total_gpus // P) + 1):
                            m = shares(total, D)
                            for stages in _assign(space, (split, kinds, D, mbs, recompute),
                                                  ctx.state, tried):
                                yield PlanSpec(mbs, "1f1b", recompute, zero, tuple(
                                    StageSpec(a, b, tuple(ReplicaSpec(g, tp, z, m[j])
                                                          for j, (g, tp, z) in enumerate(reps)))
                                    for (a, b), reps in zip(split, stages, strict=True)))
                                count += 1
                                if count > LIMIT:
                                    raise _too_large()


def _assign(space: Space, shape: tuple, state: SearchState, tried: list[int]):
    """Every way to give each stage of ``shape`` (layer split, replica kinds, D, microbatch
    size, recompute) a multiset of D replicas within the pool (``tried`` counts the multisets
    tried, which may be far more than those that fit)."""
    split, kinds, D, mbs, recompute = shape
    avail = dict(space.problem.avail)

    def rec(i: int, used: dict):
        if i == len(split):
            yield ()
            return
        a, b = split[i]
        for ms in itertools.combinations_with_replacement(kinds, D):
            tried[0] += 1
            if tried[0] % BATCH == 0:
                if tried[0] > TRIES:
                    raise _too_large()
                if state.out_of_time():
                    raise _Stop
            use = dict(used)
            ok = True
            for g, tp, z in ms:
                use[(g, z)] = use.get((g, z), 0) + tp
                if use[(g, z)] > avail[(g, z)]:
                    ok = False
                    break
            if not ok:
                continue
            reps = sorted(ms, key=lambda r: -space.stage_time(r[0], r[1], mbs, a, b, recompute))
            for rest in rec(i + 1, use):
                yield (tuple(reps), *rest)

    yield from rec(0, {})
