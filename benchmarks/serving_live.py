"""Fidelity of the serving simulator against `shoal serve run` on this machine: measure the
workers' per-layer times and the hop between processes (`shoal serve profile`), write a serving
file from them, replay one request trace live and simulate the same trace on the same placement,
and compare throughput and latency.

    python benchmarks/serving_live.py [--requests 200] [--loads 0.5,1.5] [--seed 0]

The model is a small GPT that a CPU serves in real time (8 blocks, hidden 512, context 512,
float32). Placements: two parallel chains with uneven ranges on three workers
(a [0,3) -> b [3,8) and c [0,8)), and a two-worker chain. Arrivals are Poisson at each of
``--loads`` times the placement's max flow (in requests/s, as ``serve simulate --load``). Prints JSON: per
placement, measured and simulated decode throughput, prompt latency and decode latency (mean and
p50), and their relative errors (goal within 20%).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from shoal.runtime.serve import live, traffic
from shoal.runtime.serve.profile import measure
from shoal.serving import workload as wl
from shoal.serving.cluster import build_cluster
from shoal.serving.flow import max_flow
from shoal.serving.placement import load_placement
from shoal.serving.simulator import SimOptions, simulate
from shoal.specs.model import ModelSpec
from shoal.specs.serving import load_serving

MODEL = ModelSpec(name="cpu-gpt", num_layers=8, hidden_size=512, num_heads=8, vocab_size=1024,
                  max_seq_len=512)
PLACEMENTS = {
    "two-chains-3-workers": [("a", 0, 3), ("b", 3, 8), ("c", 0, 8)],
    "chain-2-workers": [("a", 0, 4), ("b", 4, 8)],
}


def serving_file(folder: Path, prof, names: list[str], lengths: np.ndarray) -> Path:
    """A serving file whose machine reads the measured profile and whose links are the measured
    hop; the coordinator's link also carries its own work per token."""
    h = MODEL.hidden_size
    doc = {
        "schema": "shoal/serving@1", "name": "cpu-gpt on this machine",
        # activation_bytes as the workers send them (float32); the hop's bandwidth is per byte
        "model": {"name": MODEL.name, "layers": MODEL.num_layers, "hidden": h,
                  "activation_bytes": prof.activation_bytes, "token_bytes": 8,
                  "layer_bytes": 12 * h * h * 4, "kv_bytes": 2 * h * 4},
        "machines": {"cpu": {"profile": "profile", "memory": "8GB"}},
        "nodes": [{"machine": "cpu", "name": n, "region": "local"} for n in names],
        "links": {"within": {"bandwidth": prof.link_bandwidth_Bps, "latency": prof.link_latency_s},
                  "coordinator": {"bandwidth": prof.link_bandwidth_Bps,
                                  "latency": prof.link_latency_s + prof.coordinator_s / 2}},
        "coordinator": {"region": "local"},
        "host_cores": prof.host_cores,  # the workers share this machine's cores
        "host_share": prof.host_share,  # as measured: k workers computing at once
        "wake": prof.wake,  # what a message and a step to an idle worker pay
        "capacity": {"prompt_tokens": float(lengths[:, 0].mean()),
                     "output_tokens": float(lengths[:, 1].mean())},
    }
    path = folder / "serving.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def rel(sim: float | None, real: float | None) -> float | None:
    return None if not sim or not real else sim / real - 1.0


