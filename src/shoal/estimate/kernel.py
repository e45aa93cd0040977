"""The estimator's one set of formulas, vectorised over a batch of candidate plans.

A batch holds B plans padded to S stages and R replicas per stage. Replica r of every stage
belongs to pipeline r (Sailor's plan shape, §4.2: D pipelines, each a chain of one replica per
stage), and pipeline r runs ``m[r]`` microbatches.

Time (Sailor §4.3, with Narayanan et al. 2021's 1F1B): per microbatch, stage s of pipeline r
takes ``t[s,r] = fwd + bwd`` plus its sends (activations to s+1, gradients to s-1) and, for
``recv_fraction`` of each transfer, its receives: sends and receives block, as in Megatron-LM's
and DeepSpeed's pipeline engines. Each pipeline's schedule
(1F1B or GPipe) gives when every stage ends its last backward (``shoal.estimate.pipeline``: exact
max-plus recurrence, capped by the closed form ``(m-1) * max_s t[s] + sum_s t[s]``). Each stage
then reduces its gradients over its replicas (``shoal.profiles.collectives``: a ring over the
slowest hop of the ring, inside one node over its GPU-to-GPU links when the stage's replicas
fit one node; ZeRO 1 and 2 reduce-scatter and all-gather instead), the part the stack overlaps
with the last microbatch's backward hidden there, then updates. ZeRO-3 gathers the stage's
weights in every microbatch's forward and again in its backward and reduce-scatters its
gradients in the backward, hidden behind that compute as far as the stack prefetches. The
iteration ends when the last stage has updated.

Memory (Sailor §4.3, per worker): weights, gradients and optimizer state of the worker's layers at
its TP degree (ZeRO shards optimizer state, and at stage 2 gradients, over the stage's replicas),
gradient buckets, activations for the microbatches the stage keeps in flight (1F1B: stage s of
P holds P - s; GPipe: all), one rebuilt block under recompute, and a fixed framework part.

Money (Sailor §4.3): GPU $/s x used GPUs x iteration time, plus egress bytes x $/byte per zone pair
for pipeline and gradient traffic.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shoal.estimate import pipeline as _pipeline
from shoal.estimate.tables import CostTables
from shoal.problem import MemoryConstants, TimeConstants
from shoal.profiles import collectives
from shoal.profiles.network import bandwidth


@dataclass
class Batch:
    """B candidate plans, padded. Replica arrays are (B, S, R); masks mark real entries."""

    mbs_idx: np.ndarray  # (B,) index into tables.mbs
    ls: np.ndarray  # (B, S) first layer
    le: np.ndarray  # (B, S) end layer (exclusive)
    smask: np.ndarray  # (B, S)
    g: np.ndarray  # (B, S, R) GPU index
    t: np.ndarray  # (B, S, R) TP index
    z: np.ndarray  # (B, S, R) zone index
    m: np.ndarray  # (B, S, R) microbatches
    rmask: np.ndarray  # (B, S, R)
    recompute: np.ndarray  # (B,) bool
    zero: np.ndarray  # (B,) int
    gpipe: np.ndarray  # (B,) bool

    @property
    def size(self) -> int:
        return len(self.mbs_idx)


def pipeline_makespan(f_all: np.ndarray, b_all: np.ndarray, m: np.ndarray,
                      gpipe: np.ndarray | bool = False) -> np.ndarray:
    """Makespan of pipelines laid out as (B, S, R); see ``shoal.estimate.pipeline``."""
    B, S, _ = f_all.shape
    gp = np.broadcast_to(np.asarray(gpipe, dtype=bool).reshape(-1), (B,))
    n_st = (np.abs(f_all) + np.abs(b_all) > 0).any(axis=2)
    n_stages = np.where(n_st.any(axis=1), S - np.argmax(n_st[:, ::-1], axis=1), 1)
    return _pipeline.makespan(f_all, b_all, np.asarray(m, dtype=float), gp, n_stages)


def _take(a: np.ndarray, idx: np.ndarray, axis: int) -> np.ndarray:
    return np.take_along_axis(a, idx, axis=axis)


class Worker(NamedTuple):
    """Where a worker sits, as broadcastable arrays: GPU index (``CostTables.gi``), the layers
    [``first_layer``, ``end_layer``) it holds, TP index (``CostTables.ti``), the microbatch
    size and whether it recomputes activations."""

    gpu_index: object
    first_layer: object
    end_layer: object
    tp_index: object
    mbs: object
    recompute: object


def worker_memory(tb: CostTables, mem: MemoryConstants, state_bytes: tuple[float, float, float],
                  w: Worker, inflight, zero, dp):
    """(weights + gradients + optimizer state, gradient buffers, activations) in bytes of one
    worker ``w``, for broadcastable arrays of its fields and the other inputs.

    ``inflight``: microbatches whose activations the worker holds; ``dp``: the stage's replicas
    (ZeRO 1 shards the optimizer state over them, ZeRO 2 the gradients too, ZeRO 3 the
    weights too, which it gathers a layer at a time: the shard plus the current and the
    prefetched layer, never more than the whole stage)."""
    w_b, g_b, o_b = state_bytes
    ls, le = w.first_layer, w.end_layer
    tpv = np.asarray(tb.tps, dtype=float)[w.tp_index]
    params_w = (tb.cum_params[le] - tb.cum_params[ls]) / tpv
    dd = np.asarray(dp, dtype=float)
    weights = params_w * w_b
    if np.any(zero >= 3):  # the table gather only when some plan shards weights
        gathered = np.minimum(params_w, 2.0 * tb.range_max_params[ls, le] / tpv)
        weights = np.where(zero >= 3, np.minimum(params_w, params_w / dd + gathered), params_w) * w_b
    per_param = np.where(zero >= 2, g_b / dd, g_b) + np.where(zero >= 1, o_b / dd, o_b)
    states = (weights + params_w * per_param) * mem.state_factor
    buffers = params_w * mem.comm_buffer_bytes_per_param
    per_mb, once = activation_parts(tb, w)
    return states, buffers, (per_mb * inflight + once) * mem.activation_factor


def activation_parts(tb: CostTables, w: Worker):
    """A worker's activation bytes before ``MemoryConstants.activation_factor``, as (bytes per
    microbatch in flight, bytes held once: the recomputed layer's work space); broadcasts
    like ``worker_memory``, which adds them as ``per_mb * inflight + once``."""
    g, t, ls, le = w.gpu_index, w.tp_index, w.first_layer, w.end_layer
    cum_a = np.where(w.recompute, tb.cum_act_rc[g, t, le] - tb.cum_act_rc[g, t, ls],
                     tb.cum_act[g, t, le] - tb.cum_act[g, t, ls])
    return cum_a * w.mbs, np.where(w.recompute, tb.rc_work[g, t] * w.mbs, 0.0)


def p2p_s(tb: CostTables, tc: TimeConstants, mbs_idx, lid):
    """Seconds of one microbatch's pipeline transfer on link ``lid`` (``CostTables.link_id``)
    at microbatch-size index ``mbs_idx``, as every estimate charges it; broadcasts."""
    return tb.p2p_time[mbs_idx, lid] * tc.p2p_scale + tc.p2p_overhead_s


def ring_allreduce_s(tb: CostTables, rid, d, gbytes, sync_scale: float = 1.0):
    """Seconds of a ring all-reduce of ``gbytes`` over ``d`` members whose slowest hop is link
    ``rid`` (``CostTables.link_id``): ``collectives.ring_allreduce_s`` at the link's bandwidth
    for that message size. Broadcasts over array inputs."""
    return ring_from_terms(ring_terms(tb, rid, gbytes), d, sync_scale)


def intra_ring_allreduce_s(tb: CostTables, g, d, gbytes, sync_scale: float = 1.0):
    """The same ring over ``d`` members inside one node of GPU index ``g``: its GPU-to-GPU
    links (each member sends its own share of ``gbytes``: TP ranks' rings run side by side
    on their own links)."""
    return ring_from_terms(intra_terms(tb, g, gbytes), d, sync_scale)


def intra_terms(tb: CostTables, g, gbytes) -> tuple[np.ndarray, np.ndarray]:
    """``ring_terms`` of ``gbytes`` over one node's GPU-to-GPU links of GPU index ``g``."""
    curve = tb.intra_curve[g]
    return gbytes / bandwidth(curve, gbytes), tb.intra_lat[g]


