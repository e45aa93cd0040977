"""A decoder-only transformer built layer by layer from an ``Arch`` (a catalog model or a
HuggingFace config: Llama, Qwen2, Mistral, GPT-NeoX, OPT, GPT-2), cut at any layer boundary,
with Megatron-style tensor parallelism (Shoeybi et al. 2019, §3): attention heads (and KV heads)
and the MLP's hidden units split across the TP group (column-parallel in, row-parallel out, one
all-reduce each), everything else replicated.

The layer list is that of the plans: ``[embedding, block_0, ..., block_{L-1}, head]``. A layer's
parameters come from a weight source: ``RandomInit`` draws every parameter in full from a
generator seeded by (seed, layer index) and then slices it, so any TP degree and any cut hold
exactly the weights of the one-process model with that seed; ``shoal.runtime.hf.weights`` reads
this rank's slices from safetensors files.

One block serves training and decoding: given a ``KVCache``, ``Block.forward`` runs new
positions against the cached keys and values of the earlier ones and extends the cache.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from shoal.runtime import rope as rotary
from shoal.runtime.arch import Arch, as_arch
from shoal.runtime.hf.weights import HFWeights
from shoal.runtime.params import TP_DIM, ParamDef, RandomInit, layer_params, shard, unshard
from shoal.specs.model import ModelSpec

__all__ = ["TP_DIM", "Block", "Embedding", "Head", "KVCache", "ParamDef", "Stage", "TPGroup", "RandomInit",
           "layer_params", "shard", "token_loss", "unshard"]

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


def _params(module: nn.Module, values: dict[str, torch.Tensor]) -> None:
    for name, t in values.items():
        module.register_parameter(name, nn.Parameter(t))


def norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, arch: Arch) -> torch.Tensor:
    """LayerNorm, or RMSNorm (computed in float32 at least, then cast back, as Llama's)."""
    if arch.norm == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, arch.norm_eps)
    xf = x if x.dtype == torch.float64 else x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + arch.norm_eps)
    return w * y.to(x.dtype)


def act(x: torch.Tensor, kind: str) -> torch.Tensor:
    if kind == "gelu":
        return F.gelu(x)
    if kind == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if kind == "relu":
        return F.relu(x)
    return F.silu(x)


