"""Per-request routing (Helix §5): every request gets its own chain of nodes from the coordinator
back to it, chosen hop by hop; its decode iterations follow the same chain (KV locality).

Routers, one interface (``choose(u, candidates, weight) -> v``):
- ``iwrr`` (default): Helix's interleaved weighted round-robin over the max flow's edges (§5.1),
  with two changes that make it win at equal load (BENCHMARKS.md). Its weights are the max flow
  that spreads load over parallel nodes and links in proportion to their capacity
  (``flow.balanced``: of all the max flows, the one with the least sum of flow² / capacity),
  not whichever one preflow-push returns, which can leave one of two equal nodes at a third of
  the other's load. And its virtual finish time counts the work *in flight* on each edge: a
  request adds its expected tokens (prompt + mean output) when it is routed and takes them back
  when it completes, and the candidate with the smallest ``(in flight + weight) / flow`` is
  taken. So each path holds requests in proportion to its flow, and a path whose requests take
  longer gets fewer new ones (Little's law), where a count of all past requests does not see
  how long they stay;
- ``helix-iwrr``: the same scheduler as Helix's code runs it — the virtual finish time
  ``load + weight / flow`` of all requests so far, the weight the prompt's tokens and each
  decode iteration adding ``1 / flow`` on every hop, the weights the edge flows of the max flow
  networkx's preflow-push returns;
- ``swarm``: the next node with the smallest recent time per token (exponential moving average
  of its batches), as Swarm's scheduler;
- ``random``: uniformly among the valid next nodes;
- ``shortest-queue``: the valid next node with the fewest queued items.

Both IWRR routers leave out edges with less than 5% of a vertex's outgoing flow (Helix's code).

Admission (KV cache, §5.2): each node on a chain reserves, for the request, the KV it expects to
hold: ``(prompt + mean output x ratio) x its layers`` token-layers; a node whose free KV would fall
below ``(1 - high_water) x`` its total is masked out. Helix uses high water 0.9 and ratio 0.6
online, 0.85 and 1.0 offline.
"""

from __future__ import annotations

import numpy as np

from shoal.serving.cluster import Cluster
from shoal.serving.flow import SINK, SOURCE, Flow, balanced, valid
from shoal.serving.placement import Placement

IWRR = ("iwrr", "helix-iwrr")
MIN_SHARE = 0.05  # iwrr: edges under this share of a vertex's outgoing flow are not used


def candidates(cluster: Cluster, pl: Placement) -> dict[int, list[int]]:
    """Valid next vertices per vertex (nodes 0..n-1, source n, sink n+1) under the placement,
    over links that exist."""
    n, L = cluster.n, cluster.layers
    held = [i for i, r in enumerate(pl.ranges) if r is not None]
    out: dict[int, list[int]] = {n: [i for i in held if pl.ranges[i][0] == 0 and cluster.src[i] > 0]}
    for i in held:
        nxt = [j for j in held if j != i and cluster.S[i, j] > 0
               and valid(cluster.partial, pl.ranges[i], pl.ranges[j])]
        if pl.ranges[i][1] == L and cluster.snk[i] > 0:
            nxt.append(n + 1)
        out[i] = nxt
    return out


