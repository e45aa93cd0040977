"""BubbleTea: inference prefill placed in the bubbles of a training pipeline (Atlas §5).

The training schedule repeats every iteration. A GPU's *bubbles* are the gaps between its
training computations (the gradient all-reduce and optimizer step count as training), wrapped
around the iteration so the gap at the end joins the gap at the start. Each bubble is shortened by
a guard band at its end so a prefill always finishes before training resumes on that GPU; a
prefill never runs at the same time as training.

Prefill requests run on *inference pipelines*: GPUs of the same rank (pipeline position inside
a DP-cell, stage) across DP-cells, which sit in one datacenter, cut into groups of at most
``depth`` GPUs; each holds a slice of the inference model's layers. A request goes to the first
pipeline (first-fit) on which every stage fits in a bubble of its GPU, in order, each stage
waiting at most ``max_wait`` for its bubble (after the previous stage's hand-off and the GPU's
previous prefill, so prefills pipeline through the stages). A request that fits nowhere is
rejected at once.

Prefill latency on a GPU is the analytic layer profile of the inference model (FLOPs and bytes,
``shoal.profiles.analytic``) over its layers for the prompt length, plus one hand-off per stage
boundary: the hidden state over the datacenter link and a fixed per-hop cost
(``hop_overhead_s``, launch and synchronisation of a blocking point-to-point step).
"""

from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass, field

import numpy as np

from shoal import catalog
from shoal.errors import SpecError
from shoal.files import read_text
from shoal.profiles.analytic import AnalyticProfile
from shoal.serving.workload import poisson, synthetic_lengths
from shoal.training.geo import INTRA_DC_BPS, GeoTimeline, simulate

# Calibrated on the one latency anchor the paper gives: Llama-3-8B, 512 tokens on a DGX A100, 8
# pipeline stages add 16 ms (29%) to time-to-first-token against one GPU (Atlas §6.6): 16 ms / 7
# hand-offs, less the hidden state's NVLink transfer (4 MB at 300 GB/s, 14 us).
HOP_OVERHEAD_S = 16e-3 / 7


@dataclass(frozen=True)
class PrefillModel:
    """Seconds to prefill a prompt of n tokens on ``depth`` GPUs of one type."""

    profile_for: object  # callable seq_len -> AnalyticProfile-like (layer_times(gpu, tp, mbs))
    gpu: str
    hidden_size: int
    link_bw: float = INTRA_DC_BPS
    hop_overhead_s: float = HOP_OVERHEAD_S
    bucket: int = 64  # prompt lengths are rounded up to a multiple of this (cached profiles)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def stage_times(self, tokens: int, depth: int) -> tuple[list[float], float]:
        """(per-stage compute seconds, hand-off seconds between two stages)."""
        n = max(self.bucket, int(math.ceil(tokens / self.bucket)) * self.bucket)
        key = (n, depth)
        if key not in self._cache:
            fwd = self.profile_for(n).layer_times(self.gpu, 1, 1)[:, 0]
            cuts = np.linspace(0, len(fwd), depth + 1).round().astype(int)
            stages = [float(fwd[a:b].sum()) for a, b in zip(cuts, cuts[1:])]
            hop = 2.0 * n * self.hidden_size / self.link_bw + self.hop_overhead_s
            self._cache[key] = (stages, hop)
        return self._cache[key]

    def latency(self, tokens: int, depth: int) -> float:
        stages, hop = self.stage_times(tokens, depth)
        return sum(stages) + hop * (depth - 1)


def prefill_model(model_name: str, gpu: str, link_bw: float = INTRA_DC_BPS) -> PrefillModel:
    """A prefill model for a catalog model on a catalog GPU whose pipeline stages hand off over
    ``link_bw`` bytes/s (default: between nodes of a datacenter)."""

    spec = catalog.models().get(model_name)
    gpus = {gpu: catalog.gpus().get(gpu)}
    profiles: dict[int, AnalyticProfile] = {}

    def profile_for(n: int):
        if n not in profiles:
            profiles[n] = AnalyticProfile(spec, n, gpus, attention="flash")
        return profiles[n]

    return PrefillModel(profile_for=profile_for, gpu=catalog.gpus().canonical(gpu),
                        hidden_size=spec.hidden_size, link_bw=link_bw)