class KVCache:
    """The keys and values of the positions a request has run through one block."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[2]


class Embedding(nn.Module):
    def __init__(self, arch: Arch, values: dict[str, torch.Tensor]):
        super().__init__()
        self.arch = arch
        _params(self, values)

    def forward(self, tokens: torch.Tensor, start: int = 0) -> torch.Tensor:
        """Token (and learned position) embeddings of ``tokens`` at positions from ``start``."""
        x = F.embedding(tokens, self.tok)
        if self.arch.position == "learned":
            at = self.arch.position_offset + start
            x = x + self.pos[at:at + tokens.shape[1]]
        return x


class Block(nn.Module):
    """Pre-norm block, x + attn(norm1(x)) then x + mlp(norm2(x)) (or both from x, GPT-NeoX's
    parallel residual); this rank's share of the heads and of the MLP's hidden units."""

    def __init__(self, arch: Arch, values: dict[str, torch.Tensor], tp: TPGroup):
        super().__init__()
        s = arch.spec
        self.arch, self.tp, self.dh = arch, tp, s.dhead
        self.nh_local, self.nkv_local = s.num_heads // tp.size, s.kv_heads // tp.size
        _params(self, values)

    def _attention(self, y: torch.Tensor, kv: KVCache | None) -> torch.Tensor:
        B, S, _ = y.shape
        a, dh = self.arch, self.dh
        q = F.linear(y, self.q, getattr(self, "q_b", None)).view(B, S, -1, dh).transpose(1, 2)
        k = F.linear(y, self.k, getattr(self, "k_b", None)).view(B, S, -1, dh).transpose(1, 2)
        v = F.linear(y, self.v, getattr(self, "v_b", None)).view(B, S, -1, dh).transpose(1, 2)
        start = kv.length if kv is not None else 0
        if a.rope is not None:
            cos, sin = rotary.cos_sin(a.rope, start, S, q.dtype, q.device)
            q, k = rotary.rotate(q, cos, sin), rotary.rotate(k, cos, sin)
        if kv is not None:
            if kv.k is not None:
                k, v = torch.cat([kv.k, k], dim=2), torch.cat([kv.v, v], dim=2)
            kv.k, kv.v = k, v
        T = k.shape[2]
        mask = None
        if a.sliding_window is not None and a.sliding_window < T or (start and S > 1):
            qpos = torch.arange(start, start + S, device=y.device)[:, None]
            kpos = torch.arange(T, device=y.device)[None, :]
            mask = kpos <= qpos
            if a.sliding_window is not None:
                mask &= kpos > qpos - a.sliding_window
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and S > 1,
            enable_gqa=self.nkv_local != self.nh_local)
        out = out.transpose(1, 2).reshape(B, S, self.nh_local * dh)
        o = _FromParallel.apply(F.linear(out, self.o), self.tp)
        return o + self.o_b if a.o_bias else o

    def _mlp(self, y: torch.Tensor) -> torch.Tensor:
        a = self.arch
        u = F.linear(y, self.up, getattr(self, "up_b", None))
        if a.gated:
            u = act(F.linear(y, self.gate, getattr(self, "gate_b", None)), a.act) * u
        else:
            u = act(u, a.act)
        o = _FromParallel.apply(F.linear(u, self.down), self.tp)
        return o + self.down_b if a.mlp_bias else o

    def forward(self, x: torch.Tensor, kv: KVCache | None = None) -> torch.Tensor:
        """The block on positions that follow those in ``kv`` (from 0 without a cache)."""
        a = self.arch
        y1 = _ToParallel.apply(norm(x, self.ln1_w, getattr(self, "ln1_b", None), a), self.tp)
        attn = self._attention(y1, kv)
        if a.parallel_residual:
            y2 = _ToParallel.apply(norm(x, self.ln2_w, getattr(self, "ln2_b", None), a), self.tp)
            return x + attn + self._mlp(y2)
        x = x + attn
        y2 = _ToParallel.apply(norm(x, self.ln2_w, getattr(self, "ln2_b", None), a), self.tp)
        return x + self._mlp(y2)


class Head(nn.Module):
    def __init__(self, arch: Arch, values: dict[str, torch.Tensor]):
        super().__init__()
        self.arch = arch
        _params(self, values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(norm(x, self.ln_w, getattr(self, "ln_b", None), self.arch), self.out)


def token_loss(logits: torch.Tensor, targets: torch.Tensor, n_tokens: float) -> torch.Tensor:
    """The microbatch's share of the iteration's mean next-token loss: summed over its tokens
    (in float64) and divided by the iteration's token count, so the shares of all microbatches,
    whoever computes them, add up to the global batch's mean loss."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1),
                           reduction="sum") / n_tokens


def default_weights(arch: Arch, seed: int = 0):
    """The model's own weights when it has a folder of them, else random ones from ``seed``."""
    if arch.weights_dir is not None:
        return HFWeights(arch)
    return RandomInit(seed)


def build_layer(arch: Arch, i: int, values: dict[str, torch.Tensor], tp: TPGroup) -> nn.Module:
    """Layer ``i`` of the layer list from its parameter values (this rank's TP slices)."""
    if i == 0:
        return Embedding(arch, values)
    if i == arch.n_layers - 1:
        return Head(arch, values)
    return Block(arch, values, tp)


class Stage(nn.Module):
    """Layers ``[a, b)`` of the layer list, on this rank's TP share (``layers``: the indices to
    build instead of a range, for a stage of several pieces)."""

    def __init__(self, model: ModelSpec | Arch, a: int, b: int, *, tp: TPGroup | None = None,
                 seed: int = 0, dtype=torch.float64, weights=None,
                 layers: list[int] | None = None):
        super().__init__()
        self.arch = arch = as_arch(model)
        tp = tp or TPGroup()
        n = arch.n_layers
        if not 0 <= a < b <= n:
            raise ValueError(f"layers [{a}, {b}) outside the model's {n}")
        self.a, self.b = a, b
        self.index = list(layers) if layers is not None else list(range(a, b))
        source = weights or default_weights(arch, seed)
        self.layers = nn.ModuleList(
            build_layer(arch, i, source.load(i, layer_params(arch, i), tp, dtype), tp)
            for i in self.index)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return run_layers(self.layers, x)


def run_layers(layers, x: torch.Tensor, recompute: bool = False) -> torch.Tensor:
    """Tokens (or hidden states) through ``layers`` in order; with ``recompute``, each block's
    activations are recomputed in the backward pass instead of kept."""
    for m in layers:
        if recompute and isinstance(m, Block) and torch.is_grad_enabled():
            x = checkpoint(m, x, use_reentrant=False)
        else:
            x = m(x)
    return x
