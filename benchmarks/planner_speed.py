"""Planner speed on Sailor's pools, on the path `shoal plan` runs, one run.

Pools come from Sailor's availability traces, jobs from its training configs, layer times from
its measured profiles (GPT-Neo-2.7B on A100-40GB and V100-16GB; OPT-350M on both), network curves
from its fitted coefficients; all through `shoal import sailor`. For each scenario (medians of
--repeats runs):

- `plan`: the `shoal plan` command's own search (``cli.plan._searches``: the search under the
  objective, then the other objectives' searches completing the front, in one budget, at the
  command's default budget; the longest of those in a copy of the process, as the command runs
  it where a core is spare), with the time to a plan at least as fast as the plan Sailor's own
  planner chose for that pool (rebuilt from `reference/sailor/sailor_runs.md`, estimated by
  shoal), the time to the final best plan and the plans costed;
- `process_s`: the whole `python -m shoal plan SCENARIO --json` process, warm (compiled kernels
  cached) and cold (an empty kernel cache: the first run after an install), once or, with
  --cold-rounds N, the medians of N rounds;
- `auto` and `sailor` alone (``planners.search`` without the front), as before.

    python benchmarks/planner_speed.py [--repeats 3] [--only NAME] [--budget 600] [--cold-rounds 1]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_dir  # noqa: E402
from sailor_faithfulness import fitted, runs_table, sailor_plan  # noqa: E402
from shoal.cli import plan as plan_cmd  # noqa: E402
from shoal.errors import InfeasibleError  # noqa: E402
from shoal.estimate import estimate  # noqa: E402
from shoal.io.sailor import SailorFiles, import_sailor  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.specs.job import Constraints  # noqa: E402
from shoal.training.planners import Limits, search  # noqa: E402
from shoal.training.planners import common as planners_common  # noqa: E402

NEO, OPT = "training_config_gpt_neo27.json", "training_config_opt_350.json"
HET, GEO = "gpu_trace_heterogeneous_imbalanced.csv", "gpu_trace_multizone.csv"
TWO = "gpu_trace_2zones_2gpus.csv"
MAX_THR = ("max-throughput", {})
# name: (training config, profile, trace, trace step, (objective, constraints), pool change)
SCENARIOS = {
    "gptneo_32a_96v": (NEO, "GPT-Neo-2.7", HET, 0, MAX_THR, None),
    "gptneo_80a_240v": (NEO, "GPT-Neo-2.7", HET, 1, MAX_THR, None),
    "gptneo_128a_384v": (NEO, "GPT-Neo-2.7", HET, 2, MAX_THR, None),
    "opt350_128a_384v": (OPT, "OPT-350", HET, 2, MAX_THR, None),
    "opt350_5zones_128a": (OPT, "OPT-350", GEO, 2, MAX_THR, None),
    # Sailor section 5.2.4: 2 zones x (128 A100-40GB + 128 V100-16GB)
    "opt350_2z_mincost_thr0.2": (OPT, "OPT-350", TWO, 0, ("min-cost", {"min_iters_per_s": 0.2}),
                                 None),
    "opt350_2z_maxthr_budget1.2": (OPT, "OPT-350", TWO, 0,
                                   ("max-throughput", {"max_cost_per_iteration_usd": 1.2}), None),
    # three GPU types, 256 each, one zone (A100-80GB: analytic layer times, A100-40GB network)
    "gptneo_3types_256": (NEO, "GPT-Neo-2.7", HET, 2, MAX_THR, "three_types"),
}
# scenario -> (run, step) of reference/sailor/sailor_runs.md whose chosen plan is Sailor's for it
SAILORS_RUN = {"gptneo_32a_96v": ("het_gptneo27", 0), "gptneo_80a_240v": ("het_gptneo27", 1),
               "gptneo_128a_384v": ("het_gptneo27", 2), "opt350_128a_384v": ("het_opt350", 2),
               "opt350_5zones_128a": ("geo_opt350", 2)}
# Sailor's own planner's search time on three pools, measured on this benchmark's machine (2
# cores) from Sailor's public repository, alternating with shoal's runs: the goals are
# plan-at-least-as-good <= 1/10 of it, the whole `shoal plan` search <= it
SAILORS_SEARCH_S = {"gptneo_128a_384v": 10.3, "opt350_128a_384v": 4.4,
                    "opt350_5zones_128a": 0.47}


def three_types(scenario: Path) -> None:
    """256 each of A100-40GB, V100-16GB and A100-80GB in the one zone; the A100-80GB VMs share
    the A100-40GB network curves (same GCP a2 machine family)."""
    d = yaml.safe_load(scenario.read_text())
    zone = d["pool"]["regions"]["us-central1"]["zones"]["us-central1-a"]
    zone["gpus"] = {"A100-40GB": 256, "V100-16GB": 256, "A100-80GB": 256}
    d["pool"]["gpus_per_node"]["A100-80GB"] = 4
    links = d["network"]["links"]
    like = {tuple(lk["gpus"]): lk for lk in links}
    for pair, src in ((("A100-80GB", "A100-80GB"), ("A100-40GB", "A100-40GB")),
                      (("A100-80GB", "A100-40GB"), ("A100-40GB", "A100-40GB")),
                      (("A100-80GB", "V100-16GB"), ("A100-40GB", "V100-16GB"))):
        lk = copy.deepcopy(like[src])
        lk["gpus"] = list(pair)
        links.append(lk)
    d["network"].setdefault("intra_node", {})["A100-80GB"] = d["network"]["intra_node"]["A100-40GB"]
    scenario.write_text(yaml.safe_dump(d, sort_keys=False))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--only", default=None)
    ap.add_argument("--budget", type=float, default=600.0, help="seconds per search")
    ap.add_argument("--cold-rounds", type=int, default=1,
                    help="rounds of the process timing (cold, warm, warm), each on a new cache")
    args = ap.parse_args()
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    s = ref / "sailor"
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (*_, (objective, cons), _) in SCENARIOS.items():
            if args.only and args.only != name:
                continue
            d = Path(tmp) / name
            pb = load_problem(scenario(s, name, d))
            row = {"objective": objective, "constraints": cons}
            target = sailors_time(s, name, pb)
            row["plan"] = user_path(pb, objective, cons, args.repeats, target)
            row["process_s"] = process_times(d / "scenario.yaml", objective, cons,
                                             args.cold_rounds)
            if name in SAILORS_SEARCH_S:
                row["sailors_search_s"] = SAILORS_SEARCH_S[name]
            for strategy in ("sailor", "auto"):
                times, res = [], None
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    try:
                        res = search(pb, strategy=strategy, objective=objective,
                                     constraints=Constraints(**cons),
                                     limits=Limits(budget_s=args.budget))
                    except InfeasibleError as e:
                        res = e
                    times.append(time.perf_counter() - t0)
                if isinstance(res, InfeasibleError):
                    row[strategy] = {"search_time_s": round(float(np.median(times)), 3),
                                     "infeasible": str(res)}
                    continue
                best = res.ranked[0]
                p = best.plan
                row[strategy] = {"search_time_s": round(float(np.median(times)), 3),
                                 "iters_per_s": round(best.throughput_iters_per_s, 5),
                                 "usd_per_iter": round(best.cost_usd, 4),
                                 "stages": len(p.stages), "pipelines": len(p.stages[0].replicas),
                                 "mbs": p.microbatch_size, "gpus": best.num_gpus,
                                 "egress_usd_per_iter": round(best.cost_egress_usd, 4),
                                 # the most regions one stage's replicas span, over the ranking
                                 "stage_regions_max": max(
                                     len({pb.zone_region[r.zone] for r in st.replicas})
                                     for c in res.ranked for st in c.plan.stages),
                                 "plan": describe(p),
                                 "costed": res.stats.candidates_costed,
                                 "truncated": res.stats.truncated}
            row["auto_over_sailor_time"] = round(row["auto"]["search_time_s"]
                                                 / row["sailor"]["search_time_s"], 2)
            out[name] = row
            print(json.dumps({name: row}), file=sys.stderr)
    print(json.dumps(out, indent=1))


def scenario(s: Path, name: str, d: Path) -> Path:
    """Scenario ``name`` of ``SCENARIOS`` imported from Sailor's files (``s``: the reference's
    ``sailor`` folder) into folder ``d``: its scenario file."""
    cfg, prof, trace, step, _, change = SCENARIOS[name]
    import_sailor(SailorFiles(training_config=s / "configs" / cfg,
                              cluster_config=s / "configs" / "basic_cluster_config.json",
                              profiles=s / "profiles" / prof, network=s / "network",
                              trace=s / "traces" / trace, step=step), d)
    if change == "three_types":
        three_types(d / "scenario.yaml")
    return d / "scenario.yaml"


def sailors_time(s: Path, name: str, pb) -> float | None:
    """Shoal's iteration time of the plan Sailor's planner chose for scenario ``name`` (None
    where the reference has none)."""
    if name not in SAILORS_RUN:
        return None
    run, step = SAILORS_RUN[name]
    row = next(r for r in runs_table((s / "sailor_runs.md").read_text())
               if r["run"] == run and r["step"] == step)
    zone = sorted({z for _, z in pb.avail})[0]
    plan, _ = fitted(sailor_plan(row["plan"], pb.job.global_batch, zone), pb)
    return estimate(pb, plan).iteration_time_s


def user_path(pb, objective: str, cons: dict, repeats: int, target: float | None) -> dict:
    """``shoal plan``'s search at its default budget: its time, the times to a plan as fast as
    ``target`` (seconds per iteration) and to its final best plan, from its progress reports
    (every batch costed), and the plans costed; medians of ``repeats``."""
    planners_common.PROGRESS_EVERY_S = 0.0  # a report after every batch
    budget = plan_cmd.DEFAULT_BUDGET_S
    runs = []
    for _ in range(repeats):
        seen: list[tuple[float, float | None]] = []
        t0 = time.perf_counter()

        def note(p, seen=seen, t0=t0):
            seen.append((time.perf_counter() - t0, p.best_iteration_time_s))

        res = plan_cmd._searches(pb, "auto", objective, Constraints(**cons), 5, budget,
                                 plan_cmd.Shown(note))
        total = time.perf_counter() - t0
        best = res.ranked[0].iteration_time_s
        runs.append({
            "plan_s": total,
            "to_sailors_plan_s": None if target is None else next(
                (t for t, b in seen if b is not None and b <= target * (1 + 1e-9)), total),
            "to_final_best_s": next((t for t, b in seen if b is not None
                                     and b <= best * (1 + 1e-9)), total),
            "costed": res.stats.candidates_costed, "truncated": res.stats.truncated,
            "iters_per_s": 1 / best})
    planners_common.PROGRESS_EVERY_S = 0.25
    out = {k: (round(float(np.median([r[k] for r in runs])), 3)
               if isinstance(runs[0][k], float) else runs[-1][k]) for k in runs[0]}
    if target is not None:
        out["sailors_plan_iters_per_s"] = round(1 / target, 5)
    return out


def process_times(scenario: Path, objective: str, cons: dict, rounds: int = 1) -> dict:
    """The whole ``python -m shoal plan SCENARIO --json`` process: warm (the compiled kernels
    cached, second of two runs) and cold (an empty kernel cache); over several ``rounds`` (each
    on a new cache) the medians, with each round's cold extra."""
    got = [_process_round(scenario, objective, cons) for _ in range(rounds)]
    if rounds == 1:
        return got[0]
    extra = [r["cold_extra_s"] for r in got]
    return {"cold": round(float(np.median([r["cold"] for r in got])), 2),
            "warm": round(float(np.median([r["warm"] for r in got])), 2),
            "cold_extra_s": round(float(np.median(extra)), 3), "cold_extra_rounds": extra}


