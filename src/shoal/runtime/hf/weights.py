"""HuggingFace weights in and out: each worker reads only its own layers' tensors, and of those
only its TP slices, from the safetensors files (one file, or shards with
``model.safetensors.index.json``), by memory map; ``save_hf`` writes a folder ``transformers``
loads.

Names map per family between the files and the runtime's (``shoal.runtime.params``): GPT-NeoX's
fused ``query_key_value`` holds each head's q, k and v rows in turn; GPT-2's ``Conv1D`` weights
are stored transposed ([in, out]) with q, k and v side by side in ``c_attn``. A tied model's
file has no output projection: the head reads the embedding (and trains it as its own copy,
``ModelSpec.tied_embeddings``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from shoal.errors import SpecError
from shoal.runtime.arch import Arch
from shoal.runtime.params import ParamDef

_LLAMA_BLOCK = {"ln1_w": "input_layernorm.weight", "ln2_w": "post_attention_layernorm.weight",
                "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
                "v": "self_attn.v_proj.weight", "o": "self_attn.o_proj.weight",
                "q_b": "self_attn.q_proj.bias", "k_b": "self_attn.k_proj.bias",
                "v_b": "self_attn.v_proj.bias", "o_b": "self_attn.o_proj.bias",
                "gate": "mlp.gate_proj.weight", "up": "mlp.up_proj.weight",
                "down": "mlp.down_proj.weight", "gate_b": "mlp.gate_proj.bias",
                "up_b": "mlp.up_proj.bias", "down_b": "mlp.down_proj.bias"}
_NEOX_BLOCK = {"ln1_w": "input_layernorm.weight", "ln1_b": "input_layernorm.bias",
               "ln2_w": "post_attention_layernorm.weight", "ln2_b": "post_attention_layernorm.bias",
               "o": "attention.dense.weight", "o_b": "attention.dense.bias",
               "up": "mlp.dense_h_to_4h.weight", "up_b": "mlp.dense_h_to_4h.bias",
               "down": "mlp.dense_4h_to_h.weight", "down_b": "mlp.dense_4h_to_h.bias"}
_OPT_BLOCK = {"ln1_w": "self_attn_layer_norm.weight", "ln1_b": "self_attn_layer_norm.bias",
              "ln2_w": "final_layer_norm.weight", "ln2_b": "final_layer_norm.bias",
              "q": "self_attn.q_proj.weight", "k": "self_attn.k_proj.weight",
              "v": "self_attn.v_proj.weight", "o": "self_attn.out_proj.weight",
              "q_b": "self_attn.q_proj.bias", "k_b": "self_attn.k_proj.bias",
              "v_b": "self_attn.v_proj.bias", "o_b": "self_attn.out_proj.bias",
              "up": "fc1.weight", "up_b": "fc1.bias", "down": "fc2.weight", "down_b": "fc2.bias"}
# GPT-2: (file name, transposed); q, k and v are column blocks of c_attn
_GPT2_BLOCK = {"ln1_w": "ln_1.weight", "ln1_b": "ln_1.bias", "ln2_w": "ln_2.weight",
               "ln2_b": "ln_2.bias", "o": "attn.c_proj.weight", "o_b": "attn.c_proj.bias",
               "up": "mlp.c_fc.weight", "up_b": "mlp.c_fc.bias", "down": "mlp.c_proj.weight",
               "down_b": "mlp.c_proj.bias"}


def layer_names(arch: Arch, i: int) -> dict[str, str]:
    """Runtime name -> file name of layer ``i``'s plain tensors (NeoX's and GPT-2's fused
    q, k, v excepted), for the family's current layout."""
    f, last = arch.family, arch.n_layers - 1
    b = i - 1
    if f in ("llama", "qwen2", "mistral"):
        if i == 0:
            return {"tok": "model.embed_tokens.weight"}
        if i == last:
            return {"ln_w": "model.norm.weight", "out": "lm_head.weight"}
        return {k: f"model.layers.{b}.{v}" for k, v in _LLAMA_BLOCK.items()}
    if f == "gpt_neox":
        if i == 0:
            return {"tok": "gpt_neox.embed_in.weight"}
        if i == last:
            return {"ln_w": "gpt_neox.final_layer_norm.weight",
                    "ln_b": "gpt_neox.final_layer_norm.bias", "out": "embed_out.weight"}
        return {k: f"gpt_neox.layers.{b}.{v}" for k, v in _NEOX_BLOCK.items()}
    if f == "opt":
        if i == 0:
            return {"tok": "model.decoder.embed_tokens.weight",
                    "pos": "model.decoder.embed_positions.weight"}
        if i == last:
            return {"ln_w": "model.decoder.final_layer_norm.weight",
                    "ln_b": "model.decoder.final_layer_norm.bias", "out": "lm_head.weight"}
        return {k: f"model.decoder.layers.{b}.{v}" for k, v in _OPT_BLOCK.items()}
    if i == 0:
        return {"tok": "transformer.wte.weight", "pos": "transformer.wpe.weight"}
    if i == last:
        return {"ln_w": "transformer.ln_f.weight", "ln_b": "transformer.ln_f.bias",
                "out": "lm_head.weight"}
    return {k: f"transformer.h.{b}.{v}" for k, v in _GPT2_BLOCK.items()}


