"""Helix's placement MILP (§4.4, Tables 5 and 6) solved by HiGHS.

Per node: its first layer ``s_i`` (integer) and a one-hot layer count ``b_i^k``, so its end is
``e_i = s_i + sum_k k b_i^k`` and its capacity ``sum_k T_i(k) b_i^k`` stays linear. Per directed
link kept: a flow ``f_ij`` and a switch ``d_ij`` that may be 1 only when the link is valid:
without partial inference ``|s_j - e_i| <= L (1 - d_ij)`` (the paper's second inequality has
its sign flipped; this is the form its code uses); with it, two auxiliary binaries encode
``s_j <= e_i < e_j``. Flow is conserved at every node and bounded by the node's capacity; the
objective is the flow out of the coordinator.

Speed-ups as in §4.5: links are pruned to each node's fastest ``prune`` (Helix: 12), the solver
starts from the best heuristic placement, and stops once the best solution reaches 99.5% of
the upper bound sum_i max_k k T_i(k) / L, after ``stall_s`` without improvement, or at the
time limit.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shoal.mip import Model, Solution
from shoal.serving.cluster import Cluster
from shoal.serving.flow import SINK, SOURCE, max_flow
from shoal.serving.placement import Placement


def pruned(cluster: Cluster, keep: int, also: Placement | None = None) -> Cluster:
    """The cluster with only the links among each node's ``keep`` fastest (ties: lower index),
    and those the max flow of ``also`` uses (so a warm start keeps its value); ``keep <= 0``
    keeps all."""
    if keep <= 0 or keep >= cluster.n - 1:
        return cluster
    S = cluster.S
    mask = np.zeros_like(S, dtype=bool)
    if also is not None:
        for (u, w), f in max_flow(cluster, also).edges.items():
            if isinstance(u, int) and isinstance(w, int) and f > 0:
                mask[u, w] = True
    for i in range(cluster.n):
        order = sorted((j for j in range(cluster.n) if j != i and max(S[i, j], S[j, i]) > 0),
                       key=lambda j: (-max(S[i, j], S[j, i]), j))[:keep]
        mask[i, order] = True
    mask |= mask.T
    return dataclasses.replace(cluster, S=np.where(mask, S, 0.0))


@dataclasses.dataclass
class _Vars:
    s: list[int]
    b: list[dict[int, int]]
    edges: dict[tuple[object, object], int]  # (from, to) -> flow column
    switch: dict[tuple[object, object], int]  # (from, to) -> d column
    cond: dict[tuple[int, int], tuple[int, int]]


def build(cluster: Cluster) -> tuple[Model, _Vars]:
    L = cluster.layers
    n = cluster.n
    m = Model(maximize=True)
    s = [m.var(0, L - 1, integer=True) for _ in range(n)]
    b = [{k: m.var(0, 1, integer=True) for k in range(1, int(cluster.kmax[i]) + 1)}
         for i in range(n)]
    edges: dict[tuple[object, object], int] = {}
    switch: dict[tuple[object, object], int] = {}
    cond: dict[tuple[int, int], tuple[int, int]] = {}

    def end(i: int) -> tuple[list[int], list[float]]:  # e_i as (columns, coefficients)
        return [s[i], *b[i].values()], [1.0, *map(float, b[i].keys())]

    for i in range(n):
        m.row(list(b[i].values()), [1.0] * len(b[i]), 1.0, 1.0)
        ci, vi = end(i)
        m.row(ci, vi, hi=float(L))
    for i in range(n):
        if cluster.src[i] > 0:
            f, d = m.var(cost=1.0), m.var(0, 1, integer=True)
            edges[(SOURCE, i)], switch[(SOURCE, i)] = f, d
            m.row([f, d], [1.0, -float(cluster.src[i])], hi=0.0)
            m.row([s[i], d], [1.0, float(L)], hi=float(L))  # d = 1 -> s_i = 0
        if cluster.snk[i] > 0:
            f, d = m.var(), m.var(0, 1, integer=True)
            edges[(i, SINK)], switch[(i, SINK)] = f, d
            m.row([f, d], [1.0, -float(cluster.snk[i])], hi=0.0)
            ci, vi = end(i)  # d = 1 -> e_i = L
            m.row([d, *ci], [float(L), *(-v for v in vi)], hi=0.0)
        for j in range(n):
            if i == j or cluster.S[i, j] <= 0:
                continue
            f, d = m.var(), m.var(0, 1, integer=True)
            edges[(i, j)], switch[(i, j)] = f, d
            m.row([f, d], [1.0, -float(cluster.S[i, j])], hi=0.0)
            ei, vi = end(i)
            if not cluster.partial:
                # L d <= L + s_j - e_i  and  L d <= L - s_j + e_i
                m.row([d, s[j], *ei], [float(L), -1.0, *vi], hi=float(L))
                m.row([d, s[j], *ei], [float(L), 1.0, *(-v for v in vi)], hi=float(L))
            else:
                c1, c2 = m.var(0, 1, integer=True), m.var(0, 1, integer=True)
                cond[(i, j)] = (c1, c2)
                # c1 = 1 -> s_j <= e_i :  s_j - e_i + (L+1) c1 <= L+1
                m.row([s[j], c1, *ei], [1.0, float(L + 1), *(-v for v in vi)], hi=float(L + 1))
                # c2 = 1 -> e_j >= e_i + 1 :  e_i - e_j + (L+1) c2 <= L
                ej, vj = end(j)
                m.row([*ei, *ej, c2], [*vi, *(-v for v in vj), float(L + 1)], hi=float(L))
                m.row([d, c1, c2], [1.0, -0.5, -0.5], hi=0.0)
    cap_T = cluster.T
    for i in range(n):
        ins = [c for (u, v), c in edges.items() if v == i]
        outs = [c for (u, v), c in edges.items() if u == i]
        m.row(ins + outs, [1.0] * len(ins) + [-1.0] * len(outs), 0.0, 0.0)
        m.row(ins + list(b[i].values()), [1.0] * len(ins)
              + [-float(cap_T[i, k]) for k in b[i]], hi=0.0)
    if np.isfinite(cluster.src_total):
        src = [c for (u, _), c in edges.items() if u == SOURCE]
        m.row(src, [1.0] * len(src), hi=float(cluster.src_total))
    if np.isfinite(cluster.snk_total):
        snk = [c for (_, v), c in edges.items() if v == SINK]
        m.row(snk, [1.0] * len(snk), hi=float(cluster.snk_total))
    return m, _Vars(s, b, edges, switch, cond)


def start_vector(cluster: Cluster, m: Model, v: _Vars, pl: Placement) -> np.ndarray:
    """A feasible point of the program for ``pl`` (idle nodes get the last layer, no flow)."""
    L = cluster.layers
    x = np.zeros(m.n_vars)
    ranges = [r if r is not None else (L - 1, L) for r in pl.ranges]
    for i, (a, e) in enumerate(ranges):
        x[v.s[i]] = a
        x[v.b[i][e - a]] = 1.0
    fl = max_flow(cluster, Placement(tuple(r if pl.ranges[i] is not None else None
                                          for i, r in enumerate(ranges))))
    for key, col in v.edges.items():
        x[col] = fl.edges.get(key, 0.0)
    for (u, w), col in v.switch.items():
        if u == SOURCE:
            x[col] = float(ranges[w][0] == 0)
        elif w == SINK:
            x[col] = float(ranges[u][1] == L)
        else:
            a, bb = ranges[u], ranges[w]
            if cluster.partial:
                c1, c2 = v.cond[(u, w)]
                x[c1] = float(bb[0] <= a[1])
                x[c2] = float(bb[1] > a[1])
                x[col] = float(x[c1] and x[c2])
            else:
                x[col] = float(bb[0] == a[1])
        if x[col] == 0.0 and (u, w) in v.edges:
            x[v.edges[(u, w)]] = 0.0
    return x


def decode(cluster: Cluster, v: _Vars, x: np.ndarray) -> Placement:
    ranges = []
    for i in range(cluster.n):
        a = int(round(x[v.s[i]]))
        k = max(v.b[i], key=lambda kk: x[v.b[i][kk]])
        ranges.append((a, a + k))
    # nodes that carry no flow hold nothing
    used = set()
    for (u, w), col in v.edges.items():
        if x[col] > 1e-6:
            used |= {u, w}
    return Placement(tuple(r if i in used else None for i, r in enumerate(ranges)))


def solve(cluster: Cluster, *, time_limit_s: float, start: Placement | None = None,
          prune: int = 12, stall_s: float | None = None) -> tuple[Placement | None, Solution]:
    """Helix's MILP on the pruned cluster: (placement or None, the solver's result)."""
    work = pruned(cluster, prune, start)
    m, v = build(work)
    x0 = start_vector(work, m, v, start) if start is not None else None
    sol = m.solve(time_limit_s=time_limit_s, start=x0, target=0.995 * cluster.upper_bound(),
                  stall_s=stall_s)
    if sol.x is None:
        return None, sol
    return decode(work, v, sol.x), sol
