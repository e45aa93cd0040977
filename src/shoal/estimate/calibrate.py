"""Fit a stack's constants to measured runs (``shoal calibrate``) and judge the fit.

Each measured run (``shoal.specs.measurements``) becomes a problem and a plan: its GPUs in one
zone, ``pp`` stages of equal block counts (the embedding with the first, the head with the
last), ``dp`` replicas of ``tp`` GPUs per stage, every replica running the iteration's
microbatches of its share. The estimator predicts its step time (and peak memory); the fit
changes the stack's kernel efficiencies, one set per GPU architecture the runs use (and, when
runs give their peak memory, the memory constants), to minimise the squared log errors of the
predicted step times (and memories), with a soft-L1 loss so a run the model cannot explain
weighs less. A fit is judged by leaving out each group of runs (by default the runs of one
model) in turn: the constants fitted on the others predict it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from shoal import catalog
from shoal.errors import SpecError
from shoal.estimate.api import estimate
from shoal.problem import MemoryConstants, Problem, TimeConstants, build_problem
from shoal.profiles.analytic import AnalyticProfile, architecture
from shoal.specs.measurements import MeasuredRun
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario
from shoal.specs.stack import KernelEfficiency, StackSpec

KERNEL_FIT = ("gemm", "attention_fwd", "attention_bwd", "memory")
KERNEL_BOUNDS = (0.05, 1.0)
MEMORY_FIT = ("framework_bytes", "activation_factor")
MEMORY_SCALE = (1e9, 1.0)
MEMORY_BOUNDS = ((0.0, 0.8), (20.0, 2.0))


@dataclass
class Row:
    run: MeasuredRun
    problem: Problem
    plan: TrainingPlan
    step_s: float | None
    memory_bytes: float | None
    key: str  # the kernels entry its constants go to (architecture or GPU)


def plan_for(run: MeasuredRun, n_layers: int) -> TrainingPlan:
    """The plan a homogeneous run executed: ``pp`` stages of (about) equal block counts,
    ``dp`` replicas of ``tp`` GPUs each."""
    blocks = n_layers - 2
    cuts = [round(blocks * s / run.pp) for s in range(run.pp + 1)]
    edges = [0] + [1 + c for c in cuts[1:-1]] + [n_layers]
    per_replica = max(1, math.ceil(run.global_batch / (run.microbatch * run.dp)))
    stages = [{"layers": [edges[s], edges[s + 1]], "replicas": [
        {"gpu": run.gpu, "tp": run.tp, "zone": "local", "microbatches": per_replica}
        for _ in range(run.dp)]} for s in range(run.pp)]
    return TrainingPlan.model_validate({
        "microbatch_size": run.microbatch, "schedule": run.schedule,
        "recompute": run.recompute, "zero_stage": run.zero_stage, "stages": stages})


def scenario_for(run: MeasuredRun, stack_ref: str) -> dict:
    """The scenario of one run: its GPUs in one zone, its job, its network."""
    if run.model is not None:
        model: object = run.model
    elif run.hf_config is not None:
        model = {"hf_config": run.hf_config}
    else:
        model = {"name": run.name or "measured", **run.architecture()}
    gpu = catalog.gpus().canonical(run.gpu, field="gpu")
    per_replica = max(1, math.ceil(run.global_batch / (run.microbatch * run.dp)))
    link = {"bandwidth": run.inter_node_bandwidth or "100Gbps",
            "latency": run.inter_node_latency}
    pool: dict = {"regions": {"local": {"zones": {"local": {"gpus": {gpu: run.gpus}}}}}}
    if run.gpus_per_node:
        pool["gpus_per_node"] = {gpu: run.gpus_per_node}
    return {
        "model": model,
        "job": {"global_batch": per_replica * run.microbatch * run.dp, "seq_len": run.seq_len,
                "optimizer": run.optimizer, "precision": run.precision, "stack": stack_ref,
                "microbatch_sizes": [run.microbatch], "recompute": [run.recompute],
                "zero_stage": [run.zero_stage], "schedule": [run.schedule]},
        "pool": pool,
        "network": {"defaults": {"same_zone": link}},
        "prices": {"gpu_usd_per_h": {gpu: 0.0}},
    }


def rows_for(runs: list[MeasuredRun], stack: StackSpec, base: Path | None = None,
             file: str | None = None) -> list[Row]:
    """Each run as a problem and plan under ``stack``, or a SpecError naming the run."""
    out = []
    for i, run in enumerate(runs):
        try:
            scn = parse_scenario(scenario_for(run, stack.name), file=file)
            problem = build_problem(scn, file=file, base_dir=base, stack=stack)
            plan = plan_for(run, problem.n_layers)
        except SpecError as exc:
            raise exc.located(prefix=f"runs.{i}") from None
        g = problem.gpus[catalog.gpus().canonical(run.gpu)]
        key = architecture(g) or g.name
        out.append(Row(run, problem, plan, run.measured_step_s(), run.peak_memory, key))
    return out


def with_stack(problem: Problem, stack: StackSpec) -> Problem:
    """``problem`` under another stack (the same scenario otherwise)."""
    prof = problem.profile
    analytic = AnalyticProfile(problem.model, problem.job.seq_len, prof.gpus, stack,
                               optimizer=problem.job.optimizer, precision=problem.job.precision,
                               attention=problem.job.attention, intra_node=prof.intra) \
        if isinstance(prof, AnalyticProfile) else prof
    return replace(problem, stack=stack, profile=analytic, memory=MemoryConstants.of(stack),
                   timing=TimeConstants.of(stack))


def predict(rows: list[Row], stack: StackSpec) -> tuple[np.ndarray, np.ndarray]:
    """Predicted (step seconds, peak memory bytes) of every row under ``stack``."""
    t, m = np.zeros(len(rows)), np.zeros(len(rows))
    for i, r in enumerate(rows):
        e = estimate(with_stack(r.problem, stack), r.plan)
        t[i], m[i] = e.iteration_time_s, e.peak_memory_bytes
    return t, m


class Fit:
    """The parameters a calibration moves: kernel efficiencies per key, memory constants."""

    def __init__(self, base: StackSpec, keys: list[str], memory: bool):
        self.base, self.keys, self.memory = base, keys, memory

    def x0(self) -> np.ndarray:
        x = []
        for k in self.keys:
            eff = self.base.kernel_efficiency(k, k)
            x += [eff[f] for f in KERNEL_FIT]
        if self.memory:
            x += [getattr(self.base.memory, f) / s for f, s in zip(MEMORY_FIT, MEMORY_SCALE,
                                                                  strict=True)]
        return np.array(x)

    def bounds(self) -> tuple[list[float], list[float]]:
        lo = [KERNEL_BOUNDS[0]] * (len(KERNEL_FIT) * len(self.keys))
        hi = [KERNEL_BOUNDS[1]] * (len(KERNEL_FIT) * len(self.keys))
        if self.memory:
            lo += list(MEMORY_BOUNDS[0])
            hi += list(MEMORY_BOUNDS[1])
        return lo, hi

    def stack(self, x: np.ndarray) -> StackSpec:
        kernels = dict(self.base.kernels)
        n = len(KERNEL_FIT)
        for i, k in enumerate(self.keys):
            old = kernels.get(k, KernelEfficiency()).model_dump()
            old.update({f: float(v) for f, v in zip(KERNEL_FIT, x[i * n:(i + 1) * n],
                                                    strict=True)})
            kernels[k] = KernelEfficiency(**old)
        update: dict = {"kernels": kernels}
        if self.memory:
            mem = self.base.memory.model_dump()
            mem.update({f: float(v * s) for f, v, s in zip(
                MEMORY_FIT, x[n * len(self.keys):], MEMORY_SCALE, strict=True)})
            update["memory"] = type(self.base.memory)(**mem)
        return self.base.model_copy(update=update)


def mean_kernels(stack: StackSpec, keys: list[str]) -> dict:
    """The stack's default kernels entry with the fitted fields the geometric mean of the
    ``keys`` entries (for GPUs of architectures the runs did not cover)."""
    out = stack.kernels["default"].model_dump()
    for f in KERNEL_FIT:
        vals = [stack.kernel_efficiency(k, k)[f] for k in keys]
        out[f] = float(np.exp(np.mean(np.log(vals))))
    return out


def residuals(rows: list[Row], stack: StackSpec) -> np.ndarray:
    t, m = predict(rows, stack)
    out = [math.log(ti / r.step_s) for r, ti in zip(rows, t, strict=True) if r.step_s]
    out += [math.log(mi / r.memory_bytes) for r, mi in zip(rows, m, strict=True)
            if r.memory_bytes]
    return np.array(out)


def fit(rows: list[Row], base: StackSpec, *, max_evaluations: int = 400) -> StackSpec:
    """The stack ``base`` with the constants that best explain ``rows``."""
    from scipy.optimize import least_squares

    keys = sorted({r.key for r in rows if r.step_s})
    params = Fit(base, keys, memory=any(r.memory_bytes for r in rows))
    lo, hi = params.bounds()
    x0 = np.clip(params.x0(), lo, hi)
    sol = least_squares(lambda x: residuals(rows, params.stack(x)), x0, bounds=(lo, hi),
                        loss="soft_l1", f_scale=0.1, max_nfev=max_evaluations, diff_step=1e-3)
    return params.stack(sol.x)


def errors(rows: list[Row], stack: StackSpec) -> list[dict]:
    """Per row: measured and predicted step seconds and memory, and the errors in percent."""
    t, m = predict(rows, stack)
    out = []
    for r, ti, mi in zip(rows, t, m, strict=True):
        d = {"run": r.run.label, "group": group_of(r.run), "gpu": r.run.gpu,
             "measured_step_s": r.step_s, "predicted_step_s": float(ti),
             "time_error_pct": 100.0 * (ti / r.step_s - 1) if r.step_s else None,
             "predicted_peak_memory_bytes": float(mi),
             "memory_error_pct": 100.0 * (mi / r.memory_bytes - 1) if r.memory_bytes else None,
             "predicted_oom": bool(mi > capacity_of(r))}
        out.append(d)
    return out


def capacity_of(r: Row) -> float:
    return r.problem.gpus[catalog.gpus().canonical(r.run.gpu)].memory_bytes


def group_of(run: MeasuredRun) -> str:
    return run.group or run.model or run.hf_config or f"{run.num_layers}x{run.hidden_size}"


def leave_group_out(rows: list[Row], base: StackSpec, **kw) -> list[dict]:
    """``errors`` of every row predicted by the constants fitted on the other groups' rows."""
    groups = sorted({group_of(r.run) for r in rows})
    by_row: dict[int, dict] = {}
    for grp in groups:
        train = [r for r in rows if group_of(r.run) != grp]
        test = [i for i, r in enumerate(rows) if group_of(r.run) == grp]
        if not train:
            continue
        st = fit(train, base, **kw)
        for i, e in zip(test, errors([rows[i] for i in test], st), strict=True):
            by_row[i] = e
    return [by_row[i] for i in sorted(by_row)]


