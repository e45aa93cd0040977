"""Analytic per-layer profile: time from FLOPs, bytes and the GPU's datasheet peaks.

A GEMM-heavy layer of F FLOPs per GPU runs at ``peak * e_max * F / (F + f_half)``: small
operations do not fill the GPU (kernel launch, wave quantisation), large ones approach ``e_max``.
Memory-bound work (element-wise ops over activations, the optimizer update) moves bytes at the
GPU's memory bandwidth. Tensor parallelism adds two all-reduces of the hidden state per block in
the forward pass and two in the backward (Megatron-LM, Shoeybi et al. 2019, §3) over the node's
GPU-to-GPU link (the scenario's measured ``network.intra_node`` curve, else the datasheet's).
One set of constants serves every GPU: they were fitted once by
``benchmarks/fit_analytic.py`` to Sailor's published per-layer profiles (6 GPU types, 3
models) and are reported with their error in BENCHMARKS.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.catalog import GPU
from shoal.profiles.layers import activation_bytes, layer_sizes
from shoal.specs.model import ModelSpec


@dataclass(frozen=True)
class AnalyticConstants:
    e_max: float = 0.348  # best fraction of the dense tensor-core peak a GEMM-heavy layer reaches
    f_half_flops: float = 7.85e10  # per-GPU FLOPs of a layer at which it reaches half of e_max
    mem_passes: float = 4.56  # element-wise passes over the stored activations per forward
    layer_overhead_s: float = 0.0  # fixed cost per layer and pass (launches, hooks)
    bwd_over_fwd: float = 2.28  # backward time / forward time for the same work
    update_bytes_per_param: float = 157.0  # optimizer step traffic per parameter (incl. fp16 casts)
    tp_allreduce_efficiency: float = 0.7  # achieved / nominal intra-node bandwidth for all-reduce
    update_overhead_s: float = 6.8e-4  # per layer: optimizer kernels launched per parameter group
    score_passes: float = 13.1  # passes over attention scores (mask, softmax, dropout) per forward

    def with_(self, **kw) -> AnalyticConstants:
        return AnalyticConstants(**{**self.__dict__, **kw})


class AnalyticProfile:
    """Roofline-with-efficiency layer times for any model on any catalog GPU."""

    name = "analytic"

    def __init__(self, model: ModelSpec, seq_len: int, gpus: dict[str, GPU],
                 constants: AnalyticConstants | None = None, *, optimizer: str = "adam",
                 precision: str = "mixed-fp16", flash_attention: bool = False,
                 intra_node: dict | None = None):
        self.model = model
        self.seq_len = seq_len
        self.gpus = gpus
        self.c = constants or AnalyticConstants()
        self.sizes = layer_sizes(model, seq_len)
        self.optimizer = optimizer
        self.precision = precision
        self.flash = flash_attention
        self.intra = intra_node or {}  # GPU type -> measured link inside a node (network.Link)
        self._cache: dict[tuple[str, int, int], np.ndarray] = {}

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        key = (gpu, tp, mbs)
        if key not in self._cache:
            self._cache[key] = self._compute(self.gpus[gpu], tp, mbs)
        return self._cache[key]

    def _compute(self, g: GPU, tp: int, mbs: int) -> np.ndarray:
        c = self.c
        peak = g.flops_32 if self.precision == "fp32" else g.flops_16
        flops = self.sizes.fwd_flops * mbs / tp
        eff = c.e_max * flops / (flops + (g.f_half_flops or c.f_half_flops))
        t_gemm = np.where(flops > 0, flops / (peak * np.maximum(eff, 1e-9)), 0.0)
        act = activation_bytes(self.model, self.seq_len, tp, recompute=False,
                               flash_attention=self.flash) * mbs
        t_mem = c.mem_passes * act / g.mem_bw_Bps
        if not self.flash:
            scores = 2.0 * self.model.num_heads * self.seq_len**2 * mbs / tp  # fp16 scores
            t_mem[1:-1] += c.score_passes * scores / g.mem_bw_Bps
        fwd = t_gemm + t_mem + c.layer_overhead_s
        bwd = c.bwd_over_fwd * (t_gemm + t_mem) + c.layer_overhead_s
        fwd[0] = act[0] / g.mem_bw_Bps + c.layer_overhead_s  # embedding: a gather
        bwd[0] = 2 * self.sizes.params[0] / tp * 2 / g.mem_bw_Bps + c.layer_overhead_s
        if tp > 1:
            msg = 2.0 * mbs * self.seq_len * self.model.hidden_size  # fp16 hidden state
            if g.name in self.intra:  # measured curve: bandwidth at this message size
                from shoal.profiles.network import bandwidth

                bw = float(bandwidth(self.intra[g.name].single, msg))
            else:
                bw = g.intra_node_bw_Bps
            ar = 2.0 * (tp - 1) / tp * msg / (bw * c.tp_allreduce_efficiency)
            fwd[1:-1] += 2 * ar
            bwd[1:-1] += 2 * ar
        per_param = c.update_bytes_per_param if self.optimizer != "sgd" else 16.0
        upd = self.sizes.params / tp * per_param / g.mem_bw_Bps + c.update_overhead_s
        return np.stack([fwd, bwd, upd], axis=1)
