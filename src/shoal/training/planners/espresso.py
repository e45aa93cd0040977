"""Espresso (Zhou et al., INFOCOM 2025): the cheapest GPU mix and stage placement that meets a
training-time SLO.

Plan shape: PP degree k, DP degree d; each stage runs d replicas of one *unit* (a GPU type in one
region at one TP degree), so a plan is a multiset of k units (the allocation N) put in an order
with a layer range per stage (the placement G).

Allocation (Alg. 1, Eq. 1-7). One cost tree per (recompute, ZeRO, microbatch size, d, k). A node
is a partial allocation; children add y = 0..k-s stages of the next unit in a fixed unit order,
so every multiset is visited once. Nodes are popped best-first by C_upper (Eq. 4): the cheapest
homogeneous completion under the time model ``_Tree.t_lower``. Pruning: boundary (BP: d in
powers of two up to the microbatches and GPUs, k from the stages the layers need on the GPU
type that needs fewest), time and capacity (TCP: even the fastest completion misses the
per-iteration SLO, or the largest-memory completion cannot hold the model), cost (CP: a lower
bound of every completion's cost is above the cheapest feasible plan so far). Complete
allocations go to the stage placer, whose candidates shoal's estimator costs; the incumbent is
the cheapest one that fits in memory and meets every constraint (the SLO as
``constraints.deadline``: z iterations within T_SLO; total cost = z x cost per iteration).

Placement (Alg. 2, Eq. 8-10). For every stage-0 size l_s0: stage 0 goes to the unit with the
smallest compute-memory ratio CMR = F / M x alpha among units that hold l_s0 layers; each later
stage s to the smallest-CMR unit left, with l_c the most layers whose gradient all-reduce still
overlaps the earlier stages' backward passes (window T_s^ol = T^b_{s-1} + T_{s-1}^ol, T_0^ol =
stage 0's all-reduce), and l = min(l_m, l_f) layers; layers left over go one at a time to the
stage (not stage 0) with the most room. Every l_s0 candidate is costed, the best kept.

Choices where the paper is ambiguous or garbled (see the module tests):
- r_t, the "actual computing capability", is one replica's full-model microbatch rate from
  shoal's layer profile (measured or analytic), not peak FLOP/s x a fixed efficiency.
- alpha(t, s) = max(l_m, l_c) / min(l_m, l_c); at stage 0, l_c = l_s0.
- Eq. 5 (T = W / (p sum r)) ignores communication, and so is no bound: with 2.5 Gbps links a
  pipeline hand-off costs as much as a stage's compute. ``t_lower`` is a true lower bound of the
  estimator's iteration time that counts the cheapest hand-off per stage; C_upper, TCP and CP
  all use it. CP bounds every completion (the cheapest price and fastest rate for the stages
  left, and price over rate at least the best unit's), instead of the paper's
  layers-that-fit estimate, which can prune the optimum.
- The paper's k_upper (stages needed on the smallest-memory GPU) is not used: it cuts off
  plans whose extra stages an SLO needs (LLaMA-1.3B in examples/espresso-llama-1.3b.yaml needs
  4 stages with recompute, where memory asks for 3); the time and cost bounds cut those trees.
- TP: Espresso fixes TP = 1. A unit's TP is the smallest TP (inside one node) at which its GPU
  holds the last stage of a layer-balanced split into k (one microbatch in flight: the least
  demanding stage; the placer's l_m limits every stage to what fits); with one GPU per node
  that is TP = 1, the paper's setting.
- Besides the CMR candidates, each stage order they produce is also costed with the layer split
  that minimises its bottleneck stage under memory (bisection, greedy fill): the CMR split alone
  can miss an SLO that the same GPUs meet when balanced.
- The SLO is per job (z x T_iter <= T_SLO), as in the paper's Eq. 2 (its code compares one
  iteration's time).
- Homogeneous allocations are placed first in every tree to seed the incumbent, as Espresso's
  code does (under CP when an incumbent is already known: ``auto`` runs Espresso after its own
  search).
- Objective: the tree minimises cost. Under another objective CP is off (the cost bound says
  nothing about throughput) and the placed plans are ranked by that objective.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec
from shoal.estimate.kernel import Worker, p2p_s, ring_allreduce_s, worker_memory
from shoal.training.planners.build import shares
from shoal.training.planners.common import cannot_beat, score
from shoal.training.planners.space import Space, balanced_split
from shoal.training.planners.strategy import Context, Proposals, SearchState


@dataclass(frozen=True)
class Unit:
    """What one stage's d replicas are: a resource kind at a TP degree."""

    kind: int  # index into Space.kinds
    gpu: str
    tp: int
    rate: float  # full-model microbatches per second of one replica (r_t)
    price: float  # USD per second of one replica (tp GPUs)
    memory: float  # bytes of one replica (tp GPUs)


