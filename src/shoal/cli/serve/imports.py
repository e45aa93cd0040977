"""``shoal import helix``: Helix's cluster, machine and capacity files (and a solution) as a
shoal serving file (and placement). Registered with the other import commands."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _err, emit_json, show
from shoal.cli.helptext import examples
from shoal.report.tables import written_table


@examples(
    "shoal import helix --cluster single24.ini --machines machine_profiles.ini "
        "--capacity node_capacity.json -o out/",
    "shoal import helix --cluster single24.ini --machines machine_profiles.ini "
        "--capacity node_capacity.json --model llama-2-70b --placement ilp.ini -o out/",
    "shoal serve plan out/serving.yaml",
)
def import_helix_cmd(
    cluster: Annotated[Path, typer.Option("--cluster", help="Helix cluster INI file")],
    machines: Annotated[Path, typer.Option("--machines", help="Helix machine_profiles.ini")],
    capacity: Annotated[Path, typer.Option(
        "--capacity", help="node capacity tables T(k) (node_capacity.json format)")],
    out_dir: Annotated[Path, typer.Option(
        "--out", "-o", metavar="DIR",
        help="the folder to write serving.yaml (and placement.json) into; made if missing")],
    model: Annotated[str | None, typer.Option(
        "--model", help="which model's table, when the capacity file has several")] = None,
    placement: Annotated[Path | None, typer.Option(
        "--placement", help="also convert a Helix solution file to placement.json")] = None,
    partial_inference: Annotated[bool, typer.Option(
        "--partial-inference", help="allow a node to start inside the previous node's range")] = False,
    profiles: Annotated[Path | None, typer.Option(
        "--profiles", help="folder of <type>/prompt_bs2time.csv and <type>/decode_bs2time.csv "
                           "layer times (for `serve simulate`)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a shoal serving file (and placement) from Helix's files.

    -o names the folder that gets serving.yaml, and placement.json with --placement (a Helix
    solution). Prints what was written (or, with --json, one JSON object)."""
    import yaml

    from shoal.files import check_folder, make_folder, write_json, write_text
    from shoal.io.helix import import_helix, read_placement
    from shoal.serving.cluster import build_cluster
    from shoal.specs.serving import parse_serving

    check_folder(out_dir, "--out")
    doc = import_helix(cluster=cluster, machines=machines, capacity=capacity, model=model,
                       partial_inference=partial_inference, profiles=profiles)
    cl = build_cluster(parse_serving(doc, file=str(cluster)), file=str(cluster))
    pl = read_placement(placement, cl) if placement is not None else None
    make_folder(out_dir)
    written = {}
    written["serving"] = write_text(out_dir / "serving.yaml", yaml.safe_dump(doc, sort_keys=False))
    warnings = []
    if pl is not None:
        written["placement"] = write_json(out_dir / "placement.json", pl.to_json(cl))
        gaps = pl.uncovered_text(cl)
        if gaps:  # Helix's own solutions cover every layer: a file that does not serves nothing
            warnings.append(f"the placement leaves layers {gaps} on no node: it serves nothing")
    for w in warnings:
        _err().print(f"warning: {w}", soft_wrap=True)
    if as_json:
        emit_json({"written": {k: str(v) for k, v in written.items()}, "warnings": warnings})
        return
    show(written_table(written))