def _aliases(name: str) -> list[str]:
    """A tensor's name as other writers spell it: without the model's prefix (GPT-2's first
    checkpoints), NeoX's head as ``embed_out`` or ``lm_head``."""
    out = [name]
    for prefix in ("transformer.", "model.", "gpt_neox."):
        if name.startswith(prefix):
            out.append(name[len(prefix):])
    if name == "embed_out.weight":
        out.append("lm_head.weight")
    return out


class Files:
    """The safetensors files of a folder, opened by memory map, and which holds each tensor."""

    def __init__(self, folder: str | Path):
        from safetensors import safe_open  # only runs that read weights need safetensors

        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        else:
            names = sorted(p.name for p in self.folder.glob("*.safetensors"))
        self.handles = {n: safe_open(str(self.folder / n), framework="pt") for n in names}
        self.where = {k: n for n, h in self.handles.items() for k in h.keys()}  # noqa: SIM118

    def find(self, name: str) -> str | None:
        return next((a for a in _aliases(name) if a in self.where), None)

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None,
             file_field: str | None = None) -> torch.Tensor:
        """A tensor, or the rows and columns asked for, without reading the rest."""
        found = self.find(name)
        if found is None:
            raise SpecError("the weights lack a tensor of this model", file=str(self.folder),
                            field=file_field or name)
        part = self.handles[self.where[found]].get_slice(found)
        ndim = len(part.get_shape())
        if ndim == 1:
            return part[rows or slice(None)]
        return part[rows or slice(None), cols or slice(None)]


def _tp_slice(p: ParamDef, tp) -> tuple[slice | None, slice | None]:
    """(rows, columns) of the full tensor this TP rank holds."""
    if p.tp_dim is None or tp.size == 1:
        return None, None
    n = p.shape[p.tp_dim] // tp.size
    part = slice(tp.rank * n, (tp.rank + 1) * n)
    return (part, None) if p.tp_dim == 0 else (None, part)


class HFWeights:
    """A weight source (``Stage(weights=...)``) reading a HuggingFace folder."""

    def __init__(self, arch: Arch):
        self.arch = arch
        self.files = Files(arch.weights_dir)

    def load(self, i: int, defs: list[ParamDef], tp, dtype) -> dict[str, torch.Tensor]:
        names = layer_names(self.arch, i)
        out = {}
        for p in defs:
            rows, cols = _tp_slice(p, tp)
            if self.arch.family == "gpt2" and 0 < i < self.arch.n_layers - 1:
                t = _gpt2_param(self.files, names, i - 1, p, rows, cols)
            elif self.arch.family == "gpt_neox" and p.name in ("q", "k", "v", "q_b", "k_b", "v_b"):
                t = _neox_qkv(self.files, i - 1, p, tp, self.arch)
            elif p.name == "out" and self.files.find(names["out"]) is None:
                # a tied model's file has no output projection: the head starts from the embedding
                t = self.files.read(layer_names(self.arch, 0)["tok"], rows, cols)
            else:
                t = self.files.read(names[p.name], rows, cols)
            if tuple(t.shape) != _local_shape(p, tp):
                raise SpecError(f"shape {list(t.shape)} where the config gives "
                                f"{list(_local_shape(p, tp))}", file=str(self.files.folder),
                                field=names.get(p.name, p.name))
            out[p.name] = t.to(dtype).contiguous()
        return out


