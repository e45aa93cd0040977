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
import json
import multiprocessing as mp
import os
import signal
import tempfile
import time
from dataclasses import dataclass, field

from shoal.errors import InfeasibleError, RunFailed
from shoal.runtime import checkpoint as ckpt
from shoal.runtime.arch import Arch, as_arch
from shoal.runtime.elastic_choice import PolicyChoice, SwitchCosts, as_local
from shoal.runtime.elastic_worker import PG_TIMEOUT_S, WorkerJob, worker_main
from shoal.runtime.launch import ElasticRun, kept
from shoal.runtime.pipeline import layout
from shoal.runtime.supervise import signals_raise
from shoal.runtime.train import StoreHost, global_batch
from shoal.runtime.train import store as make_store
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan

__all__ = ["PG_TIMEOUT_S", "ElasticJob", "ElasticRun", "PolicyChoice", "Reconfiguration",
           "SwitchCosts", "as_local", "train_elastic"]

MAX_RETRIES = 3  # a generation whose workers failed, all alive, is published again this often
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


@dataclass
class ElasticJob:
    """The controller: starts workers, watches them, and publishes a plan per generation.

    ``plan_for(n)``: the plan for n workers (shoal's planner by default in ``shoal train
    --elastic``). ``on_event(kind, doc)``, when given, hears of each step as the workers finish
    it (``"step"``: ``step``, ``loss``, ``step_time_s``) and of each reconfiguration as it is
    decided (``"reconfiguration"``: a ``Reconfiguration`` as JSON)."""

    spec: ModelSpec | Arch
    plan_for: object
    total_steps: int
    seq: int
    ckpt_dir: str
    every: int = 2
    keep: int = 2
    seed: int = 0
    dtype: str = "float64"
    out_dir: str | None = None
    # other machines' workers: silent this long, they count as gone (a starved or partitioned
    # machine is not cut off at once)
    heartbeat_timeout_s: float = 10.0
    on_event: object = None
    listen: str | None = None  # host:port: the store served there, for other machines' workers
    reconfigurations: list[Reconfiguration] = field(default_factory=list)

    def __post_init__(self):
        self.arch = as_arch(self.spec)
        self.addr, port = "127.0.0.1", 0
        if self.listen is not None:
            self.addr, port = self.listen.rsplit(":", 1)[0], int(self.listen.rsplit(":", 1)[1])
        # served by a process of its own: this one forks workers all along
        self.host = StoreHost(addr=self.addr, port=port)
        self.port = self.host.port
        self.store = make_store(self.port, addr=self.addr)
        self.token = ckpt.new_token()  # names this run's temporary checkpoint folders
        self.ctx = mp.get_context("fork")
        self.procs: dict[int, mp.Process] = {}
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
        self.job = WorkerJob(self.port, os.getpid(), self.arch.model_dump_json(), self.seq,
                             self.total_steps, self.ckpt_dir, self.every, self.keep, self.seed,
                             self.dtype, self.out_dir, self.addr)
        # what the workers other machines start are given (``elastic_worker.run_node``)
        self.store.set("job", json.dumps(self.job.__dict__))

    def add_worker(self) -> int:
        wid = self.store.add("wids", 1) - 1  # one counter for the workers of every machine
        p = self.ctx.Process(target=worker_main, args=(wid, self.job))
        p.start()
        self.procs[wid] = p
        return wid

    def pid(self, wid: int) -> int:
        return self.procs[wid].pid

    def _alive(self) -> list[int]:
        """The workers alive and heard from: this machine's (its child processes) and other
        machines' (by their heartbeats alone)."""
        now = time.time()
        out = []
        for wid in range(self.store.add("wids", 0)):
            p = self.procs.get(wid)
            if p is not None and not p.is_alive():
                continue
            if not self.store.check([f"ready/{wid}"]):
                continue
            if p is not None:  # this machine's: its process is the truth, whatever the load
                out.append(wid)
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
        self._observe(detected)
        plan = self.plan_for(len(members))
        need = layout(plan, self.arch).world
        if need > len(members):
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

    def run(self, n: int, events=None, timeout_s: float | None = 300.0,
            local: int | None = None) -> dict:
        """Start ``local`` workers (``n`` by default; other machines start the rest, which
        register through the store) and train once ``n`` are alive; ``events(job)`` is called
        every poll (tests use it to kill or add workers). Returns the result document; the
        workers are stopped then, and the store stays readable until the job is collected (or
        its ``host.close()``). On any error, SIGTERM included (raised here as RunFailed), the
        workers and the store are stopped and this run's temporary checkpoint folders removed
        before it propagates."""
        try:
            with signals_raise(lambda name: RunFailed(f"stopped by {name}")):
                return self._run(n, events, timeout_s, n if local is None else local)
        except BaseException:
            self.shutdown(abort=True)
            self.host.close()
            ckpt.remove_own(self.ckpt_dir, self.token, self._made)
            raise

    def _run(self, n: int, events, timeout_s: float | None, local: int) -> dict:
        for _ in range(local):
            self.add_worker()
        started = time.time()
        while len(self._alive()) < n:
            # other machines' workers may take long to come (their launch, a loaded machine)
            if time.time() - started > (60 if local >= n else 300):
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
        measured = getattr(self.plan_for, "measured_switch", None)
        if measured is not None and r.old_plan is not None:
            # the switch's fixed cost: detection to the first step, less that step
            first = json.loads(self.store.get(f"g{self.gen}/step/"
                                              f"{int(self.store.get(f'g{self.gen}/resumed_from')) + 1}"))
            measured(r.detect_to_first_step_s - first[1])
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
        done, since = self._progress()
        self._observe(time.time())
        return pays(old_n, new_n, self.total_steps - done, since)

    def _progress(self) -> tuple[int, int]:
        """(steps done, steps since the newest checkpoint)."""
        done = self._steps_done() if self.gen >= 0 else 0
        found = ckpt.latest(self.ckpt_dir)
        return done, max(done - (found[0] if found else 0), 0)

    def _observe(self, now: float) -> None:
        """Tell the plan chooser (when it listens) where the run is, before it decides."""
        observe = getattr(self.plan_for, "observe", None)
        if observe is not None:
            done, since = self._progress()
            observe(now - self.t0, done, since, self.total_steps)

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


