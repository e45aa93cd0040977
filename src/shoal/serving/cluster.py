"""A serving spec resolved into the arrays placement and routing work on: per node its capacity
table T(k) and layer limit, per pair of nodes the tokens/s their link carries (Helix §4.3)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from shoal import catalog
from shoal.errors import SpecError, close_match
from shoal.serving import capacity
from shoal.specs.model import ModelSpec
from shoal.specs.serving import COORDINATOR, LinksSpec, ServingModel, ServingSpec


@dataclass(frozen=True)
class Cluster:
    """Node i: ``names[i]``, ``machines[i]``, ``regions[i]``; ``T[i, k]`` tokens/s holding k
    layers (0 where k > ``kmax[i]``); ``S[i, j]`` tokens/s of activations on link i -> j (0: no
    link); ``src[i]`` / ``snk[i]`` tokens/s of token ids between the coordinator and i;
    ``lat*`` the links' latencies in seconds; ``src_total`` / ``snk_total`` the coordinator's
    NIC in tokens/s."""

    layers: int
    names: tuple[str, ...]
    machines: tuple[str, ...]
    regions: tuple[str, ...]
    T: np.ndarray
    kmax: np.ndarray
    S: np.ndarray
    src: np.ndarray
    snk: np.ndarray
    lat: np.ndarray
    src_lat: np.ndarray
    snk_lat: np.ndarray
    src_total: float
    snk_total: float
    token_bytes: float
    activation_bytes: float
    partial: bool
    times: tuple = ()  # per node: capacity.LayerTimes, or None when unknown
    memory: np.ndarray | None = None  # per node, bytes (nan when unknown)
    layer_bytes: float | None = None
    kv_bytes: float | None = None
    batch: tuple = ()  # per node: its machine's spec.Batch (empty: the defaults)
    host_cores: int | None = None  # the nodes share one host of this many cores
    host_share: tuple[float, ...] | None = None  # measured: each of k computing runs at [k-1]
    wake: object | None = None  # spec.WakeSpec: what work reaching an idle node pays
    hosts: tuple[str | None, ...] = ()  # per node: the machine running its worker (None: here)
    coordinator_address: str | None = None  # HOST:PORT the live coordinator listens on

    def sharing(self):
        """The speed (against alone) of each of k nodes computing at once on the shared host, as
        a function of k, or None when each node has its own device: the measured
        ``host_share`` (past its end the last total speed split k ways), else
        min(1, host_cores / k)."""
        share, cores = self.host_share, self.host_cores
        if share:
            last = share[-1] * len(share)
            return lambda k: share[k - 1] if k <= len(share) else last / k
        if cores is not None:
            return lambda k: min(1.0, cores / k)
        return None

    @property
    def n(self) -> int:
        return len(self.names)

    def upper_bound(self) -> float:
        """Helix's bound on any placement's max flow: sum_i max_k k T_i(k) / L (every token
        passes every layer once)."""
        k = np.arange(self.T.shape[1])
        return float((self.T * k[None, :]).max(axis=1).sum() / self.layers)

    def index(self, name: str) -> int:
        try:
            return self.names.index(name)
        except ValueError:
            raise SpecError("unknown node", value=name,
                            allowed=", ".join(self.names[:8]) + (" ..." if self.n > 8 else ""),
                            suggestion=close_match(str(name), self.names)) from None


@dataclass(frozen=True)
class MachineModel:
    """A machine type resolved: its capacity table, and (when known) its per-layer times and
    memory, which the request simulator needs."""

    kmax: int
    T: list[float]
    times: object | None  # capacity.LayerTimes
    memory_bytes: float | None


def architecture(model: ServingModel) -> ModelSpec | None:
    """The catalog model named ``model.name``, or None when it is not in the catalog."""
    try:
        return catalog.models().get(model.name)
    except SpecError:
        return None


def resolved(model: ServingModel) -> tuple[int, float]:
    """(layers, activation bytes per token), from the fields or the catalog model."""
    arch = architecture(model)
    layers = model.layers or (arch.num_layers if arch else None)
    hidden = model.hidden or (arch.hidden_size if arch else None)
    act = model.activation_bytes or (2.0 * hidden if hidden else None)
    if layers is None or act is None:
        if arch is None and model.name != "custom":  # a misspelt catalog name, likely
            catalog.models().get(model.name, field="model.name")
        raise SpecError("the model needs 'layers' and 'activation_bytes' (or 'hidden'), or "
                        "a catalog 'name'", field="model", value=model.name,
                        suggestion=None)
    return int(layers), float(act)


def _model_bytes(spec: ServingSpec) -> tuple[float | None, float | None]:
    """(weights of one layer, KV bytes per token per layer) from the fields or the catalog."""
    arch = architecture(spec.model)
    lb = spec.model.layer_bytes or (2.0 * capacity.layer_params(arch) if arch else None)
    kv = spec.model.kv_bytes or (capacity.kv_bytes(arch) if arch else None)
    return lb, kv


def _machines(spec: ServingSpec, file: str | None) -> dict[str, MachineModel]:
    arch = architecture(spec.model)
    layer_b, kv_b = _model_bytes(spec)
    c = spec.capacity
    out = {}
    for name, mc in spec.machines.items():
        gpu = catalog.gpus().get(mc.gpu, field=f"machines.{name}.gpu", file=file) if mc.gpu else None
        memory = mc.memory if mc.memory is not None else (mc.gpus * gpu.memory_bytes if gpu else None)
        prof = None
        if mc.profile is not None:
            prof = Path(mc.profile)
            if file is not None and not prof.is_absolute():
                prof = Path(file).parent / prof
        times = None
        try:
            if prof is not None or (gpu is not None and arch is not None):
                times = capacity.layer_times(arch, gpu, mc.gpus,
                                             compute_efficiency=c.compute_efficiency,
                                             memory_efficiency=c.memory_efficiency,
                                             profile_dir=prof)
        except SpecError as exc:
            raise exc.located(None, f"machines.{name}.profile") from None
        if mc.tokens_per_s is not None:
            out[name] = MachineModel(int(mc.max_layers), list(mc.tokens_per_s), times, memory)
            continue
        missing = [what for what, v in (("a catalog model (model.name) or model.layer_bytes and "
                                         "model.kv_bytes", layer_b and kv_b),
                                        ("'profile' or a catalog 'gpu'", times),
                                        ("'memory' or a catalog 'gpu'", memory)) if not v]
        if missing:
            raise SpecError("a machine without a tokens_per_s table needs " + " and ".join(missing)
                            + " to compute it from", file=file, field=f"machines.{name}")
        kmax, T = capacity.table(times, memory=memory, layer_bytes=layer_b, kvb=kv_b,
                                 capacity=c, batch=mc.batch)
        if kmax == 0:
            raise SpecError("not even one layer's weights fit in this machine's memory share",
                            file=file, field=f"machines.{name}",
                            allowed="a larger GPU, more GPUs per node, or a larger "
                                    "capacity.weights_fraction")
        out[name] = MachineModel(kmax, T, times, memory)
    return out


def _coordinator_region(spec: ServingSpec, regions: list[str], file: str | None) -> str:
    """The coordinator's region: as given, which must be a region of the nodes; unsaid, the
    nodes' one region, or when they are in several, ``default`` (the region of nodes that name
    none; without such nodes every node reaches the coordinator by ``between``)."""
    known = list(dict.fromkeys(regions))
    if "region" in spec.coordinator.model_fields_set:
        region = spec.coordinator.region
        if region not in known:
            raise SpecError("no node is in this region", file=file, field="coordinator.region",
                            value=region, allowed=", ".join(known),
                            suggestion=close_match(region, known))
        return region
    return known[0] if len(known) == 1 else spec.coordinator.region


def build_cluster(spec: ServingSpec, file: str | None = None) -> Cluster:
    nodes = _nodes(spec, file)
    home = _coordinator_region(spec, list(nodes.regions), file)
    seen: set[str] = set()
    for nm in nodes.names:
        if nm in seen or nm == COORDINATOR:
            raise SpecError("node names must be unique and not 'coordinator'", file=file,
                            field="nodes", value=nm)
        seen.add(nm)
    try:
        layers, act = resolved(spec.model)
    except SpecError as exc:
        raise exc.located(file) from None
    tok = spec.model.token_bytes
    mm = _machines(spec, file)
    layer_b, kv_b = _model_bytes(spec)
    machines = nodes.machines
    kmax = np.array([mm[m].kmax for m in machines], dtype=np.int64)
    T = _capacities(spec, mm, machines, kmax, act)
    links = _mesh(spec.links, nodes.regions, home)
    _pair_links(spec.links, nodes.names, links, file)
    bw, lat, cbw, clat = links
    co = spec.coordinator
    return Cluster(
        layers=layers, names=nodes.names, machines=machines,
        regions=nodes.regions, T=T, kmax=kmax, S=bw / (act + tok), src=cbw / tok,
        snk=cbw / tok, lat=lat, src_lat=clat, snk_lat=clat.copy(),
        src_total=co.nic_out / tok if co.nic_out else np.inf,
        snk_total=co.nic_in / tok if co.nic_in else np.inf,
        token_bytes=tok, activation_bytes=act, partial=spec.partial_inference,
        times=tuple(mm[m].times for m in machines),
        memory=np.array([mm[m].memory_bytes or np.nan for m in machines]),
        layer_bytes=layer_b, kv_bytes=kv_b,
        batch=tuple(spec.machines[m].batch for m in machines), host_cores=spec.host_cores,
        host_share=tuple(spec.host_share) if spec.host_share else None, wake=spec.wake,
        hosts=nodes.hosts, coordinator_address=co.address)


@dataclass(frozen=True)
class _Nodes:
    """Node i of the spec's groups: its name, machine type, region and host."""

    names: tuple[str, ...]
    machines: tuple[str, ...]
    regions: tuple[str, ...]
    hosts: tuple[str | None, ...]