def _process_round(scenario: Path, objective: str, cons: dict) -> dict:
    args = [sys.executable, "-m", "shoal", "plan", str(scenario), "--json", "--objective",
            objective]
    flags = {"max_cost_per_iteration_usd": "--max-cost-per-iter",
             "min_iters_per_s": "--min-throughput"}
    for k, v in cons.items():
        args += [flags[k], str(v)]
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        for label in ("cold", "warm_first", "warm"):
            env = dict(os.environ, NUMBA_CACHE_DIR=cache)
            t0 = time.perf_counter()
            subprocess.run(args, env=env, capture_output=True, check=True)
            out[label] = round(time.perf_counter() - t0, 2)
    del out["warm_first"]
    out["cold_extra_s"] = round(out["cold"] - out["warm"], 2)
    return out


def describe(plan) -> str:
    """Sailor-style shape: stages, replicas, layers per stage, and each run of equal stages'
    replica mix, e.g. ``P=2 mbs=2 D=27 layers=[13,13]; S0: 3xA100-40GB(TP1)+24xV100-16GB(TP4)``."""
    mixes = []
    for st in plan.stages:
        count: dict[tuple[str, int], int] = {}
        for r in st.replicas:
            count[(r.gpu, r.tp)] = count.get((r.gpu, r.tp), 0) + 1
        mixes.append("+".join(f"{n}x{g}(TP{t})" for (g, t), n in sorted(count.items())))
    runs, i = [], 0
    while i < len(mixes):
        j = i
        while j + 1 < len(mixes) and mixes[j + 1] == mixes[i]:
            j += 1
        runs.append(f"S{i}{'-' + str(j) if j > i else ''}: {mixes[i]}")
        i = j + 1
    layers = [st.layers[1] - st.layers[0] for st in plan.stages]
    return (f"P={len(plan.stages)} mbs={plan.microbatch_size} D={len(plan.stages[0].replicas)} "
            f"layers={layers}; " + "; ".join(runs))


if __name__ == "__main__":
    main()
