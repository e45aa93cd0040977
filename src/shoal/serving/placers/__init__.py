"""Serving placers behind one interface: ``place(cluster, placer, ...) -> Placed``.

- ``auto`` (default): shoal's. By default (objective ``decode``) it chooses among placements by
  what the request simulator says they serve (``served``): the max-flow placement and stage
  placements of several depths and KV floors, each simulated offline, the highest decode
  throughput kept (the lowest decode latency among those within ``TIE`` of it), then the
  depth and KV floor refined around it while time remains. With objective ``max-flow`` (and
  wherever the cluster lacks layer times to simulate): the stage-template integer program, the
  baselines, and a local search on the exact max flow, best kept (see ``stages``);
- ``milp``: Helix's MILP (see ``milp``), warm-started from the best baseline;
- ``swarm``, ``petals``, ``separate``: Helix's baselines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shoal.errors import InfeasibleError, SpecError
from shoal.serving import served as sv
from shoal.serving.cluster import Cluster
from shoal.serving.flow import Flow, max_flow
from shoal.serving.names import OBJECTIVES, PLACERS
from shoal.serving.perf import GPU_MEMORY_UTILIZATION
from shoal.serving.placement import Placement
from shoal.serving.placers import baselines, milp, stages
from shoal.serving.served import simulatable

# decode objective: the stage placements tried, fewest stages at each flow target (x the max
# flow) and KV floor (x ``kv_bound``): a grid, then finer steps around the best pair, then the
# grid's far corners if time is left
GRID = tuple((f, k) for k in (0.0, 0.4) for f in (0.85, 0.7, 0.55))
REFINE_STEPS = ((0.075, 0.1), (0.0375, 0.05))
OUTER = ((1.0, 0.0), (0.4, 0.0), (0.4, 0.4), (0.85, 0.6))
TIE = 0.02  # decode throughputs this close are a tie, broken by the lower decode latency
# each candidate's offline run: a warm-up long enough for the KV feeder to fill the cache of
# KV-rich placements (shorter ones over-rate them), then the window measured
SEARCH_WARMUP_S, SEARCH_WINDOW_S = 150.0, 210.0
MARGIN = 0.05  # of the time limit, left for what follows the last simulation
# the candidates are simulated on another draw of the lengths than `serve simulate --seed S`
# takes by default, so that the choice is not fitted to the run it is judged by
SEARCH_SEED_OFFSET = 1


@dataclass(frozen=True)
class Placed:
    placer: str
    placement: Placement
    flow: Flow
    upper_bound: float
    solve_time_s: float
    details: dict = field(default_factory=dict)
    served: object | None = None  # served.Served: what the placement serves, simulated


def _check_fits(cluster: Cluster) -> None:
    room = int(cluster.kmax.sum())
    if room < cluster.layers:
        raise InfeasibleError(
            f"the model's {cluster.layers} layers fit on no combination of the nodes: together "
            f"they may hold {room}", binding="node memory",
            relaxation=f"add nodes that hold at least {cluster.layers - room} more layers")


def _baselines(cluster: Cluster, seed: int) -> dict[str, Placement]:
    out = {}
    for name, fn in (("swarm", baselines.swarm), ("separate", baselines.separate)):
        pl = fn(cluster)
        if pl is not None:
            out[name] = pl
    if cluster.partial:
        out["petals"] = baselines.petals(cluster, seed)
    return out


def _best(cluster: Cluster, cands: dict[str, Placement]) -> tuple[str, Placement, float] | None:
    scored = [(max_flow(cluster, pl).value, name, pl) for name, pl in cands.items()]
    if not scored:
        return None
    v, name, pl = max(scored, key=lambda x: x[0])
    return name, pl, v


@dataclass(frozen=True)
class MilpOptions:
    """The ``milp`` placer's settings: how many candidate links of each node it keeps
    (``milp.pruned``), whether it starts from the best baseline, and the seconds without a
    better solution after which it stops (None: at the time limit)."""

    prune: int = 12
    warm_start: bool = True
    stall_s: float | None = None


def place(cluster: Cluster, placer: str = "auto", *, time_limit_s: float = 60.0, seed: int = 0,
          objective: str | None = None, lengths=None,
          milp_options: MilpOptions = MilpOptions()) -> Placed:
    """The placement ``placer`` finds within ``time_limit_s``, with its max flow.

    ``objective`` (auto only; default ``decode``): ``decode`` chooses by the simulated offline
    decode throughput (``lengths``: request lengths to simulate, default seeded synthetic ones;
    the max flow when the cluster lacks what the simulator needs), ``max-flow`` by Helix's
    objective. ``milp_options``: the ``milp`` placer's settings."""
    if placer not in PLACERS:
        raise SpecError("unknown placer", field="--placer", value=placer,
                        allowed=", ".join(PLACERS))
    if objective is not None and objective not in OBJECTIVES:
        raise SpecError("unknown objective", field="--objective", value=objective,
                        allowed=", ".join(OBJECTIVES))
    if objective is not None and placer != "auto":
        raise SpecError("an objective is for the auto placer", field="--objective",
                        value=objective, allowed="--placer auto")
    if placer == "auto" and objective != "max-flow":

        if simulatable(cluster):
            return _for_decode(cluster, time_limit_s=time_limit_s, seed=seed, lengths=lengths)
        if objective == "decode":
            raise SpecError("the decode objective simulates requests, which needs layer times "
                            "and memory for every node", field="--objective", value=objective,
                            allowed="machines with a 'profile' or a catalog 'gpu' (and the "
                                    "model's layer and KV bytes), or --objective max-flow")
    _check_fits(cluster)
    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    ub = cluster.upper_bound()
    details: dict = {}
    pl: Placement | None
    if placer == "swarm":
        pl = baselines.swarm(cluster)
    elif placer == "separate":
        pl = baselines.separate(cluster)
    elif placer == "petals":
        pl = baselines.petals(cluster, seed)
    elif placer == "milp":
        mo = milp_options
        start = _best(cluster, _baselines(cluster, seed)) if mo.warm_start else None
        if start is not None:
            details["warm_start"] = {"placer": start[0], "tokens_per_s": start[2]}
        pl, sol = milp.solve(cluster, time_limit_s=max(0.0, deadline - time.perf_counter()),
                             start=start[1] if start else None, prune=mo.prune,
                             stall_s=mo.stall_s)
        details.update({"status": sol.status, "objective": sol.objective,
                        "bound": min(sol.bound, ub), "prune": mo.prune})
    else:
        # a third of the time for the stage program, the rest for the local search
        st = stages.staged(cluster, t0 + time_limit_s / 3)
        cands = _baselines(cluster, seed)
        if st is not None:
            cands["stages"] = st
        best = _best(cluster, cands)
        pl = None
        if best is not None:
            details["start"] = {"placer": best[0], "tokens_per_s": best[2]}
            pl, _ = stages.improve(cluster, best[1], deadline)
    if pl is None:
        why = {"separate": "no node type has enough nodes to hold the whole model alone",
               "swarm": "even stages sized for the weakest node outnumber the nodes"}
        raise InfeasibleError(why.get(placer, f"the {placer} placer found no placement that "
                                              "serves the model within the time limit"),
                              binding="placement",
                              relaxation="try --placer auto" + (
                                  "" if placer in why else " or a longer --time-limit"))
    fl = max_flow(cluster, pl)
    if fl.value <= 0:
        why, fix = no_flow_reason(cluster, pl)
        raise InfeasibleError(f"the {placer} placement serves nothing ({why})", binding="placement",
                              relaxation=fix)
    return Placed(placer, pl, fl, ub, time.perf_counter() - t0, details)


