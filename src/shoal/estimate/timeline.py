"""Discrete-event simulation of one training iteration: 1F1B or GPipe per pipeline, then the
per-stage gradient all-reduce and optimizer update.

It takes the same per-operation durations as the fast estimate (``shoal.estimate.kernel``: forward,
backward, blocking sends, all-reduce, update), and schedules every operation of every microbatch
on every worker under the schedule's dependencies, so it checks the estimate's closed-form
pipeline formula (Narayanan et al. 2021, §2.2 for 1F1B; Huang et al. 2019 for GPipe) and gives
the timeline that ``shoal.report.figures`` draws.

Operations of a stage run in the schedule's order; F(s, k) waits for F(s-1, k) (its activations),
B(s, k) waits for B(s+1, k) (its gradients) and, on the last stage, for F(s, k). The operations
run on the event core (``shoal.estimate.operations``): each completion's handler returns the
operations it made ready.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.errors import SpecError
from shoal.estimate import general, operations
from shoal.estimate.api import run_kernel, tables_for
from shoal.estimate.encode import encode, to_spec
from shoal.estimate.pipeline import stage_order
from shoal.estimate.validate import validate_plan
from shoal.problem import Problem
from shoal.specs.plan import TrainingPlan


@dataclass(frozen=True)
class Op:
    """One operation on worker (``stage``, ``replica``): ``kind`` "F" (forward), "B"
    (backward), "sync" (gradient all-reduce) or "update"; ``microbatch`` -1 for the last two."""

    stage: int
    replica: int
    kind: str
    microbatch: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Timeline:
    iteration_time_s: float
    ops: list[Op]
    pipeline_time_s: list[float]  # per pipeline: end of its last backward


def simulate_pipeline(fwd: np.ndarray, bwd: np.ndarray, m: int, schedule: str = "1f1b",
                      replica: int = 0) -> tuple[list[Op], np.ndarray]:
    """Simulate one pipeline. ``fwd[s]``/``bwd[s]``: seconds per microbatch on stage s, sends
    included. Returns the operations and each stage's end time."""
    P = len(fwd)
    orders = [[(int(kind == "B"), k) for kind, k in stage_order(schedule, P, s, m)]
              for s in range(P)]
    g = operations.graph(orders, np.zeros((P, m), dtype=np.int64), [1] * P,
                         np.broadcast_to(np.asarray(fwd, dtype=float)[:, None], (P, m)),
                         np.broadcast_to(np.asarray(bwd, dtype=float)[:, None], (P, m)))
    trace: operations.Trace = []
    ends = operations.simulate(g, trace)
    ops = [Op(s, replica, "B" if bk else "F", k, t0, t1) for s, _, bk, k, t0, t1 in trace]
    return ops, np.array(ends)


def simulate(problem: Problem, plan: TrainingPlan, *, validate: bool = True) -> Timeline:
    """Event-simulate one iteration of ``plan`` with the estimator's operation durations."""
    if validate:
        validate_plan(problem, plan)
    if plan.schedule == "zorse":
        raise SpecError("no timeline for the zorse schedule (its estimate has the stage "
                        "breakdown)", field="schedule", value=plan.schedule,
                        allowed="1f1b or gpipe")
    tb = tables_for(problem, [plan.microbatch_size])
    o = run_kernel(problem, tb, encode(tb, [plan]), detail=True)
    spec = to_spec(plan)
    if general.is_pipelines(spec):
        ops, stage_end, pipe_T = _pipelines(plan, o)
    else:
        S = len(plan.stages)
        trace: operations.Trace = []
        ends, _ = general.simulate(spec, o["fwd"][0, :S], o["bwd"][0, :S],
                                   general.hops(problem, tb, spec), problem.timing.recv_fraction,
                                   trace=trace)
        ops = [Op(s, j, "B" if bk else "F", i, t0, t1) for s, j, bk, i, t0, t1 in trace]
        stage_end = [float(ends[s, :len(st.replicas)].max()) for s, st in enumerate(plan.stages)]
        pipe_T = []
    tail, end = _sync_and_update(o, stage_end, [len(st.replicas) for st in plan.stages])
    return Timeline(iteration_time_s=end + problem.timing.step_overhead_s, ops=ops + tail,
                    pipeline_time_s=pipe_T)


def _pipelines(plan: TrainingPlan, o: dict) -> tuple[list[Op], np.ndarray, list[float]]:
    """A plan that is a set of pipelines, each simulated alone with the kernel's forward and
    backward (sends included): (operations, each stage's end, each pipeline's end)."""
    fwd = (o["fwd"] + o["send_fwd"])[0]
    bwd = (o["bwd"] + o["send_bwd"])[0]
    ops: list[Op] = []
    stage_end = np.zeros(len(plan.stages))
    pipe_T = []
    for r, rep in enumerate(plan.stages[0].replicas):
        if rep.microbatches == 0:
            continue
        mine, ends = simulate_pipeline(fwd[:, r], bwd[:, r], rep.microbatches, plan.schedule,
                                       replica=r)
        ops += mine
        stage_end = np.maximum(stage_end, ends)
        pipe_T.append(float(ends.max()))
    return ops, stage_end, pipe_T


def _sync_and_update(o: dict, stage_end, replicas: list[int]) -> tuple[list[Op], float]:
    """Every replica's gradient all-reduce and optimizer update, from the end of its stage's
    last backward (``stage_end[s]``), with the kernel's durations; and when the last ends."""
    ops: list[Op] = []
    end = 0.0
    for s, t0 in enumerate(stage_end):
        sync = float(o["sync"][0, s])
        upd = float(o["update"][0, s].max())
        for r in range(replicas[s]):
            if sync > 0:
                ops.append(Op(s, r, "sync", -1, t0, t0 + sync))
            ops.append(Op(s, r, "update", -1, t0 + sync, t0 + sync + upd))
        end = max(end, t0 + sync + upd)
    return ops, end


def timeline_json(problem: Problem, plan: TrainingPlan, max_rows: int = 4) -> dict:
    """The simulated iteration for a report: one row per worker shown (the first ``max_rows``
    pipelines of a set of pipelines; otherwise the first ``max_rows`` replicas of every stage),
    each with its operations ``[kind, microbatch, start_s, end_s]``."""
    tl = simulate(problem, plan)
    if tl.pipeline_time_s:
        pipes = sorted({op.replica for op in tl.ops})[:max_rows]
        rows = [(s, r) for r in pipes for s in range(len(plan.stages))]
        shown = f"first {len(pipes)} of {len(plan.stages[0].replicas)} pipelines"
    else:
        rows = [(s, r) for s, st in enumerate(plan.stages) for r in range(min(max_rows, len(st.replicas)))]
        shown = "replicas per stage " + "/".join(str(len(st.replicas)) for st in plan.stages) + \
            f"; at most {max_rows} shown per stage"
    ops: dict[tuple[int, int], list] = {rs: [] for rs in rows}
    for op in tl.ops:
        if (op.stage, op.replica) in ops:
            ops[(op.stage, op.replica)].append([op.kind, op.microbatch, op.start_s, op.end_s])
    return {"iteration_time_s": tl.iteration_time_s, "schedule": plan.schedule,
            "stages": len(plan.stages), "shown": shown,
            "rows": [{"stage": s, "replica": r, "gpu": plan.stages[s].replicas[r].gpu,
                      "tp": plan.stages[s].replicas[r].tp, "zone": plan.stages[s].replicas[r].zone,
                      "microbatches": plan.stages[s].replicas[r].microbatches,
                      "ops": ops[(s, r)]} for s, r in rows]}
