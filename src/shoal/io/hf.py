"""Read a HuggingFace ``config.json`` into a ModelSpec."""

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


def model_from_hf_config(path: str | Path) -> ModelSpec:
    p = Path(path)
    cfg = read_json(p, "HuggingFace config")
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
    out["position"] = "rotary" if ("rope_theta" in cfg or "rotary" in json.dumps(cfg)) else "learned"
    out["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", mtype in ("opt", "gpt2", "gpt_neo")))
    out["family"] = mtype or None
    try:
        return ModelSpec(**out)
    except ValidationError as exc:
        raise SpecError(exc.errors()[0]["msg"], file=str(p)) from None
