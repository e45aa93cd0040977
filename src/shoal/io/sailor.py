"""Import Sailor's inputs (training config, cluster config, profiles, network curves, availability
traces, plan files) as a shoal scenario, profile and plan, so a Sailor user migrates in one command.

Formats are those of Sailor's public artifact (eth-easl/sailor): see ``docs/import-sailor.md``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

from shoal import catalog
from shoal.errors import SpecError
from shoal.files import make_folder, read_json, read_text
from shoal.profiles.compute import PROFILE_SCHEMA
from shoal.specs.plan import TrainingPlan
from shoal.specs.scenario import parse_scenario

_NETWORK_FILES = ("network_coeffs_all_homo.json", "multizone_bandwidths_het.json",
                  "multizone_bandwidths.json")


def _gpu(name: str, file: Path, field: str) -> str:
    return catalog.gpus().canonical(name, field=field, file=str(file))


def region_of(zone: str) -> str:
    """GCP-style zone 'us-central1-a' -> region 'us-central1'."""
    return zone.rsplit("-", 1)[0] if zone.count("-") >= 2 else zone


def model_from_training_config(cfg: dict, file: Path) -> dict:
    try:
        return _model_from_training_config(cfg, file)
    except (TypeError, ValueError) as exc:
        raise SpecError(f"malformed training config ({exc})", file=str(file),
                        allowed="integers for hidden_size, num_layers, heads, vocab_size") from None


def _model_from_training_config(cfg: dict, file: Path) -> dict:
    need = ("hidden_size", "num_layers", "heads", "vocab_size")
    for k in need:
        if k not in cfg:
            raise SpecError("missing field", file=str(file), field=k)
    out = {
        "name": cfg.get("model", "sailor-model"),
        "num_layers": int(cfg["num_layers"]),
        "hidden_size": int(cfg["hidden_size"]),
        "num_heads": int(cfg["heads"]),
        "vocab_size": int(cfg["vocab_size"]),
        "max_seq_len": int(cfg.get("max_position_embeddings", cfg.get("sequence_length", 2048))),
        "mlp": "gelu",
        "norm": "layernorm",
        "position": "learned",
        # Sailor's runs train GPT-style models as Megatron-LM does, whose hidden and attention
        # dropout default to 0.1 (its masks are kept for the backward pass)
        "dropout": 0.1,
        "source": f"Sailor training config {file.name}",
    }
    if cfg.get("head_dim") and int(cfg["head_dim"]) * out["num_heads"] != out["hidden_size"]:
        out["head_dim"] = int(cfg["head_dim"])
    n_all = cfg.get("num_all_layers")
    if n_all is not None and int(n_all) != out["num_layers"] + 2:
        raise SpecError("num_all_layers must be num_layers + 2 (embedding and head)",
                        file=str(file), field="num_all_layers", value=n_all)
    return out


def convert_profiles(profile_dir: Path, n_layers: int, model: str,
                     model_spec: dict | None = None) -> tuple[dict, list[str]]:
    """Sailor ``<dir>/<GPU>/profile.json`` -> one shoal profile; returns (profile, skipped notes)."""
    if not profile_dir.is_dir():
        raise SpecError("profiles directory not found", file=str(profile_dir))
    gpus: dict[str, dict] = {}
    skipped = []
    for f in sorted(profile_dir.glob("*/profile.json")):
        g = _gpu(f.parent.name, f, "directory name")
        data = read_json(f)
        per_tp: dict[str, dict] = {}
        for mbs, tps in data.items():
            for tp, layers in tps.items():
                if len(layers) != n_layers:
                    skipped.append(f"{f}: mbs {mbs} TP {tp} has {len(layers)} layers, model has "
                                   f"{n_layers}")
                    continue
                rows = [list(map(float, layers[str(i)])) for i in range(n_layers)]
                per_tp.setdefault(str(int(tp)), {})[str(int(mbs))] = rows
        if per_tp:
            gpus[g] = per_tp
    if not gpus:
        raise SpecError(f"no usable profile for a model of {n_layers} layers", file=str(profile_dir))
    return ({"schema": PROFILE_SCHEMA, "model": model, "n_layers": n_layers,
             "units": "seconds per microbatch: [forward, backward, update] per layer",
             "source": f"Sailor measured profiles from {profile_dir}", "gpus": gpus}
            | ({"model_spec": model_spec} if model_spec else {}), skipped)


def _curve(entry, file: Path) -> dict:
    try:
        (a, b, c), mx = entry
    except (TypeError, ValueError):
        raise SpecError("expected [[a, b, c], max_bandwidth]", file=str(file), value=entry) from None
    return {"kind": "poly-log2", "coeffs": [float(a), float(b), float(c)], "max": float(mx)}


def _link(per_n: dict, file: Path) -> dict:
    """{n: [[a,b,c], max]} -> a LinkSpec mapping: n=1 is the single flow, others aggregate."""
    ns = sorted(int(n) for n in per_n)
    single = per_n.get("1", per_n[str(ns[0])])
    return {"curve": _curve(single, file),
            "parallel": {int(n): _curve(per_n[str(n)], file) for n in ns if n > 1}}


def convert_network(network_dir: Path, pool_pairs: list[tuple[str, str]]) -> dict:
    """Sailor's fitted curves -> shoal network spec covering every two (GPU, zone) pairs of
    the pool."""
    zones = sorted({z for _, z in pool_pairs})
    gpus = sorted({g for g, _ in pool_pairs})
    if not network_dir.is_dir():
        raise SpecError("network directory not found", file=str(network_dir))
    sailor_name = {}
    links: dict[tuple, dict] = {}
    homo = network_dir / "network_coeffs_all_homo.json"
    net: dict = {"links": [], "intra_node": {}}
    if homo.exists():
        data = read_json(homo)
        for g_s, per_n in data.get("inter", {}).items():
            g = _gpu(g_s, homo, f"inter.{g_s}")
            sailor_name[g] = g_s
            if g in gpus:
                for z in zones:
                    links[(z, z, g, g)] = _link(per_n, homo)
        for g_s, per_n in data.get("intra", {}).items():
            g = _gpu(g_s, homo, f"intra.{g_s}")
            if g in gpus:
                net["intra_node"][g] = _link(per_n, homo)
    for name in ("multizone_bandwidths_het.json", "multizone_bandwidths.json"):
        f = network_dir / name
        if not f.exists():
            continue
        data = read_json(f)
        for za, per_g in data.items():
            for ga_s, per_n in per_g.items():
                ga = _gpu(ga_s, f, f"{za}.{ga_s}")
                for n, per_z in per_n.items():
                    for zb, per_gb in per_z.items():
                        for gb_s, per_nb in per_gb.items():
                            gb = _gpu(gb_s, f, f"{za}.{ga_s}.{n}.{zb}.{gb_s}")
                            if za not in zones or zb not in zones or ga not in gpus or gb not in gpus:
                                continue
                            key = (za, zb, ga, gb) if (za, ga) <= (zb, gb) else (zb, za, gb, ga)
                            if key in links and links[key].get("_from") != name:
                                continue  # the homogeneous file or an earlier file wins
                            entry = links.setdefault(key, {"_from": name, "per_n": {}})
                            if n in per_nb:
                                entry["per_n"][n] = per_nb[n]
    for (za, zb, ga, gb), spec in sorted(links.items()):
        if "per_n" in spec:
            if not spec["per_n"]:
                continue
            spec = _link(spec["per_n"], network_dir)
        net["links"].append({"zones": [za, zb], "gpus": [ga, gb], **spec})
    egress = network_dir / "gcp_egress_usd_per_gb.json"
    if egress.exists():
        data = read_json(egress)
        pairs = []
        for za, per in data.items():
            for zb, p in per.items():
                if za < zb and za in zones and zb in zones:
                    pairs.append([za, zb, float(p)])
        net["egress_usd_per_gb"] = {"pairs": pairs}
    _check_coverage(net, sorted(pool_pairs), network_dir)
    return net


def _check_coverage(net: dict, pairs: list[tuple[str, str]], where: Path) -> None:
    """Every two (GPU, zone) pairs of the pool have a curve between them."""
    have = {(frozenset(link["zones"]), frozenset(link["gpus"])) for link in net["links"]}
    for i, (ga, za) in enumerate(pairs):
        for gb, zb in pairs[i:]:
            if (frozenset((za, zb)), frozenset((ga, gb))) not in have:
                raise SpecError(
                    f"no network curve between {ga} in {za} and {gb} in {zb}",
                    file=str(where),
                    allowed=f"one of {', '.join(_NETWORK_FILES)} covering that pair")


def read_trace_row(path: Path, step: int) -> dict[tuple[str, str], int]:
    """One availability state of a Sailor CSV trace: (gpu, zone) -> count."""
    rows = list(csv.reader(read_text(path, "trace", "a UTF-8 CSV trace").splitlines()))
    if rows and ("Timestamp" not in rows[0] or not any("_" in c for c in rows[0])):
        raise SpecError("not a CSV availability trace", file=str(path),
                        allowed="a header ',Timestamp,<GPU>_<zone>,...' (JSON controller traces "
                                "are not pools)")
    if len(rows) < 2:
        raise SpecError("trace has no rows", file=str(path))
    header, body = rows[0], rows[1:]
    if not 0 <= step < len(body):
        raise SpecError("no such step", file=str(path), field="--step", value=step,
                        allowed=f"0..{len(body) - 1}")
    out = {}
    for col, val in zip(header, body[step], strict=False):
        if "_" not in col:
            continue
        g_s, zone = col.split("_", 1)
        try:
            n = float(val)
        except ValueError:
            n = -1.0
        if n < 0 or n != int(n):
            raise SpecError("expected a GPU count (a whole number >= 0)", file=str(path),
                            field=f"line {step + 2}, column {col}", value=val)
        out[(_gpu(g_s, path, col), zone)] = int(n)
    return out


def convert_plan(plan_cfg: dict, file: Path, n_layers: int) -> tuple[dict, dict, dict]:
    """Sailor ``plan_config_*.json`` -> (shoal plan, pool counts, job overrides)."""
    try:
        return _convert_plan(plan_cfg, file, n_layers)
    except SpecError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise SpecError(f"not a Sailor plan file ({type(exc).__name__}: {exc})", file=str(file),
                        allowed="pipeline_list[0] with layers_per_stage, tmp_per_stage, dp; "
                                "positive mbs and gbs") from None


def _convert_plan(plan_cfg: dict, file: Path, n_layers: int) -> tuple[dict, dict, dict]:
    try:
        pl = plan_cfg["pipeline_list"][0]
        mbs, gbs = int(plan_cfg["mbs"]), int(plan_cfg["gbs"])
        if mbs <= 0 or gbs <= 0:
            raise ValueError("mbs and gbs must be positive")
    except (KeyError, IndexError, TypeError) as exc:
        raise SpecError(f"not a Sailor plan file (missing {exc})", file=str(file)) from None
    counts = [len(x) for x in pl["layers_per_stage"]]
    if sum(counts) != n_layers:
        raise SpecError("layers_per_stage does not cover the model", file=str(file),
                        field="pipeline_list.0.layers_per_stage", value=sum(counts),
                        allowed=f"{n_layers} layers in all")
    stages, pool, start = [], {}, 0
    for i, (n, reps, dp) in enumerate(zip(counts, pl["tmp_per_stage"], pl["dp"], strict=True)):
        if len(reps) != dp:
            raise SpecError("dp does not match the replicas listed", file=str(file),
                            field=f"pipeline_list.0.dp.{i}", value=dp, allowed=str(len(reps)))
        if gbs % (mbs * dp):
            raise SpecError("gbs must split evenly over dp pipelines of mbs-sized microbatches",
                            file=str(file), field="gbs", value=gbs,
                            allowed=f"a multiple of mbs x dp = {mbs * dp}")
        replicas = []
        for j, rep in enumerate(reps):
            try:
                (gpu_s, tp, zone), = rep[0]
            except (TypeError, ValueError):
                raise SpecError("expected [[[gpu, tp, zone]], tp]", file=str(file),
                                field=f"pipeline_list.0.tmp_per_stage.{i}.{j}", value=rep) from None
            g = _gpu(gpu_s, file, f"pipeline_list.0.tmp_per_stage.{i}.{j}")
            replicas.append({"gpu": g, "tp": int(tp), "zone": zone,
                             "microbatches": gbs // (mbs * dp)})
            pool[(g, zone)] = pool.get((g, zone), 0) + int(tp)
        stages.append({"layers": [start, start + n], "replicas": replicas})
        start += n
    plan = {"schema": "shoal/training-plan@1", "microbatch_size": mbs, "schedule": "1f1b",
            "recompute": False, "zero_stage": 0, "stages": stages}
    return plan, pool, {"global_batch": gbs}


@dataclass(frozen=True)
class SailorFiles:
    """Sailor's files to import: its training config (the model and job) and, each optional,
    its cluster config (GPUs per node), measured profiles (a directory of
    ``<GPU>/profile.json``), fitted network curves (a directory), an availability trace and
    the row of it that is the pool (``step``, default 0), a plan file (the pool: its GPUs),
    and profiles measured on another model with that model's training config
    (``transfer_profiles``, ``transfer_training_config``)."""

    training_config: Path
    cluster_config: Path | None = None
    profiles: Path | None = None
    network: Path | None = None
    trace: Path | None = None
    step: int | None = None
    plan: Path | None = None
    transfer_profiles: Path | None = None
    transfer_training_config: Path | None = None


def import_sailor(files: SailorFiles, out_dir: Path) -> dict[str, Path]:
    """Write ``scenario.yaml`` (+ ``profile.json``, ``plan.json``) into ``out_dir``; returns paths.

    Everything is built in memory and checked before anything is written, so a failure leaves
    no half-written output.
    """
    tcfg = read_json(files.training_config)
    model = model_from_training_config(tcfg, files.training_config)
    n_layers = model["num_layers"] + 2
    job = _job(tcfg, files.training_config)
    plan_doc, pool_counts = _pool_counts(files, n_layers, job)
    gpus_per_node = ({} if files.cluster_config is None
                     else _gpus_per_node(files.cluster_config))
    used_gpus = sorted({g for (g, _) in pool_counts})
    regions: dict[str, dict] = {}
    for (g, z), n in sorted(pool_counts.items()):
        regions.setdefault(region_of(z), {"zones": {}})["zones"].setdefault(z, {"gpus": {}})
        regions[region_of(z)]["zones"][z]["gpus"][g] = n
    scenario: dict = {
        "schema": "shoal/scenario@1",
        "name": f"{model['name']} imported from Sailor",
        "model": model, "job": job,
        "pool": {"regions": regions,
                 "gpus_per_node": {g: n for g, n in gpus_per_node.items() if g in used_gpus}},
    }
    if files.network is not None:
        scenario["network"] = convert_network(files.network, sorted(pool_counts))
    docs = _profiles(files, scenario, model, n_layers)
    parse_scenario(scenario, file=str(out_dir / "scenario.yaml"))  # check before writing
    if plan_doc is not None:
        TrainingPlan.model_validate(plan_doc)
        docs["plan.json"] = plan_doc
    return _write(out_dir, scenario, docs)


def _job(tcfg: dict, training_config: Path) -> dict:
    """The scenario's job from a Sailor training config."""
    optimizer = str(tcfg.get("optimizer", "adam")).lower()
    if optimizer not in ("adam", "adamw", "sgd"):
        raise SpecError("unsupported optimizer", file=str(training_config), field="optimizer",
                        value=tcfg.get("optimizer"), allowed="Adam, AdamW, SGD")
    try:
        return {"global_batch": int(tcfg.get("global_batch_size", 1)),
                "seq_len": int(tcfg.get("sequence_length", 2048)),
                "optimizer": optimizer, "precision": "mixed-fp16",
                # the constants fitted to the runs of Sailor's own training software
                "stack": "sailor-testbed"}
    except (TypeError, ValueError):
        raise SpecError("expected integers", file=str(training_config),
                        field="global_batch_size / sequence_length") from None


