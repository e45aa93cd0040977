"""Where every rank of a plan sits and what it runs: roles, microbatch owners, the layers of each
stage's pieces, and each replica's operations in order.

Ranks go stage by stage, replica by replica, TP rank by TP rank. Each stage deals the
iteration's microbatches to its replicas by their shares (``shoal.specs.plan.owners``).

A stage runs its layers as one piece, or under the zorse schedule as ``ministages`` pieces
(Zorse §4.1): the pieces are taken round-robin over the stages, virtual stage v = k S + s being
piece k of stage s, and the model's layers are dealt to the virtual stages in order, each
getting as many as the plan's stage s gives its piece k (``shoal.estimate.ministage.edges`` of
the stage's count), so a stage holds as many layers as its ``layers`` range says and the
embedding and head stay on the first and last stage, as the estimator costs them. Each replica
runs, for k = 0 .. V-1, the forwards of its microbatches through piece k, then the backwards
for k = V-1 .. 0 (GPipe order, ministage-major). Other schedules run ``orders`` (1F1B, GPipe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from shoal.errors import SpecError
from shoal.runtime.arch import Arch
from shoal.runtime.params import TP_DIM, layer_params
from shoal.specs.plan import TrainingPlan, orders, owners, stage_orders


@dataclass(frozen=True)
class Role:
    stage: int
    replica: int
    tp_rank: int


@dataclass(frozen=True)
class Op:
    """One operation of a replica: a forward or backward of microbatch ``mb`` through the
    stage's piece ``piece`` (virtual stage ``piece * stages + stage``)."""

    backward: bool
    mb: int
    piece: int = 0


@dataclass(frozen=True)
class Layout:
    """Where every rank sits, and which microbatches each replica owns."""

    roles: tuple[Role, ...]
    first_rank: tuple[tuple[int, ...], ...]  # [stage][replica] -> global rank of its TP rank 0
    tp: tuple[tuple[int, ...], ...]  # [stage][replica] -> TP degree
    owned: tuple[tuple[tuple[int, ...], ...], ...]  # [stage][replica] -> microbatch indices
    total: int  # microbatches per iteration
    ops: tuple[tuple[tuple[Op, ...], ...], ...]  # [stage][replica] -> its operations in order
    stage_ops: tuple[tuple[Op, ...], ...]  # [stage] -> the whole stage's order (all replicas)
    pieces: tuple[tuple[tuple[int, ...], ...], ...]  # [stage][piece] -> layer indices

    @property
    def world(self) -> int:
        return len(self.roles)

    @property
    def n_stages(self) -> int:
        return len(self.first_rank)

    @property
    def n_virtual(self) -> int:
        return self.n_stages * len(self.pieces[0])

    def owner(self, stage: int, mb: int) -> int:
        for j, mbs in enumerate(self.owned[stage]):
            if mb in mbs:
                return j
        raise KeyError(mb)

    def stage_layers(self, stage: int) -> list[int]:
        return [i for piece in self.pieces[stage] for i in piece]


def _check_shape(plan: TrainingPlan, n_layers: int) -> None:
    edges = [st.layers for st in plan.stages]
    if edges[0][0] != 0 or edges[-1][1] != n_layers or any(
            a[1] != b[0] for a, b in zip(edges, edges[1:], strict=False)):
        raise SpecError(f"the stages' layers must tile the model's {n_layers} layers "
                        "(embedding, blocks, head) in order", field="stages", value=edges)
    for s, (a, b) in enumerate(edges):
        if b <= a:
            raise SpecError("a stage must hold at least one layer", field=f"stages.{s}.layers",
                            value=[a, b])
        if plan.schedule == "zorse" and b - a < plan.ministages:
            raise SpecError(f"{b - a} layers cannot make {plan.ministages} ministages",
                            field=f"stages.{s}.layers", value=[a, b],
                            allowed=f"at least {plan.ministages} layers per stage")
    totals = {sum(r.microbatches for r in st.replicas) for st in plan.stages}
    if len(totals) != 1:
        raise SpecError("every stage must process the same number of microbatches",
                        field="stages", value=sorted(totals))
    if totals == {0}:
        raise SpecError("the iteration has no microbatch: every replica has 0",
                        field="stages.0.replicas", allowed="at least one microbatch")


