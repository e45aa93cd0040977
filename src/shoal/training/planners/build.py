"""Turn a stage allocation into a concrete plan spec: replicas, pipelines, zones, shares."""

from __future__ import annotations

from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec
from shoal.training.planners.allocate import Allocation, Option
from shoal.training.planners.space import Space

SPEC_MEMO_MAX = 200_000  # placements a Space's memo keeps before it starts again


def shares(total: int, D: int) -> list[int]:
    """Microbatches per pipeline: as even as possible, the extra ones to the last pipelines
    (which hold each stage's fastest replicas)."""
    base, extra = divmod(total, D)
    return [base + (1 if j >= D - extra else 0) for j in range(D)]


def build_spec(space: Space, alloc: Allocation, stage_opts: list[list[Option]],
               split: tuple[tuple[int, int], ...], mbs: int, D: int, *, recompute: bool = False,
               zero: int = 0, schedule: str = "1f1b", packing: str = "stage",
               home: str | None = None) -> PlanSpec | None:
    """A plan spec for ``alloc``, or None if a TP group finds no zone with enough free GPUs.

    In every stage the replicas are ordered slowest first, so pipeline j pairs the j-th slowest
    replica of each stage: slow replicas share pipelines instead of slowing every pipeline.
    Zones inside a stage's region: ``packing="stage"`` keeps a stage's replicas in as few zones
    as fit (its gradient ring crosses fewest zone boundaries), starting in the zone with the
    most free GPUs of its kind; ``"chain"`` does the same starting in the zone where the
    previous stage started (fewer sends between zones); ``"pipeline"`` keeps each pipeline's
    replicas in the zone of its previous stage (activations stay in the zone). ``home``: the
    zone the first replica prefers."""
    total = space.problem.job.global_batch // mbs
    if total < D:
        return None
    # the result depends on the pool only through the zones of the kinds it uses
    used_kinds = sorted({k for st in alloc.per_stage for k, _, _ in st})
    key = (alloc.per_stage, split, mbs, D, recompute, zero, schedule, packing, home,
           tuple(tuple(space.zones_of[space.kinds[k]]) for k in used_kinds))
    if key in space.spec_memo:
        return space.spec_memo[key]
    if len(space.spec_memo) >= SPEC_MEMO_MAX:
        space.spec_memo.clear()
    space.spec_memo[key] = spec = _build(space, alloc, stage_opts, split, mbs, D, total,
                                         recompute, zero, schedule, packing, home)
    return spec


def _build(space: Space, alloc: Allocation, stage_opts: list[list[Option]],
           split: tuple[tuple[int, int], ...], mbs: int, D: int, total: int, recompute: bool,
           zero: int, schedule: str, packing: str, home: str | None) -> PlanSpec | None:
    m = shares(total, D)
    used: dict[tuple[str, str], int] = {}
    stages = []
    for (a, b), opts, st in zip(split, stage_opts, alloc.per_stage, strict=True):
        # slowest replicas first (of equally fast ones, the allocation's order; one needs none)
        if len(st) == 1:
            runs = [(0.0, *st[0])]
        else:
            runs = sorted(((next(o.time_s for o in opts if o.kind == k and o.tp == tp), k, tp, n)
                           for k, tp, n in st), key=lambda r: -r[0])
        zones: list[str] = []
        for _, k, tp, n in runs:
            kind = space.kinds[k]
            if packing == "pipeline":
                j, end = len(zones), len(zones) + n
                while j < end:
                    prefer = stages[-1].replicas[j].zone if stages else None
                    z = space.place(kind, tp, used, prefer)
                    if z is None:
                        return None
                    more = 0
                    if z == prefer:  # the next replicas preferring it too go there while it has room
                        run = 1
                        while j + run < end and stages[-1].replicas[j + run].zone == prefer:
                            run += 1
                        more = min(run - 1, space.free(kind, z, used) // tp)
                        used[(kind.gpu, z)] += more * tp
                    zones += [z] * (more + 1)
                    j += more + 1
                continue
            if zones:
                prefer = zones[-1]
            elif packing == "chain":  # the zone where the last stage began
                prefer = stages[-1].replicas[0].zone if stages else home
            else:
                prefer = home
            left = n
            while left:  # as many as fit in the zone placed in, then the next
                z = space.place(kind, tp, used, prefer)
                if z is None:
                    return None
                more = min(left - 1, (space.free(kind, z, used)) // tp)
                used[(kind.gpu, z)] += more * tp
                zones += [z] * (more + 1)
                left -= more + 1
                prefer = z
        gpus: list[str] = []
        tps: list[int] = []
        for _, k, tp, n in runs:
            gpus += [space.kinds[k].gpu] * n
            tps += [tp] * n
        stages.append(StageSpec(a, b, tuple(map(ReplicaSpec._make,
                                                zip(gpus, tps, zones, m, strict=True)))))
    return PlanSpec(mbs, schedule, recompute, zero, tuple(stages))
