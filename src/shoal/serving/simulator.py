"""Request-level discrete-event simulation of serving a placement (Helix §5, §6).

Every request is routed once (``routing``) and then walks its chain for the prompt and for each
generated token. A node runs *dynamic batches*: when it is idle and work is queued, it takes
the queued prompts (a prefill step, the decode steps waiting) or else the queued decode steps
as one batch, whose time is its layer count x the per-layer prompt time of the batch's prompt
tokens or the per-layer decode time of its decode batch size. After a batch, the items
go on, grouped by their next node, over the link between the two: a link sends one message at a
time (FIFO) at its bandwidth, and the message arrives after the link's latency; a prompt sends
one activation per prompt token, a decode step one; a finished token goes back to the
coordinator as a token id, which then sends the request's next step to its first node.

Modes: ``offline`` keeps the cluster busy as Helix's offline runs do (``FEED_INITIAL`` requests
at the start, then one more after each prompt and each request completes while the expected KV
use of the fullest layer is at most ``FEED_HIGH_WATER``; or, given ``concurrency``, that many
requests in flight, one entering as one completes), ``online`` follows arrival times (requests
the KV cache cannot admit wait at the coordinator, first come first served). Metrics are taken
over the window after ``warmup_s``: decode throughput (generated tokens/s), prompt + decode
tokens/s, prompt latency (arrival or admission to first token) and decode latency per token
(first to last token over the output tokens after the first), node utilisation and KV use.
"""

from __future__ import annotations

import bisect
import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from shoal.errors import InfeasibleError, SpecError
from shoal.serving.cluster import Cluster
from shoal.serving.flow import Flow
from shoal.serving.perf import batch_caps, kv_capacity
from shoal.serving.placement import Placement
from shoal.serving.routing import ROUTERS, KVCache, Router, route_chain
from shoal.serving.workload import Workload

# Helix's admission settings (code, §9 of the notes): (high water, expected-output ratio)
KV_SETTINGS = {"online": (0.9, 0.6), "offline": (0.85, 1.0)}
# Helix's offline feeder: requests at the start, then one more after each prompt and each
# request completes while the expected KV use of the fullest layer is at most the high water
FEED_INITIAL = 20
FEED_HIGH_WATER = 0.8


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


class _Clock:
    """Per-layer batch times of one node, as plain Python for the simulator's inner loop."""

    def __init__(self, times):
        self.t = times
        self.px = self.pt = self.dx = self.dt = None
        if times.prompt_x is not None:
            self.px, self.pt = list(map(float, times.prompt_x)), list(map(float, times.prompt_t))
            self.dx, self.dt = list(map(float, times.decode_x)), list(map(float, times.decode_t))

    @staticmethod
    def _at(x: float, xs: list[float], ts: list[float]) -> float:
        k = bisect.bisect_left(xs, x)
        if k == 0:
            return ts[0]
        if k >= len(xs):
            k = len(xs) - 1  # past the table: extend the last segment
        x0, x1 = xs[k - 1], xs[k]
        return ts[k - 1] + (ts[k] - ts[k - 1]) * (x - x0) / (x1 - x0) if x1 > x0 else ts[k]

    def layer_s(self, P: float, D: int, ctx: float) -> float:
        if self.px is None:
            return self.t.prompt_s(P) + self.t.decode_s(D, ctx)
        return ((self._at(P, self.px, self.pt) if P > 0 else 0.0)
                + (self._at(D, self.dx, self.dt) if D > 0 else 0.0))


BATCHING = ("vllm", "live")


def woken(gap: float, gaps: list[float], extra: list[float]) -> float:
    """``extra`` (per idle time of ``gaps``, as a ``WakeSpec`` gives them) at an idle time of
    ``gap``: linear from none at 0, the last value beyond the last idle time."""
    if gap <= 0:
        return 0.0
    if gap >= gaps[-1]:
        return extra[-1]
    k = bisect.bisect_left(gaps, gap)
    g0, e0 = (gaps[k - 1], extra[k - 1]) if k else (0.0, 0.0)
    return e0 + (extra[k] - e0) * (gap - g0) / (gaps[k] - g0)


