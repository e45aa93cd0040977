"""The command line (DESIGN §6): readable tables by default, the stable JSON contract with ``--json``.

Planning and estimating live elsewhere; this module only reads arguments, calls them and prints.
Errors a person can act on (``ShoalError``) are printed without a traceback: exit 2 for bad input,
3 when nothing is feasible.
"""

from __future__ import annotations

import inspect
import json
import math
import sys
import tempfile
from dataclasses import asdict
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich import box
from rich.table import Table
from rich.text import Text

from shoal.cli_common import (  # noqa: F401  (re-exported for tests and scripts)
    EXIT_BAD_INPUT,
    EXIT_INFEASIBLE,
    _err,
    _fail,
    _out,
    _progress,
    _spec_error,
    _table,
    handles_errors,
    only_with,
    output_option,
)
from shoal.errors import SpecError
from shoal.units import fmt_per_usd, fmt_seconds

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Plan LLM training and serving on mixed, scattered GPU pools.")
import_app = typer.Typer(no_args_is_help=True, help="Convert other tools' files into shoal's formats.")
catalog_app = typer.Typer(no_args_is_help=True, help="The built-in GPU and model catalog.")
app.add_typer(import_app, name="import")
app.add_typer(catalog_app, name="catalog")


def load_plan(path: Path):
    """A TrainingPlan from a JSON or YAML file; every problem is a SpecError naming the file."""
    from shoal.specs.plan import TrainingPlan
    from shoal.specs.scenario import read_document

    data = read_document(path)
    if "plans" in data and "pareto" in data:
        raise SpecError("a `shoal plan --json` result, not a plan: write the best plan with "
                        "`shoal plan ... -o plan.json` (or take its plans[i].plan)", file=str(path))
    try:
        return TrainingPlan.model_validate(data)
    except ValidationError as exc:
        raise _spec_error(exc, str(path)) from None


# ---------------------------------------------------------------------------------------- estimate


@app.command()
@handles_errors
def estimate(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    plan: Annotated[Path, typer.Option("--plan", "-p", metavar="PLAN",
                                       help="training plan file (JSON or YAML)")],
    as_json: Annotated[bool, typer.Option("--json", help="print the estimate as JSON only")] = False,
    timeline: Annotated[Path | None, output_option("--timeline", help="write a timeline figure here")] = None,
) -> None:
    """Time, memory and money of one plan: per stage, per worker and in total."""
    from shoal.estimate import estimate as run_estimate
    from shoal.files import check_outputs
    from shoal.problem import load_problem

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
        typer.echo(json.dumps(est.to_json() | {"stack": problem.stack.name}
                              | ({"timeline": tl_doc} if tl_doc else {})))
        return
    out = _out()
    out.print(_stage_table(est))
    out.print(_worker_table(est))
    out.print(_summary_table(est))
    out.print(f"software stack: {problem.stack.name} (job.stack; `shoal catalog stacks`)")
    if timeline is not None:
        out.print(f"timeline written to {timeline}")


class Strategy(StrEnum):
    auto = "auto"
    sailor = "sailor"
    espresso = "espresso"
    zorse = "zorse"
    atlas = "atlas"
    exhaustive = "exhaustive"


class Goal(StrEnum):
    max_throughput = "max-throughput"
    min_cost = "min-cost"
    max_throughput_per_dollar = "max-throughput-per-dollar"


