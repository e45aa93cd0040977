"""Checkpoints on disk: one format and one writer for ``shoal train`` with and without
``--elastic``.

Writing. Each write goes into a temporary folder of its own, ``step-N.tmp-<token>``, where the
token is the run's own (a random id; the elastic runtime adds the generation): a folder that a
killed run left behind is never written into, and nothing reads it. Every writer rank puts its
file there with its size and SHA-256 beside it, synced to disk; the first rank then writes
``meta.json`` with the manifest of every file, syncs the folder, renames it ``step-N`` (atomic on
one file system) and syncs the parent folder, so ``step-N`` is whole or absent.

Reading. Only ``step-N`` folders with a ``meta.json`` count. Before anything is used, every file
the manifest lists must be there with its size and hash, and no rank file may be there that it
does not list; rank files are read with ``torch.load(weights_only=True)``: tensors and plain
containers only, so a crafted file cannot run code.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import uuid
from pathlib import Path

import torch

from shoal.errors import SpecError
from shoal.files import read_json
from shoal.runtime.params import unshard

_STEP = re.compile(r"step-(\d+)")
_RANK_FILE = re.compile(r"rank(\d+)\.pt")
_ENTRY = ".entry.json"  # beside a rank file in a temporary folder: its size and hash


def new_token() -> str:
    """An id for one run's temporary folders (unique across runs and machines)."""
    return uuid.uuid4().hex[:16]


def temp_folder(directory: str | Path, step: int, token: str) -> Path:
    """Where the write of checkpoint ``step`` by the run with ``token`` goes."""
    return Path(directory) / f"step-{step}.tmp-{token}"


def checkpoint_dirs(directory: str | Path) -> list[tuple[int, Path]]:
    """(step, folder) of every ``step-N`` folder in ``directory``, oldest first (temporary
    folders, ``step-N.tmp-...``, and any other name are left out)."""
    out = []
    for d in Path(directory).glob("step-*"):
        m = _STEP.fullmatch(d.name)
        if m and d.is_dir():
            out.append((int(m.group(1)), d))
    return sorted(out)


def latest(directory: str | Path) -> tuple[int, Path] | None:
    """(step, folder) of the newest published checkpoint in ``directory`` (one with a
    ``meta.json``), or None. Whether its files are whole is checked when it is read."""
    done = [(n, d) for n, d in checkpoint_dirs(directory) if (d / "meta.json").is_file()]
    return done[-1] if done else None


def checkpoint_meta(w, plan=None) -> dict:
    """What ``meta.json`` says besides the manifest, for a checkpoint written by worker ``w``:
    the model and dtype it was trained in (a resume checks them before it starts workers) and,
    when given, the plan."""
    doc = {"model": w.spec.name, "model_spec": w.spec.model_dump(mode="json"),
           "dtype": str(w.dtype).split(".")[-1]}
    return doc if plan is None else {**doc, "plan": plan.to_json()}


def make_folder(directory: str | Path) -> list[Path]:
    """Make ``directory`` (and missing parents); the folders this call made, deepest first,
    so that a failed run can remove what it made and nothing else."""
    d = Path(directory)
    made = [p for p in [d, *d.parents] if not p.exists()]
    d.mkdir(parents=True, exist_ok=True)
    return made


def remove_own(directory: str | Path, token: str, made: list[Path] = ()) -> None:
    """Undo a failed run's traces: its own temporary folders in ``directory``, then each
    folder of ``made`` (deepest first) while it is empty. Published checkpoints stay (a
    resume continues from them), and so does a folder that another run has put files in."""
    d = Path(directory)
    for tmp in [*d.glob(f"step-*.tmp-{token}"), *d.glob(f"step-*.tmp-{token}-*")]:
        shutil.rmtree(tmp, ignore_errors=True)
    for p in made:
        try:
            p.rmdir()
        except OSError:  # not empty (or already gone): someone else's, or a checkpoint
            break


class _Hashing:
    """A file-like writer that counts and hashes what passes through it."""

    def __init__(self, f):
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


