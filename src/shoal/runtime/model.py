"""A decoder-only transformer built layer by layer from a model spec, cut at any layer boundary,
with Megatron-style tensor parallelism (Shoeybi et al. 2019, §3): attention heads and the MLP's
hidden units split across the TP group (column-parallel in, row-parallel out, one all-reduce
each), everything else replicated.

The layer list is that of the plans: ``[embedding, block_0, ..., block_{L-1}, head]``. Every
parameter is initialised in full from a generator seeded by (seed, layer index) and then sliced,
so any TP degree and any cut hold exactly the weights of the one-process model with that seed.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from shoal.specs.model import ModelSpec


class TPGroup:
    """This rank's tensor-parallel group: its size, its index in it, and the process group."""

    def __init__(self, size: int = 1, rank: int = 0, group=None):
        self.size, self.rank, self.group = size, rank, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            dist.all_reduce(x, group=self.group)
        return x


class _ToParallel(torch.autograd.Function):
    """Enter a column-parallel region: identity forward, sum of the input grads backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, g):
        return ctx.tp.all_reduce(g.contiguous()), None


class _FromParallel(torch.autograd.Function):
    """Leave a row-parallel region: sum of the partial outputs forward, identity backward."""

    @staticmethod
    def forward(ctx, x, tp):
        return tp.all_reduce(x.contiguous())

    @staticmethod
    def backward(ctx, g):
        return g, None


def _init(shape, gen: torch.Generator, std: float, dtype) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * std).to(dtype)


class Embedding(nn.Module):
    def __init__(self, spec: ModelSpec, gen, dtype):
        super().__init__()
        self.tok = nn.Parameter(_init((spec.vocab_size, spec.hidden_size), gen, 0.02, dtype))
        self.pos = nn.Parameter(_init((spec.max_seq_len, spec.hidden_size), gen, 0.02, dtype))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok[tokens] + self.pos[: tokens.shape[1]]


class Block(nn.Module):
    """Pre-norm block: x + attn(ln1(x)), then x + mlp(ln2(x)); this rank's share of the heads
    and of the MLP's hidden units."""

    def __init__(self, spec: ModelSpec, gen, dtype, tp: TPGroup, n_layers: int):
        super().__init__()
        h, nh, f = spec.hidden_size, spec.num_heads, spec.ffn
        if nh % tp.size or f % tp.size:
            raise ValueError(f"TP {tp.size} does not divide {nh} heads and {f} MLP units")
        self.tp, self.nh_local, self.dh = tp, nh // tp.size, h // nh
        std, out_std = 0.02, 0.02 / math.sqrt(2 * n_layers)
        full_qkv = _init((3, nh, self.dh, h), gen, std, dtype)  # q, k, v; per head
        full_o = _init((h, nh, self.dh), gen, out_std, dtype)
        full_fc1 = _init((f, h), gen, std, dtype)
        full_fc2 = _init((h, f), gen, out_std, dtype)
        heads = slice(tp.rank * self.nh_local, (tp.rank + 1) * self.nh_local)
        units = slice(tp.rank * (f // tp.size), (tp.rank + 1) * (f // tp.size))
        self.ln1_w = nn.Parameter(torch.ones(h, dtype=dtype))
        self.ln1_b = nn.Parameter(torch.zeros(h, dtype=dtype))
        self.qkv = nn.Parameter(full_qkv[:, heads].reshape(3 * self.nh_local * self.dh, h).clone())
        self.qkv_b = nn.Parameter(torch.zeros(3 * self.nh_local * self.dh, dtype=dtype))
        self.o = nn.Parameter(full_o[:, heads].reshape(h, self.nh_local * self.dh).clone())
        self.o_b = nn.Parameter(torch.zeros(h, dtype=dtype))
        self.ln2_w = nn.Parameter(torch.ones(h, dtype=dtype))
        self.ln2_b = nn.Parameter(torch.zeros(h, dtype=dtype))
        self.fc1 = nn.Parameter(full_fc1[units].clone())
        self.fc1_b = nn.Parameter(torch.zeros(f // tp.size, dtype=dtype))
        self.fc2 = nn.Parameter(full_fc2[:, units].clone())
        self.fc2_b = nn.Parameter(torch.zeros(h, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, h = x.shape
        y = _ToParallel.apply(F.layer_norm(x, (h,), self.ln1_w, self.ln1_b), self.tp)
        qkv = F.linear(y, self.qkv, self.qkv_b).view(B, S, 3, self.nh_local, self.dh)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.dh)
        mask = torch.ones(S, S, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        a = (att @ v).transpose(1, 2).reshape(B, S, self.nh_local * self.dh)
        x = x + _FromParallel.apply(F.linear(a, self.o), self.tp) + self.o_b
        y = _ToParallel.apply(F.layer_norm(x, (h,), self.ln2_w, self.ln2_b), self.tp)
        m = F.gelu(F.linear(y, self.fc1, self.fc1_b))
        return x + _FromParallel.apply(F.linear(m, self.fc2), self.tp) + self.fc2_b


class Head(nn.Module):
    def __init__(self, spec: ModelSpec, gen, dtype):
        super().__init__()
        h = spec.hidden_size
        self.ln_w = nn.Parameter(torch.ones(h, dtype=dtype))
        self.ln_b = nn.Parameter(torch.zeros(h, dtype=dtype))
        self.out = nn.Parameter(_init((spec.vocab_size, h), gen, 0.02, dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.layer_norm(x, (x.shape[-1],), self.ln_w, self.ln_b), self.out)


def token_loss(logits: torch.Tensor, targets: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """The microbatch's share of the iteration's mean next-token loss: summed over its tokens
    (in float64) and divided by the iteration's token count, so the shares of all microbatches,
    whoever computes them, add up to the global batch's mean loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1),
                           reduction="sum") / n_tokens


class Stage(nn.Module):
    """Layers ``[a, b)`` of the layer list, on this rank's TP share."""

    def __init__(self, spec: ModelSpec, a: int, b: int, *, tp: TPGroup | None = None,
                 seed: int = 0, dtype=torch.float64, recompute: bool = False):
        super().__init__()
        tp = tp or TPGroup()
        n = spec.num_layers + 2
        if not 0 <= a < b <= n:
            raise ValueError(f"layers [{a}, {b}) outside the model's {n}")
        self.a, self.b, self.recompute = a, b, recompute
        mods = []
        for i in range(a, b):
            gen = torch.Generator().manual_seed(seed * 100003 + i)
            if i == 0:
                mods.append(Embedding(spec, gen, dtype))
            elif i == n - 1:
                mods.append(Head(spec, gen, dtype))
            else:
                mods.append(Block(spec, gen, dtype, tp, spec.num_layers))
        self.layers = nn.ModuleList(mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for m in self.layers:
            if self.recompute and isinstance(m, Block) and torch.is_grad_enabled():
                x = checkpoint(m, x, use_reentrant=False)
            else:
                x = m(x)
        return x


def tp_layout(name: str, param: torch.Tensor) -> tuple[int | None, str]:
    """How a block parameter is split across TP ranks: (dimension, how) — ``"heads"`` for the
    QKV rows (split per q/k/v), ``"cat"`` for a plain split, None when replicated."""
    last = name.rsplit(".", 1)[-1]
    if last in ("qkv", "qkv_b"):
        return 0, "heads"
    if last in ("fc1", "fc1_b"):
        return 0, "cat"
    if last in ("o", "fc2"):
        return 1, "cat"
    return None, "replicated"


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from its TP shards (in TP rank order)."""
    dim, how = tp_layout(name, shards[0])
    if dim is None or len(shards) == 1:
        return shards[0]
    if how == "heads":
        parts = [s.view(3, -1, *s.shape[1:]) for s in shards]
        return torch.cat(parts, dim=1).reshape(-1, *shards[0].shape[1:])
    return torch.cat(shards, dim=dim)


def shard(name: str, full: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    """TP rank ``rank``'s slice of a full tensor (the inverse of ``unshard``)."""
    dim, how = tp_layout(name, full)
    if dim is None or size == 1:
        return full.clone()
    if how == "heads":
        parts = full.view(3, -1, *full.shape[1:]).chunk(size, dim=1)[rank]
        return parts.reshape(-1, *full.shape[1:]).clone()
    return full.chunk(size, dim=dim)[rank].clone()
