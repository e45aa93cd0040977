"""Links a scenario does not give, from the catalog: by the cloud the two zones are in, how far
apart they are (``catalog.DISTANCES``) and the GPUs at the two ends.

A flow between two nodes gets its GPU's share of the server's network (gpus.yaml
``node_network_bandwidth`` over ``nics_per_node``: one NIC per GPU on DGX-style servers, one
shared limit on a cloud VM), capped by the distance class's bandwidth where the cloud's
catalog entry has one (clouds.yaml ``network``); the latency is the class's. A class the
catalog has no number for has no default: the scenario must give that link.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from shoal import catalog
from shoal.catalog import GPU, LinkDefault
from shoal.errors import SpecError
from shoal.profiles.network import Link, curve_array


@dataclass(frozen=True)
class DefaultedLink:
    """A link taken from the catalog, as ``--json`` reports it (``network_defaults``)."""

    zones: tuple[str, str]
    gpus: tuple[str, ...]
    cloud: str
    distance: str
    bandwidth_Bps: float  # one flow at its largest
    latency_s: float
    nic_bound: bool  # the GPUs' NIC share sets the bandwidth (else the class's cap)
    source: str

    def to_json(self) -> dict:
        return {"kind": "link", "zones": list(self.zones), "gpus": list(self.gpus),
                "cloud": self.cloud, "distance": self.distance,
                "bandwidth_Bps": self.bandwidth_Bps, "latency_s": self.latency_s,
                "bandwidth_from": "nic" if self.nic_bound else "distance class",
                "source": self.source}


def intra_defaults(gpus: dict[str, GPU], given: set[str]) -> list[dict]:
    """The catalog's link inside a node of every GPU type the scenario's ``network.intra_node``
    does not give (``--json``'s ``network_defaults``, kind ``intra_node``)."""
    return [{"kind": "intra_node", "gpu": g, "bandwidth_Bps": gpus[g].intra_node_bw_Bps,
             "source": "gpus.yaml intra_node_bandwidth"}
            for g in sorted(gpus) if g not in given and g != "cpu"]


def distance(za: str, zb: str, zone_region: dict[str, str], region_geo: dict[str, str]) -> str:
    """How far apart two zones are: one zone, one region, one continent (geo; a region of no
    known geo counts as near, as for egress prices) or two continents."""
    if za == zb:
        return "same_zone"
    ra, rb = zone_region[za], zone_region[zb]
    if ra == rb:
        return "same_region"
    ga, gb = region_geo.get(ra), region_geo.get(rb)
    unknown = (None, "unknown")
    far = ga != gb and ga not in unknown and gb not in unknown
    return "intercontinental" if far else "same_continent"


def _nic(gpu: GPU | None) -> tuple[float, float] | None:
    """(one flow's share, the whole node's) of a GPU's server network; None: not in the
    catalog."""
    if gpu is None or gpu.node_nic_bw_Bps is None:
        return None
    return gpu.node_nic_bw_Bps / (gpu.nics_per_node or 1), gpu.node_nic_bw_Bps


def _capped(curve: np.ndarray, cap: float) -> np.ndarray:
    out = curve.copy()
    out[4] = min(out[4], cap)
    out[3] = min(out[3], out[4])
    return out


def _k_flows(single: np.ndarray, k: int, cap: float) -> np.ndarray:
    """The aggregate curve of k flows of one node, each as ``single`` gives a k-th of the bytes
    (the poly-log2 form shifted by log2 k and scaled by k), capped at ``cap``."""
    a, b, c, lo, hi = single
    s = math.log2(k)
    out = np.array([k * a, k * (b - 2 * a * s), k * (a * s * s - b * s + c), k * lo, k * hi])
    return _capped(out, cap)


class CatalogLinks:
    """The catalog's links between the zones of a pool, for the GPU types there; each link it
    gives is remembered in ``used`` (what ``estimate`` and ``plan`` report as defaulted)."""

    def __init__(self, gpus: dict[str, GPU], zone_region: dict[str, str],
                 region_geo: dict[str, str], cloud: str | None = None, file: str | None = None):
        self.gpus = gpus
        self.zone_region = zone_region
        self.region_geo = region_geo
        self.cloud = cloud
        self.file = file
        self.used: dict[tuple, DefaultedLink] = {}
        self._links: dict[tuple, Link] = {}

    def cloud_of(self, zone: str) -> str | None:
        """The cloud whose catalog lists the zone, else the scenario's ``network.cloud``."""
        return catalog.zone_cloud().get(zone, self.cloud)

    def link(self, za: str, zb: str, ga: str | None, gb: str | None, cls: str) -> Link:
        """The catalog's link between zones ``za`` and ``zb`` for GPU types ``ga`` and ``gb``
        (None: a zone without GPUs); ``cls`` is the scenario's link class it stands in for
        (named in the error when there is no default)."""
        key = (frozenset((za, zb)), frozenset((ga, gb)))
        if key in self._links:
            return self._links[key]
        cloud, dist, entry = self._entry(za, zb, cls)
        known = sorted({g for g in (ga, gb) if g})
        missing = [g for g in known if _nic(self.gpus.get(g)) is None]
        if entry.curve is None and (missing or not known):
            raise self._error(za, zb, cls, f"the catalog names no server network for {missing[0]}"
                              if missing else "a zone without GPUs has no NIC to go by")
        nics = {g: _nic(self.gpus[g]) for g in known if g not in missing}
        flow = min((n[0] for n in nics.values()), default=math.inf)
        single = (curve_array(entry.curve) if entry.curve is not None
                  else np.array([0.0, 0.0, flow / 1e9, flow, flow]))
        single = _capped(single, flow)
        parallel = {}
        for k in range(2, max((self.gpus[g].gpus_per_node for g in known), default=1) + 1):
            cap = min((min(k, self.gpus[g].nics_per_node or 1) * n[0] for g, n in nics.items()),
                      default=math.inf)
            if cap < k * single[4]:  # the node's NICs, not the flows, bound k of them
                parallel[k] = _k_flows(single, k, cap)
        link = Link(single=single, parallel=parallel, latency_s=entry.latency_s,
                    name=f"{cloud} {dist}")
        self._links[key] = link
        zones = (min(za, zb), max(za, zb))
        class_bw = math.inf if entry.curve is None else float(curve_array(entry.curve)[4])
        self.used[(zones, tuple(known))] = DefaultedLink(
            zones, tuple(known), cloud, dist, float(single[4]), entry.latency_s,
            flow <= class_bw, entry.source)
        return link

    def _entry(self, za: str, zb: str, cls: str) -> tuple[str, str, LinkDefault]:
        """(cloud, distance class, catalog entry) of a zone pair, or the SpecError saying why
        the catalog has none."""
        clouds = {self.cloud_of(za), self.cloud_of(zb)}
        dist = distance(za, zb, self.zone_region, self.region_geo)
        if None in clouds:
            zone = za if self.cloud_of(za) is None else zb
            raise self._error(za, zb, cls, f"zone {zone} is in no cloud of the catalog (network.cloud "
                              "names the cloud of such zones)")
        if len(clouds) > 1:
            raise self._error(za, zb, cls, f"the zones are in two clouds ({', '.join(sorted(clouds))})")
        cloud = clouds.pop()
        entry = catalog.network_defaults().get(cloud, {}).get(dist)
        if entry is None:
            raise self._error(za, zb, cls, f"the catalog has no published number for {cloud} "
                              f"{dist.replace('_', '-')} links")
        return cloud, dist, entry

    def _error(self, za: str, zb: str, cls: str, why: str) -> SpecError:
        return SpecError(f"no link between zones {za} and {zb}, and no catalog default: {why}",
                         file=self.file, field="network",
                         allowed=f"a network.links entry with zones [{za}, {zb}] or "
                                 f"network.defaults.{cls}")
