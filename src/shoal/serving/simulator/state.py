"""The state of one serving simulation and the handlers of its four event kinds."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from shoal.errors import InfeasibleError
from shoal.estimate.events import Event
from shoal.serving.cluster import Cluster
from shoal.serving.flow import Flow
from shoal.serving.perf import batch_caps, kv_capacity
from shoal.serving.placement import Placement
from shoal.serving.routing import KVCache, Router, route_chain
from shoal.serving.simulator.batch import form_batch
from shoal.serving.simulator.clock import Clock, HostSharing, woken
from shoal.serving.simulator.events import BatchEnds, Item, MessageArrives, RequestArrives, TokensArrive
from shoal.serving.workload import Workload

# Helix's admission settings (code, §9 of the notes): (high water, expected-output ratio)
KV_SETTINGS = {"online": (0.9, 0.6), "offline": (0.85, 1.0)}
# Helix's offline feeder: requests at the start, then one more after each prompt and each
# request completes while the expected KV use of the fullest layer is at most the high water
FEED_INITIAL = 20
FEED_HIGH_WATER = 0.8


@dataclass(frozen=True)
class Settings:
    """How a run goes: its ``router`` (``names.ROUTERS``) and the router's ``seed``; metrics
    over [``warmup_s``, ``end_s``] (no event after ``end_s`` is handled); ``capped``: vLLM
    batching (else live); offline, ``concurrency`` requests in flight (None: the KV feeder)."""

    router: str
    warmup_s: float
    end_s: float
    seed: int
    capped: bool
    concurrency: int | None


class ServeRun:
    """The state of one ``simulate``: per node its queue and whether it is busy, per link when
    it is free, per request its chain, progress and times, the router and KV cache, the
    counters the metrics are made of; and the handlers of the four event kinds. Vertices:
    nodes 0..n-1, the coordinator as source ``n`` and sink ``n + 1``."""

    __slots__ = (
        "n", "SRC", "SNK", "mode", "warmup_s", "end_s", "capped", "concurrency", "feeder",
        "R", "kv", "helix", "inv_cap", "load", "layers", "clocks", "caps", "queue", "busy",
        "busy_s", "idle_since", "wake", "coord_since", "sharing",
        "N", "prompt", "output", "arrival", "done", "start_t", "entered_t", "first_t",
        "finish_t", "chains", "chain_edges", "waiting", "next_req",
        "act_b", "tok_b", "bw", "lat", "src_bw", "snk_bw", "src_lat", "snk_lat", "link_free",
        "link_busy", "per_layer", "layer_total", "kv_fill",
        "decode_tokens", "prompt_tokens", "in_flight", "peak_in_flight", "waited", "completed")

    def __init__(self, cluster: Cluster, pl: Placement, flow: Flow | None, work: Workload,
                 settings: Settings) -> None:
        s = settings
        self.n = n = cluster.n
        self.SRC, self.SNK = n, n + 1
        self.mode = "offline" if work.arrival_s is None else "online"
        self.warmup_s, self.end_s, self.capped = s.warmup_s, s.end_s, s.capped
        self.concurrency = s.concurrency
        self.feeder = self.mode == "offline" and s.concurrency is None  # a prompt lets one in
        mean_out = float(work.output.mean())
        self.R = R = Router(s.router, cluster, pl, flow, s.seed, mean_output=mean_out)
        layers = np.array([(r[1] - r[0]) if r else 0 for r in pl.ranges], dtype=float)
        self.kv = KVCache(kv_capacity(cluster, pl), layers, *KV_SETTINGS[self.mode], mean_out)
        self.helix = s.router == "helix-iwrr"  # its loads grow with every decode step
        self.inv_cap = (1.0 / R.cap_arr).tolist() if self.helix else []
        self.load = R.load
        self._nodes(cluster, pl, layers)
        self._requests(work)
        self._links(cluster)
        self._kv_rows(pl)
        self.decode_tokens = self.prompt_tokens = 0
        self.in_flight = self.peak_in_flight = self.waited = self.completed = 0

    def _nodes(self, cluster: Cluster, pl: Placement, layers: np.ndarray) -> None:
        n = self.n
        self.layers = layers.tolist()
        self.clocks = [Clock(cluster.times[i]) if pl.ranges[i] is not None else None
                       for i in range(n)]
        self.caps = batch_caps(cluster, pl)
        self.queue: list[list[Item]] = [[] for _ in range(n)]
        self.busy = [False] * n
        self.busy_s = [0.0] * n
        # what work reaching an idle node (or the coordinator) pays, by how long it was idle
        self.wake = cluster.wake
        self.idle_since = [-math.inf] * n  # when each node's last batch ended (busy: not read)
        self.coord_since = -math.inf  # when the coordinator last handled anything
        speed = cluster.sharing()
        self.sharing = None if speed is None else HostSharing(
            speed, cluster.hosts or (None,) * n, self.busy_s, self.warmup_s, self.end_s)

    def _requests(self, work: Workload) -> None:
        self.N = N = work.n
        self.prompt = work.prompt.astype(int).tolist()
        self.output = work.output.astype(int).tolist()
        self.arrival = work.arrival_s.tolist() if work.arrival_s is not None else None
        self.done = [0] * N  # tokens generated
        nan = float("nan")
        self.start_t, self.entered_t = [nan] * N, [nan] * N
        self.first_t, self.finish_t = [nan] * N, [nan] * N
        self.chains: list[list[int]] = [[] for _ in range(N)]
        self.chain_edges: list[list[int]] = [[] for _ in range(N)]
        self.waiting: deque[int] = deque()  # online: arrived, waiting for KV room
        self.next_req = 0  # offline: the next request to enter

    def _links(self, cluster: Cluster) -> None:
        self.act_b = act_b = cluster.activation_bytes + cluster.token_bytes
        self.tok_b = tok_b = cluster.token_bytes
        self.bw = (cluster.S * act_b).tolist()
        self.lat = cluster.lat.tolist()
        self.src_bw, self.snk_bw = (cluster.src * tok_b).tolist(), (cluster.snk * tok_b).tolist()
        self.src_lat, self.snk_lat = cluster.src_lat.tolist(), cluster.snk_lat.tolist()
        self.link_free: dict[tuple[int, int], float] = {}
        self.link_busy: dict[tuple[int, int], float] = {}  # seconds sending in the window

    def _kv_rows(self, pl: Placement) -> None:
        """Per layer, the nodes holding it, each counted per layer it holds (Helix's
        bottleneck use), for the offline feeder."""
        per_layer = np.zeros((max((r[1] for r in pl.ranges if r), default=0), self.n))
        for i, r in enumerate(pl.ranges):
            if r is not None:
                per_layer[r[0]:r[1], i] = 1.0 / (r[1] - r[0])
        self.per_layer = per_layer[per_layer.sum(axis=1) > 0]
        self.layer_total = np.maximum(self.per_layer @ self.kv.total, 1e-9)
        self.kv_fill = [0.0, -1]  # the fullest layer's expected KV use in the window, its row

    # ---- the start --------------------------------------------------------------------------
    def initial(self) -> list[Event]:
        """Offline: the first requests enter (the feeder's first ones, or ``concurrency``);
        online: every request's arrival."""
        if self.mode != "offline":
            return [RequestArrives(a, r) for r, a in enumerate(self.arrival)]
        out = self.feed(0.0, FEED_INITIAL if self.concurrency is None else self.concurrency)
        if self.in_flight == 0:
            raise InfeasibleError("no request can be admitted: the KV cache of the nodes on "
                                  "every chain is too small for one prompt",
                                  binding="KV cache", relaxation="use nodes with more memory "
                                  "or fewer layers per node")
        return out

    # ---- requests in and out ----------------------------------------------------------------
    def route(self, r: int) -> bool:
        """Give request r a chain (its KV reserved on every node of it), if one admits it."""
        chain = route_chain(self.R, self.kv, self.n, self.prompt[r])
        if chain is None:
            return False
        self.chains[r] = chain
        self.chain_edges[r] = self.R.edges_of(chain)
        return True

    def enter(self, t: float, r: int) -> Event:
        """Routed request r enters at ``t``: its prompt goes to its first node."""
        self.start_t[r] = t if self.arrival is None else self.arrival[r]
        self.entered_t[r] = t
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        first = self.chains[r][0]
        return self.send(t, self.SRC, first, [(r, 0)], self.prompt[r] * self.tok_b,
                         self.src_bw[first], self.src_lat[first])

    def feed(self, t: float, count: int) -> list[Event]:
        """Offline: up to ``count`` requests enter while the fullest layer's expected KV use
        is under the feeder's high water (with a fixed concurrency: while they can be routed)."""
        out = []
        for _ in range(count):
            if self.next_req >= self.N:
                break
            if self.concurrency is None:
                fill = (self.per_layer @ self.kv.used) / self.layer_total
                top = int(fill.argmax())
                if t >= self.warmup_s and fill[top] > self.kv_fill[0]:
                    self.kv_fill[0], self.kv_fill[1] = float(fill[top]), top
                if fill[top] > FEED_HIGH_WATER:
                    break
            if not self.route(self.next_req):
                self.waited += 1
                break
            out.append(self.enter(t, self.next_req))
            self.next_req += 1
        return out

    def admit(self, t: float, count: int) -> list[Event]:
        """After ``count`` prompts or requests are done: offline, ``feed``; online, the
        waiting requests enter in order while they can be routed."""
        if self.mode == "offline":
            return self.feed(t, count)
        out = []
        waiting = self.waiting
        while waiting:
            if not self.route(waiting[0]):
                break
            out.append(self.enter(t, waiting.popleft()))
        return out

    # ---- links and nodes --------------------------------------------------------------------
    def send(self, t: float, u: int, v: int, items: list[Item], nbytes: float, rate: float,
             delay: float) -> Event:
        """A message from u to v over their link, which sends one at a time (FIFO) from
        ``t``; its arrival."""
        key = (u, v)
        t0 = self.link_free.get(key, 0.0)
        if t0 < t:
            t0 = t
        t1 = t0 + nbytes / rate
        self.link_free[key] = t1
        lo, hi = max(t0, self.warmup_s), min(t1, self.end_s)
        if hi > lo:
            self.link_busy[key] = self.link_busy.get(key, 0.0) + hi - lo
        if v == self.SNK:
            return TokensArrive(t1 + delay, tuple(items))
        return MessageArrives(t1 + delay, v, tuple(items))

    def start_batch(self, v: int, t: float) -> list[Event]:
        """Node v (idle, work queued) starts a batch at ``t`` (``batch.form_batch``); it ends
        after its layers' time, plus the wake when it was idle, stretched while it shares its
        host's cores."""
        take, self.queue[v], P, D, layer_s = form_batch(
            self.queue[v], self.done, self.prompt, self.caps[v], self.capped, self.clocks[v])
        dur = self.layers[v] * layer_s
        wake = self.wake
        if wake is not None and t > self.idle_since[v]:  # the work found the node idle
            g = t - self.idle_since[v]
            dur += woken(g, wake.gap_s, wake.hop_s) + self.layers[v] * woken(
                g, wake.gap_s, wake.prompt_s_per_layer if P else wake.decode_s_per_layer)
        self.busy[v] = True
        self.R.observe(v, dur, P + D)
        if self.sharing is not None:
            return self.sharing.start(v, t, dur, tuple(take))
        lo, hi = max(t, self.warmup_s), min(t + dur, self.end_s)
        if hi > lo:
            self.busy_s[v] += hi - lo
        return [BatchEnds(t + dur, v, tuple(take))]

    def pass_on(self, v: int, t: float, items: tuple[Item, ...]) -> list[Event]:
        """After node v's batch: the items go on, one message per next node (the coordinator
        last on a chain): a prompt as its tokens' activations, a decode step as one."""
        chains = self.chains
        groups: dict[int, list[Item]] = {}
        for r, h in items:
            groups.setdefault(chains[r][h + 1], []).append((r, h + 1))
        out = []
        for u, grp in groups.items():
            if u == self.SNK:
                out.append(self.send(t, v, u, grp, len(grp) * self.tok_b, self.snk_bw[v],
                                     self.snk_lat[v]))
            else:
                done, prompt = self.done, self.prompt
                tokens = sum(prompt[r] if done[r] == 0 else 1 for r, _ in grp)
                out.append(self.send(t, v, u, grp, tokens * self.act_b, self.bw[v][u],
                                     self.lat[v][u]))
        return out

    # ---- handlers ---------------------------------------------------------------------------
    def request_arrives(self, ev: RequestArrives) -> list[Event]:
        t, r = ev.time_s, ev.request
        self.coord_since = max(self.coord_since, t)
        if self.waiting or not self.route(r):
            self.waiting.append(r)
            self.waited += 1
            return []
        return [self.enter(t, r)]

    def message_arrives(self, ev: MessageArrives) -> list[Event] | None:
        v = ev.node
        self.queue[v].extend(ev.items)
        self.R.queued[v] += len(ev.items)
        return None if self.busy[v] else self.start_batch(v, ev.time_s)

    def batch_ends(self, ev: BatchEnds) -> list[Event] | None:
        sharing = self.sharing
        if sharing is not None and not sharing.end(ev):
            return None
        v, t = ev.node, ev.time_s
        self.busy[v] = False
        self.idle_since[v] = t
        self.R.queued[v] -= len(ev.items)
        out = self.pass_on(v, t, ev.items)
        if self.queue[v]:
            out += self.start_batch(v, t)
        elif sharing is not None:
            out += sharing.reschedule(t)
        return out

    def tokens_arrive(self, ev: TokensArrive) -> list[Event]:
        """A token of each item is done: a request's first (its prompt latency ends), its
        last (it completes, its KV is freed and more may enter), or its next step goes to its
        first node."""
        t = ev.time_s
        if self.wake is not None:
            t += woken(t - self.coord_since, self.wake.gap_s, self.wake.hop_s)
            self.coord_since = t
        in_window = t >= self.warmup_s
        done, prompt, chains = self.done, self.prompt, self.chains
        go: dict[int, list[Item]] = {}
        fed = 0
        for r, _ in ev.items:
            if done[r] == 0:
                self.first_t[r] = t
                fed += self.feeder
                if in_window:
                    self.prompt_tokens += prompt[r]
            done[r] += 1
            if in_window:
                self.decode_tokens += 1
            if done[r] >= self.output[r]:
                self.finish_t[r] = t
                self.kv.release(chains[r][:-1], prompt[r])
                self.R.finish(chains[r], prompt[r])
                self.in_flight -= 1
                self.completed += 1
                fed += 1
            else:
                if self.helix:
                    load, inv_cap = self.load, self.inv_cap
                    for e in self.chain_edges[r]:
                        load[e] += inv_cap[e]
                go.setdefault(chains[r][0], []).append((r, 0))
        out = [self.send(t, self.SRC, u, grp, len(grp) * self.tok_b, self.src_bw[u],
                         self.src_lat[u]) for u, grp in go.items()]
        if fed:
            out += self.admit(t, fed)
        return out
