"""The baseline placements Helix compares against (§6.2, and its artifact's layouts): Swarm,
Petals and separate pipelines per GPU type. They are also warm starts for the MILP."""

from __future__ import annotations

import math

import numpy as np

from shoal.serving.cluster import Cluster
from shoal.serving.placement import Placement


def swarm(cluster: Cluster) -> Placement | None:
    """Even stages, as many as the weakest node needs to hold one (its layer limit); nodes,
    fastest at that stage size first, each join the stage with the least capacity so far."""
    L = cluster.layers
    size = int(cluster.kmax.min())
    P = math.ceil(L / size)
    if cluster.n < P:
        return None
    edges = np.linspace(0, L, P + 1).round().astype(int)
    stage = [(int(edges[p]), int(edges[p + 1])) for p in range(P)]
    load = np.zeros(P)
    ranges: list[tuple[int, int] | None] = [None] * cluster.n
    for i in sorted(range(cluster.n), key=lambda i: (-cluster.T[i, size], i)):
        p = int(np.argmin(load))
        ranges[i] = stage[p]
        load[p] += cluster.T[i, stage[p][1] - stage[p][0]]
    return Placement(tuple(ranges))


def petals(cluster: Cluster, seed: int = 0) -> Placement:
    """Nodes in a seeded random order each take as many layers as they may, at the window whose
    per-layer capacity (sorted) is smallest: they cover the weakest layers. Needs partial
    inference (windows overlap)."""
    L = cluster.layers
    cover = np.zeros(L)
    ranges: list[tuple[int, int] | None] = [None] * cluster.n
    for i in np.random.default_rng(seed).permutation(cluster.n):
        k = int(min(cluster.kmax[i], L))
        best = min(range(L - k + 1), key=lambda s: (tuple(sorted(cover[s:s + k])), s))
        ranges[i] = (best, best + k)
        cover[best:best + k] += cluster.T[i, k]
    return Placement(tuple(ranges))


def separate(cluster: Cluster) -> Placement | None:
    """One set of pipelines per node type, all its nodes used: for a type whose n nodes of limit
    k can hold the model, r = n // ceil(L / k) pipelines, each of its share of the nodes with the
    layers split evenly. Types that cannot hold the model alone are left out (Helix's SP)."""
    L = cluster.layers
    ranges: list[tuple[int, int] | None] = [None] * cluster.n
    any_used = False
    for m in sorted(set(cluster.machines)):
        nodes = [i for i in range(cluster.n) if cluster.machines[i] == m]
        k = int(cluster.kmax[nodes[0]])
        depth = math.ceil(L / k)
        r = len(nodes) // depth
        if r == 0:
            continue
        any_used = True
        for p in range(r):
            mine = nodes[p::r]
            edges = np.linspace(0, L, len(mine) + 1).round().astype(int)
            if np.diff(edges).max() > k:
                mine = mine[:depth]
                edges = np.linspace(0, L, depth + 1).round().astype(int)
            for j, i in enumerate(mine):
                ranges[i] = (int(edges[j]), int(edges[j + 1]))
    return Placement(tuple(ranges)) if any_used else None