@app.command()
@handles_errors
def plan(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    strategy: Annotated[Strategy, typer.Option(help="search strategy")] = Strategy.auto,
    objective: Annotated[Goal | None, typer.Option(help="default: the scenario's")] = None,
    max_cost_per_iter: Annotated[float | None, typer.Option(
        "--max-cost-per-iter", help="USD per iteration at most")] = None,
    min_throughput: Annotated[float | None, typer.Option(
        "--min-throughput", help="iterations per second at least")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus", min=1, help="GPUs in total at most")] = None,
    iterations: Annotated[int | None, typer.Option(
        "--iterations", min=1, help="training-time SLO: this many iterations ...")] = None,
    within: Annotated[str | None, typer.Option(
        "--within", help="... must finish within this time, e.g. 72h or 3d")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="plans to list")] = 5,
    budget: Annotated[float, typer.Option("--budget", min=0.1, help="search time limit, seconds")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option("-o", "--output", help="write the best plan here")] = None,
    figure: Annotated[Path | None, output_option("--figure", help="write the Pareto front here")] = None,
) -> None:
    """Which GPUs to rent and how to parallelise: ranked plans and the throughput-cost front."""
    from shoal.estimate import estimate as run_estimate
    from shoal.files import check_outputs, write_json
    from shoal.problem import load_problem
    from shoal.training.planners import Limits, Reuse, complete_front, search

    check_outputs([(output, "--output"), (figure, "--figure")], [scenario])
    for value, option in ((max_cost_per_iter, "--max-cost-per-iter"),
                          (min_throughput, "--min-throughput")):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise SpecError("must be a positive number", field=option, value=value,
                            allowed="a number > 0")
    problem = load_problem(scenario)
    cons = problem.constraints.model_copy(update={k: v for k, v in {
        "max_cost_per_iteration_usd": max_cost_per_iter, "min_iters_per_s": min_throughput,
        "max_gpus": max_gpus, "deadline": _deadline(iterations, within)}.items() if v is not None})
    goal = objective.value if objective else None
    reuse = Reuse()

    def run(status=None):
        found = search(problem, strategy=strategy.value, objective=goal, constraints=cons,
                       top_k=top, limits=Limits(budget_s=budget), reuse=reuse)
        if status is not None:
            status.update("completing the throughput-cost front (the other objectives' searches)...")
        return complete_front(problem, found, strategy=strategy.value, constraints=cons,
                              limits=Limits(budget_s=budget), reuse=reuse)
    if as_json:
        result = run()
    else:
        with _progress().status(f"searching plans ({strategy.value})...") as status:
            result = run(status)
    best = result.ranked[0].plan
    if output is not None:
        write_json(output, best.to_json())
    if figure is not None:
        from shoal.report.figures import draw_pareto, front_doc

        draw_pareto(front_doc(result), figure)
    if as_json:
        slo = cons.deadline

        def entry(c):
            e = {"plan": c.plan.to_json(), "estimate": run_estimate(problem, c.plan).to_json(),
                 "rent": _rent(problem, c.plan)}
            if slo:
                e["slo_total"] = {"cost_usd": c.cost_usd * slo.iterations,
                                  "time_s": c.iteration_time_s * slo.iterations}
            return e
        typer.echo(json.dumps({
            "search_time_s": result.stats.search_time_s, "objective": result.objective,
            "slo": {"iterations": slo.iterations, "within_s": slo.within} if slo else None,
            "plans": [entry(c) for c in result.ranked], "pareto": [entry(c) for c in result.pareto],
            "stats": result.stats.to_json()}))
        return
    out = _out()
    slo = cons.deadline
    t = _table(f"Best plans ({result.objective}, {result.stats.strategy})",
               ["#", "it/s", "tokens/s", "$/iter"]
               + ([f"$ for {slo.iterations:,} it", f"time for {slo.iterations:,} it"] if slo else [])
               + ["GPUs", "stages", "pipelines", "mbs", "schedule", "stages: GPU(TP) x replicas"],
               left=("stages: GPU(TP) x replicas",))
    tokens = problem.job.global_batch * problem.job.seq_len
    for i, c in enumerate(result.ranked):
        p = c.plan
        total = ([f"{c.cost_usd * slo.iterations:,.4g}",
                  fmt_seconds(c.iteration_time_s * slo.iterations)] if slo else [])
        t.add_row(str(i + 1), f"{c.throughput_iters_per_s:.4g}", f"{tokens * c.throughput_iters_per_s:,.0f}",
                  f"{c.cost_usd:.4g}", *total, str(c.num_gpus), str(len(p.stages)),
                  str(len(p.stages[0].replicas)), str(p.microbatch_size),
                  p.schedule + (f" x{p.ministages}" if p.schedule == "zorse" else ""), p.summary())
    out.print(t)
    if slo:
        out.print(f"SLO: {slo.iterations:,} iterations within {fmt_seconds(slo.within)}")
    rent = _table("What to rent for plan 1", ["zone", "GPU", "GPUs", "VMs (count x GPUs each)"],
                  left=("zone", "GPU", "VMs (count x GPUs each)"))
    for row in _rent(problem, best):
        rent.add_row(row["zone"], row["gpu"], str(row["gpus"]),
                     " + ".join(f"{v['count']} x {v['gpus_per_vm']}" for v in row["vms"]))
    out.print(rent)
    pt = _table("Throughput-cost Pareto front", ["it/s", "$/iter", "GPUs", "stages: GPU(TP) x replicas"],
                left=("stages: GPU(TP) x replicas",))
    for c in result.pareto:
        pt.add_row(f"{c.throughput_iters_per_s:.4g}", f"{c.cost_usd:.4g}", str(c.num_gpus), c.plan.summary())
    out.print(pt)
    st = result.stats
    out.print(f"searched in {st.search_time_s:.2f} s: {st.candidates_costed} plans costed, {st.oom} out of "
              f"memory, {st.infeasible} against a constraint, {st.pruned} shapes pruned"
              + (" (time budget reached: the search was cut short)" if st.truncated else ""))
    if output is not None:
        out.print(f"best plan written to {output}")
    if figure is not None:
        out.print(f"Pareto front drawn in {figure}")


def _deadline(iterations: int | None, within: str | None):
    """The training-time SLO from ``--iterations`` and ``--within`` (both or neither)."""
    from shoal.specs.job import Deadline
    from shoal.units import UnitError, parse_seconds

    if iterations is None and within is None:
        return None
    if iterations is None or within is None:
        raise SpecError("a training-time SLO needs both --iterations and --within",
                        field="--iterations" if iterations is None else "--within",
                        value=None, allowed="e.g. --iterations 10000 --within 72h")
    try:
        seconds = parse_seconds(within)
    except UnitError as e:
        raise SpecError(str(e), field="--within", value=within, allowed="e.g. 72h, 3d, 90min") from None
    if seconds <= 0:
        raise SpecError("the SLO must be a positive time", field="--within", value=within,
                        allowed="e.g. 72h, 3d, 90min")
    return Deadline(iterations=iterations, within=seconds)


def _rent(problem, p) -> list[dict]:
    """GPUs and VMs to rent per zone and GPU type (``vm_shapes``). The cost of a plan charges
    the GPUs, as the estimate does."""
    groups: dict[tuple[str, str], list[int]] = {}
    for s in p.stages:
        for r in s.replicas:
            groups.setdefault((r.gpu, r.zone), []).append(r.tp)
    rows = []
    for (g, z), tps in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        gpn = problem.gpus[g].gpus_per_node
        vms = vm_shapes(tps, gpn)
        rows.append({"zone": z, "gpu": g, "gpus": sum(tps), "gpus_per_node": gpn,
                     "nodes": sum(vms.values()),
                     "vms": [{"gpus_per_vm": size, "count": c} for size, c in vms.items()]})
    return rows


def vm_shapes(tps: list[int], gpus_per_node: int) -> dict[int, int]:
    """GPUs per VM -> VMs that hold TP groups of ``tps`` GPUs (powers of two, none larger than
    a node) with no GPU idle: the groups go into nodes first fit, largest first; a node they
    fill is one VM of ``gpus_per_node`` GPUs, and a node they do not is rented as VMs of a
    power of two GPUs each, largest first (clouds offer 1, 2, 4 and 8-GPU shapes), which its
    groups fill exactly."""
    nodes: list[int] = []  # GPUs used per node
    for t in sorted(tps, reverse=True):
        i = next((i for i, used in enumerate(nodes) if used + t <= gpus_per_node), None)
        if i is None:
            nodes.append(t)
        else:
            nodes[i] += t
    out: dict[int, int] = {}
    for used in nodes:
        if used == gpus_per_node:
            out[used] = out.get(used, 0) + 1
            continue
        size = 1 << (used.bit_length() - 1)
        while used:
            if size <= used:
                out[size] = out.get(size, 0) + 1
                used -= size
            size >>= 1
    return dict(sorted(out.items(), reverse=True))