def _pool_counts(files: SailorFiles, n_layers: int,
                 job: dict) -> tuple[dict | None, dict[tuple[str, str], int]]:
    """(the plan file's plan, or None; GPUs per (GPU type, zone) of the pool): the trace's
    row, else the plan's GPUs (whose job settings go into ``job``)."""
    pool_counts: dict[tuple[str, str], int] = {}
    plan_doc = None
    if files.plan is not None:
        plan_doc, pool_counts, over = convert_plan(read_json(files.plan), files.plan, n_layers)
        job.update(over)
    if files.trace is not None:
        pool_counts = read_trace_row(files.trace, files.step or 0)
    if not pool_counts:
        raise SpecError("the pool is unknown: give --plan (pool = its GPUs) or --trace with --step")
    return plan_doc, pool_counts


def _gpus_per_node(cluster_config: Path) -> dict[str, int]:
    """GPUs per node of each GPU type of a Sailor cluster config."""
    out = {}
    cc = read_json(cluster_config)
    for k, v in cc.items() if isinstance(cc, dict) else ():
        if isinstance(v, dict) and "gpus_per_node" in v:
            out[_gpu(k, cluster_config, k)] = int(v["gpus_per_node"])
    if not out:
        raise SpecError("not a Sailor cluster config: no GPU entry with gpus_per_node",
                        file=str(cluster_config),
                        allowed='{"<GPU>": {"gpus_per_node": N, ...}, ...} '
                                "(configs/basic_cluster_config.json)")
    return out


