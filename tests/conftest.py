"""Shared test helpers: where the reference data lives, and a small scenario to start from."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO.parent / "shared" / "reference"


@pytest.fixture(scope="session")
def reference_dir() -> Path:
    """``../shared/reference`` next to the repository; tests that need it skip without it."""
    if not (REFERENCE / "sailor").is_dir():
        pytest.skip(f"reference data not found at {REFERENCE / 'sailor'} (clone ../shared next to the repo)")
    return REFERENCE


BASE_SCENARIO = {
    "model": "OPT-350M",
    "job": {"global_batch": 16, "seq_len": 2048},
    "pool": {"regions": {"us-central1": {"zones": {
        "us-central1-a": {"gpus": {"A100-40GB": 8, "V100-16GB": 8}},
        "us-central1-b": {"gpus": {"A100-40GB": 8}},
    }}}},
    "network": {"defaults": {"same_zone": {"bandwidth": "100Gbps"},
                             "same_region": {"bandwidth": "25Gbps", "latency": "1ms"}}},
}


@pytest.fixture
def scenario_dict() -> dict:
    """A fresh copy of a small valid scenario (OPT-350M, two zones, A100-40GB and V100-16GB)."""
    return copy.deepcopy(BASE_SCENARIO)