def _sync_folder(path: Path) -> None:
    # a rename or a new file is durable only once its folder is synced; some platforms
    # cannot open a folder: there the rename's atomicity is what is left
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write_synced(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def write_rank_file(folder: Path, rank: int, doc: dict) -> None:
    """Write rank ``rank``'s share into the temporary ``folder`` and, beside it, its size and
    SHA-256 (both synced to disk) for the manifest."""
    path = folder / f"rank{rank}.pt"
    with open(path, "wb") as f:
        w = _Hashing(f)
        torch.save(doc, w)
        f.flush()
        os.fsync(f.fileno())
    entry = {"size_bytes": w.size, "sha256": w.sha.hexdigest()}
    _write_synced(folder / f"rank{rank}.pt{_ENTRY}", json.dumps(entry).encode())


def publish(folder: Path, step: int, meta: dict, *, writers: list[int],
            keep: int | None = None) -> Path:
    """Turn the temporary ``folder`` into ``step-N`` beside it: ``meta.json`` with the
    manifest of the ``writers``' files, the folder synced, then renamed (an older ``step-N``
    of the same step, written before a reconfiguration, is replaced). With ``keep``, only the
    newest ``keep`` checkpoints of the parent folder stay."""
    files = {}
    for r in writers:
        name = f"rank{r}.pt"
        entry = folder / f"{name}{_ENTRY}"
        if not (folder / name).is_file() or not entry.is_file():
            raise RuntimeError(f"checkpoint step {step}: rank {r}'s file is missing in {folder}")
        files[name] = json.loads(entry.read_text())
        entry.unlink()
    _write_synced(folder / "meta.json", json.dumps({**meta, "step": step, "files": files}).encode())
    _sync_folder(folder)
    final = folder.parent / f"step-{step}"
    old = None
    if final.exists():
        old = folder.parent / f"{folder.name}.replaced"
        final.rename(old)
    folder.rename(final)
    _sync_folder(folder.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    if keep is not None:
        for _, d in checkpoint_dirs(folder.parent)[:-keep]:
            shutil.rmtree(d, ignore_errors=True)
    return final


def read_meta(folder: str | Path) -> dict:
    """A published checkpoint's ``meta.json`` with its manifest checked for form (the files
    themselves are checked by ``verify`` and ``read``)."""
    path = Path(folder) / "meta.json"
    meta = read_json(path, "checkpoint")
    files = meta.get("files")
    if not isinstance(files, dict) or not files:
        raise SpecError("lists no rank files with their sizes and SHA-256 (a checkpoint of an "
                        "older shoal, or not written by shoal): it cannot be checked, so it is "
                        "not loaded", file=str(path), field="files",
                        allowed="a checkpoint written by this version of shoal")
    for name, entry in files.items():
        if not _RANK_FILE.fullmatch(name) or not isinstance(entry, dict) \
                or not isinstance(entry.get("size_bytes"), int) \
                or not isinstance(entry.get("sha256"), str):
            raise SpecError("not an entry of a shoal checkpoint manifest", file=str(path),
                            field=f"files.{name}"[:120],
                            allowed='"rankN.pt": {"size_bytes": int, "sha256": hex}')
    return meta


def _check(path: Path, entry: dict, data: bytes | None = None) -> None:
    """``path`` has the manifest's size and SHA-256 (of ``data``, its bytes, when given)."""
    if not path.is_file():
        raise SpecError("listed in meta.json but missing: the checkpoint is incomplete",
                        file=str(path))
    size = path.stat().st_size if data is None else len(data)
    if size != entry["size_bytes"]:
        raise SpecError(f"{size} bytes where meta.json says {entry['size_bytes']}: the file "
                        "was cut short or changed after it was written", file=str(path))
    if data is None:
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
    else:
        sha = hashlib.sha256(data)
    if sha.hexdigest() != entry["sha256"]:
        raise SpecError("its SHA-256 is not the one meta.json records: the file was changed "
                        "after it was written", file=str(path))


def _unlisted(folder: Path, files: dict) -> None:
    for f in sorted(folder.glob("rank*.pt")):
        if f.name not in files:
            raise SpecError("a rank file that meta.json does not list: it is not part of this "
                            "checkpoint", file=str(f))


def verify(folder: str | Path) -> dict:
    """Check a published checkpoint without loading it: its manifest, and every file's size
    and hash; its ``meta.json``, or a SpecError naming the file that is wrong."""
    folder = Path(folder)
    meta = read_meta(folder)
    for name, entry in meta["files"].items():
        _check(folder / name, entry)
    _unlisted(folder, meta["files"])
    return meta


def read(folder: str | Path) -> list[dict]:
    """Every rank file of a published checkpoint, each checked against the manifest and read
    as weights only (tensors, numbers, strings and containers of them: no code runs)."""
    folder = Path(folder)
    meta = read_meta(folder)
    _unlisted(folder, meta["files"])
    docs = []
    for name, entry in sorted(meta["files"].items()):
        path = folder / name
        data = path.read_bytes() if path.is_file() else None
        _check(path, entry, data)
        try:
            docs.append(torch.load(io.BytesIO(data), weights_only=True))
        except Exception as exc:  # the unpickler's refusal, or a broken archive
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SpecError(f"cannot be read as a weights-only checkpoint ({first[:200]}); "
                            "shoal reads tensors and plain values, never code",
                            file=str(path)) from None
    return docs


def full_params(folder: str | Path) -> dict[tuple[int, str], torch.Tensor]:
    """Every parameter of a published checkpoint in full (TP shards joined), by (layer, name)."""
    parts: dict[tuple[int, str], dict[int, torch.Tensor]] = {}
    for doc in read(folder):
        for key, row in doc["rows"].items():
            parts.setdefault(key, {})[doc["tp_rank"]] = row["param"]
    return {key: unshard(key[1], [p[t] for t in sorted(p)]) for key, p in sorted(parts.items())}
