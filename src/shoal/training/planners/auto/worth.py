"""Whether an allocation may beat the incumbent or join the front: its floors."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from shoal.training.planners.allocate import (
    Allocation,
)
from shoal.training.planners.auto.kernels import (
    pipeline_ends,
)
from shoal.training.planners.auto.shapes import (
    OptionTimes,
    Shape,
)
from shoal.training.planners.build import shares
from shoal.training.planners.common import cannot_beat


def rank_key(T, C, objective: str):
    """What ``objective`` ranks by, from times ``T`` and costs ``C`` (arrays or numbers)."""
    if objective == "max-throughput":
        return T
    if objective == "min-cost":
        return C
    return T * C


@dataclass(frozen=True)
class Worth:
    """Whether an allocation may beat the incumbent (score ``bar`` under ``objective``) or
    join the throughput-cost front of the plans found (``beaten``: whether plans taking at
    least given seconds and USD per iteration are of no use beyond the incumbent, as
    ``Evaluator.beaten``: always when the search does not look for the front).
    Whatever its zones, a plan of allocation ``a`` takes at least, over its options' times
    with the least sends (``shape``), its pipelines' time (``stage_floors_s`` of the first
    stage) plus ``after_s`` (the pair's least gradient sync and update, and the step overhead),
    and for every stage that stage's end plus its own least sync and update (``tails``) and the
    step overhead; it pays at least that long for its GPUs at their cheapest zone's price
    (``plan_floor``). An allocation whose stages are in more than one region sends across
    regions between them (``crossed``). A plan of another split than the pair's (a re-split,
    ``other``) is given that split's option times (``times_of``), and each of its stages' end
    plus the stage's least sync and update on that split (``tails``) and the step overhead. Plans
    whose floors break a constraint (``limits``) are worth nothing: they would not be
    adopted."""

    objective: str
    bar: float
    bar_t: float  # the incumbent's seconds per iteration (``cannot_beat``)
    after_s: float
    overhead_s: float
    price_h: np.ndarray
    shape: OptionTimes
    beaten: Callable[[float, float], bool] = lambda t, usd: False
    # per stage of an allocation on layer ranges (split, per_stage) and option compute times:
    # its least sync and update (Bounds.tails at the pair's degree)
    tails: Callable[..., np.ndarray] | None = None
    # the option times of an allocation whose stages are in more than one region, with the
    # sends across (Bounds.crossed_times; None: as given)
    crossed: Callable[..., list | None] | None = None
    # the most seconds and USD an iteration may take (the search's constraints): plans
    # beyond either are not adopted, so they are worth nothing
    limits: tuple[float, float] = (np.inf, np.inf)
    split: tuple[tuple[int, int], ...] = ()  # the pair's layer ranges (for ``tails``)
    # a re-split's option times (``Bounds.option_times``)
    times_of: Callable[[Shape], OptionTimes] | None = None
    one_f1b: bool = True  # the plans run 1F1B (``stage_span``)

    def __call__(self, a: Allocation, D: int, total: int, other: Shape | None = None) -> bool:
        return not self._bound() or self.below(*self.plan_floor(a, D, total, other))

    def _bound(self) -> bool:
        """Whether anything can be ruled out: there is an incumbent or a constraint."""
        return math.isfinite(self.bar) or any(math.isfinite(x) for x in self.limits)

    def beyond_level(self, level: float, D: int) -> bool:
        """True when no plan of D pipelines that takes at least ``level`` seconds before the
        step overhead can beat the incumbent: it pays at least the least USD/s of a replica
        of every stage (``OptionTimes.rate_usd_s``), D times, for the iteration."""
        t = level + self.overhead_s
        return self._bound() and not self.below(t, t * D * self.shape.rate_usd_s)

    def plan_floor(self, a: Allocation, D: int, total: int,
                   other: Shape | None = None) -> tuple[float, float]:
        """(seconds, USD) per iteration that any plan of ``a`` takes at least (on the layer
        ranges of ``other``, when given)."""
        own = self.shape if other is None else self.times_of(other)
        crossed = None if self.crossed is None else self.crossed(a.per_stage, own)
        times, fwd = crossed or (own.times, own.fwd)
        ends = stage_floors_s(a, times, fwd, D, total, own.compute, self.one_f1b)
        if other is None:
            t = float(ends[0]) + self.after_s
            split = self.split
        else:
            t = float(ends[0]) + self.overhead_s
            split = other.split
        if self.tails is not None:
            t = max(t, float((ends + self.tails(split, a.per_stage, compute=own.compute)).max())
                    + self.overhead_s)
        usd_s = sum(self.price_h[k] * tp * n for st in a.per_stage for k, tp, n in st) / 3600
        return t, t * usd_s

    def out_of_reach(self, t: float, usd: float) -> bool:
        """Whether plans taking at least ``t`` seconds and ``usd`` per iteration cannot beat
        the incumbent (the front aside: pairs are taken by their bounds against it alone),
        or break a constraint."""
        return bool(self._beyond_limits(t, usd) or self._worse(t, usd))

    def below(self, t: float, usd: float) -> bool:
        """Whether lower bounds ``t`` (iteration seconds) and ``usd`` (per iteration) leave
        room to beat the incumbent or to join the front, within the constraints."""
        if self._beyond_limits(t, usd):
            return False
        return not self._worse(t, usd) or not self.beaten(t, usd)

    def _worse(self, t: float, usd: float) -> bool:
        return bool(math.isfinite(self.bar) and cannot_beat(
            rank_key(t, usd, self.objective), t, self.bar, self.bar_t, 1e-9))

    def _beyond_limits(self, t: float, usd: float) -> bool:
        return t > self.limits[0] * (1 + 1e-9) or usd > self.limits[1] * (1 + 1e-9)


def stage_floors_s(a: Allocation, times: list[dict[tuple[int, int], float]],
                   fwd: list[dict[tuple[int, int], float]], D: int, total: int,
                   order: list[dict[tuple[int, int], float]], one_f1b: bool = True
                   ) -> np.ndarray:
    """Per stage s, the least time after the iteration's start at which every replica of s has
    run its last backward, in any plan of allocation ``a``, given per stage a lower bound on
    each (kind, TP) replica's time per microbatch (``times``) and forward (``fwd``).
    Pipeline j holds the j-th slowest replica of every stage by compute time (``order``;
    ``build_spec``) and runs m = ``shares(total, D)[j]`` microbatches: its stage b starts
    after the forwards of the stages before it, spans ``stage_span`` (the later stages' times
    its trips), and stages b-1..s then run the last microbatch backward. For s = 0 that is the
    pipeline's end."""
    t_vals, f_vals, counts = [], [], []
    for st, time_of, fwd_of, rank in zip(a.per_stage, times, fwd, order, strict=True):
        # stable, as build_spec
        for k, tp, n in (st if len(st) == 1 else sorted(st, key=lambda r: -rank[(r[0], r[1])])):
            t_vals.append(time_of[(k, tp)])
            f_vals.append(fwd_of[(k, tp)])
            counts.append(n)
    P = len(times)
    t = np.repeat(t_vals, counts).reshape(P, -1)  # (stages, pipelines)
    f = np.repeat(f_vals, counts).reshape(P, -1)
    return pipeline_ends(f, t - f, np.asarray(shares(total, D), dtype=np.float64), one_f1b)
