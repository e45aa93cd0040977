"""``shoal train`` without ``--elastic``: check everything a run needs before any worker starts,
then run the plan's ranks under torchrun (``shoal.runtime.entry``) and read back rank 0's result.

Checked first: the plan against the model (``shoal.runtime.layout``), the machines, the options
that go together, the checkpoint folder (a resume loads only a whole checkpoint of the same
model), and the data (a token file's id type and that every id is in the vocabulary; a text file
is tokenised here, once). The result carries the estimator's prediction for the plan on the
``shoal`` stack beside the measured step time, and each step's MFU.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from shoal.errors import RunFailed, SpecError
from shoal.files import check_folder, read_json
from shoal.runtime import checkpoint as ckpt
from shoal.runtime.arch import Arch
from shoal.runtime.data import TEXT_SUFFIXES, TokenFile, check_ids, file_dtype, tokenize
from shoal.runtime.models import resolve_model
from shoal.runtime.pipeline import layout
from shoal.runtime.predict import Prediction, predict
from shoal.runtime.supervise import first_failure, run_supervised
from shoal.specs.plan import TrainingPlan


@dataclass(frozen=True)
class DataOptions:
    """``--data`` and how to read it."""

    path: str | None = None
    dtype: str | None = None  # uint16 or uint32 (else a sidecar's)
    shuffle: bool = True
    tokenizer: str | None = None  # tokenizer.json for text
    text_column: str = "text"


@dataclass(frozen=True)
class Run:
    """A checked run of a plan (``check``)."""

    plan: TrainingPlan
    arch: Arch
    model: str  # as given
    world: int
    steps: int
    seq: int
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    precision: str = "fp32"
    data: TokenFile | None = None
    save_hf: str | None = None


def seq_for(seq: int | None, spec) -> int:
    """``--seq``, by default the model's positions up to 128; no more than the model has."""
    seq = seq or min(spec.max_seq_len, 128)
    if seq > spec.max_seq_len:
        raise SpecError(f"longer than the model's {spec.max_seq_len} positions", field="--seq",
                        value=seq, allowed=f"1..{spec.max_seq_len}")
    return seq


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def check_device(device: str | None, precision: str, plan: TrainingPlan) -> str:
    """The device to run on (cuda when available by default) and a check of the precision."""
    device = device or default_device()
    if device not in ("cpu", "cuda"):
        raise SpecError("unknown device", field="--device", value=device, allowed="cpu, cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise SpecError("no CUDA device is available to this process", field="--device",
                        value=device, allowed="cpu")
    if precision not in ("fp32", "bf16", "fp16"):
        raise SpecError("unknown precision", field="--precision", value=precision,
                        allowed="fp32, bf16 (autocast), fp16 (autocast)")
    if device == "cuda":
        per_node = torch.cuda.device_count()
        if per_node and max(r.tp for st in plan.stages for r in st.replicas) > per_node:
            raise SpecError(f"a replica's TP degree exceeds this machine's {per_node} GPUs",
                            field="stages.replicas.tp")
    return device


def check_data(d: DataOptions, arch: Arch, scratch: Path, seed: int) -> TokenFile | None:
    """The token file to read (a text file tokenised into ``scratch``), its ids checked."""
    if d.path is None:
        for value, option in ((d.dtype, "--data-dtype"), (d.tokenizer, "--tokenizer")):
            if value is not None:
                raise SpecError(f"{option} goes with --data", field=option, value=value)
        if not d.shuffle:
            raise SpecError("--shuffle off goes with --data (random tokens have no order)",
                            field="--shuffle", value="off")
        return None
    path = Path(d.path)
    if not path.is_file():
        raise SpecError("data file not found", file=str(path), field="--data")
    vocab = arch.spec.vocab_size
    if path.suffix in TEXT_SUFFIXES:
        if d.tokenizer is None:
            raise SpecError("text needs a tokenizer", file=str(path), field="--tokenizer",
                            allowed="--tokenizer tokenizer.json (a local file)")
        out = tokenize(path, Path(d.tokenizer), d.text_column, scratch / "tokens.bin", vocab)
        return TokenFile(str(out), "uint32", d.shuffle, seed)
    if d.tokenizer is not None:
        raise SpecError("token files are tokenised already", field="--tokenizer",
                        allowed=f"text files ({', '.join(TEXT_SUFFIXES)}) only")
    dtype = file_dtype(path, d.dtype)
    check_ids(path, dtype, vocab)
    return TokenFile(str(path.resolve()), dtype, d.shuffle, seed)


