"""Plans that are not a set of pipelines: stages with different replica counts, and replicas whose
microbatch shares differ from stage to stage (Zorse's asymmetric stages and uneven shares).

Microbatches are numbered 0..M-1 for the iteration, and each stage deals them to its replicas
in order of due time by their shares (``shoal.specs.plan.owners``, as the runtime
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

from shoal.estimate import operations
from shoal.estimate.encode import PlanSpec
from shoal.estimate.kernel import Worker, exposed_sync, p2p_s, worker_memory
from shoal.estimate.tables import CostTables, state_bytes
from shoal.problem import Problem
from shoal.specs.plan import owners as plan_owners
from shoal.specs.plan import stage_orders as plan_stage_orders
from shoal.specs.plan import warmups as plan_warmups


def is_pipelines(spec: PlanSpec) -> bool:
    """True when replica j of every stage runs the same microbatches (a set of pipelines)."""
    stages = spec.stages
    shares = [tuple(r.microbatches for r in reps) for _, _, reps in stages]
    return all(s == shares[0] for s in shares)


def owners(spec: PlanSpec) -> list[np.ndarray]:
    """Per stage: the replica that runs each microbatch of the iteration (``plan.owners``)."""
    return [np.array(plan_owners([r.microbatches for r in reps]), dtype=np.int64)
            for _, _, reps in spec.stages]


def simulate(spec: PlanSpec, fwd: np.ndarray, bwd: np.ndarray, hop: list[np.ndarray],
             recv_fraction: float, trace: list | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(end of each replica's last operation (S, R), busy seconds of each replica (S, R)), from
    the event simulation of the stages' orders (``shoal.estimate.operations``).

    ``fwd``/``bwd``: (S, R) compute seconds per microbatch; ``hop[s]``: (R_s, R_{s+1}) seconds
    of one microbatch's transfer between replica a of stage s and replica b of stage s+1 (the
    same in both directions). ``trace``: a list to which every operation is appended as
    (stage, replica, is_backward, microbatch, start, end)."""
    stages = spec.stages
    own = owners(spec)
    d_f, d_b = durations(own, fwd, bwd, hop, recv_fraction)
    shares = [[r.microbatches for r in reps] for _, _, reps in stages]
    g = operations.graph(plan_stage_orders(spec.schedule, shares), np.stack(own),
                         [len(sh) for sh in shares], d_f, d_b)
    free = np.zeros((len(stages), fwd.shape[1]))
    for (s, j), end_s in zip(g.where, operations.simulate(g, trace), strict=True):
        free[s, j] = end_s
    busy = np.zeros((len(stages), fwd.shape[1]))
    for s, sh in enumerate(shares):
        for j in range(len(sh)):
            mine = own[s] == j
            busy[s, j] = float(np.sum(d_f[s][mine]) + np.sum(d_b[s][mine]))
    return free, busy