class _Tree:
    """Tables of one (recompute, ZeRO, microbatch size, d, k) cost tree, with the CMR placer."""

    def __init__(self, space: Space, mbs: int, recompute: bool, zero: int, d: int, k: int):
        self.space, self.mbs, self.recompute, self.zero, self.d, self.k = (
            space, mbs, recompute, zero, d, k)
        p = space.problem
        self.L = p.n_layers
        self.total = p.job.global_batch // mbs
        self.m = self.total / d  # microbatches per pipeline
        tb = space.tb
        self.units: list[Unit] = []
        last = balanced_split(self.L, k)[-1]
        for ki, kind in enumerate(space.kinds):
            tp = space.min_tp(kind.gpu, mbs, last[0], last[1], 1, recompute, zero, d)
            if tp is None or tp * d > space.avail[kind]:
                continue
            cum = space.tb.cum_step(kind.gpu, tp, mbs, recompute)
            price = tp * min(p.prices[(kind.gpu, z)] for z, _ in space.zones_of[kind]) / 3600.0
            self.units.append(Unit(ki, kind.gpu, tp, 1.0 / (float(cum[-1]) * p.timing.compute_scale),
                                   price, tp * p.gpus[kind.gpu].memory_bytes))
        # the least over GPU types (attention, flash or not, differs by GPU)
        states, buffers, act = worker_memory(
            tb, p.memory, space.state_b,
            Worker(np.arange(len(tb.gpus)), 0, self.L, 0, float(mbs), np.bool_(recompute)), 1.0,
            np.int64(zero), float(d))
        self.mem_lower = float(np.min(states + buffers + act)) + k * p.memory.framework_bytes
        self._lm: dict = {}
        self._ring: dict = {}
        self._handoff: dict = {}
        # the cheapest hand-off between two of the tree's units: a bound for every stage
        self.sigma = min((self.handoff(u, v) for u in self.units for v in self.units),
                         default=0.0) if k > 1 else 0.0
        self.r_min = min((u.rate for u in self.units), default=0.0)

    # ---- the cost model (Eq. 5-7, with the pipeline's hand-offs) ------------------------------
    def t_lower(self, rate: float) -> float:
        """A lower bound of the iteration time of a pipeline whose k stages' full-model rates
        sum to ``rate``. Eq. 5 ignores communication; here each stage's microbatch also pays its
        hand-offs (ends one, interior stages two of the cheapest ``sigma``). With per-stage
        times t_s >= c_s + sigma_s and sum_s r_s c_s = 1, the bottleneck is at least
        (1 + sum_s r_s sigma_s) / R; 1F1B takes at least m bottlenecks plus the k - 1 other
        stages' hand-offs."""
        if rate <= 0:
            return math.inf
        if self.k == 1:
            return self.m / rate
        sig = self.sigma
        t_star = 1.0 / rate + sig * (1.0 + (self.k - 2) * self.r_min / rate)
        return self.m * t_star + (self.k - 1) * sig

    # ---- per-unit tables for the placer -------------------------------------------------------
    def max_layers(self, u: Unit, s: int, a: int) -> int:
        """l_m: most layers starting at ``a`` that unit ``u`` holds as stage ``s`` (1F1B keeps
        k - s microbatches in flight there)."""
        key = (u, s, a)
        if key not in self._lm:
            sp, p = self.space, self.space.problem
            b = np.arange(a + 1, self.L + 1)
            w = Worker(sp.tb.gi(u.gpu), a, b, sp.tb.ti(u.tp), float(self.mbs),
                       np.bool_(self.recompute))
            states, buffers, act = worker_memory(
                sp.tb, p.memory, sp.state_b, w, float(min(self.k - s, self.m)),
                np.int64(self.zero), float(self.d))
            fit = p.memory.framework_bytes + states + buffers + act <= p.gpus[u.gpu].memory_bytes
            self._lm[key] = int(np.argmin(fit)) if not fit.all() else len(b)
        return self._lm[key]

    def ring(self, u: Unit, a: int) -> np.ndarray:
        """All-reduce seconds of layers [a, a+1), [a, a+2), ... over the stage's d replicas."""
        key = (u, a)
        if key not in self._ring:
            sp = self.space
            tb = sp.tb
            if self.d < 2:
                self._ring[key] = np.zeros(self.L - a)
            else:
                z = tb.zones.index(sp.zones_of[sp.kinds[u.kind]][0][0])
                gi = tb.gi(u.gpu)
                rid = tb.link_id(gi, z, gi, z, tb.ti(u.tp))
                gbytes = (tb.cum_params[a + 1:] - tb.cum_params[a]) * sp.grad_b
                self._ring[key] = ring_allreduce_s(tb, rid, self.d, gbytes,
                                                   sp.problem.timing.sync_scale)
        return self._ring[key]

    def bwd_s(self, u: Unit, a: int, b: int) -> float:
        """T^b: the stage's backward passes over the iteration."""
        tb = self.space.tb
        cb = tb.cum_b[tb.gi(u.gpu), tb.ti(u.tp), tb.mi(self.mbs)]
        return float(cb[b] - cb[a]) * self.space.problem.timing.compute_scale * self.m

    # ---- Alg. 2 --------------------------------------------------------------------------------
    def place(self, alloc: tuple[int, ...]) -> list[PlanSpec]:
        """Stage placements of allocation ``alloc`` (stages per unit), one per stage-0 size."""
        k, L = self.k, self.L
        pool = [u for u, n in zip(self.units, alloc, strict=True) for _ in range(n)]
        rate_sum = sum(u.rate for u in pool)
        lf = {u: max(1, int(u.rate / rate_sum * L)) for u in pool}
        cmr = {u: u.rate / u.memory for u in pool}
        l_max = min(max(self.max_layers(u, 0, 0) for u in pool), L - (k - 1))
        out: list[PlanSpec] = []
        orders: list[tuple[Unit, ...]] = []
        for l0 in range(1, l_max + 1):
            fits0 = [u for u in dict.fromkeys(pool) if self.max_layers(u, 0, 0) >= l0]
            if not fits0:
                break
            u0 = min(fits0, key=lambda u: cmr[u] * self.max_layers(u, 0, 0) / l0)
            left = list(pool)
            left.remove(u0)
            stages = [[u0, l0, l0]]  # unit, layers, room (min(l_c, l_m))
            a, t_ol, prev_b = l0, float(self.ring(u0, 0)[l0 - 1]), self.bwd_s(u0, 0, l0)
            ok = True
            for s in range(1, k):
                t_ol += prev_b
                rest = k - s - 1
                best = None
                for u in dict.fromkeys(left):
                    lm = min(self.max_layers(u, s, a), L - a - rest)
                    if lm < 1:
                        continue
                    lc = max(1, int(np.searchsorted(self.ring(u, a), t_ol, side="right")))
                    c = cmr[u] * max(lm, lc) / min(lm, lc)
                    if best is None or c < best[0]:
                        best = (c, u, lm, lc)
                if best is None:
                    ok = False
                    break
                _, u, lm, lc = best
                n = min(lm, lf[u])
                left.remove(u)
                stages.append([u, n, min(lm, lc) if s < k - 1 else lm])
                prev_b = self.bwd_s(u, a, a + n)
                a += n
            if not ok:
                continue
            order = tuple(st[0] for st in stages)
            if order not in orders:
                orders.append(order)
            if self._cover(stages):
                out.append(self._spec(stages))
        for order in orders:
            stages = self.balanced(order)
            if stages is not None:
                out.append(self._spec(stages))
        return out

    def handoff(self, u: Unit, v: Unit) -> float:
        """Seconds one microbatch's hand-off from a stage of ``u`` to one of ``v`` costs each of
        them per direction, as the estimator counts it (send plus the blocking receive share)."""
        key = (u, v)
        if key not in self._handoff:
            sp, tc = self.space, self.space.problem.timing
            tb = sp.tb
            zu = tb.zones.index(sp.zones_of[sp.kinds[u.kind]][0][0])
            zv = tb.zones.index(sp.zones_of[sp.kinds[v.kind]][0][0])
            lid = tb.link_id(tb.gi(u.gpu), zu, tb.gi(v.gpu), zv, tb.ti(u.tp))
            self._handoff[key] = float(p2p_s(tb, tc, tb.mi(self.mbs), lid)) * (1.0 + tc.recv_fraction)
        return self._handoff[key]

    def balanced(self, order: tuple[Unit, ...]) -> list[list] | None:
        """The contiguous split of the layers over stages in ``order`` with the smallest
        bottleneck (forward + backward seconds per microbatch plus the stage's hand-offs) that
        fits every stage's memory: bisection on the bottleneck, stages filled greedily (taking
        the most layers under the bound is optimal for a fixed order, since memory and time
        grow with a stage's range)."""
        k, L = self.k, self.L
        tb = self.space.tb
        scale = self.space.problem.timing.compute_scale
        cums = [tb.cum_step(u.gpu, u.tp, self.mbs, self.recompute) * scale for u in order]
        hand = [(self.handoff(order[s - 1], u) if s else 0.0)
                + (self.handoff(u, order[s + 1]) if s < k - 1 else 0.0)
                for s, u in enumerate(order)]

        def fill(bound: float) -> list[int] | None:
            a, sizes = 0, []
            for s, (u, cum) in enumerate(zip(order, cums, strict=True)):
                rest = k - s - 1
                most = min(self.max_layers(u, s, a), L - a - rest) if a < L else 0
                room = bound - hand[s]
                n = int(np.searchsorted(cum[a + 1:a + most + 1] - cum[a], room, side="right"))
                if s == k - 1:
                    n = L - a if L - a <= most and cum[L] - cum[a] <= room else 0
                if n < 1:
                    return None
                sizes.append(n)
                a += n
            return sizes if a == L else None

        times = np.unique(np.concatenate(
            [(c[None, 1:] - c[:-1, None]).ravel() + h for c, h in zip(cums, hand, strict=True)]))
        lo, hi = 0, len(times) - 1
        if fill(times[hi]) is None:
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if fill(times[mid]) is None:
                lo = mid + 1
            else:
                hi = mid
        return [[u, n, n] for u, n in zip(order, fill(times[lo]), strict=True)]

    def _cover(self, stages: list[list]) -> bool:
        """AdjustToCoverAllLayers: leftover layers one at a time to the stage other than stage 0
        with the most room (fewest layers past min(l_c, l_m)) that still has memory for one
        more; False when some layers find no stage."""
        short = self.L - sum(st[1] for st in stages)
        if short < 0:
            return False
        heap = [(st[1] - st[2], i) for i, st in enumerate(stages) if i > 0]
        heapq.heapify(heap)
        while short > 0:
            while heap:
                _, i = heapq.heappop(heap)
                st = stages[i]
                a = sum(x[1] for x in stages[:i])
                if self.max_layers(st[0], i, a) > st[1]:
                    break
            else:
                return False
            st[1] += 1
            short -= 1
            heapq.heappush(heap, (st[1] - st[2], i))
        return True

    def _spec(self, stages: list[list]) -> PlanSpec:
        sp = self.space
        m = shares(self.total, self.d)
        used: dict[tuple[str, str], int] = {}
        # the pipelines start in the zone holding most GPUs of the plan's kinds, and each
        # stage of a pipeline goes to its previous stage's zone where that has room: the
        # hand-offs stay inside a zone where they can (the zone with most free GPUs, stage by
        # stage, alternates between equal zones)
        held: dict[str, int] = {}
        for k in dict.fromkeys(u.kind for u, _, _ in stages):
            for z, n in sp.zones_of[sp.kinds[k]]:
                held[z] = held.get(z, 0) + n
        last = [max(held, key=held.__getitem__) if held else None] * self.d
        out, a = [], 0
        for u, n, _ in stages:
            kind = sp.kinds[u.kind]
            reps = []
            for j in range(self.d):
                z = sp.place(kind, u.tp, used, last[j])
                if z is None:
                    return None
                last[j] = z
                reps.append(ReplicaSpec(u.gpu, u.tp, z, m[j]))
            out.append(StageSpec(a, a + n, tuple(reps)))
            a += n
        return PlanSpec(self.mbs, "1f1b", self.recompute, self.zero, tuple(out))


