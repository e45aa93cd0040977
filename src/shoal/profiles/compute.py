"""Per-layer compute times: forward, backward and optimizer update per (GPU, TP, microbatch size).

A profile is a table ``(gpu, tp, mbs) -> array (layers, 3)`` of seconds per microbatch on one GPU
of a TP group. Measured profiles (imported from files) and the analytic profile share this type; a
measured profile falls back to the analytic one for (GPU, TP) pairs it has no measurement for, and
says so in ``source``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from shoal import catalog
from shoal.errors import SpecError
from shoal.files import read_json

PROFILE_SCHEMA = "shoal/profile@1"


@dataclass
class ComputeProfile:
    """Layer times with a fallback for what was not measured."""

    n_layers: int
    tables: dict[tuple[str, int], dict[int, np.ndarray]] = field(default_factory=dict)
    fallback: ComputeProfile | AnalyticLike | None = None
    name: str = "measured"
    model_spec: dict | None = None  # architecture of the profiled model, when recorded

    def has(self, gpu: str, tp: int) -> bool:
        return (gpu, tp) in self.tables

    def source(self, gpu: str, tp: int) -> str:
        return self.name if self.has(gpu, tp) else (self.fallback.name if self.fallback else "none")

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray:
        per_mbs = self.tables.get((gpu, tp))
        if per_mbs is None:
            if self.fallback is None:
                raise SpecError(f"the profile has no measurement for {gpu} at TP {tp}",
                                allowed=", ".join(f"{g}/TP{t}" for g, t in sorted(self.tables)))
            return self.fallback.layer_times(gpu, tp, mbs)
        return _interpolate(per_mbs, mbs)

    def to_json(self, model: str) -> dict:
        gpus: dict[str, dict] = {}
        for (gpu, tp), per in sorted(self.tables.items()):
            gpus.setdefault(gpu, {})[str(tp)] = {str(m): t.round(9).tolist() for m, t in sorted(per.items())}
        return {"schema": PROFILE_SCHEMA, "model": model, "n_layers": self.n_layers,
                "units": "seconds per microbatch: [forward, backward, update] per layer",
                "gpus": gpus}


class AnalyticLike(Protocol):
    """Anything that gives layer times: the analytic profile, a transfer profile."""

    name: str

    def layer_times(self, gpu: str, tp: int, mbs: int) -> np.ndarray: ...


def _interpolate(per_mbs: dict[int, np.ndarray], mbs: int) -> np.ndarray:
    """Times at ``mbs``: measured (smoothed), else linear between the two nearest measured sizes;
    beyond the largest, along the line through the two largest (the per-layer fit is linear in
    the microbatch size); below the smallest, the smallest's time (never faster than measured)."""
    if mbs in per_mbs:
        return per_mbs[mbs]
    sizes = sorted(per_mbs)
    if mbs < sizes[0]:
        return per_mbs[sizes[0]]
    if mbs > sizes[-1]:
        if len(sizes) == 1:
            t = per_mbs[sizes[-1]].copy()
            t[:, :2] *= mbs / sizes[-1]
            return t
        lo, hi = sizes[-2], sizes[-1]
    else:
        hi = next(s for s in sizes if s > mbs)
        lo = max(s for s in sizes if s < mbs)
    w = (mbs - lo) / (hi - lo)
    t = (1 - w) * per_mbs[lo] + w * per_mbs[hi]
    t[:, 2] = per_mbs[hi][:, 2]
    return t


def smooth_linear(per_mbs: dict[int, np.ndarray]) -> dict[int, np.ndarray]:
    """Replace measured forward and backward times by a per-layer fit ``t(m) = a + b m``.

    A layer's time is a fixed part (kernel launches, small-batch inefficiency) plus a part that
    grows with the microbatch size m. Fitted with relative weights over every measured size, the
    line removes single-size noise (e.g. Sailor's OPT-350M GH200 profile at TP 4, where m=1 is
    slower than m=2) while keeping the measured scaling. Needs two sizes; ``a, b >= 0``. Update
    times do not depend on m: their median is used.
    """
    sizes = sorted(per_mbs)
    arr = np.stack([per_mbs[m] for m in sizes])  # (M, L, 3)
    out = {m: per_mbs[m].copy() for m in sizes}
    upd = np.median(arr[:, :, 2], axis=0)
    for m in sizes:
        out[m][:, 2] = upd
    if len(sizes) < 2:
        return out
    ms = np.asarray(sizes, dtype=float)
    for col in (0, 1):
        y = arr[:, :, col]  # (M, L)
        w = 1.0 / np.maximum(y, 1e-9)
        # weighted least squares per layer: minimise sum (w (a + b m - y))^2
        sw2, swm, swmm = (w**2).sum(0), (w**2 * ms[:, None]).sum(0), (w**2 * ms[:, None] ** 2).sum(0)
        swy, swmy = (w**2 * y).sum(0), (w**2 * ms[:, None] * y).sum(0)
        det = sw2 * swmm - swm**2
        b = np.where(det > 0, (sw2 * swmy - swm * swy) / np.where(det > 0, det, 1), 0.0)
        a = (swy - b * swm) / sw2
        neg_a = a < 0  # refit through the origin
        b = np.where(neg_a, swmy / swmm, b)
        a = np.where(neg_a, 0.0, a)
        neg_b = b < 0  # flat
        a = np.where(neg_b, swy / sw2, a)
        b = np.where(neg_b, 0.0, b)
        for m in sizes:
            out[m][:, col] = a + b * m
    return out


def load_profile(path: str | Path, n_layers: int, fallback=None) -> ComputeProfile:
    """Read a shoal profile JSON (``shoal/profile@1``) for a model of ``n_layers`` layers."""
    p = Path(path)
    data = read_json(p, "profile file")
    if data.get("schema") != PROFILE_SCHEMA:
        raise SpecError("not a shoal profile", file=str(p), field="schema",
                        value=data.get("schema"), allowed=PROFILE_SCHEMA)
    if n_layers < 0:
        n_layers = int(data.get("n_layers", -1))
    if int(data.get("n_layers", -1)) != n_layers:
        raise SpecError("profile is for a model with another number of layers", file=str(p),
                        field="n_layers", value=data.get("n_layers"),
                        allowed=f"{n_layers} (the scenario's model: blocks + embedding + head)")

    prof = ComputeProfile(n_layers=n_layers, fallback=fallback, name=f"measured ({p.name})")
    prof.model_spec = data.get("model_spec")
    if not isinstance(data.get("gpus"), dict):
        raise SpecError("missing or malformed field", file=str(p), field="gpus",
                        allowed="GPU type -> TP -> microbatch size -> rows of [fwd, bwd, update]")
    for gpu, per_tp in data["gpus"].items():
        g = catalog.gpus().canonical(gpu, field=f"gpus.{gpu}", file=str(p))
        for tp, per_mbs in per_tp.items():
            try:
                tables = {int(m): np.asarray(t, dtype=float) for m, t in per_mbs.items()}
                tp = int(tp)
            except (TypeError, ValueError, AttributeError):
                raise SpecError("expected TP -> microbatch size -> rows of numbers", file=str(p),
                                field=f"gpus.{gpu}.{tp}") from None
            for m, t in tables.items():
                if t.shape != (n_layers, 3) or (t < 0).any():
                    raise SpecError("each entry must be n_layers rows of 3 non-negative seconds",
                                    file=str(p), field=f"gpus.{gpu}.{tp}.{m}")
            prof.tables[(g, tp)] = smooth_linear(tables)
    return prof
