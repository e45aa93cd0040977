"""The live controller's plans and switch decisions: ``shoal.elastic``'s re-planner
(``Replanner``) and switch policy (``policy.choose``, the ``shoal`` policy of ``shoal replay``),
with the switch costs of this runtime.

The controller's workers are the pool: one GPU type (``cpu``) in one zone, as many as are alive.
Its history is an availability trace: every change of the alive count is a ``State``. A lost
worker forces a move (the policy picks among the plans ranked for the survivors, and those ranked
before that fit); a worker joining is a choice the policy weighs over futures sampled from the
changes seen, each move's switch included, up to the end of the job (the steps left at the
running plan's speed), so a switch late in the run does not pay.

Switch costs (the problem's ``switching`` section): a switch's fixed cost (process groups rebuilt
and the checkpoint loaded; no VM to start) is the mean measured over this run's switches (from
detection to the first step of the new plan, less that step) once there is one, configured
before (``SwitchCosts.restart_s``); checkpoints go to local disk at ``storage_Bps`` every
``every`` steps; the work since the last one is redone.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from shoal.elastic.policy import Change, choose
from shoal.elastic.replan import Replanner
from shoal.elastic.switch import Running, running
from shoal.elastic.traces import State
from shoal.errors import InfeasibleError, ShoalError
from shoal.estimate import estimate
from shoal.estimate.encode import to_spec
from shoal.problem import Problem
from shoal.runtime.arch import Arch, as_arch
from shoal.runtime.pipeline import layout
from shoal.runtime.predict import scenario
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan
from shoal.training.planners.common import Candidate

POOL = ("cpu", "local")  # the controller's workers, as a pool
MAX_WORKERS = 1024  # the pool's size: the search is given the alive count each time


@dataclass(frozen=True)
class SwitchCosts:
    """What a live switch costs before any is measured (``restart_s``, a bound above the
    switches BENCHMARKS.md records), and the local disk's checkpoint bandwidth."""

    restart_s: float = 1.0
    storage_Bps: float = 1e9


@dataclass
class Decision:
    """One decision, with what the policy was given (tests compare it with the policy's)."""

    forced: bool
    workers: int
    seen: list[State]
    since_checkpoint_s: float
    end_s: float  # the steps left at the running plan's speed
    chosen: TrainingPlan | None  # None: the running plan stays
    problem: Problem | None = None
    current: Running | None = None
    options: list[Running] = field(default_factory=list)


def as_local(plan: TrainingPlan) -> TrainingPlan:
    """The plan as this machine runs it: every replica a CPU process in the zone ``local``
    (the plan the run started with may name any GPU types and zones)."""
    doc = plan.to_json()
    for st in doc["stages"]:
        for r in st["replicas"]:
            r["gpu"], r["zone"] = POOL
    return TrainingPlan.model_validate(doc)


