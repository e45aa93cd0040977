"""Re-planning speed: one planner that remembers earlier pools against cold searches, over
seeded random single-type availability changes, one run.

Scenario: Sailor's GPT-Neo-2.7B job (global batch 2048, sequence 2048) with its measured layer
profiles and network curves, on 2 zones x (128 A100-40GB + 128 V100-16GB) (Sailor's
`gpu_trace_2zones_2gpus.csv`). Each change sets one (GPU type, zone) count to a random number of
whole nodes within [0, 128]. For every change: the `Replanner` time (it has seen the earlier
pools of the sequence) and a cold `search` of the same pool, both for the best plans only (no
throughput-cost front, as the `Replanner` searches); the estimated iterations/s of both; which
path the re-plan took (a pool seen before, a search bounded because a larger pool's best plan
fits, or a full search), with the count and median time of each.

    python benchmarks/replan_speed.py [--changes 100] [--seed 0] [--model gptneo|opt350]
        [--capacity 128] [--budget 600] [--no-cold]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_or_skip  # noqa: E402
from shoal.elastic.replan import Replanner  # noqa: E402
from shoal.errors import InfeasibleError  # noqa: E402
from shoal.io.sailor import SailorFiles, import_sailor  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.training.planners import Limits, search  # noqa: E402

MODELS = {"gptneo": ("training_config_gpt_neo27.json", "GPT-Neo-2.7"),
          "opt350": ("training_config_opt_350.json", "OPT-350")}


def changes(keys, capacity: int, gpn: int, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    cur = {k: capacity for k in keys}
    out = []
    for _ in range(n):
        k = keys[int(rng.integers(len(keys)))]
        step = int(rng.integers(1, 9)) * gpn * (1 if rng.random() < 0.5 else -1)
        new = min(capacity, max(0, cur[k] + step))
        if new == cur[k]:
            new = min(capacity, max(0, cur[k] - step))
        cur = {**cur, k: new}
        out.append(dict(cur))
    return out


def best_plan(fn) -> float:
    """Iterations/s of the best plan ``fn`` returns; 0 when nothing fits."""
    try:
        return fn().ranked[0].throughput_iters_per_s
    except InfeasibleError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--changes", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", choices=sorted(MODELS), default="gptneo")
    ap.add_argument("--capacity", type=int, default=128, help="GPUs per type and zone at most")
    ap.add_argument("--budget", type=float, default=600.0, help="seconds per search")
    ap.add_argument("--no-cold", action="store_true", help="skip the cold searches")
    args = ap.parse_args()
    ref = reference_or_skip()
    if ref is None:
        return
    cfg, prof = MODELS[args.model]
    s = ref / "sailor"
    with tempfile.TemporaryDirectory() as tmp:
        import_sailor(SailorFiles(training_config=s / "configs" / cfg,
                                  cluster_config=s / "configs" / "basic_cluster_config.json",
                                  profiles=s / "profiles" / prof, network=s / "network",
                                  trace=s / "traces" / "gpu_trace_2zones_2gpus.csv", step=0),
                      Path(tmp))
        problem = load_problem(Path(tmp) / "scenario.yaml")
        keys = sorted(problem.avail)
        full = {k: args.capacity for k in keys}
        gpn = max(g.gpus_per_node for g in problem.gpus.values())
        rp = Replanner(problem, budget_s=args.budget)
        t = time.perf_counter()
        first = best_plan(lambda: rp.plan(full))
        first_s = time.perf_counter() - t
        rows = []
        for i, avail in enumerate(changes(keys, args.capacity, gpn, args.changes, args.seed)):
            t = time.perf_counter()
            warm = best_plan(lambda a=avail: rp.plan(a))
            warm_s = time.perf_counter() - t
            call = rp.calls[-1]
            row = {"change": i, "gpus": sum(avail.values()), "replan_s": warm_s,
                   "replan_iters_per_s": warm, "remembered": call.remembered,
                   "path": ("memory" if call.remembered else
                            "bounded" if call.from_larger else "full")}
            if not args.no_cold:
                cold_problem = problem.__class__(**{**problem.__dict__, "avail": avail})
                t = time.perf_counter()
                row["cold_iters_per_s"] = best_plan(
                    lambda p=cold_problem: search(p, limits=Limits(budget_s=args.budget, front=False)))
                row["cold_s"] = time.perf_counter() - t
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    rs = np.array([r["replan_s"] for r in rows])
    out = {"model": args.model, "capacity": args.capacity, "changes": len(rows),
           "seed": args.seed, "first_search_s": first_s, "first_iters_per_s": first,
           "replan_median_s": float(np.median(rs)), "replan_max_s": float(rs.max()),
           # per path (a pool seen before; a search bounded to a few pairs because a larger
           # pool's best plan fits; a full search): how many re-plans and their median time
           "paths": {p: {"count": len(ts), "median_s": float(np.median(ts))}
                     for p in ("memory", "bounded", "full")
                     if (ts := [r["replan_s"] for r in rows if r["path"] == p])}}
    if not args.no_cold:
        cs = np.array([r["cold_s"] for r in rows])
        worse = [r for r in rows if r["replan_iters_per_s"] < r["cold_iters_per_s"] * (1 - 1e-9)]
        out.update({"cold_median_s": float(np.median(cs)),
                    "median_ratio_replan_to_cold": float(np.median(rs / cs)),
                    "replan_worse_than_cold": len(worse),
                    "worst_replan_to_cold": float(min(
                        (r["replan_iters_per_s"] / r["cold_iters_per_s"] for r in rows
                         if r["cold_iters_per_s"] > 0), default=1.0))})
    out["rows"] = rows
    print(json.dumps(out))


if __name__ == "__main__":
    main()
