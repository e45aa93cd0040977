"""Elastic training without killing workers (Sailor §4.4): a controller watches who is alive,
chooses a plan for the workers it has, and the workers — the same processes, never restarted —
leave the old process group, build the new plan's groups, load their share from the newest
checkpoint (resharded to the new plan) and go on.

Membership lives in a TCPStore the controller hosts: workers send heartbeats, the controller
also sees its child processes exit, and workers added later register themselves. Each plan is a
*generation*: the controller publishes its members (worker ids in rank order) and plan; its
process group is created over a store prefix of its own, so a new group never meets the old
one's keys. Before every step the group's rank 0 tells the others whether a new generation is
waiting (one broadcast), so they all leave at the same step.

When a member dies instead, its peers are left blocked in communication: gloo fails a pending
operation only when its connection closes or its timeout (PG_TIMEOUT_S) passes, and a survivor
that leaves with a send still pending keeps the old group's connections open (gloo frees the
group only once that send ends). So the controller marks a generation it gives up on (a member
gone, or a retry) as aborted; each worker's watcher thread then shuts the old group's
connections (every TCP connection of the process but its store clients and those it inherited)
and the blocked operations fail at once; a worker leaving a generation does the same to what is
left of it. Reconfiguration never waits for gloo's timeout, which is left for a peer that hangs.

Checkpoints every K steps are asynchronous: the state is copied at the step boundary and a
thread writes it while training goes on, into ``step-N.tmp-<run>-g<generation>`` (a folder of
this run and generation alone); each rank marks its file done in the store, and the first rank
publishes ``step-N`` once every rank has (``shoal.runtime.checkpoint``: a manifest of sizes and
hashes, an atomic rename), so a crash mid-write leaves the previous checkpoint whole. Older
checkpoints beyond ``keep`` are removed.

The workers and the store end with the controller: each asks for SIGKILL when its parent ends
(and polls its parent where it cannot ask), each worker sits in a process group of its own (a
Ctrl-C at the terminal reaches the controller only, which stops them in order), and the
controller stops them all on its way out of ``run``, whatever the way (SIGTERM included).
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
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from shoal.errors import RunFailed
from shoal.runtime import checkpoint as ckpt
from shoal.runtime.supervise import die_with_parent, parent_alive, signals_raise
from shoal.runtime.train import StoreHost, batch
from shoal.runtime.train import store as make_store
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan

HEARTBEAT_S = 0.3
WATCH_S = 0.05  # how often a worker looks for an abort of its generation
JOIN_ATTEMPTS = 5  # a worker's starts of one generation before it reports the generation failed
MAX_RETRIES = 3  # a generation whose workers failed, all alive, is published again this often
# how long a worker waits on a peer that neither answers nor leaves (a hang); a lost member
# does not make anyone wait for it (the generation is aborted)
PG_TIMEOUT_S = float(os.environ.get("SHOAL_ELASTIC_TIMEOUT_S", "8"))
STOP_GRACE_S = 5.0  # how long stopped workers get to end before they are killed


@dataclass
class Reconfiguration:
    time_s: float  # since the job started
    cause: str
    old_plan: str | None
    new_plan: str
    members: list[int]
    detect_to_first_step_s: float | None = None
    steps_lost: int = 0
    resumed_from_step: int | None = 0  # None: no switch (the workers stayed)
    decision: str = "switch"

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _client(port: int):
    """A store client of its own (a client is not shared between threads)."""
    return make_store(port)


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


def _write_async(port: int, token: str, gen: int, rank: int, world: int, writer: bool, doc: dict,
                 step: int, directory: Path, keep: int, meta: dict) -> threading.Thread:
    """Write this rank's share of checkpoint ``step`` in a thread; rank 0 publishes it once
    every rank's share is on disk. The temporary folder is this run's and generation's own, so
    the files of a run or generation that broke off mid-write never mix with another's."""
    tmp = ckpt.temp_folder(directory, step, f"{token}-g{gen}")

    def work() -> None:
        store = _client(port)
        if writer:
            tmp.mkdir(exist_ok=True)  # made by whichever writer comes first
            ckpt.write_rank_file(tmp, rank, doc)
        store.set(f"g{gen}/ckpt/{step}/{rank}", "1" if writer else "0")
        if rank == 0:
            keys = [f"g{gen}/ckpt/{step}/{r}" for r in range(world)]
            store.wait(keys)
            writers = [r for r, k in enumerate(keys) if store.get(k) == b"1"]
            ckpt.publish(tmp, step, meta, writers=writers, keep=keep)

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t


