"""What running a plan costs per second, and what moving from one plan to another costs.

A move stops training for: saving a checkpoint of the old plan (when it is still running, or
when the preemption notice leaves time to save), or else redoing the work since the last periodic
checkpoint; rebuilding process groups; starting VMs the old plan did not rent; loading each new
worker's share of the checkpoint; and the warm-up iterations. Parameters: the scenario's
``switching`` section (shoal.specs.switching).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from shoal.estimate.api import _state_bytes
from shoal.problem import Problem
from shoal.training.planners.common import Candidate, fits, usage


@dataclass(frozen=True)
class Running:
    """A plan as the replay sees it: speed, rent, the GPUs it holds and its checkpoint times."""

    cand: Candidate
    tokens_per_iter: int
    usage: dict[tuple[str, str], int]  # (gpu, zone) -> GPUs held
    nodes: dict[tuple[str, str], int]  # (gpu, zone) -> VMs rented
    usd_per_s: float  # GPU rent while the plan holds its GPUs (training or switching)
    egress_usd_per_iter: float
    save_s: float  # write one copy of the training state, every GPU of a stage writing its share
    load_s: float  # every replica reads its own copy of its stage's state

    @property
    def iteration_time_s(self) -> float:
        return self.cand.iteration_time_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens_per_iter / self.cand.iteration_time_s

    @property
    def egress_usd_per_s(self) -> float:
        """What the plan pays for egress while it trains (none while it switches)."""
        return self.egress_usd_per_iter / self.iteration_time_s

    def fits(self, avail: dict[tuple[str, str], int]) -> bool:
        return fits(self.usage, avail)


def checkpoint_bytes_per_param(problem: Problem) -> float:
    """Bytes a checkpoint holds per parameter: the fp32 weights (the master copy under mixed
    precision) and the optimizer's state."""
    _, (weights, _, optimizer) = _state_bytes(problem)
    return optimizer + (weights if problem.job.precision == "fp32" else 0.0)


def running(problem: Problem, cand: Candidate) -> Running:
    per_param = checkpoint_bytes_per_param(problem)
    bw = problem.switching.storage_bandwidth
    save_s = load_s = 0.0
    for a, b, reps in cand.spec.stages:
        stage_bytes = float(problem.sizes.params[a:b].sum()) * per_param
        gpus = sum(tp for _, tp, _, _ in reps)
        save_s = max(save_s, stage_bytes / gpus / bw)
        load_s = max(load_s, max(stage_bytes / tp for _, tp, _, _ in reps) / bw)
    held = usage(cand.spec)
    nodes = {k: math.ceil(n / problem.gpus[k[0]].gpus_per_node) for k, n in held.items()}
    T = cand.iteration_time_s
    return Running(cand=cand, tokens_per_iter=problem.job.global_batch * problem.job.seq_len,
                   usage=held, nodes=nodes, usd_per_s=cand.cost_compute_usd / T,
                   egress_usd_per_iter=cand.cost_egress_usd, save_s=save_s, load_s=load_s)


@dataclass(frozen=True)
class SwitchCost:
    save_s: float = 0.0
    redo_s: float = 0.0
    restart_s: float = 0.0
    startup_s: float = 0.0
    load_s: float = 0.0
    warmup_s: float = 0.0
    wait_s: float = 0.0  # for an earlier switch under way: its checkpoint, VMs it is starting

    @property
    def total_s(self) -> float:
        return (self.save_s + self.redo_s + self.restart_s + self.startup_s + self.load_s
                + self.warmup_s + self.wait_s)

    @property
    def up_s(self) -> float:
        """Seconds from the move's start until every VM of its new plan is up (0: they all
        were, and nothing was waited for): the parts run wait, save, start-up, restart, load,
        warm-up, redo."""
        return self.wait_s + self.save_s + self.startup_s if self.startup_s or self.wait_s else 0.0

    def to_json(self) -> dict:
        return {"total_s": self.total_s, "save_s": self.save_s, "redo_s": self.redo_s,
                "restart_s": self.restart_s, "startup_s": self.startup_s,
                "load_s": self.load_s, "warmup_s": self.warmup_s, "wait_s": self.wait_s}


