"""What the estimator predicts for a run: the same plan, model and job on the ``shoal`` stack
(shoal's own runtime), for the closed loop of ``shoal train`` (measured against predicted step
time, and MFU by the estimator's own FLOP count and peaks), and the scenario the elastic
controller re-plans in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from shoal.errors import ShoalError
from shoal.estimate import estimate
from shoal.estimate.api import model_flops_per_iteration
from shoal.files import read_json
from shoal.problem import Problem, build_problem
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

PRECISION = {"fp32": "fp32", "bf16": "mixed-bf16", "fp16": "mixed-fp16"}  # autocast -> job's
NOMINAL_LINK = {"bandwidth": "1GB/s", "latency": "0.5ms"}  # a local link when nothing is measured


def profile_link(profile: str | None) -> dict:
    """A ``shoal profile`` file's measured link, else a nominal local one."""
    if profile:
        link = read_json(profile, "profile").get("network", {}).get("link")
        if link:
            return {"bandwidth": link["bandwidth_Bps"], "latency": link["latency_s"]}
    return dict(NOMINAL_LINK)


def scenario(spec: ModelSpec, pool: dict[tuple[str, str], int], global_batch: int, seq: int, *,
             mbs: int, precision: str = "fp32", profile: str | None = None,
             any_settings: bool = False) -> Problem:
    """The problem of training ``spec`` on ``pool`` ((GPU type, zone) -> count, every zone in
    one region) with the job's batch and sequence, on the ``shoal`` stack; a ``shoal profile``
    file gives measured times and the link. ``any_settings``: the job allows every schedule,
    recompute and ZeRO setting (to cost a given plan), else the job's defaults."""
    zones: dict[str, dict] = {}
    for (gpu, zone), n in pool.items():
        zones.setdefault(zone, {"gpus": {}})["gpus"][gpu] = n
    link = profile_link(profile)
    doc = {"model": spec.model_dump(mode="json"),
           "job": {"global_batch": global_batch, "seq_len": seq, "optimizer": "adamw",
                   "precision": PRECISION[precision], "microbatch_sizes": [mbs],
                   "stack": "shoal",
                   **({"recompute": [False, True], "zero_stage": [0, 1, 2, 3],
                       "schedule": ["1f1b", "gpipe", "zorse"]} if any_settings else {})},
           "pool": {"regions": {"local": {"zones": zones}},
                    "gpus_per_node": {gpu: n for (gpu, _), n in pool.items()}},
           "network": {"defaults": {"same_zone": link, "same_region": link}},
           "prices": {"gpu_usd_per_h": {gpu: 0.0 for gpu, _ in pool}}}
    if profile:
        doc["profiles"] = {"compute": str(Path(profile).resolve())}
    return build_problem(parse_scenario(doc))


@dataclass(frozen=True)
class Prediction:
    """The estimator's step time for the plan (None when it cannot cost it, with why), the
    model's training FLOPs per iteration and the plan's peak FLOP/s (for MFU)."""

    iteration_time_s: float | None
    flops_per_iteration: float
    peak_flops: float
    why: str | None = None

    def mfu(self, step_time_s: float) -> float:
        return self.flops_per_iteration / (step_time_s * self.peak_flops) \
            if self.peak_flops > 0 and step_time_s > 0 else 0.0

    def to_json(self) -> dict:
        return {"iteration_time_s": self.iteration_time_s, "stack": "shoal",
                "flops_per_iteration": self.flops_per_iteration, "peak_flops": self.peak_flops,
                "why_none": self.why}


def predict(plan: TrainingPlan, spec: ModelSpec, seq: int, *, precision: str = "fp32",
            profile: str | None = None) -> Prediction:
    """The estimate of ``plan`` (its GPU types and zones as given) on the ``shoal`` stack."""
    gb = sum(r.microbatches for r in plan.stages[0].replicas) * plan.microbatch_size
    problem = scenario(spec, plan.gpu_counts(), gb, seq, mbs=plan.microbatch_size,
                       precision=precision, profile=profile, any_settings=True)
    flops = model_flops_per_iteration(problem)
    try:
        est = estimate(problem, plan)
    except ShoalError as exc:  # a plan shape the estimator does not cost: no prediction, no MFU
        return Prediction(None, flops, 0.0, str(exc).splitlines()[0][:200])
    peak = flops / (est.iteration_time_s * est.mfu) if est.mfu > 0 else 0.0
    return Prediction(est.iteration_time_s, flops, peak)
