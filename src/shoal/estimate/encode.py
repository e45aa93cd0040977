"""Turn TrainingPlans (or their compact specs) into the padded arrays of a kernel Batch."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from shoal import catalog
from shoal.estimate.kernel import Batch
from shoal.estimate.tables import CostTables
from shoal.specs.plan import TrainingPlan


class ReplicaSpec(NamedTuple):
    """One data-parallel replica of a stage: its GPU type, TP degree, zone and microbatches
    per iteration."""

    gpu: str
    tp: int
    zone: str
    microbatches: int


class StageSpec(NamedTuple):
    """A pipeline stage: layers [first_layer, end_layer) and its replicas."""

    first_layer: int
    end_layer: int
    replicas: tuple[ReplicaSpec, ...]


class PlanSpec(NamedTuple):
    """A training plan in compact form, cheap to build and hash by the thousand (the
    planners' currency; ``to_plan`` makes it a TrainingPlan): microbatch size, schedule key
    (``schedule_key``), activation recompute, ZeRO stage and the stages."""

    mbs: int
    schedule: str
    recompute: bool
    zero: int
    stages: tuple[StageSpec, ...]


def schedule_key(schedule: str, ministages: int = 1) -> str:
    """A spec's schedule field: the schedule, with the zorse schedule's ministages ("zorse:4")."""
    return f"zorse:{ministages}" if schedule == "zorse" else schedule


def parse_schedule(key: str) -> tuple[str, int]:
    """(schedule, ministages) of a spec's schedule field."""
    if key.startswith("zorse:"):
        return "zorse", int(key.split(":", 1)[1])
    return key, 1


def to_spec(plan: TrainingPlan) -> PlanSpec:
    reg = catalog.gpus()
    key = schedule_key(plan.schedule, plan.ministages)
    return PlanSpec(plan.microbatch_size, key, plan.recompute, plan.zero_stage, tuple(
        StageSpec(st.layers[0], st.layers[1],
                  tuple(ReplicaSpec(reg.canonical(r.gpu), r.tp, r.zone, r.microbatches)
                        for r in st.replicas))
        for st in plan.stages))


def encode(tb: CostTables, plans: list[TrainingPlan]) -> Batch:
    return encode_specs(tb, [to_spec(p) for p in plans])


def encode_specs(tb: CostTables, specs: list[PlanSpec]) -> Batch:
    """Padded kernel arrays for compact plan specs."""
    B = len(specs)
    S = max(len(sp.stages) for sp in specs)
    R = max(len(st.replicas) for sp in specs for st in sp.stages)
    ls = np.zeros((B, S), dtype=np.int64)
    le = np.zeros((B, S), dtype=np.int64)
    smask = np.zeros((B, S), dtype=bool)
    g = np.zeros((B, S, R), dtype=np.int64)
    t = np.zeros((B, S, R), dtype=np.int64)
    z = np.zeros((B, S, R), dtype=np.int64)
    m = np.zeros((B, S, R), dtype=np.int64)
    rmask = np.zeros((B, S, R), dtype=bool)
    gi = {name: i for i, name in enumerate(tb.gpus)}
    ti = {tp: i for i, tp in enumerate(tb.tps)}
    zi = {name: i for i, name in enumerate(tb.zones)}
    mi = {mb: i for i, mb in enumerate(tb.mbs)}
    where: list[tuple[int, int, int, int, int]] = []  # (plan, stage, first, last, replicas)
    reps_all: list[tuple] = []
    for b, (_, _, _, _, stages) in enumerate(specs):
        for s, (a, e, reps) in enumerate(stages):
            where.append((b, s, a, e, len(reps)))
            reps_all += reps
    if where:
        wb, ws, wa, we, wn = np.array(where, dtype=np.int64).T
        ls[wb, ws], le[wb, ws], smask[wb, ws] = wa, we, True
        rb, rs = np.repeat(wb, wn), np.repeat(ws, wn)
        rr = np.arange(len(reps_all)) - np.repeat(np.cumsum(wn) - wn, wn)
        # plans repeat the same replicas: each distinct one is looked up once
        seen = {r: i for i, r in enumerate(dict.fromkeys(reps_all))}
        which = np.fromiter(map(seen.__getitem__, reps_all), np.int64, len(reps_all))
        rows = np.array([(gi[r.gpu], ti[r.tp], zi[r.zone], r.microbatches) for r in seen],
                        dtype=np.int64).reshape(len(seen), 4)[which]
        g[rb, rs, rr], t[rb, rs, rr], z[rb, rs, rr], m[rb, rs, rr] = rows.T
        rmask[rb, rs, rr] = True
    return Batch(
        mbs_idx=np.array([mi[sp.mbs] for sp in specs]), ls=ls, le=le, smask=smask, g=g, t=t,
        z=z, m=m, rmask=rmask, recompute=np.array([sp.recompute for sp in specs]),
        zero=np.array([sp.zero for sp in specs]),
        gpipe=np.array([sp.schedule == "gpipe" for sp in specs]))
