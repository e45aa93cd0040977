"""``shoal bubbles``: a training plan across datacenters simulated with its WAN schedule, and
inference prefill placed in its pipeline bubbles (BubbleTea)."""

from __future__ import annotations

import json
import math
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from shoal.cli_common import _out, _table, only_with, output_option
from shoal.errors import SpecError
from shoal.units import fmt_seconds, parse_seconds


class GeoSchedule(StrEnum):
    atlas = "atlas"
    varuna = "varuna"
    f1b1 = "1f1b"
    gpipe = "gpipe"


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


def bubbles_cmd(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    plan: Annotated[Path, typer.Option("--plan", "-p", metavar="PLAN",
                                       help="training plan: every stage in one region")],
    requests: Annotated[Path | None, typer.Option(
        "--requests", metavar="CSV", help="prefill requests: arrival_s,prompt_tokens")] = None,
    rate: Annotated[float | None, typer.Option(
        "--rate", help="without --requests: Poisson requests per second")] = None,
    duration: Annotated[str | None, typer.Option(
        "--duration", help="with --rate: how long [default: 60s]")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0,
                                             help="with --rate: its seed [default: 0]")] = None,
    schedule: Annotated[GeoSchedule, typer.Option(
        "--schedule", help="training schedule over the WAN")] = GeoSchedule.atlas,
    cell: Annotated[int | None, typer.Option(
        "--cell", help="pipelines per DP-cell (atlas; default all)")] = None,
    inference_model: Annotated[str, typer.Option(
        "--inference-model", help="catalog model whose prefills fill the bubbles")] = "LLaMA-3-8B",
    depth: Annotated[int, typer.Option("--depth", help="most GPUs per inference pipeline")] = 8,
    guard: Annotated[str, typer.Option("--guard", help="slack before training resumes")] = "5ms",
    max_wait: Annotated[str, typer.Option(
        "--max-wait", help="longest a request may wait for a bubble")] = "50ms",
    figure: Annotated[Path | None, output_option(
        "--figure", help="write the filled timeline here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Inference prefill in the bubbles of a training pipeline across datacenters: GPU
    utilization, time to first token and training iteration time, before and after."""
    from shoal import catalog
    from shoal.cli import load_plan
    from shoal.files import check_outputs
    from shoal.problem import load_problem
    from shoal.training import bubbles as bt
    from shoal.training.geo import job_from_plan, simulate

    check_outputs([(figure, "--figure")], [scenario, plan, requests])
    if depth < 1:
        raise SpecError("must be >= 1", field="--depth", value=depth)
    if cell is not None and cell < 1:
        raise SpecError("must be >= 1", field="--cell", value=cell)
    g, w = _seconds(guard, "--guard"), _seconds(max_wait, "--max-wait")
    if requests is not None and rate is not None:
        raise SpecError("give --requests or --rate, not both", field="--rate", value=rate)
    only_with("--rate", rate is not None, ("--duration", duration), ("--seed", seed))
    only_with("--schedule atlas", schedule is GeoSchedule.atlas, ("--cell", cell))
    duration = "60s" if duration is None else duration
    seed = 0 if seed is None else seed
    if requests is not None:
        reqs = bt.load_requests(requests)
        source = str(requests)
    elif rate is not None:
        if not (0 < rate < math.inf):
            raise SpecError("must be a positive number", field="--rate", value=rate,
                            allowed="requests per second > 0")
        length = _seconds(duration, "--duration", positive=True)
        if rate * length > MAX_REQUESTS:
            raise SpecError(f"{rate:g}/s for {duration} is {rate * length:,.0f} requests, "
                            "more than one run places", field="--rate", value=rate,
                            allowed=f"--rate x --duration up to {MAX_REQUESTS:,} requests")
        reqs = bt.synthetic_requests(rate, length, seed)
        source = f"Poisson {rate:g}/s for {duration} (seed {seed})"
    else:
        raise SpecError("no requests", field="--requests",
                        allowed="--requests FILE.csv or --rate N [--duration 60s]")
    catalog.models().get(inference_model, field="--inference-model")  # a clear error
    problem = load_problem(scenario)
    tplan = load_plan(plan)
    from shoal.estimate import estimate

    est = estimate(problem, tplan, file=str(plan))
    job = job_from_plan(problem, tplan, est, file=str(plan))
    pipelines = len(tplan.stages[0].replicas)
    if cell is not None and cell > pipelines:
        raise SpecError(f"the plan has {pipelines} pipelines", field="--cell", value=cell,
                        allowed=f"1 to {pipelines}")
    gpu = catalog.gpus().canonical(tplan.stages[0].replicas[0].gpu)
    import contextlib

    from shoal.cli_common import _progress

    with (contextlib.nullcontext() if as_json else
          _progress().status(f"simulating {len(tplan.stages)} stages and placing "
                             f"{len(reqs)} prefills...")):
        tl = simulate(job, schedule.value, cell=cell)
        model = bt.prefill_model(inference_model, gpu)
        res = bt.place(tl, reqs, model, depth=depth, guard_s=g, max_wait_s=w)
        sus = bt.sustainable(tl, model, depth=depth, guard_s=g, max_wait_s=w, probe=bt.Probe(seed=seed))
    doc = res.summary() | {"schedule": schedule.value, "requests_source": source,
                           "sustainable": sus.to_json(),
                           "inference_model": inference_model, "training": tl.to_json(),
                           "estimate_iteration_time_s": est.iteration_time_s,
                           "fill": res.fill_json(tl.iteration_s)}
    if figure is not None:
        from shoal.report.figures import draw_bubbles

        draw_bubbles(doc, figure)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    s = res.summary()
    out = _out()
    gpus = sum(r.tp for st in tplan.stages for r in st.replicas)
    out.print(f"{plan.name}: {gpus} GPUs in {len(tl.busy)} replicas (TP groups), "
              f"{schedule.value} schedule; {len(reqs)} prefill "
              f"requests ({source}) of {inference_model}, {len(res.pipelines)} inference pipelines")
    t = _table("training GPUs", ["", "before", "after"], left=("",))
    t.add_row("GPU busy", f"{s['utilization_before']:.1%}", f"{s['utilization_after']:.1%}")
    t.add_row("training iteration", fmt_seconds(s["iteration_time_before_s"]),
              fmt_seconds(s["iteration_time_after_s"]))
    t.add_row("prefills rejected", "", f"{s['rejected_fraction']:.1%}")
    out.print(t)
    out.print(f"(`shoal estimate` gives {fmt_seconds(est.iteration_time_s)} for this plan: its "
              "pipeline formula adds each microbatch's hand-off to its stage's busy time"
              + (" and recomputes on every stage" if tplan.recompute else "")
              + ", where this event simulation overlaps hand-offs with other microbatches' "
              "compute" + (" and the last stage keeps its activations" if tplan.recompute
                           else "") + ")")
    r = s["requests"]
    q = _table("prefill requests", ["placed", "rejected", "TTFT p50", "TTFT p95", "decision p50"])
    q.add_row(f"{r['placed']}", f"{s['rejected_fraction']:.1%}",
              fmt_seconds(s["ttft_s"]["p50"]) if s["ttft_s"]["p50"] is not None else "-",
              fmt_seconds(s["ttft_s"]["p95"]) if s["ttft_s"]["p95"] is not None else "-",
              f"{s['decision_us']['p50']:.0f} us")
    out.print(q)
    if s["rejected_fraction"] > sus.max_rejected:
        out.print(f"[yellow]warning:[/yellow] {s['rejected_fraction']:.1%} of these prefills "
                  f"were turned away: the GPU busy after ({s['utilization_after']:.1%}) counts "
                  f"only the {1 - s['rejected_fraction']:.1%} placed", soft_wrap=True)
    _print_sustainable(sus)
    if figure is not None:
        out.print(f"timeline written to {figure}")


def _print_sustainable(sus) -> None:
    out = _out()
    wait = fmt_seconds(sus.max_wait_s)
    if sus.rate_per_s is None:
        msg = (f"no request rate is served with at most {sus.max_rejected:.0%} rejected at "
               f"--max-wait {wait}: even at {sus.lowest_rate_per_s:.3g}/s, "
               f"{sus.floor:.1%} of the prefills find no bubble long enough within the wait")
        if sus.relaxed:
            msg += "; with a longer --max-wait: " + ", ".join(
                f"{fmt_seconds(r['max_wait_s'])} "
                + (f"{r['rate_per_s']:.3g}/s (GPU busy {r['utilization_after']:.1%})"
                   if r["rate_per_s"] is not None else
                   f"none ({r['rejected_at_lowest_rate']:.1%} rejected at the lowest rate)")
                for r in sus.relaxed)
        out.print(msg, soft_wrap=True)
        return
    a = sus.result
    q = _table(f"sustainable load (at most {sus.max_rejected:.0%} rejected)",
               ["requests/s", "rejected", "GPU busy", "training iteration", "TTFT p95"])
    q.add_row(f"{sus.rate_per_s:.3g}", f"{a['rejected_fraction']:.1%}",
              f"{a['utilization_before']:.1%} -> {a['utilization_after']:.1%}",
              f"{fmt_seconds(a['iteration_time_before_s'])} -> "
              f"{fmt_seconds(a['iteration_time_after_s'])}",
              fmt_seconds(a["ttft_s"]["p95"]) if a["ttft_s"]["p95"] is not None else "-")
    out.print(q)
