"""``shoal report``: one self-contained HTML page from the JSON outputs of shoal's commands."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _progress, emit_json, handles_errors, output_option, show
from shoal.cli.helptext import examples
from shoal.files import check_outputs, read_json


@handles_errors
@examples(
    "shoal plan examples/opt350m-two-zones.yaml --json > plan.json",
    "shoal report plan.json",
    'shoal report plan.json replay.json -o report.html --title "Two zones"',
)
def report(
    inputs: Annotated[list[Path], typer.Argument(
        metavar="FILE...", help="JSON outputs of plan, estimate, replay, bubbles, serve plan, "
                                "serve simulate (each run with --json)")],
    output: Annotated[Path, output_option(
        "-o", "--output", help="the HTML report to write (one file, figures inside)")] = Path(
        "report.html"),
    title: Annotated[str | None, typer.Option("--title", help="the page title")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """One self-contained HTML report (figures embedded) from the JSON outputs of shoal's
    commands.

    -o writes the report (default report.html), one section per input file."""
    from shoal.report.html import build, kind_of

    check_outputs([(output, "--output")], inputs)
    with _progress().status("drawing the report...") if not as_json else contextlib.nullcontext():
        path = build(list(inputs), output, title)
    if as_json:
        emit_json({"written": str(path), "sections": [
            {"input": str(p), "kind": kind_of(read_json(p))} for p in inputs]})
    else:
        show(f"report written to {path} ({path.stat().st_size / 1e6:.1f} MB, "
             f"{len(inputs)} section{'s' * (len(inputs) > 1)})")
