"""Plan quality of `auto` (and `sailor`) against `exhaustive` on seeded random small problems.

Each problem: a dense model of 2 to --max-blocks blocks (default 8), A100-40GB and V100-16GB in
one or two zones of one region (--max-gpus drawn, default 6, plus one when a zone draws none;
exhaustive enumeration grows as replicas^stages, and a pool with more than its limit of plans is
drawn again and counted), 2 or 4 GPUs per node, a global batch of 8-32. For each objective, the
gap of each strategy's best plan to the exhaustive optimum (iteration time for max-throughput,
USD/iteration for min-cost); worst and mean gaps over all problems, and search times.

    python benchmarks/planner_quality.py [--problems 20] [--seed 0] [--max-gpus 6] [--max-blocks 8]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from shoal.errors import InfeasibleError, SpecError  # noqa: E402
from shoal.problem import build_problem  # noqa: E402
from shoal.specs.scenario import parse_scenario  # noqa: E402
from shoal.training.planners import search  # noqa: E402

KEY = {"max-throughput": "iteration_time_s", "min-cost": "cost_usd"}


def random_problem(rng: random.Random, max_gpus: int = 6, max_blocks: int = 8
                   ) -> tuple[dict, object]:
    hidden = rng.choice([512, 1024, 2048])
    zones = {"us-central1-a": {}}
    if rng.random() < 0.5:
        zones["us-central1-b"] = {}
    budget = max_gpus
    for z in zones:
        gpus = {}
        for g in ("A100-40GB", "V100-16GB"):
            n = rng.randint(0, min(max_gpus, budget))
            if n:
                gpus[g] = n
                budget -= n
        zones[z] = {"gpus": gpus or {"A100-40GB": 1}}
    gpn = rng.choice([2, 4])
    data = {
        "model": {"name": "rand", "num_layers": rng.randint(2, max_blocks), "hidden_size": hidden,
                  "num_heads": hidden // 64, "vocab_size": 32000, "max_seq_len": 2048},
        "job": {"global_batch": rng.choice([8, 16, 32]), "seq_len": rng.choice([1024, 2048]),
                "schedule": ["1f1b"], "zero_stage": [0], "recompute": [False]},
        "pool": {"regions": {"us-central1": {"zones": {z: v for z, v in zones.items()}}},
                 "gpus_per_node": {"A100-40GB": gpn, "V100-16GB": gpn}},
        "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "20us"},
                                 "same_region": {"bandwidth": "25Gbps", "latency": "1ms"}}},
    }
    return data, build_problem(parse_scenario(data, file="random.yaml"), file="random.yaml")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-gpus", type=int, default=6, help="GPUs drawn for the pool, at most")
    ap.add_argument("--max-blocks", type=int, default=8)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    rows, too_large = [], 0
    while len(rows) < args.problems:
        data, pb = random_problem(rng, args.max_gpus, args.max_blocks)
        row = {"pool": {z: v["gpus"] for z, v in data["pool"]["regions"]["us-central1"]["zones"].items()},
               "blocks": data["model"]["num_layers"], "hidden": data["model"]["hidden_size"],
               "batch": data["job"]["global_batch"]}
        try:
            for objective, key in KEY.items():
                t0 = time.perf_counter()
                ex = search(pb, strategy="exhaustive", objective=objective).ranked[0]
                t_ex = time.perf_counter() - t0
                for strategy in ("auto", "sailor"):
                    t0 = time.perf_counter()
                    got = search(pb, strategy=strategy, objective=objective).ranked[0]
                    row[f"{objective}/{strategy}_gap"] = getattr(got, key) / getattr(ex, key) - 1
                    row[f"{objective}/{strategy}_s"] = round(time.perf_counter() - t0, 3)
                row[f"{objective}/exhaustive_s"] = round(t_ex, 3)
        except InfeasibleError:  # a pool nothing fits: draw another
            continue
        except SpecError:  # too many plans for exhaustive enumeration: draw another
            too_large += 1
            continue
        rows.append(row)
        print(json.dumps(row), file=sys.stderr)
    summary = {}
    for objective in KEY:
        for strategy in ("auto", "sailor"):
            gaps = [r[f"{objective}/{strategy}_gap"] for r in rows]
            summary[f"{objective}/{strategy}"] = {
                "worst_gap": round(max(gaps), 5), "mean_gap": round(sum(gaps) / len(gaps), 5),
                "within_1pct": sum(g <= 0.01 for g in gaps),
                "median_time_s": sorted(r[f"{objective}/{strategy}_s"] for r in rows)[len(rows) // 2]}
        summary[f"{objective}/exhaustive_median_time_s"] = sorted(
            r[f"{objective}/exhaustive_s"] for r in rows)[len(rows) // 2]
    print(json.dumps({"problems": len(rows), "seed": args.seed, "max_gpus": args.max_gpus,
                      "max_blocks": args.max_blocks, "too_large_for_exhaustive": too_large,
                      "summary": summary,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
