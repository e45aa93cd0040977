"""Analytic per-layer profile: each layer's time from the operations it runs, on any catalog GPU,
under a software stack.

A transformer block's forward runs its matrix multiplies by shape (QKV, attention output, the
MLP's, per routed and shared expert for a mixture of experts; ``shoal.profiles.kernels`` times
each with tile and wave quantisation on the GPU's SMs), attention (fused flash attention where
the stack and the GPU have it, else the scores materialised: two batched GEMMs and the softmax
over them, memory-bound), and its element-wise kernels (norms, residual adds, the activation,
rotary embedding, dropout), memory-bound. The backward runs two GEMMs per forward GEMM (input
and weight gradients), the attention backward and twice the element-wise traffic. Tensor
parallelism (Megatron-LM, Shoeybi et al. 2019, §3) splits the GEMMs and attention heads over TP
ranks and adds two all-reduces of the hidden state per block in the forward pass and two in the
backward, inside the node (``shoal.profiles.collectives``). The embedding is a gather (its
backward a scatter-add), the head a norm, the logits GEMM and the loss over the vocabulary. The
optimizer update moves each parameter's state at the memory bandwidth.

Precision sets the peak (tensor-core fp16/bf16, tf32 or fp8 from the catalog; fp32 without
tensor cores) and the bytes per element. Every efficiency comes from the stack
(``shoal.specs.stack``); the stack's constants were fitted to measured runs and say where from.
"""

from __future__ import annotations

import numpy as np

from shoal.catalog import GPU
from shoal.catalog.stacks import DEFAULT_STACK, stacks
from shoal.profiles import collectives
from shoal.profiles.kernels import (
    Device,
    backward_shapes,
    flash_attention_s,
    gemms_s,
    memory_bound_s,
)
from shoal.profiles.layers import layer_sizes
from shoal.profiles.network import bandwidth
from shoal.specs.model import ModelSpec
from shoal.specs.stack import StackSpec

FLASH_ARCHITECTURES = ("Ampere", "Ada Lovelace", "Hopper", "Blackwell", "CDNA 3")
# optimizer traffic per parameter and update (reads and writes of weights, gradient and state)
UPDATE_BYTES = {("adam", "mixed"): 28.0, ("adam", "fp32"): 28.0, ("adam", "bf16"): 14.0,
                ("sgd", "mixed"): 20.0, ("sgd", "fp32"): 20.0, ("sgd", "bf16"): 10.0}


def precision_class(precision: str) -> str:
    """'fp32' (fp32 or tf32 weights), 'bf16' (everything in bf16) or 'mixed'."""
    return "fp32" if precision in ("fp32", "tf32") else "bf16" if precision == "bf16" else "mixed"


def peak_flops(gpu: GPU, precision: str) -> float:
    """The dense peak the plan's matrix multiplies run at: tensor-core fp16/bf16, fp8 or tf32
    where the GPU has them (fp8 and tf32 fall back to 16-bit and fp32), fp32 without."""
    if precision == "fp32":
        return gpu.flops_32
    if precision == "tf32":
        return gpu.flops_tf32 or gpu.flops_32
    if precision == "mixed-fp8":
        return gpu.flops_fp8 or gpu.flops_16
    return gpu.flops_16


def element_bytes(precision: str) -> float:
    """Bytes of one activation element."""
    return 4.0 if precision in ("fp32", "tf32") else 2.0


def architecture(gpu: GPU) -> str:
    return gpu.architecture


def uses_flash(gpu: GPU, stack: StackSpec, attention: str = "auto") -> bool:
    """Whether attention runs as a fused flash kernel on this GPU."""
    want = stack.attention if attention == "auto" else attention
    return want == "flash" and architecture(gpu) in FLASH_ARCHITECTURES


def device(gpu: GPU, stack: StackSpec, precision: str) -> Device:
    eff = stack.kernel_efficiency(gpu.name, architecture(gpu))
    sms = None if gpu.architecture == "CPU" else gpu.sm_count
    return Device(peak_flops=peak_flops(gpu, precision), mem_bw_Bps=gpu.mem_bw_Bps,
                  sm_count=sms, gemm=eff["gemm"], attention_fwd=eff["attention_fwd"],
                  attention_bwd=eff["attention_bwd"], memory=eff["memory"],
                  launch_s=eff["launch_s"], f_half_flops=gpu.f_half_flops or 1e6)


