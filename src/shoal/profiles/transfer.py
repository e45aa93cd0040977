"""Predict one model's layer times from another model's measured profile.

For each layer kind (embedding, block, head) on the same GPU, TP and microbatch size, the target
model's time is the measured time of the profiled model's layer times the ratio of the analytic
profile's times for the two models. The analytic model's absolute error on a GPU largely cancels
in the ratio; what remains is how well FLOPs and bytes predict the change in size.
"""

from __future__ import annotations

import numpy as np

from shoal.profiles.analytic import AnalyticProfile
from shoal.profiles.compute import ComputeProfile


class TransferProfile:
    def __init__(self, measured: ComputeProfile, source_analytic: AnalyticProfile,
                 target_analytic: AnalyticProfile, source_name: str):
        self.measured = measured
        self.src = source_analytic
        self.dst = target_analytic
        self.name = f"scaled from {source_name} ({measured.name})"
        self.n_layers = target_analytic.model.num_layer_slots

    def source(self, gpu: str, tp: int) -> str:
        return self.name if self.measured.has(gpu, tp) else self.dst.name

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        if not self.measured.has(gpu, tp):
            return self.dst.layer_times(gpu, tp, mbs)
        m = self.measured.layer_times(gpu, tp, mbs)
        a = self.src.layer_times(gpu, tp, mbs)
        b = self.dst.layer_times(gpu, tp, mbs)
        blocks_m = np.median(m[1:-1], axis=0)
        ratio_blk = b[1] / np.maximum(a[1], 1e-12)
        out = np.empty_like(b)
        out[0] = m[0] * b[0] / np.maximum(a[0], 1e-12)
        out[1:-1] = blocks_m * ratio_blk
        out[-1] = m[-1] * b[-1] / np.maximum(a[-1], 1e-12)
        return out
