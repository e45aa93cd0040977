"""Problem: a scenario resolved against the catalog, with its profile and network model.

This is what the estimator and every planner are given (DESIGN §3). Building it checks everything
that needs more than one field: GPU and model names, zones and links, profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from shoal import catalog
from shoal.catalog import GPU
from shoal.catalog.stacks import resolve_stack
from shoal.errors import SpecError, close_match
from shoal.profiles.analytic import AnalyticProfile, uses_flash
from shoal.profiles.compute import load_profile
from shoal.profiles.default_links import CatalogLinks, intra_defaults
from shoal.profiles.layers import LayerSizes, layer_sizes
from shoal.profiles.network import NetworkModel
from shoal.profiles.transfer import TransferProfile
from shoal.specs.hf import model_from_hf_config
from shoal.specs.job import Constraints, JobSpec
from shoal.specs.model import ModelSpec
from shoal.specs.scenario import HFModelRef, Scenario, load_scenario
from shoal.specs.stack import StackSpec
from shoal.specs.switching import SwitchingSpec


@dataclass(frozen=True)
class MemoryConstants:
    """A stack's constants of the memory model (``shoal.estimate.kernel.worker_memory``;
    ``shoal.specs.stack.StackMemory`` documents each). The defaults are the
    ``sailor-testbed`` stack's, fitted to the peak memory of Sailor's GH200 runs by
    ``benchmarks/validate_sailor.py --fit``."""

    framework_bytes: float = 4.20e9  # CUDA context, NCCL communicators, library workspaces
    state_factor: float = 1.265  # on weights + gradients + optimizer state (fp32 grad copies, buckets)
    activation_factor: float = 1.049  # allocator fragmentation and temporaries over stored activations
    comm_buffer_bytes_per_param: float = 2.0  # fp16 flat gradient buckets for the DP all-reduce
    mixed_state_bytes: tuple[float, float, float] = (2.0, 2.0, 12.0)  # weights, grads, optimizer
    logits_bytes: float = 8.0  # per logit, kept by the loss for the backward pass

    @classmethod
    def of(cls, stack: StackSpec) -> MemoryConstants:
        return cls(**stack.memory.model_dump())


@dataclass(frozen=True)
class TimeConstants:
    """A stack's constants of the time model (``shoal.estimate.kernel``;
    ``shoal.specs.stack.StackTiming`` documents each). The defaults are the ``sailor-testbed``
    stack's, fitted by ``benchmarks/validate_sailor.py --fit``."""

    compute_scale: float = 1.0  # multiplier on profiled layer times inside a running pipeline
    p2p_overhead_s: float = 1.77e-3  # per pipeline transfer: handshake and synchronisation
    p2p_scale: float = 1.96  # achieved / modelled time of a pipeline transfer
    recv_fraction: float = 0.507  # share of a transfer that also blocks the receiving stage
    sync_scale: float = 6.28  # achieved / modelled time of the data-parallel gradient all-reduce
    # ZeRO's gradient reduce-scatter plus weight all-gather over an all-reduce of the same
    # gradient: 1 where both run as bandwidth-optimal rings (NCCL); at least 1 (the planner's
    # bounds charge ZeRO plans the all-reduce)
    sharded_sync_ratio: float = 1.0
    step_overhead_s: float = 0.0  # per iteration: scheduler, loss reduction, logging
    grad_reduce_overlap: float = 0.0  # share of the last backward the gradient reduction hides in
    param_gather_overlap: float = 0.0  # share of compute ZeRO-3's gathers hide behind

    @classmethod
    def of(cls, stack: StackSpec) -> TimeConstants:
        return cls(**stack.timing.model_dump())