def worker_main(wid: int, port: int, controller: int, model_json: str, seq: int,
                total_steps: int, ckpt_dir: str, every: int, keep: int, seed: int,
                dtype_name: str, out_dir: str | None) -> None:
    """One elastic worker: follows the controller's generations until the job is done."""
    from shoal.runtime.pipeline import Worker

    die_with_parent(signal.SIGKILL, controller)
    os.setpgid(0, 0)  # a Ctrl-C at the terminal reaches the controller only
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the controller's handler, forked along
    inherited = _sockets()  # the controller's, forked along: never shut here
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    spec = ModelSpec.model_validate_json(model_json)
    dtype = getattr(torch, dtype_name)
    store = _client(port)
    token = store.get("run").decode()
    stop = threading.Event()
    lock = threading.Lock()
    current: list[int | None] = [None]  # the generation whose groups this worker is in

    def watch() -> None:
        hb = _client(port)
        beat = 0.0
        try:
            while not stop.is_set():
                if not parent_alive(controller):
                    os._exit(1)  # where no parent-death signal exists
                if time.monotonic() - beat >= HEARTBEAT_S:
                    hb.set(f"hb/{wid}", str(time.time()))
                    beat = time.monotonic()
                g = current[0]
                if g is not None and hb.check([f"g{g}/abort"]):
                    with lock:
                        if current[0] == g:
                            current[0] = None
                            _sever(port, inherited)
                time.sleep(WATCH_S)
        except Exception:  # the store is gone, and with it the controller's job
            os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
    store.set(f"ready/{wid}", str(os.getpid()))
    directory = Path(ckpt_dir)
    seen = -1
    starts: dict[int, int] = {}  # failed starts per generation
    while True:
        g = int(store.get("gen"))
        if store.check(["done"]):
            break
        if g == seen or g < 0:
            time.sleep(0.05)
            continue
        seen = g
        members = json.loads(store.get(f"g{g}/members"))
        if wid not in members or store.check([f"g{g}/abort"]):
            continue
        rank, world = members.index(wid), len(members)
        plan = TrainingPlan.model_validate_json(store.get(f"g{g}/plan"))
        pending: list[threading.Thread] = []
        joined = False
        with lock:
            current[0] = g
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"g{g}/pg", store),
                                    rank=rank, world_size=world,
                                    timeout=timedelta(seconds=PG_TIMEOUT_S))
            w = Worker(plan, spec, seed=seed, dtype=dtype)
            joined = True
            found = ckpt.latest(directory)
            start = 0
            if found is not None:
                start, folder = found
                w.load(folder)
            gb = sum(r.microbatches for r in plan.stages[0].replicas) * plan.microbatch_size
            step = start
            while step < total_steps:
                flag = torch.zeros(1)
                if rank == 0 and int(store.get("gen")) != g:
                    flag += 1
                dist.broadcast(flag, 0)
                if flag.item():
                    break  # a new generation is waiting: leave at this step boundary
                t0 = time.perf_counter()
                loss = w.step(batch(step, gb, seq, spec.vocab_size, seed))
                dt = time.perf_counter() - t0
                step += 1
                if rank == 0:
                    if step == start + 1:
                        store.set(f"g{g}/resumed_from", str(start))
                        store.set(f"g{g}/first_step_at", str(time.time()))
                    store.set(f"g{g}/step/{step}", json.dumps([loss, dt]))
                    store.set(f"g{g}/last_step", str(step))
                if step % every == 0 or step == total_steps:
                    pending.append(_write_async(
                        port, token, g, rank, world, w.role.replica == 0, w.snapshot(), step,
                        directory, keep, {**ckpt.checkpoint_meta(w, plan), "run": token}))
            for t in pending:
                t.join()
            if step >= total_steps:
                if out_dir is not None:
                    torch.save({"role": tuple(w.role.__dict__.values()), "state": w.state(),
                                "plan": plan.model_dump_json(by_alias=True)},
                               Path(out_dir) / f"rank{rank}.pt")
                dist.barrier()
                if rank == 0:
                    store.set("finished", str(g))
        except Exception:  # a peer left mid-step: wait for the controller's next generation
            starts[g] = starts.get(g, 0) + 1
            on = int(store.get("gen")) == g and not store.check([f"g{g}/abort"])
            if not joined and on and starts[g] < JOIN_ATTEMPTS:
                seen = -1  # a member was still leaving the old group: join this one again
            elif on:
                # no new generation to move to: tell the controller why this one stopped
                store.set(f"g{g}/failed/{wid}",
                          json.dumps([time.time(), traceback.format_exc(limit=8)]))
        finally:
            with lock:
                current[0] = None
            w = None  # drop the old groups' handles so their connections close now
            gc.collect()
            with contextlib.suppress(Exception):  # the group may already be broken
                dist.destroy_process_group()
            # what a pending send kept open: peers still waiting on it fail now
            _sever(port, inherited)
            # a failed start leaves torch's group counter advanced; the next group of this
            # generation must get the same name on every worker
            c10d = dist.distributed_c10d
            if hasattr(c10d, "_world"):
                c10d._world.group_count = 0
    stop.set()


