"""The built-in catalog: every required GPU and model resolves, numbers are positive and sourced,
parameter counts match the published sizes, aliases work, and HuggingFace configs load."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import yaml
from typer.testing import CliRunner

from shoal import catalog
from shoal.cli import app
from shoal.errors import SpecError
from shoal.io.hf import model_from_hf_config
from shoal.problem import build_problem
from shoal.profiles.layers import checkpoint_params, layer_sizes
from shoal.specs.scenario import parse_scenario

REQUIRED_GPUS = [
    "H100-80GB", "H200", "GH200-96GB", "A100-80GB", "A100-40GB", "V100-32GB", "V100-16GB", "L40S",
    "L4", "T4", "A10G", "A6000", "A30", "A4000", "RTX-3090", "RTX-2080", "Titan-RTX", "H100-NVL",
    "H100-PCIe", "B200", "MI300X", "MI250X",
]

# nominal sizes in billions of parameters (the papers' and model cards' figures)
REQUIRED_MODELS = {
    "OPT-350M": 0.35, "OPT-30B": 30.0, "GPT-Neo-2.7B": 2.7,
    "GPT-3-1.7B": 1.7, "GPT-3-3.6B": 3.6, "GPT-3-7.5B": 7.5, "GPT-3-18B": 18.4, "GPT-3-39B": 39.1,
    "GPT-3-76B": 76.1, "GPT-3-145B": 145.6, "GPT-3-310B": 310.1, "GPT-3-530B": 529.6,
    "GPT-3-1T": 1008.0, "GPT-3-175B": 175.0,
    "LLaMA-1-7B": 6.7, "LLaMA-1-13B": 13.0, "LLaMA-1-30B": 32.5, "LLaMA-1-65B": 65.2,
    "LLaMA-2-7B": 6.7, "LLaMA-2-13B": 13.0, "LLaMA-2-70B": 70.0,
    "LLaMA-3-8B": 8.0, "LLaMA-3-70B": 70.6, "LLaMA-3-405B": 405.0,
}
# presets of widely used open models with the parameter count their model card (or paper)
# publishes, in billions: the catalog's checkpoint count is within 2% of it
PUBLISHED_SIZES = {
    "Llama-3.1-8B": 8.03, "Llama-3.1-70B": 70.6, "Llama-3.1-405B": 405.9,
    "Qwen2.5-0.5B": 0.49, "Qwen2.5-1.5B": 1.54, "Qwen2.5-3B": 3.09, "Qwen2.5-7B": 7.61,
    "Qwen2.5-14B": 14.7, "Qwen2.5-32B": 32.5, "Qwen2.5-72B": 72.7,
    "Gemma-2-2B": 2.61, "Gemma-2-9B": 9.24, "Gemma-2-27B": 27.2,
    "Mixtral-8x7B": 46.7, "Mixtral-8x22B": 141.0,
    "Mistral-7B": 7.24, "Mistral-7B-v0.3": 7.25, "Mistral-Nemo-12B": 12.2,
}
# the mixtures of experts among them: (experts, routed per token, published active billions)
MOE_PRESETS = {"Mixtral-8x7B": (8, 2, 12.9), "Mixtral-8x22B": (8, 2, 39.0)}
TOLERANCE = {"OPT-350M": 0.15}  # its nominal 350M is rounded (HF counts 331M with a 512-d projection)


def _gpu_yaml() -> dict:
    return yaml.safe_load(resources.files("shoal.catalog").joinpath("gpus.yaml").read_text())["gpus"]


def _clouds_yaml() -> dict:
    return yaml.safe_load(resources.files("shoal.catalog").joinpath("clouds.yaml").read_text())["clouds"]


# gpus.yaml key of each number -> the key of its source
NUMBER_SOURCES = {
    "memory": "memory", "flops_bf16_dense": "flops", "flops_fp16_dense": "flops",
    "flops_fp32": "flops", "mem_bandwidth": "mem_bandwidth",
    "intra_node_bandwidth": "intra_node_bandwidth", "host_link_bandwidth": "host_link_bandwidth",
    "gpus_per_node": "gpus_per_node", "price_usd_per_h": "price", "sm_count": "sm_count",
    "flops_tf32_dense": "flops_tf32", "flops_fp8_dense": "flops_fp8",
    "node_network_bandwidth": "node_network", "nics_per_node": "node_network",
}
# architectures with TF32 / FP8 tensor (matrix) cores, as their datasheets give them
TF32_ARCHS = {"Ampere", "Ada Lovelace", "Hopper", "Blackwell", "CDNA 3"}
FP8_ARCHS = {"Ada Lovelace", "Hopper", "Blackwell", "CDNA 3"}
# catalog GPUs that a cloud of clouds.yaml (GCP, AWS, Azure) rents on demand, with the cloud
# whose list price the catalog records
RENTED_WITH_PRICE = {
    "H100-80GB": "gcp", "H200": "aws", "A100-80GB": "gcp", "A100-40GB": "gcp", "V100-32GB": "aws",
    "V100-16GB": "gcp", "L40S": "aws", "L4": "gcp", "T4": "gcp", "A10G": "aws", "H100-NVL": "azure",
    "B200": "aws", "MI300X": "azure",
}
# catalog GPUs priced by another public cloud's list price page (none of clouds.yaml rents them)
PRICED_ELSEWHERE = {"A6000": "Lambda", "H100-PCIe": "Lambda", "GH200-96GB": "Sailor"}


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_required_gpu_resolves_with_positive_numbers(name):
    g = catalog.gpus().get(name)
    assert g.name == name
    assert g.memory_bytes > 1e9
    assert g.flops_16 > 0 and g.flops_32 > 0
    assert g.flops_16 >= g.flops_32  # tensor cores are never slower than the vector units
    assert g.mem_bw_Bps > 0 and g.intra_node_bw_Bps > 0
    assert g.gpus_per_node >= 1
    assert g.price_usd_per_h is None or g.price_usd_per_h > 0


def test_catalog_gpu_units_are_si():
    a100 = catalog.gpus().get("A100-40GB")
    assert a100.memory_bytes == 40 * 2**30
    assert a100.flops_16 == pytest.approx(312e12)
    assert 1e12 < a100.mem_bw_Bps < 3e12  # bytes/s, not bits


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_every_gpu_entry_has_a_source(name):
    entry = _gpu_yaml()[name]
    src = entry.get("source")
    assert src, f"{name} has no source"
    if isinstance(src, dict):
        assert all(isinstance(v, str) and v.strip() for v in src.values()), f"{name}: empty source item"
        for key in ("memory", "flops"):
            assert key in src, f"{name}: no source for {key}"


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_every_number_has_its_own_source(name):
    entry = _gpu_yaml()[name]
    src = entry["source"]
    assert isinstance(src, dict)
    for key, src_key in NUMBER_SOURCES.items():
        if key in entry:
            assert src.get(src_key, "").strip(), f"{name}: {key} has no source.{src_key}"
    for text in [*src.values(), entry.get("notes", "")]:  # pages cited, not how they were found
        assert not re.search(r"search tool|snapshot|transcribed|found through|as read from", text,
                             re.IGNORECASE), f"{name}: {text[:80]}"


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_every_gpu_has_sm_count_vendor_and_architecture(name):
    g = catalog.gpus().get(name)
    assert g.vendor in ("NVIDIA", "AMD")
    assert g.architecture
    assert isinstance(g.sm_count, int) and 20 <= g.sm_count <= 400


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_tf32_and_fp8_peaks_where_the_gpu_has_them(name):
    g = catalog.gpus().get(name)
    assert (g.flops_tf32 is not None) == (g.architecture in TF32_ARCHS), name
    assert (g.flops_fp8 is not None) == (g.architecture in FP8_ARCHS), name
    # a lower precision is never slower: fp32 vector <= tf32 <= 16-bit <= fp8
    ladder = [g.flops_32, g.flops_tf32, g.flops_16, g.flops_fp8]
    ladder = [f for f in ladder if f is not None]
    assert ladder == sorted(ladder), name


def test_datasheet_values_in_si_units():
    h100 = catalog.gpus().get("H100-80GB")
    assert (h100.sm_count, h100.flops_tf32, h100.flops_fp8) == (132, 494.5e12, 1979e12)
    assert h100.node_nic_bw_Bps == 3200e9 / 8 and h100.nics_per_node == 8  # bytes/s, DGX H100
    a100 = catalog.gpus().get("A100-40GB")
    assert (a100.sm_count, a100.flops_tf32, a100.flops_fp8) == (108, 156e12, None)
    assert a100.node_nic_bw_Bps == 1600e9 / 8
    assert catalog.gpus().get("V100-16GB").flops_tf32 is None


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_node_network_comes_with_its_nic_count(name):
    g = catalog.gpus().get(name)
    assert (g.node_nic_bw_Bps is None) == (g.nics_per_node is None), name
    if g.node_nic_bw_Bps is not None:
        assert 1e9 <= g.node_nic_bw_Bps <= 1e12 and 1 <= g.nics_per_node <= g.gpus_per_node
    else:  # no usual server or instance: the source says so
        assert "node_network" in _gpu_yaml()[name]["source"], name


@pytest.mark.parametrize(("name", "vendor", "memory_gib", "fp8"), [
    ("MI300X", "AMD", 192, 2614.9e12), ("MI250X", "AMD", 128, None), ("B200", "NVIDIA", 180, 4.5e15),
    ("H100-PCIe", "NVIDIA", 80, 1513e12), ("H100-NVL", "NVIDIA", 94, 1670.5e12),
    ("L40S", "NVIDIA", 48, 733e12), ("A10G", "NVIDIA", 24, None),
])
def test_new_and_checked_gpus(name, vendor, memory_gib, fp8):
    g = catalog.gpus().get(name)
    assert g.vendor == vendor
    assert g.memory_bytes == memory_gib * 2**30  # vendor GB of HBM/GDDR are binary
    assert g.flops_fp8 == (pytest.approx(fp8) if fp8 else None)
    assert {"flops", "memory", "mem_bandwidth", "sm_count"} <= set(catalog.gpu_sources()[name])


@pytest.mark.parametrize(("name", "cloud"), list(RENTED_WITH_PRICE.items()))
def test_gpus_rented_by_a_listed_cloud_have_a_price(name, cloud):
    g = catalog.gpus().get(name)
    assert g.price_usd_per_h and g.price_usd_per_h > 0
    assert "price" in catalog.gpu_sources()[name]
    assert name in _clouds_yaml()[cloud]["gpu_prices_usd_per_h"]


def test_cloud_prices_are_catalog_gpus_with_a_price():
    for cloud in _clouds_yaml().values():
        for name, price in cloud.get("gpu_prices_usd_per_h", {}).items():
            assert price > 0
            assert catalog.gpus().get(name).price_usd_per_h is not None, name


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_a_gpu_without_a_price_says_why(name):
    entry = _gpu_yaml()[name]
    if "price_usd_per_h" not in entry:
        notes = entry.get("notes", "")
        assert "No on-demand price" in notes, name
        assert f"prices.gpu_usd_per_h.{name}" in notes, name  # how to give one


@pytest.mark.parametrize("name", list(_gpu_yaml()))
def test_every_gpu_a_cloud_rents_has_a_price(name):
    """The catalog's prices: each GPU that a cloud of clouds.yaml rents, or another public
    cloud's list price page gives, has one; no other GPU has one."""
    entry = _gpu_yaml()[name]
    assert ("price_usd_per_h" in entry) == (name in RENTED_WITH_PRICE or name in PRICED_ELSEWHERE)
    if name in PRICED_ELSEWHERE:
        assert PRICED_ELSEWHERE[name] in entry["source"]["price"]


