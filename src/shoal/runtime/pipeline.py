"""Run one TrainingPlan on torch.distributed: the pipeline schedule of each rank, the hand-offs
between stages, and the step (``shoal.runtime.shards`` sums gradients and updates).

Microbatch i meets, in every stage, the replica that owns it there (``shoal.runtime.layout``);
activations and gradients go between those replicas' first TP ranks (tagged by the boundary and
direction they cross) and are broadcast inside the receiving TP group, so neighbouring stages
may differ in replica count and TP degree, and so may the replicas of one stage. Losses are
summed over tokens and divided by the iteration's tokens, so summing the gradients over a
stage's replicas gives the gradient of the global batch's mean loss whatever the shares:
training is the same as one process on the whole batch. Sends are non-blocking, receives
blocking.

Under ZeRO-3 a stage keeps only shards of its layers: each layer is gathered for each forward
and backward of a microbatch, and its backward recomputes its forward from the layer's input
(kept from the forward); the replicas of a stage go through the stage's whole order together
(those that do not own an operation take part in its gathers only), so every gather has all its
members whatever the shares. Under the zorse schedule, a ministage is gathered once for its
forwards and once for its backwards, its gradients are reduce-scattered after them, and the
backward recomputes its forward from its input (a layer-boundary activation, kept in host
memory on a GPU).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as dist

from shoal.errors import SpecError
from shoal.runtime import checkpoint
from shoal.runtime.arch import Arch, as_arch
from shoal.runtime.groups import make_groups
from shoal.runtime.layout import Layout, Op, Role
from shoal.runtime.layout import layout as _layout
from shoal.runtime.model import Stage, run_layers, shard, token_loss, unshard
from shoal.runtime.shards import ParamStore
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan

__all__ = ["Layout", "Role", "Worker", "layout"]


def layout(plan: TrainingPlan, model: ModelSpec | Arch) -> Layout:
    """The rank layout of a plan, or a SpecError naming what the runtime cannot run."""
    return _layout(plan, as_arch(model))


def _mode(plan: TrainingPlan, replicated: bool) -> str:
    if not replicated:
        return "dense"
    if plan.schedule == "zorse" or plan.zero_stage == 3:
        return "sharded"
    return "zero12" if plan.zero_stage else "dense"


class Worker:
    """One rank's share of the plan: its stage's layers on its TP share, and the groups it
    talks in. Every rank must build its Worker (the process groups are made collectively).
    ``autocast``: the lower precision (torch.bfloat16 or torch.float16) forwards run in."""

    def __init__(self, plan: TrainingPlan, model: ModelSpec | Arch, *, seed: int = 0,
                 dtype=torch.float64, lr: float = 1e-3, weight_decay: float = 0.01,
                 device: torch.device | str = "cpu", autocast=None):
        self.plan, self.arch, self.dtype = plan, as_arch(model), dtype
        self.spec = self.arch.spec
        self.device, self.autocast = torch.device(device), autocast
        self.lay = lay = layout(plan, self.arch)
        if dist.get_world_size() != lay.world:
            raise SpecError(f"the plan needs {lay.world} processes, "
                            f"{dist.get_world_size()} were started")
        self.rank = dist.get_rank()
        self.role = lay.roles[self.rank]
        s = self.role.stage
        self.groups = make_groups(lay, self.rank)
        self.tp = self.groups.tp
        index = lay.stage_layers(s)
        self.model = Stage(self.arch, index[0], index[-1] + 1, tp=self.tp, seed=seed, dtype=dtype,
                           layers=index).to(self.device)
        self.mode = _mode(plan, self.groups.replicated)
        at, self.piece_mods = 0, []
        for piece in lay.pieces[s]:
            self.piece_mods.append(list(self.model.layers[at:at + len(piece)]))
            at += len(piece)
        named = [((index[k], n), p) for k, m in enumerate(self.model.layers)
                 for n, p in m.named_parameters()]
        self.layer_of = [k for k, m in enumerate(self.model.layers) for _ in m.parameters()]
        if plan.zero_stage == 3 and plan.schedule != "zorse":
            units = [[i for i, k in enumerate(self.layer_of) if k == layer]
                     for layer in range(len(index))]
        else:
            units = [[i for i, k in enumerate(self.layer_of)
                      if index[k] in piece] for piece in lay.pieces[s]]
            if plan.schedule != "zorse":
                units = [sum(units, [])]
        home = torch.device("cpu") if plan.schedule == "zorse" else None
        self.store = ParamStore(named, units, self.groups, self.mode, lr=lr,
                                weight_decay=weight_decay, home=home)
        self.params = self.store.params
        self._unit_of_module = {id(m): u for u, unit in enumerate(units)
                                for m in {self.model.layers[self.layer_of[i]] for i in unit}}

    # ---------------------------------------------------------------------------- hand-offs

    def _lead(self, stage: int, mb: int) -> int:
        return self.lay.first_rank[stage][self.lay.owner(stage, mb)]

    def _me(self) -> int:
        return self.lay.first_rank[self.role.stage][self.role.replica]

    def _bcast(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size > 1:
            dist.broadcast(x, src=self._me(), group=self.tp.group)
        return x

    def _virtual(self, op: Op) -> int:
        return op.piece * self.lay.n_stages + self.role.stage

    def _neighbour(self, v: int, mb: int) -> int:
        return self._lead(v % self.lay.n_stages, mb)

    def _send(self, x: torch.Tensor, v_to: int, mb: int, tag: int) -> None:
        to = self._neighbour(v_to, mb)
        if to == self._me():  # the same replica holds both pieces (one stage): no message
            self._mail[(tag, mb)] = x.detach().clone()
        elif self.role.tp_rank == 0:
            self._sends.append(dist.isend(x.detach().to(self.dtype).contiguous(), dst=to, tag=tag))

    def _recv(self, v_from: int, mb: int, tag: int, shape) -> torch.Tensor:
        src = self._neighbour(v_from, mb)
        if src == self._me():
            return self._mail.pop((tag, mb))
        x = torch.empty(shape, dtype=self.dtype, device=self.device)
        if self.role.tp_rank == 0:
            dist.recv(x, src=src, tag=tag)
        return self._bcast(x)

    # ---------------------------------------------------------------------------- one step

    def step(self, tokens: torch.Tensor) -> float:
        """One iteration on ``tokens`` (global batch x (sequence + 1)); the iteration's mean loss
        (the same on every rank)."""
        lay = self.lay
        self._tokens = tokens.to(self.device)
        mbs = self.plan.microbatch_size
        self._seq = tokens.shape[1] - 1
        self._shape = (mbs, self._seq, self.spec.hidden_size)
        self._n_tok = float(lay.total * mbs * self._seq)
        self._sends, self._mail, self._kept, self._out = [], {}, {}, {}
        self._loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self.store.zero_grad()
        mine = lay.ops[self.role.stage][self.role.replica]
        if self.mode == "sharded" and self.plan.schedule == "zorse":
            self._by_phase(mine)
        elif self.mode == "sharded":
            owned = set(lay.owned[self.role.stage][self.role.replica])
            for op in lay.stage_ops[self.role.stage]:
                self._run(op) if op.mb in owned else self._shadow(op)
        else:
            for op in mine:
                self._run(op)
        for w in self._sends:
            w.wait()
        self.store.finish()
        # the iteration's loss: the last stage's first TP ranks hold its parts
        if not (self.role.stage == lay.n_stages - 1 and self.role.tp_rank == 0):
            self._loss.zero_()
        # gloo reduces host tensors, NCCL device ones
        loss = self._loss if dist.get_backend() == "nccl" else self._loss.cpu()
        dist.all_reduce(loss)
        return float(loss)

    def _by_phase(self, mine: list[Op]) -> None:
        """The zorse schedule: each ministage gathered for its forwards, again for its
        backwards, then its gradients reduce-scattered."""
        V = len(self.lay.pieces[self.role.stage])
        for k in range(V):
            self.store.materialize(k)
            for op in mine:
                if not op.backward and op.piece == k:
                    self._run(op)
            self.store.release(k)
        for k in range(V - 1, -1, -1):
            self.store.materialize(k)
            for op in mine:
                if op.backward and op.piece == k:
                    self._run(op)
            self.store.reduce(k)
            self.store.release(k)

    def _cast(self):
        if self.autocast is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast)

    def _targets(self, mb: int) -> torch.Tensor:
        mbs = self.plan.microbatch_size
        return self._tokens[mb * mbs:(mb + 1) * mbs, 1:]

    def _run(self, op: Op) -> None:
        v = self._virtual(op)
        last = v == self.lay.n_virtual - 1
        mods = self.piece_mods[op.piece]
        sharded_layers = self.mode == "sharded" and self.plan.schedule != "zorse"
        if not op.backward:
            mbs = self.plan.microbatch_size
            if v == 0:
                x = self._tokens[op.mb * mbs:(op.mb + 1) * mbs, :-1]
            else:
                x = self._recv(v - 1, op.mb, 2 * (v - 1), self._shape)
            if self.mode == "sharded":
                with torch.no_grad(), self._cast():
                    y, kept = self._forward_kept(mods, x, per_layer=sharded_layers)
                self._kept[(op.mb, op.piece)] = kept
            else:
                if v > 0:
                    x.requires_grad_(True)
                with self._cast():
                    y = run_layers(mods, x, self.plan.recompute)
                self._kept[(op.mb, op.piece)] = x
            out = token_loss(y, self._targets(op.mb), self._n_tok) if last else y
            if last:
                self._loss += out.detach()
            else:
                self._send(y, v + 1, op.mb, 2 * v)
            if self.mode != "sharded":  # the backward goes from it (sharded: recomputed)
                self._out[(op.mb, op.piece)] = out
            return
        g = None if last else self._recv(v + 1, op.mb, 2 * v + 1, self._shape)
        if self.mode == "sharded":
            gx = self._backward_recomputed(op, mods, g, last, sharded_layers)
        else:
            y = self._out.pop((op.mb, op.piece))
            y.backward() if last else y.backward(g)
            gx = self._kept.pop((op.mb, op.piece)).grad
        if v > 0:
            self._send(gx, v - 1, op.mb, 2 * (v - 1) + 1)

    def _forward_kept(self, mods, x, per_layer: bool):
        """Forward through ``mods`` without a graph; the inputs the backward recomputes from:
        each layer's (gathered one at a time) or the piece's."""
        kept = []
        for m in mods:
            if per_layer or not kept:
                kept.append(self._keep(x))
            if per_layer:
                self.store.materialize(self._unit_of_module[id(m)])
            x = m(x)
            if per_layer:
                self.store.release(self._unit_of_module[id(m)])
        return x, kept

    def _keep(self, x: torch.Tensor) -> torch.Tensor:
        # under the zorse schedule boundary activations wait in host memory (Zorse §4.1.3)
        if self.plan.schedule == "zorse" and x.device.type != "cpu":
            return x.to("cpu", non_blocking=True)
        return x

    def _backward_recomputed(self, op: Op, mods, g, last: bool, per_layer: bool):
        kept = self._kept.pop((op.mb, op.piece))
        groups = [[m] for m in mods] if per_layer else [list(mods)]
        for chunk, x in reversed(list(zip(groups, kept, strict=True))):
            u = self._unit_of_module[id(chunk[0])]
            if per_layer:
                self.store.materialize(u)
            x = x.to(self.device)
            if x.is_floating_point():
                x = x.detach().requires_grad_(True)
            with self._cast():
                y = run_layers(chunk, x, self.plan.recompute and not per_layer)
            is_end = last and chunk is groups[-1]
            if is_end:
                token_loss(y, self._targets(op.mb), self._n_tok).backward()
            else:
                y.backward(g)
            g = x.grad if x.is_floating_point() else None
            if per_layer:
                self.store.reduce(u)
                self.store.release(u)
        return g

    def _shadow(self, op: Op) -> None:
        """Take part in the gathers (and gradient sums) of an operation another replica of
        this stage runs (ZeRO-3)."""
        units = [self._unit_of_module[id(m)] for m in self.piece_mods[op.piece]]
        for u in (reversed(units) if op.backward else units):
            self.store.materialize(u)
            if op.backward:
                self.store.reduce(u)
            self.store.release(u)

    # ----------------------------------------------------------------------------- state

    def _keys(self) -> list[tuple[int, str]]:
        """(global layer index, parameter name inside the layer) of each parameter."""
        return list(self.store.keys)

    def state(self) -> dict[tuple[int, str], torch.Tensor]:
        """This rank's parameters (its TP shards) by (global layer index, name in the layer).
        Collective under ZeRO-3 and the zorse schedule (the shards are gathered)."""
        rows, _ = self.store.state()
        return {k: r["param"].cpu() for k, r in zip(self._keys(), rows, strict=True)}

    def snapshot(self) -> dict:
        """This rank's checkpoint content, copied now: parameters and Adam state by global
        layer and name, TP shards as such. Collective: every rank must call it."""
        rows, step = self.store.state()
        return {"tp_rank": self.role.tp_rank, "tp": self.tp.size, "step": step,
                "rows": {k: {n: t.cpu() for n, t in r.items()}
                         for k, r in zip(self._keys(), rows, strict=True)}}

    def load(self, folder) -> None:
        """Take parameters and Adam state from a published checkpoint written under any plan
        (its files checked against its manifest and read as weights only)."""
        shards: dict[tuple[int, str], dict[int, dict]] = {}
        degree: dict[tuple[int, str], int] = {}
        step = 0
        for doc in checkpoint.read(folder):
            step = doc["step"]
            for key, row in doc["rows"].items():
                shards.setdefault(key, {})[doc["tp_rank"]] = row
                degree[key] = doc["tp"]
        rows = []
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
            rows.append({k: shard(key[1], v, self.tp.size, self.role.tp_rank)
                         .to(device=self.device, dtype=p.dtype) for k, v in full.items()})
        self.store.load(rows, step)

