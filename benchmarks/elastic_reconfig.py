"""Kill-free reconfiguration against a full restart, on the CPU test model.

    python benchmarks/elastic_reconfig.py [--repeats 3]

Kill-free: 4 elastic workers train `tiny`; one is killed with SIGKILL after step 3; the time from
the controller noticing to the survivors' first step under the new plan (planner-chosen), as the
job reports it. Full restart: what a restart of every process costs for the same change, measured
as `shoal train PLAN --resume` through torchrun (new interpreters, rendezvous, model build,
checkpoint load) from launch to the end of its first step. Prints JSON (medians).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch.distributed as dist

from shoal.catalog import TINY
from shoal.runtime import shards
from shoal.runtime.elastic import ElasticJob, PolicyChoice
from shoal.specs.plan import TrainingPlan

SEQ = 16
START = TrainingPlan.model_validate({"microbatch_size": 2, "stages": [
    {"layers": [0, 3], "replicas": [{"gpu": "cpu", "tp": 2, "zone": "local", "microbatches": 4}]},
    {"layers": [3, 6], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": m}
                                    for m in (3, 1)]}]})


def kill_free(tmp: Path, at_sync: bool) -> tuple[float, float, TrainingPlan, Path]:
    """(noticed to first step, lost to first step, the new plan, the checkpoint folder)."""
    choice = PolicyChoice(TINY, 8, SEQ, 2)
    choice.cache[4] = START
    ck = tmp / "ck"
    lost_at = tmp / "lost-at"
    real, parent, calls = shards.ParamStore.finish, os.getpid(), {"n": 0}

    def exits_at_sync(self):  # the workers are forked: they see this (the gradient sync)
        calls["n"] += 1
        if at_sync and os.getpid() != parent and dist.get_rank() == 3 and calls["n"] == 3:
            lost_at.write_text(str(time.time()))
            os._exit(3)
        return real(self)

    shards.ParamStore.finish = exits_at_sync
    job = ElasticJob(TINY, choice, total_steps=8, seq=SEQ, ckpt_dir=str(ck), every=2, keep=100)
    done = set()

    def events(j):
        if not at_sync and "k" not in done and j.store.check(["g0/last_step"]) \
                and int(j.store.get("g0/last_step")) >= 3:
            done.add("k")
            lost_at.write_text(str(time.time()))
            os.kill(j.pid(3), signal.SIGKILL)

    try:
        res = job.run(4, events=events)
    finally:
        shards.ParamStore.finish = real
    first = float(job.store.get(f"g{job.gen}/first_step_at"))
    return (res["reconfigurations"][-1]["detect_to_first_step_s"],
            first - float(lost_at.read_text()), choice(3), ck)


def full_restart(tmp: Path, plan: TrainingPlan, ck: Path) -> float:
    f = tmp / "plan.json"
    f.write_text(plan.model_dump_json(by_alias=True))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "shoal", "train", str(f), "--model", "tiny",
                    "--steps", "1", "--seq", str(SEQ), "--dtype", "float64",
                    "--checkpoint-dir", str(ck), "--resume", "--json"],
                   capture_output=True, text=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, list[float]] = {k: [] for k in (
        "kill_noticed_to_first_step_s", "kill_to_first_step_s",
        "sync_exit_noticed_to_first_step_s", "sync_exit_to_first_step_s", "full_restart_s")}
    for _ in range(args.repeats):
        tmp = Path(tempfile.mkdtemp())
        t, t_lost, plan, ck = kill_free(tmp / "kill", at_sync=False)
        runs["kill_noticed_to_first_step_s"].append(t)
        runs["kill_to_first_step_s"].append(t_lost)
        t, t_lost, _, _ = kill_free(tmp / "sync", at_sync=True)
        runs["sync_exit_noticed_to_first_step_s"].append(t)
        runs["sync_exit_to_first_step_s"].append(t_lost)
        runs["full_restart_s"].append(full_restart(tmp / "kill", plan, ck))
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(json.dumps({**med, "ratio": med["full_restart_s"] / med["kill_to_first_step_s"],
                      "runs": runs, "new_plan": plan.summary()}, indent=1))


if __name__ == "__main__":
    main()