def train_elastic(plan: TrainingPlan, arch: Arch, run: ElasticRun, on_event=None) -> dict:
    """Run the controller and this machine's workers, starting from ``plan``; the result
    document (a RunFailed names the checkpoint a failed run leaves)."""
    # a profile that cannot be used is an error now, not a silent fallback
    choice = PolicyChoice(arch, global_batch(plan), run.seq, plan.microbatch_size,
                          every=run.every, profile=run.profile)
    choice.cache[run.world] = plan  # the given plan for the starting workers
    with tempfile.TemporaryDirectory() as tmp:
        ck = str(run.checkpoint_dir) if run.checkpoint_dir is not None else tmp
        job = ElasticJob(arch, choice, total_steps=run.steps, seq=run.seq, ckpt_dir=ck,
                         every=run.every, keep=run.keep, seed=run.seed, dtype=run.dtype,
                         on_event=on_event, listen=run.endpoint)
        done: set[str] = set()

        def events(j: ElasticJob) -> None:  # the demo's fault and join
            last = int(j.store.get(f"g{j.gen}/last_step")) \
                if j.store.check([f"g{j.gen}/last_step"]) else 0
            if run.fault_at is not None and "fault" not in done and last >= run.fault_at:
                done.add("fault")
                os.kill(j.pid(max(j.members)), signal.SIGKILL)
            if run.join_at is not None and "join" not in done and last >= run.join_at:
                done.add("join")
                j.add_worker()

        try:
            return job.run(run.world, events=events, timeout_s=None, local=run.local)
        except RunFailed as exc:
            raise RunFailed(f"{exc}{kept(run.checkpoint_dir)}") from None
