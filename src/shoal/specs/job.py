"""The training job: batch, sequence, optimizer, precision and what the planner may choose."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shoal.specs._types import STRICT, Flag, PositiveInt, Seconds, one_or_list


class JobSpec(BaseModel):
    model_config = STRICT

    global_batch: PositiveInt = Field(description="sequences per iteration, over all replicas")
    seq_len: PositiveInt = Field(default=2048, description="tokens per sequence")
    optimizer: Literal["adam", "adamw", "sgd"] = Field(
        default="adam", description="sets optimizer-state memory and update time")
    precision: Literal["mixed-fp16", "mixed-bf16", "mixed-fp8", "bf16", "tf32", "fp32"] = Field(
        default="mixed-fp16",
        description="mixed-*: 16-bit (or fp8) matrix multiplies with fp32 master weights "
                    "(mixed-bf16 needs bf16 tensor cores; mixed-fp8 runs fp8 multiplies where the "
                    "GPU has them, 16-bit elsewhere); bf16: weights, gradients and optimizer "
                    "state all in bf16; tf32: fp32 weights with tf32 multiplies; fp32: no "
                    "tensor cores")
    stack: str = Field(
        default="megatron",
        description="the software that runs the plans: a built-in stack (`shoal catalog "
                    "stacks`) or a stack file `shoal calibrate` wrote (path relative to this "
                    "file)")
    attention: Literal["auto", "flash", "eager"] = Field(
        default="auto",
        description="attention kernel: auto (the stack's: flash attention where the GPU "
                    "supports it), flash (where supported) or eager (scores materialised)")
    recompute: list[Flag] = Field(json_schema_extra=one_or_list,
        default=[False], description="activation-recompute settings the planner may choose (one value or "
                                   "a list)"
    )
    zero_stage: list[Literal[0, 1, 2, 3]] = Field(json_schema_extra=one_or_list,
        default=[0], description="ZeRO stages the planner may choose (0 = none; 3 also shards weights; "
                                "one value or a list)"
    )
    schedule: list[Literal["1f1b", "gpipe", "zorse"]] = Field(json_schema_extra=one_or_list,
        default=["1f1b", "gpipe"],
        description="pipeline schedules the planner may choose (one value or a list); zorse "
                    "(ministages with host offload) needs recompute and ZeRO stage 2 allowed"
    )
    microbatch_sizes: list[PositiveInt] | None = Field(
        default=None, description="microbatch sizes the planner may use; default powers of two"
    )

    @field_validator("recompute", "zero_stage", "schedule", mode="before")
    @classmethod
    def _listify(cls, v):
        v = v if isinstance(v, list) else [v]
        return [x.lower() if isinstance(x, str) else x for x in v]

    @model_validator(mode="after")
    def _some_microbatch_size_divides(self):
        if self.microbatch_sizes and all(self.global_batch % m for m in self.microbatch_sizes):
            raise ValueError(f"microbatch_sizes: none of {self.microbatch_sizes} divides the "
                             f"global batch {self.global_batch}; allowed: a divisor of it")
        return self

    @field_validator("optimizer", "precision", mode="before")
    @classmethod
    def _lower(cls, v):
        return v.lower() if isinstance(v, str) else v


class Deadline(BaseModel):
    model_config = STRICT
    iterations: PositiveInt = Field(description="iterations that must finish within `within`")
    within: Seconds = Field(gt=0, description="wall-clock time the iterations must finish in")


class Constraints(BaseModel):
    model_config = STRICT

    max_cost_per_iteration_usd: float | None = Field(
        default=None, gt=0, description="upper bound on USD per iteration (compute + egress)")
    min_iters_per_s: float | None = Field(
        default=None, gt=0, description="lower bound on iterations per second")
    max_gpus: PositiveInt | None = Field(default=None, description="most GPUs a plan may use")
    deadline: Deadline | None = Field(
        default=None, description="{iterations: N, within: 12h}: N iterations must finish within "
                                  "that time")


Objective = Literal["max-throughput", "min-cost", "max-throughput-per-dollar"]


def _goal_or_mapping(schema: dict) -> None:
    """The objective is a goal's name or ``{goal: name}``."""
    mapping = {k: schema.pop(k) for k in ("type", "properties", "additionalProperties",
                                           "required") if k in schema}
    schema["anyOf"] = [{"type": "string", "enum": mapping["properties"]["goal"]["enum"]}, mapping]


class ObjectiveSpec(BaseModel):
    model_config = ConfigDict(**STRICT, json_schema_extra=_goal_or_mapping)
    goal: Objective = Field(
        default="max-throughput",
        description="what planners optimize: the shortest iteration, the cheapest iteration, or "
                    "the smallest iteration time x cost")

    @model_validator(mode="before")
    @classmethod
    def _from_str(cls, v):
        return {"goal": v} if isinstance(v, str) else v
