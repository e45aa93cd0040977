"""``shoal serve run`` and ``shoal serve worker``: a placement run for real, one worker process
per node, on this machine and on the hosts the serving file names; answering generated requests
or, with ``--http``, an OpenAI-style endpoint."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _err, _fail, _out, emit_json, handles_errors, output_option, show, with_meta
from shoal.cli.helptext import examples
from shoal.cli.serve.inputs import check_dtype, given_placement, load_cluster, status, trace_workload
from shoal.errors import SpecError
from shoal.report import serve_tables as tables


@handles_errors
@examples(
    "# serving.yaml: nodes for the 4-block tiny model on a CPU (docs/serving.md)",
    "shoal serve run serving.yaml --model tiny --requests 8",
    "shoal serve run serving.yaml --placement placement.json --model tiny --rate 4 -o served.json",
    "shoal serve run serving.yaml --model tiny --http 8000",
)
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
        "--lengths", help="CSV: input_tokens, output_tokens (default: seeded synthetic lengths)")] = None,
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="CSV: arrival_s (seconds), input_tokens, output_tokens: replay these "
                        "requests (the file serve simulate --trace reads)")] = None,
    max_new: Annotated[int | None, typer.Option(
        "--max-new", min=1, help="at most this many generated tokens per request")] = None,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    timeout: Annotated[float, typer.Option(
        "--timeout", min=1, metavar="SECONDS", help="seconds a request may take from its arrival")] = 600.0,
    start_timeout: Annotated[float, typer.Option(
        "--start-timeout", min=1, metavar="SECONDS",
        help="seconds every worker (here and on the serving file's hosts) may take to start")] = 120.0,
    restarts: Annotated[int, typer.Option(
        "--restarts", min=0, help="times a worker this machine started is started again after "
                                  "it dies (0: never; it is routed around)")] = 3,
    http: Annotated[str | None, typer.Option(
        "--http", metavar="[HOST:]PORT", help="instead: answer OpenAI-style /v1/completions "
                                              "requests here until interrupted")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of weights, prompts and arrivals")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option(
        "-o", "--output", help="write the result here (the JSON --json prints; not with --http)")] = None,
) -> None:
    """Run a placement for real on this machine: one worker process per node holding its layers,
    the coordinator routing each request along its chain; the simulator's metrics, measured.

    With --http, answers requests until interrupted instead. Without --placement, places the
    layers with auto first. Needs PyTorch."""
    from shoal.files import check_outputs
    from shoal.runtime.serve import live, traffic
    from shoal.serving import workload as wl
    from shoal.serving.placers import check_serves

    check_outputs([(output, "--output")], [serving, placement, lengths, trace])
    check_dtype(dtype)
    cluster = load_cluster(serving)
    placed = given_placement(cluster, placement)
    check_serves(cluster, placed)  # no request could be served: refused before any worker starts
    spec = _model(serving, model)
    if trace is not None:
        work = trace_workload(trace, lengths=lengths, rate=rate)
    else:
        work = traffic.workload(spec, requests, rate=rate, max_new=max_new, seed=seed,
                                lengths=wl.load_lengths(lengths) if lengths is not None else None)
    reqs = traffic.requests_from(work, spec, seed)
    address = _http_address(http, output) if http is not None else None
    opts = live.LiveOptions(seed=seed, dtype=dtype, start_timeout_s=start_timeout,
                            restarts=restarts)
    server = _start(serving, cluster, placed, spec, opts, as_json)
    if address is not None:
        _serve_http(server, *address, spec, timeout, as_json)
        return
    try:
        with status(f"serving {len(reqs)} requests", as_json):
            server.run(reqs, timeout_s=timeout)
    finally:
        server.close()
    doc = traffic.result(reqs, server.wall_s, model=spec.name, max_flow=placed.flow.value,
                         health=server.health)
    if output is not None:
        from shoal.files import write_json

        write_json(output, with_meta(doc))
    if as_json:
        emit_json(doc)
        return
    show(tables.live_table(doc, len(reqs), len(server.workers), traffic.chains_used(reqs)),
         *tables.live_lines(doc))
    if output is not None:
        show(f"result written to {output}")


@handles_errors
@examples(
    "# on the host the serving file gives node c (docs/serving.md)",
    "shoal serve worker serving.yaml --node c",
    "shoal serve worker serving.yaml --node c --bind 0.0.0.0",
)
def worker_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    node: Annotated[str, typer.Option("--node", help="the node this worker runs: a node name "
                                                     "of the serving file with a 'host'")],
    bind: Annotated[str | None, typer.Option(
        "--bind", help="interface to listen on (default: the node's host; e.g. 0.0.0.0 "
                       "behind NAT)")] = None,
) -> None:
    """Run one node's worker on this machine for `shoal serve run` on another.

    It reaches the coordinator at the serving file's coordinator.address, gets its layers from
    it, serves until the coordinator stops it, then exits. Writes no file."""
    from shoal.runtime.serve.worker import worker_main

    cluster = load_cluster(serving)
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
    out = _out()
    out.print(f"node {node}: waiting for the coordinator at {coord}")
    try:
        why = worker_main(node, coord, bind or host, advertise=host, with_parent=False)
    except KeyboardInterrupt:
        raise _fail(f"node {node}: interrupted", 130) from None
    if why is not None:
        raise _fail(f"node {node} stopped: {why}", 1)
    out.print(f"node {node}: stopped by the coordinator")


def _model(serving: Path, model: str | None):
    """The catalog model to run: ``--model``, or the serving file's."""
    from shoal import catalog
    from shoal.specs.serving import load_serving

    name = model or load_serving(serving).model.name
    return catalog.models().get(name, field="--model" if model else "model.name",
                                file=None if model else str(serving))