def k_lower(space: Space, mbs: int, recompute: bool, zero: int, d: int) -> int:
    """BP for the PP degree: the stages needed when the layers are packed greedily on the
    GPU type that needs fewest (one microbatch in flight; each type at the smallest TP that
    holds its largest single layer). Fewer stages cannot hold the model."""
    p = space.problem
    L = p.n_layers
    counts = []
    for g in sorted({k.gpu for k in space.kinds}):
        need = [space.min_tp(g, mbs, i, i + 1, 1, recompute, zero, d) for i in range(L)]
        if any(t is None for t in need):
            continue
        tp = max(need)

        def fits(a: int, b: int, g=g, tp=tp) -> bool:
            t = space.min_tp(g, mbs, a, b, 1, recompute, zero, d)
            return t is not None and t <= tp

        a, n = 0, 0
        while a < L:
            b = a + 1
            while b < L and fits(a, b + 1):
                b += 1
            a, n = b, n + 1
        counts.append(n)
    return min(counts, default=1)


def propose(ctx: Context) -> Proposals:
    """Espresso's allocator and CMR placer (module docstring)."""
    return _Search(ctx, every_order=False).run()


def propose_every_order(ctx: Context) -> Proposals:
    """The reference for Espresso's space: every allocation the trees reach, each in every
    distinct stage order with its bottleneck-optimal layer split (``_Tree.balanced``). No
    boundary pruning; only the valid lower bounds (time and cost) cut branches, so under the
    min-cost objective it returns the space's minimum up to the split rule."""
    return _Search(ctx, every_order=True).run()


