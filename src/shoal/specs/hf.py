"""Read a HuggingFace ``config.json`` into a ModelSpec (what planning needs of the model; the
runtime reads the rest of the architecture from the same file, ``shoal.runtime.hf.config``)."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from shoal.errors import SpecError
from shoal.files import read_json
from shoal.specs.model import ModelSpec

_KEYS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "multi_query_group_num"),
    "ffn_hidden_size": ("intermediate_size", "ffn_dim", "n_inner"),
    "vocab_size": ("vocab_size", "padded_vocab_size"),
    "max_seq_len": ("max_position_embeddings", "n_positions", "max_sequence_length"),
    "head_dim": ("head_dim",),
}


# families that rotate queries and keys (RoPE), whatever keys their configs write
ROTARY_FAMILIES = ("llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                   "gemma", "gemma2", "gemma3", "gpt_neox", "phi3", "deepseek_v2", "deepseek_v3",
                   "olmo", "olmo2", "olmoe", "falcon", "starcoder2", "internlm2", "cohere")


def _position(cfg: dict, mtype: str) -> str:
    """rotary (RoPE, by family or by a rope/rotary key at any depth: current transformers
    write ``rope_parameters``, older ones a top-level ``rope_theta``), alibi, or learned."""
    text = json.dumps(cfg).lower()
    if cfg.get("alibi") or "alibi" in text and mtype in ("mpt", "bloom", "falcon"):
        return "alibi"
    if mtype in ROTARY_FAMILIES or "rope" in text or "rotary" in text:
        return "rotary"
    return "learned"


def _dropout(cfg: dict) -> float:
    """The largest training dropout the config sets on hidden states or attention."""
    keys = ("dropout", "hidden_dropout", "hidden_dropout_prob", "resid_pdrop", "resid_dropout",
            "attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "embd_pdrop")
    vals = [cfg[k] for k in keys if isinstance(cfg.get(k), int | float)]
    return float(max(vals, default=0.0))


def _experts(cfg: dict, p: Path) -> dict:
    """Mixture-of-experts fields (Mixtral, Qwen-MoE, DeepSeek, OLMoE configs), or none."""
    n = cfg.get("num_local_experts") or cfg.get("n_routed_experts") or cfg.get("num_experts")
    if not n:
        return {}
    out = {"num_experts": int(n),
           "experts_per_token": int(cfg.get("num_experts_per_tok") or cfg.get("top_k") or 2)}
    width = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    if width:
        out["moe_ffn_hidden_size"] = int(width)
    shared = cfg.get("n_shared_experts")
    if shared is None and cfg.get("shared_expert_intermediate_size") and width:
        # one shared expert of that width counts as that many experts of the routed width
        shared = -(-int(cfg["shared_expert_intermediate_size"]) // int(width))
    if shared:
        out["shared_experts"] = int(shared)
    dense = cfg.get("first_k_dense_replace")
    if dense:
        out["dense_layers"] = int(dense)
    return out


def model_from_hf_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of a HuggingFace ``config.json`` (a SpecError naming the file and field
    when it lacks what a transformer needs)."""
    p = Path(path)
    return spec_from_hf_dict(read_json(p, "HuggingFace config"), p)


def spec_from_hf_dict(cfg: dict, p: Path) -> ModelSpec:
    """The ModelSpec of a config already read from ``p``."""
    out: dict = {"name": cfg.get("_name_or_path") or p.parent.name or "hf-model",
                 "source": f"HuggingFace config {p}"}
    for field, keys in _KEYS.items():
        for k in keys:
            if cfg.get(k) is not None:
                try:
                    out[field] = int(cfg[k])
                except (TypeError, ValueError):
                    raise SpecError("expected an integer", file=str(p), field=k,
                                    value=cfg[k]) from None
                break
    for req in ("num_layers", "hidden_size", "num_heads", "vocab_size"):
        if req not in out:
            raise SpecError("missing field", file=str(p), field=_KEYS[req][0],
                            allowed=" or ".join(_KEYS[req]))
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "gelu").lower()
    mtype = str(cfg.get("model_type", "")).lower()
    out["mlp"] = "swiglu" if act in ("silu", "swiglu") else ("relu" if act == "relu" else "gelu")
    out["norm"] = "rmsnorm" if "rms_norm_eps" in cfg else "layernorm"
    out["position"] = _position(cfg, mtype)
    out["dropout"] = _dropout(cfg)
    out.update(_experts(cfg, p))
    out["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", mtype in ("opt", "gpt2", "gpt_neo")))
    out["family"] = mtype or None
    try:
        return ModelSpec(**out)
    except ValidationError as exc:
        raise SpecError(exc.errors()[0]["msg"], file=str(p)) from None
