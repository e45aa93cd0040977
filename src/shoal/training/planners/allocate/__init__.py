"""Resource-stage assignment (Sailor §4.2.2, Eq. 1, Listing 1): which GPUs of the pool each
pipeline stage's replicas take, per resource kind (GPU type in a region).

Each stage gets D replicas, each of one kind at that kind's smallest fitting TP for the stage
(H1, H2), all in one region (H5; zones of a region are one pool, H6). For a bound ``tau`` on the
per-microbatch time of the slowest replica, the cheapest allocation is exact: with one or two
kinds by Sailor's dynamic program over stages on the GPUs still free (keeping after each stage
the GPU-usage vectors that no other dominates), with three kinds or more, where those sets grow
to thousands of vectors per stage, by a MIP over the same choices (unless the options the bound
leaves are of one or two kinds: the dynamic program on those; or every stage's own cheapest
choice fits the pool together: no allocation is cheaper). The smallest feasible ``tau`` is
found by bisection over the distinct stage times (feasibility is monotone in ``tau``).

Pool sizes enter the dynamic program only as caps, so a ``PoolMemo`` keeps each program's last
front computed for the largest pool it serves (``Fronts``) and answers smaller pools from it."""

from shoal.training.planners.allocate.base import (
    DP_KINDS,
    GREEDY_ORDERS,
    Allocation,
    Bound,
    Option,
    OutOfTime,
    Pool,
    kind_weights,
    slots,
)
from shoal.training.planners.allocate.memo import Fronts, Memoised, PoolMemo
from shoal.training.planners.allocate.program import fastest, tradeoffs, upgraded

__all__ = ["DP_KINDS", "GREEDY_ORDERS", "Allocation", "Bound", "Fronts", "Memoised", "Option",
           "OutOfTime", "Pool", "PoolMemo", "fastest", "kind_weights", "slots", "tradeoffs", "upgraded"]
