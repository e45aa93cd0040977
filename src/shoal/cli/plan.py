"""``shoal plan``: which GPUs to rent and how to parallelise, ranked, with the throughput-cost
front."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NamedTuple

import typer

from shoal.cli.choices import Goal, Strategy, choice_option
from shoal.cli.common import _progress, emit_json, handles_errors, output_option, show
from shoal.cli.helptext import examples
from shoal.errors import SpecError
from shoal.files import check_outputs, write_json
from shoal.report.tables import (
    network_defaults_line,
    pareto_table,
    plans_table,
    progress_line,
    rent_table,
    search_line,
)
from shoal.units import UnitError, fmt_seconds, parse_seconds

DEFAULT_BUDGET_S = 60.0  # `shoal plan --budget`'s default


@handles_errors
@examples(
    "shoal plan examples/opt350m-two-zones.yaml",
    "shoal plan examples/espresso-llama-1.3b.yaml --strategy espresso",
    "shoal plan examples/opt350m-two-zones.yaml --iterations 10000 --within 72h",
    "shoal plan examples/het-a100-v100.yaml --budget 20 -o best.plan.json --figure front.png",
)
def plan(
    scenario: Annotated[Path, typer.Argument(metavar="SCENARIO", help="scenario file (YAML or JSON)")],
    strategy: Annotated[Strategy, choice_option(Strategy, help="search strategy: {choices}")] = Strategy.auto,
    objective: Annotated[Goal | None, choice_option(
        Goal, help="what to optimise: {choices} (default: the scenario's)")] = None,
    max_cost_per_iter: Annotated[float | None, typer.Option(
        "--max-cost-per-iter", metavar="USD", help="cost per iteration at most, in USD")] = None,
    min_throughput: Annotated[float | None, typer.Option(
        "--min-throughput", help="iterations per second at least")] = None,
    max_gpus: Annotated[int | None, typer.Option("--max-gpus", min=1, help="GPUs in total at most")] = None,
    iterations: Annotated[int | None, typer.Option(
        "--iterations", min=1, help="training-time SLO: this many iterations ...")] = None,
    within: Annotated[str | None, typer.Option(
        "--within", metavar="TIME",
        help="... must finish within this time: a number and a unit (min, h or d; no "
             "unit: seconds), e.g. 72h")] = None,
    top: Annotated[int, typer.Option("--top", min=1, help="plans to list")] = 5,
    budget: Annotated[float, typer.Option(
        "--budget", min=0.1, metavar="SECONDS",
        help="search time limit in seconds")] = DEFAULT_BUDGET_S,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON only")] = False,
    output: Annotated[Path | None, output_option(
        "-o", "--output", help="write the best plan here (a training-plan file, JSON)")] = None,
    figure: Annotated[Path | None, output_option("--figure", help="write the Pareto front here")] = None,
) -> None:
    """Which GPUs to rent and how to parallelise: ranked plans and the throughput-cost front.

    Prints the ranked plans, what to rent for the best one and the front (or, with --json, one
    JSON object); -o writes the best plan, a training-plan file that estimate, bubbles and
    train take."""
    from shoal import jit
    from shoal.problem import load_problem
    from shoal.training import planners  # noqa: F401 - its compiled loops declared, for jit

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
    jit.prepare()  # a first run: the loops' helper, before the progress display's thread
    result = _search(problem, strategy.value, objective.value if objective else None, cons, top,
                     budget, as_json)
    best = result.ranked[0].plan
    if output is not None:
        write_json(output, best.to_json())
    if figure is not None:
        from shoal.report.figures import draw_pareto, front_doc

        draw_pareto(front_doc(result), figure)
    if as_json:
        emit_json(_plan_json(problem, result, cons.deadline), problem)
        return
    _print_plans(problem, result, cons.deadline)
    if output is not None:
        show(f"best plan written to {output}")
    if figure is not None:
        show(f"Pareto front drawn in {figure}")


PIPED_EVERY_S = 5.0  # a progress line this often when stderr is not a terminal
FRONT = "completing the throughput-cost front (the other objectives' searches)..."
# seconds the search runs alone before the front's copy is forked: its first plans come without
# the fork's cost (copying the process's page tables, then a fault at each page either writes)
ALONE_S = 0.25


def _search(problem, strategy: str, goal: str | None, cons, top: int, budget: float, quiet: bool):
    """The search, then the other objectives' searches completing the front within the same
    budget (the longest alongside it where a core is spare). Progress on stderr unless
    ``quiet``: the best plan so far, plans costed and time, on a live line in a terminal, a
    line every ``PIPED_EVERY_S`` seconds otherwise."""
    args = (problem, strategy, goal, cons, top, budget)
    if quiet:
        return _searches(*args)
    con = _progress()
    if con.is_terminal:
        with con.status(f"searching plans ({strategy})...") as status:

            @contextlib.contextmanager
            def paused():  # the live line's thread stopped: a copy may be forked
                status.stop()
                try:
                    yield
                finally:
                    status.start()

            return _searches(*args, Shown(
                lambda p: status.update(progress_line(strategy, p, budget)),
                lambda: status.update(FRONT), paused))
    last = [-PIPED_EVERY_S]

    def line(p) -> None:
        if p.elapsed_s - last[0] >= PIPED_EVERY_S:
            last[0] = p.elapsed_s
            con.print(progress_line(strategy, p, budget), soft_wrap=True)
    return _searches(*args, Shown(line, lambda: con.print(FRONT, soft_wrap=True)))


class Shown(NamedTuple):
    """What ``_searches`` shows while it runs: the search's progress (``planners.Progress``),
    then that the front is being completed, each where not None; ``paused``, a context in which
    the display's thread, if any, is stopped."""

    progress: Callable | None = None
    front: Callable[[], None] | None = None
    paused: Callable = contextlib.nullcontext


