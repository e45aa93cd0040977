"""``shoal calibrate``: fit a software stack's constants to measured runs and write it."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import _out, _progress, _table, handles_errors, output_option


@handles_errors
def calibrate_cmd(
    measurements: Annotated[Path, typer.Argument(
        metavar="MEASUREMENTS", help="measured runs: a CSV (header row) or JSON list "
                                     "(docs/estimator.md#calibrating-a-stack lists the fields)")],
    stack: Annotated[str, typer.Option(
        "--stack", help="the stack the runs used: a built-in one (its kernels, overlap and "
                        "memory layout are the starting point) or a stack file")],
    output: Annotated[Path, output_option("-o", "--output", help="stack file to write (YAML)")],
    name: Annotated[str | None, typer.Option(
        "--name", help="the written stack's name [default: the output file's name]")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the fit as JSON")] = False,
) -> None:
    """Fit a stack's kernel efficiencies (per GPU architecture in the runs) and, for runs that
    give their peak memory, its memory constants, to measured runs; print each run's error in
    sample and when its group (model) is left out of the fit; write the stack file scenarios
    name in job.stack.

    Example: shoal calibrate my-runs.csv --stack fsdp -o my-fsdp.yaml
    """
    import yaml

    from shoal.catalog.stacks import resolve_stack
    from shoal.estimate import calibrate as cal
    from shoal.files import check_output, write_text
    from shoal.specs.measurements import read_runs

    check_output(output, "--output")
    base = resolve_stack(stack, base=Path.cwd(), field="--stack")
    runs = read_runs(measurements)
    rows = cal.rows_for(runs, base, base=measurements.parent, file=str(measurements))
    groups = sorted({cal.group_of(r) for r in runs})
    with _progress().status(f"fitting {len(rows)} runs") as status:
        fitted = cal.fit(rows, base)
        in_sample = cal.errors(rows, fitted)
        held_out: list[dict] = []
        if len(groups) > 1:
            status.update(f"judging the fit: leaving each of {len(groups)} groups out")
            held_out = cal.leave_group_out(rows, base)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    summary = {"in_sample": cal.summary(in_sample),
               "leave_group_out": cal.summary(held_out) if held_out else None}
    new_name = name or output.stem
    doc = _rounded(fitted.model_dump(mode="json", by_alias=True, exclude_none=True))
    doc["name"] = new_name
    doc["sources"] = dict(doc.get("sources", {}))
    keys = sorted({r.key for r in rows if r.step_s})
    for k in keys:
        doc["sources"][f"kernels.{k}"] = (
            f"fitted by shoal calibrate on {measurements.name} ({stamp}; "
            f"{sum(r.key == k for r in rows)} runs)")
    if keys:  # GPUs of other architectures: the fitted ones' geometric mean
        doc["kernels"]["default"] = _rounded(cal.mean_kernels(fitted, keys))
        doc["sources"]["kernels.default"] = (
            "the geometric mean of the fitted entries (" + ", ".join(keys) + ")")
    if any(r.memory_bytes for r in rows):
        doc["sources"]["memory"] = f"fitted by shoal calibrate on {measurements.name} ({stamp})"
    doc["fit"] = {"measurements": measurements.name, "runs": len(rows), "groups": groups,
                  "date": stamp, **summary}
    write_text(output, yaml.safe_dump(doc, sort_keys=False))
    result = {"stack": new_name, "output": str(output), "kernels": {
        k: v for k, v in doc["kernels"].items()}, **summary,
        "runs": [dict(e, held_out_error_pct=h["time_error_pct"] if h else None)
                 for e, h in zip(in_sample, held_out or [None] * len(in_sample), strict=True)]}
    if as_json:
        typer.echo(json.dumps(result))
        return
    _print(result)


def _rounded(x):
    """Floats to four significant digits (a fitted constant is not known better)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def _print(result: dict) -> None:
    t = _table(f"Stack {result['stack']}: kernel efficiencies (share of the datasheet peak)",
               ["kernels", "gemm", "attention fwd", "attention bwd", "memory", "launch"],
               left=("kernels",), whole=("kernels",))
    for k, v in result["kernels"].items():
        t.add_row(k, *(f"{v[f]:.3f}" if f in v else "—" for f in
                       ("gemm", "attention_fwd", "attention_bwd", "memory")),
                  f"{v['launch_s'] * 1e6:.1f} us" if "launch_s" in v else "—")
    _out().print(t)
    rows = _table("Runs: step time, measured and predicted", ["run", "measured", "predicted",
                                                               "error", "left out"],
                  left=("run",))
    for r in result["runs"]:
        if r["measured_step_s"] is None:
            continue
        held = r["held_out_error_pct"]
        rows.add_row(r["run"], f"{r['measured_step_s']:.3f} s", f"{r['predicted_step_s']:.3f} s",
                     f"{r['time_error_pct']:+.1f}%", f"{held:+.1f}%" if held is not None else "—")
    _out().print(rows)
    ins, loo = result["in_sample"], result["leave_group_out"]
    line = f"mean error {ins['time_mape_pct']:.1f}% in sample"
    if loo:
        line += f", {loo['time_mape_pct']:.1f}% with each group left out"
    _out().print(line)
    _out().print(f"stack written to {result['output']} (use it as job.stack: {result['output']})")
