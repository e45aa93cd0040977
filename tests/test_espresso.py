"""Espresso strategy: cheapest plan under a training-time SLO; its bounds are bounds, its split
is the best for an order, its plans are valid, and it stays near the exhaustive minimum."""

from __future__ import annotations

import copy
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from shoal.estimate import estimate
from shoal.estimate.api import run_kernel
from shoal.estimate.encode import encode_specs
from shoal.estimate.validate import validate_plan
from shoal.problem import build_problem
from shoal.specs.job import Constraints, Deadline
from shoal.specs.scenario import parse_scenario
from shoal.training.planners import search
from shoal.training.planners.common import Evaluator, SearchStats
from shoal.training.planners.espresso import _Tree
from shoal.training.planners.exhaustive import compositions
from shoal.training.planners.space import Space, mbs_options

BASE = {
    "model": {"name": "small", "num_layers": 6, "hidden_size": 1024, "num_heads": 16,
              "vocab_size": 32000, "max_seq_len": 2048},
    "job": {"global_batch": 8, "seq_len": 2048, "schedule": ["1f1b"], "zero_stage": [0]},
    "pool": {"regions": {"r": {"zones": {"r-a": {"gpus": {"A100-40GB": 2, "V100-16GB": 3}}}}},
             "gpus_per_node": {"A100-40GB": 1, "V100-16GB": 1}},
    "network": {"defaults": {"same_zone": {"bandwidth": "10Gbps", "latency": "50us"}}},
    "prices": {"gpu_usd_per_h": {"A100-40GB": 3.67, "V100-16GB": 2.48}},
}


def problem(**changes):
    data = copy.deepcopy(BASE)
    data.update(changes)
    return build_problem(parse_scenario(data, file="espresso.yaml"), file="espresso.yaml")


def tree_for(pb, mbs=1, d=1, k=3, recompute=False):
    mbs_values = mbs_options(pb)
    ev = Evaluator(pb, mbs_values, pb.constraints, SearchStats("t"), "min-cost")
    space = Space(pb, ev.tb)
    return ev, space, _Tree(space, mbs, recompute, 0, d, k)


def deadline_for(pb, slack: float) -> Constraints:
    """An SLO of 100 iterations at ``slack`` x the fastest plan's iteration time."""
    fast = search(pb, strategy="exhaustive", objective="max-throughput").ranked[0]
    return Constraints(deadline=Deadline(iterations=100, within=100 * fast.iteration_time_s * slack))