def _s(t: float) -> str:
    from shoal.units import fmt_seconds

    return fmt_seconds(t) if t > 0 else "0"


def _stage_table(est) -> Table:
    t = _table("Stages (per-microbatch times of the slowest replica)",
               ["stage", "layers", "replicas", "fwd\n/mb", "bwd\n/mb", "send/recv\n/mb", "grad\nsync",
                "update", "busy", "bubble", "profile"], left=("layers", "profile"))
    t.caption = "* straggler: the stage whose busiest replica works longest; it sets the pace"
    t.caption_justify = "left"
    for s in est.stages:
        a, b = s.layers
        t.add_row(
            Text(f"{s.stage}*", style="bold yellow") if s.straggler else Text(f"{s.stage} "),
            f"[{a}, {b})", str(s.replicas), _s(s.compute_fwd_s), _s(s.compute_bwd_s),
            _s(s.send_recv_s), _s(s.gradient_sync_s), _s(s.update_s), _s(s.busy_s), _s(s.bubble_s),
            s.profile_source,
        )
    return t


def _worker_table(est) -> Table:
    from shoal.units import fmt_bytes

    t = _table("Workers (peak memory per GPU; in flight = microbatches whose activations are held; "
               "identical neighbouring replicas share a row)",
               ["stage", "replica", "gpu", "zone", "tp", "peak\nmemory", "capacity", "used",
                "in flight", "memory"], left=("gpu", "zone"), whole=("gpu", "zone"))
    for first, last in _runs(est.workers):
        w = first
        used = w.peak_memory_bytes / w.capacity_bytes if w.capacity_bytes else float("inf")
        reps = str(w.replica) if first is last else f"{first.replica}-{last.replica}"
        t.add_row(
            str(w.stage), reps, w.gpu, w.zone, str(w.tp), fmt_bytes(w.peak_memory_bytes),
            fmt_bytes(w.capacity_bytes), f"{used:.0%}", str(w.microbatches_in_flight),
            Text("OOM", style="bold red") if w.oom else "ok", style="red" if w.oom else None,
        )
    return t


def _runs(workers):
    """(first, last) of each run of consecutive replicas of a stage that would print the same."""
    def key(w):
        return (w.stage, w.gpu, w.zone, w.tp, round(w.peak_memory_bytes), round(w.capacity_bytes),
                w.microbatches_in_flight, w.oom)

    runs: list[list] = []
    for w in workers:
        if runs and key(runs[-1][1]) == key(w) and runs[-1][1].replica + 1 == w.replica:
            runs[-1][1] = w
        else:
            runs.append([w, w])
    return [tuple(r) for r in runs]


def _summary_table(est) -> Table:
    from shoal.units import fmt_bytes, fmt_seconds

    t = Table(title="Summary", show_header=False, box=box.SIMPLE, title_justify="left",
              title_style="bold")
    t.add_column("what")
    t.add_column("value", justify="right")
    n_oom = sum(w.oom for w in est.workers)
    t.add_row("GPUs", str(est.num_gpus))
    t.add_row("iteration time", fmt_seconds(est.iteration_time_s))
    t.add_row("iterations/s", f"{est.throughput_iters_per_s:.4g}")
    t.add_row("tokens/s", f"{est.tokens_per_s:,.0f}")
    t.add_row("MFU", f"{est.mfu:.1%}")
    t.add_row("$/iteration compute", f"{est.cost_compute_usd:.4f}")
    t.add_row("$/iteration egress", f"{est.cost_egress_usd:.4f}")
    t.add_row("$/iteration total", f"{est.cost_per_iteration_usd:.4f}")
    t.add_row("peak memory", fmt_bytes(est.peak_memory_bytes))
    t.add_row("memory", Text(f"OOM on {n_oom} of {len(est.workers)} workers", style="bold red")
              if est.oom else Text("fits on every worker", style="green"))
    return t


# ------------------------------------------------------------------------------------------ replay


class Policy(StrEnum):
    shoal = "shoal"
    always = "always"
    never = "never"
    oracle = "oracle"
    all = "all"


