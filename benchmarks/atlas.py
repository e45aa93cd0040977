"""Atlas's testbed in simulation: speed-up of the Atlas schedule over GPipe, 1F1B and Varuna-style
pipelines across three datacenters, with one TCP connection per node pair and with many.

Fixed setting (not tuned): 12 A100-80GB, 4 pipeline stages x 3 data-parallel pipelines (one DP-cell
of 3 for Atlas), fp16, microbatch 1, activation recompute; GPT-A (hidden 4096, sequence 4096, 24
standard blocks, 6 per stage) and GPT-B (hidden 8192, sequence 6144, 16 blocks, 4 per stage);
standard blocks (12 h^2 parameters) although the paper's parameters-per-layer figures imply wider
MLPs; 4 and 16 microbatches; one-way latency 10/20/30/40 ms. Layer times from shoal's analytic
A100-80GB profile. Stage s of every pipeline sits in one datacenter (Atlas's rule, so gradient
all-reduces stay inside a datacenter); with 4 stages over 3 datacenters that cannot hold with 4 GPUs
each, so stages go to datacenters [1, 2, 3, 3] (datacenter 3 holds 6 GPUs). WAN: 12,000 Mbit/s x ms
/ latency per connection (Table 1), 5 Gbit/s per node pair with many connections; 100 Gbit/s inside
a datacenter. Atlas always uses its many connections (its first measure); the baselines use one
connection in table (a) and many in table (b). Iteration time = pipeline makespan + each stage's
intra-datacenter gradient all-reduce.

Also: Algorithm 1's run time for 5 datacenters x 600 GPUs (C = 2 and 4, 60 stages, 60
microbatches); BubbleTea on the 12-GPU Atlas timeline (GPT-A, 4 microbatches, 40 ms) with Poisson
prefill requests of Llama-3-8B (prompt lengths like the Azure conversation trace) at several rates,
and the largest rate it sustains with at most 1% rejected (at the 50 ms wait and at 500 ms); the
controller's decision time per request on 1000 GPUs (50 DP-cells of 5 pipelines x 4 stages);
and the prefill latency model against the paper's anchors.

    python benchmarks/atlas.py [--only bubbletea]
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
from shoal import catalog  # noqa: E402
from shoal.profiles.analytic import AnalyticProfile  # noqa: E402
from shoal.specs.model import ModelSpec  # noqa: E402
from shoal.specs.network import WanSpec  # noqa: E402
from shoal.training import bubbles  # noqa: E402
from shoal.training.geo import JobShape, iteration_bounds, job_from_profile, simulate  # noqa: E402
from shoal.training.planners.atlas import (  # noqa: E402
    algorithm1,
    best,
    ring_latency,
    uniform_cell_latency,
)

MODELS = {
    "GPT-A": (ModelSpec(name="GPT-A", num_layers=24, hidden_size=4096, num_heads=32,
                        vocab_size=50257, max_seq_len=4096), 4096),
    "GPT-B": (ModelSpec(name="GPT-B", num_layers=16, hidden_size=8192, num_heads=64,
                        vocab_size=50257, max_seq_len=6144), 6144),
}
STAGE_DC = ["dc1", "dc2", "dc3", "dc3"]
BASELINES = ("gpipe", "1f1b", "varuna")


def make_job(model_name: str, microbatches: int, wan: WanSpec, pipelines: int = 3,
             blocks_per_stage: int | None = None, at_peak: bool = False):
    """The benchmark's job; ``at_peak``: every stage's compute scaled so its forward runs at the
    A100's fp16 peak FLOP/s (no GPU runs faster)."""
    model, seq = MODELS[model_name]
    gpus = {"A100-80GB": catalog.gpus().get("A100-80GB")}
    prof = AnalyticProfile(model, seq, gpus)
    per = blocks_per_stage or model.num_layers // 4
    stages = [(1 + i * per, 1 + (i + 1) * per) for i in range(4)]  # blocks only
    job = job_from_profile(prof, "A100-80GB", stages, STAGE_DC,
                           lambda a, b: (wan.bandwidth(), wan.latency),
                           JobShape(mbs=1, microbatches=microbatches, pipelines=pipelines))
    if not at_peak:
        return job
    k = [float(prof.sizes.fwd_flops[a:b].sum()) / gpus["A100-80GB"].flops_16 / f
         for (a, b), f in zip(stages, job.fwd_s, strict=True)]
    return replace(job, **{name: tuple(x * ks for x, ks in zip(getattr(job, name), k, strict=True))
                           for name in ("fwd_s", "bwd_s", "recompute_s")})


def run(model_name: str, microbatches: int, latency_ms: float,
        blocks_per_stage: int | None = None, at_peak: bool = False) -> dict:
    out = {"model": model_name, "microbatches": microbatches, "latency_ms": latency_ms}
    if blocks_per_stage:
        out["blocks_per_stage"] = blocks_per_stage
    if at_peak:
        out["compute"] = "at the A100's fp16 peak"
    for conns in ("one", "many"):
        wan = WanSpec(latency=latency_ms / 1e3, connections=1 if conns == "one" else "auto")
        many = WanSpec(latency=latency_ms / 1e3)

        def mk(w):
            return make_job(model_name, microbatches, w, blocks_per_stage=blocks_per_stage,
                            at_peak=at_peak)

        atlas_job = mk(many)
        atlas = simulate(atlas_job, "atlas", cell=3)
        row = {"atlas_s": atlas.iteration_s, "atlas_utilization": atlas.utilization()}
        base_job = mk(wan)
        # the most any schedule can gain (``iteration_bounds``): over each simulated baseline,
        # and over any baseline that waits only for inputs (one thing at a time at worst)
        lower = iteration_bounds(atlas_job)[0]
        row["speedup_ceiling"] = iteration_bounds(base_job)[1] / lower
        for b in BASELINES:
            tl = simulate(base_job, b)
            row[f"{b}_s"] = tl.iteration_s
            row[f"speedup_vs_{b}"] = tl.iteration_s / atlas.iteration_s
            row[f"ceiling_vs_{b}"] = tl.iteration_s / lower
        out[conns] = row
    return out


