"""Zorse strategy: SPLIT partitions the nodes for every k, cuts slow links first, and the plans
it builds are valid asymmetric plans with shares by speed."""

from __future__ import annotations

import copy

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from shoal.estimate import estimate
from shoal.estimate.api import run_kernel, run_specs
from shoal.estimate.encode import encode_specs
from shoal.estimate.validate import validate_plan
from shoal.problem import build_problem
from shoal.specs.scenario import parse_scenario
from shoal.training.planners import search
from shoal.training.planners.common import Evaluator, SearchStats
from shoal.training.planners.space import Space, mbs_options
from shoal.training.planners.strategy import Context, drive
from shoal.training.planners.zorse import _with_ministages, build, floors, min_cut, nodes, split

BASE = {
    "model": {"name": "m", "num_layers": 8, "hidden_size": 1024, "num_heads": 16,
              "vocab_size": 32000, "max_seq_len": 2048},
    "job": {"global_batch": 32, "seq_len": 1024, "recompute": [True], "zero_stage": [0, 1, 2]},
    "pool": {"regions": {
        "east": {"zones": {"east-a": {"gpus": {"A100-40GB": 4, "T4": 8}}}},
        "west": {"zones": {"west-a": {"gpus": {"V100-16GB": 4, "T4": 4}}}}},
        "gpus_per_node": {"A100-40GB": 4, "T4": 4, "V100-16GB": 4}},
    "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "50us"},
                             "cross_region": {"bandwidth": "5Gbps", "latency": "20ms"}}},
    "prices": {"gpu_usd_per_h": {"T4": 0.35}},
}


@pytest.fixture(scope="module")
def setup():
    pb = build_problem(parse_scenario(copy.deepcopy(BASE), file="z.yaml"), file="z.yaml")
    mbs = mbs_options(pb)
    ev = Evaluator(pb, mbs, pb.constraints, SearchStats("z"), "max-throughput")
    space = Space(pb, ev.tb)
    return pb, space, nodes(space)


def test_split_partitions_every_k_and_cuts_the_wan_first(setup):
    pb, space, verts = setup
    assert sum(n for _, _, n in verts) == 20 and len(verts) == 5
    parts = split(space, verts)
    assert sorted(parts) == list(range(1, len(verts) + 1))
    for k, groups in parts.items():
        assert len(groups) == k
        flat = sorted(v for g in groups for v in g)
        assert flat == list(range(len(verts)))  # every node in exactly one group
    region = {i: pb.zone_region[z] for i, (_, z, _) in enumerate(verts)}
    two = parts[2]
    assert all(len({region[v] for v in g}) == 1 for g in two)  # the slow link is cut first


def test_plans_are_valid_with_shares_by_speed(setup):
    pb, space, verts = setup
    total = pb.job.global_batch
    for k, groups in split(space, verts).items():
        sp = build(space, verts, groups, 1, True, 2, "1f1b")
        assert sp is not None
        from shoal.training.planners.common import to_plan

        plan = to_plan(sp)
        validate_plan(pb, plan)
        assert len(plan.stages) == k
        for st in plan.stages:
            assert sum(r.microbatches for r in st.replicas) == total
            by_gpu = {}
            for r in st.replicas:
                by_gpu.setdefault(r.gpu, set()).add(r.microbatches)
            if {"A100-40GB", "T4"} <= set(by_gpu):
                assert min(by_gpu["A100-40GB"]) >= max(by_gpu["T4"])  # faster GPU, more work
        assert estimate(pb, plan).iteration_time_s > 0


def test_zorse_and_auto_return_fitting_plans(setup):
    pb, _, _ = setup
    z = search(pb, strategy="zorse", top_k=3)
    a = search(pb, strategy="auto", top_k=1)
    for c in z.ranked:
        e = estimate(pb, c.plan)
        assert not e.oom
        assert e.iteration_time_s == pytest.approx(c.iteration_time_s, rel=1e-9)
    # auto costs zorse's plans too, so it is never slower
    assert a.ranked[0].iteration_time_s <= z.ranked[0].iteration_time_s * (1 + 1e-9)


def test_no_plan_is_faster_than_its_floor(setup):
    """The search skips plans whose floor cannot beat the best so far: every plan it builds,
    under every schedule and ZeRO stage, takes at least its floor."""
    pb, space, verts = setup
    specs = []
    for groups in split(space, verts).values():
        for schedule in ("1f1b", "gpipe", "zorse"):
            for zero in (0, 2) if schedule != "zorse" else (2,):  # as the search builds them
                sp = build(space, verts, groups, 1, True, zero, schedule)
                if sp is not None:
                    specs += _with_ministages(sp) if schedule == "zorse" else [sp]
    out = run_kernel(pb, space.tb, encode_specs(space.tb, specs), detail=True)
    low = floors(pb, specs, out)
    T = run_specs(pb, space.tb, specs)["iteration_time_s"]
    assert len(specs) > 10 and (low <= T * (1 + 1e-9)).all(), (low, T)