def summary(errs: list[dict]) -> dict:
    """Mean absolute errors (percent) of time and memory, and the rows counted."""
    t = [abs(e["time_error_pct"]) for e in errs if e["time_error_pct"] is not None]
    m = [abs(e["memory_error_pct"]) for e in errs if e["memory_error_pct"] is not None]
    return {"runs": len(errs),
            "time_mape_pct": float(np.mean(t)) if t else None,
            "time_max_pct": float(np.max(t)) if t else None,
            "memory_mape_pct": float(np.mean(m)) if m else None}


def stack_document(fitted: StackSpec, rows: list[Row], groups: list[str], *, name: str,
                   measurements: str, date: str, quality: dict) -> dict:
    """The fitted stack as the file scenarios name in job.stack: its constants to four
    significant digits, a source for every fitted entry, the default kernels the geometric mean
    of the fitted ones (for GPUs of other architectures), and the fit (``measurements``, the
    file's name; ``quality``, the ``summary`` of its errors)."""
    doc = rounded(fitted.model_dump(mode="json", by_alias=True, exclude_none=True))
    doc["name"] = name
    doc["sources"] = dict(doc.get("sources", {}))
    keys = sorted({r.key for r in rows if r.step_s})
    for k in keys:
        doc["sources"][f"kernels.{k}"] = (
            f"fitted by shoal calibrate on {measurements} ({date}; "
            f"{sum(r.key == k for r in rows)} runs)")
    if keys:
        doc["kernels"]["default"] = rounded(mean_kernels(fitted, keys))
        doc["sources"]["kernels.default"] = (
            "the geometric mean of the fitted entries (" + ", ".join(keys) + ")")
    if any(r.memory_bytes for r in rows):
        doc["sources"]["memory"] = f"fitted by shoal calibrate on {measurements} ({date})"
    doc["fit"] = {"measurements": measurements, "runs": len(rows), "groups": groups,
                  "date": date, **quality}
    return doc


def rounded(x):
    """Floats to four significant digits (a fitted constant is not known better)."""
    if isinstance(x, float):
        return float(f"{x:.4g}")
    if isinstance(x, dict):
        return {k: rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [rounded(v) for v in x]
    return x
