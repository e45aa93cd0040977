"""Zorse (§4.2-4.3): GPU groups from a min-k cut of the bandwidth graph, pipeline parallelism
across groups, data parallelism (ZeRO) inside each, with mixed GPU types per group and uneven
microbatch shares.

Phase 1. The pool is a graph whose vertices are nodes (a node's GPUs share its fast intra-node
links, so they stay in one group) and whose edge weights are the bandwidths between them. SPLIT
(Saran & Vazirani; within 2 - 2/k of the optimal min k-cut) splits, k = 2, 3, ..., the component
whose Stoer-Wagner min cut is lightest, so one pass gives a partition for every k: data
parallelism stays on fast links and the pipeline crosses slow ones.

Phase 2, per partition. Each group's speed is the sum of its GPUs' full-model rates (from the
layer profile); layers are split over groups in proportion to speed (largest remainder, at least
one each); groups run in descending order of the bandwidth inside them (the first group's
all-gathers have nothing to hide behind); inside a group, one replica per GPU (no TP, as Zorse)
and microbatch shares in proportion to GPU speed. Every microbatch size, recompute and schedule
setting the job allows, with the highest ZeRO stage it allows up to 2 (Zorse runs ZeRO-2; a
higher stage never needs more memory and never updates slower) and ZeRO-3 if allowed, is costed
by shoal's estimator (asymmetric plans go through its event simulation,
``shoal.estimate.general``), in order of a lower bound (the busiest GPU's compute), skipping
plans whose bound cannot beat the best so far; the best under the objective wins.

Choices and limits:
- Graph vertices are nodes, not GPUs (Zorse's own groups never split a node). Where links tie
  (one zone at one bandwidth, as a scenario usually says), an edge between nodes of the same GPU
  type weighs 1% more, so the cut keeps types together (Zorse's Cluster B groups are its GPU
  types), and ties are broken by node order.
- Hand-off between groups: each group deals the iteration's microbatches to its GPUs in order
  of due time by their shares (``shoal.specs.plan.owners``), so every GPU receives work at the
  pace of its share. Zorse assigns the i-th finished microbatch to the GPU with the i-th most
  work left; with steady per-GPU rates both keep every GPU's queue in step with its share, and
  the static deal is what the runtime executes and the estimator simulates.
- The zorse schedule (Zorse §4.1: ministages taken round-robin over the groups, GPipe order,
  idle ministages, optimizer state and boundary activations in host memory;
  ``shoal.estimate.ministage``), where the job allows it (``schedule: zorse`` with recompute and
  ZeRO-2): every partition's plan also at each ministage count of MINISTAGES its shortest group
  allows, and at one layer per ministage there.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from shoal.errors import InfeasibleError
from shoal.estimate import general, ministage
from shoal.estimate.api import run_kernel
from shoal.estimate.encode import PlanSpec, ReplicaSpec, StageSpec, encode_specs, schedule_key
from shoal.jit import compiled
from shoal.problem import Problem
from shoal.training.planners.common import Candidate, cannot_beat
from shoal.training.planners.space import Space, zero_stages
from shoal.training.planners.strategy import Context, Proposals

SAME_TYPE_BONUS = 1.01
MINISTAGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)  # tried under the zorse schedule
MESSAGE = 64e6  # bytes at which link bandwidths are compared
# SPLIT's minimum cuts take O(n^3) time and an n x n matrix over the pool's nodes: pools of more
# nodes get no Zorse plans (benchmarks/NOTES.md, Strategies)
MAX_NODES = 1024


def nodes(space: Space) -> list[tuple[str, str, int]]:
    """(GPU type, zone, GPUs) per node of the pool, a zone's partial node last; under a quota
    on a GPU type (``pool.quotas``), that many of its GPUs, the largest zones' first."""
    p = space.problem
    out = []
    left = dict(p.quotas)
    for k in space.kinds:
        gpn = p.gpus[k.gpu].gpus_per_node
        for z, n in space.zones_of[k]:
            if k.gpu in left:
                n = min(n, left[k.gpu])
                left[k.gpu] -= n
            full, rest = divmod(n, gpn)
            out += [(k.gpu, z, gpn)] * full + ([(k.gpu, z, rest)] if rest else [])
    return out


