"""An elastic worker (``shoal.runtime.elastic``): one process that follows the controller's
generations until the job is done, never restarted.

Each generation's process group lives under a store prefix of its own. Before every step the
group's rank 0 tells the others whether a new generation is waiting (one broadcast), so they all
leave at the same step. When a member dies instead, its peers are left blocked in
communication: gloo fails a pending operation only when its connection closes or its timeout
(PG_TIMEOUT_S) passes, and a survivor that leaves with a send still pending keeps the old
group's connections open. So each worker's watcher thread shuts the old group's connections
(every TCP connection of the process but its store clients and those it inherited) once the
controller marks the generation aborted, and the blocked operations fail at once; a worker
leaving a generation does the same to what is left of it.

Checkpoints every K steps are asynchronous: the state is copied at the step boundary and a
thread writes it while training goes on, into ``step-N.tmp-<run>-g<generation>``; each rank
marks its file done in the store, and the first rank publishes ``step-N`` once every rank has.
"""

from __future__ import annotations

import contextlib
import gc
import json
import multiprocessing as mp
import os
import signal
import socket
import stat
import threading
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.runtime import checkpoint as ckpt
from shoal.runtime.arch import Arch
from shoal.runtime.data import RandomTokens
from shoal.runtime.pipeline import Worker
from shoal.runtime.supervise import die_with_parent, parent_alive
from shoal.runtime.train import store as make_store
from shoal.specs.plan import TrainingPlan

HEARTBEAT_S = 0.3
WATCH_S = 0.05  # how often a worker looks for an abort of its generation
JOIN_ATTEMPTS = 5  # a worker's starts of one generation before it reports the generation failed
# how long a worker waits on a peer that neither answers nor leaves (a hang); a lost member
# does not make anyone wait for it (the generation is aborted)
PG_TIMEOUT_S = float(os.environ.get("SHOAL_ELASTIC_TIMEOUT_S", "8"))



def _client(port: int, addr: str = "127.0.0.1"):
    """A store client of its own (a client is not shared between threads)."""
    return make_store(port, addr=addr)


def _open_fds() -> list[int]:
    where = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    return [int(x) for x in os.listdir(where) if x.isdigit()]


def _sockets() -> set[tuple[int, int]]:
    """The identities of this process's sockets."""
    out = set()
    for fd in _open_fds():
        with contextlib.suppress(OSError):
            st = os.fstat(fd)
            if stat.S_ISSOCK(st.st_mode):
                out.add((st.st_dev, st.st_ino))
    return out


def _sever(store_port: int, inherited: set[tuple[int, int]]) -> int:
    """Shut down every TCP connection of this process but those to the store and those it
    inherited (gloo's connections, that is), so that operations pending on them, here and at
    the peers, fail now; gloo closes the descriptors when it frees the group. The number shut."""
    n = 0
    for fd in _open_fds():
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if not stat.S_ISSOCK(st.st_mode) or (st.st_dev, st.st_ino) in inherited:
            continue
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        with s:  # closes the duplicate only
            if s.family not in (socket.AF_INET, socket.AF_INET6) or s.type != socket.SOCK_STREAM:
                continue
            try:
                peer = s.getpeername()
            except OSError:  # listening, or not connected
                continue
            if peer[1] == store_port:
                continue
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
                n += 1
    return n


@dataclass(frozen=True)
class CheckpointWrite:
    """One asynchronous checkpoint: its folder, step, how many to keep, its ``meta.json``, and
    the run token and generation that name its temporary folder."""

    directory: Path
    step: int
    keep: int
    meta: dict
    token: str
    gen: int