def simulate(cluster: Cluster, pl: Placement, flow: Flow | None, work: Workload, *,
             router: str = "iwrr", warmup_s: float = 60.0, duration_s: float | None = 600.0,
             seed: int = 0, progress=None, batching: str = "vllm",
             concurrency: int | None = None) -> SimResult:
    """Simulate ``work`` on the placement; offline runs last ``warmup_s + duration_s`` of
    simulated time, online runs until every request is done (``duration_s``: stop earlier).
    ``batching``: ``vllm`` schedules as vLLM 0.4 (Helix's engine: prefill-only steps while
    prompts wait, batches capped by each machine's ``batch`` limits, one prefill over all their
    tokens), ``live`` as the workers of ``shoal serve run``: one request's step at a time, in
    arrival order, each sent on when done. ``concurrency``: offline, that many requests in
    flight instead of the KV feeder."""
    if router not in ROUTERS:
        raise SpecError("unknown router", field="--router", value=router, allowed=", ".join(ROUTERS))
    if batching not in BATCHING:
        raise SpecError("unknown batching", field="--batching", value=batching,
                        allowed=", ".join(BATCHING))
    bare = pl.uncovered_text(cluster)
    if bare:
        raise InfeasibleError(
            f"no request can finish: layers {bare} are on no node", binding="placement",
            relaxation="give those layers to a node (serve plan places every layer)")
    capped = batching == "vllm"
    missing = [cluster.names[i] for i, r in enumerate(pl.ranges)
               if r is not None and cluster.times[i] is None]
    if missing:
        raise SpecError("simulation needs per-layer times for every node used: give its machine "
                        "a 'profile' or a catalog 'gpu'", value=missing[0])
    wall0 = time.perf_counter()
    mode = "offline" if work.arrival_s is None else "online"
    n = cluster.n
    SRC, SNK = n, n + 1
    R = Router(router, cluster, pl, flow, seed, mean_output=float(work.output.mean()))
    layers_np = np.array([(r[1] - r[0]) if r else 0 for r in pl.ranges], dtype=float)
    layers = layers_np.tolist()
    hw, ratio = KV_SETTINGS[mode]
    kv = KVCache(kv_capacity(cluster, pl), layers_np, hw, ratio, float(work.output.mean()))
    clocks = [_Clock(cluster.times[i]) if pl.ranges[i] is not None else None for i in range(n)]
    prompt = work.prompt.astype(int).tolist()
    output = work.output.astype(int).tolist()
    arrival = work.arrival_s.tolist() if work.arrival_s is not None else None
    N = work.n
    done = [0] * N
    nan = float("nan")
    start_t, first_t, finish_t = [nan] * N, [nan] * N, [nan] * N
    chains: list[list[int]] = [[] for _ in range(N)]
    chain_edges: list[list[int]] = [[] for _ in range(N)]
    act_b = cluster.activation_bytes + cluster.token_bytes
    tok_b = cluster.token_bytes
    bw = (cluster.S * act_b).tolist()
    lat = cluster.lat.tolist()
    src_bw, snk_bw = (cluster.src * tok_b).tolist(), (cluster.snk * tok_b).tolist()
    src_lat, snk_lat = cluster.src_lat.tolist(), cluster.snk_lat.tolist()
    link_free: dict[tuple[int, int], float] = {}
    queue: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    busy = [False] * n
    busy_s = [0.0] * n
    end = (warmup_s + duration_s) if duration_s is not None else float("inf")
    heap: list = []
    seq = 0
    decode_tokens = prompt_tokens = events = 0
    in_flight = peak_in_flight = waited = completed = 0
    waiting: deque[int] = deque()
    next_req = 0
    helix = router == "helix-iwrr"  # its loads grow with every decode step
    caps = batch_caps(cluster, pl)
    inv_cap = (1.0 / R.cap_arr).tolist() if helix else []
    load = R.load

    def route(r: int) -> bool:
        chain = route_chain(R, kv, n, prompt[r])
        if chain is None:
            return False
        chains[r] = chain
        chain_edges[r] = R.edges_of(chain)
        return True

    def send(t: float, u: int, v: int, items: list[tuple[int, int]], nbytes: float,
             rate: float, delay: float) -> None:
        """Move a message from u to v over their link (FIFO); deliver or return at arrival."""
        nonlocal seq
        t0 = link_free.get((u, v), 0.0)
        if t0 < t:
            t0 = t
        t1 = t0 + nbytes / rate
        link_free[(u, v)] = t1
        lo, hi = max(t0, warmup_s), min(t1, end)
        if hi > lo:
            link_busy[(u, v)] = link_busy.get((u, v), 0.0) + hi - lo
        heapq.heappush(heap, (t1 + delay, seq, 1 if v != SNK else 2, v, items))
        seq += 1

    def start_batch(v: int, t: float) -> None:
        """What is queued, as vLLM 0.4 (Helix's engine) schedules it: when prompts wait, a
        prefill step of whole prompts in arrival order while their number and tokens stay
        under the node's caps (at least one), the decode steps waiting; otherwise one decode
        step of up to its cap. ``batching="live"``: the first queued request's step alone (a
        worker of ``shoal serve run`` runs what has arrived one request after the other and
        sends each on as it is done)."""
        nonlocal seq
        items = queue[v]
        take, rest = [], []
        if not capped:  # live: one request's step at a time, in arrival order, sent on when done
            items, rest = items[:1], items[1:]
        P = 0
        D = 0
        ctx = 0
        solo = 0.0  # live batching: the prompts' times, each on its own
        prefill_only = capped and any(done[it[0]] == 0 for it in items)
        max_p, max_pt, max_d = caps[v]
        n_p = 0
        for it in items:
            r = it[0]
            if prefill_only and done[r] != 0:
                rest.append(it)
                continue
            if done[r] == 0:
                if (P + prompt[r] <= max_pt and n_p < max_p) or not take or not capped:
                    P += prompt[r]
                    n_p += 1
                    if not capped:
                        solo += clocks[v].layer_s(float(prompt[r]), 0, 0.0)
                    take.append(it)
                else:
                    rest.append(it)
            elif max_d > D or not capped:
                D += 1
                ctx += prompt[r] + done[r]
                take.append(it)
            else:
                rest.append(it)
        queue[v] = rest
        dur = layers[v] * (clocks[v].layer_s(float(P), D, ctx / D if D else 0.0) if capped
                           else solo + clocks[v].layer_s(0.0, D, ctx / D if D else 0.0))
        if wake is not None and t > idle_since[v]:  # the work found the node idle
            g = t - idle_since[v]
            dur += woken(g, wake.gap_s, wake.hop_s) + layers[v] * woken(
                g, wake.gap_s, wake.prompt_s_per_layer if P else wake.decode_s_per_layer)
        busy[v] = True
        R.observe(v, dur, P + D)
        if speed is None:
            lo, hi = max(t, warmup_s), min(t + dur, end)
            if hi > lo:
                busy_s[v] += hi - lo
            heapq.heappush(heap, (t + dur, seq, 0, v, (take, 0)))
            seq += 1
        else:
            share(t)
            running[v] = [dur, take]
            computing[host_of[v]] = computing.get(host_of[v], 0) + 1
            reschedule(t)

    # what work reaching an idle node (or the coordinator) pays, by how long it was idle
    wake = cluster.wake
    idle_since = [-math.inf] * n  # when each node's last batch ended (busy: not read)
    coord_since = -math.inf  # when the coordinator last handled anything

    # nodes sharing a host's cores: each of the k nodes of one host computing at once
    # progresses at share(k) of its own speed (processor sharing; the measured
    # ``host_share`` or min(1, cores / k)); nodes on other hosts (their ``host``; none: the
    # coordinator's machine) do not count. A batch's end is moved whenever k changes
    # (``version`` tells the events still current)
    speed = cluster.sharing()
    host_of = cluster.hosts or (None,) * n
    running: dict[int, list] = {}  # node -> [its own seconds of work left, the batch]
    computing: dict = {}  # host -> its nodes computing now
    version = [0] * n
    since = [0.0]

    def share(t: float) -> None:
        """Advance the running batches to ``t`` at the current rates."""
        if running:
            lo, hi = max(since[0], warmup_s), min(t, end)
            for u, job in running.items():
                job[0] -= (t - since[0]) * speed(computing[host_of[u]])
                if hi > lo:
                    busy_s[u] += hi - lo
        since[0] = t

    def reschedule(t: float) -> None:
        nonlocal seq
        for u, (left, take) in running.items():
            version[u] += 1
            rate = speed(computing[host_of[u]])
            heapq.heappush(heap, (t + max(left, 0.0) / rate, seq, 0, u, (take, version[u])))
            seq += 1

    def enter(t: float, r: int) -> None:
        nonlocal in_flight, peak_in_flight
        start_t[r] = t if arrival is None else arrival[r]
        entered_t[r] = t
        in_flight += 1
        peak_in_flight = max(peak_in_flight, in_flight)
        first = chains[r][0]
        send(t, SRC, first, [(r, 0)], prompt[r] * tok_b, src_bw[first], src_lat[first])

    # per layer, the nodes holding it, each counted per layer it holds (Helix's bottleneck use)
    per_layer = np.zeros((max((r[1] for r in pl.ranges if r), default=0), n))
    for i, r in enumerate(pl.ranges):
        if r is not None:
            per_layer[r[0]:r[1], i] = 1.0 / (r[1] - r[0])
    per_layer = per_layer[per_layer.sum(axis=1) > 0]
    layer_total = np.maximum(per_layer @ kv.total, 1e-9)
    kv_fill = [0.0, -1]  # the fullest layer's expected KV use after the warm-up, and its row
    link_busy: dict[tuple[int, int], float] = {}
    entered_t = [nan] * N

    def admit(t: float, count: int = 1) -> None:
        """Offline: up to ``count`` requests while the fullest layer's expected KV use is under
        the feeder's high water; online: admit waiting requests in order."""
        nonlocal next_req, waited
        if mode == "offline":
            for _ in range(count):
                if next_req >= N:
                    break
                if concurrency is None:
                    fill = (per_layer @ kv.used) / layer_total
                    top = int(fill.argmax())
                    if t >= warmup_s and fill[top] > kv_fill[0]:
                        kv_fill[0], kv_fill[1] = float(fill[top]), top
                    if fill[top] > FEED_HIGH_WATER:
                        break
                if not route(next_req):
                    waited += 1
                    break
                enter(t, next_req)
                next_req += 1
        else:
            while waiting:
                if not route(waiting[0]):
                    break
                enter(t, waiting.popleft())

    if concurrency is not None and (mode != "offline" or concurrency < 1):
        raise SpecError("a fixed concurrency is for offline runs, at least 1", field="concurrency",
                        value=concurrency)
    feeder = mode == "offline" and concurrency is None  # a finished prompt lets one more in
    if mode == "offline":
        admit(0.0, FEED_INITIAL if concurrency is None else concurrency)
        if in_flight == 0:
            raise InfeasibleError("no request can be admitted: the KV cache of the nodes on "
                                  "every chain is too small for one prompt",
                                  binding="KV cache", relaxation="use nodes with more memory "
                                  "or fewer layers per node")
    else:
        for r in range(N):
            heapq.heappush(heap, (arrival[r], seq, 3, r, None))
            seq += 1
    last_report = 0.0
    t = 0.0
    while heap:
        t, _, kind, v, items = heapq.heappop(heap)
        if t > end:
            break
        events += 1
        if progress is not None and t - last_report > 5.0:
            last_report = t
            progress(t, end if end != float("inf") else None, completed)
        if kind == 1:  # delivered to node v
            queue[v].extend(items)
            R.queued[v] += len(items)
            if not busy[v]:
                start_batch(v, t)
        elif kind == 0:  # node v finished a batch
            items, ver = items
            if speed is not None:
                if ver != version[v]:
                    continue  # moved since: the sharing changed
                share(t)
                del running[v]
                computing[host_of[v]] -= 1
            busy[v] = False
            idle_since[v] = t
            R.queued[v] -= len(items)
            groups: dict[int, list[tuple[int, int]]] = {}
            for r, h in items:
                groups.setdefault(chains[r][h + 1], []).append((r, h + 1))
            for u, grp in groups.items():
                if u == SNK:
                    send(t, v, SNK, grp, len(grp) * tok_b, snk_bw[v], snk_lat[v])
                else:
                    tokens = sum(prompt[r] if done[r] == 0 else 1 for r, _ in grp)
                    send(t, v, u, grp, tokens * act_b, bw[v][u], lat[v][u])
            if queue[v]:
                start_batch(v, t)
            elif speed is not None:
                reschedule(t)
        elif kind == 2:  # tokens back at the coordinator
            if wake is not None:
                t += woken(t - coord_since, wake.gap_s, wake.hop_s)
                coord_since = t
            in_window = t >= warmup_s
            go: dict[int, list[tuple[int, int]]] = {}
            fed = 0
            for r, _ in items:
                if done[r] == 0:
                    first_t[r] = t
                    fed += feeder
                    if in_window:
                        prompt_tokens += prompt[r]
                done[r] += 1
                if in_window:
                    decode_tokens += 1
                if done[r] >= output[r]:
                    finish_t[r] = t
                    kv.release(chains[r][:-1], prompt[r])
                    R.finish(chains[r], prompt[r])
                    in_flight -= 1
                    completed += 1
                    fed += 1
                else:
                    if helix:
                        for e in chain_edges[r]:
                            load[e] += inv_cap[e]
                    go.setdefault(chains[r][0], []).append((r, 0))
            for u, grp in go.items():
                send(t, SRC, u, grp, len(grp) * tok_b, src_bw[u], src_lat[u])
            if fed:
                admit(t, fed)
        else:  # kind == 3: an arrival (online)
            coord_since = max(coord_since, t)
            if waiting or not route(v):
                waiting.append(v)
                waited += 1
            else:
                enter(t, v)
    fin = np.array(finish_t)
    first = np.array(first_t)
    start = np.array(start_t)
    out_arr = np.array(output)
    t_end = end if end != float("inf") else (float(np.nanmax(fin)) if completed else warmup_s)
    window = max(t_end - warmup_s, 1e-9)
    # latencies of the requests that entered after the warm-up (the steady state)
    with np.errstate(invalid="ignore"):
        ok = ~np.isnan(first) & (start >= warmup_s) & (first <= t_end)
        fin_ok = ~np.isnan(fin) & (start >= warmup_s) & (out_arr > 1)
    pl_lat = (first - start)[ok]
    dl = ((fin - first) / np.maximum(out_arr - 1, 1))[fin_ok]
    # requests in flight, averaged over the window: each from its admission to its end
    entered = np.array(entered_t)
    with np.errstate(invalid="ignore"):
        a = np.clip(entered, warmup_s, t_end)
        b = np.clip(np.where(np.isnan(fin), t_end, fin), warmup_s, t_end)
    in_flight_mean = float(np.nansum(np.maximum(b - a, 0.0))) / window
    routed = [len(c) - 1 for c in chains if c]
    busiest = max(link_busy.items(), key=lambda kv_: kv_[1], default=None)
    warnings = []
    if np.isfinite(start).any() and not (start >= warmup_s).any():
        warnings.append(
            f"no request arrived after the {warmup_s:g} s warm-up (the last of {len(start)} "
            f"arrived at {float(np.nanmax(start)):.1f} s): no latency is measured and the "
            "throughput is that of the run's tail; lower --warmup or simulate more requests")
    return SimResult(
        mode=mode, router=router, window_s=window,
        decode_tokens_per_s=decode_tokens / window,
        tokens_per_s=(decode_tokens + prompt_tokens) / window,
        prompt_latency_s=_stats(pl_lat), decode_latency_s=_stats(dl),
        latency_histogram={"prompt": _histogram(pl_lat), "decode": _histogram(dl)},
        completed=completed, waited=waited, in_flight_peak=peak_in_flight,
        node_utilization=[b / window for b in busy_s],
        kv_peak_fraction=[float(p / t) if t > 0 else 0.0 for p, t in zip(kv.peak, kv.total,
                                                                          strict=True)],
        wall_s=time.perf_counter() - wall0, events=events, measured=int(ok.sum()),
        warnings=warnings, in_flight_mean=in_flight_mean,
        hops_mean=float(np.mean(routed)) if routed else 0.0,
        busiest_link=None if busiest is None else (*busiest[0], busiest[1] / window),
        kv_fill_peak=kv_fill[0] if kv_fill[1] >= 0 else None,
        kv_fill_nodes=tuple(int(i) for i in np.flatnonzero(per_layer[kv_fill[1]]))
        if kv_fill[1] >= 0 else ())
