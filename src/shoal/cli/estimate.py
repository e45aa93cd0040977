"""``shoal estimate``: time, memory and money of one plan."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.common import emit_json, handles_errors, output_option, show
from shoal.cli.helptext import examples
from shoal.report.tables import network_defaults_line, stage_table, summary_table, worker_table


@handles_errors
@examples(
    "shoal estimate examples/het-a100-v100.yaml --plan examples/het-a100-v100.plan.json",
    "shoal estimate examples/atlas-gpt-3dc.yaml -p examples/atlas-gpt-3dc.plan.json --timeline timeline.png",
)
def estimate(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    plan: Annotated[Path, typer.Option("--plan", "-p", metavar="PLAN",
                                       help="training plan file (JSON or YAML)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the estimate as JSON only")] = False,
    timeline: Annotated[Path | None, output_option(
        "--timeline", help="write a figure of one iteration's timeline here")] = None,
) -> None:
    """Time, memory and money of one plan: per stage, per worker and in total.

    Prints tables (or, with --json, one JSON object, which `shoal report` takes); writes
    nothing unless --timeline names a figure."""
    from shoal.estimate import estimate as run_estimate
    from shoal.files import check_outputs
    from shoal.problem import load_problem
    from shoal.specs.plan import load_plan

    check_outputs([(timeline, "--timeline")], [scenario, plan])
    problem = load_problem(scenario)
    tplan = load_plan(plan)
    est = run_estimate(problem, tplan, file=str(plan))
    tl_doc = None
    if timeline is not None or (as_json and tplan.schedule != "zorse"):
        from shoal.estimate.timeline import timeline_json

        tl_doc = timeline_json(problem, tplan)
    if timeline is not None:
        from shoal.report.figures import draw_timeline_doc

        draw_timeline_doc(tl_doc, timeline)
    if as_json:
        emit_json(est.to_json() | {"stack": problem.stack.name}
                  | {"network_defaults": list(problem.network_defaults)}
                  | ({"timeline": tl_doc} if tl_doc else {}), problem)
        return
    show(stage_table(est), worker_table(est), summary_table(est),
         f"software stack: {problem.stack.name} (job.stack; `shoal catalog stacks`)")
    net = network_defaults_line(list(problem.network_defaults))
    if net:
        show(net)
    if timeline is not None:
        show(f"timeline written to {timeline}")
