"""The readable tables of the serving commands: ``shoal serve plan`` and ``flow`` (a placement,
its candidates, what it serves, the flow on its links), ``serve simulate``, ``serve run`` and
``serve profile``."""

from __future__ import annotations

from shoal.report.tables import Table


def placement_table(cluster, placed) -> Table:
    """Each node holding layers: its range, the flow through it and its capacity there."""
    by = "Given placement" if placed.placer == "given" else f"Placement by {placed.placer}"
    t = Table(f"{by}: {placed.flow.value:,.2f} tokens/s "
              f"(upper bound {placed.upper_bound:,.2f}, {placed.solve_time_s:.2f} s)",
              ["node", "type", "region", "layers", "tokens/s through", "capacity"],
              left=("node", "type", "region"), whole=("node", "type"))
    rows = sorted((r, i) for i, r in enumerate(placed.placement.ranges) if r is not None)
    for (s, e), i in rows:
        t.add_row(cluster.names[i], cluster.machines[i], cluster.regions[i], f"[{s}, {e})",
                  f"{placed.flow.through[i]:,.1f}", f"{cluster.T[i, e - s]:,.1f}")
    return t


def candidates_table(cands: list[dict]) -> Table:
    """The auto placer's candidates, simulated; the one kept marked ``*``."""
    c = Table("Candidates, simulated offline (the best decode throughput is kept)",
              ["candidate", "max flow", "stages", "nodes", "decode tokens/s", "s/token"],
              left=("candidate",))
    for r in cands:
        c.add_row(("* " if r.get("chosen") else "") + r["candidate"],
                  f"{r['max_flow_tokens_per_s']:,.1f}", str(r["stages"]),
                  str(r["nodes"]), f"{r['decode_tokens_per_s']:,.1f}",
                  f"{r['decode_latency_s']:.3f}" if r["decode_latency_s"] else "—")
    return c


def served_table(placed) -> Table:
    """What the placement serves (``placed.served``), next to its max flow."""
    s = placed.served

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.3f} s mean, {d['p95']:.3f} s p95"

    t = Table(f"Served, simulated offline ({s.window_s:g} s after {s.warmup_s:g} s of "
              f"warm-up, {s.lengths})", ["", "value"], left=("",))
    t.add_row("decode tokens/s", f"{s.decode_tokens_per_s:,.1f}")
    t.add_row("prompt + decode tokens/s", f"{s.tokens_per_s:,.1f}")
    t.add_row("prompt latency", lat(s.prompt_latency_s))
    t.add_row("decode latency per token", lat(s.decode_latency_s))
    t.add_row("requests in flight, nodes per request", f"{s.in_flight:,.0f}, {s.hops:.1f}")
    t.add_row("max flow at the nodes' T(k) (Helix's objective)",
              f"{placed.flow.value:,.1f} tokens/s")
    if s.compute_bound_tokens_per_s is not None:
        t.add_row("compute bound (each node at its largest batch)",
                  f"{s.compute_bound_tokens_per_s:,.1f} tokens/s")
    return t


def links_table(flows: list[dict]) -> Table:
    """The links carrying flow (a placement document's ``flows``)."""
    lt = Table("Flow on every link, tokens/s (routing weights)", ["from", "to", "tokens/s"],
               left=("from", "to"), whole=("from", "to"))
    for f in flows:
        if f["tokens_per_s"] > 0:
            lt.add_row(f["from"], f["to"], f"{f['tokens_per_s']:,.1f}")
    return lt


def simulated_table(res, source: str, max_flow: float) -> Table:
    """A simulation's metrics (``SimResult``) of the workload ``source``."""

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.2f} / {d['p50']:.2f} / {d['p95']:.2f}"

    t = Table(f"Simulated {res.mode}, router {res.router}, {res.window_s:,.0f} s measured "
              f"({source})", ["metric", "value"], left=("metric",))
    t.add_row("decode throughput, tokens/s", f"{res.decode_tokens_per_s:,.1f}")
    t.add_row("prompt + decode tokens/s", f"{res.tokens_per_s:,.1f}")
    t.add_row("max flow of the placement, tokens/s", f"{max_flow:,.1f}")
    t.add_row("prompt latency s (mean / p50 / p95)", lat(res.prompt_latency_s))
    t.add_row("decode latency s/token (mean / p50 / p95)", lat(res.decode_latency_s))
    t.add_row("requests completed / had to wait for KV room", f"{res.completed} / {res.waited}")
    used = [u for u in res.node_utilization if u > 0]
    if used:
        t.add_row("node utilisation (min / mean / max)",
                  f"{min(used):.0%} / {sum(used) / len(used):.0%} / {max(used):.0%}")
    t.add_row("simulated in", f"{res.wall_s:.1f} s ({res.events:,} events)")
    return t