def _bandwidth(space: Space, a: tuple[str, str, int], b: tuple[str, str, int]) -> float:
    return _link_bw(space.problem.network, a[1], b[1], a[0], b[0])


@lru_cache(maxsize=65536)
def _link_bw(network, za: str, zb: str, ga: str, gb: str) -> float:
    link = network.link(za, zb, ga, gb)
    t = float(link.transfer_time(MESSAGE)) - link.latency_s
    return MESSAGE / t if t > 0 else math.inf


def _intra(space: Space, gpu: str) -> float:
    """Bandwidth between the GPUs of one node of type ``gpu``."""
    p = space.problem
    return _intra_bw(p.network, gpu, p.gpus[gpu].intra_node_bw_Bps)


@lru_cache(maxsize=1024)
def _intra_bw(network, gpu: str, default_Bps: float) -> float:
    link = network.intra.get(gpu)
    if link is not None:
        t = float(link.transfer_time(MESSAGE)) - link.latency_s
        return MESSAGE / t if t > 0 else math.inf
    return default_Bps


def min_cut(W: np.ndarray) -> tuple[float, list[int]]:
    """Stoer-Wagner global minimum cut of the graph with symmetric weight matrix ``W`` (zero
    diagonal, at least two vertices): (cut weight, one side's vertex indices, sorted). Each
    phase grows a set by the most tightly connected vertex (ties: the lowest index); the last
    vertex's connection is a cut, and the last two are merged (``_phases``). O(n^3), dense."""
    n = len(W)
    cuts = np.empty(n - 1)
    merged_into, merged = np.empty((2, n - 1), dtype=np.int64)
    _phases(np.array(W, dtype=float), cuts, merged_into, merged, np.empty(n, np.int64),
            np.empty(n), np.empty(n, np.bool_))
    members = [[i] for i in range(n)]
    best, best_side = math.inf, [0]
    for cut, s, t in zip(cuts.tolist(), merged_into.tolist(), merged.tolist(), strict=True):
        if cut < best:
            best, best_side = cut, sorted(members[t])
        members[s] += members[t]
    return best, best_side


@compiled("f8[:, ::1], f8[::1], i8[::1], i8[::1], i8[::1], f8[::1], b1[::1]", hot=True)
def _phases(W, cuts, merged_into, merged, alive, conn, added):
    """``min_cut``'s phases, compiled: per phase its cut and the two vertices merged (the last
    into the one before it). Merges into ``W``. Scratch of n each: ``alive``, ``conn``,
    ``added`` (``shoal.jit``: a loop allocates no array)."""
    n = W.shape[0]
    for i in range(n):
        alive[i] = i
    for phase in range(n - 1):
        m = n - phase
        for i in range(m):
            conn[i] = W[alive[0], alive[i]]
            added[i] = False
        added[0] = True
        prev = last = 0
        for step in range(1, m):
            nxt = -1
            for i in range(m):
                if not added[i] and (nxt < 0 or conn[i] > conn[nxt]):
                    nxt = i
            prev, last = last, nxt
            added[nxt] = True
            if step < m - 1:
                for i in range(m):
                    conn[i] += W[alive[nxt], alive[i]]
        s, t = alive[prev], alive[last]
        cuts[phase], merged_into[phase], merged[phase] = conn[last], s, t
        for j in range(n):
            W[s, j] += W[t, j]
        for i in range(n):
            W[i, s] += W[i, t]
        W[s, s] = 0.0
        for i in range(last, m - 1):
            alive[i] = alive[i + 1]


