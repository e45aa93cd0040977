"""How long one GPU kernel takes: matrix multiplies by shape, fused attention, memory-bound
element-wise work.

A matrix multiply C[M, N] = A[M, K] B[K, N] runs as tiles of C, one tile per thread block, in
waves over the GPU's streaming multiprocessors (SMs). Its time is the number of waves times one
tile's work at the SM's share of the dense peak, at the stack's GEMM efficiency and the tile's
own (smaller tiles reuse less of what they load): when M x N makes few tiles, the last wave
leaves SMs idle (wave quantisation) and K is padded to the tile depth (tile quantisation), so
small or oddly shaped GEMMs fall well short of the peak. The library picks the fastest tile,
and for few tiles it may split K over more thread blocks and add the partial results up
(split-K). No GEMM runs faster than it can move its operands at the memory bandwidth. A device
with no SM count (a CPU) runs GEMMs at the peak times an efficiency that grows with the work
(``F / (F + f_half)``).

Fused (flash) attention does the attention FLOPs at its own efficiency; the backward does 2.5
times the forward's FLOPs (it recomputes the scores). Element-wise kernels (norms,
activations, residual adds, softmax over materialised scores, the optimizer update) move their
bytes at the stack's fraction of the memory bandwidth. Every kernel also pays a launch cost.

References: NVIDIA, "Matrix Multiplication Background User's Guide" (tile and wave
quantisation); Dao, "FlashAttention-2" (2023), §3 (FLOPs of the forward and backward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# (rows, columns, thread blocks an SM runs at once, efficiency relative to the largest tile)
TILES = ((256, 128, 1, 1.0), (128, 256, 1, 1.0), (128, 128, 1, 0.93), (128, 64, 2, 0.85),
         (64, 128, 2, 0.85), (64, 64, 4, 0.70))
SPLITS = (1, 2, 4, 8, 16)  # split-K factors tried when a GEMM makes fewer tiles than SMs
K_DEPTH = {1: 64, 2: 32, 4: 16}  # K padded to a multiple of the tile depth, by element bytes


@dataclass(frozen=True)
class Device:
    """What the timing needs of one GPU at one precision."""

    peak_flops: float  # dense tensor-core peak at the compute precision, FLOP/s
    mem_bw_Bps: float
    sm_count: int | None  # None: no wave model (a CPU)
    gemm: float  # stack efficiencies (``StackSpec.kernel_efficiency``)
    attention_fwd: float
    attention_bwd: float
    memory: float
    launch_s: float
    f_half_flops: float = 1e6  # without SMs: FLOPs at which a GEMM reaches half its efficiency


def gemm_s(dev: Device, M: float, N: float, K: float, elem_bytes: float = 2.0,
           batch: float = 1.0) -> float:
    """Seconds of ``batch`` GEMMs of shape (M, N, K) on ``dev`` (the fastest tile and split-K)."""
    if M <= 0 or N <= 0 or K <= 0 or batch <= 0:
        return 0.0
    moved = batch * (M * K + K * N + M * N) * elem_bytes
    floor = moved / (dev.mem_bw_Bps * dev.memory)
    if dev.sm_count is None:
        flops = 2.0 * M * N * K * batch
        eff = dev.gemm * flops / (flops + dev.f_half_flops)
        return max(flops / (dev.peak_flops * eff), floor) + dev.launch_s
    depth = K_DEPTH.get(int(elem_bytes), 64)
    per_sm = dev.peak_flops / dev.sm_count * dev.gemm
    best = math.inf
    for tm, tn, ctas, eff in TILES:
        tiles = math.ceil(M / tm) * math.ceil(N / tn) * batch
        for split in SPLITS:
            if split > 1 and tiles * split > 2 * dev.sm_count * ctas:
                break
            k_part = math.ceil(math.ceil(K / split) / depth) * depth
            waves = math.ceil(tiles * split / (dev.sm_count * ctas))
            t = waves * ctas * 2.0 * tm * tn * k_part / (per_sm * eff)
            if split > 1:  # partial sums written and added up in fp32
                t += split * batch * M * N * 4.0 * 2.0 / (dev.mem_bw_Bps * dev.memory)
            best = min(best, t)
    return max(best, floor) + dev.launch_s


def flash_attention_s(dev: Device, flops_fwd: float, backward: bool) -> float:
    """Seconds of fused attention doing ``flops_fwd`` forward FLOPs (its backward: 2.5x)."""
    if flops_fwd <= 0:
        return 0.0
    if backward:
        return 2.5 * flops_fwd / (dev.peak_flops * dev.attention_bwd) + dev.launch_s
    return flops_fwd / (dev.peak_flops * dev.attention_fwd) + dev.launch_s


def memory_bound_s(dev: Device, nbytes: float, kernels: float = 1.0) -> float:
    """Seconds of element-wise kernels moving ``nbytes`` in all, ``kernels`` launches."""
    return float(nbytes) / (dev.mem_bw_Bps * dev.memory) + kernels * dev.launch_s


def gemms_s(dev: Device, shapes, elem_bytes: float = 2.0) -> float:
    """Total seconds of GEMMs given as (M, N, K) or (M, N, K, batch)."""
    return float(sum(gemm_s(dev, *s[:3], elem_bytes, *(s[3:] or (1.0,))) for s in shapes))


def backward_shapes(shapes) -> list[tuple]:
    """The backward GEMMs of forward GEMMs (M, N, K[, batch]): for each, the input gradient
    (M, K, N) and the weight gradient (K, N, M)."""
    out = []
    for s in shapes:
        m, n, k = s[:3]
        b = s[3] if len(s) > 3 else 1.0
        out += [(m, k, n, b), (k, n, m, b)]
    return out

