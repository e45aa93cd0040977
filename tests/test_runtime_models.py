"""Real architectures in the runtime, with ``transformers`` as the referee: the same safetensors
weights give the same logits; configs as current and older ``transformers`` write them; each
worker's slices; decoding with a KV cache; ``--save-hf`` round trips; mixture-of-experts
models refused."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from shoal.errors import SpecError  # noqa: E402
from shoal.runtime.arch import Arch  # noqa: E402
from shoal.runtime.hf.config import arch_from_hf  # noqa: E402
from shoal.runtime.hf.weights import HFWeights  # noqa: E402
from shoal.runtime.model import KVCache, Stage, TPGroup, layer_params, unshard  # noqa: E402

T = transformers
VOCAB = 101


def _llama(**kw):
    return T.LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         max_position_embeddings=64, **kw)


CONFIGS = {
    "llama-gqa-llama3-rope": (lambda: _llama(rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}), T.LlamaForCausalLM),
    "llama-tied-yarn": (lambda: _llama(tie_word_embeddings=True, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}),
        T.LlamaForCausalLM),
    "llama-linear-bias": (lambda: _llama(attention_bias=True, mlp_bias=True,
                                         rope_scaling={"rope_type": "linear", "factor": 2.0}),
                          T.LlamaForCausalLM),
    "gpt-neox": (lambda: T.GPTNeoXConfig(hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=3, num_attention_heads=4,
                                         vocab_size=VOCAB), T.GPTNeoXForCausalLM),
    "gpt-neox-sequential": (lambda: T.GPTNeoXConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        vocab_size=VOCAB, use_parallel_residual=False), T.GPTNeoXForCausalLM),
    "opt": (lambda: T.OPTConfig(hidden_size=64, ffn_dim=128, num_hidden_layers=3,
                                num_attention_heads=4, vocab_size=VOCAB, word_embed_proj_dim=64),
            T.OPTForCausalLM),
    "gpt2": (lambda: T.GPT2Config(n_embd=64, n_layer=3, n_head=4, vocab_size=VOCAB,
                                  bos_token_id=0, eos_token_id=0), T.GPT2LMHeadModel),
    "qwen2": (lambda: T.Qwen2Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2,
                                    vocab_size=VOCAB), T.Qwen2ForCausalLM),
    "mistral-window": (lambda: T.MistralConfig(hidden_size=64, intermediate_size=96,
                                               num_hidden_layers=2, num_attention_heads=4,
                                               num_key_value_heads=2, vocab_size=VOCAB,
                                               sliding_window=8), T.MistralForCausalLM),
}


def hf_model(name: str, folder, shard: str | None = None, seed: int = 0):
    """A transformers model of random weights (perturbed away from its initialisation, so that
    every tensor matters), saved as safetensors in ``folder``."""
    cfg, cls = CONFIGS[name]
    torch.manual_seed(seed)
    m = cls(cfg()).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    m.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
    return m


def close(a, b, tol=1e-5) -> bool:
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_equal_transformers_for_the_same_weights(name, tmp_path):
    m = hf_model(name, tmp_path, shard="40KB" if name.startswith("llama") else None)
    if name.startswith("llama"):
        assert (tmp_path / "model.safetensors.index.json").is_file()  # sharded files
    arch = arch_from_hf(tmp_path)
    st = Stage(arch, 0, arch.n_layers, dtype=torch.float32).eval()
    x = torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert close(st(x), m(x).logits)


OLD_CONFIGS = {
    # as transformers 4.x wrote them: a top-level rope_theta and rope_scaling with "type"
    "llama": ({"model_type": "llama", "hidden_size": 64, "intermediate_size": 96,
               "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
               "vocab_size": VOCAB, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
               "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 2.0},
               "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "float32"},
              {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                   "rope_theta": 500000.0}}),
    # GPT-NeoX's own keys: rotary_pct and rotary_emb_base
    "gpt_neox": ({"model_type": "gpt_neox", "hidden_size": 64, "intermediate_size": 128,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": VOCAB,
                  "max_position_embeddings": 64, "rotary_pct": 0.5, "rotary_emb_base": 5000,
                  "layer_norm_eps": 1e-5, "hidden_act": "gelu", "use_parallel_residual": True,
                  "tie_word_embeddings": False},
                 {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5,
                                      "rope_theta": 5000.0}}),
}


@pytest.mark.parametrize("family", list(OLD_CONFIGS))
def test_configs_of_older_transformers_read_as_current_ones(family, tmp_path):
    """The same architecture whichever way its config spells RoPE; and the logits of a model
    saved under the older spelling equal those transformers computes under the current one."""
    old, new_keys = OLD_CONFIGS[family]
    current = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling",
                                                         "rotary_pct", "rotary_emb_base")}
    current.update(new_keys)
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(old))
    (tmp_path / "new" / "config.json").write_text(json.dumps(current))
    a_old = arch_from_hf(tmp_path / "old" / "config.json")
    a_new = arch_from_hf(tmp_path / "new" / "config.json")
    assert a_old.rope == a_new.rope and a_old.rope.theta != 10000.0
    assert a_old.spec.position == "rotary"
    cfg = T.AutoConfig.for_model(**current)
    m = T.AutoModelForCausalLM.from_config(cfg).eval()
    m.save_pretrained(tmp_path / "weights")
    (tmp_path / "weights" / "config.json").write_text(json.dumps(old))
    arch = arch_from_hf(tmp_path / "weights")
    x = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert close(Stage(arch, 0, arch.n_layers, dtype=torch.float32)(x), m(x).logits)


@pytest.mark.parametrize("name", ["llama-gqa-llama3-rope", "gpt-neox", "gpt2", "opt"])
def test_each_rank_reads_its_tp_slices_and_they_make_the_whole(name, tmp_path):
    hf_model(name, tmp_path)
    arch = arch_from_hf(tmp_path)
    src = HFWeights(arch)
    for i in (0, 1, arch.n_layers - 1):
        defs = layer_params(arch, i)
        whole = src.load(i, defs, TPGroup(), torch.float32)
        parts = [src.load(i, defs, TPGroup(2, r), torch.float32) for r in range(2)]
        for p in defs:
            joined = unshard(p.name, [x[p.name] for x in parts])
            assert torch.equal(joined, whole[p.name]), (i, p.name)
            if p.tp_dim is not None:
                assert parts[0][p.name].shape[p.tp_dim] * 2 == p.shape[p.tp_dim]


@pytest.mark.parametrize("model", ["tiny-gpt", "llama-gqa-llama3-rope", "gpt-neox"])
def test_decoding_with_a_kv_cache_equals_recomputing(model, tmp_path):
    """The serving workers' path: a prompt, then one token at a time through each block's
    cache, gives the logits of the whole sequence run at once."""
    from shoal.catalog import TINY

    if model == "tiny-gpt":
        arch = Arch.from_spec(TINY)
    else:
        hf_model(model, tmp_path)
        arch = arch_from_hf(tmp_path)
    st = Stage(arch, 0, arch.n_layers, dtype=torch.float64).eval()
    seq = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    emb, *blocks, head = st.layers
    caches = [KVCache() for _ in blocks]
    out = []
    with torch.no_grad():
        full = st(seq)
        for start, stop in ((0, 5), (5, 6), (6, 7), (7, 12)):
            h = emb(seq[:, start:stop], start=start)
            for b, c in zip(blocks, caches, strict=True):
                h = b(h, c)
            out.append(head(h))
    assert close(torch.cat(out, dim=1), full, 1e-10)


def test_a_mixture_of_experts_model_is_refused(tmp_path):
    from typer.testing import CliRunner

    from shoal.cli import app
    from shoal.runtime.models import resolve_model

    cfg = {"model_type": "mixtral", "hidden_size": 64, "intermediate_size": 96,
           "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "vocab_size": VOCAB, "num_local_experts": 4, "num_experts_per_tok": 2,
           "rms_norm_eps": 1e-5}
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="model family"):
        resolve_model(str(f))  # Mixtral's blocks are not in the runtime
    cfg["model_type"] = "llama"  # a dense family's config with experts
    f.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="mixture-of-experts") as e:
        resolve_model(str(f))
    assert e.value.field == "num_experts" and str(f) in str(e.value)
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"microbatch_size": 1, "stages": [{"layers": [0, 4], "replicas": [
        {"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": 1}]}]}))
    r = CliRunner().invoke(app, ["train", str(plan), "--model", str(f), "--steps", "1"])
    assert r.exit_code == 2 and "mixture-of-experts" in r.output


def test_save_hf_loads_in_transformers_with_the_same_logits(tmp_path):
    """A 2-stage run of a HuggingFace Llama (TP 2 then TP 1) writes --save-hf; transformers
    loads it and gives the logits of shoal's model of the trained weights."""
    from shoal.runtime.train import spawn
    from shoal.specs.plan import TrainingPlan

    hf_model("llama-gqa-llama3-rope", tmp_path / "in")
    arch = arch_from_hf(tmp_path / "in")
    plan = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [
        {"layers": [0, 2], "replicas": [{"gpu": "cpu", "tp": 2, "zone": "local",
                                         "microbatches": 2}]},
        {"layers": [2, 5], "replicas": [{"gpu": "cpu", "tp": 1, "zone": "local",
                                         "microbatches": 2}]}]})
    out = tmp_path / "out"
    spawn(plan, arch, 2, 16, dtype=torch.float32, save_hf=str(out))
    m = T.AutoModelForCausalLM.from_pretrained(out).eval()
    mine = Stage(arch_from_hf(out), 0, arch.n_layers, dtype=torch.float32).eval()
    before = Stage(arch, 0, arch.n_layers, dtype=torch.float32).eval()
    x = torch.randint(0, VOCAB, (2, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert close(m(x).logits, mine(x))
        assert not close(mine(x), before(x), 1e-3)  # the trained weights, not the first ones


@pytest.mark.parametrize("spec_name", ["tiny", "tiny-llama"])
def test_catalog_models_save_as_a_family_transformers_has(spec_name, tmp_path):
    """GPT-style catalog models save as GPT-2, Llama-style ones as Llama."""
    from shoal.catalog import TINY
    from shoal.runtime.hf.weights import save_hf

    spec = TINY if spec_name == "tiny" else TINY.model_copy(update={
        "name": "tiny-llama", "mlp": "swiglu", "norm": "rmsnorm", "position": "rotary",
        "num_kv_heads": 2, "ffn_hidden_size": 96})
    arch = Arch.from_spec(spec)
    st = Stage(arch, 0, arch.n_layers, dtype=torch.float32, seed=3).eval()
    state = {(i, n): p for i, layer in enumerate(st.layers) for n, p in layer.named_parameters()}
    save_hf(tmp_path, arch, state)
    m = T.AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert close(m(x).logits, st(x))
