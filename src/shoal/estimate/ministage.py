"""The zorse schedule (Zorse §4.1): pipeline stages cut into ministages, ZeRO-2 inside a stage,
idle ministages and layer-boundary activations in host memory.

Layout. Stage s's layers are cut into V ministages of near-equal layer counts (the first
``(b - a) mod V`` one layer longer). Ministages are taken round-robin: virtual stage
v = k S + s is ministage k of stage s, so after the last stage's ministage k the activations go
back to stage 0's ministage k + 1. Every stage deals the iteration's microbatches to its replicas
by their shares (``shoal.specs.plan.owners``), as for any plan with uneven shares.

Order (GPipe, ministage-major). Each replica runs, for k = 0..V-1, the forwards of its
microbatches through ministage k, then for k = V-1..0 their backwards. A max-plus scan over
every (virtual stage, microbatch), virtual stage by virtual stage (the order is fixed and an
operation waits only for the virtual stage next to it), gives when each operation ends: a
forward starts when the replica is free, the previous virtual stage's forward of that
microbatch has ended and the ministage's weights are on the GPU; a backward when the next
virtual stage's backward of it has ended (the last one's: its own forward) and the weights are
there. Hand-offs are charged as the
batched kernel charges them (the send on the link between the two owners, ``recv_fraction`` of it
on the receiver). Each operation also moves the microbatch's layer-boundary activations of the
ministage over the host link (out in the forward, back in the backward), overlapped with its
compute: an operation takes at least that transfer.

Weights (Table 2's Zorse row: two ministages materialised, shards in host memory). A ministage's
weights come in before its forwards and again before its backwards: its shard over the host link,
then an all-gather over the stage's ring (half a ring all-reduce, the kernel's ring formula).
Weights come in one ministage at a time; those of ministage k may come in once ministage k - 2
is done (two buffers: the current and the next). The last ministage stays
for its backwards. After a ministage's backwards its gradients are reduce-scattered over the
ring (half an all-reduce; gradients go out one ministage at a time, beside the weights coming
in), its shard's optimizer state (fp32 weights and moments, kept in host
memory with the weight shards) comes in over the host link, the shard is updated on the GPU (the
stage's update time over its replicas, ZeRO-2) and goes back with the new weights; one
ministage's update overlaps the next one's backwards. The iteration ends when every stage has
updated ministage 0.

Memory per worker: two ministages' weights (its TP share), one ministage's full gradients while
its backwards run and its optimizer-state shard while it updates, gradient buckets for one
ministage, the boundary activations of two microbatches (the current and the prefetched) over
one ministage plus one rebuilt block, and the framework part. Host memory is not checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.estimate.encode import PlanSpec, parse_schedule
from shoal.estimate.general import hop
from shoal.estimate.kernel import ring_allreduce_s
from shoal.estimate.tables import CostTables, state_bytes
from shoal.problem import Problem
from shoal.specs.plan import owners as plan_owners


def is_ministage(spec: PlanSpec) -> bool:
    return parse_schedule(spec.schedule)[0] == "zorse"


def edges(a: int, b: int, V: int) -> list[int]:
    """Layer edges of the V ministages of a stage holding layers [a, b)."""
    q, r = divmod(b - a, V)
    out = [a]
    for k in range(V):
        out.append(out[-1] + q + (1 if k < r else 0))
    return out


@dataclass(frozen=True)
class _Costs:
    """Seconds of one zorse plan's parts. Per stage s: ``own[s]`` the replica of each
    microbatch; ``f[s]``, ``b[s]``, ``act_io[s]`` (replicas, V) a forward's and backward's
    compute per microbatch through each ministage and its boundary activations to or from the
    host; ``hop[s]`` (R_s, R_{s+1 mod S}) a hand-off to the next stage. Per stage and
    ministage (S, V): ``fetch`` its weights in, ``reduce`` its gradients out with its
    optimizer state in and out, ``update`` its shard's update."""

    S: int
    V: int
    M: int
    recv_fraction: float
    own: list[np.ndarray]
    f: list[np.ndarray]
    b: list[np.ndarray]
    act_io: list[np.ndarray]
    hop: list[np.ndarray]
    fetch: np.ndarray
    reduce: np.ndarray
    update: np.ndarray


