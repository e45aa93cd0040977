"""A HuggingFace model as the runtime builds it: ``config.json`` (as current and older
``transformers`` versions write it) read into an ``Arch``, for the Llama family, Qwen2, Mistral,
GPT-NeoX, OPT and GPT-2.

Older configs give RoPE as a top-level ``rope_theta`` and a ``rope_scaling`` dict (``type`` or
``rope_type``), GPT-NeoX as ``rotary_pct`` and ``rotary_emb_base``; current ones write
``rope_parameters`` (with ``partial_rotary_factor``). Both are read.
"""

from __future__ import annotations

from pathlib import Path

from shoal.errors import SpecError
from shoal.files import read_json
from shoal.runtime.arch import Arch, Rope, check_runnable
from shoal.specs.hf import spec_from_hf_dict

LLAMA_LIKE = ("llama", "qwen2", "mistral")
FAMILIES = (*LLAMA_LIKE, "gpt_neox", "opt", "gpt2")
_ACTS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
         "gelu_fast": "gelu_tanh", "relu": "relu", "silu": "silu", "swish": "silu"}
_SCALINGS = ("default", "linear", "dynamic", "llama3", "yarn")


def model_folder(path: str | Path) -> tuple[Path, Path | None]:
    """(its ``config.json``, the folder of its weights or None) for ``--model`` given as a
    ``config.json`` or a folder holding one (and, usually, ``*.safetensors``)."""
    p = Path(path)
    if p.is_dir():
        cfg = p / "config.json"
        if not cfg.is_file():
            raise SpecError("a model folder needs its config.json", file=str(p), field="--model")
        weights = sorted(p.glob("*.safetensors"))
        if not weights and sorted(p.glob("*.bin")):
            raise SpecError("weights in PyTorch pickles (*.bin) are not read: they can run code",
                            file=str(p), field="--model",
                            allowed="a folder with *.safetensors (transformers' save_pretrained "
                                    "writes them)")
        return cfg, p if weights else None
    return p, None


def arch_from_hf(path: str | Path) -> Arch:
    """The Arch of a HuggingFace ``config.json`` or model folder."""
    cfg_path, weights = model_folder(path)
    cfg = read_json(cfg_path, "HuggingFace config")
    return arch_from_config(cfg, cfg_path, weights)


def arch_from_config(cfg: dict, cfg_path: Path, weights: Path | None = None) -> Arch:
    """The Arch of a config already read from ``cfg_path``."""
    file = str(cfg_path)
    mtype = str(cfg.get("model_type", "")).lower()
    if mtype not in FAMILIES:
        raise SpecError("the runtime has no blocks of this model family", file=file,
                        field="model_type", value=mtype or None, allowed=", ".join(FAMILIES))
    spec = spec_from_hf_dict(cfg, cfg_path)
    check_runnable(spec, file)
    common = {"spec": spec, "family": mtype, "tied_embeddings": bool(spec.tied_embeddings),
              "weights_dir": str(weights.resolve()) if weights else None, "hf_config": cfg}
    if mtype in LLAMA_LIKE:
        return Arch(**common, **_llama(cfg, file, spec))
    if mtype == "gpt_neox":
        return Arch(**common, **_neox(cfg, file, spec))
    if mtype == "opt":
        return Arch(**common, **_opt(cfg, file))
    return Arch(**common, **_gpt2(cfg, file))


def _act(cfg: dict, file: str, key: str, default: str) -> str:
    name = str(cfg.get(key) or default)
    if name not in _ACTS:
        raise SpecError("an activation the runtime does not have", file=file, field=key,
                        value=name, allowed=", ".join(_ACTS))
    return _ACTS[name]


