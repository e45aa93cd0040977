"""A ~100M-parameter Llama trained by `shoal train` on a local token file, 4 CPU processes in 2
stages (two data-parallel replicas each): the loss falls below half its first value within 30
steps on a repetitive file (issue 66).

    python benchmarks/runtime_llama100m.py [--steps 30] [--seq 64] [--batch 4]

Writes a Llama `config.json` (hidden 768, 12 blocks, 12 heads, MLP 2048, vocabulary 16000:
~110M parameters, random weights from the seed), a token file of a 97-token phrase repeated
(uint16, with its dtype in a sidecar) and the plan into a temporary folder, runs `shoal train
--json` there and prints JSON: the first and last losses, their ratio, the mean step time, the
estimator's prediction for the plan on the `shoal` stack and the mean MFU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 768,
          "intermediate_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 12,
          "num_key_value_heads": 12, "vocab_size": 16000, "max_position_embeddings": 512,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=4, help="global batch (sequences)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        (d / "config.json").write_text(json.dumps(CONFIG))
        phrase = np.random.default_rng(0).integers(0, CONFIG["vocab_size"], 97)
        np.tile(phrase, 2000).astype(np.uint16).tofile(d / "tokens.bin")
        (d / "tokens.bin.json").write_text(json.dumps({"dtype": "uint16"}))
        half = a.batch // 2
        layers = CONFIG["num_hidden_layers"] + 2
        plan = {"microbatch_size": 1, "stages": [
            {"layers": [0, layers // 2], "replicas": [
                {"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": half}] * 2},
            {"layers": [layers // 2, layers], "replicas": [
                {"gpu": "cpu", "tp": 1, "zone": "local", "microbatches": half}] * 2}]}
        (d / "plan.json").write_text(json.dumps(plan))
        out = subprocess.run([sys.executable, "-m", "shoal", "train", str(d / "plan.json"),
                              "--model", str(d / "config.json"), "--data", str(d / "tokens.bin"),
                              "--steps", str(a.steps), "--seq", str(a.seq), "--device", "cpu",
                              "--json"], capture_output=True, text=True)
        if out.returncode:
            raise SystemExit(out.stdout + out.stderr)
        doc = json.loads(out.stdout)
    losses = doc["losses"]
    print(json.dumps({"params": "~110M", "processes": doc["world_size"], "stages": 2,
                      "steps": len(losses), "first_loss": losses[0], "last_loss": losses[-1],
                      "last_over_first": losses[-1] / losses[0],
                      "below_half_at_step": next((i + 1 for i, x in enumerate(losses)
                                                  if x < losses[0] / 2), None),
                      "step_time_s": doc["step_time_s"],
                      "predicted_step_time_s": doc["predicted"]["iteration_time_s"],
                      "mfu": doc["mfu"]}))


if __name__ == "__main__":
    main()
