"""Per-layer sizes of a transformer: parameters, FLOPs, stored activations, boundary messages.

The layer list is ``[embedding, block x L, head]``. Activation sizes follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), §4.1: per block and sample,
``s*h*(10 + 24/t) + 5*a*s^2/t`` bytes with 16-bit activations and tensor parallelism t (no sequence
parallelism), generalised here to any FFN width, gated MLPs and grouped-query attention.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.specs.model import ModelSpec


@dataclass(frozen=True)
class LayerSizes:
    """Arrays over the layer list (length L + 2). Per sample of ``seq_len`` tokens."""

    params: np.ndarray  # parameters held by the layer (un-sharded)
    matmul_params: np.ndarray  # parameters that take part in a matmul per token
    fwd_flops: np.ndarray  # forward FLOPs per sample (un-sharded)
    boundary_bytes: float  # bytes sent to the next stage per sample (16-bit hidden state)
    seq_len: int

    @property
    def n(self) -> int:
        return len(self.params)


def layer_sizes(model: ModelSpec, seq_len: int) -> LayerSizes:
    h, s, v = model.hidden_size, seq_len, model.vocab_size
    q = model.num_heads * model.dhead
    kv = model.kv_heads * model.dhead
    f = model.ffn
    n_mlp = 3 if model.mlp == "swiglu" else 2
    attn = h * q + 2 * h * kv + q * h
    mlp = n_mlp * h * f
    biases = 0 if model.norm == "rmsnorm" else (q + 2 * kv + h + f * (n_mlp - 1) + h)
    norms = 2 * h * (1 if model.norm == "rmsnorm" else 2)
    block = attn + mlp + biases + norms
    emb = v * h + (model.max_seq_len * h if model.position == "learned" else 0)
    head = v * h + (h if model.norm == "rmsnorm" else 2 * h)  # final norm + output projection
    L = model.num_layers
    params = np.array([emb] + [block] * L + [head], dtype=float)
    mm = np.array([0.0] + [attn + mlp] * L + [v * h], dtype=float)
    attn_flops = 4.0 * s * s * q  # QK^T and attention x V, forward
    fwd = 2.0 * s * mm + np.array([0.0] + [attn_flops] * L + [0.0])
    return LayerSizes(params=params, matmul_params=mm, fwd_flops=fwd,
                      boundary_bytes=2.0 * s * h, seq_len=s)


def activation_bytes(model: ModelSpec, seq_len: int, tp: int, *, recompute: bool,
                     flash_attention: bool = False) -> np.ndarray:
    """Bytes kept for the backward pass per sample, per layer, on one TP rank.

    With full recompute a block keeps only its input (2*s*h); the working set of the block being
    recomputed is added once per worker by the memory model (``recompute_working_bytes``).
    """
    h, s, a, v = model.hidden_size, seq_len, model.num_heads, model.vocab_size
    q = model.num_heads * model.dhead
    kv = model.kv_heads * model.dhead
    f = model.ffn
    n_mlp_out = 2 if model.mlp == "swiglu" else 1
    # Unsharded: two norm inputs (4sh), attention and MLP inputs (4sh... counted in the 10sh) and
    # two dropout masks (2sh): Korthikanti's 10sh.
    unsharded = 10.0 * s * h
    # Sharded over TP: Q, K, V (2s(q+2kv)), attention-projection input (2sq), MLP hidden
    # (fc1 output and activation output: 2s*f*(1 + n_mlp_out)), attention dropout masks.
    sharded = 2.0 * s * (q + 2 * kv) + 2.0 * s * q + 2.0 * s * f * (1 + n_mlp_out) + 0.0
    # Flash attention keeps the log-sum-exp per row (fp32); otherwise the softmax output (2 bytes),
    # dropout mask (1) and dropout output (2) per score.
    scores = 4.0 * s * a if flash_attention else 5.0 * a * s * s
    block = unsharded + (sharded + scores) / tp
    if recompute:
        block = 2.0 * s * h
    emb = 3.0 * s * h  # embedding output (2 bytes) and its dropout mask (1 byte)
    head = 8.0 * s * v / tp + 4.0 * s * h  # fp32 logits and their softmax; final-norm input
    return np.array([emb] + [block] * model.num_layers + [head], dtype=float)


def recompute_working_bytes(model: ModelSpec, seq_len: int, tp: int,
                            flash_attention: bool = False) -> float:
    """Activations of one block rebuilt during backward with full recompute (per sample)."""
    return float(activation_bytes(model, seq_len, tp, recompute=False,
                                  flash_attention=flash_attention)[1])
