"""Measured training runs: what ``shoal calibrate`` fits a stack to, and what the fidelity
benchmark compares estimates with.

One run per row of a CSV file (a header naming the columns) or per item of a JSON list (or of
``{"runs": [...]}``). A run is a homogeneous job: ``gpus`` GPUs of one type, ``tp`` x ``pp`` x
data-parallel replicas, each stage of ``pp`` holding an equal share of the model's blocks; the
model is a catalog name, a HuggingFace ``config.json`` (``hf_config``) or its shape in columns;
and what was measured: the step time, tokens/s or tokens/s per GPU, optionally the peak memory
per GPU.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from shoal.errors import SpecError
from shoal.files import read_text
from shoal.specs._types import STRICT, Bytes, BytesPerSecond, Flag, PositiveInt, Seconds
from shoal.specs.scenario import validated

ARCH_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
               "vocab_size", "max_seq_len", "mlp", "norm", "position", "head_dim", "dropout",
               "num_experts", "experts_per_token", "shared_experts", "moe_ffn_hidden_size",
               "dense_layers")


class MeasuredRun(BaseModel):
    """One measured training run."""

    model_config = STRICT
    name: str | None = Field(default=None, description="a label for the tables")
    group: str | None = Field(default=None,
                              description="runs of one group are left out together when the "
                                          "fit is judged (default: the model)")
    model: str | None = Field(default=None, description="catalog model name")
    hf_config: str | None = Field(default=None, description="path to a HuggingFace config.json")
    num_layers: PositiveInt | None = None
    hidden_size: PositiveInt | None = None
    num_heads: PositiveInt | None = None
    num_kv_heads: PositiveInt | None = None
    ffn_hidden_size: PositiveInt | None = None
    vocab_size: PositiveInt | None = None
    max_seq_len: PositiveInt | None = None
    mlp: Literal["gelu", "relu", "swiglu"] | None = None
    norm: Literal["layernorm", "rmsnorm"] | None = None
    position: Literal["learned", "rotary", "alibi"] | None = None
    head_dim: PositiveInt | None = None
    dropout: float | None = Field(default=None, ge=0, lt=1)
    num_experts: PositiveInt | None = None
    experts_per_token: PositiveInt | None = None
    shared_experts: int | None = Field(default=None, ge=0)
    moe_ffn_hidden_size: PositiveInt | None = None
    dense_layers: int | None = Field(default=None, ge=0)
    gpu: str = Field(description="GPU type (catalog name)")
    gpus: PositiveInt = Field(description="GPUs the run used")
    gpus_per_node: PositiveInt | None = Field(default=None,
                                              description="default: the catalog's")
    tp: PositiveInt = Field(default=1, description="tensor-parallel degree")
    pp: PositiveInt = Field(default=1, description="pipeline stages")
    global_batch: PositiveInt = Field(description="sequences per iteration")
    microbatch: PositiveInt = Field(description="sequences per microbatch")
    seq_len: PositiveInt = Field(description="tokens per sequence")
    precision: Literal["mixed-fp16", "mixed-bf16", "mixed-fp8", "bf16", "tf32", "fp32"] = \
        "mixed-bf16"
    optimizer: Literal["adam", "adamw", "sgd"] = "adamw"
    zero_stage: Literal[0, 1, 2, 3] = 0
    recompute: Flag = False
    schedule: Literal["1f1b", "gpipe"] = "1f1b"
    inter_node_bandwidth: BytesPerSecond | None = Field(
        default=None, description="one GPU's flow between nodes (default: 100Gbps)")
    inter_node_latency: Seconds = Field(default=1.0e-5, description="latency between nodes")
    step_time_s: float | None = Field(default=None, gt=0, description="measured seconds per step")
    tokens_per_s: float | None = Field(default=None, gt=0, description="measured, whole job")
    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0, description="measured")
    peak_memory: Bytes | None = Field(default=None, description="measured peak per GPU")
    mfu: float | None = Field(default=None, ge=0, le=1,
                              description="published model FLOPs utilisation, for comparison")

    @model_validator(mode="after")
    def _check(self):
        given = [x for x in (self.step_time_s, self.tokens_per_s, self.tokens_per_s_per_gpu)
                 if x is not None]
        if not given and self.peak_memory is None:
            raise ValueError("a run needs a measurement: step_time_s, tokens_per_s, "
                             "tokens_per_s_per_gpu or peak_memory")
        if self.gpus % (self.tp * self.pp):
            raise ValueError(f"gpus ({self.gpus}) must be a multiple of tp x pp "
                             f"({self.tp * self.pp})")
        if self.microbatch > self.global_batch:
            raise ValueError("microbatch must not exceed global_batch")
        if self.model is None and self.hf_config is None and self.num_layers is None:
            raise ValueError("a run needs its model: 'model' (catalog), 'hf_config' or the "
                             "shape (num_layers, hidden_size, num_heads, vocab_size)")
        return self

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)

    @property
    def label(self) -> str:
        return self.name or f"{self.model or self.hf_config or 'model'} {self.gpus}x{self.gpu}"

    def measured_step_s(self) -> float | None:
        """The measured seconds per step, from whichever throughput was given."""
        tokens = self.global_batch * self.seq_len
        if self.step_time_s is not None:
            return self.step_time_s
        if self.tokens_per_s is not None:
            return tokens / self.tokens_per_s
        if self.tokens_per_s_per_gpu is not None:
            return tokens / (self.tokens_per_s_per_gpu * self.gpus)
        return None

    def architecture(self) -> dict:
        return {k: getattr(self, k) for k in ARCH_FIELDS if getattr(self, k) is not None}


def _cell(text: str):
    """A CSV cell as the value it spells: empty -> absent, numbers, true/false."""
    t = text.strip()
    if t == "":
        return None
    low = t.lower()
    if low in ("true", "false"):
        return low == "true"
    for cast in (int, float):
        try:
            v = cast(t)
        except ValueError:
            continue
        return v if cast is int or math.isfinite(v) else t
    return t


def read_runs(path: str | Path) -> list[MeasuredRun]:
    """The runs of a CSV or JSON measurements file, or a SpecError naming the file, the row
    and the field."""

    p = Path(path)
    text = read_text(p, "measurements file", "UTF-8 CSV or JSON")
    if p.suffix.lower() == ".json":
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise SpecError(f"malformed JSON at line {exc.lineno}: {exc.msg}", file=str(p)) from None
        rows = doc.get("runs") if isinstance(doc, dict) else doc
        if not isinstance(rows, list):
            raise SpecError("expected a list of runs (or {\"runs\": [...]})", file=str(p))
    else:
        reader = csv.DictReader(io.StringIO(text))
        rows = [{k.strip(): v for k, c in r.items() if k and (v := _cell(c or "")) is not None}
                for r in reader]
    if not rows:
        raise SpecError("no runs in the file", file=str(p))
    out = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise SpecError("a run must be a mapping of fields", file=str(p), field=f"runs.{i}")
        try:
            out.append(validated(MeasuredRun, row, str(p)))
        except SpecError as exc:
            raise exc.located(prefix=f"runs.{i}") from None
    return out
