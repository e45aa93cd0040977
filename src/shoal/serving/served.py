"""What a placement serves, as against its max flow.

Helix's objective, the max flow at each node's capacity T(k) (§4.3), counts what the nodes could
pass at a typical batch. What requests get also depends on how many can be in flight (each holds
KV cache in every layer of its chain, §5.2) and on how long each of their tokens takes (every
hop adds its batch time and its wait): offline, decode throughput is the requests in flight over
the time per token (Little's law), and the nodes can sit mostly idle while the KV cache of one
layer holds the number in flight down. So a placement is judged here by a short offline run of
the request simulator (``simulator.simulate``, Helix §6's offline mode) on the requests' lengths:
decode tokens/s, prompt and decode latency, requests in flight, hops, and which resource binds.

Next to it, the *compute bound*: the max flow with each node passing what the simulator's own
performance model lets it (``perf.tokens_per_s`` at its largest batch: the KV cache and engine
limits the simulator runs, the profile's layer times), which no run exceeds by more than the
prefill batching it leaves out; it is where the max flow would be reached if KV cache and latency
did not bind first. (Helix's T(k) tables are computed at a smaller typical batch, so a run can
serve more than the max flow at T(k); that max flow is Helix's objective, not a bound.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.serving import perf, workload
from shoal.serving.cluster import Cluster
from shoal.serving.flow import max_flow
from shoal.serving.placement import Placement
from shoal.serving.simulator import FEED_HIGH_WATER, SimOptions, simulate

WARMUP_S, WINDOW_S = 60.0, 240.0  # the offline run: seconds not measured, then measured
SATURATED = 0.85  # a node or link busy this share of the window binds


@dataclass(frozen=True)
class Served:
    decode_tokens_per_s: float
    tokens_per_s: float  # prompt and decode
    prompt_latency_s: dict
    decode_latency_s: dict
    in_flight: float  # requests in flight, averaged over the window
    hops: float  # nodes on a request's chain, on average
    compute_bound_tokens_per_s: float | None
    binding: dict  # {"resource", "where": [names], "text"}
    window_s: float
    warmup_s: float
    lengths: str
    wall_s: float

    def to_json(self) -> dict:
        return {"decode_throughput_tokens_per_s": self.decode_tokens_per_s,
                "tokens_per_s": self.tokens_per_s, "prompt_latency_s": self.prompt_latency_s,
                "decode_latency_s": self.decode_latency_s, "in_flight_mean": self.in_flight,
                "hops_mean": self.hops,
                "compute_bound_tokens_per_s": self.compute_bound_tokens_per_s,
                "binding": self.binding,
                "simulated": {"mode": "offline", "warmup_s": self.warmup_s,
                              "window_s": self.window_s, "lengths": self.lengths,
                              "wall_s": self.wall_s}}


def simulatable(cluster: Cluster, pl: Placement | None = None) -> bool:
    """Whether the simulator can run placements on ``cluster``: layer times for every node
    (of ``pl``, or all), memory and the model's layer and KV bytes."""
    nodes = range(cluster.n) if pl is None else [i for i, r in enumerate(pl.ranges) if r]
    return (cluster.kv_bytes is not None and cluster.layer_bytes is not None
            and cluster.memory is not None and not np.isnan(cluster.memory).any()
            and bool(cluster.times) and all(cluster.times[i] is not None for i in nodes))


def compute_bound(cluster: Cluster, pl: Placement, prompt_tokens: float,
                  output_tokens: float) -> float | None:
    """The max flow with each node at ``perf.tokens_per_s`` for its layer count (None when a
    node's layer times are unknown)."""
    if not simulatable(cluster, pl):
        return None
    caps = perf.batch_caps(cluster, pl)
    kv = perf.kv_capacity(cluster, pl)
    node_cap = [0.0] * cluster.n
    for i, r in enumerate(pl.ranges):
        if r is not None:
            node_cap[i] = perf.tokens_per_s(cluster.times[i], r[1] - r[0],
                                            kv_token_layers_total=kv[i],
                                            decode_batch_cap=caps[i][2],
                                            prompt_tokens=prompt_tokens,
                                            output_tokens=output_tokens)
    return max_flow(cluster, pl, node_cap).value