def test_mi300x_is_priced_from_azures_page():
    g = catalog.gpus().get("MI300X")
    price = catalog.gpu_sources()["MI300X"]["price"]
    assert g.price_usd_per_h == pytest.approx(48.00 / 8)  # one ND MI300X v5 VM holds 8
    assert "Standard_ND96isr_MI300X_v5" in price and "$48.00/h / 8" in price
    assert "azure.microsoft.com/pricing" in price
    assert _clouds_yaml()["azure"]["gpu_prices_usd_per_h"]["MI300X"] == g.price_usd_per_h


def test_catalog_gpus_json_lists_new_fields_and_gpus():
    res = CliRunner().invoke(app, ["catalog", "gpus", "--json"])
    assert res.exit_code == 0, res.output
    gpus = {g["name"]: g for g in json.loads(res.stdout)["gpus"]}
    assert {"MI300X", "MI250X", "B200", "H100-PCIe", "H100-NVL", "L40S", "A10G"} <= set(gpus)
    mi = gpus["MI300X"]
    assert (mi["vendor"], mi["architecture"], mi["sm_count"]) == ("AMD", "CDNA 3", 304)
    assert mi["flops_tf32"] == pytest.approx(653.7e12) and mi["flops_fp8"] == pytest.approx(2614.9e12)
    assert mi["node_nic_bw_Bps"] == 400e9 and mi["nics_per_node"] == 8
    assert {"sm_count", "flops_tf32", "flops_fp8", "node_network"} <= set(mi["source"])
    # a GPU without a price says why, and how to give one
    assert gpus["RTX-3090"]["price_usd_per_h"] is None
    assert "prices.gpu_usd_per_h.RTX-3090" in gpus["RTX-3090"]["notes"]
    # each with its sources, its price among them
    for name, price in (("MI300X", 6.0), ("B200", 14.2416), ("H100-PCIe", 2.49)):
        g = gpus[name]
        assert g["price_usd_per_h"] == pytest.approx(price), name
        assert {"flops", "memory", "mem_bandwidth", "price"} <= set(g["source"]), name
        assert all(isinstance(v, str) and "http" in v for k, v in g["source"].items()
                   if k in ("flops", "price")), name


