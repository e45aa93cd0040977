"""What every planner shares: compact plan specs, batched costing, objectives, constraints,
the Pareto front, and the search statistics."""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from shoal.errors import InfeasibleError
from shoal.estimate.api import run_specs, tables_for
from shoal.estimate.encode import PlanSpec, parse_schedule
from shoal.estimate.tables import CostTables
from shoal.problem import Problem
from shoal.specs.job import Constraints
from shoal.specs.plan import TrainingPlan
from shoal.training.names import OBJECTIVES

MEMO_MAX = 50_000  # plan estimates an Evaluator's memo keeps


def to_plan(spec: PlanSpec) -> TrainingPlan:
    mbs, key, recompute, zero, stages = spec
    schedule, ministages = parse_schedule(key)
    return TrainingPlan.model_validate({
        "microbatch_size": mbs, "schedule": schedule, "recompute": recompute, "zero_stage": zero,
        **({"ministages": ministages} if ministages != 1 else {}),
        "stages": [{"layers": [a, b], "replicas": [
            {"gpu": g, "tp": tp, "zone": z, "microbatches": m} for g, tp, z, m in reps]}
            for a, b, reps in stages]})


def usage(spec: PlanSpec) -> dict[tuple[str, str], int]:
    """GPUs a compact plan holds per (GPU type, zone)."""
    out: dict[tuple[str, str], int] = {}
    for _, _, reps in spec.stages:
        for g, tp, z, _ in reps:
            out[(g, z)] = out.get((g, z), 0) + tp
    return out


def fits(need: dict[tuple[str, str], int], avail: dict[tuple[str, str], int]) -> bool:
    """True when ``avail`` has every GPU ``need`` counts, per (GPU type, zone)."""
    return all(avail.get(k, 0) >= n for k, n in need.items())


@dataclass(frozen=True)
class Candidate:
    spec: PlanSpec
    iteration_time_s: float
    cost_compute_usd: float
    cost_egress_usd: float
    num_gpus: int

    @property
    def throughput_iters_per_s(self) -> float:
        return 1.0 / self.iteration_time_s

    @property
    def cost_usd(self) -> float:
        return self.cost_compute_usd + self.cost_egress_usd

    @property
    def plan(self) -> TrainingPlan:
        return to_plan(self.spec)


@dataclass
class SearchStats:
    strategy: str
    candidates_costed: int = 0
    oom: int = 0
    pruned: int = 0  # candidates never costed: cut by heuristics or bounds
    infeasible: int = 0  # costed, fit in memory, but break a constraint
    no_fit: int = 0  # plan shapes where some stage fits on no GPU of the pool at any TP
    truncated: bool = False  # a time or pair budget ended the search before it was complete
    timed_out: bool = False  # the time budget did
    interrupted: bool = False  # the user did (Ctrl-C): the best plan found so far is returned
    search_time_s: float = 0.0
    started: float = field(default_factory=time.perf_counter)

    def to_json(self) -> dict:
        return {"strategy": self.strategy, "candidates_costed": self.candidates_costed,
                "oom": self.oom, "pruned": self.pruned, "infeasible": self.infeasible,
                "no_fit": self.no_fit, "truncated": self.truncated, "timed_out": self.timed_out,
                "interrupted": self.interrupted, "search_time_s": self.search_time_s}


PROGRESS_EVERY_S = 0.25
_TP = operator.itemgetter(1)  # a ReplicaSpec's TP


class Progress(NamedTuple):
    """What a search has found so far: seconds since it started, plans costed, and the best
    plan's seconds and USD per iteration (None before one is found)."""

    elapsed_s: float
    costed: int
    best_iteration_time_s: float | None
    best_cost_usd: float | None


