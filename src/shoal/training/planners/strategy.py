"""What a planning strategy is: a generator of plan batches.

A strategy proposes plans (``PlanSpec``) in batches; it neither costs nor ranks them. The search
that drives it (``drive``) costs each batch in one place (``Evaluator.cost``: the estimator,
memory, quotas, constraints) and sends the batch's candidates back (None where a plan does not
fit or breaks a constraint), so a strategy that bounds its search reads what the costing found so
far (the incumbent, the plans kept) from its context's ``state`` before proposing more. The
ranking, the Pareto front and the statistics belong to the search, not to the strategy.

So each strategy runs alone (``planners.run_strategy``), under another's search (``auto``
proposes ``sailor``'s plans first under min-cost, then Zorse's, Espresso's and Atlas's), or under
a test's own driver.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from shoal.estimate.encode import PlanSpec
from shoal.problem import Problem
from shoal.specs.job import Constraints

if TYPE_CHECKING:  # the types a strategy reads (common imports nothing of this module)
    from shoal.training.planners.common import Candidate, SearchStats
    from shoal.training.planners.space import Space

# what a strategy yields (a batch of plans) and is sent back (their candidates, in order)
Proposals = Generator[list[PlanSpec], "list[Candidate | None]", None]


class SearchState(Protocol):
    """What a strategy may read of the search driving it (``Evaluator`` is one), and the
    statistics it adds to (plan shapes it passes by, shapes nothing fits, a cut search)."""

    problem: Problem
    constraints: Constraints
    objective: str
    stats: SearchStats
    incumbent: Candidate | None  # the best plan so far under the objective
    fastest: Candidate | None  # of the plans that fit, whatever the constraints
    cheapest: Candidate | None
    feasible: dict[PlanSpec, Candidate]  # every plan kept so far
    max_pairs: int | None  # (shape, degree) pairs a bounded search allocates
    front: bool  # whether plans only for the throughput-cost front are still built
    tuned: dict  # where descents from plans ended (``refine``)

    def out_of_time(self) -> bool: ...

    def allocation_deadline(self) -> float | None: ...

    def beaten(self, t: float, usd: float) -> bool: ...


@dataclass(frozen=True)
class Context:
    """One strategy's run: the search state it reads, the planning space (the pool's GPU kinds,
    cost tables, caches), the objective, the microbatch sizes to try and the most pipeline
    stages (None: as many as layers)."""

    state: SearchState
    space: Space
    objective: str
    mbs_values: tuple[int, ...]
    max_stages: int | None = None


class Strategy(Protocol):
    """A planning strategy: ``propose(ctx)`` yields batches of plans and receives each batch's
    candidates."""

    def __call__(self, ctx: Context) -> Proposals: ...


def drive(cost, proposals: Proposals) -> None:
    """Runs ``proposals`` to its end, costing each batch with ``cost`` (a list of plans to
    their candidates) and sending the candidates back."""
    try:
        batch = next(proposals)
        while True:
            batch = proposals.send(cost(batch))
    except StopIteration:
        return
