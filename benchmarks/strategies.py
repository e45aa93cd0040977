"""Every planning strategy on the same scenarios, one table: estimated throughput, $/iteration,
total cost under the training-time SLO, search time, plans found out of memory.

Scenarios (built from the bundled examples; the catalog's models):
- espresso-*: Espresso's testbed (examples/espresso-llama-1.3b.yaml: A6000 x8, A30 x16,
  RTX-3090 x16, A4000 x16, one GPU per instance, 2.5 Gbps) with Espresso's LLaMA-1.3B/3B/7B,
  min-cost under an SLO of 100 iterations within 1 h / 2 h / 3 h (about 1.4, 2 and 2 times the
  fastest plan shoal finds). ``espresso-ref`` is ``propose_every_order`` with at most 12 stages:
  every allocation in every stage order with its bottleneck-optimal split, cut only by valid
  lower bounds: the minimum of Espresso's space that the 4.5% claim is measured against.
- zorse-B-*, zorse-C-*: Zorse's clusters B (one region: 8 A100-40GB, 16 A10G, 16 V100, 24 T4)
  and C (two regions: 16 A10G + 48 T4 | 16 V100 + 48 T4), 8 GPUs per node, LLaMA-1 7B/13B/33B,
  1M-token batches (sequence 1024 on B, 512 on C), activation recompute, ZeRO 0-3,
  max-throughput.
- sailor: examples/het-a100-v100.yaml (GPT-Neo-2.7B on 32 A100 + 96 V100), max-throughput.

Every strategy gets the same search-time budget (``--budget``); a search cut by it says so.

    python benchmarks/strategies.py [--budget 120] [--only espresso|zorse|sailor]
        [--scenario NAME]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from shoal.errors import InfeasibleError  # noqa: E402
from shoal.problem import build_problem  # noqa: E402
from shoal.specs.scenario import parse_scenario  # noqa: E402
from shoal.training.planners import Limits, search  # noqa: E402
from shoal.training.planners.espresso import propose_every_order  # noqa: E402

NET = {"defaults": {"same_zone": {"bandwidth": "100Gbps", "latency": "50us"},
                    "same_region": {"bandwidth": "25Gbps", "latency": "1ms"},
                    "cross_region": {"bandwidth": "5Gbps", "latency": "20ms"}}}
ZORSE_JOB = {"optimizer": "adam", "precision": "mixed-fp16", "recompute": [True],
             "zero_stage": [0, 1, 2, 3], "schedule": ["1f1b", "gpipe", "zorse"]}
REF_STAGES = 12  # deepest pipelines espresso-ref enumerates
# Zorse's Table 5, measured TFLOPS on its clusters: (Zorse, TorchTitan-Het, HexiScale, Cephalo);
# None where the paper reports OOM
TABLE5 = {"zorse-B-7B": (3412.88, 2033.53, 1194.89, 2274.50),
          "zorse-B-13B": (2965.64, 1956.09, 1152.73, 1992.24),
          "zorse-B-30B": (2658.29, None, 657.16, 1373.31),
          "zorse-C-7B": (3936.94, 2441.70, 2624.63, 1213.39),
          "zorse-C-13B": (3357.97, 2061.55, 1952.31, 1222.96),
          "zorse-C-30B": (1548.60, None, None, 775.42)}
PRICES = {"A100-40GB": 3.67, "V100-16GB": 2.48, "A10G": 1.006, "T4": 0.35}


def scenarios(only: str | None) -> list[tuple[str, dict, list[str]]]:
    out = []
    if only in (None, "espresso"):
        base = yaml.safe_load((ROOT / "examples" / "espresso-llama-1.3b.yaml").read_text())
        for model, hours in (("Espresso-LLaMA-1.3B", 1), ("Espresso-LLaMA-3B", 2),
                             ("Espresso-LLaMA-7B", 3)):
            d = copy.deepcopy(base)
            d["model"] = model
            d["constraints"] = {"deadline": {"iterations": 100, "within": f"{hours}h"}}
            out.append((f"espresso-{model.split('-')[-1]}", d,
                        ["sailor", "espresso", "zorse", "auto", "espresso-ref"]))
    if only in (None, "zorse"):
        pools = {
            "B": ({"us-east-1": {"zones": {"us-east-1a": {"gpus": {
                "A100-40GB": 8, "A10G": 16, "V100-16GB": 16, "T4": 24}}}}}, 1024, 1024),
            "C": ({"us-east-1": {"zones": {"us-east-1a": {"gpus": {"A10G": 16, "T4": 48}}}},
                   "us-east-2": {"zones": {"us-east-2a": {"gpus": {"V100-16GB": 16, "T4": 48}}}}},
                  512, 2048),
        }
        for name, (regions, seq, batch) in pools.items():
            for model in ("LLaMA-1-7B", "LLaMA-1-13B", "LLaMA-1-30B"):
                d = {"schema": "shoal/scenario@1", "name": f"Zorse {name} {model}", "model": model,
                     "job": {"global_batch": batch, "seq_len": seq, **ZORSE_JOB},
                     "pool": {"regions": regions,
                              "gpus_per_node": {g: 8 for g in PRICES}},
                     "network": NET, "prices": {"gpu_usd_per_h": PRICES},
                     "objective": "max-throughput"}
                out.append((f"zorse-{name}-{model.split('-')[-1]}", d,
                            ["sailor", "zorse", "auto"]))
    if only in (None, "sailor"):
        d = yaml.safe_load((ROOT / "examples" / "het-a100-v100.yaml").read_text())
        out.append(("sailor-het", d, ["sailor", "zorse", "auto"]))
    return out


def run(pb, strategy: str, budget: float) -> dict:
    t0 = time.perf_counter()
    try:
        if strategy == "espresso-ref":
            res = search(pb, strategy=propose_every_order, top_k=1,
                         limits=Limits(max_stages=REF_STAGES, budget_s=budget))
        else:
            res = search(pb, strategy=strategy, top_k=1, limits=Limits(budget_s=budget))
    except InfeasibleError as e:
        return {"strategy": strategy, "found": False, "why": e.binding,
                "search_s": round(time.perf_counter() - t0, 2)}
    best = res.ranked[0]
    dl = pb.constraints.deadline
    tokens = pb.job.global_batch * pb.job.seq_len
    # hardware FLOP/s as Zorse counts them: forward, backward and the recomputed forward
    flops = (4.0 if best.plan.recompute else 3.0) * float(pb.sizes.fwd_flops.sum()) \
        * pb.job.global_batch * best.throughput_iters_per_s
    return {"strategy": strategy, "found": True,
            "tokens_per_s": round(tokens * best.throughput_iters_per_s, 1),
            "tflops": round(flops / 1e12, 1),
            "usd_per_iter": round(best.cost_usd, 5),
            "total_usd_slo": round(best.cost_usd * dl.iterations, 3) if dl else None,
            "gpus": best.num_gpus, "plan": best.plan.summary(),
            "schedule": best.plan.schedule + (f" x{best.plan.ministages}"
                                              if best.plan.schedule == "zorse" else ""),
            "search_s": round(res.stats.search_time_s, 2), "oom_plans": res.stats.oom,
            "truncated": res.stats.truncated}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=120.0)
    ap.add_argument("--only", choices=["espresso", "zorse", "sailor"])
    ap.add_argument("--scenario", help="only the scenario of this name (e.g. zorse-B-7B)")
    args = ap.parse_args()
    rows = []
    chosen = [x for x in scenarios(args.only) if args.scenario in (None, x[0])]
    if not chosen:
        ap.error(f"--scenario {args.scenario!r}: not one of "
                 + ", ".join(x[0] for x in scenarios(args.only)))
    for name, data, strategies in chosen:
        pb = build_problem(parse_scenario(data, file=f"{name}.yaml"), file=f"{name}.yaml")
        for s in strategies:
            r = {"scenario": name, **run(pb, s, args.budget)}
            if name in TABLE5:
                r["zorse_table5_tflops"] = dict(zip(
                    ("zorse", "torchtitan_het", "hexiscale", "cephalo"), TABLE5[name],
                    strict=True))
            rows.append(r)
            print(json.dumps(r), file=sys.stderr, flush=True)
    print(json.dumps({"budget_s": args.budget, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