@dataclass(frozen=True)
class Problem:
    model: ModelSpec
    job: JobSpec
    gpus: dict[str, GPU]
    avail: dict[tuple[str, str], int]  # (gpu, zone) -> count
    zones: list[str]
    zone_region: dict[str, str]
    region_geo: dict[str, str]
    quotas: dict[str, int]
    # (gpu, zone) -> USD per GPU-hour; a pair with no price (neither the scenario nor the
    # catalog gives one) is absent: its cost is unknown (``unpriced``, ``require_prices``)
    prices: dict[tuple[str, str], float]
    network: NetworkModel
    profile: object
    sizes: LayerSizes
    constraints: Constraints
    objective: str
    stack: StackSpec | None = None
    memory: MemoryConstants = field(default_factory=MemoryConstants)
    timing: TimeConstants = field(default_factory=TimeConstants)
    file: str | None = None
    switching: SwitchingSpec = field(default_factory=SwitchingSpec)
    name: str | None = None  # the scenario's label
    # the links and intra-node links the catalog gave because the scenario did not
    # (``DefaultedLink.to_json``, ``default_links.intra_defaults``)
    network_defaults: tuple[dict, ...] = ()

    @property
    def n_layers(self) -> int:
        return self.model.num_layer_slots

    def flash(self, gpu: str) -> bool:
        """Whether attention runs as a fused flash kernel on ``gpu`` in this problem."""
        return self.stack is not None and uses_flash(self.gpus[gpu], self.stack,
                                                     self.job.attention)

    def price_usd_per_h(self, gpu: str, zone: str) -> float:
        if (gpu, zone) not in self.prices:
            self.require_prices([gpu], "a cost on it needs one")
        return self.prices[(gpu, zone)]

    def unpriced(self, gpus: object = None) -> list[str]:
        """The GPU types (of ``gpus``, default the whole pool) that have no price in some zone of
        the pool that holds them, sorted."""
        wanted = None if gpus is None else set(gpus)
        return sorted({g for (g, z) in self.avail if (g, z) not in self.prices
                       and (wanted is None or g in wanted)})

    def require_prices(self, gpus: object, why: str) -> None:
        """A SpecError naming ``gpus`` without a price and ``why`` (what needs them), and how
        to give one; nothing when all have prices."""
        missing = self.unpriced(gpus)
        if missing:
            raise SpecError(f"{no_price_reason(missing)}: {why}", file=self.file,
                            field=f"prices.gpu_usd_per_h.{missing[0]}",
                            allowed="USD per GPU-hour for " + ", ".join(missing) + " in the "
                                    "scenario's prices.gpu_usd_per_h.<GPU> (or "
                                    "prices.zone_gpu_usd_per_h.<zone>.<GPU>)")

    def with_constants(self, memory: MemoryConstants | None = None,
                       timing: TimeConstants | None = None) -> Problem:
        return replace(self, memory=memory or self.memory, timing=timing or self.timing)


def no_price_reason(gpus: list[str]) -> str:
    """Why a cost is unknown: the GPU types without a price."""
    return (f"no price for {', '.join(gpus)} (the catalog has no public on-demand price for "
            f"{'it' if len(gpus) == 1 else 'them'} and the scenario gives none)")


def resolve_model(ref, file: str | None, base: Path) -> ModelSpec:
    if isinstance(ref, str):
        return catalog.models().get(ref, field="model", file=file,
                                    route=catalog.HF_ROUTE_SCENARIO)
    if isinstance(ref, HFModelRef):

        p = Path(ref.hf_config)
        try:
            return model_from_hf_config(p if p.is_absolute() else base / p)
        except SpecError as exc:
            raise SpecError(f"{exc.reason} ({exc.file})", file=file, field="model.hf_config",
                            value=ref.hf_config) from None
    return ref


