"""The `sailor` strategy against Sailor's own planner: on each run of
`reference/sailor/sailor_runs.md`, the plan Sailor's planner chose and the plan the `sailor`
strategy picks on the same pool, job and objective, both estimated by shoal, one run.

For each run: the shapes of the `sailor` strategy's, `auto`'s and Sailor's plans (stages,
microbatch size, pipelines, each stage's GPU mix), their iterations/s and USD/iteration under
shoal's estimator, and Sailor's own estimate of its plan. ``ours_over_sailors`` and
``auto_over_sailors``: iterations/s over Sailor's plan's under max-throughput, its USD/iteration
over theirs under min-cost (above 1: better). ``verdict`` says why the strategy's shape differs
from Sailor's, as far as shoal's estimates tell: ``estimates`` (shoal rates the strategy's plan at
least as good, or Sailor's plan breaks a constraint under shoal's estimator), ``search`` (shoal
rates Sailor's plan better: the strategy did not reach it) or ``pool`` (Sailor's plan over-fills a
zone). Sailor's plans are read from the table in the reference folder; its pipelines run equal
shares of the microbatches, its replicas ordered in each stage slowest first (as the planners
build theirs); a replica placed in a zone without GPUs left for it is moved to the zone of its
region with the most left, and the row says so.

    python benchmarks/sailor_faithfulness.py [--only RUN]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_or_skip  # noqa: E402
from shoal.errors import InfeasibleError  # noqa: E402
from shoal.estimate import estimate  # noqa: E402
from shoal.io.sailor import SailorFiles, import_sailor  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.specs.job import Constraints  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402
from shoal.training.planners import Limits, search  # noqa: E402
from shoal.training.planners.build import shares  # noqa: E402

NEO, OPT = "training_config_gpt_neo27.json", "training_config_opt_350.json"
HET, GEO = "gpu_trace_heterogeneous_imbalanced.csv", "gpu_trace_multizone.csv"
TWO = "gpu_trace_2zones_2gpus.csv"
# run name (as in sailor_runs.md) -> (training config, profiles, trace, objective, constraints)
RUNS = {
    "het_opt350": (OPT, "OPT-350", HET, "max-throughput", {}),
    "het_gptneo27": (NEO, "GPT-Neo-2.7", HET, "max-throughput", {}),
    "geo_opt350": (OPT, "OPT-350", GEO, "max-throughput", {}),
    "cost_minthr_2z_opt350": (OPT, "OPT-350", TWO, "min-cost", {"min_iters_per_s": 0.2}),
    "thr_maxbudget_2z_opt350": (OPT, "OPT-350", TWO, "max-throughput",
                                {"max_cost_per_iteration_usd": 1.2}),
    "thr_2z_opt350": (OPT, "OPT-350", TWO, "max-throughput", {}),
    "cost_minthr_het_opt350": (OPT, "OPT-350", HET, "min-cost", {"min_iters_per_s": 0.2}),
}
# runs in the table whose settings the reference does not record
UNRECORDED = {"cost_minthr_het_gptneo27": "its throughput floor is not recorded"}
GPUS = {"A100": "A100-40GB", "V100": "V100-16GB"}
SLOWEST_FIRST = {"V100-16GB": 0, "A100-40GB": 1}  # replicas of a stage, slowest kind first
REPLICAS = re.compile(r"(\d+)x(\w+)\(TP(\d+)(?:@(\w+))?\)")


def runs_table(text: str) -> list[dict]:
    """The rows of the markdown tables whose first cell is a run name: run, step, chosen plan,
    Sailor's planner's estimates."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 11 or not cells[1].isdigit():
            continue
        rows.append({"run": cells[0], "step": int(cells[1]), "plan": cells[6],
                     "sailor_est_iters_per_s": float(cells[8]),
                     "sailor_est_usd_per_iter": float(cells[10])})
    return rows


def zone_name(short: str | None, default: str) -> str:
    """'c1f' -> 'us-central1-f', 'w1b' -> 'us-west1-b'."""
    if short is None:
        return default
    region = {"c": "us-central", "w": "us-west", "e": "us-east"}[short[0]]
    return f"{region}{short[1]}-{short[2:]}"


