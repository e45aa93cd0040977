"""``shoal profile``: measure per-layer times and link speeds with the runtime; write a profile
file the planner reads."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import emit_json, handles_errors, needs_torch, output_option, show
from shoal.cli.helptext import examples
from shoal.cli.meta import model_doc
from shoal.errors import SpecError
from shoal.files import check_output
from shoal.report.runtime_tables import link_line, profile_table


@handles_errors
@examples(
    "shoal profile --model tiny -o tiny-cpu.profile.json",
    "shoal profile --model tiny --tp 1,2 --mbs 1,2,4 -o tiny-cpu.profile.json",
)
def profile(
    model: Annotated[str, typer.Option("--model", help="catalog model (e.g. tiny)")],
    output: Annotated[Path, output_option(
        "-o", "--output", help="the profile file to write (JSON; a scenario's profiles.compute)")],
    device: Annotated[str, typer.Option(help="cpu (cuda: not on this build)")] = "cpu",
    tp: Annotated[str, typer.Option(help="TP degrees, comma-separated")] = "1",
    mbs: Annotated[str, typer.Option(help="microbatch sizes, comma-separated")] = "1,2",
    seq: Annotated[int | None, typer.Option(
        "--seq", min=1, help="sequence length in tokens (default: the model's, at most 128)")] = None,
    procs: Annotated[int, typer.Option(
        "--procs", min=1, help="processes measuring at once (as many as the plans use)")] = 2,
    reps: Annotated[int, typer.Option("--reps", min=1, help="repetitions per measurement")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print what was measured as JSON")] = False,
) -> None:
    """Measure per-layer times and link speeds with the runtime; write a profile file.

    -o writes the profile, which a scenario names in profiles.compute (and train --elastic
    takes as --profile); prints what was measured (or, with --json, one JSON object). Needs
    PyTorch."""
    from shoal import catalog

    needs_torch("shoal profile")
    from shoal.runtime import profiler
    from shoal.runtime.launch import seq_for
    from shoal.runtime.train import launch

    check_output(output, "--output")
    if device != "cpu":
        raise SpecError("only the CPU is available to this build", field="--device",
                        value=device, allowed="cpu")
    spec = catalog.models().get(model, field="--model")
    tps, sizes = _whole_numbers(tp, "--tp"), _whole_numbers(mbs, "--mbs")
    for values, option in ((tps, "--tp"), (sizes, "--mbs")):
        if min(values) < 1:
            raise SpecError("must be at least 1", field=option, value=min(values))
    for t in tps:
        if procs % t or spec.num_heads % t:
            raise SpecError(f"TP {t} must divide --procs ({procs}) and the model's "
                            f"{spec.num_heads} heads", field="--tp", value=t)
    seq = seq_for(seq, spec)
    launch(procs, profiler.run, spec, model, tps, sizes, seq, reps, output.resolve())
    doc = json.loads(output.read_text())
    link = doc["network"].get("link")
    if as_json:
        emit_json({"path": str(output), "layers": doc["n_layers"], "tp": tps, "mbs": sizes,
                   "processes": procs, "link": link}, model=model_doc(spec))
        return
    show(profile_table(doc, model, device, procs))
    if link:
        show(link_line(link))
    show(f"profile written to {output}")


def _whole_numbers(text: str, option: str) -> list[int]:
    """A comma-separated list of whole numbers (``--tp``, ``--mbs``)."""
    try:
        return [int(x) for x in text.split(",")]
    except ValueError:
        raise SpecError("expected whole numbers separated by commas", field=option,
                        value=text, allowed="say 1,2,4") from None
