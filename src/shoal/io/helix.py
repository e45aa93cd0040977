"""Import Helix's inputs (cluster and machine INI files, node capacity tables, placement files)
as a shoal serving file and placement, and export placements in Helix's format.

Formats are those of Helix's public artifact (TheSys-lab/Helix-ASPLOS25), see
``docs/serving.md``. Units: Helix writes bandwidths as ``1000 * mbps`` with ``mbps = 1e6`` and
divides them by sizes in bytes, so ``1000 * mbps`` acts as 1e9 bytes/s; shoal reads them the same
way, so that flows match Helix's own numbers.
"""

from __future__ import annotations

import ast
import configparser
import math
import re
from pathlib import Path

from shoal.errors import SpecError
from shoal.files import read_json, read_text
from shoal.serving.cluster import Cluster
from shoal.serving.placement import Placement

# Helix's unit constants (simulator/event_simulator/utils.py); bandwidths act as bytes/s
_UNITS = {"bps": 1.0, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9, "B": 1.0, "KB": 1e3, "MB": 1e6,
          "GB": 1e9, "MilliSec": 1e-3, "Sec": 1.0, "MicroSec": 1e-6}
_EXPR = re.compile(r"^\s*([-+0-9.eE]+)\s*(?:\*\s*([A-Za-z]+))?\s*$")
# The engine's batch limits Helix's simulator gives each node type, per model (its model files,
# simulator/model_manager/llama2_70b/<type>/llama2_70b_<type>.py: prompt requests and tokens per
# batch; decode tokens per batch by layers held): the machines' ``batch`` on import
ENGINE_BATCH = {
    "llama-2-70b": {
        "A100": {"prompts": 3, "prompt_tokens": 6144, "decode": [480] * 9 + [450, 380, 300]},
        "L4": {"prompts": 1, "prompt_tokens": 2048, "decode": [380] * 6 + [280]},
        "T4": {"prompts": 1, "prompt_tokens": 2048, "decode": 300}}}


def _value(text: str, file: Path, field: str) -> float:
    m = _EXPR.match(text)
    try:
        if not m or (m.group(2) and m.group(2) not in _UNITS):
            raise ValueError
        v = float(m.group(1)) * (_UNITS[m.group(2)] if m.group(2) else 1.0)
        if not math.isfinite(v):
            raise ValueError
    except ValueError:
        raise SpecError("not a Helix quantity", file=str(file), field=field, value=text,
                        allowed="a finite number, optionally '* <unit>' with unit one of "
                                + ", ".join(_UNITS)) from None
    return v


