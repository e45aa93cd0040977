"""What a change of plan costs: the scenario's `switching` section (defaults documented here).

Defaults are deliberately plain cloud numbers a user should override with their own: a GPU VM
writes and reads checkpoints at about 1 GB/s per GPU worker to object storage, a new GPU VM takes
about three minutes from request to a running container, rebuilding communicators and reloading
the framework takes about a minute, and the first iteration after a restart is not counted.
Checkpoints are written at Young's interval for the GPU losses seen (``auto``), or at a fixed
one.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from shoal.specs._types import STRICT, BytesPerSecond, Seconds


class SwitchingSpec(BaseModel):
    model_config = STRICT

    storage_bandwidth: BytesPerSecond = Field(
        default=1e9, description="checkpoint write and read bandwidth per GPU worker")
    checkpoint_interval: Literal["auto"] | Annotated[Seconds, Field(gt=0)] = Field(
        default="auto", description="training time between checkpoints (time spent switching "
                                    "not counted), each stalling training for the plan's save; a "
                                    "move forced without enough notice redoes the work since the "
                                    "last. auto: sqrt(2 x save x mean time between GPU losses "
                                    "seen so far), Young's interval")
    restart: Seconds = Field(
        default=60.0, description="tear down and rebuild process groups, reload the framework")
    node_startup: Seconds = Field(
        default=180.0, description="a VM the new plan needs that the old plan did not rent: "
                                   "request to running worker")
    warmup_iterations: int = Field(
        default=1, ge=0, description="iterations after a restart that are not counted (pipeline "
                                     "fill, allocator and communicator warm-up)")
    prior_gap: Seconds = Field(
        default=3600.0, gt=0, description="the `shoal` policy's guess of the time between "
                                          "availability changes before it has seen any")