def apply(problem: Problem, tb: CostTables, spec: PlanSpec, out: dict) -> dict:
    """Replace a one-plan kernel result (``detail=True``) by the zorse schedule's time, memory
    and money."""
    c = _costs(problem, tb, spec)
    fwd_s, bwd_s = _durations(c)
    ms_end_b, busy = _scan(c, fwd_s, bwd_s)
    # gradients out and updates, per stage in backward order of its ministages
    done = np.zeros(c.S)
    sync_s = np.zeros(c.S)
    for s in range(c.S):
        out_free = opt_free = 0.0
        for k in range(c.V - 1, -1, -1):
            out_free = max(out_free, ms_end_b[s, k]) + c.reduce[s, k]
            opt_free = max(opt_free, out_free) + c.update[s, k]
        done[s] = opt_free
        sync_s[s] = c.fetch[s].sum() * 2 - c.fetch[s, c.V - 1] + c.reduce[s].sum()
    T = float(done.max() + problem.timing.step_overhead_s)
    res = dict(out)
    memory(problem, tb, spec, res)
    for k_ in ("t_mb", "send_fwd", "send_bwd", "sync", "update"):
        res[k_] = res[k_].copy()
    for s, (_, _, reps) in enumerate(spec.stages):
        for j, (_, _, _, m) in enumerate(reps):
            comp = m * (c.f[s][j].sum() + c.b[s][j].sum())
            res["t_mb"][0, s, j] = busy[s][j] / m if m else 0.0
            extra = (busy[s][j] - comp) / m if m else 0.0
            res["send_fwd"][0, s, j] = res["send_bwd"][0, s, j] = extra / 2
            res["update"][0, s, j] = c.update[s].sum()
        res["sync"][0, s] = sync_s[s]
    res["iteration_time_s"] = np.array([T])
    res["stage_end"] = out["stage_end"].copy()
    res["stage_end"][0, :c.S] = ms_end_b[:, 0]
    res["cost_compute_usd"] = np.array([float(out["gpu_usd_per_s"][0]) * T])
    res["cost_egress_usd"] = np.array([_egress(tb, spec, c.own, float(out["egress_ring"][0]))])
    return res


def _costs(problem: Problem, tb: CostTables, spec: PlanSpec) -> _Costs:
    """The seconds of every part of the plan (``_Costs``) from the cost tables."""
    mbs, key, _, _, stages = spec
    _, V = parse_schedule(key)
    S = len(stages)
    tc = problem.timing
    mi = tb.mi(mbs)
    cut = [edges(a, b, V) for a, b, _ in stages]
    host = [np.array([problem.gpus[r[0]].host_bw_Bps for r in reps]) for _, _, reps in stages]
    f = [np.zeros((len(reps), V)) for _, _, reps in stages]
    bw = [np.zeros((len(reps), V)) for _, _, reps in stages]
    act_io = [np.zeros((len(reps), V)) for _, _, reps in stages]
    for s, (_, _, reps) in enumerate(stages):
        for j, (g, tp, _, _) in enumerate(reps):
            gi, ti = tb.gi(g), tb.ti(tp)
            for k in range(V):
                e0, e1 = cut[s][k], cut[s][k + 1]
                ff = (tb.cum_f[gi, ti, mi, e1] - tb.cum_f[gi, ti, mi, e0]) * tc.compute_scale
                bb = (tb.cum_b[gi, ti, mi, e1] - tb.cum_b[gi, ti, mi, e0]) * tc.compute_scale
                f[s][j, k], bw[s][j, k] = ff, bb + ff  # every layer boundary is a checkpoint
                act_io[s][j, k] = ((tb.cum_act_rc[gi, ti, e1] - tb.cum_act_rc[gi, ti, e0]) * mbs
                                   / host[s][j])
    # hand-offs: stage s -> s + 1 inside a round, the last stage -> stage 0 between rounds
    nxt_hop = [hop(problem, tb, mbs, stages[s].replicas, stages[(s + 1) % S].replicas) if S > 1
               else np.zeros((len(stages[0].replicas),) * 2) for s in range(S)]  # one stage: no hand-off
    own = [np.array(plan_owners([r.microbatches for r in reps]), dtype=np.int64) for _, _, reps in stages]
    fetch, reduce, update = _weights(problem, tb, spec, cut, host)
    return _Costs(S=S, V=V, M=len(own[0]), recv_fraction=tc.recv_fraction, own=own, f=f, b=bw,
                  act_io=act_io, hop=nxt_hop, fetch=fetch, reduce=reduce, update=update)


