"""Node capacity T(k): the tokens per second (prompt and generated tokens together, as Helix
counts them) a node sustains while holding k layers, and how many layers it may hold.

The node runs a typical batch: as many requests as its KV cache holds beside k layers of
weights (each at the mean context, prompt plus half the output), at most ``max_batch``. A request
costs, per layer, its prompt tokens' prefill time and its output tokens' share of the batch's
decode steps (Helix's ``(prompt + decode tokens) / (layers x (t_prompt + t_decode))``). Times
come from measured per-layer profiles in Helix's CSV format (milliseconds per layer against
prompt tokens / decode batch, linearly interpolated) or, without them, from the GPU's catalog
FLOP/s and memory bandwidth: prefill at the compute roof, a decode step at the slower of its
FLOPs and of reading the weights and the batch's KV cache. A node passes on no more tokens than
its NIC carries (applied when the cluster is built).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from shoal.catalog import GPU
from shoal.errors import SpecError
from shoal.specs.model import ModelSpec


def layer_params(m: ModelSpec) -> float:
    """Weights of one transformer block: attention (q, k, v, o) and the MLP."""
    h, kv = m.hidden_size, m.kv_heads * m.dhead
    attn = h * (m.num_heads * m.dhead) * 2 + 2 * h * kv
    mlp = (3 if m.mlp == "swiglu" else 2) * h * m.ffn
    return float(attn + mlp)


def read_profile(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(x, seconds per layer) from a two-column CSV of x and milliseconds, sorted by x."""
    try:
        rows = list(csv.reader(path.read_text().splitlines()))
    except (FileNotFoundError, IsADirectoryError):
        raise SpecError("profile file not found", file=str(path)) from None
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


def table(model: ModelSpec, gpu: GPU, gpus: int, *, weights_fraction: float,
          prompt_tokens: float, output_tokens: float, max_batch: int,
          compute_efficiency: float, memory_efficiency: float,
          profile_dir: Path | None = None) -> tuple[int, list[float]]:
    """(max layers, [T(1), ..., T(max layers)]) for a node of ``gpus`` GPUs (TP inside)."""
    P = layer_params(model)
    W = 2.0 * P  # fp16 weights
    kvb = 2.0 * 2.0 * model.kv_heads * model.dhead  # K and V, fp16, per token per layer
    mem = gpus * gpu.memory_bytes
    kmax = int(weights_fraction * mem // W)
    if kmax < 1:
        return 0, []
    F = gpus * gpu.flops_16 * compute_efficiency
    B_W = gpus * gpu.mem_bw_Bps * memory_efficiency
    ctx = prompt_tokens + output_tokens / 2.0
    prompt = decode = None
    if profile_dir is not None:
        prompt = read_profile(profile_dir / "prompt_bs2time.csv")
        decode = read_profile(profile_dir / "decode_bs2time.csv")
    out = []
    for k in range(1, kmax + 1):
        batch = max(1.0, min(float(max_batch), (mem - k * W) / (k * kvb * ctx)))
        if prompt is not None and decode is not None:
            t_prompt = float(np.interp(prompt_tokens, *prompt))  # whole prompt, one layer
            t_step = float(np.interp(batch, *decode))
        else:
            t_prompt = prompt_tokens * 2.0 * P / F
            t_step = max(2.0 * P * batch / F, (W + batch * ctx * kvb) / B_W)
        per_request = k * (t_prompt + output_tokens * t_step / batch)
        out.append((prompt_tokens + output_tokens) / per_request)
    return kmax, out
