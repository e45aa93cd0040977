"""What a result is: the ``meta`` block every ``--json`` output (and so every report section)
starts with. shoal's version, the command line, the UTC time, and, for commands that read a
scenario or a serving file, its name, path and SHA-256, the model (name, parameters), the job
(global batch, sequence length, precision) and the pool (GPUs per type and zone)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import shlex
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy and the estimator load only when a result is printed
    from shoal.problem import Problem
    from shoal.specs.model import ModelSpec


def version() -> str:
    """The installed shoal's version ("unknown" when run from a tree that is not installed)."""
    try:
        return importlib.metadata.version("shoal")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


ARGV: list[str] | None = None  # the arguments of the ``shoal`` process (set by cli.main)


def _context():
    """The running command's click context (None outside a command), from the click that typer
    runs on: its own copy in recent typer, the click package before."""
    try:
        from typer._click.globals import get_current_context
    except ImportError:  # typer that runs on the click package
        from click import get_current_context
    return get_current_context(silent=True)


def command_line() -> str:
    """The running command as a shell line: the process's own arguments under ``shoal``;
    inside a test runner, the command's path (``shoal estimate``) and every parameter given a
    value other than its default, in the order the command declares them."""
    if ARGV is not None:
        return shlex.join(["shoal", *ARGV])
    ctx = _context()
    if ctx is None:
        return "shoal"
    words = ctx.command_path.split()
    words[0] = "shoal"
    for p in ctx.command.params:
        value = ctx.params.get(p.name)
        if value is None or value == p.default or p.name == "help":
            continue
        values = list(value) if isinstance(value, (list, tuple)) else [value]
        if p.param_type_name == "argument":
            words += [_word(v) for v in values]
        elif getattr(p, "is_flag", False):
            words.append(p.opts[0] if value else (p.secondary_opts or [p.opts[0]])[0])
        else:
            for v in values:
                words += [p.opts[0], _word(v)]
    return shlex.join(words)


def _given(name: str) -> object:
    """The running command's parameter ``name`` as given (None: no such parameter)."""
    ctx = _context()
    return None if ctx is None else ctx.params.get(name)


def _word(v: object) -> str:
    return str(getattr(v, "value", v))  # an enum's value, else the value as written


def file_doc(path: str | Path | None, name: str | None) -> dict | None:
    """A scenario or serving file: its label, path and SHA-256 (None without a file)."""
    if path is None:
        return None
    p = Path(path)
    digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
    return {"name": name or p.stem, "file": str(path), "sha256": digest}


def run_meta(problem: Problem | None = None, *, serving: str | Path | None = None,
             **known) -> dict:
    """The ``meta`` block of the running command: ``problem`` (a scenario's) or ``serving`` (a
    serving file) fills its scenario, model, job and pool; ``known`` fills those a command
    knows otherwise (``shoal train``: the model and job); the rest stay null."""
    doc = {"shoal_version": version(), "command": command_line(),
           "utc_time": datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
           "scenario": None, "model": None, "job": None, "pool": None}
    serving = serving if serving is not None else _given("serving")
    if problem is not None:
        doc.update(_problem_meta(problem))
    elif serving is not None:
        doc.update(_serving_meta(serving))
    doc.update({k: v for k, v in known.items() if k in doc})
    return doc


def model_doc(spec: ModelSpec, name: str | None = None) -> dict:
    """A model's name and parameter count (embeddings and head included)."""
    from shoal.profiles.layers import layer_sizes

    return {"name": name or spec.name, "parameters": float(layer_sizes(spec, 2048).params.sum())}


def _problem_meta(problem: Problem) -> dict:
    job = problem.job
    pool: dict[str, dict[str, int]] = {}
    for (gpu, zone), n in sorted(problem.avail.items()):
        pool.setdefault(gpu, {})[zone] = n
    return {"scenario": file_doc(problem.file, problem.name),
            "model": model_doc(problem.model),
            "job": {"global_batch": job.global_batch, "seq_len": job.seq_len,
                    "precision": job.precision},
            "pool": {"gpus": pool, "total": sum(problem.avail.values())}}


def _serving_meta(path: str | Path) -> dict:
    from shoal.serving.cluster import architecture
    from shoal.specs.serving import load_serving

    spec = load_serving(path)
    model = architecture(spec.model)
    nodes: dict[str, dict[str, int]] = {}
    for group in spec.nodes:
        machine = spec.machines[group.machine]
        kind = machine.gpu or group.machine
        per = nodes.setdefault(kind, {})
        per[group.region] = per.get(group.region, 0) + group.count * machine.gpus
    return {"scenario": file_doc(path, spec.name),
            "model": ({"name": spec.model.name, "parameters": None} if model is None
                      else model_doc(model, spec.model.name)),
            "job": None, "pool": {"gpus": nodes, "total": sum(
                n for per in nodes.values() for n in per.values())}}
