"""Training planners: one interface, several strategies (DESIGN §4: strategies, not forks).

``search(problem, strategy=..., objective=..., constraints=..., top_k=...) -> SearchResult``
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import pickle
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shoal import forks, jit
from shoal.errors import InfeasibleError, SpecError
from shoal.estimate.tables import CostTables
from shoal.problem import Problem
from shoal.specs.job import Constraints
from shoal.training.planners import atlas, auto, espresso, exhaustive, sailor, zorse
from shoal.training.planners.common import (
    OBJECTIVES,
    Candidate,
    Evaluator,
    Progress,
    SearchResult,
    SearchStats,
    finish,
    pareto,
    top,
)
from shoal.training.planners.refine import refine_best
from shoal.training.planners.space import Space, mbs_options
from shoal.training.planners.strategy import Context, SearchState, Strategy, drive


@dataclass
class Reuse:
    """What one search leaves for the next search of the same problem under other GPU counts:
    cost tables, smallest fitting TPs and plan estimates depend on GPU types, zones and the
    model, not on how many GPUs are free; Zorse's partitions depend only on the node list."""

    tables: CostTables | None = None
    min_tp: dict = field(default_factory=dict)
    estimates: dict = field(default_factory=dict)  # plan -> its estimate (Evaluator.memo)
    splits: dict = field(default_factory=dict)  # Zorse's partitions of a node list
    memos: dict = field(default_factory=dict)  # allocations, placements, re-splits (Space)
    # where ``refine``'s descents from plans ended, per objective and constraints (the moves
    # keep a plan's GPUs, and estimates do not depend on the pool): not tuned again
    tuned: dict = field(default_factory=dict)


# every strategy proposes plans (``strategy.Strategy``); ``search`` costs and ranks them
STRATEGIES: dict[str, Strategy] = {
    "auto": auto.propose, "sailor": sailor.propose, "espresso": espresso.propose,
    "zorse": zorse.propose, "atlas": atlas.propose, "exhaustive": exhaustive.propose}

__all__ = ["OBJECTIVES", "STRATEGIES", "Alongside", "Candidate", "Context", "Limits", "Reuse",
           "SearchResult", "SearchState", "Strategy", "complete_front", "drive", "search"]


@dataclass(frozen=True)
class Limits:
    """How far a search goes: the most pipeline stages (None: as many as layers), seconds
    (None: no budget) and (shape, degree) pairs it allocates (None: every pair its bounds let
    through), and whether it builds plans only to fill the throughput-cost front."""

    max_stages: int | None = None
    budget_s: float | None = None
    max_pairs: int | None = None
    front: bool = True
    # called with the search's ``Progress`` (the best plan so far, plans costed, time spent)
    # every quarter of a second or so while it runs
    progress: Callable[[Progress], None] | None = None
    # Ctrl-C (KeyboardInterrupt) ends the search with the best plans found until then, marked
    # ``stats.interrupted``, instead of raising (a person waiting on it; not a loop of
    # searches, which Ctrl-C must stop)
    interruptible: bool = False


# allocations between the cyclic collector's runs during a search (Python's default: 700)
SEARCH_GC_GEN0 = 50_000


def _fewer_collections(fn):
    """``fn`` with the cyclic garbage collector run less often and over the search's own
    objects only: a search makes many small objects and few reference cycles (at the default
    a tenth of its time went to the collector), and what lived before it (caches of earlier
    searches) is frozen meanwhile (``gc.freeze``), so a collection does not walk it again."""

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if _GC_DEPTH[0] or threading.current_thread() is not threading.main_thread():
            return fn(*args, **kwargs)  # inside a search already, or not the main thread's
        old = gc.get_threshold()
        freeze = gc.get_freeze_count() == 0  # a program that froze objects itself keeps them so
        if freeze:
            gc.freeze()
        gc.set_threshold(max(old[0], SEARCH_GC_GEN0), *old[1:])
        _GC_DEPTH[0] += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _GC_DEPTH[0] -= 1
            gc.set_threshold(*old)
            if freeze:
                gc.unfreeze()
    return run


_GC_DEPTH = [0]  # searches running in the main thread's stack (the collector is the process's)


