"""Discrete-event simulation of one training iteration: 1F1B or GPipe per pipeline, then the
per-stage gradient all-reduce and optimizer update.

It takes the same per-operation durations as the fast estimate (``shoal.estimate.kernel``: forward,
backward, blocking sends, all-reduce, update), and schedules every operation of every microbatch
on every worker under the schedule's dependencies, so it checks the estimate's closed-form
pipeline formula (Narayanan et al. 2021, §2.2 for 1F1B; Huang et al. 2019 for GPipe) and draws
the timeline.

Operations of a stage run in the schedule's order; F(s, k) waits for F(s-1, k) (its activations),
B(s, k) waits for B(s+1, k) (its gradients) and, on the last stage, for F(s, k). An event heap
orders completions; each completion's handler returns the operations it made ready.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.errors import SpecError
from shoal.estimate import general
from shoal.estimate.api import run_kernel, tables_for
from shoal.estimate.encode import encode, to_spec
from shoal.estimate.pipeline import stage_order
from shoal.estimate.validate import validate_plan
from shoal.problem import Problem
from shoal.specs.plan import TrainingPlan


@dataclass(frozen=True)
class Op:
    stage: int
    replica: int
    kind: str  # "F", "B", "sync", "update"
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
    orders = [stage_order(schedule, P, s, m) for s in range(P)]
    pos = [0] * P
    free = [0.0] * P
    done: dict[tuple[str, int, int], float] = {}
    ops: list[Op] = []
    heap: list[tuple[float, int, str, int]] = []

    def ready(s: int) -> tuple[bool, float]:
        kind, k = orders[s][pos[s]]
        deps = []
        if kind == "F" and s > 0:
            deps.append(("F", s - 1, k))
        if kind == "B":
            deps.append(("B", s + 1, k) if s < P - 1 else ("F", s, k))
        t = free[s]
        for d in deps:
            if d not in done:
                return False, 0.0
            t = max(t, done[d])
        return True, t

    def try_start(s: int) -> list[tuple[float, int, str, int]]:
        """Start stage s's next operation if its inputs are there; return the new event."""
        if pos[s] >= len(orders[s]):
            return []
        ok, t0 = ready(s)
        if not ok or free[s] == np.inf:
            return []
        kind, k = orders[s][pos[s]]
        dur = fwd[s] if kind == "F" else bwd[s]
        free[s] = np.inf  # busy until the completion event
        return [(t0 + dur, s, kind, k, t0)]

    for s in range(P):
        for ev in try_start(s):
            heapq.heappush(heap, ev)
    while heap:
        t, s, kind, k, t0 = heapq.heappop(heap)
        done[(kind, s, k)] = t
        ops.append(Op(s, replica, kind, k, t0, t))
        pos[s] += 1
        free[s] = t
        neighbours = (s, s + 1, s - 1) if kind == "F" else (s, s - 1)
        for nb in neighbours:
            if 0 <= nb < P:
                for ev in try_start(nb):
                    heapq.heappush(heap, ev)
    if any(pos[s] < len(orders[s]) for s in range(P)):
        raise RuntimeError("schedule deadlocked: an operation's inputs never arrived")
    ends = np.array([free[s] for s in range(P)])
    return ops, ends


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
    if not general.is_pipelines(spec):
        return _simulate_general(problem, plan, tb, spec, o)
    fwd = (o["fwd"] + o["send_fwd"])[0]
    bwd = (o["bwd"] + o["send_bwd"])[0]
    P = len(plan.stages)
    R = len(plan.stages[0].replicas)
    all_ops: list[Op] = []
    stage_end = np.zeros(P)
    pipe_T = []
    for r in range(R):
        m = plan.stages[0].replicas[r].microbatches
        if m == 0:
            continue
        ops, ends = simulate_pipeline(fwd[:, r], bwd[:, r], m, plan.schedule, replica=r)
        all_ops += ops
        stage_end = np.maximum(stage_end, ends)
        pipe_T.append(float(ends.max()))
    end = 0.0
    for s in range(P):
        sync = float(o["sync"][0, s])
        upd = float(o["update"][0, s].max())
        t0 = stage_end[s]
        for r in range(R):
            if sync > 0:
                all_ops.append(Op(s, r, "sync", -1, t0, t0 + sync))
            all_ops.append(Op(s, r, "update", -1, t0 + sync, t0 + sync + upd))
        end = max(end, t0 + sync + upd)
    return Timeline(iteration_time_s=end + problem.timing.step_overhead_s, ops=all_ops,
                    pipeline_time_s=pipe_T)


def _simulate_general(problem: Problem, plan: TrainingPlan, tb, spec, o) -> Timeline:
    """A plan that is not a set of pipelines: every replica's operations from the estimator's
    event simulation (``shoal.estimate.general``), then each stage's all-reduce and update."""
    S = len(plan.stages)
    trace: list = []
    ends, _ = general.simulate(spec, o["fwd"][0, :S], o["bwd"][0, :S], general.hops(problem, tb, spec),
                               problem.timing.recv_fraction, trace=trace)
    ops = [Op(s, j, "B" if bk else "F", i, t0, t1) for s, j, bk, i, t0, t1 in trace]
    end = 0.0
    for s, st in enumerate(plan.stages):
        t0 = float(ends[s, :len(st.replicas)].max())
        sync, upd = float(o["sync"][0, s]), float(o["update"][0, s].max())
        for r in range(len(st.replicas)):
            if sync > 0:
                ops.append(Op(s, r, "sync", -1, t0, t0 + sync))
            ops.append(Op(s, r, "update", -1, t0 + sync, t0 + sync + upd))
        end = max(end, t0 + sync + upd)
    return Timeline(iteration_time_s=end + problem.timing.step_overhead_s, ops=ops,
                    pipeline_time_s=[])


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
                      "tp": plan.stages[s].replicas[r].tp,
                      "microbatches": plan.stages[s].replicas[r].microbatches,
                      "ops": ops[(s, r)]} for s, r in rows]}


def draw_timeline(problem: Problem, plan: TrainingPlan, path: str | Path,
                  max_pipelines: int = 4) -> Path:
    """Draw the simulated iteration as a Gantt chart (one row per worker) and write a PNG."""
    from shoal.report.figures import draw_timeline_doc

    return draw_timeline_doc(timeline_json(problem, plan, max_pipelines), path)
