"""Request-level serving simulator against Helix's own simulator: fidelity on its single24
LLaMA-2-70B offline run (its MILP placement, max-flow router and two baselines), and speed and
memory on the whole Azure conversation trace online on the 42-node cluster.

    python benchmarks/serving_simulator.py [--only fidelity|online42]

Prints one JSON object. Helix's numbers (from its artifact, ../shared/reference/helix/README.md
and the issue): single24 offline, 10 minutes after 1 minute of warm-up: max-flow router decode
248.3 tokens/s, prompt + decode 1176.7 tokens/s, prompt latency 3.09 s, decode latency 1.46 s per
token; Swarm router 187.6, random 189.8 decode tokens/s; 1,778 s of wall time for that run.
The fidelity rows run Helix's router as its code does (``helix-iwrr``); ``iwrr`` rows are shoal's
default router on the same placement, for comparison.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_dir  # noqa: E402
from shoal.io.helix import import_helix, read_placement  # noqa: E402
from shoal.serving import workload  # noqa: E402
from shoal.serving.cluster import build_cluster  # noqa: E402
from shoal.serving.flow import max_flow  # noqa: E402
from shoal.serving.placers import place  # noqa: E402
from shoal.serving.simulator import SimOptions, simulate  # noqa: E402
from shoal.specs.serving import parse_serving  # noqa: E402

HELIX = {"iwrr": {"decode": 248.3, "tokens": 1176.7, "prompt_latency": 3.09,
                  "decode_latency": 1.46},
         "swarm": {"decode": 187.6}, "random": {"decode": 189.8}}
# Helix's offline runs of its baseline routers keep this many requests in flight (its max-flow
# router is fed by expected KV use instead; examples/simulation/step3_run_simulation.py)
HELIX_BASELINE_CONCURRENCY = 240


def cluster(h: Path, cl: str, model: str | None):
    # single24 (A100, L4, T4 with LLaMA-2-70B) gets the engine's batch limits Helix's simulator
    # has (shoal.io.helix.ENGINE_BATCH); cluster42 has types it has none for here
    return build_cluster(parse_serving(import_helix(
        cluster=h / "clusters" / cl, machines=h / "clusters" / "machine_profiles.ini",
        capacity=h / "node_capacity.json", model=model,
        profiles=h / "profiles" / ("llama2_70b" if "70" in (model or "70") else "llama1_30b"))))


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def fidelity(h: Path) -> dict:
    c = cluster(h, "single24.ini", "llama-2-70b")
    pl = read_placement(h / "placements" / "single24-llama2-70b" / "ilp.ini", c)
    fl = max_flow(c, pl)
    lengths = workload.load_lengths(h / "traces" / "azure_conv_lengths.csv")
    out = {}
    for name, router, conc in (("iwrr", "helix-iwrr", None),
                               ("swarm", "swarm", HELIX_BASELINE_CONCURRENCY),
                               ("random", "random", HELIX_BASELINE_CONCURRENCY),
                               ("iwrr_at_baseline_concurrency", "helix-iwrr",
                                HELIX_BASELINE_CONCURRENCY),
                               ("shoal_iwrr", "iwrr", None),
                               ("shoal_iwrr_at_baseline_concurrency", "iwrr",
                                HELIX_BASELINE_CONCURRENCY)):
        r = simulate(c, pl, fl, workload.offline(lengths, seed=0), SimOptions(router=router, warmup_s=60.0,
                     duration_s=600.0, concurrency=conc))
        row = {"router": router, "concurrency": "KV feeder" if conc is None else conc,
               "in_flight_peak": r.in_flight_peak,
               "decode_tokens_per_s": round(r.decode_tokens_per_s, 1),
               "tokens_per_s": round(r.tokens_per_s, 1),
               "prompt_latency_s": round(r.prompt_latency_s["mean"], 2),
               "decode_latency_s": round(r.decode_latency_s["mean"], 3),
               "wall_s": round(r.wall_s, 2), "events": r.events}
        ref = HELIX.get(name, {})
        row["vs_helix"] = {k: round(row[m] / ref[k] - 1, 3) for k, m in (
            ("decode", "decode_tokens_per_s"), ("tokens", "tokens_per_s"),
            ("prompt_latency", "prompt_latency_s"), ("decode_latency", "decode_latency_s"))
            if k in ref}
        out[name] = row
    # the same run on shoal's placements (max flow, and the decode objective)
    for name, kw in (("auto_max_flow", {"objective": "max-flow"}),
                     ("auto_decode", {"objective": "decode", "lengths": lengths})):
        placed = place(c, "auto", time_limit_s=60.0, **kw)
        r = simulate(c, placed.placement, placed.flow, workload.offline(lengths, seed=0),
                     SimOptions(warmup_s=60.0, duration_s=600.0))
        out[name] = {"max_flow": round(placed.flow.value, 2),
                     "stages": len({x for x in placed.placement.ranges if x is not None}),
                     "nodes": sum(x is not None for x in placed.placement.ranges),
                     "decode_tokens_per_s": round(r.decode_tokens_per_s, 1),
                     "tokens_per_s": round(r.tokens_per_s, 1),
                     "prompt_latency_s": round(r.prompt_latency_s["mean"], 2),
                     "decode_latency_s": round(r.decode_latency_s["mean"], 3)}
    out["ranking_as_helix"] = (out["iwrr"]["decode_tokens_per_s"]
                               > max(out["swarm"]["decode_tokens_per_s"],
                                     out["random"]["decode_tokens_per_s"]))
    out["speedup_vs_helix_1778s"] = round(1778.0 / out["iwrr"]["wall_s"], 1)
    out["max_rss_mb"] = round(rss_mb(), 1)
    return out


def online42(h: Path) -> dict:
    c = cluster(h, "cluster42.ini", None)
    lengths = workload.load_lengths(h / "traces" / "azure_conv_lengths.csv")
    placed = place(c, "auto", time_limit_s=60.0, objective="decode", lengths=lengths)
    per = workload.load_arrivals(h / "traces" / "azure_conv_arrivals_per_3s.csv")
    # every request of the trace once: the hour's arrival shape at len(lengths) / hour
    rate = len(lengths) / (len(per) * workload.INTERVAL_S)
    w = workload.online(lengths, per, rate, seed=0)
    t0 = time.perf_counter()
    r = simulate(c, placed.placement, placed.flow, w, SimOptions(warmup_s=30.0, duration_s=None))
    return {"placement": "auto, decode objective", "placement_max_flow": round(placed.flow.value, 2),
            "placement_stages": len({x for x in placed.placement.ranges if x is not None}),
            "requests": w.n,
            "rate_per_s": round(rate, 3),
            "offered_tokens_per_s_over_max_flow": round(
                rate * float(lengths.sum(axis=1).mean()) / placed.flow.value, 3),
            "completed": r.completed, "decode_tokens_per_s": round(r.decode_tokens_per_s, 1),
            "prompt_latency_s": r.prompt_latency_s, "decode_latency_s": r.decode_latency_s,
            "simulated_s": round(r.window_s + 30.0, 1), "events": r.events,
            "wall_s": round(time.perf_counter() - t0, 1), "max_rss_mb": round(rss_mb(), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("fidelity", "online42"), default=None)
    args = ap.parse_args()
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    h = ref / "helix"
    out = {}
    for name, fn in (("fidelity", fidelity), ("online42", online42)):
        if args.only in (None, name):
            out[name] = fn(h)
            print(json.dumps({name: out[name]}), file=sys.stderr)
    out["numpy"] = np.__version__
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
