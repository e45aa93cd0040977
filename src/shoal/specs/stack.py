"""A software stack: what the software that runs a plan reaches of the hardware.

The same plan on the same GPUs runs at different speeds under different software: one stack
fuses element-wise kernels and uses flash attention, another runs eager PyTorch; one overlaps
the gradient reduction with the backward pass, another waits for it; allocators and framework
state take different amounts of memory. A stack is a data file of those constants, each with
its source (``shoal/stack@1``): the built-in ones live in ``shoal/catalog/stacks/``, and
``shoal calibrate`` writes new ones from a user's own measured runs. A scenario names one in
``job.stack``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from shoal.specs._types import STRICT, Flag

STACK_SCHEMA = "shoal/stack@1"

Fraction = float


class KernelEfficiency(BaseModel):
    """Fractions of a GPU's datasheet peaks its kernels reach under this stack. Each field left
    out takes the value of the stack's ``default`` entry."""

    model_config = STRICT
    gemm: Fraction | None = Field(
        default=None, gt=0, le=1,
        description="fraction of the dense tensor-core peak a large matrix multiply reaches "
                    "(smaller ones lose more to tile and wave quantisation, modelled apart)")
    attention_fwd: Fraction | None = Field(
        default=None, gt=0, le=1,
        description="fraction of the tensor-core peak the fused (flash) attention forward reaches")
    attention_bwd: Fraction | None = Field(
        default=None, gt=0, le=1,
        description="fraction of the tensor-core peak the fused attention backward reaches")
    memory: Fraction | None = Field(
        default=None, gt=0, le=1,
        description="fraction of the memory bandwidth element-wise kernels reach (norms, "
                    "activations, residuals, softmax, the optimizer update)")
    launch_s: float | None = Field(
        default=None, ge=0, description="fixed cost of one kernel launch, seconds")
    link: Fraction | None = Field(
        default=None, gt=0, le=1,
        description="fraction of the datasheet GPU-to-GPU bandwidth a collective inside a node "
                    "reaches (a measured intra-node curve is used as measured)")


class StackTiming(BaseModel):
    """The stack's constants of the plan-level time model (``shoal.estimate.kernel``)."""

    model_config = STRICT
    compute_scale: float = Field(default=1.0, gt=0,
                                 description="multiplier on layer times inside a running pipeline")
    p2p_scale: float = Field(default=1.0, gt=0,
                             description="achieved / modelled time of a pipeline transfer")
    p2p_overhead_s: float = Field(default=0.0, ge=0,
                                  description="per pipeline transfer: handshake, synchronisation")
    recv_fraction: float = Field(default=0.5, ge=0, le=1,
                                 description="share of a transfer that also blocks the receiver")
    sync_scale: float = Field(default=1.0, gt=0,
                              description="achieved / modelled time of a gradient collective")
    sharded_sync_ratio: float = Field(
        default=1.0, ge=1,
        description="ZeRO's reduce-scatter + all-gather over the all-reduce of the same bytes")
    step_overhead_s: float = Field(default=0.0, ge=0,
                                   description="per iteration: scheduler, loss reduction, logging")
    grad_reduce_overlap: float = Field(
        default=0.0, ge=0, le=1,
        description="share of the last microbatch's backward the gradient reduction hides "
                    "behind (bucketed all-reduce as DDP, FSDP and Megatron run it)")
    param_gather_overlap: float = Field(
        default=0.0, ge=0, le=1,
        description="share of a layer's compute that ZeRO-3's weight gathers and gradient "
                    "reduce-scatters hide behind (prefetch)")


