"""The cost model: memory, time and money of a plan (DESIGN §3, §4).

``estimate(problem, plan)`` is a thin wrapper over the batched kernel in ``kernel.py`` that the
planners call on many candidates at once.
"""

from shoal.estimate.api import Estimate, StageBreakdown, WorkerMemory, estimate

__all__ = ["Estimate", "StageBreakdown", "WorkerMemory", "estimate"]
