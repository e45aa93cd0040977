"""Check a TrainingPlan against a Problem; every failure is a SpecError naming the field."""

from __future__ import annotations

from shoal import catalog
from shoal.errors import SpecError, spelt
from shoal.problem import Problem
from shoal.specs.plan import TrainingPlan


def validate_plan(problem: Problem, plan: TrainingPlan, file: str | None = None) -> None:
    _check_layers(problem, plan, file)
    _check_settings(problem, plan, file)
    used = _check_replicas(problem, plan, file)
    _check_usage(problem, used, file)


def _check_layers(problem: Problem, plan: TrainingPlan, file: str | None) -> None:
    """The stages' layer ranges tile the model."""
    n = problem.n_layers
    start = 0
    for i, st in enumerate(plan.stages):
        a, b = st.layers
        if a != start or b <= a:
            raise SpecError(
                "layer ranges must tile the model: each stage starts where the previous ended "
                "and holds at least one layer",
                file=file, field=f"stages.{i}.layers", value=[a, b],
                allowed=f"[{start}, e] with {start} < e <= {n}",
            )
        start = b
    if start != n:
        raise SpecError("layer ranges must cover the whole model", file=file,
                        field=f"stages.{len(plan.stages) - 1}.layers",
                        value=list(plan.stages[-1].layers),
                        allowed=f"last range ending at {n} ({problem.model.num_layers} blocks + "
                                "embedding + head)")


def _check_settings(problem: Problem, plan: TrainingPlan, file: str | None) -> None:
    """The microbatch size, recompute, ZeRO stage, schedule and ministages: allowed by the job
    and by one another."""
    job = problem.job
    if job.global_batch % plan.microbatch_size:
        raise SpecError("microbatch size must divide the global batch", file=file,
                        field="microbatch_size", value=plan.microbatch_size,
                        allowed=f"a divisor of {job.global_batch}")
    if plan.recompute not in job.recompute:
        raise SpecError("recompute setting not allowed by the job", file=file, field="recompute",
                        value=plan.recompute, allowed=_listed(job.recompute))
    if plan.zero_stage not in job.zero_stage:
        raise SpecError("ZeRO stage not allowed by the job", file=file, field="zero_stage",
                        value=plan.zero_stage, allowed=_listed(job.zero_stage))
    if plan.schedule not in job.schedule:
        raise SpecError("schedule not allowed by the job", file=file, field="schedule",
                        value=plan.schedule, allowed=_listed(job.schedule))
    if plan.schedule == "zorse":
        if not plan.recompute or plan.zero_stage != 2:
            raise SpecError("the zorse schedule checkpoints every layer boundary and runs ZeRO-2",
                            file=file, field="schedule", value=plan.schedule,
                            allowed="zorse with recompute: true and zero_stage: 2, or 1f1b / gpipe")
        for i, st in enumerate(plan.stages):
            if st.layers[1] - st.layers[0] < plan.ministages:
                raise SpecError("a stage holds fewer layers than the plan's ministages", file=file,
                                field=f"stages.{i}.layers", value=list(st.layers),
                                allowed=f"at least {plan.ministages} layers (ministages)")
    elif plan.ministages != 1:
        raise SpecError("ministages apply to the zorse schedule only", file=file,
                        field="ministages", value=plan.ministages,
                        allowed="1, or schedule: zorse")
    if job.microbatch_sizes and plan.microbatch_size not in job.microbatch_sizes:
        raise SpecError("microbatch size not allowed by the job", file=file,
                        field="microbatch_size", value=plan.microbatch_size,
                        allowed=_listed(job.microbatch_sizes))


def _check_replicas(problem: Problem, plan: TrainingPlan,
                    file: str | None) -> dict[tuple[str, str], int]:
    """Each stage's replicas run all its microbatches, each on GPUs of the pool it can use;
    returns the GPUs used per (GPU type, zone)."""
    total_mb = problem.job.global_batch // plan.microbatch_size
    reg = catalog.gpus()
    used: dict[tuple[str, str], int] = {}
    for i, st in enumerate(plan.stages):
        if sum(r.microbatches for r in st.replicas) != total_mb:
            raise SpecError(
                "replica microbatches of a stage must sum to global batch / microbatch size",
                file=file, field=f"stages.{i}.replicas",
                value=sum(r.microbatches for r in st.replicas), allowed=str(total_mb))
        for j, r in enumerate(st.replicas):
            f = f"stages.{i}.replicas.{j}"
            g = reg.canonical(r.gpu, field=f"{f}.gpu", file=file)
            _check_replica(problem, r, g, f, file)
            used[(g, r.zone)] = used.get((g, r.zone), 0) + r.tp
    return used


def _check_replica(problem: Problem, r, g: str, f: str, file: str | None) -> None:
    """Replica ``r`` (field ``f``) of GPU type ``g``: in the pool, its precision on that GPU,
    its TP inside one node and dividing the heads."""
    if r.zone not in problem.zone_region:
        raise SpecError("zone not in the pool", file=file, field=f"{f}.zone", value=r.zone,
                        allowed=", ".join(problem.zones))
    if (g, r.zone) not in problem.avail:
        have = sorted({gg for (gg, zz) in problem.avail if zz == r.zone})
        raise SpecError(f"the pool has no {g} in {r.zone}", file=file, field=f"{f}.gpu",
                        value=r.gpu, allowed=", ".join(have) or "none")
    if problem.job.precision == "mixed-bf16" and not problem.gpus[g].bf16:
        raise SpecError(f"{g} has no bf16 tensor cores", file=file, field=f"{f}.gpu",
                        value=r.gpu, allowed="GPUs with bf16 (Ampere and newer), or "
                                             "job.precision mixed-fp16")
    gpn = problem.gpus[g].gpus_per_node
    if r.tp > gpn:
        raise SpecError("TP must fit inside one node", file=file, field=f"{f}.tp",
                        value=r.tp, allowed=f"<= {gpn} GPUs per node of {g}")
    heads, kv = problem.model.num_heads, problem.model.kv_heads
    if r.tp & (r.tp - 1) or heads % r.tp or kv % r.tp:
        raise SpecError("TP must be a power of two dividing the attention heads and the "
                        "KV heads", file=file, field=f"{f}.tp", value=r.tp,
                        allowed=f"1, 2, 4, ... dividing {heads} heads and {kv} KV heads")


def _check_usage(problem: Problem, used: dict[tuple[str, str], int], file: str | None) -> None:
    """The GPUs used fit the pool and the quotas."""
    for (g, z), k in used.items():
        if k > problem.avail[(g, z)]:
            raise SpecError(f"plan uses more {g} in {z} than the pool has", file=file,
                            field="stages", value=k, allowed=f"<= {problem.avail[(g, z)]}")
    per_type: dict[str, int] = {}
    for (g, _), k in used.items():
        per_type[g] = per_type.get(g, 0) + k
    for g, q in problem.quotas.items():
        if per_type.get(g, 0) > q:
            raise SpecError(f"plan uses more {g} than its quota", file=file, field="stages",
                            value=per_type[g], allowed=f"<= {q}")


def _listed(values) -> str:
    """A job's allowed settings as a file spells them: ``true, false``, ``1f1b, gpipe``."""
    return ", ".join(spelt(v) for v in values)
