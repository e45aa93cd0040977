"""auto's branch and bound cuts (shape, degree) pairs by lower bounds on iteration time and
cost: on small problems, no plan of the exhaustive space beats the bound of its pair (a shape's
options are each stage's GPU types at every TP that fits with one microbatch in flight per later
stage; plans with other replicas are not the shape's)."""

from __future__ import annotations

import numpy as np
import pytest
from tests.test_planners import SMALL_PROBLEMS, small_problem

from shoal.estimate.api import tables_for
from shoal.training.planners import sailor, search
from shoal.training.planners.auto import Bounds, Shape
from shoal.training.planners.space import Kind, Space, mbs_options

CASES = [*SMALL_PROBLEMS[1:],
         # more replicas than the fast GPUs can hold at their largest TP: the counts bind
         ({"us-central1-a": (2, 6)}, 3, 1024, 16, 2),
         ({"us-central1-a": (2, 2), "us-central1-b": (0, 2)}, 2, 1024, 8, 2)]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_no_plan_beats_its_bound(case):
    pb = small_problem(*CASES[case])
    res = search(pb, strategy="exhaustive", top_k=10 ** 7)
    assert len(res.ranked) > 10
    space = Space(pb, tables_for(pb, mbs_options(pb)))
    avail, price, region_of = sailor.arrays(space)
    bounds = Bounds(space, avail, price, region_of)
    checked = 0
    for c in res.ranked:
        mbs, _, recompute, _, stages = c.spec
        split = tuple((a, b) for a, b, _ in stages)
        D = len(stages[0][2])
        if any(len(reps) != D for _, _, reps in stages):
            continue
        opts = sailor.stage_options(space, split, mbs, recompute, 0, 1, all_tp=True)
        if opts is None or any(
                (space.kinds.index(Kind(g, "us-central1")), tp) not in {(o.kind, o.tp) for o in st}
                for (_, _, reps), st in zip(stages, opts, strict=True) for g, tp, _, _ in reps):
            continue  # a replica outside the shape's options (they count every microbatch in flight)
        sh = Shape(recompute, mbs, split, tuple(tuple(o) for o in opts), rebalance=False)
        T, C, _ = bounds(sh, np.array([D]), pb.job.global_batch // mbs)
        assert T[0] <= c.iteration_time_s * (1 + 1e-9), (c.spec, T[0], c.iteration_time_s)
        assert C[0] <= c.cost_usd * (1 + 1e-9), (c.spec, C[0], c.cost_usd)
        checked += 1
    assert checked > 10
