"""The serving file: one YAML or JSON document describing a model served on a cluster of
heterogeneous nodes (Helix §3: compute nodes, links, a coordinator)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, model_validator

from shoal.files import read_document
from shoal.specs._types import STRICT, Bytes, BytesPerSecond, Flag, PositiveInt, Seconds
from shoal.specs.scenario import validated

SERVING_SCHEMA = "shoal/serving@1"
COORDINATOR = "coordinator"


class ServingModel(BaseModel):
    """What placement needs of the model: its transformer layers and the bytes a request sends
    between nodes per token. ``name`` may be a catalog model, which fills the rest."""

    model_config = STRICT
    name: str = Field(default="custom", description="a catalog model (it fills the fields left "
                                                    "out) or a label")
    layers: PositiveInt | None = Field(
        default=None, description="transformer layers (the layers placement splits)")
    hidden: PositiveInt | None = Field(default=None, description="hidden size")
    token_bytes: Bytes = Field(default=2.0, description="bytes of one token id (coordinator links)")
    activation_bytes: Bytes | None = Field(
        default=None, description="bytes of one token's activation between nodes; "
                                  "default 2 x hidden (fp16)")
    layer_bytes: Bytes | None = Field(default=None, description="weights of one layer "
                                      "(default: from the catalog model, fp16)")
    kv_bytes: Bytes | None = Field(default=None, description="KV cache of one token in one layer "
                                   "(default: from the catalog model, fp16)")


class Batch(BaseModel):
    """How much one batch of a node's engine takes (the simulator's; vLLM 0.4's defaults)."""

    model_config = STRICT
    prompts: PositiveInt | None = Field(
        default=None, description="prompts one prefill batch takes at most (default: no limit "
                                  "but the tokens)")
    prompt_tokens: PositiveInt = Field(default=4096,
                                       description="prompt tokens one prefill batch takes at most")
    decode: PositiveInt | Annotated[list[PositiveInt], Field(min_length=1)] = Field(
        default=256, description="decode steps one batch takes at most; a list gives it per "
                                 "number of layers the node holds (1, 2, ..., the last entry "
                                 "for more)")


class Machine(BaseModel):
    """A node type. Its capacity ``tokens_per_s[k-1]`` is T(k), the tokens per second a node
    sustains while holding k layers (Helix §4.4), for k = 1 .. ``max_layers``; without the
    table it is computed from ``profile`` (Helix's per-layer CSVs) or the ``gpu``'s catalog
    numbers (see ``shoal.serving.capacity``)."""

    model_config = STRICT
    gpu: str | None = Field(default=None, description="GPU type (catalog name)")
    profile: str | None = Field(
        default=None, description="folder with prompt_bs2time.csv and decode_bs2time.csv "
                                  "(relative to this file)")
    gpus: PositiveInt = Field(default=1, description="GPUs in the node (TP inside the node)")
    memory: Bytes | None = Field(default=None, description="GPU memory of the whole node")
    nic_in: BytesPerSecond | None = Field(default=None, description="inbound NIC bandwidth")
    nic_out: BytesPerSecond | None = Field(default=None, description="outbound NIC bandwidth")
    max_layers: PositiveInt | None = Field(default=None,
                                           description="the most layers a node may hold")
    tokens_per_s: list[float] | None = Field(
        default=None, description="T(k) for k = 1 .. max_layers, tokens/s")
    batch: Batch = Field(default_factory=Batch, description="batch limits of the node's engine "
                                                            "(request simulator)")

    @model_validator(mode="after")
    def _check(self):
        if self.tokens_per_s is None:
            if self.gpu is None and (self.profile is None or self.memory is None):
                raise ValueError("give 'tokens_per_s' (with 'max_layers'), a 'gpu', or a "
                                 "'profile' with 'memory' to compute them from")
            return self
        if self.max_layers is None:
            raise ValueError("'tokens_per_s' needs 'max_layers'")
        if len(self.tokens_per_s) != self.max_layers:
            raise ValueError(f"tokens_per_s has {len(self.tokens_per_s)} entries; it needs one per "
                             f"layer count 1 .. max_layers ({self.max_layers})")
        if any(t < 0 for t in self.tokens_per_s):
            raise ValueError("tokens_per_s must be >= 0")
        return self


