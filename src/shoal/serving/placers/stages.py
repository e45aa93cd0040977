"""shoal's placer: stage templates chosen by an integer program, then a local search on the exact
max flow.

A *stage* is a run of layers held by a group of nodes that each hold exactly that run; a
placement made of stages carries, when links inside a region are fast, the smallest stage
capacity (sum of its nodes' T(l)). For a target flow F the stages worth using are the *minimal*
node multisets whose capacity reaches F, per length l and region; an integer program picks how
many of each so the lengths add up to the model's layers and no more nodes are used than exist.
Identical nodes are counted, not named, so the program has no symmetry between them: tens of
integer variables where Helix's MILP has thousands of binaries. The largest F that is feasible
is found by bisection.

Regions joined by slow links are visited in blocks (each region at most once, every order of
every subset tried): the last stage of a block and the first of the next must carry F across
the links between them (with ``a`` and ``b`` nodes on the two sides, each node passes at most
``b`` (resp. ``a``) links' worth), which the program enforces through a choice of the pair
(a, b). The result is then improved by moving single range ends while the exact max flow (with
every link's real capacity) rises; partial inference, when allowed, is used by that search.

What a placement *serves* also depends on its KV cache (how many requests can be in flight:
every request holds KV in every layer, so the layer whose nodes hold the least KV caps them) and
on its depth (each hop adds to every token's time). ``shallowest`` therefore also takes a KV
floor K: every stage's nodes must together hold the KV of K tokens in each of its layers
(``perf.kv_tokens_per_layer``, the simulator's KV cache), and it minimises the number of stages.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import numpy as np

from shoal.mip import Model
from shoal.serving import perf
from shoal.serving.cluster import Cluster
from shoal.serving.flow import max_flow
from shoal.serving.placement import Placement

MAX_FAN = 8  # the most nodes on one side of a boundary between regions
FAST = 0.1  # links at least this fraction of a region's fastest are "inside" it


@dataclass(frozen=True)
class Group:
    """Identical nodes: one region, one capacity table, one KV cache table."""

    region: int
    T: tuple[float, ...]  # T[k], k = 0 .. kmax
    nodes: tuple[int, ...]
    kv: tuple[float, ...] = ()  # kv[k]: tokens of KV per layer holding k layers (0: unknown)

    @property
    def kmax(self) -> int:
        return len(self.T) - 1


def groups(cluster: Cluster) -> tuple[list[Group], list[str]]:
    regions = sorted(set(cluster.regions))
    by: dict[tuple, list[int]] = {}
    for i in range(cluster.n):
        k = int(cluster.kmax[i])
        row = tuple(float(x) for x in cluster.T[i, :k + 1])
        kv = tuple(perf.kv_tokens_per_layer(cluster, i, j) for j in range(k + 1))
        by.setdefault((regions.index(cluster.regions[i]), row, kv), []).append(i)
    return [Group(r, row, tuple(ix), kv) for (r, row, kv), ix in sorted(by.items())], regions


@dataclass(frozen=True)
class Template:
    length: int
    region: int
    counts: tuple[tuple[int, int], ...]  # (group index, nodes)

    @property
    def size(self) -> int:
        return sum(c for _, c in self.counts)


def templates(gs: list[Group], region: int, F: float, per_node=None,
              K: float = 0.0) -> list[Template]:
    """Minimal node multisets of ``region`` whose stage capacity reaches F and whose KV cache
    holds K tokens in each layer, for every length. ``per_node(g, l)``: a node's contribution
    to the capacity (default its T(l))."""
    out: list[Template] = []
    cand = [gi for gi, g in enumerate(gs) if g.region == region]
    for ln in range(1, max((gs[g].kmax for g in cand), default=0) + 1):
        val = {gi: (per_node(gi, ln) if per_node else gs[gi].T[ln]) for gi in cand
               if gs[gi].kmax >= ln and gs[gi].T[ln] > 0}
        kv = {gi: (gs[gi].kv[ln] if gs[gi].kv else 0.0) for gi in val}
        use = [g for g in val if val[g] > 0 and (K <= 0 or kv[g] > 0)]
        out += [Template(ln, region, c) for c in _minimal(gs, use, val, F, kv, K)]
    return out


def _minimal(gs: list[Group], use: list[int], val: dict[int, float], F: float,
             kv: dict[int, float], K: float):
    """Multisets (group, count) of ``use`` with total ``val`` >= F and total ``kv`` >= K from
    which no node can go."""
    def enough(tot: float, kt: float) -> bool:
        return tot >= F and kt >= K

    stack: list[tuple[int, tuple[tuple[int, int], ...], float, float]] = [(0, (), 0.0, 0.0)]
    while stack:
        k, chosen, tot, kt = stack.pop()
        if enough(tot, kt):
            if all(not enough(tot - val[g], kt - kv[g]) for g, _ in chosen):
                yield chosen
            continue
        if k == len(use):
            continue
        g = use[k]
        for c in range(len(gs[g].nodes) + 1):
            stack.append((k + 1, (*chosen, (g, c)) if c else chosen, tot + c * val[g],
                          kt + c * kv[g]))
            if enough(tot + c * val[g], kt + c * kv[g]):
                break


def _region_links(cluster: Cluster, regions: list[str]) -> np.ndarray:
    """Per pair of regions, the slowest link between them in tokens/s (0 if some pair of their
    nodes is not linked)."""
    R = len(regions)
    ri = np.array([regions.index(r) for r in cluster.regions])
    out = np.zeros((R, R))
    for a in range(R):
        for b in range(R):
            if a != b:
                sub = cluster.S[np.ix_(ri == a, ri == b)]
                out[a, b] = sub.min() if sub.size else 0.0
    return out


@dataclass(frozen=True)
class _FanCap:
    """A node's contribution next to a boundary: its capacity, at most its links' worth."""

    gs: list[Group]
    links: float

    def __call__(self, g: int, ln: int) -> float:
        return min(self.gs[g].T[ln], self.links)


def _program(gs: list[Group], seq: tuple[int, ...], F: float, links: np.ndarray, L: int,
             fewest: bool = False, K: float = 0.0):
    """The integer program for visiting the regions in ``seq`` with flow F (and every stage's
    KV cache holding K tokens per layer): (model, decode) or None when some stage has no
    template. ``fewest``: minimise the number of stages (the hops of every request), else any
    feasible point."""
    m = Model(maximize=False)
    segs: list[tuple[int, int, Template, str]] = []  # (column, block, template, role)
    use: dict[int, tuple[list[int], list[float]]] = {}
    length: tuple[list[int], list[float]] = ([], [])

    def add(block: int, t: Template, role: str, binary: bool) -> int:
        col = m.var(0.0, 1.0 if binary else float(L), cost=1.0 if fewest else 0.0,
                    integer=True)
        segs.append((col, block, t, role))
        length[0].append(col)
        length[1].append(t.length)
        for g, c in t.counts:
            use.setdefault(g, ([], []))
            use[g][0].append(col)
            use[g][1].append(c)
        return col

    for b, r in enumerate(seq):
        inner = templates(gs, r, F, K=K)
        for t in inner:
            add(b, t, "inner", False)
    for b in range(len(seq) - 1):
        r, r2 = seq[b], seq[b + 1]
        S = links[r, r2]
        if S <= 0:
            return None
        pairs = {}
        for a in range(1, MAX_FAN + 1):
            for c in range(1, MAX_FAN + 1):
                if a * c * S >= F:
                    pairs[(a, c)] = m.var(0.0, 1.0, integer=True)
        if not pairs:
            return None
        m.row(list(pairs.values()), [1.0] * len(pairs), 1.0, 1.0)
        for role, reg, fan_side in (("exit", r, 1), ("entry", r2, 0)):
            cols: list[int] = []
            found: dict[Template, list[int]] = {}
            for fan in range(1, MAX_FAN + 1):
                for t in templates(gs, reg, F, _FanCap(gs, fan * S), K=K):
                    if t.size <= MAX_FAN:
                        found.setdefault(t, []).append(fan)
            if not found:
                return None
            for t, fans in found.items():
                col = add(b if role == "exit" else b + 1, t, role, True)
                cols.append(col)
                # the pair (nodes on this side, on the other) must be one this template serves
                ok = [pairs[(t.size, f) if fan_side else (f, t.size)] for f in fans
                      if ((t.size, f) if fan_side else (f, t.size)) in pairs]
                m.row([col, *ok], [1.0] + [-1.0] * len(ok), hi=0.0)
            m.row(cols, [1.0] * len(cols), 1.0, 1.0)
    m.row(length[0], [float(x) for x in length[1]], float(L), float(L))
    for g, (cols, vals) in use.items():
        m.row(cols, vals, hi=float(len(gs[g].nodes)))
    return m, segs


def _decode(gs: list[Group], seq, segs, x: np.ndarray, n: int, L: int) -> Placement:
    order = []
    for b in range(len(seq)):
        mine = [(col, t, role) for col, blk, t, role in segs if blk == b and x[col] > 0.5]
        first = [s for s in mine if s[2] == "entry"]
        last = [s for s in mine if s[2] == "exit"]
        inner = sorted((s for s in mine if s[2] == "inner"), key=lambda s: -s[1].length)
        for col, t, _ in first + inner + last:
            order += [t] * int(round(x[col]))
    free = {g: list(gs[g].nodes) for g in range(len(gs))}
    ranges: list[tuple[int, int] | None] = [None] * n
    at = 0
    for t in order:
        for g, c in t.counts:
            for _ in range(c):
                ranges[free[g].pop(0)] = (at, at + t.length)
        at += t.length
    assert at == L
    return Placement(tuple(ranges))


def _sequences(gs: list[Group], regions: list[str], links: np.ndarray, L: int):
    """Orders of distinct regions, fewest first, whose nodes may hold the model and whose
    consecutive regions are linked."""
    R = len(regions)
    cap = [sum(len(g.nodes) * g.kmax for g in gs if g.region == r) for r in range(R)]
    seqs = [p for k in range(1, R + 1) for p in itertools.permutations(range(R), k)
            if sum(cap[r] for r in p) >= L
            and all(links[p[i], p[i + 1]] > 0 for i in range(len(p) - 1))]
    return sorted(seqs, key=len)


def staged(cluster: Cluster, deadline: float) -> Placement | None:
    """The best stage-structured placement the bisection finds before ``deadline``."""
    gs, regions = groups(cluster)
    L = cluster.layers
    links = _region_links(cluster, regions)
    seqs = _sequences(gs, regions, links, L)
    best: tuple[float, Placement] | None = None
    ub = cluster.upper_bound()
    for seq in seqs:
        lo, hi = (best[0] if best else 0.0), ub
        found = None
        # a quick test just above the best so far skips orders that cannot beat it
        probe = [lo * 1.0001] if best else []
        while hi - lo > 1e-4 * ub and time.perf_counter() < deadline:
            F = probe.pop() if probe else (lo + hi) / 2
            built = _program(gs, seq, F, links, L)
            sol = None if built is None else built[0].solve(
                time_limit_s=max(0.05, min(5.0, deadline - time.perf_counter())))
            if sol is not None and sol.x is not None:
                lo, found = F, (F, _decode(gs, seq, built[1], sol.x, cluster.n, L))
            else:
                hi = F
                if best and best[0] * 1.0001 >= F:
                    break
        if found and (best is None or found[0] > best[0]):
            best = found
    return best[1] if best else None


def shallowest(cluster: Cluster, F: float, deadline: float, K: float = 0.0) -> Placement | None:
    """The stage placement with the fewest stages whose every stage carries F and holds the KV
    of K tokens in each of its layers (over every order of regions), or None."""
    gs, regions = groups(cluster)
    L = cluster.layers
    links = _region_links(cluster, regions)
    best: tuple[float, Placement] | None = None
    for seq in _sequences(gs, regions, links, L):
        built = _program(gs, seq, F, links, L, fewest=True, K=K)
        if built is None or time.perf_counter() > deadline:
            continue
        sol = built[0].solve(time_limit_s=max(0.05, min(10.0, deadline - time.perf_counter())))
        if sol.x is not None and (best is None or sol.objective < best[0]):
            best = (sol.objective, _decode(gs, seq, built[1], sol.x, cluster.n, L))
    return best[1] if best else None


def improve(cluster: Cluster, pl: Placement, deadline: float) -> tuple[Placement, float]:
    """First-improvement local search over single range-end moves (and giving an idle node a
    range next to a busy one), on the exact max flow, until no move helps or time is up."""
    cur = max_flow(cluster, pl).value
    ranges = list(pl.ranges)
    L = cluster.layers
    improved = True
    while improved and time.perf_counter() < deadline:
        improved = False
        for i in range(cluster.n):
            r = ranges[i]
            if r is None:
                moves = [(s, s + k) for s in range(L) for k in (1, int(cluster.kmax[i]))
                         if s + k <= L and cluster.kmax[i] >= k]
            else:
                s, e = r
                moves = [(s + ds, e + de) for ds, de in ((-1, 0), (1, 0), (0, -1), (0, 1),
                                                         (-1, -1), (1, 1))]
            for s, e in moves:
                if time.perf_counter() > deadline:
                    break
                if not (0 <= s < e <= L and e - s <= cluster.kmax[i]):
                    continue
                trial = ranges.copy()
                trial[i] = (s, e)
                v = max_flow(cluster, Placement(tuple(trial))).value
                if v > cur * (1 + 1e-9):
                    ranges, cur, improved = trial, v, True
                    break
    return Placement(tuple(ranges)), cur
