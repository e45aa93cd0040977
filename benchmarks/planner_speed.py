"""Planner search time and plan quality on Sailor's pools, `auto` against `sailor`, one run.

Pools come from Sailor's availability traces, jobs from its training configs, layer times from
its measured profiles (GPT-Neo-2.7B on A100-40GB and V100-16GB; OPT-350M on both), network curves
from its fitted coefficients; all through `shoal import sailor`. For each scenario: search time
of each strategy (median of --repeats runs), and the best plan's estimated iterations/s and
USD/iteration under shoal's estimator.

    python benchmarks/planner_speed.py [--repeats 3] [--only NAME] [--budget 600]
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
from _reference import reference_dir  # noqa: E402
from shoal.io.sailor import import_sailor  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.training.planners import search  # noqa: E402

NEO, OPT = "training_config_gpt_neo27.json", "training_config_opt_350.json"
HET, GEO = "gpu_trace_heterogeneous_imbalanced.csv", "gpu_trace_multizone.csv"
SCENARIOS = {
    "gptneo_32a_96v": (NEO, "GPT-Neo-2.7", HET, 0),
    "gptneo_80a_240v": (NEO, "GPT-Neo-2.7", HET, 1),
    "gptneo_128a_384v": (NEO, "GPT-Neo-2.7", HET, 2),
    "opt350_128a_384v": (OPT, "OPT-350", HET, 2),
    "opt350_5zones_128a": (OPT, "OPT-350", GEO, 2),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None)
    ap.add_argument("--budget", type=float, default=600.0, help="seconds per search")
    args = ap.parse_args()
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    s = ref / "sailor"
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (cfg, prof, trace, step) in SCENARIOS.items():
            if args.only and args.only != name:
                continue
            d = Path(tmp) / name
            import_sailor(training_config=s / "configs" / cfg,
                          cluster_config=s / "configs" / "basic_cluster_config.json",
                          profiles=s / "profiles" / prof, network=s / "network", out_dir=d,
                          trace=s / "traces" / trace, step=step)
            pb = load_problem(d / "scenario.yaml")
            row = {}
            for strategy in ("sailor", "auto"):
                times, res = [], None
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    res = search(pb, strategy=strategy, objective="max-throughput",
                                 budget_s=args.budget)
                    times.append(time.perf_counter() - t0)
                best = res.ranked[0]
                p = best.plan
                row[strategy] = {"search_time_s": round(float(np.median(times)), 3),
                                 "iters_per_s": round(best.throughput_iters_per_s, 5),
                                 "usd_per_iter": round(best.cost_usd, 4),
                                 "stages": len(p.stages), "pipelines": len(p.stages[0].replicas),
                                 "mbs": p.microbatch_size, "gpus": best.num_gpus,
                                 "costed": res.stats.candidates_costed,
                                 "truncated": res.stats.truncated}
            row["auto_over_sailor_time"] = round(row["auto"]["search_time_s"]
                                                 / row["sailor"]["search_time_s"], 2)
            out[name] = row
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
