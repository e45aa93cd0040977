"""Serving placers behind one interface: ``place(cluster, placer, ...) -> Placed``.

- ``auto`` (default): shoal's stage-template integer program, the baselines, and a local search
  on the exact max flow, best kept (see ``stages``);
- ``milp``: Helix's MILP (see ``milp``), warm-started from the best baseline;
- ``swarm``, ``petals``, ``separate``: Helix's baselines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from shoal.errors import InfeasibleError, SpecError
from shoal.serving.cluster import Cluster
from shoal.serving.flow import Flow, max_flow
from shoal.serving.placement import Placement
from shoal.serving.placers import baselines, milp, stages

PLACERS = ("auto", "milp", "swarm", "petals", "separate")
OBJECTIVES = ("max-flow", "decode")
DEPTH_LEVELS = (1.0, 0.85, 0.7, 0.55, 0.4)  # decode objective: flow targets tried, x max flow


@dataclass(frozen=True)
class Placed:
    placer: str
    placement: Placement
    flow: Flow
    upper_bound: float
    solve_time_s: float
    details: dict = field(default_factory=dict)


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


def place(cluster: Cluster, placer: str = "auto", *, time_limit_s: float = 60.0, seed: int = 0,
          prune: int = 12, warm_start: bool = True, stall_s: float | None = None,
          objective: str = "max-flow", lengths=None) -> Placed:
    """The placement ``placer`` finds within ``time_limit_s``, with its max flow.

    ``objective="decode"`` (auto only): among the max-flow placement and the shallowest stage
    placements (fewest stages, so fewest hops per token) that carry 85%, 70%, ... of it, the one
    whose simulated offline decode throughput is highest (``lengths``: request lengths to
    simulate, default seeded synthetic ones)."""
    if placer not in PLACERS:
        raise SpecError("unknown placer", field="--placer", value=placer,
                        allowed=", ".join(PLACERS))
    if objective not in OBJECTIVES:
        raise SpecError("unknown objective", field="--objective", value=objective,
                        allowed=", ".join(OBJECTIVES))
    if objective == "decode":
        if placer != "auto":
            raise SpecError("the decode objective is for the auto placer", field="--objective",
                            value=objective, allowed="--placer auto")
        return _for_decode(cluster, time_limit_s=time_limit_s, seed=seed, lengths=lengths)
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
        start = _best(cluster, _baselines(cluster, seed)) if warm_start else None
        if start is not None:
            details["warm_start"] = {"placer": start[0], "tokens_per_s": start[2]}
        pl, sol = milp.solve(cluster, time_limit_s=max(0.0, deadline - time.perf_counter()),
                             start=start[1] if start else None, prune=prune, stall_s=stall_s)
        details.update({"status": sol.status, "objective": sol.objective,
                        "bound": min(sol.bound, ub), "prune": prune})
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


SIM_WARMUP_S, SIM_WINDOW_S = 60.0, 300.0  # decode objective: each candidate's offline run


def _for_decode(cluster: Cluster, *, time_limit_s: float, seed: int, lengths) -> Placed:
    """Candidates of several depths, each simulated offline; the best decode throughput wins."""
    from shoal.serving import workload
    from shoal.serving.simulator import simulate

    t0 = time.perf_counter()
    deadline = t0 + time_limit_s
    top = place(cluster, "auto", time_limit_s=time_limit_s / 4, seed=seed)
    cands = [("max-flow", top.placement)]
    for level in DEPTH_LEVELS:
        pl = stages.shallowest(cluster, level * top.flow.value, deadline)
        if pl is not None and all(pl != c for _, c in cands):
            cands.append((f"fewest stages at {level:.0%} of the max flow", pl))
    L = lengths if lengths is not None else workload.synthetic_lengths(20000, seed)
    rows, best = [], None
    for name, pl in cands:
        if time.perf_counter() > deadline and best is not None:
            break
        fl = max_flow(cluster, pl)
        r = simulate(cluster, pl, fl, workload.offline(L, seed), warmup_s=SIM_WARMUP_S,
                     duration_s=SIM_WINDOW_S, seed=seed)
        row = {"candidate": name, "max_flow_tokens_per_s": fl.value,
               "stages": len({x for x in pl.ranges if x is not None}),
               "nodes": sum(x is not None for x in pl.ranges),
               "decode_tokens_per_s": r.decode_tokens_per_s,
               "decode_latency_s": r.decode_latency_s["mean"]}
        rows.append(row)
        if best is None or r.decode_tokens_per_s > best[0]:
            best = (r.decode_tokens_per_s, pl, fl)
    return Placed("auto", best[1], best[2], cluster.upper_bound(), time.perf_counter() - t0,
                  {"objective": "decode", "candidates": rows})