def ring_terms(tb: CostTables, rid, gbytes) -> tuple[np.ndarray, np.ndarray]:
    """The parts of ``ring_allreduce_s`` that do not depend on the member count: seconds to
    move all ``gbytes`` over link ``rid`` at its bandwidth for that message size, and the
    link's latency (``ring_from_terms`` combines them for a count)."""
    rdiv = tb.flat_div.take(rid)
    return gbytes / (rdiv * bandwidth(tb.flat_curve[rid], gbytes / rdiv)), tb.flat_lat.take(rid)


def ring_from_terms(terms: tuple[np.ndarray, np.ndarray], d, sync_scale: float = 1.0):
    """``ring_allreduce_s`` over ``d`` members from its ``ring_terms``; broadcasts."""
    move, lat = terms
    return collectives.ring_allreduce_s(move, d, 1.0, lat) * sync_scale


class RingBound(NamedTuple):
    """``ring_terms`` (move, latency; last axis: candidate links) of a data-parallel ring's hop
    over links at the replicas' own TP flows (``own``), at a whole node's flows (``node``), and
    inside one node (``inside``), with the most replicas of that TP one node holds
    (``per_node``): what ``_dp_ring`` can take, by the ring's member count
    (``ring_bound_at``)."""

    own: tuple[np.ndarray, np.ndarray]
    node: tuple[np.ndarray, np.ndarray] | None  # None: a hop between two kinds
    inside: tuple[np.ndarray, np.ndarray] | None
    per_node: int


