"""Re-planning as availability changes: one search per availability state, reusing across
states what does not depend on GPU counts, and starting each search from plans that still fit.

* GPU counts never change cost tables (layer times, links, prices) or the smallest TP that fits a
  stage, so those are built once (``Reuse``).
* A plan's estimate does not depend on the pool either: every plan ranked in an earlier state
  that fits the new pool is costed first and becomes the incumbent the search must beat, so
  the search returns nothing worse than the best of them.
* A state seen before is answered from memory (traces go back and forth between the same
  counts).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from shoal.errors import InfeasibleError
from shoal.estimate.encode import PlanSpec
from shoal.problem import Problem
from shoal.specs.job import Constraints
from shoal.training.planners import Reuse, SearchResult, search
from shoal.training.planners.memory import fits, usage

Avail = dict[tuple[str, str], int]


@dataclass
class ReplanCall:
    time_s: float
    remembered: bool  # the same counts were planned before
    seeds: int  # earlier plans that fit and were costed first


@dataclass
class Replanner:
    """Plans for a sequence of availability states of one problem (``plan(avail)``)."""

    problem: Problem
    strategy: str = "auto"
    objective: str | None = None
    constraints: Constraints | None = None
    top_k: int = 5
    budget_s: float | None = None
    max_seeds: int = 64
    reuse: Reuse = field(default_factory=Reuse)
    calls: list[ReplanCall] = field(default_factory=list)
    _results: dict[tuple, SearchResult | InfeasibleError] = field(default_factory=dict)
    _ranked: dict[PlanSpec, Avail] = field(default_factory=dict)  # plans ranked so far

    def plan(self, avail: Avail) -> SearchResult:
        """Ranked plans for the pool ``avail`` ((gpu, zone) -> GPUs). Raises InfeasibleError
        when nothing fits."""
        start = time.perf_counter()
        key = tuple(sorted((k, n) for k, n in avail.items() if n > 0))
        if key in self._results:
            self.calls.append(ReplanCall(time.perf_counter() - start, True, 0))
            return self._answer(self._results[key])
        seeds = [sp for sp, use in reversed(self._ranked.items()) if fits(use, avail)]
        seeds = seeds[:self.max_seeds]
        problem = replace(self.problem, avail={**self.problem.avail, **avail})
        try:
            res: SearchResult | InfeasibleError = search(
                problem, strategy=self.strategy, objective=self.objective,
                constraints=self.constraints, top_k=self.top_k, budget_s=self.budget_s,
                reuse=self.reuse, seeds=tuple(seeds))
        except InfeasibleError as exc:
            res = exc
        self._results[key] = res
        if isinstance(res, SearchResult):
            for c in res.ranked:
                self._ranked.pop(c.spec, None)
                self._ranked[c.spec] = usage(c.spec)  # most recent last
        self.calls.append(ReplanCall(time.perf_counter() - start, False, len(seeds)))
        return self._answer(res)

    @staticmethod
    def _answer(res: SearchResult | InfeasibleError) -> SearchResult:
        if isinstance(res, InfeasibleError):
            raise res
        return res