@_fewer_collections
def search(problem: Problem, *, strategy: str | Strategy = "auto", objective: str | None = None,
           constraints: Constraints | None = None, top_k: int = 10, limits: Limits = Limits(),
           reuse: Reuse | None = None, seeds: tuple = ()) -> SearchResult:
    """Ranked plans for ``problem`` under ``objective`` and ``constraints`` (default: the
    scenario's), with the throughput-cost Pareto front and search statistics. ``strategy``: a
    name of ``STRATEGIES`` or any ``Strategy`` (which then runs alone, as every strategy but
    ``auto`` does). ``limits.budget_s`` bounds the search time (``auto`` stops taking new plan
    shapes; the result says it was truncated). ``reuse`` carries what does not depend on GPU
    counts from one search of this problem to the next (cost tables, smallest fitting TPs);
    ``seeds`` are plans known to fit the pool, costed with the plans found, so nothing worse
    than the best of them is returned: after the search and the tuning of its best plans (as the
    incumbent, the seeds would spare the search plans whose tuned boundaries beat them), or
    first when ``limits.max_pairs`` bounds the search, as the incumbent it must beat. ``auto``
    also costs the plan shapes of ``zorse`` (when the pool mixes GPU types) and, under min-cost,
    of ``espresso``, and, when the pool spans regions, Atlas's layouts (pipelines across
    datacenters, data parallelism inside each), unless ``limits.max_pairs`` bounds it, and last
    tunes the layer boundaries of its best plans (``refine``). Without ``limits.front``,
    ``auto`` builds no plan only for the throughput-cost front (one that cannot beat the best
    plan so far): the best plan before the tuning is the same (the tuning starts from the best
    few plans found, which may then differ), the front and the plans ranked below the best are
    those met on the way. Raises InfeasibleError naming the binding constraint when nothing
    fits, and a relaxation that works (``_nearest``: when plans fit but the constraints cut
    them, searches without the binding one, within the budget)."""
    name, propose = _strategy(strategy)
    objective = objective or problem.objective
    if objective not in OBJECTIVES:
        raise SpecError("unknown objective", field="--objective", value=objective,
                        allowed=", ".join(OBJECTIVES))
    constraints = constraints or problem.constraints
    problem = _capped(problem, constraints)
    _require_prices(problem, objective, constraints)
    jit.prepare()  # a first run after an install: the helper compiles alongside from here
    reuse = reuse if reuse is not None else Reuse()
    mbs = mbs_options(problem)
    ev, space = _start(problem, mbs, SearchStats(strategy=name), (objective, constraints),
                       limits, reuse)
    full = name == "auto" and limits.max_pairs is None
    seeds = tuple(dict.fromkeys(seeds))
    if seeds and not full:
        ev.cost(list(seeds))  # the incumbent a bounded search must beat
    ev.fallback = bool(seeds)
    ctx = Context(ev, space, objective, tuple(mbs), limits.max_stages)
    try:
        _run(ctx, propose, name, seeds if full else ())
    except KeyboardInterrupt:
        if not (limits.interruptible and ev.feasible):
            raise
        ev.stats.interrupted = ev.stats.truncated = True  # the best plan found so far
        return finish(ev, objective, top_k)
    if not ev.feasible and ev.fits and not ev.out_of_time():
        _nearest(ev, problem, strategy, constraints, limits, reuse)
    return finish(ev, objective, top_k)


def _run(ctx: Context, propose: Strategy, name: str, seeds_after: tuple) -> None:
    """The strategy's search (``auto``'s whole one when it is unbounded), the tuning of the
    best plans' layer boundaries, then the seeds ``seeds_after``."""
    ev = ctx.state
    if name == "auto" and ev.max_pairs is None:
        _auto(ctx, propose)
    else:
        drive(ev.cost, propose(ctx))
    if name == "auto" and not ev.out_of_time():
        refine_best(ev, ctx.objective)  # the best plans' layer boundaries tuned on their replicas
    if seeds_after:
        # after the tuning: with the seeds as its incumbent, the search would not build the
        # plans it cannot beat, and the tuning would not start from them
        ev.cost(list(seeds_after))


def _strategy(strategy: str | Strategy) -> tuple[str, Strategy]:
    """The strategy's name and proposals, of a name of ``STRATEGIES`` or a strategy."""
    if not isinstance(strategy, str):
        return getattr(strategy, "__name__", type(strategy).__name__), strategy
    if strategy not in STRATEGIES:
        raise SpecError("unknown strategy", field="--strategy", value=strategy,
                        allowed=", ".join(STRATEGIES))
    return strategy, STRATEGIES[strategy]


