"""auto's branch and bound cuts (shape, degree) pairs by lower bounds on iteration time and
cost: on small problems, no plan of the exhaustive space beats the bound of its pair (a shape's
options are each stage's GPU types at every TP that fits with one microbatch in flight per later
stage; plans with other replicas are not the shape's)."""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from functools import cache

import numpy as np
import pytest
from tests.test_planners import SMALL_PROBLEMS, problem, small_problem

from shoal.errors import InfeasibleError
from shoal.estimate.api import run_specs, tables_for
from shoal.specs.job import Constraints, Deadline
from shoal.training.planners import sailor, search
from shoal.training.planners.allocate import Allocation, tradeoffs
from shoal.training.planners.auto import PACKINGS, Bounds, Shape, Worth
from shoal.training.planners.build import Form, build_spec
from shoal.training.planners.space import Kind, Space, mbs_options

CASES = [*SMALL_PROBLEMS[1:],
         # more replicas than the fast GPUs can hold at their largest TP: the counts bind
         ({"us-central1-a": (2, 6)}, 3, 1024, 16, 2),
         ({"us-central1-a": (2, 2), "us-central1-b": (0, 2)}, 2, 1024, 8, 2)]


def _shape_plans(space: Space, res):
    """The exhaustive plans that are plans of one of ``auto``'s shapes (one data-parallel degree
    for every stage, every replica among the shape's options, at most two options a stage, as
    the allocation program mixes, all in one region): (plan, shape, degree)."""
    shapes: dict = {}
    region = space.problem.zone_region
    for c in res.ranked:
        mbs, _, recompute, _, stages = c.spec
        split = tuple((a, b) for a, b, _ in stages)
        D = len(stages[0][2])
        if any(len(reps) != D or len({(g, tp) for g, tp, _, _ in reps}) > 2
               or len({region[z] for _, _, z, _ in reps}) > 1 for _, _, reps in stages):
            continue
        if (mbs, recompute, split) not in shapes:
            opts = sailor.stage_options(space, split, mbs, recompute, 0, 1, all_tp=True)
            shapes[(mbs, recompute, split)] = opts and Shape(
                recompute, mbs, split, tuple(tuple(o) for o in opts), rebalance=False)
        sh = shapes[(mbs, recompute, split)]
        if not sh or any(
                (space.kinds.index(Kind(g, region[z])), tp) not in {(o.kind, o.tp) for o in st}
                for (_, _, reps), st in zip(stages, sh.opts, strict=True) for g, tp, z, _ in reps):
            continue  # a replica outside the shape's options (they count every microbatch in flight)
        yield c, sh, D


@pytest.mark.parametrize("case", range(len(CASES)))
def test_no_plan_beats_its_bound(case):
    """Neither the pair's bound nor its refined bound (``Bounds.refined``)."""
    pb, res = _exhaustive(case)
    assert len(res.ranked) > 10
    space = Space(pb, tables_for(pb, mbs_options(pb)))
    pool = sailor.arrays(space)
    bounds = Bounds(space, pool)
    checked, tighter = 0, 0
    cut: dict = {}
    for c, sh, D in _shape_plans(space, res):
        if (sh, D) not in cut:
            total = pb.job.global_batch // sh.mbs
            T, C, _, _ = bounds(sh, np.array([D]), total)
            cut[(sh, D)] = ((T[0], C[0]), bounds.refined(sh, D, total))
            # the refined cost over the refined time at every stage's cheapest replica
            t_ref, c_ref = cut[(sh, D)][1]
            cheapest = sum(min(bounds.price_s[o.kind] * o.tp for o in st) for st in sh.opts)
            tighter += c_ref > t_ref * D * cheapest * (1 + 1e-6)
        for T, C in cut[(sh, D)]:
            assert c.iteration_time_s * (1 + 1e-9) >= T, (c.spec, T, c.iteration_time_s)
            assert c.cost_usd * (1 + 1e-9) >= C, (c.spec, C, c.cost_usd)
        checked += 1
    assert checked > 10
    assert tighter > 0


