"""What a serving simulation reports (``SimResult``) and how it is made from a run's state."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from shoal.serving.simulator.state import ServeRun


@dataclass
class SimResult:
    mode: str
    router: str
    window_s: float
    decode_tokens_per_s: float
    tokens_per_s: float  # prompt and decode
    prompt_latency_s: dict
    decode_latency_s: dict
    completed: int
    waited: int  # requests that waited for KV room before entering (none is turned away)
    in_flight_peak: int
    node_utilization: list[float]
    kv_peak_fraction: list[float]
    wall_s: float
    events: int
    latency_histogram: dict | None = None
    measured: int = 0  # requests that entered after the warm-up (their latencies are measured)
    warnings: list[str] = field(default_factory=list)
    in_flight_mean: float = 0.0  # requests admitted and not done, averaged over the window
    hops_mean: float = 0.0  # nodes on a request's chain, averaged over the requests routed
    busiest_link: tuple | None = None  # (from, to, fraction of the window it was sending)
    kv_fill_peak: float | None = None  # offline feeder: the fullest layer's expected KV use
    kv_fill_nodes: tuple[int, ...] = ()  # the nodes holding that layer

    def to_json(self, names) -> dict:
        return {"mode": self.mode, "router": self.router, "window_s": self.window_s,
                "warnings": self.warnings,
                "decode_throughput_tokens_per_s": self.decode_tokens_per_s,
                "tokens_per_s": self.tokens_per_s,
                "prompt_latency_s": self.prompt_latency_s,
                "decode_latency_s": self.decode_latency_s,
                "requests": {"completed": self.completed, "rejected": 0, "waited": self.waited,
                             "measured": self.measured,
                             "in_flight_peak": self.in_flight_peak},
                "nodes": [{"name": names[i], "utilization": u, "kv_peak_fraction": k}
                          for i, (u, k) in enumerate(zip(self.node_utilization,
                                                         self.kv_peak_fraction, strict=True))
                          if u > 0 or k > 0],
                "in_flight_mean": self.in_flight_mean, "hops_mean": self.hops_mean,
                "busiest_link": None if self.busiest_link is None else {
                    "from": _end_name(self.busiest_link[0], names),
                    "to": _end_name(self.busiest_link[1], names),
                    "utilization": self.busiest_link[2]},
                "kv_fill_peak": self.kv_fill_peak,
                "simulated_events": self.events, "wall_s": self.wall_s,
                "latency_histogram": self.latency_histogram}


def _end_name(v: int, names) -> str:
    """A node's name, or ``coordinator`` for the simulator's source and sink vertices."""
    return names[v] if v < len(names) else "coordinator"


def _histogram(x: np.ndarray, bins: int = 40) -> dict:
    """Counts over log-spaced bins (latencies span orders of magnitude)."""
    x = x[x > 0]
    if len(x) == 0:
        return {"edges": [], "counts": []}
    lo, hi = float(x.min()), float(x.max())
    edges = np.geomspace(lo, hi * (1 + 1e-9), bins + 1) if hi > lo else np.array([lo, lo * 1.01 + 1e-12])
    counts, edges = np.histogram(x, edges)
    return {"edges": edges.tolist(), "counts": counts.tolist()}


def _stats(x: np.ndarray) -> dict:
    """Mean and percentiles of latencies, and how many requests they are of (those that
    entered after the warm-up: none when every request entered before)."""
    if len(x) == 0:
        return {"mean": None, "p50": None, "p95": None, "requests": 0}
    return {"mean": float(x.mean()), "p50": float(np.percentile(x, 50)),
            "p95": float(np.percentile(x, 95)), "requests": int(len(x))}


def _latencies(run: ServeRun, t_end: float) -> tuple[np.ndarray, np.ndarray, np.ndarray,
                                                       float]:
    """(prompt latencies, decode latencies per token, which requests are measured, requests
    in flight averaged over the window): latencies of the requests that entered after the
    warm-up (the steady state); in flight, each request from its admission to its end."""
    warmup_s = run.warmup_s
    fin = np.array(run.finish_t)
    first = np.array(run.first_t)
    start = np.array(run.start_t)
    out_arr = np.array(run.output)
    with np.errstate(invalid="ignore"):
        ok = ~np.isnan(first) & (start >= warmup_s) & (first <= t_end)
        fin_ok = ~np.isnan(fin) & (start >= warmup_s) & (out_arr > 1)
    pl_lat = (first - start)[ok]
    dl = ((fin - first) / np.maximum(out_arr - 1, 1))[fin_ok]
    entered = np.array(run.entered_t)
    with np.errstate(invalid="ignore"):
        a = np.clip(entered, warmup_s, t_end)
        b = np.clip(np.where(np.isnan(fin), t_end, fin), warmup_s, t_end)
    window = max(t_end - warmup_s, 1e-9)
    return pl_lat, dl, ok, float(np.nansum(np.maximum(b - a, 0.0))) / window


def _warnings(run: ServeRun) -> list[str]:
    start = np.array(run.start_t)
    warmup_s = run.warmup_s
    if np.isfinite(start).any() and not (start >= warmup_s).any():
        return [f"no request arrived after the {warmup_s:g} s warm-up (the last of "
                f"{len(start)} arrived at {float(np.nanmax(start)):.1f} s): no latency is "
                "measured and the throughput is that of the run's tail; lower --warmup or "
                "simulate more requests"]
    return []


def summarise(run: ServeRun, router: str, wall0: float, events: int) -> SimResult:
    """The metrics of a finished run over its window: from the warm-up to its end (or, with
    no end, the last completion). ``wall0``: ``time.perf_counter()`` at the run's start."""
    warmup_s, end = run.warmup_s, run.end_s
    t_end = end if end != float("inf") else (
        float(np.nanmax(np.array(run.finish_t))) if run.completed else warmup_s)
    window = max(t_end - warmup_s, 1e-9)
    pl_lat, dl, ok, in_flight_mean = _latencies(run, t_end)
    routed = [len(c) - 1 for c in run.chains if c]
    busiest = max(run.link_busy.items(), key=lambda kv_: kv_[1], default=None)
    kv, (fill, row) = run.kv, run.kv_fill
    return SimResult(
        mode=run.mode, router=router, window_s=window,
        decode_tokens_per_s=run.decode_tokens / window,
        tokens_per_s=(run.decode_tokens + run.prompt_tokens) / window,
        prompt_latency_s=_stats(pl_lat), decode_latency_s=_stats(dl),
        latency_histogram={"prompt": _histogram(pl_lat), "decode": _histogram(dl)},
        completed=run.completed, waited=run.waited, in_flight_peak=run.peak_in_flight,
        node_utilization=[b / window for b in run.busy_s],
        kv_peak_fraction=[float(p / t) if t > 0 else 0.0 for p, t in zip(kv.peak, kv.total,
                                                                          strict=True)],
        wall_s=time.perf_counter() - wall0, events=events, measured=int(ok.sum()),
        warnings=_warnings(run), in_flight_mean=in_flight_mean,
        hops_mean=float(np.mean(routed)) if routed else 0.0,
        busiest_link=None if busiest is None else (*busiest[0], busiest[1] / window),
        kv_fill_peak=fill if row >= 0 else None,
        kv_fill_nodes=tuple(int(i) for i in np.flatnonzero(run.per_layer[row]))
        if row >= 0 else ())