def _nodes(spec: ServingSpec, file: str | None) -> _Nodes:
    names: list[str] = []
    machines: list[str] = []
    regions: list[str] = []
    hosts: list[str | None] = []
    for gi, g in enumerate(spec.nodes):
        if g.machine not in spec.machines:
            raise SpecError("unknown machine type", file=file, field=f"nodes.{gi}.machine",
                            value=g.machine, allowed=", ".join(sorted(spec.machines)))
        base = g.name or g.machine
        for c in range(g.count):
            names.append(base if g.count == 1 and g.name else f"{base}-{c}")
            machines.append(g.machine)
            regions.append(g.region)
            hosts.append(g.host)
    return _Nodes(tuple(names), tuple(machines), tuple(regions), tuple(hosts))


def _capacities(spec: ServingSpec, mm: dict[str, MachineModel], machines: tuple[str, ...],
                kmax: np.ndarray, act: float) -> np.ndarray:
    """T[i, k]: tokens/s of node i holding k layers (0 beyond its most, ``kmax[i]``), no more
    than its NICs carry (``act`` bytes of activations per token)."""
    T = np.zeros((len(machines), int(kmax.max()) + 1))
    for i, m in enumerate(machines):
        mc = spec.machines[m]
        row = np.asarray(mm[m].T, dtype=float)
        for nic in (mc.nic_in, mc.nic_out):  # a node passes on no more than its NIC carries
            if nic is not None:
                row = np.minimum(row, nic / act)
        T[i, 1:len(row) + 1] = row
    return T