class AnalyticProfile:
    """Per-operation layer times for any model on any catalog GPU under a stack."""

    name = "analytic"

    def __init__(self, model: ModelSpec, seq_len: int, gpus: dict[str, GPU],
                 stack: StackSpec | None = None, *, optimizer: str = "adam",
                 precision: str = "mixed-fp16", attention: str = "auto",
                 intra_node: dict | None = None):
        if stack is None:

            stack = stacks()[DEFAULT_STACK]
        self.model = model
        self.seq_len = seq_len
        self.gpus = gpus
        self.stack = stack
        self.sizes = layer_sizes(model, seq_len)
        self.optimizer = optimizer
        self.precision = precision
        self.attention = attention
        self.intra = intra_node or {}  # GPU type -> measured link inside a node (network.Link)
        self._cache: dict[tuple[str, int, int], np.ndarray] = {}

    def flash(self, gpu: str) -> bool:
        return uses_flash(self.gpus[gpu], self.stack, self.attention)

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        key = (gpu, tp, mbs)
        if key not in self._cache:
            self._cache[key] = self._compute(self.gpus[gpu], tp, mbs)
        return self._cache[key]

    # ------------------------------------------------------------------------------ layers

    def _compute(self, g: GPU, tp: int, mbs: int) -> np.ndarray:
        dev = device(g, self.stack, self.precision)
        m = self.model
        out = np.zeros((m.num_layer_slots, 3))
        kinds: dict[bool, tuple[float, float]] = {}
        for i in range(m.num_layers):
            moe = m.is_moe_block(i)
            if moe not in kinds:
                kinds[moe] = self._block(g, dev, tp, mbs, moe)
            out[1 + i, :2] = kinds[moe]
        out[0, :2] = self._embedding(dev, tp, mbs)
        out[-1, :2] = self._head(dev, tp, mbs)
        out[:, 2] = self._updates(dev, tp)
        return out

    def _block(self, g: GPU, dev: Device, tp: int, mbs: int, moe: bool) -> tuple[float, float]:
        m, s = self.model, self.seq_len
        e = element_bytes(self.precision)
        ge = 1.0 if self.precision == "mixed-fp8" and g.flops_fp8 else e
        M = float(mbs * s)
        h = m.hidden_size
        heads = m.num_heads / tp
        q = heads * m.dhead
        kv = max(m.kv_heads / tp, 1.0) * m.dhead  # fewer KV heads than ranks: replicated
        up = 2 if m.mlp == "swiglu" else 1
        attn = [(M, q + 2 * kv, h), (M, h, q)]
        if moe:
            fe, n_e = m.expert_ffn / tp, m.num_experts
            routed = M * m.experts_per_token / n_e  # tokens per expert, evenly routed
            mlp = [(routed, up * fe, h, n_e), (routed, h, fe, n_e), (M, n_e, h)]
            if m.shared_experts:
                mlp += [(M, up * fe * m.shared_experts, h), (M, h, fe * m.shared_experts)]
            width = fe * (m.experts_per_token + m.shared_experts)
        else:
            width = m.ffn / tp
            mlp = [(M, up * width, h), (M, h, width)]
        fwd_g = attn + mlp
        t_f = gemms_s(dev, fwd_g, ge)
        t_b = gemms_s(dev, backward_shapes(fwd_g), ge)
        a_f, a_b = self._attention(g, dev, tp, mbs, e)
        el_bytes, el_kernels = self._elementwise_bytes(M, h, q, kv, width, up, e)
        if moe:  # tokens permuted to their experts and back, in both passes
            el_bytes += 2.0 * M * h * m.experts_per_token * e
            el_kernels += 2
        t_f += a_f + memory_bound_s(dev, el_bytes, el_kernels)
        t_b += a_b + memory_bound_s(dev, 2.0 * el_bytes, 2.0 * el_kernels)
        if tp > 1:
            ar = self._tp_allreduce(g, M * h * e, tp)
            t_f += 2 * ar
            t_b += 2 * ar
        return t_f, t_b

    def _attention(self, g: GPU, dev: Device, tp: int, mbs: int, e: float) -> tuple[float, float]:
        m, s = self.model, self.seq_len
        heads = m.num_heads / tp
        batch = mbs * heads
        if uses_flash(g, self.stack, self.attention):
            flops = 4.0 * batch * m.dhead * s * s * 0.5  # causal: the lower triangle
            return flash_attention_s(dev, flops, False), flash_attention_s(dev, flops, True)
        scores = [(s, s, m.dhead, batch), (s, m.dhead, s, batch)]
        f = gemms_s(dev, scores, e)
        b = gemms_s(dev, backward_shapes(scores), e)
        n = batch * s * s
        passes = 1.0 if self.stack.fused_elementwise else 3.0  # scale, mask, softmax
        drop = (2.0 * e + 1.0) * n if m.dropout > 0 else 0.0
        kernels = passes + (1 if m.dropout > 0 else 0)
        f += memory_bound_s(dev, passes * 2.0 * e * n + drop, kernels)
        b += memory_bound_s(dev, 2.0 * (passes * 2.0 * e * n + drop), 2 * kernels)
        return f, b

    def _elementwise_bytes(self, M: float, h: int, q: float, kv: float, width: float, up: int,
                           e: float) -> tuple[float, float]:
        """Bytes and kernels of a block's forward element-wise work on one TP rank."""
        m = self.model
        if self.stack.fused_elementwise:  # residual add fused into each norm
            nbytes, kernels = 2 * 4.0 * M * h * e, 2.0
        else:  # two norms (read, write) and two residual adds (two reads, a write)
            nbytes, kernels = 2 * 2.0 * M * h * e + 2 * 3.0 * M * h * e, 4.0
        nbytes += (up + 1) * M * width * e  # the activation: reads fc1's outputs, writes one
        kernels += 1
        if m.position == "rotary":
            nbytes += 2.0 * M * (q + kv) * e
            kernels += 2
        if m.dropout > 0:  # two sites: read, write and a one-byte mask
            nbytes += 2 * (2.0 * e + 1.0) * M * h
            kernels += 2
        return nbytes, kernels

    def _tp_allreduce(self, g: GPU, nbytes: float, tp: int) -> float:
        if g.name in self.intra:  # measured curve: bandwidth at this message size

            link = self.intra[g.name]
            bw, lat = float(bandwidth(link.single, nbytes)), link.latency_s
        else:
            eff = self.stack.kernel_efficiency(g.name, architecture(g))
            bw, lat = g.intra_node_bw_Bps * eff["link"], 0.0
        return float(collectives.ring_allreduce_s(nbytes, tp, bw, lat))

    def _embedding(self, dev: Device, tp: int, mbs: int) -> tuple[float, float]:
        m, e = self.model, element_bytes(self.precision)
        M = float(mbs * self.seq_len)
        h = m.hidden_size
        reads = 2.0 if m.position == "learned" else 1.0
        f = memory_bound_s(dev, M * h * e * (reads + 1), reads)
        # the gradient rows added into an fp32 table, which is zeroed first
        b = memory_bound_s(dev, M * h * (e + 8.0) + m.vocab_size / tp * h * 4.0, 2)
        return f, b

    def _head(self, dev: Device, tp: int, mbs: int) -> tuple[float, float]:
        m, e = self.model, element_bytes(self.precision)
        M = float(mbs * self.seq_len)
        h, v = m.hidden_size, m.vocab_size / tp
        ge = e
        logits = [(M, v, h)]
        kept = self.stack.memory.logits_bytes  # what the loss writes and keeps per logit
        loss_f = (e + kept + 4.0) * M * v
        f = gemms_s(dev, logits, ge) + memory_bound_s(dev, 2.0 * M * h * e + loss_f, 4)
        loss_b = (kept + e) * M * v
        b = gemms_s(dev, backward_shapes(logits), ge) + memory_bound_s(
            dev, 3.0 * M * h * e + loss_b, 3)
        return f, b

    def _updates(self, dev: Device, tp: int) -> np.ndarray:
        opt = "sgd" if self.optimizer == "sgd" else "adam"
        per_param = UPDATE_BYTES[(opt, precision_class(self.precision))]
        params = self.sizes.params / tp
        m = self.model
        tensors = np.full(len(params), 12.0 if m.norm == "layernorm" else 9.0)
        tensors[0] = 2.0 if m.position == "learned" else 1.0
        tensors[-1] = 2.0
        kernels = np.full(len(params), 1.0) if self.stack.fused_optimizer else 4.0 * tensors
        return params * per_param * self.stack.optimizer_passes / (
            dev.mem_bw_Bps * dev.memory) + kernels * dev.launch_s

