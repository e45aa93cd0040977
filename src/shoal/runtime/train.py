"""Training with the runtime: the one-process reference, and running a plan's ranks (spawned on
this machine with gloo, or under torchrun)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import tempfile
import time
import weakref
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.runtime import checkpoint as ckpt
from shoal.runtime.arch import Arch, as_arch
from shoal.runtime.data import RandomTokens
from shoal.runtime.hf.weights import save_hf
from shoal.runtime.model import Stage, token_loss
from shoal.runtime.pipeline import Worker, layout
from shoal.runtime.supervise import die_with_parent
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan

LR, WEIGHT_DECAY = 1e-3, 0.01  # AdamW's, as the workers'


def batch(step: int, global_batch: int, seq: int, vocab: int, seed: int = 0) -> torch.Tensor:
    """The iteration's tokens (global batch x (seq + 1)): uniform ids from a generator seeded by
    (seed, step), so every rank and the reference see the same data without a data set."""
    return RandomTokens(vocab, seed).batch(step, global_batch, seq)


def global_batch(plan: TrainingPlan) -> int:
    return plan.global_batch


def reference(model: ModelSpec | Arch, plan: TrainingPlan, steps: int, seq: int, *,
              seed: int = 0, dtype=torch.float64, data=None):
    """One process training the whole model on the same batches: (losses, parameters by
    global layer index and name)."""
    arch = as_arch(model)
    data = data or RandomTokens(arch.spec.vocab_size, seed)
    model = Stage(arch, 0, arch.n_layers, seed=seed, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    mbs, gb = plan.microbatch_size, global_batch(plan)
    losses = []
    for step in range(steps):
        tokens = data.batch(step, gb, seq)
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


@dataclass(frozen=True)
class RunOptions:
    """How a rank trains besides the plan and the model: the seed of weights and data, the
    parameters' dtype, the device and the lower precision forwards run in (``autocast``:
    ``bf16`` or ``fp16``; ``fp32`` for none), the data (``RandomTokens`` when None),
    checkpoints (``every`` K steps and after the last, the newest ``keep`` kept, ``resume``
    from the newest; ``token`` names this run's temporary folders), where each rank saves its
    parameters for checks (``out_dir``), and where the trained model goes as a HuggingFace
    folder (``save_hf``)."""

    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"
    autocast: str = "fp32"
    data: object = None
    checkpoint_dir: str | None = None
    resume: bool = False
    every: int | None = None
    keep: int | None = None
    token: str | None = None
    out_dir: str | None = None
    save_hf: str | None = None

    @property
    def torch_dtype(self):
        return getattr(torch, self.dtype)

    @property
    def autocast_dtype(self):
        return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[self.autocast]


def options(**kw) -> RunOptions:
    """RunOptions from keywords, ``dtype`` given as a torch dtype or its name."""
    if "dtype" in kw and not isinstance(kw["dtype"], str):
        kw["dtype"] = str(kw["dtype"]).split(".")[-1]
    return RunOptions(**kw)


def run_rank(plan: TrainingPlan, model: ModelSpec | Arch, steps: int, seq: int,
             opts: RunOptions | None = None, progress=None) -> dict:
    """This rank's part of training (the process group must be initialised): per-step losses
    and times, with ``progress(steps_done, loss, step_time_s)`` called after each step; with
    ``opts.out_dir``, its parameters are saved there for checks. With a checkpoint folder:
    ``resume`` starts from its newest checkpoint (written under any plan), a checkpoint is
    written after every step whose number ``every`` divides and after the last step, and only
    the newest ``keep`` stay (all without ``keep``)."""
    o = opts or RunOptions()
    arch = as_arch(model)
    w = Worker(plan, arch, seed=o.seed, dtype=o.torch_dtype, device=o.device,
               autocast=o.autocast_dtype)
    data = o.data or RandomTokens(arch.spec.vocab_size, o.seed)
    gb = global_batch(plan)
    start, token = 0, o.token
    if o.checkpoint_dir is not None or o.save_hf is not None:
        token = _shared_token(token)
    if o.resume and o.checkpoint_dir is not None:
        found = ckpt.latest(o.checkpoint_dir)
        if found is not None:
            start, folder = found
            w.load(folder)
    losses, times = [], []
    for step in range(start, start + steps):
        tokens = data.batch(step, gb, seq)
        clock = _Clock(o.device)
        losses.append(w.step(tokens))
        times.append(clock.elapsed_s())
        done = step + 1  # steps done, as checkpoints count them
        if progress is not None:
            progress(done, losses[-1], times[-1])
        if o.checkpoint_dir is not None and (done == start + steps
                                             or (o.every and done % o.every == 0)):
            save_checkpoint(w, o.checkpoint_dir, done, plan, token=token, keep=o.keep)
    if o.save_hf is not None:
        export_hf(w, plan, o.save_hf, token)
    res = {"rank": dist.get_rank(), "role": w.role, "losses": losses, "step_time_s": times,
           "first_step": start}
    if o.out_dir is not None:
        torch.save({**res, "role": tuple(w.role.__dict__.values()), "state": w.state()},
                   Path(o.out_dir) / f"rank{dist.get_rank()}.pt")
    return res


class _Clock:
    """A step's time: CUDA events on a GPU (the device's own clock, once its queue has run),
    the host's clock elsewhere."""

    def __init__(self, device: str):
        self.cuda = device.startswith("cuda")
        if self.cuda:
            self.start, self.end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        self.t0 = time.perf_counter()

    def elapsed_s(self) -> float:
        if not self.cuda:
            return time.perf_counter() - self.t0
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3


