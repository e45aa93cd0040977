"""``estimate(problem, plan) -> Estimate``: the readable wrapper over the batched kernel."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from shoal import catalog
from shoal.estimate import general, kernel, ministage
from shoal.estimate.encode import encode_specs, to_spec
from shoal.estimate.tables import CostTables, build_tables, default_tp_values
from shoal.estimate.tables import state_bytes as _state_bytes  # the planners' name for it
from shoal.estimate.validate import validate_plan
from shoal.problem import Problem, no_price_reason
from shoal.specs.plan import TrainingPlan


@dataclass(frozen=True)
class WorkerMemory:
    stage: int
    replica: int
    gpu: str
    zone: str
    tp: int
    peak_memory_bytes: float
    capacity_bytes: float
    weights_grads_optimizer_bytes: float
    activation_bytes: float
    buffer_bytes: float
    framework_bytes: float
    microbatches_in_flight: int
    oom: bool


@dataclass(frozen=True)
class StageBreakdown:
    stage: int
    layers: tuple[int, int]
    replicas: int
    compute_fwd_s: float  # per microbatch, slowest replica
    compute_bwd_s: float
    send_recv_s: float  # per microbatch, forward and backward sends of the slowest replica
    gradient_sync_s: float
    update_s: float
    busy_s: float  # time the stage computes or sends during the iteration (slowest replica)
    bubble_s: float  # idle in the pipeline: iteration time minus busy, sync and update time
    straggler: bool  # the stage whose busiest replica is busiest: it sets the pace
    profile_source: str


@dataclass(frozen=True)
class Estimate:
    iteration_time_s: float
    throughput_iters_per_s: float
    tokens_per_s: float
    mfu: float
    cost_compute_usd: float
    cost_egress_usd: float
    oom: bool
    workers: list[WorkerMemory]
    stages: list[StageBreakdown]
    num_gpus: int
    # GPU types the plan uses that have no price: the compute cost (and so the total) is
    # unknown, NaN here and null in JSON, and ``cost_unknown`` says why
    unpriced_gpus: tuple[str, ...] = ()

    @property
    def cost_per_iteration_usd(self) -> float:
        return self.cost_compute_usd + self.cost_egress_usd

    @property
    def cost_unknown(self) -> str | None:
        """Why the compute cost is unknown (the plan's GPU types without a price), or None."""
        return no_price_reason(list(self.unpriced_gpus)) if self.unpriced_gpus else None

    @property
    def peak_memory_bytes(self) -> float:
        return max(w.peak_memory_bytes for w in self.workers)

    def to_json(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "throughput_iters_per_s": self.throughput_iters_per_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "cost_per_iteration_usd": {"compute": _known(self.cost_compute_usd),
                                       "egress": self.cost_egress_usd,
                                       "total": _known(self.cost_per_iteration_usd),
                                       "reason": self.cost_unknown},
            "oom": self.oom,
            "num_gpus": self.num_gpus,
            "peak_memory_bytes": self.peak_memory_bytes,
            "workers": [asdict(w) for w in self.workers],
            "stages": [asdict(s) | {"layers": list(s.layers)} for s in self.stages],
        }


def tables_for(problem: Problem, mbs_values: list[int]) -> CostTables:
    return build_tables(problem, mbs_values, default_tp_values(problem))


def run_kernel(problem: Problem, tb: CostTables, batch: kernel.Batch, detail: bool = False):
    grad_b, states = _state_bytes(problem)
    return kernel.run(tb, batch, problem.memory, problem.timing, bytes_per_grad=grad_b,
                      state_bytes=states, detail=detail)


def run_specs(problem: Problem, tb: CostTables, specs: list) -> dict[str, np.ndarray]:
    """``run_kernel`` over compact plan specs of any shape: plans that are not a set of
    pipelines are redone one by one through the event simulation (``general``), and plans
    under the zorse schedule through theirs (``ministage``)."""
    out = run_kernel(problem, tb, encode_specs(tb, specs))
    for i, sp in enumerate(specs):
        if ministage.is_ministage(sp):
            one = ministage.apply(problem, tb, sp, run_kernel(problem, tb, encode_specs(tb, [sp]),
                                                               detail=True))
        elif general.is_pipelines(sp):
            continue
        else:
            one = general.apply(problem, tb, sp, run_kernel(problem, tb, encode_specs(tb, [sp]),
                                                             detail=True))
        for k in ("iteration_time_s", "cost_compute_usd", "cost_egress_usd", "oom"):
            out[k][i] = one[k][0]
        S, R = one["peak_bytes"].shape[1:]
        for k in ("peak_bytes", "capacity_bytes"):
            out[k][i] = 0.0
            out[k][i, :S, :R] = one[k][0]
    return out


def model_flops_per_iteration(problem: Problem) -> float:
    """Training FLOPs of one iteration without recompute: 3 x forward FLOPs."""
    return 3.0 * float(problem.sizes.fwd_flops.sum()) * problem.job.global_batch


def estimate(problem: Problem, plan: TrainingPlan, *, file: str | None = None,
             tables: CostTables | None = None) -> Estimate:
    validate_plan(problem, plan, file)
    tb = tables or tables_for(problem, [plan.microbatch_size])
    spec = to_spec(plan)
    out = run_kernel(problem, tb, encode_specs(tb, [spec]), detail=True)
    if ministage.is_ministage(spec):
        out = ministage.apply(problem, tb, spec, out)
    elif not general.is_pipelines(spec):
        out = general.apply(problem, tb, spec, out)
    return _readable(problem, plan, tb, out)


def _known(usd: float) -> float | None:
    """A cost for JSON: null when unknown (NaN: a GPU type without a price)."""
    return None if np.isnan(usd) else usd


def _readable(problem: Problem, plan: TrainingPlan, tb: CostTables, o: dict) -> Estimate:
    T = float(o["iteration_time_s"][0])
    reg = catalog.gpus()
    workers = []
    for s, st in enumerate(plan.stages):
        for r, rep in enumerate(st.replicas):
            workers.append(WorkerMemory(
                stage=s, replica=r, gpu=reg.canonical(rep.gpu), zone=rep.zone, tp=rep.tp,
                peak_memory_bytes=float(o["peak_bytes"][0, s, r]),
                capacity_bytes=float(o["capacity_bytes"][0, s, r]),
                weights_grads_optimizer_bytes=float(o["states"][0, s, r]),
                activation_bytes=float(o["activations"][0, s, r]),
                buffer_bytes=float(o["buffers"][0, s, r]),
                framework_bytes=problem.memory.framework_bytes,
                microbatches_in_flight=int(o["inflight"][0, s, r]),
                oom=bool(o["oom_workers"][0, s, r]),
            ))
    t_mb = o["t_mb"][0]
    shares = np.zeros_like(t_mb)
    for s, st in enumerate(plan.stages):
        shares[s, :len(st.replicas)] = [rep.microbatches for rep in st.replicas]
    busy_all = t_mb * shares
    straggler = int(np.argmax(busy_all.max(axis=1)))
    stages = []
    for s, st in enumerate(plan.stages):
        busy = busy_all[s]
        r_slow = int(np.argmax(busy))
        stages.append(StageBreakdown(
            stage=s, layers=tuple(st.layers), replicas=len(st.replicas),
            compute_fwd_s=float(o["fwd"][0, s, r_slow]), compute_bwd_s=float(o["bwd"][0, s, r_slow]),
            send_recv_s=float(o["send_fwd"][0, s, r_slow] + o["send_bwd"][0, s, r_slow]),
            gradient_sync_s=float(o["sync"][0, s]), update_s=float(o["update"][0, s].max()),
            busy_s=float(busy[r_slow]),
            bubble_s=max(0.0, T - float(busy[r_slow]) - float(o["sync"][0, s])
                         - float(o["update"][0, s].max())),
            straggler=(s == straggler),
            profile_source=tb.sources.get((reg.canonical(st.replicas[r_slow].gpu),
                                           st.replicas[r_slow].tp), "analytic"),
        ))
    peak = sum(rep.tp * tb.peak_flops[tb.gi(reg.canonical(rep.gpu))]
               for st in plan.stages for rep in st.replicas)
    mfu = model_flops_per_iteration(problem) / (T * peak) if peak > 0 else 0.0
    unpriced = sorted({w.gpu for w in workers if (w.gpu, w.zone) not in problem.prices})
    return Estimate(
        iteration_time_s=T, throughput_iters_per_s=1.0 / T,
        tokens_per_s=problem.job.global_batch * problem.job.seq_len / T, mfu=mfu,
        cost_compute_usd=np.nan if unpriced else float(o["cost_compute_usd"][0]),
        cost_egress_usd=float(o["cost_egress_usd"][0]),
        oom=bool(o["oom"][0]), workers=workers, stages=stages, num_gpus=plan.num_gpus,
        unpriced_gpus=tuple(unpriced),
    )