@dataclass
class ElasticJob:
    """The controller: starts workers, watches them, and publishes a plan per generation.

    ``plan_for(n)``: the plan for n workers (shoal's planner by default in ``shoal train
    --elastic``). ``on_event(kind, doc)``, when given, hears of each step as the workers finish
    it (``"step"``: ``step``, ``loss``, ``step_time_s``) and of each reconfiguration as it is
    decided (``"reconfiguration"``: a ``Reconfiguration`` as JSON)."""

    spec: ModelSpec
    plan_for: object
    total_steps: int
    seq: int
    ckpt_dir: str
    every: int = 2
    keep: int = 2
    seed: int = 0
    dtype: str = "float64"
    out_dir: str | None = None
    heartbeat_timeout_s: float = 3.0
    on_event: object = None
    reconfigurations: list[Reconfiguration] = field(default_factory=list)

    def __post_init__(self):
        # served by a process of its own: this one forks workers all along
        self.host = StoreHost()
        self.port = self.host.port
        self.store = make_store(self.port)
        self.token = ckpt.new_token()  # names this run's temporary checkpoint folders
        self.ctx = mp.get_context("fork")
        self.procs: dict[int, mp.Process] = {}
        self.next_wid = 0
        self.gen = -1
        self.members: list[int] = []
        self.plan: TrainingPlan | None = None
        self._standby: set[int] = set()
        self._failed_at: float | None = None  # when a member of this generation reported failing
        self._retries = 0  # generations published again in a row after a failure
        self._unheard_since: float | None = None  # since when no worker is heard from
        self._shown = 0  # the last step passed to on_event
        self._losses: dict[int, float] = {}
        self.t0 = time.time()
        self._made = ckpt.make_folder(self.ckpt_dir)
        self.store.set("run", self.token)
        self.store.set("gen", "-1")

    def add_worker(self) -> int:
        wid = self.next_wid
        self.next_wid += 1
        p = self.ctx.Process(target=worker_main, args=(
            wid, self.port, os.getpid(), self.spec.model_dump_json(), self.seq,
            self.total_steps, self.ckpt_dir, self.every, self.keep, self.seed, self.dtype,
            self.out_dir))
        p.start()
        self.procs[wid] = p
        return wid

    def pid(self, wid: int) -> int:
        return self.procs[wid].pid

    def _alive(self) -> list[int]:
        now = time.time()
        out = []
        for wid, p in self.procs.items():
            if not p.is_alive():
                continue
            if not self.store.check([f"ready/{wid}"]):
                continue
            hb = float(self.store.get(f"hb/{wid}")) if self.store.check([f"hb/{wid}"]) else now
            if now - hb <= self.heartbeat_timeout_s:
                out.append(wid)
        return sorted(out)

    def _emit(self, kind: str, doc: dict) -> None:
        if self.on_event is not None:
            self.on_event(kind, doc)

    def _publish(self, members: list[int], cause: str, detected: float, *,
                 abort: bool = False) -> None:
        if self.gen >= 0:
            self._report_steps()  # the old generation's, before the new one's
        old = self.plan.summary() if self.plan is not None else None
        lost_from = self._steps_done() if self.gen >= 0 else 0
        from shoal.runtime.pipeline import layout

        plan = self.plan_for(len(members))
        need = layout(plan, self.spec).world
        if need > len(members):
            from shoal.errors import InfeasibleError

            raise InfeasibleError(f"the plan chosen for {len(members)} workers needs {need}",
                                  binding="workers", relaxation="add workers")
        members = members[:need]  # the planner may leave workers idle (standby)
        if abort and self.gen >= 0:
            # the old generation is broken: its workers shut its connections, not wait on them
            self.store.set(f"g{self.gen}/abort", "1")
        self.gen += 1
        g = self.gen
        self.store.set(f"g{g}/members", json.dumps(members))
        self.store.set(f"g{g}/plan", plan.model_dump_json(by_alias=True))
        found = ckpt.latest(self.ckpt_dir)
        resumed = found[0] if found else 0
        self.reconfigurations.append(Reconfiguration(
            time_s=detected - self.t0, cause=cause, old_plan=old, new_plan=plan.summary(),
            members=members, steps_lost=max(lost_from - resumed, 0) if old else 0,
            resumed_from_step=resumed))
        self._detected = detected
        self._lost_from = lost_from
        self._failed_at = None
        self._standby = set(self._alive()) - set(members)
        self.members, self.plan = members, plan
        # the steps after the checkpoint are run, and shown, again
        self._shown = min(self._shown, resumed)
        self.store.set("gen", str(g))
        self._emit("reconfiguration", self.reconfigurations[-1].to_json())

    def run(self, n: int, events=None, timeout_s: float | None = 300.0) -> dict:
        """Start ``n`` workers and train; ``events(job)`` is called every poll (tests use it to
        kill or add workers). Returns the result document; the workers are stopped then, and
        the store stays readable until the job is collected (or its ``host.close()``). On any
        error, SIGTERM included (raised here as RunFailed), the workers and the store are
        stopped and this run's temporary checkpoint folders removed before it propagates."""
        try:
            with signals_raise(lambda name: RunFailed(f"stopped by {name}")):
                return self._run(n, events, timeout_s)
        except BaseException:
            self.shutdown(abort=True)
            self.host.close()
            ckpt.remove_own(self.ckpt_dir, self.token, self._made)
            raise

    def _run(self, n: int, events, timeout_s: float | None) -> dict:
        for _ in range(n):
            self.add_worker()
        started = time.time()
        while len(self._alive()) < n:
            if time.time() - started > 60:
                raise TimeoutError(f"only {len(self._alive())} of {n} workers started")
            time.sleep(0.05)
        self._publish(self._alive(), "start", time.time())
        deadline = time.time() + timeout_s if timeout_s is not None else float("inf")
        while time.time() < deadline:
            if self.store.check(["finished"]) and int(self.store.get("finished")) == self.gen:
                break
            if events is not None:
                events(self)
            self._report_steps()
            alive = self._alive()
            if not alive:
                self._none_left()
                time.sleep(0.05)
                continue
            self._unheard_since = None
            gone = sorted(set(self.members) - set(alive))
            new = sorted(set(alive) - set(self.members) - self._standby)
            why = self._why_stay(len(alive)) if new and not gone else None
            if why is not None:
                self._stay(new, why)
                new = []
            if gone or new:
                cause = ", ".join([f"worker {w} left" for w in gone]
                                  + [f"worker {w} joined" for w in new])
                self._publish(alive, cause, time.time(), abort=bool(gone))
            else:  # the same members: a standby joins only when the switch policy says so
                self._retry_failed(list(self.members))
            if self._first_step():
                self._retries = 0  # the generation runs
            time.sleep(0.05)
        else:
            raise TimeoutError("the elastic job did not finish in time")
        self._first_step()
        self._report_steps()
        losses = self._losses
        self.shutdown()
        return {"steps": self.total_steps, "losses": [losses[s] for s in sorted(losses)],
                "final_loss": losses.get(self.total_steps), "plan": self.plan.to_json(),
                "reconfigurations": [r.to_json() for r in self.reconfigurations]}

    def _first_step(self) -> bool:
        """Once the current generation has run its first step, complete its reconfiguration
        record with what the workers did: the time from detection to that step, and the
        checkpoint they resumed from (a write still under way when the controller published
        may have landed before they loaded). True when that happens in this call."""
        r = self.reconfigurations[-1]
        if r.detect_to_first_step_s is not None \
                or not self.store.check([f"g{self.gen}/first_step_at"]):
            return False
        r.detect_to_first_step_s = float(self.store.get(f"g{self.gen}/first_step_at")) \
            - self._detected
        if r.resumed_from_step is not None:
            r.resumed_from_step = int(self.store.get(f"g{self.gen}/resumed_from"))
            r.steps_lost = max(self._lost_from - r.resumed_from_step, 0) if r.old_plan else 0
        return True

    def _report_steps(self) -> None:
        """Pass the steps done since the last call to ``on_event``, and keep their losses:
        those of the current generation, and those before the checkpoint it resumed from,
        which the latest earlier generation to run them ran (it may have run them after the
        controller last looked)."""
        for s in range(self._shown + 1, self._steps_done() + 1):
            self._shown = s
            key = None
            for g in range(self.gen, -1, -1):
                if self.store.check([f"g{g}/step/{s}"]):
                    key = f"g{g}/step/{s}"
                    break
            if key is None:
                continue  # run before this job started (it resumed from a checkpoint)
            loss, dt = json.loads(self.store.get(key))
            self._losses[s] = loss
            self._emit("step", {"step": s, "loss": loss, "step_time_s": dt})

    def _none_left(self) -> None:
        """No worker is alive and heard from: a RunFailed saying why when no worker process
        is left, or none has sent a heartbeat for long (else wait: a loaded machine may
        delay them)."""
        now = time.time()
        if self._unheard_since is None:
            self._unheard_since = now
        limit_s = max(10 * self.heartbeat_timeout_s, 2 * PG_TIMEOUT_S)
        if any(p.is_alive() for p in self.procs.values()) and now - self._unheard_since < limit_s:
            return
        why = []
        for wid, p in sorted(self.procs.items()):
            code = p.exitcode
            if code is None:
                why.append(f"worker {wid} sent no heartbeat for {now - self._unheard_since:.0f} s")
            elif code < 0:
                why.append(f"worker {wid} was killed by {signal.Signals(-code).name}")
            else:
                why.append(f"worker {wid} exited with code {code}")
        done = self._steps_done() if self.gen >= 0 else 0
        raise RunFailed(f"the workers died, none is left to train (after step {done} of "
                        f"{self.total_steps}): " + "; ".join(why))

    def _retry_failed(self, members: list[int]) -> None:
        """A generation whose workers stopped while every member is still alive (a collective
        timed out on a loaded machine, say) is published again, after a heartbeat timeout (a
        member that died shows up as gone by then) and the group timeout (a member still
        waiting to join this generation, or an earlier one, has given up by then and joins
        the new one with the others: published sooner, it could keep missing them); after
        MAX_RETRIES in a row, the job stops with the worker's error."""
        failed = [w for w in self.members if self.store.check([f"g{self.gen}/failed/{w}"])]
        if not failed:
            return
        now = time.time()
        if self._failed_at is None:
            self._failed_at = now
            return
        if now - self._failed_at <= max(self.heartbeat_timeout_s, PG_TIMEOUT_S):
            return
        # the worker that failed first: the others' errors are mostly that it left
        records = {w: json.loads(self.store.get(f"g{self.gen}/failed/{w}")) for w in failed}
        first = min(failed, key=lambda w: records[w][0])
        error = records[first][1]
        self._retries += 1
        if self._retries > MAX_RETRIES:
            raise RunFailed(f"generation {self.gen} failed {self._retries} times in a row; "
                            f"worker {first}, the first to fail:\n"
                            + "\n".join(error.strip().splitlines()[-12:]))
        last = error.strip().splitlines()[-1] if error.strip() else "error"
        self._publish(members, f"worker {first} failed ({last}): retried", now, abort=True)

    def _why_stay(self, new_n: int) -> str | None:
        """Why the plan stays when workers join and none left (None: it switches to
        ``new_n`` workers): a join after the last step has nothing left to speed up; else the
        plan chooser's switch policy decides."""
        if self._steps_done() >= self.total_steps:
            return "stay: the run has done its steps"
        if not self._worth_it(len(self.members), new_n):
            return "stay: the switch would not pay"
        return None

    def _worth_it(self, old_n: int, new_n: int) -> bool:
        """Ask the plan chooser's switch policy (when it has one) whether more workers pay."""
        pays = getattr(self.plan_for, "pays", None)
        if pays is None:
            return True
        done = self._steps_done()
        found = ckpt.latest(self.ckpt_dir)
        ck = found[0] if found else 0
        return pays(old_n, new_n, self.total_steps - done, max(done - ck, 0))

    def _steps_done(self) -> int:
        """The steps the current generation has run up to (0 before its first)."""
        return int(self.store.get(f"g{self.gen}/last_step")) \
            if self.store.check([f"g{self.gen}/last_step"]) else 0

    def _stay(self, new: list[int], why: str) -> None:
        """Keep the plan; the new workers wait as standbys (asked again at the next change)."""
        self._standby |= set(new)
        self.reconfigurations.append(Reconfiguration(
            time_s=time.time() - self.t0, cause=", ".join(f"worker {w} joined" for w in new),
            old_plan=self.plan.summary(), new_plan=self.plan.summary(),
            members=list(self.members), detect_to_first_step_s=0.0, steps_lost=0,
            resumed_from_step=None, decision=why))
        self._emit("reconfiguration", self.reconfigurations[-1].to_json())

    def shutdown(self, abort: bool = False) -> None:
        """Stop every worker and the store. ``abort``: the current generation may be mid-step
        (an error, a signal): its workers shut its connections rather than finish the step.
        Workers still running after STOP_GRACE_S get SIGTERM, then SIGKILL."""
        with contextlib.suppress(Exception):  # the store may be gone already
            self.store.set("done", "1")
            if abort and self.gen >= 0:
                self.store.set(f"g{self.gen}/abort", "1")
            self.store.set("gen", str(self.gen + 1))
        deadline = time.monotonic() + STOP_GRACE_S
        for p in self.procs.values():
            p.join(timeout=max(deadline - time.monotonic(), 0.0))
        late = [p for p in self.procs.values() if p.is_alive()]
        for p in late:
            p.terminate()
        for p in late:
            p.join(timeout=STOP_GRACE_S)
            if p.is_alive():
                p.kill()
                p.join()


