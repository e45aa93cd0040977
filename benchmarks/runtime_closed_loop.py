"""Closed loop: the estimator, fed a profile that `shoal profile` measured on this machine with
the same number of processes, against the runtime's measured step time, for each runtime test
plan (float32, gloo on CPU).

    python benchmarks/runtime_closed_loop.py [--steps 10] [--seq 128] [--hidden 384] [--vocab 1024]
        [--rounds 3] [--only NAMES] [--no-caps]

The model is `tiny`'s shape (4 blocks, 4 heads) at hidden size 384, vocabulary 1024 and sequence
128 by default: a few milliseconds of work per layer and microbatch, so the operating system's
time slices (a few ms, which a process waiting for a core loses whole) do not swamp the step as
they do at `tiny`'s own size (hidden 64, sequence 32; steps of 30 ms). `--hidden 64 --vocab 256
--seq 32` runs `tiny` itself.

Where a plan has more processes than the machine has cores, each process (in the profile and in
the run alike) is held to an equal share of the cores by a cgroup v1 CPU quota, as each worker
of a GPU plan has a device of a fixed speed to itself; this needs root and a writable
/sys/fs/cgroup/cpu, and is skipped otherwise or with `--no-caps`. `--only dp2,gpipe` runs some
plans.

The scenario uses the profile's layer times and its measured point-to-point link (bandwidth and
latency) for links and TP traffic, with the time constants the profile gives
(``profiler.time_constants``: transfers as measured, the gradient all-reduce scaled by the
profile's measured all-reduce over the modelled one). Prints JSON: per plan, estimated and measured step
time and the relative error (goal within 15%). Each plan is profiled and run ``--rounds`` times,
the rounds going over all the plans in turn; the error is the median estimate's against the
median measured step.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
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
from shoal.specs.model import ModelSpec  # noqa: E402
from shoal.specs.plan import TrainingPlan  # noqa: E402


def plan(stages, mbs=2, schedule="1f1b", zero=0, recompute=False):
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": schedule, "zero_stage": zero, "recompute": recompute,
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
    "gpipe-recompute": plan([((0, 2), [(1, 8)]), ((2, 6), [(1, 8)])], schedule="gpipe",
                            recompute=True),
}


def scenario(prof: Path, p: TrainingPlan, seq: int, world: int, spec: ModelSpec) -> dict:
    link = json.loads(prof.read_text())["network"]["link"]
    ln = {"bandwidth": link["bandwidth_Bps"], "latency": link["latency_s"]}
    return {"model": spec.model_dump(), "job": {"global_batch": global_batch(p), "seq_len": seq,
                                     "optimizer": "adamw", "precision": "fp32",
                                     "zero_stage": [0, 1, 2], "recompute": [False, True],
                                     "schedule": ["1f1b", "gpipe"]},
            "pool": {"regions": {"local": {"zones": {"local": {"gpus": {"cpu": world}}}}},
                     "gpus_per_node": {"cpu": world}},
            "network": {"defaults": {"same_zone": ln}, "intra_node": {"cpu": ln}},
            "prices": {"gpu_usd_per_h": {"cpu": 0.0}}, "profiles": {"compute": str(prof)}}


def estimated(tmp: Path, name: str, prof: Path, p: TrainingPlan, seq: int, world: int,
              spec: ModelSpec) -> float:
    f = tmp / f"{name}-{prof.stem}.yaml"
    f.write_text(yaml.safe_dump(scenario(prof, p, seq, world, spec)))
    pb = load_problem(f)
    pb = pb.with_constants(timing=profiler.time_constants(json.loads(prof.read_text()), pb.timing))
    return estimate(pb, p).iteration_time_s


CPU_CGROUP = Path("/sys/fs/cgroup/cpu")  # cgroup v1's CPU controller
PERIOD_US = 20_000


def can_cap() -> bool:
    """Whether this process may make CPU cgroups (cgroup v1, as root)."""
    return os.access(CPU_CGROUP, os.W_OK) and (CPU_CGROUP / "cgroup.procs").exists()


def capped(tag: str, share: float, fn, *args) -> None:
    """In a launched rank: move this process into a cgroup of its own that lets it use
    ``share`` of a core, then run ``fn(*args)``."""
    import torch.distributed as dist

    d = CPU_CGROUP / f"{tag}-rank{dist.get_rank()}"
    d.mkdir(exist_ok=True)
    (d / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (d / "cpu.cfs_quota_us").write_text(str(int(PERIOD_US * share)))
    (d / "cgroup.procs").write_text(str(os.getpid()))
    fn(*args)


def run(world: int, share: float | None, fn, *args) -> None:
    """``fn(*args)`` in ``world`` processes; each capped at ``share`` of a core when given."""
    if share is None:
        launch(world, fn, *args)
        return
    tag = f"shoal-closed-loop-{os.getpid()}"
    try:
        launch(world, capped, tag, share, fn, *args)
    finally:
        for d in CPU_CGROUP.glob(f"{tag}-rank*"):
            with contextlib.suppress(OSError):  # not empty yet: left for the system to reap
                d.rmdir()  # empty once its process has exited


def measure(path: Path, world: int, p: TrainingPlan, spec: ModelSpec, args,
            share: float | None) -> Path:
    """`shoal profile`'s measurement with ``world`` processes: TP 1 by all of them, TP 2 by
    groups of two side by side (by ``world`` itself when it is even, else by two)."""
    run(world, share, profiler.run, spec, spec.name, [1] + ([2] if world % 2 == 0 else []),
        [p.microbatch_size], args.seq, args.reps, path)
    if world % 2:
        extra = path.with_suffix(".tp2.json")
        run(2, share, profiler.run, spec, spec.name, [2], [p.microbatch_size], args.seq,
            args.reps, extra)
        doc = json.loads(path.read_text())
        doc["gpus"]["cpu"].update(json.loads(extra.read_text())["gpus"]["cpu"])
        path.write_text(json.dumps(doc))
    return path


def train(p: TrainingPlan, spec: ModelSpec, args, share: float | None) -> list[float]:
    """The runtime's step times (rank 0's) for ``args.steps`` steps of the plan."""
    import torch

    res = spawn(p, spec, args.steps, args.seq, dtype=torch.float32,
                launcher=lambda world, fn, *a: run(world, share, fn, *a))
    return res[0]["step_time_s"]


def summary(rows: list[tuple[float, float, float | None]], world: int, share: float | None) -> dict:
    """A plan's rounds: the median estimate against the median measured step."""
    est = statistics.median(e for e, _, _ in rows)
    meas = statistics.median(m for _, m, _ in rows)
    out = {"processes": world, "core_share": round(share, 3) if share else None,
           "rounds": len(rows), "estimated_s": round(est, 5), "measured_s": round(meas, 5),
           "error": round(est / meas - 1, 3),
           "round_errors": [round(e / m - 1, 3) for e, m, _ in rows]}
    if rows[0][2] is not None:
        out["estimated_s_one_process_per_core"] = round(statistics.median(c for _, _, c in rows), 5)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--hidden", type=int, default=384,
                    help=f"hidden size of the model (tiny's is {TINY.hidden_size})")
    ap.add_argument("--vocab", type=int, default=1024, help=f"(tiny's is {TINY.vocab_size})")
    ap.add_argument("--rounds", type=int, default=3,
                    help="profile-and-run rounds per plan (medians of each reported)")
    ap.add_argument("--only", help="comma-separated plan names (all by default)")
    ap.add_argument("--no-caps", action="store_true",
                    help="do not hold processes to an equal share of the cores")
    args = ap.parse_args()

    spec = TINY.model_copy(update={"hidden_size": args.hidden, "vocab_size": args.vocab,
                                   "max_seq_len": max(TINY.max_seq_len, args.seq)})

    tmp = Path(tempfile.mkdtemp())
    out = {}
    cores = os.cpu_count() or 1
    caps = not args.no_caps and can_cap()
    names = args.only.split(",") if args.only else list(PLANS)
    if unknown := sorted(set(names) - set(PLANS)):
        ap.error(f"--only: unknown plan {', '.join(unknown)}; plans: {', '.join(PLANS)}")
    rounds: dict[str, list[tuple[float, float, float | None]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names:
            p = PLANS[name]
            world = layout(p, spec).world
            # where processes outnumber cores, each is held to an equal share of them, as a
            # worker has a device of its own (else one process may have a core while two share
            # the other, and an idle one leaves its share to the others)
            share = cores / world if caps and world > cores else None
            # profiled right before the run: this machine's speed drifts by 10-20% over minutes
            prof = measure(tmp / f"{name}-{r}-profile-{world}.json", world, p, spec, args, share)
            try:
                est = estimated(tmp, name, prof, p, args.seq, world, spec)
            except SpecError as e:
                out[name] = {"processes": world, "estimated_s": None, "not_estimated": str(e)}
                print(json.dumps({name: out[name]}), file=sys.stderr)
                continue
            times = train(p, spec, args, share)[2:]  # after 2 warm-up steps
            per_core = None
            if world > cores and share is None:
                # processes outnumber cores: the profile charges every layer the slowdown of all
                # of them busy at once; the estimate from the profile of one process per core
                # shows the other end (each busy process with a core of its own)
                per_core = estimated(tmp, name, measure(
                    tmp / f"{name}-{r}-profile-{cores}.json", cores, p, spec, args, None),
                    p, args.seq, world, spec)
            rounds[name].append((est, statistics.median(times), per_core))
            print(json.dumps({"round": r, name: {"estimated_s": round(est, 5), "measured_s": round(
                rounds[name][-1][1], 5), "error": round(est / rounds[name][-1][1] - 1, 3)}}),
                file=sys.stderr)
            out[name] = summary(rounds[name], world, share)
    errs = [abs(v["error"]) for v in out.values() if "error" in v]
    out["mean_abs_error"] = round(statistics.mean(errs), 3) if errs else None
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
