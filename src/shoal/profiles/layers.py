"""Per-layer sizes of a transformer: parameters, FLOPs, stored activations, boundary messages.

The layer list is ``[embedding, block x L, head]``. Activation sizes follow Korthikanti et al.,
"Reducing Activation Recomputation in Large Transformer Models" (2022), §4.1: per block and sample,
``s*h*(10 + 24/t) + 5*a*s^2/t`` bytes with 16-bit activations and tensor parallelism t (no sequence
parallelism), generalised here to any FFN width, gated MLPs, grouped-query attention, flash
attention, dropout or none, and mixtures of experts.
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


def _mlp_params(model: ModelSpec, width: int) -> int:
    """Weights of one MLP of this width (biases apart)."""
    return (3 if model.mlp == "swiglu" else 2) * model.hidden_size * width


def block_parts(model: ModelSpec, i: int) -> dict[str, float]:
    """Block ``i``'s parameters and its matmul parameters per token (a mixture of experts
    holds every expert and its router but runs each token through ``experts_per_token`` routed
    experts and the shared ones)."""
    h = model.hidden_size
    q = model.num_heads * model.dhead
    kv = model.kv_heads * model.dhead
    attn = h * q + 2 * h * kv + q * h
    n_mlp = 3 if model.mlp == "swiglu" else 2
    norms = 2 * h * (1 if model.norm == "rmsnorm" else 2)
    biased = model.norm != "rmsnorm"
    if model.is_moe_block(i):
        fe = model.expert_ffn
        router = h * model.num_experts
        experts = model.num_experts + model.shared_experts
        mlp = experts * _mlp_params(model, fe) + router
        active = (model.experts_per_token + model.shared_experts) * _mlp_params(model, fe) + router
        mlp_bias = experts * (fe * (n_mlp - 1) + h) if biased else 0
    else:
        mlp = active = _mlp_params(model, model.ffn)
        mlp_bias = model.ffn * (n_mlp - 1) + h if biased else 0
    attn_bias = q + 2 * kv + h if biased else 0
    return {"params": attn + mlp + attn_bias + mlp_bias + norms, "matmul": attn + active}


def layer_sizes(model: ModelSpec, seq_len: int) -> LayerSizes:
    h, s, v = model.hidden_size, seq_len, model.vocab_size
    q = model.num_heads * model.dhead
    emb = v * h + (model.max_seq_len * h if model.position == "learned" else 0)
    head = v * h + (h if model.norm == "rmsnorm" else 2 * h)  # final norm + output projection
    L = model.num_layers
    parts = [block_parts(model, i) for i in range(L)]
    params = np.array([emb] + [p["params"] for p in parts] + [head], dtype=float)
    mm = np.array([0.0] + [p["matmul"] for p in parts] + [v * h], dtype=float)
    attn_flops = 4.0 * s * s * q  # QK^T and attention x V, forward, the whole square
    fwd = 2.0 * s * mm + np.array([0.0] + [attn_flops] * L + [0.0])
    return LayerSizes(params=params, matmul_params=mm, fwd_flops=fwd,
                      boundary_bytes=2.0 * s * h, seq_len=s)


def checkpoint_params(model: ModelSpec) -> float:
    """Parameters of the model as its checkpoint holds them (and model cards count them): the
    layer list's, with a tied input/output embedding counted once (the layer list gives the
    output projection its own copy, as pipeline stages hold it)."""
    total = float(layer_sizes(model, 1).params.sum())
    return total - (model.vocab_size * model.hidden_size if model.tied_embeddings else 0.0)


def block_activation_bytes(model: ModelSpec, seq_len: int, tp: int, i: int, *,
                           flash_attention: bool, elem_bytes: float = 2.0) -> float:
    """Bytes block ``i`` keeps for its backward pass per sample on one TP rank (no sequence
    parallelism): what each operation saves, after Korthikanti et al. (2022) §4.1, whose
    ``s*h*(10 + 24/t) + 5*a*s^2/t`` it gives for a GPT block with dropout and materialised
    attention scores in 16-bit.

    Kept whole on every TP rank: both norms' inputs, the QKV and MLP inputs (the norms'
    outputs), and with dropout its two masks (a byte per element). Split over TP: Q, K, V, the
    attention output, the MLP's inner activations (per routed and shared expert of a token).
    Attention: the softmax output per score, with dropout also its mask and output; flash
    attention instead keeps the softmax's log-sum-exp per row (fp32) and recomputes the scores.
    """
    h, s, a = model.hidden_size, seq_len, model.num_heads
    q = model.num_heads * model.dhead
    kv = model.kv_heads * model.dhead
    e = elem_bytes
    drop = model.dropout > 0
    up = 2 if model.mlp == "swiglu" else 1  # fc1 outputs per inner unit (gate and up)
    if model.is_moe_block(i):
        width = model.expert_ffn * (model.experts_per_token + model.shared_experts)
        # tokens dispatched to their experts and gathered back, and the router's logits
        routing = 2.0 * s * h * model.experts_per_token * e / tp + 4.0 * s * model.num_experts
    else:
        width, routing = model.ffn, 0.0
    whole = 4.0 * s * h * e + (2.0 * s * h if drop else 0.0)
    split = s * (q + 2 * kv) * e + s * q * e + s * width * (up + 1) * e
    # flash: the log-sum-exp per row; else each score's softmax (and its dropout mask, output)
    scores = 4.0 * s * a if flash_attention else a * s * s * (e + (1.0 + e if drop else 0.0))
    return whole + (split + scores) / tp + routing


def activation_bytes(model: ModelSpec, seq_len: int, tp: int, *, recompute: bool,
                     flash_attention: bool = False, elem_bytes: float = 2.0,
                     logits_bytes: float = 8.0) -> np.ndarray:
    """Bytes kept for the backward pass per sample, per layer, on one TP rank.

    With full recompute a block keeps only its input; the working set of the block being
    recomputed is added once per worker by the memory model (``recompute_working_bytes``).
    The embedding keeps its output (and dropout mask); the head its norm's input and output and
    ``logits_bytes`` per logit (what the loss keeps: 16-bit logits, an fp32 softmax, or an fp32
    copy and its softmax).
    """
    h, s, v, e = model.hidden_size, seq_len, model.vocab_size, elem_bytes
    if recompute:
        blocks = [s * h * e] * model.num_layers
    else:
        blocks = [block_activation_bytes(model, s, tp, i, flash_attention=flash_attention,
                                         elem_bytes=e) for i in range(model.num_layers)]
    emb = s * h * e + (s * h if model.dropout > 0 else 0.0)
    head = logits_bytes * s * v / tp + 2.0 * s * h * e
    return np.array([emb] + blocks + [head], dtype=float)


def recompute_working_bytes(model: ModelSpec, seq_len: int, tp: int,
                            flash_attention: bool = False, elem_bytes: float = 2.0) -> float:
    """Activations of one block rebuilt during backward with full recompute (per sample): the
    largest block's."""
    return max(block_activation_bytes(model, seq_len, tp, i, flash_attention=flash_attention,
                                      elem_bytes=elem_bytes) for i in range(model.num_layers))
