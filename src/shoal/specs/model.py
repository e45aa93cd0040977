"""Transformer architecture (the model part of a scenario)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from shoal.specs._types import STRICT, Flag, PositiveInt


class ModelSpec(BaseModel):
    """A decoder-only transformer: embedding, ``num_layers`` blocks, head.

    The model's *layer list* (what plans index with half-open ranges) is
    ``[embedding, block_0, ..., block_{L-1}, head]``: ``num_layers + 2`` entries.
    """

    model_config = STRICT

    name: str = Field(default="custom", description="label")
    num_layers: PositiveInt = Field(description="transformer blocks")
    hidden_size: PositiveInt = Field(description="model width")
    num_heads: PositiveInt = Field(description="attention heads")
    num_kv_heads: PositiveInt | None = Field(
        default=None, description="KV heads (grouped-query attention); must divide num_heads; "
                                  "default num_heads")
    ffn_hidden_size: PositiveInt | None = Field(
        default=None, description="MLP width; default 4 x hidden_size")
    vocab_size: PositiveInt = Field(description="vocabulary size")
    max_seq_len: PositiveInt = Field(
        default=2048, description="positions (learned position embeddings are sized by it)")
    mlp: Literal["gelu", "relu", "swiglu"] = Field(
        default="gelu", description="MLP kind (swiglu has three matrices)")
    norm: Literal["layernorm", "rmsnorm"] = Field(default="layernorm", description="norm kind")
    position: Literal["learned", "rotary", "alibi"] = Field(
        default="learned", description="position encoding")
    tied_embeddings: Flag = Field(
        default=False, description="input and output embeddings shared in the checkpoint; "
                                   "informational: the estimator and the runtime give the output "
                                   "projection its own weights, as pipeline runtimes do (and "
                                   "Sailor's measured runs did)")
    head_dim: PositiveInt | None = Field(
        default=None, description="per-head width; default hidden_size / num_heads")
    dropout: float = Field(
        default=0.0, ge=0, lt=1,
        description="dropout probability of the hidden states (and attention) in training: "
                    "masks kept for the backward pass and their kernels; most recent models "
                    "train without it")
    num_experts: PositiveInt | None = Field(
        default=None, description="mixture of experts: routed experts per MoE block (none: "
                                  "a dense model)")
    experts_per_token: PositiveInt = Field(
        default=2, description="mixture of experts: routed experts each token goes through")
    shared_experts: int = Field(
        default=0, ge=0, description="mixture of experts: experts every token goes through")
    moe_ffn_hidden_size: PositiveInt | None = Field(
        default=None, description="mixture of experts: one expert's MLP width; default "
                                  "ffn_hidden_size")
    dense_layers: int = Field(
        default=0, ge=0, description="mixture of experts: the first blocks that are dense")
    family: str | None = Field(default=None, description="label: the model family (e.g. opt)")
    source: str | None = Field(default=None, description="label: where the architecture comes from")

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        kv = self.kv_heads
        if self.num_heads % kv:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({kv})"
            )
        if self.num_experts is not None:
            if self.experts_per_token > self.num_experts:
                raise ValueError(f"experts_per_token ({self.experts_per_token}) must not exceed "
                                 f"num_experts ({self.num_experts})")
            if self.dense_layers > self.num_layers:
                raise ValueError(f"dense_layers ({self.dense_layers}) must not exceed "
                                 f"num_layers ({self.num_layers})")
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
    def moe(self) -> bool:
        """Whether some blocks are mixtures of experts."""
        return self.num_experts is not None and self.dense_layers < self.num_layers

    @property
    def expert_ffn(self) -> int:
        return self.moe_ffn_hidden_size or self.ffn

    def is_moe_block(self, i: int) -> bool:
        """Whether block ``i`` (0-based) is a mixture of experts."""
        return self.moe and i >= self.dense_layers

    @property
    def num_layer_slots(self) -> int:
        """Entries in the layer list: embedding + blocks + head."""
        return self.num_layers + 2