def split(space: Space, vertices: list[tuple[str, str, int]],
          most: int | None = None) -> dict[int, list[list[int]]]:
    """SPLIT: k -> groups (vertex indices) for k = 1 .. min(most, vertices)."""
    n = len(vertices)
    W = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            w = _bandwidth(space, vertices[i], vertices[j])
            if vertices[i][0] == vertices[j][0]:
                w *= SAME_TYPE_BONUS
            W[i, j] = W[j, i] = w / 1e9
    parts = [list(range(n))]
    out = {1: [list(p) for p in parts]}
    cuts: dict[tuple[int, ...], tuple[float, list[int], list[int]]] = {}
    limit = min(most or n, n)
    for k in range(2, limit + 1):
        best = None
        for c in parts:
            if len(c) < 2:
                continue
            key = tuple(c)
            if key not in cuts:
                value, side = min_cut(W[np.ix_(c, c)])
                a = sorted(c[i] for i in side)
                cuts[key] = (value, a, sorted(set(c) - set(a)))
            value, a, b = cuts[key]
            if best is None or (value, min(c)) < (best[0], min(best[1])):
                best = (value, c, a, b)
        if best is None:
            break
        _, c, a, b = best
        parts = [p for p in parts if p is not c] + [a, b]
        parts.sort(key=min)
        out[k] = [list(p) for p in parts]
    return out


def _largest_remainder(weights: list[float] | np.ndarray, total: int,
                       floor: int = 0) -> list[int]:
    """Integers proportional to ``weights`` summing to ``total``, each at least ``floor``."""
    w = np.asarray(weights, dtype=float)
    left = total - floor * len(w)
    raw = w / w.sum() * left
    got = np.floor(raw).astype(np.int64)
    rem = left - int(got.sum())
    order = np.argsort(-(raw - got), kind="stable")
    got[order[:rem]] += 1
    return (got + floor).tolist()


def build(space: Space, vertices, groups: list[list[int]], mbs: int, recompute: bool, zero: int,
          schedule: str, memo: dict | None = None) -> PlanSpec | None:
    """The plan of one partition (module docstring, Phase 2), or None if it has more groups
    than layers or fewer microbatches than one per group. ``memo`` keeps, across calls, each
    group's inside bandwidth and each partition's layout and stages per (microbatch size,
    recompute): they do not depend on the ZeRO stage or the schedule."""
    memo = memo if memo is not None else {}
    key = ("stages", tuple(map(tuple, groups)), mbs, recompute)
    if key not in memo:
        got = layout(space, vertices, groups, mbs, recompute, memo)
        memo[key] = None if got is None else _stages(space, vertices, groups, mbs, got)
    stages = memo[key]
    return None if stages is None else PlanSpec(mbs, schedule, recompute, zero, stages)


def layout(space: Space, vertices, groups: list[list[int]], mbs: int, recompute: bool,
           memo: dict) -> tuple | None:
    """The partition's stages before their replicas are dealt: per stage in pipeline order,
    its layers [a, b), its group's index and the GPUs' full-model rates by type; None when
    there are more groups than layers. Kept in ``memo`` (with each group's inside
    bandwidth and the rates per microbatch size and recompute)."""
    key = ("layout", tuple(map(tuple, groups)), mbs, recompute)
    if key in memo:
        return memo[key]
    p = space.problem
    L = p.n_layers
    if len(groups) > L:
        memo[key] = None
        return None
    rate = memo.get(("rates", mbs, recompute))
    if rate is None:
        gpus = {v[0] for v in vertices}
        rate = memo[("rates", mbs, recompute)] = {
            gpu: 1.0 / (float(space.tb.cum_step(gpu, 1, mbs, recompute)[-1])
                        * p.timing.compute_scale) for gpu in gpus}
    speed = [sum(rate[vertices[v][0]] * vertices[v][2] for v in grp) for grp in groups]

    def inside(grp: list[int]) -> float:
        """The slowest link between two GPUs of the group: inside a node, between two nodes
        of one type and zone, or between nodes of two (each pair in the order the group
        lists them; nodes of one type and zone are listed together)."""
        key = ("inside", tuple(grp))
        if key not in memo:
            bws = [_intra(space, g) for g in {vertices[v][0] for v in grp if vertices[v][2] > 1}]
            nodes_of: dict[tuple[str, str], int] = {}
            for v in grp:
                nodes_of[vertices[v][:2]] = nodes_of.get(vertices[v][:2], 0) + 1
            where = list(nodes_of)
            for i, (g, z) in enumerate(where):
                if nodes_of[(g, z)] > 1:
                    bws.append(_link_bw(p.network, z, z, g, g))
                bws += [_link_bw(p.network, z, z2, g, g2) for g2, z2 in where[i + 1:]]
            memo[key] = min(bws, default=math.inf)
        return memo[key]

    order = sorted(range(len(groups)), key=lambda i: (-inside(groups[i]), i))
    layers = _largest_remainder([speed[i] for i in order], L, floor=1)
    out, a = [], 0
    for i, n in zip(order, layers, strict=True):
        out.append((a, a + n, i))
        a += n
    memo[key] = got = (tuple(out), rate)
    return got


