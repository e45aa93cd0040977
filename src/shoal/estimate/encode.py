"""Turn TrainingPlans into the padded arrays of a kernel Batch."""

from __future__ import annotations

import numpy as np

from shoal import catalog
from shoal.estimate.kernel import Batch
from shoal.estimate.tables import CostTables
from shoal.specs.plan import TrainingPlan


def encode(tb: CostTables, plans: list[TrainingPlan]) -> Batch:
    B = len(plans)
    S = max(len(p.stages) for p in plans)
    R = max(len(s.replicas) for p in plans for s in p.stages)
    ls = np.zeros((B, S), dtype=np.int64)
    le = np.zeros((B, S), dtype=np.int64)
    smask = np.zeros((B, S), dtype=bool)
    g = np.zeros((B, S, R), dtype=np.int64)
    t = np.zeros((B, S, R), dtype=np.int64)
    z = np.zeros((B, S, R), dtype=np.int64)
    m = np.zeros((B, S, R), dtype=np.int64)
    rmask = np.zeros((B, S, R), dtype=bool)
    reg = catalog.gpus()
    zi = {zz: i for i, zz in enumerate(tb.zones)}
    for b, p in enumerate(plans):
        for s, st in enumerate(p.stages):
            ls[b, s], le[b, s] = st.layers
            smask[b, s] = True
            for r, rep in enumerate(st.replicas):
                g[b, s, r] = tb.gi(reg.canonical(rep.gpu))
                t[b, s, r] = tb.ti(rep.tp)
                z[b, s, r] = zi[rep.zone]
                m[b, s, r] = rep.microbatches
                rmask[b, s, r] = True
    return Batch(
        mbs_idx=np.array([tb.mi(p.microbatch_size) for p in plans]),
        ls=ls, le=le, smask=smask, g=g, t=t, z=z, m=m, rmask=rmask,
        recompute=np.array([p.recompute for p in plans]),
        zero=np.array([p.zero_stage for p in plans]),
        gpipe=np.array([p.schedule == "gpipe" for p in plans]),
    )