@app.command()
@handles_errors
def replay(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    trace: Annotated[Path | None, typer.Option(
        "--trace", help="availability trace: Sailor CSV or controller JSON, or shoal events")] = None,
    synthetic: Annotated[str | None, typer.Option(
        "--synthetic", help="instead of --trace: generate one (spot, scarcity, outage)")] = None,
    seed: Annotated[int | None, typer.Option(
        "--seed", min=0, help="seed of --synthetic (default 0)")] = None,
    hours: Annotated[float | None, typer.Option(
        "--hours", min=0.01, help="length of --synthetic (default 8)")] = None,
    trace_gpu: Annotated[str | None, typer.Option(
        "--trace-gpu", help="GPU type of a controller JSON trace (default A100-40GB)")] = None,
    trace_zone: Annotated[str | None, typer.Option(
        "--trace-zone", help="zone of a controller JSON trace (default: the only one with it)")] = None,
    policy: Annotated[Policy, typer.Option(help="when to move plans; 'all' compares them")] = Policy.shoal,
    strategy: Annotated[Strategy, typer.Option(help="planner for each state")] = Strategy.auto,
    budget: Annotated[float, typer.Option("--budget", min=0.1, help="search time limit per state, s")] = 60.0,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option("-o", "--output", help="write the JSON here")] = None,
    figure: Annotated[Path | None, output_option(
        "--figure", help="write availability, throughput and tokens over time here")] = None,
) -> None:
    """Follow availability over time: the plan at every change, when to move, tokens and dollars."""
    from shoal.elastic.replan import Replanner
    from shoal.elastic.replay import plan_trace, simulate
    from shoal.elastic.traces import synthetic as make_synthetic
    from shoal.files import check_outputs, write_json
    from shoal.io.traces import load_trace
    from shoal.problem import load_problem

    check_outputs([(output, "--output"), (figure, "--figure")], [scenario, trace])
    if (trace is None) == (synthetic is None):
        raise SpecError("give exactly one of --trace FILE and --synthetic KIND", field="--trace")
    # options of the other way of giving a trace would be ignored: refused instead
    only_with("--synthetic", trace is None, ("--seed", seed), ("--hours", hours))
    only_with("--trace", trace is not None, ("--trace-gpu", trace_gpu),
              ("--trace-zone", trace_zone))
    seed = 0 if seed is None else seed
    hours = 8.0 if hours is None else hours
    if not math.isfinite(hours):
        raise SpecError("must be a finite number of hours", field="--hours", value=hours,
                        allowed="a number >= 0.01")
    problem = load_problem(scenario)
    if trace is not None:
        tr = load_trace(trace, problem, gpu=trace_gpu, zone=trace_zone)
    else:
        tr = make_synthetic(problem, synthetic, seed=seed, duration_s=hours * 3600)
    replanner = Replanner(problem, strategy=strategy.value, budget_s=budget)
    if as_json:
        options = plan_trace(problem, tr, replanner)
    else:
        from rich.progress import Progress

        with Progress(console=_progress(), transient=True) as bar:
            task = bar.add_task("planning each availability state", total=len(tr.states))
            options = plan_trace(problem, tr, replanner,
                                 lambda done, total: bar.update(task, completed=done))
    names = [p.value for p in Policy if p is not Policy.all] if policy is Policy.all else [policy.value]
    runs = [simulate(problem, tr, options, name) for name in names]
    doc = _replay_json(problem, tr, runs, replanner)
    if output is not None:
        write_json(output, doc)
    if figure is not None:
        from shoal.report.figures import draw_replay

        draw_replay(doc, figure)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    out = _out()
    cut = [c.timed_out for c in replanner.calls]
    if len(runs) == 1:
        out.print(_replay_steps(runs[0], cut))
    totals = _table(f"Totals over {tr.end_s / 3600:.2f} h of {tr.source}",
                    ["policy", "tokens", "USD", "tokens/USD", "moves", "switching", "checkpoints"],
                    left=("policy",))
    for r in runs:
        t = r.totals()
        totals.add_row(r.policy, f"{t['tokens']:.4g}", f"{t['cost_usd']:,.2f}",
                       fmt_per_usd(t["tokens_per_usd"]), str(t["switches"]), _s(t["switch_time_s"]),
                       _s(t["checkpoint_time_s"]))
    out.print(totals)
    lost = [f"{r.policy} {r.lost_tokens:.4g}" for r in runs if r.lost_tokens > 0]
    if lost:
        out.print("Not in the tokens: work trained, then lost and not redone by the trace's end: "
                  + ", ".join(lost))
    calls = [c.time_s for c in replanner.calls if not c.remembered]
    if calls:
        out.print(f"{len(tr.states)} availability states, {len(calls)} distinct: planned in "
                  f"{sum(calls):.2f} s (slowest {max(calls):.2f} s)")
    if any(cut):
        out.print(f"{sum(cut)} states' searches were cut short by --budget {budget:g} s "
                  "(marked *): a larger budget may find faster plans for them")
    for path, what in ((output, "result"), (figure, "figure")):
        if path is not None:
            out.print(f"{what} written to {path}")


def _avail_text(avail: dict, zones: list[str]) -> str:
    """'A100-40GB 8/0, V100-16GB 8/8': GPUs of each type per zone, zones in ``zones`` order."""
    gpus = sorted({g for g, _ in avail})
    return ", ".join(f"{g} " + "/".join(str(avail.get((g, z), 0)) for z in zones) for g in gpus)


def _replay_steps(rep, cut: list[bool]) -> Table:
    zones = sorted({z for s in rep.steps for _, z in s.avail})
    t = _table(f"Plan per availability change (policy {rep.policy}; GPUs available per zone: "
               f"{'/'.join(zones)})",
               ["time", "available", "decision", "it/s", "$/h GPUs\n+ egress", "move cost",
                "switching", "plan"],
               left=("available", "decision", "plan"))
    for s, timed_out in zip(rep.steps, cut, strict=True):
        p = s.plan
        t.add_row(f"{s.time_s / 3600:.2f} h" + (" *" if timed_out else ""),
                  _avail_text(s.avail, zones), s.decision,
                  f"{1 / p.iteration_time_s:.4g}" if p else "-",
                  f"{p.usd_per_s * 3600:,.1f} + {_egress_per_h(p):,.1f}" if p else "-",
                  _s(s.switch.total_s) if s.switch else "",
                  _s(s.switch_s) if s.switch_s > 0 else "",
                  p.cand.plan.summary() if p and s.decision != "keep" else "")
    return t


def _egress_per_h(p) -> float:
    """USD per hour a replay plan pays for egress while it trains (its GPUs are ``usd_per_s``;
    no egress while switching)."""
    return p.egress_usd_per_iter / p.iteration_time_s * 3600