def _write_async(port: int | tuple[str, int], c: CheckpointWrite, where: tuple[int, int],
                 writer: bool, doc: dict) -> threading.Thread:
    """Write this rank's share of checkpoint ``c.step`` in a thread; rank 0 publishes it once
    every rank's share is on disk. The temporary folder is this run's and generation's own, so
    the files of a run or generation that broke off mid-write never mix with another's."""
    rank, world = where  # this rank and the generation's size
    gen, step = c.gen, c.step
    tmp = ckpt.temp_folder(c.directory, step, f"{c.token}-g{gen}")

    addr, port = port if isinstance(port, tuple) else ("127.0.0.1", port)

    def work() -> None:
        store = _client(port, addr)
        if writer:
            tmp.mkdir(exist_ok=True)  # made by whichever writer comes first
            ckpt.write_rank_file(tmp, rank, doc)
        store.set(f"g{gen}/ckpt/{step}/{rank}", "1" if writer else "0")
        if rank == 0:
            keys = [f"g{gen}/ckpt/{step}/{r}" for r in range(world)]
            store.wait(keys)
            writers = [r for r, k in enumerate(keys) if store.get(k) == b"1"]
            ckpt.publish(tmp, step, c.meta, writers=writers, keep=c.keep)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t


@dataclass(frozen=True)
class WorkerJob:
    """What every elastic worker of a job is given: the store's port and the process id of the
    worker's parent (the controller, or a node agent on another machine), the model (an Arch as
    JSON), the sequence, the steps to train to, the checkpoint folder with its rhythm
    (``every``) and how many to keep, the seed, the dtype, where each rank's final parameters
    go for checks (``out_dir``), and the store's address."""

    port: int
    controller: int
    arch_json: str
    seq: int
    total_steps: int
    ckpt_dir: str
    every: int
    keep: int
    seed: int = 0
    dtype: str = "float64"
    out_dir: str | None = None
    addr: str = "127.0.0.1"  # where the store is served (the first machine's, elastic nodes)


def worker_main(wid: int, job: WorkerJob) -> None:
    """One elastic worker: follows the controller's generations until the job is done."""
    die_with_parent(signal.SIGKILL, job.controller)
    os.setpgid(0, 0)  # a Ctrl-C at the terminal reaches the controller only
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the controller's handler, forked along
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    _ElasticWorker(wid, job).run()


