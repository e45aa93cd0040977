"""Answers never get worse with a constraint: adding one that the unconstrained best plan
satisfies leaves the answer as good as it was, and one that cuts it returns a plan that keeps
to it (or says nothing does). Over random pools, every objective and every constraint."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.test_planners import problem

from shoal.errors import InfeasibleError
from shoal.specs.job import Constraints, Deadline
from shoal.training.planners import search

KINDS = ["max_cost", "min_throughput", "max_gpus", "deadline"]
OBJECTIVES = ["max-throughput", "min-cost", "max-throughput-per-dollar"]


def value(c, objective: str) -> float:
    """The objective's value of a ranked plan: lower is better."""
    return {"max-throughput": c.iteration_time_s, "min-cost": c.cost_usd,
            "max-throughput-per-dollar": c.iteration_time_s * c.cost_usd}[objective]


def constraint(kind: str, c, scale: float) -> Constraints:
    """A constraint ``kind`` at ``scale`` x the plan ``c``'s own value (1: the plan just keeps
    to it; past 1 on the cutting side: it does not)."""
    if kind == "max_cost":
        return Constraints(max_cost_per_iteration_usd=c.cost_usd * scale)
    if kind == "min_throughput":
        return Constraints(min_iters_per_s=1 / c.iteration_time_s / scale)
    if kind == "max_gpus":
        return Constraints(max_gpus=max(1, int(c.plan.num_gpus * scale)))
    return Constraints(deadline=Deadline(iterations=100, within=100 * c.iteration_time_s * scale))


def keeps(c, cons: Constraints) -> bool:
    tol = 1 + 1e-9
    return ((cons.max_cost_per_iteration_usd is None
             or c.cost_usd <= cons.max_cost_per_iteration_usd * tol)
            and (cons.min_iters_per_s is None or 1 / c.iteration_time_s * tol >= cons.min_iters_per_s)
            and (cons.max_gpus is None or c.plan.num_gpus <= cons.max_gpus)
            and (cons.deadline is None or cons.deadline.iterations * c.iteration_time_s
                 <= cons.deadline.within * tol))


def _pool(a100: int, v100: int, two_zones: bool):
    zones = {"us-central1-a": {"gpus": {"A100-40GB": max(a100, 1), "V100-16GB": v100}}}
    if two_zones:
        zones["us-central1-b"] = {"gpus": {"V100-16GB": 4}}
    return problem(pool__regions={"us-central1": {"zones": zones}})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a100=st.integers(1, 8), v100=st.integers(0, 8), two_zones=st.booleans(),
       objective=st.sampled_from(OBJECTIVES), kind=st.sampled_from(KINDS))
def test_a_constraint_the_best_plan_keeps_changes_nothing(a100, v100, two_zones, objective,
                                                           kind):
    pb = _pool(a100, v100, two_zones)
    best = search(pb, objective=objective, constraints=Constraints()).ranked[0]
    cons = constraint(kind, best, 1 + 1e-6 if kind != "max_gpus" else 1)
    again = search(pb, objective=objective, constraints=cons).ranked[0]
    assert keeps(again, cons)
    assert value(again, objective) == pytest.approx(value(best, objective), rel=1e-9)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a100=st.integers(1, 8), v100=st.integers(0, 8), two_zones=st.booleans(),
       objective=st.sampled_from(OBJECTIVES), kind=st.sampled_from(KINDS),
       scale=st.sampled_from([0.5, 0.8, 0.95]))
def test_a_constraint_that_cuts_the_best_plan_is_kept(a100, v100, two_zones, objective, kind,
                                                      scale):
    pb = _pool(a100, v100, two_zones)
    best = search(pb, objective=objective, constraints=Constraints()).ranked[0]
    cons = constraint(kind, best, scale)  # less money, more speed, fewer GPUs, less time
    try:
        got = search(pb, objective=objective, constraints=cons).ranked
    except InfeasibleError:
        return
    assert all(keeps(c, cons) for c in got)
    assert value(got[0], objective) >= value(best, objective) * (1 - 1e-9)