def served(cluster: Cluster, pl: Placement, lengths: np.ndarray | None = None, *,
           seed: int = 0, router: str = "iwrr", warmup_s: float = WARMUP_S,
           window_s: float = WINDOW_S, source: str | None = None) -> Served:
    """The offline run of ``pl`` on ``lengths`` (prompt and output tokens per request, in a
    permutation drawn with ``seed``; default seeded synthetic lengths like the Azure
    conversation trace)."""

    if lengths is None:
        lengths = workload.synthetic_lengths(20000, seed)
        source = source or "synthetic lengths"
    fl = max_flow(cluster, pl)
    r = simulate(cluster, pl, fl, workload.offline(lengths, seed), SimOptions(router=router,
                 warmup_s=warmup_s, duration_s=window_s, seed=seed))
    bound = compute_bound(cluster, pl, float(lengths[:, 0].mean()), float(lengths[:, 1].mean()))
    return Served(r.decode_tokens_per_s, r.tokens_per_s, r.prompt_latency_s,
                  r.decode_latency_s, r.in_flight_mean, r.hops_mean, bound,
                  binding(r, cluster, bound), window_s, warmup_s, source or "lengths", r.wall_s)


def binding(r, cluster: Cluster, bound: float | None = None) -> dict:
    """Which resource holds an offline run's throughput down: compute when the run serves
    ``SATURATED`` of the compute bound (its nodes at their largest batches; the busiest named),
    a link when it sends ``SATURATED`` of the time; else the KV cache when the feeder stopped
    admitting at its high water (the nodes holding the fullest layer) or a request waited for KV
room (the nodes whose KV was the fullest), even if a node is busy
    (its batches are small because few requests are in flight); else a node's compute when it
    is busy ``SATURATED`` of the time; else the requests themselves (the lengths ran out)."""

    names = cluster.names
    util = np.asarray(r.node_utilization)
    busiest = int(util.argmax())
    link = r.busiest_link
    per_token = r.decode_latency_s.get("mean")
    tail = (f"{r.in_flight_mean:.0f} requests in flight on average, each token "
            + (f"{per_token:.3f} s" if per_token is not None else "(not measured)")
            + f" over {r.hops_mean:.1f} nodes")
    node = f"{names[busiest]}, busy {util[busiest]:.0%} of the time"
    if bound is not None and r.tokens_per_s >= SATURATED * bound:
        return {"resource": "compute", "where": [names[busiest]],
                "text": f"compute: {r.tokens_per_s / bound:.0%} of the compute bound is served "
                        f"(the busiest node {node}); {tail}"}
    if link is not None and link[2] >= SATURATED:
        ends = [names[x] if x < len(names) else "coordinator" for x in link[:2]]
        return {"resource": "link", "where": ends,
                "text": f"the link {ends[0]} -> {ends[1]}, sending {link[2]:.0%} of the time; "
                        f"{tail}"}
    if r.waited or (r.kv_fill_peak is not None and r.kv_fill_peak >= FEED_HIGH_WATER):
        where = [names[i] for i in r.kv_fill_nodes] or [names[i] for i in np.flatnonzero(
            np.asarray(r.kv_peak_fraction) >= np.max(r.kv_peak_fraction) - 1e-9)]
        return {"resource": "KV cache", "where": where,
                "text": f"the KV cache: requests enter until {', '.join(where)} "
                        f"{'has' if len(where) == 1 else 'have'} as much KV reserved as "
                        f"admission allows, which holds {tail}; decode tokens/s = requests in "
                        f"flight / time per token (the busiest node {node})"}
    if util[busiest] >= SATURATED:
        return {"resource": "compute", "where": [names[busiest]],
                "text": f"the compute of {node}; {tail}"}
    return {"resource": "requests", "where": [],
            "text": f"the requests: none waited for KV room or compute; {tail}"}