def _searches(problem, strategy: str, goal: str | None, cons, top: int, budget: float,
              shown: Shown | None = None):
    """The search under ``goal`` and the front's searches. Once the search has run for
    ``ALONE_S`` and shown a plan, the front's longest search starts in a copy of this process
    (``planners.Alongside``), forked while ``shown.paused``, from what the search has built so
    far (a progress report comes between two of its batches)."""
    from shoal.training.planners import Alongside, Limits, Reuse, complete_front, search

    shown = shown or Shown()
    alongside: list = []

    def progress(p) -> None:
        if shown.progress is not None:
            shown.progress(p)
        if not alongside and p.best_iteration_time_s is not None and p.elapsed_s >= ALONE_S:
            with shown.paused():
                alongside.append(Alongside.start(
                    problem, goal, strategy=strategy, constraints=cons,
                    limits=Limits(budget_s=budget), started=time.perf_counter() - p.elapsed_s,
                    reuse=reuse))

    reuse = Reuse()
    try:
        found = search(problem, strategy=strategy, objective=goal, constraints=cons,
                       top_k=top, limits=Limits(budget_s=budget, progress=progress,
                                                interruptible=True), reuse=reuse)
        if found.stats.interrupted:
            return found
        if shown.front is not None:
            shown.front()
        try:
            return complete_front(problem, found, strategy=strategy, constraints=cons,
                                  limits=Limits(budget_s=budget, interruptible=True),
                                  reuse=reuse, alongside=alongside[0] if alongside else None)
        except KeyboardInterrupt:  # between the front's searches: the plans found so far
            found.stats.interrupted = found.stats.truncated = True
            return found
    finally:
        if alongside and alongside[0] is not None:
            alongside[0].stop()


def _plan_json(problem, result, slo) -> dict:
    """``shoal plan --json`` (DESIGN §6): ranked plans and the front, each with its estimate and
    what to rent; with an SLO, each plan's dollars and time for it."""
    from shoal.estimate import estimate
    from shoal.training.rent import rent

    def entry(c):
        e = {"plan": c.plan.to_json(), "estimate": estimate(problem, c.plan).to_json(),
             "rent": rent(problem, c.plan)}
        if slo:
            e["slo_total"] = {"cost_usd": c.cost_usd * slo.iterations,
                              "time_s": c.iteration_time_s * slo.iterations}
        return e
    return {"search_time_s": result.stats.search_time_s, "objective": result.objective,
            "slo": {"iterations": slo.iterations, "within_s": slo.within} if slo else None,
            "plans": [entry(c) for c in result.ranked], "pareto": [entry(c) for c in result.pareto],
            "stats": result.stats.to_json(), "network_defaults": list(problem.network_defaults)}


def _print_plans(problem, result, slo) -> None:
    from shoal.training.rent import rent

    show(plans_table(result, problem.job.global_batch * problem.job.seq_len, slo))
    if slo:
        show(f"SLO: {slo.iterations:,} iterations within {fmt_seconds(slo.within)}")
    show(rent_table(rent(problem, result.ranked[0].plan)), pareto_table(result),
         search_line(result.stats))
    net = network_defaults_line(list(problem.network_defaults))
    if net:
        show(net)


def _deadline(iterations: int | None, within: str | None):
    """The training-time SLO from ``--iterations`` and ``--within`` (both or neither)."""
    from shoal.specs.job import Deadline

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
