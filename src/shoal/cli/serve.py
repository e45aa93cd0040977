"""``shoal serve ...`` and ``shoal import helix``: serving placement on heterogeneous nodes."""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

import shoal.cli.common as _cli
from shoal.errors import SpecError

serve_app = typer.Typer(no_args_is_help=True,
                        help="Serve a model over heterogeneous nodes: placement and max flow.")


class Objective(StrEnum):
    max_flow = "max-flow"
    decode = "decode"


class Placer(StrEnum):
    auto = "auto"
    milp = "milp"
    swarm = "swarm"
    petals = "petals"
    separate = "separate"


def _load(serving: Path):
    from shoal.serving.cluster import build_cluster
    from shoal.specs.serving import load_serving

    return build_cluster(load_serving(serving), file=str(serving))


def _placement_json(cluster, placed) -> dict:
    flows = [{"from": cluster.names[u] if isinstance(u, int) else u,
              "to": cluster.names[v] if isinstance(v, int) else v, "tokens_per_s": f}
             for (u, v), f in sorted(placed.flow.edges.items(), key=str)]
    doc = placed.placement.to_json(cluster)
    doc["max_flow_tokens_per_s"] = placed.flow.value
    doc["flows"] = flows
    return doc


def _report(cluster, placed, as_json: bool, output: Path | None, helix_out: Path | None,
            figure: Path | None, links: bool = False) -> None:
    from shoal.files import write_json

    doc = {"placer": placed.placer, "solve_time_s": placed.solve_time_s,
           "max_flow_tokens_per_s": placed.flow.value,
           "upper_bound_tokens_per_s": placed.upper_bound,
           "gap_to_upper_bound": 1.0 - placed.flow.value / placed.upper_bound,
           "served": placed.served.to_json() if placed.served is not None else None,
           "nodes_used": sum(r is not None for r in placed.placement.ranges),
           "layers_on_no_node": [list(r) for r in placed.placement.uncovered(cluster)],
           "details": placed.details, "placement": _placement_json(cluster, placed)}
    if output is not None:
        write_json(output, doc["placement"])
    if helix_out is not None:
        from shoal.files import write_text
        from shoal.io.helix import write_placement

        write_text(helix_out, write_placement(placed.placement, cluster))
    if figure is not None:
        from shoal.report.figures import draw_placement

        draw_placement(doc, figure)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out = _cli._out()
    by = "Given placement" if placed.placer == "given" else f"Placement by {placed.placer}"
    t = _cli._table(f"{by}: {placed.flow.value:,.2f} tokens/s "
                    f"(upper bound {placed.upper_bound:,.2f}, {placed.solve_time_s:.2f} s)",
                    ["node", "type", "region", "layers", "tokens/s through", "capacity"],
                    left=("node", "type", "region"), whole=("node", "type"))
    rows = sorted((r, i) for i, r in enumerate(placed.placement.ranges) if r is not None)
    for (s, e), i in rows:
        t.add_row(cluster.names[i], cluster.machines[i], cluster.regions[i], f"[{s}, {e})",
                  f"{placed.flow.through[i]:,.1f}", f"{cluster.T[i, e - s]:,.1f}")
    out.print(t)
    cands = placed.details.get("candidates")
    if cands:
        c = _cli._table("Candidates, simulated offline (the best decode throughput is kept)",
                        ["candidate", "max flow", "stages", "nodes", "decode tokens/s",
                         "s/token"], left=("candidate",))
        for r in cands:
            c.add_row(("* " if r.get("chosen") else "") + r["candidate"],
                      f"{r['max_flow_tokens_per_s']:,.1f}", str(r["stages"]),
                      str(r["nodes"]), f"{r['decode_tokens_per_s']:,.1f}",
                      f"{r['decode_latency_s']:.3f}" if r["decode_latency_s"] else "—")
        out.print(c)
    if placed.served is not None:
        _print_served(placed)
    elif "serves_nothing" in placed.details:
        out.print(f"simulated, the placement serves nothing: {placed.details['serves_nothing']}",
                  soft_wrap=True)
    if links:
        lt = _cli._table("Flow on every link, tokens/s (routing weights)",
                         ["from", "to", "tokens/s"], left=("from", "to"), whole=("from", "to"))
        for f in doc["placement"]["flows"]:
            if f["tokens_per_s"] > 0:
                lt.add_row(f["from"], f["to"], f"{f['tokens_per_s']:,.1f}")
        out.print(lt)
    idle = [cluster.names[i] for i, r in enumerate(placed.placement.ranges) if r is None]
    if idle:
        out.print(f"{len(idle)} node(s) hold no layers: {', '.join(idle)}")
    if placed.flow.value <= 0:
        from shoal.serving.placers import no_flow_reason

        why, fix = no_flow_reason(cluster, placed.placement)
        out.print(f"the max flow is 0: {why}; {fix}")
    for path, what in ((output, "placement"), (helix_out, "placement (Helix format)"),
                       (figure, "figure")):
        if path is not None:
            out.print(f"{what} written to {path}")


