"""Locate ../shared/reference (beside the project) for benchmarks and tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reference_dir() -> Path | None:
    env = os.environ.get("SHOAL_REFERENCE")
    for cand in ([Path(env)] if env else []) + [ROOT.parent / "shared" / "reference",
                                                 ROOT.parent.parent / "shared" / "reference"]:
        if (cand / "sailor").is_dir():
            return cand
    return None


def reference_or_skip() -> Path | None:
    """``reference_dir()``; when there is none, prints the benchmark's JSON saying it skipped."""
    ref = reference_dir()
    if ref is None:
        print(json.dumps({"skipped": "reference data not found (../shared/reference)"}))
    return ref