@pytest.mark.parametrize(("alias", "name"), [
    ("GH-96", "GH200-96GB"), ("A100-40", "A100-40GB"), ("V100-16", "V100-16GB"),
    ("A100-80", "A100-80GB"), ("a100_40gb", "A100-40GB"), ("h100", "H100-80GB"),
    ("Titan-RTX", "Titan-RTX"), ("RTX-2080", "RTX-2080"), ("RTX-3090", "RTX-3090"),
    ("mi300x", "MI300X"), ("MI300X-192GB", "MI300X"), ("amd_instinct_mi300x", "MI300X"),
    ("mi250x", "MI250X"), ("B200-180GB", "B200"), ("b200_sxm", "B200"), ("h100_pcie", "H100-PCIe"),
    ("H100-PCIe-80GB", "H100-PCIe"), ("h100 nvl", "H100-NVL"),
])
def test_gpu_aliases(alias, name):
    assert catalog.gpus().canonical(alias) == name


@pytest.mark.parametrize(("alias", "name"), [
    ("OPT-350", "OPT-350M"), ("facebook/opt-350m", "OPT-350M"), ("GPT-Neo-2.7", "GPT-Neo-2.7B"),
    ("LLAMA-3-8", "LLaMA-3-8B"), ("meta-llama/Llama-2-70b-hf", "LLaMA-2-70B"), ("OPT-30", "OPT-30B"),
])
def test_model_aliases(alias, name):
    assert catalog.models().canonical(alias) == name


