"""The training job: batch, sequence, optimizer, precision and what the planner may choose."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from shoal.specs._types import STRICT, PositiveInt, Seconds


class JobSpec(BaseModel):
    model_config = STRICT

    global_batch: PositiveInt = Field(description="sequences per iteration, over all replicas")
    seq_len: PositiveInt = 2048
    optimizer: Literal["adam", "adamw", "sgd"] = "adam"
    precision: Literal["mixed-fp16", "mixed-bf16", "fp32"] = "mixed-fp16"
    recompute: list[bool] = Field(
        default=[False], description="activation-recompute settings the planner may choose"
    )
    zero_stage: list[Literal[0, 1, 2, 3]] = Field(
        default=[0], description="ZeRO stages the planner may choose (0 = none; 3 also shards weights)"
    )
    schedule: list[Literal["1f1b", "gpipe"]] = Field(
        default=["1f1b", "gpipe"], description="pipeline schedules the planner may choose"
    )
    microbatch_sizes: list[PositiveInt] | None = Field(
        default=None, description="microbatch sizes the planner may use; default powers of two"
    )

    @field_validator("recompute", "zero_stage", "schedule", mode="before")
    @classmethod
    def _listify(cls, v):
        v = v if isinstance(v, list) else [v]
        return [x.lower() if isinstance(x, str) else x for x in v]

    @field_validator("optimizer", "precision", mode="before")
    @classmethod
    def _lower(cls, v):
        return v.lower() if isinstance(v, str) else v


class Deadline(BaseModel):
    model_config = STRICT
    iterations: PositiveInt
    within: Seconds


class Constraints(BaseModel):
    model_config = STRICT

    max_cost_per_iteration_usd: float | None = Field(default=None, gt=0)
    min_iters_per_s: float | None = Field(default=None, gt=0)
    max_gpus: PositiveInt | None = None
    deadline: Deadline | None = None


Objective = Literal["max-throughput", "min-cost", "max-throughput-per-dollar"]


class ObjectiveSpec(BaseModel):
    model_config = STRICT
    goal: Objective = "max-throughput"

    @model_validator(mode="before")
    @classmethod
    def _from_str(cls, v):
        return {"goal": v} if isinstance(v, str) else v
