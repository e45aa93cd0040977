"""Transformer architecture (the model part of a scenario)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, model_validator

from shoal.specs._types import STRICT, PositiveInt


class ModelSpec(BaseModel):
    """A decoder-only transformer: embedding, ``num_layers`` blocks, head.

    The model's *layer list* (what plans index with half-open ranges) is
    ``[embedding, block_0, ..., block_{L-1}, head]``: ``num_layers + 2`` entries.
    """

    model_config = STRICT

    name: str = "custom"
    num_layers: PositiveInt
    hidden_size: PositiveInt
    num_heads: PositiveInt
    num_kv_heads: PositiveInt | None = None
    ffn_hidden_size: PositiveInt | None = None
    vocab_size: PositiveInt
    max_seq_len: PositiveInt = 2048
    mlp: Literal["gelu", "relu", "swiglu"] = "gelu"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    position: Literal["learned", "rotary", "alibi"] = "learned"
    tied_embeddings: bool = False
    head_dim: PositiveInt | None = None
    family: str | None = None
    source: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({kv})"
            )
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by num_heads "
                f"({self.num_heads}) unless head_dim is given"
            )
        return self

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def ffn(self) -> int:
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def dhead(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def num_layer_slots(self) -> int:
        """Entries in the layer list: embedding + blocks + head."""
        return self.num_layers + 2
