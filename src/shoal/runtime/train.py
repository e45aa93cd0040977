"""Training with the runtime: synthetic token batches, the one-process reference, and running a
plan's ranks (spawned on this machine with gloo, or under torchrun)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import tempfile
import time
import weakref
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.runtime import checkpoint as ckpt
from shoal.runtime.model import Stage, token_loss
from shoal.runtime.supervise import die_with_parent
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan


def batch(step: int, global_batch: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """The iteration's tokens (global batch x (seq + 1)): uniform ids from a generator seeded by
    (seed, step), so every rank and the reference see the same data without a data set."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (global_batch, seq + 1), generator=gen)


def global_batch(plan: TrainingPlan) -> int:
    return sum(r.microbatches for r in plan.stages[0].replicas) * plan.microbatch_size


def reference(spec: ModelSpec, plan: TrainingPlan, steps: int, seq: int, *, seed: int = 0,
              dtype=torch.float64, lr: float = 1e-3, weight_decay: float = 0.01):
    """One process training the whole model on the same batches: (losses, parameters by
    global layer index and name)."""
    model = Stage(spec, 0, spec.num_layers + 2, seed=seed, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    mbs, gb = plan.microbatch_size, global_batch(plan)
    losses = []
    for step in range(steps):
        tokens = batch(step, gb, seq, spec.vocab_size, seed)
        opt.zero_grad()
        total = 0.0
        for m in range(gb // mbs):
            t = tokens[m * mbs:(m + 1) * mbs]
            y = model(t[:, :-1])
            loss = token_loss(y, t[:, 1:], float(gb * seq))
            loss.backward()
            total += float(loss.detach())
        opt.step()
        losses.append(total)
    params = {}
    for name, p in model.named_parameters():
        _, k, rest = name.split(".", 2)
        params[(int(k), rest)] = p.detach().clone()
    return losses, params


def _shared_token(mine: str | None) -> str:
    """The checkpoint token every rank uses: rank 0's (``mine``, or a new one), broadcast (the
    launchers of several machines each have their own)."""
    t = torch.zeros(64, dtype=torch.uint8)
    if dist.get_rank() == 0:
        raw = (mine or ckpt.new_token()).encode()[:64]
        t[:len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
    dist.broadcast(t, 0)
    return bytes(t.tolist()).rstrip(b"\0").decode()


def save_checkpoint(w, directory: str | Path, step: int, plan: TrainingPlan, *, token: str,
                    keep: int | None = None) -> Path:
    """Collective: every writer rank (its stage's first replica) puts its share into this
    write's own temporary folder; rank 0 then publishes it as ``step-N`` (see
    ``shoal.runtime.checkpoint``), keeping the newest ``keep`` checkpoints when given."""
    tmp = ckpt.temp_folder(directory, step, token)
    rank = dist.get_rank()
    if rank == 0:
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()  # new: the token is this run's own
    dist.barrier()
    doc = w.snapshot()
    if w.role.replica == 0:
        ckpt.write_rank_file(tmp, rank, doc)
    dist.barrier()
    if rank == 0:
        writers = [r for r, role in enumerate(w.lay.roles) if role.replica == 0]
        ckpt.publish(tmp, step, {**ckpt.checkpoint_meta(w, plan), "run": token},
                     writers=writers, keep=keep)
    dist.barrier()
    return Path(directory) / f"step-{step}"


def run_rank(plan: TrainingPlan, spec: ModelSpec, steps: int, seq: int, *, seed: int = 0,
             dtype=torch.float64, out_dir: str | None = None, progress=None,
             checkpoint_dir: str | None = None, resume: bool = False,
             every: int | None = None, keep: int | None = None,
             token: str | None = None) -> dict:
    """This rank's part of training (the process group must be initialised): per-step losses
    and times, with ``progress(steps_done, loss, step_time_s)`` called after each step; with
    ``out_dir``, its parameters are saved there for checks. With ``checkpoint_dir``: ``resume``
    starts from its newest checkpoint (written under any plan), a checkpoint is written after
    every step whose number ``every`` divides and after the last step, and only the newest
    ``keep`` stay (all without ``keep``). Rank 0's ``token`` (a new one without it) names this
    run's temporary folders on every rank."""
    from shoal.runtime.pipeline import Worker

    w = Worker(plan, spec, seed=seed, dtype=dtype)
    gb = global_batch(plan)
    start = 0
    if checkpoint_dir is not None:
        token = _shared_token(token)
    if resume and checkpoint_dir is not None:
        found = ckpt.latest(checkpoint_dir)
        if found is not None:
            start, folder = found
            w.load(folder)
    losses, times = [], []
    for step in range(start, start + steps):
        tokens = batch(step, gb, seq, spec.vocab_size, seed)
        t0 = time.perf_counter()
        losses.append(w.step(tokens))
        times.append(time.perf_counter() - t0)
        done = step + 1  # steps done, as checkpoints count them
        if progress is not None:
            progress(done, losses[-1], times[-1])
        if checkpoint_dir is not None and (done == start + steps or (every and done % every == 0)):
            save_checkpoint(w, checkpoint_dir, done, plan, token=token, keep=keep)
    res = {"rank": dist.get_rank(), "role": w.role, "losses": losses, "step_time_s": times,
           "first_step": start}
    if out_dir is not None:
        torch.save({**res, "role": tuple(w.role.__dict__.values()), "state": w.state()},
                   Path(out_dir) / f"rank{dist.get_rank()}.pt")
    return res


def store(port: int = 0, *, host: bool = False, timeout_s: float = 120.0,
          listen_fd: int | None = None) -> dist.TCPStore:
    """The key-value store processes of this machine meet in. ``host=True`` serves it (port 0:
    on a port the system picks, held from then on, so two launches never race for one; with
    ``listen_fd``, on that socket, already listening on ``port``); else a client of the one
    served on ``port``."""
    return dist.TCPStore("127.0.0.1", port, is_master=host, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s), master_listen_fd=listen_fd)


def _serve_until_closed(listen_fd: int, port: int, stop_fd: int, parent: int) -> None:
    die_with_parent(signal.SIGKILL, parent)  # its parent may be killed without a chance to close()
    st = store(port, host=True, listen_fd=listen_fd)
    os.read(stop_fd, 1)  # a byte from close(), or b"" once every write end is closed
    del st


class StoreHost:
    """A store served by a forked process of its own, for a parent that goes on forking
    workers: a store served in the parent runs a thread there, and a child forked while that
    thread holds a lock can hang. The server stops on ``close()``, when this object is
    collected, when the parent exits, or when the parent is killed (a parent-death signal)."""

    def __init__(self, backlog: int = 64):
        import multiprocessing as mp

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(backlog)
            self.port = sock.getsockname()[1]
            stop_r, stop_w = os.pipe()
            proc = mp.get_context("fork").Process(
                target=_serve_until_closed, args=(sock.fileno(), self.port, stop_r, os.getpid()),
                daemon=True)
            proc.start()
            os.close(stop_r)
        # clients may connect at once: the socket listened before the fork
        self.close = weakref.finalize(self, _stop_host, stop_w, proc)


def _stop_host(stop_w: int, proc) -> None:
    # a byte, not only the close: processes forked since hold copies of the write end
    with contextlib.suppress(OSError):  # the server is already gone
        os.write(stop_w, b"x")
    os.close(stop_w)
    proc.join(timeout=10)
    if proc.is_alive():
        proc.kill()
        proc.join()


def _launched(rank: int, world: int, port: int, listen_fd: int | None, fn, args: tuple) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # rank 0 serves the store on the launcher's socket (when given)
    serve = listen_fd is not None and rank == 0
    st = store(port, host=serve, listen_fd=listen_fd if serve else None)
    dist.init_process_group("gloo", store=st, rank=rank, world_size=world)
    try:
        fn(*args)
    finally:
        dist.destroy_process_group()


def launch(world: int, fn, *args) -> None:
    """Run ``fn(*args)`` in ``world`` processes on this machine, joined by gloo."""
    # fork where the platform has it: the children start at once, with torch already imported
    if "fork" in torch.multiprocessing.get_all_start_methods():
        # a socket bound to a port the system picks, held until every child is done (two
        # launches never race for one); rank 0 serves the store on it. A store served here
        # would run a thread in this process, and a child forked while that thread holds a
        # lock can hang.
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen(max(world, 8))
            torch.multiprocessing.start_processes(
                _launched, args=(world, sock.getsockname()[1], sock.fileno(), fn, args),
                nprocs=world, join=True, start_method="fork")
        return
    served = store(host=True)  # spawned children start clean: held until they are done
    torch.multiprocessing.start_processes(_launched, args=(world, served.port, None, fn, args),
                                          nprocs=world, join=True, start_method="spawn")


def _run_from_json(plan_json: str, spec_json: str, steps: int, seq: int, seed: int,
                   dtype_name: str, out_dir: str, checkpoint_dir: str | None, resume: bool,
                   every: int | None, keep: int | None) -> None:
    run_rank(TrainingPlan.model_validate_json(plan_json), ModelSpec.model_validate_json(spec_json),
             steps, seq, seed=seed, dtype=getattr(torch, dtype_name), out_dir=out_dir,
             checkpoint_dir=checkpoint_dir, resume=resume, every=every, keep=keep)


def spawn(plan: TrainingPlan, spec: ModelSpec, steps: int, seq: int, *, seed: int = 0,
          dtype=torch.float64, out_dir: str | None = None, checkpoint_dir: str | None = None,
          resume: bool = False, every: int | None = None, keep: int | None = None,
          launcher=None) -> list[dict]:
    """Run the plan's ranks as processes on this machine (gloo); each rank's saved result
    (read as weights only). ``launcher(world, fn, *args)`` starts them (``launch`` by
    default)."""
    from shoal.runtime.pipeline import layout

    world = layout(plan, spec).world
    with tempfile.TemporaryDirectory(prefix="shoal-run-") as tmp:
        out = out_dir or tmp  # results are read back before the temporary folder goes
        (launcher or launch)(world, _run_from_json, plan.model_dump_json(by_alias=True),
                             spec.model_dump_json(), steps, seq, seed, str(dtype).split(".")[-1],
                             out, checkpoint_dir, resume, every, keep)
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=True) for r in range(world)]
