"""A model's parameters as the runtime names them, layer by layer, and how they split across TP
ranks: one list per layer kind, the same for every architecture (a block has ``q``, ``k``, ``v``,
``o``, ``up``, ``down`` and, as its architecture says, ``gate``, biases and norm parameters),
so checkpoints, TP resharding and the HuggingFace conversion speak one naming.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from shoal.runtime.arch import Arch

# the dimension a block parameter is split along across TP ranks (absent: replicated)
TP_DIM = {"q": 0, "k": 0, "v": 0, "q_b": 0, "k_b": 0, "v_b": 0, "o": 1,
          "up": 0, "up_b": 0, "gate": 0, "gate_b": 0, "down": 1}


@dataclass(frozen=True)
class ParamDef:
    """One parameter of a layer: its name, full shape, and how it starts (a standard deviation
    for a normal draw, or ``"ones"`` / ``"zeros"``)."""

    name: str
    shape: tuple[int, ...]
    init: float | str

    @property
    def tp_dim(self) -> int | None:
        return TP_DIM.get(self.name)


def layer_params(arch: Arch, i: int) -> list[ParamDef]:
    """The parameters of layer ``i`` of the layer list, in the order they are drawn."""
    s = arch.spec
    h, f, dh = s.hidden_size, s.ffn, s.dhead
    if i == 0:
        out = [ParamDef("tok", (s.vocab_size, h), 0.02)]
        if arch.position == "learned":
            out.append(ParamDef("pos", (s.max_seq_len + arch.position_offset, h), 0.02))
        return out
    norm = [ParamDef("ln_w", (h,), "ones")] + (
        [ParamDef("ln_b", (h,), "zeros")] if arch.norm == "layernorm" else [])
    if i == arch.n_layers - 1:
        return [*norm, ParamDef("out", (s.vocab_size, h), 0.02)]
    out_std = 0.02 / (2 * s.num_layers) ** 0.5
    qo, kv = s.num_heads * dh, s.kv_heads * dh
    out = [ParamDef("ln1" + p.name[2:], p.shape, p.init) for p in norm]
    out += [ParamDef("q", (qo, h), 0.02), ParamDef("k", (kv, h), 0.02), ParamDef("v", (kv, h), 0.02)]
    if arch.qkv_bias:
        out += [ParamDef("q_b", (qo,), "zeros"), ParamDef("k_b", (kv,), "zeros"),
                ParamDef("v_b", (kv,), "zeros")]
    out.append(ParamDef("o", (h, qo), out_std))
    if arch.o_bias:
        out.append(ParamDef("o_b", (h,), "zeros"))
    out += [ParamDef("ln2" + p.name[2:], p.shape, p.init) for p in norm]
    mlp = (["gate"] if arch.gated else []) + ["up"]
    out += [ParamDef(n, (f, h), 0.02) for n in mlp]
    if arch.mlp_bias:
        out += [ParamDef(n + "_b", (f,), "zeros") for n in mlp]
    out.append(ParamDef("down", (h, f), out_std))
    if arch.mlp_bias:
        out.append(ParamDef("down_b", (h,), "zeros"))
    return out


def shard(name: str, full: torch.Tensor, size: int, rank: int) -> torch.Tensor:
    """TP rank ``rank``'s slice of a full tensor (the inverse of ``unshard``)."""
    dim = TP_DIM.get(name)
    if dim is None or size == 1:
        return full.clone()
    return full.chunk(size, dim=dim)[rank].clone()


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full tensor from its TP shards (in TP rank order)."""
    dim = TP_DIM.get(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    return torch.cat(shards, dim=dim)


class RandomInit:
    """Weights drawn from a generator seeded by (seed, layer index), in full, then sliced."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def load(self, i: int, defs: list[ParamDef], tp, dtype) -> dict[str, torch.Tensor]:
        gen = torch.Generator().manual_seed(self.seed * 100003 + i)
        out = {}
        for p in defs:
            if p.init == "ones":
                full = torch.ones(p.shape, dtype=dtype)
            elif p.init == "zeros":
                full = torch.zeros(p.shape, dtype=dtype)
            else:
                full = (torch.randn(*p.shape, generator=gen, dtype=torch.float64) * p.init).to(dtype)
            out[p.name] = shard(p.name, full, tp.size, tp.rank)
        return out


