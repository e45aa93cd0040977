"""TrainingPlan: the one plan type every planner, the estimator, the simulator and the runtime share."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field, ValidationError

from shoal.errors import SpecError
from shoal.files import read_document
from shoal.specs._types import STRICT, Flag, NonNegInt, PositiveInt
from shoal.specs.scenario import spec_error_from_validation

PLAN_SCHEMA = "shoal/training-plan@1"


class Replica(BaseModel):
    model_config = STRICT
    gpu: str = Field(description="GPU type (catalog name or alias)")
    tp: PositiveInt = Field(default=1, description="tensor-parallel degree: GPUs of one node the "
                                                   "replica uses (a power of two)")
    zone: str = Field(description="a zone of the pool")
    microbatches: NonNegInt = Field(description="microbatches this replica processes per iteration")


class Stage(BaseModel):
    model_config = STRICT
    layers: tuple[NonNegInt, NonNegInt] = Field(
        description="half-open range [start, end) over the layer list")
    replicas: list[Replica] = Field(min_length=1,
                                    description="the data-parallel replicas of the stage")


def owners(shares: list[int] | tuple[int, ...]) -> list[int]:
    """The replica that runs each microbatch of the iteration, for one stage whose replicas run
    ``shares`` microbatches: replica j's k-th microbatch is due at (k + 1/2) / share_j of the
    iteration, and microbatches go out in order of due time (lower replica first on ties).
    Each replica gets exactly its share, spread evenly over the iteration, so a stage with fewer
    replicas or other shares than its neighbour still receives work at a steady pace. Stages
    with the same shares get the same owners: they form pipelines."""
    return list(_owners(tuple(int(n) for n in shares)))


@lru_cache(maxsize=4096)
def _owners(shares: tuple[int, ...]) -> tuple[int, ...]:
    if not shares or sum(shares) == 0:
        return ()
    due = np.concatenate([(np.arange(n) + 0.5) / n for n in shares if n > 0])
    who = np.concatenate([np.full(n, j) for j, n in enumerate(shares) if n > 0])
    return tuple(int(x) for x in who[np.lexsort((who, due))])


def warmups(shares: list[list[int]]) -> list[int]:
    """W_s of ``orders``' 1F1B: forwards each stage runs before its first backward."""
    S = len(shares)
    total = sum(shares[0])
    warm = [0] * S
    for s in range(S - 1, -1, -1):
        w = sum(min(S - s - 1, n) for n in shares[s])
        if s < S - 1:
            w = max(w, warm[s + 1] + 1)
        warm[s] = min(w, total)
    return warm


def orders(schedule: str, shares: list[list[int]]) -> list[list[list[tuple[int, int]]]]:
    """[stage][replica] -> the (is_backward, microbatch) operations that replica runs, in order,
    for a plan whose stage s gives its replicas ``shares[s]`` microbatches (``owners``).

    Each stage runs one order over all the iteration's microbatches, and each replica the part of
    it that it owns. GPipe: every forward, then every backward. 1F1B: W_s forwards, then a
    forward and a backward in turn, then the backwards left. W_s gives each replica the
    warm-up of a pipeline's stage s (min(S - s - 1, its share)), is at least W_{s+1} + 1 (so
    that a stage never waits for a backward that needs a forward it has not yet sent) and at
    most the microbatches. With equal shares these are the pipelines' 1F1B orders; the stages'
    orders form a valid single-pipeline schedule and each replica's order is part of its
    stage's, so no plan can deadlock."""
    out = []
    for s, stage in enumerate(stage_orders(schedule, shares)):
        own = owners(shares[s])
        mine: list[list[tuple[int, int]]] = [[] for _ in shares[s]]
        for op in stage:
            mine[own[op[1]]].append(op)
        out.append(mine)
    return out


def stage_orders(schedule: str, shares: list[list[int]]) -> list[list[tuple[int, int]]]:
    """[stage] -> the (is_backward, microbatch) order of the whole stage (``orders``)."""
    total = sum(shares[0])
    out = []
    for w in warmups(shares):
        if schedule == "gpipe":
            stage = [(0, i) for i in range(total)] + [(1, i) for i in range(total)]
        else:
            stage = [(0, i) for i in range(w)]
            for k in range(total):
                if w + k < total:
                    stage.append((0, w + k))
                stage.append((1, k))
        out.append(stage)
    return out


class TrainingPlan(BaseModel):
    model_config = STRICT | {"frozen": True}
    schema_: Literal["shoal/training-plan@1"] = Field(default=PLAN_SCHEMA, alias="schema",
                                                      description="format version")
    microbatch_size: PositiveInt = Field(
        description="sequences per microbatch; must divide job.global_batch")
    schedule: Literal["1f1b", "gpipe", "zorse"] = Field(
        default="1f1b", description="pipeline schedule; must be allowed by job.schedule. "
        "zorse: each stage's layers in `ministages` chunks taken round-robin over the stages, "
        "every microbatch through one chunk before the next (GPipe order), ZeRO-2 inside a stage "
        "with the chunks not in use and the layer-boundary activations offloaded to host memory")
    ministages: PositiveInt = Field(
        default=1, description="chunks per stage under the zorse schedule (1 for the others)")
    recompute: Flag = Field(default=False, description="activation recompute for this plan; must "
                                                       "be allowed by job.recompute")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        default=0, description="ZeRO stage for this plan; must be allowed by job.zero_stage")
    stages: list[Stage] = Field(min_length=1, description="the pipeline stages, in layer order")

    def to_json(self) -> dict:
        return self.model_dump(mode="json", by_alias=True)

    @property
    def global_batch(self) -> int:
        """Sequences per iteration: the first stage's microbatches times their size."""
        return sum(r.microbatches for r in self.stages[0].replicas) * self.microbatch_size

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

    def layer_split(self) -> str:
        """Layers per stage, '12+13+1' (the model's layer list: embedding, blocks, head)."""
        return "+".join(str(st.layers[1] - st.layers[0]) for st in self.stages)

    def summary(self, zones: bool = False) -> str:
        """'S0-1: V100-16GB(4)x9 | S2: A100-40GB(1)x6+V100-16GB(4)x3' (runs of identical
        stages: GPU type(TP) x replicas, in name order); with ``zones``, each mix's zone after an @
        ('A100-40GB(1)x6@us-central1-a')."""
        descs = []
        for st in self.stages:
            counts: dict[tuple[str, str], int] = {}
            for r in st.replicas:
                key = (f"{r.gpu}({r.tp})", f"@{r.zone}" if zones else "")
                counts[key] = counts.get(key, 0) + 1
            descs.append("+".join(f"{k}x{n}{z}" for (k, z), n in sorted(counts.items())))
        parts, prev, start = [], None, 0
        for i, d in enumerate([*descs, None]):
            if d != prev:
                if prev is not None:
                    parts.append(f"S{start}{'' if start == i - 1 else f'-{i - 1}'}: {prev}")
                prev, start = d, i
        return " | ".join(parts)


def load_plan(path: str | Path) -> TrainingPlan:
    """A TrainingPlan from a JSON or YAML file; every problem is a SpecError naming the file."""
    data = read_document(path)
    if "plans" in data and "pareto" in data:
        raise SpecError("a `shoal plan --json` result, not a plan: write the best plan with "
                        "`shoal plan ... -o plan.json` (or take its plans[i].plan)", file=str(path))
    try:
        return TrainingPlan.model_validate(data)
    except ValidationError as exc:
        raise spec_error_from_validation(exc, str(path)) from None