def _print_served(placed) -> None:
    """What the placement serves, next to its max flow, and what binds."""
    s = placed.served
    out = _cli._out()

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.3f} s mean, {d['p95']:.3f} s p95"

    t = _cli._table(f"Served, simulated offline ({s.window_s:g} s after {s.warmup_s:g} s of "
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
    out.print(t)
    out.print(f"binding: {s.binding['text']}", soft_wrap=True)


@serve_app.command("plan")
@_cli.handles_errors
def plan_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placer: Annotated[Placer, typer.Option(help="placement algorithm")] = Placer.auto,
    objective: Annotated[Objective | None, typer.Option(
        help="auto only: decode (default where the nodes have layer times): the simulated "
             "decode throughput; max-flow: Helix's objective", show_default=False)] = None,
    lengths: Annotated[Path | None, typer.Option(
        "--lengths", help="request lengths to simulate (CSV input_tokens,output_tokens; "
                          "default: seeded synthetic ones)")] = None,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="seconds")] = 60.0,
    seed: Annotated[int | None, typer.Option(
        min=0, help="petals' node order (auto and milp start from it too) [default: 0]")] = None,
    prune: Annotated[int | None, typer.Option(
        min=0, help="milp: keep each node's fastest N links (0: all) [default: 12]")] = None,
    warm_start: Annotated[bool, typer.Option(
        "--warm-start/--cold", help="milp: start from the best baseline placement")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, _cli.output_option(
        "-o", "--output", help="write the placement (JSON) here")] = None,
    helix_out: Annotated[Path | None, _cli.output_option(
        "--helix-out", help="also write the placement in Helix's solution format")] = None,
    figure: Annotated[Path | None, _cli.output_option("--figure", help="draw the placement")] = None,
) -> None:
    """Place the model's layers on the nodes: by default for the most decode tokens/s the request
    simulator serves (or, with --objective max-flow, the largest max flow); reports what the
    placement serves next to its max flow, and what binds."""
    from shoal.files import check_outputs
    from shoal.serving.placers import MilpOptions, place, with_served

    check_outputs([(output, "--output"), (helix_out, "--helix-out"), (figure, "--figure")],
                  [serving, lengths])
    _cli.only_with("--placer milp", placer is Placer.milp, ("--prune", prune),
                   ("--cold", None if warm_start else "--cold"))
    _cli.only_with("--placer auto, milp or petals", placer not in (Placer.swarm, Placer.separate),
                   ("--seed", seed))
    seed = 0 if seed is None else seed
    prune = 12 if prune is None else prune
    cluster = _load(serving)
    obj = objective.value if objective is not None else None
    L = None
    if lengths is not None:
        from shoal.serving.served import simulatable
        from shoal.serving.workload import load_lengths

        if not simulatable(cluster):
            raise SpecError("request lengths are simulated, which needs layer times and memory "
                            "for every node", field="--lengths", value=str(lengths),
                            allowed="machines with a 'profile' or a catalog 'gpu'")
        L = load_lengths(lengths)
    kw = dict(time_limit_s=time_limit, seed=seed, objective=obj, lengths=L,
              milp_options=MilpOptions(prune=prune, warm_start=warm_start))
    if as_json or time_limit < 1:
        placed = place(cluster, placer.value, **kw)
    else:
        with _cli._progress().status(f"placing {cluster.layers} layers on {cluster.n} nodes "
                                f"({placer.value}, up to {time_limit:g} s)"):
            placed = place(cluster, placer.value, **kw)
    placed = with_served(cluster, placed, L, seed)
    _report(cluster, placed, as_json, output, helix_out, figure)


