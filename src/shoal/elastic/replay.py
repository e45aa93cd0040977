"""Replay an availability trace: plan every state, let a policy decide when to move, and add up
the tokens, dollars and time spent switching.

Accounting (the same for every policy): while a plan holds its GPUs it pays their rent, also
while it is switching; it trains, at its estimated throughput, only outside switching and
checkpoints. A switch longer than its state continues into the next one unless that one moves
again. Checkpoints are written every ``switching.checkpoint_interval`` of training time (under
``auto``, Young's interval for the plan's save and the GPU losses seen so far:
``switch.checkpoint_every_s``), each stalling training for the plan's save.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from shoal.elastic.policy import Change, check_policy, choose, oracle_choices
from shoal.elastic.replan import Replanner
from shoal.elastic.switch import (
    Running,
    SwitchCost,
    UnderWay,
    checkpoint_every_s,
    loss_gaps_s,
    not_up,
    running,
    switch_cost,
    training_share,
)
from shoal.elastic.traces import State, Trace
from shoal.errors import InfeasibleError
from shoal.problem import Problem


@dataclass(frozen=True)
class Step:
    time_s: float
    duration_s: float
    avail: dict[tuple[str, str], int]
    decision: str  # start | keep | switch | forced | stop | idle
    plan: Running | None
    switch: SwitchCost | None
    switch_s: float  # time of this state spent switching (this move's or one carried over)
    train_s: float
    tokens: float
    usd: float
    checkpoint_s: float = 0.0  # time of this state spent writing periodic checkpoints
    checkpoint_every_s: float | None = None  # the plan's training time between checkpoints


@dataclass
class Replay:
    policy: str
    objective: str
    steps: list[Step]
    plans: list[Running] = field(default_factory=list)  # distinct plans used, in order
    # tokens trained after the last checkpoint, lost and not redone by the trace's end (the
    # job stopped without saving, or a move had not finished redoing them): not counted
    lost_tokens: float = 0.0

    @property
    def tokens(self) -> float:
        return sum(s.tokens for s in self.steps) - self.lost_tokens

    @property
    def usd(self) -> float:
        return sum(s.usd for s in self.steps)

    @property
    def switch_s(self) -> float:
        return sum(s.switch_s for s in self.steps)

    @property
    def checkpoint_s(self) -> float:
        return sum(s.checkpoint_s for s in self.steps)

    @property
    def switches(self) -> int:
        return sum(s.decision in ("switch", "forced", "start") for s in self.steps)

    def totals(self) -> dict:
        return {"tokens": self.tokens, "lost_tokens": self.lost_tokens, "cost_usd": self.usd,
                "tokens_per_usd": self.tokens / self.usd if self.usd > 0 else None,  # free: none
                "switch_time_s": self.switch_s, "switches": self.switches,
                "checkpoint_time_s": self.checkpoint_s,
                "duration_s": sum(s.duration_s for s in self.steps)}


def plan_trace(problem: Problem, trace: Trace, replanner: Replanner,
               progress: Callable[[int, int], None] | None = None) -> list[list[Running]]:
    """Ranked plans of every state (empty where nothing fits); a plan met in several states is
    one ``Running`` object."""
    seen: dict = {}
    out = []
    first: InfeasibleError | None = None
    for i, st in enumerate(trace.states):
        try:
            ranked = replanner.plan(st.avail).ranked
        except InfeasibleError as exc:
            first = first or exc
            ranked = []
        out.append([seen.setdefault(c.spec, running(problem, c)) for c in ranked])
        if progress is not None:
            progress(i + 1, len(trace.states))
    if first is not None and not any(out):
        # nothing fits at any moment: say why, as `shoal plan` would, of the trace's GPUs
        if not any(n for st in trace.states for n in st.avail.values()):
            raise InfeasibleError(f"the trace ({trace.source}) has no GPUs at any moment",
                                  binding="availability")
        raise InfeasibleError(f"no plan fits at any moment of the trace ({trace.source}): "
                              f"at {trace.states[0].time_s:g} s, {first.reason}",
                              binding=first.binding, relaxation=first.relaxation)
    return out


def simulate(problem: Problem, trace: Trace, options: list[list[Running]], policy: str,
             objective: str | None = None, *, chooser: Callable[..., Running | None] | None = None
             ) -> Replay:
    """Run ``policy`` over the trace given every state's ranked plans. ``chooser``: a function
    called as ``policy.choose`` is, deciding instead of it (a policy studied outside shoal's own;
    the replay labels it ``policy``)."""
    check_policy(policy)
    return _Replayer(problem, trace, options, policy, objective or problem.objective,
                     chooser or choose).run()


class _Replayer:
    """One replay: the job as it goes from state to state."""

    def __init__(self, problem: Problem, trace: Trace, options: list[list[Running]], policy: str,
                 objective: str, chooser: Callable[..., Running | None]):
        self.problem, self.trace, self.options = problem, trace, options
        self.policy, self.objective, self.chooser = policy, objective, chooser
        self.fixed = oracle_choices(problem, trace, options) if policy == "oracle" else None
        self.cur: Running | None = None
        self.busy = 0.0  # switching left over from an earlier state
        self.redo_s = 0.0  # the redone work of the switch under way (its last part)
        self.since_ckpt = 0.0
        self.lost = 0.0  # iterations lost when the job stopped without saving, redone at the next start
        self.booting: dict = {}  # VMs the switch under way is still starting ...
        self.boot_left = 0.0  # ... and the seconds until they are up
        self.save_left = 0.0  # seconds until the checkpoint the switch under way saves is written
        self.steps: list[Step] = []
        self.used: dict = {}
        self.known: dict = {}  # every plan ranked in the states so far (the `shoal` policy's choices)
        self.gaps = loss_gaps_s([st.time_s for st in trace.states],
                                [st.avail for st in trace.states], problem.switching.prior_gap)

    def run(self) -> Replay:
        durations = self.trace.durations()
        for i, st in enumerate(self.trace.states):
            self._state(i, st, durations[i])
        # work lost and not redone by the end: the job is stopped, or a move's redo is unfinished
        cur, busy = self.cur, self.busy
        unrecovered = self.lost if cur is None else (min(self.redo_s, busy) / cur.iteration_time_s
                                                     if busy > 0 else 0.0)
        per_iter = self.problem.job.global_batch * self.problem.job.seq_len
        return Replay(policy=self.policy, objective=self.objective, steps=self.steps,
                      plans=list(self.used.values()), lost_tokens=unrecovered * per_iter)

    def _state(self, i: int, st: State, d: float) -> None:
        cur = self.cur
        forced = cur is not None and not cur.fits(st.avail)
        # a switch under way ends by redoing lost work on the new plan: what of it is not
        # redone yet is still owed when the job stops or moves again
        owed = min(self.redo_s, self.busy) if cur is not None else 0.0
        for r in self.options[i]:
            self.known.setdefault(r.cand.spec, r)
        new = self.fixed[i] if self.fixed is not None else self._choose(i, st, forced, owed)
        decision, cost = self._move(new, st, forced, owed)
        self.cur = new
        self.boot_left, self.save_left = max(0.0, self.boot_left - d), max(0.0, self.save_left - d)
        self.booting = self.booting if self.boot_left > 0 else {}
        self.steps.append(self._run_state(i, st, d, decision, cost))

    def _choose(self, i: int, st: State, forced: bool, owed: float) -> Running | None:
        cur = self.cur
        here = self.options[i]
        if self.policy == "shoal" and (forced or cur is None):
            # a move it must make may also go to a plan ranked earlier that fits now: one
            # that leaves GPUs free, say, where every plan of this state's ranking takes all
            ranked = {r.cand.spec for r in here}
            here = here + [r for sp, r in self.known.items()
                           if sp not in ranked and r.fits(st.avail)]
        change = Change(seen=list(self.trace.states[:i + 1]), forced=forced,
                        notice_s=st.notice_s, since_checkpoint_s=max(self.since_ckpt - owed, 0.0),
                        pending_s=self.busy, owed_s=owed, booting=self.booting,
                        boot_left_s=self.boot_left, save_left_s=self.save_left,
                        lost_iterations=self.lost if cur is None else 0.0,
                        known=list(self.known.values()))
        return self.chooser(self.policy, self.problem, self.objective, cur, here, change)

    def _move(self, new: Running | None, st: State, forced: bool,
              owed: float) -> tuple[str, SwitchCost | None]:
        """(the decision, the switch's cost) of going from the plan running to ``new``; the
        job's switching, redo, checkpoint and lost work after it."""
        cur = self.cur
        owed_iters = owed / cur.iteration_time_s if owed > 0 else 0.0
        if new is None:
            if cur is not None:
                self.lost += owed_iters
                if self.busy - owed <= 0 and st.notice_s < cur.save_s:  # a stop saves nothing
                    self.lost += max(self.since_ckpt - owed, 0.0) / cur.iteration_time_s
            self.busy, self.redo_s, self.since_ckpt = 0.0, 0.0, 0.0
            self.booting, self.boot_left, self.save_left = {}, 0.0, 0.0
            return ("stop" if cur is not None else "idle"), None
        if cur is not None and new.cand.spec == cur.cand.spec:
            return "keep", None
        before_redo = self.busy - owed > 0
        cost = switch_cost(self.problem, cur, new, forced=forced, notice_s=st.notice_s,
                           since_checkpoint_s=max(self.since_ckpt - owed, 0.0),
                           under_way=UnderWay(before_redo, self.booting, self.boot_left,
                                              self.save_left),
                           lost_iterations=(self.lost if cur is None else 0.0) + owed_iters)
        self.booting = not_up(cur, new, self.booting) if cost.up_s > 0 else {}
        self.boot_left = cost.up_s
        # the checkpoint the new plan loads: the one under way, or this move's own save
        self.save_left = self.save_left if before_redo else cost.save_s
        # redone work is not in the checkpoint the switch saved or loaded
        self.busy, self.redo_s, self.since_ckpt, self.lost = (cost.total_s, cost.redo_s,
                                                              cost.redo_s, 0.0)
        return ("start" if cur is None else ("forced" if forced else "switch")), cost

    def _run_state(self, i: int, st: State, d: float, decision: str,
                   cost: SwitchCost | None) -> Step:
        """The state's step with the plan now running: switching, checkpoints, training."""
        cur = self.cur
        if cur is None:
            return Step(st.time_s, d, st.avail, decision, None, None, 0.0, 0.0, 0.0, 0.0)
        self.used.setdefault(cur.cand.spec, cur)
        switching = min(self.busy, d)
        self.busy -= switching
        every = checkpoint_every_s(self.problem, cur, self.gaps[i])
        train = (d - switching) * training_share(cur, every)
        self.since_ckpt = (self.since_ckpt + train) % every if every > 0 else 0.0
        iters = train / cur.iteration_time_s
        return Step(st.time_s, d, st.avail, decision, cur, cost, switching, train,
                    iters * cur.tokens_per_iter,
                    cur.usd_per_s * d + cur.egress_usd_per_iter * iters,
                    d - switching - train, every)


def replay(problem: Problem, trace: Trace, policy: str, *, replanner: Replanner | None = None,
           progress: Callable[[int, int], None] | None = None) -> Replay:
    replanner = replanner or Replanner(problem)
    return simulate(problem, trace, plan_trace(problem, trace, replanner, progress), policy,
                    replanner.objective)


def replay_json(trace: Trace, runs: list[Replay], replanner: Replanner) -> dict:
    """The replay's JSON (DESIGN §6): each distinct plan once, and per policy its totals and one
    object per availability state; with one policy, its fields at the top level."""
    index: dict = {}
    plans = []
    for r in runs:
        for p in r.plans:
            if p.cand.spec not in index:
                index[p.cand.spec] = len(plans)
                plans.append({"plan": p.cand.plan.to_json(), "summary": p.cand.plan.summary(),
                              "iters_per_s": 1 / p.iteration_time_s, "tokens_per_s": p.tokens_per_s,
                              "usd_per_h": p.usd_per_s * 3600,
                              "egress_usd_per_h": p.egress_usd_per_s * 3600, "gpus": p.cand.num_gpus})
    cut = [c.timed_out for c in replanner.calls]  # one call per state, in order
    calls = [c.time_s for c in replanner.calls if not c.remembered]
    doc = {"trace": trace.source, "states": len(trace.states), "end_s": trace.end_s, "plans": plans,
           "replan": {"states": len(replanner.calls), "searched": len(calls),
                      "total_s": sum(calls), "max_s": max(calls, default=0.0),
                      "timed_out": sum(cut)}}
    if len(runs) == 1:
        return {**_replay_run_json(runs[0], index, cut), **doc}
    return {**doc, "replays": [_replay_run_json(r, index, cut) for r in runs]}


def _replay_run_json(r: Replay, index: dict, cut: list[bool]) -> dict:
    return {"policy": r.policy, "objective": r.objective, "totals": r.totals(), "steps": [
        {"time_s": s.time_s, "duration_s": s.duration_s, "search_timed_out": cut[i],
         "available": {f"{g}@{z}": n for (g, z), n in sorted(s.avail.items())},
         "decision": s.decision, "plan": index[s.plan.cand.spec] if s.plan else None,
         "iters_per_s": 1 / s.plan.iteration_time_s if s.plan else 0.0,
         "usd_per_h": s.plan.usd_per_s * 3600 if s.plan else 0.0,
         "egress_usd_per_h": s.plan.egress_usd_per_s * 3600 if s.plan else 0.0,
         "switch": s.switch.to_json() if s.switch else None, "switch_s": s.switch_s,
         "checkpoint_s": s.checkpoint_s, "checkpoint_every_s": s.checkpoint_every_s,
         "train_s": s.train_s, "tokens": s.tokens, "usd": s.usd}
        for i, s in enumerate(r.steps)]}
