"""Run one TrainingPlan on torch.distributed: ranks, process groups, the pipeline schedule,
gradient synchronisation and the optimizer step.

Ranks are given stage by stage, replica by replica, TP rank by TP rank. Each stage deals the
iteration's microbatches to its replicas by their ``microbatches`` shares, in order of due time
(``shoal.specs.plan.owners``), so microbatch i meets, in every stage, the replica that owns i
there; activations and gradients go between those replicas' first TP ranks and are broadcast
inside the receiving TP group, so neighbouring stages may differ in replica count and TP degree.
Losses are summed over tokens and divided by the iteration's tokens, so summing the gradients
over a stage's replicas (all-reduce) gives the gradient of the global batch's mean loss whatever
the shares: training is the same as one process on the whole batch. Each replica runs its part
of its stage's 1F1B or GPipe order (``shoal.specs.plan.orders``: no plan can deadlock); sends
are non-blocking and receives blocking.

ZeRO (``zero_stage`` 1 or 2): inside each data-parallel group the flat gradient is
reduce-scattered so that each rank owns one shard, updates only that shard with AdamW (its
optimizer state is the shard's), and the parameters are all-gathered back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shoal.errors import SpecError
from shoal.runtime import checkpoint
from shoal.runtime.model import Stage, TPGroup, token_loss
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan, orders, owners


@dataclass(frozen=True)
class Role:
    stage: int
    replica: int
    tp_rank: int


@dataclass(frozen=True)
class Layout:
    """Where every rank sits, and which microbatches each replica owns."""

    roles: tuple[Role, ...]
    first_rank: tuple[tuple[int, ...], ...]  # [stage][replica] -> global rank of its TP rank 0
    tp: tuple[tuple[int, ...], ...]  # [stage][replica] -> TP degree
    owned: tuple[tuple[tuple[int, ...], ...], ...]  # [stage][replica] -> microbatch indices
    total: int  # microbatches per iteration
    ops: tuple[tuple[tuple[tuple[str, int], ...], ...], ...]  # [stage][replica] -> ("F"|"B", mb)

    @property
    def world(self) -> int:
        return len(self.roles)

    def owner(self, stage: int, mb: int) -> int:
        for j, mbs in enumerate(self.owned[stage]):
            if mb in mbs:
                return j
        raise KeyError(mb)


def layout(plan: TrainingPlan, spec: ModelSpec) -> Layout:
    """The rank layout of a plan, or a SpecError naming what the runtime cannot run."""
    if plan.zero_stage > 2:
        raise SpecError("unsupported by the runtime: ZeRO-3 (the estimator and planners model "
                        "it; the runtime shards optimizer state and gradients only)",
                        field="zero_stage", value=plan.zero_stage, allowed="0, 1 or 2")
    if plan.schedule == "zorse":
        raise SpecError("unsupported by the runtime: the zorse schedule (ministages with host "
                        "offload; the estimator and planners model it)", field="schedule",
                        value=plan.schedule, allowed="1f1b or gpipe")
    n_layers = spec.num_layers + 2
    edges = [st.layers for st in plan.stages]
    if edges[0][0] != 0 or edges[-1][1] != n_layers or any(
            a[1] != b[0] for a, b in zip(edges, edges[1:], strict=False)):
        raise SpecError(f"the stages' layers must tile the model's {n_layers} layers "
                        "(embedding, blocks, head) in order", field="stages", value=edges)
    for s, (a, b) in enumerate(edges):
        if b <= a:
            raise SpecError("a stage must hold at least one layer", field=f"stages.{s}.layers",
                            value=[a, b])
    totals = {sum(r.microbatches for r in st.replicas) for st in plan.stages}
    if len(totals) != 1:
        raise SpecError("every stage must process the same number of microbatches",
                        field="stages", value=sorted(totals))
    if totals == {0}:
        raise SpecError("the iteration has no microbatch: every replica has 0",
                        field="stages.0.replicas", allowed="at least one microbatch")
    roles, first, tps, owned = [], [], [], []
    for s, st in enumerate(plan.stages):
        if len({r.tp for r in st.replicas}) > 1:
            raise SpecError("unsupported by the runtime: replicas of one stage with different "
                            "TP degrees", field=f"stages.{s}.replicas",
                            value=[r.tp for r in st.replicas])
        for r in st.replicas:
            if spec.num_heads % r.tp or spec.ffn % r.tp:
                raise SpecError(f"TP {r.tp} does not divide the model's {spec.num_heads} heads "
                                f"and {spec.ffn} MLP units", field=f"stages.{s}.replicas")
        f, t = [], []
        own = owners([r.microbatches for r in st.replicas])
        o = [tuple(i for i, x in enumerate(own) if x == j) for j in range(len(st.replicas))]
        for j, r in enumerate(st.replicas):
            f.append(len(roles))
            t.append(r.tp)
            roles += [Role(s, j, k) for k in range(r.tp)]
        first.append(tuple(f))
        tps.append(tuple(t))
        owned.append(tuple(o))
    ops = tuple(tuple(tuple(("B" if bk else "F", m) for bk, m in rep) for rep in stage)
                for stage in orders(plan.schedule, [[r.microbatches for r in st.replicas]
                                                     for st in plan.stages]))
    return Layout(tuple(roles), tuple(first), tuple(tps), tuple(owned), totals.pop(), ops)


class Worker:
    """One rank's share of the plan: its stage's layers on its TP share, and the groups it
    talks in. Every rank must build its Worker (the process groups are made collectively)."""

    def __init__(self, plan: TrainingPlan, spec: ModelSpec, *, seed: int = 0,
                 dtype=torch.float64, lr: float = 1e-3, weight_decay: float = 0.01):
        self.plan, self.spec, self.dtype = plan, spec, dtype
        self.lay = layout(plan, spec)
        rank = dist.get_rank()
        if dist.get_world_size() != self.lay.world:
            raise SpecError(f"the plan needs {self.lay.world} processes, "
                            f"{dist.get_world_size()} were started")
        self.rank, self.role = rank, self.lay.roles[rank]
        s, j, t = self.role.stage, self.role.replica, self.role.tp_rank
        # collectives: every rank creates every group, in the same order
        self.tp_group = None
        for s2, reps in enumerate(self.lay.first_rank):
            for j2, r0 in enumerate(reps):
                n = self.lay.tp[s2][j2]
                if n > 1:
                    g = dist.new_group(list(range(r0, r0 + n)))
                    if (s2, j2) == (s, j):
                        self.tp_group = g
        self.dp_group, self.dp_ranks = None, []
        for s2, reps in enumerate(self.lay.first_rank):
            for k in range(self.lay.tp[s2][0]):
                ranks = [r0 + k for r0 in reps]
                g = dist.new_group(ranks) if len(ranks) > 1 else None
                if (s2, k) == (s, t):
                    self.dp_group, self.dp_ranks = g, ranks
        tp_n = self.lay.tp[s][j]
        self.tp = TPGroup(tp_n, t, self.tp_group)
        a, b = plan.stages[s].layers
        self.model = Stage(spec, a, b, tp=self.tp, seed=seed, dtype=dtype,
                           recompute=plan.recompute)
        self.params = [p for p in self.model.parameters()]
        self.is_first, self.is_last = s == 0, s == len(plan.stages) - 1
        self.zero = plan.zero_stage if len(self.dp_ranks) > 1 else 0
        if self.zero:
            self._flat = torch.cat([p.detach().reshape(-1) for p in self.params])
            n_dp = len(self.dp_ranks)
            self._shard = -(-self._flat.numel() // n_dp)
            self._flat = F.pad(self._flat, (0, self._shard * n_dp - self._flat.numel()))
            me = self.dp_ranks.index(rank)
            self._mine = torch.nn.Parameter(self._flat[me * self._shard:(me + 1) * self._shard].clone())
            self.opt = torch.optim.AdamW([self._mine], lr=lr, weight_decay=weight_decay)
        else:
            self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)

    # ------------------------------------------------------------------------------ one step

    def _tp0(self, stage: int, replica: int) -> int:
        return self.lay.first_rank[stage][replica]

    def _bcast(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1:
            dist.broadcast(x, src=self._tp0(self.role.stage, self.role.replica), group=self.tp_group)
        return x

    def step(self, tokens: torch.Tensor) -> float:
        """One iteration on ``tokens`` (global batch x (sequence + 1)); the iteration's mean loss
        (the same on every rank)."""
        plan, lay = self.plan, self.lay
        s, j = self.role.stage, self.role.replica
        mbs = plan.microbatch_size
        seq = tokens.shape[1] - 1
        n_tok = float(lay.total * mbs * seq)
        h = self.spec.hidden_size
        sends, inputs, outputs = [], {}, {}
        loss_sum = torch.zeros((), dtype=torch.float64)
        lead = self.role.tp_rank == 0
        for p in self.params:
            p.grad = None
        for kind, m in lay.ops[s][j]:
            if kind == "F":
                x_tok = tokens[m * mbs:(m + 1) * mbs]
                if self.is_first:
                    x = x_tok[:, :-1]
                else:
                    x = torch.empty(mbs, seq, h, dtype=self.dtype)
                    if lead:
                        dist.recv(x, src=self._tp0(s - 1, lay.owner(s - 1, m)))
                    x = self._bcast(x).requires_grad_(True)
                y = self.model(x)
                inputs[m] = x
                if self.is_last:
                    loss = token_loss(y, x_tok[:, 1:], n_tok)
                    outputs[m] = loss
                    loss_sum += loss.detach()
                else:
                    outputs[m] = y
                    if lead:
                        sends.append(dist.isend(y.detach().contiguous(),
                                                dst=self._tp0(s + 1, lay.owner(s + 1, m))))
            else:
                y = outputs.pop(m)
                if self.is_last:
                    y.backward()
                else:
                    g = torch.empty_like(y)
                    if lead:
                        dist.recv(g, src=self._tp0(s + 1, lay.owner(s + 1, m)))
                    y.backward(self._bcast(g))
                x = inputs.pop(m)
                if not self.is_first and lead:
                    sends.append(dist.isend(x.grad.contiguous(),
                                            dst=self._tp0(s - 1, lay.owner(s - 1, m))))
        for w in sends:
            w.wait()
        self._update()
        # the iteration's loss: the last stage's first TP ranks hold its parts
        if not (self.is_last and self.role.tp_rank == 0):
            loss_sum.zero_()
        dist.all_reduce(loss_sum)
        return float(loss_sum)

    def _update(self) -> None:
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if not self.zero:
            if self.dp_group is not None:  # one flat all-reduce: one message, not one per tensor
                flat = torch.cat([p.grad.reshape(-1) for p in self.params])
                dist.all_reduce(flat, group=self.dp_group)
                at = 0
                for p in self.params:
                    p.grad.copy_(flat[at:at + p.numel()].view_as(p))
                    at += p.numel()
            self.opt.step()
            return
        n_dp = len(self.dp_ranks)
        flat_g = torch.cat([p.grad.reshape(-1) for p in self.params])
        flat_g = F.pad(flat_g, (0, self._shard * n_dp - flat_g.numel()))
        chunks = list(flat_g.split(self._shard))
        mine = torch.empty(self._shard, dtype=flat_g.dtype)
        dist.reduce_scatter(mine, chunks, group=self.dp_group)
        self._mine.grad = mine
        self.opt.step()
        out = [torch.empty(self._shard, dtype=self._mine.dtype) for _ in range(n_dp)]
        dist.all_gather(out, self._mine.detach(), group=self.dp_group)
        flat = torch.cat(out)
        at = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[at:at + p.numel()].view_as(p))
                at += p.numel()

    def state(self) -> dict[tuple[int, str], torch.Tensor]:
        """This rank's parameters (its TP shards) by (global layer index, name in the layer)."""
        return {key: p.detach().clone() for key, p in zip(self._keys(), self.params, strict=True)}

    # ----------------------------------------------------------------------------- checkpoints

    def _keys(self) -> list[tuple[int, str]]:
        """(global layer index, parameter name inside the layer) of each parameter."""
        a = self.plan.stages[self.role.stage].layers[0]
        out = []
        for name, _ in self.model.named_parameters():
            _, k, rest = name.split(".", 2)
            out.append((a + int(k), rest))
        return out

    def _adam(self) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Per parameter (this rank's TP shard): Adam's first and second moments, and the step."""
        if not self.zero:
            st = [self.opt.state.get(p, {}) for p in self.params]
            step = int(st[0]["step"]) if st and "step" in st[0] else 0
            z = [torch.zeros_like(p) for p in self.params]
            return ([x.get("exp_avg", zz) for x, zz in zip(st, z, strict=True)],
                    [x.get("exp_avg_sq", zz) for x, zz in zip(st, z, strict=True)], step)
        st = self.opt.state.get(self._mine, {})
        step = int(st["step"]) if "step" in st else 0
        out = []
        for key in ("exp_avg", "exp_avg_sq"):
            mine = st.get(key, torch.zeros_like(self._mine)).detach()
            parts = [torch.empty_like(mine) for _ in self.dp_ranks]
            dist.all_gather(parts, mine, group=self.dp_group)
            flat, at, per = torch.cat(parts), 0, []
            for p in self.params:
                per.append(flat[at:at + p.numel()].view_as(p).clone())
                at += p.numel()
            out.append(per)
        return out[0], out[1], step

    def snapshot(self) -> dict:
        """This rank's checkpoint content, copied now: parameters and Adam state by global
        layer and name, TP shards as such. Collective: every rank must call it."""
        m1, m2, step = self._adam()
        rows = {key: {"param": p.detach().clone(), "exp_avg": a.clone(), "exp_avg_sq": b.clone()}
                for key, p, a, b in zip(self._keys(), self.params, m1, m2, strict=True)}
        return {"tp_rank": self.role.tp_rank, "tp": self.tp.size, "step": step, "rows": rows}

    def load(self, folder) -> None:
        """Take parameters and Adam state from a published checkpoint written under any plan
        (its files checked against its manifest and read as weights only)."""
        from shoal.runtime.model import shard, unshard

        shards: dict[tuple[int, str], dict[int, dict]] = {}
        degree: dict[tuple[int, str], int] = {}
        step = 0
        for doc in checkpoint.read(folder):
            step = doc["step"]
            for key, row in doc["rows"].items():
                shards.setdefault(key, {})[doc["tp_rank"]] = row
                degree[key] = doc["tp"]
        state = {}
        for key, p in zip(self._keys(), self.params, strict=True):
            if key not in shards:
                raise SpecError("the checkpoint lacks a parameter of this plan", file=str(folder),
                                value=str(key))
            if sorted(shards[key]) != list(range(degree[key])):
                raise SpecError(f"the checkpoint lacks TP shards of a parameter (has "
                                f"{sorted(shards[key])} of {degree[key]})", file=str(folder),
                                value=str(key))
            parts = [shards[key][t] for t in sorted(shards[key])]
            full = {k: unshard(key[1], [x[k] for x in parts]) for k in parts[0]}
            # in this run's dtype (the checkpoint may have been written in another)
            mine = {k: shard(key[1], v, self.tp.size, self.role.tp_rank).to(p.dtype)
                    for k, v in full.items()}
            with torch.no_grad():
                p.copy_(mine["param"])
            state[p] = mine
        if not self.zero:
            for p in self.params:
                self.opt.state[p] = {"step": torch.tensor(float(step)),
                                     "exp_avg": state[p]["exp_avg"],
                                     "exp_avg_sq": state[p]["exp_avg_sq"]}
            return
        n_dp, me = len(self.dp_ranks), self.dp_ranks.index(self.rank)
        flat = {}
        for k in ("param", "exp_avg", "exp_avg_sq"):
            f = torch.cat([state[p][k].reshape(-1) for p in self.params])
            f = F.pad(f, (0, self._shard * n_dp - f.numel()))
            flat[k] = f[me * self._shard:(me + 1) * self._shard].clone()
        with torch.no_grad():
            self._mine.copy_(flat["param"])
        self.opt.state[self._mine] = {"step": torch.tensor(float(step)),
                                      "exp_avg": flat["exp_avg"],
                                      "exp_avg_sq": flat["exp_avg_sq"]}