class NodeGroup(BaseModel):
    """One node (``name``) or ``count`` nodes named ``<name>-<i>`` (``name`` defaults to the
    machine type)."""

    model_config = STRICT
    machine: str = Field(description="machine type: a key of `machines`")
    name: str | None = Field(default=None, description="node name, or the prefix of `<name>-<i>` "
                                                       "with count; default: the machine type")
    count: PositiveInt = Field(default=1, description="number of nodes of this machine type")
    region: str = Field(default="default",
                        description="region of the nodes: picks the within or between link")
    host: str | None = Field(
        default=None, min_length=1, pattern=r"^[^:\s*]+$",
        description="IPv4 address or name of the machine that runs these nodes' workers (`shoal "
                    "serve worker`), as the coordinator and the other nodes reach it; default: "
                    "`shoal serve run` starts them on its own machine")


class LinkClass(BaseModel):
    model_config = STRICT
    bandwidth: BytesPerSecond = Field(description="link bandwidth")
    latency: Seconds = Field(default=0.0, description="link latency")


class PairLink(LinkClass):
    """A link between two nodes (or a node and ``coordinator``), used in both directions."""

    a: str = Field(description="one end: a node name or `coordinator`")
    b: str = Field(description="the other end: a node name or `coordinator`")


class LinksSpec(BaseModel):
    """Every pair of nodes in one region is linked by ``within``, of two regions by ``between``
    (when given), the coordinator to every node by ``coordinator`` (default ``within``);
    ``pairs`` add or override single links; ``mesh: false`` keeps only ``pairs``."""

    model_config = STRICT
    within: LinkClass | None = Field(
        default=None, description="link between every pair of nodes of one region")
    between: LinkClass | None = Field(
        default=None, description="link between every pair of nodes of two regions; none when left out")
    coordinator: LinkClass | None = Field(
        default=None, description="link from the coordinator to every node; default: within, or "
                                  "between for nodes outside the coordinator's region")
    mesh: Flag = Field(default=True, description="false: only the pairs exist")
    pairs: list[PairLink] = Field(default_factory=list,
                                  description="single links that add to or override the mesh")


class CoordinatorSpec(BaseModel):
    model_config = STRICT
    address: str | None = Field(
        default=None, description="HOST:PORT where `shoal serve run` listens for workers, as "
                                  "nodes with a `host` reach it (needed when a node has one)")
    region: str = Field(default="default", description="region of the coordinator, one of the "
                                                       "nodes' (unsaid: theirs when they are in "
                                                       "one, else `default`, the region of nodes "
                                                       "that name none): picks the within or "
                                                       "between link to each node")
    nic_in: BytesPerSecond | None = Field(default=None,
                                          description="inbound NIC bandwidth of the coordinator")
    nic_out: BytesPerSecond | None = Field(default=None,
                                           description="outbound NIC bandwidth of the coordinator")


class CapacitySpec(BaseModel):
    """How T(k) is computed for machines without a table (``shoal.serving.capacity``)."""

    model_config = STRICT
    weights_fraction: float = Field(default=0.5, gt=0, le=1,
                                    description="the most of a node's memory weights may take "
                                                "(Helix: half; the rest is KV cache)")
    prompt_tokens: float = Field(default=763.0, gt=0, description="mean prompt length (Azure "
                                 "conversation trace, Helix's filtered mean)")
    output_tokens: float = Field(default=232.0, gt=0, description="mean output length (same)")
    max_batch: PositiveInt = Field(default=256, description="most requests in one decode batch")
    compute_efficiency: float = Field(default=0.5, gt=0, le=1,
                                      description="fraction of peak FLOP/s reached (analytic)")
    memory_efficiency: float = Field(default=0.8, gt=0, le=1,
                                     description="fraction of memory bandwidth reached (analytic)")