def _two_regions():
    """Two regions, each with A100s and V100s, a slow link between them."""
    gpus = ("A100-40GB", "V100-16GB")
    return problem(
        model={"name": "rand", "num_layers": 3, "hidden_size": 1024, "num_heads": 16,
               "vocab_size": 32000, "max_seq_len": 2048},
        job={"global_batch": 8, "seq_len": 2048, "schedule": ["1f1b"], "zero_stage": [0]},
        pool__regions={"us-central1": {"zones": {"us-central1-a": {"gpus": dict(zip(gpus, (2, 1)))}}},
                       "us-west1": {"zones": {"us-west1-b": {"gpus": dict(zip(gpus, (1, 2)))}}}},
        pool__gpus_per_node={"A100-40GB": 2, "V100-16GB": 2},
        network__defaults={"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                           "same_region": {"bandwidth": "25Gbps", "latency": "1ms"},
                           "cross_region": {"bandwidth": "1Gbps", "latency": "30ms"}})


@cache
def _exhaustive(case: int):
    pb = small_problem(*CASES[case]) if case < len(CASES) else _two_regions()
    return pb, search(pb, strategy="exhaustive", top_k=10 ** 7)


def test_no_plan_across_regions_beats_its_refined_bound():
    """On a pool of two regions, plans whose stages sit in different regions send across
    them between two stages on every pipeline: ``Bounds.refined`` counts it (the least level
    over the plans in one region and, per pair of stages, those crossing between them). No
    plan of the exhaustive space beats it, and it is above the bound that ignores it for
    some pairs."""
    pb, res = _exhaustive(len(CASES))
    space = Space(pb, tables_for(pb, mbs_options(pb)))
    pool = sailor.arrays(space)
    bounds = Bounds(space, pool)
    plain = Bounds(space, pool)
    plain.cross = None  # the same bound without the sends across regions
    checked, crossing, above = 0, 0, set()
    for c, sh, D in _shape_plans(space, res):
        total = pb.job.global_batch // sh.mbs
        T, C = bounds.refined(sh, D, total)
        assert c.iteration_time_s * (1 + 1e-9) >= T, (c.spec, T, c.iteration_time_s)
        assert c.cost_usd * (1 + 1e-9) >= C, (c.spec, C, c.cost_usd)
        checked += 1
        crossing += len({pb.zone_region[st[2][0][2]] for st in c.spec.stages}) > 1
        if plain.refined(sh, D, total)[0] * (1 + 1e-6) < T:
            above.add((sh, D))
    assert checked > 10 and crossing > 5
    assert above


@pytest.mark.parametrize("case", range(len(CASES) + 1))
def test_the_level_program_starts_under_its_least_level(case):
    """The allocation program over the options' levels (``Bounds.option_levels``) starts
    from ``Bounds.refined_level``'s third value: it is at most the program's least level, so
    the program returns the allocation of least level it returns from no bound, also on a
    pool of two regions (the last case), whose refined time counts sends across them that the
    levels do not."""
    pb, res = _exhaustive(case)
    space = Space(pb, tables_for(pb, mbs_options(pb)))
    pool = sailor.arrays(space)
    bounds = Bounds(space, pool)
    checked = above = 0
    for sh, D in dict.fromkeys((sh, D) for _, sh, D in _shape_plans(space, res)):
        total = pb.job.global_batch // sh.mbs
        t, _, start = bounds.refined_level(sh, D, total)
        levels = bounds.option_levels(sh, D, total)
        free = tradeoffs(levels, D, pool, levels=1)
        if not free:
            continue
        assert start <= free[0].bottleneck_s * (1 + 1e-12)
        got = tradeoffs(levels, D, pool, levels=1, at_least=start)
        assert got[0].per_stage == free[0].per_stage
        assert got[0].bottleneck_s == free[0].bottleneck_s
        above += t - pb.timing.step_overhead_s > free[0].bottleneck_s * (1 + 1e-9)
        checked += 1
    assert checked > 5
    assert (above > 0) == (case == len(CASES))  # only the sends across regions raise it


