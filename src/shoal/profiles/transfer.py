"""Predict a model's layer times on a GPU where only another model was measured.

The target model's time for a layer kind (embedding, block, head) on GPU g is the source model's
measured time on g times a size ratio target/source:

- where both models were measured on some other GPU h (same TP, microbatch size), the ratio is
  the one measured on the h nearest to g in peak FLOP/s and memory bandwidth (log distance),
  corrected by how the analytic profile says that ratio changes from h to g;
- otherwise the analytic profile's ratio on g.

Measured ratios carry what FLOPs and bytes miss (how a GPU's efficiency grows with operation
size); the analytic model's absolute error on a GPU largely cancels in its ratios.
"""

from __future__ import annotations

import math

import numpy as np

from shoal.profiles.analytic import AnalyticProfile
from shoal.profiles.compute import ComputeProfile


def _kinds(t: np.ndarray) -> np.ndarray:
    """(3 kinds: embedding, median block, head) x (fwd, bwd, update)."""
    return np.stack([t[0], np.median(t[1:-1], axis=0), t[-1]])


class TransferProfile:
    def __init__(self, source: ComputeProfile, source_analytic: AnalyticProfile,
                 target_analytic: AnalyticProfile, source_name: str,
                 target_measured: ComputeProfile | None = None):
        self.src = source
        self.src_a = source_analytic
        self.dst_a = target_analytic
        self.own = target_measured
        self.name = f"scaled from {source_name} ({source.name})"
        self.n_layers = target_analytic.model.num_layer_slots

    def source(self, gpu: str, tp: int) -> str:
        return self.name if self.src.has(gpu, tp) else self.dst_a.name

    def _analytic_ratio(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        a = _kinds(self.src_a.layer_times(gpu, tp, mbs))
        b = _kinds(self.dst_a.layer_times(gpu, tp, mbs))
        return b / np.maximum(a, 1e-12)

    def _hardware_distance(self, g: str, h: str) -> float:
        ga, ha = self.dst_a.gpus[g], self.dst_a.gpus[h]
        return math.hypot(math.log(ga.flops_16 / ha.flops_16), math.log(ga.mem_bw_Bps / ha.mem_bw_Bps))

    def ratio(self, gpu: str, tp: int, mbs: int) -> tuple[np.ndarray, str | None]:
        """Per-kind ratio target/source on ``gpu``, and the GPU it was measured on (if any)."""
        ar_g = self._analytic_ratio(gpu, tp, mbs)
        if self.own is None:
            return ar_g, None
        both = [h for (h, t) in self.own.tables if t == tp and h != gpu and self.src.has(h, tp)
                and h in self.dst_a.gpus]
        if not both:
            return ar_g, None
        h = min(both, key=lambda x: (self._hardware_distance(gpu, x), x))
        measured = _kinds(self.own.layer_times(h, tp, mbs)) / np.maximum(
            _kinds(self.src.layer_times(h, tp, mbs)), 1e-12)
        return measured * ar_g / np.maximum(self._analytic_ratio(h, tp, mbs), 1e-12), h

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        if not self.src.has(gpu, tp):
            return self.dst_a.layer_times(gpu, tp, mbs)
        src = _kinds(self.src.layer_times(gpu, tp, mbs))
        r, _ = self.ratio(gpu, tp, mbs)
        k = src * r
        out = np.empty((self.n_layers, 3))
        out[0], out[1:-1], out[-1] = k[0], k[1], k[2]
        return out