def durations(own: list[np.ndarray], fwd: np.ndarray, bwd: np.ndarray, hop: list[np.ndarray],
              recv_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(S, M) seconds of each microbatch's forward and backward on the replica that owns it in
    each stage: compute, the send to the next stage's owner, and the blocking share
    (``recv_fraction``) of the receive from the previous stage's."""
    S = len(own)
    d_f, d_b = [], []
    for s in range(S):
        o = own[s]
        df = fwd[s, o].astype(float)
        db = bwd[s, o].astype(float)
        if s + 1 < S:
            h = hop[s][o, own[s + 1]]
            df, db = df + h, db + recv_fraction * h
        if s > 0:
            h = hop[s - 1][own[s - 1], o]
            df, db = df + recv_fraction * h, db + h
        d_f.append(df)
        d_b.append(db)
    return np.stack(d_f), np.stack(d_b)


def hop(problem: Problem, tb: CostTables, mbs: int, src, dst) -> np.ndarray:
    """(R_src, R_dst) seconds of one microbatch's transfer from each replica of a stage
    (``src``: its replica specs) to each of another's, as the kernel computes a pipeline send
    (the sender's TP sets the link's flows)."""
    ga, za, ta = (np.array([tb.gi(r.gpu) for r in src]), np.array([tb.zones.index(r.zone) for r in src]),
                  np.array([tb.ti(r[1]) for r in src]))
    gb, zb = np.array([tb.gi(r.gpu) for r in dst]), np.array([tb.zones.index(r.zone) for r in dst])
    lid = tb.link_id(ga[:, None], za[:, None], gb[None, :], zb[None, :], ta[:, None])
    return np.asarray(p2p_s(tb, problem.timing, tb.mi(mbs), lid), dtype=float)


def hops(problem: Problem, tb: CostTables, spec: PlanSpec) -> list[np.ndarray]:
    """Per stage boundary: ``hop`` from every replica of stage s to every replica of s + 1."""
    stages = spec.stages
    return [hop(problem, tb, spec.mbs, stages[s].replicas, stages[s + 1].replicas)
            for s in range(len(stages) - 1)]


def egress(tb: CostTables, spec: PlanSpec) -> float:
    """USD of the iteration's pipeline transfers (activations forward, gradients back)."""
    own = owners(spec)
    msg = tb.boundary_bytes * spec.mbs
    stages = spec.stages
    total = 0.0
    for s in range(len(stages) - 1):
        za = [tb.zones.index(r.zone) for r in stages[s].replicas]
        zb = [tb.zones.index(r.zone) for r in stages[s + 1].replicas]
        for i in range(len(own[s])):
            total += 2.0 * msg * tb.egress_per_byte[za[own[s][i]], zb[own[s + 1][i]]]
    return float(total)


def apply(problem: Problem, tb: CostTables, spec: PlanSpec, out: dict) -> dict:
    """Replace the schedule-dependent outputs of a one-plan kernel result (``detail=True``) by
    the event simulation's: iteration time, stage ends, per-microbatch send shares, money."""
    S = len(spec.stages)
    fwd, bwd = out["fwd"][0, :S], out["bwd"][0, :S]
    hop = hops(problem, tb, spec)
    ends, busy = simulate(spec, fwd, bwd, hop, problem.timing.recv_fraction)
    rm = out["capacity_bytes"][0, :S] > 0
    stage_end = np.where(rm, ends, 0.0).max(axis=1)
    sync = exposed_sync(out["ring"][0, :S], ends, bwd, rm, stage_end,
                        problem.timing.grad_reduce_overlap)
    upd = out["update"][0, :S].max(axis=1)
    T = float((stage_end + sync + upd).max() + problem.timing.step_overhead_s)
    res = dict(out)
    memory(problem, tb, spec, res)
    res["iteration_time_s"] = np.array([T])
    res["stage_end"] = out["stage_end"].copy()
    res["stage_end"][0, :S] = stage_end
    res["sync"] = out["sync"].copy()
    res["sync"][0, :S] = sync
    # per-microbatch hand-off seconds of each replica: its busy time beyond compute, averaged
    counts = np.zeros_like(fwd)
    for s, (_, _, reps) in enumerate(spec.stages):
        for j, r in enumerate(reps):
            counts[s, j] = r.microbatches
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
    """[stage][replica] -> the most microbatches whose activations the replica holds at once.

    In the 1F1B stage order (W forwards, then forward W+k before backward k), a replica holds
    after forward W+k its microbatches in [k, W+k]: the most it ever holds is the most of its
    microbatches in any W+1 consecutive ones. Under GPipe, all of them."""
    stages = spec.stages
    shares = [[r.microbatches for r in reps] for _, _, reps in stages]
    warm = plan_warmups(shares)
    out = []
    for s, sh in enumerate(shares):
        if spec.schedule == "gpipe":
            out.append(list(sh))
            continue
        own = np.array(plan_owners(sh), dtype=np.int64)
        M, W = len(own), warm[s]
        row = []
        for j in range(len(sh)):
            c = np.concatenate([[0], np.cumsum(own == j)])
            hi = np.minimum(np.arange(M) + W + 1, M)
            row.append(int((c[hi] - c[np.arange(M)]).max()) if M else 0)
        out.append(row)
    return out


def memory(problem: Problem, tb: CostTables, spec: PlanSpec, res: dict) -> None:
    """Activations, peak and OOM of every replica from its order's in-flight microbatches,
    written into ``res`` (a one-plan kernel result with ``detail``)."""
    mem = problem.memory
    mbs = float(spec.mbs)
    rc, zero = spec.recompute, spec.zero
    keys = ("inflight", "activations", "peak_bytes", "oom_workers")
    for k in keys:
        res[k] = res[k].copy()
    for s, ((a, b, reps), held) in enumerate(zip(spec.stages, in_flight(spec), strict=True)):
        for j, (gpu, tp, _, _) in enumerate(reps):
            w = Worker(tb.gi(gpu), a, b, tb.ti(tp), mbs, np.bool_(rc))
            states, buffers, act = worker_memory(tb, mem, state_bytes(problem)[1], w,
                                                 float(held[j]), np.int64(zero), float(len(reps)))
            peak = mem.framework_bytes + float(states) + float(buffers) + float(act)
            res["inflight"][0, s, j] = held[j]
            res["activations"][0, s, j] = float(act)
            res["peak_bytes"][0, s, j] = peak
            res["oom_workers"][0, s, j] = peak > res["capacity_bytes"][0, s, j]
    res["oom"] = np.array([bool(res["oom_workers"][0].any())])
