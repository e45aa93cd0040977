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
from shoal.training.planners.common import Evaluator
from shoal.training.planners.space import Space

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


def search(ev: Evaluator, space: Space, objective: str, mbs_values: list[int],
           max_stages: int | None = None) -> None:
    problem = space.problem
    L = problem.n_layers
    gbs = problem.job.global_batch
    kinds = [(g, tp, z) for (g, z), n in sorted(problem.avail.items()) if n > 0
             for tp in space.tps[g] if tp <= n]
    total_gpus = sum(problem.avail.values())
    pending: list[PlanSpec] = []
    tried = [0]  # replica multisets tried, fitting or not

    def flush():
        ev.cost(list(pending))
        pending.clear()

    try:
        _enumerate(ev, space, L, gbs, kinds, total_gpus, mbs_values, max_stages, pending, tried,
                   flush)
    except _Stop:
        ev.stats.truncated = True
    except SpecError:
        # past the limits: with plans found, the result is cut short as a budget cuts it (so
        # a longer budget never turns a result into an error); with none, refuse
        flush()
        if not ev.feasible:
            raise
        ev.stats.truncated = True
    flush()


def _enumerate(ev, space, L, gbs, kinds, total_gpus, mbs_values, max_stages, pending, tried,
               flush) -> None:
    problem = space.problem
    count = 0
    for recompute in sorted(set(problem.job.recompute)):
        for zero in sorted(set(problem.job.zero_stage)):
            for P in range(1, min(L, max_stages or L, total_gpus) + 1):
                for split in compositions(L, P):
                    for mbs in mbs_values:
                        total = gbs // mbs
                        for D in range(1, min(total, total_gpus // P) + 1):
                            m = shares(total, D)
                            for stages in _assign(space, split, kinds, D, mbs, recompute,
                                                  ev, tried):
                                pending.append(PlanSpec(mbs, "1f1b", recompute, zero, tuple(
                                    StageSpec(a, b, tuple(ReplicaSpec(g, tp, z, m[j])
                                                          for j, (g, tp, z) in enumerate(reps)))
                                    for (a, b), reps in zip(split, stages, strict=True))))
                                count += 1
                                if count > LIMIT:
                                    raise _too_large()
                                if len(pending) >= BATCH:
                                    flush()
                                    if ev.out_of_time():
                                        raise _Stop


def _assign(space: Space, split, kinds, D: int, mbs: int, recompute: bool, ev: Evaluator,
            tried: list[int]):
    """Every way to give each stage a multiset of D replicas within the pool (``tried``
    counts the multisets tried, which may be far more than those that fit)."""
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
                if ev.out_of_time():
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
