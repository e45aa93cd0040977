"""Node capacity T(k): the tokens per second (prompt and generated tokens together, as Helix
counts them) a node sustains while holding k layers, and how many layers it may hold.

The node runs a typical batch: as many requests as its KV cache holds beside k layers of
weights (each at the mean context, prompt plus half the output), at most ``max_batch`` and its
machine's decode limit; the KV cache and the limits are the simulator's (``perf``, one
performance model). A request costs, per layer, its prompt tokens' prefill time and its output
tokens' share of the batch's decode steps (Helix's ``(prompt + decode tokens) / (layers x
(t_prompt + t_decode))``). Times
come from measured per-layer profiles in Helix's CSV format (milliseconds per layer against
prompt tokens / decode batch, linearly interpolated) or, without them, from the GPU's catalog
FLOP/s and memory bandwidth: prefill at the compute roof, a decode step at the slower of its
FLOPs and of reading the weights and the batch's KV cache. A node passes on no more tokens than
its NIC carries (applied when the cluster is built).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.catalog import GPU
from shoal.errors import SpecError
from shoal.files import read_text
from shoal.serving import perf
from shoal.specs.model import ModelSpec
from shoal.specs.serving import Batch, CapacitySpec


def layer_params(m: ModelSpec) -> float:
    """Weights of one transformer block: attention (q, k, v, o) and the MLP."""
    h, kv = m.hidden_size, m.kv_heads * m.dhead
    attn = h * (m.num_heads * m.dhead) * 2 + 2 * h * kv
    mlp = (3 if m.mlp == "swiglu" else 2) * h * m.ffn
    return float(attn + mlp)


def read_profile(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(x, seconds per layer) from a two-column CSV of x and milliseconds, sorted by x."""
    rows = list(csv.reader(read_text(path, "profile file", "a UTF-8 CSV").splitlines()))
    pts = []
    for n, r in enumerate(rows, 1):
        if not r or not r[0].strip():
            continue
        try:
            pts.append((float(r[0]), float(r[1]) / 1000.0))
        except (ValueError, IndexError):
            if n == 1:
                continue  # a header
            raise SpecError(f"line {n}: expected two numbers (tokens, milliseconds)",
                            file=str(path), value=",".join(r)) from None
    if len(pts) < 2:
        raise SpecError("a profile needs at least two rows", file=str(path))
    pts.sort()
    x, t = np.array(pts).T
    return x, t


def kv_bytes(m: ModelSpec) -> float:
    """KV cache of one token in one layer: K and V, fp16."""
    return 2.0 * 2.0 * m.kv_heads * m.dhead


@dataclass(frozen=True)
class LayerTimes:
    """Seconds one layer takes on a node: for a prompt batch of n tokens, and for one decode
    step of a batch of b requests (at context ``ctx`` tokens each, analytic model only)."""

    prompt_x: np.ndarray | None = None  # measured: tokens -> seconds per layer
    prompt_t: np.ndarray | None = None
    decode_x: np.ndarray | None = None  # measured: batch -> seconds per layer
    decode_t: np.ndarray | None = None
    params: float = 0.0  # analytic: weights per layer, FLOP/s, bytes/s, KV bytes per token
    flops: float = 0.0
    bw: float = 0.0
    kvb: float = 0.0

    def prompt_s(self, tokens: float) -> float:
        if tokens <= 0:
            return 0.0
        if self.prompt_x is not None:
            return _interp(tokens, self.prompt_x, self.prompt_t)
        return tokens * 2.0 * self.params / self.flops

    def decode_s(self, batch: float, ctx: float = 1000.0) -> float:
        if batch <= 0:
            return 0.0
        if self.decode_x is not None:
            return _interp(batch, self.decode_x, self.decode_t)
        return max(2.0 * self.params * batch / self.flops,
                   (2.0 * self.params + batch * ctx * self.kvb) / self.bw)


def _interp(x: float, xs: np.ndarray, ts: np.ndarray) -> float:
    """Linear interpolation, extended linearly past the last two points. A larger batch never
    takes less time: where noise made the last two points fall, the extension takes the slope
    over the whole measured range instead (flat if that falls too)."""
    if x <= xs[-1]:
        return float(np.interp(x, xs, ts))
    slope = (ts[-1] - ts[-2]) / max(xs[-1] - xs[-2], 1e-12)
    if slope <= 0:
        slope = max(0.0, (ts[-1] - ts[0]) / max(xs[-1] - xs[0], 1e-12))
    return float(ts[-1] + slope * (x - xs[-1]))


def layer_times(model: ModelSpec | None, gpu: GPU | None, gpus: int, *,
                compute_efficiency: float, memory_efficiency: float,
                profile_dir: Path | None = None) -> LayerTimes:
    if profile_dir is not None:
        px, pt = read_profile(profile_dir / "prompt_bs2time.csv")
        dx, dt = read_profile(profile_dir / "decode_bs2time.csv")
        return LayerTimes(px, pt, dx, dt)
    assert model is not None and gpu is not None
    return LayerTimes(params=layer_params(model), flops=gpus * gpu.flops_16 * compute_efficiency,
                      bw=gpus * gpu.mem_bw_Bps * memory_efficiency, kvb=kv_bytes(model))


def table(times: LayerTimes, *, memory: float, layer_bytes: float, kvb: float,
          capacity: CapacitySpec, batch: Batch | None = None) -> tuple[int, list[float]]:
    """(max layers, [T(1), ..., T(max layers)]) for a node with ``memory`` bytes, weights
    taking at most ``capacity.weights_fraction`` of it: at each layer count, the tokens/s of the
    performance model the simulator runs (``perf.tokens_per_s``: its KV cache, and its decode
    batches capped by the machine's ``batch`` limits and by ``capacity.max_batch``) for
    requests of the capacity's mean prompt and output tokens."""

    b = batch if batch is not None else Batch()
    kmax = int(capacity.weights_fraction * memory // layer_bytes)
    out = [perf.tokens_per_s(times, k, kv_token_layers_total=perf.kv_token_layers(
               memory, k, layer_bytes, kvb),
               decode_batch_cap=min(capacity.max_batch, perf.decode_cap(b, k)),
               prompt_tokens=capacity.prompt_tokens, output_tokens=capacity.output_tokens)
           for k in range(1, kmax + 1)]
    return kmax, out