def sailor_plan(text: str, gbs: int, default_zone: str) -> TrainingPlan:
    """A TrainingPlan from the table's notation, e.g. 'P=2, mbs=2, D=27x2, layers/stage=[13,
    13]; S0: 3xA100(TP1)+24xV100(TP4); S1: 27xA100(TP1)'."""
    head, *stages = [p.strip() for p in text.split(";")]
    mbs = int(re.search(r"mbs=(\d+)", head).group(1))
    layers = [int(x) for x in re.search(r"layers/stage=\[([\d, ]+)\]", head).group(1).split(",")]
    per_stage: list[list[tuple[str, int, str]]] = [[] for _ in layers]
    for part in stages:
        label, mix = part.split(":", 1)
        ids = [int(x) for x in label.strip()[1:].split("-")]
        reps = []
        for n, gpu, tp, zone in REPLICAS.findall(mix):
            reps += [(GPUS[gpu], int(tp), zone_name(zone or None, default_zone))] * int(n)
        reps.sort(key=lambda r: SLOWEST_FIRST[r[0]])
        for s in range(ids[0], ids[-1] + 1):
            per_stage[s] = reps
    D = len(per_stage[0])
    share = shares(gbs // mbs, D)
    edges = [0]
    for n in layers:
        edges.append(edges[-1] + n)
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": "1f1b", "recompute": False, "zero_stage": 0,
        "stages": [{"layers": [edges[s], edges[s + 1]], "replicas": [
            {"gpu": g, "tp": tp, "zone": z, "microbatches": share[j]}
            for j, (g, tp, z) in enumerate(reps)]} for s, reps in enumerate(per_stage)]})


def fitted(plan: TrainingPlan, pb) -> tuple[TrainingPlan, list[str]]:
    """``plan`` with any replica a zone has no GPUs left for moved to the zone of the same
    region with the most free GPUs of its type (Sailor's planner can over-fill a zone by a
    replica), and what was moved."""
    used: dict[tuple[str, str], int] = {}
    moved = []
    d = plan.model_dump(mode="json")
    for st in d["stages"]:
        for r in st["replicas"]:
            g, z, tp = r["gpu"], r["zone"], r["tp"]
            if used.get((g, z), 0) + tp > pb.avail.get((g, z), 0):
                region = pb.zone_region[z]
                free = {z2: pb.avail.get((g, z2), 0) - used.get((g, z2), 0)
                        for z2 in pb.zones if pb.zone_region[z2] == region}
                to = max(free, key=lambda z2: free[z2])
                if free[to] >= tp:
                    moved.append(f"one {g} TP{tp} replica of stage {d['stages'].index(st)} "
                                 f"from {z} to {to}")
                    r["zone"] = z = to
            used[(g, z)] = used.get((g, z), 0) + tp
    return TrainingPlan.model_validate(d), moved


def shape(plan: TrainingPlan) -> dict:
    """Stages, microbatch size, pipelines and each stage's GPU mix ('GPU(TP)' -> replicas)."""
    mixes = []
    for st in plan.stages:
        mix: dict[str, int] = {}
        for r in st.replicas:
            mix[f"{r.gpu}(TP{r.tp})"] = mix.get(f"{r.gpu}(TP{r.tp})", 0) + 1
        mixes.append(dict(sorted(mix.items())))
    return {"stages": len(plan.stages), "mbs": plan.microbatch_size,
            "pipelines": len(plan.stages[0].replicas), "mixes": mixes,
            "layers": [b - a for a, b in (st.layers for st in plan.stages)]}


def same_shape(a: dict, b: dict) -> bool:
    return all(a[k] == b[k] for k in ("stages", "mbs", "pipelines", "mixes"))


def kinds(mixes: list[dict]) -> str:
    """Each stage's GPU types with their TPs, runs of equal stages merged: 'S0-1: V100(TP4) |
    S2: A100(TP1)+V100(TP4)'."""
    out: list[tuple[int, int, str]] = []
    for s, mix in enumerate(mixes):
        label = "+".join(mix)
        if out and out[-1][2] == label:
            out[-1] = (out[-1][0], s, label)
        else:
            out.append((s, s, label))
    return " | ".join(f"S{a}{'' if a == b else f'-{b}'}: {lab}" for a, b, lab in out)


def best_of(pb, strategy: str, objective: str, cons: dict) -> dict:
    """The strategy's best plan: iterations/s, USD/iteration, search seconds and its shape; or
    why there is none."""
    try:
        res = search(pb, strategy=strategy, objective=objective,
                     constraints=Constraints(**cons), limits=Limits(budget_s=600))
    except InfeasibleError as exc:
        return {"infeasible": str(exc)}
    best = res.ranked[0]
    return {"iters_per_s": round(best.throughput_iters_per_s, 5),
            "usd_per_iter": round(best.cost_usd, 4),
            "search_s": round(res.stats.search_time_s, 3), **shape(best.plan)}