def _http_address(http: str, output: Path | None) -> tuple[str, int]:
    """``--http [HOST:]PORT`` as a host (default 127.0.0.1) and a port that can be listened on
    now; an --http server writes no ``--output``."""
    h, _, p = http.rpartition(":")
    try:
        host, port = (h or "127.0.0.1"), int(p)
    except ValueError:
        raise SpecError("expected [HOST:]PORT", field="--http", value=http) from None
    if not 0 <= port <= 65535:
        raise SpecError("no such port", field="--http", value=http, allowed="0-65535")
    if output is not None:
        raise SpecError("an --http server writes no result file: it answers requests until "
                        "stopped", field="--output", value=str(output))
    _check_port(host, port)
    return host, port


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


def _start(serving: Path, cluster, placed, spec, opts, as_json: bool):
    """The live server with every worker started: this machine's, and those on other hosts
    (``shoal serve worker``) waited for."""
    from shoal.runtime.serve.live import LiveServer

    held = [i for i, r in enumerate(placed.placement.ranges) if r is not None]
    far = [cluster.names[i] for i in held if cluster.hosts[i] is not None]
    with status(f"starting {len(held) - len(far)} workers"
                + (f"; waiting for {len(far)} on other hosts (shoal serve worker {serving} "
                   f"--node NAME): {', '.join(far)}" if far else ""), as_json):
        return LiveServer(cluster, placed.placement, placed.flow, spec, opts)


def _serve_http(server, host: str, port: int, spec, timeout: float, as_json: bool) -> None:
    """Answer /v1/completions on ``host:port`` until interrupted (Ctrl-C or SIGTERM), then stop
    the workers."""
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
        _err().print(f"serving {spec.name} on {url} ({len(server.workers)} workers); "
                     "Ctrl-C stops")
        if as_json:  # one line a caller can read the address from, as soon as it serves
            emit_json({"serving": url, "model": spec.name, "workers": len(server.workers)})
            sys.stdout.flush()
        try:
            told = False
            while True:
                time.sleep(1)
                if ep.failure is not None and not told:  # /health says it too, with a 503
                    _err().print(f"error: {ep.failure}; every request is answered 503",
                                 soft_wrap=True)
                    told = True
        except KeyboardInterrupt:
            pass
        ep.close()
    finally:
        server.close()
