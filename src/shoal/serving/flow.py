"""The flow network of a placement and its max flow (Helix §4.3): the coordinator is the source
and the sink, each node an in -> out edge of its capacity T(k), each valid link an edge of the
tokens/s it carries. The max flow is the placement's serving throughput in tokens/s, and the
per-edge flows are the routing weights."""

from __future__ import annotations

import math
from dataclasses import dataclass

import networkx as nx

from shoal.mip import Model
from shoal.serving.cluster import Cluster
from shoal.serving.placement import Placement

SOURCE, SINK = "source", "sink"


def valid(partial: bool, a: tuple[int, int], b: tuple[int, int]) -> bool:
    """Can a request leave a node holding ``a`` for one holding ``b``? Without partial
    inference b must start where a ends; with it, b may start inside a (and computes only
    the layers after a's end)."""
    if partial:
        return b[0] <= a[1] < b[1]
    return b[0] == a[1]


def graph(cluster: Cluster, pl: Placement, node_cap=None) -> nx.DiGraph:
    """Vertices ``source``, ``sink`` and ``(i, "in")`` / ``(i, "out")`` per node holding layers;
    each node passes its T(k), or ``node_cap[i]`` when given."""
    G = nx.DiGraph()
    L = cluster.layers
    src = SOURCE
    if cluster.src_total != float("inf") or cluster.snk_total != float("inf"):
        src = "coordinator"  # the coordinator's NIC caps all it sends and receives
        G.add_edge(SOURCE, src, capacity=cluster.src_total)
    held = [(i, r) for i, r in enumerate(pl.ranges) if r is not None]
    for i, (s, e) in held:
        G.add_edge((i, "in"), (i, "out"), capacity=float(
            cluster.T[i, e - s] if node_cap is None else node_cap[i]))
        if s == 0 and cluster.src[i] > 0:
            G.add_edge(src, (i, "in"), capacity=float(cluster.src[i]))
        if e == L and cluster.snk[i] > 0:
            G.add_edge((i, "out"), "sink-in" if src != SOURCE else SINK,
                       capacity=float(cluster.snk[i]))
    if src != SOURCE:
        G.add_edge("sink-in", SINK, capacity=cluster.snk_total)
    for i, a in held:
        for j, b in held:
            if i != j and cluster.S[i, j] > 0 and valid(cluster.partial, a, b):
                G.add_edge((i, "out"), (j, "in"), capacity=float(cluster.S[i, j]))
    G.add_node(SOURCE)
    G.add_node(SINK)
    return G


@dataclass(frozen=True)
class Flow:
    value: float  # tokens/s
    # (from, to) -> tokens/s on each used link; ends are node indices or "source" / "sink"
    edges: dict[tuple[object, object], float]
    through: tuple[float, ...]  # tokens/s through each node


SCALE = 1e6  # capacities in micro-tokens/s, as integers


def max_flow(cluster: Cluster, pl: Placement, node_cap=None) -> Flow:
    """The placement's max flow with networkx (preflow-push), on capacities rounded to whole
    micro-tokens/s: preflow-push's relabelling can overrun its height bound on floating-point
    capacities (an IndexError inside networkx on clusters of ~100 nodes). ``node_cap``: each
    node's capacity instead of its T(k)."""
    G = graph(cluster, pl, node_cap)
    for _, _, d in G.edges(data=True):
        if math.isinf(d["capacity"]):
            del d["capacity"]  # networkx: no capacity, no limit
        else:
            d["capacity"] = round(d["capacity"] * SCALE)
    value, fd = nx.maximum_flow(G, SOURCE, SINK)
    value /= SCALE
    fd = {u: {v: f / SCALE for v, f in outs.items()} for u, outs in fd.items()}
    return _flow(cluster, float(value), fd)


def balanced(cluster: Cluster, pl: Placement, value: float | None = None) -> Flow:
    """Of the flows of ``value`` tokens/s (default: the max flow), the one with the least sum
    over nodes and links of flow² / capacity: parallel nodes and links carry shares in
    proportion to their capacity, and of two paths the one through fewer nodes carries more.
    A max flow is rarely unique (every node off the bottleneck can carry any share of it);
    Helix routes by whichever one its solver returns (§5.1). This one is unique (the cost is
    strictly convex in every capacity-limited edge) and follows only the placement. Solved
    as a quadratic program by HiGHS; the max flow itself when that fails."""

    best = max_flow(cluster, pl)
    target = best.value if value is None else min(float(value), best.value)
    if target <= 0:
        return best
    G = graph(cluster, pl)
    m = Model(maximize=False)
    col = {}
    for u, v, d in G.edges(data=True):
        c = d["capacity"]  # infinite: the coordinator's NIC when unlimited, no cost
        col[(u, v)] = m.var(0.0, c, quad=1.0 / c) if math.isfinite(c) else m.var(0.0)
    for x in G.nodes:
        if x in (SOURCE, SINK):
            continue
        ins = [col[(u, x)] for u in G.predecessors(x)]
        outs = [col[(x, v)] for v in G.successors(x)]
        m.row(ins + outs, [1.0] * len(ins) + [-1.0] * len(outs), 0.0, 0.0)
    out = [col[(SOURCE, v)] for v in G.successors(SOURCE)]
    # a hair under the max flow: the program stays feasible after HiGHS's own rounding
    m.row(out, [1.0] * len(out), target * (1.0 - 1e-7), target)
    sol = m.solve(time_limit_s=10.0)
    if sol.x is None:
        return best
    fd: dict = {}
    for (u, v), c in col.items():
        fd.setdefault(u, {})[v] = float(sol.x[c])
    return _flow(cluster, target, fd)


def _flow(cluster: Cluster, value: float, fd: dict) -> Flow:
    """A ``Flow`` from per-edge flows of ``graph``'s vertices."""
    edges: dict[tuple[object, object], float] = {}
    through = [0.0] * cluster.n

    def end(v) -> object:
        if isinstance(v, tuple):
            return v[0]
        return SOURCE if v in (SOURCE, "coordinator") else SINK

    for u, outs in fd.items():
        for v, f in outs.items():
            if f <= 1e-9:
                continue
            if isinstance(u, tuple) and isinstance(v, tuple) and u[0] == v[0]:
                through[u[0]] = f
            elif (u, v) not in ((SOURCE, "coordinator"), ("sink-in", SINK)):
                edges[(end(u), end(v))] = f
    return Flow(value, edges, tuple(through))
