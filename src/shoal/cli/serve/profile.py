"""``shoal serve profile``: per-layer prompt and decode times and the hop between processes,
measured with serve run's own workers, written as a machine's profile and links."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import emit_json, handles_errors, show
from shoal.cli.helptext import examples
from shoal.cli.meta import model_doc
from shoal.cli.serve.inputs import check_dtype, status
from shoal.errors import SpecError
from shoal.report.serve_tables import serve_profile_lines, serve_profile_table


@handles_errors
@examples(
    "shoal serve profile --model tiny -o prof/",
    "shoal serve profile --model tiny --context 16 --reps 10 -o prof/",
)
def profile_cmd(
    model: Annotated[str, typer.Option("--model", help="model to measure (e.g. tiny)")],
    out_dir: Annotated[Path, typer.Option(
        "--out", "-o", metavar="DIR", help="the folder to write the profile into; made if missing")],
    context: Annotated[int | None, typer.Option(
        "--context", min=1, help="cached tokens per request while decode steps are timed "
                                 "(default: a quarter of the model's context)")] = None,
    reps: Annotated[int, typer.Option("--reps", min=1, help="repeats per measurement")] = 5,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    seed: Annotated[int, typer.Option(min=0, help="seed of the weights")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Measure per-layer prompt and decode times and the hop between processes.

    Measures with serve run's own workers. -o names the folder that gets Helix's
    prompt_bs2time.csv and decode_bs2time.csv (a machine's 'profile:' in the serving file) and
    links.json (latency and bandwidth for the serving file's links; host_cores, host_share and
    wake for its top level). Needs PyTorch."""
    from dataclasses import asdict

    from shoal import catalog
    from shoal.files import check_folder
    from shoal.runtime.serve.profile import measure

    check_dtype(dtype)
    spec = catalog.models().get(model, field="--model")
    if context is not None and context >= spec.max_seq_len:
        raise SpecError(f"more cached tokens than {spec.name}'s context of {spec.max_seq_len} "
                        "leaves room for", field="--context", value=context,
                        allowed=f"1 to {spec.max_seq_len - 1}")
    check_folder(out_dir, "--out")
    with status(f"measuring {spec.name}", as_json):
        prof = measure(spec, reps=reps, seed=seed, dtype=dtype, context=context)
    paths = prof.write(out_dir)
    if as_json:
        emit_json({"model": spec.name, "files": [str(p) for p in paths]} | asdict(prof),
                  model=model_doc(spec))
        return
    show(serve_profile_table(prof, spec.name, dtype), *serve_profile_lines(prof),
         f"written to {out_dir}/: " + ", ".join(p.name for p in paths))