def _stages(space: Space, vertices, groups: list[list[int]], mbs: int, lay: tuple) -> tuple:
    """The partition's stages from its ``layout``: inside a group, one replica per GPU with
    microbatch shares in proportion to the GPU's speed (GPUs whose share is none left out)."""
    total = space.problem.job.global_batch // mbs
    stages, rate = [], lay[1]
    for a, b, i in lay[0]:
        grp = [vertices[v] for v in groups[i]]
        shares = _largest_remainder(np.repeat([rate[g] for g, _, _ in grp],
                                              [count for _, _, count in grp]), total)
        gpus, zones = [], []
        for g, z, count in grp:
            gpus += [g] * count
            zones += [z] * count
        # a GPU whose share rounds to no microbatch would only hold its GPU (and join the sync)
        reps = tuple(ReplicaSpec(*r) for r in zip(gpus, [1] * len(gpus), zones, shares,
                                                  strict=True) if r[3] > 0)
        stages.append(StageSpec(a, b, reps))
    return tuple(stages)


def _with_ministages(sp: PlanSpec) -> list[PlanSpec]:
    """The plan under the zorse schedule at every ministage count of MINISTAGES its shortest
    stage allows, and at one layer per ministage there (more ministages hold less on the GPU
    and wait more on the host link)."""
    fewest = min(b - a for a, b, _ in sp.stages)
    counts = sorted({v for v in MINISTAGES if v <= fewest} | {fewest})
    return [sp._replace(schedule=schedule_key("zorse", v)) for v in counts]


def _cannot_fit(space: Space, sizes: list[tuple[int, tuple[str, ...]]], lay: tuple, mbs: int,
                recompute: bool, zero: int) -> bool:
    """True when some GPU of the partition's plan (its ``layout``; ``sizes``: per group, its
    GPUs and their types) cannot hold its stage even with one microbatch in flight at TP 1
    (a lower bound of its memory): the plan is out of memory without building or simulating
    it."""
    for a, b, i in lay[0]:
        n, gpus = sizes[i]
        for gpu in gpus:
            if space.min_tp(gpu, mbs, a, b, 1, recompute, zero, n) != 1:
                return True
    return False


def floors(problem: Problem, specs: list[PlanSpec], out: dict) -> np.ndarray:
    """Per plan, seconds its iteration takes at least, from the kernel's detailed result of
    the batch (``out``): its busiest GPU's compute, and under the event simulation
    (``general``, every schedule but the zorse one) each stage's busiest GPU's compute
    followed by the stage's gradient sync and update, and the step overhead."""
    shares = np.zeros(out["fwd"].shape)
    for b, sp in enumerate(specs):
        for s_, (_, _, reps) in enumerate(sp.stages):
            shares[b, s_, :len(reps)] = [r.microbatches for r in reps]
    busiest = ((out["fwd"] + out["bwd"]) * shares).max(axis=2)  # (plans, stages)
    tail = out["sync"] + out["update"].max(axis=2)
    staged = np.array([not ministage.is_ministage(sp) for sp in specs])
    return np.where(staged, (busiest + tail).max(axis=1) + problem.timing.step_overhead_s,
                    busiest.max(axis=1))


