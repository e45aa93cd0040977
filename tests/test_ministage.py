"""The zorse schedule (ministages with host offload): what the plan file accepts, how the
estimate moves with the ministage count and the host link, and that the zorse strategy finds
plans that fit only this way."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest

from shoal.errors import InfeasibleError, SpecError
from shoal.estimate import estimate
from shoal.estimate.api import _state_bytes, run_specs, tables_for
from shoal.estimate.encode import parse_schedule, schedule_key, to_spec
from shoal.estimate.ministage import edges
from shoal.problem import build_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario
from shoal.training.planners import search
from shoal.training.planners.common import to_plan
from shoal.training.planners.space import mbs_options

BASE = {
    "model": {"name": "m", "num_layers": 12, "hidden_size": 2048, "num_heads": 16,
              "vocab_size": 32000, "max_seq_len": 2048},
    "job": {"global_batch": 16, "seq_len": 1024, "recompute": [True], "zero_stage": [2],
            "schedule": ["1f1b", "gpipe", "zorse"]},
    "pool": {"regions": {"east": {"zones": {"east-a": {"gpus": {"A100-40GB": 4, "T4": 4}}}}},
             "gpus_per_node": {"A100-40GB": 4, "T4": 4}},
    "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "50us"}}},
    "prices": {"gpu_usd_per_h": {"T4": 0.35}},
}


def problem(**job):
    data = copy.deepcopy(BASE)
    data["job"].update(job)
    return build_problem(parse_scenario(data, file="z.yaml"), file="z.yaml")


def plan(ministages: int, schedule: str = "zorse", **kw) -> TrainingPlan:
    doc = {"microbatch_size": 1, "schedule": schedule, "recompute": True, "zero_stage": 2,
           "stages": [
               {"layers": [0, 6], "replicas": [{"gpu": "A100-40GB", "zone": "east-a",
                                                "microbatches": 8} for _ in range(2)]},
               {"layers": [6, 14], "replicas": [
                   {"gpu": "T4", "zone": "east-a", "microbatches": m} for m in (4, 4, 4, 4)]}]}
    if ministages != 1 or schedule == "zorse":
        doc["ministages"] = ministages
    return TrainingPlan.model_validate(doc | kw)


def test_ministage_edges_tile_the_stage():
    for a, b in ((0, 6), (3, 17), (5, 6)):
        for v in range(1, b - a + 1):
            e = edges(a, b, v)
            sizes = np.diff(e)
            assert e[0] == a and e[-1] == b and len(sizes) == v
            assert sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


def test_spec_round_trip_keeps_the_ministages():
    p = plan(3)
    sp = to_spec(p)
    assert sp.schedule == schedule_key("zorse", 3) and parse_schedule(sp.schedule) == ("zorse", 3)
    assert to_plan(sp) == p
    assert parse_schedule("1f1b") == ("1f1b", 1)


@pytest.mark.parametrize("bad, field", [
    ({"recompute": False}, "schedule"),  # ministages checkpoint every layer
    ({"zero_stage": 0}, "schedule"),  # and run ZeRO-2
])
def test_zorse_needs_recompute_and_zero2(bad, field):
    pb = problem(recompute=[False, True], zero_stage=[0, 2])
    with pytest.raises(SpecError) as e:
        estimate(pb, plan(2, **bad))
    assert e.value.field == field


def test_ministages_are_checked_against_stages_and_schedule():
    pb = problem()
    with pytest.raises(SpecError) as e:
        estimate(pb, plan(7))  # stage 0 holds 6 layers
    assert e.value.field == "stages.0.layers"
    with pytest.raises(SpecError) as e:
        estimate(pb, plan(2, schedule="1f1b"))
    assert e.value.field == "ministages"
    with pytest.raises(SpecError) as e:
        estimate(problem(schedule=["1f1b"]), plan(2))  # the job does not allow it
    assert e.value.field == "schedule"


def test_more_ministages_hold_less_and_the_estimate_matches_the_batch_path():
    pb = problem()
    tb = tables_for(pb, mbs_options(pb))
    peaks = []
    for v in (1, 2, 3, 6):
        est = estimate(pb, plan(v))
        peaks.append(est.peak_memory_bytes)
        out = run_specs(pb, tb, [to_spec(plan(v))])
        assert out["iteration_time_s"][0] == pytest.approx(est.iteration_time_s, rel=1e-9)
        assert bool(out["oom"][0]) == est.oom
        # every replica computes its microbatches' forwards and backwards at least once
        busiest = max(s.compute_fwd_s + s.compute_bwd_s for s in est.stages)
        assert est.iteration_time_s >= busiest * 4
    assert all(b < a for a, b in zip(peaks, peaks[1:], strict=False))
    # ZeRO-2 with the whole stage resident (gpipe) holds more than two ministages of it
    assert estimate(pb, plan(1, schedule="gpipe")).peak_memory_bytes > peaks[2]


def test_a_faster_host_link_is_never_slower():
    pb = problem()
    slow = estimate(pb, plan(6)).iteration_time_s
    fast_gpus = {g: replace(spec, host_bw_Bps=spec.host_bw_Bps * 100) for g, spec in pb.gpus.items()}
    fast = estimate(replace(pb, gpus=fast_gpus), plan(6)).iteration_time_s
    assert fast <= slow * (1 + 1e-12)
    slower_gpus = {g: replace(spec, host_bw_Bps=spec.host_bw_Bps / 1000) for g, spec in pb.gpus.items()}
    assert estimate(replace(pb, gpus=slower_gpus), plan(6)).iteration_time_s > slow


def test_zorse_finds_plans_that_fit_only_with_ministages():
    # a model whose stages fit these GPUs only with most of their weights in host memory
    data = copy.deepcopy(BASE)
    data["model"] = {"name": "big", "num_layers": 24, "hidden_size": 4096, "num_heads": 32,
                     "vocab_size": 32000, "max_seq_len": 2048}
    data["pool"]["regions"]["east"]["zones"]["east-a"]["gpus"] = {"T4": 8}
    data["pool"]["gpus_per_node"] = {"T4": 4}
    data["job"]["schedule"] = ["1f1b", "gpipe"]
    pb = build_problem(parse_scenario(copy.deepcopy(data), file="z.yaml"), file="z.yaml")
    with pytest.raises(InfeasibleError):
        search(pb, strategy="zorse", top_k=1)
    data["job"]["schedule"] = ["1f1b", "gpipe", "zorse"]
    pb = build_problem(parse_scenario(data, file="z.yaml"), file="z.yaml")
    best = search(pb, strategy="zorse", top_k=1).ranked[0]
    assert best.plan.schedule == "zorse" and best.plan.ministages > 1
    est = estimate(pb, best.plan)
    assert not est.oom and est.iteration_time_s == pytest.approx(best.iteration_time_s)


def test_the_timeline_refuses_the_zorse_schedule_and_the_runtime_runs_it():
    pytest.importorskip("torch")
    from shoal.catalog import models
    from shoal.estimate.timeline import simulate
    from shoal.runtime.pipeline import layout

    p = TrainingPlan.model_validate({
        "microbatch_size": 1, "schedule": "zorse", "ministages": 2, "recompute": True,
        "zero_stage": 2, "stages": [{"layers": [0, 6], "replicas": [
            {"gpu": "cpu", "zone": "z", "microbatches": 2}]}]})
    lay = layout(p, models().get("tiny"))
    assert lay.world == 1 and lay.pieces[0] == ((0, 1, 2), (3, 4, 5))  # two ministages
    with pytest.raises(SpecError) as e:
        simulate(problem(), plan(2))
    assert e.value.field == "schedule"


def test_one_gpu_is_weights_in_compute_and_the_update_by_hand():
    data = copy.deepcopy(BASE)
    data["pool"]["regions"]["east"]["zones"]["east-a"]["gpus"] = {"A100-40GB": 1}
    data["pool"]["gpus_per_node"] = {"A100-40GB": 1}
    pb = build_problem(parse_scenario(data, file="z.yaml"), file="z.yaml")
    p = TrainingPlan.model_validate({
        "microbatch_size": 1, "schedule": "zorse", "ministages": 1, "recompute": True,
        "zero_stage": 2, "stages": [{"layers": [0, 14], "replicas": [
            {"gpu": "A100-40GB", "zone": "east-a", "microbatches": 16}]}]})
    tb = tables_for(pb, [1])
    g, host = tb.gi("A100-40GB"), pb.gpus["A100-40GB"].host_bw_Bps
    c = pb.timing.compute_scale
    f = (tb.cum_f[g, 0, 0, -1] - tb.cum_f[g, 0, 0, 0]) * c
    b = (tb.cum_b[g, 0, 0, -1] - tb.cum_b[g, 0, 0, 0]) * c + f  # the forward again (recompute)
    io = (tb.cum_act_rc[g, 0, -1] - tb.cum_act_rc[g, 0, 0]) / host
    params = tb.cum_params[-1]
    w_b, _, o_b = _state_bytes(pb)[1]
    weights_in = params * w_b / host  # 16-bit weights
    grads_out = params * (2 * o_b + w_b) / host  # optimizer state in and out, new weights out
    upd = tb.cum_u[g, 0, -1] - tb.cum_u[g, 0, 0]
    want = weights_in + 16 * (max(f, io) + max(b, io)) + grads_out + upd
    assert estimate(pb, p).iteration_time_s == pytest.approx(want + pb.timing.step_overhead_s,
                                                            rel=1e-9)
