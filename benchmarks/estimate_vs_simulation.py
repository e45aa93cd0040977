"""The fast estimate against the discrete-event simulation of the same operations.

Random valid plans (1-8 stages cut anywhere in OPT-350M's layer list, 1-4 pipelines with uneven
microbatch shares, a random GPU type, TP degree and zone per replica, 1F1B or GPipe), and plans
with identical stages. Prints JSON: error of the estimate relative to the simulation.

    python benchmarks/estimate_vs_simulation.py [--plans 500] [--seed 0]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from shoal.estimate import estimate
from shoal.estimate.timeline import simulate
from shoal.problem import build_problem
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

GPUS = ["A100-40GB", "V100-16GB", "A100-80GB"]
ZONES = ["us-central1-a", "us-central1-b", "us-west1-b"]


def problem():
    return build_problem(parse_scenario({
        "model": "OPT-350M",
        "job": {"global_batch": 256, "seq_len": 2048, "recompute": [False, True]},
        "pool": {"regions": {
            "us-central1": {"zones": {z: {"gpus": {g: 1024 for g in GPUS}} for z in ZONES[:2]}},
            "us-west1": {"zones": {ZONES[2]: {"gpus": {g: 1024 for g in GPUS}}}}}},
        "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                                 "same_region": {"bandwidth": "20Gbps", "latency": "1ms"},
                                 "cross_region": {"bandwidth": "5Gbps", "latency": "30ms"}}},
    }))


def random_plan(rng, L: int, identical: bool = False) -> TrainingPlan:
    S = int(rng.integers(1, 9))
    if identical:
        S = int(rng.choice([1, 2, 13, 26]))
        edges = list(range(0, L + 1, L // S))
    else:
        edges = [0, *sorted(rng.choice(np.arange(1, L), S - 1, replace=False).tolist()), L]
    mbs = int(rng.choice([1, 2, 4]))
    total = 256 // mbs
    d = int(rng.integers(1, 5))
    cuts = sorted(rng.choice(np.arange(1, total), d - 1, replace=False).tolist())
    shares = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
    gpu, tp, zone = GPUS[0], 1, ZONES[0]
    stages = []
    for i in range(S):
        reps = []
        for j in range(d):
            if not identical:
                gpu = GPUS[int(rng.integers(3))]
                tp = int(rng.choice([1, 2, 4]))
                zone = ZONES[int(rng.integers(3))]
            reps.append({"gpu": gpu, "tp": tp, "zone": zone, "microbatches": shares[j]})
        stages.append({"layers": [edges[i], edges[i + 1]], "replicas": reps})
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "stages": stages,
        "schedule": "1f1b" if identical else str(rng.choice(["1f1b", "gpipe"])),
        "recompute": bool(rng.integers(2))})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plans", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    pb = problem()
    rng = np.random.default_rng(args.seed)
    out = {}
    for kind in ("heterogeneous", "identical_stages"):
        errs = []
        for _ in range(args.plans):
            plan = random_plan(rng, pb.n_layers, identical=kind == "identical_stages")
            e = estimate(pb, plan).iteration_time_s
            s = simulate(pb, plan).iteration_time_s
            errs.append(e / s - 1)
        errs = np.array(errs) * 100
        out[kind] = {"plans": len(errs), "max_pessimistic_pct": round(float(errs.max()), 3),
                     "max_optimistic_pct": round(float(-errs.min()), 3),
                     "mean_abs_pct": round(float(np.abs(errs).mean()), 4)}
    out["targets"] = {"identical_stages_within_pct": 1, "heterogeneous_within_pct": 5,
                      "never_optimistic_by_more_than_pct": 1}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
