"""What to rent for a plan: GPUs and VMs per zone and GPU type."""

from __future__ import annotations

from shoal.problem import Problem
from shoal.specs.plan import TrainingPlan


def rent(problem: Problem, plan: TrainingPlan) -> list[dict]:
    """GPUs and VMs to rent per zone and GPU type (``vm_shapes``), zones then GPU types in
    order. The cost of a plan charges the GPUs, as the estimate does."""
    groups: dict[tuple[str, str], list[int]] = {}
    for s in plan.stages:
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