def ring_bound_terms(tb: CostTables, rid, g: int, tp: int, gbytes, same_kind: bool) -> RingBound:
    """The candidates of a data-parallel ring's hop from a replica of GPU index ``g`` at TP
    ``tp`` over links ``rid`` (at ``tp`` flows) to another of the same kind or not
    (``same_kind``; replicas of one kind may share a node and then ring inside it)."""
    own = ring_terms(tb, rid, gbytes)
    if not same_kind:
        return RingBound(own, None, None, 1)
    gpn = int(tb.gpus_per_node[g])
    per_node = max(gpn // tp, 1)
    T = tb._dims[2]
    ti = np.asarray(rid) % T
    node_rid = np.asarray(rid) - ti + tb.tp_pos[per_node * tp]
    return RingBound(own, ring_terms(tb, node_rid, gbytes), intra_terms(tb, g, gbytes / tp),
                     per_node)


def ring_bound_at(bound: RingBound, d: int) -> tuple[np.ndarray, np.ndarray]:
    """``bound``'s candidates for a ring of ``d`` members: its own links, and for a ring of
    one kind, one node's GPU-to-GPU links when the members fit one node, else the links at a
    node's flows (replicas packed into nodes; such a ring is no faster than that)."""
    move, lat = bound.own
    if bound.node is None:
        return move, lat
    if d <= bound.per_node:
        m_in, l_in = bound.inside
        col = move.shape[:-1] + (1,)
        return (np.concatenate([move, np.broadcast_to(m_in, col)], axis=-1),
                np.concatenate([lat, np.broadcast_to(l_in, col)], axis=-1))
    return (np.concatenate([move, bound.node[0]], axis=-1),
            np.concatenate([lat, bound.node[1]], axis=-1))


def exposed_sync(ring_s, ends, bwd, rm, stage_end, overlap: float):
    """Seconds a stage's gradient reduction (``ring_s`` per stage) adds after its last
    backward (``stage_end``): the reduction of a gradient bucket starts once every replica has
    produced it in its last backward (replica ends ``ends``, backward compute ``bwd``, mask
    ``rm``: (..., S, R)), so as far as the stack overlaps them the ring runs from the latest
    start of a replica's last backward; a share ``1 - overlap`` follows the stage's end."""
    sync = (1.0 - overlap) * ring_s
    if overlap > 0:
        started = np.where(rm, ends - overlap * bwd, -np.inf).max(axis=-1)
        sync = np.maximum(sync, started + ring_s - stage_end)
    return sync


class DpRing(NamedTuple):
    """A stage's data-parallel ring, per replica (B, S, R) unless said: ``d`` members of the
    stage (B, S, 1), replica r sends to the next one (GPU ``gn``, zone ``zn``) over link
    ``rid``, its slowest hop, whose curve is that of the node's concurrent flows
    (``per_node`` replicas of ``tpv`` TP ranks each); ``in_node``: the whole ring inside one
    node of GPU index ``g``."""

    d: np.ndarray
    g: np.ndarray
    gn: np.ndarray
    zn: np.ndarray
    tpv: np.ndarray
    per_node: np.ndarray
    in_node: np.ndarray
    rid: np.ndarray


def _dp_layout(tb: CostTables, bt: Batch, tpv: np.ndarray) -> DpRing:
    """The data-parallel ring of every stage of the batch: replica r sends to r+1, over its
    slowest hop. Replicas of one GPU type in one zone pack into nodes: the ring crosses nodes
    through their networks (the flows of every replica of a node sharing it) and runs inside
    a node over its GPU-to-GPU links; a stage that fits one node never leaves it."""
    g, z, rm = bt.g, bt.z, bt.rmask
    R = g.shape[2]
    d = np.maximum(rm.sum(axis=2), 1)[:, :, None]
    nxt = (np.arange(R)[None, None, :] + 1) % d  # ring successor inside the stage
    gn, zn = _take(g, nxt, 2), _take(z, nxt, 2)
    same = (((g == g[:, :, :1]) & (z == z[:, :, :1])) | ~rm).all(axis=2, keepdims=True)
    per_node = np.where(same, np.clip(tb.gpus_per_node[g] // tpv, 1, d), 1.0)
    in_node = (per_node >= d) & (d > 1) & rm
    rid = tb.link_id(g, z, gn, zn, tb.tp_pos[(per_node * tpv).astype(np.int64)])
    return DpRing(d, g, gn, zn, tpv, per_node, in_node, rid)


def _dp_ring(tb: CostTables, ring: DpRing, gbytes, sync_scale: float):
    """A stage's data-parallel ring all-reduce of ``gbytes`` (the stage's, over all its TP
    ranks' rings side by side): inside one node where ``ring.in_node`` (each TP rank's ring on
    its own GPU-to-GPU links); else over the ring's slowest hop, and where several replicas
    share a node, no faster than its GPU-to-GPU links (NCCL's rings pipeline both)."""
    across = ring_allreduce_s(tb, ring.rid, ring.d, gbytes, sync_scale)
    if not (ring.per_node > 1).any():
        return across
    inside = intra_ring_allreduce_s(tb, ring.g, ring.d, gbytes / ring.tpv, sync_scale)
    return np.where(ring.in_node, inside,
                    np.where(ring.per_node > 1, np.maximum(across, inside), across))


def _subset(bt: Batch, idx: np.ndarray, r: int) -> Batch:
    return Batch(mbs_idx=bt.mbs_idx[idx], ls=bt.ls[idx], le=bt.le[idx], smask=bt.smask[idx],
                 g=bt.g[idx, :, :r], t=bt.t[idx, :, :r], z=bt.z[idx, :, :r], m=bt.m[idx, :, :r],
                 rmask=bt.rmask[idx, :, :r], recompute=bt.recompute[idx], zero=bt.zero[idx],
                 gpipe=bt.gpipe[idx])


def run(tb: CostTables, bt: Batch, mem: MemoryConstants, tc: TimeConstants,
        bytes_per_grad: float = 2.0, state_bytes: tuple[float, float, float] = (2.0, 2.0, 12.0),
        detail: bool = False) -> dict[str, np.ndarray]:
    """Estimate a batch. Without ``detail``, large batches of plans with different replica counts
    are evaluated in buckets of similar width, so short plans do not pay for the widest one."""
    B, S, R = bt.g.shape
    if detail or B < 256 or R <= 8:
        return _run(tb, bt, mem, tc, bytes_per_grad, state_bytes, detail)
    width = bt.rmask.any(axis=1).sum(axis=1)  # replicas used per plan
    bucket = (width + 7) // 8
    out: dict[str, np.ndarray] = {}
    for k in np.unique(bucket):
        idx = np.nonzero(bucket == k)[0]
        r = int(min(R, 8 * k))
        part = _run(tb, _subset(bt, idx, r), mem, tc, bytes_per_grad, state_bytes, False)
        for name, v in part.items():
            if name not in out:
                out[name] = np.zeros((B,) + v.shape[1:-1] + ((R,) if v.ndim == 3 else ()), v.dtype) \
                    if v.ndim == 3 else np.zeros((B,) + v.shape[1:], v.dtype)
            if v.ndim == 3:
                out[name][idx, :, :r] = v
            else:
                out[name][idx] = v
    return out


class _Compute(NamedTuple):
    """Seconds per microbatch of every worker (B, S, R): forward, backward (with the
    recomputed forward) and the optimizer step (ZeRO: its shard)."""

    fwd: np.ndarray
    bwd: np.ndarray
    update: np.ndarray


def _compute(tb: CostTables, bt: Batch, tc: TimeConstants) -> _Compute:
    """Every worker's compute per microbatch. Gathers go through flat indices: one take per
    table instead of 4-D fancy indexing."""
    g, t = bt.g, bt.t
    mi = bt.mbs_idx[:, None, None]
    ls, le = bt.ls[:, :, None], bt.le[:, :, None]
    L1 = tb.cum_f.shape[-1]
    T_, M_ = tb.cum_f.shape[1], tb.cum_f.shape[2]
    row = ((g * T_ + t) * M_ + mi) * L1
    cf, cb = tb.cum_f.ravel(), tb.cum_b.ravel()
    f = (cf.take(row + le) - cf.take(row + ls)) * tc.compute_scale
    bw_ = (cb.take(row + le) - cb.take(row + ls)) * tc.compute_scale
    bw_ = bw_ + np.where(bt.recompute[:, None, None], f, 0.0)
    urow = (g * T_ + t) * L1
    cu = tb.cum_u.ravel()
    upd = cu.take(urow + le) - cu.take(urow + ls)
    stage_d = bt.rmask.sum(axis=2)  # (B, S) replicas per stage
    zero_div = np.where(bt.zero[:, None] >= 1, np.maximum(stage_d, 1), 1)[:, :, None]
    return _Compute(f, bw_, upd / zero_div)


def _zero3(tb: CostTables, tc: TimeConstants, ring: DpRing, stage_bytes: tuple, z3: np.ndarray,
           c: _Compute) -> _Compute:
    """``c`` with ZeRO-3's gathers of the stage's weights (``stage_bytes``: (weights,
    gradients) of the stage, (B, S, 1)) in every microbatch's forward and again in its
    backward, and the reduce-scatter of its gradients there, where ``z3``: hidden behind the
    compute as far as the stack prefetches."""
    w_bytes, g_bytes = stage_bytes
    gather = 0.5 * _dp_ring(tb, ring, w_bytes, tc.sync_scale)
    scatter = 0.5 * _dp_ring(tb, ring, g_bytes, tc.sync_scale)
    hide = tc.param_gather_overlap
    f = c.fwd + np.where(z3, np.maximum(gather - hide * c.fwd, 0.0), 0.0)
    bw_ = c.bwd + np.where(z3, np.maximum(gather + scatter - hide * c.bwd, 0.0), 0.0)
    return c._replace(fwd=f, bwd=bw_)


class _Sends(NamedTuple):
    """Seconds per microbatch of the pipeline's transfers (B, S, R): activations s -> s+1
    and gradients s -> s-1 (same link, same size) each stage sends, and those it receives."""

    fwd: np.ndarray
    bwd: np.ndarray
    recv_fwd: np.ndarray
    recv_bwd: np.ndarray


def _sends(tb: CostTables, bt: Batch, tc: TimeConstants) -> _Sends:
    """Pipeline sends: stage s -> s+1 on the same pipeline."""
    B, S, R = bt.g.shape
    g, z, t, rm = bt.g, bt.z, bt.t, bt.rmask
    send = np.zeros((B, S, R))
    if S > 1:
        lid = tb.link_id(g[:, :-1], z[:, :-1], g[:, 1:], z[:, 1:], t[:, :-1])
        pair = rm[:, :-1] & rm[:, 1:]
        tt = p2p_s(tb, tc, bt.mbs_idx[:, None, None], lid)
        send[:, :-1] = np.where(pair, tt, 0.0)
    send_bwd = np.zeros_like(send)
    send_bwd[:, 1:] = send[:, :-1]
    recv_fwd = np.zeros_like(send)
    recv_fwd[:, 1:] = send[:, :-1]
    return _Sends(send, send_bwd, recv_fwd, send)


class _Memory(NamedTuple):
    """Bytes per worker (B, S, R): model states, gradient buffers, activations, the peak and
    the GPU's capacity; microbatches in flight; workers and plans out of memory."""

    states: np.ndarray
    buffers: np.ndarray
    act: np.ndarray
    inflight: np.ndarray
    peak: np.ndarray
    cap: np.ndarray
    oom_w: np.ndarray
    oom: np.ndarray


def _memory(tb: CostTables, bt: Batch, mem: MemoryConstants,
            state_bytes: tuple[float, float, float], mbs: np.ndarray, d: np.ndarray) -> _Memory:
    """Memory per worker (``mbs``: (B,) microbatch sizes; ``d``: (B, S, 1) replicas per
    stage). 1F1B holds P - s microbatches in flight at stage s, GPipe all."""
    S = bt.g.shape[1]
    rm = bt.rmask
    rmf = rm.astype(float)
    n_stages = bt.smask.sum(axis=1)[:, None, None]
    m_rep = bt.m.astype(float)
    s_idx = np.arange(S)[None, :, None]
    inflight = np.where(bt.gpipe[:, None, None], m_rep, np.minimum(n_stages - s_idx, m_rep))
    w = Worker(bt.g, bt.ls[:, :, None], bt.le[:, :, None], bt.t, mbs[:, None, None],
               bt.recompute[:, None, None])
    states, buffers, act = worker_memory(tb, mem, state_bytes, w, inflight,
                                         bt.zero[:, None, None], d)
    peak = (mem.framework_bytes + states + buffers + act) * rmf
    cap = tb.mem_capacity[bt.g]
    oom_w = (peak > cap) & rm
    return _Memory(states, buffers, act, inflight, peak, cap, oom_w, oom_w.any(axis=(1, 2)))


def _egress(tb: CostTables, bt: Batch, msg: np.ndarray, m_pipe: np.ndarray,
            ring: DpRing, ring_bytes: np.ndarray, z3: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(USD of egress per plan, the part of its gradient rings): ``msg`` bytes per microbatch
    between stages, ``m_pipe`` (B, R) microbatches per pipeline, ``ring_bytes`` (B, S, 1)
    each ring member sends (ZeRO-3 moves a ring's bytes in every microbatch, where ``z3``)."""
    B, S, _ = bt.g.shape
    z, rm = bt.z, bt.rmask
    eg = np.zeros(B)
    if S > 1:
        per_b = tb.egress_per_byte[z[:, :-1], z[:, 1:]]
        pair = (rm[:, :-1] & rm[:, 1:]).astype(float)
        eg += (2.0 * msg * m_pipe[:, None, :] * per_b * pair).sum(axis=(1, 2))
    ring_b = tb.egress_per_byte[z, ring.zn]
    n_rings = np.where(z3, 1.5 * m_pipe[:, None, :], 1.0)
    eg_ring = (np.where(rm & (ring.d > 1), ring_bytes * ring_b * n_rings, 0.0)).sum(axis=(1, 2))
    eg += eg_ring
    return eg, eg_ring


def _gradient_sync(tb: CostTables, bt: Batch, tc: TimeConstants, ring: DpRing,
                   gbytes: np.ndarray, z3: np.ndarray) -> np.ndarray:
    """(B, S) seconds of each stage's data-parallel gradient reduction (ZeRO: reduce-scatter,
    then all-gather; ZeRO-3 reduced its gradients in every backward already)."""
    rm, d = bt.rmask, ring.d
    ring_s = _dp_ring(tb, ring, gbytes, tc.sync_scale)
    if tc.sharded_sync_ratio != 1.0:  # ZeRO: reduce-scatter, then all-gather
        ring_s = np.where((bt.zero >= 1)[:, None, None], ring_s * tc.sharded_sync_ratio, ring_s)
    return np.where(rm & (d > 1) & ~z3, ring_s, 0.0).max(axis=2)  # (B, S)


def _run(tb: CostTables, bt: Batch, mem: MemoryConstants, tc: TimeConstants,
         bytes_per_grad: float, state_bytes: tuple[float, float, float],
         detail: bool) -> dict[str, np.ndarray]:
    rm = bt.rmask
    rmf = rm.astype(float)
    mbs = np.asarray(tb.mbs)[bt.mbs_idx].astype(float)  # (B,)
    tpv = np.asarray(tb.tps)[bt.t].astype(float)
    c = _compute(tb, bt, tc)
    ring = _dp_layout(tb, bt, tpv)
    params_stage = tb.cum_params[bt.le] - tb.cum_params[bt.ls]  # (B, S)
    gbytes = (params_stage * bytes_per_grad)[:, :, None]
    z3 = (bt.zero[:, None, None] >= 3) & (ring.d > 1) & rm
    if z3.any():
        c = _zero3(tb, tc, ring, ((params_stage * tb.elem_bytes)[:, :, None], gbytes), z3, c)
    sends = _sends(tb, bt, tc)
    # A blocking receive also holds the receiving stage (DeepSpeed's and Megatron's engines wait
    # in recv before computing): ``recv_fraction`` of each transfer counts on the receiver too.
    rf = tc.recv_fraction
    f_all = (c.fwd + sends.fwd + rf * sends.recv_fwd) * rmf
    b_all = (c.bwd + sends.bwd + rf * sends.recv_bwd) * rmf
    m_pipe = bt.m[:, 0, :].astype(float)  # (B, R) microbatches per pipeline
    pipe_T, ends = _pipeline.schedule_times(f_all, b_all, m_pipe, bt.gpipe, bt.smask.sum(axis=1))
    stage_end = (ends * rmf).max(axis=2)  # (B, S) last backward of each stage
    # The reduction of a gradient bucket starts once every replica has produced it during its
    # last backward: as far as the stack overlaps it, the ring runs from the latest start of a
    # replica's last backward; a share (1 - overlap) of it follows the stage's last backward
    # whatever.
    ring_s = _gradient_sync(tb, bt, tc, ring, gbytes, z3)
    sync = exposed_sync(ring_s, ends, c.bwd, rm, stage_end, tc.grad_reduce_overlap)
    upd_stage = (c.update * rmf).max(axis=2)
    iter_T = (stage_end + sync + upd_stage).max(axis=1) + tc.step_overhead_s  # (B,)
    mm = _memory(tb, bt, mem, state_bytes, mbs, ring.d)
    # (padding slots point at a (GPU, zone) pair the pool may not price: NaN, kept out)
    gpu_s = np.where(rm, tpv * tb.price_per_s[bt.g, bt.z], 0.0).sum(axis=(1, 2))  # USD/s
    msg = tb.boundary_bytes * mbs[:, None, None]  # (B,1,1) bytes per microbatch
    eg, eg_ring = _egress(tb, bt, msg, m_pipe, ring, 2.0 * (ring.d - 1) / ring.d * gbytes, z3)
    out = {"iteration_time_s": iter_T, "cost_compute_usd": gpu_s * iter_T,
           "cost_egress_usd": eg, "oom": mm.oom, "peak_bytes": mm.peak,
           "capacity_bytes": mm.cap * rmf}
    if detail:
        out.update(fwd=c.fwd * rmf, bwd=c.bwd * rmf,
                   send_fwd=(sends.fwd + rf * sends.recv_fwd) * rmf,
                   send_bwd=(sends.bwd + rf * sends.recv_bwd) * rmf,
                   t_mb=f_all + b_all, pipe_T=pipe_T, stage_end=stage_end, sync=sync,
                   ring=ring_s, update=c.update * rmf, states=mm.states * rmf,
                   buffers=mm.buffers * rmf, activations=mm.act * rmf, oom_workers=mm.oom_w,
                   inflight=mm.inflight * rmf, egress=eg, egress_ring=eg_ring,
                   gpu_usd_per_s=gpu_s)
    return out
