"""Turn a stage allocation into a concrete plan spec: replicas, pipelines, zones, shares."""

from __future__ import annotations

from typing import NamedTuple

from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec
from shoal.training.planners.allocate import Allocation, Option
from shoal.training.planners.space import Kind, Space

SPEC_MEMO_MAX = 200_000  # placements a Space's memo keeps before it starts again


class _Replicas(dict):
    """One ``ReplicaSpec`` per distinct (GPU, TP, zone, microbatches), made once: a plan of many
    pipelines repeats a few, and a lookup costs a fraction of making one."""

    def __missing__(self, key: tuple) -> ReplicaSpec:
        if len(self) >= SPEC_MEMO_MAX:
            self.clear()
        rep = self[key] = ReplicaSpec._make(key)
        return rep


_REPLICAS = _Replicas()


def shares(total: int, D: int) -> list[int]:
    """Microbatches per pipeline: as even as possible, the extra ones to the last pipelines
    (which hold each stage's fastest replicas)."""
    base, extra = divmod(total, D)
    return [base + (1 if j >= D - extra else 0) for j in range(D)]


class Form(NamedTuple):
    """What every stage of a plan shares: the layer split, the microbatch size, recompute, the
    ZeRO stage and the pipeline schedule."""

    split: tuple[tuple[int, int], ...]
    mbs: int
    recompute: bool = False
    zero: int = 0
    schedule: str = "1f1b"


def build_spec(space: Space, alloc: Allocation, stage_opts: list[list[Option]], form: Form,
               D: int, *, packing: str = "stage", home: str | None = None) -> PlanSpec | None:
    """A plan spec of ``form`` for ``alloc``, or None if a TP group finds no zone with enough
    free GPUs.

    In every stage the replicas are ordered slowest first, so pipeline j pairs the j-th slowest
    replica of each stage: slow replicas share pipelines instead of slowing every pipeline.
    Zones inside a stage's region: ``packing="stage"`` keeps a stage's replicas in as few zones
    as fit (its gradient ring crosses fewest zone boundaries), starting in the zone with the
    most free GPUs of its kind; ``"chain"`` does the same starting in the zone where the
    previous stage started (fewer sends between zones); ``"pipeline"`` keeps each pipeline's
    replicas in the zone of its previous stage (activations stay in the zone). ``home``: the
    zone the first replica prefers."""
    total = space.problem.job.global_batch // form.mbs
    if total < D:
        return None
    # the result depends on the pool only through the zones of the kinds it uses
    used_kinds = sorted({k for st in alloc.per_stage for k, _, _ in st})
    key = (alloc.per_stage, form.split, form.mbs, D, form.recompute, form.zero, form.schedule,
           packing, home, tuple(tuple(space.zones_of[space.kinds[k]]) for k in used_kinds))
    if key in space.spec_memo:
        return space.spec_memo[key]
    if len(space.spec_memo) >= SPEC_MEMO_MAX:
        space.spec_memo.clear()
    space.spec_memo[key] = spec = _build(space, alloc, stage_opts, form, shares(total, D),
                                         packing, home)
    return spec


def _build(space: Space, alloc: Allocation, stage_opts: list[list[Option]], form: Form,
           m: list[int], packing: str, home: str | None) -> PlanSpec | None:
    """``build_spec``'s plan, pipeline j running ``m[j]`` microbatches."""
    used: dict[tuple[str, str], int] = {}
    stages: list[StageSpec] = []
    for (a, b), opts, st in zip(form.split, stage_opts, alloc.per_stage, strict=True):
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
                placed = _along_pipelines(space, kind, tp, n, used,
                                          stages[-1] if stages else None, len(zones))
            else:
                if zones:
                    prefer = zones[-1]
                elif packing == "chain":  # the zone where the last stage began
                    prefer = stages[-1].replicas[0].zone if stages else home
                else:
                    prefer = home
                placed = _packed(space, kind, tp, n, used, prefer)
            if placed is None:
                return None
            zones += placed
        gpus: list[str] = []
        tps: list[int] = []
        for _, k, tp, n in runs:
            gpus += [space.kinds[k].gpu] * n
            tps += [tp] * n
        stages.append(StageSpec(a, b, tuple(map(_REPLICAS.__getitem__,
                                                zip(gpus, tps, zones, m, strict=True)))))
    return PlanSpec(form.mbs, form.schedule, form.recompute, form.zero, tuple(stages))


def _along_pipelines(space: Space, kind: Kind, tp: int, n: int, used: dict[tuple[str, str], int],
                     before: StageSpec | None, first: int) -> list[str] | None:
    """Zones of ``n`` replicas of ``kind`` at ``tp``, replicas ``first``, ``first + 1``, ...
    of their stage, each preferring the zone of its pipeline's replica in the stage
    ``before`` (None: none); None when one finds no zone."""
    zones: list[str] = []
    j, end = first, first + n
    while j < end:
        prefer = before.replicas[j].zone if before else None
        z = space.place(kind, tp, used, prefer)
        if z is None:
            return None
        more = 0
        if z == prefer:  # the next replicas preferring it too go there while it has room
            run = 1
            while j + run < end and before.replicas[j + run].zone == prefer:
                run += 1
            more = min(run - 1, space.free(kind, z, used) // tp)
            used[(kind.gpu, z)] += more * tp
        zones += [z] * (more + 1)
        j += more + 1
    return zones


def _packed(space: Space, kind: Kind, tp: int, n: int, used: dict[tuple[str, str], int],
            prefer: str | None) -> list[str] | None:
    """Zones of ``n`` replicas of ``kind`` at ``tp``: as many as fit in the zone placed in,
    then the next, starting from ``prefer``; None when one finds no zone."""
    zones: list[str] = []
    left = n
    while left:
        z = space.place(kind, tp, used, prefer)
        if z is None:
            return None
        more = min(left - 1, (space.free(kind, z, used)) // tp)
        used[(kind.gpu, z)] += more * tp
        zones += [z] * (more + 1)
        left -= more + 1
        prefer = z
    return zones