def _weights(problem: Problem, tb: CostTables, spec: PlanSpec, cut: list[list[int]],
             host: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(S, V) seconds per stage and ministage: weights in (host shard, then all-gather),
    gradients out (reduce-scatter) with the optimizer state in and out, and the shard's update."""
    tc = problem.timing
    grad_b, (w_b, _, o_b) = state_bytes(problem)
    S, V = len(spec.stages), len(cut[0]) - 1
    fetch, reduce, update = np.zeros((S, V)), np.zeros((S, V)), np.zeros((S, V))
    for s, (_, _, reps) in enumerate(spec.stages):
        d = len(reps)
        g = np.array([tb.gi(r[0]) for r in reps])
        z = np.array([tb.zones.index(r.zone) for r in reps])
        t = np.array([tb.ti(r[1]) for r in reps])
        tpv = np.array([r[1] for r in reps], dtype=float)
        nx = (np.arange(d) + 1) % d
        rid = tb.link_id(g, z, g[nx], z[nx], t)
        for k in range(V):
            e0, e1 = cut[s][k], cut[s][k + 1]
            p = float(tb.cum_params[e1] - tb.cum_params[e0])
            shard_in = (p / tpv / d * w_b / host[s]).max()
            half = (0.5 * tc.sharded_sync_ratio
                    * ring_allreduce_s(tb, rid, d, p / tpv * grad_b, tc.sync_scale)).max() \
                if d > 1 else 0.0
            fetch[s, k] = shard_in + half
            # the shard's optimizer state in from the host and out again with the new weights
            opt_io = (p / tpv / d * (2.0 * o_b + w_b) / host[s]).max()
            reduce[s, k] = half + opt_io
            u = tb.cum_u[g, t, e1] - tb.cum_u[g, t, e0]
            update[s, k] = float(u.max()) / d
    return fetch, reduce, update


def _durations(c: _Costs) -> tuple[np.ndarray, np.ndarray]:
    """(S V, M) seconds of the forward and backward of every microbatch through every virtual
    stage v = k S + s: compute, the hand-off to the next virtual stage's owner and the blocking
    share of the one from the previous, at least the host transfer of its activations."""
    S, V, rf = c.S, c.V, c.recv_fraction
    fwd_s, bwd_s = np.zeros((S * V, c.M)), np.zeros((S * V, c.M))
    for v in range(S * V):
        k, s = divmod(v, S)
        o, prev_own, next_own = c.own[s], c.own[(s - 1) % S], c.own[(s + 1) % S]
        d = c.f[s][o, k].copy()
        if v + 1 < S * V:
            d += c.hop[s][o, next_own]
        if v > 0:
            d += rf * c.hop[(s - 1) % S][prev_own, o]
        fwd_s[v] = np.maximum(d, c.act_io[s][o, k])
        d = c.b[s][o, k].copy()
        if v > 0:
            d += c.hop[(s - 1) % S][prev_own, o]
        if v + 1 < S * V:
            d += rf * c.hop[s][o, next_own]
        bwd_s[v] = np.maximum(d, c.act_io[s][o, k])
    return fwd_s, bwd_s


def _scan(c: _Costs, fwd_s: np.ndarray, bwd_s: np.ndarray) -> tuple[np.ndarray, list]:
    """(when the backwards of each stage's ministage end (S, V), each replica's busy seconds).

    Every replica runs its operations virtual stage by virtual stage (forwards up, then
    backwards down), and an operation of virtual stage v waits only for v - 1's (or v + 1's)
    operation of its microbatch, so the virtual stages are taken in that order and each
    replica's operations of one virtual stage in a max-plus scan. Stage s's weights come in one
    ministage at a time over its host link (module docstring)."""
    S, V, M = c.S, c.V, c.M
    free = [np.zeros(len(c.f[s])) for s in range(S)]
    busy = [np.zeros(len(c.f[s])) for s in range(S)]
    link_free_s = np.zeros(S)  # stage s's weights come in from then

    def weights_in(s: int, k: int, after: float) -> float:
        link_free_s[s] = max(link_free_s[s], after) + c.fetch[s, k]
        return float(link_free_s[s])

    def run(s: int, dur: np.ndarray, dep: np.ndarray, w: float, end: np.ndarray) -> None:
        """Each replica runs its microbatches of one virtual stage in order: an operation ends
        at max(previous end, its dependency, weights in) + its duration (a max-plus scan)."""
        for j in range(len(free[s])):
            idx = np.flatnonzero(c.own[s] == j)
            if len(idx) == 0:
                continue
            d = dur[idx]
            cs = np.cumsum(d)
            lead = np.maximum.accumulate(np.maximum(dep[idx], w) - (cs - d))
            end[idx] = cs + np.maximum(lead, free[s][j])
            free[s][j] = end[idx[-1]]
            busy[s][j] += float(cs[-1])

    ms_end_f, ms_end_b, ready = np.zeros((S, V)), np.zeros((S, V)), np.zeros((S, V))
    f_end, b_end = np.zeros((S * V, M)), np.zeros((S * V, M))
    for v in range(S * V):  # forwards, virtual stage by virtual stage
        k, s = divmod(v, S)
        ready[s, k] = weights_in(s, k, ms_end_f[s, k - 2] if k >= 2 else 0.0)
        run(s, fwd_s[v], f_end[v - 1] if v > 0 else np.zeros(M), ready[s, k], f_end[v])
        ms_end_f[s, k] = f_end[v].max()
    for v in range(S * V - 1, -1, -1):  # backwards
        k, s = divmod(v, S)
        if k == V - 1:  # the last ministage's weights are still on the GPU
            w = ready[s, k]
        else:
            w = weights_in(s, k, ms_end_b[s, k + 2] if k + 2 < V else ms_end_f[s, V - 1])
        run(s, bwd_s[v], b_end[v + 1] if v + 1 < S * V else f_end[v], w, b_end[v])
        ms_end_b[s, k] = b_end[v].max()
    return ms_end_b, busy


def _egress(tb: CostTables, spec: PlanSpec, own: list[np.ndarray], egress_ring: float) -> float:
    """USD of the pipeline's hand-offs (the last stage's to stage 0 between rounds included) and
    the stage's weights and gradients: two all-gathers and a reduce-scatter, 1.5 all-reduces."""
    mbs, key, _, _, stages = spec
    _, V = parse_schedule(key)
    S = len(stages)
    msg = tb.boundary_bytes * mbs
    eg = 1.5 * egress_ring
    zones = [np.array([tb.zones.index(r.zone) for r in reps]) for _, _, reps in stages]
    for s in range(S):
        s2 = (s + 1) % S
        rounds = V if s + 1 < S else (V - 1 if S > 1 else 0)  # hand-offs out of s per microbatch
        if rounds:
            per = tb.egress_per_byte[zones[s][own[s]], zones[s2][own[s2]]].sum()
            eg += 2.0 * msg * rounds * float(per)
    return eg


def memory(problem: Problem, tb: CostTables, spec: PlanSpec, res: dict) -> None:
    """Every worker's memory under the zorse schedule (module docstring), written into ``res``
    (a one-plan kernel result with ``detail``): states, buffers, activations, peak, OOM."""
    mbs, key, _, _, stages = spec
    _, V = parse_schedule(key)
    mem = problem.memory
    _, (w_b, g_b, o_b) = state_bytes(problem)
    for k_ in ("inflight", "activations", "peak_bytes", "oom_workers", "states", "buffers"):
        res[k_] = res[k_].copy()
    for s, (a, b, reps) in enumerate(stages):
        d = len(reps)
        cut = edges(a, b, V)
        p_ms = max(float(tb.cum_params[cut[k + 1]] - tb.cum_params[cut[k]]) for k in range(V))
        for j, (gpu, tp, _, m) in enumerate(reps):
            gi, ti = tb.gi(gpu), tb.ti(tp)
            states = (2.0 * p_ms / tp * w_b + p_ms / tp * g_b + p_ms / tp / d * o_b) \
                * mem.state_factor
            buffers = p_ms / tp * mem.comm_buffer_bytes_per_param
            a_ms = max(float(tb.cum_act_rc[gi, ti, cut[k + 1]] - tb.cum_act_rc[gi, ti, cut[k]])
                       for k in range(V))
            act = (2.0 * a_ms * mbs + tb.rc_work[gi, ti] * mbs) * mem.activation_factor
            peak = mem.framework_bytes + states + buffers + act
            res["states"][0, s, j], res["buffers"][0, s, j] = states, buffers
            res["activations"][0, s, j] = act
            res["inflight"][0, s, j] = min(2, m)
            res["peak_bytes"][0, s, j] = peak
            res["oom_workers"][0, s, j] = peak > res["capacity_bytes"][0, s, j]
    res["oom"] = np.array([bool(res["oom_workers"][0].any())])
