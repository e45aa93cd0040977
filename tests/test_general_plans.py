"""Plans that are not a set of pipelines: stages with different replica counts, uneven and
stage-specific microbatch shares. The event simulation equals the batched kernel on pipelines,
and behaves as a schedule must on the rest."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shoal.estimate import estimate, general
from shoal.estimate.api import run_kernel, tables_for
from shoal.estimate.encode import encode_specs, to_spec
from shoal.problem import load_problem
from shoal.specs.plan import TrainingPlan, owners
from shoal.training.planners import search

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def het():
    pb = load_problem(EXAMPLES / "het-a100-v100.yaml")
    plan = json.loads((EXAMPLES / "het-a100-v100.plan.json").read_text())
    return pb, plan


@lru_cache(maxsize=1)
def small_het():
    """The example pool with a 64-sequence batch: quick to simulate."""
    import yaml

    from shoal.problem import build_problem
    from shoal.specs.scenario import parse_scenario

    data = yaml.safe_load((EXAMPLES / "het-a100-v100.yaml").read_text())
    data["job"]["global_batch"] = 64
    return build_problem(parse_scenario(data, file="small.yaml"), file="small.yaml")


@lru_cache(maxsize=1)
def small_tables():
    return tables_for(small_het(), [1])


def test_simulation_equals_kernel_on_pipelines(het):
    """Exact where the kernel runs its recurrence over every microbatch (at most
    ``STEADY_AFTER`` per stage); beyond, it extrapolates at the steady period, never
    optimistic and at most 0.6% pessimistic (``shoal.estimate.pipeline``)."""
    from shoal.estimate.pipeline import STEADY_AFTER

    pb, plan = het
    plans = [TrainingPlan.model_validate(plan)] + [c.plan for c in search(pb, top_k=4).ranked]
    small = [c.plan for c in search(small_het(), top_k=3).ranked]  # few microbatches
    exact = 0
    cases = [(pb, p) for p in plans + [p.model_copy(update={"schedule": "gpipe"})
                                       for p in plans[:2]]]
    for pb, p in cases + [(small_het(), p) for p in small]:
        tb = tables_for(pb, [p.microbatch_size])
        sp = to_spec(p)
        out = run_kernel(pb, tb, encode_specs(tb, [sp]), detail=True)
        sim = general.apply(pb, tb, sp, out)
        m = max(r.microbatches for r in p.stages[0].replicas)
        if m <= STEADY_AFTER * len(p.stages):
            exact += 1
            assert sim["iteration_time_s"][0] == pytest.approx(out["iteration_time_s"][0],
                                                                rel=1e-9)
        else:
            assert sim["iteration_time_s"][0] * (1 - 1e-9) <= out["iteration_time_s"][0] \
                <= sim["iteration_time_s"][0] * 1.006
        assert sim["cost_egress_usd"][0] == pytest.approx(out["cost_egress_usd"][0], rel=1e-9, abs=1e-12)
    assert exact >= 1


@given(shares=st.lists(st.integers(0, 9), min_size=1, max_size=6))
def test_owners_deal_every_share_evenly(shares):
    own = owners(shares)
    assert len(own) == sum(shares)
    for j, n in enumerate(shares):
        picks = [i for i, x in enumerate(own) if x == j]
        assert len(picks) == n
        # spread: replica j's k-th microbatch comes within one round of k * total / share
        for k, i in enumerate(picks):
            assert abs(i - k * sum(shares) / n) <= sum(shares) / n + 1


def _with_stage(plan: dict, s: int, replicas: list[dict]) -> TrainingPlan:
    d = json.loads(json.dumps(plan))
    d["stages"][s]["replicas"] = replicas
    return TrainingPlan.model_validate(d)


def test_fewer_faster_replicas_carry_a_stage(het):
    """8 V100 stages handing off to 4 A100 replicas with twice the share each: the hand-off
    many-to-few works, the A100 stage is twice as busy per replica as with 8, and the iteration
    is no faster than its busiest replica."""
    pb, plan = het
    total = sum(r["microbatches"] for r in plan["stages"][2]["replicas"])
    base = estimate(pb, TrainingPlan.model_validate(plan))
    four = [{"gpu": "A100-40GB", "tp": 4, "zone": "us-central1-a", "microbatches": total // 4}] * 4
    e = estimate(pb, _with_stage(plan, 2, four))
    assert not e.oom
    assert e.stages[2].replicas == 4
    assert e.stages[2].busy_s == pytest.approx(2 * base.stages[2].busy_s, rel=1e-6)
    assert e.iteration_time_s >= max(s.busy_s for s in e.stages)
    assert e.num_gpus == base.num_gpus - 16


def test_shares_by_speed_beat_even_shares():
    """Zorse's point: in a data-parallel group of mixed GPUs, microbatch shares proportional to
    speed finish sooner than even shares."""
    pb = load_problem(EXAMPLES / "het-a100-v100.yaml")
    L = pb.n_layers
    mixed = [("A100-40GB", 4), ("A100-40GB", 4), ("V100-16GB", 4), ("V100-16GB", 4)]

    def plan(shares):
        reps = [{"gpu": g, "tp": t, "zone": "us-central1-a", "microbatches": m}
                for (g, t), m in zip(mixed, shares, strict=True)]
        return TrainingPlan.model_validate({
            "microbatch_size": 1, "recompute": True,
            "stages": [{"layers": [0, L // 2], "replicas": reps},
                       {"layers": [L // 2, L], "replicas": reps}]})

    even = estimate(pb, plan([512] * 4))
    by_speed = estimate(pb, plan([700, 700, 324, 324]))
    assert by_speed.iteration_time_s < even.iteration_time_s


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(counts=st.lists(st.integers(1, 4), min_size=2, max_size=4), seed=st.integers(0, 10_000))
def test_asymmetric_plans_schedule_and_bound(counts, seed):
    """Random stage replica counts and shares: the simulation finishes (no deadlock), every
    replica's busy time is at most the iteration time, and slowing one replica never makes the
    iteration faster."""
    pb = small_het()
    rng = np.random.default_rng(seed)
    total = pb.job.global_batch  # microbatch size 1
    cuts = np.sort(rng.choice(np.arange(1, pb.n_layers), size=len(counts) - 1, replace=False))
    edges = [0, *cuts.tolist(), pb.n_layers]
    stages = []
    for s, n in enumerate(counts):
        w = rng.dirichlet(np.ones(n))
        sh = np.floor(w * total).astype(int)
        sh[-1] += total - sh.sum()
        stages.append({"layers": [edges[s], edges[s + 1]], "replicas": [
            {"gpu": "A100-40GB", "tp": 4, "zone": "us-central1-a", "microbatches": int(m)}
            for m in sh]})
    plan = TrainingPlan.model_validate({"microbatch_size": 1, "recompute": True, "stages": stages})
    tb = small_tables()
    sp = to_spec(plan)
    out = run_kernel(pb, tb, encode_specs(tb, [sp]), detail=True)
    S = len(counts)
    fwd, bwd = out["fwd"][0, :S], out["bwd"][0, :S]
    hop = general.hops(pb, tb, sp)
    ends, busy = general.simulate(sp, fwd, bwd, hop, pb.timing.recv_fraction)
    assert np.all(busy <= ends.max() * (1 + 1e-12))
    s0 = int(rng.integers(S))
    slower = fwd.copy()
    slower[s0] *= 1.5
    ends2, _ = general.simulate(sp, slower, bwd, hop, pb.timing.recv_fraction)
    assert ends2.max() >= ends.max() * (1 - 1e-12)


@settings(max_examples=30, deadline=None)
@given(a=st.integers(0, 20), n=st.integers(1, 14), tp=st.integers(0, 2), dp=st.integers(1, 16),
       inflight=st.integers(1, 8), recompute=st.booleans())
def test_zero_never_raises_memory(a, n, tp, dp, inflight, recompute):
    from shoal.estimate.api import _state_bytes
    from shoal.estimate.kernel import Worker, worker_memory

    pb, tb = small_het(), small_tables()
    b = min(a + n, pb.n_layers)
    totals = []
    for zero in (0, 1, 2, 3):
        parts = worker_memory(tb, pb.memory, _state_bytes(pb)[1],
                              Worker(0, a, b, tp, 1.0, np.bool_(recompute)), float(inflight),
                              np.int64(zero), float(dp))
        totals.append(float(sum(parts)))
    assert totals[1] <= totals[0] and totals[2] <= totals[1] and totals[3] <= totals[2]


def test_timeline_of_an_asymmetric_plan_matches_the_estimate(het, tmp_path):
    from shoal.estimate.timeline import simulate
    from shoal.report.figures import draw_timeline

    pb, plan = het
    total = sum(r["microbatches"] for r in plan["stages"][2]["replicas"])
    four = [{"gpu": "A100-40GB", "tp": 4, "zone": "us-central1-a", "microbatches": total // 4}] * 4
    p = _with_stage(plan, 2, four)
    tl = simulate(pb, p)
    assert tl.iteration_time_s == pytest.approx(estimate(pb, p).iteration_time_s, rel=1e-9)
    per_replica = {}
    for op in tl.ops:
        if op.kind in "FB":
            per_replica[(op.stage, op.replica)] = per_replica.get((op.stage, op.replica), 0) + 1
    assert per_replica[(2, 0)] == 2 * total // 4 and per_replica[(0, 0)] == 2 * total // 8
    assert draw_timeline(pb, p, tmp_path / "t.png").stat().st_size > 10_000


def test_zero3_trades_gathers_for_memory():
    """ZeRO-3 holds less than ZeRO-2 on a data-parallel stage and pays weight gathers in
    every microbatch; the runtime runs it (``tests/test_runtime.py`` checks it trains as one
    process)."""
    import yaml

    from shoal.problem import build_problem
    from shoal.runtime.pipeline import layout
    from shoal.specs.scenario import parse_scenario

    data = yaml.safe_load((EXAMPLES / "het-a100-v100.yaml").read_text())
    data["job"].update(global_batch=64, zero_stage=[2, 3])
    pb = build_problem(parse_scenario(data, file="z3.yaml"), file="z3.yaml")
    L = pb.n_layers
    reps = [{"gpu": "A100-40GB", "tp": 4, "zone": "us-central1-a", "microbatches": 16}] * 4

    def plan(z):
        return TrainingPlan.model_validate({
            "microbatch_size": 1, "recompute": True, "zero_stage": z,
            "stages": [{"layers": [0, L // 2], "replicas": reps},
                       {"layers": [L // 2, L], "replicas": reps}]})

    e2, e3 = estimate(pb, plan(2)), estimate(pb, plan(3))
    assert max(w.peak_memory_bytes for w in e3.workers) < max(w.peak_memory_bytes for w in e2.workers)
    assert e3.iteration_time_s > e2.iteration_time_s
    assert layout(plan(3), pb.model).world == 32