class Router:
    """``mean_output``: the requests' mean output tokens (``iwrr`` counts a request's expected
    tokens in flight)."""

    def __init__(self, kind: str, cluster: Cluster, pl: Placement, flow: Flow | None,
                 seed: int = 0, mean_output: float = 0.0):
        self.kind = kind
        self.n = cluster.n
        self.rng = np.random.default_rng(seed)
        self.mean_output = float(mean_output)
        cand = candidates(cluster, pl)
        self.cap: dict[tuple[int, int], float] = {}
        if kind in IWRR:
            if flow is None:
                raise ValueError("iwrr routes by the max flow's edge flows")
            if kind == "iwrr":
                flow = balanced(cluster, pl, flow.value)

            def vid(x) -> int:
                return self.n if x == SOURCE else self.n + 1 if x == SINK else int(x)

            per: dict[int, dict[int, float]] = {}
            for (u, v), f in flow.edges.items():
                per.setdefault(vid(u), {})[vid(v)] = f
            for u, outs in per.items():
                tot = sum(outs.values())
                for v, f in outs.items():
                    if f >= MIN_SHARE * tot and v in cand.get(u, ()):
                        self.cap[(u, v)] = f
            cand = {u: [v for v in vs if (u, v) in self.cap] for u, vs in cand.items()}
        self.cand = cand
        self.eid = {e: k for k, e in enumerate(self.cap)}  # iwrr: edge -> index
        self.cap_arr = np.array([self.cap[e] for e in self.eid], dtype=float)
        self.load = np.zeros(len(self.eid))  # helix-iwrr: virtual time; iwrr: tokens in flight
        self.ema = np.zeros(self.n)  # swarm: seconds per token, recent
        self.queued = np.zeros(self.n)  # shortest-queue: items waiting or running

    def choose(self, u: int, allowed, weight: float) -> int | None:
        """The next vertex after ``u`` among its candidates that ``allowed(v)`` accepts."""
        opts = [v for v in self.cand.get(u, ()) if allowed(v)]
        if not opts:
            return None
        if len(opts) == 1:
            v = opts[0]
        elif self.kind == "iwrr":
            w = weight + self.mean_output
            v = min(opts, key=lambda v: ((self.load[self.eid[(u, v)]] + w) / self.cap[(u, v)], v))
        elif self.kind == "helix-iwrr":
            v = min(opts, key=lambda v: (self.load[self.eid[(u, v)]] + weight / self.cap[(u, v)],
                                         v))
        elif self.kind == "random":
            v = opts[int(self.rng.integers(len(opts)))]
        elif self.kind == "swarm":
            v = min(opts, key=lambda v: (self.ema[v] if v < self.n else 0.0, self.rng.random()))
        else:
            v = min(opts, key=lambda v: (self.queued[v] if v < self.n else 0.0, v))
        if self.kind in IWRR:
            self.load[self.eid[(u, v)]] += self._share(u, v, weight)
        return v

    def _share(self, u: int, v: int, weight: float) -> float:
        """What routing a request of ``weight`` prompt tokens over (u, v) adds to its load."""
        if self.kind == "iwrr":
            return weight + self.mean_output
        return weight / self.cap[(u, v)]

    def undo(self, u: int, v: int, weight: float) -> None:
        """Take back a choice whose chain could not be completed."""
        if self.kind in IWRR:
            self.load[self.eid[(u, v)]] -= self._share(u, v, weight)

    def finish(self, chain: list[int], weight: float) -> None:
        """iwrr: a request of ``weight`` prompt tokens on ``chain`` (its nodes, the coordinator
        last) is no longer in flight."""
        if self.kind == "iwrr":
            for e in self.edges_of(chain):
                self.load[e] -= weight + self.mean_output

    def edges_of(self, chain: list[int]) -> list[int]:
        """IWRR: the edge indices of a chain (coordinator -> ... -> coordinator)."""
        if self.kind not in IWRR:
            return []
        hops = [self.n, *chain]
        return [self.eid[(a, b)] for a, b in zip(hops[:-1], hops[1:], strict=True)]

    def decode_step(self, edges: np.ndarray) -> None:
        """helix-iwrr: one decode iteration over each of ``edges`` (indices, repeated) adds
        1 / flow."""
        if self.kind == "helix-iwrr" and len(edges):
            np.add.at(self.load, edges, 1.0 / self.cap_arr[edges])

    def observe(self, node: int, seconds: float, tokens: float) -> None:
        """swarm: a batch of ``tokens`` took ``seconds`` on ``node``."""
        if tokens > 0:
            x = seconds / tokens
            self.ema[node] = x if self.ema[node] == 0 else 0.8 * self.ema[node] + 0.2 * x


def route_chain(R: Router, kv: KVCache, n: int, prompt: int,
                exclude: set[int] | frozenset = frozenset()) -> list[int] | None:
    """One request's chain of nodes from the coordinator (vertex ``n``) back to it (``n + 1``),
    chosen hop by hop by ``R`` among nodes whose KV cache admits the prompt, the KV reserved on
    every node of it; None (nothing reserved, choices taken back) when no chain exists. Shared by
    the simulator and the live coordinator; ``exclude``: nodes not to use (workers that died)."""
    snk = n + 1
    u, chain, taken = n, [], []
    while u != snk:
        v = R.choose(u, lambda v: v == snk or (v not in chain and v not in exclude
                                                and kv.fits(v, prompt)), prompt)
        if v is None:
            for a, b in reversed(taken):
                R.undo(a, b, prompt)
            return None
        taken.append((u, v))
        chain.append(v)
        u = v
    kv.reserve(chain[:-1], prompt)
    return chain


class KVCache:
    """Expected KV use per node in token-layers, reserved at admission, freed at completion."""

    def __init__(self, total: np.ndarray, layers: np.ndarray, high_water: float, ratio: float,
                 mean_output: float):
        self.total = total
        self.used = np.zeros_like(total)
        self.layers = layers
        self.hw, self.ratio, self.mean_out = high_water, ratio, mean_output
        self.peak = np.zeros_like(total)

    def need(self, node: int, prompt: int) -> float:
        return (prompt + self.mean_out * self.ratio) * self.layers[node]

    def fits(self, node: int, prompt: int) -> bool:
        return self.total[node] - self.used[node] - self.need(node, prompt) \
            >= (1.0 - self.hw) * self.total[node]

    def reserve(self, chain: list[int], prompt: int) -> None:
        for v in chain:
            self.used[v] += self.need(v, prompt)
            self.peak[v] = max(self.peak[v], self.used[v])

    def release(self, chain: list[int], prompt: int) -> None:
        for v in chain:
            self.used[v] -= self.need(v, prompt)


def reachable(R: Router, n: int, exclude: set[int] | frozenset = frozenset()) -> bool:
    """Whether some chain from the coordinator (vertex ``n``) back to it (``n + 1``) avoids the
    nodes ``exclude`` (workers that died): whether a request can be served at all, KV room
    aside."""
    seen, todo = set(), [n]
    while todo:
        for v in R.cand.get(todo.pop(), ()):
            if v == n + 1:
                return True
            if v not in exclude and v not in seen:
                seen.add(v)
                todo.append(v)
    return False