def _replay_json(problem, tr, runs, replanner) -> dict:
    index: dict = {}
    plans = []
    for r in runs:
        for p in r.plans:
            if p.cand.spec not in index:
                index[p.cand.spec] = len(plans)
                plans.append({"plan": p.cand.plan.to_json(), "summary": p.cand.plan.summary(),
                              "iters_per_s": 1 / p.iteration_time_s, "tokens_per_s": p.tokens_per_s,
                              "usd_per_h": p.usd_per_s * 3600,
                              "egress_usd_per_h": _egress_per_h(p), "gpus": p.cand.num_gpus})

    cut = [c.timed_out for c in replanner.calls]  # one call per state, in order

    def one(r) -> dict:
        return {"policy": r.policy, "objective": r.objective, "totals": r.totals(), "steps": [
            {"time_s": s.time_s, "duration_s": s.duration_s, "search_timed_out": cut[i],
             "available": {f"{g}@{z}": n for (g, z), n in sorted(s.avail.items())},
             "decision": s.decision, "plan": index[s.plan.cand.spec] if s.plan else None,
             "iters_per_s": 1 / s.plan.iteration_time_s if s.plan else 0.0,
             "usd_per_h": s.plan.usd_per_s * 3600 if s.plan else 0.0,
             "egress_usd_per_h": _egress_per_h(s.plan) if s.plan else 0.0,
             "switch": s.switch.to_json() if s.switch else None, "switch_s": s.switch_s,
             "checkpoint_s": s.checkpoint_s, "checkpoint_every_s": s.checkpoint_every_s,
             "train_s": s.train_s, "tokens": s.tokens, "usd": s.usd}
            for i, s in enumerate(r.steps)]}

    calls = [c.time_s for c in replanner.calls if not c.remembered]
    doc = {"trace": tr.source, "states": len(tr.states), "end_s": tr.end_s, "plans": plans,
           "replan": {"states": len(replanner.calls), "searched": len(calls),
                      "total_s": sum(calls), "max_s": max(calls, default=0.0),
                      "timed_out": sum(cut)}}
    if len(runs) == 1:
        return {**one(runs[0]), **doc}
    return {**doc, "replays": [one(r) for r in runs]}


# ------------------------------------------------------------------------------------------ schema


class SchemaKind(StrEnum):
    scenario = "scenario"
    plan = "plan"
    serving = "serving"


@app.command()
@handles_errors
def schema(
    kind: Annotated[SchemaKind, typer.Argument(help="which file format")] = SchemaKind.scenario,
    markdown: Annotated[bool, typer.Option(
        "--markdown", help="print a markdown reference of every field instead")] = False,
) -> None:
    """Print the JSON Schema (or a markdown reference) of the scenario, training-plan or serving
    format."""
    from shoal.specs.reference import markdown_reference, roots

    if markdown:
        # nl=False: the text ends with its own newline, so the file equals markdown_reference()
        typer.echo(markdown_reference(kind.value), nl=False)
        return
    model = roots()[kind.value]
    typer.echo(json.dumps(model.model_json_schema(by_alias=True), indent=2))


# ------------------------------------------------------------------------------------------ import