def propose(ctx: Context) -> Proposals:
    """Zorse's plans (module docstring): every partition's plans, then each simulated in the
    order of its lower bound, one per batch, while its bound can beat the best plan so far."""
    ev, space = ctx.state, ctx.space
    vertices = nodes(space)
    if not vertices:
        return
    if len(vertices) > MAX_NODES:
        if ev.stats.strategy == "zorse":
            raise InfeasibleError(
                f"the pool has {len(vertices):,} nodes; Zorse's grouping (minimum cuts over the "
                f"nodes) takes at most {MAX_NODES:,}", binding="pool",
                relaxation=f"--strategy auto, or a pool of at most {MAX_NODES:,} nodes")
        return  # auto: the other strategies' plans only
    specs = _partition_plans(ctx, vertices)
    if not specs:
        return
    # Plans are simulated in the order of their lower bounds, and those whose bound cannot
    # beat the best plan so far are skipped.
    problem = space.problem
    out = run_kernel(problem, space.tb, encode_specs(space.tb, specs), detail=True)
    t_low = floors(problem, specs, out)
    usd_s = out["gpu_usd_per_s"]
    B = len(specs)
    for i in np.argsort(t_low, kind="stable"):
        if _hopeless(ev.incumbent, ctx.objective, t_low[i], usd_s[i]):
            ev.stats.pruned += 1
            continue
        # memory needs no simulation: a plan out of memory is counted, not simulated
        one = {k: v[i:i + 1] for k, v in out.items() if isinstance(v, np.ndarray) and len(v) == B}
        (ministage if ministage.is_ministage(specs[i]) else general).memory(
            problem, space.tb, specs[i], one)
        if one["oom"][0]:
            ev.stats.oom += 1
            ev.stats.candidates_costed += 1
            continue
        yield [specs[i]]
        if ev.out_of_time():
            return


def _hopeless(inc: Candidate | None, objective: str, t_low: float, usd_s: float) -> bool:
    """Whether a plan of at least ``t_low`` seconds an iteration on GPUs of ``usd_s`` USD a
    second cannot beat the incumbent ``inc`` under ``objective``."""
    if inc is None:
        return False
    low = {"max-throughput": t_low, "min-cost": t_low * usd_s,
           "max-throughput-per-dollar": t_low ** 2 * usd_s}[objective]
    best = {"max-throughput": inc.iteration_time_s, "min-cost": inc.cost_usd,
            "max-throughput-per-dollar": inc.iteration_time_s * inc.cost_usd}[objective]
    return cannot_beat(low, t_low, best, inc.iteration_time_s)


def _partition_plans(ctx: Context, vertices) -> list[PlanSpec]:
    """The plans of every partition of the nodes into groups (SPLIT, kept per node list in
    the space), under every setting the job allows; stops early when the budget is spent."""
    ev, space = ctx.state, ctx.space
    problem = space.problem
    most = min(ctx.max_stages or problem.n_layers, problem.n_layers)
    key = (tuple(vertices), most)
    if key not in space.splits:
        space.splits[key] = split(space, vertices, most=most)
    parts = space.splits[key]
    specs: list[PlanSpec] = []
    memo: dict = {}
    for k in sorted(parts):
        if ev.out_of_time():
            return []  # the budget is spent: no more plans are built, none of the pass's costed
        specs += _group_plans(ctx, vertices, parts[k], memo)
    return specs


def _group_plans(ctx: Context, vertices, groups: list[list[int]], memo: dict) -> list[PlanSpec]:
    """The plans of one partition of the nodes into ``groups``."""
    ev, space = ctx.state, ctx.space
    job = space.problem.job
    # per group: its GPUs (its replicas) and their types
    sizes = [(sum(vertices[v][2] for v in grp), tuple({vertices[v][0]: 0 for v in grp}))
             for grp in groups]
    lays: dict = {}  # the partition's layout per (recompute, microbatch size)
    specs: list[PlanSpec] = []
    for recompute in sorted(set(job.recompute), reverse=True):
        for zero in zero_stages(job.zero_stage):
            for schedule in job.schedule:
                if schedule == "zorse" and not (recompute and zero == 2):
                    continue  # ministages checkpoint every layer and run ZeRO-2
                for mbs in ctx.mbs_values:
                    if (recompute, mbs) not in lays:
                        lays[(recompute, mbs)] = layout(space, vertices, groups, mbs, recompute,
                                                        memo)
                    lay = lays[(recompute, mbs)]
                    if lay is None:
                        continue
                    if schedule != "zorse" and _cannot_fit(space, sizes, lay, mbs, recompute,
                                                           zero):
                        ev.stats.oom += 1
                        ev.stats.candidates_costed += 1
                        continue
                    sp = build(space, vertices, groups, mbs, recompute, zero, schedule, memo)
                    if sp is None:
                        continue
                    specs += _with_ministages(sp) if schedule == "zorse" else [sp]
    return specs
