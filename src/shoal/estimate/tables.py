"""Lookup tables the batched estimator kernel gathers from, built once per problem.

Layer times, parameters and activations are stored as prefix sums over the layer list, so that any
stage's total is one subtraction, whatever its layer range.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.problem import Problem
from shoal.profiles.analytic import architecture, element_bytes, peak_flops, precision_class
from shoal.profiles.layers import activation_bytes, recompute_working_bytes
from shoal.profiles.network import bandwidth


def _prefix(x: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros(x.shape[:-1] + (1,)), np.cumsum(x, axis=-1)], axis=-1)


def state_bytes(problem: Problem) -> tuple[float, tuple[float, float, float]]:
    """(bytes per gradient element as reduced, (weights, gradients, optimizer state) bytes per
    parameter): fp32 and tf32 keep everything in fp32; bf16 everything in bf16 (Adam's two
    moments included); mixed precision as the stack lays it out (fp32 master weights with the
    optimizer state, or fp32 weights cast to 16-bit as they are used). SGD keeps one moment."""
    sgd = problem.job.optimizer == "sgd"
    cls = precision_class(problem.job.precision)
    if cls == "fp32":
        return 4.0, (4.0, 4.0, 4.0 if sgd else 8.0)
    if cls == "bf16":
        return 2.0, (2.0, 2.0, 2.0 if sgd else 4.0)
    w, gr, opt = problem.memory.mixed_state_bytes
    return gr, (w, gr, opt - 4.0 if sgd else opt)


def default_tp_values(problem: Problem) -> list[int]:
    most = max((g.gpus_per_node for g in problem.gpus.values()), default=1)
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if t <= most]


@dataclass
class CostTables:
    gpus: list[str]
    zones: list[str]
    tps: list[int]
    mbs: list[int]
    cum_f: np.ndarray  # (G, T, M, L+1) seconds
    cum_b: np.ndarray
    cum_u: np.ndarray  # (G, T, L+1)
    cum_params: np.ndarray  # (L+1,)
    cum_act: np.ndarray  # (G, T, L+1) bytes per sample, no recompute
    cum_act_rc: np.ndarray  # (G, T, L+1) with full recompute
    rc_work: np.ndarray  # (G, T) bytes per sample of one block rebuilt in backward
    boundary_bytes: float  # per sample
    link_curve: np.ndarray  # (G, Z, G, Z, T, 5) aggregate curve for k = tps[t] flows
    link_div: np.ndarray  # (G, Z, G, Z, T) size divisor (k when built from the single flow)
    link_lat: np.ndarray  # (G, Z, G, Z)
    price_per_s: np.ndarray  # (G, Z) USD per GPU-second
    egress_per_byte: np.ndarray  # (Z, Z)
    mem_capacity: np.ndarray  # (G,)
    peak_flops: np.ndarray  # (G,)
    sources: dict[tuple[str, int], str]
    intra_curve: np.ndarray  # (G, 5) one GPU's link to the others of its node (collectives)
    intra_lat: np.ndarray  # (G,)
    gpus_per_node: np.ndarray  # (G,)
    elem_bytes: float  # bytes of one activation or compute-precision weight element

    def __post_init__(self) -> None:
        # largest single layer's parameters in [a, b): ZeRO-3 materialises one layer at a time
        lp = np.diff(self.cum_params)
        n = len(lp)
        rng = np.zeros((n + 1, n + 1))
        for a in range(n):
            rng[a, a + 1:] = np.maximum.accumulate(lp[a:])
        self.range_max_params = rng
        G, Z, _, _, T, _ = self.link_curve.shape
        self._dims = (G, Z, T)
        # TP index of k concurrent flows from a node (k a TP degree); others: the largest below
        top = max(self.tps)
        self.tp_pos = np.zeros(top * 64 + 1, dtype=np.int64)
        for k in range(1, len(self.tp_pos)):
            below = [i for i, t in enumerate(self.tps) if t <= k]
            self.tp_pos[k] = below[-1] if below else 0
        self.flat_curve = self.link_curve.reshape(-1, 5)
        self.flat_div = self.link_div.ravel()
        self.flat_lat = np.broadcast_to(self.link_lat[..., None], self.link_div.shape).ravel().copy()
        # pipeline send time per microbatch for every link and microbatch size: (M, links)
        msg = self.boundary_bytes * np.asarray(self.mbs, dtype=float)[:, None]

        self.p2p_time = self.flat_lat[None, :] + msg / (
            self.flat_div[None, :] * bandwidth(self.flat_curve[None, :, :], msg / self.flat_div[None, :]))

    def link_id(self, ga, za, gb, zb, t):
        G, Z, T = self._dims
        return (((ga * Z + za) * G + gb) * Z + zb) * T + t

    def cum_step(self, gpu: str, tp: int, mbs: int, recompute: bool) -> np.ndarray:
        """Prefix sums over the layer list of one replica's forward + backward seconds per
        microbatch (the forward twice under recompute), as the kernel adds them."""
        gi, ti, mi = self.gi(gpu), self.ti(tp), self.mi(mbs)
        return self.cum_f[gi, ti, mi] * (2.0 if recompute else 1.0) + self.cum_b[gi, ti, mi]

    def gi(self, gpu: str) -> int:
        return self.gpus.index(gpu)

    def ti(self, tp: int) -> int:
        return self.tps.index(tp)

    def mi(self, mbs: int) -> int:
        return self.mbs.index(mbs)


def build_tables(problem: Problem, mbs_values: list[int], tp_values: list[int] | None = None,
                 gpus: list[str] | None = None) -> CostTables:
    gpus = gpus or sorted(problem.gpus)
    zones = problem.zones
    tps = tp_values or default_tp_values(problem)
    mbs_values = sorted(set(mbs_values))
    L = problem.n_layers
    G, Z, T, M = len(gpus), len(zones), len(tps), len(mbs_values)
    f = np.zeros((G, T, M, L))
    b = np.zeros((G, T, M, L))
    u = np.zeros((G, T, L))
    sources = {}
    prof = problem.profile
    for gi, g in enumerate(gpus):
        for ti, t in enumerate(tps):
            src = prof.source(g, t) if hasattr(prof, "source") else prof.name
            sources[(g, t)] = src
            for mi, m in enumerate(mbs_values):
                lt = prof.layer_times(g, t, m)
                f[gi, ti, mi] = lt[:, 0]
                b[gi, ti, mi] = lt[:, 1]
            u[gi, ti] = lt[:, 2]
    act, act_rc, work = _activations(problem, gpus, tps)

    curve = np.zeros((G, Z, G, Z, T, 5))
    div = np.ones((G, Z, G, Z, T))
    lat = np.zeros((G, Z, G, Z))
    for a, ga in enumerate(gpus):
        for za_i, za in enumerate(zones):
            for c, gb in enumerate(gpus):
                for zb_i, zb in enumerate(zones):
                    link = problem.network.link(za, zb, ga, gb)
                    lat[a, za_i, c, zb_i] = link.latency_s
                    for ti, t in enumerate(tps):
                        cv, d = link.aggregate_curve(t)
                        curve[a, za_i, c, zb_i, ti] = cv
                        div[a, za_i, c, zb_i, ti] = d
    price = np.array([[problem.prices.get((g, z), np.nan) / 3600.0 for z in zones] for g in gpus])
    egress = np.array([[problem.network.egress_usd_per_byte(za, zb) for zb in zones] for za in zones])
    intra_curve, intra_lat = _intra_links(problem, gpus)
    return CostTables(
        gpus=gpus, zones=zones, tps=tps, mbs=mbs_values,
        cum_f=_prefix(f), cum_b=_prefix(b), cum_u=_prefix(u),
        cum_params=_prefix(problem.sizes.params), cum_act=act, cum_act_rc=act_rc,
        rc_work=work,
        boundary_bytes=problem.sizes.boundary_bytes * element_bytes(problem.job.precision) / 2.0,
        link_curve=curve, link_div=div, link_lat=lat, price_per_s=price, egress_per_byte=egress,
        mem_capacity=np.array([problem.gpus[g].memory_bytes for g in gpus]),
        peak_flops=np.array([peak_flops(problem.gpus[g], problem.job.precision) for g in gpus]),
        sources=sources, intra_curve=intra_curve, intra_lat=intra_lat,
        gpus_per_node=np.array([problem.gpus[g].gpus_per_node for g in gpus], dtype=float),
        elem_bytes=element_bytes(problem.job.precision),
    )


def _activations(problem: Problem, gpus: list[str], tps: list[int]):
    """Prefix sums over the layer list of activation bytes per sample, per (GPU, TP), without
    and with full recompute, and one rebuilt block's bytes per (GPU, TP): attention differs
    by GPU (flash or not)."""
    model, s = problem.model, problem.job.seq_len
    e = element_bytes(problem.job.precision)
    lb = problem.memory.logits_bytes
    G, T, L = len(gpus), len(tps), problem.n_layers
    act, act_rc, work = np.zeros((G, T, L)), np.zeros((G, T, L)), np.zeros((G, T))
    for gi, g in enumerate(gpus):
        fa = problem.flash(g)
        for ti, t in enumerate(tps):
            act[gi, ti] = activation_bytes(model, s, t, recompute=False, flash_attention=fa,
                                           elem_bytes=e, logits_bytes=lb)
            act_rc[gi, ti] = activation_bytes(model, s, t, recompute=True, flash_attention=fa,
                                              elem_bytes=e, logits_bytes=lb)
            work[gi, ti] = recompute_working_bytes(model, s, t, fa, e)
    # with recompute, embedding and head keep their full activations (only blocks recompute)
    act_rc[..., 0], act_rc[..., -1] = act[..., 0], act[..., -1]
    return _prefix(act), _prefix(act_rc), work


def _intra_links(problem: Problem, gpus: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per GPU type, the curve and latency of its link to the other GPUs of its node: the
    scenario's measured ``network.intra_node`` link, else the datasheet's bandwidth at the
    stack's share of it."""
    curve, lat = np.zeros((len(gpus), 5)), np.zeros(len(gpus))
    for gi, g in enumerate(gpus):
        link = problem.network.intra.get(g)
        if link is not None:
            curve[gi], lat[gi] = link.single, link.latency_s
            continue
        gpu = problem.gpus[g]
        share = 1.0
        if problem.stack is not None:
            share = problem.stack.kernel_efficiency(g, architecture(gpu))["link"]
        bw = gpu.intra_node_bw_Bps * share
        curve[gi] = [0.0, 0.0, bw / 1e9, bw, bw]
    return curve, lat
