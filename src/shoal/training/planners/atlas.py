"""Atlas: how many stages each datacenter hosts, and how many DP-cells to run (Atlas §4.5, Alg. 1).

Pipelines span datacenters, data parallelism stays inside each: stage s of every pipeline sits in
one datacenter, so a datacenter hosting k stages for D DP-cells of C pipelines uses k·D·C GPUs.
For every D from 1 to D_max = ΣGPUs / (C·P), datacenters are filled in order (each
datacenter's GPUs in whole stages, the rest left idle; more stages where there are more GPUs,
as few datacenters as possible), and the iteration time is the Atlas schedule of one DP-cell
(``shoal.training.geo``) plus the gradient all-reduce over the D·C pipelines; throughput is
D·C / total_time and the smallest D that reaches the highest throughput wins.

``propose`` is ``--strategy atlas`` on a scenario: datacenters are the pool's regions, one GPU type
at a time; for every stage count P (balanced layers, smallest TP that fits) and microbatch size,
C is the WAN hand-off of one microbatch over its stage's forward time (rounded up), and every D of
Algorithm 1's partitioning whose D·C pipelines divide the global batch becomes a plan (stage s on
D·C replicas in its datacenter's zones). Every plan is costed by shoal's estimator (the global
batch is fixed, so the best D is the one with the shortest iteration, not the most pipelines);
the Atlas schedule itself (temporal WAN sharing) is simulated by ``shoal bubbles`` and
``shoal.training.geo``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec
from shoal.profiles.network import bandwidth
from shoal.training.geo import GeoJob, ring_allreduce_s, simulate
from shoal.training.planners.space import Kind, Space, balanced_split, zero_stages
from shoal.training.planners.strategy import Context, Proposals, SearchState


@dataclass(frozen=True)
class CellChoice:
    cells: int  # D
    pipelines: int  # D·C
    partitions: tuple[tuple[str, int], ...]  # (datacenter, stages) in pipeline order
    pp_s: float  # pipeline time of one DP-cell (inf when the stages do not fit)
    dp_s: float
    total_s: float
    throughput: float  # pipelines (D·C) / total_s: iterations of one pipeline's batch per second

    @property
    def feasible(self) -> bool:
        return self.total_s != float("inf")

    def to_json(self) -> dict:
        return {"cells": self.cells, "pipelines": self.pipelines,
                "partitions": [list(p) for p in self.partitions], "pp_s": self.pp_s,
                "dp_s": self.dp_s, "total_s": self.total_s, "throughput": self.throughput,
                "feasible": self.feasible}


def algorithm1(dcs: Sequence[tuple[str, int]], comm_ratio: int, stages: int,
               pp_latency: Callable[[tuple[tuple[str, int], ...]], float],
               dp_latency: Callable[[int], float], d_max: int | None = None) -> list[CellChoice]:
    """Atlas Algorithm 1. ``dcs``: (name, GPUs) in preference order (default: most GPUs first);
    ``comm_ratio``: C, pipelines per DP-cell; ``stages``: P; ``pp_latency(partitions)``: pipeline
    time of one DP-cell whose stages go to datacenters as given; ``dp_latency(n)``: gradient
    all-reduce over n pipelines."""
    C, P = int(comm_ratio), int(stages)
    if C < 1 or P < 1:
        raise ValueError("comm_ratio and stages must be >= 1")
    total_gpus = sum(n for _, n in dcs)
    d_max = total_gpus // (C * P) if d_max is None else int(d_max)
    out: list[CellChoice] = []
    memo: dict[tuple, float] = {}  # the pipeline time depends on D only through partitions
    for D in range(1, d_max + 1):
        left = P
        parts: list[tuple[str, int]] = []
        for name, n in dcs:
            k = min(left, n // (D * C))
            if k > 0:
                parts.append((name, k))
            left -= k
            if left == 0:
                break
        key = tuple(parts)
        if left > 0:
            pp = dp = total = float("inf")
        else:
            if key not in memo:
                memo[key] = pp_latency(key)
            pp, dp = memo[key], dp_latency(D * C)
            total = pp + dp
        out.append(CellChoice(D, D * C, key, pp, dp, total,
                              0.0 if total == float("inf") else D * C / total))
    return out


def best(choices: Sequence[CellChoice], rel_tol: float = 1e-9) -> CellChoice | None:
    """The smallest D that reaches the highest throughput (None when nothing fits)."""
    ok = [c for c in choices if c.feasible]
    if not ok:
        return None
    top = max(c.throughput for c in ok)
    return next(c for c in ok if c.throughput >= top * (1 - rel_tol))


def uniform_cell_latency(comm_ratio: int, stages: int, microbatches: int, *,
                         fwd_s: float = 0.01, wan_latency_s: float = 0.0,
                         intra_speedup: float = 20.0, recompute: bool = True
                         ) -> Callable[[tuple[tuple[str, int], ...]], float]:
    """``pp_latency`` for identical stages: forward ``fwd_s``, backward twice that, recompute
    equal to the forward; a WAN hand-off takes ``comm_ratio`` forwards (the definition of C), one
    inside a datacenter ``intra_speedup`` times less (5 vs 100 Gbit/s in Atlas's testbed)."""
    C = int(comm_ratio)

    def pp(parts: tuple[tuple[str, int], ...]) -> float:
        dc = tuple(name for name, k in parts for _ in range(k))
        S = len(dc)
        wan = [dc[i] != dc[i + 1] for i in range(S - 1)]
        # one node pair moves the activation (1 unit of bytes) in C forwards over the WAN
        job = GeoJob(stage_dc=dc, fwd_s=(fwd_s,) * S, bwd_s=(2 * fwd_s,) * S,
                     recompute_s=(fwd_s if recompute else 0.0,) * S, act_bytes=1.0,
                     grad_bytes=(0.0,) * S,
                     hop_bw=tuple(1 / (C * fwd_s) * (1 if w else intra_speedup) for w in wan),
                     hop_latency_s=tuple(wan_latency_s if w else 0.0 for w in wan),
                     pipelines=C, microbatches=microbatches, intra_bw=intra_speedup / (C * fwd_s))
        return simulate(job, "atlas", cell=C).pipeline_s

    return pp


def ring_latency(grad_bytes: float, bw: float) -> Callable[[int], float]:
    """``dp_latency``: ring all-reduce of one stage's gradients inside a datacenter."""
    return lambda n: ring_allreduce_s(grad_bytes, n, bw)


def partitions(dcs: Sequence[tuple[str, int]], per_stage: int, stages: int
               ) -> tuple[tuple[str, int], ...] | None:
    """Algorithm 1's fill (lines 2-10): each datacenter in order takes as many stages as its GPUs
    hold at ``per_stage`` GPUs per stage; None when the stages do not fit."""
    left, parts = stages, []
    for name, n in dcs:
        k = min(left, n // per_stage)
        if k > 0:
            parts.append((name, k))
        left -= k
        if left == 0:
            return tuple(parts)
    return None


class _Fleet(NamedTuple):
    """One GPU type's datacenters: (region, GPUs) most GPUs first, the type's kind and first
    zone in each region."""

    gpu: str
    dcs: tuple[tuple[str, int], ...]
    kinds: dict[str, Kind]
    zone0: dict[str, str]


class _Shape(NamedTuple):
    """The stages' layer ranges and the settings a layout's plans run under."""

    ranges: tuple[tuple[int, int], ...]
    mbs: int
    recompute: bool
    zero: int
    schedule: str


def propose(ctx: Context) -> Proposals:
    """``--strategy atlas``: Atlas layouts of the pool (module docstring), a batch per GPU type
    and number of stages, so that the first plans are costed within milliseconds."""
    space, job = ctx.space, ctx.space.problem.job
    L = space.problem.n_layers
    geo = len({k.region for k in space.kinds}) > 1
    for fleet in _fleets(space):
        total = sum(n for _, n in fleet.dcs)
        for P in range(1, min(ctx.max_stages or L, L, total) + 1):
            specs: list[PlanSpec] = []
            for mbs in ctx.mbs_values:
                if job.global_batch % mbs:
                    continue
                for recompute in sorted(set(job.recompute), reverse=True):
                    for zero in zero_stages(job.zero_stage):
                        for schedule in (x for x in job.schedule if x != "zorse"):
                            shape = _Shape(balanced_split(L, P), mbs, recompute, zero, schedule)
                            specs += _layouts(ctx.state, space, fleet, shape, geo)
            if specs:
                yield list(dict.fromkeys(specs))


def _fleets(space: Space) -> list[_Fleet]:
    out = []
    for gpu in sorted({k.gpu for k in space.kinds}):
        kinds = {k.region: k for k in space.kinds if k.gpu == gpu}
        dcs = sorted(((r, space.avail[k]) for r, k in kinds.items()), key=lambda x: (-x[1], x[0]))
        out.append(_Fleet(gpu, tuple(dcs), kinds,
                          {r: space.zones_of[k][0][0] for r, k in kinds.items()}))
    return out


def _pipelines_per_cell(space: Space, fleet: _Fleet, shape: _Shape, geo: bool) -> int:
    """C: the WAN hand-off of one microbatch between the first two datacenters over the
    shortest stage's forward time, rounded up (1 inside one datacenter)."""
    if not geo or len(fleet.dcs) < 2:
        return 1
    tb, gpu, mbs = space.tb, fleet.gpu, shape.mbs
    cum = tb.cum_f[tb.gi(gpu), tb.ti(1), tb.mi(mbs)]
    fwd = [float(cum[b] - cum[a]) for a, b in shape.ranges]
    link = space.problem.network.link(fleet.zone0[fleet.dcs[0][0]],
                                      fleet.zone0[fleet.dcs[1][0]], gpu, gpu)
    nbytes = float(space.problem.sizes.boundary_bytes) * mbs
    hop = nbytes / float(bandwidth(link.single, nbytes)) + link.latency_s
    return max(1, math.ceil(hop / max(min(fwd), 1e-9) - 1e-9))


def _layouts(state: SearchState, space: Space, fleet: _Fleet, shape: _Shape,
             geo: bool) -> list[PlanSpec]:
    """The plans of one (GPU type, stages, microbatch size, recompute, ZeRO, schedule) for
    every D whose D·C pipelines divide the microbatches."""
    P, m_total = len(shape.ranges), space.problem.job.global_batch // shape.mbs
    C = _pipelines_per_cell(space, fleet, shape, geo)
    out = []
    for D in range(1, m_total // C + 1):
        n_pipe = D * C
        if m_total % n_pipe:
            continue
        share = m_total // n_pipe
        tp = _stage_tp(space, fleet.gpu, shape, n_pipe, share)
        if tp is None:
            state.stats.no_fit += 1  # some stage fits on no GPU of this type at any TP
            continue
        parts = partitions(fleet.dcs, n_pipe * tp, P)
        if parts is not None:
            stages = _placed(space, fleet, shape.ranges, parts, (n_pipe, tp, share))
            if stages is not None:
                out.append(PlanSpec(shape.mbs, shape.schedule, shape.recompute, shape.zero,
                                    stages))
    return out


def _stage_tp(space: Space, gpu: str, shape: _Shape, n_pipe: int, share: int) -> int | None:
    """The smallest TP every stage fits at (None: some stage fits at none)."""
    tp, P = 1, len(shape.ranges)
    for s, (a, b) in enumerate(shape.ranges):
        in_flight = share if shape.schedule == "gpipe" else min(P - s, share)
        t = space.min_tp(gpu, shape.mbs, a, b, in_flight, shape.recompute, shape.zero, n_pipe)
        if t is None:
            return None
        tp = max(tp, t)
    return tp


def _placed(space: Space, fleet: _Fleet, ranges, parts, replicas: tuple[int, int, int]
            ) -> tuple[StageSpec, ...] | None:
    """The stages of partition ``parts`` (datacenter, stages), each of ``replicas`` (count,
    TP, microbatches each) in its datacenter's zones; None when they do not fit."""
    n_pipe, tp, share = replicas
    zones = _zones(space, fleet, parts, n_pipe, tp)
    if zones is None:
        return None
    rep = {z: ReplicaSpec(fleet.gpu, tp, z, share) for r, _ in parts
           for z, _ in space.zones_of[fleet.kinds[r]]}
    return tuple(StageSpec(a, b, tuple(map(rep.__getitem__, zs)))
                 for (a, b), zs in zip(ranges, zones, strict=True))


def _zones(space: Space, fleet: _Fleet, parts, n_pipe: int, tp: int
           ) -> tuple[tuple[str, ...], ...] | None:
    """Per stage of partition ``parts``, the zones of its ``n_pipe`` TP groups of ``tp`` GPUs
    (None when they do not fit); the same for every stage split, microbatch size and schedule,
    so worked out once per pool."""
    memo = space.stage_zones
    key = (fleet.gpu, parts, n_pipe, tp)
    if key not in memo:
        used: dict = {}
        out: list[tuple[str, ...]] | None = []
        for region, k in parts:
            for _ in range(k):
                zs = space.place_many(fleet.kinds[region], tp, n_pipe, used)
                if zs is None:
                    out = None
                    break
                out.append(tuple(zs))
            if out is None:
                break
        memo[key] = None if out is None else tuple(out)
    return memo[key]
