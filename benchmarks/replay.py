"""Replay policies on availability traces: tokens and tokens per dollar of `shoal`, `always`,
`never` and `oracle`, one run.

Jobs and layer profiles are Sailor's (OPT-350M, global batch 1024; GPT-Neo-2.7B, 2048; sequence
2048; measured on A100-40GB and V100-16GB), through `shoal import sailor`. Traces: Sailor's
controller traces (A100-40GB in one zone: `a100_trace.json`, `a100_trace_16.json`,
`a100_trace_original.json`) on a pool of that zone, and seeded synthetic traces (spot, scarcity,
outage) on 2 zones x (A100-40GB + V100-16GB), --capacity GPUs of each per zone. Every state is
planned once (`Replanner`); the policies then run on the same plans. Switching parameters are the
scenario defaults (shoal.specs.switching).

    python benchmarks/replay.py [--capacity 8] [--hours 8] [--seeds 0] [--only NAME]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_or_skip  # noqa: E402
from shoal.elastic.policy import POLICIES  # noqa: E402
from shoal.elastic.replan import Replanner  # noqa: E402
from shoal.elastic.replay import plan_trace, simulate  # noqa: E402
from shoal.elastic.traces import synthetic  # noqa: E402
from shoal.io.sailor import SailorFiles, import_sailor  # noqa: E402
from shoal.io.traces import load_trace  # noqa: E402
from shoal.problem import load_problem  # noqa: E402

MODELS = {"opt350m": ("training_config_opt_350.json", "OPT-350"),
          "gptneo27b": ("training_config_gpt_neo27.json", "GPT-Neo-2.7")}
SAILOR_TRACES = ("a100_trace.json", "a100_trace_16.json", "a100_trace_original.json")
KINDS = ("spot", "scarcity", "outage")


def scenario(ref: Path, model: str, out: Path, zones: dict[str, dict[str, int]]) -> Path:
    cfg, prof = MODELS[model]
    s = ref / "sailor"
    trace = ("gpu_trace_2zones_2gpus.csv" if len(zones) > 1
             else "gpu_trace_heterogeneous_imbalanced.csv")
    import_sailor(SailorFiles(training_config=s / "configs" / cfg,
                              cluster_config=s / "configs" / "basic_cluster_config.json",
                              profiles=s / "profiles" / prof, network=s / "network",
                              trace=s / "traces" / trace, step=0), out)
    path = out / "scenario.yaml"
    d = yaml.safe_load(path.read_text())
    d["pool"]["regions"]["us-central1"]["zones"] = {z: {"gpus": g} for z, g in zones.items()}
    path.write_text(yaml.safe_dump(d, sort_keys=False))
    return path


def run(problem, tr) -> dict:
    rp = Replanner(problem)
    t0 = time.perf_counter()
    options = plan_trace(problem, tr, rp)
    plan_s = time.perf_counter() - t0
    row = {"states": len(tr.states), "hours": tr.end_s / 3600, "planning_s": round(plan_s, 2),
           "distinct_pools": sum(not c.remembered for c in rp.calls)}
    for p in POLICIES:
        t = simulate(problem, tr, options, p).totals()
        row[p] = {"tokens": t["tokens"], "tokens_per_usd": t["tokens_per_usd"],
                  "cost_usd": round(t["cost_usd"], 2), "moves": t["switches"],
                  "switch_time_s": round(t["switch_time_s"], 1)}
    better = max(row["always"]["tokens"], row["never"]["tokens"])
    row["shoal_over_better_of_always_never"] = row["shoal"]["tokens"] / better if better else 1.0
    row["shoal_over_oracle"] = (row["shoal"]["tokens"] / row["oracle"]["tokens"]
                                if row["oracle"]["tokens"] else 1.0)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=8, help="GPUs per type and zone (synthetic)")
    ap.add_argument("--hours", type=float, default=8.0, help="length of synthetic traces")
    ap.add_argument("--seeds", default="0", help="comma-separated seeds of synthetic traces")
    ap.add_argument("--only", default=None, help="run the rows whose name contains this")
    args = ap.parse_args()
    ref = reference_or_skip()
    if ref is None:
        return
    rows = {}
    zones2 = {z: {"A100-40GB": args.capacity, "V100-16GB": args.capacity}
              for z in ("us-central1-a", "us-central1-b")}
    with tempfile.TemporaryDirectory() as tmp:
        for model in MODELS:
            jobs = []
            for name in SAILOR_TRACES:
                peak = max(e["GPUs"] for e in json.loads(
                    (ref / "sailor" / "traces" / name).read_text()))
                jobs.append((f"{model}/{name}", {"us-central1-a": {"A100-40GB": peak}},
                             lambda pb, n=name: load_trace(ref / "sailor" / "traces" / n, pb)))
            for kind in KINDS:
                for seed in (int(x) for x in args.seeds.split(",")):
                    jobs.append((f"{model}/{kind}-seed{seed}", zones2,
                                 lambda pb, k=kind, sd=seed: synthetic(
                                     pb, k, seed=sd, duration_s=args.hours * 3600)))
            for i, (name, zones, make) in enumerate(jobs):
                if args.only and args.only not in name:
                    continue
                pb = load_problem(scenario(ref, model, Path(tmp) / f"{model}{i}", zones))
                rows[name] = run(pb, make(pb))
                print(json.dumps({name: rows[name]}), file=sys.stderr, flush=True)
    vs_better = [r["shoal_over_better_of_always_never"] for r in rows.values()]
    vs_oracle = [r["shoal_over_oracle"] for r in rows.values()]
    mean = {p: float(np.mean([r[p]["tokens"] / max(r["oracle"]["tokens"], 1e-12)
                              for r in rows.values()])) for p in POLICIES}
    print(json.dumps({"capacity": args.capacity, "hours": args.hours, "rows": rows, "summary": {
        "mean_tokens_over_oracle": mean,
        "worst_shoal_over_better_of_always_never": min(vs_better, default=None),
        "worst_shoal_over_oracle": min(vs_oracle, default=None)}}, indent=1))


if __name__ == "__main__":
    main()