def build_problem(scn: Scenario, *, file: str | None = None, base_dir: str | Path | None = None,
                  stack: StackSpec | None = None) -> Problem:
    """The scenario resolved; ``stack`` replaces the one ``job.stack`` names (calibration)."""
    base = Path(base_dir) if base_dir else (Path(file).parent if file else Path.cwd())
    model = resolve_model(scn.model, file, base)
    job = scn.job
    stack = stack or resolve_stack(job.stack, base=base, file=file)
    reg = catalog.gpus()
    pool = _pool(scn, file)
    gpus: dict[str, GPU] = {}
    for g in sorted(pool.used):
        spec = reg.get(g)
        gpn = _lookup(scn.pool.gpus_per_node, g, "pool.gpus_per_node", file)
        gpus[g] = replace(spec, gpus_per_node=gpn) if gpn else spec
    quotas = {reg.canonical(k, field=f"pool.quotas.{k}", file=file): v
              for k, v in scn.pool.quotas.items()}
    prices = _prices(scn, pool, gpus, file)
    network, defaulted = _network(scn, pool, gpus, file)
    analytic = AnalyticProfile(model, job.seq_len, {**reg.entries, **gpus}, stack,
                               optimizer=job.optimizer, precision=job.precision,
                               attention=job.attention, intra_node=network.intra)
    profile = _profile(scn, model, gpus, analytic, (base, file))
    return Problem(
        model=model, job=job, gpus=gpus, avail=pool.avail, zones=sorted(pool.zone_region),
        zone_region=pool.zone_region, region_geo=pool.region_geo, quotas=quotas, prices=prices,
        network=network, profile=profile, sizes=layer_sizes(model, job.seq_len),
        constraints=scn.constraints, objective=scn.objective.goal, stack=stack,
        memory=MemoryConstants.of(stack), timing=TimeConstants.of(stack), file=file,
        switching=scn.switching, name=scn.name, network_defaults=defaulted,
    )


@dataclass(frozen=True)
class _Pool:
    """The scenario's pool resolved: each zone's region, each region's geography, the GPUs of
    each (canonical GPU type, zone) and the GPU types used."""

    zone_region: dict[str, str]
    region_geo: dict[str, str]
    avail: dict[tuple[str, str], int]
    used: set[str]


def _pool(scn: Scenario, file: str | None) -> _Pool:
    reg = catalog.gpus()
    geo_of = catalog.zone_geo()
    zone_region: dict[str, str] = {}
    region_geo: dict[str, str] = {}
    avail: dict[tuple[str, str], int] = {}
    used: set[str] = set()
    for rname, region in scn.pool.regions.items():
        region_geo[rname] = region.geo or next(
            (g for z, (r, g) in geo_of.items() if r == rname), "unknown")
        for zname, zone in region.zones.items():
            if zname in zone_region:
                raise SpecError("zone listed in two regions", file=file,
                                field=f"pool.regions.{rname}.zones.{zname}",
                                value=zone_region[zname])
            zone_region[zname] = rname
            for gname, count in zone.gpus.items():
                g = reg.canonical(gname, field=f"pool.regions.{rname}.zones.{zname}.gpus.{gname}",
                                  file=file)
                avail[(g, zname)] = avail.get((g, zname), 0) + count
                used.add(g)
    return _Pool(zone_region, region_geo, avail, used)


def _prices(scn: Scenario, pool: _Pool, gpus: dict[str, GPU],
            file: str | None) -> dict[tuple[str, str], float]:
    """USD per GPU-hour of every (GPU type, zone) of the pool: the zone's price, else the
    type's, else the catalog's; a pair with none of them is left out (its cost is unknown:
    an estimate says so, a search that needs it asks for it)."""
    reg = catalog.gpus()
    prices: dict[tuple[str, str], float] = {}
    typed = {reg.canonical(k, field=f"prices.gpu_usd_per_h.{k}", file=file): v
             for k, v in scn.prices.gpu_usd_per_h.items()}
    for z in scn.prices.zone_gpu_usd_per_h:
        if z not in pool.zone_region:
            raise SpecError("zone not in the pool", file=file, field=f"prices.zone_gpu_usd_per_h.{z}",
                            value=z, allowed=", ".join(sorted(pool.zone_region)))
    for (g, z) in pool.avail:
        zone_over = {reg.canonical(k, field=f"prices.zone_gpu_usd_per_h.{z}.{k}", file=file): v
                     for k, v in scn.prices.zone_gpu_usd_per_h.get(z, {}).items()}
        p = zone_over.get(g, typed.get(g, gpus[g].price_usd_per_h))
        if p is not None:
            prices[(g, z)] = float(p)
    return prices