def _local_shape(p: ParamDef, tp) -> tuple[int, ...]:
    if p.tp_dim is None:
        return p.shape
    return tuple(n // tp.size if d == p.tp_dim else n for d, n in enumerate(p.shape))


def _neox_qkv(files: Files, b: int, p: ParamDef, tp, arch: Arch) -> torch.Tensor:
    """This rank's heads of q, k or v from NeoX's fused rows (per head: q, k, v rows)."""
    dh, nh = arch.spec.dhead, arch.spec.num_heads
    local = nh // tp.size
    rows = slice(tp.rank * local * 3 * dh, (tp.rank + 1) * local * 3 * dh)
    which = "qkv".index(p.name[0])
    suffix = "bias" if p.name.endswith("_b") else "weight"
    t = files.read(f"gpt_neox.layers.{b}.attention.query_key_value.{suffix}", rows)
    t = t.view(local, 3, dh, *t.shape[1:])[:, which]
    return t.reshape(local * dh, *t.shape[2:])


def _gpt2_param(files: Files, names: dict, b: int, p: ParamDef, rows, cols) -> torch.Tensor:
    """A GPT-2 block parameter: Conv1D weights transposed, q, k, v cut from c_attn."""
    if p.name in ("q", "k", "v", "q_b", "k_b", "v_b"):
        h = p.shape[-1] if p.name in ("q", "k", "v") else p.shape[0]
        which = "qkv".index(p.name[0])
        part = rows or slice(0, p.shape[0])
        cut = slice(which * h + part.start, which * h + part.stop)
        if p.name.endswith("_b"):
            return files.read(f"transformer.h.{b}.attn.c_attn.bias", cut)
        return files.read(f"transformer.h.{b}.attn.c_attn.weight", None, cut).t()
    if p.name.endswith("_b") or p.name.startswith("ln"):
        return files.read(names[p.name], rows)
    return files.read(names[p.name], cols, rows).t()  # stored [in, out]


def to_hf(arch: Arch, state: dict[tuple[int, str], torch.Tensor]) -> dict[str, torch.Tensor]:
    """Full parameters by (layer, runtime name) as the family's file names and layouts."""
    out: dict[str, torch.Tensor] = {}
    dh, nh = arch.spec.dhead, arch.spec.num_heads
    for (i, name), t in state.items():
        names = layer_names(arch, i)
        b = i - 1
        t = t.detach().contiguous()
        if arch.family == "gpt_neox" and name in ("q", "k", "v", "q_b", "k_b", "v_b"):
            suffix = "bias" if name.endswith("_b") else "weight"
            key = f"gpt_neox.layers.{b}.attention.query_key_value.{suffix}"
            fused = out.setdefault(key, torch.empty(nh, 3, dh, *t.shape[1:], dtype=t.dtype))
            fused[:, "qkv".index(name[0])] = t.view(nh, dh, *t.shape[1:])
        elif arch.family == "gpt2" and name in ("q", "k", "v", "q_b", "k_b", "v_b"):
            suffix = "bias" if name.endswith("_b") else "weight"
            key = f"transformer.h.{b}.attn.c_attn.{suffix}"
            h = arch.spec.hidden_size
            fused = out.setdefault(key, torch.empty((3 * h,) if suffix == "bias" else (h, 3 * h),
                                                    dtype=t.dtype))
            cut = slice("qkv".index(name[0]) * h, ("qkv".index(name[0]) + 1) * h)
            if suffix == "bias":
                fused[cut] = t
            else:
                fused[:, cut] = t.t()
        elif arch.family == "gpt2" and 0 < i < arch.n_layers - 1 and t.dim() == 2:
            out[names[name]] = t.t().contiguous()
        else:
            out[names[name]] = t
    return {k: v.reshape(-1, *v.shape[3:]) if v.dim() >= 3 else v for k, v in out.items()}


def hf_config(arch: Arch, dtype: torch.dtype) -> dict:
    """The ``config.json`` of a saved model: the one it was read from, or one of the family
    whose blocks a catalog model has (GPT-2 for GPT-style, Llama for Llama-style); the head
    untied (the runtime trains it as its own weights)."""
    s = arch.spec
    if arch.hf_config is not None:
        cfg = dict(arch.hf_config)
    elif arch.family == "gpt":
        cfg = {"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "n_embd": s.hidden_size,
               "n_layer": s.num_layers, "n_head": s.num_heads, "n_inner": s.ffn,
               "n_positions": s.max_seq_len, "vocab_size": s.vocab_size,
               "activation_function": {"gelu": "gelu", "relu": "relu"}[arch.act],
               "layer_norm_epsilon": arch.norm_eps, "resid_pdrop": 0.0, "embd_pdrop": 0.0,
               "attn_pdrop": 0.0}
    else:
        cfg = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
               "hidden_size": s.hidden_size, "intermediate_size": s.ffn,
               "num_hidden_layers": s.num_layers, "num_attention_heads": s.num_heads,
               "num_key_value_heads": s.kv_heads, "head_dim": s.dhead, "vocab_size": s.vocab_size,
               "max_position_embeddings": s.max_seq_len, "rms_norm_eps": arch.norm_eps,
               "hidden_act": arch.act, "rope_theta": arch.rope.theta if arch.rope else 10000.0,
               "attention_bias": False, "mlp_bias": False}
    cfg["tie_word_embeddings"] = False
    cfg["torch_dtype"] = cfg["dtype"] = str(dtype).split(".")[-1]
    return cfg


def save_hf(folder: str | Path, arch: Arch, state: dict[tuple[int, str], torch.Tensor],
            dtype: torch.dtype = torch.float32) -> Path:
    """Write ``config.json`` and ``model.safetensors`` of the full parameters ``state``."""
    from safetensors.torch import save_file  # only --save-hf needs safetensors

    if arch.family == "gpt" and arch.spec.position != "learned":
        raise SpecError("no HuggingFace family has this catalog model's blocks", field="--save-hf")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    saved_as = arch if arch.family != "gpt" else arch.model_copy(update={"family": "gpt2"})
    tensors = {k: v.to(dtype).contiguous() for k, v in to_hf(saved_as, state).items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(arch, dtype), indent=2))
    return folder