class _Links(NamedTuple):
    """Per pair of nodes, bytes/s and latency of their link (0: none); per node, those of its
    link to the coordinator."""

    bw: np.ndarray
    lat: np.ndarray
    cbw: np.ndarray
    clat: np.ndarray


def _mesh(lk: LinksSpec, regions: tuple[str, ...], home: str) -> _Links:
    """The links of the link classes: ``within`` a region and ``between`` regions, and to the
    coordinator (in region ``home``) ``coordinator`` or by the same classes."""
    n = len(regions)
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    cbw = np.zeros(n)
    clat = np.zeros(n)
    if lk.mesh:
        for i in range(n):
            same = np.array([regions[j] == regions[i] for j in range(n)])
            for cls, mask in ((lk.within, same), (lk.between, ~same)):
                if cls is not None:
                    sel = mask.copy()
                    sel[i] = False
                    bw[i, sel], lat[i, sel] = cls.bandwidth, cls.latency
            cc = lk.coordinator or (lk.within if regions[i] == home else lk.between)
            if cc is not None:
                cbw[i], clat[i] = cc.bandwidth, cc.latency
    return _Links(bw, lat, cbw, clat)


def _pair_links(lk: LinksSpec, names: tuple[str, ...], links: _Links, file: str | None) -> None:
    """The links the spec gives pair by pair, over those of the classes in ``links``."""
    pos = {nm: i for i, nm in enumerate(names)}
    for pi, p in enumerate(lk.pairs):
        ends = []
        for side, nm in (("a", p.a), ("b", p.b)):
            if nm != COORDINATOR and nm not in pos:
                raise SpecError("link to an unknown node", file=file, field=f"links.pairs.{pi}.{side}",
                                value=nm, allowed="a node name or 'coordinator'")
            ends.append(nm)
        a, b = ends
        if a == b:
            raise SpecError("a link needs two different ends", file=file,
                            field=f"links.pairs.{pi}", value=a)
        if COORDINATOR in (a, b):
            i = pos[b if a == COORDINATOR else a]
            links.cbw[i], links.clat[i] = p.bandwidth, p.latency
        else:
            i, j = pos[a], pos[b]
            links.bw[i, j] = links.bw[j, i] = p.bandwidth
            links.lat[i, j] = links.lat[j, i] = p.latency