# (pool per GPU type, blocks, hidden, SLO slack over the fastest plan)
CASES = [
    ({"A100-40GB": 2, "V100-16GB": 3}, 6, 1024, 1.3),
    ({"A100-40GB": 2, "V100-16GB": 3}, 6, 1024, 2.0),
    ({"A100-40GB": 1, "V100-16GB": 4}, 4, 2048, 1.5),
    ({"A100-40GB": 3, "V100-16GB": 2}, 5, 1024, 1.2),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_espresso_within_4_5_percent_of_exhaustive(case):
    gpus, blocks, hidden, slack = CASES[case]
    pb = problem(model={"name": "m", "num_layers": blocks, "hidden_size": hidden,
                        "num_heads": hidden // 64, "vocab_size": 32000, "max_seq_len": 2048},
                 pool={"regions": {"r": {"zones": {"r-a": {"gpus": gpus}}}},
                       "gpus_per_node": {g: 1 for g in gpus}})
    cons = deadline_for(pb, slack)
    ex = search(pb, strategy="exhaustive", objective="min-cost", constraints=cons).ranked[0]
    es = search(pb, strategy="espresso", objective="min-cost", constraints=cons)
    best = es.ranked[0]
    assert best.cost_usd >= ex.cost_usd * (1 - 1e-9)  # exhaustive's space holds Espresso's
    assert best.cost_usd <= ex.cost_usd * 1.045
    for c in es.ranked:  # every returned plan is valid, fits, meets the SLO, one GPU type per stage
        validate_plan(pb, c.plan)
        e = estimate(pb, c.plan)
        assert not e.oom
        assert 100 * e.iteration_time_s <= cons.deadline.within * (1 + 1e-9)
        for st in c.plan.stages:
            assert len({(r.gpu, r.tp) for r in st.replicas}) == 1


def test_time_bound_is_below_every_placed_plan():
    """``t_lower`` is a lower bound of the estimator's iteration time (what makes CP and TCP
    safe): checked on every plan the placer builds for every allocation of several trees."""
    pb = problem()
    checked = 0
    for d, k, rc in [(1, 3, False), (1, 4, True), (2, 2, False), (1, 1, False)]:
        ev, space, tree = tree_for(pb, d=d, k=k, recompute=rc)
        U = len(tree.units)
        for alloc in itertools.product(range(k + 1), repeat=U):
            if sum(alloc) != k:
                continue
            specs = [s for s in tree.place(alloc) if s is not None]
            if not specs:
                continue
            out = run_kernel(pb, ev.tb, encode_specs(ev.tb, specs))
            rate = sum(n * u.rate for u, n in zip(tree.units, alloc, strict=True))
            bound = tree.t_lower(rate)
            assert np.all(out["iteration_time_s"] >= bound * (1 - 1e-9))
            checked += len(specs)
    assert checked > 20


def test_balanced_split_is_the_best_split_of_its_order():
    pb = problem()
    ev, space, tree = tree_for(pb, k=3)
    a100 = next(u for u in tree.units if u.gpu == "A100-40GB")
    v100 = next(u for u in tree.units if u.gpu == "V100-16GB")
    cums = {u: space.tb.cum_step(u.gpu, u.tp, 1, False) * pb.timing.compute_scale
            for u in (a100, v100)}
    for order in [(v100, a100, v100), (a100, v100, v100), (v100, v100, a100)]:
        got = tree.balanced(order)
        assert got is not None and sum(n for _, n, _ in got) == pb.n_layers
        hand = [(tree.handoff(order[s - 1], u) if s else 0.0)
                + (tree.handoff(u, order[s + 1]) if s < 2 else 0.0) for s, u in enumerate(order)]

        def bottleneck(split, order=order, hand=hand):
            return max(cums[u][b] - cums[u][a] + h
                       for (a, b), u, h in zip(split, order, hand, strict=True))

        def fits(split, order=order):
            return all(b - a <= tree.max_layers(u, s, a)
                       for s, ((a, b), u) in enumerate(zip(split, order, strict=True)))

        edges = np.cumsum([0] + [n for _, n, _ in got])
        mine = bottleneck(list(zip(edges[:-1], edges[1:], strict=True)))
        best = min(bottleneck(sp) for sp in compositions(pb.n_layers, 3) if fits(sp))
        assert mine == pytest.approx(best, rel=1e-12)


def test_slo_that_nothing_meets_names_the_deadline():
    from shoal.errors import InfeasibleError

    pb = problem()
    with pytest.raises(InfeasibleError) as e:
        search(pb, strategy="espresso", objective="min-cost",
               constraints=Constraints(deadline=Deadline(iterations=100, within=1e-3)))
    assert e.value.binding == "deadline"


def test_example_scenario_finds_a_plan_within_its_slo():
    from pathlib import Path

    from shoal.problem import load_problem

    pb = load_problem(Path(__file__).resolve().parents[1] / "examples" / "espresso-llama-1.3b.yaml")
    res = search(pb, strategy="espresso")
    best = res.ranked[0]
    dl = pb.constraints.deadline
    assert dl.iterations * best.iteration_time_s <= dl.within
    # the 10 s goal is measured alone by benchmarks/strategies.py; here tests share the cores
    assert res.stats.search_time_s < 40


def test_plan_completes_the_front_of_espresso_with_its_cost_search_only():
    """`shoal plan --strategy espresso`: the front is completed by Espresso's min-cost search
    alone (its walk is not bounded under the other objectives, which ran to the time budget)."""
    from typer.testing import CliRunner

    from shoal.cli import app

    example = Path(__file__).resolve().parents[1] / "examples" / "espresso-llama-1.3b.yaml"
    r = CliRunner().invoke(app, ["plan", str(example), "--strategy", "espresso", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert not doc["stats"]["truncated"]
    assert doc["plans"][0]["slo_total"]["time_s"] <= 3600


def test_a_pipeline_stays_in_a_zone_that_holds_it(tmp_path):
    """Two zones, z1 with 4 A30 and z2 with 4 A30 and 4 RTX-3090, slower between zones: the
    stages of a pipeline follow each other's zone. Placing each stage in the zone with most free
    GPUs alternated z1/z2, every hand-off crossed, and no plan met the hour."""
    import yaml

    from shoal.problem import load_problem
    from shoal.training.planners import search

    example = Path(__file__).resolve().parents[1] / "examples" / "espresso-llama-1.3b.yaml"
    doc = yaml.safe_load(example.read_text())
    doc["pool"]["regions"] = {"r1": {"zones": {"z1": {"gpus": {"A30": 4}},
                                               "z2": {"gpus": {"A30": 4, "RTX-3090": 4}}}}}
    doc["network"]["defaults"]["same_region"] = {"bandwidth": "1Gbps", "latency": "1ms"}
    doc["network"]["egress_usd_per_gb"] = {"same_zone": 0, "same_region": 0.01}
    path = tmp_path / "two-zones.yaml"
    path.write_text(yaml.safe_dump(doc))
    pb = load_problem(path)
    res = search(pb, strategy="espresso", constraints=pb.constraints)
    best = res.ranked[0]
    assert best.iteration_time_s * 100 <= 3600
    zones = [{r.zone for r in st.replicas} for st in best.plan.stages]
    assert all(z == zones[0] for z in zones), zones
