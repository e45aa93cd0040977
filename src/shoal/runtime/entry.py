"""The worker program ``shoal train`` starts under torchrun: one process per GPU (or CPU rank)
of the plan; rank 0 reports progress on stderr and writes the result file.

Each rank ends when torchrun ends (a parent-death signal) and, with ``--report-dir``, records
how it ended there (``shoal.runtime.supervise.RankReport``), so that ``shoal train`` can name
the rank that failed first."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from shoal.runtime.arch import Arch
from shoal.runtime.data import TokenFile

# torch is imported only once the signal mask is set (RankReport.stop_on_signals): a thread it
# starts before that could take SIGTERM and end the process without a report
from shoal.runtime.supervise import RankReport, die_with_parent
from shoal.runtime.train import RunOptions, global_batch, run_rank
from shoal.specs.plan import TrainingPlan


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m shoal.runtime.entry")
    ap.add_argument("--plan", required=True)
    ap.add_argument("--arch", required=True, help="the model's Arch as JSON")
    ap.add_argument("--job", required=True, help="steps, seq, seed, dtype, device, data as JSON")
    ap.add_argument("--checkpoint-dir", default=None)
    ap.add_argument("--checkpoint-every", type=int, default=None)
    ap.add_argument("--keep", type=int, default=None)
    ap.add_argument("--run-token", default=None)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--result", required=True)
    ap.add_argument("--report-dir", default=None)
    a = ap.parse_args(argv)
    report = None
    if a.report_dir is not None:
        report = RankReport(a.report_dir, int(os.environ.get("RANK", "0")))
        report.stop_on_signals()  # before torch or gloo start threads
    launcher = os.environ.get("SHOAL_PARENT_PID")
    if launcher is not None:
        die_with_parent(signal.SIGTERM, int(launcher))
    try:
        doc = _train(a)
    except BaseException as exc:
        if report is not None:
            report.failed(exc)
        raise
    if report is not None:
        report.final("done")
    if doc is not None:
        tmp = Path(a.result + ".tmp")
        tmp.write_text(json.dumps(doc))
        tmp.replace(a.result)


def _train(a) -> dict | None:
    """Train; rank 0's result document (None on the other ranks)."""
    import torch
    import torch.distributed as dist


    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    run = json.loads(Path(a.job).read_text())
    device = run["device"]
    if device == "cuda":  # one GPU per process, by its rank on this machine
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = f"cuda:{torch.cuda.current_device()}"
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend)
    plan = TrainingPlan.model_validate_json(Path(a.plan).read_text())
    arch = Arch.model_validate_json(Path(a.arch).read_text())
    rank = dist.get_rank()
    tokens = global_batch(plan) * run["seq"]

    def progress(step, loss, dt):
        if rank == 0:
            print(json.dumps({"step": step, "loss": loss, "step_time_s": dt,
                              "tokens_per_s": tokens / dt}), file=sys.stderr, flush=True)

    opts = RunOptions(seed=run["seed"], dtype=run["dtype"], device=device,
                      autocast=run["precision"], data=TokenFile(**run["data"]) if run["data"]
                      else None, checkpoint_dir=a.checkpoint_dir, resume=a.resume,
                      every=a.checkpoint_every, keep=a.keep, token=a.run_token,
                      save_hf=run["save_hf"])
    try:
        res = run_rank(plan, arch, run["steps"], run["seq"], opts, progress)
        dist.barrier()  # no rank closes its connections while a peer still uses them
        if rank != 0:
            return None
        times = res["step_time_s"]
        return {"steps": len(res["losses"]), "first_step": res["first_step"],
                "losses": res["losses"], "final_loss": res["losses"][-1] if res["losses"] else None,
                "step_time_s": sum(times) / len(times) if times else None,
                "step_times_s": times, "tokens_per_iteration": tokens,
                "world_size": dist.get_world_size(), "backend": backend, "device": run["device"],
                "precision": run["precision"], "reconfigurations": []}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
