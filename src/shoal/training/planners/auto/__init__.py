"""shoal's default planner: a best-first branch and bound over plan shapes and data-parallel
degrees, with Sailor's space widened.

The space, beyond the ``sailor`` strategy's:
- every TP degree that fits a node, not only the smallest that fits in memory;
- for shallow pipelines every contiguous layer split, and for every depth the layers re-split
  so each stage's slowest GPU takes about equal time (a linear-partition dynamic program);
- every data-parallel degree worth trying, not only the walk that stops at the first
  non-improvement;
- for cost objectives, the cheapest allocation under several levels (bounds on the slowest
  option's cost to the iteration), so time-cost trade-offs reach the estimator and the Pareto
  front;
- every objective uses every pipeline depth (Sailor's public planner keeps min-cost searches to
  one stage), and activation recompute where the job allows it;
- each pair of a balanced split also gets the ``sailor`` strategy's own allocation (each kind at
  Sailor's TP, ``sailor.sailor_tp``), so every plan that strategy costs is costed here;
- a pair whose allocation puts stages in more than one region also gets the allocation of each
  region's own GPUs (the program counts no sends), and an allocation in a region of several
  zones is also placed from each of them (``packings``);
- after the search, the best plans' layer boundaries are tuned on their own replicas
  (``refine``, run by ``planners.search``).

The search: (when minimising cost, Sailor's single-stage walk first, for an incumbent) every
(shape, degree) pair gets a lower bound on iteration time and on $/iteration
that holds for any allocation of the pool (see ``Bounds``). Pairs are taken cheapest bound
first; each is given its allocation by the stage dynamic program and costed by the estimator in
batches; the search stops when the next bound cannot beat the best plan found. A pair taken is
first given a tighter bound, per option rather than per term (``Bounds.refined``: what a replica
of each option costs the iteration, and the GPUs of the options under a level): when that
cannot beat the best plan, the pair's own split is not allocated, and of a re-split shape only
the re-split is (under its own refined bound). Inside a pair,
an allocation whose pipelines can neither beat the best plan found nor join the throughput-cost
front of the plans found (``Worth``: each pipeline's replicas run their microbatches at their
option times with the least sends, plus the pair's least sync and update) is not built, and when
the pair's least level already cannot, neither are the variants the program would give on fewer
options or fewer GPUs. Only bounds cut the space, so on it the result is the same as costing
every pair, and inside the pairs taken so is the front.

A pair's own allocations are the program's over its options' levels (``Bounds.option_levels``:
each option's least cost to the whole iteration, its stage's gradient ring and update after the
last backward included) rather than over their compute times: the fastest-compute allocation
gives a stage of many parameters (the embeddings) replicas at the smallest TP, whose gradient
ring can take longer than all its microbatches."""

from shoal.training.planners.auto.bounds import Bounds
from shoal.training.planners.auto.branch import propose
from shoal.training.planners.auto.pairs import PACKINGS
from shoal.training.planners.auto.shapes import Shape
from shoal.training.planners.auto.worth import Worth

__all__ = ["PACKINGS", "Bounds", "Shape", "Worth", "propose"]