def with_served(cluster: Cluster, placed: Placed, lengths=None, seed: int = 0) -> Placed:
    """``placed`` with what its placement serves (``served.served``, simulated offline on
    ``lengths`` drawn with the search's seed), unless it has that already or the cluster
    cannot be simulated."""
    import dataclasses


    if placed.served is not None or placed.flow.value <= 0 \
            or not sv.simulatable(cluster, placed.placement):
        return placed
    try:
        s = sv.served(cluster, placed.placement, lengths, seed=seed + SEARCH_SEED_OFFSET,
                      warmup_s=SEARCH_WARMUP_S, window_s=SEARCH_WINDOW_S)
    except InfeasibleError as exc:  # no request can be admitted: say why instead
        return dataclasses.replace(placed, details={**placed.details,
                                                    "serves_nothing": str(exc)})
    return dataclasses.replace(placed, served=s)


def no_flow_reason(cluster: Cluster, pl: Placement) -> tuple[str, str]:
    """Why no request can get through ``pl`` (its max flow is 0), and what would help."""
    gaps = pl.uncovered_text(cluster)
    if gaps:
        return (f"layers {gaps} are on no node",
                "place the layers with `shoal serve plan --placer auto`, or nodes with more "
                "memory, or allow partial inference")
    first = [i for i, r in enumerate(pl.ranges) if r is not None and r[0] == 0]
    last = [i for i, r in enumerate(pl.ranges) if r is not None and r[1] == cluster.layers]
    if not any(cluster.src[i] > 0 for i in first) or not any(cluster.snk[i] > 0 for i in last):
        return ("the coordinator has no link to the nodes holding the first or last layers",
                "give the serving file's links a `within` class (or `coordinator`, or `pairs` "
                "from the coordinator)")
    if not (cluster.S > 0).any():
        return ("no node has a link to another, and no node holds every layer",
                "give the serving file's links a `within` class (and `between` for nodes in "
                "two regions)")
    # a token's layers pass from node to node, each range starting where the one before ends
    reached, todo = {0}, [0]
    while todo:
        at = todo.pop()
        for r in pl.ranges:
            if r is not None and r[0] == at and r[1] not in reached:
                reached.add(r[1])
                todo.append(r[1])
    if cluster.layers not in reached and not cluster.partial:
        return (f"no nodes' layer ranges follow one another, each starting where the one before "
                f"ends, from layer 0 to {cluster.layers} (they reach layer {max(reached)} at most)",
                "place the layers with `shoal serve plan --placer auto` (or petals with another "
                "--seed), or allow partial inference")
    return ("no chain of linked nodes covers every layer",
            "link the nodes holding consecutive layers (the serving file's links: `within`, "
            "`between` or `pairs`), or place with `shoal serve plan --placer auto`")


