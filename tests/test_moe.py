"""Mixtures of experts: HuggingFace configs read as such, parameters, FLOPs, memory."""

from __future__ import annotations

import json

import pytest

from shoal.estimate import estimate
from shoal.io.hf import model_from_hf_config
from shoal.problem import build_problem
from shoal.profiles.layers import activation_bytes, layer_sizes
from shoal.specs.model import ModelSpec
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

MIXTRAL = {  # mistralai/Mixtral-8x7B-v0.1 config.json (the keys the reader uses)
    "model_type": "mixtral", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "rms_norm_eps": 1e-5, "rope_theta": 1e6, "vocab_size": 32000,
    "max_position_embeddings": 32768, "tie_word_embeddings": False}
QWEN_MOE = {  # Qwen/Qwen1.5-MoE-A2.7B
    "model_type": "qwen2_moe", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 5632, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
    "num_hidden_layers": 24, "num_key_value_heads": 16, "num_experts": 60,
    "num_experts_per_tok": 4, "rms_norm_eps": 1e-6, "vocab_size": 151936,
    "max_position_embeddings": 8192}
DEEPSEEK = {  # deepseek-ai/DeepSeek-V2-Lite (attention read as multi-head)
    "model_type": "deepseek_v2", "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 10944, "moe_intermediate_size": 1408, "num_attention_heads": 16,
    "num_hidden_layers": 27, "n_routed_experts": 64, "n_shared_experts": 2,
    "num_experts_per_tok": 6, "first_k_dense_replace": 1, "rms_norm_eps": 1e-6,
    "vocab_size": 102400, "max_position_embeddings": 163840,
    "rope_scaling": {"type": "yarn", "factor": 40}}


def _read(tmp_path, cfg, name="config.json") -> ModelSpec:
    p = tmp_path / name
    p.write_text(json.dumps(cfg))
    return model_from_hf_config(p)


def test_mixtral_is_read_as_a_mixture_and_counted_so(tmp_path):
    m = _read(tmp_path, MIXTRAL)
    assert (m.num_experts, m.experts_per_token, m.expert_ffn, m.moe) == (8, 2, 14336, True)
    assert m.position == "rotary" and m.mlp == "swiglu" and m.kv_heads == 8
    sizes = layer_sizes(m, 4096)
    # 46.7B parameters, 12.9B of them active per token (Mistral AI's announcement)
    assert sizes.params.sum() / 1e9 == pytest.approx(46.7, rel=0.01)
    assert (sizes.matmul_params.sum() + sizes.params[0]) / 1e9 == pytest.approx(12.9, rel=0.02)


def test_qwen_and_deepseek_moe_configs(tmp_path):
    q = _read(tmp_path, QWEN_MOE, "q.json")
    assert (q.num_experts, q.experts_per_token, q.expert_ffn, q.shared_experts) == (60, 4, 1408, 4)
    assert layer_sizes(q, 2048).params.sum() / 1e9 == pytest.approx(14.3, rel=0.02)
    d = _read(tmp_path, DEEPSEEK, "d.json")
    assert (d.num_experts, d.shared_experts, d.dense_layers, d.ffn) == (64, 2, 1, 10944)
    assert not d.is_moe_block(0) and d.is_moe_block(1) and d.position == "rotary"


def test_a_rope_parameters_config_is_rotary(tmp_path):
    """Current transformers write ``rope_parameters`` where older ones wrote ``rope_theta``."""
    cfg = {"model_type": "llama", "hidden_size": 512, "num_attention_heads": 8,
           "num_hidden_layers": 2, "vocab_size": 1000, "intermediate_size": 1376,
           "hidden_act": "silu", "rms_norm_eps": 1e-5,
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}
    assert _read(tmp_path, cfg).position == "rotary"
    cfg.pop("model_type")
    assert _read(tmp_path, cfg, "b.json").position == "rotary"


def test_experts_hold_memory_for_all_and_compute_for_the_tokens_routes():
    dense = ModelSpec(name="d", num_layers=4, hidden_size=1024, num_heads=8, vocab_size=32000,
                      mlp="swiglu", ffn_hidden_size=2816, norm="rmsnorm")
    moe = dense.model_copy(update={"num_experts": 8, "experts_per_token": 2})
    d, e = layer_sizes(dense, 2048), layer_sizes(moe, 2048)
    mlp = 3 * 1024 * 2816
    assert e.params[1] - d.params[1] == pytest.approx(7 * mlp + 1024 * 8, rel=1e-9)
    assert e.matmul_params[1] - d.matmul_params[1] == pytest.approx(mlp + 1024 * 8, rel=1e-9)
    # activations: each token's two experts keep their inner activations, plus the routing
    assert activation_bytes(moe, 2048, 1, recompute=False)[1] > \
        activation_bytes(dense, 2048, 1, recompute=False)[1]


def test_a_moe_model_is_planned_with_its_experts_memory(scenario_dict):
    scenario_dict["model"] = {"name": "moe", "num_layers": 8, "hidden_size": 2048,
                              "num_heads": 16, "vocab_size": 32000, "mlp": "swiglu",
                              "ffn_hidden_size": 5632, "num_experts": 16,
                              "experts_per_token": 2}
    pb = build_problem(parse_scenario(scenario_dict))
    plan = TrainingPlan.model_validate({"microbatch_size": 1, "stages": [{"layers": [0, 10],
                                        "replicas": [{"gpu": "A100-40GB", "tp": 1,
                                                      "zone": "us-central1-a",
                                                      "microbatches": 16}]}]})
    e = estimate(pb, plan)
    dense = dict(scenario_dict, model=dict(scenario_dict["model"], num_experts=None))
    ed = estimate(build_problem(parse_scenario(dense)), plan)
    # 16 experts' weights and optimizer state (the embedding and head once), two experts'
    # compute per token
    assert e.workers[0].weights_grads_optimizer_bytes > 6 * ed.workers[0].weights_grads_optimizer_bytes
    assert ed.iteration_time_s < e.iteration_time_s < 3 * ed.iteration_time_s