def _check_tp(plan: TrainingPlan, arch: Arch) -> None:
    """Every TP degree splits whole heads, KV heads and MLP units; a stage's replicas of other
    degrees meet in pieces of the least common multiple (their gradients are summed there)."""
    s_ = arch.spec
    for s, st in enumerate(plan.stages):
        for r in st.replicas:
            for n, what in ((s_.num_heads, "heads"), (s_.kv_heads, "KV heads"),
                            (s_.ffn, "MLP units")):
                if n % r.tp:
                    raise SpecError(f"TP {r.tp} does not divide the model's {n} {what}",
                                    field=f"stages.{s}.replicas", value=r.tp)
        g = math.lcm(*(r.tp for r in st.replicas))
        for p in layer_params(arch, 1):
            if p.name in TP_DIM and p.shape[TP_DIM[p.name]] % g:
                raise SpecError(f"replicas of TP degrees {sorted({r.tp for r in st.replicas})} "
                                f"sum gradients in {g} pieces, which do not divide the "
                                f"{p.shape[TP_DIM[p.name]]} rows of {p.name}",
                                field=f"stages.{s}.replicas")


def pieces(plan: TrainingPlan) -> list[list[list[int]]]:
    """[stage][piece] -> the layers it holds (one piece per stage but under zorse)."""
    if plan.schedule != "zorse":
        return [[list(range(*st.layers))] for st in plan.stages]
    V, S = plan.ministages, len(plan.stages)
    counts = []
    for st in plan.stages:
        q, r = divmod(st.layers[1] - st.layers[0], V)
        counts.append([q + (1 if k < r else 0) for k in range(V)])
    out: list[list[list[int]]] = [[[] for _ in range(V)] for _ in range(S)]
    at = 0
    for k in range(V):
        for s in range(S):
            out[s][k] = list(range(at, at + counts[s][k]))
            at += counts[s][k]
    return out


def _zorse_ops(shares: list[list[int]], V: int) -> list[list[list[Op]]]:
    out = []
    for st in shares:
        own = owners(st)
        reps = []
        for j in range(len(st)):
            mine = [m for m, o in enumerate(own) if o == j]
            reps.append([Op(False, m, k) for k in range(V) for m in mine]
                        + [Op(True, m, k) for k in range(V - 1, -1, -1) for m in mine])
        out.append(reps)
    return out


def layout(plan: TrainingPlan, arch: Arch) -> Layout:
    """The rank layout of a plan, or a SpecError naming what the runtime cannot run."""
    _check_shape(plan, arch.n_layers)
    _check_tp(plan, arch)
    roles, first, tps, owned = [], [], [], []
    for s, st in enumerate(plan.stages):
        own = owners([r.microbatches for r in st.replicas])
        owned.append(tuple(tuple(i for i, x in enumerate(own) if x == j)
                           for j in range(len(st.replicas))))
        f = []
        for j, r in enumerate(st.replicas):
            f.append(len(roles))
            roles += [Role(s, j, k) for k in range(r.tp)]
        first.append(tuple(f))
        tps.append(tuple(r.tp for r in st.replicas))
    shares = [[r.microbatches for r in st.replicas] for st in plan.stages]
    if plan.schedule == "zorse":
        ops = _zorse_ops(shares, plan.ministages)
        V, total = plan.ministages, sum(shares[0])
        whole = [Op(False, m, k) for k in range(V) for m in range(total)] + [
            Op(True, m, k) for k in range(V - 1, -1, -1) for m in range(total)]
        stage_ops = tuple(tuple(whole) for _ in plan.stages)
    else:
        ops = [[[Op(bool(bk), m) for bk, m in rep] for rep in stage]
               for stage in orders(plan.schedule, shares)]
        # each replica's order is part of its stage's (``orders``)
        stage_ops = tuple(tuple(Op(bool(bk), m) for bk, m in stage)
                          for stage in stage_orders(plan.schedule, shares))
    total = sum(shares[0])
    return Layout(tuple(roles), tuple(first), tuple(tps), tuple(owned), total,
                  tuple(tuple(tuple(rep) for rep in stage) for stage in ops), stage_ops,
                  tuple(tuple(tuple(p) for p in st) for st in pieces(plan)))