@pytest.mark.parametrize("case", range(len(CASES) + 1))
def test_no_plan_of_an_allocation_beats_its_floors(case):
    """The search skips allocations (and programs) whose floors cannot beat the incumbent:
    every plan ``build_spec`` makes of an allocation of the exhaustive space, in every zone
    packing, takes at least the allocation's floor and the floor of its options' largest level
    (``Bounds.option_levels``, ``Worth.beyond_level``), in time and in cost, and the floor it
    gets as a re-split's
    allocation, which counts each stage's least sync and update on its layers (the last case:
    two regions, where the allocations whose stages are in both send across them), and a ring
    between two zones where a stage holds more replicas of an option than one zone does."""
    pb, res = _exhaustive(case)
    tb = tables_for(pb, mbs_options(pb))
    space = Space(pb, tb)
    pool = sailor.arrays(space)
    bounds = Bounds(space, pool)
    allocs: dict = {}
    for c, sh, D in _shape_plans(space, res):
        per_stage = tuple(
            tuple((k, tp, n) for (k, tp), n in sorted(Counter(
                (space.kinds.index(Kind(g, pb.zone_region[z])), tp)
                for g, tp, z, _ in reps).items()))
            for _, _, reps in c.spec.stages)
        allocs[(sh, D, per_stage)] = None
    floors, specs = [], []  # per allocation: its two floors and the range of its plans
    worths: dict = {}
    tighter = 0  # allocations whose floor the sends across regions raise
    synced = 0  # allocations whose floor as a re-split's the stages' sync and update raise
    near = Bounds(space, pool)  # as if every kind's zone held all its GPUs
    near._most_in_a_zone = lambda k, tp: 10 ** 9
    apart = 0  # allocations whose floor a ring between two zones of one kind raises
    for sh, D, per_stage in allocs:
        opts = [list(o) for o in sh.opts]
        total = pb.job.global_batch // sh.mbs
        if (sh, D) not in worths:
            after = bounds(sh, np.array([D]), total)[3][0]
            worths[(sh, D)] = Worth("max-throughput", np.inf, np.inf, float(after),
                                    pb.timing.step_overhead_s, pool.price, bounds.option_times(sh),
                                    tails=functools.partial(bounds.tails, D=D),
                                    crossed=functools.partial(bounds.crossed_times, sh),
                                    split=sh.split, times_of=bounds.option_times)
        worth = worths[(sh, D)]
        a = Allocation(per_stage, (0,) * len(pool.avail), 0.0)
        built = [sp for pk in PACKINGS
                 if (sp := build_spec(space, a, opts, Form(sh.split, sh.mbs, sh.recompute), D,
                                      packing=pk)) is not None]
        if not built:
            continue
        # the largest level of its options, as the variants' floor counts it
        levels = bounds.option_levels(sh, D, total)
        level = max(o.time_s for mix, st in zip(per_stage, levels, strict=True) for o in st
                    if any((o.kind, o.tp) == (k, tp) for k, tp, _ in mix))
        t_level = level + pb.timing.step_overhead_s
        level_floor = (t_level, t_level * D * worth.shape.rate_usd_s)
        floors.append((per_stage, worth.plan_floor(a, D, total), level_floor,
                       worth.plan_floor(a, D, total, other=sh),
                       slice(len(specs), len(specs) + len(built))))
        specs += built
        plain = dataclasses.replace(worth, crossed=None).plan_floor(a, D, total)
        tighter += floors[-1][1][0] > plain[0] * (1 + 1e-6)
        bare = dataclasses.replace(worth, tails=None).plan_floor(a, D, total, other=sh)
        synced += floors[-1][3][0] > bare[0] * (1 + 1e-6)
        one_zone = dataclasses.replace(worth, tails=functools.partial(near.tails, D=D))
        apart += floors[-1][1][0] > one_zone.plan_floor(a, D, total)[0] * (1 + 1e-6)
    out = run_specs(pb, tb, specs)
    T, usd = out["iteration_time_s"], out["cost_compute_usd"] + out["cost_egress_usd"]
    for per_stage, plan, program, split_floor, at in floors:
        for floor_t, floor_usd in (plan, program, split_floor):
            assert (floor_t <= T[at] * (1 + 1e-9)).all(), (per_stage, floor_t, T[at])
            assert (floor_usd <= usd[at] * (1 + 1e-9)).all(), (per_stage, floor_usd, usd[at])
    assert len(floors) > 10
    assert (tighter > 10) == (case == len(CASES))
    assert synced > 0
    # where a kind's GPUs are in more than one zone, some allocations hold more replicas of
    # one option than a zone does: their rings cross zones
    assert (apart > 0) == any(len(zs) > 1 for zs in space.zones_of.values())