@serve_app.command("flow")
@_cli.handles_errors
def flow_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path, typer.Option("--placement", help="placement JSON (or Helix .ini)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    figure: Annotated[Path | None, _cli.output_option("--figure", help="draw the placement")] = None,
) -> None:
    """The max flow (tokens/s) of a given placement, the flow on every link, and what the
    placement serves (simulated) and what binds."""
    from shoal.files import check_outputs
    from shoal.serving.placers import with_served

    check_outputs([(figure, "--figure")], [serving, placement])
    cluster = _load(serving)
    _report(cluster, with_served(cluster, _placement(cluster, placement)), as_json, None, None,
            figure, links=True)


def _trace(trace: Path, **others):
    """The requests of a ``--trace`` file; the options it replaces must not be given too."""
    from shoal.serving import workload as wl

    given = [f"--{k}" for k, v in others.items() if v is not None]
    if given:
        raise SpecError("a trace gives the arrivals and lengths itself", field="--trace",
                        value=" ".join(given), allowed="--trace alone, or "
                        + " / ".join(f"--{k}" for k in others))
    return wl.load_trace(trace)


class Mode(StrEnum):
    offline = "offline"
    online = "online"


class RouterName(StrEnum):
    iwrr = "iwrr"
    helix_iwrr = "helix-iwrr"
    swarm = "swarm"
    random = "random"
    shortest_queue = "shortest-queue"


def _check_port(host: str, port: int) -> None:
    """A SpecError naming --http when ``host:port`` cannot be listened on (in use, say), before
    the workers start."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise SpecError(f"cannot listen there: {exc.strerror or exc}", field="--http",
                        value=f"{host}:{port}", allowed="a free port (0: any)") from None


def _placement(cluster, placement: Path | None):
    """A placement file (shoal JSON or Helix .ini), or auto's when none is given."""
    from shoal.serving.flow import max_flow
    from shoal.serving.placement import load_placement
    from shoal.serving.placers import Placed, place

    if placement is None:
        return place(cluster, "auto", time_limit_s=10.0)
    if placement.suffix.lower() == ".ini":
        from shoal.io.helix import read_placement

        pl = read_placement(placement, cluster)
    else:
        pl = load_placement(placement, cluster)
    return Placed("given", pl, max_flow(cluster, pl), cluster.upper_bound(), 0.0)