def test_unknown_name_suggests():
    with pytest.raises(SpecError) as ei:
        catalog.gpus().canonical("A100-40GBX", field="f", file="c.yaml")
    assert catalog.gpus().canonical(ei.value.suggestion) == "A100-40GB"


def _suggestion(reg: catalog.Registry, name: str) -> str | None:
    with pytest.raises(SpecError) as ei:
        reg.canonical(name, field="f", file="c.yaml")
    return ei.value.suggestion


def test_a_gpu_the_catalog_lacks_gets_no_far_fetched_suggestion():
    """Before the catalog had AMD GPUs, 'MI300X' was answered with "did you mean 'RTX-3090'?"
    (difflib ratio 0.6 against the alias '3090'): a wrong suggestion is worse than none."""
    full = catalog.gpus()
    without_amd = catalog.Registry("GPU")
    for alias, name in full.alias.items():
        if full.entries[name].vendor != "AMD":
            without_amd.add(name, full.entries[name], [alias])
    for name in ("MI300X", "MI300X-192GB", "MI250X", "MI325X"):
        assert _suggestion(without_amd, name) is None, name
    for name in ("MI210", "Gaudi2", "TPU-v5e", "B100"):
        assert _suggestion(full, name) is None, name
    assert _suggestion(full, "MI325X") in (None, "MI300X", "MI250X")  # never an NVIDIA card
    # a typo of a catalog name still gets it
    assert _suggestion(full, "MI300") == "MI300X"
    assert _suggestion(full, "MI-300X") == "MI300X"
    assert _suggestion(full, "H10O-80GB") == "H100-80GB"


