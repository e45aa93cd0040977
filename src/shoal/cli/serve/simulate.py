"""``shoal serve simulate``: requests simulated on a placement, offline or online."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.choices import Mode, RouterName, choice_option
from shoal.cli.common import (
    _out,
    _progress,
    emit_json,
    handles_errors,
    only_with,
    output_option,
    show,
    with_meta,
)
from shoal.cli.helptext import examples
from shoal.cli.serve.inputs import given_placement, load_cluster, trace_workload
from shoal.errors import SpecError
from shoal.report.serve_tables import simulated_table

OFFLINE_DURATION_S = 600.0  # seconds measured offline when no --duration is given


@handles_errors
@examples(
    "# placement.json: written by serve plan -o",
    "shoal serve simulate examples/llama2-70b-mixed.serving.yaml --placement placement.json --duration 300",
    "shoal serve simulate examples/llama2-70b-mixed.serving.yaml --mode online --load 0.5 "
        "--router shortest-queue -o simulated.json",
)
def simulate_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path | None, typer.Option(
        "--placement", help="placement JSON or Helix .ini (default: place with auto)")] = None,
    mode: Annotated[Mode | None, choice_option(
        Mode, metavar="MODE",
        help="offline (default): keep the cluster busy (Helix's KV feeder, or --concurrency); "
             "online (with --trace, always): arrivals", show_default=False)] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", min=1, help="offline: this many requests in flight (as Helix runs its "
                                     "baseline routers) instead of the KV feeder")] = None,
    router: Annotated[RouterName, choice_option(
        RouterName, help="per-request routing: {choices}")] = RouterName.iwrr,
    lengths: Annotated[Path | None, typer.Option(
        "--lengths", help="CSV: input_tokens, output_tokens (default: seeded synthetic lengths)")] = None,
    arrivals: Annotated[Path | None, typer.Option(
        "--arrivals", help="online: CSV: interval, requests (per 3 s interval; default: Poisson)")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="online: CSV: arrival_s (seconds), input_tokens, output_tokens, a row "
                        "per request (instead of --lengths, --arrivals and --load)")] = None,
    batching: Annotated[str, typer.Option(
        "--batching", metavar="NAME", help="vllm: as vLLM 0.4 (Helix's engine); live: as serve "
                                           "run's workers (one request's step at a time, in "
                                           "arrival order)")] = "vllm",
    load: Annotated[float | None, typer.Option(
        "--load", min=0.01, help="online: arrivals at this fraction of the max flow (default: 0.75)")] = None,
    requests: Annotated[int | None, typer.Option(
        "--requests", min=1, help="online: simulate only the first N requests")] = None,
    warmup: Annotated[float, typer.Option(
        "--warmup", min=0, metavar="SECONDS", help="simulated seconds at the start, not measured")] = 60.0,
    duration: Annotated[float | None, typer.Option(
        "--duration", min=1, metavar="SECONDS",
        help="simulated seconds measured (default: offline 600; online until done)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of lengths, arrivals and random routing")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option(
        "-o", "--output", help="write the result here (the JSON object --json prints)")] = None,
) -> None:
    """Simulate requests on a placement: throughput, prompt and decode latency, utilisation.

    Prints the result (or, with --json, one JSON object); -o writes that JSON object to a file.
    Without --placement, places the layers with auto first."""
    from shoal.files import check_outputs, write_json
    from shoal.serving import workload as wl
    from shoal.serving.simulator import SimOptions

    check_outputs([(output, "--output")], [serving, placement, lengths, arrivals, trace])
    if trace is not None and mode is Mode.offline:
        raise SpecError("a trace's requests come at its own times: an online run",
                        field="--mode", value="offline", allowed="online, with --trace")
    online = mode is Mode.online or trace is not None
    only_with("--mode online", online, ("--arrivals", arrivals), ("--load", load),
              ("--requests", requests))
    only_with("offline runs (without --trace)", not online, ("--concurrency", concurrency))
    cluster = load_cluster(serving)
    placed = given_placement(cluster, placement)
    if trace is not None:
        work = wl.first(trace_workload(trace, lengths=lengths, arrivals=arrivals, load=load),
                        requests)
    else:
        work = wl.generated(lengths, seed, max_flow=placed.flow.value if online else None,
                            load=load, arrivals=arrivals, limit=requests)
    if not online and duration is None:
        duration = OFFLINE_DURATION_S
    opts = SimOptions(router=router.value, warmup_s=warmup, duration_s=duration, seed=seed,
                      batching=batching, concurrency=concurrency)
    res = _simulate(cluster, placed, work, opts, as_json)
    doc = res.to_json(cluster.names)
    doc["max_flow_tokens_per_s"] = placed.flow.value
    doc["workload"] = work.source
    if output is not None:
        write_json(output, with_meta(doc))
    if as_json:
        emit_json(doc)
        return
    show(simulated_table(res, work.source, placed.flow.value))
    for w in res.warnings:
        _out().print(f"[yellow]warning:[/yellow] {w}")
    if output is not None:
        show(f"result written to {output}")


def _simulate(cluster, placed, work, opts, as_json: bool):
    """The simulation of ``work`` on ``placed``, with a progress bar on stderr unless
    ``as_json``."""
    import dataclasses

    from shoal.serving.simulator import simulate

    if as_json:
        return simulate(cluster, placed.placement, placed.flow, work, opts)
    from rich.progress import Progress

    with Progress(console=_progress(), transient=True) as bar:
        task = bar.add_task(f"simulating {work.source}", total=None)

        def tick(t, end, completed):
            bar.update(task, completed=t, total=end,
                       description=f"simulating: {t:,.0f} s, {completed} requests done")

        return simulate(cluster, placed.placement, placed.flow, work,
                        dataclasses.replace(opts, progress=tick))
