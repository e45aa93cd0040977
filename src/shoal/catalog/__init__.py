"""Built-in data: GPUs, models and clouds, each number with its source in the YAML files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from shoal import units
from shoal.errors import SpecError, close_match
from shoal.specs.model import ModelSpec
from shoal.specs.network import CurveSpec


@dataclass(frozen=True)
class GPU:
    """One GPU type, in SI units."""

    name: str
    memory_bytes: float
    flops_16: float  # dense fp16/bf16 tensor-core peak, FLOP/s
    flops_32: float
    mem_bw_Bps: float
    intra_node_bw_Bps: float
    gpus_per_node: int
    price_usd_per_h: float | None
    bf16: bool = True  # has bf16 tensor cores (Volta and Turing do not)
    # per direction to the host's memory (CPU offload); every catalog entry gives its own, this
    # default (PCIe Gen3 x16, as gpus.yaml halves it) is for GPUs built in code
    host_bw_Bps: float = 16e9
    # per-GPU FLOPs at which a layer reaches half the best efficiency, where the analytic
    # profile's fitted constant (GPU kernels) does not apply; None: that constant
    f_half_flops: float | None = None
    vendor: str = ""
    architecture: str = ""
    sm_count: int | None = None  # streaming multiprocessors (NVIDIA) / compute units (AMD)
    flops_tf32: float | None = None  # dense TF32 tensor-core peak; None: no TF32 tensor cores
    flops_fp8: float | None = None  # dense FP8 tensor-core peak; None: no FP8 tensor cores
    # inter-node network of one node of the usual server / instance, per direction, and how
    # many NICs share it (one per GPU on DGX-style servers, 1 for a cloud VM's single limit)
    node_nic_bw_Bps: float | None = None
    nics_per_node: int | None = None


def _read(name: str) -> dict:
    text = resources.files("shoal.catalog").joinpath(name).read_text()
    return yaml.safe_load(text)


# difflib ratio a misspelt name needs to be offered a catalog name: one typo in a name of five or
# more characters passes ("A100-40BG" 0.89, "OPT-350N" 0.88); a different product does not
# ("B100" vs "V100" 0.75, "MI300X" vs "3090" 0.6)
SUGGEST_CUTOFF = 0.8


class Registry:
    """Name -> entry with aliases; rejects duplicate names or aliases when built."""

    def __init__(self, kind: str):
        self.kind = kind
        self.entries: dict[str, object] = {}
        self.alias: dict[str, str] = {}

    def add(self, name: str, entry: object, aliases: list[str]) -> None:
        for key in [name, *aliases]:
            k = _norm(key)
            if k in self.alias and self.alias[k] != name:
                raise ValueError(f"catalog {self.kind}: {key!r} names both {self.alias[k]} and {name}")
            self.alias[k] = name
        self.entries[name] = entry

    def canonical(self, name: str, *, field: str | None = None, file: str | None = None,
                  route: str | None = None) -> str:
        """The canonical name of ``name`` or an alias; else a SpecError naming the catalog's
        list, ``route`` (another way to give what was asked for, such as a HuggingFace
        config.json in place of a catalog model) and a close catalog name."""
        hit = self.alias.get(_norm(name))
        if hit is None:
            raise SpecError(
                f"unknown {self.kind}",
                file=file,
                field=field,
                value=name,
                allowed=(f"one of the catalog's {self.kind}s "
                         f"(`shoal catalog {self.kind.lower()}s` lists them)"
                         + (f", or {route}" if route else "")),
                suggestion=self._suggest(name),
            )
        return hit

    def _suggest(self, name: str) -> str | None:
        # Match against every alias (normalised), but always suggest the canonical name. Only a
        # close match is offered: a name the catalog lacks (MI300X before it was added) scored
        # 0.6 against "3090", and a wrong suggestion misleads more than none. So is another
        # model: a name with a size ("7b") is offered only names with all its numbers, as
        # "Mixtral-8x7B" is no "Mistral-7B", "Gemma-7B" no "Gemma-2-27B", "Llama-3.2-3B" no
        # LLaMA-3B.
        query = _norm(name)
        wanted = _numbers(query)
        if any(n[-1] in "bmt" for n in wanted):  # a model's size: its numbers must all match
            names = [a for a in self.alias
                     if wanted in (_numbers(a), _numbers(_norm(self.alias[a])))]
        else:
            names = list(self.alias)
        hit = close_match(query, names, cutoff=SUGGEST_CUTOFF)
        return self.alias[hit] if hit else None

    def get(self, name: str, **kw):
        return self.entries[self.canonical(name, **kw)]


def _norm(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(" ", "-")


# the numbers of a name that stand apart: "3.2" and "1b" in "llama-3.2-1b", "8x22b", "350m",
# "1t"; not those inside words ("qwen2", "v0.3", "80gb")
_NUMBER = re.compile(r"(?<![a-z0-9.])\d+(?:\.\d+)?(?:x\d+(?:\.\d+)?)?[bmt]?(?![a-z0-9.])")


def _numbers(name: str) -> set[str]:
    """The numbers a normalised name gives apart (sizes end in b, m or t)."""
    return set(_NUMBER.findall(name))


@cache
def gpus() -> Registry:
    reg = Registry("GPU")
    for name, e in _read("gpus.yaml")["gpus"].items():
        f16 = e.get("flops_bf16_dense") or e.get("flops_fp16_dense")
        gpu = GPU(
            name=name,
            memory_bytes=units.parse_bytes(e["memory"]),
            flops_16=units.parse_flops(f16),
            flops_32=units.parse_flops(e["flops_fp32"]),
            mem_bw_Bps=units.parse_bandwidth(e["mem_bandwidth"]),
            intra_node_bw_Bps=units.parse_bandwidth(e["intra_node_bandwidth"]),
            gpus_per_node=int(e["gpus_per_node"]),
            price_usd_per_h=e.get("price_usd_per_h"),
            bf16="flops_bf16_dense" in e,
            host_bw_Bps=units.parse_bandwidth(e["host_link_bandwidth"]),
            vendor=str(e["vendor"]),
            architecture=str(e["architecture"]),
            sm_count=int(e["sm_count"]),
            flops_tf32=_optional(e, "flops_tf32_dense", units.parse_flops),
            flops_fp8=_optional(e, "flops_fp8_dense", units.parse_flops),
            node_nic_bw_Bps=_optional(e, "node_network_bandwidth", units.parse_bandwidth),
            nics_per_node=_optional(e, "nics_per_node", int),
        )
        reg.add(name, gpu, list(e.get("aliases", [])))
    reg.add("cpu", _CPU, ["CPU"])
    return reg


def _optional(entry: dict, key: str, parse):
    value = entry.get(key)
    return None if value is None else parse(value)


# CPU processes for runtime tests: a nominal desktop core (no vendor datasheet applies).
# A CPU has no kernel launches or waves to fill: its small GEMMs reach half the best rate at
# about a megaFLOP (the GPUs' fitted 7.85e10 would charge every layer over 2 s here).
_CPU = GPU("cpu", 8e9, 1e11, 1e11, 2e10, 1e10, 4, None, host_bw_Bps=2e10, f_half_flops=1e6,
           architecture="CPU")


@cache
def gpu_sources() -> dict[str, dict[str, str]]:
    """GPU name -> where each of its catalog numbers comes from (gpus.yaml's ``source``)."""
    return {name: dict(e.get("source", {})) for name, e in _read("gpus.yaml")["gpus"].items()}


@cache
def gpu_notes() -> dict[str, str]:
    """GPU name -> gpus.yaml's ``notes`` (why a number is missing, such as a price), where any."""
    return {name: str(e["notes"]) for name, e in _read("gpus.yaml")["gpus"].items() if "notes" in e}


# another way to give a model than a catalog name, by where the name was given
HF_ROUTE_SCENARIO = ("any HuggingFace model through its config.json: "
                     "`model: {hf_config: path/to/config.json}` (relative to the scenario file)")
HF_ROUTE_OPTION = ("any HuggingFace model through its config.json: --model path/to/config.json "
                   "(or a folder holding config.json and its *.safetensors)")


@cache
def models() -> Registry:
    reg = Registry("model")
    fields = set(ModelSpec.model_fields)
    for name, e in _read("models.yaml")["models"].items():
        spec = ModelSpec(name=name, **{k: v for k, v in e.items() if k in fields and k != "name"})
        reg.add(name, spec, list(e.get("aliases", [])))
    reg.add("tiny", TINY, [])
    return reg


TINY = ModelSpec(
    name="tiny", num_layers=4, hidden_size=64, num_heads=4, vocab_size=256, max_seq_len=32,
    source="shoal's CPU test model (DESIGN §6)",
)


@cache
def clouds() -> dict:
    return _read("clouds.yaml")["clouds"]


@cache
def zone_geo() -> dict[str, tuple[str, str]]:
    """Catalog zone -> (region, geo)."""
    out: dict[str, tuple[str, str]] = {}
    for cloud in clouds().values():
        for region, r in cloud.get("regions", {}).items():
            for z in r.get("zones", []):
                out[z] = (region, r.get("geo", "unknown"))
    return out


# how far apart two zones are, nearest first (clouds.yaml ``network``)
DISTANCES = ("same_zone", "same_region", "same_continent", "intercontinental")


@dataclass(frozen=True)
class LinkDefault:
    """A cloud's catalog link for one distance class (clouds.yaml ``network``): the one-way
    latency and, when the class caps it, the curve of one GPU-to-GPU flow (None: the flow gets
    its GPU's NIC share)."""

    latency_s: float
    curve: CurveSpec | None
    source: str


@cache
def network_defaults() -> dict[str, dict[str, LinkDefault]]:
    """Cloud -> distance class -> its catalog link; a class a cloud leaves out has none."""
    out: dict[str, dict[str, LinkDefault]] = {}
    for name, cloud in clouds().items():
        classes: dict[str, LinkDefault] = {}
        for cls, e in (cloud.get("network") or {}).items():
            if cls not in DISTANCES:
                raise ValueError(f"clouds.yaml {name}.network: unknown distance class {cls!r}")
            if not str(e.get("source", "")).strip():
                raise ValueError(f"clouds.yaml {name}.network.{cls}: no source")
            curve = (CurveSpec(**e["curve"]) if "curve" in e else
                     CurveSpec(kind="constant", bandwidth=e["bandwidth"]) if "bandwidth" in e
                     else None)
            classes[cls] = LinkDefault(units.parse_seconds(e["latency"]), curve, str(e["source"]))
        out[name] = classes
    return out


@cache
def zone_cloud() -> dict[str, str]:
    """Catalog zone -> the cloud that has it."""
    return {z: name for name, cloud in clouds().items()
            for r in cloud.get("regions", {}).values() for z in r.get("zones", [])}
