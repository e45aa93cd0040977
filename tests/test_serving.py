"""Serving placement: specs, flow model, placers (auto, Helix's MILP, baselines), Helix interop."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from shoal.cli import app
from shoal.errors import InfeasibleError, SpecError
from shoal.serving.cluster import build_cluster
from shoal.serving.flow import max_flow, valid
from shoal.serving.placement import Placement, placement_from_json
from shoal.serving.placers import baselines, milp, place, stages
from shoal.specs.serving import Batch, WakeSpec, parse_serving

runner = CliRunner()


def spec(nodes, machines=None, layers=6, links=None, partial=False, **kw):
    return {"model": {"layers": layers, "activation_bytes": 100, "token_bytes": 2},
            "machines": machines or {
                "big": {"max_layers": 4, "tokens_per_s": [400, 190, 120, 80]},
                "small": {"max_layers": 2, "tokens_per_s": [150, 60]}},
            "nodes": nodes, "links": links or {"within": {"bandwidth": 1e9}},
            "partial_inference": partial, **kw}


def cluster(*a, **kw):
    return build_cluster(parse_serving(spec(*a, **kw)))


def brute_force(c):
    """The best max flow over every placement (each node: nothing or any range it may hold)."""
    opts = [[None] + [(s, s + k) for k in range(1, int(c.kmax[i]) + 1)
                      for s in range(c.layers - k + 1)] for i in range(c.n)]
    best = 0.0
    for combo in itertools.product(*opts):
        best = max(best, max_flow(c, Placement(combo)).value)
    return best


def test_flow_of_a_hand_computed_placement():
    # big-0 [0,3) 120 and the chain small-0 [0,2) 60 -> small-1 [2,3) 150 both feed
    # big-1 [3,6), which passes at most 120
    c = cluster([{"machine": "big", "count": 2}, {"machine": "small", "count": 2}])
    pl = Placement(((0, 3), (3, 6), (0, 2), (2, 3)))
    f = max_flow(c, pl)
    # into [3,6): from big-0 (120) and small-1 (min(150, 60 from small-0)); out cap 120
    assert f.value == pytest.approx(120.0)
    assert f.through[1] == pytest.approx(120.0)
    # sum over nodes of max_k k T(k), over the layers
    assert c.upper_bound() == pytest.approx((400 * 2 + 150 * 2) / 6)


def test_links_limit_the_flow_and_coordinator_links():
    c = cluster([{"machine": "big", "name": "a"}, {"machine": "big", "name": "b"}],
                links={"mesh": False, "pairs": [
                    {"a": "a", "b": "b", "bandwidth": 51 * 102},  # 51 tokens/s of activations
                    {"a": "coordinator", "b": "a", "bandwidth": 1e9},
                    {"a": "coordinator", "b": "b", "bandwidth": 1e9}]})
    assert max_flow(c, Placement(((0, 3), (3, 6)))).value == pytest.approx(51.0)
    # no coordinator link to the first node: nothing flows
    c2 = cluster([{"machine": "big", "name": "a"}, {"machine": "big", "name": "b"}],
                 links={"mesh": False, "pairs": [{"a": "a", "b": "b", "bandwidth": 1e9},
                                                 {"a": "coordinator", "b": "b", "bandwidth": 1e9}]})
    assert max_flow(c2, Placement(((0, 3), (3, 6)))).value == 0.0


def test_validity_with_and_without_partial_inference():
    assert valid(False, (0, 3), (3, 5)) and not valid(False, (0, 3), (2, 5))
    assert valid(True, (0, 3), (2, 5)) and valid(True, (0, 3), (3, 5))
    assert not valid(True, (0, 3), (1, 3)) and not valid(True, (0, 3), (4, 6))


@pytest.mark.parametrize("partial", [False, True])
def test_milp_is_optimal_on_a_small_cluster_and_its_objective_is_the_max_flow(partial):
    c = cluster([{"machine": "big", "count": 2}, {"machine": "small", "count": 1}], layers=5,
                partial=partial)
    best = brute_force(c)
    pl, sol = milp.solve(c, time_limit_s=30, prune=0)
    assert sol.status == "Optimal"
    assert sol.objective == pytest.approx(best, rel=1e-6)
    # the returned layer ranges, costed independently, carry the MILP's objective
    assert max_flow(c, pl).value == pytest.approx(sol.objective, rel=1e-6)
    r = place(c, "auto", time_limit_s=5)
    assert r.flow.value <= best * (1 + 1e-9)
    assert r.flow.value >= 0.9 * best


def test_partial_inference_helps_where_ranges_overlap():
    # petals-style overlapping ranges serve only with partial inference
    pl = Placement(((0, 4), (2, 6)))
    no = cluster([{"machine": "big", "count": 2}])
    yes = cluster([{"machine": "big", "count": 2}], partial=True)
    assert max_flow(no, pl).value == 0.0
    assert max_flow(yes, pl).value == pytest.approx(80.0)


def test_milp_warm_start_is_kept_and_pruning_keeps_its_links():
    c = cluster([{"machine": "big", "count": 3}, {"machine": "small", "count": 4}], layers=8)
    start = baselines.swarm(c)
    v0 = max_flow(c, start).value
    assert v0 > 0
    w = milp.pruned(c, 1, start)
    assert max_flow(w, start).value == pytest.approx(v0)
    m, v = milp.build(w)
    x = milp.start_vector(w, m, v, start)
    for lo, hi, idx, val in m.rows:
        a = float(np.dot(x[idx], val))
        assert lo - 1e-6 <= a <= hi + 1e-6
    pl, sol = milp.solve(c, time_limit_s=5, start=start, prune=1)
    assert sol.objective >= v0 - 1e-6


def test_auto_beats_or_matches_every_baseline_on_random_clusters():
    rng = np.random.default_rng(3)
    for _ in range(4):
        counts = rng.integers(1, 5, size=2)
        nodes = [{"machine": "big", "count": int(counts[0])},
                 {"machine": "small", "count": int(counts[1])}]
        c = cluster(nodes, layers=int(rng.integers(4, 9)), partial=bool(rng.integers(2)))
        try:
            r = place(c, "auto", time_limit_s=3)
        except InfeasibleError:
            assert c.kmax.sum() < c.layers
            continue
        r.placement.check(c)
        for fn in (baselines.swarm, baselines.separate):
            pl = fn(c)
            if pl is not None:
                assert r.flow.value >= max_flow(c, pl).value - 1e-9
        # flows respect node capacities
        for i, rg in enumerate(r.placement.ranges):
            if rg is not None:
                assert r.flow.through[i] <= c.T[i, rg[1] - rg[0]] + 1e-6


def test_stage_program_respects_slow_links_between_regions():
    # two regions, each too small to hold the model alone; links between them carry 100/s
    machines = {"n": {"max_layers": 3, "tokens_per_s": [1000, 500, 300]}}
    c = cluster([{"machine": "n", "count": 3, "region": "r1", "name": "a"},
                 {"machine": "n", "count": 3, "region": "r2", "name": "b"}], machines=machines,
                layers=8, links={"within": {"bandwidth": 1e9},
                                 "between": {"bandwidth": 100 * 102}})
    pl = stages.staged(c, deadline=float("inf"))
    f = max_flow(c, pl).value
    assert f > 0
    # every path crosses once: at most (nodes before) x (nodes after) links of 100 tokens/s
    assert f <= 9 * 100 + 1e-6


def test_bad_inputs_name_the_item():
    with pytest.raises(InfeasibleError, match="fit on no combination"):
        place(cluster([{"machine": "small"}], layers=6), "auto")
    with pytest.raises(SpecError, match="unknown machine type") as e:
        cluster([{"machine": "huge"}])
    assert "nodes.0.machine" in str(e.value)
    with pytest.raises(SpecError, match="unknown node"):
        cluster([{"machine": "big", "name": "a"}],
                links={"pairs": [{"a": "a", "b": "zz", "bandwidth": 1e9}]})
    with pytest.raises(SpecError, match="tokens_per_s has 1 entries"):
        cluster([{"machine": "x"}], machines={"x": {"max_layers": 2, "tokens_per_s": [1.0]}})
    with pytest.raises(SpecError, match="unknown GPU") as e:
        build_cluster(parse_serving({"model": {"name": "LLaMA-2-70B"},
                                     "machines": {"x": {"gpu": "H9000"}},
                                     "nodes": [{"machine": "x"}]}))
    assert "machines.x.gpu" in str(e.value)
    c = cluster([{"machine": "big", "count": 2}])
    with pytest.raises(SpecError, match="more layers than the node may hold"):
        placement_from_json({"nodes": [{"name": "big-0", "layers": [0, 5]}]}, c)
    with pytest.raises(SpecError, match="unknown node"):
        placement_from_json({"nodes": [{"name": "nope", "layers": [0, 2]}]}, c)


def test_analytic_capacity_from_the_catalog():
    c = build_cluster(parse_serving({
        "model": {"name": "LLaMA-2-70B"},
        "machines": {"A100": {"gpu": "A100-40GB"}, "T4": {"gpu": "T4"}},
        "nodes": [{"machine": "A100"}, {"machine": "T4"}]}))
    a, t = c.kmax
    assert c.layers == 80 and a == 12 and t in (4, 5)  # Helix: 12 and 4 (weights <= half)
    # capacity falls with more layers; the A100 serves more than the T4
    assert np.all(np.diff(c.T[0, 1:a + 1]) < 0)
    assert c.T[0, 1] > c.T[1, 1]


# ----------------------------------------------------------------------------- Helix reference


SETTINGS = [("single24.ini", "llama-2-70b", "single24-llama2-70b/ilp.ini", 1289.56),
            ("3cluster24.ini", "llama-2-70b", "3cluster24-llama2-70b/ilp.ini", 1212.18),
            ("cluster42.ini", None, "cluster42-llama2-70b/ilp_unpruned.ini", 4892.24),
            ("cluster10.ini", None, "cluster10-llama1-30b/ilp.ini", 286.59)]


def helix_cluster(ref, cl, model, partial=False, profiles=None):
    from shoal.io.helix import import_helix

    h = ref / "helix"
    return build_cluster(parse_serving(import_helix(
        cluster=h / "clusters" / cl, machines=h / "clusters" / "machine_profiles.ini",
        capacity=h / "node_capacity.json", model=model, partial_inference=partial,
        profiles=profiles)))


def test_simulator_within_15pct_of_helix_simulator_on_single24(reference_dir):
    """Helix's single24 LLaMA-2-70B offline run on its MILP placement (its simulator's numbers:
    max-flow router 248.3 decode tokens/s, 3.09 s prompt latency, 1.46 s per decoded token;
    swarm 187.6 and random 189.8 decode tokens/s at 240 requests in flight), with Helix's
    router as its code runs it."""
    from shoal.io.helix import read_placement
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import load_lengths, offline

    h = reference_dir / "helix"
    c = helix_cluster(reference_dir, "single24.ini", "llama-2-70b",
                      profiles=h / "profiles" / "llama2_70b")
    assert c.batch[0].prompt_tokens in (2048, 6144)  # Helix's engine limits came with the import
    pl = read_placement(h / "placements" / "single24-llama2-70b" / "ilp.ini", c)
    fl = max_flow(c, pl)
    work = offline(load_lengths(h / "traces" / "azure_conv_lengths.csv"), seed=0)
    r = simulate(c, pl, fl, work, SimOptions(router="helix-iwrr", warmup_s=60.0, duration_s=600.0))
    for got, helix in ((r.decode_tokens_per_s, 248.3), (r.prompt_latency_s["mean"], 3.09),
                       (r.decode_latency_s["mean"], 1.46)):
        assert abs(got / helix - 1) <= 0.15
    for router, helix in (("swarm", 187.6), ("random", 189.8)):
        b = simulate(c, pl, fl, work, SimOptions(router=router, warmup_s=60.0, duration_s=600.0,
                     concurrency=240))
        assert abs(b.decode_tokens_per_s / helix - 1) <= 0.15
        assert b.decode_tokens_per_s < r.decode_tokens_per_s  # Helix's ranking


@pytest.mark.parametrize("cl,model,file,helix", SETTINGS, ids=[s[2].split("/")[0] for s in SETTINGS])
def test_helix_placements_recompute_to_its_numbers_and_auto_beats_them(reference_dir, cl, model,
                                                                       file, helix):
    from shoal.io.helix import read_placement

    c = helix_cluster(reference_dir, cl, model)
    pl = read_placement(reference_dir / "helix" / "placements" / file, c)
    assert max_flow(c, pl).value == pytest.approx(helix, abs=0.01)
    r = place(c, "auto", time_limit_s=20)
    assert r.flow.value >= helix - 0.01
    assert max_flow(c, r.placement).value == pytest.approx(r.flow.value)


def test_helix_petals_needs_partial_inference(reference_dir):
    from shoal.io.helix import read_placement

    f = reference_dir / "helix" / "placements" / "single24-llama2-70b" / "petals.ini"
    no = helix_cluster(reference_dir, "single24.ini", "llama-2-70b")
    yes = helix_cluster(reference_dir, "single24.ini", "llama-2-70b", partial=True)
    assert max_flow(no, read_placement(f, no)).value == pytest.approx(531.70, abs=0.01)
    assert max_flow(yes, read_placement(f, yes)).value == pytest.approx(952.11, abs=0.01)


def test_helix_import_errors(reference_dir, tmp_path):
    from shoal.io.helix import import_helix

    h = reference_dir / "helix"
    bad = tmp_path / "cluster10.ini"  # the capacity file's tables are per cluster file name
    bad.write_text((h / "clusters" / "cluster10.ini").read_text().replace("type=L4", "type=H100", 1))
    with pytest.raises(SpecError, match="node type without a capacity table") as e:
        import_helix(cluster=bad, machines=h / "clusters" / "machine_profiles.ini",
                     capacity=h / "node_capacity.json", model="llama-1-30b")
    assert "H100" in str(e.value)
    with pytest.raises(SpecError, match="cannot tell which capacity table"):
        import_helix(cluster=h / "clusters" / "single24.ini",
                     machines=h / "clusters" / "machine_profiles.ini",
                     capacity=h / "node_capacity.json")
    bad.write_text("[NodeNames]\ntotal_compute_nodes=1\n[ComputeNode-0]\ntype=L4\n"
                   "[Link-0-7]\nbandwidth=1 * mbps\n")
    with pytest.raises(SpecError, match="link between unknown nodes"):
        import_helix(cluster=bad, machines=h / "clusters" / "machine_profiles.ini",
                     capacity=h / "node_capacity.json")


def test_cli_import_plan_flow(reference_dir, tmp_path):
    h = reference_dir / "helix"
    out = tmp_path / "s"
    res = runner.invoke(app, ["import", "helix", "--cluster", str(h / "clusters" / "cluster10.ini"),
                              "--machines", str(h / "clusters" / "machine_profiles.ini"),
                              "--capacity", str(h / "node_capacity.json"), "--placement",
                              str(h / "placements" / "cluster10-llama1-30b" / "ilp.ini"),
                              "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["serve", "flow", str(out / "serving.yaml"), "--placement",
                              str(out / "placement.json"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["max_flow_tokens_per_s"] == pytest.approx(286.59, abs=0.01)
    res = runner.invoke(app, ["serve", "plan", str(out / "serving.yaml"), "--time-limit", "5",
                              "--json", "-o", str(tmp_path / "p.json"), "--helix-out",
                              str(tmp_path / "p.ini"), "--figure", str(tmp_path / "p.png")])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("solve_time_s", "max_flow_tokens_per_s", "upper_bound_tokens_per_s", "placement"):
        assert key in doc
    assert doc["placement"]["nodes"][0].keys() >= {"name", "gpu", "layers"}
    assert (tmp_path / "p.png").stat().st_size > 1000
    # the Helix-format export reads back to the same flow
    res = runner.invoke(app, ["serve", "flow", str(out / "serving.yaml"), "--placement",
                              str(tmp_path / "p.ini"), "--json"])
    assert json.loads(res.output)["max_flow_tokens_per_s"] == pytest.approx(
        doc["max_flow_tokens_per_s"])


def test_cli_errors_exit_codes(tmp_path):
    import yaml

    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(spec([{"machine": "small"}], layers=6)))
    res = runner.invoke(app, ["serve", "plan", str(f), "--time-limit", "1"])
    assert res.exit_code == 3 and "fit on no combination" in res.output
    f.write_text(yaml.safe_dump(spec([{"machine": "nope"}])))
    res = runner.invoke(app, ["serve", "plan", str(f)])
    assert res.exit_code == 2 and "nodes.0.machine" in res.output
    f.write_text(yaml.safe_dump(spec([{"machine": "big", "count": 2}])))
    res = runner.invoke(app, ["serve", "plan", str(f), "--placer", "separate"])
    assert res.exit_code == 0, res.output
    # options of another placer or objective are refused, not ignored
    for args, option in ((["--lengths", str(f)], "--lengths"),
                         (["--placer", "swarm", "--cold"], "--cold"),
                         (["--placer", "petals", "--prune", "3"], "--prune"),
                         (["--placer", "swarm", "--seed", "5"], "--seed")):
        res = runner.invoke(app, ["serve", "plan", str(f), *args, "--json"])
        assert res.exit_code == 2, (args, res.output)
        assert json.loads(res.stdout)["error"]["field"] == option, args


# ------------------------------------------------------------------------------ the simulator


def sim_cluster(nodes, links=None, layers=4, kv_bytes=1000):
    """Nodes with measured-style layer times: prompt 1 ms per token, decode 10 ms per step
    (flat in batch size up to 64), 10 GB of memory, 1 GB layers, ``kv_bytes`` of KV per token
    and layer."""
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    (d / "prompt_bs2time.csv").write_text("0,0\n1000,1000\n")
    (d / "decode_bs2time.csv").write_text("0,10\n64,10\n")
    return build_cluster(parse_serving({
        "model": {"layers": layers, "activation_bytes": 1000, "token_bytes": 2,
                  "layer_bytes": 1e9, "kv_bytes": kv_bytes},
        "machines": {"m": {"max_layers": 4, "tokens_per_s": [100, 50, 33, 25],
                           "profile": str(d), "memory": 10e9}},
        "nodes": nodes, "links": links or {"within": {"bandwidth": 1e12, "latency": 0.001}}}))


def test_one_request_on_one_node_takes_the_profiled_times():
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload

    c = sim_cluster([{"machine": "m", "name": "a"}])
    pl = Placement(((0, 4),))
    w = Workload(np.array([100]), np.array([5]), np.array([0.0]), "one")
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
    # prompt: link in (1 ms) + 4 layers x 100 ms + link out (1 ms); each decode step:
    # 1 ms in + 4 x 10 ms + 1 ms out
    assert r.prompt_latency_s["mean"] == pytest.approx(0.402, rel=1e-3)
    assert r.decode_latency_s["mean"] == pytest.approx(0.042, rel=1e-3)
    assert r.completed == 1


def test_a_run_that_ends_in_its_warm_up_says_nothing_was_measured(tmp_path):
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload

    c = sim_cluster([{"machine": "m", "name": "a"}])
    pl = Placement(((0, 4),))
    w = Workload(np.array([100, 100]), np.array([5, 5]), np.array([0.0, 1.0]), "two")
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=60.0, duration_s=None))
    assert r.measured == 0 and r.prompt_latency_s["mean"] is None
    assert len(r.warnings) == 1 and "warm-up" in r.warnings[0]
    assert r.to_json(["a"])["warnings"] == r.warnings
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.5, duration_s=None))
    assert r.measured == 1 and r.warnings == []


def test_simulated_tokens_add_up_and_routers_run():
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import online, synthetic_lengths

    c = sim_cluster([{"machine": "m", "count": 3}], layers=4)
    pl = Placement(((0, 2), (0, 2), (2, 4)))
    lengths = synthetic_lengths(200, seed=1) // 8 + 1
    for router in ("iwrr", "helix-iwrr", "swarm", "random", "shortest-queue"):
        w = online(lengths, np.array([30, 0, 30, 10]), rate_per_s=5.0, seed=2, limit=40)
        r = simulate(c, pl, max_flow(c, pl), w, SimOptions(router=router, warmup_s=0.0, duration_s=None))
        assert r.completed == w.n
        # every output token and prompt token is counted once
        assert r.decode_tokens_per_s * r.window_s == pytest.approx(float(w.output.sum()))
        assert (r.tokens_per_s - r.decode_tokens_per_s) * r.window_s == pytest.approx(
            float(w.prompt.sum()))
        assert all(0 <= u <= 1 + 1e-9 for u in r.node_utilization)
        assert all(k <= 0.9 + 1e-9 for k in r.kv_peak_fraction)  # online high water


def test_iwrr_follows_the_flows():
    from shoal.serving.routing import Router

    # two small nodes (60 tokens/s each at 2 layers) feed one big node (190 at 2 layers)
    c = cluster([{"machine": "small", "count": 2}, {"machine": "big"}], layers=4)
    pl = Placement(((0, 2), (0, 2), (2, 4)))
    fl = max_flow(c, pl)
    assert fl.value == pytest.approx(120.0)
    r = Router("iwrr", c, pl, fl)
    picks = [r.choose(c.n, lambda v: True, 1.0) for _ in range(100)]
    # the two share the flow equally, interleaved (no bursts)
    assert picks.count(0) == picks.count(1) == 50
    assert all(a != b for a, b in zip(picks, picks[1:]))


def test_offline_kv_admission_limits_the_requests_in_flight():
    from shoal.serving.perf import kv_capacity
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import offline

    c = sim_cluster([{"machine": "m", "name": "a"}], kv_bytes=1e5)
    pl = Placement(((0, 4),))
    cap = kv_capacity(c, pl)[0]  # (0.9 x 10 GB - 4 GB) / 100 kB = 5e4 token-layers
    assert cap == pytest.approx(5e4)
    w = offline(np.array([[1000, 250]] * 50), seed=0)
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=30.0))
    # each request reserves (1000 + 250) x 4 layers; at most 85% of the cache in use: 8
    assert r.in_flight_peak == int(0.85 * cap // (1250 * 4)) == 8
    assert r.kv_peak_fraction[0] == pytest.approx(8 * 5000 / cap)


def test_offline_feeder_stops_at_the_high_water_and_concurrency_fixes_the_requests():
    from shoal.serving.perf import kv_capacity
    from shoal.serving.simulator import FEED_HIGH_WATER, SimOptions, simulate
    from shoal.serving.workload import offline

    c = sim_cluster([{"machine": "m", "name": "a"}], kv_bytes=1e5)
    pl = Placement(((0, 4),))
    share = (100 + 25) * 4 / kv_capacity(c, pl)[0]  # one request's part of the cache: 1%
    w = offline(np.array([[100, 25]] * 400), seed=0)
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=60.0))
    # the feeder adds requests while at most 80% is expected in use (the node's own high water,
    # 85%, is never reached): 81 in flight at most
    assert r.in_flight_peak == int(FEED_HIGH_WATER / share + 1e-9) + 1 == 81
    assert r.kv_peak_fraction[0] == pytest.approx(81 * share)
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=60.0, concurrency=10))
    assert r.in_flight_peak == 10 and r.completed > 10
    with pytest.raises(SpecError, match="concurrency"):
        simulate(c, pl, max_flow(c, pl), w, SimOptions(concurrency=0))


def test_batch_limits_of_a_machine():
    from shoal.serving.perf import batch_caps
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload

    w = Workload(np.array([100, 100, 100]), np.array([1, 1, 1]), np.zeros(3), "three at once")
    pl = Placement(((0, 4),))
    lat = {}
    for prompts in (None, 1):
        c = sim_cluster([{"machine": "m", "name": "a"}])
        if prompts is not None:
            c = replace(c, batch=(Batch(prompts=prompts),))
        r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
        lat[prompts] = r.prompt_latency_s["mean"]
    # the first starts alone (0.4 s), the other two then go together (4 layers x 200 ms, done
    # at 1.2 s); one at a time: done at 0.4, 0.8 and 1.2 s (each plus the two 1 ms links)
    assert lat[None] == pytest.approx((0.402 + 2 * 1.202) / 3, rel=1e-3)
    assert lat[1] == pytest.approx(0.802, rel=1e-3)
    c = replace(sim_cluster([{"machine": "m", "count": 3}]), batch=(
        Batch(decode=[8, 6, 4]), Batch(decode=[8, 6, 4]), Batch(prompt_tokens=10, decode=5)))
    caps = batch_caps(c, Placement(((0, 1), (0, 4), (1, 4))))
    assert [x[1:] for x in caps] == [(4096, 8), (4096, 4), (10, 5)]  # a list past its end: last
    for bad, where in (({"decode": []}, "batch.decode"), ({"prompts": 0}, "batch.prompts")):
        with pytest.raises(SpecError, match=where):
            parse_serving({"model": {"layers": 4, "activation_bytes": 1000},
                           "machines": {"m": {"max_layers": 1, "tokens_per_s": [1],
                                              "batch": bad}},
                           "nodes": [{"machine": "m"}]})


def test_nodes_on_one_host_share_its_cores():
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload

    pl = Placement(((0, 4), (0, 4)))  # two chains of one node each
    w = Workload(np.array([100, 100, 50]), np.array([1, 1, 1]), np.array([0.0, 0.0, 1.0]), "3")
    ends = {}
    for cores in (None, 2, 1):
        c = replace(sim_cluster([{"machine": "m", "count": 2}]), host_cores=cores)
        r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
        assert r.completed == 3
        ends[cores] = r.prompt_latency_s["mean"]
    # each prompt is 0.4 s of work; on one core the two at t=0 progress at half speed (0.8 s),
    # and the third, alone, at full speed (0.2 s); the links add 2 ms to each
    assert ends[None] == ends[2] == pytest.approx((0.402 * 2 + 0.202) / 3, rel=1e-3)
    assert ends[1] == pytest.approx((0.802 * 2 + 0.202) / 3, rel=1e-3)
    # a second prompt (0.2 s of work) 0.1 s after the first (0.4 s) on one core: the first
    # runs alone for 0.1 s, both at half speed until the second is done at 0.5 s, then the
    # first alone again to 0.6 s
    w = Workload(np.array([100, 50]), np.array([1, 1]), np.array([0.0, 0.1]), "2")
    r = simulate(c, pl, max_flow(c, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
    assert r.prompt_latency_s["mean"] == pytest.approx((0.602 + 0.402) / 2, rel=1e-3)


def test_measured_sharing_of_the_host():
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload

    pl = Placement(((0, 4), (0, 4), (0, 4)))  # three chains of one node each
    c = sim_cluster([{"machine": "m", "count": 3}])
    two = Workload(np.array([100, 100]), np.array([1, 1]), np.zeros(2), "2")
    three = Workload(np.array([100, 100, 100]), np.array([1, 1, 1]), np.zeros(3), "3")
    for share, w, each in (((1.0, 0.25), two, 1.6),  # two at once: each at a quarter
                           ((1.0, 0.5), three, 1.2),  # past the list: a total of 1 split 3 ways
                           ((1.0, 0.5, 0.5), three, 0.8)):
        # the measured sharing is used, not host_cores' min(1, cores / k)
        cl = replace(c, host_share=share, host_cores=2)
        r = simulate(cl, pl, max_flow(cl, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
        assert r.prompt_latency_s["mean"] == pytest.approx(each + 0.002, rel=1e-3)
    # only nodes on one host share it: a and b on h1 go at a quarter, c alone on h2 at full
    cl = replace(c, host_share=(1.0, 0.25), hosts=("h1", "h1", "h2"))
    r = simulate(cl, pl, max_flow(cl, pl), three, SimOptions(warmup_s=0.0, duration_s=None))
    assert r.prompt_latency_s["mean"] == pytest.approx((1.6 + 1.6 + 0.4) / 3 + 0.002, rel=1e-3)
    base = {"model": {"layers": 4, "activation_bytes": 1000},
            "machines": {"m": {"max_layers": 1, "tokens_per_s": [1]}}, "nodes": [{"machine": "m"}]}
    for bad in ([1.0, 0.0], [1.2], []):
        with pytest.raises(SpecError, match="host_share"):
            parse_serving(base | {"host_share": bad})


def test_work_reaching_an_idle_node_pays_its_wake():
    from shoal.serving.simulator import SimOptions, simulate, woken
    from shoal.serving.workload import Workload

    gaps, hop = [0.01, 1.0], [0.001, 0.003]
    assert woken(0.0, gaps, hop) == 0.0
    assert woken(0.005, gaps, hop) == pytest.approx(0.0005)  # from none at 0
    assert woken(0.505, gaps, hop) == pytest.approx(0.002)
    assert woken(5.0, gaps, hop) == 0.003  # the last beyond the last
    c = sim_cluster([{"machine": "m", "name": "a"}])
    pl = Placement(((0, 4),))
    w = Workload(np.array([100]), np.array([1]), np.array([0.0]), "one")
    wake = {"gap_s": gaps, "hop_s": hop, "prompt_s_per_layer": [0.0, 0.01],
            "decode_s_per_layer": [0.0, 0.002]}
    cw = replace(c, wake=WakeSpec(**wake))
    r = simulate(cw, pl, max_flow(cw, pl), w, SimOptions(warmup_s=0.0, duration_s=None))
    # the node was never busy: the whole wake (3 ms + 4 layers x 10 ms) on its 0.4 s prompt;
    # the token is back at the coordinator at 0.445 s, 0.445 s after it last worked (the
    # arrival): 1 ms + 2 ms x 0.435 / 0.99 more
    back = 0.001 + 0.4 + 0.003 + 0.04 + 0.001
    assert r.prompt_latency_s["mean"] == pytest.approx(back + 0.001 + 0.002 * 0.435 / 0.99,
                                                       rel=1e-6)
    for bad, what in (({"hop_s": [0.001]}, "hop_s has 1"), ({"gap_s": [1.0, 0.01]}, "increasing"),
                      ({"decode_s_per_layer": [0.0, -1.0]}, ">= 0")):
        with pytest.raises(SpecError, match=what):
            parse_serving({"model": {"layers": 4, "activation_bytes": 1000},
                           "machines": {"m": {"max_layers": 1, "tokens_per_s": [1]}},
                           "nodes": [{"machine": "m"}], "wake": wake | bad})


def test_workload_files_and_errors(tmp_path):
    from shoal.serving.workload import load_arrivals, load_lengths, online

    f = tmp_path / "l.csv"
    f.write_text("input_tokens,output_tokens\n10,5\n20,0\n")
    with pytest.raises(SpecError, match="at least one output token"):
        load_lengths(f)
    f.write_text("in,out\n10,5\n")
    with pytest.raises(SpecError, match="header"):
        load_lengths(f)
    f.write_text("input_tokens,output_tokens\n10,x\n")
    with pytest.raises(SpecError, match="line 2"):
        load_lengths(f)
    a = tmp_path / "a.csv"
    a.write_text("interval,requests\n0,3\n1,0\n2,3\n")
    per = load_arrivals(a)
    w = online(np.array([[10, 5]]), per, rate_per_s=2.0, seed=0)
    assert np.all(np.diff(w.arrival_s) >= 0) and w.arrival_s.max() < 9.0
    assert abs(w.n - 18) <= 3  # 2 requests/s over 9 s


def test_cli_simulate(tmp_path):
    res = runner.invoke(app, ["serve", "simulate", "examples/llama2-70b-mixed.serving.yaml",
                              "--mode", "online", "--requests", "30", "--warmup", "0", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    for key in ("decode_throughput_tokens_per_s", "prompt_latency_s", "decode_latency_s",
                "requests"):
        assert key in doc
    assert doc["requests"]["completed"] == 30
    assert doc["prompt_latency_s"].keys() == {"mean", "p50", "p95", "requests"}
    res = runner.invoke(app, ["serve", "simulate", "examples/llama2-70b-mixed.serving.yaml",
                              "--mode", "online", "--concurrency", "5", "--json"])
    assert res.exit_code == 2 and "--concurrency" in res.output and "offline runs" in res.output
    # options of the other mode are refused, not ignored
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,input_tokens,output_tokens\n0.0,100,10\n")
    for args, option in ((["--load", "0.5"], "--load"), (["--requests", "5"], "--requests"),
                         (["--arrivals", str(trace)], "--arrivals"),
                         (["--mode", "offline", "--trace", str(trace)], "--mode"),
                         (["--trace", str(trace), "--load", "0.5"], "--trace")):
        res = runner.invoke(app, ["serve", "simulate", "examples/llama2-70b-mixed.serving.yaml",
                                  *args, "--json"])
        assert res.exit_code == 2, (args, res.output)
        assert json.loads(res.stdout)["error"]["field"] == option, args


def test_fewer_stages_at_a_lower_flow_and_a_kv_floor():
    from shoal.serving.perf import kv_tokens_per_layer

    c = sim_cluster([{"machine": "m", "count": 6}], layers=8)
    top = place(c, "auto", time_limit_s=5, objective="max-flow")
    deep = len({r for r in top.placement.ranges if r})
    shallow = stages.shallowest(c, 0.5 * top.flow.value, float("inf"))
    assert max_flow(c, shallow).value >= 0.5 * top.flow.value - 1e-9
    assert len({r for r in shallow.ranges if r}) <= deep
    # every stage's nodes hold the KV of K tokens in each of its layers
    K = 1.5 * max(kv_tokens_per_layer(c, i, 4) for i in range(c.n))
    floor = stages.shallowest(c, 0.5 * top.flow.value, float("inf"), K=K)
    held = {}
    for i, r in enumerate(floor.ranges):
        if r is not None:
            held[r] = held.get(r, 0.0) + kv_tokens_per_layer(c, i, r[1] - r[0])
    assert held and min(held.values()) >= K


@pytest.mark.parametrize("body,why", [
    ("arrival_s,input_tokens,output_tokens\n0.5,4,2\n0.1,4,2\n", "line 3: arrivals must be in order"),
    ("arrival_s,input_tokens,output_tokens\n-1,4,2\n", "line 2: arrival must be >= 0"),
    ("arrival_s,input_tokens,output_tokens\n0,0,2\n", "line 2: arrival must be >= 0 and both"),
    ("arrival_s,input_tokens,output_tokens\n0,x,2\n", "line 2: expected seconds"),
    ("t,in,out\n0,1,1\n", "expected a CSV with the header"),
    ("arrival_s,input_tokens,output_tokens\n", "no rows"),
])
def test_bad_request_traces_name_the_line(tmp_path, body, why):
    from shoal.serving.workload import load_trace

    (tmp_path / "t.csv").write_text(body)
    with pytest.raises(SpecError, match=why):
        load_trace(tmp_path / "t.csv")


def test_trace_round_trips_and_live_batching_times_prompts_one_by_one(tmp_path):
    """A written trace reads back as the same workload. Two prompts that queue behind a third:
    with ``vllm`` batching they run as one prefill of both and come back together, with
    ``live`` (serve run's workers) one after the other, each paying the step's fixed cost (9 ms
    per layer here) and each sent on as soon as it is done."""
    from shoal.serving.simulator import SimOptions, simulate
    from shoal.serving.workload import Workload, load_trace, write_trace

    w = Workload(np.array([100, 100, 100]), np.array([1, 1, 1]), np.array([0.0, 0.01, 0.01]), "t")
    back = load_trace(write_trace(tmp_path / "t.csv", w))
    assert back.prompt.tolist() == [100] * 3 and back.arrival_s.tolist() == [0.0, 0.01, 0.01]
    (tmp_path / "prompt_bs2time.csv").write_text("1,10\n1001,1010\n")  # 9 ms + 1 ms/token
    (tmp_path / "decode_bs2time.csv").write_text("1,10\n64,10\n")
    c = build_cluster(parse_serving({
        "model": {"layers": 4, "activation_bytes": 1000, "token_bytes": 2, "layer_bytes": 1e9,
                  "kv_bytes": 1000},
        "machines": {"m": {"profile": str(tmp_path), "memory": 10e9}},
        "nodes": [{"machine": "m", "name": "a"}],
        "links": {"within": {"bandwidth": 1e12, "latency": 0.001}}}))
    pl = Placement(((0, 4),))
    lat = {b: simulate(c, pl, max_flow(c, pl), back, SimOptions(warmup_s=0.0, duration_s=None,
                       batching=b)).prompt_latency_s["mean"] for b in ("vllm", "live")}
    # the first prompt: link in, 4 layers x (9 + 100) ms, link out, back at 0.438 s; the other
    # two (arrived at 0.01 s) start when it is done, at 0.437 s: as one prefill of 200 tokens
    # (4 x 209 ms) both back at 1.274 s; one by one (4 x 109 ms each) back at 0.874 and 1.310 s
    assert lat["vllm"] == pytest.approx((0.438 + 2 * (1.274 - 0.01)) / 3, rel=1e-6)
    assert lat["live"] == pytest.approx((0.438 + 0.874 - 0.01 + 1.310 - 0.01) / 3, rel=1e-6)


def test_measured_times_past_the_last_point_never_fall():
    """A noisy profile whose last point came out faster than the one before must not extend
    into shorter (or negative) times for larger batches: the capacity table would go to zero
    and no chain could be routed."""
    import numpy as np

    from shoal.serving.capacity import LayerTimes

    xs = np.array([1.0, 16.0, 128.0, 256.0])
    good = LayerTimes(xs, np.array([1.0, 2.0, 8.0, 15.0]), xs, np.array([1.0, 1.1, 1.3, 1.5]))
    assert good.prompt_s(512) == pytest.approx(15.0 + 7.0 / 128 * 256)  # the last two's slope
    noisy = LayerTimes(xs, np.array([1.0, 2.0, 9.0, 8.0]), xs, np.array([1.0, 1.1, 1.3, 1.2]))
    assert noisy.prompt_s(763) == pytest.approx(8.0 + 7.0 / 255 * (763 - 256))
    assert noisy.decode_s(512) == pytest.approx(1.2 + 0.2 / 255 * 256)
    falling = LayerTimes(xs, np.array([9.0, 8.0, 7.0, 6.0]), xs, np.array([2.0, 1.5, 1.2, 1.0]))
    assert falling.prompt_s(763) == 6.0 and falling.decode_s(1000) == 1.0


def test_helix_solution_files_round_trip_on_nodes_of_any_name(tmp_path):
    """``write_placement`` then ``read_placement`` gives the placement back, for nodes named
    ``n<id>`` (Helix's) and for any other names (numbered by position)."""
    from shoal.io.helix import read_placement, write_placement

    for nodes in ([{"machine": "big", "count": 2}, {"machine": "small"}],
                  [{"machine": "big", "name": "n7"}, {"machine": "small", "name": "n3"},
                   {"machine": "small", "name": "n12"}]):
        c = cluster(nodes)
        pl = Placement(((0, 4), (4, 6), (4, 6)))
        f = tmp_path / "solution.ini"
        f.write_text(write_placement(pl, c))
        assert read_placement(f, c) == pl


def test_layers_on_no_node_are_named_by_flow_and_simulate():
    """A placement that leaves layers on no node: ``uncovered`` names them, the max flow is
    0, and simulating it is infeasible for that reason (not the KV cache)."""
    from shoal.serving.simulator import simulate
    from shoal.serving.workload import Workload

    c = cluster([{"machine": "big", "count": 2}, {"machine": "small", "count": 2}])
    assert Placement(((0, 4), None, (4, 6), None)).uncovered(c) == []
    gap = Placement(((0, 2), (0, 2), None, (4, 6)))
    assert gap.uncovered(c) == [(2, 4)]
    assert Placement((None, None, None, (1, 2))).uncovered(c) == [(0, 1), (2, 6)]
    assert max_flow(c, gap).value == 0
    with pytest.raises(InfeasibleError, match=r"layers \[2, 4\) are on no node") as e:
        simulate(c, gap, None, Workload(np.array([10]), np.array([5]), None, "one"))
    assert e.value.binding == "placement"


def test_zero_flow_names_its_reason():
    """When no request can get through a placement, the reason names what is missing: layers
    on no node, the coordinator's links, or links between the nodes of consecutive layers."""
    from shoal.serving.placers import no_flow_reason

    nodes = [{"machine": "big", "count": 2}]
    split = Placement(((0, 3), (3, 6)))
    c = cluster(nodes)
    assert max_flow(c, split).value > 0
    assert "on no node" in no_flow_reason(c, Placement(((0, 3), None)))[0]
    cut = cluster(nodes, links={"mesh": False, "pairs": [
        {"a": "big-0", "b": "big-1", "bandwidth": 1e9}]})
    assert max_flow(cut, split).value == 0
    why, fix = no_flow_reason(cut, split)
    assert "coordinator" in why and "`within`" in fix
    between = cluster(nodes, links={"coordinator": {"bandwidth": 1e9}})
    assert max_flow(between, split).value == 0
    why, fix = no_flow_reason(between, split)
    assert "link to another" in why and "`within`" in fix


@pytest.mark.slow
def test_max_flow_on_a_hundred_node_cluster():
    """The bundled serving example at 5x its node counts: networkx's preflow-push failed inside
    (IndexError) on its floating-point capacities; capacities are whole micro-tokens/s now."""
    import yaml

    from shoal.serving.placers import place

    doc = yaml.safe_load((Path(__file__).parents[1] / "examples"
                          / "llama2-70b-mixed.serving.yaml").read_text())
    for group, n in zip(doc["nodes"], (20, 20, 20, 60), strict=True):
        group["count"] = n
    c = build_cluster(parse_serving(doc))
    placed = place(c, "auto", time_limit_s=3.0)
    assert 0 < placed.flow.value <= c.upper_bound() * (1 + 1e-9)
    assert placed.flow.value == pytest.approx(max_flow(c, placed.placement).value)


def _helix_inputs(tmp_path, capacity: dict, machines: str = "[L4]\ninbound_nic_speed = 10 * gbps\n"
                  "outbound_nic_speed = 10 * gbps\nvram_size = 24 * GB\n"):
    (tmp_path / "c.ini").write_text(
        "[NodeNames]\ntotal_compute_nodes=1\n[ComputeNode-0]\ntype=L4\n"
        "[Link-source-0]\nbandwidth=1 * gbps\n[Link-0-sink]\nbandwidth=1 * gbps\n")
    (tmp_path / "m.ini").write_text("[SourceNode]\ninbound_nic_speed = -1\n" + machines)
    (tmp_path / "cap.json").write_text(json.dumps(capacity))
    return {"cluster": tmp_path / "c.ini", "machines": tmp_path / "m.ini",
            "capacity": tmp_path / "cap.json"}


def _capacity(**over) -> dict:
    nt = {"max_layers": 2, "tokens_per_s": {"1": 100.0, "2": 50.0}}
    model = {"name": "m", "layers": 4, "activation_bytes": 1000}
    setting = {"model": model, "clusters": ["c.ini"], "node_types": {"L4": nt}}
    for k, v in over.items():
        where, _, key = k.partition("__")
        {"nt": nt, "model": model, "setting": setting}[where][key] = v
    return {"settings": {"x": setting}}


@pytest.mark.parametrize("over,field", [
    ({"nt__max_layers": 3}, "node_types.L4"),  # no tokens_per_s for 3 layers
    ({"nt__max_layers": "two"}, "node_types.L4"),
    ({"nt__max_layers": 0}, "node_types.L4"),
    ({"nt__tokens_per_s": [100.0, 50.0]}, "node_types.L4"),
    ({"nt__tokens_per_s": {"1": "fast", "2": 50.0}}, "node_types.L4"),
    ({"model__layers": None}, "x.model"),
    ({"setting__node_types": {"L4": None}}, "node_types.L4"),
    ({"setting__node_types": []}, "node_types"),
])
def test_helix_capacity_entries_that_cannot_be_read_are_named(tmp_path, over, field):
    from shoal.io.helix import import_helix

    import_helix(**_helix_inputs(tmp_path, _capacity()))  # the file as made reads
    with pytest.raises(SpecError) as e:
        import_helix(**_helix_inputs(tmp_path, _capacity(**over)))
    assert e.value.file.endswith("cap.json") and field in e.value.field


@pytest.mark.parametrize("machines,bad", [
    ("[L4]\ninbound_nic_speed = -10 * gbps\n", "inbound_nic_speed"),
    ("[L4]\nvram_size = 0 * GB\n", "vram_size"),
    ("[L4]\nvram_size = 1e999 * GB\n", "vram_size"),
    ("[L4]\nvram_size = 1.2.3 * GB\n", "vram_size"),
])
def test_helix_machine_values_that_are_not_positive_quantities_are_named(tmp_path, machines, bad):
    from shoal.io.helix import import_helix

    with pytest.raises(SpecError) as e:
        import_helix(**_helix_inputs(tmp_path, _capacity(), machines))
    assert e.value.field == f"[L4] {bad}" and e.value.file.endswith("m.ini")


def test_import_helix_warns_of_a_placement_that_leaves_layers_on_no_node(tmp_path):
    files = _helix_inputs(tmp_path, _capacity())
    (tmp_path / "p.ini").write_text("[Settings]\noffset=2\n\n[Solution]\ncompute_node_2=[0]\n")
    args = ["import", "helix", "--cluster", str(files["cluster"]), "--machines",
            str(files["machines"]), "--capacity", str(files["capacity"]), "--placement",
            str(tmp_path / "p.ini"), "-o", str(tmp_path / "out"), "--json"]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["warnings"] == ["the placement leaves layers [1, 4) on no node: it serves nothing"]
    (tmp_path / "p.ini").write_text("[Settings]\noffset=2\n\n[Solution]\ncompute_node_2=[0, 1]\n")
    assert json.loads(runner.invoke(app, args).stdout)["warnings"] == [
        "the placement leaves layers [2, 4) on no node: it serves nothing"]


def test_the_coordinators_region_is_one_of_the_nodes():
    """``coordinator.region`` picks the within or between link to every node of a mesh: a
    region no node is in is refused with its close match; unsaid, it is the nodes' one region
    (before, 'default', which left the coordinator unlinked without `between`), or, over
    several, 'default' (no node's here: every node reaches it by `between`)."""
    from shoal.errors import SpecError

    one = [{"machine": "big", "count": 2, "region": "r"}]
    assert cluster(one).src.min() > 0  # the nodes' region: linked by `within`
    with pytest.raises(SpecError, match="no node is in this region") as e:
        cluster(one, coordinator={"region": "rr"})
    assert e.value.field == "coordinator.region" and e.value.suggestion == "r"
    two = [*one, {"machine": "big", "name": "far", "count": 2, "region": "s"}]
    links = {"within": {"bandwidth": 1e9}, "between": {"bandwidth": 1e8}}
    apart = cluster(two, links=links)
    assert apart.src[0] == apart.src[2] > 0  # `between` to every node
    c = cluster(two, links=links, coordinator={"region": "s"})
    assert c.src[2] > c.src[0] > 0  # within to its own region's nodes, between to the others


def test_no_flow_from_ranges_that_do_not_follow_one_another_says_so():
    """Every layer is on some node and every node is linked, but no range starts where another
    ends ([0, 3) then [2, 6)): the reason names the ranges, not the links."""
    from shoal.serving.placers import no_flow_reason

    c = cluster([{"machine": "big", "count": 2}])
    pl = Placement(((0, 3), (2, 6)))
    assert max_flow(c, pl).value == 0
    why, fix = no_flow_reason(c, pl)
    assert "follow one another" in why and "layer 3 at most" in why
    assert "serve plan --placer auto" in fix and "link" not in fix


def test_a_worker_for_an_unknown_node_names_the_file_and_the_nodes():
    res = runner.invoke(app, ["serve", "worker", "examples/llama2-70b-mixed.serving.yaml",
                              "--node", "A100-9"])
    assert res.exit_code == 2, res.output
    out = " ".join(res.output.split())
    assert "llama2-70b-mixed.serving.yaml: --node: unknown node (got 'A100-9')" in out
    assert "A100-0" in out
