"""``shoal replay``: follow availability over time, the plan at every change and when to move."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.choices import Policy, Strategy, choice_option
from shoal.cli.common import (
    _err,
    _progress,
    emit_json,
    handles_errors,
    only_with,
    output_option,
    show,
    with_meta,
)
from shoal.cli.helptext import examples
from shoal.errors import SpecError
from shoal.files import check_outputs, write_json
from shoal.report.replay_tables import notes, steps_table, totals_table


@handles_errors
@examples(
    "shoal replay examples/opt350m-two-zones.yaml --trace examples/opt350m-two-zones.events.csv --policy all",
    "shoal replay examples/opt350m-two-zones.yaml --synthetic spot --hours 4 -o replay.json "
        "--figure replay.png",
)
def replay(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="availability trace: Sailor CSV or controller JSON, or shoal events")] = None,
    synthetic: Annotated[str | None, typer.Option(
        "--synthetic", metavar="KIND",
        help="instead of --trace: generate one of this kind: spot, scarcity, outage")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", min=0, help="seed of --synthetic (default 0)")] = None,
    hours: Annotated[float | None, typer.Option(
        "--hours", min=0.01, metavar="HOURS", help="length of --synthetic in hours (default 8)")] = None,
    trace_gpu: Annotated[str | None, typer.Option(
        "--trace-gpu", help="GPU type of a controller JSON trace (default A100-40GB)")] = None,
    trace_zone: Annotated[str | None, typer.Option(
        "--trace-zone", help="zone of a controller JSON trace (default: the only one with it)")] = None,
    policy: Annotated[Policy, choice_option(
        Policy, help="when to move plans: {choices} (all: every policy, compared)")] = Policy.shoal,
    strategy: Annotated[Strategy, choice_option(
        Strategy, help="planner for each state: {choices}")] = Strategy.auto,
    budget: Annotated[float, typer.Option(
        "--budget", min=0.1, metavar="SECONDS", help="search time limit per state in seconds")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option(
        "-o", "--output", help="write the result here (the JSON object --json prints)")] = None,
    figure: Annotated[Path | None, output_option(
        "--figure", help="write availability, throughput and tokens over time here")] = None,
) -> None:
    """Follow availability over time: the plan at every change, when to move, tokens and dollars.

    Plans every state of an availability trace (--trace, or one --synthetic generates) and
    replays the policies over it; prints the plan at every change and the totals per policy (or,
    with --json, one JSON object); -o writes that JSON object to a file."""
    from shoal.elastic.replan import Replanner
    from shoal.elastic.replay import replay_json, simulate
    from shoal.elastic.traces import over_pool
    from shoal.problem import load_problem

    check_outputs([(output, "--output"), (figure, "--figure")], [scenario, trace])
    if (trace is None) == (synthetic is None):
        raise SpecError("give exactly one of --trace FILE and --synthetic KIND", field="--trace")
    # options of the other way of giving a trace would be ignored: refused instead
    only_with("--synthetic", trace is None, ("--seed", seed), ("--hours", hours))
    only_with("--trace", trace is not None, ("--trace-gpu", trace_gpu),
              ("--trace-zone", trace_zone))
    hours = 8.0 if hours is None else hours
    if not math.isfinite(hours):
        raise SpecError("must be a finite number of hours", field="--hours", value=hours,
                        allowed="a number >= 0.01")
    problem = load_problem(scenario)
    tr = _trace(problem, trace, trace_gpu, trace_zone, synthetic, 0 if seed is None else seed, hours)
    warnings = [o.message() for o in over_pool(problem, tr)]
    for w in warnings:
        _err().print(f"warning: {w}", soft_wrap=True)
    replanner = Replanner(problem, strategy=strategy.value, budget_s=budget)
    options = _plan_states(problem, tr, replanner, as_json)
    names = [p.value for p in Policy if p is not Policy.all] if policy is Policy.all else [policy.value]
    runs = [simulate(problem, tr, options, name) for name in names]
    doc = with_meta(replay_json(tr, runs, replanner) | {"warnings": warnings}, problem)
    if output is not None:
        write_json(output, doc)
    if figure is not None:
        from shoal.report.figures import draw_replay

        draw_replay(doc, figure)
    if as_json:
        emit_json(doc, problem)
        return
    _print_replay(tr, runs, replanner, budget)
    for path, what in ((output, "result"), (figure, "figure")):
        if path is not None:
            show(f"{what} written to {path}")


def _print_replay(tr, runs, replanner, budget: float) -> None:
    """The plan at every change (for one policy), the totals per policy, and what they leave
    out."""
    if len(runs) == 1:
        show(steps_table(runs[0], [c.timed_out for c in replanner.calls]))
    show(totals_table(tr, runs), *notes(tr, runs, replanner, budget))


def _trace(problem, trace: Path | None, gpu: str | None, zone: str | None, synthetic: str | None,
           seed: int, hours: float):
    """The availability trace: read from ``trace``, or a ``synthetic`` one generated."""
    from shoal.elastic.traces import synthetic as make_synthetic
    from shoal.io.traces import load_trace

    if trace is not None:
        return load_trace(trace, problem, gpu=gpu, zone=zone)
    return make_synthetic(problem, synthetic, seed=seed, duration_s=hours * 3600)


def _plan_states(problem, tr, replanner, quiet: bool):
    """The ranked plans of every state of the trace (a progress bar on stderr unless ``quiet``)."""
    from shoal.elastic.replay import plan_trace

    if quiet:
        return plan_trace(problem, tr, replanner)
    from rich.progress import Progress

    with Progress(console=_progress(), transient=True) as bar:
        task = bar.add_task("planning each availability state", total=len(tr.states))
        return plan_trace(problem, tr, replanner, lambda done, total: bar.update(task, completed=done))