class WakeSpec(BaseModel):
    """What work that reaches an idle process pays, against a process already running, by how
    long it was idle (``shoal serve profile`` measures it): on a shared or power-saving host a
    sleeping process takes longer to be woken, and its first step runs on cold caches. Linear
    between the measured idle times, none at 0, the last value beyond the last."""

    model_config = STRICT
    gap_s: list[float] = Field(min_length=1, description="idle times, seconds, increasing, > 0")
    hop_s: list[float] = Field(description="extra seconds a message takes to reach a process "
                                           "idle that long")
    prompt_s_per_layer: list[float] = Field(description="extra seconds per layer of a prompt "
                                                        "step after that idle time")
    decode_s_per_layer: list[float] = Field(description="extra seconds per layer of a decode "
                                                        "step after that idle time")

    @model_validator(mode="after")
    def _check(self):
        n = len(self.gap_s)
        if any(g <= 0 for g in self.gap_s) or any(
                b <= a for a, b in zip(self.gap_s, self.gap_s[1:], strict=False)):
            raise ValueError("gap_s must be increasing and > 0")
        for name in ("hop_s", "prompt_s_per_layer", "decode_s_per_layer"):
            v = getattr(self, name)
            if len(v) != n:
                raise ValueError(f"{name} has {len(v)} entries; it needs one per gap_s ({n})")
            if any(x < 0 for x in v):
                raise ValueError(f"{name} must be >= 0")
        return self


class ServingSpec(BaseModel):
    model_config = STRICT
    schema_: Literal["shoal/serving@1"] = Field(default=SERVING_SCHEMA, alias="schema",
                                                description="format version")
    name: str | None = Field(default=None, description="a label for reports")
    model: ServingModel = Field(description="the served model")
    machines: dict[str, Machine] = Field(description="node type name -> the node type")
    nodes: list[NodeGroup] = Field(min_length=1, description="the nodes, by machine type")
    links: LinksSpec = Field(default_factory=LinksSpec, description="the links between nodes and "
                             "to the coordinator")
    coordinator: CoordinatorSpec = Field(default_factory=CoordinatorSpec,
                                         description="where requests enter and leave")
    capacity: CapacitySpec = Field(default_factory=CapacitySpec,
                                   description="how T(k) is computed for machines without a table")
    partial_inference: Flag = Field(
        default=False, description="a node may start inside the previous node's layer range "
                                   "(computing only the layers it still lacks)")
    host_cores: PositiveInt | None = Field(
        default=None, description="the nodes are processes on hosts with this many cores "
                                  "(`shoal serve run`): more nodes of one host (the same `host`, "
                                  "or none) computing at once share them (request simulator); "
                                  "default: each has its own")
    host_share: list[Annotated[float, Field(gt=0, le=1)]] | None = Field(
        default=None, min_length=1,
        description="measured sharing of the host (`shoal serve profile`): entry k-1 is the "
                    "speed, against alone, of each of k nodes of one host computing at once "
                    "(past the list: the last total speed split k ways); overrides host_cores' "
                    "min(1, cores / k)")
    wake: WakeSpec | None = Field(
        default=None, description="what work reaching an idle node pays (request simulator; "
                                  "`shoal serve profile` measures it for `shoal serve run`); "
                                  "default: nothing")

    @model_validator(mode="after")
    def _check_addresses(self):
        if self.coordinator.address is None and any(g.host for g in self.nodes):
            raise ValueError("a node with a 'host' needs coordinator.address (HOST:PORT) for its "
                             "worker to reach the coordinator")
        if self.coordinator.address is not None:
            split_address(self.coordinator.address)
        return self


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an IPv4 address or a name) as (host, port)."""
    host, sep, port = address.rpartition(":")
    if not sep or ":" in host or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"coordinator.address {address!r} is not HOST:PORT with a port in "
                         f"1-65535")
    if host in ("*", "0.0.0.0"):
        raise ValueError(f"coordinator.address {address!r}: the workers need an address they "
                         f"can reach, not a wildcard")
    return host, int(port)


def parse_serving(data: dict, *, file: str | None = None) -> ServingSpec:
    return validated(ServingSpec, data, file)


def load_serving(path: str | Path) -> ServingSpec:
    return parse_serving(read_document(path), file=str(path))