class Evaluator:
    """Costs compact plans in kernel batches, keeps every feasible one, counts the rest."""

    def __init__(self, problem: Problem, mbs_values: list[int], constraints: Constraints,
                 stats: SearchStats, objective: str = "max-throughput",
                 tables: CostTables | None = None, memo: dict | None = None):
        self.problem = problem
        # estimates by plan, which do not depend on GPU counts: a caller may share them
        self.memo: dict[PlanSpec, tuple[bool, float, float, float, float]] = (
            memo if memo is not None else {})
        self.tb = tables if tables is not None else tables_for(problem, mbs_values)
        self.constraints = constraints
        self.stats = stats
        self.feasible: dict[PlanSpec, Candidate] = {}
        self.best_oom_margin = np.inf  # smallest peak/capacity over OOM candidates (for errors)
        self.fits = 0  # candidates that fit in memory, constraints or not
        self.fastest: Candidate | None = None  # among those
        self.cheapest: Candidate | None = None
        # the fastest that meets every constraint but the throughput floors (min iterations/s,
        # the deadline), and the cheapest that meets every one but the cost cap: the
        # relaxations InfeasibleError names (each alone then gives a plan)
        self.fastest_else: Candidate | None = None
        self.cheapest_else: Candidate | None = None
        self._but_floors = constraints.model_copy(update={"min_iters_per_s": None,
                                                          "deadline": None})
        self._but_cap = constraints.model_copy(update={"max_cost_per_iteration_usd": None})
        self.objective = objective
        self.deadline: float | None = None  # perf_counter time after which the search stops
        self.max_pairs: int | None = None  # (shape, degree) pairs a bounded search allocates
        # plans known to fit are costed after the search (a re-plan's seeds): it returns a plan
        # whatever the budget leaves
        self.fallback = False
        self.incumbent: Candidate | None = None  # best feasible plan so far under the objective
        # (plan, objective, constraints) -> the plan ``refine``'s descent from it ended at
        # (itself: its layer boundaries are tuned); a caller may share it across searches of
        # the problem
        self.tuned: dict = {}
        # whether plans that cannot beat the incumbent are still built to fill the
        # throughput-cost front (a caller that needs only the best plans turns it off)
        self.front = True
        # called with what the search has found so far (``Progress``), at most every
        # PROGRESS_EVERY_S seconds, after a batch is costed
        self.progress: Callable[[Progress], None] | None = None
        self._reported = -math.inf  # the first batch costed is reported
        # the feasible plans' (seconds, USD) per iteration that no other beats in both: by
        # time ascending, so by cost descending
        self._front_t: list[float] = []
        self._front_c: list[float] = []
        job = problem.job
        self._zeros = sorted(set(job.zero_stage))
        self._schedules = [x for x in dict.fromkeys(job.schedule) if x != "zorse"]
        self._key_ok: dict[str, bool] = {}  # schedule key -> whether the job allows it
        # the strategies' own settings (ZeRO 0, 1F1B, GPipe) all allowed: nothing to map
        self._open = 0 in self._zeros and {"1f1b", "gpipe"} <= set(self._schedules)

    def _within_quotas(self, sp: PlanSpec) -> bool:
        used: dict[str, int] = {}
        for _, _, reps in sp.stages:
            for g, tp, _, _ in reps:
                used[g] = used.get(g, 0) + tp
        return all(used.get(g, 0) <= q for g, q in self.problem.quotas.items())

    def _report(self) -> None:
        now = time.perf_counter()
        if now - self._reported < PROGRESS_EVERY_S:
            return
        self._reported = now
        best = self.incumbent
        self.progress(Progress(now - self.stats.started, self.stats.candidates_costed,
                               None if best is None else best.iteration_time_s,
                               None if best is None else best.cost_usd))

    def out_of_time(self) -> bool:
        """True (and marks the search truncated) once the time budget is spent."""
        if self.deadline is not None and time.perf_counter() > self.deadline:
            self.stats.truncated = self.stats.timed_out = True
            return True
        return False

    def allocation_deadline(self) -> float | None:
        """The deadline an allocation program stops at: the budget's, once some plan is found
        or is to be costed after the search (``fallback``); until then the search goes on, so
        that it returns a plan."""
        return self.deadline if self.feasible or self.fallback else None

    def _allowed(self, sp: PlanSpec) -> list[PlanSpec] | None:
        """``sp``'s variants under the ZeRO stages and schedules the job allows, or None when
        it allows ``sp``'s own (the strategies' own shapes are ZeRO 0 with 1F1B, which a job
        may rule out)."""
        schedule_ok = self._key_ok.get(sp.schedule)
        if schedule_ok is None:
            name = parse_schedule(sp.schedule)[0]
            schedule_ok = self._key_ok[sp.schedule] = name == "zorse" or name in self._schedules
        zero_ok = sp.zero in self._zeros
        if zero_ok and schedule_ok:
            return None
        zeros = [sp.zero] if zero_ok else self._zeros
        keys = [sp.schedule] if schedule_ok else self._schedules
        return [sp._replace(schedule=k, zero=z) for z in zeros for k in keys]

    def cost(self, specs: list[PlanSpec]) -> list[Candidate | None]:
        """Candidates for ``specs`` (None where OOM or against a constraint), batch-costed.
        A plan under a ZeRO stage or schedule the job rules out is costed under each one it
        allows; its candidate is the best of those (the objective's ranking)."""
        if not specs:
            return []
        res = self._cost_allowed(specs)
        if self.progress is not None:
            self._report()
        return res

    def _cost_allowed(self, specs: list[PlanSpec]) -> list[Candidate | None]:
        if self._open:
            return self._cost(specs)
        variants = [self._allowed(sp) for sp in specs]
        if any(v is not None for v in variants):
            variants = [[sp] if v is None else v for v, sp in zip(variants, specs, strict=True)]
            flat = self._cost([x for v in variants for x in v])
            res: list[Candidate | None] = []
            i = 0
            for v in variants:
                found = [c for c in flat[i:i + len(v)] if c is not None]
                res.append(min(found, key=lambda c: score(c, self.objective)) if found else None)
                i += len(v)
            return res
        return self._cost(specs)

    def _cost(self, specs: list[PlanSpec]) -> list[Candidate | None]:
        if not specs:
            return []
        new = [sp for sp in dict.fromkeys(specs) if sp not in self.memo]
        if new:
            out = run_specs(self.problem, self.tb, new)
            ratio = (out["peak_bytes"] / np.maximum(out["capacity_bytes"], 1)).max(axis=(1, 2))
            for i, sp in enumerate(new):
                self.memo[sp] = (bool(out["oom"][i]), float(ratio[i]),
                                 float(out["iteration_time_s"][i]),
                                 float(out["cost_compute_usd"][i]), float(out["cost_egress_usd"][i]))
        vals = [self.memo[sp] for sp in specs]
        if len(self.memo) > MEMO_MAX:  # the oldest half goes
            for sp in list(itertools.islice(self.memo, len(self.memo) - MEMO_MAX // 2)):
                del self.memo[sp]
        self.stats.candidates_costed += len(specs)
        res: list[Candidate | None] = []
        for sp, (oom, ratio_, t, usd, egress) in zip(specs, vals, strict=True):
            if oom:
                self.stats.oom += 1
                self.best_oom_margin = min(self.best_oom_margin, ratio_)
                res.append(None)
                continue
            n_gpus = sum(sum(map(_TP, reps)) for _, _, reps in sp.stages)
            if self.problem.quotas and not self._within_quotas(sp):
                self.stats.infeasible += 1
                res.append(None)
                continue
            cand = Candidate(sp, t, usd, egress, n_gpus)
            if not self.adopt(cand):
                res.append(None)
                continue
            res.append(cand)
        return res

    def adopt(self, cand: Candidate) -> bool:
        """Count a costed plan that fits in memory; keep it when it meets the constraints
        (True)."""
        self.fits += 1
        if self.fastest is None or cand.iteration_time_s < self.fastest.iteration_time_s:
            self.fastest = cand
        if self.cheapest is None or cand.cost_usd < self.cheapest.cost_usd:
            self.cheapest = cand
        if not meets(cand, self.constraints):
            self.stats.infeasible += 1
            if ((self.fastest_else is None
                 or cand.iteration_time_s < self.fastest_else.iteration_time_s)
                    and meets(cand, self._but_floors)):
                self.fastest_else = cand
            if ((self.cheapest_else is None or cand.cost_usd < self.cheapest_else.cost_usd)
                    and meets(cand, self._but_cap)):
                self.cheapest_else = cand
            return False
        self.feasible[cand.spec] = cand
        if self.incumbent is None or (score(cand, self.objective)
                                      < score(self.incumbent, self.objective)):
            self.incumbent = cand
        self._onto_front(cand.iteration_time_s, cand.cost_usd)
        return True

    def beaten(self, t: float, usd: float) -> bool:
        """Whether a plan taking at least ``t`` seconds and ``usd`` per iteration is of no
        use to the search beyond beating the incumbent: always, when the search does not look
        for the throughput-cost front (``front``), else when it is ``dominated``."""
        return not self.front or self.dominated(t, usd)

    def dominated(self, t: float, usd: float) -> bool:
        """True when a feasible plan found so far takes at most ``t`` seconds and ``usd``
        per iteration: a plan taking at least both is on no throughput-cost front."""
        i = bisect.bisect_right(self._front_t, t)
        return i > 0 and self._front_c[i - 1] <= usd

    def _onto_front(self, t: float, usd: float) -> None:
        if self.dominated(t, usd):
            return
        i = bisect.bisect_left(self._front_t, t)
        j = i
        while j < len(self._front_t) and self._front_c[j] >= usd:
            j += 1  # slower (or as fast) and no cheaper: off the front
        self._front_t[i:j] = [t]
        self._front_c[i:j] = [usd]


def meets(c: Candidate, cons: Constraints) -> bool:
    if cons.max_cost_per_iteration_usd is not None and c.cost_usd > cons.max_cost_per_iteration_usd:
        return False
    if cons.min_iters_per_s is not None and c.throughput_iters_per_s < cons.min_iters_per_s:
        return False
    if cons.max_gpus is not None and c.num_gpus > cons.max_gpus:
        return False
    if cons.deadline is not None:
        need = cons.deadline.iterations / cons.deadline.within
        if c.throughput_iters_per_s < need:
            return False
    return True


def score(c: Candidate, objective: str) -> tuple[float, float]:
    """Sort key, smaller is better; the second entry breaks ties."""
    if objective == "max-throughput":
        return (c.iteration_time_s, c.cost_usd)
    if objective == "min-cost":
        return (c.cost_usd, c.iteration_time_s)
    if objective == "max-throughput-per-dollar":
        return (c.iteration_time_s * c.cost_usd, c.iteration_time_s)
    raise ValueError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")


def cannot_beat(key: float, t: float, bar: float, bar_t: float, tol: float = 0.0) -> bool:
    """Whether plans of at least ``key`` (what the objective ranks by, ``score``'s first
    entry) and ``t`` seconds per iteration cannot beat an incumbent of ``bar`` and ``bar_t``:
    a key of ``bar`` (1 + ``tol``) or more; or, when the incumbent's key is 0 (its GPUs cost
    nothing, so other plans can at best tie with it on the key), a key above 0 or a time
    not below its own (the time breaks ties)."""
    if bar > 0:
        return key >= bar * (1 + tol)
    return key > 0 or t >= bar_t


def pareto(cands: list[Candidate]) -> list[Candidate]:
    """Non-dominated candidates in (throughput up, cost per iteration down), by throughput."""
    front: list[Candidate] = []
    for c in sorted(cands, key=lambda c: (c.cost_usd, c.iteration_time_s)):
        if not front or c.iteration_time_s < front[-1].iteration_time_s * (1 - 1e-12):
            front.append(c)
    return sorted(front, key=lambda c: c.iteration_time_s)


@dataclass
class SearchResult:
    ranked: list[Candidate]
    pareto: list[Candidate]
    stats: SearchStats
    objective: str


def finish(ev: Evaluator, objective: str, top_k: int) -> SearchResult:
    ev.stats.search_time_s = time.perf_counter() - ev.stats.started
    cands = list(ev.feasible.values())
    if not cands:
        raise infeasible(ev)
    return SearchResult(ranked=top(cands, objective, top_k), pareto=pareto(cands),
                        stats=ev.stats, objective=objective)


def top(cands: list[Candidate], objective: str, k: int) -> list[Candidate]:
    """The ``k`` best of ``cands`` under ``objective``, one per allocation a user can tell
    apart: of plans alike in all the ranking shows but their speed and cost (each stage's GPU
    types, TPs, replicas and zones, the layer split, microbatch size, schedule, recompute and
    ZeRO; replicas of two zones paired into pipelines another way, say), the best only."""
    out, seen = [], set()
    for c in sorted(cands, key=lambda c: score(c, objective)):
        plan = c.plan
        key = (plan.summary(zones=True), plan.layer_split(), plan.microbatch_size,
               plan.schedule, plan.ministages, plan.recompute, plan.zero_stage)
        if key not in seen:
            seen.add(key)
            out.append(c)
            if len(out) == k:
                break
    return out


def rounded(x: float, up: bool, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, rounded up (``up``) or down, so that a limit
    written as shown still admits the plan it was read from."""
    if not math.isfinite(x) or x <= 0:
        return f"{x:.{digits}g}"
    scale = 10.0 ** (math.floor(math.log10(x)) - digits + 1)
    v = (math.ceil if up else math.floor)(x / scale) * scale
    return f"{v:.{digits + 1}g}"


def infeasible(ev: Evaluator) -> InfeasibleError:
    """The binding reason nothing was returned, and the nearest relaxation."""
    st, c = ev.stats, ev.constraints
    if not ev.fits and st.truncated:
        return InfeasibleError(
            f"the search's time budget ran out before a plan that fits was found "
            f"({st.candidates_costed} candidates costed, {st.oom} of them out of memory)",
            binding="time budget", relaxation="raise the search's time budget (--budget)")
    if not ev.fits and (st.oom or st.no_fit):
        if st.oom and np.isfinite(ev.best_oom_margin):
            closest = f", the closest needs {ev.best_oom_margin:.2f}x its GPU's memory"
        elif st.oom:
            closest = ", each with a GPU that cannot hold its layers"
        else:
            closest = ": some stage fits on no GPU of the pool even at the largest TP inside a node"
        job = ev.problem.job
        allow = [x for x, open_ in (("activation recompute", True not in job.recompute),
                                    ("ZeRO", max(job.zero_stage) < 3)) if open_]
        return InfeasibleError(
            f"no plan fits in GPU memory ({st.oom} candidates costed{closest})",
            binding="GPU memory",
            relaxation=(f"allow {' or '.join(allow)} in the job, " if allow else "")
            + "add GPUs with more memory, or use a smaller microbatch" + (
                "" if st.strategy in ("auto", "exhaustive") else
                f"; or --strategy auto ({st.strategy}'s plan shapes are fewer)"))
    if not ev.fits:
        return InfeasibleError("no plan shape fits the pool", binding="pool",
                               relaxation="add GPUs or allow more microbatch sizes")
    best_thr, cheapest = ev.fastest_else, ev.cheapest_else
    found = next((x for x in (best_thr, cheapest) if x is not None and meets(x, c)), None)
    if found is not None:
        # the searches without one constraint found a plan that meets them all: this
        # strategy's own search passed it by (Sailor's min-cost search, say, keeps to
        # single-stage plans)
        return InfeasibleError(
            f"the {ev.stats.strategy} strategy found no plan that meets the constraints, but "
            f"one exists ({found.throughput_iters_per_s:.4g} iterations/s, "
            f"{found.cost_usd:.4g} USD/iteration)", binding="search strategy",
            relaxation="--strategy auto (it searches every plan shape)")
    # each relaxation is of the one constraint alone, to a value rounded so that it holds
    parts = []
    if (c.min_iters_per_s is not None and best_thr is not None
            and best_thr.throughput_iters_per_s < c.min_iters_per_s):
        parts.append(("min iterations/s", "min_iters_per_s <= "
                      + rounded(best_thr.throughput_iters_per_s, up=False)
                      + " (--min-throughput on the command line)"))
    if (c.max_cost_per_iteration_usd is not None and cheapest is not None
            and cheapest.cost_usd > c.max_cost_per_iteration_usd):
        parts.append(("max $/iteration", "max_cost_per_iteration_usd >= "
                      + rounded(cheapest.cost_usd, up=True)
                      + " (--max-cost-per-iter on the command line)"))
    if c.max_gpus is not None and c.max_gpus < sum(ev.problem.avail.values()):
        parts.append(("max GPUs", f"max_gpus > {c.max_gpus} (--max-gpus on the command "
                                  "line)"))  # a cap below the pool may bind
    if c.deadline is not None and best_thr is not None:
        thr = best_thr.throughput_iters_per_s
        need_s = c.deadline.iterations / thr if thr > 0 else float("inf")
        most = int(thr * c.deadline.within)
        parts.append(("deadline", f"--within {rounded(need_s / 3600, up=True)}h "
                                  f"(the fastest plan found that meets the other constraints runs "
                                  f"{thr:.4g} iterations/s)"
                      + (f", or at most {most} iterations" if most >= 1 else "")))
    if not parts:
        parts.append(("constraints together", "relax one of the constraints"))
    binding, relax = parts[0]
    reason = f"no plan meets the constraints ({ev.fits} plans fit in memory)"
    if st.truncated:  # the relaxation is of the plans found before the cut
        reason += ("; the search was cut short by its time budget, so a plan that meets them "
                   "may still exist")
        relax += "; or raise the search's time budget (--budget)"
    return InfeasibleError(reason, binding=binding, relaxation=relax)
