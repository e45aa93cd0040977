"""What placements serve, not just their max flow: shoal's default placement against the placements
Helix's artifact ships (its MILP, Petals, Swarm) on Helix's three LLaMA-2-70B settings, in shoal's
request simulator, offline and online, and the routers at equal load.

    python benchmarks/serving_served.py [--only single24|3cluster24|cluster42] [--no-online]
                                        [--no-routers]

Prints one JSON object. Per setting:

- ``placement``: shoal's default (`auto`, decode objective, 60 s budget, told the Azure
  conversation lengths), its time, max flow and the candidates it simulated;
- ``offline``: each placement, the default router (``iwrr``), Helix's offline protocol (10
  minutes measured after 1 minute; Helix's KV feeder; the Azure conversation lengths, seed 0):
  decode tokens/s, prompt and decode latency (mean, p95); Helix's MILP placement also with
  Helix's own router (``helix-iwrr``), the setting of its published numbers;
- ``online``: the same placements on the Azure conversation arrivals (the first 30.5 minutes of
  the per-3-second counts, the first 30 s not measured, run until every request is done), all at
  one arrival rate per setting: 75% of what Helix's MILP placement decodes offline with Helix's
  router, in requests/s (Helix scales its online runs to 75% of peak);
- ``routers`` (single24): decode tokens/s at 240 requests in flight (offline) and online, per
  router, on shoal's placement and on Helix's MILP placement;
- ``fidelity``: Helix's MILP placement on single24 with Helix's router against Helix's own
  simulator (248.3 decode tokens/s).

Petals' placement needs partial inference (a node may start inside the previous node's range);
it runs on the cluster with partial inference allowed, the others without.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _reference import reference_or_skip  # noqa: E402
from shoal.io.helix import import_helix, read_placement  # noqa: E402
from shoal.serving import workload  # noqa: E402
from shoal.serving.cluster import build_cluster  # noqa: E402
from shoal.serving.flow import max_flow  # noqa: E402
from shoal.serving.placers import place  # noqa: E402
from shoal.serving.simulator import SimOptions, simulate  # noqa: E402
from shoal.specs.serving import parse_serving  # noqa: E402

# name: (cluster file, model key in node_capacity.json, placement folder, Helix MILP file)
SETTINGS = {"single24": ("single24.ini", "llama-2-70b", "single24-llama2-70b", "ilp.ini"),
            "3cluster24": ("3cluster24.ini", "llama-2-70b", "3cluster24-llama2-70b", "ilp.ini"),
            "cluster42": ("cluster42.ini", None, "cluster42-llama2-70b", "ilp_unpruned.ini")}
HELIX_SINGLE24_DECODE = 248.3  # Helix's simulator, its MILP placement, offline
ONLINE_LOAD = 0.75  # x Helix's MILP placement's offline decode throughput
ONLINE_INTERVALS = 610  # 3-second intervals of arrivals: 30 s of warm-up and 30 minutes
ROUTER_CONCURRENCY = 240  # Helix runs its baseline routers with this many requests in flight


def cluster(h: Path, cl: str, model: str | None, partial: bool = False):
    return build_cluster(parse_serving(import_helix(
        cluster=h / "clusters" / cl, machines=h / "clusters" / "machine_profiles.ini",
        capacity=h / "node_capacity.json", model=model, partial_inference=partial,
        profiles=h / "profiles" / "llama2_70b")))


def metrics(r) -> dict:
    def two(d):
        return {"mean": None if d["mean"] is None else round(d["mean"], 3),
                "p95": None if d["p95"] is None else round(d["p95"], 3)}

    return {"decode_tokens_per_s": round(r.decode_tokens_per_s, 1),
            "prompt_latency_s": two(r.prompt_latency_s),
            "decode_latency_s": two(r.decode_latency_s),
            "in_flight_mean": round(r.in_flight_mean, 1), "completed": r.completed}


def run(c, pl, work, router="iwrr", **kw):
    return simulate(c, pl, max_flow(c, pl), work, SimOptions(router=router), **kw)


def setting(h: Path, name: str, lengths: np.ndarray, arrivals: np.ndarray, online: bool,
            routers: bool) -> dict:
    cl, model, folder, ilp = SETTINGS[name]
    c = cluster(h, cl, model)
    cp = cluster(h, cl, model, partial=True)
    t0 = time.perf_counter()
    placed = place(c, "auto", time_limit_s=60.0, lengths=lengths)
    out: dict = {"placement": {
        "time_s": round(time.perf_counter() - t0, 1),
        "max_flow": round(placed.flow.value, 2),
        "stages": len({x for x in placed.placement.ranges if x is not None}),
        "nodes": sum(x is not None for x in placed.placement.ranges),
        "binding": placed.served.binding["resource"] if placed.served else None,
        "candidates": [{k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}
                       for r in placed.details.get("candidates", [])]}}
    pls = {"shoal": (c, placed.placement)}
    for f in ("ilp", "petals", "swarm"):
        path = h / "placements" / folder / (ilp if f == "ilp" else f"{f}.ini")
        cc = cp if f == "petals" else c
        pls[f] = (cc, read_placement(path, cc))
    offline = workload.offline(lengths, seed=0)
    off: dict = {}
    for f, (cc, pl) in pls.items():
        off[f] = {"max_flow": round(max_flow(cc, pl).value, 2)} | metrics(
            run(cc, pl, offline, warmup_s=60.0, duration_s=600.0))
    ilp_c, ilp_pl = pls["ilp"]
    helix = run(ilp_c, ilp_pl, offline, "helix-iwrr", warmup_s=60.0, duration_s=600.0)
    off["ilp_helix_router"] = metrics(helix)
    for ref in ("ilp", "ilp_helix_router"):
        off[f"shoal_over_{ref}"] = round(off["shoal"]["decode_tokens_per_s"]
                                         / off[ref]["decode_tokens_per_s"], 3)
    out["offline"] = off
    rate = ONLINE_LOAD * helix.decode_tokens_per_s / float(lengths[:, 1].mean())
    work = workload.online(lengths, arrivals[:ONLINE_INTERVALS], rate, seed=0)
    if online:
        on: dict = {"rate_per_s": round(rate, 3), "requests": work.n}
        for f, (cc, pl) in pls.items():
            on[f] = metrics(run(cc, pl, work, warmup_s=30.0, duration_s=None))
        out["online"] = on
    if routers and name == "single24":
        rt: dict = {}
        for f in ("shoal", "ilp"):
            cc, pl = pls[f]
            rt[f] = {"offline_at_240": {}, "online": {}}
            for router in ("iwrr", "helix-iwrr", "swarm", "random"):
                rt[f]["offline_at_240"][router] = metrics(run(
                    cc, pl, offline, router, warmup_s=60.0, duration_s=600.0,
                    concurrency=ROUTER_CONCURRENCY))
                if online:
                    rt[f]["online"][router] = metrics(run(cc, pl, work, router, warmup_s=30.0,
                                                          duration_s=None))
        out["routers"] = rt
    if name == "single24":
        out["fidelity"] = {"helix_simulator": HELIX_SINGLE24_DECODE,
                           "shoal_simulator": round(helix.decode_tokens_per_s, 1),
                           "error": round(helix.decode_tokens_per_s / HELIX_SINGLE24_DECODE - 1,
                                          3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=tuple(SETTINGS), default=None)
    ap.add_argument("--no-online", action="store_true")
    ap.add_argument("--no-routers", action="store_true")
    args = ap.parse_args()
    ref = reference_or_skip()
    if ref is None:
        return
    h = ref / "helix"
    lengths = workload.load_lengths(h / "traces" / "azure_conv_lengths.csv")
    arrivals = workload.load_arrivals(h / "traces" / "azure_conv_arrivals_per_3s.csv")
    out = {}
    for name in SETTINGS:
        if args.only in (None, name):
            out[name] = setting(h, name, lengths, arrivals, not args.no_online,
                                not args.no_routers)
            print(json.dumps({name: out[name]}), file=sys.stderr)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