def run_one(name: str, ranges, load: float, prof, folder: Path, args) -> dict:
    pool = traffic.workload(MODEL, 4000, seed=args.seed)
    lengths = np.stack([pool.prompt, pool.output], axis=1)
    lengths[:, 1] = lengths[:, 1].clip(max=args.max_new)
    sub = folder / f"{name}-{load:g}"
    sub.mkdir()
    (sub / "profile").symlink_to(folder / "profile")
    path = serving_file(sub, prof, [n for n, _, _ in ranges], lengths)
    (sub / "placement.json").write_text(json.dumps({
        "schema": "shoal/serving-placement@1", "layers": MODEL.num_layers,
        "nodes": [{"name": n, "layers": [a, b]} for n, a, b in ranges]}))
    cl = build_cluster(load_serving(path), file=str(path))
    pl = load_placement(sub / "placement.json", cl)
    fl = max_flow(cl, pl)
    per_req = float(lengths.sum(axis=1).mean())
    rate = load * fl.value / per_req  # as serve simulate --load: a share of the max flow
    work = traffic.workload(MODEL, args.requests, rate=rate, lengths=lengths, seed=args.seed)
    wl.write_trace(sub / "trace.csv", work)
    sim = simulate(cl, pl, fl, wl.load_trace(sub / "trace.csv"), SimOptions(warmup_s=0.0, duration_s=None,
                   batching="live"))
    # the same without the shared cores (each worker as if it had its own)
    own = simulate(replace(cl, host_cores=None, host_share=None), pl, fl, wl.load_trace(sub / "trace.csv"),
                   SimOptions(warmup_s=0.0, duration_s=None, batching="live")).to_json(cl.names)
    # and without what work reaching an idle worker pays
    awake = simulate(replace(cl, wake=None), pl, fl, wl.load_trace(sub / "trace.csv"),
                     SimOptions(warmup_s=0.0, duration_s=None, batching="live")).to_json(cl.names)
    reqs = traffic.requests_from(work, MODEL, args.seed)
    with live.LiveServer(cl, pl, fl, MODEL, live.LiveOptions(mode="online")) as srv:
        srv.run(reqs, timeout_s=600)
        wall = srv.wall_s
    real = traffic.summary(reqs, wall)
    s = sim.to_json(cl.names)
    out = {"placement": name, "load": load, "requests": args.requests, "rate_per_s": rate,
           "max_flow_tokens_per_s": fl.value, "completed": real["requests"]["completed"]}
    for key, label in (("decode_throughput_tokens_per_s", "decode_tokens_per_s"),
                       ("tokens_per_s", "tokens_per_s")):
        out[label] = {"measured": real[key], "simulated": s[key], "error": rel(s[key], real[key]),
                      "error_own_cores": rel(own[key], real[key]),
                      "error_no_wake": rel(awake[key], real[key])}
    for key in ("prompt_latency_s", "decode_latency_s"):
        for stat in ("mean", "p50"):
            m, v = real[key][stat], s[key][stat]
            out[f"{key}_{stat}"] = {"measured": m, "simulated": v, "error": rel(v, m),
                                    "error_own_cores": rel(own[key][stat], m),
                                    "error_no_wake": rel(awake[key][stat], m)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--loads", default="0.5,1.5",
                    help="arrival rates as fractions of the max flow, comma-separated")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", choices=sorted(PLACEMENTS))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        pool = traffic.workload(MODEL, 4000, seed=args.seed)
        # decode steps timed at the trace's mean context (prompt and half the output)
        ctx = int(pool.prompt.mean() + pool.output.clip(max=args.max_new).mean() / 2)
        prof = measure(MODEL, seed=args.seed, context=ctx)
        prof.write(folder / "profile")
        rows = [run_one(name, ranges, float(load), prof, folder, args)
                for name, ranges in PLACEMENTS.items() if args.only in (None, name)
                for load in args.loads.split(",")]
    print(json.dumps({"model": MODEL.model_dump(exclude_none=True),
                      "profile": {"link_latency_s": prof.link_latency_s,
                                  "link_bandwidth_Bps": prof.link_bandwidth_Bps,
                                  "coordinator_s": prof.coordinator_s, "wake": prof.wake,
                                  "host_share": prof.host_share,
                                  "decode_s_per_layer_batch1": prof.decode_s_per_layer[0],
                                  "prompt_tokens": prof.prompt_tokens,
                                  "prompt_s_per_layer": prof.prompt_s_per_layer},
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
