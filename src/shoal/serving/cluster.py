"""A serving spec resolved into the arrays placement and routing work on: per node its capacity
table T(k) and layer limit, per pair of nodes the tokens/s their link carries (Helix §4.3)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shoal.errors import SpecError
from shoal.serving.spec import COORDINATOR, ServingSpec


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
                            allowed=", ".join(self.names[:8]) + (" ..." if self.n > 8 else "")) \
                from None


def _tables(spec: ServingSpec, file: str | None) -> dict[str, tuple[int, list[float]]]:
    """Per machine type: (max layers, T(k) for k = 1 .. max layers)."""
    from pathlib import Path

    from shoal import catalog
    from shoal.serving import capacity

    out = {}
    arch = None
    for name, mc in spec.machines.items():
        if mc.tokens_per_s is not None:
            out[name] = (int(mc.max_layers), list(mc.tokens_per_s))
            continue
        if arch is None:
            arch = spec.model.architecture()
            if arch is None:
                raise SpecError("a machine without a tokens_per_s table needs a catalog model "
                                "to compute it from", file=file, field="model.name",
                                value=spec.model.name, allowed="a catalog model "
                                "(`shoal catalog models`), or tables for every machine")
        gpu = catalog.gpus().get(mc.gpu, field=f"machines.{name}.gpu", file=file)
        prof = None
        if mc.profile is not None:
            prof = Path(mc.profile)
            if file is not None and not prof.is_absolute():
                prof = Path(file).parent / prof
        c = spec.capacity
        try:
            out[name] = capacity.table(
                arch, gpu, mc.gpus, weights_fraction=c.weights_fraction,
                prompt_tokens=c.prompt_tokens, output_tokens=c.output_tokens,
                max_batch=c.max_batch, compute_efficiency=c.compute_efficiency,
                memory_efficiency=c.memory_efficiency, profile_dir=prof)
        except SpecError as exc:
            raise exc.located(None, f"machines.{name}.profile") from None
        if out[name][0] == 0:
            raise SpecError("not even one layer's weights fit in this machine's memory share",
                            file=file, field=f"machines.{name}",
                            allowed="a larger GPU, more GPUs per node, or a larger "
                                    "capacity.weights_fraction")
    return out


def build_cluster(spec: ServingSpec, file: str | None = None) -> Cluster:
    names: list[str] = []
    machines: list[str] = []
    regions: list[str] = []
    for gi, g in enumerate(spec.nodes):
        if g.machine not in spec.machines:
            raise SpecError("unknown machine type", file=file, field=f"nodes.{gi}.machine",
                            value=g.machine, allowed=", ".join(sorted(spec.machines)))
        base = g.name or g.machine
        for c in range(g.count):
            names.append(base if g.count == 1 and g.name else f"{base}-{c}")
            machines.append(g.machine)
            regions.append(g.region)
    seen: set[str] = set()
    for nm in names:
        if nm in seen or nm == COORDINATOR:
            raise SpecError("node names must be unique and not 'coordinator'", file=file,
                            field="nodes", value=nm)
        seen.add(nm)
    n = len(names)
    try:
        layers, act = spec.model.resolved()
    except SpecError as exc:
        raise exc.located(file) from None
    tok = spec.model.token_bytes
    tables = _tables(spec, file)
    kmax = np.array([tables[m][0] for m in machines], dtype=np.int64)
    T = np.zeros((n, int(kmax.max()) + 1))
    for i, m in enumerate(machines):
        mc = spec.machines[m]
        row = np.asarray(tables[m][1], dtype=float)
        for nic in (mc.nic_in, mc.nic_out):  # a node passes on no more than its NIC carries
            if nic is not None:
                row = np.minimum(row, nic / act)
        T[i, 1:len(row) + 1] = row
    bw = np.zeros((n, n))
    lat = np.zeros((n, n))
    cbw = np.zeros(n)
    clat = np.zeros(n)
    lk = spec.links
    if lk.mesh:
        for i in range(n):
            same = np.array([regions[j] == regions[i] for j in range(n)])
            for cls, mask in ((lk.within, same), (lk.between, ~same)):
                if cls is not None:
                    sel = mask.copy()
                    sel[i] = False
                    bw[i, sel], lat[i, sel] = cls.bandwidth, cls.latency
            cc = lk.coordinator or (lk.within if regions[i] == spec.coordinator.region
                                    else lk.between)
            if cc is not None:
                cbw[i], clat[i] = cc.bandwidth, cc.latency
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
            cbw[i], clat[i] = p.bandwidth, p.latency
        else:
            i, j = pos[a], pos[b]
            bw[i, j] = bw[j, i] = p.bandwidth
            lat[i, j] = lat[j, i] = p.latency
    co = spec.coordinator
    return Cluster(
        layers=layers, names=tuple(names), machines=tuple(machines),
        regions=tuple(regions), T=T, kmax=kmax, S=bw / (act + tok), src=cbw / tok,
        snk=cbw / tok, lat=lat, src_lat=clat, snk_lat=clat.copy(),
        src_total=co.nic_out / tok if co.nic_out else np.inf,
        snk_total=co.nic_in / tok if co.nic_in else np.inf,
        token_bytes=tok, activation_bytes=act, partial=spec.partial_inference)