def _without(reg: catalog.Registry, keep) -> catalog.Registry:
    """A copy of ``reg`` with only the entries ``keep(name)`` accepts (a catalog before them)."""
    out = catalog.Registry(reg.kind)
    for alias, name in reg.alias.items():
        if keep(name):
            out.add(name, reg.entries[name], [alias])
    return out


def test_a_model_the_catalog_lacks_gets_no_suggestion_of_another_size():
    """Before the catalog had Mixtral, 'Mixtral-8x7B' was answered with "did you mean
    'Mistral-7B'?" (difflib ratio 0.82): a model of another size (or version) is never offered,
    a typo of a catalog name still is."""
    full = catalog.models()
    before = _without(full, lambda n: not n.startswith(("Mixtral", "Qwen", "Gemma")))
    for name in ("Mixtral-8x7B", "mixtral-8x7b-v0.1", "Mixtral-8x22B", "Gemma-2-27B"):
        assert _suggestion(before, name) is None, name
    for name in ("Gemma-7B", "Llama-3.2-1B", "Llama-3.2-3B", "OPT-1.3B", "GPT-NeoX-20B"):
        assert _suggestion(full, name) is None, name
    assert _suggestion(full, "Mixtral-8x7C") == "Mixtral-8x7B"
    assert _suggestion(full, "Mixtral-8x7B-v0.4") == "Mixtral-8x7B"
    assert _suggestion(full, "LLaMA-2-70C") == "LLaMA-2-70B"
    assert _suggestion(full, "OPT-350N") == "OPT-350M"
    assert _suggestion(full, "Qwen2.5-7B-chat") == "Qwen2.5-7B"
    assert _suggestion(full, "llama-2-7b-chat") == "LLaMA-2-7B"
    # and a GPU the catalog lacks is never answered with a consumer card
    assert _suggestion(_without(catalog.gpus(), lambda n: n != "MI300X"), "MI300X") is None


def test_an_unknown_model_names_the_huggingface_config_route(tmp_path, scenario_dict):
    scenario_dict["model"] = "Phi-3-mini"
    with pytest.raises(SpecError) as ei:
        build_problem(parse_scenario(scenario_dict, file="s.yaml"), file="s.yaml")
    text = str(ei.value)
    assert ei.value.field == "model" and ei.value.suggestion is None
    assert "shoal catalog models" in text and "model: {hf_config: path/to/config.json}" in text
    # the route works: the same scenario with the model's config.json
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    scenario_dict["model"] = {"hf_config": "config.json"}
    problem = build_problem(parse_scenario(scenario_dict), file=str(tmp_path / "s.yaml"))
    assert problem.model.num_layers == LLAMA_LIKE["num_hidden_layers"]


