"""Training planners: one interface, several strategies (DESIGN §4: strategies, not forks).

``search(problem, strategy=..., objective=..., constraints=..., top_k=...) -> SearchResult``
"""

from __future__ import annotations

from shoal.errors import SpecError
from shoal.problem import Problem
from shoal.specs.job import Constraints
from shoal.training.planners import auto, exhaustive, sailor
from shoal.training.planners.common import (
    OBJECTIVES,
    Candidate,
    Evaluator,
    SearchResult,
    SearchStats,
    finish,
)
from shoal.training.planners.space import Space, mbs_options

STRATEGIES = {"auto": auto.search, "sailor": sailor.search, "exhaustive": exhaustive.search}

__all__ = ["OBJECTIVES", "STRATEGIES", "Candidate", "SearchResult", "search"]


def search(problem: Problem, *, strategy: str = "auto", objective: str | None = None,
           constraints: Constraints | None = None, top_k: int = 10,
           max_stages: int | None = None, budget_s: float | None = None) -> SearchResult:
    """Ranked plans for ``problem`` under ``objective`` and ``constraints`` (default: the
    scenario's), with the throughput-cost Pareto front and search statistics. ``budget_s``
    bounds the search time (``auto`` stops taking new plan shapes; the result says it was
    truncated). Raises InfeasibleError naming the binding constraint when nothing fits."""
    if strategy not in STRATEGIES:
        raise SpecError("unknown strategy", field="--strategy", value=strategy,
                        allowed=", ".join(STRATEGIES))
    objective = objective or problem.objective
    if objective not in OBJECTIVES:
        raise SpecError("unknown objective", field="--objective", value=objective,
                        allowed=", ".join(OBJECTIVES))
    constraints = constraints or problem.constraints
    mbs = mbs_options(problem)
    stats = SearchStats(strategy=strategy)
    ev = Evaluator(problem, mbs, constraints, stats, objective)
    space = Space(problem, ev.tb)
    if budget_s is not None:
        ev.deadline = stats.started + budget_s
    STRATEGIES[strategy](ev, space, objective, mbs, max_stages)
    return finish(ev, objective, top_k)
