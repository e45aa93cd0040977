"""Serving placement on Helix's own settings: shoal's `auto` placer against Helix's MILP (run here
with HiGHS, warm-started and cold) and the baselines, on the node capacity tables T(k) Helix's
code computed (`../shared/reference/helix/node_capacity.json`) and its cluster files.

    python benchmarks/serving_placement.py [--only NAME] [--milp-scale 1.0] [--no-milp]

Prints one JSON object: per setting, each placer's max flow (tokens/s, recomputed from its
layer ranges with networkx) and solve time, the upper bound, and Helix's published numbers.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_dir  # noqa: E402
from shoal.errors import InfeasibleError  # noqa: E402
from shoal.io.helix import import_helix, read_placement  # noqa: E402
from shoal.serving.cluster import build_cluster  # noqa: E402
from shoal.serving.flow import max_flow  # noqa: E402
from shoal.serving.placers import MilpOptions, place  # noqa: E402
from shoal.specs.serving import parse_serving  # noqa: E402

# name: (cluster file, model, placement folder, time limit s, Helix MILP's max flow)
SETTINGS = {
    "single24-llama2-70b": ("single24.ini", "llama-2-70b", "single24-llama2-70b", 60, 1289.56),
    "3cluster24-llama2-70b": ("3cluster24.ini", "llama-2-70b", "3cluster24-llama2-70b", 60,
                              1212.18),
    "cluster42-llama2-70b": ("cluster42.ini", None, "cluster42-llama2-70b", 120, 4892.24),
    "cluster10-llama1-30b": ("cluster10.ini", None, "cluster10-llama1-30b", 30, 286.59),
}


def cluster_of(ref: Path, cl: str, model: str | None, partial: bool):
    doc = import_helix(cluster=ref / "clusters" / cl, machines=ref / "clusters" /
                       "machine_profiles.ini", capacity=ref / "node_capacity.json", model=model,
                       partial_inference=partial)
    return build_cluster(parse_serving(doc))


def run(cluster, placer: str, limit: float, **kw) -> dict:
    t0 = time.perf_counter()
    try:
        r = place(cluster, placer, time_limit_s=limit, **kw)
    except InfeasibleError as e:
        return {"infeasible": str(e), "time_s": round(time.perf_counter() - t0, 2)}
    check = max_flow(cluster, r.placement).value
    assert abs(check - r.flow.value) <= 1e-6 * max(check, 1.0)
    row = {"tokens_per_s": round(r.flow.value, 2), "time_s": round(r.solve_time_s, 2),
           "nodes_used": sum(x is not None for x in r.placement.ranges)}
    if "objective" in r.details:
        row["milp_objective"] = r.details["objective"] and round(r.details["objective"], 2)
        row["milp_status"] = r.details["status"]
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None)
    ap.add_argument("--milp-scale", type=float, default=1.0,
                    help="MILP time limit as a multiple of the setting's limit")
    ap.add_argument("--no-milp", action="store_true")
    args = ap.parse_args()
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    ref = ref / "helix"
    out = {}
    for name, (cl, model, folder, limit, helix) in SETTINGS.items():
        if args.only and args.only != name:
            continue
        c = cluster_of(ref, cl, model, partial=False)
        cp = cluster_of(ref, cl, model, partial=True)
        row: dict = {"nodes": c.n, "upper_bound": round(c.upper_bound(), 2),
                     "helix_milp_published": helix, "time_limit_s": limit}
        row["auto"] = run(c, "auto", limit, objective="max-flow")
        row["auto"]["over_helix"] = round(row["auto"]["tokens_per_s"] / helix, 3)
        row["auto"]["gap_to_upper_bound"] = round(1 - row["auto"]["tokens_per_s"]
                                                  / row["upper_bound"], 3)
        row["swarm"] = run(c, "swarm", limit)
        row["separate"] = run(c, "separate", limit)
        row["petals_partial"] = run(cp, "petals", limit)
        if not args.no_milp:
            ml = limit * args.milp_scale
            row["milp_warm"] = run(c, "milp", ml)
            row["milp_cold"] = run(c, "milp", ml, milp_options=MilpOptions(warm_start=False))
        row["helix_files"] = {f.stem: round(max_flow(cp if f.stem == "petals" else c,
                                                     read_placement(f, c)).value, 2)
                              for f in sorted((ref / "placements" / folder).glob("*.ini"))}
        out[name] = row
        print(json.dumps({name: row}), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