def _start(problem: Problem, mbs: list[int], stats: SearchStats,
           goal: tuple[str, Constraints], limits: Limits, reuse: Reuse
           ) -> tuple[Evaluator, Space]:
    """The search's costing (of microbatch sizes ``mbs``, under the (objective, constraints)
    ``goal``) and its space, with what ``reuse`` keeps from the last search of the problem;
    refuses a pool with no GPU the job can use."""
    objective, constraints = goal
    if reuse.tables is None or reuse.tables.mbs != mbs:
        reuse.tables, reuse.min_tp, reuse.estimates, reuse.memos = None, {}, {}, {}
        reuse.tuned = {}
    ev = Evaluator(problem, mbs, constraints, stats, objective, tables=reuse.tables,
                   memo=reuse.estimates)
    reuse.tables = ev.tb
    ev.tuned = reuse.tuned
    space = Space(problem, ev.tb, reuse.min_tp, splits=reuse.splits, memos=reuse.memos)
    if limits.budget_s is not None:
        ev.deadline = stats.started + limits.budget_s
    ev.max_pairs = limits.max_pairs
    ev.front = limits.front
    ev.progress = limits.progress
    if not space.kinds:
        bf16 = problem.job.precision == "mixed-bf16"
        raise InfeasibleError("the pool has no GPUs the job can use" + (
            " (a mixed-bf16 job needs GPUs with bf16)" if bf16 and any(problem.avail.values())
            else ""),
            binding="pool", relaxation="add GPUs to the pool" + (" with bf16" if bf16 else ""))
    return ev, space


def _auto(ctx: Context, propose: Strategy) -> None:
    """``auto``'s whole search: Atlas's layouts first on a pool of several regions, its own
    branch and bound, Zorse's mixed groups on a pool of several GPU types, and under min-cost
    Espresso's trees."""
    ev, kinds = ctx.state, ctx.space.kinds
    if len({k.region for k in kinds}) > 1:
        drive(ev.cost, atlas.propose(ctx))  # pipelines across datacenters
    drive(ev.cost, propose(ctx))
    if len({k.gpu for k in kinds}) > 1 and not ev.out_of_time():
        # mixed groups, each simulated event by event: after the search, whose best plan
        # spares most of them by their bounds
        drive(ev.cost, zorse.propose(ctx))
    if ctx.objective == "min-cost" and not ev.out_of_time():
        drive(ev.cost, espresso.propose(ctx))  # its bounds use the incumbent


def _require_prices(problem: Problem, objective: str, constraints: Constraints) -> None:
    """A SpecError naming a GPU type the search could use that has no price (the scenario can
    give one): every plan found is costed, and plans are compared by their cost per
    iteration. GPU types it cannot use (none available under the quotas and the GPU cap, or no
    bf16 for a mixed-bf16 job) need none."""
    bf16 = problem.job.precision == "mixed-bf16"
    usable = {g for (g, _), n in problem.avail.items() if n > 0 and (not bf16 or problem.gpus[g].bf16)}
    if objective != "max-throughput":
        why = f"the objective {objective} needs a price for every GPU type a plan can use"
    elif constraints.max_cost_per_iteration_usd is not None:
        why = ("the constraint max_cost_per_iteration_usd needs a price for every GPU type a "
               "plan can use")
    else:
        why = ("planning needs a price for every GPU type a plan can use (it compares plans by "
               "cost too: the throughput-cost front)")
    problem.require_prices(usable, why)


def _capped(problem: Problem, constraints: Constraints) -> Problem:
    """The pool as a plan under the GPU cap and the quotas can use it: no (GPU type, zone) with
    more GPUs than ``max_gpus`` or its type's quota. No plan that keeps to them is lost, and the
    strategies' smallest TPs, allocations and bounds then see only what such a plan can take
    (on the whole pool, a stage's fastest allocation may need more GPUs than the cap allows
    and be rejected after costing, passing by the plans that keep to it)."""
    cap = constraints.max_gpus
    avail = {(g, z): min(n, n if cap is None else cap, problem.quotas.get(g, n))
             for (g, z), n in problem.avail.items()}
    return problem if avail == problem.avail else replace(problem, avail=avail)


