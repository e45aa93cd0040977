"""Estimator speed: batched kernel (plans/s on one core), one full estimate(), one event simulation.

    python benchmarks/estimator_speed.py [--repeats 7]

Batched kernel: B random valid plans of 8 stages with up to 32 replicas per stage, GPU type per
replica drawn from 3 types in 2 zones, evaluated in one kernel call (how the planners call it).
Medians over repeats; the process is pinned to one core where the OS allows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from shoal.estimate import estimate
from shoal.estimate.api import run_kernel, tables_for
from shoal.estimate.kernel import Batch
from shoal.estimate.timeline import simulate
from shoal.problem import build_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

GPUS = ["A100-40GB", "V100-16GB", "A100-80GB"]
ZONES = ["us-central1-a", "us-central1-b"]


def problem():
    scn = parse_scenario({
        "model": "GPT-3-7.5B",
        "job": {"global_batch": 2048, "seq_len": 2048},
        "pool": {"regions": {"us-central1": {"zones": {
            z: {"gpus": {g: 512 for g in GPUS}} for z in ZONES}}}},
        "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                                 "same_region": {"bandwidth": "25Gbps", "latency": "1ms"}}},
    })
    return build_problem(scn)


def random_batch(pb, tb, B: int, S: int = 8, R: int = 32, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    L = pb.n_layers
    cuts = np.sort(np.stack([rng.choice(np.arange(1, L), S - 1, replace=False) for _ in range(B)]), 1)
    ls = np.concatenate([np.zeros((B, 1), int), cuts], 1)
    le = np.concatenate([cuts, np.full((B, 1), L)], 1)
    d = rng.integers(1, R + 1, B)
    rmask = np.broadcast_to(np.arange(R)[None, None, :] < d[:, None, None], (B, S, R)).copy()
    total_mb = pb.job.global_batch // tb.mbs[0]
    m = np.where(rmask, (total_mb // d)[:, None, None], 0)
    return Batch(
        mbs_idx=np.zeros(B, int), ls=ls, le=le, smask=np.ones((B, S), bool),
        g=rng.integers(0, len(tb.gpus), (B, S, R)), t=rng.integers(0, len(tb.tps), (B, S, R)),
        z=rng.integers(0, len(tb.zones), (B, S, R)), m=m, rmask=rmask,
        recompute=rng.random(B) < 0.5, zero=np.zeros(B, int), gpipe=np.zeros(B, bool))


def plan_8x(pb) -> TrainingPlan:
    L = pb.n_layers
    edges = np.linspace(0, L, 9).astype(int)
    stages = [{"layers": [int(edges[i]), int(edges[i + 1])],
               "replicas": [{"gpu": GPUS[(i + r) % 3], "tp": 4, "zone": ZONES[r % 2],
                             "microbatches": 128} for r in range(4)]} for i in range(8)]
    return TrainingPlan.model_validate({"microbatch_size": 4, "stages": stages})


def median_time(fn, repeats: int) -> float:
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--batch", type=int, default=4096)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pb = problem()
    tb = tables_for(pb, [4])
    batch = random_batch(pb, tb, args.batch)
    run_kernel(pb, tb, batch)  # warm up
    t_batch = median_time(lambda: run_kernel(pb, tb, batch), args.repeats)
    plan = plan_8x(pb)
    estimate(pb, plan, tables=tb)
    t_est = median_time(lambda: estimate(pb, plan, tables=tb), args.repeats)
    t_est_cold = median_time(lambda: estimate(pb, plan), args.repeats)
    one_pipe = [{**st, "replicas": [{**st["replicas"][0], "microbatches": 64}]}
                for st in plan.to_json()["stages"]]
    plan64 = TrainingPlan.model_validate({**plan.to_json(), "stages": one_pipe,
                                          "microbatch_size": 32})
    t_sim = median_time(lambda: simulate(pb, plan64), args.repeats)
    print(json.dumps({
        "machine": {"python": platform.python_version(), "cpu": platform.processor() or platform.machine(),
                    "cores_used": 1},
        "batched_kernel": {"plans": args.batch, "stages": 8, "max_replicas": 32, "gpu_types": 3,
                           "median_s": round(t_batch, 4),
                           "plans_per_s": round(args.batch / t_batch)},
        "estimate_with_breakdown_ms": {"tables_reused": round(t_est * 1e3, 2),
                                       "including_table_build": round(t_est_cold * 1e3, 2)},
        "event_simulation_8_stages_64_microbatches_ms": round(t_sim * 1e3, 2),
        "targets": {"plans_per_s": 20000, "estimate_ms": 5, "simulation_ms": 50},
    }, indent=1))


if __name__ == "__main__":
    main()
