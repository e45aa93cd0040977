"""The worker program ``shoal train`` starts under torchrun: one process per GPU (or CPU rank)
of the plan; rank 0 reports progress on stderr and writes the result file."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from shoal import catalog
from shoal.runtime.train import global_batch, run_rank
from shoal.specs.plan import TrainingPlan


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shoal.runtime.entry")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--result", required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    plan = TrainingPlan.model_validate_json(Path(a.plan).read_text())
    spec = catalog.models().get(a.model)
    rank = dist.get_rank()
    tokens = global_batch(plan) * a.seq

    def progress(step, loss, dt):
        if rank == 0:
            print(json.dumps({"step": step, "loss": loss, "step_time_s": dt,
                              "tokens_per_s": tokens / dt}), file=sys.stderr, flush=True)

    try:
        res = run_rank(plan, spec, a.steps, a.seq, seed=a.seed, dtype=getattr(torch, a.dtype),
                       progress=progress, checkpoint_dir=a.checkpoint_dir, resume=a.resume)
        if rank == 0:
            times = res["step_time_s"]
            doc = {"steps": len(res["losses"]), "first_step": res["first_step"],
                   "losses": res["losses"], "final_loss": res["losses"][-1] if res["losses"] else None,
                   "step_time_s": sum(times) / len(times) if times else None,
                   "step_times_s": times, "tokens_per_iteration": tokens,
                   "world_size": dist.get_world_size(), "backend": backend,
                   "reconfigurations": []}
            tmp = Path(a.result + ".tmp")
            tmp.write_text(json.dumps(doc))
            tmp.replace(a.result)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