def not_up(old: Running | None, new: Running,
           booting: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """VMs (per GPU type and zone) ``new`` needs that are not up when it replaces ``old``:
    those ``old`` does not rent, and those of ``booting`` (VMs ``old`` rents that are still
    starting) it takes."""
    held = old.nodes if old is not None else {}
    out = {}
    for k, n in new.nodes.items():
        up = held.get(k, 0) - booting.get(k, 0)
        if n > up:
            out[k] = n - up
    return out


@dataclass(frozen=True)
class UnderWay:
    """What an earlier switch still under way leaves the next move: ``before_redo``, it has
    not reached its redo yet (the next move has nothing new to save: it loads the checkpoint
    that switch saves, written in ``save_left_s``); ``booting``: VMs (per GPU type and zone)
    it is still starting, up in ``boot_left_s``."""

    before_redo: bool = False
    booting: dict[tuple[str, str], int] = field(default_factory=dict)
    boot_left_s: float = 0.0
    save_left_s: float = 0.0


def switch_cost(problem: Problem, old: Running | None, new: Running, *, forced: bool,
                notice_s: float, since_checkpoint_s: float, under_way: UnderWay = UnderWay(),
                lost_iterations: float = 0.0) -> SwitchCost:
    """Seconds without progress when ``new`` replaces ``old`` (None: the job was idle).

    A move the policy chooses saves first; a move forced by GPUs leaving saves only when the
    notice covers the save, otherwise the iterations since the last checkpoint are redone at
    the new plan's speed. A move made while an earlier one is still under way (before its
    redo) has nothing new to save: it loads the checkpoint that one saved, so it waits until
    that is written, and for the VMs that one is still starting when ``new`` takes some of
    them, no longer than its own start-up of new VMs (``under_way``). ``lost_iterations``:
    work lost and not redone yet, redone on the new plan (the last part of the move): the
    work lost when the job stopped earlier without a checkpoint, and the part of an earlier
    move's redo not done when this move interrupts it."""
    sw = problem.switching
    save = redo = 0.0
    if old is not None and not under_way.before_redo:
        if not forced or notice_s >= old.save_s:
            save = old.save_s
        else:
            redo = since_checkpoint_s / old.iteration_time_s * new.iteration_time_s
    redo += lost_iterations * new.iteration_time_s
    held = old.nodes if old is not None else {}
    startup = sw.node_startup if any(n > held.get(k, 0) for k, n in new.nodes.items()) else 0.0
    wait = under_way.save_left_s if under_way.before_redo else 0.0
    booting, boot_left_s = under_way.booting, under_way.boot_left_s
    if boot_left_s > 0 and booting and any(
            n > held.get(k, 0) - booting.get(k, 0) and booting.get(k, 0) > 0
            for k, n in new.nodes.items()):
        wait = max(wait, boot_left_s - startup)
    return SwitchCost(save_s=save, redo_s=redo, restart_s=sw.restart, startup_s=startup,
                      load_s=new.load_s, warmup_s=sw.warmup_iterations * new.iteration_time_s,
                      wait_s=wait)


def loss_gaps_s(times: list[float], avails: list[dict], prior_s: float) -> list[float]:
    """Per state of a trace, the mean time between GPU losses seen up to it: the time since
    the first state plus ``prior_s`` (one gap before any loss), over the changes that took
    GPUs of some (GPU type, zone) plus one. Losses of GPUs the plan running does not hold
    count too: they are the pool's failure rate, the same whatever the policy has chosen
    (counting only the losses that would have hit each plan did worse on
    ``benchmarks/replay.py``'s traces: BENCHMARKS.md)."""
    out, losses = [], 0
    for i, (t, avail) in enumerate(zip(times, avails, strict=True)):
        if i and any(avail.get(k, 0) < n for k, n in avails[i - 1].items()):
            losses += 1
        out.append((t - times[0] + prior_s) / (losses + 1))
    return out


def checkpoint_every_s(problem: Problem, run: Running, loss_gap_s: float) -> float:
    """Training seconds between ``run``'s checkpoints: the scenario's interval, or under
    ``auto`` Young's sqrt(2 x save x mean time between losses) (0 when a save is free)."""
    every = problem.switching.checkpoint_interval
    if every == "auto":
        return math.sqrt(2.0 * run.save_s * loss_gap_s)
    return float(every)


def training_share(run: Running, every_s: float) -> float:
    """The share of ``run``'s time outside switching that trains: each checkpoint, one every
    ``every_s`` of training, stalls it for the plan's save."""
    if run.save_s <= 0:
        return 1.0
    return every_s / (every_s + run.save_s)
