"""Calibrate the built-in ``fsdp`` stack on llm-foundry's published runs, through the command a
user runs (``shoal calibrate``).

    python benchmarks/calibrate_fsdp.py [--reference DIR] [-o src/shoal/catalog/stacks/fsdp.yaml]

Writes llm-foundry's 209 BF16 runs (``_foundry.py``) as a measurements file in a temporary
folder, runs ``shoal calibrate MEASUREMENTS --stack fsdp -o OUT --name fsdp --json`` and prints
its JSON: the kernel efficiencies per GPU architecture, each run's error in sample and with its
model size left out of the fit.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _foundry import runs  # noqa: E402
from _reference import reference_dir  # noqa: E402

STACK = Path(__file__).resolve().parents[1] / "src" / "shoal" / "catalog" / "stacks" / "fsdp.yaml"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, default=None)
    ap.add_argument("-o", "--output", type=Path, default=STACK)
    args = ap.parse_args()
    ref = args.reference or reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "../shared/reference not found"}))
        return
    with tempfile.TemporaryDirectory() as tmp:
        measured = Path(tmp) / "llm-foundry-runs.json"
        measured.write_text(json.dumps(runs(ref / "llm-foundry")))
        out = subprocess.run([sys.executable, "-m", "shoal", "calibrate", str(measured),
                              "--stack", "fsdp", "-o", str(args.output), "--name", "fsdp",
                              "--json"], capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(out.stderr)
    print(out.stdout.strip())


if __name__ == "__main__":
    main()