def complete_front(problem: Problem, result: SearchResult, *, strategy: str = "auto",
                   constraints: Constraints | None = None, limits: Limits = Limits(),
                   reuse: Reuse | None = None, alongside: Alongside | None = None
                   ) -> SearchResult:
    """``result`` (a search under one objective) with its throughput-cost front completed by
    the same strategy's searches under the other objectives. A search passes by what cannot
    beat its own best plan, so the plans one search costs reach only part of the front (the
    fastest search misses the cheap end, and plans between); the front returned is the plans
    that no plan of any of the searches beats in both throughput and cost per iteration.
    ``limits.budget_s`` counts from ``result``'s start, as ``search``'s does; the statistics
    add up all the searches. The ranked plans are ``result``'s, with any plan of the other searches
    (which keep to the same constraints) that ranks above them under ``result``'s objective:
    a plan on the front never beats the first ranked. ``alongside``: those searches, started
    with ``result``'s (``Alongside``); the searches it could not run are run here."""
    st = result.stats
    found = list(result.pareto)
    goals = () if st.interrupted else _front_goals(strategy, result.objective)  # Ctrl-C: so far
    there = [g for g in (alongside.goals if alongside is not None else ()) if g in goals]
    for goal in [*(g for g in goals if g not in there), *there]:
        if goal in there:  # run alongside: waited for once this process has run the others
            other = alongside.result(goal)
            if other is _FAILED:
                other = _front_search(problem, goal, strategy, constraints, limits, st.started,
                                      reuse)
        else:
            try:
                other = _front_search(problem, goal, strategy, constraints, limits, st.started,
                                      reuse)
            except KeyboardInterrupt:  # before any plan of that search
                if not limits.interruptible:
                    raise
                st.interrupted = st.truncated = True
                break
        if other == _OUT_OF_TIME:
            st.truncated = st.timed_out = True
            break
        if other is None:  # nothing meets the constraints under that objective's bounds
            continue
        o = other.stats
        st.candidates_costed += o.candidates_costed
        st.oom += o.oom
        st.pruned += o.pruned
        st.infeasible += o.infeasible
        st.no_fit += o.no_fit
        st.truncated = st.truncated or o.truncated
        st.timed_out = st.timed_out or o.timed_out
        st.interrupted = o.interrupted
        found += other.pareto
        if o.interrupted:
            break
    st.search_time_s = time.perf_counter() - st.started
    first: dict = {}  # a plan found by several searches: as the first found it
    for c in [*result.ranked, *found]:
        first.setdefault(c.spec, c)
    ranked = top(list(first.values()), result.objective, len(result.ranked))
    return SearchResult(ranked=ranked, pareto=pareto(found), stats=st,
                        objective=result.objective)


_OUT_OF_TIME = "out of time"  # a front search the budget left no time for


def _front_goals(strategy: str, objective: str) -> tuple[str, ...]:
    """The objectives whose searches complete the front of a search under ``objective``."""
    # Espresso's walk is bounded by cost alone: other goals run to the budget
    return tuple(g for g in OBJECTIVES
                 if g != objective and (strategy != "espresso" or g == "min-cost"))


def _front_search(problem: Problem, goal: str, strategy: str, constraints: Constraints | None,
                  limits: Limits, started: float, reuse: Reuse | None
                  ) -> SearchResult | str | None:
    """One search completing the front, within what is left of ``limits.budget_s`` from
    ``started``: its result, None when nothing meets the constraints, ``_OUT_OF_TIME`` when
    the budget left under 0.1 s."""
    left = _left(limits, started)
    if left is not None and left < 0.1:
        return _OUT_OF_TIME
    try:
        return search(problem, strategy=strategy, objective=goal, constraints=constraints,
                      top_k=1, limits=Limits(limits.max_stages, left,
                                             interruptible=limits.interruptible),
                      reuse=reuse)
    except InfeasibleError:
        return None


_FAILED = "failed"  # a search the copy of ``Alongside`` did not run to its end
ALONGSIDE_ENV = "SHOAL_ALONGSIDE"  # "0": the front's searches all run in this process
EXIT_S = 1.0  # seconds a copy that has sent its result is given to end before it is killed