class Bubbles:
    """The periodic free windows of one GPU: ``starts``/``ends`` within one period (ends may pass
    the period for the window that wraps around)."""

    def __init__(self, busy: list[tuple[float, float]], period: float, guard: float):
        self.period = period
        busy = sorted(busy)
        gaps = []
        t = 0.0
        for a, b in busy:
            if a > t:
                gaps.append((t, a))
            t = max(t, b)
        if t < period:
            gaps.append((t, period))
        if len(gaps) > 1 and gaps[0][0] == 0.0 and gaps[-1][1] == period:
            # the last gap runs into the first gap of the next iteration
            gaps = gaps[1:-1] + [(gaps[-1][0], period + gaps[0][1])]
        elif len(gaps) == 1 and gaps[0] == (0.0, period):
            gaps = [(0.0, math.inf)]
        self.starts = [a for a, b in gaps if b - guard > a]
        self.ends = [b - guard for a, b in gaps if b - guard > a]
        self.free_s = sum(e - s for s, e in zip(self.starts, self.ends)) if gaps else 0.0
        # the previous period's last bubble (it may run into this period), this period's and the
        # next one's: enough for a search that starts anywhere in this period
        prev = ([self.starts[-1] - period], [self.ends[-1] - period]) if self.starts else ([], [])
        self._two = (prev[0] + self.starts + [s + period for s in self.starts],
                     prev[1] + self.ends + [e + period for e in self.ends])

    def fit(self, t: float, dur: float) -> float:
        """Earliest start >= t of a window of ``dur`` inside one bubble (inf if none is long
        enough)."""
        if not self.starts:
            return math.inf
        k, off = divmod(t, self.period)
        S, E = self._two
        eps = 1e-9  # a window that fills a bubble exactly fits (period shifts round)
        i = bisect.bisect_left(E, off + dur - eps)  # the first bubble that ends late enough
        while i < len(S):
            if S[i] <= off + eps:
                return t
            if E[i] - S[i] >= dur - eps:
                return k * self.period + S[i]
            i += 1
        return math.inf  # two periods from any point hold every bubble there is


@dataclass(frozen=True)
class Prefill:
    request: int
    arrival: float
    tokens: int
    pipeline: int  # -1 when rejected
    start: float
    ttft: float  # finish - arrival (nan when rejected)


@dataclass
class BubbleResult:
    prefills: list[Prefill]
    utilization_before: float
    utilization_after: float
    iteration_time_before_s: float
    iteration_time_after_s: float
    decision_s: list[float]
    reserved: dict[tuple, list[tuple[float, float]]]  # GPU -> prefill intervals
    horizon_s: float
    pipelines: list[list[tuple]]

    def fill_json(self, period: float, iterations: int = 2, cell: int = 0) -> dict:
        """The prefills on the GPUs of DP-cell ``cell`` during the first ``iterations``
        training iterations (for the filled-timeline figure)."""
        end = iterations * period
        return {"iterations": iterations, "cell": cell, "gpus": [
            {"pipeline": p, "stage": s, "busy": [[a, min(b, end)] for a, b in iv if a < end]}
            for (c, p, s), iv in sorted(self.reserved.items()) if c == cell]}

    def summary(self) -> dict:
        done = [p.ttft for p in self.prefills if p.pipeline >= 0]
        n = len(self.prefills)

        def pct(xs, q):
            return float(np.percentile(xs, q)) if xs else None

        return {
            "utilization_before": self.utilization_before,
            "utilization_after": self.utilization_after,
            "iteration_time_before_s": self.iteration_time_before_s,
            "iteration_time_after_s": self.iteration_time_after_s,
            "ttft_s": {"p50": pct(done, 50), "p95": pct(done, 95), "mean": (
                float(np.mean(done)) if done else None)},
            "rejected_fraction": (n - len(done)) / n if n else 0.0,
            "requests": {"total": n, "placed": len(done), "rejected": n - len(done)},
            "inference_pipelines": len(self.pipelines),
            "decision_us": {"p50": pct(self.decision_s, 50) * 1e6 if self.decision_s else None,
                            "p99": pct(self.decision_s, 99) * 1e6 if self.decision_s else None},
            "horizon_s": self.horizon_s,
        }


def training_busy(tl: GeoTimeline, cells: int = 1) -> dict[tuple, list[tuple[float, float]]]:
    """Training busy intervals per GPU ``(cell, pipeline-in-cell, stage)`` over one iteration,
    for ``cells`` identical copies of the timeline's DP-cells (cells do not interact). The
    stage's all-reduce and the rest of its training step count as busy."""
    out = {}
    for (p, s), ops in tl.busy.items():
        iv = [(b.start, b.end) for b in ops]
        iv.append((tl.stage_end[s], tl.stage_end[s] + tl.allreduce_s[s]))
        for c in range(cells):
            out[(c, p, s)] = iv
    return out