class _ElasticWorker:
    def __init__(self, wid: int, job: WorkerJob):
        self.wid, self.job = wid, job
        self.inherited = _sockets()  # the controller's, forked along: never shut here
        self.arch = Arch.model_validate_json(job.arch_json)
        self.data = RandomTokens(self.arch.spec.vocab_size, job.seed)
        self.store = _client(job.port, job.addr)
        self.token = self.store.get("run").decode()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.current: int | None = None  # the generation whose groups this worker is in
        self.starts: dict[int, int] = {}  # failed starts per generation

    def watch(self) -> None:
        """Heartbeats, and the abort of the current generation: its connections shut."""
        hb = _client(self.job.port, self.job.addr)
        beat = 0.0
        try:
            while not self.stop.is_set():
                if not parent_alive(self.job.controller):
                    os._exit(1)  # where no parent-death signal exists
                if time.monotonic() - beat >= HEARTBEAT_S:
                    hb.set(f"hb/{self.wid}", str(time.time()))
                    beat = time.monotonic()
                g = self.current
                if g is not None and hb.check([f"g{g}/abort"]):
                    with self.lock:
                        if self.current == g:
                            self.current = None
                            _sever(self.job.port, self.inherited)
                time.sleep(WATCH_S)
        except Exception:  # the store is gone, and with it the controller's job
            os._exit(1)

    def run(self) -> None:
        threading.Thread(target=self.watch, daemon=True).start()
        store = self.store
        store.set(f"ready/{self.wid}", str(os.getpid()))
        seen = -1
        while True:
            g = int(store.get("gen"))
            if store.check(["done"]):
                break
            if g == seen or g < 0:
                time.sleep(0.05)
                continue
            seen = g
            members = json.loads(store.get(f"g{g}/members"))
            if self.wid not in members or store.check([f"g{g}/abort"]):
                continue
            if not self._generation(g, members):
                seen = -1  # a member was still leaving the old group: join this one again
        self.stop.set()

    def _generation(self, g: int, members: list[int]) -> bool:
        """Train in generation ``g`` until the job is done or a newer generation waits; False
        when its group could not start yet and should be joined again."""
        store, job = self.store, self.job
        rank, world = members.index(self.wid), len(members)
        plan = TrainingPlan.model_validate_json(store.get(f"g{g}/plan"))
        joined = False
        w = None
        with self.lock:
            self.current = g
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"g{g}/pg", store),
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=PG_TIMEOUT_S))
            w = Worker(plan, self.arch, seed=job.seed, dtype=getattr(torch, job.dtype))
            joined = True
            self._train(g, w, plan, rank, world)
        except Exception:  # a peer left mid-step: wait for the controller's next generation
            self.starts[g] = self.starts.get(g, 0) + 1
            on = int(store.get("gen")) == g and not store.check([f"g{g}/abort"])
            if not joined and on and self.starts[g] < JOIN_ATTEMPTS:
                return False
            if on:
                # no new generation to move to: tell the controller why this one stopped
                store.set(f"g{g}/failed/{self.wid}",
                          json.dumps([time.time(), traceback.format_exc(limit=8)]))
        finally:
            with self.lock:
                self.current = None
            w = None  # drop the old groups' handles so their connections close now
            gc.collect()
            with contextlib.suppress(Exception):  # the group may already be broken
                dist.destroy_process_group()
            # what a pending send kept open: peers still waiting on it fail now
            _sever(job.port, self.inherited)
            # a failed start leaves torch's group counter advanced; the next group of this
            # generation must get the same name on every worker
            c10d = dist.distributed_c10d
            if hasattr(c10d, "_world"):
                c10d._world.group_count = 0
        return True

    def _train(self, g: int, w: Worker, plan: TrainingPlan, rank: int, world: int) -> None:
        store, job = self.store, self.job
        directory = Path(job.ckpt_dir)
        found = ckpt.latest(directory)
        start = 0
        if found is not None:
            start, folder = found
            w.load(folder)
        gb = sum(r.microbatches for r in plan.stages[0].replicas) * plan.microbatch_size
        step = start
        pending: list[threading.Thread] = []
        while step < job.total_steps:
            flag = torch.zeros(1)
            if rank == 0 and int(store.get("gen")) != g:
                flag += 1
            dist.broadcast(flag, 0)
            if flag.item():
                break  # a new generation is waiting: leave at this step boundary
            t0 = time.perf_counter()
            loss = w.step(self.data.batch(step, gb, job.seq))
            dt = time.perf_counter() - t0
            step += 1
            if rank == 0:
                if step == start + 1:
                    store.set(f"g{g}/resumed_from", str(start))
                    store.set(f"g{g}/first_step_at", str(time.time()))
                store.set(f"g{g}/step/{step}", json.dumps([loss, dt]))
                store.set(f"g{g}/last_step", str(step))
            if step % job.every == 0 or step == job.total_steps:
                write = CheckpointWrite(directory, step, job.keep,
                                        {**ckpt.checkpoint_meta(w, plan), "run": self.token},
                                        self.token, g)
                pending.append(_write_async((job.addr, job.port), write, (rank, world),
                                            w.role.replica == 0, w.snapshot()))
        for t in pending:
            t.join()
        if step >= job.total_steps:
            if job.out_dir is not None:
                torch.save({"role": tuple(w.role.__dict__.values()), "state": w.state(),
                            "plan": plan.model_dump_json(by_alias=True)},
                           Path(job.out_dir) / f"rank{rank}.pt")
            dist.barrier()
            if rank == 0:
                store.set("finished", str(g))


def run_node(endpoint: str, workers: int, *, timeout_s: float = 300.0) -> int:
    """A machine's part of a multi-machine elastic job: meet the controller's store at
    ``endpoint`` (host:port, served by the first machine), start ``workers`` workers there that
    register with it, and wait until the job is done. The number of workers that ended
    without an error."""
    addr, port = endpoint.rsplit(":", 1)
    store = _client(int(port), addr)
    store.set_timeout(timedelta(seconds=timeout_s))  # the first machine may start later
    job = WorkerJob(**{**json.loads(store.get("job")), "addr": addr, "port": int(port),
                       "controller": os.getpid()})
    ctx = mp.get_context("fork")
    procs = []
    for _ in range(workers):
        wid = store.add("wids", 1) - 1  # ids taken from the job's one counter
        p = ctx.Process(target=worker_main, args=(wid, job))
        p.start()
        procs.append(p)
    while any(p.is_alive() for p in procs):
        with contextlib.suppress(Exception):  # the controller's store gone: the job is over
            if store.check(["done"]):
                break
        time.sleep(0.2)
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    return sum(p.exitcode == 0 for p in procs)
