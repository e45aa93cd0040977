"""Plans that are not a set of pipelines: stages with different replica counts, and replicas whose
microbatch shares differ from stage to stage (Zorse's asymmetric stages and uneven shares).

Microbatches are numbered 0..M-1 for the iteration, and each stage deals them to its replicas
by smooth weighted round-robin over their shares (``shoal.specs.plan.owners``, as the runtime
does): microbatch i meets, in every stage, the replica that owns i there. Every replica runs its
part of its stage's 1F1B (or GPipe) order (``shoal.specs.plan.orders``). An event simulation
gives when every replica ends: a forward of microbatch i starts when the replica is free and the
previous stage's forward of i has ended; a backward when the next stage's backward of i has
ended (the last stage's, its own forward). Each operation also pays its hand-offs as the batched
kernel charges them: the send to the neighbour that owns i, plus ``recv_fraction`` of the
receive from it, on the link between those two replicas. For a plan that is a set of pipelines
this is the kernel's model exactly (tested).

Per-replica compute, gradient all-reduce, update, weights and price come from the batched
kernel (they do not depend on how replicas pair up); this module replaces its schedule, its
pipeline sends and their egress, and the activations held (the most microbatches a replica's
order has in flight).
"""

from __future__ import annotations

import numpy as np

from shoal.estimate.encode import PlanSpec
from shoal.estimate.tables import CostTables
from shoal.problem import Problem
from shoal.specs.plan import orders as plan_orders
from shoal.specs.plan import owners as plan_owners


def is_pipelines(spec: PlanSpec) -> bool:
    """True when replica j of every stage runs the same microbatches (a set of pipelines)."""
    stages = spec[4]
    shares = [tuple(r[3] for r in reps) for _, _, reps in stages]
    return all(s == shares[0] for s in shares)


def owners(spec: PlanSpec) -> list[np.ndarray]:
    """Per stage: the replica that runs each microbatch of the iteration (``plan.owners``)."""
    return [np.array(plan_owners([r[3] for r in reps]), dtype=np.int64) for _, _, reps in spec[4]]