@serve_app.command("simulate")
@_cli.handles_errors
def simulate_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path | None, typer.Option(
        "--placement", help="placement JSON or Helix .ini (default: place with auto)")] = None,
    mode: Annotated[Mode | None, typer.Option(
        help="offline (default): keep the cluster busy (Helix's KV feeder, or --concurrency); "
             "online (with --trace, always): arrivals", show_default=False)] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="offline: this many requests in flight (as Helix runs its "
                                     "baseline routers) instead of the KV feeder")] = None,
    router: Annotated[RouterName, typer.Option(help="per-request routing")] = RouterName.iwrr,
    lengths: Annotated[Path | None, typer.Option(
        "--lengths", help="CSV input_tokens,output_tokens (default: seeded synthetic lengths)")] = None,
    arrivals: Annotated[Path | None, typer.Option(
        "--arrivals", help="online: CSV interval,requests per 3 s (default: Poisson)")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="online: CSV arrival_s,input_tokens,output_tokens, one row per request "
                        "(instead of --lengths, --arrivals and --load)")] = None,
    batching: Annotated[str, typer.Option(
        "--batching", help="vllm: as vLLM 0.4 (Helix's engine); live: as serve run's workers "
                           "(one request's step at a time, in arrival order)")] = "vllm",
    load: Annotated[float | None, typer.Option(
        "--load", min=0.01, help="online: mean arrival rate as a fraction of the max flow "
                                 "[default: 0.75]")] = None,
    requests: Annotated[int | None, typer.Option(
        "--requests", min=1, help="online: simulate only the first N requests")] = None,
    warmup: Annotated[float, typer.Option("--warmup", min=0, help="seconds not measured")] = 60.0,
    duration: Annotated[float | None, typer.Option(
        "--duration", min=1, help="seconds measured (offline default 600; online: until done)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of lengths, arrivals and random routing")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, _cli.output_option("-o", "--output", help="write the JSON here")] = None,
) -> None:
    """Simulate requests on a placement: throughput, prompt and decode latency, utilisation."""
    from shoal.files import check_outputs, write_json
    from shoal.serving import workload as wl
    from shoal.serving.simulator import SimOptions, simulate

    check_outputs([(output, "--output")], [serving, placement, lengths, arrivals, trace])
    if trace is not None and mode is Mode.offline:
        raise SpecError("a trace's requests come at its own times: an online run",
                        field="--mode", value="offline", allowed="online, with --trace")
    online = mode is Mode.online or trace is not None
    _cli.only_with("--mode online", online, ("--arrivals", arrivals), ("--load", load),
                   ("--requests", requests))
    _cli.only_with("offline runs (without --trace)", not online, ("--concurrency", concurrency))
    cluster = _load(serving)
    placed = _placement(cluster, placement)
    if trace is not None:
        work = _trace(trace, lengths=lengths, arrivals=arrivals, load=load)
        if requests is not None:
            work = wl.Workload(work.prompt[:requests], work.output[:requests],
                               work.arrival_s[:requests], work.source)
        dur = duration
    else:
        L = wl.load_lengths(lengths) if lengths is not None else wl.synthetic_lengths(20000, seed)
        src = lengths.name if lengths is not None else "synthetic lengths"
        if not online:
            work = wl.offline(L, seed, src)
            dur = duration if duration is not None else 600.0
        else:
            rate = (0.75 if load is None else load) * placed.flow.value / float(
                L.sum(axis=1).mean())
            if arrivals is not None:
                work = wl.online(L, wl.load_arrivals(arrivals), rate, seed, arrivals.name,
                                 limit=requests)
            else:
                work = wl.poisson(L, rate, requests or 2000, seed)
            dur = duration
    if as_json:
        res = simulate(cluster, placed.placement, placed.flow, work, SimOptions(router=router.value,
                       warmup_s=warmup, duration_s=dur, seed=seed, batching=batching,
                       concurrency=concurrency))
    else:
        from rich.progress import Progress

        with Progress(console=_cli._progress(), transient=True) as bar:
            task = bar.add_task(f"simulating {work.source}", total=None)

            def tick(t, end, completed):
                bar.update(task, completed=t, total=end,
                           description=f"simulating: {t:,.0f} s, {completed} requests done")

            res = simulate(cluster, placed.placement, placed.flow, work, SimOptions(router=router.value,
                           warmup_s=warmup, duration_s=dur, seed=seed, progress=tick,
                           batching=batching, concurrency=concurrency))
    doc = res.to_json(cluster.names)
    doc["max_flow_tokens_per_s"] = placed.flow.value
    doc["workload"] = work.source
    if output is not None:
        write_json(output, doc)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out = _cli._out()

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.2f} / {d['p50']:.2f} / {d['p95']:.2f}"

    t = _cli._table(f"Simulated {res.mode}, router {res.router}, {res.window_s:,.0f} s measured "
                    f"({work.source})", ["metric", "value"], left=("metric",))
    t.add_row("decode throughput, tokens/s", f"{res.decode_tokens_per_s:,.1f}")
    t.add_row("prompt + decode tokens/s", f"{res.tokens_per_s:,.1f}")
    t.add_row("max flow of the placement, tokens/s", f"{placed.flow.value:,.1f}")
    t.add_row("prompt latency s (mean / p50 / p95)", lat(res.prompt_latency_s))
    t.add_row("decode latency s/token (mean / p50 / p95)", lat(res.decode_latency_s))
    t.add_row("requests completed / had to wait for KV room", f"{res.completed} / {res.waited}")
    used = [u for u in res.node_utilization if u > 0]
    if used:
        t.add_row("node utilisation (min / mean / max)",
                  f"{min(used):.0%} / {sum(used) / len(used):.0%} / {max(used):.0%}")
    t.add_row("simulated in", f"{res.wall_s:.1f} s ({res.events:,} events)")
    out.print(t)
    for w in res.warnings:
        out.print(f"[yellow]warning:[/yellow] {w}")
    if output is not None:
        out.print(f"result written to {output}")