def export_hf(w, plan: TrainingPlan, folder: str, token: str) -> None:
    """Collective: write the trained model as a HuggingFace folder (rank 0 writes it from a
    checkpoint every rank puts its share in, then removes the checkpoint)."""
    tmp = Path(folder).parent / f".{Path(folder).name}.parts-{token}"
    save_checkpoint(w, tmp, 0, plan, token=token)
    if dist.get_rank() == 0:
        full = ckpt.full_params(tmp / "step-0")
        save_hf(folder, w.arch, full, dtype=w.dtype if w.dtype != torch.float64 else torch.float32)
        shutil.rmtree(tmp, ignore_errors=True)
    dist.barrier()


def store(port: int = 0, *, host: bool = False, timeout_s: float = 120.0,
          listen_fd: int | None = None, addr: str = "127.0.0.1") -> dist.TCPStore:
    """The key-value store processes meet in (on this machine, or at ``addr``).
    ``host=True`` serves it (port 0: on a port the system picks, held from then on, so two
    launches never race for one; with ``listen_fd``, on that socket, already listening on
    ``port``); else a client of the one served at ``addr:port``."""
    return dist.TCPStore(addr, port, is_master=host, wait_for_workers=False,
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

    def __init__(self, backlog: int = 64, addr: str = "127.0.0.1", port: int = 0):
        import multiprocessing as mp

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((addr, port))
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


def _run_from_json(plan_json: str, arch_json: str, steps: int, seq: int,
                   opts: RunOptions) -> None:
    run_rank(TrainingPlan.model_validate_json(plan_json), Arch.model_validate_json(arch_json),
             steps, seq, opts)


def spawn(plan: TrainingPlan, model: ModelSpec | Arch, steps: int, seq: int, *, launcher=None,
          **kw) -> list[dict]:
    """Run the plan's ranks as processes on this machine (gloo); each rank's saved result
    (read as weights only). ``kw``: ``RunOptions`` fields (``dtype`` may be a torch dtype);
    ``launcher(world, fn, *args)`` starts the ranks (``launch`` by default)."""
    arch = as_arch(model)
    world = layout(plan, arch).world
    with tempfile.TemporaryDirectory(prefix="shoal-run-") as tmp:
        opts = options(**kw)
        out = opts.out_dir or tmp  # results are read back before the temporary folder goes
        opts = replace(opts, out_dir=out)
        (launcher or launch)(world, _run_from_json, plan.model_dump_json(by_alias=True),
                             arch.model_dump_json(), steps, seq, opts)
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=True) for r in range(world)]