def _profiles(files: SailorFiles, scenario: dict, model: dict, n_layers: int) -> dict[str, object]:
    """The profile documents to write beside the scenario (measured profiles, and profiles
    measured on another model to transfer from), named in its ``profiles`` section."""
    docs: dict[str, object] = {}
    if files.profiles is not None:
        prof, _ = convert_profiles(files.profiles, n_layers, model["name"], model)
        docs["profile.json"] = prof
        scenario["profiles"] = {"compute": "profile.json"}
    if files.transfer_profiles is not None:
        if files.transfer_training_config is None:
            raise SpecError("--transfer-profiles needs --transfer-training-config: the training "
                            "config of the model those profiles were measured on")
        pmodel = model_from_training_config(read_json(files.transfer_training_config),
                                            files.transfer_training_config)
        prof, _ = convert_profiles(files.transfer_profiles, pmodel["num_layers"] + 2,
                                   pmodel["name"], pmodel)
        docs["transfer_profile.json"] = prof
        scenario.setdefault("profiles", {})["transfer_from"] = "transfer_profile.json"
    return docs


def _write(out_dir: Path, scenario: dict, docs: dict[str, object]) -> dict[str, Path]:
    """``scenario.yaml`` and the JSON ``docs`` in ``out_dir``, each written whole (to a
    temporary file first); their paths."""
    import yaml

    make_folder(out_dir)
    written = {}
    tmp = out_dir / "scenario.yaml.tmp"
    tmp.write_text(yaml.safe_dump(scenario, sort_keys=False))
    for name, doc in docs.items():
        t = out_dir / (name + ".tmp")
        t.write_text(json.dumps(doc, indent=1))
    for name in ["scenario.yaml", *docs]:
        (out_dir / (name + ".tmp")).replace(out_dir / name)
        written[name] = out_dir / name
    return written