@serve_app.command("run")
@_cli.handles_errors
def run_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path | None, typer.Option(
        "--placement", help="placement JSON or Helix .ini (default: place with auto)")] = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="model to run (default: the serving file's; e.g. tiny on a CPU)")] = None,
    requests: Annotated[int, typer.Option("--requests", min=1, help="requests to serve")] = 16,
    rate: Annotated[float | None, typer.Option(
        "--rate", min=0.001, help="Poisson arrivals per second (default: all at once)")] = None,
    lengths: Annotated[Path | None, typer.Option(
        "--lengths", help="CSV input_tokens,output_tokens (default: seeded synthetic lengths)")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="CSV arrival_s,input_tokens,output_tokens: replay these requests "
                        "(the same file serve simulate --trace reads)")] = None,
    max_new: Annotated[int | None, typer.Option(
        "--max-new", min=1, help="at most this many generated tokens per request")] = None,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, help="seconds a request may take from its arrival")] = 600.0,
    start_timeout: Annotated[float, typer.Option(
        "--start-timeout", min=1, help="seconds to wait for every worker, here and on the "
                                       "hosts the serving file names, to start")] = 120.0,
    restarts: Annotated[int, typer.Option(
        "--restarts", min=0, help="times a worker this machine started is started again after "
                                  "it dies (0: never; it is routed around)")] = 3,
    http: Annotated[str | None, typer.Option(
        "--http", metavar="[HOST:]PORT",
        help="serve an OpenAI-style /v1/completions endpoint here until interrupted "
             "(instead of the generated requests)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of weights, prompts and arrivals")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, _cli.output_option("-o", "--output", help="write the JSON here")] = None,
) -> None:
    """Run a placement for real on this machine: one worker process per node holding its layers,
    the coordinator routing each request along its chain; the simulator's metrics, measured."""
    from shoal import catalog
    from shoal.files import check_outputs, write_json
    from shoal.runtime.serve import live, traffic
    from shoal.serving import workload as wl

    check_outputs([(output, "--output")], [serving, placement, lengths, trace])
    if dtype not in ("float32", "float64"):
        raise SpecError("unknown dtype", field="--dtype", value=dtype, allowed="float32, float64")
    cluster = _load(serving)
    placed = _placement(cluster, placement)
    if placed.flow.value <= 0:  # no request could be served: refused before any worker starts
        from shoal.errors import InfeasibleError
        from shoal.serving.placers import no_flow_reason

        why, fix = no_flow_reason(cluster, placed.placement)
        raise InfeasibleError(f"the placement serves nothing ({why})", binding="placement",
                              relaxation=fix)
    from shoal.specs.serving import load_serving

    name = model or load_serving(serving).model.name
    spec = catalog.models().get(name, field="--model" if model else "model.name",
                                file=None if model else str(serving))
    if trace is not None:
        work = _trace(trace, lengths=lengths, rate=rate)
    else:
        work = traffic.workload(spec, requests, rate=rate, max_new=max_new, seed=seed,
                                lengths=wl.load_lengths(lengths) if lengths is not None else None)
    reqs = traffic.requests_from(work, spec, seed)
    host, port = "127.0.0.1", None
    if http is not None:
        h, _, p = http.rpartition(":")
        try:
            host, port = (h or host), int(p)
        except ValueError:
            raise SpecError("expected [HOST:]PORT", field="--http", value=http) from None
        if not 0 <= port <= 65535:
            raise SpecError("no such port", field="--http", value=http, allowed="0-65535")
        if output is not None:
            raise SpecError("an --http server writes no result file: it answers requests until "
                            "stopped", field="--output", value=str(output))
        _check_port(host, port)
    held = [i for i, r in enumerate(placed.placement.ranges) if r is not None]
    far = [cluster.names[i] for i in held if cluster.hosts[i] is not None]
    with _cli._progress().status(
            f"starting {len(held) - len(far)} workers"
            + (f"; waiting for {len(far)} on other hosts (shoal serve worker {serving} --node "
               f"NAME): {', '.join(far)}" if far else "")) if not as_json else _null():
        server = live.LiveServer(cluster, placed.placement, placed.flow, spec, live.LiveOptions(
            seed=seed, dtype=dtype, start_timeout_s=start_timeout, restarts=restarts))
    if port is not None:
        _serve_http(server, host, port, spec, timeout, as_json)
        return
    try:
        with _cli._progress().status(f"serving {len(reqs)} requests") if not as_json else _null():
            server.run(reqs, timeout_s=timeout)
    finally:
        server.close()
    health = server.health
    doc = traffic.summary(reqs, server.wall_s) | {
        "model": spec.name, "max_flow_tokens_per_s": placed.flow.value,
        "workers": {n: {k: w[k] for k in ("state", "restarts", "dropped_messages")}
                    for n, w in health["workers"].items()},
        "dropped_messages": health["dropped_messages"],
        "generated": [{"request": r.rid, "tokens": r.tokens, "chain": r.chain[:-1],
                       "runs": r.attempt + 1, "rejected": r.rejected} for r in reqs]}
    if output is not None:
        write_json(output, doc)
    if as_json:
        typer.echo(json.dumps(doc))
        return

    def lat(d):
        return "—" if d["mean"] is None else f"{d['mean']:.3f} / {d['p50']:.3f} / {d['p95']:.3f}"

    t = _cli._table(f"Served {len(reqs)} requests of {spec.name} on "
                    f"{len(server.workers)} workers in {server.wall_s:.2f} s",
                    ["metric", "value"], left=("metric",))
    t.add_row("decode throughput, tokens/s", f"{doc['decode_throughput_tokens_per_s']:,.1f}")
    t.add_row("prompt + decode tokens/s", f"{doc['tokens_per_s']:,.1f}")
    t.add_row("prompt latency s (mean / p50 / p95)", lat(doc["prompt_latency_s"]))
    t.add_row("decode latency s/token (mean / p50 / p95)", lat(doc["decode_latency_s"]))
    t.add_row("requests completed / rejected",
              f"{doc['requests']['completed']} / {doc['requests']['rejected']}")
    chains: dict[str, int] = {}
    for r in reqs:
        if r.chain:
            key = " -> ".join(r.chain[:-1])
            chains[key] = chains.get(key, 0) + 1
    t.add_row("chains used", "; ".join(f"{k} ({n})" for k, n in sorted(chains.items())))
    _cli._out().print(t)
    for why, n in doc["requests"]["rejected_why"].items():
        _cli._out().print(f"rejected ({n}): {why}")
    again = [f"{n} ({w['restarts']}x, now {w['state']})" for n, w in doc["workers"].items()
             if w["restarts"]]
    if again:
        _cli._out().print("workers started again after they died: " + ", ".join(again))
    dropped = doc["dropped_messages"] + sum(w["dropped_messages"] for w in doc["workers"].values())
    if dropped:
        _cli._out().print(f"{dropped} malformed messages dropped (coordinator and workers)")
    if output is not None:
        _cli._out().print(f"result written to {output}")


