"""``shoal serve ...`` and ``shoal import helix``: serving placement on heterogeneous nodes."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from shoal import cli_common as _cli
from shoal.errors import SpecError

serve_app = typer.Typer(no_args_is_help=True,
                        help="Serve a model over heterogeneous nodes: placement and max flow.")


class Placer(StrEnum):
    auto = "auto"
    milp = "milp"
    swarm = "swarm"
    petals = "petals"
    separate = "separate"


def _load(serving: Path):
    from shoal.serving.cluster import build_cluster
    from shoal.serving.spec import load_serving

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
            figure: Path | None) -> None:
    from shoal.files import write_json

    doc = {"placer": placed.placer, "solve_time_s": placed.solve_time_s,
           "max_flow_tokens_per_s": placed.flow.value,
           "upper_bound_tokens_per_s": placed.upper_bound,
           "gap_to_upper_bound": 1.0 - placed.flow.value / placed.upper_bound,
           "nodes_used": sum(r is not None for r in placed.placement.ranges),
           "details": placed.details, "placement": _placement_json(cluster, placed)}
    if output is not None:
        write_json(output, doc["placement"])
    if helix_out is not None:
        from shoal.io.helix import write_placement

        tmp = helix_out.with_name(helix_out.name + ".tmp")
        tmp.write_text(write_placement(placed.placement, cluster))
        tmp.replace(helix_out)
    if figure is not None:
        from shoal.report.figures import draw_placement

        draw_placement(cluster, placed, figure)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out = _cli._out()
    t = _cli._table(f"Placement by {placed.placer}: {placed.flow.value:,.2f} tokens/s "
                    f"(upper bound {placed.upper_bound:,.2f}, {placed.solve_time_s:.2f} s)",
                    ["node", "type", "region", "layers", "tokens/s through", "capacity"],
                    left=("node", "type", "region"), whole=("node", "type"))
    rows = sorted((r, i) for i, r in enumerate(placed.placement.ranges) if r is not None)
    for (s, e), i in rows:
        t.add_row(cluster.names[i], cluster.machines[i], cluster.regions[i], f"[{s}, {e})",
                  f"{placed.flow.through[i]:,.1f}", f"{cluster.T[i, e - s]:,.1f}")
    out.print(t)
    idle = cluster.n - len(rows)
    if idle:
        out.print(f"{idle} node(s) hold no layers")
    for path, what in ((output, "placement"), (helix_out, "placement (Helix format)"),
                       (figure, "figure")):
        if path is not None:
            out.print(f"{what} written to {path}")


@serve_app.command("plan")
@_cli.handles_errors
def plan_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placer: Annotated[Placer, typer.Option(help="placement algorithm")] = Placer.auto,
    time_limit: Annotated[float, typer.Option("--time-limit", min=0.1, help="seconds")] = 60.0,
    seed: Annotated[int, typer.Option(help="seed (petals' node order)")] = 0,
    prune: Annotated[int, typer.Option(
        help="milp: keep each node's fastest N links (0: all)")] = 12,
    warm_start: Annotated[bool, typer.Option(
        "--warm-start/--cold", help="milp: start from the best baseline placement")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, typer.Option("-o", "--output",
                                                help="write the placement (JSON) here")] = None,
    helix_out: Annotated[Path | None, typer.Option(
        "--helix-out", help="also write the placement in Helix's solution format")] = None,
    figure: Annotated[Path | None, typer.Option("--figure", help="write the placement (PNG)")] = None,
) -> None:
    """Place the model's layers on the nodes for the largest max flow (tokens/s)."""
    from shoal.files import check_output
    from shoal.serving.placers import place

    for path, opt in ((output, "--output"), (helix_out, "--helix-out"), (figure, "--figure")):
        if path is not None:
            check_output(path, opt)
    cluster = _load(serving)
    if as_json or time_limit < 1:
        placed = place(cluster, placer.value, time_limit_s=time_limit, seed=seed, prune=prune,
                       warm_start=warm_start)
    else:
        with _cli._err().status(f"placing {cluster.layers} layers on {cluster.n} nodes "
                                f"({placer.value}, up to {time_limit:g} s)"):
            placed = place(cluster, placer.value, time_limit_s=time_limit, seed=seed,
                           prune=prune, warm_start=warm_start)
    _report(cluster, placed, as_json, output, helix_out, figure)


@serve_app.command("flow")
@_cli.handles_errors
def flow_cmd(
    serving: Annotated[Path, typer.Argument(metavar="SERVING", help="serving file (YAML or JSON)")],
    placement: Annotated[Path, typer.Option("--placement", help="placement JSON (or Helix .ini)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    figure: Annotated[Path | None, typer.Option("--figure", help="write the placement (PNG)")] = None,
) -> None:
    """The max flow (tokens/s) of a given placement and the flow on every link."""
    from shoal.files import check_output
    from shoal.serving.flow import max_flow
    from shoal.serving.placement import load_placement
    from shoal.serving.placers import Placed

    if figure is not None:
        check_output(figure, "--figure")
    cluster = _load(serving)
    if placement.suffix.lower() == ".ini":
        from shoal.io.helix import read_placement

        pl = read_placement(placement, cluster)
    else:
        pl = load_placement(placement, cluster)
    placed = Placed("given", pl, max_flow(cluster, pl), cluster.upper_bound(), 0.0)
    _report(cluster, placed, as_json, None, None, figure)


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
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a shoal serving file (and placement) from Helix's files."""
    import yaml

    from shoal.files import write_json
    from shoal.io.helix import import_helix, read_placement
    from shoal.serving.cluster import build_cluster
    from shoal.serving.spec import parse_serving

    if not out_dir.parent.is_dir():
        raise SpecError("the folder to write into does not exist", field="--out", value=str(out_dir))
    doc = import_helix(cluster=cluster, machines=machines, capacity=capacity, model=model,
                       partial_inference=partial_inference)
    cl = build_cluster(parse_serving(doc, file=str(cluster)), file=str(cluster))
    pl = read_placement(placement, cl) if placement is not None else None
    out_dir.mkdir(exist_ok=True)
    written = {}
    target = out_dir / "serving.yaml"
    tmp = target.with_name("serving.yaml.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(target)
    written["serving"] = target
    if pl is not None:
        written["placement"] = write_json(out_dir / "placement.json", pl.to_json(cl))
    if as_json:
        typer.echo(json.dumps({"written": {k: str(v) for k, v in written.items()}}))
        return
    t = _cli._table("Written", ["file", "path"], left=("file", "path"))
    for name, path in written.items():
        t.add_row(name, str(path))
    _cli._out().print(t)