@pytest.mark.parametrize("objective", ["max-throughput", "min-cost", "max-throughput-per-dollar"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_floors_keep_the_best_plan_and_the_front(case, objective, monkeypatch):
    """Skipping allocations by their floors leaves the best plan and the throughput-cost front
    of a search as they are with every allocation built."""
    pb = small_problem(*CASES[case])

    def outcome():
        res = search(pb, objective=objective, top_k=1)
        return (res.ranked[0].spec,
                [(c.iteration_time_s, c.cost_usd) for c in res.pareto], res.stats.candidates_costed)

    best, front, costed = outcome()
    monkeypatch.setattr(Worth, "__call__", lambda self, *a, **k: True)
    monkeypatch.setattr(Worth, "beyond_level", lambda self, *a, **k: False)
    best_all, front_all, costed_all = outcome()
    assert (best, front) == (best_all, front_all)
    # (an allocation skipped may leave the program a variant to build that the full run
    # did not need: a few more plans at most)
    assert costed <= costed_all * 1.1


@pytest.mark.parametrize("case", range(len(CASES)))
def test_constraints_cut_only_plans_that_break_them(case, monkeypatch):
    """Under a constraint (least iterations/s, a deadline, most USD/iteration), pairs and
    allocations whose floors break it are not built: the best plan and the front (or the error
    naming the binding constraint) are those found when they are, and fewer plans are
    costed."""
    pb = small_problem(*CASES[case])
    free = search(pb, objective="max-throughput", top_k=1).ranked[0]
    slo = Deadline(iterations=100, within=100 * free.iteration_time_s / 0.9)
    cut = 0
    for objective, cons in (("min-cost", Constraints(min_iters_per_s=0.9 / free.iteration_time_s)),
                            ("min-cost", Constraints(deadline=slo)),
                            ("max-throughput", Constraints(max_cost_per_iteration_usd=free.cost_usd
                                                           * 0.8))):
        def outcome(objective=objective, cons=cons):
            try:
                res = search(pb, objective=objective, constraints=cons, top_k=1)
            except InfeasibleError as e:
                return str(e), [], 0
            return (res.ranked[0].spec, [(c.iteration_time_s, c.cost_usd) for c in res.pareto],
                    res.stats.candidates_costed)

        best, front, costed = outcome()
        with monkeypatch.context() as m:
            m.setattr(Worth, "_beyond_limits", lambda self, t, usd: False)
            best_all, front_all, costed_all = outcome()
        assert (best, front) == (best_all, front_all)
        assert costed <= costed_all
        if objective == "min-cost":
            cut += costed < costed_all  # the slow plans' pairs and allocations are cut
    assert cut  # by one of the two floors at least
