"""A serving placement: per node a half-open range of layers (or none), and the file format."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shoal.errors import SpecError
from shoal.files import read_json
from shoal.serving.cluster import Cluster

PLACEMENT_SCHEMA = "shoal/serving-placement@1"


@dataclass(frozen=True)
class Placement:
    """``ranges[i]``: the layers ``[start, end)`` node i holds, or None when it holds none."""

    ranges: tuple[tuple[int, int] | None, ...]

    def check(self, cluster: Cluster) -> None:
        """Raise SpecError unless every range is inside the model and within its node's limit."""
        if len(self.ranges) != cluster.n:
            raise SpecError(f"the placement has {len(self.ranges)} nodes, the cluster {cluster.n}")
        for i, r in enumerate(self.ranges):
            if r is None:
                continue
            s, e = r
            if not (0 <= s < e <= cluster.layers):
                raise SpecError("layer range outside the model", field=f"nodes.{cluster.names[i]}",
                                value=[s, e], allowed=f"0 <= start < end <= {cluster.layers}")
            if e - s > cluster.kmax[i]:
                raise SpecError("more layers than the node may hold",
                                field=f"nodes.{cluster.names[i]}", value=e - s,
                                allowed=f"at most {int(cluster.kmax[i])}")

    def uncovered(self, cluster: Cluster) -> list[tuple[int, int]]:
        """The layer ranges [start, end) no node holds: while there are any, no request
        can pass every layer, and the max flow is 0."""
        held = np.zeros(cluster.layers + 1, dtype=np.int64)
        for r in self.ranges:
            if r is not None:
                held[r[0]] += 1
                held[r[1]] -= 1
        bare = np.cumsum(held[:-1]) == 0
        edges = np.flatnonzero(np.diff(np.concatenate([[0], bare.astype(np.int8), [0]])))
        return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]

    def uncovered_text(self, cluster: Cluster) -> str:
        """``uncovered`` as "[a, b), [c, d)" ("" when every layer is held)."""
        return ", ".join(f"[{a}, {b})" for a, b in self.uncovered(cluster))

    def to_json(self, cluster: Cluster) -> dict:
        return {"schema": PLACEMENT_SCHEMA, "layers": cluster.layers, "nodes": [
            {"name": cluster.names[i], "gpu": cluster.machines[i], "layers": list(r)}
            for i, r in enumerate(self.ranges) if r is not None]}


def placement_from_json(doc: dict, cluster: Cluster, file: str | None = None) -> Placement:
    """A placement from its JSON form (nodes absent from the file hold no layers)."""
    nodes = doc.get("nodes")
    if not isinstance(nodes, list):
        raise SpecError("expected 'nodes': a list of {name, layers: [start, end]}", file=file)
    ranges: list[tuple[int, int] | None] = [None] * cluster.n
    for k, nd in enumerate(nodes):
        try:
            i = cluster.index(nd["name"])
            s, e = (int(x) for x in nd["layers"])
        except SpecError as exc:
            raise exc.located(file, f"nodes.{k}.name") from None
        except (KeyError, TypeError, ValueError):
            raise SpecError("expected {name, layers: [start, end]}", file=file,
                            field=f"nodes.{k}") from None
        if ranges[i] is not None:
            raise SpecError("node listed twice", file=file, field=f"nodes.{k}", value=nd["name"])
        ranges[i] = (s, e)
    pl = Placement(tuple(ranges))
    try:
        pl.check(cluster)
    except SpecError as exc:
        raise exc.located(file) from None
    return pl


def load_placement(path: str | Path, cluster: Cluster) -> Placement:
    return placement_from_json(read_json(path, "placement file"), cluster, file=str(path))
