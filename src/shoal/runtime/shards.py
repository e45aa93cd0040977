"""A stage's parameters across its replicas: gradient sums, ZeRO sharding and the optimizer.

The parameters are cut into units (the whole stage; under ZeRO-3 each layer; under the zorse
schedule each ministage). For each unit and each sync group (``shoal.runtime.groups``) this rank
is in, its flat vector is this rank's part of that group's pieces of the unit's parameters. Three
modes:

- ``dense`` (ZeRO 0, or a stage of one replica): each group's flat gradient is all-reduced and
  every rank updates its whole parameters with AdamW.
- ``zero12`` (ZeRO 1 and 2): each flat gradient is reduce-scattered, each rank updates its
  shard (its optimizer state is the shard's) and the parameters are all-gathered back.
- ``sharded`` (ZeRO-3, and the zorse schedule's ministages): between uses only the shard is
  kept; ``materialize(unit)`` all-gathers the unit's parameters before it runs, ``release``
  frees them, ``reduce`` reduce-scatters its gradients into the shard's (they add up over
  microbatches), and the shards are updated at the end of the iteration. ``home`` is where the
  shards and their optimizer state live (host memory under the zorse schedule).

AdamW works element by element, so updating shards is updating the whole.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from shoal.runtime.groups import Groups, SyncGroup
from shoal.runtime.params import TP_DIM


class ParamStore:
    def __init__(self, named: list[tuple[tuple[int, str], torch.nn.Parameter]],
                 units: list[list[int]], groups: Groups, mode: str, *, lr: float,
                 weight_decay: float, home: torch.device | None = None):
        self.keys = [k for k, _ in named]
        self.params = [p for _, p in named]
        self.units, self.groups, self.mode = units, groups, mode
        self.shapes = [tuple(p.shape) for p in self.params]
        self.home = home or self.params[0].device
        self.shards: dict[tuple[int, int], torch.nn.Parameter] = {}
        if mode == "dense":
            self.opt = torch.optim.AdamW(self.params, lr=lr, weight_decay=weight_decay)
            return
        for u in range(len(units)):
            for gi, g in enumerate(groups.sync):
                flat = self._flat(u, g, [p.detach() for p in self.params])
                self.shards[(u, gi)] = torch.nn.Parameter(self._mine(flat, g).to(self.home))
        self.opt = torch.optim.AdamW(list(self.shards.values()), lr=lr, weight_decay=weight_decay)
        if mode == "sharded":
            for u in range(len(units)):
                self.release(u)

    # ------------------------------------------------------------------------------ pieces

    def _piece(self, i: int, t: torch.Tensor, g: SyncGroup) -> torch.Tensor:
        """This rank's part of group ``g``'s pieces of parameter ``i`` (a view of ``t``)."""
        dim = TP_DIM.get(self.keys[i][1])
        tp = self.groups.tp
        if dim is None or self.groups.G == 1:
            return t
        per_rank = self.groups.G // tp.size  # pieces on each TP rank
        width = t.shape[dim] // per_rank
        return t.narrow(dim, (g.lo - tp.rank * per_rank) * width, (g.hi - g.lo) * width)

    def _flat(self, u: int, g: SyncGroup, tensors: list[torch.Tensor]) -> torch.Tensor:
        flat = torch.cat([self._piece(i, tensors[i], g).reshape(-1) for i in self.units[u]])
        return F.pad(flat, (0, -len(flat) % g.size))

    def _spread(self, u: int, g: SyncGroup, flat: torch.Tensor, into: list[torch.Tensor]) -> None:
        """Write a flat vector back into the pieces of ``into`` (tensors by parameter index)."""
        at = 0
        for i in self.units[u]:
            piece = self._piece(i, into[i], g)
            piece.copy_(flat[at:at + piece.numel()].view_as(piece))
            at += piece.numel()

    @staticmethod
    def _mine(flat: torch.Tensor, g: SyncGroup) -> torch.Tensor:
        n = len(flat) // g.size
        return flat[g.me * n:(g.me + 1) * n].clone()

    def _gathered(self, shard: torch.Tensor, g: SyncGroup, device) -> torch.Tensor:
        shard = shard.detach().to(device)
        if g.group is None:
            return shard
        parts = [torch.empty_like(shard) for _ in range(g.size)]
        dist.all_gather(parts, shard.contiguous(), group=g.group)
        return torch.cat(parts)

    # ---------------------------------------------------------------------------- sharded use

    def materialize(self, u: int) -> None:
        """Gather unit ``u``'s parameters (this rank's TP slices) from the shards."""
        if self.mode != "sharded":
            return
        dev = self.params[0].device
        full = {i: torch.empty(self.shapes[i], dtype=self.params[i].dtype, device=dev)
                for i in self.units[u]}
        tensors = [full.get(i) for i in range(len(self.params))]
        for gi, g in enumerate(self.groups.sync):
            self._spread(u, g, self._gathered(self.shards[(u, gi)], g, dev), tensors)
        for i in self.units[u]:
            self.params[i].data = full[i]

    def release(self, u: int) -> None:
        if self.mode != "sharded":
            return
        for i in self.units[u]:
            p = self.params[i]
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            p.grad = None

    def reduce(self, u: int) -> None:
        """Add unit ``u``'s gradients, summed over the replicas, to the shards' (collective:
        a replica with nothing to add adds zeros)."""
        if self.mode != "sharded":
            return
        grads = [None] * len(self.params)
        for i in self.units[u]:
            p = self.params[i]
            grads[i] = p.grad if p.grad is not None else torch.zeros(self.shapes[i], dtype=p.dtype,
                                                                     device=p.device)
            p.grad = None
        for gi, g in enumerate(self.groups.sync):
            mine = self._reduce_scatter(self._flat(u, g, grads), g).to(self.home)
            shard = self.shards[(u, gi)]
            shard.grad = mine if shard.grad is None else shard.grad + mine

    @staticmethod
    def _reduce_scatter(flat: torch.Tensor, g: SyncGroup) -> torch.Tensor:
        if g.group is None:
            return flat
        n = len(flat) // g.size
        out = torch.empty(n, dtype=flat.dtype, device=flat.device)
        dist.reduce_scatter(out, list(flat.split(n)), group=g.group)
        return out

    # ---------------------------------------------------------------------------- the update

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None
        for s in self.shards.values():
            s.grad = None

    def finish(self) -> None:
        """Sum the iteration's gradients over the replicas and update the parameters."""
        for p, shape in zip(self.params, self.shapes, strict=True):
            if self.mode != "sharded" and p.grad is None:
                p.grad = torch.zeros(shape, dtype=p.dtype, device=p.device)
        if self.mode == "dense":
            grads = [p.grad for p in self.params]
            # every flat from this rank's own gradients before any is written back: a
            # replicated tensor goes through each of its groups
            flats = [(g, self._flat(0, g, grads)) for g in self.groups.sync if g.group is not None]
            for g, flat in flats:
                dist.all_reduce(flat, group=g.group)  # one message, not one per tensor
            for g, flat in flats:
                self._spread(0, g, flat, grads)
            self.opt.step()
            return
        if self.mode == "zero12":
            for gi, g in enumerate(self.groups.sync):
                flat = self._flat(0, g, [p.grad for p in self.params])
                self.shards[(0, gi)].grad = self._reduce_scatter(flat, g).to(self.home)
        self.opt.step()
        if self.mode == "zero12":
            with torch.no_grad():
                tensors = [p.data for p in self.params]
                for gi, g in enumerate(self.groups.sync):
                    dev = self.params[0].device
                    self._spread(0, g, self._gathered(self.shards[(0, gi)], g, dev), tensors)

    # ----------------------------------------------------------------------------- state

    def state(self) -> tuple[list[dict[str, torch.Tensor]], int]:
        """Per parameter (this rank's TP slice): the parameter and Adam's moments; and Adam's
        step. Collective under ZeRO (the shards are gathered)."""
        if self.mode == "dense":
            st = [self.opt.state.get(p, {}) for p in self.params]
            step = int(st[0]["step"]) if st and "step" in st[0] else 0
            return [{"param": p.detach().clone(),
                     "exp_avg": s.get("exp_avg", torch.zeros_like(p)).clone(),
                     "exp_avg_sq": s.get("exp_avg_sq", torch.zeros_like(p)).clone()}
                    for p, s in zip(self.params, st, strict=True)], step
        dev = self.params[0].device
        out = [{k: torch.empty(shape, dtype=p.dtype, device=dev)
                for k in ("param", "exp_avg", "exp_avg_sq")}
               for p, shape in zip(self.params, self.shapes, strict=True)]
        step = 0
        for (u, gi), shard in self.shards.items():
            g = self.groups.sync[gi]
            st = self.opt.state.get(shard, {})
            step = int(st["step"]) if "step" in st else step
            for k in ("param", "exp_avg", "exp_avg_sq"):
                t = shard if k == "param" else st.get(k, torch.zeros_like(shard))
                self._spread(u, g, self._gathered(t, g, dev), [o[k] for o in out])
        return out, step

    def load(self, rows: list[dict[str, torch.Tensor]], step: int) -> None:
        """Take parameters and Adam state (``state``'s form) for every parameter."""
        st = torch.tensor(float(step))
        if self.mode == "dense":
            with torch.no_grad():
                for p, row in zip(self.params, rows, strict=True):
                    p.copy_(row["param"])
                    self.opt.state[p] = {"step": st.clone(), "exp_avg": row["exp_avg"].clone(),
                                         "exp_avg_sq": row["exp_avg_sq"].clone()}
            return
        for (u, gi), shard in self.shards.items():
            g = self.groups.sync[gi]
            mine = {k: self._mine(self._flat(u, g, [r[k] for r in rows]), g).to(self.home)
                    for k in ("param", "exp_avg", "exp_avg_sq")}
            with torch.no_grad():
                shard.copy_(mine["param"])
            self.opt.state[shard] = {"step": st.clone(), "exp_avg": mine["exp_avg"],
                                     "exp_avg_sq": mine["exp_avg_sq"]}
        if self.mode == "zero12":
            with torch.no_grad():
                for p, row in zip(self.params, rows, strict=True):
                    p.copy_(row["param"])