def check_resumable(step_dir: Path, spec) -> None:
    """A checkpoint resumes only into the model it was trained on (its ``meta.json`` says
    which), and only when it is whole: every file its manifest lists there, with its size and
    SHA-256 (checked here, before any worker starts, and again as the workers read it)."""
    meta = read_json(step_dir / "meta.json", "checkpoint")
    written = meta.get("model_spec")
    if written is not None and written != spec.model_dump(mode="json"):
        raise SpecError(f"the checkpoint is of model {meta.get('model')!r}, another model's "
                        "weights", file=str(step_dir), field="--model", value=spec.name,
                        allowed=f"{meta.get('model')} (the model it was trained on)")
    ckpt.verify(step_dir)


def check_checkpoints(checkpoint_dir: Path | None, resume: bool, spec):
    """The checkpoint to resume from ((step, folder), or None), with the folder checked."""
    if resume and checkpoint_dir is None:
        raise SpecError("--resume needs --checkpoint-dir", field="--resume")
    if checkpoint_dir is None:
        return None
    check_folder(checkpoint_dir, "--checkpoint-dir")
    found = ckpt.latest(checkpoint_dir) if checkpoint_dir.is_dir() else None
    if resume and found is None:
        raise SpecError("no checkpoint to resume from (no complete step-N folder)",
                        field="--checkpoint-dir", value=str(checkpoint_dir))
    if found is not None and not resume:
        # a run writes step-N there (and, elastic, reloads the newest on a reconfiguration)
        raise SpecError(f"holds a checkpoint of an earlier run (step-{found[0]})",
                        field="--checkpoint-dir", value=str(checkpoint_dir),
                        allowed="--resume to continue from it, or an empty folder")
    if found is not None:
        check_resumable(found[1], spec)
    return found


def check_machines(world: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None) -> None:
    if world % nnodes:
        raise SpecError(f"the plan's {world} processes do not split evenly over {nnodes} "
                        "machines", field="--nnodes", value=nnodes)
    if nnodes > 1 and rdzv_endpoint is None:
        raise SpecError("several machines meet at a rendezvous", field="--nnodes", value=nnodes,
                        allowed="--rdzv-endpoint HOST:PORT with it (the same on every machine)")
    if node_rank >= nnodes:
        raise SpecError("this machine's index must be below the number of machines",
                        field="--node-rank", value=node_rank, allowed=f"0..{nnodes - 1}")


def plan_for(plan: TrainingPlan, plan_file: str, model: str) -> tuple[Arch, int]:
    """The model ``--model`` names and the plan's process count on it (a SpecError naming
    the plan file for a plan the runtime cannot run)."""
    arch = resolve_model(model)
    try:
        return arch, layout(plan, arch).world
    except SpecError as exc:
        raise exc.located(file=plan_file) from None


def kept(checkpoint_dir: Path | None) -> str:
    """What a failed run leaves to resume from, for its error message."""
    found = ckpt.latest(checkpoint_dir) if checkpoint_dir is not None and checkpoint_dir.is_dir() \
        else None
    return f" (step-{found[0]} in {checkpoint_dir} is kept: --resume continues from it)" \
        if found else ""


def worker_errors(log: list[str]) -> str:
    """What the workers' errors were, from torchrun's stderr: each rank's last exception line
    (``[rankN]: SomeError: ...``), else the log's last lines."""
    last: dict[str, str] = {}
    for line in log:
        m = re.match(r"\[(rank\d+)\]:\s*((?:[\w.]+)(?:Error|Exception|Interrupt)\b.*)", line)
        if m:
            last[m.group(1)] = m.group(2).strip()
    if last:
        return "; ".join(f"{rank}: {msg}" for rank, msg in sorted(last.items()))
    # a process that died in native code (an abort, a fatal Python error) says why in lines
    # the launcher's own traceback would push out of the tail
    first = next((i for i, x in enumerate(log) if re.search(_NATIVE, x)), None)
    head = "" if first is None else "".join(log[max(0, first - 3):first + 40]) + "...\n"
    return "\n" + head + "".join(x for x in log if not x.startswith("{"))[-2000:]


_NATIVE = r"terminate called|what\(\):|Fatal Python error|Segmentation fault|\[enforce fail"


