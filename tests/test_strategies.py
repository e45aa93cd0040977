"""Every planning strategy on one shared set of problems, through the same public entry point
(``search(problem, strategy=...)``) and through its proposals alone (``Strategy``): what any
strategy must give, whatever its method."""

from __future__ import annotations

import functools

import pytest
from tests.test_planners import problem, small_problem

from shoal.errors import InfeasibleError
from shoal.estimate import estimate
from shoal.estimate.encode import PlanSpec
from shoal.estimate.validate import validate_plan
from shoal.training.planners import STRATEGIES, Context, search
from shoal.training.planners.common import Evaluator, SearchStats, score, to_plan
from shoal.training.planners.space import Space, mbs_options

OBJECTIVES = ("max-throughput", "min-cost")


def _two_regions():
    return problem(
        model={"name": "small", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
               "vocab_size": 32000, "max_seq_len": 2048},
        job={"global_batch": 16, "seq_len": 2048, "schedule": ["1f1b"], "zero_stage": [0]},
        pool__regions={
            "us-central1": {"zones": {"us-central1-a": {"gpus": {"A100-40GB": 4}}}},
            "europe-west4": {"zones": {"europe-west4-a": {"gpus": {"A100-40GB": 2}}}}},
        pool__gpus_per_node={"A100-40GB": 2},
        network__defaults={"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                           "same_region": {"bandwidth": "25Gbps", "latency": "1ms"},
                           "cross_region": {"bandwidth": "5Gbps", "latency": "30ms"}})


# the shared problems: small enough for the exhaustive strategy, each with something to choose
FIXTURES = {
    "two-types": lambda: small_problem({"us-central1-a": (2, 4)}, 6, 1024, 8, 4),
    "two-zones": lambda: small_problem({"us-central1-a": (6, 0), "us-central1-b": (0, 2)},
                                       3, 1024, 8, 2),
    "two-regions": _two_regions,
}


@functools.cache
def _problem(name: str):
    return FIXTURES[name]()


@functools.cache
def _result(name: str, strategy: str, objective: str):
    try:
        return search(_problem(name), strategy=strategy, objective=objective)
    except InfeasibleError as e:
        return e


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("fixture", list(FIXTURES))
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_returns_valid_ranked_plans_no_better_than_the_optimum(
        strategy, fixture, objective):
    """Every plan returned is valid on the pool (tiles the model, within the GPUs, TP inside a
    node), fits in memory, is costed as the estimator costs it, and the plans are ranked by
    the objective; none beats the exhaustive strategy's optimum of the space; a second run
    gives the same best plan."""
    pb = _problem(fixture)
    res = _result(fixture, strategy, objective)
    if isinstance(res, InfeasibleError):
        # a strategy may find nothing only where its own method rules the pool out, and it
        # says why; the exhaustive strategy finds a plan on every shared problem
        assert strategy != "exhaustive" and res.binding
        return
    assert res.ranked and res.stats.strategy == strategy
    for c in [*res.ranked, *res.pareto]:
        plan = c.plan
        validate_plan(pb, plan)
        e = estimate(pb, plan)
        assert not e.oom
        assert e.iteration_time_s == pytest.approx(c.iteration_time_s, rel=1e-9)
        assert e.cost_per_iteration_usd == pytest.approx(c.cost_usd, rel=1e-9)
        for (g, z), n in plan.gpu_counts().items():
            assert n <= pb.avail[(g, z)]
    keys = [score(c, objective) for c in res.ranked]
    assert keys == sorted(keys)
    best = _result(fixture, "exhaustive", objective).ranked[0]
    assert score(res.ranked[0], objective)[0] >= score(best, objective)[0] * (1 - 1e-9)
    again = search(pb, strategy=strategy, objective=objective)
    assert again.ranked[0].spec == res.ranked[0].spec


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_runs_alone_on_its_proposals(strategy):
    """A strategy driven by a test's own loop, whose costing keeps nothing (every plan answered
    None): it ends, and proposes only plans of the problem (each tiles the model on the pool's
    GPU types and zones)."""
    pb = _problem("two-types")
    mbs = mbs_options(pb)
    state = Evaluator(pb, mbs, pb.constraints, SearchStats(strategy), "max-throughput")
    ctx = Context(state, Space(pb, state.tb), "max-throughput", tuple(mbs))
    proposals = STRATEGIES[strategy](ctx)
    seen: list[PlanSpec] = []
    try:
        batch = next(proposals)
        while True:
            assert isinstance(batch, list)
            seen += batch
            batch = proposals.send([None] * len(batch))
    except StopIteration:
        pass
    assert seen
    assert not state.feasible and not state.memo  # the search's own costing ran on nothing
    for sp in seen[:: max(1, len(seen) // 50)]:
        assert isinstance(sp, PlanSpec)
        validate_plan(pb, to_plan(sp))


@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_any_strategy_object_runs_in_the_search(strategy):
    """``search`` takes a strategy object as well as a name: a wrapper around a strategy that
    counts its batches gives the same best plan as the strategy by name."""
    pb = _problem("two-types")
    batches = []

    def counted(ctx):
        proposals = STRATEGIES[strategy](ctx)
        try:
            batch = next(proposals)
            while True:
                batches.append(len(batch))
                got = yield batch
                batch = proposals.send(got)
        except StopIteration:
            return

    if strategy == "auto":
        pytest.skip("auto's extras (Zorse's, Espresso's, Atlas's plans, the tuning) run by name")
    res = search(pb, strategy=counted, objective="max-throughput")
    assert res.stats.strategy == "counted"
    assert res.ranked[0].spec == _result("two-types", strategy, "max-throughput").ranked[0].spec
    assert batches
