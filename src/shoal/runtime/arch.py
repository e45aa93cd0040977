"""What the runtime needs to know of a model beyond its planning shape (``ModelSpec``): the norm
and its epsilon, the activation, which projections carry biases, the position encoding (learned
positions, or RoPE with its scaling), residual wiring, the attention window, and where the
weights come from.

A catalog model becomes a GPT-style decoder (``Arch.from_spec``: LayerNorm, GELU, biases,
learned positions) or, for a Llama-shaped spec (RMSNorm, SwiGLU, rotary), a Llama-style one
without biases; a HuggingFace ``config.json`` gives its family's exact architecture
(``shoal.runtime.hf.config``). Mixture-of-experts models are refused: the runtime runs dense
blocks only, and running such a model as dense would train another model.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shoal.errors import SpecError
from shoal.specs.model import ModelSpec

FAMILIES = ("gpt", "llama", "qwen2", "mistral", "gpt_neox", "opt", "gpt2")


class Rope(BaseModel):
    """Rotary position embedding: the base, how many of a head's dimensions rotate, and the
    scaling of long contexts (HuggingFace's ``rope_type`` and its parameters)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    theta: float = 10000.0
    rotary_dim: int
    scaling: Literal["default", "linear", "dynamic", "llama3", "yarn"] = "default"
    factor: float = 1.0
    original_max_positions: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: cos and sin scaled by it
    truncate: bool = True  # yarn: correction range rounded outwards


class Arch(BaseModel):
    """A decoder-only transformer as the runtime builds it."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    spec: ModelSpec
    family: str = "gpt"
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    act: Literal["gelu", "gelu_tanh", "relu", "silu"] = "gelu"
    gated: bool = False  # SwiGLU-style: act(gate(x)) * up(x)
    qkv_bias: bool = True
    o_bias: bool = True
    mlp_bias: bool = True
    position: Literal["learned", "rotary"] = "learned"
    position_offset: int = 0  # OPT's learned positions start at row 2
    rope: Rope | None = None
    parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
    sliding_window: int | None = None
    tied_embeddings: bool = False  # in the file: the head is read from the embedding
    weights_dir: str | None = Field(default=None, description="HuggingFace folder of the weights")
    hf_config: dict | None = Field(default=None, description="the config.json it was read from")

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> Arch:
        """The architecture the runtime gives a catalog model (random weights)."""
        check_runnable(spec)
        if spec.mlp == "swiglu" or spec.norm == "rmsnorm" or spec.position == "rotary":
            return cls(spec=spec, family="llama", norm=spec.norm, act="silu" if spec.mlp == "swiglu"
                       else spec.mlp, gated=spec.mlp == "swiglu", qkv_bias=False, o_bias=False,
                       mlp_bias=False, position="rotary" if spec.position == "rotary" else "learned",
                       rope=Rope(rotary_dim=spec.dhead) if spec.position == "rotary" else None)
        return cls(spec=spec, act="relu" if spec.mlp == "relu" else "gelu")

    @property
    def n_layers(self) -> int:
        """Entries of the layer list: embedding, blocks, head."""
        return self.spec.num_layers + 2


def check_runnable(spec: ModelSpec, file: str | None = None) -> None:
    """A SpecError for a model the runtime cannot run as it is."""
    if spec.moe:
        raise SpecError(f"a mixture-of-experts model ({spec.num_experts} experts): the runtime "
                        "runs dense blocks only, and running it as dense would train another "
                        "model", file=file, field="num_experts", value=spec.num_experts,
                        allowed="a dense model (the estimator and planners cost MoE models)")
    if spec.position == "alibi":
        raise SpecError("ALiBi positions are not in the runtime", file=file, field="position",
                        value=spec.position, allowed="learned or rotary")


def as_arch(model: ModelSpec | Arch) -> Arch:
    """``model`` as an Arch (a ModelSpec gets the catalog's architecture)."""
    return model if isinstance(model, Arch) else Arch.from_spec(model)