def live_table(doc: dict, requests: int, workers: int, chains: dict[str, int]) -> Table:
    """A live run's metrics (``serve run --json``): ``requests`` served by ``workers``, and how
    many took each chain of nodes."""

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.3f} / {d['p50']:.3f} / {d['p95']:.3f}"

    t = Table(f"Served {requests} requests of {doc['model']} on {workers} workers in "
              f"{doc['window_s']:.2f} s", ["metric", "value"], left=("metric",))
    t.add_row("decode throughput, tokens/s", f"{doc['decode_throughput_tokens_per_s']:,.1f}")
    t.add_row("prompt + decode tokens/s", f"{doc['tokens_per_s']:,.1f}")
    t.add_row("prompt latency s (mean / p50 / p95)", lat(doc["prompt_latency_s"]))
    t.add_row("decode latency s/token (mean / p50 / p95)", lat(doc["decode_latency_s"]))
    t.add_row("requests completed / rejected",
              f"{doc['requests']['completed']} / {doc['requests']['rejected']}")
    t.add_row("chains used", "; ".join(f"{k} ({n})" for k, n in sorted(chains.items())))
    return t


def live_lines(doc: dict) -> list[str]:
    """Under a live run's table: why requests were rejected, workers started again, messages
    dropped."""
    lines = [f"rejected ({n}): {why}" for why, n in doc["requests"]["rejected_why"].items()]
    again = [f"{n} ({w['restarts']}x, now {w['state']})" for n, w in doc["workers"].items()
             if w["restarts"]]
    if again:
        lines.append("workers started again after they died: " + ", ".join(again))
    dropped = doc["dropped_messages"] + sum(w["dropped_messages"] for w in doc["workers"].values())
    if dropped:
        lines.append(f"{dropped} malformed messages dropped (coordinator and workers)")
    return lines


def serve_profile_table(prof, model: str, dtype: str) -> Table:
    """Measured seconds per layer (``runtime.serve.profile.Profile``), prompt and decode."""
    t = Table(f"{model}: seconds per layer, measured ({dtype})", ["what", "x", "ms per layer"],
              left=("what",))
    for n, v in zip(prof.prompt_tokens, prof.prompt_s_per_layer, strict=True):
        t.add_row("prompt, tokens", str(n), f"{v * 1e3:.4f}")
    for n, v in zip(prof.decode_batch, prof.decode_s_per_layer, strict=True):
        t.add_row(f"decode at {prof.context} cached, batch", str(n), f"{v * 1e3:.4f}")
    return t


def serve_profile_lines(prof) -> list[str]:
    """Under the profile's table: the hop between processes, processes sharing a host, and what
    a step costs more after idling."""
    w = prof.wake
    return [
        f"hop between processes: {prof.link_latency_s * 1e6:.0f} us + bytes / "
        f"{prof.link_bandwidth_Bps / 1e9:.2f} GB/s ({prof.activation_bytes} B per token); "
        f"coordinator {prof.coordinator_s * 1e6:.0f} us per token",
        "each of k processes at once, speed against one alone: "
        + ", ".join(f"k={k} {v:.2f}" for k, v in enumerate(prof.host_share, 1)),
        "after idle " + ", ".join(f"{g * 1e3:g} ms" for g in w["gap_s"]) + ": message +"
        + ", ".join(f"{v * 1e3:.2f}" for v in w["hop_s"]) + " ms; prompt step +"
        + ", ".join(f"{v * 1e3:.2f}" for v in w["prompt_s_per_layer"]) + " ms per layer; decode "
        "step +" + ", ".join(f"{v * 1e3:.2f}" for v in w["decode_s_per_layer"])
        + " ms per layer",
    ]