@dataclass(frozen=True)
class Launch:
    """How the ranks are started and where checkpoints go."""

    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: str | None = None
    checkpoint_dir: Path | None = None
    resume: bool = False
    every: int | None = None
    keep: int | None = None


def _command(run: Run, launch: Launch, tmp: Path, token: str) -> list[str]:
    (tmp / "plan.json").write_text(run.plan.model_dump_json(by_alias=True))
    (tmp / "arch.json").write_text(run.arch.model_dump_json())
    (tmp / "run.json").write_text(json.dumps({
        "steps": run.steps, "seq": run.seq, "seed": run.seed, "dtype": run.dtype,
        "device": run.device, "precision": run.precision, "save_hf": run.save_hf,
        "data": asdict(run.data) if run.data else None}))
    cmd = [sys.executable, "-m", "shoal.runtime.torchrun",
           f"--nproc-per-node={run.world // launch.nnodes}", f"--nnodes={launch.nnodes}"]
    cmd += ([f"--node-rank={launch.node_rank}", f"--rdzv-endpoint={launch.rdzv_endpoint}",
             "--rdzv-backend=c10d"] if launch.rdzv_endpoint else ["--standalone"])
    cmd += ["-m", "shoal.runtime.entry", "--plan", str(tmp / "plan.json"), "--arch",
            str(tmp / "arch.json"), "--job", str(tmp / "run.json"),
            "--result", str(tmp / "result.json"), "--report-dir", str(tmp)]
    if launch.checkpoint_dir is not None:
        cmd += ["--checkpoint-dir", str(launch.checkpoint_dir), "--run-token", token]
        cmd += ["--resume"] if launch.resume else []
        cmd += ["--checkpoint-every", str(launch.every)] if launch.every else []
        cmd += ["--keep", str(launch.keep)] if launch.keep else []
    return cmd


@dataclass(frozen=True)
class TrainOptions:
    """``shoal train``'s options as given (``prepare`` checks them)."""

    model: str
    steps: int
    seq: int | None = None
    seed: int = 0
    dtype: str = "float32"
    data: DataOptions = DataOptions()
    device: str | None = None
    precision: str = "fp32"
    save_hf: Path | None = None
    launch: Launch = Launch()
    elastic: bool = False
    fault_at: int | None = None
    join_at: int | None = None
    profile: Path | None = None


@dataclass(frozen=True)
class ElasticRun:
    """``shoal train --elastic`` on the first machine: the workers in all (``world``) and on
    this machine (``local``; other machines start the rest and meet the store at
    ``endpoint``), the steps to train to, sequence, seed, dtype, checkpoints, the demo's fault
    and join steps, and a ``shoal profile`` file for the estimates."""

    world: int
    local: int
    endpoint: str | None
    steps: int
    seq: int
    seed: int = 0
    dtype: str = "float32"
    checkpoint_dir: Path | None = None
    every: int = 2
    keep: int = 2
    fault_at: int | None = None
    join_at: int | None = None
    profile: str | None = None


def _check_options(o: TrainOptions) -> None:
    """Options that go only with others, and values out of their range."""
    la = o.launch
    if not o.elastic:
        for option, value in (("--profile", o.profile), ("--fault-at", o.fault_at),
                              ("--join-at", o.join_at)):
            if value is not None:
                raise SpecError(f"{option} goes with --elastic", field=option,
                                value=str(value) if isinstance(value, Path) else value)
        for option, value in (("--checkpoint-every", la.every), ("--keep", la.keep)):
            if value is not None and la.checkpoint_dir is None:
                raise SpecError(f"{option} needs --checkpoint-dir (where the checkpoints go)",
                                field=option, value=value)
    if o.profile is not None and not o.profile.is_file():
        raise SpecError("profile not found", file=str(o.profile), field="--profile")
    if o.dtype not in ("float32", "float64"):
        raise SpecError("unknown dtype", field="--dtype", value=o.dtype,
                        allowed="float32, float64")


