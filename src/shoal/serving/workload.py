"""Serving workloads: requests with an arrival time and prompt / output lengths, from Helix's
Azure trace files or generated with a seed.

Helix's online mode draws, every 3 seconds, a request count from the trace's per-interval counts
rescaled to a target mean rate; lengths are sampled from the length file. shoal does the same,
seeded: interval counts are scaled by ``rate / mean`` and rounded stochastically, arrivals are
spread uniformly inside each interval, and each request takes the next length pair of a seeded
permutation of the length file (cycling when the trace is longer)."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.errors import SpecError
from shoal.files import read_text, write_text

INTERVAL_S = 3.0


@dataclass(frozen=True)
class Workload:
    prompt: np.ndarray  # tokens per request
    output: np.ndarray
    arrival_s: np.ndarray | None  # None: offline (the cluster is kept full)
    source: str

    @property
    def n(self) -> int:
        return len(self.prompt)


def _rows(path: Path, cols: tuple[str, str]) -> np.ndarray:
    rows = list(csv.reader(read_text(path, "file", "a UTF-8 CSV").splitlines()))
    if not rows or [c.strip() for c in rows[0]][:2] != list(cols):
        raise SpecError("expected a CSV with the header " + ",".join(cols), file=str(path),
                        value=",".join(rows[0]) if rows else "")
    out = []
    for n, r in enumerate(rows[1:], 2):
        try:
            a, b = int(r[0]), int(r[1])
        except (ValueError, IndexError):
            raise SpecError(f"line {n}: expected two integers", file=str(path),
                            value=",".join(r)) from None
        if a < 0 or b < 0:
            raise SpecError(f"line {n}: negative value", file=str(path), value=",".join(r))
        out.append((a, b))
    if not out:
        raise SpecError("no rows", file=str(path))
    return np.array(out, dtype=np.int64)


def load_lengths(path: Path) -> np.ndarray:
    """(n, 2) prompt and output tokens per request (``input_tokens,output_tokens``)."""
    x = _rows(path, ("input_tokens", "output_tokens"))
    if (x[:, 1] < 1).any():
        raise SpecError("every request needs at least one output token", file=str(path))
    return x


def load_arrivals(path: Path) -> np.ndarray:
    """Requests per 3-second interval (``interval,requests``)."""
    return _rows(path, ("interval", "requests"))[:, 1]


def load_trace(path: Path) -> Workload:
    """Requests one per row (``arrival_s,input_tokens,output_tokens``), arrivals in seconds from
    the start and in order: the same trace for ``serve run`` and ``serve simulate``."""
    rows = list(csv.reader(read_text(path, "file", "a UTF-8 CSV").splitlines()))
    cols = ["arrival_s", "input_tokens", "output_tokens"]
    if not rows or [c.strip() for c in rows[0]][:3] != cols:
        raise SpecError("expected a CSV with the header " + ",".join(cols), file=str(path),
                        value=",".join(rows[0]) if rows else "")
    out = []
    for n, r in enumerate(rows[1:], 2):
        if not r:
            continue
        try:
            t, a, b = float(r[0]), int(r[1]), int(r[2])
        except (ValueError, IndexError):
            raise SpecError(f"line {n}: expected seconds and two integers", file=str(path),
                            value=",".join(r)) from None
        if not np.isfinite(t) or t < 0 or a < 1 or b < 1:
            raise SpecError(f"line {n}: arrival must be >= 0 and both lengths >= 1",
                            file=str(path), value=",".join(r))
        if out and t < out[-1][0]:
            raise SpecError(f"line {n}: arrivals must be in order", file=str(path),
                            value=",".join(r))
        out.append((t, a, b))
    if not out:
        raise SpecError("no rows", file=str(path))
    x = np.array(out)
    return Workload(x[:, 1].astype(np.int64), x[:, 2].astype(np.int64), x[:, 0],
                    f"{Path(path).name} (trace)")


def write_trace(path: Path, work: Workload) -> Path:
    """The workload as a ``load_trace`` file (online workloads only)."""

    assert work.arrival_s is not None
    rows = "".join(f"{t:.6f},{a},{b}\n" for t, a, b in zip(work.arrival_s, work.prompt,
                                                           work.output, strict=True))
    return write_text(path, "arrival_s,input_tokens,output_tokens\n" + rows)


def offline(lengths: np.ndarray, seed: int = 0, source: str = "lengths") -> Workload:
    idx = np.random.default_rng(seed).permutation(len(lengths))
    return Workload(lengths[idx, 0], lengths[idx, 1], None, f"{source} (offline)")


def online(lengths: np.ndarray, per_interval: np.ndarray, rate_per_s: float, seed: int = 0,
           source: str = "trace", limit: int | None = None) -> Workload:
    """Arrivals shaped like ``per_interval`` at a mean of ``rate_per_s`` requests per second."""
    if rate_per_s <= 0:
        raise SpecError("the arrival rate must be > 0", value=rate_per_s)
    rng = np.random.default_rng(seed)
    mean = per_interval.mean() / INTERVAL_S
    if mean <= 0:
        raise SpecError("the arrival trace has no requests")
    scaled = per_interval * (rate_per_s / mean)
    counts = np.floor(scaled + rng.random(len(scaled))).astype(int)
    times = np.concatenate([k * INTERVAL_S + np.sort(rng.random(c)) * INTERVAL_S
                            for k, c in enumerate(counts)]) if counts.sum() else np.zeros(0)
    if limit is not None:
        times = times[:limit]
    order = np.resize(rng.permutation(len(lengths)), len(times))
    return Workload(lengths[order, 0], lengths[order, 1], times,
                    f"{source} (online, {rate_per_s:.3g} requests/s)")


def synthetic_lengths(n: int, seed: int = 0, prompt_mean: float = 763.0,
                      output_mean: float = 232.0) -> np.ndarray:
    """Lognormal prompt and output lengths with the given means (sigma 1), prompts at most
    2048 and outputs at most 1024 tokens, as Helix filters the Azure trace."""
    rng = np.random.default_rng(seed)
    p = rng.lognormal(np.log(prompt_mean) - 0.5, 1.0, n).clip(1, 2048)
    o = rng.lognormal(np.log(output_mean) - 0.5, 1.0, n).clip(1, 1024)
    return np.stack([p.round(), o.round()], axis=1).astype(np.int64)


def poisson(lengths: np.ndarray, rate_per_s: float, n: int, seed: int = 0,
            source: str = "synthetic") -> Workload:
    """``n`` requests arriving as a Poisson process of ``rate_per_s``, lengths drawn from
    ``lengths`` (a seeded permutation, cycling)."""
    if rate_per_s <= 0:
        raise SpecError("the arrival rate must be > 0", value=rate_per_s)
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    order = np.resize(rng.permutation(len(lengths)), n)
    return Workload(lengths[order, 0], lengths[order, 1], times,
                    f"{source} (online, Poisson {rate_per_s:.3g} requests/s)")


DEFAULT_LOAD = 0.75  # online: the mean arrival rate, as a fraction of the max flow
SYNTHETIC_REQUESTS = 20000  # lengths drawn when no lengths file is given
POISSON_REQUESTS = 2000  # Poisson arrivals: requests generated when no limit is given


def generated(lengths: Path | None, seed: int = 0, *, max_flow: float | None = None,
              load: float | None = None, arrivals: Path | None = None,
              limit: int | None = None) -> Workload:
    """The requests ``serve simulate`` runs without a trace, their lengths from ``lengths`` (a
    CSV; default seeded synthetic ones): offline when ``max_flow`` is None; else online at a mean
    of ``load`` (default ``DEFAULT_LOAD``) x ``max_flow`` tokens/s, arriving as the ``arrivals``
    CSV is shaped (``limit``: the first requests only) or as a Poisson process (``limit``
    requests, default ``POISSON_REQUESTS``)."""
    L = load_lengths(lengths) if lengths is not None else synthetic_lengths(SYNTHETIC_REQUESTS, seed)
    src = lengths.name if lengths is not None else "synthetic lengths"
    if max_flow is None:
        return offline(L, seed, src)
    rate = (DEFAULT_LOAD if load is None else load) * max_flow / float(L.sum(axis=1).mean())
    if arrivals is not None:
        return online(L, load_arrivals(arrivals), rate, seed, arrivals.name, limit=limit)
    return poisson(L, rate, limit or POISSON_REQUESTS, seed)


def first(work: Workload, n: int | None) -> Workload:
    """The first ``n`` requests of ``work`` (all of them when ``n`` is None)."""
    if n is None:
        return work
    arrivals = work.arrival_s[:n] if work.arrival_s is not None else None
    return Workload(work.prompt[:n], work.output[:n], arrivals, work.source)
