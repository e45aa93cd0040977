"""TrainingPlan: the one plan type every planner, the estimator, the simulator and the runtime share."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from shoal.specs._types import STRICT, NonNegInt, PositiveInt

PLAN_SCHEMA = "shoal/training-plan@1"


class Replica(BaseModel):
    model_config = STRICT
    gpu: str
    tp: PositiveInt = 1
    zone: str
    microbatches: NonNegInt = Field(description="microbatches this replica processes per iteration")


class Stage(BaseModel):
    model_config = STRICT
    layers: tuple[NonNegInt, NonNegInt] = Field(description="half-open range over the layer list")
    replicas: list[Replica] = Field(min_length=1, description="at least one replica")


class TrainingPlan(BaseModel):
    model_config = STRICT | {"frozen": True}
    schema_: Literal["shoal/training-plan@1"] = Field(default=PLAN_SCHEMA, alias="schema")
    microbatch_size: PositiveInt
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    recompute: bool = False
    zero_stage: Literal[0, 1, 2] = 0
    stages: list[Stage] = Field(min_length=1, description="at least one stage")

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def num_gpus(self) -> int:
        return sum(r.tp for s in self.stages for r in s.replicas)

    def gpu_counts(self) -> dict[tuple[str, str], int]:
        """(GPU type, zone) -> GPUs used."""
        out: dict[tuple[str, str], int] = {}
        for s in self.stages:
            for r in s.replicas:
                out[(r.gpu, r.zone)] = out.get((r.gpu, r.zone), 0) + r.tp
        return out

    def summary(self) -> str:
        """'S0-1: V100-16GB(4)x9 | S2: A100-40GB(1)x6+V100-16GB(4)x3' (runs of identical
        stages: GPU type(TP) x replicas)."""
        descs = []
        for st in self.stages:
            counts: dict[str, int] = {}
            for r in st.replicas:
                key = f"{r.gpu}({r.tp})"
                counts[key] = counts.get(key, 0) + 1
            descs.append("+".join(f"{k}x{n}" for k, n in counts.items()))
        parts, prev, start = [], None, 0
        for i, d in enumerate([*descs, None]):
            if d != prev:
                if prev is not None:
                    parts.append(f"S{start}{'' if start == i - 1 else f'-{i - 1}'}: {prev}")
                prev, start = d, i
        return " | ".join(parts)