def algorithm1_speed() -> list[dict]:
    out = []
    for C in (2, 4):
        t0 = time.perf_counter()
        five = [(f"dc{i}", 600) for i in range(5)]
        b = best(algorithm1(five, C, 60, uniform_cell_latency(C, 60, 60, wan_latency_s=0.02),
                            ring_latency(1.0, 2.0)))
        out.append({"C": C, "cells": b.cells, "pipelines": b.pipelines,
                    "partitions": [list(p) for p in b.partitions],
                    "seconds": time.perf_counter() - t0})
    return out


def bubbletea_12gpu() -> list[dict]:
    tl = simulate(make_job("GPT-A", 4, WanSpec(latency=0.04)), "atlas", cell=3)
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    rows = []
    for rate in (10, 25, 50, 100, 200):
        reqs = bubbles.synthetic_requests(rate, 120.0, seed=1)
        res = bubbles.place(tl, reqs, model, depth=8, guard_s=0.005, max_wait_s=0.05)
        s = res.summary()
        rows.append({"rate_per_s": rate, **{k: s[k] for k in (
            "utilization_before", "utilization_after", "iteration_time_before_s",
            "iteration_time_after_s", "ttft_s", "rejected_fraction", "decision_us")}})
    return rows


def bubbletea_sustainable() -> list[dict]:
    """The largest rate with at most 1% of the prefills rejected, on the same timeline."""
    tl = simulate(make_job("GPT-A", 4, WanSpec(latency=0.04)), "atlas", cell=3)
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    out = []
    for wait in (0.05, 0.5):
        t0 = time.perf_counter()
        s = bubbles.sustainable(tl, model, depth=8, guard_s=0.005, max_wait_s=wait,
                                probe=bubbles.Probe(seed=1))
        row = s.to_json()
        row["wall_s"] = time.perf_counter() - t0
        out.append(row)
    return out


def bubbletea_1000gpu() -> dict:
    tl = simulate(make_job("GPT-A", 4, WanSpec(latency=0.04), pipelines=5), "atlas", cell=5)
    model = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB")
    reqs = bubbles.synthetic_requests(2000, 30.0, seed=2)
    t0 = time.perf_counter()
    res = bubbles.place(tl, reqs, model, cells=50, depth=8, guard_s=0.005, max_wait_s=0.05,
                        max_checks=0)
    s = res.summary()
    return {"gpus": 50 * 20, "cells": 50, "inference_pipelines": s["inference_pipelines"],
            "requests": s["requests"], "utilization_before": s["utilization_before"],
            "utilization_after": s["utilization_after"], "decision_us": s["decision_us"],
            "wall_s": time.perf_counter() - t0}


def prefill_anchors() -> dict:
    nvlink = catalog.gpus().get("A100-80GB").intra_node_bw_Bps  # the paper's DGX A100
    m = bubbles.prefill_model("LLaMA-3-8B", "A100-80GB", link_bw=nvlink)
    t = {(n, d): m.latency(n, d) for n in (512, 8192) for d in (1, 8)}
    return {"ttft_512_pp1_s": t[(512, 1)], "ttft_512_pp8_s": t[(512, 8)],
            "pp8_over_pp1_512": t[(512, 8)] / t[(512, 1)],
            "paper_512": "PP 8 adds 29% (+16 ms) to about 55 ms",
            "ttft_8k_pp1_s": t[(8192, 1)], "ttft_8k_pp8_s": t[(8192, 8)],
            "paper_8k": "PP 1 is 67% slower than PP 8 (weights swapped when compute saturates)"}


def main() -> None:
    t0 = time.perf_counter()
    if sys.argv[1:] == ["--only", "bubbletea"]:
        print(json.dumps({"bubbletea_12gpu": bubbletea_12gpu(),
                          "bubbletea_sustainable": bubbletea_sustainable(),
                          "wall_s": time.perf_counter() - t0}, indent=1))
        return
    rows = [run(m, mb, lat) for m in MODELS for mb in (4, 16) for lat in (10, 20, 30, 40)]
    light = [run("GPT-A", mb, 40, blocks_per_stage=1) for mb in (4, 16)]
    peak = [run("GPT-A", 4, 40, at_peak=True)]
    print(json.dumps({"rows": rows, "gpt_a_one_block_per_stage": light, "gpt_a_at_peak": peak,
                      "algorithm1_5x600": algorithm1_speed(),
                      "bubbletea_12gpu": bubbletea_12gpu(),
                      "bubbletea_sustainable": bubbletea_sustainable(),
                      "bubbletea_1000gpu": bubbletea_1000gpu(),
                      "prefill_anchors": prefill_anchors(),
                      "wall_s": time.perf_counter() - t0}, indent=1))


if __name__ == "__main__":
    main()