def check_serves(cluster: Cluster, placed: Placed) -> None:
    """An InfeasibleError saying why, and what would help, when no request can get through
    ``placed`` (its max flow is 0)."""
    if placed.flow.value > 0:
        return
    why, fix = no_flow_reason(cluster, placed.placement)
    raise InfeasibleError(f"the placement serves nothing ({why})", binding="placement",
                          relaxation=fix)


def kv_bound(cluster: Cluster) -> float:
    """Tokens of KV cache per layer if every node's memory beside one copy of the weights held
    KV, spread evenly over the layers: no placement's fullest layer holds more."""

    free = GPU_MEMORY_UTILIZATION * float(cluster.memory.sum()) \
        - cluster.layers * cluster.layer_bytes
    return max(free, 0.0) / (cluster.kv_bytes * cluster.layers)


def _for_decode(cluster: Cluster, *, time_limit_s: float, seed: int, lengths) -> Placed:
    """Stage placements of several depths and KV floors (``GRID``), each simulated offline
    (``served``); the flow target and KV floor of the best refined (``REFINE_STEPS``), then
    the grid's far corners, the max-flow placement and the baselines while time remains. The
    best decode throughput wins (ties within ``TIE``: the lower mean decode latency). A new
    simulation starts only if the longest so far still fits before the deadline."""

    t0 = time.perf_counter()
    deadline = t0 + (1.0 - MARGIN) * time_limit_s
    top = place(cluster, "auto", time_limit_s=time_limit_s / 4, seed=seed, objective="max-flow")
    search = _DecodeSearch(cluster, deadline, seed + SEARCH_SEED_OFFSET, lengths,
                           (top.flow.value, kv_bound(cluster)))
    for level, kv in GRID:
        search.trial(level, kv)
    search.refine()
    for level, kv in OUTER:
        search.trial(level, kv)
    # the deepest, the max-flow placement, last: its run is the longest and it rarely serves most
    search.judge("max flow", top.placement, None, None)
    for name, q in _baselines(cluster, seed).items():
        search.judge(name, q, None, None)
    tried, scored = search.tried, search.scored
    if not scored:
        raise InfeasibleError(
            "no placement tried serves a request: " + next(
                (r["serves_nothing"] for r in tried.values() if "serves_nothing" in r),
                "none could be simulated in the time limit"),
            binding="KV cache", relaxation="nodes with more memory, or --objective max-flow "
                                           "for Helix's objective alone")
    pl = search.best()
    for r in search.rows:
        r["chosen"] = tried[pl] is r
    return Placed("auto", pl, max_flow(cluster, pl), cluster.upper_bound(),
                  time.perf_counter() - t0,
                  {"objective": "decode", "max_flow_placement": top.flow.value,
                   "kv_bound_tokens_per_layer": search.K, "candidates": search.rows},
                  served=scored[pl])


