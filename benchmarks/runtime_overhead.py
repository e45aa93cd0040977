"""Step time of shoal's runtime on a pure data-parallel plan against PyTorch's
DistributedDataParallel, on the same processes, model, data and microbatches (gloo, CPU).

    python benchmarks/runtime_overhead.py [--ranks 2] [--steps 20] [--hidden 256] [--layers 4]

Prints JSON: median step time of each and their ratio (shoal / DDP; goal <= 1.15).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shoal.runtime.model import Stage
from shoal.runtime.pipeline import Worker
from shoal.runtime.train import batch, launch
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan


def run(args, out: str) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    spec = ModelSpec(name="bench", num_layers=args.layers, hidden_size=args.hidden, num_heads=4,
                     vocab_size=512, max_seq_len=args.seq)
    mb, per_rank = 2, 4
    plan = TrainingPlan.model_validate({"microbatch_size": mb, "stages": [{
        "layers": [0, args.layers + 2], "replicas": [
            {"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": per_rank}] * world}]})
    gb = mb * per_rank * world
    w = Worker(plan, spec, dtype=torch.float32)
    ours = []
    for step in range(args.steps):
        tokens = batch(step, gb, args.seq, spec.vocab_size)
        t0 = time.perf_counter()
        w.step(tokens)
        ours.append(time.perf_counter() - t0)
    model = Stage(spec, 0, args.layers + 2, dtype=torch.float32)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3, weight_decay=0.01)
    theirs = []
    for step in range(args.steps):
        tokens = batch(step, gb, args.seq, spec.vocab_size)
        mine = tokens[rank * mb * per_rank:(rank + 1) * mb * per_rank]
        t0 = time.perf_counter()
        opt.zero_grad()
        for m in range(per_rank):
            t = mine[m * mb:(m + 1) * mb]
            ctx = ddp.no_sync() if m < per_rank - 1 else torch.enable_grad()
            with ctx:
                y = ddp(t[:, :-1])
                loss = F.cross_entropy(y.reshape(-1, y.shape[-1]), t[:, 1:].reshape(-1),
                                       reduction="sum") / float(gb * args.seq)
                loss.backward()
        opt.step()
        theirs.append(time.perf_counter() - t0)
    if rank == 0:
        skip = min(3, args.steps // 4)  # warm-up steps
        a, b = statistics.median(ours[skip:]), statistics.median(theirs[skip:])
        Path(out).write_text(json.dumps({"ranks": world, "hidden": args.hidden,
                                         "layers": args.layers, "seq": args.seq,
                                         "steps": args.steps, "shoal_step_s": a, "ddp_step_s": b,
                                         "ratio": a / b}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    args = ap.parse_args()
    out = Path(tempfile.mkdtemp()) / "r.json"
    launch(args.ranks, run, args, str(out))
    print(out.read_text())


if __name__ == "__main__":
    main()
