"""The plan space the planners walk: TP, microbatch and pipeline-depth options, layer splits,
the smallest TP that fits each stage (Sailor H1, H2), per-replica stage times, and resources."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from shoal.estimate.api import _state_bytes
from shoal.estimate.kernel import Worker, activation_parts, worker_memory
from shoal.estimate.tables import CostTables
from shoal.problem import Problem
from shoal.training.planners.allocate import PoolMemo


def tp_options(problem: Problem, gpu: str, tps: list[int]) -> list[int]:
    """TP degrees inside one node (H1) that split the attention and KV heads."""
    heads, kv = problem.model.num_heads, problem.model.kv_heads
    gpn = problem.gpus[gpu].gpus_per_node
    return [t for t in tps if t <= gpn and heads % t == 0 and kv % t == 0]


def mbs_options(problem: Problem, most: int = 32) -> list[int]:
    job = problem.job
    if job.microbatch_sizes:
        return sorted(m for m in job.microbatch_sizes if job.global_batch % m == 0)
    return [m for m in (1, 2, 4, 8, 16, 32, 64) if m <= most and job.global_batch % m == 0]


def balanced_split(n_layers: int, P: int) -> tuple[tuple[int, int], ...]:
    """Contiguous ranges of n_layers // P or one more layer, the shorter ones first (the first
    stage also holds the embedding lookup, the last the output head)."""
    base, extra = divmod(n_layers, P)
    sizes = [base] * (P - extra) + [base + 1] * extra
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return tuple((int(edges[i]), int(edges[i + 1])) for i in range(P))


@dataclass(frozen=True)
class Kind:
    """A resource kind the allocator counts: one GPU type in one region (zones merged, H6)."""

    gpu: str
    region: str


class Space:
    """Per-problem tables the planners reuse across pipeline depths, microbatch sizes and DP
    degrees: which TP fits each stage, and how long each replica takes per microbatch."""

    def __init__(self, problem: Problem, tb: CostTables, min_tp: dict | None = None,
                 splits: dict | None = None, memos: dict | None = None):
        self.problem = problem
        self.tb = tb
        self.grad_b, self.state_b = _state_bytes(problem)
        regions = sorted(set(problem.zone_region.values()))
        self.kinds: list[Kind] = []
        self.avail: dict[Kind, int] = {}
        self.zones_of: dict[Kind, list[tuple[str, int]]] = {}
        bf16 = problem.job.precision == "mixed-bf16"
        for r in regions:
            for g in sorted(problem.gpus):
                if bf16 and not problem.gpus[g].bf16:
                    continue  # no bf16 tensor cores
                zs = [(z, problem.avail[(g, z)]) for z in problem.zones
                      if problem.zone_region[z] == r and problem.avail.get((g, z), 0) > 0]
                if zs:
                    k = Kind(g, r)
                    self.kinds.append(k)
                    cap = sum(n for _, n in zs)
                    if g in problem.quotas:
                        cap = min(cap, problem.quotas[g])
                    self.avail[k] = cap
                    self.zones_of[k] = sorted(zs, key=lambda x: (-x[1], x[0]))
        self.tps = {g: tp_options(problem, g, tb.tps) for g in problem.gpus}
        # a TP group is one node, so one zone: no larger than the kind's largest zone holds
        self.kind_tps = {k: [t for t in self.tps[k.gpu] if t <= self.zones_of[k][0][1]]
                         for k in self.kinds}
        # smallest fitting TPs do not depend on GPU counts: a caller may share them
        self._min_tp: dict[tuple, Any] = min_tp if min_tp is not None else {}
        self._zone_pools: list[tuple[str, np.ndarray]] | None = None
        self.splits: dict = splits if splits is not None else {}  # zorse.split's, by node list
        # allocations and zone placements reused on smaller pools of the same kinds and prices
        # (PoolMemo, build_spec); a caller may share them across pools
        # per kind, its cheapest zone's USD per GPU-hour
        self.prices = tuple(min(problem.prices[(k.gpu, z)] for z, _ in self.zones_of[k])
                            for k in self.kinds)
        # this pool's zone placements of whole stages (``atlas._zones``), by their layout
        self.stage_zones: dict = {}
        memos = memos if memos is not None else {}
        # layer re-splits by the stages' slowest (GPU, TP) (``auto.shapes.rebalanced``): by GPU type,
        # not by pool
        self.resplits: dict = memos.setdefault("re-splits", {})
        self.alloc_memo, self.spec_memo = memos.setdefault(
            (tuple(self.kinds), self.prices, tuple(max(self.kind_tps[k], default=0)
                                                   for k in self.kinds)), (PoolMemo(), {}))
        # each stage's options (``sailor.stage_options``), by the kinds and their TPs
        self.stage_opts: dict = memos.setdefault(
            ("stage options", tuple(self.kinds), tuple(tuple(self.kind_tps[k]) for k in self.kinds)),
            {})
        # which zones hold each kind: what links the pool's plans can use
        self.zone_sets = tuple(tuple(sorted(z for z, _ in self.zones_of[k])) for k in self.kinds)
        # ``auto.Bounds``' parts that depend on the kinds and their zones, not on GPU counts
        self.bound_memo: dict = memos.setdefault(("bounds", tuple(self.kinds), self.zone_sets),
                                                 {})
        # the allocation programs' fronts are computed for the largest pool the memo serves
        self.alloc_memo.fronts.raise_ceiling(
            np.array([self.avail[k] for k in self.kinds], dtype=np.int64))

    def zone_pools(self) -> list[tuple[str, np.ndarray]]:
        """When the GPUs are in more than one zone: per zone, its GPUs per kind (0 for kinds
        of other zones), as the allocator counts them."""
        if self._zone_pools is None:
            zones = sorted({z for k in self.kinds for z, _ in self.zones_of[k]})
            self._zone_pools = [] if len(zones) < 2 else [
                (z, np.array([dict(self.zones_of[k]).get(z, 0) for k in self.kinds],
                             dtype=np.int64)) for z in zones]
        return self._zone_pools

    def stage_time(self, gpu: str, tp: int, mbs: int, a: int, b: int, recompute: bool) -> float:
        """Forward + backward seconds of one microbatch of layers [a, b) on one replica."""
        cum = self.tb.cum_step(gpu, tp, mbs, recompute)
        return float(cum[b] - cum[a]) * self.problem.timing.compute_scale

    def grad_bytes(self, a: int, b: int) -> float:
        """Bytes of one replica's gradients of layers [a, b)."""
        return float(self.tb.cum_params[b] - self.tb.cum_params[a]) * self.grad_b

    def min_tp(self, gpu: str, mbs: int, a: int, b: int, in_flight: int, recompute: bool,
               zero: int, dp: int) -> int | None:
        """Smallest TP for which a worker holding layers [a, b) fits (H2), or None."""
        t = int(self.min_tp_table(gpu, mbs, in_flight, recompute, zero, dp)[a, b])
        return None if t < 0 else self.tps[gpu][t]

    def min_tp_table(self, gpu: str, mbs: int, in_flight: int, recompute: bool, zero: int,
                     dp: int) -> np.ndarray:
        """``min_tp`` of every layer range [a, b) as its position in ``tps[gpu]`` (-1: none
        fits), kept."""
        # replicas shard nothing without ZeRO: the table is the same for every count
        key = (gpu, mbs, in_flight, recompute, zero, max(dp, 1) if zero else 1)
        table = self._min_tp.get(key)
        if table is None:
            table = self._min_tp[key] = self._smallest_fitting_tps(*key)
        return table

    def _smallest_fitting_tps(self, gpu: str, mbs: int, in_flight: int, recompute: bool,
                              zero: int, dp: int) -> np.ndarray:
        """``min_tp`` for every layer range [a, b) at once (the kernel's memory model
        broadcasts): per (a, b), the position in ``tps[gpu]`` of the smallest TP that fits, or
        -1 (entries with a >= b are not read)."""
        tps = self.tps[gpu]
        L = len(self.tb.cum_params) - 1
        if not tps:
            return np.full((L + 1, L + 1), -1, dtype=np.int8)
        # the bytes that do not depend on the microbatches in flight, per (a, b, TP), once
        # per (GPU, microbatch size, recompute, ZeRO, replicas): the tables differ only there
        parts_key = ("memory parts", gpu, mbs, recompute, zero, dp)
        parts = self._min_tp.get(parts_key)
        if parts is None:
            parts = self._min_tp[parts_key] = self._memory_parts(gpu, mbs, recompute, zero, dp)
        fixed, per_mb, once = parts
        act = (per_mb * float(in_flight) + once) * self.problem.memory.activation_factor
        fits = fixed + act <= self.problem.gpus[gpu].memory_bytes
        return np.where(fits.any(axis=-1), fits.argmax(axis=-1), -1).astype(np.int8)

    def _memory_parts(self, gpu: str, mbs: int, recompute: bool, zero: int, dp: int):
        """Per (a, b, TP position): the framework, model states and buffers (summed as the
        estimator sums them), and ``kernel.activation_parts``."""
        tb, mem = self.tb, self.problem.memory
        L = len(tb.cum_params) - 1
        ls, le = np.indices((L + 1, L + 1))
        ls, le = ls[..., None], le[..., None]
        t = np.array([tb.ti(tp) for tp in self.tps[gpu]])
        gi = tb.gi(gpu)
        w = Worker(gi, ls, le, t, float(mbs), np.bool_(recompute))
        states, buffers, _ = worker_memory(tb, mem, self.state_b, w, 0.0, np.int64(zero),
                                           float(max(dp, 1)))
        per_mb, once = activation_parts(tb, w)
        return mem.framework_bytes + states + buffers, per_mb, once

    def free(self, kind: Kind, zone: str, used: dict[tuple[str, str], int]) -> int:
        """GPUs of ``kind``'s type left in ``zone`` after ``used``."""
        return dict(self.zones_of[kind]).get(zone, 0) - used.get((kind.gpu, zone), 0)

    def place(self, kind: Kind, tp: int, used: dict[tuple[str, str], int],
              prefer: str | None = None) -> str | None:
        """A zone of ``kind``'s region with ``tp`` free GPUs of its type (a TP group stays in
        one node, so in one zone): ``prefer`` if it has room, else the zone with the most free
        GPUs."""
        best, free_best = None, -1
        for z, n in self.zones_of[kind]:
            free = n - used.get((kind.gpu, z), 0)
            if free >= tp and (z == prefer or free > free_best):
                best, free_best = z, free
                if z == prefer:
                    break
        if best is not None:
            used[(kind.gpu, best)] = used.get((kind.gpu, best), 0) + tp
        return best

    def place_many(self, kind: Kind, tp: int, n: int, used: dict[tuple[str, str], int]
                   ) -> list[str] | None:
        """The zones of ``n`` TP groups of ``tp`` GPUs placed one after another as ``place``
        places them (each in the zone with the most free GPUs), counted in ``used``; None (and
        ``used`` partly filled) when they do not all fit."""
        zones = self.zones_of[kind]
        if n == 0:
            return []
        if len(zones) == 1:
            z = zones[0][0]
            k = (kind.gpu, z)
            if zones[0][1] - used.get(k, 0) < n * tp:
                return None
            used[k] = used.get(k, 0) + n * tp
            return [z] * n
        free = [m - used.get((kind.gpu, z), 0) for z, m in zones]
        out = []
        for _ in range(n):
            i = max(range(len(free)), key=free.__getitem__)  # the first of the most free
            if free[i] < tp:
                return None
            free[i] -= tp
            out.append(zones[i][0])
        for (z, m), f in zip(zones, free, strict=True):
            if m - f != used.get((kind.gpu, z), 0):
                used[(kind.gpu, z)] = m - f
        return out


def zero_stages(allowed) -> list[int]:
    """Of the ZeRO stages a job allows, those worth planning: the highest up to 2 (less memory,
    never slower), and 3 if allowed (less memory again, but it gathers weights every
    microbatch)."""
    out = [max((z for z in allowed if z <= 2), default=None)] + ([3] if 3 in allowed else [])
    return [z for z in out if z is not None]