class _DecodeSearch:
    """``_for_decode``'s candidates, each simulated offline once on request lengths drawn with
    ``draw``, until ``deadline``: stage placements at a share of the max flow ``F`` and a KV
    floor at a share of ``K`` (``kv_bound``) tokens per layer (``targets``: (F, K)), and any
    placement given. ``tried``: every placement judged and its row (or why it serves
    nothing); ``scored``: what those that serve serve."""

    def __init__(self, cluster: Cluster, deadline: float, draw: int, lengths,
                 targets: tuple[float, float]):
        self.cluster, self.deadline, self.draw, self.lengths = cluster, deadline, draw, lengths
        self.F, self.K = targets
        self.rows: list[dict] = []
        self.tried: dict[Placement, dict] = {}
        self.scored: dict[Placement, object] = {}
        self.slowest = 0.0  # the longest simulation so far: another must fit before the deadline

    def judge(self, name: str, pl: Placement, level: float | None, kv: float | None) -> None:
        cluster, tried, scored = self.cluster, self.tried, self.scored
        if pl in tried or time.perf_counter() + self.slowest > self.deadline and scored:
            return
        t = time.perf_counter()
        try:
            s = sv.served(cluster, pl, self.lengths, seed=self.draw, warmup_s=SEARCH_WARMUP_S,
                          window_s=SEARCH_WINDOW_S)
        except InfeasibleError as exc:  # e.g. no node on some chain has KV for one prompt
            tried[pl] = {"candidate": name, "serves_nothing": str(exc)}
            return
        self.slowest = max(self.slowest, time.perf_counter() - t)
        row = {"candidate": name, "flow_level": level, "kv_level": kv,
               "max_flow_tokens_per_s": max_flow(cluster, pl).value,
               "stages": len({x for x in pl.ranges if x is not None}),
               "nodes": sum(x is not None for x in pl.ranges),
               "decode_tokens_per_s": s.decode_tokens_per_s,
               "decode_latency_s": s.decode_latency_s["mean"]}
        self.rows.append(row)
        tried[pl] = row
        scored[pl] = s

    def best(self) -> Placement:
        tried, scored = self.tried, self.scored
        top_v = max(tried[p]["decode_tokens_per_s"] for p in scored)
        near = [p for p in scored if tried[p]["decode_tokens_per_s"] >= (1 - TIE) * top_v]
        return min(near, key=lambda p: (tried[p]["decode_latency_s"] or float("inf"),
                                        -tried[p]["decode_tokens_per_s"]))

    def trial(self, level: float, kv: float) -> None:
        """The placement of fewest stages at ``level`` of the max flow, KV floor ``kv``."""
        if 0 < level <= 1 and kv >= 0 and time.perf_counter() < self.deadline:
            pl = stages.shallowest(self.cluster, level * self.F, self.deadline, K=kv * self.K)
            if pl is not None:
                self.judge(f"fewest stages at {level:.1%} of the max flow, KV floor {kv:.0%}",
                           pl, level, kv)

    def refine(self) -> None:
        """Around the best (flow target, KV floor) pair, finer and finer."""
        for dl, dk in REFINE_STEPS:
            if not self.scored:
                break
            b = self.tried[self.best()]
            if b["flow_level"] is None:
                break
            for level, kv in ((b["flow_level"] + dl, b["kv_level"]),
                              (b["flow_level"] - dl, b["kv_level"]),
                              (b["flow_level"], b["kv_level"] + dk),
                              (b["flow_level"], b["kv_level"] - dk)):
                self.trial(level, kv)