def _network(scn: Scenario, pool: _Pool, gpus: dict[str, GPU],
             file: str | None) -> tuple[NetworkModel, tuple[dict, ...]]:
    """The network model, checked to link every pair of zones (and GPU types there), and the
    links and intra-node links the catalog gave for it (``network_defaults``)."""
    cloud = scn.network.cloud
    if cloud is not None and cloud not in catalog.clouds():
        raise SpecError("unknown cloud", file=file, field="network.cloud", value=cloud,
                        allowed=", ".join(catalog.clouds()),
                        suggestion=close_match(cloud, list(catalog.clouds())))
    fallback = CatalogLinks(gpus, pool.zone_region, pool.region_geo, cloud, file)
    network = NetworkModel(scn.network, pool.zone_region, pool.region_geo, file=file,
                           fallback=fallback)
    zones = sorted(pool.zone_region)
    in_zone = {z: sorted({g for (g, zz) in pool.avail if zz == z}) for z in zones}
    for i, za in enumerate(zones):  # every pair of zones (and GPU types there) needs a link
        for zb in zones[i:]:
            for ga in in_zone[za] or [None]:
                for gb in in_zone[zb] or [None]:
                    network.link(za, zb, ga, gb)
    used = [d.to_json() for _, d in sorted(fallback.used.items())]
    return network, (*used, *intra_defaults(gpus, set(network.intra)))


def _profile(scn: Scenario, model: ModelSpec, gpus: dict[str, GPU], analytic: AnalyticProfile,
             where: tuple[Path, str | None]) -> object:
    """The compute profile: the analytic one, or the scenario's measured one (falling back to
    the analytic one), and a transfer profile from another model behind either. ``where``:
    the directory relative paths start from, and the scenario's file."""
    base, file = where
    job = scn.job
    reg = catalog.gpus()
    profile: object = analytic
    own = None
    if scn.profiles.compute != "analytic":
        own = _load_located(scn.profiles.compute, base, file, "profiles.compute",
                            lambda p: load_profile(p, model.num_layer_slots, fallback=analytic))
        profile = own
    if scn.profiles.transfer_from:
        transfer = _load_located(scn.profiles.transfer_from, base, file, "profiles.transfer_from",
                                 lambda p: _transfer(p, model, job, reg, gpus, analytic, own))
        if own is not None:
            own.fallback = transfer
        else:
            profile = transfer
    return profile


def _load_located(ref: str, base: Path, file: str | None, field: str, loader):
    p = Path(ref)
    p = p if p.is_absolute() else base / p
    try:
        return loader(p)
    except SpecError as exc:
        raise exc.located(prefix=None if exc.file else field, file=exc.file or file) from None


def _transfer(path: Path, model: ModelSpec, job: JobSpec, reg, gpus, analytic, own):
    """A profile measured on another model, scaled to this one (shoal.profiles.transfer)."""
    import json


    try:
        spec = json.loads(path.read_text()).get("model_spec")
    except (OSError, ValueError, AttributeError):
        spec = None
    if not spec:
        raise SpecError("a transfer profile must record the architecture it was measured on",
                        file=str(path), field="model_spec",
                        allowed="the model fields (num_layers, hidden_size, ...), as "
                                "`shoal import sailor` writes them")
    src_model = ModelSpec(**spec)
    measured = load_profile(path, src_model.num_layer_slots)
    src_analytic = AnalyticProfile(src_model, job.seq_len, {**reg.entries, **gpus},
                                   analytic.stack, optimizer=job.optimizer,
                                   precision=job.precision, attention=job.attention,
                                   intra_node=analytic.intra)
    return TransferProfile(measured, src_analytic, analytic, src_model.name, own)


def _lookup(mapping: dict, gpu: str, field: str, file: str | None):
    reg = catalog.gpus()
    for k, v in mapping.items():
        if reg.canonical(k, field=f"{field}.{k}", file=file) == gpu:
            return v
    return None


def load_problem(path: str | Path, **kw) -> Problem:
    return build_problem(load_scenario(path), file=str(path), **kw)
