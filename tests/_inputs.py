"""Small input files several tests write: a Sailor training config and plan."""

from __future__ import annotations

import json
from pathlib import Path


def sailor_config_and_plan(d: Path) -> tuple[Path, Path]:
    """A Sailor training config of a two-layer model and a plan of two one-A100 stages (the
    plan gives the pool), written in ``d``."""
    cfg, plan = d / "training_config.json", d / "plan_config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_layers": 2, "heads": 4, "vocab_size": 256,
                               "global_batch_size": 8, "sequence_length": 32}))
    one = [[[["A100-40", 1, "us-central1-a"]], 1]]
    plan.write_text(json.dumps({"mbs": 1, "gbs": 4, "pipeline_list": [
        {"layers_per_stage": [[0, 1], [2, 3]], "dp": [1, 1], "tmp_per_stage": [one, one]}]}))
    return cfg, plan