def _rope(cfg: dict, file: str, spec, fraction: float = 1.0, theta: float = 10000.0) -> Rope:
    """RoPE from ``rope_parameters`` (current transformers) or ``rope_theta`` and
    ``rope_scaling`` (older ones)."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = dict(cfg.get("rope_scaling") or {})
    merged = {**scaling, **params}
    theta = float(merged.get("rope_theta", cfg.get("rope_theta", theta)))
    fraction = float(merged.get("partial_rotary_factor", cfg.get("partial_rotary_factor", fraction)))
    kind = str(merged.get("rope_type") or merged.get("type") or "default")
    if kind not in _SCALINGS:
        raise SpecError("a RoPE scaling the runtime does not have", file=file,
                        field="rope_parameters.rope_type", value=kind, allowed=", ".join(_SCALINGS))
    dim = int(spec.dhead * fraction)
    orig = merged.get("original_max_position_embeddings")
    if kind in ("dynamic", "yarn") and orig is None:
        orig = cfg.get("max_position_embeddings")
    extra = {k: float(merged[k]) for k in ("low_freq_factor", "high_freq_factor", "beta_fast",
                                           "beta_slow", "attention_factor")
             if merged.get(k) is not None}
    if kind == "yarn" and merged.get("factor") is None and orig:
        merged["factor"] = spec.max_seq_len / float(orig)
    return Rope(theta=theta, rotary_dim=dim, scaling=kind, factor=float(merged.get("factor", 1.0)),
                original_max_positions=int(orig) if orig else None,
                truncate=bool(merged.get("truncate", True)), **extra)


def _llama(cfg: dict, file: str, spec) -> dict:
    family = str(cfg.get("model_type"))
    bias = bool(cfg.get("attention_bias", family == "qwen2"))
    window = None
    if family == "mistral" or cfg.get("use_sliding_window"):
        window = cfg.get("sliding_window")
    if family == "qwen2" and cfg.get("use_sliding_window") and cfg.get("max_window_layers", 0) \
            < spec.num_layers:
        raise SpecError("Qwen2's sliding window on some layers only is not in the runtime",
                        file=file, field="use_sliding_window", value=True, allowed="false")
    return {"norm": "rmsnorm", "norm_eps": float(cfg.get("rms_norm_eps", 1e-6)),
            "act": _act(cfg, file, "hidden_act", "silu"), "gated": True, "qkv_bias": bias,
            "o_bias": family != "qwen2" and bias, "mlp_bias": bool(cfg.get("mlp_bias", False)),
            "position": "rotary", "rope": _rope(cfg, file, spec),
            "sliding_window": int(window) if window else None}


def _neox(cfg: dict, file: str, spec) -> dict:
    bias = bool(cfg.get("attention_bias", True))
    return {"norm": "layernorm", "norm_eps": float(cfg.get("layer_norm_eps", 1e-5)),
            "act": _act(cfg, file, "hidden_act", "gelu"), "qkv_bias": bias, "o_bias": bias,
            "mlp_bias": True, "position": "rotary",
            "rope": _rope(cfg, file, spec, fraction=float(cfg.get("rotary_pct", 0.25)),
                          theta=float(cfg.get("rotary_emb_base", 10000.0))),
            "parallel_residual": bool(cfg.get("use_parallel_residual", True))}


def _opt(cfg: dict, file: str) -> dict:
    if not cfg.get("do_layer_norm_before", True) or cfg.get("_remove_final_layer_norm"):
        raise SpecError("OPT with its norms after the blocks (OPT-350m) is not in the runtime",
                        file=file, field="do_layer_norm_before", value=False, allowed="true")
    proj = cfg.get("word_embed_proj_dim")
    if proj is not None and int(proj) != int(cfg.get("hidden_size", proj)):
        raise SpecError("OPT's embedding projection (word_embed_proj_dim other than the hidden "
                        "size) is not in the runtime", file=file, field="word_embed_proj_dim",
                        value=proj, allowed=f"{cfg.get('hidden_size')}")
    if not cfg.get("layer_norm_elementwise_affine", True):
        raise SpecError("norms without weights are not in the runtime", file=file,
                        field="layer_norm_elementwise_affine", value=False, allowed="true")
    bias = bool(cfg.get("enable_bias", True))
    return {"norm": "layernorm", "norm_eps": 1e-5, "act": _act(cfg, file, "activation_function",
                                                                "relu"),
            "qkv_bias": bias, "o_bias": bias, "mlp_bias": bias, "position": "learned",
            "position_offset": 2}


def _gpt2(cfg: dict, file: str) -> dict:
    for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if cfg.get(key):
            raise SpecError("this GPT-2 attention variant is not in the runtime", file=file,
                            field=key, value=True, allowed="false")
    if cfg.get("scale_attn_weights") is False:
        raise SpecError("GPT-2 attention without scaling is not in the runtime", file=file,
                        field="scale_attn_weights", value=False, allowed="true")
    return {"norm": "layernorm", "norm_eps": float(cfg.get("layer_norm_epsilon", 1e-5)),
            "act": _act(cfg, file, "activation_function", "gelu_new"), "position": "learned"}
