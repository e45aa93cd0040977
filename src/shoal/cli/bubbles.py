"""``shoal bubbles``: a training plan across datacenters simulated with its WAN schedule, and
inference prefill placed in its pipeline bubbles (BubbleTea)."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli.choices import GeoSchedule, choice_option
from shoal.cli.common import _out, _progress, emit_json, handles_errors, only_with, output_option, show
from shoal.cli.helptext import examples
from shoal.errors import SpecError
from shoal.files import check_outputs
from shoal.report import bubbles_tables as tables
from shoal.units import parse_seconds

MAX_REQUESTS = 200_000  # prefill requests one `--rate` run generates at most


def _seconds(text: str, option: str, positive: bool = False) -> float:
    """A time option's seconds (``positive``: more than 0, else 0 or more)."""
    try:
        v = parse_seconds(text)
    except Exception as exc:  # units.UnitError
        raise SpecError(str(exc), field=option, value=text) from None
    if v < 0 or (positive and v == 0):
        raise SpecError("must be > 0" if positive else "must be >= 0", field=option, value=text)
    return v


@handles_errors
@examples(
    "shoal bubbles examples/atlas-gpt-3dc.yaml --plan examples/atlas-gpt-3dc.plan.json --rate 100",
    "shoal bubbles examples/atlas-gpt-3dc.yaml -p examples/atlas-gpt-3dc.plan.json --rate 50 "
        "--duration 2min --max-wait 20ms --figure bubbles.png",
)
def bubbles_cmd(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    plan: Annotated[Path, typer.Option("--plan", "-p", metavar="PLAN",
                                       help="training plan: every stage in one region")],
    requests: Annotated[Path | None, typer.Option(
        "--requests", metavar="CSV",
        help="prefill requests, CSV: arrival_s (seconds), prompt_tokens")] = None,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="without --requests: Poisson requests per second")] = None,
    duration: Annotated[str | None, typer.Option(
        "--duration", metavar="TIME",
        help="with --rate: how long, e.g. 90s or 2min (default: 60s)")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0,
                                             help="with --rate: its seed (default: 0)")] = None,
    schedule: Annotated[GeoSchedule, choice_option(
        GeoSchedule, "--schedule", help="training schedule over the WAN: {choices}")] = GeoSchedule.atlas,
    cell: Annotated[int | None, typer.Option(
        "--cell", help="pipelines per DP-cell (atlas; default all)")] = None,
    inference_model: Annotated[str, typer.Option(
        "--inference-model", help="catalog model whose prefills fill the bubbles")] = "LLaMA-3-8B",
    depth: Annotated[int, typer.Option("--depth", help="most GPUs per inference pipeline")] = 8,
    guard: Annotated[str, typer.Option(
        "--guard", metavar="TIME", help="slack before training resumes, e.g. 5ms")] = "5ms",
    max_wait: Annotated[str, typer.Option(
        "--max-wait", metavar="TIME",
        help="longest a request may wait for a bubble, e.g. 50ms")] = "50ms",
    figure: Annotated[Path | None, output_option(
        "--figure", help="write the filled timeline here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Inference prefill in the bubbles of a training pipeline across datacenters.

    Simulates the plan with its WAN schedule and places prefill requests in its pipeline
    bubbles: GPU utilization, time to first token and training iteration time, before and
    after. Prints tables (or, with --json, one JSON object); writes nothing unless --figure
    names a figure. A TIME is a number and a unit: ms, s, min or h (no unit: seconds)."""
    from shoal import catalog

    check_outputs([(figure, "--figure")], [scenario, plan, requests])
    for value, option in ((depth, "--depth"), (cell, "--cell")):
        if value is not None and value < 1:
            raise SpecError("must be >= 1", field=option, value=value)
    g, w = _seconds(guard, "--guard"), _seconds(max_wait, "--max-wait")
    _check_options(cell, requests, rate, duration, seed, schedule)
    seed = 0 if seed is None else seed
    reqs, source = _requests(requests, rate, "60s" if duration is None else duration, seed)
    catalog.models().get(inference_model, field="--inference-model")  # a clear error
    problem, tplan, est, job = _job(scenario, plan, cell)
    gpu = catalog.gpus().canonical(tplan.stages[0].replicas[0].gpu)
    with (contextlib.nullcontext() if as_json else
          _progress().status(f"simulating {len(tplan.stages)} stages and placing "
                             f"{len(reqs)} prefills...")):
        tl, res, sus = _fill(job, schedule.value, cell, inference_model, gpu, reqs,
                             dict(depth=depth, guard_s=g, max_wait_s=w), seed)
    doc = res.summary() | {"schedule": schedule.value, "requests_source": source,
                           "sustainable": sus.to_json(),
                           "inference_model": inference_model, "training": tl.to_json(),
                           "estimate_iteration_time_s": est.iteration_time_s,
                           "fill": res.fill_json(tl.iteration_s)}
    if figure is not None:
        from shoal.report.figures import draw_bubbles

        draw_bubbles(doc, figure)
    if as_json:
        emit_json(doc, problem)
        return
    gpus = sum(r.tp for st in tplan.stages for r in st.replicas)
    show(f"{plan.name}: {gpus} GPUs in {len(tl.busy)} replicas (TP groups), "
         f"{schedule.value} schedule; {len(reqs)} prefill "
         f"requests ({source}) of {inference_model}, {len(res.pipelines)} inference pipelines")
    _print_result(res.summary(), sus, est.iteration_time_s, tplan.recompute)
    if figure is not None:
        show(f"timeline written to {figure}")



def _check_options(cell: int | None, requests: Path | None, rate: float | None,
                   duration: str | None, seed: int | None, schedule: GeoSchedule) -> None:
    """Options given together that exclude each other, or where they do not apply, as a
    SpecError naming one."""
    if requests is not None and rate is not None:
        raise SpecError("give --requests or --rate, not both", field="--rate", value=rate)
    only_with("--rate", rate is not None, ("--duration", duration), ("--seed", seed))
    only_with("--schedule atlas", schedule is GeoSchedule.atlas, ("--cell", cell))


def _job(scenario: Path, plan: Path, cell: int | None):
    """The plan, its estimate, and one iteration's work for the WAN simulation."""
    from shoal.estimate import estimate
    from shoal.problem import load_problem
    from shoal.specs.plan import load_plan
    from shoal.training.geo import job_from_plan

    problem = load_problem(scenario)
    tplan = load_plan(plan)
    est = estimate(problem, tplan, file=str(plan))
    job = job_from_plan(problem, tplan, est, file=str(plan))
    pipelines = len(tplan.stages[0].replicas)
    if cell is not None and cell > pipelines:
        raise SpecError(f"the plan has {pipelines} pipelines", field="--cell", value=cell,
                        allowed=f"1 to {pipelines}")
    return problem, tplan, est, job


def _requests(requests: Path | None, rate: float | None, duration: str, seed: int):
    """The prefill requests, from ``--requests`` or Poisson at ``--rate``, and where from."""
    from shoal.training import bubbles as bt

    if requests is not None:
        return bt.load_requests(requests), str(requests)
    if rate is None:
        raise SpecError("no requests", field="--requests",
                        allowed="--requests FILE.csv or --rate N [--duration 60s]")
    if not (0 < rate < math.inf):
        raise SpecError("must be a positive number", field="--rate", value=rate,
                        allowed="requests per second > 0")
    length = _seconds(duration, "--duration", positive=True)
    if rate * length > MAX_REQUESTS:
        raise SpecError(f"{rate:g}/s for {duration} is {rate * length:,.0f} requests, "
                        "more than one run places", field="--rate", value=rate,
                        allowed=f"--rate x --duration up to {MAX_REQUESTS:,} requests")
    return bt.synthetic_requests(rate, length, seed), f"Poisson {rate:g}/s for {duration} (seed {seed})"


def _fill(job, schedule: str, cell: int | None, inference_model: str, gpu: str, reqs,
          limits: dict, seed: int):
    """The training timeline, the prefills placed in its bubbles, and the load it sustains
    (``limits``: depth, guard_s, max_wait_s)."""
    from shoal.training import bubbles as bt
    from shoal.training.geo import simulate

    tl = simulate(job, schedule, cell=cell)
    model = bt.prefill_model(inference_model, gpu)
    res = bt.place(tl, reqs, model, **limits)
    sus = bt.sustainable(tl, model, probe=bt.Probe(seed=seed), **limits)
    return tl, res, sus


def _print_result(s: dict, sus, estimate_s: float, recompute: bool) -> None:
    show(tables.training_table(s), tables.estimate_note(estimate_s, recompute),
         tables.requests_table(s))
    warning = tables.rejected_warning(s, sus)
    if warning:
        _out().print(f"[yellow]warning:[/yellow] {warning}")
    best = tables.sustainable(sus)
    if isinstance(best, str):
        _out().print(best)
    else:
        show(best)