class _Search:
    """One run of Espresso over its trees: the SLO per iteration, the trees, and the
    allocations already placed."""

    def __init__(self, ctx: Context, every_order: bool):
        self.ctx, self.state, self.space = ctx, ctx.state, ctx.space
        self.every_order = every_order
        cons = ctx.state.constraints
        self.z = cons.deadline.iterations if cons.deadline else 1
        self.slo_iter = math.inf
        if cons.deadline:
            self.slo_iter = cons.deadline.within / cons.deadline.iterations
        if cons.min_iters_per_s:
            self.slo_iter = min(self.slo_iter, 1.0 / cons.min_iters_per_s)
        self.prune_cost = ctx.objective == "min-cost"
        self.placed: set = set()

    def best_cost(self) -> float:
        inc = self.state.incumbent
        return self.z * inc.cost_usd if (self.prune_cost and inc is not None) else math.inf

    def hopeless(self, t_low: float, usd_low: float) -> bool:
        """Under the other objectives, whether plans of at least ``t_low`` seconds and
        ``usd_low`` USD per iteration cannot beat the incumbent (min-cost: ``best_cost``)."""
        inc, objective = self.state.incumbent, self.ctx.objective
        if self.prune_cost or inc is None:
            return False
        key = t_low if objective == "max-throughput" else t_low * usd_low
        return cannot_beat(key, t_low, score(inc, objective)[0], inc.iteration_time_s)

    def trees(self) -> list[_Tree]:
        """One cost tree per (recompute, ZeRO, microbatch size, d, k) that some unit holds."""
        space, ctx = self.space, self.ctx
        problem, job = space.problem, space.problem.job
        n_gpus = sum(space.avail.values())
        trees: list[_Tree] = []
        for recompute in sorted(set(job.recompute)):
            for zero in sorted(set(job.zero_stage)):
                for mbs in ctx.mbs_values:
                    d = 1
                    while d <= min(job.global_batch // mbs, n_gpus):
                        most = min(ctx.max_stages or problem.n_layers, problem.n_layers,
                                   n_gpus // d)
                        lo = 1 if self.every_order else k_lower(space, mbs, recompute, zero, d)
                        for k in range(lo, most + 1):
                            tree = _Tree(space, mbs, recompute, zero, d, k)
                            if tree.units:
                                trees.append(tree)
                            else:  # no GPU type holds its layers at any TP
                                self.state.stats.no_fit += 1
                        d *= 2
        return trees

    def placements(self, tree: _Tree, alloc: tuple[int, ...]) -> list[PlanSpec]:
        """The plans of allocation ``alloc`` of ``tree`` (none when placed before)."""
        key = (id(tree), alloc)
        if key in self.placed:
            return []
        self.placed.add(key)
        if self.every_order:
            pool = [u for u, n in zip(tree.units, alloc, strict=True) for _ in range(n)]
            splits = (tree.balanced(o) for o in _orders(pool))
            specs = [tree._spec(st) for st in splits if st is not None]
        else:
            specs = tree.place(alloc)
        return [s for s in dict.fromkeys(specs) if s is not None]

    def homogeneous(self, tree: _Tree, within_slo: bool):
        """(unit, allocation): every stage on that unit."""
        for i, u in enumerate(tree.units):
            if tree.k * tree.d * u.tp <= self.space.avail[self.space.kinds[u.kind]] and (
                    tree.t_lower(tree.k * u.rate) <= self.slo_iter) == within_slo:
                yield u, tuple(tree.k if j == i else 0 for j in range(len(tree.units)))

    def run(self) -> Proposals:
        state, z = self.state, self.z
        trees = self.trees()
        # seed: every homogeneous allocation that the pool holds and the SLO allows, unless its
        # cost bound (CP, as ``_walk`` takes it) is above the cheapest plan already found (one
        # the caller's search brings)
        for tree in trees:
            for u, alloc in self.homogeneous(tree, True):
                if z * tree.t_lower(tree.k * u.rate) * tree.d * tree.k * u.price > self.best_cost():
                    state.stats.pruned += 1
                    continue
                if specs := self.placements(tree, alloc):
                    yield specs
            if state.out_of_time():
                return
        if self.prune_cost:  # the cheapest bound first
            trees.sort(key=lambda t: min(t.t_lower(t.k * u.rate) * t.k * t.d * u.price
                                         for u in t.units))
        else:  # the fastest bound first: the incumbent the others are pruned against
            trees.sort(key=lambda t: t.t_lower(t.k * max(u.rate for u in t.units)))
        for tree in trees:
            for alloc in _walk(state, tree, (z, self.slo_iter), self.best_cost, self.hopeless):
                if specs := self.placements(tree, alloc):
                    yield specs
            if state.out_of_time():
                return
        if not state.feasible:  # nothing meets the SLO: cost the rest, so the error names the
            for tree in trees:  # fastest
                for _, alloc in self.homogeneous(tree, False):
                    if specs := self.placements(tree, alloc):
                        yield specs
                if state.out_of_time():
                    return


def _orders(pool: list[Unit]):
    """Every distinct order of a multiset of units."""
    if not pool:
        yield ()
        return
    for u in dict.fromkeys(pool):
        rest = list(pool)
        rest.remove(u)
        for tail in _orders(rest):
            yield (u, *tail)


def _walk(ev: SearchState, tree: _Tree, slo: tuple[int, float], best_cost,
          hopeless=lambda t, usd: False):
    """Alg. 1 on one tree: best-first over partial allocations by C_upper, yielding each
    complete allocation the bounds leave (``slo``: z iterations, and the seconds an iteration
    may take). ``hopeless(t, usd)``: whether plans of at least t seconds and usd per iteration
    cannot beat the best plan under the search's other objectives (Espresso's own prunes by
    cost alone)."""
    z, slo_iter = slo
    space, units, k, d = tree.space, tree.units, tree.k, tree.d
    U = len(units)
    kinds_of = [u.kind for u in units]
    # suffix tables over the unit order: best rate, memory and price among units >= t
    max_rate = [max((u.rate for u in units[t:]), default=0.0) for t in range(U + 1)]
    max_mem = [max((u.memory for u in units[t:]), default=0.0) for t in range(U + 1)]
    min_price = [min((u.price for u in units[t:]), default=math.inf) for t in range(U + 1)]
    best_ratio = [min((u.price / u.rate for u in units[t:]), default=math.inf)
                  for t in range(U + 1)]

    def c_upper(alloc, s, t, rate, price, mem, used) -> float:
        if s == k:
            tl = tree.t_lower(rate)
            return z * tl * d * price if tl <= slo_iter and mem >= tree.mem_lower else math.inf
        best = math.inf
        for j in range(t, U):
            u = units[j]
            need = (k - s) * d * u.tp
            if used.get(u.kind, 0) + need > space.avail[space.kinds[u.kind]]:
                continue
            r = rate + (k - s) * u.rate
            tl = tree.t_lower(r)
            if tl > slo_iter or mem + (k - s) * u.memory < tree.mem_lower:
                continue
            best = min(best, z * tl * d * (price + (k - s) * u.price))
        return best

    counter = itertools.count()
    root = (tuple([0] * U), 0, 0, 0.0, 0.0, 0.0, {})
    heap = [(c_upper(*root), next(counter), root)]
    while heap:
        if ev.out_of_time():
            return
        _, _, (alloc, s, t, rate, price, mem, used) = heapq.heappop(heap)
        rest = k - s
        best_rate = rate + rest * max_rate[t]
        if tree.t_lower(best_rate) > slo_iter or mem + rest * max_mem[t] < tree.mem_lower:
            ev.stats.pruned += 1  # TCP
            continue
        bound = z * tree.t_lower(best_rate) * d * (price + (rest * min_price[t] if rest else 0.0))
        if rest:  # price over rate of the whole pipeline is at least the smallest unit's
            ratio = min(price / rate if rate > 0 else math.inf, best_ratio[t])
            bound = max(bound, z * tree.total * (ratio + tree.sigma * (price + rest * min_price[t])))
        if bound > best_cost() or hopeless(tree.t_lower(best_rate), bound / z):
            ev.stats.pruned += 1  # CP
            continue
        if s == k:
            yield alloc
            continue
        if t >= U:
            continue
        u = units[t]
        free = space.avail[space.kinds[u.kind]] - used.get(u.kind, 0)
        for y in range(0, min(rest, free // (d * u.tp)) + 1):
            child_alloc = alloc[:t] + (y,) + alloc[t + 1:]
            child_used = dict(used)
            if y:
                child_used[kinds_of[t]] = child_used.get(kinds_of[t], 0) + y * d * u.tp
            child = (child_alloc, s + y, t + 1, rate + y * u.rate, price + y * u.price,
                     mem + y * u.memory, child_used)
            if s + y < k and t + 1 >= U:
                continue
            cu = c_upper(*child)
            if cu == math.inf:
                ev.stats.pruned += 1
                continue
            heapq.heappush(heap, (cu, next(counter), child))