def _capacity(file: Path, field: str, read, allowed: str):
    """``read()`` of a capacity file's entry, any failure to read it (a missing key, a value
    of the wrong type) a SpecError naming the file and the entry."""
    try:
        return read()
    except (KeyError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise SpecError(f"unreadable entry ({type(exc).__name__}: {exc})", file=str(file),
                        field=field, allowed=allowed) from None


def _ini(path: Path) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(inline_comment_prefixes=("#",))
    cp.optionxform = str  # keep the case of keys
    text = read_text(path, "file", "a UTF-8 INI file")
    try:
        cp.read_string(text, source=str(path))
    except configparser.Error as exc:
        raise SpecError(f"malformed INI file ({exc.message.splitlines()[0]})",
                        file=str(path)) from None
    return cp


def _get(cp: configparser.ConfigParser, section: str, key: str, file: Path) -> str:
    if not cp.has_section(section):
        raise SpecError("missing section", file=str(file), field=f"[{section}]")
    if not cp.has_option(section, key):
        raise SpecError("missing key", file=str(file), field=f"[{section}] {key}")
    return cp.get(section, key)


def read_cluster(path: Path) -> tuple[list[str], dict[tuple[str, str], tuple[float, float]]]:
    """(machine type per compute node, {(a, b): (bytes/s, latency s)}) with a, b node ids as
    strings or 'source' / 'sink'."""
    cp = _ini(path)
    try:
        n = int(_get(cp, "NodeNames", "total_compute_nodes", path))
    except ValueError:
        raise SpecError("expected an integer", file=str(path),
                        field="[NodeNames] total_compute_nodes") from None
    types = [_get(cp, f"ComputeNode-{i}", "type", path).strip() for i in range(n)]
    links: dict[tuple[str, str], tuple[float, float]] = {}
    ids = {str(i) for i in range(n)} | {"source", "sink"}
    for sec in cp.sections():
        if not sec.startswith("Link-"):
            continue
        parts = sec[len("Link-"):].split("-")
        if len(parts) != 2 or not set(parts) <= ids:
            raise SpecError("link between unknown nodes", file=str(path), field=f"[{sec}]",
                            allowed=f"node ids 0..{n - 1}, 'source', 'sink'")
        bw = _value(_get(cp, sec, "bandwidth", path), path, f"[{sec}] bandwidth")
        lat = _value(cp.get(sec, "latency", fallback="0"), path, f"[{sec}] latency")
        links[(parts[0], parts[1])] = (bw, lat)
    return types, links


def read_machines(path: Path) -> dict[str, dict[str, float]]:
    cp = _ini(path)
    out = {}
    for sec in cp.sections():
        row = {}
        for key in ("inbound_nic_speed", "outbound_nic_speed", "vram_size"):
            if not cp.has_option(sec, key):
                continue
            v = _value(cp.get(sec, key), path, f"[{sec}] {key}")
            if v == -1:
                continue  # Helix's "does not apply" (the source's inbound NIC, say)
            if v <= 0:
                raise SpecError("must be positive", file=str(path), field=f"[{sec}] {key}",
                                value=cp.get(sec, key), allowed="a positive quantity, or -1 "
                                                                "where it does not apply")
            row[key] = v
        out[sec] = row
    return out


def _setting(cap: dict, cluster_file: Path, model: str | None, file: Path) -> tuple[str, dict]:
    settings = cap.get("settings") if isinstance(cap, dict) else None
    if not isinstance(settings, dict) or not all(isinstance(v, dict) and isinstance(
            v.get("model", {}), dict) for v in settings.values()):
        raise SpecError("expected 'settings': {name: {model: {...}, clusters: [...], "
                        "node_types: {...}}}", file=str(file), field="settings")
    match = [k for k, v in settings.items() if cluster_file.name in v.get("clusters", [])
             and (model is None or model.lower() in (k.lower(), str(v.get("model", {}).get("name",
                                                                                     "")).lower()))]
    if len(match) != 1:
        raise SpecError("cannot tell which capacity table to use" if match else
                        f"no capacity table for the cluster file {cluster_file.name}"
                        + (f" and --model {model}" if model is not None else ""),
                        file=str(file), field="--model" if model is not None else None,
                        value=model, allowed="--model one of " + ", ".join(
                            sorted({str(settings[k].get("model", {}).get("name")) for k in
                                    (match or settings)})))
    return match[0], settings[match[0]]


def _regions(n: int, links: dict[tuple[str, str], tuple[float, float]]) -> list[str]:
    """Nodes joined by links at least a tenth of the fastest link's bandwidth share a region."""
    fast = max((bw for bw, _ in links.values()), default=0.0)
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (a, b), (bw, _) in links.items():
        if a.isdigit() and b.isdigit() and bw >= 0.1 * fast:
            parent[root(int(a))] = root(int(b))
    label: dict[int, str] = {}
    return [label.setdefault(root(i), f"region-{len(label)}") for i in range(n)]


def import_helix(*, cluster: Path, machines: Path, capacity: Path, model: str | None = None,
                 partial_inference: bool = False, profiles: Path | None = None) -> dict:
    """A serving document (as for ``serving.yaml``) from Helix's cluster, machine profile and
    node capacity files; ``profiles``: a folder with one ``<type>/`` (lower case) per node type
    holding Helix's ``prompt_bs2time.csv`` and ``decode_bs2time.csv`` (the request simulator's
    layer times). When Helix's simulator has engine batch limits for this model and every node
    type (``ENGINE_BATCH``), the machines get them as their ``batch``."""
    types, links = read_cluster(cluster)
    nics = read_machines(machines)
    name, setting = _setting(read_json(capacity, "capacity file"), cluster, model, capacity)
    mdl = setting.get("model", {})
    node_types = setting.get("node_types", {})
    if not isinstance(node_types, dict):
        raise SpecError("expected {node type: {max_layers, tokens_per_s}}", file=str(capacity),
                        field=f"settings.{name}.node_types")
    mach = {}
    for t in sorted(set(types)):
        if t not in node_types:
            raise SpecError("node type without a capacity table", file=str(capacity),
                            field=f"settings.{name}.node_types", value=t,
                            allowed=", ".join(sorted(node_types)))
        nt = node_types[t]

        def table(nt=nt) -> dict:
            k = int(nt["max_layers"])
            if k < 1:
                raise ValueError(f"max_layers {k} < 1")
            return {"max_layers": k, "tokens_per_s": [float(nt["tokens_per_s"][str(j)])
                                                      for j in range(1, k + 1)]}

        row = _capacity(capacity, f"settings.{name}.node_types.{t}", table,
                        "max_layers (an integer >= 1) and tokens_per_s {'1': n, ..., "
                        "'<max_layers>': n}")
        prof = nics.get(t, {})
        if "vram_size" in prof:
            row["memory"] = prof["vram_size"]
        if "inbound_nic_speed" in prof:
            row["nic_in"] = prof["inbound_nic_speed"]
        if "outbound_nic_speed" in prof:
            row["nic_out"] = prof["outbound_nic_speed"]
        if profiles is not None:
            d = profiles / t.lower()
            if not (d / "prompt_bs2time.csv").is_file() or not (d / "decode_bs2time.csv").is_file():
                raise SpecError("node type without a profile", file=str(profiles), value=t,
                                allowed=f"a folder {t.lower()}/ with prompt_bs2time.csv and "
                                        "decode_bs2time.csv")
            row["profile"] = str(d.resolve())
        mach[t] = row
    # all node types or none (a cluster half on the defaults would match neither simulator)
    limits = ENGINE_BATCH.get(str(mdl.get("name", name)).lower(), {})
    if set(mach) <= set(limits):
        for t, row in mach.items():
            row["batch"] = limits[t]
    regions = _regions(len(types), links)
    pairs = []
    for (a, b), (bw, lat) in sorted(links.items()):
        ends = ["coordinator" if x in ("source", "sink") else f"n{x}" for x in (a, b)]
        pairs.append({"a": ends[0], "b": ends[1], "bandwidth": bw, "latency": lat})
    coord = {}
    if "outbound_nic_speed" in nics.get("SourceNode", {}):
        coord["nic_out"] = nics["SourceNode"]["outbound_nic_speed"]
    if "inbound_nic_speed" in nics.get("SinkNode", {}):
        coord["nic_in"] = nics["SinkNode"]["inbound_nic_speed"]
    return {
        "schema": "shoal/serving@1",
        "name": f"{cluster.stem} {mdl.get('name', name)}",
        "model": _capacity(capacity, f"settings.{name}.model", lambda: {
            "name": str(mdl.get("name", "model")), "layers": int(mdl["layers"]),
            "token_bytes": float(mdl.get("token_bytes", 2)),
            "activation_bytes": float(mdl["activation_bytes"])},
            "layers and activation_bytes (numbers), optionally name and token_bytes"),
        "machines": mach,
        "nodes": [{"name": f"n{i}", "machine": t, "region": regions[i]}
                  for i, t in enumerate(types)],
        "links": {"mesh": False, "pairs": pairs},
        "coordinator": coord,
        "partial_inference": partial_inference,
    }


def read_placement(path: Path, cluster: Cluster) -> Placement:
    """A Helix solution file (``[Solution] compute_node_<k> = [layer ids]``, numbered from
    ``[Settings] offset``): node k - offset is ``n<k - offset>`` in a cluster imported by
    ``import_helix``, else the node at that position (as ``write_placement`` numbers them)."""
    cp = _ini(path)
    try:
        offset = int(cp.get("Settings", "offset", fallback="0"))
    except ValueError:
        raise SpecError("expected an integer", file=str(path), field="[Settings] offset") from None
    if not cp.has_section("Solution"):
        raise SpecError("missing section", file=str(path), field="[Solution]")
    ranges: list[tuple[int, int] | None] = [None] * cluster.n
    ids = _helix_ids(cluster)
    for key, text in cp.items("Solution"):
        m = re.fullmatch(r"compute_node_(\d+)", key)
        if not m:
            raise SpecError("unexpected key", file=str(path), field=f"[Solution] {key}",
                            allowed="compute_node_<k>")
        try:
            layers = sorted(int(x) for x in ast.literal_eval(text))
        except (ValueError, SyntaxError, TypeError):
            raise SpecError("expected a list of layer ids", file=str(path),
                            field=f"[Solution] {key}", value=text) from None
        if not layers:
            continue
        if layers != list(range(layers[0], layers[-1] + 1)):
            raise SpecError("layers are not contiguous", file=str(path), field=f"[Solution] {key}")
        i = ids.get(int(m.group(1)) - offset)
        if i is None:
            raise SpecError("no such node", file=str(path), field=f"[Solution] {key}",
                            value=m.group(1), allowed=f"compute_node_<k>, k - offset one of "
                            f"{', '.join(map(str, sorted(ids)[:8]))}{' ...' if len(ids) > 8 else ''}")
        ranges[i] = (layers[0], layers[-1] + 1)
    pl = Placement(tuple(ranges))
    try:
        pl.check(cluster)
    except SpecError as exc:
        raise exc.located(str(path)) from None
    return pl


def write_placement(pl: Placement, cluster: Cluster, offset: int = 2) -> str:
    """The placement in Helix's solution format (nodes ``n<id>`` numbered from ``offset``)."""
    lines = ["[Settings]", f"offset={offset}", "", "[Solution]"]
    nid = {i: k for k, i in _helix_ids(cluster).items()}
    for i, r in enumerate(pl.ranges):
        if r is not None:
            lines.append(f"compute_node_{nid[i] + offset}={list(range(*r))}")
    return "\n".join(lines) + "\n"


def _helix_ids(cluster: Cluster) -> dict[int, int]:
    """Helix's node id -> node index: ``<id>`` for a node named ``n<id>`` (as ``import_helix``
    names them), else the node's position; a SpecError when two nodes get one id."""
    out: dict[int, int] = {}
    for i, nm in enumerate(cluster.names):
        k = int(nm[1:]) if nm[:1] == "n" and nm[1:].isdigit() else i
        if k in out:
            raise SpecError("two nodes get one Helix node id (nodes named n<id> and others "
                            "numbered by position)", field="nodes",
                            value=f"{cluster.names[out[k]]}, {nm}")
        out[k] = i
    return out