@import_app.command("sailor")
@handles_errors
def import_sailor_cmd(
    training_config: Annotated[Path, typer.Option("--training-config", help="Sailor training_config_*.json")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="directory to write into")],
    cluster_config: Annotated[Path | None, typer.Option(
        "--cluster-config", help="Sailor cluster config (GPUs per node)")] = None,
    profiles: Annotated[Path | None, typer.Option(
        "--profiles", help="directory of <GPU>/profile.json measured profiles")] = None,
    profiles_training_config: Annotated[Path | None, typer.Option(
        "--profiles-training-config",
        help="training config of the model the --profiles were measured on, when it is another "
             "model: they are then imported as transfer profiles")] = None,
    transfer_profiles: Annotated[Path | None, typer.Option(
        "--transfer-profiles",
        help="directory of <GPU>/profile.json measured on another model, used to predict GPUs "
             "the --profiles lack")] = None,
    transfer_training_config: Annotated[Path | None, typer.Option(
        "--transfer-training-config",
        help="training config of the model the --transfer-profiles were measured on")] = None,
    network: Annotated[Path | None, typer.Option(
        "--network", help="directory of Sailor's fitted network curves")] = None,
    trace: Annotated[Path | None, typer.Option("--trace", help="availability trace CSV")] = None,
    step: Annotated[int | None, typer.Option(
        "--step", help="row of the trace to use as the pool (0-based; default 0, the first)")] = None,
    plan: Annotated[Path | None, typer.Option("--plan", help="Sailor plan_config_*.json")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """Write a shoal scenario (and profile, plan) from Sailor's files."""
    from shoal.files import check_folder
    from shoal.io.sailor import SailorFiles, import_sailor

    check_folder(out_dir, "--out", parents=True)
    if step is not None and trace is None:
        raise SpecError("--step needs --trace", field="--step", value=step)
    if profiles_training_config is not None:  # the --profiles are of another model
        if profiles is None or transfer_profiles is not None:
            raise SpecError("--profiles-training-config goes with --profiles and without "
                            "--transfer-profiles (or use --transfer-profiles with "
                            "--transfer-training-config)", field="--profiles-training-config")
        profiles, transfer_profiles = None, profiles
        transfer_training_config = profiles_training_config
    written = import_sailor(SailorFiles(
        training_config=training_config, cluster_config=cluster_config, profiles=profiles,
        network=network, trace=trace, step=step, plan=plan,
        transfer_profiles=transfer_profiles, transfer_training_config=transfer_training_config,
    ), out_dir)
    if network is None:
        _err().print(Text("note: no --network given, so the scenario has no links; add a network "
                          "section (e.g. network.defaults.same_zone) before estimating with it"),
                     soft_wrap=True)
    if as_json:
        typer.echo(json.dumps({"written": {k: str(v) for k, v in written.items()}}))
        return
    t = _table("Written", ["file", "path"], left=("file", "path"))
    for name, path in written.items():
        t.add_row(name, str(path))
    _out().print(t)


# ----------------------------------------------------------------------------------------- catalog


@catalog_app.command("gpus")
@handles_errors
def catalog_gpus(
    as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False,
) -> None:
    """GPU types: memory, peak FLOP/s, bandwidths, node size and price."""
    from shoal import catalog
    from shoal.units import fmt_bytes

    entries = list(catalog.gpus().entries.values())
    if as_json:
        sources = catalog.gpu_sources()
        typer.echo(json.dumps({"gpus": [{**asdict(g), "source": sources.get(g.name, {})}
                                        for g in entries]}))
        return
    t = _table("GPUs (dense peak FLOP/s, bf16 or else fp16; $/h on demand, '-' where no public "
               "price; SMs, TF32/FP8 peaks, node network and sources: --json)",
               ["name", "memory", "16-bit\nTFLOPS", "fp32\nTFLOPS", "mem\nGB/s", "intra-node\nGB/s",
                "GPUs/\nnode", "$/h"], left=("name",), whole=("name",))
    for g in entries:
        t.add_row(
            g.name, fmt_bytes(g.memory_bytes),
            f"{g.flops_16 / 1e12:.1f}" + ("" if g.bf16 else " fp16"), f"{g.flops_32 / 1e12:.1f}",
            f"{g.mem_bw_Bps / 1e9:.0f}", f"{g.intra_node_bw_Bps / 1e9:.0f}", str(g.gpus_per_node),
            "-" if g.price_usd_per_h is None else f"{g.price_usd_per_h:.2f}",
        )
    _out().print(t)


@catalog_app.command("models")
@handles_errors
def catalog_models(
    as_json: Annotated[bool, typer.Option("--json", help="print the catalog as JSON")] = False,
) -> None:
    """Model architectures: layers, widths, vocabulary and parameter count."""
    from shoal import catalog
    from shoal.profiles.layers import layer_sizes

    rows = []
    for m in catalog.models().entries.values():
        params = float(layer_sizes(m, 2048).params.sum())
        rows.append({"name": m.name, "num_layers": m.num_layers, "hidden_size": m.hidden_size,
                     "num_heads": m.num_heads, "num_kv_heads": m.kv_heads, "ffn_hidden_size": m.ffn,
                     "vocab_size": m.vocab_size, "params_billions": params / 1e9})
    if as_json:
        typer.echo(json.dumps({"models": rows}))
        return
    t = _table("Models (layers = transformer blocks; params at sequence length 2048, the output "
               "projection counted apart from the embedding, as the estimator does)",
               ["name", "layers", "hidden", "heads", "kv heads", "ffn", "vocab", "params (B)"],
               left=("name",), whole=("name",))
    for r in rows:
        t.add_row(r["name"], str(r["num_layers"]), str(r["hidden_size"]), str(r["num_heads"]),
                  str(r["num_kv_heads"]), str(r["ffn_hidden_size"]), str(r["vocab_size"]),
                  f"{r['params_billions']:,.2f}")
    _out().print(t)


@catalog_app.command("stacks")
@handles_errors
def catalog_stacks(
    as_json: Annotated[bool, typer.Option("--json", help="print the stacks as JSON")] = False,
) -> None:
    """Software stacks a scenario's job.stack names: kernels, overlap and memory layout.

    Example: shoal catalog stacks --json
    """
    from shoal.catalog.stacks import DEFAULT_STACK, stacks

    docs = {n: s.model_dump(mode="json", by_alias=True, exclude_none=True)
            for n, s in stacks().items()}
    if as_json:
        typer.echo(json.dumps({"default": DEFAULT_STACK, "stacks": list(docs.values())}))
        return
    t = _table(f"Software stacks (default: {DEFAULT_STACK}; kernels as shares of the datasheet "
               "peaks, by GPU architecture)",
               ["stack", "kernels", "gemm", "attn fwd", "attn bwd", "memory", "attention",
                "overlap"], left=("stack", "kernels", "attention"), whole=("stack",))
    for name, spec in stacks().items():
        for i, key in enumerate(spec.kernels):
            eff = spec.kernel_efficiency(key, key)
            t.add_row(name if i == 0 else "", key, *(f"{eff[f]:.2f}" for f in (
                "gemm", "attention_fwd", "attention_bwd", "memory")),
                spec.attention if i == 0 else "",
                f"{spec.timing.grad_reduce_overlap:g}" if i == 0 else "")
    _out().print(t)


@app.command()
@handles_errors
def train(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="training plan (JSON or YAML)")],
    model: Annotated[str, typer.Option(
        "--model", help="catalog model (e.g. tiny), a HuggingFace config.json, or a folder with "
                        "config.json and *.safetensors (its weights)")],
    steps: Annotated[int, typer.Option("--steps", min=1, help="iterations to run")],
    seq: Annotated[int | None, typer.Option(
        "--seq", min=1, help="sequence length (default: the model's, at most 128)")] = None,
    seed: Annotated[int, typer.Option(min=0, help="seed of weights and data")] = 0,
    dtype: Annotated[str, typer.Option(help="float32 or float64")] = "float32",
    data: Annotated[Path | None, typer.Option(
        "--data", help="token ids (flat uint16/uint32 binary) or text (parquet, arrow, JSONL) "
                       "[default: random tokens]")] = None,
    data_dtype: Annotated[str | None, typer.Option(
        "--data-dtype", help="uint16 or uint32 [default: the sidecar FILE.json's]")] = None,
    shuffle: Annotated[str, typer.Option(
        "--shuffle", help="on: random windows by (seed, step); off: consecutive windows")] = "on",
    tokenizer: Annotated[Path | None, typer.Option(
        "--tokenizer", help="tokenizer.json for text --data")] = None,
    text_column: Annotated[str, typer.Option("--text-column", help="text --data's column")] = "text",
    device: Annotated[str | None, typer.Option(
        "--device", help="cuda (NCCL) or cpu (gloo) [default: cuda when available]")] = None,
    precision: Annotated[str, typer.Option(
        "--precision", help="fp32, or autocast bf16 or fp16 (weights in --dtype)")] = "fp32",
    save_hf: Annotated[Path | None, output_option(
        "--save-hf", help="write the trained model here as a HuggingFace folder")] = None,
    checkpoint_dir: Annotated[Path | None, typer.Option(
        "--checkpoint-dir",
        help="write checkpoints here: after the last step, and every --checkpoint-every steps")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume", help="start from the newest checkpoint in --checkpoint-dir (any plan)")] = False,
    nnodes: Annotated[int, typer.Option("--nnodes", min=1, help="machines taking part")] = 1,
    node_rank: Annotated[int, typer.Option("--node-rank", min=0, help="this machine's index")] = 0,
    rdzv_endpoint: Annotated[str | None, typer.Option(
        "--rdzv-endpoint", help="host:port of the rendezvous (several machines)")] = None,
    elastic: Annotated[bool, typer.Option(
        "--elastic", help="kill-free reconfiguration when workers leave or join (this machine)")] = False,
    checkpoint_every: Annotated[int | None, typer.Option(
        "--checkpoint-every", min=1,
        help="a checkpoint every K steps (elastic: asynchronous) [default: elastic 2, else "
             "after the last step only]")] = None,
    keep: Annotated[int | None, typer.Option(
        "--keep", min=1, help="the newest K checkpoints are kept [default: elastic 2, else all]")] = None,
    fault_at: Annotated[int | None, typer.Option(
        "--fault-at", min=1, help="elastic demo: kill the last worker after this step")] = None,
    join_at: Annotated[int | None, typer.Option(
        "--join-at", min=1, help="elastic demo: add a worker after this step")] = None,
    profile: Annotated[Path | None, typer.Option(
        "--profile", help="elastic: a `shoal profile` file for the planner's estimates")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
) -> None:
    """Run a plan on torch.distributed through torchrun (gloo on CPU, NCCL on GPUs); with
    --elastic, the workers switch plans without restarting when workers leave or join."""
    _needs_torch("shoal train")
    from shoal.runtime import launch as rl

    p = load_plan(plan_file)
    opts = rl.TrainOptions(
        model, steps, seq, seed, dtype, rl.DataOptions(
            str(data) if data else None, data_dtype, _on_off(shuffle, "--shuffle"),
            str(tokenizer) if tokenizer else None, text_column),
        device, precision, save_hf, rl.Launch(nnodes, node_rank, rdzv_endpoint, checkpoint_dir,
                                              resume, checkpoint_every, keep),
        elastic, fault_at, join_at, profile)
    with tempfile.TemporaryDirectory() as scratch:
        kind, *what = rl.prepare(p, str(plan_file), opts, Path(scratch))
        if kind == "node":
            from shoal.runtime.elastic_worker import run_node

            ok = run_node(*what)
            _progress().print(f"node {node_rank}: {ok} of {what[1]} workers ended")
            return
        if kind == "elastic":
            _train_elastic(p, what[1], what[0], as_json)
            return
        doc = rl.train(what[0], opts.launch, None if as_json else _print_step)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    _print_trained(doc, save_hf)


def _on_off(value: str, option: str) -> bool:
    if value not in ("on", "off"):
        raise SpecError("on or off", field=option, value=value, allowed="on, off")
    return value == "on"


def _print_step(d: dict) -> None:
    _progress().print(f"step {d['step']}: loss {d['loss']:.4f}, {d['step_time_s']:.3f} s, "
                      f"{d['tokens_per_s']:,.0f} tokens/s, MFU {d['mfu']:.1%}", soft_wrap=True)


def _print_trained(doc: dict, save_hf: Path | None) -> None:
    t = _table(f"Trained {doc['steps']} steps on {doc['world_size']} processes ({doc['backend']}, "
               f"{doc['device']}, {doc['precision']})", ["metric", "value"], left=("metric",))
    t.add_row("final loss", f"{doc['final_loss']:.5f}")
    t.add_row("mean step time", _s(doc["step_time_s"]))
    pred = doc["predicted"]["iteration_time_s"]
    t.add_row("predicted step time (stack shoal)",
              f"{_s(pred)} (measured {doc['measured_over_predicted']:.2f}x)" if pred
              else f"none ({doc['predicted']['why_none']})")
    t.add_row("tokens per iteration", f"{doc['tokens_per_iteration']:,}")
    t.add_row("tokens/s", f"{doc['tokens_per_iteration'] / doc['step_time_s']:,.0f}")
    t.add_row("MFU", f"{doc['mfu']:.2%}" if doc["mfu"] else "—")
    _out().print(t)
    if save_hf is not None:
        _out().print(f"model written to {save_hf} (HuggingFace format)")


@app.command()
@handles_errors
def profile(
    model: Annotated[str, typer.Option("--model", help="catalog model (e.g. tiny)")],
    output: Annotated[Path, output_option("-o", "--output", help="profile file to write")],
    device: Annotated[str, typer.Option(help="cpu (cuda: not on this build)")] = "cpu",
    tp: Annotated[str, typer.Option(help="TP degrees, comma-separated")] = "1",
    mbs: Annotated[str, typer.Option(help="microbatch sizes, comma-separated")] = "1,2",
    seq: Annotated[int | None, typer.Option("--seq", min=1, help="sequence length")] = None,
    procs: Annotated[int, typer.Option(
        "--procs", min=1, help="processes measuring at once (as many as the plans use)")] = 2,
    reps: Annotated[int, typer.Option("--reps", min=1, help="repetitions per measurement")] = 5,
    as_json: Annotated[bool, typer.Option("--json", help="print what was measured as JSON")] = False,
) -> None:
    """Measure per-layer times and link speeds with the runtime; write a profile file."""
    from shoal import catalog
    from shoal.files import check_output

    _needs_torch("shoal profile")
    from shoal.runtime import profiler
    from shoal.runtime.launch import seq_for
    from shoal.runtime.train import launch

    check_output(output, "--output")
    if device != "cpu":
        raise SpecError("only the CPU is available to this build", field="--device",
                        value=device, allowed="cpu")
    spec = catalog.models().get(model, field="--model")
    lists = {}
    for text, option in ((tp, "--tp"), (mbs, "--mbs")):
        try:
            lists[option] = [int(x) for x in text.split(",")]
        except ValueError:
            raise SpecError("expected whole numbers separated by commas", field=option,
                            value=text, allowed="say 1,2,4") from None
    tps, sizes = lists["--tp"], lists["--mbs"]
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
    summary = {"path": str(output), "layers": doc["n_layers"], "tp": tps, "mbs": sizes,
               "processes": procs, "link": doc["network"].get("link")}
    if as_json:
        typer.echo(json.dumps(summary))
        return
    t = _table(f"Profile of {model} on {procs} {device} processes", ["TP", "mbs", "forward",
                                                                     "backward", "update"])
    for t_, per in doc["gpus"][device].items():
        for m, rows in per.items():
            t.add_row(t_, m, _s(sum(r[0] for r in rows)), _s(sum(r[1] for r in rows)),
                      _s(sum(r[2] for r in rows)))
    _out().print(t)
    link = doc["network"].get("link")
    if link:
        _out().print(f"link: {link['bandwidth_Bps'] / 1e9:.2f} GB/s, {link['latency_s'] * 1e6:.0f} us "
                     "latency (point to point)")
    _out().print(f"profile written to {output}")


def _needs_torch(command: str) -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise SpecError(f"{command} needs PyTorch, which is not installed",
                        allowed="pip install torch==2.13.0 (or: pip install -e '.[runtime]')")


def _train_elastic(p, arch, run, as_json: bool) -> None:
    """``--elastic`` on the first machine: the controller (``shoal.runtime.elastic``)."""
    from shoal.runtime.elastic import train_elastic

    con = _progress()

    def on_event(kind: str, d: dict) -> None:
        # each step and each reconfiguration as it happens (not under --json), a line each
        if kind == "step":
            line = f"step {d['step']}: loss {d['loss']:.4f}, {d['step_time_s']:.3f} s"
        elif d.get("decision", "switch") == "switch":
            line = (f"{_s(d['time_s'])}: {d['cause']}: plan {d['new_plan']} on workers "
                    f"{d['members']}, from step {d['resumed_from_step']}")
        else:
            line = f"{_s(d['time_s'])}: {d['cause']}: plan kept ({d['decision']})"
        con.print(line, soft_wrap=True)

    if as_json:
        doc = train_elastic(p, arch, run)
    else:
        with con.status(f"training {run.steps} steps on {run.world} elastic workers"):
            doc = train_elastic(p, arch, run, on_event)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    t = _table(f"Trained to step {doc['steps']}, elastic", ["time", "cause", "plan", "from step",
                                                         "steps lost", "to first step"],
               left=("cause", "plan"))
    for r in doc["reconfigurations"]:
        if r.get("decision", "switch") != "switch":
            t.add_row(_s(r["time_s"]), r["cause"], f"kept ({r['decision']})", "—", "0", "—")
            continue
        t.add_row(_s(r["time_s"]), r["cause"], r["new_plan"], str(r["resumed_from_step"]),
                  str(r["steps_lost"]),
                  _s(r["detect_to_first_step_s"]) if r["detect_to_first_step_s"] else "—")
    _out().print(t)
    _out().print(f"final loss {doc['final_loss']:.5f}")


def _serving_commands() -> None:
    from shoal.cli_serve import import_helix_cmd, serve_app

    app.add_typer(serve_app, name="serve")
    import_app.command("helix")(handles_errors(import_helix_cmd))


_serving_commands()


@app.command()
@handles_errors
def report(
    inputs: Annotated[list[Path], typer.Argument(
        metavar="INPUT...", help="JSON outputs of plan, estimate, replay, bubbles, serve plan, "
                                 "serve simulate (each run with --json)")],
    output: Annotated[Path, output_option("-o", "--output", help="the HTML file to write")] = Path(
        "report.html"),
    title: Annotated[str | None, typer.Option("--title", help="the page title")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print what was written as JSON")] = False,
) -> None:
    """One self-contained HTML report (figures embedded) from the JSON outputs of shoal's
    commands."""
    from shoal.files import check_outputs
    from shoal.report.html import build, kind_of

    check_outputs([(output, "--output")], inputs)
    with _progress().status("drawing the report...") if not as_json else _nullcontext():
        path = build(list(inputs), output, title)
    if as_json:
        from shoal.files import read_json

        typer.echo(json.dumps({"written": str(path), "sections": [
            {"input": str(p), "kind": kind_of(read_json(p))} for p in inputs]}))
    else:
        _out().print(f"report written to {path} ({path.stat().st_size / 1e6:.1f} MB, "
                     f"{len(inputs)} section{'s' * (len(inputs) > 1)})")


def _nullcontext():
    import contextlib

    return contextlib.nullcontext()


def _geo_commands() -> None:
    from shoal.cli_geo import bubbles_cmd

    app.command("bubbles")(handles_errors(bubbles_cmd))


_geo_commands()


def _calibrate_command() -> None:
    from shoal.cli_calibrate import calibrate_cmd

    app.command("calibrate")(calibrate_cmd)


_calibrate_command()


def _reflow_help(group: typer.Typer) -> None:
    """Commands' help from their docstrings with the source's line breaks inside a paragraph
    joined (rich help keeps them, which breaks lines mid-sentence), for ``group`` and the
    groups under it."""
    for info in group.registered_commands:
        if info.help is None and info.callback is not None and info.callback.__doc__:
            paragraphs = inspect.cleandoc(info.callback.__doc__).split("\n\n")
            info.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _reflow_help(sub.typer_instance)


_reflow_help(app)


def main() -> None:
    """The ``shoal`` command. A command-line usage error (an unknown option, a value out of
    range) exits 2 as the others do; under ``--json`` it is also printed as the one JSON object
    on stdout (``{"error": {"message", "exit_code"}}``), as every other error is."""
    try:
        rv = app(standalone_mode=False)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    except Exception as exc:
        if not all(hasattr(exc, a) for a in ("format_message", "exit_code", "show")):
            raise  # not a usage error (click's ClickException, whichever click typer uses)
        if "--json" in sys.argv[1:]:
            typer.echo(json.dumps({"error": {"message": exc.format_message(),
                                             "exit_code": exc.exit_code}}))
        try:
            from typer import rich_utils

            rich_utils.rich_format_error(exc)
        except Exception:  # typer without rich: click's plain message
            exc.show()
        sys.exit(exc.exit_code)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