def breaks(plan: dict, cons: dict) -> str | None:
    """The constraint a plan (as ``best_of`` describes it) breaks, if any."""
    if plan.get("oom"):
        return "GPU memory"
    if "min_iters_per_s" in cons and plan["iters_per_s"] < cons["min_iters_per_s"]:
        return f"min {cons['min_iters_per_s']} iterations/s"
    if ("max_cost_per_iteration_usd" in cons
            and plan["usd_per_iter"] > cons["max_cost_per_iteration_usd"]):
        return f"max {cons['max_cost_per_iteration_usd']} USD/iteration"
    return None


def better(a: dict, b: dict, objective: str) -> float:
    """How much better plan ``a`` is than ``b`` under ``objective`` (above 1: better)."""
    return round(a["iters_per_s"] / b["iters_per_s"] if objective == "max-throughput"
                 else b["usd_per_iter"] / a["usd_per_iter"], 4)


def verdict(row: dict) -> str:
    """same shape; or why the shapes differ, as far as shoal's estimates tell."""
    ours, theirs = row["ours"], row["sailors"]
    if "infeasible" in ours or "stages" not in theirs:
        return ("same: no plan" if "infeasible" in ours and "stages" not in theirs
                else "differ: one planner finds no plan")
    if same_shape(ours, theirs):
        return "same shape"
    if theirs["moved_to_fit_the_pool"]:
        return "pool: Sailor's plan over-fills a zone (its repaired copy is compared)"
    if (why := breaks(theirs, row["constraints"])) is not None:
        return f"estimates: Sailor's plan breaks {why} under shoal's estimator"
    if row["ours_over_sailors"] >= 1.0:
        return "estimates: shoal rates the sailor strategy's plan at least as good"
    return "search: shoal rates Sailor's plan better"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run the rows whose run name contains this")
    args = ap.parse_args()
    ref = reference_or_skip()
    if ref is None:
        return
    s = ref / "sailor"
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, r in enumerate(runs_table((s / "sailor_runs.md").read_text())):
            if args.only and args.only not in r["run"]:
                continue
            if r["run"] in UNRECORDED or r["run"] not in RUNS:
                rows.append({"run": r["run"], "step": r["step"],
                             "skipped": UNRECORDED.get(r["run"], "unknown run")})
                continue
            cfg, prof, trace, objective, cons = RUNS[r["run"]]
            out = Path(tmp) / f"run{i}"
            import_sailor(SailorFiles(training_config=s / "configs" / cfg,
                                      cluster_config=s / "configs" / "basic_cluster_config.json",
                                      profiles=s / "profiles" / prof, network=s / "network",
                                      trace=s / "traces" / trace, step=r["step"]), out)
            pb = load_problem(out / "scenario.yaml")
            row = {"run": r["run"], "step": r["step"], "objective": objective,
                   "constraints": cons, "pool_gpus": sum(pb.avail.values()),
                   "ours": best_of(pb, "sailor", objective, cons),
                   "auto": best_of(pb, "auto", objective, cons)}
            if r["plan"].startswith("no valid plan"):
                row["sailors"] = {"plan": "none (no valid plan)"}
            else:
                zone = sorted({z for _, z in pb.avail})[0]
                theirs, moved = fitted(sailor_plan(r["plan"], pb.job.global_batch, zone), pb)
                est = estimate(pb, theirs)
                row["sailors"] = {
                    "iters_per_s": round(est.throughput_iters_per_s, 5),
                    "usd_per_iter": round(est.cost_compute_usd + est.cost_egress_usd, 4),
                    "oom": est.oom, "moved_to_fit_the_pool": moved,
                    "sailor_est_iters_per_s": r["sailor_est_iters_per_s"],
                    "sailor_est_usd_per_iter": r["sailor_est_usd_per_iter"], **shape(theirs)}
                for who in ("ours", "auto"):
                    if "stages" in row[who]:
                        row[f"{who}_over_sailors"] = better(row[who], row["sailors"], objective)
            row["verdict"] = verdict(row)
            for side in ("ours", "auto", "sailors"):
                if "mixes" in row[side]:
                    row[side]["kinds"] = kinds(row[side].pop("mixes"))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    done = [r for r in rows if "verdict" in r]
    counts: dict[str, int] = {}
    for r in done:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    fair = [r for r in done if "auto_over_sailors" in r and breaks(r["sailors"], r["constraints"])
            is None]
    print(json.dumps({"rows": rows, "summary": {
        "runs": len(done), "verdicts": counts,
        "auto_at_least_as_good_as_sailors_plan": sum(r["auto_over_sailors"] >= 1.0 for r in fair),
        "of_runs_where_sailors_plan_meets_the_constraints": len(fair),
        "worst_auto_over_sailors": min((r["auto_over_sailors"] for r in fair), default=None)}},
        indent=1))


if __name__ == "__main__":
    main()