def prepare(plan: TrainingPlan, plan_file: str, o: TrainOptions, scratch: Path):
    """Check a ``shoal train`` before any worker starts: ``("train", Run)``, ``("elastic",
    ElasticRun, Arch)`` or, on another machine of an elastic run, ``("node", endpoint,
    workers)``; a text data set is tokenised into ``scratch``."""
    arch, world = plan_for(plan, plan_file, o.model)
    la = o.launch
    check_machines(world, la.nnodes, la.node_rank, la.rdzv_endpoint)
    _check_options(o)
    found = check_checkpoints(la.checkpoint_dir, la.resume, arch.spec)
    seq = seq_for(o.seq, arch.spec)
    dev = check_device(o.device, o.precision, plan)
    if dev == "cuda" and world // la.nnodes > torch.cuda.device_count():
        raise SpecError(f"the plan runs {world // la.nnodes} processes on each machine, one per "
                        f"GPU; this one has {torch.cuda.device_count()}", field="--nnodes",
                        value=la.nnodes)
    data = check_data(o.data, arch, scratch, o.seed)
    if not o.elastic:
        return "train", Run(plan, arch, o.model, world, o.steps, seq, o.seed, o.dtype, dev,
                            o.precision, data, str(o.save_hf.resolve()) if o.save_hf else None)
    if o.fault_at is not None and world < 2:
        raise SpecError("the plan has one worker: killing it leaves none to go on",
                        field="--fault-at", value=o.fault_at,
                        allowed="a plan of two workers or more")
    if data is not None or o.save_hf is not None or dev != "cpu" or o.precision != "fp32":
        raise SpecError("--elastic trains random tokens on CPU processes", field="--elastic",
                        allowed="without --data, --save-hf, --device cuda and --precision")
    if la.node_rank > 0:  # another machine's workers join the first machine's controller
        return "node", la.rdzv_endpoint, world // la.nnodes
    # --steps more iterations after the checkpoint resumed from, as without --elastic
    start = found[0] if la.resume and found is not None else 0
    return "elastic", ElasticRun(world, world // la.nnodes, la.rdzv_endpoint, start + o.steps,
                                 seq, o.seed, o.dtype, la.checkpoint_dir, la.every or 2,
                                 la.keep or 2, o.fault_at, o.join_at,
                                 str(o.profile) if o.profile else None), arch


def train(run: Run, launch: Launch, on_step=None, *, predicted: Prediction | None = None) -> dict:
    """Run the plan's ranks under torchrun; rank 0's result with the prediction beside it.
    ``on_step(doc)``: each step as rank 0 reports it (``step``, ``loss``, ``step_time_s``,
    ``tokens_per_s``, ``mfu``)."""
    pred = predicted or predict(run.plan, run.arch.spec, run.seq, precision=run.precision)
    token = ckpt.new_token()  # names this run's temporary checkpoint folders
    made: list[Path] = []  # the folders of --checkpoint-dir this run makes
    if launch.checkpoint_dir is not None:
        made = ckpt.make_folder(launch.checkpoint_dir)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = _command(run, launch, Path(tmp), token)
        # PYTHONFAULTHANDLER: a rank that dies in native code shows where, on stderr
        env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
               "PYTHONFAULTHANDLER": "1"}
        log: list[str] = []

        def on_line(line: str) -> None:
            log.append(line)
            if line.startswith("{") and on_step is not None:
                try:
                    d = json.loads(line)
                    on_step({**d, "mfu": pred.mfu(d["step_time_s"])})
                except (ValueError, KeyError):
                    pass

        try:
            rc, stopped = run_supervised(cmd, env=env, on_line=on_line)
        except BaseException:
            if launch.checkpoint_dir is not None:
                ckpt.remove_own(launch.checkpoint_dir, token, made)
            raise
        result = Path(tmp) / "result.json"
        if rc != 0 or not result.is_file() or stopped:
            if launch.checkpoint_dir is not None:
                ckpt.remove_own(launch.checkpoint_dir, token, made)
            why = f"stopped by {stopped}" if stopped else f"the workers failed (exit {rc})"
            raise RunFailed(f"{why}: {first_failure(tmp) or worker_errors(log)}"
                            + kept(launch.checkpoint_dir))
        doc = json.loads(result.read_text())
    return summarise(doc, pred)


def summarise(doc: dict, pred: Prediction) -> dict:
    """The run's result with the closed loop: the estimator's step time for the plan on the
    ``shoal`` stack beside the measured one, and the MFU of each step and of the mean."""
    mean = doc.get("step_time_s")
    doc["mfu"] = pred.mfu(mean) if mean else None
    doc["mfus"] = [pred.mfu(t) for t in doc.get("step_times_s", [])]
    doc["predicted"] = pred.to_json()
    p = pred.iteration_time_s
    doc["measured_over_predicted"] = mean / p if mean and p else None
    return doc
