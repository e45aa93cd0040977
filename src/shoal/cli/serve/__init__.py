"""``shoal serve ...``: serving placement on heterogeneous nodes, simulated and run live; and
``shoal import helix`` (registered with the import commands).

One module per job: ``plan`` (``serve plan`` and ``serve flow``), ``simulate``, ``run`` (``serve
run`` and ``serve worker``), ``profile`` and ``imports``; ``inputs`` reads what they share.
"""

from __future__ import annotations

import typer

from shoal.cli.helptext import examples_text
from shoal.cli.serve import plan, profile, run, simulate
from shoal.cli.serve.imports import import_helix_cmd

__all__ = ["import_helix_cmd", "serve_app"]

serve_app = typer.Typer(
    no_args_is_help=True,
    help="""Serve a model over heterogeneous nodes: placement and max flow.

    Place the model's layers on the nodes (plan), check a placement (flow), simulate requests
    on it (simulate), run it for real (run, worker) and measure this machine (profile).""",
    epilog=examples_text(
        "shoal serve plan examples/llama2-70b-mixed.serving.yaml -o placement.json",
        "shoal serve flow examples/llama2-70b-mixed.serving.yaml --placement placement.json",
        "shoal serve simulate examples/llama2-70b-mixed.serving.yaml --placement placement.json"))
for name, command in (("plan", plan.plan_cmd), ("flow", plan.flow_cmd),
                      ("simulate", simulate.simulate_cmd), ("run", run.run_cmd),
                      ("worker", run.worker_cmd), ("profile", profile.profile_cmd)):
    serve_app.command(name)(command)
