"""Re-planning as availability changes: one search per availability state, reusing across
states what does not depend on GPU counts, and starting each search from plans that still fit.

* GPU counts never change cost tables (layer times, links, prices) or the smallest TP that fits a
  stage, so those are built once (``Reuse``).
* A plan's estimate does not depend on the pool either: every plan ranked in an earlier state
  that fits the new pool is costed with the search's plans (``search``'s ``seeds``), so the
  search returns nothing worse than the best of them. Plans the caller gives as hints
  (``plan(avail, hints=...)``: a plan read from a file and running, say) come first. They are
  costed after the search and its tuning of the best plans' layer boundaries: as the
  incumbent, they would spare the search plans that the tuning makes faster than them, and the
  re-plan would return less than a cold search.
* A state seen before is answered from memory (traces go back and forth between the same
  counts).
* A pool with no more GPUs of any type in any zone than a pool searched before has only plans
  that pool had: when that pool's best plan fits, it would be the best here too if the search
  were exact. Allocation and zone placement are heuristics that sometimes find a better plan
  on the smaller pool, so the most promising ``CHECK_PAIRS`` (plan shape, data-parallel degree)
  pairs are still searched, from that plan as the incumbent.
* Otherwise the pool is searched (with the tables and the earlier plans that fit).

A bound per (plan shape, data-parallel degree) from larger pools would prune far more, but the
zone placement and the allocation are heuristics whose result on a smaller pool can beat the
larger pool's by several percent; such a bound then cuts plans a cold search finds.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from shoal.errors import InfeasibleError
from shoal.estimate.encode import PlanSpec
from shoal.problem import Problem
from shoal.specs.job import Constraints
from shoal.training.planners import Limits, Reuse, SearchResult, search
from shoal.training.planners.common import fits, usage

Avail = dict[tuple[str, str], int]
CHECK_PAIRS = 60  # pairs searched when a larger pool's best plan fits (five estimator batches)


@dataclass
class ReplanCall:
    time_s: float
    remembered: bool  # the same counts were planned before
    seeds: int  # earlier plans (and hints) that fit, costed with the search's
    from_larger: bool = False  # a larger pool's best plan fits: a bounded search
    timed_out: bool = False  # the time budget cut the search short


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
    # the searches build plans only to beat the best (no throughput-cost front: a re-plan
    # needs the best plans, ``search``'s ``front``)
    front: bool = False
    reuse: Reuse = field(default_factory=Reuse)
    calls: list[ReplanCall] = field(default_factory=list)
    _results: dict[tuple, SearchResult | InfeasibleError] = field(default_factory=dict)
    _ranked: dict[PlanSpec, Avail] = field(default_factory=dict)  # plans ranked so far

    def plan(self, avail: Avail, hints: Iterable[PlanSpec] = ()) -> SearchResult:
        """Ranked plans for the pool ``avail`` ((gpu, zone) -> GPUs; pairs of the scenario's
        pool left out have none). ``hints``: plans to cost where they fit (the plan running,
        say), ahead of the earlier states' plans when there are more than ``max_seeds``; a
        state planned before is answered from memory without them. Raises InfeasibleError
        when nothing fits."""
        start = time.perf_counter()
        # every pair of the scenario's pool, those not given having none
        avail = {k: int(avail.get(k, 0)) for k in self.problem.avail}
        key = tuple(sorted((k, n) for k, n in avail.items() if n > 0))
        if key in self._results:
            self.calls.append(ReplanCall(time.perf_counter() - start, True, 0,
                                         timed_out=_timed_out(self._results[key])))
            return self._answer(self._results[key])
        inherited = self._from_larger(avail)
        first = [sp for sp in hints if fits(usage(sp), avail)]
        seeds = list(dict.fromkeys(first + inherited + [
            sp for sp, use in reversed(self._ranked.items()) if fits(use, avail)]))
        seeds = seeds[:self.max_seeds]
        problem = replace(self.problem, avail=avail)
        try:
            res: SearchResult | InfeasibleError = search(
                problem, strategy=self.strategy, objective=self.objective,
                constraints=self.constraints, top_k=self.top_k,
                limits=Limits(budget_s=self.budget_s,
                              max_pairs=CHECK_PAIRS if inherited else None, front=self.front),
                reuse=self.reuse, seeds=tuple(seeds))
        except InfeasibleError as exc:
            res = exc
        self._results[key] = res
        if isinstance(res, SearchResult):
            for c in res.ranked:
                self._ranked.pop(c.spec, None)
                self._ranked[c.spec] = usage(c.spec)  # most recent last
        self.calls.append(ReplanCall(time.perf_counter() - start, False, len(seeds),
                                     bool(inherited), _timed_out(res)))
        return self._answer(res)

    def _from_larger(self, avail: Avail) -> list[PlanSpec]:
        """The plans ranked by a complete search of a pool containing ``avail`` that fit it,
        when that search's best plan fits; else none."""
        for key, res in self._results.items():
            if not isinstance(res, SearchResult) or res.stats.truncated:
                continue
            have = dict(key)
            if any(n > have.get(k, 0) for k, n in avail.items() if n > 0):
                continue
            if fits(usage(res.ranked[0].spec), avail):
                return [c.spec for c in res.ranked if fits(usage(c.spec), avail)]
        return []

    @staticmethod
    def _answer(res: SearchResult | InfeasibleError) -> SearchResult:
        if isinstance(res, InfeasibleError):
            raise res
        return res


def _timed_out(res: SearchResult | InfeasibleError) -> bool:
    """Whether the search's time budget cut it short (an error says so by its binding)."""
    if isinstance(res, InfeasibleError):
        return res.binding == "time budget"
    return res.stats.timed_out