class StackMemory(BaseModel):
    """The stack's constants of the per-worker memory model."""

    model_config = STRICT
    framework_bytes: float = Field(default=1.0e9, ge=0,
                                   description="CUDA context, communicators, library workspaces")
    state_factor: float = Field(default=1.0, ge=0.5,
                                description="multiplier on weights + gradients + optimizer state")
    activation_factor: float = Field(default=1.0, ge=0.5,
                                     description="allocator fragmentation over stored activations")
    comm_buffer_bytes_per_param: float = Field(
        default=0.0, ge=0, description="flat gradient buckets for the data-parallel reduction")
    mixed_state_bytes: tuple[float, float, float] = Field(
        default=(2.0, 2.0, 12.0),
        description="bytes per parameter under mixed precision with Adam: [weights, gradients, "
                    "optimizer state incl. fp32 master weights]")
    logits_bytes: float = Field(
        default=4.0, gt=0,
        description="bytes per logit the loss keeps for the backward pass: 2 for a fused "
                    "cross-entropy on 16-bit logits, 4 for an fp32 softmax, 8 for an fp32 copy "
                    "of the logits and its softmax")


class StackSpec(BaseModel):
    """One software stack (``shoal/stack@1``)."""

    model_config = STRICT
    schema_: Literal["shoal/stack@1"] = Field(default=STACK_SCHEMA, alias="schema",
                                              description="format version")
    name: str = Field(description="the name scenarios use in job.stack")
    description: str = Field(default="", description="what software this is")
    attention: Literal["flash", "eager"] = Field(
        default="flash", description="attention kernel where the GPU supports flash attention "
                                     "(Ampere and newer, CDNA 3); eager elsewhere")
    fused_elementwise: Flag = Field(
        default=True, description="residual adds fused into the norms, bias and activation into "
                                  "one kernel")
    fused_optimizer: Flag = Field(
        default=True, description="the optimizer updates all tensors in a few multi-tensor "
                                  "kernels rather than several kernels per tensor")
    optimizer_passes: float = Field(
        default=1.0, ge=1, description="memory traffic of the update over one pass of its bytes")
    kernels_from: str | None = Field(
        default=None,
        description="a built-in stack whose kernel efficiencies this one takes (the same GEMM "
                    "and attention libraries); its own `kernels` entries override them")
    kernels: dict[str, KernelEfficiency] = Field(
        default_factory=dict,
        description="'default' and optional entries per GPU architecture (e.g. Hopper) or GPU "
                    "type that override it")
    timing: StackTiming = Field(default_factory=StackTiming,
                                description="plan-level time constants")
    memory: StackMemory = Field(default_factory=StackMemory,
                                description="memory constants")
    sources: dict[str, str] = Field(
        default_factory=dict,
        description="where each constant comes from: a section ('kernels', 'timing'), a field "
                    "('timing.p2p_scale') or an entry ('kernels.Hopper') -> its source")
    fit: dict | None = Field(default=None,
                             description="the calibration that produced the constants, if any")

    @model_validator(mode="after")
    def _default_complete(self):
        if self.kernels_from is not None:
            return self  # completed when the stack it names is merged in (``with_kernels_of``)
        d = self.kernels.get("default")
        missing = [k for k in KernelEfficiency.model_fields if d is None or getattr(d, k) is None]
        if missing:
            raise ValueError("kernels.default must give every field: "
                             + ", ".join(missing) + " missing")
        return self

    def with_kernels_of(self, other: StackSpec) -> StackSpec:
        """This stack with ``other``'s kernel entries under its own (``kernels_from``)."""
        merged = dict(other.kernels)
        for key, entry in self.kernels.items():
            base = merged.get(key)
            merged[key] = entry if base is None else KernelEfficiency(**(
                base.model_dump() | entry.model_dump(exclude_none=True)))
        return StackSpec.model_validate(
            self.model_dump(by_alias=True) | {"kernels": {k: v.model_dump() for k, v in
                                                          merged.items()},
                                               "kernels_from": None})

    def kernel_efficiency(self, gpu: str, architecture: str) -> dict[str, float]:
        """The efficiencies for one GPU: its own entry, else its architecture's, over the
        default."""
        out = dict(self.kernels["default"].model_dump())
        for key in (architecture, gpu):
            entry = self.kernels.get(key)
            if entry is not None:
                out.update({k: v for k, v in entry.model_dump().items() if v is not None})
        return out
