"""``shoal calibrate``: fit a software stack's constants to measured runs and write it."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _progress, emit_json, handles_errors, output_option, show
from shoal.cli.helptext import examples
from shoal.files import check_output, write_text
from shoal.report.catalog_tables import fit_line, kernels_table, runs_table


@handles_errors
@examples(
    "# my-runs.csv: runs you measured (docs/estimator.md lists the fields)",
    "shoal calibrate my-runs.csv --stack fsdp -o my-fsdp.yaml",
    "shoal calibrate my-runs.csv --stack megatron --name tuned -o tuned.yaml",
)
def calibrate_cmd(
    measurements: Annotated[Path, typer.Argument(
        metavar="MEASUREMENTS", help="measured runs: a CSV (header row) or JSON list "
                                     "(docs/estimator.md#calibrating-a-stack lists the fields)")],
    stack: Annotated[str, typer.Option(
        "--stack", help="the stack the runs used: a built-in one (its kernels, overlap and "
                        "memory layout are the starting point) or a stack file")],
    output: Annotated[Path, output_option(
        "-o", "--output", help="the stack file to write (YAML; a scenario's job.stack)")],
    name: Annotated[str | None, typer.Option(
        "--name", help="the written stack's name (default: the output file's, without suffix)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the fit as JSON")] = False,
) -> None:
    """Fit a software stack's constants to measured runs and write the stack file.

    Fits the stack's kernel efficiencies (per GPU architecture in the runs) and, for runs that
    give their peak memory, its memory constants; prints each run's error in sample and when its
    group (model) is left out of the fit (or, with --json, one JSON object). -o writes the
    fitted stack (YAML), which a scenario names in job.stack."""
    import yaml

    from shoal.catalog.stacks import resolve_stack
    from shoal.estimate import calibrate as cal
    from shoal.specs.measurements import read_runs

    check_output(output, "--output")
    base = resolve_stack(stack, base=Path.cwd(), field="--stack")
    runs = read_runs(measurements)
    rows = cal.rows_for(runs, base, base=measurements.parent, file=str(measurements))
    groups = sorted({cal.group_of(r) for r in runs})
    fitted, in_sample, held_out = _fit(rows, base, len(groups))
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    quality = {"in_sample": cal.summary(in_sample),
               "leave_group_out": cal.summary(held_out) if held_out else None}
    new_name = name or output.stem
    doc = cal.stack_document(fitted, rows, groups, name=new_name, measurements=measurements.name,
                             date=stamp, quality=quality)
    write_text(output, yaml.safe_dump(doc, sort_keys=False))
    result = {"stack": new_name, "output": str(output), "kernels": {
        k: v for k, v in doc["kernels"].items()}, **quality,
        "runs": [dict(e, held_out_error_pct=h["time_error_pct"] if h else None)
                 for e, h in zip(in_sample, held_out or [None] * len(in_sample), strict=True)]}
    if as_json:
        emit_json(result)
        return
    show(kernels_table(result), runs_table(result), fit_line(result),
         f"stack written to {result['output']} (use it as job.stack: {result['output']})")


def _fit(rows, base, groups: int):
    """The fitted stack, its errors on every run, and (with several groups) each group's errors
    under the stack fitted on the others, with a status line on stderr."""
    from shoal.estimate import calibrate as cal

    with _progress().status(f"fitting {len(rows)} runs") as status:
        fitted = cal.fit(rows, base)
        in_sample = cal.errors(rows, fitted)
        held_out: list[dict] = []
        if groups > 1:
            status.update(f"judging the fit: leaving each of {groups} groups out")
            held_out = cal.leave_group_out(rows, base)
    return fitted, in_sample, held_out
