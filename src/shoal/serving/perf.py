"""One performance model of a serving node, shared by the flow model's node capacities
(``capacity.table``), the placers' KV limits (``placers.stages``), the request simulator and the
live runtime: what its memory holds beside the weights (the KV cache, Helix §5.2), how much one
batch of its engine takes, and the tokens/s it passes at those batches (Helix §4.3's node
capacity).

The KV cache is the share of the node's memory its engine manages (vLLM's default 90%) less the
weights of the layers it holds, counted in *token-layers* (one token's keys and values in one
layer). A batch takes at most the machine's ``batch`` limits (``spec.Batch``: prompts and prompt
tokens of one prefill step, decode steps of one decode step, the latter per layer count).
"""

from __future__ import annotations

import numpy as np

from shoal.errors import SpecError
from shoal.specs.serving import Batch

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory it manages


def kv_token_layers(memory_bytes: float, layers: int, layer_bytes: float,
                    kv_bytes: float) -> float:
    """Token-layers of KV cache beside ``layers`` layers' weights (0 when they do not fit)."""
    free = GPU_MEMORY_UTILIZATION * memory_bytes - layers * layer_bytes
    return max(free, 0.0) / kv_bytes


def kv_capacity(cluster, pl) -> np.ndarray:
    """Token-layers of KV cache per node of ``cluster`` under the placement ``pl`` (0 for nodes
    holding nothing)."""
    if cluster.kv_bytes is None or cluster.layer_bytes is None or cluster.memory is None \
            or np.isnan(cluster.memory).any():
        raise SpecError("simulation needs each machine's memory and the model's layer and KV "
                        "bytes (a catalog model and gpu, or memory, layer_bytes, kv_bytes)")
    out = np.zeros(cluster.n)
    for i, r in enumerate(pl.ranges):
        if r is not None:
            out[i] = kv_token_layers(cluster.memory[i], r[1] - r[0], cluster.layer_bytes,
                                     cluster.kv_bytes)
    return out


def kv_tokens_per_layer(cluster, node: int, layers: int) -> float:
    """Tokens whose KV one node holds in each of its layers while holding ``layers`` layers
    (0 when the cluster says nothing of memory)."""
    if cluster.kv_bytes is None or cluster.layer_bytes is None or cluster.memory is None \
            or not np.isfinite(cluster.memory[node]) or layers < 1:
        return 0.0
    return kv_token_layers(cluster.memory[node], layers, cluster.layer_bytes,
                           cluster.kv_bytes) / layers


def decode_cap(batch, layers: int) -> int:
    """The most decode steps one batch of a machine with ``batch`` limits takes while it holds
    ``layers`` layers."""
    dec = batch.decode
    if isinstance(dec, list):
        dec = dec[min(max(layers, 1), len(dec)) - 1]
    return int(dec)


def batch_caps(cluster, pl) -> list[tuple[float, int, int]]:
    """Per node: (prompts, prompt tokens, decode steps) one batch takes at most, from its
    machine's ``batch`` limits (the decode limit at the node's layer count)."""

    out = []
    for i, r in enumerate(pl.ranges):
        b = cluster.batch[i] if cluster.batch else Batch()
        k = (r[1] - r[0]) if r else 1
        out.append((b.prompts or float("inf"), b.prompt_tokens, decode_cap(b, k)))
    return out


def tokens_per_s(times, layers: int, *, kv_token_layers_total: float, decode_batch_cap: float,
                 prompt_tokens: float, output_tokens: float) -> float:
    """Tokens/s (prompt and generated together, as Helix counts them) a node holding ``layers``
    layers passes at its largest decode batch: as many requests as its KV cache holds at the
    mean context (prompt plus half the output), at most ``decode_batch_cap``. A request costs,
    per layer, its prompt's prefill and its output tokens' share of the batch's decode steps
    (Helix's ``(prompt + decode tokens) / (layers x (t_prompt + t_decode))``)."""
    ctx = prompt_tokens + output_tokens / 2.0
    batch = max(1.0, min(float(decode_batch_cap), kv_token_layers_total / (layers * ctx)))
    per_request = layers * (times.prompt_s(prompt_tokens)
                            + output_tokens * times.decode_s(batch, ctx) / batch)
    return (prompt_tokens + output_tokens) / per_request