@serve_app.command("worker")
@_cli.handles_errors
def worker_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    node: Annotated[str, typer.Option("--node", help="the node this worker runs: a node name "
                                                     "of the serving file with a 'host'")],
    bind: Annotated[str | None, typer.Option(
        "--bind", help="interface to listen on (default: the node's host; e.g. 0.0.0.0 "
                       "behind NAT)")] = None,
) -> None:
    """Run one node's worker on this machine for `shoal serve run` on another: it reaches the
    coordinator at the serving file's coordinator.address, gets its layers from it, serves until
    the coordinator stops it, then exits."""
    from shoal.runtime.serve.worker import worker_main

    cluster = _load(serving)
    try:
        i = cluster.index(node)
    except SpecError as exc:
        raise exc.located(str(serving), "--node") from None
    host = cluster.hosts[i]
    if host is None:
        raise SpecError("this node has no 'host': shoal serve run starts its worker itself",
                        file=str(serving), field="nodes", value=node,
                        allowed=", ".join(n for n, h in zip(cluster.names, cluster.hosts,
                                                            strict=True) if h) or "none")
    coord = "tcp://" + cluster.coordinator_address
    out = _cli._out()
    out.print(f"node {node}: waiting for the coordinator at {coord}")
    try:
        why = worker_main(node, coord, bind or host, advertise=host, with_parent=False)
    except KeyboardInterrupt:
        raise _cli._fail(f"node {node}: interrupted", 130) from None
    if why is not None:
        raise _cli._fail(f"node {node} stopped: {why}", 1)
    out.print(f"node {node}: stopped by the coordinator")