@settings(max_examples=60, deadline=None)
@given(n=hst.integers(2, 12), seed=hst.integers(0, 2 ** 31 - 1))
def test_min_cut_is_the_minimum_cut(n, seed):
    """The dense Stoer-Wagner gives networkx's cut weight, and its side has that weight."""
    rng = np.random.default_rng(seed)
    W = np.triu(rng.choice([0.0, 1.0, 2.0, 3.5, 10.0], size=(n, n)), 1)
    W = W + W.T
    g = nx.Graph()
    g.add_nodes_from(range(n))
    g.add_weighted_edges_from((i, j, W[i, j]) for i in range(n) for j in range(i + 1, n))
    value, _ = nx.stoer_wagner(g)
    got, side = min_cut(W)
    other = [i for i in range(n) if i not in side]
    assert got == pytest.approx(value, abs=1e-9)
    assert 0 < len(side) < n
    assert W[np.ix_(side, other)].sum() == pytest.approx(got, abs=1e-9)


def test_a_spent_budget_stops_the_pass_before_it_builds_plans(setup, monkeypatch):
    """Past the deadline the pass builds and costs nothing and marks the search truncated;
    with time left it costs plans."""
    from shoal.training.planners import zorse

    pb, _, _ = setup
    mbs = mbs_options(pb)
    built = []
    real = zorse.build
    monkeypatch.setattr(zorse, "build", lambda *a, **k: built.append(1) or real(*a, **k))
    for spent in (True, False):
        built.clear()
        ev = Evaluator(pb, mbs, pb.constraints, SearchStats("z"), "max-throughput")
        ev.deadline = -1.0 if spent else None
        drive(ev.cost, zorse.propose(Context(ev, Space(pb, ev.tb), "max-throughput", tuple(mbs))))
        assert ev.stats.truncated == spent
        assert (not built and ev.stats.candidates_costed == 0) if spent else built


def test_no_replica_is_left_without_microbatches():
    """A batch smaller than Zorse's groups: shares by speed leave some replicas none; those are
    left out of the plan (before, 31 of 32 GPUs were rented for nothing)."""
    import yaml

    doc = yaml.safe_load("""
model: {name: one, num_layers: 1, hidden_size: 64, num_heads: 2, vocab_size: 100, max_seq_len: 128}
job: {global_batch: 1, seq_len: 128}
pool: {regions: {r1: {zones: {z1: {gpus: {A100-40GB: 8, V100-16GB: 8}}, z2: {gpus: {T4: 16}}}}}}
network: {defaults: {same_zone: {bandwidth: 32Gbps, latency: 20us},
                     same_region: {bandwidth: 16Gbps, latency: 1ms}}}
""")
    pb = build_problem(parse_scenario(doc))
    res = search(pb, strategy="zorse", objective="max-throughput")
    for c in [*res.ranked, *res.pareto]:
        assert all(r.microbatches > 0 for st in c.plan.stages for r in st.replicas)
        assert c.num_gpus == sum(r.tp for st in c.plan.stages for r in st.replicas)


def test_a_quota_caps_the_nodes_zorse_plans_on():
    """A quota of 6 T4s over the 12 of the pool: zorse plans on 6 of them (those of the first
    region's zone, a full node and half of the next), and its plans keep to the quota."""
    data = copy.deepcopy(BASE)
    data["pool"]["quotas"] = {"T4": 6}
    pb = build_problem(parse_scenario(data, file="z.yaml"), file="z.yaml")
    ev = Evaluator(pb, mbs_options(pb), pb.constraints, SearchStats("z"), "max-throughput")
    t4 = [(z, n) for g, z, n in nodes(Space(pb, ev.tb)) if g == "T4"]
    assert sum(n for _, n in t4) == 6 and sorted(t4) == [("east-a", 2), ("east-a", 4)]
    res = search(pb, strategy="zorse", top_k=3)
    assert res.ranked
    for c in res.ranked:
        validate_plan(pb, c.plan)  # within the pool and its quotas
        assert sum(n for (g, _), n in c.plan.gpu_counts().items() if g == "T4") <= 6


def test_a_pool_of_more_nodes_than_zorse_takes_is_refused_by_name(monkeypatch):
    """SPLIT's cuts grow as the cube of the node count: past ``MAX_NODES`` nodes the `zorse`
    strategy says so (InfeasibleError naming the pool and `--strategy auto`), and `auto` goes
    on without Zorse's plans instead of running out of memory."""
    import shoal.training.planners.zorse as zorse
    from shoal.errors import InfeasibleError

    pb = build_problem(parse_scenario(copy.deepcopy(BASE), file="z.yaml"), file="z.yaml")
    monkeypatch.setattr(zorse, "MAX_NODES", 4)  # the pool has 5 nodes
    with pytest.raises(InfeasibleError, match="5 nodes.*at most 4") as e:
        search(pb, strategy="zorse")
    assert e.value.binding == "pool" and "--strategy auto" in e.value.relaxation
    called = []
    split = zorse.split
    monkeypatch.setattr(zorse, "split", lambda *a, **k: called.append(1) or split(*a, **k))
    monkeypatch.setattr(zorse, "MAX_NODES", 5)  # the pool: Zorse's grouping runs
    assert search(pb, strategy="auto").ranked and called
    called.clear()
    monkeypatch.setattr(zorse, "MAX_NODES", 4)
    assert search(pb, strategy="auto").ranked and not called