class PolicyChoice:
    """``plan_for(n)`` and ``pays(...)`` of ``ElasticJob``, by the re-planner and the policy.

    ``observe(time_s, steps_done, since_checkpoint_steps)`` tells it where the run is before
    each decision; ``measured_switch(s)`` a switch's measured fixed cost."""

    def __init__(self, model: ModelSpec | Arch, global_batch: int, seq: int, mbs: int, *,
                 every: int = 2, profile: str | None = None, budget_s: float = 10.0,
                 costs: SwitchCosts = SwitchCosts()):
        self.arch = as_arch(model)
        self.gb, self.seq, self.mbs, self.every = global_batch, seq, mbs, every
        self.costs = costs
        self.problem = scenario(self.arch.spec, {POOL: MAX_WORKERS}, global_batch, seq, mbs=mbs,
                                profile=profile)
        self.replanner = Replanner(self.problem, budget_s=budget_s, top_k=8)
        self.cache: dict[int, TrainingPlan] = {}  # plans given or chosen, by worker count
        self.current: TrainingPlan | None = None
        self.seen: list[State] = []
        self.known: dict = {}  # every plan ranked so far, as the policy's Running
        self.decisions: list[Decision] = []
        self.measured: list[float] = []
        self._at = (0.0, 0, 0, 0)  # time, steps done, steps since the checkpoint, steps left

    # --------------------------------------------------------------------- what the run says

    def observe(self, time_s: float, steps_done: int, since_checkpoint: int,
                total_steps: int) -> None:
        self._at = (time_s, steps_done, since_checkpoint, max(total_steps - steps_done, 0))

    def measured_switch(self, seconds: float) -> None:
        self.measured.append(max(seconds, 0.0))

    # ------------------------------------------------------------------------ the decisions

    def __call__(self, n: int) -> TrainingPlan:
        """The plan for ``n`` workers: the one given for them, else a forced move's."""
        if n in self.cache and self.current is None:
            self.current = self.cache[n]
            self._note(n)
            return self.current
        if self.current is not None and self._workers(self.current) <= n \
                and self.cache.get(n) is self.current:
            return self.current  # chosen for them by ``pays``
        plan = self._decide(n, forced=True)
        self.cache[n] = self.current = plan
        return plan

    def pays(self, old_n: int, new_n: int, remaining_steps: int, redo_steps: int) -> bool:
        """Whether the policy moves to a plan for ``new_n`` workers (more joined, none left)."""
        self._at = (self._at[0], self._at[1], redo_steps, remaining_steps)
        plan = self._decide(new_n, forced=False)
        if plan is self.current:
            return False
        self.cache[new_n] = self.current = plan
        return True

    def _workers(self, plan: TrainingPlan) -> int:
        return layout(plan, self.arch).world

    def _note(self, n: int) -> None:
        t = self._at[0]
        if self.seen and self.seen[-1].avail[POOL] == n:
            return
        if self.seen and t <= self.seen[-1].time_s:
            t = self.seen[-1].time_s + 1e-3  # states in time order
        self.seen.append(State(t, {POOL: n}))

    def _problem(self, cur: Running | None) -> Problem:
        """The scenario with this runtime's switch costs at this point of the run."""
        t_iter = cur.iteration_time_s if cur is not None else 1.0
        restart = sum(self.measured) / len(self.measured) if self.measured else self.costs.restart_s
        sw = self.problem.switching.model_copy(update={
            "restart": restart, "node_startup": 0.0, "storage_bandwidth": self.costs.storage_Bps,
            "checkpoint_interval": max(self.every * t_iter, 1e-6)})
        return replace(self.problem, switching=sw)

    def iteration_s(self, plan: TrainingPlan) -> float | None:
        """The estimated iteration time of ``plan`` run on this machine's workers (None when
        the estimator cannot cost it)."""
        c = self._candidate(self.problem, plan)
        return c.iteration_time_s if c is not None else None

    def _candidate(self, problem: Problem, plan: TrainingPlan) -> Candidate | None:
        try:
            est = estimate(problem, as_local(plan))
        except ShoalError:
            return None
        return Candidate(to_spec(as_local(plan)), est.iteration_time_s, est.cost_compute_usd,
                         est.cost_egress_usd, est.num_gpus)

    def _decide(self, n: int, *, forced: bool) -> TrainingPlan:
        self._note(n)
        base = self._candidate(self.problem, self.current) if self.current else None
        problem = self._problem(running(self.problem, base) if base else None)
        cur = running(problem, base) if base is not None else None
        hints = [base.spec] if base is not None and not forced else []
        try:
            ranked = self.replanner.plan({POOL: n}, hints=hints).ranked
        except InfeasibleError:
            ranked = []
        options = [running(problem, c) for c in ranked if self._runs(c.plan)]
        for r in options:
            self.known.setdefault(r.cand.spec, r)
        since_s = self._at[2] * (cur.iteration_time_s if cur else 0.0)
        end_s = self._at[3] * (cur.iteration_time_s if cur else 1.0)
        got = choose("shoal", problem, problem.objective, cur, options,
                     Change(seen=list(self.seen), forced=forced, notice_s=0.0,
                            since_checkpoint_s=since_s, known=list(self.known.values()),
                            end_s=end_s))
        if got is None or (cur is not None and not forced and got.cand.spec == cur.cand.spec):
            chosen = self.current if not forced else self._fallback(n)
        else:
            chosen = got.cand.plan
        self.decisions.append(Decision(forced, n, list(self.seen), since_s, end_s,
                                       None if chosen is self.current else chosen, problem,
                                       cur, options))
        return chosen

    def _runs(self, plan: TrainingPlan) -> bool:
        try:
            layout(plan, self.arch)
            return True
        except ShoalError:
            return False

    def _fallback(self, n: int) -> TrainingPlan:
        """Data parallel over the workers when nothing the runtime runs was found."""
        total = self.gb // self.mbs
        reps = [total // n + (1 if i < total % n else 0) for i in range(min(n, total))]
        return TrainingPlan.model_validate({"microbatch_size": self.mbs, "stages": [{
            "layers": [0, self.arch.n_layers], "replicas": [
                {"gpu": POOL[0], "tp": 1, "zone": POOL[1], "microbatches": m} for m in reps]}]})