class Alongside:
    """One of the searches that complete the front of a search under ``objective``
    (``complete_front``), the longest (max-throughput-per-dollar, whose key goes as the square
    of the time, or else max-throughput), run in a copy of this process (``forks``) while this
    one runs that search and the others: the front then costs about the longer of the two, not
    their sum, on a machine with a core to spare. ``start`` while no other thread runs (a
    progress display's: ``shoal plan`` pauses it, once its search has run 0.25 s and shown a
    plan); ``result`` waits for the copy; ``stop`` ends it (a context manager's exit does).
    Where the copy cannot run (not Linux, one core, another thread, or ``SHOAL_ALONGSIDE=0``)
    ``start`` gives None, and where it fails ``complete_front`` runs its search itself: the
    front is the same either way."""

    def __init__(self, child: forks.Forked, fd: int, goals: tuple[str, ...]) -> None:
        self.child, self.fd, self.goals = child, fd, goals
        self._results: dict[str, object] | None = None

    @classmethod
    def start(cls, problem: Problem, objective: str | None = None, *, strategy: str = "auto",
              constraints: Constraints | None = None, limits: Limits = Limits(),
              started: float | None = None, reuse: Reuse | None = None) -> Alongside | None:
        """The copy, forked now; its budget, ``limits.budget_s``, counts from ``started`` (a
        ``time.perf_counter()``; default: now). ``reuse``: what the searches of this process
        have built so far (``Reuse``), which the copy's search starts from (start the copy
        between two of their batches, as a progress report is: not while they change it)."""
        goals = _front_goals(strategy, objective or problem.objective)
        if (not goals or os.environ.get(ALONGSIDE_ENV) == "0" or not forks.can_fork()
                or not forks.spare_core()):
            return None
        goal = max(goals, key=lambda g: (g != "min-cost", g == "max-throughput-per-dollar"))
        started = time.perf_counter() if started is None else started
        limits = replace(limits, progress=None, interruptible=False)
        read, write = os.pipe()

        def run() -> None:
            jit.settle()  # a first run: the helper's loops, not compiled twice
            out = _front_search(problem, goal, strategy, constraints, limits, started, reuse)
            with os.fdopen(write, "wb") as f:
                pickle.dump({goal: out}, f, protocol=pickle.HIGHEST_PROTOCOL)

        try:
            child = forks.Forked.start(run, name=b"shoal-front", keep=(write,))
        except OSError:
            os.close(read)
            return None
        finally:
            os.close(write)
        jit.only_hot()  # once the copy runs: it needs the second core
        return cls(child, read, (goal,))

    def result(self, goal: str) -> SearchResult | str | None:
        """The copy's result for ``goal`` (as ``_front_search``), once it ends; ``_FAILED``
        when it failed."""
        if self._results is None:
            try:
                with os.fdopen(self.fd, "rb") as f:
                    self.fd = None
                    data = f.read()
                self._results = pickle.loads(data) if data else {}
            except (OSError, EOFError, pickle.UnpicklingError):
                self._results = {}
            finally:
                # it has written all it will: let it end on its own (a moment), then stop it
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.child.wait(timeout=EXIT_S)
                self.stop()
        return self._results.get(goal, _FAILED)

    def stop(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.child.kill()
        self.child.wait()

    def __enter__(self) -> Alongside:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _left(limits: Limits, started: float) -> float | None:
    """Seconds left of the budget of a search started at ``started`` (None: no budget)."""
    return (None if limits.budget_s is None
            else limits.budget_s - (time.perf_counter() - started))


def _nearest(ev: Evaluator, problem: Problem, strategy: str | Strategy, constraints: Constraints,
             limits: Limits, reuse: Reuse) -> None:
    """Plans fit in memory but none meets the constraints: the fastest plan under the other
    constraints (for a throughput floor or a deadline) and the cheapest (for a cost cap), each
    found by a search without that constraint, so that ``InfeasibleError`` names a relaxation
    that works (the failed search's fastest and cheapest are of the plans its bounds let
    through, whatever the other constraints; kept when the other constraints bind too)."""
    c = constraints
    relaxed = []
    if c.min_iters_per_s is not None or c.deadline is not None:
        relaxed.append(("max-throughput", {"min_iters_per_s": None, "deadline": None}))
    if c.max_cost_per_iteration_usd is not None:
        relaxed.append(("min-cost", {"max_cost_per_iteration_usd": None}))
    for goal, drop in relaxed:
        left = _left(limits, ev.stats.started)
        if left is not None and left < 0.1:
            return  # the budget is spent: the relaxations stay those of the plans costed
        try:
            best = search(problem, strategy=strategy, objective=goal,
                          constraints=c.model_copy(update=drop), top_k=1,
                          limits=Limits(limits.max_stages, left, front=False),
                          reuse=reuse).ranked[0]
        except InfeasibleError:
            continue  # the other constraints bind too
        if goal == "max-throughput":
            ev.fastest_else = best
        else:
            ev.cheapest_else = best