@serve_app.command("profile")
@_cli.handles_errors
def profile_cmd(
    model: Annotated[str, typer.Option("--model", help="model to measure (e.g. tiny)")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="folder to write the profile into")],
    context: Annotated[int | None, typer.Option(
        "--context", min=1, help="cached tokens per request while decode steps are timed "
                                 "(default: a quarter of the model's context)")] = None,
    reps: Annotated[int, typer.Option("--reps", min=1, help="repeats per measurement")] = 5,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    seed: Annotated[int, typer.Option(min=0, help="seed of the weights")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Measure per-layer prompt and decode times and the hop between processes with serve run's
    own workers: Helix's prompt_bs2time.csv and decode_bs2time.csv (a machine's 'profile:') and
    links.json (latency and bandwidth for the serving file's links; host_cores, host_share and
    wake for its top level)."""
    from dataclasses import asdict

    from shoal import catalog
    from shoal.runtime.serve.profile import measure

    if dtype not in ("float32", "float64"):
        raise SpecError("unknown dtype", field="--dtype", value=dtype, allowed="float32, float64")
    from shoal.files import check_folder

    spec = catalog.models().get(model, field="--model")
    if context is not None and context >= spec.max_seq_len:
        raise SpecError(f"more cached tokens than {spec.name}'s context of {spec.max_seq_len} "
                        "leaves room for", field="--context", value=context,
                        allowed=f"1 to {spec.max_seq_len - 1}")
    check_folder(out_dir, "--out")
    with _cli._progress().status(f"measuring {spec.name}") if not as_json else _null():
        prof = measure(spec, reps=reps, seed=seed, dtype=dtype, context=context)
    paths = prof.write(out_dir)
    if as_json:
        typer.echo(json.dumps({"model": spec.name, "files": [str(p) for p in paths]}
                              | asdict(prof)))
        return
    t = _cli._table(f"{spec.name}: seconds per layer, measured ({dtype})",
                    ["what", "x", "ms per layer"], left=("what",))
    for n, v in zip(prof.prompt_tokens, prof.prompt_s_per_layer, strict=True):
        t.add_row("prompt, tokens", str(n), f"{v * 1e3:.4f}")
    for n, v in zip(prof.decode_batch, prof.decode_s_per_layer, strict=True):
        t.add_row(f"decode at {prof.context} cached, batch", str(n), f"{v * 1e3:.4f}")
    _cli._out().print(t)
    _cli._out().print(
        f"hop between processes: {prof.link_latency_s * 1e6:.0f} us + bytes / "
        f"{prof.link_bandwidth_Bps / 1e9:.2f} GB/s ({prof.activation_bytes} B per token); "
        f"coordinator {prof.coordinator_s * 1e6:.0f} us per token")
    _cli._out().print(
        "each of k processes at once, speed against one alone: "
        + ", ".join(f"k={k} {v:.2f}" for k, v in enumerate(prof.host_share, 1)))
    w = prof.wake
    _cli._out().print(
        "after idle " + ", ".join(f"{g * 1e3:g} ms" for g in w["gap_s"]) + ": message +"
        + ", ".join(f"{v * 1e3:.2f}" for v in w["hop_s"]) + " ms; prompt step +"
        + ", ".join(f"{v * 1e3:.2f}" for v in w["prompt_s_per_layer"]) + " ms per layer; decode "
        "step +" + ", ".join(f"{v * 1e3:.2f}" for v in w["decode_s_per_layer"])
        + " ms per layer")
    _cli._out().print(f"written to {out_dir}/: " + ", ".join(p.name for p in paths))


def _serve_http(server, host: str, port: int, spec, timeout: float, as_json: bool) -> None:
    import signal
    import time

    from shoal.runtime.serve.http import Endpoint

    def interrupt(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)  # a terminated server stops its workers too

    try:
        try:
            ep = Endpoint(server, host, port, timeout_s=timeout)
        except OSError as exc:
            raise SpecError(f"cannot listen on {host}:{port} ({exc.strerror})",
                            field="--http") from None
        # the address goes to stderr and is always printed: a caller needs it even with --quiet
        url = f"http://{host}:{ep.port}/v1/completions"
        _cli._err().print(f"serving {spec.name} on {url} ({len(server.workers)} workers); "
                          "Ctrl-C stops")
        if as_json:  # one line a caller can read the address from, as soon as it serves
            typer.echo(json.dumps({"serving": url, "model": spec.name,
                                   "workers": len(server.workers)}))
            sys.stdout.flush()
        try:
            told = False
            while True:
                time.sleep(1)
                if ep.failure is not None and not told:  # /health says it too, with a 503
                    _cli._err().print(f"error: {ep.failure}; every request is answered 503",
                                      soft_wrap=True)
                    told = True
        except KeyboardInterrupt:
            pass
        ep.close()
    finally:
        server.close()


def _null():
    import contextlib

    return contextlib.nullcontext()


def import_helix_cmd(
    cluster: Annotated[Path, typer.Option("--cluster", help="Helix cluster INI file")],
    machines: Annotated[Path, typer.Option("--machines", help="Helix machine_profiles.ini")],
    capacity: Annotated[Path, typer.Option(
        "--capacity", help="node capacity tables T(k) (node_capacity.json format)")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="directory to write into")],
    model: Annotated[str | None, typer.Option(
        "--model", help="which model's table, when the capacity file has several")] = None,
    placement: Annotated[Path | None, typer.Option(
        "--placement", help="also convert a Helix solution file to placement.json")] = None,
    partial_inference: Annotated[bool, typer.Option(
        "--partial-inference", help="allow a node to start inside the previous node's range")] = False,
    profiles: Annotated[Path | None, typer.Option(
        "--profiles", help="folder of <type>/{prompt,decode}_bs2time.csv layer times (for "
                           "`serve simulate`)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a shoal serving file (and placement) from Helix's files."""
    import yaml

    from shoal.files import check_folder, write_json, write_text
    from shoal.io.helix import import_helix, read_placement
    from shoal.serving.cluster import build_cluster
    from shoal.specs.serving import parse_serving

    check_folder(out_dir, "--out")
    doc = import_helix(cluster=cluster, machines=machines, capacity=capacity, model=model,
                       partial_inference=partial_inference, profiles=profiles)
    cl = build_cluster(parse_serving(doc, file=str(cluster)), file=str(cluster))
    pl = read_placement(placement, cl) if placement is not None else None
    out_dir.mkdir(exist_ok=True)
    written = {}
    written["serving"] = write_text(out_dir / "serving.yaml", yaml.safe_dump(doc, sort_keys=False))
    warnings = []
    if pl is not None:
        written["placement"] = write_json(out_dir / "placement.json", pl.to_json(cl))
        gaps = pl.uncovered_text(cl)
        if gaps:  # Helix's own solutions cover every layer: a file that does not serves nothing
            warnings.append(f"the placement leaves layers {gaps} on no node: it serves nothing")
    for w in warnings:
        _cli._err().print(f"warning: {w}", soft_wrap=True)
    if as_json:
        typer.echo(json.dumps({"written": {k: str(v) for k, v in written.items()},
                               "warnings": warnings}))
        return
    t = _cli._table("Written", ["file", "path"], left=("file", "path"))
    for name, path in written.items():
        t.add_row(name, str(path))
    _cli._out().print(t)
