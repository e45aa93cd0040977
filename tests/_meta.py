"""The ``meta`` block every ``--json`` result starts with (``shoal.cli.meta``), as tests check
it."""

from __future__ import annotations

import re

FIELDS = {"shoal_version", "command", "utc_time", "scenario", "model", "job", "pool"}


def check_meta(doc: dict, *, command: str, scenario: bool = False, model: bool = False,
               job: bool = False) -> dict:
    """``doc``'s meta block: every field, the command line starting with ``command``, a UTC
    time; with ``scenario``, the input file's name and SHA-256 and the pool; with ``model`` /
    ``job``, those."""
    meta = doc["meta"]
    assert set(meta) == FIELDS, set(meta) ^ FIELDS
    assert meta["shoal_version"] and meta["command"].startswith(command), meta["command"]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["utc_time"]), meta["utc_time"]
    if scenario:
        s = meta["scenario"]
        assert s["name"] and s["file"] and re.fullmatch(r"[0-9a-f]{64}", s["sha256"]), s
        pool = meta["pool"]
        assert pool["total"] == sum(n for z in pool["gpus"].values() for n in z.values()) > 0
    if model or scenario:
        assert meta["model"]["name"] and meta["model"]["parameters"] > 0, meta["model"]
    if job:
        j = meta["job"]
        assert j["global_batch"] > 0 and j["seq_len"] > 0 and j["precision"], j
    return meta