def test_an_unknown_model_option_names_the_config_json_it_takes():
    from shoal.runtime.models import resolve_model

    with pytest.raises(SpecError) as ei:
        resolve_model("Mixtral-8x7X")
    assert ei.value.field == "--model" and ei.value.suggestion == "Mixtral-8x7B"
    assert "--model path/to/config.json" in str(ei.value)


def _unique_params(model) -> float:
    """Parameters of the model; the layer list gives the head its own copy of a tied embedding
    (as pipeline stages hold it), which the published sizes count once."""
    return checkpoint_params(model)


@pytest.mark.parametrize(("name", "nominal_b"), list(REQUIRED_MODELS.items()))
def test_required_model_parameter_count(name, nominal_b):
    model = catalog.models().get(name)
    assert model.name == name
    assert model.source, f"{name} has no source"
    tol = TOLERANCE.get(name, 0.10)
    got = _unique_params(model) / 1e9
    assert got == pytest.approx(nominal_b, rel=tol), f"{name}: {got:.3f}B vs nominal {nominal_b}B"
    sizes = layer_sizes(model, 2048)
    assert sizes.n == model.num_layers + 2
    assert (sizes.params > 0).all() and (sizes.fwd_flops[1:] > 0).all()


@pytest.mark.parametrize(("name", "published_b"), list(PUBLISHED_SIZES.items()))
def test_preset_parameter_count_matches_the_published_size(name, published_b):
    model = catalog.models().get(name)
    got = checkpoint_params(model) / 1e9
    assert got == pytest.approx(published_b, rel=0.02), f"{name}: {got:.3f}B vs {published_b}B"
    assert "config.json" in model.source and "huggingface.co/" in model.source, name
    sizes = layer_sizes(model, 4096)
    assert sizes.n == model.num_layers + 2 and (sizes.fwd_flops[1:] > 0).all()


@pytest.mark.parametrize(("name", "moe"), list(MOE_PRESETS.items()))
def test_moe_presets_route_each_token_through_some_experts(name, moe):
    experts, top_k, active_b = moe
    model = catalog.models().get(name)
    assert model.moe and (model.num_experts, model.experts_per_token) == (experts, top_k)
    assert all(model.is_moe_block(i) for i in range(model.num_layers))
    # parameters a token goes through: every block's attention, its top-k experts and router,
    # the embedding and the output projection
    sizes = layer_sizes(model, 1)
    active = float(sizes.matmul_params.sum()) + model.vocab_size * model.hidden_size
    assert active / 1e9 == pytest.approx(active_b, rel=0.02)


@pytest.mark.parametrize(("name", "tied", "head_dim"), [
    ("Qwen2.5-0.5B", True, 64), ("Qwen2.5-7B", False, 128), ("Gemma-2-2B", True, 256),
    ("Gemma-2-27B", True, 128), ("Mistral-Nemo-12B", False, 128), ("Llama-3.1-8B", False, 128),
])
def test_presets_keep_their_configs_head_width_and_tied_embeddings(name, tied, head_dim):
    model = catalog.models().get(name)
    assert (model.tied_embeddings, model.dhead) == (tied, head_dim)


def test_new_presets_resolve_by_their_huggingface_names():
    reg = catalog.models()
    for alias, name in (("meta-llama/Llama-3.1-8B", "Llama-3.1-8B"),
                        ("Qwen/Qwen2.5-72B-Instruct", "Qwen2.5-72B"),
                        ("google/gemma-2-9b", "Gemma-2-9B"),
                        ("mistralai/Mixtral-8x22B-v0.1", "Mixtral-8x22B"),
                        ("mistralai/Mistral-Nemo-Base-2407", "Mistral-Nemo-12B"),
                        ("Llama-3.1-405B", "LLaMA-3-405B")):
        assert reg.canonical(alias) == name, alias


