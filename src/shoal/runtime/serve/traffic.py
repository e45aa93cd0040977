"""The requests a live server serves: what one is and how it went, requests made from a
workload (``serve run``'s ``--requests``, ``--rate`` and ``--trace``), and a run's summary in
the simulator's metrics.
"""

from __future__ import annotations

import math
import queue
from dataclasses import dataclass, field

import numpy as np

from shoal.errors import SpecError
from shoal.serving.simulator import _histogram, _stats
from shoal.serving.workload import Workload, synthetic_lengths


@dataclass(frozen=True)
class Rejected:
    """Put in a request's sink when it is rejected."""

    reason: str


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new: int
    arrival: float = 0.0
    tokens: list[int] = field(default_factory=list)
    chain: list[str] = field(default_factory=list)
    nodes: list[int] = field(default_factory=list)
    start: float = math.nan
    first: float = math.nan
    finish: float = math.nan
    rejected: str | None = None
    attempt: int = 0  # runs from the prompt (a worker on its chain died: run again)
    sink: queue.Queue | None = None  # new tokens as they come, then None (HTTP streaming)
    sent: int = 0  # tokens put in the sink
    entered: float = math.nan  # when the coordinator took it

    @property
    def key(self) -> tuple[int, int]:
        return (self.rid, self.attempt)


def workload(spec, n: int, *, rate: float | None = None, lengths: np.ndarray | None = None,
             max_new: int | None = None, seed: int = 0):
    """A ``Workload`` of ``n`` requests for ``spec``: lengths from ``lengths`` (rows of prompt
    and output tokens, cycled) or like the Azure conversation trace with prompts scaled to at
    most half the model's context; outputs cut to the context left (and ``max_new``); arrivals
    Poisson at ``rate`` per second, or all at once."""
    rng = np.random.default_rng(seed)
    ctx = spec.max_seq_len
    if lengths is None:
        raw = synthetic_lengths(n, seed).astype(float)
        scale = (ctx / 2) / 2048  # synthetic prompts reach 2048 tokens
        lengths = np.maximum(1, np.round(raw * [scale, 1.0])).astype(int)
    rows = np.resize(np.asarray(lengths, dtype=np.int64), (n, 2))
    prompt = rows[:, 0].clip(1, ctx // 2)
    output = np.minimum(rows[:, 1].clip(1), ctx - prompt)
    if max_new:
        output = output.clip(max=max_new)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n)) if rate else np.zeros(n)
    return Workload(prompt, output, arrival,
                    f"{n} requests" + (f", Poisson {rate:g}/s" if rate else ", all at once"))


def requests_from(work, spec, seed: int = 0) -> list[Request]:
    """One live request per request of ``work`` (an online workload, or all arriving at once):
    random prompt tokens of its prompt length, its output length as ``max_new``. A request
    longer than the model's context is a SpecError."""
    rng = np.random.default_rng(seed)
    arrival = work.arrival_s if work.arrival_s is not None else np.zeros(work.n)
    out = []
    for i, (p, o, t) in enumerate(zip(work.prompt, work.output, arrival, strict=True)):
        if p + o > spec.max_seq_len:
            raise SpecError(f"request {i}: {p} prompt + {o} output tokens pass the model's "
                            "context", field=work.source, value=int(p + o),
                            allowed=f"at most {spec.max_seq_len} tokens ({spec.name})")
        out.append(Request(i, rng.integers(0, spec.vocab_size, int(p)).tolist(), int(o),
                           arrival=float(t)))
    return out


def summary(requests: list[Request], wall_s: float) -> dict:
    """The simulator's metrics (``serve simulate --json``) of a live run: decode throughput, prompt
    latency (arrival to first token) and decode latency per token, completed and rejected."""
    done = [r for r in requests if r.rejected is None and not math.isnan(r.finish)]
    first = np.array([r.first - r.arrival for r in requests if not math.isnan(r.first)])
    dec = np.array([(r.finish - r.first) / (len(r.tokens) - 1) for r in done
                    if len(r.tokens) > 1])
    decode_tokens = sum(len(r.tokens) for r in requests)  # every generated token, as simulated
    prompt_tokens = sum(len(r.prompt) for r in requests if not math.isnan(r.first))
    reasons: dict[str, int] = {}
    for r in requests:
        if r.rejected:
            reasons[r.rejected] = reasons.get(r.rejected, 0) + 1
    return {"mode": "live", "window_s": wall_s,
            "decode_throughput_tokens_per_s": decode_tokens / wall_s if wall_s > 0 else 0.0,
            "tokens_per_s": (decode_tokens + prompt_tokens) / wall_s if wall_s > 0 else 0.0,
            "prompt_latency_s": _stats(first), "decode_latency_s": _stats(dec),
            "requests": {"completed": len(done), "rejected": len(requests) - len(done),
                         "rejected_why": reasons},
            "latency_histogram": {"prompt": _histogram(first), "decode": _histogram(dec)}}


def result(requests: list[Request], wall_s: float, *, model: str, max_flow: float,
           health: dict) -> dict:
    """``serve run --json``: the run's ``summary``, the model, the placement's max flow, each
    worker's state, restarts and dropped messages (``health``, the server's), and what every
    request generated along which chain."""
    return summary(requests, wall_s) | {
        "model": model, "max_flow_tokens_per_s": max_flow,
        "workers": {n: {k: w[k] for k in ("state", "restarts", "dropped_messages")}
                    for n, w in health["workers"].items()},
        "dropped_messages": health["dropped_messages"],
        "generated": [{"request": r.rid, "tokens": r.tokens, "chain": r.chain[:-1],
                       "runs": r.attempt + 1, "rejected": r.rejected} for r in requests]}


def chains_used(requests: list[Request]) -> dict[str, int]:
    """How many requests went along each chain of nodes (``"a -> b"``, the coordinator left
    out)."""
    chains: dict[str, int] = {}
    for r in requests:
        if r.chain:
            key = " -> ".join(r.chain[:-1])
            chains[key] = chains.get(key, 0) + 1
    return chains
