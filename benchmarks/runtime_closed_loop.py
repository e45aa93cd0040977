"""Closed loop: the estimator, fed a profile that `shoal profile` measured on this machine with
the same number of processes, against the runtime's measured step time, for each runtime test
plan (tiny model, float32, gloo on CPU).

    python benchmarks/runtime_closed_loop.py [--steps 12] [--seq 32]

The scenario uses the profile's layer times and its measured point-to-point link (bandwidth and
latency) for links and TP traffic, with the time constants the profile gives
(``profiler.time_constants``: transfers as measured, the gradient all-reduce scaled by the
profile's measured all-reduce over the modelled one). Prints JSON: per plan, estimated and measured step
time and the relative error (goal within 15%).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

import yaml

from shoal.catalog import TINY  # noqa: E402
from shoal.errors import SpecError  # noqa: E402
from shoal.estimate import estimate  # noqa: E402
from shoal.problem import load_problem  # noqa: E402
from shoal.runtime import profiler  # noqa: E402
from shoal.runtime.pipeline import layout  # noqa: E402
from shoal.runtime.train import global_batch, launch, spawn  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402


def plan(stages, mbs=2, schedule="1f1b", zero=0):
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": schedule, "zero_stage": zero,
        "stages": [{"layers": list(lay), "replicas": [
            {"gpu": "cpu", "tp": tp, "zone": "local", "microbatches": m} for tp, m in reps]}
            for lay, reps in stages]})


PLANS = {
    "dp2": plan([((0, 6), [(1, 4), (1, 4)])]),
    "pp2-1f1b": plan([((0, 3), [(1, 8)]), ((3, 6), [(1, 8)])]),
    "asymmetric-3-1": plan([((0, 3), [(1, 8)]), ((3, 6), [(1, 6), (1, 2)])]),
    "tp2-then-tp1": plan([((0, 3), [(2, 8)]), ((3, 6), [(1, 8)])]),
    "zero2": plan([((0, 6), [(1, 4), (1, 4)])], zero=2),
    "gpipe": plan([((0, 3), [(1, 8)]), ((3, 6), [(1, 8)])], schedule="gpipe"),
}


def scenario(prof: Path, p: TrainingPlan, seq: int, world: int) -> dict:
    link = json.loads(prof.read_text())["network"]["link"]
    ln = {"bandwidth": link["bandwidth_Bps"], "latency": link["latency_s"]}
    return {"model": "tiny", "job": {"global_batch": global_batch(p), "seq_len": seq,
                                     "optimizer": "adamw", "precision": "fp32",
                                     "zero_stage": [0, 1, 2]},
            "pool": {"regions": {"local": {"zones": {"local": {"gpus": {"cpu": world}}}}},
                     "gpus_per_node": {"cpu": world}},
            "network": {"defaults": {"same_zone": ln}, "intra_node": {"cpu": ln}},
            "prices": {"gpu_usd_per_h": {"cpu": 0.0}}, "profiles": {"compute": str(prof)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import torch

    tmp = Path(tempfile.mkdtemp())
    out = {}
    profiles: dict[int, Path] = {}
    for name, p in PLANS.items():
        world = layout(p, TINY).world
        if world not in profiles:
            # TP 1 measured by as many processes as the plan has; TP 2 by groups of two side by
            # side (by the plan's own count when it is even, else by two)
            profiles[world] = tmp / f"profile-{world}.json"
            launch(world, profiler.run, TINY, "tiny", [1] + ([2] if world % 2 == 0 else []),
                   [p.microbatch_size], args.seq, args.reps, profiles[world])
            if world % 2:
                extra = tmp / f"profile-{world}-tp2.json"
                launch(2, profiler.run, TINY, "tiny", [2], [p.microbatch_size], args.seq,
                       args.reps, extra)
                doc = json.loads(profiles[world].read_text())
                doc["gpus"]["cpu"].update(json.loads(extra.read_text())["gpus"]["cpu"])
                profiles[world].write_text(json.dumps(doc))
        f = tmp / f"{name}.yaml"
        f.write_text(yaml.safe_dump(scenario(profiles[world], p, args.seq, world)))
        pb = load_problem(f)
        pb = pb.with_constants(timing=profiler.time_constants(
            json.loads(profiles[world].read_text()), pb.timing))
        try:
            est = estimate(pb, p).iteration_time_s
        except SpecError as e:
            out[name] = {"processes": world, "estimated_s": None, "not_estimated": str(e)}
            continue
        res = spawn(p, TINY, args.steps, args.seq, dtype=torch.float32)
        times = res[0]["step_time_s"][2:]  # after two warm-up steps
        meas = statistics.median(times)
        out[name] = {"processes": world, "estimated_s": round(est, 5),
                     "measured_s": round(meas, 5), "error": round(est / meas - 1, 3)}
        print(json.dumps({name: out[name]}), file=sys.stderr)
    errs = [abs(v["error"]) for v in out.values() if "error" in v]
    out["mean_abs_error"] = round(statistics.mean(errs), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