def _as_local(plan: TrainingPlan) -> TrainingPlan:
    """The plan as this machine runs it: every replica a CPU process in the zone ``local``
    (the plan the run started with may name any GPU types and zones)."""
    doc = plan.to_json()
    for st in doc["stages"]:
        for r in st["replicas"]:
            r["gpu"], r["zone"] = "cpu", "local"
    return TrainingPlan.model_validate(doc)


class PlannerChoice:
    """``plan_for(n)`` with shoal's planner: the best plan for n CPU workers (the job's global
    batch and sequence kept) that the runtime can run; data parallel when none is."""

    def __init__(self, model: str, spec: ModelSpec, global_batch: int, seq: int, mbs: int,
                 budget_s: float = 10.0, switch_s: float = 1.0, profile: str | None = None):
        self.model, self.spec, self.gb, self.seq, self.mbs = model, spec, global_batch, seq, mbs
        self.budget_s = budget_s
        self.profile = profile  # a `shoal profile` file: measured times for the estimates
        self.switch_s = switch_s  # a kill-free switch (BENCHMARKS: about 0.6 s on this model)
        self.cache: dict[int, TrainingPlan] = {}

    def __call__(self, n: int) -> TrainingPlan:
        if n not in self.cache:
            self.cache[n] = self._choose(n)
        return self.cache[n]

    def iteration_s(self, n: int) -> float | None:
        """The estimated iteration time of the plan for n workers (None when the estimator
        cannot cost that plan shape)."""
        from shoal.errors import ShoalError
        from shoal.estimate import estimate
        from shoal.problem import build_problem

        try:
            return estimate(build_problem(self._scenario(n)), _as_local(self(n))).iteration_time_s
        except ShoalError:
            return None

    def pays(self, old_n: int, new_n: int, remaining_steps: int, redo_steps: int) -> bool:
        """The switch policy for a voluntary move (more workers, nobody lost): switch only when
        the time the new plan saves over the steps left exceeds what the switch costs (its
        fixed cost and the steps since the last checkpoint done again)."""
        t_old, t_new = self.iteration_s(old_n), self.iteration_s(new_n)
        if t_old is None or t_new is None:
            return True  # no estimate to weigh: take the planner's plan for the workers
        return (t_old - t_new) * remaining_steps > self.switch_s + redo_steps * t_new

    def _scenario(self, n: int):
        from shoal.specs.scenario import parse_scenario

        return parse_scenario({
            "model": self.model,
            "job": {"global_batch": self.gb, "seq_len": self.seq, "optimizer": "adamw",
                    "precision": "fp32", "microbatch_sizes": [self.mbs]},
            "pool": {"regions": {"local": {"zones": {"local": {"gpus": {"cpu": n}}}}},
                     "gpus_per_node": {"cpu": n}},
            "network": {"defaults": {"same_zone": self._link()}},
            "prices": {"gpu_usd_per_h": {"cpu": 0.0}},
            **({"profiles": {"compute": str(Path(self.profile).resolve())}} if self.profile else {})})

    def _link(self) -> dict:
        """The profile's measured link, else a nominal local one."""
        if self.profile:
            from shoal.files import read_json

            link = read_json(self.profile, "profile").get("network", {}).get("link")
            if link:
                return {"bandwidth": link["bandwidth_Bps"], "latency": link["latency_s"]}
        return {"bandwidth": "1GB/s", "latency": "0.5ms"}

    def check(self, n: int) -> None:
        """Raise a SpecError naming the file now when the profile cannot be used for ``n``
        workers (``_choose`` would plan without it)."""
        from shoal.problem import build_problem

        build_problem(self._scenario(n))

    def _choose(self, n: int) -> TrainingPlan:
        from shoal.errors import ShoalError
        from shoal.problem import build_problem
        from shoal.runtime.pipeline import layout
        from shoal.training.planners import Limits, search

        try:
            res = search(build_problem(self._scenario(n)), strategy="auto",
                         limits=Limits(budget_s=self.budget_s))
            for c in res.ranked:
                plan = c.plan
                try:
                    layout(plan, self.spec)
                    return plan
                except ShoalError:
                    continue
        except ShoalError:
            pass
        reps = [(self.gb // self.mbs) // n + (1 if i < (self.gb // self.mbs) % n else 0)
                for i in range(n)]
        return TrainingPlan.model_validate({"microbatch_size": self.mbs, "stages": [{
            "layers": [0, self.spec.num_layers + 2], "replicas": [
                {"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": m} for m in reps]}]})