def inference_pipelines(gpus: list[tuple], dc_of, depth: int) -> list[list[tuple]]:
    """Same-rank GPUs across cells, in one datacenter, in groups of at most ``depth``."""
    by_rank: dict[tuple, list[tuple]] = {}
    for g in sorted(gpus):
        c, p, s = g
        by_rank.setdefault((dc_of(g), p, s), []).append(g)
    out = []
    for _, members in sorted(by_rank.items()):
        for i in range(0, len(members), depth):
            out.append(members[i:i + depth])
    return out


def place(tl: GeoTimeline, requests: list[tuple[float, int]], model: PrefillModel, *,
          cells: int = 1, depth: int = 8, guard_s: float = 0.005,
          max_wait_s: float = 0.05, max_checks: int = 64) -> BubbleResult:
    """Place prefill ``requests`` ((arrival s, prompt tokens), sorted by arrival) in the bubbles
    of ``cells`` copies of the training timeline ``tl``."""
    T = tl.iteration_s
    busy = training_busy(tl, cells)
    bub = {g: Bubbles(iv, T, guard_s) for g, iv in busy.items()}
    pipes = inference_pipelines(list(busy), lambda g: tl.job.stage_dc[g[2]], depth)
    gpu_free = {g: 0.0 for g in busy}  # end of the GPU's last prefill
    pattern = [tuple(id(busy[g]) for g in pipe) for pipe in pipes]  # copies of a cell share lists
    pipe_free = [0.0] * len(pipes)  # its last prefill's end (the last stage ends last)
    reserved: dict[tuple, list[tuple[float, float]]] = {g: [] for g in busy}
    out: list[Prefill] = []
    decisions: list[float] = []
    last = -math.inf
    for i, (arrival, tokens) in enumerate(requests):
        if arrival < last:
            raise ValueError(f"request {i}: arrivals must be sorted (arrival {arrival} < {last})")
        last = arrival
        t0 = time.perf_counter()
        hit = None
        failed_idle: set = set()  # patterns of idle pipelines that did not fit this request
        for k, pipe in enumerate(pipes):
            if gpu_free[pipe[0]] > arrival + max_wait_s:
                continue
            # pipelines with the same bubbles whose GPUs are all idle fit a request alike
            idle = pipe_free[k] <= arrival
            if idle and pattern[k] in failed_idle:
                continue
            stages, hop = model.stage_times(tokens, len(pipe))
            starts = []
            ready = arrival
            for j, g in enumerate(pipe):
                # stage j: after stage j-1 and the hand-off, after the GPU's last prefill, in a
                # bubble, waiting at most max_wait
                ready = max(ready, gpu_free[g])
                s_j = bub[g].fit(ready, stages[j])
                if s_j - ready > max_wait_s or (j == 0 and s_j > arrival + max_wait_s):
                    break
                starts.append(s_j)
                ready = s_j + stages[j] + hop
            else:
                hit = (k, starts)
                break
            if idle:
                failed_idle.add(pattern[k])
        decisions.append(time.perf_counter() - t0)
        if hit is None:
            out.append(Prefill(i, arrival, tokens, -1, math.nan, math.nan))
            continue
        k, starts = hit
        pipe = pipes[k]
        stages, hop = model.stage_times(tokens, len(pipe))
        for g, s_j, d in zip(pipe, starts, stages):
            reserved[g].append((s_j, s_j + d))
            gpu_free[g] = s_j + d
        end = starts[-1] + stages[-1]
        pipe_free[k] = end
        out.append(Prefill(i, arrival, tokens, k, starts[0], end - arrival))
    horizon = max([requests[-1][0] if requests else 0.0]
                  + [iv[-1][1] for iv in reserved.values() if iv] + [T])
    periods = horizon / T
    n = len(busy)
    train = sum(b.end - b.start for ops in tl.busy.values() for b in ops) * cells
    before = train / (n * T)
    prefill = sum(b - a for iv in reserved.values() for a, b in iv)
    after = (train * periods + prefill) / (n * horizon)
    after_iter = _iteration_with_prefill(tl, reserved, cells, max_checks)
    return BubbleResult(out, before, after, T, after_iter, decisions, reserved, horizon, pipes)


