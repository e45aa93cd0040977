"""``shoal serve plan`` and ``shoal serve flow``: a placement of the model's layers on the nodes,
found or given, its max flow and what it serves (simulated)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.choices import Objective, Placer, choice_option
from shoal.cli.common import _out, emit_json, handles_errors, only_with, output_option, show
from shoal.cli.helptext import examples
from shoal.cli.serve.inputs import given_placement, load_cluster, status
from shoal.errors import SpecError
from shoal.report import serve_tables as tables


@handles_errors
@examples(
    "shoal serve plan examples/llama2-70b-mixed.serving.yaml -o placement.json --figure placement.png",
    "shoal serve plan examples/llama2-70b-mixed.serving.yaml --placer milp --time-limit 30 "
        "--helix-out placement.ini",
)
def plan_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placer: Annotated[Placer, choice_option(Placer, help="placement algorithm: {choices}")] = Placer.auto,
    objective: Annotated[Objective | None, choice_option(
        Objective, help="auto only: decode (default where the nodes have layer times), the "
                        "simulated decode throughput; or max-flow, Helix's objective",
        show_default=False)] = None,
    lengths: Annotated[Path | None, typer.Option(
        "--lengths", help="request lengths to simulate, CSV: input_tokens, output_tokens "
                          "(default: seeded synthetic ones)")] = None,
    time_limit: Annotated[float, typer.Option(
        "--time-limit", min=0.1, metavar="SECONDS", help="the placer's time limit in seconds")] = 60.0,
    seed: Annotated[int | None, typer.Option(
        min=0, help="petals' node order (auto and milp start from it too; default: 0)")] = None,
    prune: Annotated[int | None, typer.Option(
        min=0, help="milp: keep each node's fastest N links (0: all; default: 12)")] = None,
    warm_start: Annotated[bool, typer.Option(
        "--warm-start/--cold", help="milp: start from the best baseline placement")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option(
        "-o", "--output", help="write the placement here (JSON, for --placement)")] = None,
    helix_out: Annotated[Path | None, output_option(
        "--helix-out", help="also write the placement in Helix's solution format")] = None,
    figure: Annotated[Path | None, output_option("--figure", help="draw the placement")] = None,
) -> None:
    """Place the model's layers on the nodes: the placement, its max flow and what it serves.

    By default for the most decode tokens/s the request simulator serves (or, with --objective
    max-flow, the largest max flow); reports what the placement serves next to its max flow,
    and what binds (or, with --json, one JSON object). -o writes the placement, which serve
    flow, simulate and run take as --placement."""
    from shoal.files import check_outputs
    from shoal.serving.placers import MilpOptions, place, with_served

    check_outputs([(output, "--output"), (helix_out, "--helix-out"), (figure, "--figure")],
                  [serving, lengths])
    only_with("--placer milp", placer is Placer.milp, ("--prune", prune),
              ("--cold", None if warm_start else "--cold"))
    only_with("--placer auto, milp or petals", placer not in (Placer.swarm, Placer.separate),
              ("--seed", seed))
    seed = 0 if seed is None else seed
    prune = 12 if prune is None else prune
    cluster = load_cluster(serving)
    L = _lengths(cluster, lengths)
    kw = dict(time_limit_s=time_limit, seed=seed,
              objective=objective.value if objective is not None else None, lengths=L,
              milp_options=MilpOptions(prune=prune, warm_start=warm_start))
    with status(f"placing {cluster.layers} layers on {cluster.n} nodes "
                f"({placer.value}, up to {time_limit:g} s)", as_json or time_limit < 1):
        placed = place(cluster, placer.value, **kw)
    placed = with_served(cluster, placed, L, seed)
    _report(cluster, placed, as_json, (output, helix_out, figure))


@handles_errors
@examples(
    "shoal serve plan examples/llama2-70b-mixed.serving.yaml -o placement.json",
    "shoal serve flow examples/llama2-70b-mixed.serving.yaml --placement placement.json --figure flow.png",
)
def flow_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path, typer.Option("--placement", help="placement JSON (or Helix .ini)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    figure: Annotated[Path | None, output_option("--figure", help="draw the placement")] = None,
) -> None:
    """The max flow (tokens/s) of a given placement and the flow on every link.

    Also what the placement serves (simulated) and what binds. Prints tables (or, with --json,
    one JSON object); writes nothing unless --figure names a figure."""
    from shoal.files import check_outputs
    from shoal.serving.placers import with_served

    check_outputs([(figure, "--figure")], [serving, placement])
    cluster = load_cluster(serving)
    _report(cluster, with_served(cluster, given_placement(cluster, placement)), as_json,
            (None, None, figure), links=True)


def _lengths(cluster, lengths: Path | None):
    """The request lengths of ``--lengths`` (None: not given), which only a cluster the
    simulator can run takes."""
    if lengths is None:
        return None
    from shoal.serving.served import simulatable
    from shoal.serving.workload import load_lengths

    if not simulatable(cluster):
        raise SpecError("request lengths are simulated, which needs layer times and memory "
                        "for every node", field="--lengths", value=str(lengths),
                        allowed="machines with a 'profile' or a catalog 'gpu'")
    return load_lengths(lengths)


def _placed_json(cluster, placed) -> dict:
    """``serve plan --json`` and ``serve flow --json``: the placer's result and the placement
    with its max flow and the flow on every link."""
    flows = [{"from": cluster.names[u] if isinstance(u, int) else u,
              "to": cluster.names[v] if isinstance(v, int) else v, "tokens_per_s": f}
             for (u, v), f in sorted(placed.flow.edges.items(), key=str)]
    pl = placed.placement.to_json(cluster)
    pl["max_flow_tokens_per_s"] = placed.flow.value
    pl["flows"] = flows
    return {"placer": placed.placer, "solve_time_s": placed.solve_time_s,
            "max_flow_tokens_per_s": placed.flow.value,
            "upper_bound_tokens_per_s": placed.upper_bound,
            "gap_to_upper_bound": 1.0 - placed.flow.value / placed.upper_bound,
            "served": placed.served.to_json() if placed.served is not None else None,
            "nodes_used": sum(r is not None for r in placed.placement.ranges),
            "layers_on_no_node": [list(r) for r in placed.placement.uncovered(cluster)],
            "details": placed.details, "placement": pl}


def _report(cluster, placed, as_json: bool, outputs: tuple, links: bool = False) -> None:
    """Write the ``outputs`` given (--output, --helix-out, --figure; None: not given), then
    print the result: as JSON, or as tables (``links``: with the flow on every link)."""
    doc = _placed_json(cluster, placed)
    _write(cluster, placed, doc, *outputs)
    if as_json:
        emit_json(doc)
        return
    _print_placed(cluster, placed, doc, links)
    for path, what in zip(outputs, ("placement", "placement (Helix format)", "figure"),
                          strict=True):
        if path is not None:
            show(f"{what} written to {path}")


def _write(cluster, placed, doc: dict, output: Path | None, helix_out: Path | None,
           figure: Path | None) -> None:
    if output is not None:
        from shoal.files import write_json

        write_json(output, doc["placement"])
    if helix_out is not None:
        from shoal.files import write_text
        from shoal.io.helix import write_placement

        write_text(helix_out, write_placement(placed.placement, cluster))
    if figure is not None:
        from shoal.report.figures import draw_placement

        draw_placement(doc, figure)


def _print_placed(cluster, placed, doc: dict, links: bool) -> None:
    """The placement, the auto placer's candidates, what it serves and what binds, the flow on
    its links (``links``), its idle nodes, and why nothing gets through when nothing does."""
    show(tables.placement_table(cluster, placed))
    if placed.details.get("candidates"):
        show(tables.candidates_table(placed.details["candidates"]))
    if placed.served is not None:
        show(tables.served_table(placed))
        _out().print(f"binding: {placed.served.binding['text']}")
    elif "serves_nothing" in placed.details:
        _out().print(f"simulated, the placement serves nothing: {placed.details['serves_nothing']}")
    if links:
        show(tables.links_table(doc["placement"]["flows"]))
    idle = [cluster.names[i] for i, r in enumerate(placed.placement.ranges) if r is None]
    if idle:
        show(f"{len(idle)} node(s) hold no layers: {', '.join(idle)}")
    if placed.flow.value <= 0:
        from shoal.serving.placers import no_flow_reason

        why, fix = no_flow_reason(cluster, placed.placement)
        show(f"the max flow is 0: {why}; {fix}")
