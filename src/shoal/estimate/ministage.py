"""The zorse schedule (Zorse §4.1): pipeline stages cut into ministages, ZeRO-2 inside a stage,
idle ministages and layer-boundary activations in host memory.

Layout. Stage s's layers are cut into V ministages of near-equal layer counts (the first
``(b - a) mod V`` one layer longer). Ministages are taken round-robin: virtual stage
v = k S + s is ministage k of stage s, so after the last stage's ministage k the activations go
back to stage 0's ministage k + 1. Every stage deals the iteration's microbatches to its replicas
by their shares (``shoal.specs.plan.owners``), as for any plan with uneven shares.

Order (GPipe, ministage-major). Each replica runs, for k = 0..V-1, the forwards of its
microbatches through ministage k, then for k = V-1..0 their backwards. An event simulation over
every (virtual stage, microbatch) gives when each operation ends: a forward starts when the
replica is free, the previous virtual stage's forward of that microbatch has ended and the
ministage's weights are on the GPU; a backward when the next virtual stage's backward of it has
ended (the last one's: its own forward) and the weights are there. Hand-offs are charged as the
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

import numpy as np

from shoal.estimate.encode import PlanSpec, parse_schedule
from shoal.estimate.general import hop
from shoal.estimate.kernel import ring_allreduce_s
from shoal.estimate.tables import CostTables
from shoal.problem import Problem
from shoal.specs.plan import owners as plan_owners


def is_ministage(spec: PlanSpec) -> bool:
    return parse_schedule(spec[1])[0] == "zorse"


def edges(a: int, b: int, V: int) -> list[int]:
    """Layer edges of the V ministages of a stage holding layers [a, b)."""
    q, r = divmod(b - a, V)
    out = [a]
    for k in range(V):
        out.append(out[-1] + q + (1 if k < r else 0))
    return out


def apply(problem: Problem, tb: CostTables, spec: PlanSpec, out: dict) -> dict:
    """Replace a one-plan kernel result (``detail=True``) by the zorse schedule's time, memory
    and money."""
    from shoal.estimate.api import _state_bytes

    mbs, key, _, _, stages = spec
    _, V = parse_schedule(key)
    S = len(stages)
    tc = problem.timing
    mi = tb.mi(mbs)
    rf = tc.recv_fraction
    grad_b, (w_b, _, o_b) = _state_bytes(problem)
    own = [np.array(plan_owners([r[3] for r in reps]), dtype=np.int64) for _, _, reps in stages]
    M = len(own[0])
    cut = [edges(a, b, V) for a, b, _ in stages]
    host = [np.array([problem.gpus[r[0]].host_bw_Bps for r in reps]) for _, _, reps in stages]
    # per stage, replica and ministage: forward and backward compute per microbatch, and the
    # boundary activations it moves to and from the host
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
    nxt_hop = [hop(problem, tb, mbs, stages[s][2], stages[(s + 1) % S][2]) if S > 1
               else np.zeros((len(stages[0][2]),) * 2) for s in range(S)]  # one stage: no hand-off
    # per stage and ministage: weights in (host shard, then all-gather), gradients out
    # (reduce-scatter), and the shard's update
    fetch = np.zeros((S, V))
    rs = np.zeros((S, V))
    upd = np.zeros((S, V))
    for s, (_, _, reps) in enumerate(stages):
        d = len(reps)
        g = np.array([tb.gi(r[0]) for r in reps])
        z = np.array([tb.zones.index(r[2]) for r in reps])
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
            rs[s, k] = half + opt_io
            u = tb.cum_u[g, t, e1] - tb.cum_u[g, t, e0]
            upd[s, k] = float(u.max()) / d
    # ---- event simulation ----------------------------------------------------------------
    free = [np.zeros(len(reps)) for _, _, reps in stages]
    comm = np.zeros(S)  # weights come in to the stage from
    ms_end_f = np.zeros((S, V))
    ms_end_b = np.zeros((S, V))
    ready = np.zeros((S, V))
    f_end = np.zeros((S * V, M))
    b_end = np.zeros((S * V, M))
    busy = [np.zeros(len(reps)) for _, _, reps in stages]
    prev_own = [own[(s - 1) % S] for s in range(S)]
    next_own = [own[(s + 1) % S] for s in range(S)]

    def weights_in(s: int, k: int, after: float) -> float:
        start = max(comm[s], after)
        comm[s] = start + fetch[s, k]
        return comm[s]

    def run(v: int, s: int, k: int, dur: np.ndarray, dep: np.ndarray, w: float,
            end: np.ndarray) -> None:
        """Each replica runs its microbatches of virtual stage v in order: an operation ends
        at max(previous end, its dependency, weights in) + its duration (a max-plus scan)."""
        o = own[s]
        for j in range(len(free[s])):
            idx = np.flatnonzero(o == j)
            if len(idx) == 0:
                continue
            d = dur[idx]
            c = np.cumsum(d)
            lead = np.maximum.accumulate(np.maximum(dep[idx], w) - (c - d))
            end[idx] = c + np.maximum(lead, free[s][j])
            free[s][j] = end[idx[-1]]
            busy[s][j] += float(c[-1])

    for v in range(S * V):  # forwards, virtual stage by virtual stage
        k, s = divmod(v, S)
        w = weights_in(s, k, ms_end_f[s, k - 2] if k >= 2 else 0.0)
        ready[s, k] = w
        o = own[s]
        d = f[s][o, k].copy()
        if v + 1 < S * V:
            d += nxt_hop[s][o, next_own[s]]
        if v > 0:
            d += rf * nxt_hop[(s - 1) % S][prev_own[s], o]
        d = np.maximum(d, act_io[s][o, k])
        dep = f_end[v - 1] if v > 0 else np.zeros(M)
        run(v, s, k, d, dep, w, f_end[v])
        ms_end_f[s, k] = f_end[v].max()
    for v in range(S * V - 1, -1, -1):  # backwards
        k, s = divmod(v, S)
        if k == V - 1:  # the last ministage's weights are still on the GPU
            w = ready[s, k]
        else:
            w = weights_in(s, k, ms_end_b[s, k + 2] if k + 2 < V else ms_end_f[s, V - 1])
        o = own[s]
        d = bw[s][o, k].copy()
        if v > 0:
            d += nxt_hop[(s - 1) % S][prev_own[s], o]
        if v + 1 < S * V:
            d += rf * nxt_hop[s][o, next_own[s]]
        d = np.maximum(d, act_io[s][o, k])
        dep = b_end[v + 1] if v + 1 < S * V else f_end[v]
        run(v, s, k, d, dep, w, b_end[v])
        ms_end_b[s, k] = b_end[v].max()
    # gradients out and updates, per stage in backward order of its ministages
    done = np.zeros(S)
    sync_s = np.zeros(S)
    for s in range(S):
        out_free = opt_free = 0.0
        for k in range(V - 1, -1, -1):
            out_free = max(out_free, ms_end_b[s, k]) + rs[s, k]
            opt_free = max(opt_free, out_free) + upd[s, k]
        done[s] = opt_free
        sync_s[s] = fetch[s].sum() * 2 - fetch[s, V - 1] + rs[s].sum()
    T = float(done.max() + tc.step_overhead_s)
    res = dict(out)
    memory(problem, tb, spec, res)
    for k_ in ("t_mb", "send_fwd", "send_bwd", "sync", "update"):
        res[k_] = res[k_].copy()
    for s, (_, _, reps) in enumerate(stages):
        for j, (_, _, _, m) in enumerate(reps):
            comp = m * (f[s][j].sum() + bw[s][j].sum())
            res["t_mb"][0, s, j] = busy[s][j] / m if m else 0.0
            extra = (busy[s][j] - comp) / m if m else 0.0
            res["send_fwd"][0, s, j] = res["send_bwd"][0, s, j] = extra / 2
            res["update"][0, s, j] = upd[s].sum()
        res["sync"][0, s] = sync_s[s]
    res["iteration_time_s"] = np.array([T])
    res["stage_end"] = out["stage_end"].copy()
    res["stage_end"][0, :S] = ms_end_b[:, 0]
    res["cost_compute_usd"] = np.array([float(out["gpu_usd_per_s"][0]) * T])
    # the pipeline's hand-offs (the last stage's to stage 0 between rounds included) and the
    # stage's weights and gradients: two all-gathers and a reduce-scatter, 1.5 all-reduces
    msg = tb.boundary_bytes * mbs
    eg = 1.5 * float(out["egress_ring"][0])
    zones = [np.array([tb.zones.index(r[2]) for r in reps]) for _, _, reps in stages]
    for s in range(S):
        s2 = (s + 1) % S
        rounds = V if s + 1 < S else (V - 1 if S > 1 else 0)  # hand-offs out of s per microbatch
        if rounds:
            per = tb.egress_per_byte[zones[s][own[s]], zones[s2][own[s2]]].sum()
            eg += 2.0 * msg * rounds * float(per)
    res["cost_egress_usd"] = np.array([eg])
    return res


def memory(problem: Problem, tb: CostTables, spec: PlanSpec, res: dict) -> None:
    """Every worker's memory under the zorse schedule (module docstring), written into ``res``
    (a one-plan kernel result with ``detail``): states, buffers, activations, peak, OOM."""
    from shoal.estimate.api import _state_bytes

    mbs, key, _, _, stages = spec
    _, V = parse_schedule(key)
    mem = problem.memory
    _, (w_b, g_b, o_b) = _state_bytes(problem)
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