def _iteration_with_prefill(tl: GeoTimeline, reserved, cells: int, max_checks: int) -> float:
    """The training iteration re-simulated with the prefills as windows in which each GPU is
    taken (``geo.simulate(blocked=...)``), for every iteration the prefills touch (at most
    ``max_checks`` (cell, iteration) pairs, the busiest first); the longest one is returned.
    Equal to the undisturbed iteration when every prefill sits inside a bubble."""

    T = tl.iteration_s
    per: dict[tuple[int, int], dict[tuple[int, int], list]] = {}
    for (c, p, s), iv in reserved.items():
        for a, b in iv:
            for k in range(int(a // T) - 1, int(b // T) + 1):
                if k >= 0:
                    per.setdefault((c, k), {}).setdefault((p, s), []).append((a - k * T, b - k * T))
    worst = T
    todo = sorted(per, key=lambda ck: -sum(len(v) for v in per[ck].values()))[:max_checks]
    for c, k in todo:
        again = simulate(tl.job, tl.schedule, cell=tl.cell, max_inflight=tl.max_inflight,
                         blocked=per[(c, k)])
        worst = max(worst, again.iteration_s)
    return worst


MAX_REJECTED = 0.01  # a rate is sustainable while at most this share of its requests is rejected
PROBE_REQUESTS = 400  # requests per trial rate: a 1% share is 4 of them
WAIT_STEPS = (2.0, 4.0, 10.0, 20.0)  # longer --max-wait tried (x the given) when none sustains


@dataclass(frozen=True)
class Sustainable:
    """The largest Poisson request rate found at which at most ``max_rejected`` of the requests
    are rejected, and what it does to training (None fields: no rate tried was sustainable)."""

    max_rejected: float
    max_wait_s: float
    rate_per_s: float | None
    result: dict | None  # BubbleResult.summary() at that rate
    floor: float  # rejected share at the lowest rate tried (requests finding no bubble in time)
    lowest_rate_per_s: float
    trials: list[tuple[float, float]]  # (rate, rejected share) of every trial
    relaxed: list[dict] | None = None  # when none: each longer max wait tried, and its rate

    def to_json(self) -> dict:
        return {"max_rejected": self.max_rejected, "max_wait_s": self.max_wait_s,
                "rate_per_s": self.rate_per_s, "at_rate": self.result,
                "rejected_at_lowest_rate": self.floor,
                "lowest_rate_per_s": self.lowest_rate_per_s,
                "trials": [{"rate_per_s": r, "rejected_fraction": f} for r, f in self.trials],
                "longer_wait": self.relaxed}


@dataclass(frozen=True)
class Probe:
    """How ``sustainable`` tries rates: ``requests`` Poisson prefills per trial rate (drawn with
    ``seed``), a rate sustainable while at most ``max_rejected`` of them are rejected, the
    largest bisected to ``tolerance``."""

    seed: int = 0
    max_rejected: float = MAX_REJECTED
    requests: int = PROBE_REQUESTS
    tolerance: float = 0.05


def sustainable(tl: GeoTimeline, model: PrefillModel, *, cells: int = 1, depth: int = 8,
                guard_s: float = 0.005, max_wait_s: float = 0.05, probe: Probe = Probe(),
                relax: bool = True) -> Sustainable:
    """The largest request rate BubbleTea serves with at most ``probe.max_rejected`` rejected
    (Atlas §5 places every prefill or turns it away at once, so a rate is only served if
    almost none is turned away). Each trial rate places ``probe.requests`` Poisson prefills
    like the Azure conversation trace (``synthetic_requests``, seeded); the rate starts low
    enough for the bubbles to be nearly empty, doubles while it is sustainable, then is
    bisected (geometrically, to ``probe.tolerance``). At the rate found, the full result with
    the iteration re-simulated. When even the lowest rate rejects more (requests whose prefill
    fits no bubble within ``max_wait_s``, however idle the GPUs), ``relaxed`` gives, for each
    longer wait of ``WAIT_STEPS``, the rate it sustains (None: none)."""
    T = tl.iteration_s
    trials: list[tuple[float, float]] = []
    max_rejected = probe.max_rejected

    def rejected(rate: float) -> float:
        reqs = _poisson(rate, probe.requests, probe.seed)
        res = place(tl, reqs, model, cells=cells, depth=depth, guard_s=guard_s,
                    max_wait_s=max_wait_s, max_checks=0)
        share = res.summary()["rejected_fraction"]
        trials.append((rate, share))
        return share

    low = 0.1 / T  # one request every ten iterations: the bubbles are nearly empty
    floor = rejected(low)
    if floor > max_rejected:
        relaxed = None
        if relax:
            relaxed = [_at_longer_wait(tl, model, (cells, depth, guard_s), k * max_wait_s, probe)
                       for k in WAIT_STEPS]
        return Sustainable(max_rejected, max_wait_s, None, None, floor, low, trials, relaxed)
    ok, bad = low, None
    while bad is None:
        r = 2.0 * ok
        if rejected(r) <= max_rejected:
            ok = r
        else:
            bad = r
        if ok > 1e6:
            break
    while bad is not None and bad / ok > 1.0 + probe.tolerance:
        mid = (ok * bad) ** 0.5
        if rejected(mid) <= max_rejected:
            ok = mid
        else:
            bad = mid
    reqs = _poisson(ok, probe.requests, probe.seed)
    res = place(tl, reqs, model, cells=cells, depth=depth, guard_s=guard_s,
                max_wait_s=max_wait_s)
    return Sustainable(max_rejected, max_wait_s, ok, res.summary(), floor, low, trials)


def _at_longer_wait(tl: GeoTimeline, model: PrefillModel, placing: tuple[int, int, float],
                    max_wait_s: float, probe: Probe) -> dict:
    """The rate ``sustainable`` finds at a longer wait (``placing``: its cells, depth and
    guard)."""
    cells, depth, guard_s = placing
    s = sustainable(tl, model, cells=cells, depth=depth, guard_s=guard_s, max_wait_s=max_wait_s,
                    probe=probe, relax=False)
    return {"max_wait_s": s.max_wait_s, "rate_per_s": s.rate_per_s,
            "utilization_after": s.result and s.result["utilization_after"],
            "rejected_at_lowest_rate": s.floor}


def _poisson(rate_per_s: float, n: int, seed: int) -> list[tuple[float, int]]:
    """``n`` Poisson prefills at ``rate_per_s``, prompts like the Azure conversation trace (the
    same prompts in the same order at every rate, so trials differ only in the rate)."""

    w = poisson(synthetic_lengths(n, seed), rate_per_s, n, seed)
    return [(float(a), int(p)) for a, p in zip(w.arrival_s, w.prompt, strict=True)]


def load_requests(path) -> list[tuple[float, int]]:
    """Prefill requests from a CSV with the header ``arrival_s,prompt_tokens`` (arrivals sorted,
    non-negative; prompts > 0); every problem is a SpecError naming the line."""
    import csv


    text = read_text(path, "file", "a UTF-8 CSV")
    rows = list(csv.reader(text.splitlines()))
    if not rows or [c.strip() for c in rows[0]][:2] != ["arrival_s", "prompt_tokens"]:
        raise SpecError("expected a CSV with the header arrival_s,prompt_tokens", file=str(path),
                        value=",".join(rows[0]) if rows else "")
    out: list[tuple[float, int]] = []
    for n, r in enumerate(rows[1:], 2):
        if not r:
            continue
        try:
            a, k = float(r[0]), int(r[1])
        except (ValueError, IndexError):
            raise SpecError(f"line {n}: expected a time in seconds and a token count",
                            file=str(path), value=",".join(r)) from None
        if not math.isfinite(a) or a < 0 or k <= 0:
            raise SpecError(f"line {n}: arrival must be >= 0 and prompt_tokens > 0",
                            file=str(path), value=",".join(r))
        if out and a < out[-1][0]:
            raise SpecError(f"line {n}: arrivals must be sorted", file=str(path), value=r[0],
                            allowed=f">= {out[-1][0]}")
        out.append((a, k))
    if not out:
        raise SpecError("no requests", file=str(path))
    return out


def synthetic_requests(rate_per_s: float, duration_s: float, seed: int = 0
                       ) -> list[tuple[float, int]]:
    """Poisson arrivals at ``rate_per_s`` for ``duration_s``, prompt lengths like the Azure
    conversation trace (``shoal.serving.workload.synthetic_lengths``)."""

    n = max(1, int(round(rate_per_s * duration_s)))
    w = poisson(synthetic_lengths(n, seed), rate_per_s, n, seed)
    out = [(float(a), int(p)) for a, p in zip(w.arrival_s, w.prompt) if a <= duration_s]
    if not out:
        raise SpecError("no request arrives within the duration at this rate",
                        field="--rate", value=rate_per_s,
                        allowed=f"a rate and --duration that bring requests (here "
                                f"{rate_per_s * duration_s:.3g} expected)")
    return out