def simulate(spec: PlanSpec, fwd: np.ndarray, bwd: np.ndarray, hop: list[np.ndarray],
             recv_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(end of each replica's last operation (S, R), busy seconds of each replica (S, R)).

    ``fwd``/``bwd``: (S, R) compute seconds per microbatch; ``hop[s]``: (R_s, R_{s+1}) seconds
    of one microbatch's transfer between replica a of stage s and replica b of stage s+1 (the
    same in both directions)."""
    schedule = spec[1]
    stages = spec[4]
    S = len(stages)
    own = owners(spec)
    M = len(own[0])
    R = fwd.shape[1]
    f_end = np.full((S, M), np.nan)
    b_end = np.full((S, M), np.nan)
    free = np.zeros((S, R))
    busy = np.zeros((S, R))
    per = plan_orders(schedule, [[r[3] for r in reps] for _, _, reps in stages])
    orders = [(s, j, ops) for s in range(S) for j, ops in enumerate(per[s])]
    pos = [0] * len(orders)
    left = sum(len(o) for _, _, o in orders)
    rf = recv_fraction
    while left:
        progressed = False
        for w, (s, j, ops) in enumerate(orders):
            t = free[s, j]
            while pos[w] < len(ops):
                bk, i = ops[pos[w]]
                if not bk:
                    dep = f_end[s - 1, i] if s > 0 else 0.0
                    d = fwd[s, j]
                    if s + 1 < S:
                        d += hop[s][j, own[s + 1][i]]  # send activations on
                    if s > 0:
                        d += rf * hop[s - 1][own[s - 1][i], j]  # blocking share of the receive
                else:
                    dep = b_end[s + 1, i] if s + 1 < S else f_end[s, i]
                    d = bwd[s, j]
                    if s > 0:
                        d += hop[s - 1][own[s - 1][i], j]  # send gradients back
                    if s + 1 < S:
                        d += rf * hop[s][j, own[s + 1][i]]
                if np.isnan(dep):
                    break
                t = max(t, dep) + d
                busy[s, j] += d
                if bk:
                    b_end[s, i] = t
                else:
                    f_end[s, i] = t
                pos[w] += 1
                left -= 1
                progressed = True
            free[s, j] = t
        if not progressed:
            raise RuntimeError("the plan's schedule has a cycle")
    return free, busy


def hops(problem: Problem, tb: CostTables, spec: PlanSpec) -> list[np.ndarray]:
    """Per stage boundary: seconds of one microbatch's transfer between every replica pair, as
    the kernel computes a pipeline send (the sender's TP sets the link's flows)."""
    tc = problem.timing
    mi = tb.mi(spec[0])
    stages = spec[4]
    out = []
    for s in range(len(stages) - 1):
        a_reps, b_reps = stages[s][2], stages[s + 1][2]
        h = np.zeros((len(a_reps), len(b_reps)))
        for a, (ga, ta, za, _) in enumerate(a_reps):
            for b, (gb, _, zb, _) in enumerate(b_reps):
                lid = tb.link_id(tb.gi(ga), tb.zones.index(za), tb.gi(gb), tb.zones.index(zb),
                                 tb.ti(ta))
                h[a, b] = float(tb.p2p_time[mi, lid]) * tc.p2p_scale + tc.p2p_overhead_s
        out.append(h)
    return out


def egress(tb: CostTables, spec: PlanSpec) -> float:
    """USD of the iteration's pipeline transfers (activations forward, gradients back)."""
    own = owners(spec)
    msg = tb.boundary_bytes * spec[0]
    stages = spec[4]
    total = 0.0
    for s in range(len(stages) - 1):
        za = [tb.zones.index(r[2]) for r in stages[s][2]]
        zb = [tb.zones.index(r[2]) for r in stages[s + 1][2]]
        for i in range(len(own[s])):
            total += 2.0 * msg * tb.egress_per_byte[za[own[s][i]], zb[own[s + 1][i]]]
    return float(total)


def apply(problem: Problem, tb: CostTables, spec: PlanSpec, out: dict) -> dict:
    """Replace the schedule-dependent outputs of a one-plan kernel result (``detail=True``) by
    the event simulation's: iteration time, stage ends, per-microbatch send shares, money."""
    S = len(spec[4])
    fwd, bwd = out["fwd"][0, :S], out["bwd"][0, :S]
    hop = hops(problem, tb, spec)
    ends, busy = simulate(spec, fwd, bwd, hop, problem.timing.recv_fraction)
    rm = out["capacity_bytes"][0, :S] > 0
    stage_end = np.where(rm, ends, 0.0).max(axis=1)
    sync = out["sync"][0, :S]
    upd = out["update"][0, :S].max(axis=1)
    T = float((stage_end + sync + upd).max() + problem.timing.step_overhead_s)
    res = dict(out)
    _memory(problem, tb, spec, res)
    res["iteration_time_s"] = np.array([T])
    res["stage_end"] = out["stage_end"].copy()
    res["stage_end"][0, :S] = stage_end
    # per-microbatch hand-off seconds of each replica: its busy time beyond compute, averaged
    counts = np.zeros_like(fwd)
    for s, (_, _, reps) in enumerate(spec[4]):
        for j, r in enumerate(reps):
            counts[s, j] = r[3]
    extra = np.where(counts > 0, (busy - counts * (fwd + bwd)) / np.maximum(counts, 1), 0.0)
    res["send_fwd"] = out["send_fwd"].copy()
    res["send_bwd"] = out["send_bwd"].copy()
    res["send_fwd"][0, :S] = extra / 2
    res["send_bwd"][0, :S] = extra / 2
    res["t_mb"] = out["t_mb"].copy()
    res["t_mb"][0, :S] = np.where(counts > 0, busy / np.maximum(counts, 1), 0.0)
    res["busy"] = busy
    res["cost_compute_usd"] = np.array([float(out["gpu_usd_per_s"][0]) * T])
    res["cost_egress_usd"] = np.array([float(out["egress_ring"][0]) + egress(tb, spec)])
    return res


def in_flight(spec: PlanSpec) -> list[list[int]]:
    """[stage][replica] -> the most microbatches whose activations the replica holds at once."""
    per = plan_orders(spec[1], [[r[3] for r in reps] for _, _, reps in spec[4]])
    out = []
    for stage in per:
        row = []
        for ops in stage:
            held = most = 0
            for bk, _ in ops:
                held += -1 if bk else 1
                most = max(most, held)
            row.append(most)
        out.append(row)
    return out


def _memory(problem: Problem, tb: CostTables, spec: PlanSpec, res: dict) -> None:
    """Activations, peak and OOM of every replica from its order's in-flight microbatches."""
    from shoal.estimate.api import _state_bytes
    from shoal.estimate.kernel import worker_memory

    mem = problem.memory
    mbs = float(spec[0])
    rc, zero = spec[2], spec[3]
    keys = ("inflight", "activations", "peak_bytes", "oom_workers")
    for k in keys:
        res[k] = res[k].copy()
    for s, ((a, b, reps), held) in enumerate(zip(spec[4], in_flight(spec), strict=True)):
        for j, (_, tp, _, _) in enumerate(reps):
            states, buffers, act = worker_memory(
                tb, mem, _state_bytes(problem)[1], a, b, tb.ti(tp), mbs, float(held[j]),
                np.bool_(rc), np.int64(zero), float(len(reps)))
            peak = mem.framework_bytes + float(states) + float(buffers) + float(act)
            res["inflight"][0, s, j] = held[j]
            res["activations"][0, s, j] = float(act)
            res["peak_bytes"][0, s, j] = peak
            res["oom_workers"][0, s, j] = peak > res["capacity_bytes"][0, s, j]
    res["oom"] = np.array([bool(res["oom_workers"][0].any())])