def test_gqa_and_swiglu_models():
    l3 = catalog.models().get("LLaMA-3-70B")
    assert (l3.num_heads, l3.kv_heads, l3.mlp, l3.norm) == (64, 8, "swiglu", "rmsnorm")
    assert catalog.models().get("OPT-350M").mlp == "relu"


def test_tiny_model_for_cpu_tests():
    tiny = catalog.models().get("tiny")
    assert tiny.num_layers == 4 and layer_sizes(tiny, 32).params.sum() < 1e6


LLAMA_LIKE = {
    "_name_or_path": "acme/llama-ish-1b",
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def test_hf_config_loads(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(LLAMA_LIKE))
    m = model_from_hf_config(path)
    assert m.name == "acme/llama-ish-1b"
    assert (m.num_layers, m.hidden_size, m.num_heads, m.kv_heads) == (22, 2048, 32, 4)
    assert (m.ffn, m.vocab_size, m.max_seq_len) == (5632, 32000, 2048)
    assert (m.mlp, m.norm, m.position, m.tied_embeddings) == ("swiglu", "rmsnorm", "rotary", False)
    # the same shape as TinyLlama-1.1B
    assert layer_sizes(m, 2048).params.sum() == pytest.approx(1.1e9, rel=0.02)


def test_hf_config_gpt2_style_keys(tmp_path):
    path = tmp_path / "gpt2" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
                                "vocab_size": 50257, "n_positions": 1024,
                                "activation_function": "gelu_new"}))
    m = model_from_hf_config(path)
    assert (m.num_layers, m.hidden_size, m.num_heads, m.max_seq_len) == (12, 768, 12, 1024)
    assert (m.mlp, m.norm, m.position, m.tied_embeddings) == ("gelu", "layernorm", "learned", True)
    assert m.name == "gpt2"  # no _name_or_path: the directory name


def test_hf_config_in_scenario(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_LIKE))
    scn = parse_scenario({
        "model": {"hf_config": "config.json"},
        "job": {"global_batch": 8},
        "pool": {"regions": {"r": {"zones": {"z": {"gpus": {"A100-40GB": 8}}}}}},
        "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps"}}},
    }, file=str(tmp_path / "s.yaml"))
    problem = build_problem(scn, file=str(tmp_path / "s.yaml"))
    assert problem.model.num_layers == 22 and problem.n_layers == 24


def test_hf_config_missing_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in LLAMA_LIKE.items() if k != "num_attention_heads"}))
    with pytest.raises(SpecError) as ei:
        model_from_hf_config(path)
    assert ei.value.file == str(path)
    assert ei.value.field == "num_attention_heads"


def test_hf_config_malformed(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 12,\n  oops}')
    with pytest.raises(SpecError, match="line 2") as ei:
        model_from_hf_config(path)
    assert ei.value.file == str(path)


def test_cpu_layers_are_not_charged_gpu_kernel_floors():
    """GPU kernels pay tile and wave quantisation and launches: on the CPU test entry (no SMs)
    a layer of the tiny model takes milliseconds (the runtime measures tens of milliseconds
    per whole step on this machine), not what a GPU's quantisation would give."""
    from shoal.profiles.analytic import AnalyticProfile, device

    gpus = {"cpu": catalog.gpus().get("cpu"), "A100-40GB": catalog.gpus().get("A100-40GB")}
    model = catalog.models().get("tiny")
    prof = AnalyticProfile(model, 32, gpus)
    cpu = prof.layer_times("cpu", 1, 8)
    assert cpu[1:-1, :2].max() < 0.01
    # on a GPU a tiny block costs at least its kernels' launches (4 GEMMs, attention, the
    # element-wise kernels)
    launch = device(gpus["A100-40GB"], prof.stack, prof.precision).launch_s
    assert prof.layer_times("A100-40GB", 1, 8)[1:-1, 0].min() > 6 * launch
