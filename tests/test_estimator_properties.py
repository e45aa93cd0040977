"""Invariants of the estimator over random valid plans (hypothesis).

A small fixed problem: OPT-350M, two zones of one region, A100-40GB and V100-16GB, constant
network bandwidths. Plans are drawn at random: 1-4 stages cutting the 26-layer list anywhere,
1-3 pipelines (replicas per stage) each with its own share of the microbatches, and per replica a
GPU type, TP degree and zone.
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from shoal import catalog
from shoal.errors import SpecError
from shoal.estimate import estimate
from shoal.estimate.timeline import simulate
from shoal.estimate.validate import validate_plan
from shoal.problem import build_problem
from shoal.profiles.analytic import AnalyticProfile
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ZONES = ("us-central1-a", "us-central1-b")
GPUS = ("A100-40GB", "V100-16GB")
N_LAYERS = 26
GLOBAL_BATCH = 16


def scenario(*, global_batch=GLOBAL_BATCH, avail=64, bw_scale=1.0, quota=None) -> dict:
    return {
        "model": "OPT-350M",
        "job": {"global_batch": global_batch, "seq_len": 2048, "recompute": [False, True]},
        "pool": {"regions": {"us-central1": {"zones": {
            z: {"gpus": {g: avail for g in GPUS}} for z in ZONES}}},
            **({"quotas": quota} if quota else {})},
        "network": {"defaults": {
            "same_zone": {"bandwidth": 12.5e9 * bw_scale, "latency": "20us"},
            "same_region": {"bandwidth": 2.5e9 * bw_scale, "latency": "1ms"},
        }},
    }


def build(data: dict):
    return build_problem(parse_scenario(data, file="x.yaml"), file="x.yaml")


PROBLEM = build(scenario())


# ---- strategies ---------------------------------------------------------------------------------


@st.composite
def plans(draw, *, max_stages=4, max_pipelines=3, tps=(1, 2, 4, 8), global_batch=GLOBAL_BATCH,
          schedule=None):
    n_stages = draw(st.integers(1, max_stages))
    cuts = sorted(draw(st.sets(st.integers(1, N_LAYERS - 1), min_size=n_stages - 1,
                               max_size=n_stages - 1)))
    bounds = [0, *cuts, N_LAYERS]
    mbs = draw(st.sampled_from([m for m in (1, 2, 4) if global_batch % m == 0]))
    total = global_batch // mbs
    d = draw(st.integers(1, min(max_pipelines, total)))
    # split the microbatches over d pipelines, each at least one
    splits = sorted(draw(st.sets(st.integers(1, total - 1), min_size=d - 1, max_size=d - 1)))
    shares = [b - a for a, b in zip([0, *splits], [*splits, total])]
    stages = []
    for s in range(n_stages):
        replicas = [{"gpu": draw(st.sampled_from(GPUS)), "tp": draw(st.sampled_from(tps)),
                     "zone": draw(st.sampled_from(ZONES)), "microbatches": shares[j]}
                    for j in range(d)]
        stages.append({"layers": [bounds[s], bounds[s + 1]], "replicas": replicas})
    return TrainingPlan.model_validate({
        "microbatch_size": mbs,
        "schedule": schedule or draw(st.sampled_from(["1f1b", "gpipe"])),
        "recompute": draw(st.booleans()),
        "stages": stages,
    })


def with_schedule(plan: TrainingPlan, schedule: str) -> TrainingPlan:
    return TrainingPlan.model_validate(plan.to_json() | {"schedule": schedule})


def scaled_batch(plan: TrainingPlan, k: int) -> TrainingPlan:
    doc = copy.deepcopy(plan.to_json())
    for s in doc["stages"]:
        for r in s["replicas"]:
            r["microbatches"] *= k
    return TrainingPlan.model_validate(doc)


def faster(problem, gpu: str, flops_x: float, bw_x: float):
    """The same problem with one GPU type made faster (compute peak and memory bandwidth)."""
    g = problem.gpus[gpu]
    fast = dataclasses.replace(g, flops_16=g.flops_16 * flops_x, flops_32=g.flops_32 * flops_x,
                               mem_bw_Bps=g.mem_bw_Bps * bw_x)
    gpus = {**problem.gpus, gpu: fast}
    profile = AnalyticProfile(problem.model, problem.job.seq_len, {**catalog.gpus().entries, **gpus},
                              optimizer=problem.job.optimizer, precision=problem.job.precision)
    return dataclasses.replace(problem, gpus=gpus, profile=profile)


REL = 1e-9  # float slack for "never slower"


# ---- properties ---------------------------------------------------------------------------------


@SETTINGS
@given(plan=plans(), scale=st.floats(1.0, 50.0))
def test_more_bandwidth_never_slower(plan, scale):
    base = estimate(PROBLEM, plan)
    fast = estimate(build(scenario(bw_scale=scale)), plan)
    assert fast.iteration_time_s <= base.iteration_time_s * (1 + REL)
    for a, b in zip(fast.stages, base.stages):  # per stage: the slowest link of the ring
        assert a.gradient_sync_s <= b.gradient_sync_s * (1 + REL)
    # bandwidth is not memory: peaks do not move
    assert [w.peak_memory_bytes for w in fast.workers] == [w.peak_memory_bytes for w in base.workers]


@SETTINGS
@given(plan=plans(), gpu=st.sampled_from(GPUS), flops_x=st.floats(1.0, 8.0), bw_x=st.floats(1.0, 8.0))
def test_faster_gpu_never_slower(plan, gpu, flops_x, bw_x):
    base = estimate(PROBLEM, plan)
    fast = estimate(faster(PROBLEM, gpu, flops_x, bw_x), plan)
    assert fast.iteration_time_s <= base.iteration_time_s * (1 + REL)
    # (a stage's breakdown reports its busiest replica, which may change, so compare stage totals)
    for a, b in zip(fast.stages, base.stages):
        assert a.busy_s <= b.busy_s * (1 + REL)


def test_faster_gpu_is_strictly_faster_when_compute_bound():
    """The property above must be able to fail: a faster GPU does change the estimate."""
    p = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [{"layers": [0, N_LAYERS],
                                     "replicas": [{"gpu": "V100-16GB", "tp": 1, "zone": ZONES[0],
                                                   "microbatches": GLOBAL_BATCH}]}]})
    base = estimate(PROBLEM, p).iteration_time_s
    fast = estimate(faster(PROBLEM, "V100-16GB", 2.0, 2.0), p).iteration_time_s
    assert fast < 0.75 * base


@SETTINGS
@given(plan=plans(schedule="1f1b"))
def test_gpipe_never_uses_less_memory_than_1f1b(plan):
    e1 = estimate(PROBLEM, plan)
    eg = estimate(PROBLEM, with_schedule(plan, "gpipe"))
    n_stages = len(plan.stages)
    for w1, wg in zip(e1.workers, eg.workers):
        assert (w1.stage, w1.replica) == (wg.stage, wg.replica)
        m = plan.stages[w1.stage].replicas[w1.replica].microbatches
        # 1F1B: stage s of P keeps P - s microbatches in flight (at most its own); GPipe: all
        assert w1.microbatches_in_flight == min(n_stages - w1.stage, m)
        assert wg.microbatches_in_flight == m
        assert wg.peak_memory_bytes >= w1.peak_memory_bytes * (1 - REL)
        assert wg.activation_bytes >= w1.activation_bytes * (1 - REL)
        assert wg.weights_grads_optimizer_bytes == w1.weights_grads_optimizer_bytes


@SETTINGS
@given(plan=plans(schedule="1f1b"))
def test_1f1b_earlier_stages_hold_more_in_flight(plan):
    e = estimate(PROBLEM, plan)
    by_replica: dict[int, list[int]] = {}
    for w in e.workers:
        by_replica.setdefault(w.replica, []).append(w.microbatches_in_flight)
    for inflight in by_replica.values():
        assert inflight == sorted(inflight, reverse=True)


@SETTINGS
@given(plan=plans(global_batch=8, schedule="gpipe"), k=st.integers(2, 4))
def test_gpipe_bigger_global_batch_never_uses_less_memory(plan, k):
    small = estimate(build(scenario(global_batch=8)), plan)
    big_plan = scaled_batch(plan, k)
    big = estimate(build(scenario(global_batch=8 * k)), big_plan)
    for ws, wb in zip(small.workers, big.workers):
        assert wb.microbatches_in_flight == k * ws.microbatches_in_flight
        assert wb.peak_memory_bytes >= ws.peak_memory_bytes * (1 - REL)
    # and more work never takes less time
    assert big.iteration_time_s >= small.iteration_time_s * (1 - REL)


SMALL_AVAIL = 6
SMALL_POOL = build(scenario(avail=SMALL_AVAIL))


@SETTINGS
@given(plan=plans(max_pipelines=3, tps=(1, 2, 4, 8)))
def test_plans_only_use_gpus_the_pool_has(plan):
    used = plan.gpu_counts()
    over = {k: n for k, n in used.items() if n > SMALL_AVAIL}
    event("over the pool" if over else "within the pool")
    if over:
        with pytest.raises(SpecError) as ei:
            validate_plan(SMALL_POOL, plan, "plan.json")
        assert ei.value.field == "stages"
        assert ei.value.allowed == f"<= {SMALL_AVAIL}"
        assert ei.value.value in over.values()
    else:
        validate_plan(SMALL_POOL, plan, "plan.json")
        assert estimate(SMALL_POOL, plan).num_gpus == sum(used.values()) <= SMALL_AVAIL * 4


@SETTINGS
@given(plan=plans(), quota=st.integers(0, 12))
def test_plans_respect_quotas(plan, quota):
    problem = build(scenario(quota={"A100-40GB": quota}))
    a100 = sum(n for (g, _), n in plan.gpu_counts().items() if g == "A100-40GB")
    if a100 > quota:
        with pytest.raises(SpecError, match="quota"):
            validate_plan(problem, plan)
    else:
        validate_plan(problem, plan)


def uniform_problem(layer_s: float = 0.01):
    """PROBLEM with a measured profile in which every layer takes the same time (bwd = 2 fwd)."""
    from shoal.profiles.compute import ComputeProfile

    table = np.tile([layer_s, 2 * layer_s, 0.0], (N_LAYERS, 1))
    prof = ComputeProfile(n_layers=N_LAYERS, name="uniform")
    for g in GPUS:
        for tp in (1, 2, 4, 8):
            prof.tables[(g, tp)] = {m: table * m for m in (1, 2, 4)}
    return dataclasses.replace(PROBLEM, profile=prof)


@SETTINGS
@given(n_stages=st.sampled_from([1, 2, 13, 26]), mbs=st.sampled_from([1, 2, 4]),
       gpu=st.sampled_from(GPUS), zone=st.sampled_from(ZONES))
def test_homogeneous_1f1b_time_matches_textbook_formula(n_stages, mbs, gpu, zone):
    """Identical stages, one pipeline: T = (m + P - 1) t + update (Narayanan et al. 2021), with
    t the per-microbatch time of a stage: forward + backward + its blocking sends and receives."""
    pb = uniform_problem()
    m = GLOBAL_BATCH // mbs
    per = N_LAYERS // n_stages
    plan = TrainingPlan.model_validate({"microbatch_size": mbs, "stages": [
        {"layers": [i * per, (i + 1) * per],
         "replicas": [{"gpu": gpu, "tp": 1, "zone": zone, "microbatches": m}]}
        for i in range(n_stages)]})
    e = estimate(pb, plan)
    # every stage computes the same; inner stages also send and receive both ways
    compute = 3 * 0.01 * mbs * per
    assert all(st_.compute_fwd_s + st_.compute_bwd_s == pytest.approx(compute) for st_ in e.stages)
    t = max(s.compute_fwd_s + s.compute_bwd_s + s.send_recv_s for s in e.stages)
    if n_stages <= 2:  # both end stages send once and receive once: truly identical
        expected = (m + n_stages - 1) * t
        assert e.iteration_time_s == pytest.approx(expected, rel=1e-9)
    sim = simulate(pb, plan).iteration_time_s
    assert e.iteration_time_s == pytest.approx(sim, rel=0.01)
    assert e.iteration_time_s >= sim * (1 - 1e-9)


@SETTINGS
@given(gpu=st.sampled_from(GPUS), tp=st.sampled_from([1, 2, 4, 8]), mbs=st.sampled_from([1, 2, 4]),
       recompute=st.booleans(), zone=st.sampled_from(ZONES))
def test_one_stage_closed_form(gpu, tp, mbs, recompute, zone):
    """One stage, one replica: T = m (fwd + bwd) + update, with layer times read straight from the
    profile (independently of the kernel's tables)."""
    m = GLOBAL_BATCH // mbs
    plan = TrainingPlan.model_validate({
        "microbatch_size": mbs, "recompute": recompute,
        "stages": [{"layers": [0, N_LAYERS],
                    "replicas": [{"gpu": gpu, "tp": tp, "zone": zone, "microbatches": m}]}]})
    lt = PROBLEM.profile.layer_times(gpu, tp, mbs)
    fwd, bwd, upd = (float(lt[:, i].sum()) for i in range(3))
    c = PROBLEM.timing.compute_scale
    bwd_total = (bwd + (fwd if recompute else 0.0)) * c
    e = estimate(PROBLEM, plan)
    assert e.stages[0].compute_fwd_s == pytest.approx(fwd * c, rel=1e-12)
    assert e.stages[0].compute_bwd_s == pytest.approx(bwd_total, rel=1e-12)
    assert e.stages[0].send_recv_s == 0.0
    expected = m * (fwd * c + bwd_total) + upd + PROBLEM.timing.step_overhead_s
    assert e.iteration_time_s == pytest.approx(expected, rel=1e-9)
    # money: GPUs x $/s x time; no traffic leaves the GPU group
    price = PROBLEM.prices[(gpu, zone)] / 3600.0
    assert e.cost_compute_usd == pytest.approx(tp * price * e.iteration_time_s, rel=1e-9)
    assert e.cost_egress_usd == 0.0


@SETTINGS
@given(plan=plans())
def test_estimate_within_5pct_of_event_simulation(plan):
    """Random heterogeneous plans: the fast estimate stays within 5% of the event simulation of
    the same operations and is never optimistic by more than 1%."""
    e = estimate(PROBLEM, plan).iteration_time_s
    sim = simulate(PROBLEM, plan).iteration_time_s
    assert sim * 0.99 <= e <= sim * 1.05


@SETTINGS
@given(plan=plans())
def test_estimate_is_sane(plan):
    """Finite positive time; memory parts add up; OOM verdict agrees with capacity."""
    e = estimate(PROBLEM, plan)
    assert 0 < e.iteration_time_s < float("inf")
    assert e.num_gpus == plan.num_gpus
    assert 0 < e.mfu < 1
    for w in e.workers:
        parts = (w.weights_grads_optimizer_bytes + w.activation_bytes + w.buffer_bytes
                 + w.framework_bytes)
        assert w.peak_memory_bytes == pytest.approx(parts, rel=1e-12)
        assert w.oom == (w.peak_memory_bytes > w.capacity_bytes)
        assert w.capacity_bytes == PROBLEM.gpus[w.gpu].memory_bytes
    assert e.oom == any(w.oom for w in e.workers)
    assert {tuple(s.layers) for s in e.stages} == {tuple(s.layers) for s in plan.stages}


@SETTINGS
@given(plan=plans(), zero=st.sampled_from([0, 1, 2]), ratio=st.floats(1.0, 4.0))
def test_sharded_sync_ratio_scales_only_the_sync_of_zero_plans(plan, zero, ratio):
    data = scenario()
    data["job"]["zero_stage"] = [0, 1, 2]
    problem = build(data)
    # without overlap, the sync is the whole collective (its exposed part is tested below)
    problem = problem.with_constants(timing=dataclasses.replace(problem.timing,
                                                                grad_reduce_overlap=0.0))
    plan = plan.model_copy(update={"zero_stage": zero})
    base = estimate(problem, plan)
    scaled = estimate(problem.with_constants(
        timing=dataclasses.replace(problem.timing, sharded_sync_ratio=ratio)), plan)
    for a, b in zip(scaled.stages, base.stages, strict=True):
        want = b.gradient_sync_s * (ratio if zero else 1.0)
        assert a.gradient_sync_s == pytest.approx(want, rel=1e-9, abs=1e-15)
    if zero == 0:
        assert scaled.iteration_time_s == base.iteration_time_s
    else:
        assert scaled.iteration_time_s >= base.iteration_time_s * (1 - REL)


@SETTINGS
@given(plan=plans(), overlap=st.floats(0.0, 1.0))
def test_overlapping_the_gradient_reduction_never_slows_and_never_hides_more_than_it_has(
        plan, overlap):
    """The part of a stage's gradient reduction the stack overlaps with the last backward
    comes off the iteration: more overlap is never slower, and the exposed sync is never
    negative nor more than the reduction without overlap."""
    none = PROBLEM.with_constants(timing=dataclasses.replace(PROBLEM.timing,
                                                             grad_reduce_overlap=0.0))
    some = PROBLEM.with_constants(timing=dataclasses.replace(PROBLEM.timing,
                                                             grad_reduce_overlap=overlap))
    e0, e1 = estimate(none, plan), estimate(some, plan)
    assert e1.iteration_time_s <= e0.iteration_time_s * (1 + REL)
    for a, b in zip(e1.stages, e0.stages, strict=True):
        assert -1e-12 <= a.gradient_sync_s <= b.gradient_sync_s * (1 + REL) + 1e-12


def test_overlap_hides_a_reduction_shorter_than_the_backward():
    """The property above must be able to fail: a replica whose backward outlasts its ring
    shows no sync with full overlap, and the whole ring without."""
    p = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [{"layers": [0, N_LAYERS],
                                     "replicas": [{"gpu": "A100-40GB", "tp": 1, "zone": ZONES[0],
                                                   "microbatches": GLOBAL_BATCH // 2}] * 2}]})
    sync = {}
    for ov in (0.0, 1.0):
        pb = PROBLEM.with_constants(timing=dataclasses.replace(PROBLEM.timing,
                                                               grad_reduce_overlap=ov))
        sync[ov] = estimate(pb, p).stages[0].gradient_sync_s
    assert sync[0.0] > 0 and sync[1.0] < sync[0.0]
